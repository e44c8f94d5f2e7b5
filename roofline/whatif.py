"""What the roofline predicts of a speculative pair at a set acceptance: each phase at its roofs (analytic FLOPs and
bytes against this machine's measured peaks), a cycle's expected tokens from the per-position rates.

decode speedup = mean acceptance length x one decode step at its roofs / one cycle at its roofs (gamma draft steps
and a verify pass of gamma+1 rows); end to end, the prompt's prefill is added on both sides, and the draft's own
reading of the prompt on the speculative side. The best gamma for an acceptance is the one with the highest
predicted decode speedup (0 where no chain beats plain decoding), chosen as spec-auto's planner chooses from its
measured costs (suts/planner.py); the break-even acceptance, where it falls to 1.
"""
from dataclasses import dataclass

from mlperf.cost import forward_cost
from mlperf.model import GPTConfig
from roofline.analytic import phase_costs
from roofline.peaks import cycle_roofline_s, roofline_s
from suts.planner import best_length
from suts.synthetic import Acceptance

LONGEST = 8  # the longest chain the best gamma is chosen among


@dataclass(frozen=True)
class Pair:
    """A target and its draft as the roofline costs them: geometries, and bytes per linear weight each streams
    (2.0 for fp16 panels, 1.0 for int8; None: the activations' dtype)."""
    target: GPTConfig
    draft: GPTConfig
    target_weight_bytes: float | None = 2.0
    draft_weight_bytes: float | None = 2.0
    act_bytes: int = 4


@dataclass(frozen=True)
class Prediction:
    decode_s: float  # one decode step at its roofs
    draft_s: float  # one draft step (averaged over a cycle's)
    verify_s: float  # one verify pass of gamma+1 rows
    prefill_s: float
    mean_length: float  # tokens a cycle
    decode_speedup: float
    end_to_end_speedup: float

    @property
    def verify_steps(self) -> float:
        """A verify pass in decode steps at the roofs."""
        return self.verify_s / self.decode_s

    @property
    def draft_ratio(self) -> float:
        """c at the roofs: a draft step over a decode step."""
        return self.draft_s / self.decode_s


def predict(pair: Pair, acceptance: Acceptance, gamma: int, prefill: int, decode: int, peaks: dict) -> Prediction:
    """One point at the roofs: `prefill` prompt tokens, then `decode` new tokens at a mean context halfway through."""
    context = prefill + decode // 2
    costs = phase_costs(pair.target, prefill, context, pair.draft, gamma, act_bytes=pair.act_bytes,
                        draft_weight_bytes=pair.draft_weight_bytes, target_weight_bytes=pair.target_weight_bytes)
    step, cycle = roofline_s(costs["decode"], peaks), cycle_roofline_s(costs, peaks, gamma)
    prefill_s, verify_s = roofline_s(costs["prefill"], peaks), roofline_s(costs["verify"], peaks)
    draft_prefill_s = roofline_s(forward_cost(pair.draft, 0, prefill, logits_positions=1, act_bytes=pair.act_bytes,
                                              weight_bytes_per_param=pair.draft_weight_bytes), peaks)
    length = acceptance.mean_length(gamma)
    plain = prefill_s + (decode - 1) * step  # the first token is the prefill's
    speculative = prefill_s + draft_prefill_s + (decode - 1) / length * cycle  # the draft reads the prompt too
    return Prediction(step, (cycle - verify_s) / gamma, verify_s, prefill_s, length, length * step / cycle,
                      plain / speculative)


def best_gamma(pair: Pair, acceptance: Acceptance, prefill: int, decode: int, peaks: dict) -> int:
    """The chain length whose predicted decode speedup is highest at this acceptance; 0: plain decoding's."""
    return best_length(lambda g: predict(pair, acceptance, g, prefill, decode, peaks).decode_speedup if g else 1.0,
                       LONGEST)


def break_even(pair: Pair, gamma: int, prefill: int, decode: int, peaks: dict) -> float | None:
    """The one conditional acceptance rate at which the predicted decode speedup is 1 (bisection); None where even
    full acceptance does not pay."""
    speedup = lambda a: predict(pair, Acceptance((a,)), gamma, prefill, decode, peaks).decode_speedup  # noqa: E731
    if speedup(1.0) < 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid) < 1 else (lo, mid)
    return (lo + hi) / 2
