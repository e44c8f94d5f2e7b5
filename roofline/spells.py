"""What the machine's spells and its caches do to a step: `spells` repeats one step to show how far the machine alone
moves it, `against_a_read` sets it against a read of its bytes taken in turns with it (a roof that moves with the
spells), and `warm_and_cold` times a call straight after itself and after a stream that pushes its data out of the
caches (a step's bookkeeping, a draft's chain after a verify pass)."""
import time
from dataclasses import dataclass

import numpy as np
import torch

from mlperf.cost import forward_cost
from mlperf.model import GPT
from mlperf.pages import huge_pages
from roofline.profile import CONTEXT, greedy_step, phase_forward, reference_ids
from suts.fast.packed import weight_bytes
from suts.fast.runner import as_runner


def warm_and_cold(fn, flush, repeats: int = 51) -> tuple[float, float]:
    """Median seconds of fn() run again straight after itself, and right after flush() (a forward of the target,
    whose stream of weights pushes what fn reads out of the caches)."""
    warm, cold = [], []
    for _ in range(repeats):
        fn()
        start = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - start)
        flush()
        start = time.perf_counter()
        fn()
        cold.append(time.perf_counter() - start)
    return sorted(warm)[repeats // 2], sorted(cold)[repeats // 2]


@torch.inference_mode()
def bookkeeping_s(model: GPT, repeats: int = 51) -> tuple[float, float]:
    """A step's own Python around its forward (the new token into a tensor, the logits' argmax into a list, a
    cache's length set), warm and right after a decode forward at context 256 (warm_and_cold)."""
    forward = phase_forward(model, CONTEXT, 1)
    cache, logits = model.new_cache(1), forward()

    def bookkeeping():
        cache.restart([CONTEXT])
        return torch.tensor([[7]]), logits[:, -1].argmax(-1).tolist()
    return warm_and_cold(bookkeeping, forward, repeats)


@torch.inference_mode()
def draft_chain_s(target: GPT, draft: GPT, gamma: int, repeats: int = 51) -> tuple[float, float]:
    """The draft's greedy chain as a cycle runs it (a catch-up of 2 tokens and gamma steps, Runner.greedy) at context
    256, warm and right after the target's verify pass of gamma + 1 tokens (warm_and_cold)."""
    ids, run = reference_ids(draft, 2)[0].tolist(), as_runner(draft)
    chain = phase_forward(draft, CONTEXT, 2, call=lambda x, chunk: run.greedy(ids, chunk.cache, [2], gamma))
    return warm_and_cold(chain, phase_forward(target, CONTEXT, gamma + 1), repeats)


@dataclass
class Spells:
    """One step repeated, in ms: its percentiles, the lowest and highest median of a span of steps in a row, and
    how alike one step's time is to the next's (their correlation)."""
    steps: int
    percentiles: dict[int, float]
    spans: tuple[float, float]
    span: int
    correlation: float


@torch.inference_mode()
def spells(model: GPT, steps: int = 1000, span: int = 100) -> Spells:
    """The greedy decode step at context CONTEXT (greedy_step), `steps` times in a row. A VM's memory speed moves in
    spells of hundreds of ms: a run's mean step inherits them, while a best-of timing (the peaks, the profile's phases)
    catches the fastest."""
    step = greedy_step(model, CONTEXT, 1)
    step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    ms = 1e3 * np.array(times)
    medians = [float(np.median(ms[i:i + span])) for i in range(0, steps - span + 1, span)]
    return Spells(steps, {p: float(np.percentile(ms, p)) for p in (10, 50, 90)}, (min(medians), max(medians)), span,
                  float(np.corrcoef(ms[:-1], ms[1:])[0, 1]))


@dataclass
class InTurns:
    """A step and a plain read of its bytes, one after the other: the read's time over the step's, pair by pair,
    at the 10th, 50th and 90th percentiles."""
    pairs: int
    bytes: float
    fractions: dict[int, float]


@torch.inference_mode()
def against_a_read(model: GPT, pairs: int = 201) -> InTurns:
    """The greedy decode step at context CONTEXT and a plain read of as many bytes as it moves (on huge pages, as the
    weights are), `pairs` times in turns: a VM's spells move both alike, so the read's time over the step's is the
    step's fraction of a memory roof measured in the same spell, where the peaks' best-of timing catches the fastest."""
    step = greedy_step(model, CONTEXT, 1)
    moved = forward_cost(model.config, CONTEXT, 1, weight_bytes_per_param=weight_bytes(model)).bytes
    buffer = huge_pages([torch.ones(int(moved) // 4)])[0]
    step()
    buffer.sum()
    fractions = []
    for _ in range(pairs):
        start = time.perf_counter()
        step()
        middle = time.perf_counter()
        buffer.sum()
        fractions.append((time.perf_counter() - middle) / (middle - start))
    return InTurns(pairs, moved, {p: float(np.percentile(fractions, p)) for p in (10, 50, 90)})
