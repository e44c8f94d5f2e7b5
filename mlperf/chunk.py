"""One forward pass described in one object (a Chunk), and what a GPT's forward returns (Output).

A model is called as `model(ids, chunk)`: the ids are the pass's new tokens, the chunk says everything else (the KV
cache they continue, a token tree, packed rows, which outputs), so that the model, its fast steps (suts/fast/step.py)
and the runner between them (suts/fast/runner.py) pass one thing instead of six arguments in a row."""
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from mlperf.cache import KVCache, TreeMask


@dataclass(frozen=True)
class Chunk:
    """New tokens against `cache` (None: a whole sequence from position 0, causal): B rows of T tokens, or packed
    one row after another (`lens`: row b's count, T the longest), or a token tree's last T nodes (`tree`); outputs
    at each row's last token alone where `last_only`, every position's final hidden states beside the logits where
    `features`. B and T are the tokens' shape: `of` fills them in from the ids (the runner does, before asking a
    fast step), and a fast step's caller may give them. What a model reads beside its tokens (an EAGLE head's
    features) is its forward's own, not the chunk's."""
    cache: KVCache | None = None
    tree: TreeMask | None = None
    lens: list[int] | None = None
    last_only: bool = False
    features: bool = False
    B: int = 0
    T: int = 0

    def of(self, ids: torch.Tensor) -> "Chunk":
        """The chunk with B and T read from its token ids, (B, T), or packed (1, sum(lens))."""
        if self.lens is not None:
            return replace(self, B=len(self.lens), T=max(self.lens, default=0))
        B, T = ids.shape
        return replace(self, B=B, T=T)

    @property
    def counts(self) -> list[int]:
        """Each row's new tokens."""
        return [self.T] * self.B if self.lens is None else self.lens

    def lasts(self, x: torch.Tensor) -> torch.Tensor:
        """Each row's last token's entry of x, every token's (B, T, ...; packed: (1, sum(lens), ...)), as (rows, 1,
        ...): what a last_only pass returns."""
        return x[:, -1:] if self.lens is None else x[0, torch.tensor(self.lens).cumsum(0) - 1][:, None]

    def rows(self, a: int, b: int, lens: list[int] | None = None) -> "Chunk":
        """Rows a..b-1 of the chunk, against their rows of the cache (packed: with their own `lens`)."""
        return replace(self, B=b - a, cache=self.cache.rows(a, b), lens=lens,
                       T=max(lens) if lens is not None else self.T)


class Output(NamedTuple):
    """What a GPT's forward returns: logits (B, T, vocab), or (B, 1, vocab) where last_only (packed: one row per
    packed row); and where the chunk asked for `features`, every position's final hidden states (B, T, n_embd),
    what the LM head reads and an EAGLE head drafts from (else None)."""
    logits: torch.Tensor
    hidden: torch.Tensor | None = None
