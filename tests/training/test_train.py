"""The trainer of the shipped pair."""
from pathlib import Path

import pytest

from mlperf.checkpoint import read_meta
from training.data import Data
from training.train import TrainConfig, distill_loss, train
from training.train import main as train_main


def test_training_can_start_from_a_shipped_checkpoint(tmp_path, capsys):
    """--init continues from the shipped draft's weights: after one step its held-out loss is the shipped
    draft's (about 1.3 nats/byte), not a fresh model's (about 5.5)."""
    draft = Path(__file__).resolve().parents[2] / "mlperf" / "assets" / "models" / "draft"
    assert train_main(["draft", "--init", str(draft), "--steps", "1", "--lr", "1e-4", "--workdir",
                       str(tmp_path / "work"), "--out", str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    init_tokens = read_meta(draft)["tokens_seen"]
    assert "--init" in card and "peak lr 0.0001" in card and f"after the --init checkpoint's {init_tokens:,}" in card
    assert read_meta(tmp_path / "out")["heldout_loss"] < 1.6
    assert train_main(["draft", "--init", str(draft.with_name("target")), "--steps", "1",
                       "--workdir", str(tmp_path / "work2")]) == 1
    assert "is not the draft's" in capsys.readouterr().err


def test_distillation_pulls_the_draft_toward_the_teacher(tmp_path):
    """On random data a draft trained on the data alone learns near-uniform predictions; one distilled from a
    peaky teacher learns the teacher's: its KL to the teacher ends far lower. Its card says how it was trained."""
    import numpy as np
    import torch

    from mlperf.model import GPTConfig
    from mlperf.checkpoint import load_model
    from suts.distribution import peaky_model

    geometry = GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=16, block_size=32)
    teacher = peaky_model(geometry, 0, sharpness=12.0).eval()
    rng = np.random.default_rng(0)
    data = Data(rng.integers(0, 16, 20000).astype(np.uint16), rng.integers(0, 16, 2000).astype(np.uint16),
                lambda ids: " ".join(map(str, ids)), None, "token", "uniform random tokens")
    cfg = TrainConfig(steps=60, batch=8, seq=32, lr=3e-3, warmup=5, eval_every=60, eval_windows=8)
    kl = {}
    for name, t in (("plain", None), ("distilled", teacher)):
        train(name, cfg, tmp_path / f"work-{name}", tmp_path / name, geometry, data, "test", teacher=t)
        x = torch.from_numpy(data.heldout[:256].astype(np.int64)).view(8, 32)
        with torch.no_grad():
            kl[name] = float(distill_loss(load_model(tmp_path / name)(x).logits, teacher(x).logits, 1.0))
    assert kl["distilled"] < 0.75 * kl["plain"], kl  # about 0.6: the data loss pulls toward uniform
    assert "KL(teacher || distilled)" in (tmp_path / "distilled" / "MODEL_CARD.md").read_text()
    assert "next-token cross-entropy on the data" in (tmp_path / "plain" / "MODEL_CARD.md").read_text()


def test_a_teacher_with_another_vocabulary_is_a_one_line_error(tmp_path, capsys):
    import torch

    from mlperf.checkpoint import save_checkpoint
    from mlperf.model import GPTConfig
    from suts.distribution import peaky_model
    save_checkpoint(peaky_model(GPTConfig(n_layer=1, n_head=1, n_embd=16, vocab_size=32, block_size=512), 0),
                    tmp_path / "teacher", dtype=torch.float32)
    assert train_main(["draft", "--distill", str(tmp_path / "teacher"), "--steps", "1", "--workdir",
                       str(tmp_path / "work"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must share the draft's vocabulary (256)" in err
    assert not (tmp_path / "out").exists()


def test_an_unusable_device_is_a_one_line_error(tmp_path, capsys):
    import torch
    for device, line in (("nonsense", "unknown device 'nonsense'; use cpu, cuda, cuda:N or mps"),
                         *(() if torch.cuda.is_available() else (("cuda", "CUDA is not available"),)),
                         *(() if torch.backends.mps.is_available() else
                           (("mps", "Apple's GPU (MPS) is not available"),))):
        assert train_main(["draft", "--device", device, "--steps", "1", "--workdir", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and line in err


def test_stop_at_exports_early_on_the_same_schedule_and_resumes_to_its_end(tmp_path, capsys):
    """--stop-at N gives the weights of step N of the full schedule: resumed without it, the run ends where an
    uninterrupted one does. A state already past the requested end, and a --stop-at beyond --steps, are errors."""
    import numpy as np
    import torch

    from mlperf.checkpoint import load_model
    from mlperf.model import GPTConfig

    geometry = GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=16, block_size=32)
    rng = np.random.default_rng(0)
    data = Data(rng.integers(0, 16, 5000).astype(np.uint16), rng.integers(0, 16, 1000).astype(np.uint16),
                lambda ids: " ".join(map(str, ids)), None, "token", "uniform random tokens")
    full = TrainConfig(steps=6, batch=4, seq=32, lr=3e-3, warmup=2, eval_every=2, eval_windows=4)
    train("whole", full, tmp_path / "w1", tmp_path / "whole", geometry, data, "test")
    train("early", TrainConfig(**{**vars(full), "stop_at": 4}), tmp_path / "w2", tmp_path / "early", geometry, data,
          "test")
    card = (tmp_path / "early" / "MODEL_CARD.md").read_text()
    assert "over 6 steps (stopped at step 4)" in card and "| 4 |" in card and "| 6 |" not in card
    assert not torch.equal(load_model(tmp_path / "early").transformer.wte.weight,
                           load_model(tmp_path / "whole").transformer.wte.weight)
    train("early", full, tmp_path / "w2", tmp_path / "resumed", geometry, data, "test")
    resumed, whole = load_model(tmp_path / "resumed").state_dict(), load_model(tmp_path / "whole").state_dict()
    assert all(torch.allclose(resumed[k], whole[k], atol=1e-6) for k in whole)
    with pytest.raises(ValueError, match="is at step 6, past the requested end"):
        train("early", TrainConfig(**{**vars(full), "stop_at": 4}), tmp_path / "w2", tmp_path / "x", geometry, data,
              "test")
    assert train_main(["draft", "--steps", "3", "--stop-at", "5", "--workdir", str(tmp_path / "w3")]) == 1
    assert "--stop-at between 1 and --steps (3)" in capsys.readouterr().err
