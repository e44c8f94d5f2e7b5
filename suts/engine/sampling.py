"""The one sampling module every SUT uses: greedy, temperature, top-k, top-p, seeded.

Speculative decoding applies `probs` with the same parameters to draft and target logits, so rejection
sampling compares the two distributions the tokens are really drawn from.
"""
import math
from dataclasses import dataclass, replace

import numpy as np
import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax)
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature < math.inf):
            raise ValueError(f"temperature must be >= 0 and finite, got {self.temperature!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be a non-negative integer, got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def for_sample(self, index: int) -> "SamplingParams":
        """These parameters with a seed of sample `index`'s own, derived from (run seed, index): a sampled run
        is reproducible sample by sample, whatever order LoadGen issues the samples in."""
        return replace(self, seed=int(np.random.SeedSequence([self.seed, index]).generate_state(1, np.uint64)[0] >> 1))

    def generator(self, device="cpu") -> torch.Generator:
        return torch.Generator(device).manual_seed(self.seed)


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Next-token probabilities (float32) over the last dim after temperature, top-k and top-p."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_logits, dim=-1)
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # keep the smallest set reaching top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `logits` (..., vocab): argmax when greedy, else a draw from `probs`."""
    if params.greedy:
        return logits.argmax(-1)
    p = probs(logits, params)
    return torch.multinomial(p.reshape(-1, p.shape[-1]), 1, generator=generator).reshape(p.shape[:-1])


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list) -> list[int]:
    """One token per row of `logits` (rows, vocab), each row with its own parameters and generator."""
    if all(p.greedy for p in params):
        return logits.argmax(-1).tolist()
    return [int(sample(row, p, g)) for row, p, g in zip(logits, params, generators)]
