"""Plain autoregressive decoding with the KV cache: one target forward per token, for all running rows."""
import torch

from suts.base import SUT
from suts.sampling import sample_rows
from suts.scheduler import Sequence


class Baseline(SUT):
    name = "baseline"

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        """Feed every row its last token; rows at different lengths are handled by the cache's per-row lengths.
        Each row samples with its own generator, so its tokens depend on its seed alone, not on its batch."""
        x = torch.tensor([s.tokens[-1:] for s in seqs], device=self.device)
        logits = self.target(x, self.caches[0].rows(0, len(seqs)))[:, -1]
        return [[tok] for tok in sample_rows(logits, [s.params for s in seqs], [s.generator for s in seqs])]
