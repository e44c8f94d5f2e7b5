"""The one iteration-level scheduler every batched SUT runs on (continuous batching, as in Orca and vLLM).

Sequences wait in a queue. Each iteration runs one decode step, or one speculative cycle, for all running rows
together, then admits waiting sequences into the free rows of the SUT's KV cache pool and prefills: the prompts
being prefilled, oldest first, get chunks of what the step left of the token budget (chunked prefill, as in
Sarathi-Serve and vLLM), all in one packed forward. A prompt's first token streams the moment its last chunk
is in, and its row joins the next step. A sequence leaves the batch the moment it reaches max_new_tokens or EOS
and its row is freed: the last running row moves into it, and the prefilling rows move down after it, so the
running rows are always rows 0..n-1, the prefilling ones the rows after them, and a step works on one slice.
"""
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from mlperf.rules import positive_int
from suts.engine.sampling import SamplingParams
from suts.engine.stats import Stats


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
    on_tokens: Callable[[list[int]], None] | None = None  # each step's new tokens, as they are emitted (streaming)
    # an EOS ends the sequence only from this many tokens on (a client's min_tokens; ignore_eos: max_new_tokens, so that
    # only the budget ends it)
    min_tokens: int = 0
    cancelled: bool = False  # set from any thread (a client gone): the scheduler drops it and frees its row
    tokens: list[int] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    generator: torch.Generator | None = None
    gamma: int = 0  # speculative SUTs: drafts for this sequence's next cycle (adaptive gamma changes it)
    prefilled: int = 0  # prompt tokens in the KV cache so far (chunked prefill)
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
        """Append one step's tokens, stopping at EOS (once min_tokens are out) or max_new_tokens; True when the
        sequence is finished."""
        now, start, done = time.perf_counter() - self.t0, len(self.tokens), False
        for tok in new:
            self.tokens.append(tok)
            self.stats.token_times_s.append(now)
            if len(self.tokens) == 1 and self.on_first_token is not None:
                self.on_first_token(tok)
            if tok == eos_id and len(self.tokens) >= self.min_tokens or len(self.tokens) == self.max_new_tokens:
                done = True
                break
        if self.on_tokens is not None:
            self.on_tokens(self.tokens[start:])
        return done


class Scheduler:
    """Admits, steps, prefills and retires sequences on one SUT, at most `max_batch` holding rows at once.

    `token_budget`: the tokens one iteration feeds the target at most, the step's first (1 per decoding row, 1 +
    gamma per speculative row); prefill gets the rest, and at least a quarter of the budget, so that a full batch
    never starves a waiting prompt. None: every admitted prompt is prefilled whole in the next iteration.
    The SUT provides `reserve(rows)` (its KV cache pool, allocated once), `prefill(first, seqs, chunks)` (the
    first token of each prompt completed), `step(seqs)` (each running row's new tokens), `step_tokens(seqs)` and
    `move_row(src, dst)`."""

    def __init__(self, sut, max_batch: int, token_budget: int | None = None):
        positive_int("max_batch", max_batch)
        if token_budget is not None:
            positive_int("token_budget", token_budget)
        self.sut, self.max_batch, self.token_budget = sut, max_batch, token_budget
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # running[i] owns row i of the pool
        self.prefilling: list[Sequence] = []  # prefilling[j] owns row len(running) + j, oldest first
        sut.reserve(max_batch)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling)

    @property
    def rows(self) -> int:
        """Sequences holding a row of the pool (running or prefilling)."""
        return len(self.running) + len(self.prefilling)

    def submit(self, seq: Sequence) -> None:
        self.sut.check(seq.prompt, seq.max_new_tokens)
        seq.generator = seq.params.generator(self.sut.device)
        self.waiting.append(seq)

    def drop(self) -> None:
        """Forget every sequence, waiting, prefilling or running (the run has failed; their rows are reused)."""
        self.waiting.clear()
        self.running.clear()
        self.prefilling.clear()

    def run(self, seqs: list[Sequence] = ()) -> None:
        """Submit `seqs` and iterate until every sequence is finished."""
        for seq in seqs:
            self.submit(seq)
        while self.busy:
            self.iterate()

    @torch.inference_mode()
    def iterate(self) -> None:
        """One step for every running row, then admit what fits in the rows free and prefill chunks; finished
        sequences leave at once (so a row the step frees is prefilled again in the same iteration), and so do
        cancelled ones, before the step (a cancelled prompt being prefilled leaves once its prefill is done)."""
        self._drop_cancelled()
        used = 0
        if n := len(self.running):
            used = self.sut.step_tokens(self.running)
            start = time.perf_counter()
            new = self.sut.step(self.running)
            seconds = time.perf_counter() - start
            for row in reversed(range(n)):  # from the end: a finished row is refilled by a row already handled
                seq = self.running[row]
                seq.stats.record_step(seconds, n)
                if seq.emit(new[row], self.sut.eos_id):
                    self._finish(row)
        while self.waiting and len(self.running) + len(self.prefilling) < self.max_batch:
            self.prefilling.append(self.waiting.popleft())
        if self.prefilling:
            budget = self.token_budget
            self._prefill(None if budget is None else max(budget - used, budget // 4, 1))

    def _drop_cancelled(self) -> None:
        if any(seq.cancelled for seq in self.waiting):
            self.waiting = deque(seq for seq in self.waiting if not seq.cancelled)
        for row in reversed(range(len(self.running))):
            if self.running[row].cancelled:
                self._finish(row, done=False)

    def _prefill(self, budget: int | None) -> None:
        """The prefilling prompts' next chunks, oldest first, `budget` tokens at most, in one call to the SUT; the
        prompts completed (always the oldest) stream their first token and join the running rows."""
        seqs, chunks = [], []
        for seq in self.prefilling:
            left = len(seq.prompt) - seq.prefilled
            chunk = left if budget is None else min(left, budget - sum(chunks))
            if chunk < 1:
                break
            seqs.append(seq)
            chunks.append(chunk)
        start = time.perf_counter()
        firsts = self.sut.prefill(len(self.running), seqs, chunks)
        seconds = time.perf_counter() - start
        for seq, chunk in zip(seqs, chunks):
            seq.prefilled += chunk
            seq.stats.prefill_s += seconds * chunk / sum(chunks)
        for seq, first in zip(seqs, firsts):
            if first is None:
                break
            self.running.append(self.prefilling.pop(0))  # its row is the first after the running ones already
            if seq.emit([first], self.sut.eos_id):
                self._finish(len(self.running) - 1)

    def _finish(self, row: int, done: bool = True) -> None:
        seq, last = self.running[row], self.running.pop()
        if seq is not last:
            self.running[row] = last
            self.sut.move_row(len(self.running), row)
        n = len(self.running)
        for j in range(len(self.prefilling)):  # the prefilling rows follow the running ones
            self.sut.move_row(n + j + 1, n + j)
        if done and seq.on_done is not None:
            seq.on_done(seq.result)
