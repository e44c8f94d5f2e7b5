import copy

import pytest
import torch

from mlperf.model import GPT, GPTConfig


def peaky_model(config: GPTConfig, seed: int, sharpness: float = 4.0) -> GPT:
    """A random model with varied, far-from-uniform next-token distributions.

    GPT-2's init (std 0.02) makes a random model repeat its input token with near-uniform probabilities;
    larger matrices let the blocks shape the output, and a scaled final LayerNorm sharpens it.
    """
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
        model.transformer.ln_f.weight.mul_(sharpness / config.n_embd ** 0.5)
    return model


def perturbed(model: GPT, seed: int, noise: float) -> GPT:
    """A copy of `model` with Gaussian noise on every weight: a draft that agrees with it part of the time."""
    torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * noise * p.std().clamp_min(1e-3))
    return draft


SMALL = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=32, block_size=128)


@pytest.fixture(scope="session")
def pair():
    target = peaky_model(SMALL, 0)
    return target, perturbed(target, 1, 0.06)  # accepts about 60% of drafts
