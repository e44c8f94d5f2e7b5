"""How batching changes each SUT's throughput, predicted from batch-1 (and batch-2) runs and the analytic costs.

A forward of B rows costs what it cost at batch 1 (dispatch, Python and kernel launches included) plus what the
rows beyond the first add to its roofline time, from its FLOPs and bytes and the measured peaks, times a row
factor. Fitted on a batch-1 run alone the factor is 1: rows cost their roofline time. Fitted on batch 1 and
batch 2 it is what gives back the batch-2 run: on a CPU a row costs more than its roofline time (its work in the
kernels and in Python), which a batch-1 run cannot show.
A GPU overlaps a kernel's memory traffic with its arithmetic, so that time is the roofline's max(FLOPs / peak
FLOP/s, bytes / peak bandwidth); one CPU core does the two in turn, so on a CPU it is their sum. Rows share
the weight reads, so they come cheap while the weights dominate the bytes; each row's own arithmetic and its
KV cache reads do not shrink. A verify pass feeds gamma + 1 tokens per row for one read of the row's cache,
so it does gamma + 1 times the arithmetic of a decode step: past the point where that arithmetic dominates,
verifying drafts that get rejected costs real time, and speculative decoding stops paying unless its savings
on cache reads (long contexts) make up for it. A sample costs its own prefill plus its share of the steps:
    baseline: prefill + (N - 1) * decode(B) / B
    spec:     prefill + (N - 1) / E * (gamma * draft(B) + verify(B)) / B,   E = expected tokens per cycle.
A run's rows drain as its samples finish, so a run is compared with the model at its mean rows per forward.
"""
from dataclasses import dataclass
from functools import partial
from typing import Callable

from mlperf.cost import Cost
from roofline.analysis import ACT_BYTES, measured_times
from roofline.analytic import phase_costs
from roofline.peaks import roofline_s
from roofline.speculative import alpha_from_tested, expected_tokens_per_cycle, mean_batch, merged_cycles
from scenarios.records import RunRecord

MAX_BATCH = 4096  # the predicted crossover is searched up to here


@dataclass
class BatchModel:
    """Per-forward costs at any batch for one SUT, fitted on its batch-1 run (and its batch-2 run)."""
    prefill_s: float  # per sample, measured (prefill runs one row at a time)
    n_tokens: float  # per sample
    tokens_per_cycle: float  # 1 for the baseline; E(alpha, gamma) for a speculative SUT
    phases: dict[str, tuple[int, float, float]]  # phase -> (forwards per step, seconds at batch 1, row factor)
    costs: Callable[..., dict[str, Cost]]  # costs(batch=B): the analytic cost of each phase at B rows
    peaks: dict
    overlap: bool  # compute and memory traffic overlap (GPU), or take turns (CPU)

    def tokens_per_s(self, batch: float) -> float:
        """Predicted tokens per second of SUT time at `batch` rows (a run's mean rows per forward)."""
        costs, at_one = self.costs(batch=batch), self.costs(batch=1)
        step = sum(n * (seconds + factor * (self.roofline_s(costs[phase]) - self.roofline_s(at_one[phase])))
                   for phase, (n, seconds, factor) in self.phases.items())
        per_sample = self.prefill_s + (self.n_tokens - 1) / self.tokens_per_cycle * step / batch
        return self.n_tokens / per_sample

    def roofline_s(self, cost: Cost) -> float:
        return roofline_s(cost, self.peaks, self.overlap)


def fit(record: RunRecord, target, draft, peaks: dict, second: RunRecord | None = None) -> BatchModel:
    """The model of one SUT from its batch-1 run, and its batch-2 run when `second` is given (`measured_times`
    gives their seconds per forward)."""
    stats, sut = record.stats, record.sut
    if round(mean_batch(stats)) != 1:
        raise ValueError(f"the batching model is fitted on a batch-1 run, not one at batch {mean_batch(stats):.1f}")
    if second is not None and round(mean_batch(second.stats)) != 2:
        raise ValueError(f"the batching model's second run is at batch 2, not {mean_batch(second.stats):.1f}")
    prompt_len = round(sum(s.prompt_tokens for s in record.samples) / len(stats))
    n_tokens = sum(s.n_tokens for s in stats) / len(stats)
    cycles = merged_cycles(stats)
    speculative = bool(cycles)
    gamma = sut.gamma if speculative else 1
    costs = partial(phase_costs, target, prompt_len, round(prompt_len + n_tokens / 2), draft if speculative else None,
                    gamma, act_bytes=ACT_BYTES.get(sut.dtype, 4), draft_weight_bytes=sut.draft_weight_bytes,
                    drafter=sut.drafter if speculative else None, tree=sut.tree)
    overlap = sut.device.startswith("cuda")
    counts = {"draft": gamma, "verify": 1} if speculative else {"decode": 1}
    times, at_one = measured_times(stats), costs(batch=1)
    phases = {p: (n, max(times[p][0], roofline_s(at_one[p], peaks, overlap)), 1.0) for p, n in counts.items()}
    if second is not None:  # the row factor that makes each phase come out as the batch-2 run measured it
        times, at_two = measured_times(second.stats), costs(batch=mean_batch(second.stats))
        for p, (n, seconds, _) in phases.items():
            added = roofline_s(at_two[p], peaks, overlap) - roofline_s(at_one[p], peaks, overlap)
            phases[p] = (n, seconds, max(0.0, times[f"{p} x2"][0] - seconds) / added if added > 0 else 1.0)
    per_cycle = expected_tokens_per_cycle(alpha_from_tested(cycles), gamma) if speculative else 1.0
    return BatchModel(sum(s.prefill_s for s in stats) / len(stats), n_tokens, per_cycle, phases, costs, peaks, overlap)


def crossover(spec: BatchModel, baseline: BatchModel, limit: int = MAX_BATCH) -> int | None:
    """The smallest batch at which the speculative SUT is predicted slower than the baseline (None: not by `limit`)."""
    return next((b for b in range(1, limit + 1) if spec.tokens_per_s(b) < baseline.tokens_per_s(b)), None)
