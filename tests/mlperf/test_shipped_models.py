"""The shipped default pair: present, loadable, the documented geometry, small enough, with model cards."""
import json
from pathlib import Path

import pytest

from mlperf.checkpoint import load_model
from mlperf.model import GEOMETRIES
from mlperf.tokenizer import ByteTokenizer, load_tokenizer
from mlperf.cost import forward_cost

MODELS = Path(__file__).resolve().parents[2] / "mlperf" / "assets" / "models"


@pytest.mark.parametrize("name, max_heldout", [("target", 1.4), ("draft", 1.9)])
def test_shipped_checkpoint(name, max_heldout):
    model = load_model(MODELS / name)
    assert model.config == GEOMETRIES[name]
    assert isinstance(load_tokenizer(MODELS / name), ByteTokenizer)
    meta = json.loads((MODELS / name / "config.json").read_text())["meta"]
    assert meta["heldout_loss"] <= max_heldout and meta["params"] == model.num_params()
    card = (MODELS / name / "MODEL_CARD.md").read_text()
    for field in ("geometry", "parameters", "tokens seen", "wall time", "held-out loss", "list hash", "seed"):
        assert field in card


def test_the_pair_is_small_and_the_target_much_costlier_than_the_draft():
    size = sum(f.stat().st_size for f in MODELS.glob("*/model.safetensors"))
    assert size <= 40 * 2 ** 20
    target, draft = (forward_cost(GEOMETRIES[n], 256, 1) for n in ("target", "draft"))
    assert target.flops >= 6 * draft.flops and target.bytes >= 6 * draft.bytes
