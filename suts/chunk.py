"""What a runner asks its model's fast step for (suts/runner.py, suts/step.py): one chunk of new tokens against a KV
cache, described once instead of by six positional arguments."""
from dataclasses import dataclass, replace

import torch

from mlperf.cache import KVCache, TreeMask


@dataclass(frozen=True)
class Chunk:
    """B rows of T new tokens each, or packed one row after another (`lens`: row b's count, T the longest), against
    `cache`; or a token tree's last T nodes (`tree`); outputs at each row's last token alone where `last_only`, the
    final hidden states beside the logits where `features`. An EAGLE head's chunk also holds the target's features
    its tokens pair with (`feats`) and the target's token embedding they are looked up in (`wte`)."""
    B: int
    T: int
    cache: KVCache
    tree: TreeMask | None = None
    lens: list[int] | None = None
    last_only: bool = False
    features: bool = False
    feats: torch.Tensor | None = None
    wte: torch.Tensor | None = None

    @property
    def counts(self) -> list[int]:
        """Each row's new tokens."""
        return [self.T] * self.B if self.lens is None else self.lens

    def rows(self, a: int, b: int, lens: list[int] | None = None) -> "Chunk":
        """Rows a..b-1 of the chunk, against their rows of the cache (packed: with their own `lens`)."""
        return replace(self, B=b - a, cache=self.cache.rows(a, b), lens=lens,
                       T=max(lens) if lens is not None else self.T)


def gpt_chunk(idx: torch.Tensor, cache: KVCache | None = None, *, last_only: bool = False, features: bool = False,
              tree: TreeMask | None = None, lens: list[int] | None = None) -> tuple[torch.Tensor, Chunk | None]:
    """GPT.forward's call (its own arguments) as token ids and a Chunk; None for the chunk without a cache."""
    if cache is None:
        return idx, None
    if lens is not None:  # packed: one row of every row's tokens
        return idx, Chunk(len(lens), max(lens, default=0), cache, tree, lens, last_only, features)
    return idx, Chunk(*idx.shape, cache, tree, None, last_only, features)
