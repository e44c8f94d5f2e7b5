"""What one request's decoding measured: token times, its share of prefill, decode steps, drafts and verify
passes, and each speculative cycle's acceptance. A SUT fills it; the roofline, the reports and the records read
it."""
import math
from dataclasses import dataclass, field


@dataclass
class Stats:
    """Per-sample statistics. Time shared by a batch is divided among the rows that ran in it, so every
    row's `prefill_s + decode_s` adds up to the SUT's busy time. Speculative SUTs call `record_cycle` once
    per verify pass."""
    token_times_s: list[float] = field(default_factory=list)  # when each token was emitted, from submission
    prefill_s: float = 0.0  # this row's prefill: its share (by tokens) of the forwards its prompt's chunks went in
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
    def rejected(self) -> int:
        """Drafts the target tested and rejected: one per cycle that stopped before its last draft."""
        return sum(c for g, counts in self.cycle_hist.items() for k, c in enumerate(counts) if k < g)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def merged_cycles(stats: list["Stats"]) -> dict[int, list[int]]:
    """Every sample's cycle_hist added up: cycles[g][k] counts cycles that drafted g and accepted k."""
    merged: dict[int, list[int]] = {}
    for s in stats:
        for g, counts in s.cycle_hist.items():
            row = merged.setdefault(g, [0] * (g + 1))
            for k, c in enumerate(counts):
                row[k] += c
    return dict(sorted(merged.items()))


def conditional_acceptance(cycles: dict[int, list[int]]) -> list[float | None]:
    """Acceptance per draft position as the field reports it: of the cycles that tested draft i (drafted at least
    i, accepted the i-1 before it), the share that accepted it; None where none tested it."""
    rates = []
    for i in range(1, max(cycles, default=0) + 1):
        tested = sum(c for g, counts in cycles.items() if g >= i for k, c in enumerate(counts) if k >= i - 1)
        passed = sum(c for g, counts in cycles.items() if g >= i for k, c in enumerate(counts) if k >= i)
        rates.append(passed / tested if tested else None)
    return rates


def accepted_lengths(cycles: dict[int, list[int]]) -> list[int]:
    """The histogram of drafts accepted a cycle: [cycles accepting 0, 1, ...] over every cycle's length."""
    hist = [0] * (max(cycles, default=0) + 1)
    for counts in cycles.values():
        for k, c in enumerate(counts):
            hist[k] += c
    return hist


def acceptance(cycles: dict[int, list[int]]) -> dict:
    """A run's acceptance as engines report it: the mean acceptance length (tokens a cycle, the target's own
    included), the conditional acceptance per draft position and the histogram of accepted drafts a cycle."""
    hist = accepted_lengths(cycles)
    n = sum(hist)
    return {"mean_acceptance_length": 1 + sum(k * c for k, c in enumerate(hist)) / n if n else math.nan,
            "conditional_acceptance": conditional_acceptance(cycles), "accepted_per_cycle": hist}
