"""How batching changes each SUT's throughput, predicted from batch-1 (and batch-2) runs and the analytic costs.

A forward of B rows costs what it cost at batch 1 (the weights' stream, dispatch, Python and kernel launches
included), plus what the rows beyond the first add at the roofs, plus a fixed overhead for each of those rows.
What a row adds at the roofs (peaks.py's `rows_s`) is its arithmetic and its logits, then its attention: the rows
share the weights' stream, but a row's arithmetic is not hidden under it. A core overlaps the two while the weights
dominate, so the second row comes cheap; from about 6 rows (a decode step of the shipped target) the linears are
bound by their arithmetic, and every row costs its own in full. A model that hid the arithmetic under the stream
(a forward at the longer of its FLOPs and its bytes, or its linears' and its attention's in turn) fitted the second
row's arithmetic into the overhead at batch 2 and then counted it twice from there on: the baseline's step at 64 rows
came out 21% dear (docs/history.md).
On a CPU the arithmetic runs at the rate the run's own prefill achieved (its FLOPs over its seconds, a forward of
many tokens on the same kernels, at most the compute peak), not at the peak of a bare linear: a forward's layer
norms, softmax and GELU run at a fraction of it, and a VM's slow spell slows the prefill of the same run. (A GPU's
prefill is bound by its kernel launches, and says nothing of its arithmetic.) Fitted on a batch-1 run
alone the overhead is 0. Fitted on batch 1 and batch 2 it is what gives back the batch-2 run: what a row costs beyond
its arithmetic and bytes (its Python, its share of the kernels' setup), which a batch-1 run cannot show. It is a fixed
cost, not a multiple of the row's time at the roofs: a draft step's row adds a few microseconds there and tens
measured, and a multiple fitted at batch 2 put every speculative SUT's drafting 30-100% over what the sweeps measured
at batch 64. A verify pass feeds gamma + 1 tokens per row for one read of the row's cache, so it does gamma + 1 times
the arithmetic of a decode step: once that arithmetic dominates, verifying drafts that get rejected costs real time,
and speculative decoding stops paying unless its savings on cache reads (long contexts) make up for it. A sample
costs its own prefill plus its share of the steps:
    baseline: prefill + (N - 1) * decode(B) / B
    spec:     prefill + (N - 1) / T * (draft(B) + verify(B)) / B,   T = tokens per cycle
where T is what the batch-1 run measured (greedy drafts and their acceptance do not depend on the batch;
Leviathan's E(alpha, gamma) from one alpha came out 4% above it for the shipped pair, whose acceptance comes in
runs), and draft(B) is a cycle's drafting, gamma draft steps (a tree's depth).
A run's rows drain as its samples finish, so a run is compared with the model at its mean rows per forward.
"""
from dataclasses import dataclass
from functools import partial
from typing import Callable

from mlperf.cost import Cost
from roofline.analysis import ACT_BYTES, measured_times
from roofline.analytic import drafts_per_cycle, phase_costs
from roofline.peaks import rows_s
from roofline.speculative import mean_batch
from scenarios.records import RunRecord
from suts.engine.stats import Stats

MAX_BATCH = 4096  # the predicted crossover is searched up to here


@dataclass
class BatchModel:
    """Per-cycle costs at any batch for one SUT, fitted on its batch-1 run (and its batch-2 run); a baseline's
    cycle is one decode step."""
    prefill_s: float  # per sample, measured (prefill runs one row at a time)
    n_tokens: float  # per sample
    tokens_per_cycle: float  # 1 for the baseline; measured at batch 1 for a speculative SUT
    # phase -> (forwards a cycle, seconds a cycle at batch 1, seconds a cycle each row beyond the first adds beyond what
    # it adds at the roofs)
    phases: dict[str, tuple[int, float, float]]
    costs: Callable[..., dict[str, Cost]]  # costs(batch=B): one forward of each phase at B rows, analytic
    peaks: dict  # the machine's; on a CPU, the compute peak at the rate the batch-1 run's prefill achieved

    def tokens_per_s(self, batch: float) -> float:
        """Predicted tokens per second of SUT time at `batch` rows (a run's mean rows per forward)."""
        costs, at_one = self.costs(batch=batch), self.costs(batch=1)
        cycle = sum(seconds + n * (rows_s(costs[p], self.peaks) - rows_s(at_one[p], self.peaks))
                    + overhead * (batch - 1) for p, (n, seconds, overhead) in self.phases.items())
        per_sample = self.prefill_s + (self.n_tokens - 1) / self.tokens_per_cycle * cycle / batch
        return self.n_tokens / per_sample


def cycle_seconds(stats: list[Stats]) -> dict[str, float]:
    """Seconds of each phase in one cycle of a run, for all the rows that shared it: drafting and verify pass, or
    one decode step."""
    times = {name.split()[0]: seconds for name, (seconds, _) in measured_times(stats).items()}
    if "cycle" in times:
        return {"draft": times["cycle"] - times["verify"], "verify": times["verify"]}
    return {"decode": times["decode"]}


def fit(record: RunRecord, target, draft, peaks: dict, second: RunRecord | None = None) -> BatchModel:
    """The model of one SUT from its batch-1 run, and its batch-2 run when `second` is given."""
    stats, sut = record.stats, record.sut
    if round(mean_batch(stats)) != 1:
        raise ValueError(f"the batching model is fitted on a batch-1 run, not one at batch {mean_batch(stats):.1f}")
    if second is not None and round(mean_batch(second.stats)) != 2:
        raise ValueError(f"the batching model's second run is at batch 2, not {mean_batch(second.stats):.1f}")
    prompt_len = round(sum(s.prompt_tokens for s in record.samples) / len(stats))
    n_tokens = sum(s.n_tokens for s in stats) / len(stats)
    n_cycles = sum(s.cycles for s in stats)
    speculative = n_cycles > 0
    gamma = sut.gamma if speculative else 1
    costs = partial(phase_costs, target, prompt_len, round(prompt_len + n_tokens / 2), draft if speculative else None,
                    gamma, act_bytes=ACT_BYTES.get(sut.dtype, 4), draft_weight_bytes=sut.draft_weight_bytes,
                    target_weight_bytes=sut.target_weight_bytes, drafter=sut.drafter if speculative else None,
                    tree=sut.tree)
    counts = {"draft": drafts_per_cycle(gamma, sut.tree), "verify": 1} if speculative else {"decode": 1}
    at_one, seconds = costs(batch=1), cycle_seconds(stats)
    prefill_s = sum(s.prefill_s for s in stats) / len(stats)
    if sut.device == "cpu" and prefill_s > 0:  # a GPU's prefill of a few hundred tokens is bound by its launches
        peaks = dict(peaks, flops_per_s=min(peaks["flops_per_s"], at_one["prefill"].flops / prefill_s))
    phases = {p: (n, seconds[p], 0.0) for p, n in counts.items()}
    if second is not None:  # the overhead a row adds that makes each phase come out as the batch-2 run measured it
        rows = mean_batch(second.stats)
        at_two, measured = costs(batch=rows), cycle_seconds(second.stats)
        for p, (n, seconds, _) in phases.items():
            added = n * (rows_s(at_two[p], peaks) - rows_s(at_one[p], peaks))
            phases[p] = (n, seconds, max(0.0, measured[p] - seconds - added) / (rows - 1))
    per_cycle = sum(s.n_tokens - 1 for s in stats) / n_cycles if speculative else 1.0  # the first is prefill's
    return BatchModel(prefill_s, n_tokens, per_cycle, phases, costs, peaks)


def crossover(spec: BatchModel, baseline: BatchModel, limit: int = MAX_BATCH) -> int | None:
    """The smallest batch at which the speculative SUT is predicted slower than the baseline (None: not by `limit`)."""
    return next((b for b in range(1, limit + 1) if spec.tokens_per_s(b) < baseline.tokens_per_s(b)), None)
