"""Speculative decoding: a draft proposes gamma tokens, the target scores all gamma+1 positions in one forward.

Greedy: accept the longest prefix of drafts that equal the target's argmax, then emit the target's own token
(a correction, or a bonus after full acceptance): the output is token-identical to the baseline's.
Sampling: modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft token d with
probability min(1, p(d)/q(d)), else draw from normalize(max(0, p - q)); the output is distributed exactly as
the target's. After each cycle both KV caches are rolled back to the committed length (an O(1) length reset).
"""
import copy
import time

import torch

from mlperf.model import GPT
from suts.base import GREEDY, SUT, Result, Stats
from suts.quantize import quantize_int8
from suts.sampling import SamplingParams, probs, sample


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution to resample from after a rejection: normalize(max(0, p - q)); p itself if p == q."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else p


def accept(drafts: list[int], q: torch.Tensor | None, logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None) -> tuple[int, int]:
    """How many drafts the target accepts and the token it emits after them.

    `logits` (len(drafts)+1, vocab) are the target's at the positions before each draft and after the last;
    `q` (len(drafts), vocab) the draft's probabilities the drafts were drawn from (None when greedy).
    """
    if params.greedy:
        choice = logits.argmax(-1).tolist()
        k = 0
        while k < len(drafts) and choice[k] == drafts[k]:
            k += 1
        return k, choice[k]
    p = probs(logits, params)
    u = torch.rand(len(drafts), generator=generator, device=p.device).tolist()
    for i, d in enumerate(drafts):
        if u[i] * float(q[i, d]) >= float(p[i, d]):  # reject: the draft over-proposed d
            return i, int(torch.multinomial(residual(p[i], q[i]), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[-1], 1, generator=generator))


class Speculative(SUT):
    name = "spec"
    needs_draft = True
    quantize_draft = False  # int8 draft weights (see suts/quantize.py)

    def __init__(self, target: GPT, draft: GPT | None = None, eos_id: int | None = None, gamma: int = 4,
                 adaptive: bool = False):
        if draft is None:
            raise ValueError(f"SUT {self.name} needs a draft model")
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocab ({draft.config.vocab_size}) does not match target vocab "
                             f"({target.config.vocab_size})")
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
            raise ValueError(f"gamma must be a positive integer, got {gamma!r}")
        if draft.config.block_size < target.config.block_size:
            raise ValueError(f"draft context ({draft.config.block_size}) is shorter than the target's "
                             f"({target.config.block_size})")
        super().__init__(target, quantize_int8(draft) if self.quantize_draft else draft, eos_id)
        self.gamma, self.adaptive = gamma, adaptive
        self.max_gamma = 2 * gamma if adaptive else gamma

    @torch.inference_mode()
    def generate(self, prompt, max_new_tokens, params: SamplingParams = GREEDY, on_first_token=None) -> Result:
        self.check(prompt, max_new_tokens)
        t0, out = time.perf_counter(), []
        stats = Stats()
        generator = params.generator(self.device)
        tcache, dcache = self.target.new_cache(), self.draft.new_cache()
        x = self.tensor(prompt)
        logits = self.target(x, tcache, last_only=True)
        self.draft(x, dcache, last_only=True)
        seq = list(prompt)  # committed tokens; the target's cache holds all but the last
        gamma = self.gamma
        new = [int(sample(logits[0, -1], params, generator))]
        while not self.emit(out, new, max_new_tokens, stats, t0, on_first_token):
            seq += new
            g = min(gamma, max_new_tokens - len(out) - 1)  # never draft past max_new_tokens
            t_draft = time.perf_counter()
            drafts, q = self._propose(seq, dcache, g, params, generator)
            t_verify = time.perf_counter()
            n = len(seq) - 1
            logits = self.target(self.tensor(seq[-1:] + drafts), tcache)[0]
            k, nxt = accept(drafts, q, logits, params, generator)
            tcache.lengths[:] = n + 1 + k  # roll back the rejected drafts
            dcache.lengths[:] = min(int(dcache.lengths[0]), n + 1 + k)
            stats.draft_s += t_verify - t_draft
            stats.verify_s += time.perf_counter() - t_verify
            stats.record_cycle(g, k)
            if self.adaptive and g == gamma:  # grow after a fully accepted cycle, shrink after a rejection
                gamma = min(gamma + 1, self.max_gamma) if k == g else max(1, gamma - 1)
            new = drafts[:k] + [nxt]
        return Result(out, stats)

    def _propose(self, seq, dcache, g, params, generator) -> tuple[list[int], torch.Tensor | None]:
        """g draft tokens continuing `seq` (the draft's cache first catches up on what it has not seen)."""
        drafts, qs = [], []
        x = self.tensor(seq[int(dcache.lengths[0]):])
        for _ in range(g):
            logits = self.draft(x, dcache, last_only=True)[0, -1]
            if params.greedy:
                x = logits.argmax().view(1, 1)
            else:
                qs.append(probs(logits, params))
                x = torch.multinomial(qs[-1], 1, generator=generator).view(1, 1)
            drafts.append(int(x))
        return drafts, torch.stack(qs) if qs else None


class SpeculativeInt8(Speculative):
    """Speculative decoding with the draft's linear weights in int8; greedy output stays token-identical."""
    name = "spec-int8"
    quantize_draft = True


class SelfSpeculativeInt8(Speculative):
    """The draft is an int8 copy of the target itself: high acceptance, but only as cheap as int8 makes it."""
    name = "spec-self-int8"
    needs_draft = False
    quantize_draft = True

    def __init__(self, target: GPT, draft: GPT | None = None, eos_id: int | None = None, gamma: int = 4,
                 adaptive: bool = False):
        super().__init__(target, copy.deepcopy(target), eos_id, gamma, adaptive)
