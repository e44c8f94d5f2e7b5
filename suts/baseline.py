"""Plain autoregressive decoding with the KV cache: one target forward per token (per batch of rows)."""
import time

import torch

from suts.base import GREEDY, SUT, Result, Stats
from suts.sampling import SamplingParams, sample


class Baseline(SUT):
    name = "baseline"
    batched = True

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

    @torch.inference_mode()
    def generate_batch(self, prompts, max_new_tokens, params: SamplingParams = GREEDY) -> list[Result]:
        """Decode all prompts together: each row is prefilled alone into its slice of one cache, then every
        step feeds one token per row; rows of different lengths are handled by the cache's per-row lengths."""
        for prompt in prompts:
            self.check(prompt, max_new_tokens)
        t0, generator = time.perf_counter(), params.generator(self.device)
        stats, outs, done = [Stats() for _ in prompts], [[] for _ in prompts], [False] * len(prompts)
        cache = self.target.new_cache(len(prompts))
        logits = torch.cat([self.target(self.tensor(p), cache.rows(b, b + 1), last_only=True)
                            for b, p in enumerate(prompts)])[:, -1]
        while True:
            tokens = sample(logits, params, generator)
            for b, tok in enumerate(tokens.tolist()):
                done[b] = done[b] or self.emit(outs[b], [tok], max_new_tokens, stats[b], t0, None)
            if all(done):
                return [Result(out, s) for out, s in zip(outs, stats)]
            logits = self.target(tokens[:, None], cache)[:, -1]
