"""Cross-implementation check: our baseline's greedy tokens equal Hugging Face transformers' on the same weights."""
import pytest
import torch

from mlperf.checkpoint import export_hf, load_model
from mlperf.data import load_prompts
from mlperf.tokenizer import ByteTokenizer
from suts.registry import build_sut
from tests.suts.test_shipped_pair import MODELS

transformers = pytest.importorskip("transformers")


def test_greedy_tokens_equal_transformers_on_the_shipped_target(tmp_path):
    export_hf(load_model(MODELS / "target"), tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ours = build_sut("baseline", str(tmp_path / "hf"))  # our loader reads the exported directory back
    tok = ByteTokenizer()
    for prompt in [tok.encode(p.text) for p in load_prompts()[:3]]:
        with torch.inference_mode():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False, pad_token_id=0)
        assert ours.generate(prompt, 48).tokens == expected[0, len(prompt):].tolist()
