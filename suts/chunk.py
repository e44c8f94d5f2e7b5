"""What a runner asks its model's fast step for (suts/runner.py, suts/fastpath.py, suts/graphs.py): one chunk of new
tokens against a KV cache, described once instead of by six positional arguments."""
from dataclasses import dataclass, replace

from mlperf.cache import KVCache, TreeMask


@dataclass(frozen=True)
class Chunk:
    """B rows of T new tokens each, or packed one row after another (`lens`: row b's count, T the longest), against
    `cache`; or a token tree's last T nodes (`tree`); outputs at each row's last token alone where `last_only`."""
    B: int
    T: int
    cache: KVCache
    tree: TreeMask | None = None
    lens: list[int] | None = None
    last_only: bool = False

    @property
    def counts(self) -> list[int]:
        """Each row's new tokens."""
        return [self.T] * self.B if self.lens is None else self.lens

    def rows(self, a: int, b: int, lens: list[int] | None = None) -> "Chunk":
        """Rows a..b-1 of the chunk, against their rows of the cache (packed: with their own `lens`)."""
        return replace(self, B=b - a, cache=self.cache.rows(a, b), lens=lens,
                       T=max(lens) if lens is not None else self.T)
