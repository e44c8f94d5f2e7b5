"""The small interface every SUT implements, and the per-sample statistics it returns.

A SUT turns one prompt (token ids) into generated token ids. It calls `on_first_token(token)` the moment the
first token exists (LoadGen's time to first token) and returns the tokens with their `Stats`.
"""
import time
from dataclasses import dataclass, field

import torch

from mlperf.model import GPT
from suts.sampling import SamplingParams

GREEDY = SamplingParams()


@dataclass
class Stats:
    """Per-sample statistics. `emit` fills in the timing of a one-row SUT; a batched SUT sets its rows' own
    prefill and the batch's shared decode time. Speculative SUTs call `record_cycle` once per verify pass."""
    token_times_s: list[float] = field(default_factory=list)  # when each token was emitted, from the call's start
    prefill_s: float = 0.0  # this row's prefill: the prompt's forward pass and its first token
    decode_s: float = 0.0  # wall time of the decode steps this row took part in (shared by a batch's rows)
    steps: int = 0  # target forward passes after prefill: decode steps, or verify passes
    batch: int = 1  # rows that decoded together
    cycle_hist: dict[int, list[int]] = field(default_factory=dict)  # cycle_hist[g][k]: cycles drafting g, accepting k
    draft_s: float = 0.0
    verify_s: float = 0.0

    def record_cycle(self, drafted: int, accepted: int) -> None:
        self.cycle_hist.setdefault(drafted, [0] * (drafted + 1))[accepted] += 1

    @property
    def n_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def ttft_s(self) -> float:
        return self.token_times_s[0]

    @property
    def total_s(self) -> float:
        return self.token_times_s[-1]

    @property
    def cycles(self) -> int:
        return sum(sum(counts) for counts in self.cycle_hist.values())

    @property
    def drafted(self) -> int:
        return sum(g * sum(counts) for g, counts in self.cycle_hist.items())

    @property
    def accepted(self) -> int:
        return sum(k * c for counts in self.cycle_hist.values() for k, c in enumerate(counts))

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass
class Result:
    tokens: list[int]
    stats: Stats


class SUT:
    """Base of every decoding strategy: holds the target, validates requests, records emitted tokens."""
    name = "sut"
    needs_draft = False  # True: the registry loads a draft checkpoint and passes it in
    batched = False  # True: generate_batch decodes its prompts together (Offline), not one at a time

    def __init__(self, target: GPT, draft: GPT | None = None, eos_id: int | None = None):
        self.target, self.draft, self.eos_id = target, draft, eos_id
        p = target.transformer.wte.weight
        self.device, self.dtype = p.device, p.dtype

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams = GREEDY,
                 on_first_token=None) -> Result:
        raise NotImplementedError

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       params: list[SamplingParams]) -> list[Result]:
        """Offline entry point, one SamplingParams (with its own seed) per prompt; the default decodes one
        prompt at a time."""
        return [self.generate(p, max_new_tokens, ps) for p, ps in zip(prompts, params)]

    def check(self, prompt: list[int], max_new_tokens: int) -> None:
        config = self.target.config
        if not prompt:
            raise ValueError("empty prompt")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if len(prompt) + max_new_tokens > config.block_size:
            raise ValueError(f"prompt of {len(prompt)} tokens + {max_new_tokens} new tokens exceeds the model's "
                             f"context of {config.block_size}")
        if min(prompt) < 0 or max(prompt) >= config.vocab_size:
            raise ValueError(f"prompt has token ids outside the vocabulary (0..{config.vocab_size - 1})")

    def tensor(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], device=self.device)

    def emit(self, out: list[int], new: list[int], max_new_tokens: int, stats: Stats, t0: float,
             on_first_token) -> bool:
        """Append the tokens of one step (stopping at EOS and max_new_tokens); True when generation is finished.
        The first call is the prefill's token; every later call is one decode step (or speculative cycle)."""
        now = time.perf_counter() - t0
        if out:
            stats.steps += 1
            stats.decode_s = now - stats.prefill_s
        else:
            stats.prefill_s = now
        for tok in new:
            out.append(tok)
            stats.token_times_s.append(now)
            if len(out) == 1 and on_first_token is not None:
                on_first_token(tok)
            if tok == self.eos_id or len(out) == max_new_tokens:
                return True
        return False
