import pytest
import torch

from mlperf.model import GPT, GPTConfig

torch.set_num_threads(1)  # tiny models run fastest on one thread, and a busy machine can't oversubscribe it

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=61, block_size=64)


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return GPT(TINY).eval()
