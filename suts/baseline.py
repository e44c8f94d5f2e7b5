"""Plain autoregressive decoding with the KV cache: one target forward per token."""
import time

import torch

from suts.base import GREEDY, SUT, Result, Stats
from suts.sampling import SamplingParams, sample


class Baseline(SUT):
    name = "baseline"

    @torch.inference_mode()
    def generate(self, prompt, max_new_tokens, params: SamplingParams = GREEDY, on_first_token=None) -> Result:
        self.check(prompt, max_new_tokens)
        t0, stats, out = time.perf_counter(), Stats(), []
        generator = params.generator(self.device)
        cache = self.target.new_cache()
        logits = self.target(self.tensor(prompt), cache, last_only=True)
        while True:
            tok = int(sample(logits[0, -1], params, generator))
            if self.emit(out, [tok], max_new_tokens, stats, t0, on_first_token):
                return Result(out, stats)
            logits = self.target(self.tensor([tok]), cache)
