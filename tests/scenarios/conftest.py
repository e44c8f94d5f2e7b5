import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlperf.checkpoint import save_checkpoint
from mlperf.model import GPTConfig
from tests.suts.conftest import peaky_model, perturbed

ROOT = Path(__file__).resolve().parents[2]
# Short LoadGen runs: 64 queries are enough for early stopping at the 90th percentile.
FAST_CONF = """\
*.SingleStream.min_duration = 500
*.Server.min_duration = 500
*.Offline.min_duration = 500
"""


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A byte-vocabulary target and a draft that agrees with it most of the time, saved as checkpoints."""
    root = tmp_path_factory.mktemp("pair")
    target = peaky_model(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=256, block_size=512), 0)
    save_checkpoint(target, root / "target", dtype=torch.float32)
    save_checkpoint(perturbed(target, 1, 0.03), root / "draft", dtype=torch.float32)
    (root / "fast.conf").write_text(FAST_CONF)
    return root


@pytest.fixture
def mlperf_run(tiny_pair, tmp_path):
    """Run `python -m mlperf run ...` in a fresh process (LoadGen allows one test per process)."""
    def call(*args, samples=16, tokens=8):
        cmd = [sys.executable, "-m", "mlperf", "run", "--target", str(tiny_pair / "target"),
               "--draft", str(tiny_pair / "draft"), "--samples", str(samples), "--max-new-tokens", str(tokens),
               "--user-conf", str(tiny_pair / "fast.conf"), "--results", str(tmp_path / "results"), *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    call.results = tmp_path / "results"
    return call
