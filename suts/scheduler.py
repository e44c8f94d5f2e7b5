"""The one iteration-level scheduler every batched SUT runs on (continuous batching, as in Orca and vLLM).

Sequences wait in a queue. Each iteration admits waiting sequences into free rows of the SUT's KV cache pool
(one prefill each, which streams the first token at once), then runs one decode step, or one speculative
cycle, for all running rows together. A sequence leaves the batch the moment it reaches max_new_tokens or EOS
and its row is freed: the last running row moves into it, so the running rows are always rows 0..n-1 and a
step works on one slice of the pool.
"""
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from suts.sampling import SamplingParams


@dataclass
class Stats:
    """Per-sample statistics. Time shared by a batch is divided among the rows that ran in it, so every
    row's `prefill_s + decode_s` adds up to the SUT's busy time. Speculative SUTs call `record_cycle` once
    per verify pass."""
    token_times_s: list[float] = field(default_factory=list)  # when each token was emitted, from submission
    prefill_s: float = 0.0  # this row's prefill: the prompt's forward pass and its first token
    decode_s: float = 0.0  # this row's share of the decode steps (or cycles) it ran in
    steps: int = 0  # target forward passes after prefill this row took part in: decode steps or verify passes
    batch_steps: dict[int, int] = field(default_factory=dict)  # batch_steps[b]: of those, steps that ran b rows
    cycle_hist: dict[int, list[int]] = field(default_factory=dict)  # cycle_hist[g][k]: cycles drafting g, accepting k
    draft_s: float = 0.0  # this row's share of drafting time
    verify_s: float = 0.0  # this row's share of verify time

    def record_cycle(self, drafted: int, accepted: int) -> None:
        self.cycle_hist.setdefault(drafted, [0] * (drafted + 1))[accepted] += 1

    def record_step(self, seconds: float, batch: int) -> None:
        """One decode step (or cycle) of `seconds` that ran `batch` rows, this row among them."""
        self.steps += 1
        self.decode_s += seconds / batch
        self.batch_steps[batch] = self.batch_steps.get(batch, 0) + 1

    @property
    def forwards(self) -> float:
        """This row's share of the target forwards after prefill: a step of b rows counts 1/b."""
        return sum(count / b for b, count in self.batch_steps.items())

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


@dataclass(eq=False)
class Sequence:
    """One request on its way through the scheduler: its prompt, its sampling, what it has emitted so far."""
    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams
    on_first_token: Callable[[int], None] | None = None
    on_done: Callable[[Result], None] | None = None
    tokens: list[int] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    generator: torch.Generator | None = None
    gamma: int = 0  # speculative SUTs: drafts for this sequence's next cycle (adaptive gamma changes it)
    t0: float = field(default_factory=time.perf_counter)

    def tail(self, n: int) -> list[int]:
        """The last n committed tokens (prompt, then emitted)."""
        return (self.prompt[-n:] + self.tokens)[-n:]

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.tokens)

    @property
    def budget(self) -> int:
        """Tokens this sequence may still emit."""
        return self.max_new_tokens - len(self.tokens)

    @property
    def result(self) -> Result:
        return Result(self.tokens, self.stats)

    def emit(self, new: list[int], eos_id: int | None) -> bool:
        """Append one step's tokens, stopping at EOS or max_new_tokens; True when the sequence is finished."""
        now = time.perf_counter() - self.t0
        for tok in new:
            self.tokens.append(tok)
            self.stats.token_times_s.append(now)
            if len(self.tokens) == 1 and self.on_first_token is not None:
                self.on_first_token(tok)
            if tok == eos_id or len(self.tokens) == self.max_new_tokens:
                return True
        return False


class Scheduler:
    """Admits, steps and retires sequences on one SUT, at most `max_batch` running at once.

    The SUT provides `reserve(rows)` (its KV cache pool, allocated once), `prefill(row, seq)` (the first
    token), `step(seqs)` (each running row's new tokens) and `move_row(src, dst)`."""

    def __init__(self, sut, max_batch: int):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.sut, self.max_batch = sut, max_batch
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # running[i] owns row i of the pool
        sut.reserve(max_batch)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def submit(self, seq: Sequence) -> None:
        self.sut.check(seq.prompt, seq.max_new_tokens)
        seq.generator = seq.params.generator(self.sut.device)
        self.waiting.append(seq)

    def drop(self) -> None:
        """Forget every sequence, waiting or running (the run has failed; their rows are simply reused)."""
        self.waiting.clear()
        self.running.clear()

    def run(self, seqs: list[Sequence] = ()) -> None:
        """Submit `seqs` and iterate until every sequence is finished."""
        for seq in seqs:
            self.submit(seq)
        while self.busy:
            self.iterate()

    @torch.inference_mode()
    def iterate(self) -> None:
        """Admit what fits, then one step for every running row; finished sequences leave at once."""
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting.popleft()
            self.running.append(seq)
            start = time.perf_counter()
            first = self.sut.prefill(len(self.running) - 1, seq)
            seq.stats.prefill_s = time.perf_counter() - start
            if seq.emit([first], self.sut.eos_id):
                self._finish(len(self.running) - 1)
        n = len(self.running)
        if not n:
            return
        start = time.perf_counter()
        new = self.sut.step(self.running)
        seconds = time.perf_counter() - start
        for row in reversed(range(n)):  # from the end: a finished row is refilled by a row already handled
            seq = self.running[row]
            seq.stats.record_step(seconds, n)
            if seq.emit(new[row], self.sut.eos_id):
                self._finish(row)

    def _finish(self, row: int) -> None:
        seq, last = self.running[row], self.running.pop()
        if seq is not last:
            self.running[row] = last
            self.sut.move_row(len(self.running), row)
        if seq.on_done is not None:
            seq.on_done(seq.result)
