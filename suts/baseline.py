"""Plain autoregressive decoding with the KV cache: one target forward per token, for all running rows."""
import torch

from mlperf.chunk import Chunk
from suts.base import SUT
from suts.engine.sampling import sample_rows
from suts.engine.scheduler import Sequence


class Baseline(SUT):
    name = "baseline"

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        """Feed every row its last token; rows at different lengths are handled by the cache's per-row lengths.
        A greedy batch takes its argmaxes through Runner.greedy, as a draft's steps do (on a fast path in the call
        that runs its forward: one C call on a CPU, one graph on a GPU). Otherwise each row samples with its own
        generator, so its tokens depend on its seed alone, not on its batch."""
        n = len(seqs)
        cache = self.cache.rows(0, n)
        if all(s.params.greedy for s in seqs):
            return self.target.greedy([s.tokens[-1] for s in seqs], cache, [1] * n, 1)
        last = torch.tensor([s.tokens[-1:] for s in seqs], device=self.device)
        logits = self.target(last, Chunk(cache)).logits[:, -1]
        return [[tok] for tok in sample_rows(logits, [s.params for s in seqs], [s.generator for s in seqs])]
