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
from suts.stats import Stats


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
