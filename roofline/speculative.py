"""Step accounting and the speculative speedup model (Leviathan et al. 2023), from per-sample `Stats`.

One definition of each figure, used by `bench`, the roofline sidecar and the smoke gate:
- a decode step is the wall time of one target forward after prefill for all the rows of a batch, sampling
  and bookkeeping included; each row carries its share (the step's time / its rows), so per row a step
  costs sum(decode_s) / sum(steps);
- c (draft cost ratio) is one draft step / one decode step; the verify ratio is one verify pass / one decode
  step, both per row, so a batched run is costed against a baseline at the same batch;
- alpha, the chance that a draft is accepted, is estimated from the drafts the target actually tested: a
  cycle stops at its first rejection, so the drafts after it were never tested and accepted / drafted
  (the draft acceptance rate serving engines report) underestimates alpha;
- the predicted speedup takes a cycle's tokens from the conditional acceptance measured at each draft position,
  as engines report it, not from one alpha: acceptance comes in runs, so one alpha misjudges long chains.
"""
import math
from dataclasses import dataclass

from suts.engine.stats import Stats, conditional_acceptance, merged_cycles


def expected_tokens_per_cycle(alpha: float, gamma: int) -> float:
    """Tokens one cycle emits when each draft is accepted independently with probability alpha."""
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def mean_batch(stats: list[Stats]) -> float:
    """Rows per decode step, averaged over the steps (not over the rows)."""
    forwards = sum(s.forwards for s in stats)
    return sum(s.steps for s in stats) / forwards if forwards else 1.0


def decode_step_s(stats: list[Stats]) -> float:
    """Mean wall time of one decode step (one target forward for every row of a batch), prefill excluded."""
    forwards = sum(s.forwards for s in stats)
    return sum(s.decode_s for s in stats) / forwards if forwards else math.nan


def row_step_s(stats: list[Stats]) -> float:
    """A decode step's time per row: what one more token of one row costs at the run's batch."""
    steps = sum(s.steps for s in stats)
    return sum(s.decode_s for s in stats) / steps if steps else math.nan


def sut_seconds(stats: list[Stats]) -> float:
    """The SUT's busy time: each row's own prefill, plus its share of the decode steps it ran in."""
    return sum(s.prefill_s + s.decode_s for s in stats)


def generation_rate(stats: list[Stats]) -> float:
    """Tokens per second of SUT time (prefill + decode), independent of LoadGen's scheduling."""
    return sum(s.n_tokens for s in stats) / sut_seconds(stats)


def decode_rate(stats: list[Stats]) -> float:
    """Tokens after the first per second of decode time: what speculative decoding speeds up."""
    seconds = sum(s.decode_s for s in stats)
    return sum(s.n_tokens - 1 for s in stats) / seconds if seconds > 0 else math.nan


def alpha_from_tested(cycles: dict[int, list[int]]) -> float:
    """accepted / (accepted + rejections): every tested draft is either accepted or the cycle's one rejection."""
    merged = Stats(cycle_hist=cycles)
    accepted, rejected = merged.accepted, merged.rejected
    return accepted / (accepted + rejected) if accepted + rejected else math.nan


def positional_tokens_per_cycle(cycles: dict[int, list[int]]) -> float:
    """Tokens a cycle emits by the conditional acceptance measured at each draft position (p_i): 1 + p_1 +
    p_1 p_2 + ... over each cycle's own drafts, averaged over the cycles."""
    rates = [r or 0.0 for r in conditional_acceptance(cycles)]  # None: no cycle reached that position
    total = 0.0
    for g, counts in cycles.items():
        tokens = reach = 1.0
        for rate in rates[:g]:
            reach *= rate
            tokens += reach
        total += sum(counts) * tokens
    n_cycles = sum(sum(counts) for counts in cycles.values())
    return total / n_cycles if n_cycles else math.nan


@dataclass
class SpeculativeFigures:
    gamma: float  # mean drafts per cycle (the gamma each cycle actually used)
    acceptance_rate: float  # accepted / drafted
    alpha: float  # per-draft acceptance probability, from tested drafts
    tokens_per_cycle: float  # measured: (accepted + cycles) / cycles
    expected_tokens_per_cycle: float  # Leviathan's formula at alpha (as if each draft were accepted independently)
    positional_tokens_per_cycle: float  # from the conditional acceptance per draft position, as engines report it
    draft_cost_ratio: float  # c
    verify_cost_ratio: float
    predicted_speedup: float  # positional tokens per cycle / (gamma c + verify ratio); nan if a SUT times neither
    measured_speedup: float  # decode rate against the baseline's (prefill excluded on both sides)
    roof_cycle_steps: float = math.nan  # a cycle's cost at the roof (drafts and verify), in decode steps at the roof
    ceiling_speedup: float = math.nan  # this pair's limit here: measured tokens per cycle / roof_cycle_steps


def speculative_figures(spec: list[Stats], baseline: list[Stats]) -> SpeculativeFigures:
    """The speedup model of a speculative run, costed against a baseline run that matches it."""
    cycles = merged_cycles(spec)
    merged = Stats(cycle_hist=cycles)
    n_cycles, drafted, accepted = merged.cycles, merged.drafted, merged.accepted
    alpha = alpha_from_tested(cycles)
    expected = sum(sum(c) * expected_tokens_per_cycle(alpha, g) for g, c in cycles.items()) / n_cycles
    positional = positional_tokens_per_cycle(cycles)
    step = row_step_s(baseline)
    c = sum(s.draft_s for s in spec) / drafted / step
    v = sum(s.verify_s for s in spec) / n_cycles / step
    gamma = drafted / n_cycles
    cycle_cost = gamma * c + v
    return SpeculativeFigures(
        gamma=gamma, acceptance_rate=accepted / drafted, alpha=alpha, tokens_per_cycle=(accepted + n_cycles) / n_cycles,
        expected_tokens_per_cycle=expected, positional_tokens_per_cycle=positional, draft_cost_ratio=c,
        verify_cost_ratio=v, predicted_speedup=positional / cycle_cost if cycle_cost > 0 else math.nan,
        measured_speedup=decode_rate(spec) / decode_rate(baseline))
