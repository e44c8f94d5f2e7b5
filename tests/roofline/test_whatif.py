import pytest

from mlperf.model import GEOMETRIES, GPT
from roofline.whatif import LONGEST, Pair, best_gamma, break_even, predict
from suts.planner import Planner
from suts.synthetic import Acceptance
from tests.helpers import SMALL

PEAKS = {"flops_per_s": 150e9, "bytes_per_s": 50e9, "reads_by_size": {"1048576": 150e9, "67108864": 50e9}}
SEED = Pair(GEOMETRIES["seed-target"], GEOMETRIES["seed-draft"])


def test_more_acceptance_predicts_more_speedup_and_full_acceptance_its_ceiling():
    speedups = [predict(SEED, Acceptance((a,)), 4, 128, 64, PEAKS).decode_speedup for a in (0.5, 0.7, 0.9, 1.0)]
    assert speedups == sorted(speedups)
    full = predict(SEED, Acceptance((1.0,)), 4, 128, 64, PEAKS)
    assert full.decode_speedup == pytest.approx(5 / (full.verify_steps + 4 * full.draft_ratio))


def test_a_memory_bound_target_verifies_several_rows_for_little_more_than_one_step():
    p = predict(SEED, Acceptance((0.7,)), 2, 128, 64, PEAKS)
    assert 1 <= p.verify_steps < 1.5  # 3 rows of fp16 weights: at 1 FLOP a byte a row, still under the ridge (3)
    assert 0.05 < p.draft_ratio < 0.25  # an eighth of the weights, its LM head and caches beside


def test_the_break_even_acceptance_gives_a_speedup_of_one_and_the_best_gamma_beats_its_neighbours():
    even = break_even(SEED, 4, 128, 64, PEAKS)
    assert 0 < even < 1
    assert predict(SEED, Acceptance((even,)), 4, 128, 64, PEAKS).decode_speedup == pytest.approx(1, abs=1e-6)
    best = best_gamma(SEED, Acceptance((0.8,)), 128, 64, PEAKS)
    at = lambda g: predict(SEED, Acceptance((0.8,)), g, 128, 64, PEAKS).decode_speedup  # noqa: E731
    assert all(at(best) >= at(g) for g in range(1, 9))
    assert best_gamma(SEED, Acceptance((0.95,)), 128, 64, PEAKS) >= best_gamma(SEED, Acceptance((0.5,)), 128, 64, PEAKS)


def test_spec_autos_planner_handed_the_roofs_plans_the_roofline_s_best_gamma():
    """The planner maximises what the roofline does, tokens a second of a cycle (0 drafts: a plain step): given each
    length's cycle at its roofs and the acceptance set, it plans the roofline's best gamma, from none (0.1) up."""
    chosen = []
    for alpha in (0.1, 0.3, 0.6, 0.95):
        acceptance = Acceptance((alpha,))
        points = {g: predict(SEED, acceptance, g, 128, 64, PEAKS) for g in range(1, LONGEST + 1)}
        cycle_s = {g: p.decode_s * p.mean_length / p.decode_speedup for g, p in points.items()}
        cycle_s[0] = points[1].decode_s
        planner = Planner(GPT(SMALL), LONGEST)
        planner.tested[1:] = [10 ** 9] * LONGEST
        planner.passed[1:] = [round(alpha * 10 ** 9)] * LONGEST
        planner.draft_step_s[1, 1] = 0.0  # the cycle's whole cost below, drafts included
        planner.target_s = lambda batch, tokens, context: cycle_s[tokens - 1]  # noqa: B023
        chosen.append(planner.choose([LONGEST], 128))
        assert chosen[-1] == best_gamma(SEED, acceptance, 128, 64, PEAKS)
    assert chosen[0] == 0 and chosen == sorted(chosen) and chosen[-1] >= 2
