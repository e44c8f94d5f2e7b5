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
    def generate_batch(self, prompts, max_new_tokens, params: list[SamplingParams]) -> list[Result]:
        """Decode all prompts together: each row is prefilled alone into its slice of one cache, then every
        step feeds one token per row; rows of different lengths are handled by the cache's per-row lengths.
        Each row samples with its own generator, so its tokens depend on its seed alone, not on its batch."""
        for prompt in prompts:
            self.check(prompt, max_new_tokens)
        t0 = time.perf_counter()
        generators = [p.generator(self.device) for p in params]
        stats, outs, done = [Stats() for _ in prompts], [[] for _ in prompts], [False] * len(prompts)
        cache = self.target.new_cache(len(prompts))
        logits, prefill_s = [], []
        for b, prompt in enumerate(prompts):
            start = time.perf_counter()
            logits.append(self.target(self.tensor(prompt), cache.rows(b, b + 1), last_only=True)[:, -1])
            prefill_s.append(time.perf_counter() - start)
        logits, steps, decode_start = torch.cat(logits), 0, time.perf_counter()
        while True:
            if params[0].greedy:
                tokens = logits.argmax(-1)
            else:
                tokens = torch.stack([sample(row, p, g) for row, p, g in zip(logits, params, generators)])
            for b, tok in enumerate(tokens.tolist()):
                done[b] = done[b] or self.emit(outs[b], [tok], max_new_tokens, stats[b], t0, None)
            if all(done):
                break
            logits = self.target(tokens[:, None], cache)[:, -1]
            steps += 1
        decode_s = time.perf_counter() - decode_start
        for s, p in zip(stats, prefill_s):  # per-step accounting: own prefill, the batch's shared steps
            s.prefill_s, s.decode_s, s.steps, s.batch = p, decode_s, steps, len(prompts)
        return [Result(out, s) for out, s in zip(outs, stats)]
