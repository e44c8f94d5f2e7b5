"""The trainer of the shipped pair."""
import json
from pathlib import Path

from mlperf.train import main as train_main


def test_training_can_start_from_a_shipped_checkpoint(tmp_path, capsys):
    """--init continues from the shipped draft's weights: after one step its held-out loss is the shipped
    draft's (about 1.4 nats/byte), not a fresh model's (about 5.5)."""
    draft = Path(__file__).resolve().parents[2] / "mlperf" / "assets" / "models" / "draft"
    assert train_main(["draft", "--init", str(draft), "--steps", "1", "--lr", "1e-4", "--workdir",
                       str(tmp_path / "work"), "--out", str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    assert "--init" in card and "peak lr 0.0001" in card and float(json.loads((tmp_path / "out" / "config.json").read_text())["meta"]["heldout_loss"]) < 1.6
    assert train_main(["draft", "--init", str(draft.with_name("target")), "--steps", "1",
                       "--workdir", str(tmp_path / "work2")]) == 1
    assert "is not the draft's" in capsys.readouterr().err
