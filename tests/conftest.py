import pytest
import torch

from mlperf.checkpoint import save_checkpoint
from mlperf.model import GPT, GPTConfig
from tests.helpers import FAST_CONF, SMALL, peaky_model, perturbed

torch.set_num_threads(1)  # tiny models run fastest on one thread, and a busy machine can't oversubscribe it

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=61, block_size=64)


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return GPT(TINY).eval()


@pytest.fixture(scope="session")
def pair():
    """A small target and a draft that accepts about 60% of its proposals."""
    target = peaky_model(SMALL, 0)
    return target, perturbed(target, 1, 0.06)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A byte-vocabulary target and a draft that agrees with it most of the time, saved as checkpoints."""
    root = tmp_path_factory.mktemp("pair")
    target = peaky_model(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=256, block_size=512), 0)
    save_checkpoint(target, root / "target", dtype=torch.float32)
    save_checkpoint(perturbed(target, 1, 0.03), root / "draft", dtype=torch.float32)
    (root / "fast.conf").write_text(FAST_CONF)
    return root
