"""spec-auto's speculation length: every cycle, the number of drafts (0 = a plain decode step) whose expected
tokens per second is highest for the batch that runs it.

Tokens: 1 + the chance that the first 1, 2, ..., g drafts are all accepted, each from the run's measured chance
that draft i is accepted once drafts 1..i-1 were (not one alpha for all: acceptance comes in runs, so after a few
accepted drafts the next is likelier), capped by what each row may still emit. Time: g draft steps as this run
measured them at (or nearest) this batch, for any drafter, plus the target's pass of g + 1 tokens per row costed
from its FLOPs and bytes (mlperf/cost.py) at the batch and context on an effective roofline (overhead, bandwidth,
FLOP/s) fitted to three timed forwards of the target before the run, then scaled by what the nearest shape measured
in this run. Every EXPLORE-th cycle tries another length (one more, one fewer, none), so a wrong prediction gets
measured.
"""
import itertools
import math
import time

import numpy as np
import torch

from mlperf import devices
from mlperf.chunk import Chunk
from mlperf.cost import forward_cost
from mlperf.model import GPT

EXPLORE = 16  # every 16th cycle measures another length (one in 48 a plain decode step: ~1% at batch 1)
SMOOTHING = 0.25  # the weight of a new measurement in a running mean
OUTLIER = 2.0  # a measurement above this many times the running mean counts as this many times it
CALIBRATION_ROWS = 32  # the widest of the three timed forwards: enough rows for the FLOPs to show


def nonnegative_fit(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least-squares coefficients, none negative: the best fit over the subsets of features it may use."""
    best, best_error = np.zeros(features.shape[1]), math.inf
    for k in range(1, features.shape[1] + 1):
        for used in itertools.combinations(range(features.shape[1]), k):
            coef = np.linalg.lstsq(features[:, used], seconds, rcond=None)[0]
            error = float(np.sum((features[:, used] @ coef - seconds) ** 2))
            if (coef >= 0).all() and error < best_error:
                best, best_error = np.zeros(features.shape[1]), error
                best[list(used)] = coef
    return best


def running_mean(old: float | None, new: float) -> float:
    """The mean moved towards a new measurement (which starts it where there is none, or 0), upwards by at most
    SMOOTHING x (OUTLIER - 1) of itself: a one-off stall (a graph captured at a new key length, a busy machine)
    pulls the plan little, a lasting rise goes through in a few cycles."""
    return new if not old else (1 - SMOOTHING) * old + SMOOTHING * min(new, OUTLIER * old)


def nearest(table: dict, batch: int, tokens: int = 1):
    """The entry of a table keyed by (batch, tokens) nearest to this shape: the same batch first, then the
    nearest batch (by ratio), then the nearest token count; None for an empty table."""
    if not table:
        return None
    return table[min(table, key=lambda k: (abs(math.log(k[0] / batch)), abs(k[1] - tokens)))]


def best_length(rate, most: int) -> int:
    """The number of drafts, 0 to `most`, whose cycle emits the most tokens a second (`rate(g)`), the fewer on a
    tie: what spec-auto plans from its measured costs, and the roofline's best gamma from its roofs."""
    return max(range(most + 1), key=lambda g: (rate(g), -g))


class Planner:
    def __init__(self, target: GPT, max_gamma: int):
        self.target, self.max_gamma = target, max_gamma
        self.act_bytes = target.transformer.wte.weight.element_size()
        self.coef: np.ndarray | None = None  # seconds per forward, per byte, per FLOP (calibrate)
        self.scale: dict[tuple[int, int], float] = {}  # (batch, tokens per row) -> measured / predicted seconds
        self.draft_step_s: dict[tuple[int, int], float] = {}  # (batch, 1) -> seconds per draft step
        self.seen: set[tuple[int, int]] = set()  # (batch, drafts) cycles run once: timed from their second on
        self.tested = [0] * (max_gamma + 1)  # tested[i]: cycles whose draft i the target tested (1..i-1 accepted)
        self.passed = [0] * (max_gamma + 1)  # passed[i]: of those, cycles that accepted draft i
        self.cycles = 0

    def features(self, batch: int, tokens: int, context: int) -> np.ndarray:
        cost = forward_cost(self.target.config, context, tokens, batch=batch, act_bytes=self.act_bytes)
        return np.array([1.0, cost.bytes, cost.flops])

    @torch.inference_mode()
    def calibrate(self, target=None) -> None:
        """The effective roofline: three forwards of the target as the SUT runs it (`target`, its runner; default
        the modules) (1 row x 1 token, many rows x 1 token, many rows x max_gamma + 1 tokens) timed, best of three
        each, on a cache a quarter full."""
        target = target or self.target
        config = self.target.config
        context, tokens = config.block_size // 4, min(self.max_gamma + 1, config.block_size // 4)
        cache = self.target.new_cache(CALIBRATION_ROWS, max_len=context + tokens)
        device = self.target.transformer.wte.weight.device
        shapes = [(1, 1), (CALIBRATION_ROWS, 1), (CALIBRATION_ROWS, tokens)]
        seconds = []
        for batch, t in shapes:
            x, view, best = torch.zeros(batch, t, dtype=torch.long, device=device), cache.rows(0, batch), math.inf
            for _ in range(4):  # the first call warms up
                view.restart(context)
                start = time.perf_counter()
                target(x, Chunk(view))
                devices.synchronize(device)
                best = min(best, time.perf_counter() - start)
            seconds.append(best)
        self.coef = nonnegative_fit(np.array([self.features(b, t, context) for b, t in shapes]), np.array(seconds))

    def target_s(self, batch: int, tokens: int, context: int) -> float:
        """Predicted seconds of a target pass of `tokens` per row over `batch` rows at `context`."""
        return float(self.features(batch, tokens, context) @ self.coef) * (nearest(self.scale, batch, tokens) or 1.0)

    def expected_tokens(self, g: int) -> float:
        """A row's expected tokens from a cycle of g drafts: 1 + P(draft 1 accepted) + P(drafts 1, 2 accepted) ...
        Each conditional chance starts from the one before it (the first from 1/2), as if tested twice."""
        tokens = reach = 1.0
        chance = 0.5
        for i in range(1, g + 1):
            chance = (self.passed[i] + 2 * chance) / (self.tested[i] + 2)
            reach *= chance
            tokens += reach
        return tokens

    def choose(self, caps: list[int], context: int) -> int:
        """The number of drafts for this cycle: `caps` are the most drafts each row may take, `context` the rows'
        mean length."""
        batch = len(caps)
        draft_s = nearest(self.draft_step_s, batch) or 0.0  # not measured yet: try drafting, and measure it
        expected = [self.expected_tokens(g) for g in range(self.max_gamma + 1)]

        def rate(g: int) -> float:
            drafted = min(g, max(caps))
            tokens = sum(expected[min(g, c)] for c in caps)
            return tokens / (drafted * draft_s + self.target_s(batch, 1 + drafted, context))

        best = best_length(rate, self.max_gamma)
        self.cycles += 1
        if self.cycles % EXPLORE == 0:  # measure in turn one draft fewer, one more, and a plain decode step
            turn = (self.cycles // EXPLORE) % 3
            best = 0 if turn == 2 else min(max(best + (1 if turn else -1), 0), self.max_gamma)
        return best

    def observe(self, batch: int, drafted: int, context: int, draft_s: float, verify_s: float, *,
                cycles: list[tuple[int, int]]) -> None:
        """What a cycle measured: its draft and verify seconds, and each row's (drafts, accepted). A shape's first
        cycle counts its acceptance but not its time: it pays one-time costs (on a GPU, capturing the chain's and
        the verify's CUDA graphs) that would make drafting look many times dearer than it is; later captures (at a
        new key length) are outliers that running_mean caps."""
        if (batch, drafted) in self.seen:
            if drafted:
                self.draft_step_s[batch, 1] = running_mean(self.draft_step_s.get((batch, 1)), draft_s / drafted)
            predicted = float(self.features(batch, 1 + drafted, context) @ self.coef)
            if predicted > 0:
                key = (batch, 1 + drafted)
                self.scale[key] = running_mean(self.scale.get(key), verify_s / predicted)
        self.seen.add((batch, drafted))
        for g, k in cycles:
            for i in range(1, min(g, k + 1) + 1):
                self.tested[i] += 1
                self.passed[i] += k >= i
