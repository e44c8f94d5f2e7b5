import numpy as np
import pytest

from mlperf.model import GPT
from suts.planner import EXPLORE, OUTLIER, Planner, nearest, nonnegative_fit, running_mean
from tests.helpers import SMALL

PER_FLOP, PER_BYTE = 1e-9, 1e-9


def planner(per_byte: float, per_flop: float, accepted: float, gamma: int = 4) -> Planner:
    """A planner whose target takes `per_byte` s per byte and `per_flop` s per FLOP, with 1000 cycles measured at
    a chance `accepted` of each draft, and drafting that costs nothing."""
    p = Planner(GPT(SMALL), gamma)
    p.coef = np.array([0.0, per_byte, per_flop])
    for i in range(1, gamma + 1):
        p.tested[i], p.passed[i] = 1000, round(1000 * accepted)
    p.draft_step_s[1, 1] = 0.0
    return p


def test_expected_tokens_follow_the_measured_chances_and_extrapolate_from_the_last():
    p = Planner(GPT(SMALL), 4)
    assert [p.expected_tokens(g) for g in range(3)] == [1.0, 1.5, 1.75]  # nothing measured: 1/2 each
    p.tested[1:3], p.passed[1:3] = [1000, 800], [800, 720]  # 0.8, then 0.9 once the first was accepted
    assert p.expected_tokens(2) == pytest.approx(1 + 0.8 + 0.8 * 0.9, rel=1e-2)
    assert p.expected_tokens(3) == pytest.approx(p.expected_tokens(2) + 0.8 * 0.9 * 0.9, rel=1e-2)


def test_it_drafts_where_the_pass_is_memory_bound_and_decodes_where_it_is_compute_bound():
    """Memory-bound, verifying 5 tokens costs about what 1 does: draft the most. Compute-bound, a verify costs
    its tokens, and drafts accepted half the time never pay: a plain decode step. A planner that always drafted
    (or never) fails one of the two."""
    assert planner(PER_BYTE, 0.0, 0.5).choose([10], 50) == 4
    assert planner(0.0, PER_FLOP, 0.5).choose([10] * 8, 50) == 0


def test_rows_that_may_take_few_drafts_shorten_the_cycle():
    p = planner(PER_BYTE, PER_FLOP / 1000, 0.9)
    assert p.choose([10], 50) == 4
    assert p.choose([1], 50) == 1  # one token left to draft before max_new_tokens


def test_measured_times_correct_the_prediction():
    p = planner(PER_BYTE, 0.0, 0.6)
    assert p.choose([10], 50) == 4
    for _ in range(20):  # verifying 5 tokens turns out 3x slower than predicted, drafting costs what a pass does
        p.observe(1, 4, 50, 4 * p.target_s(1, 1, 50), 3 * p.target_s(1, 5, 50), cycles=[(4, 2)])
    assert p.choose([10], 50) < 4


def test_a_shapes_first_cycle_is_not_timed():
    """A GPU captures a cycle's graphs the first time its shape runs: that one cycle's time says nothing about
    the next ones. The second cycle of the shape is timed (a planner that never timed would fail the last line)."""
    p = planner(PER_BYTE, 0.0, 0.9)
    verify, slow = p.target_s(1, 5, 50), 1000 * p.target_s(1, 5, 50)  # drafting 1000x a pass: never pays
    p.observe(1, 4, 50, slow, verify, cycles=[(4, 4)])
    assert p.choose([10], 50) == 4 and p.tested[1] == 1001
    p.observe(1, 4, 50, slow, verify, cycles=[(4, 4)])
    assert p.choose([10], 50) == 0


def test_a_stall_moves_the_running_mean_little_and_a_lasting_rise_goes_through():
    mean = running_mean(None, 1.0)
    assert running_mean(mean, 1000.0) == pytest.approx(1 + (OUTLIER - 1) / 4)  # not 250
    for _ in range(30):
        mean = running_mean(mean, 3.0)
    assert mean == pytest.approx(3.0, rel=1e-3)
    assert running_mean(mean, 1.0) == pytest.approx(2.5, rel=1e-3)  # downwards, a full step


def test_every_explore_th_cycle_measures_another_length():
    p = planner(PER_BYTE, 0.0, 0.9)
    chosen = [p.choose([10], 50) for _ in range(3 * EXPLORE)]
    others = {i + 1: g for i, g in enumerate(chosen) if g != 4}
    assert others == {2 * EXPLORE: 0, 3 * EXPLORE: 3}  # at EXPLORE, one more than gamma: gamma again


def test_the_effective_roofline_fits_without_negative_terms():
    features = np.array([[1, 10, 1], [1, 20, 100], [1, 40, 400], [1, 5, 0]], dtype=float)
    truth = np.array([0.5, 0.1, 0.01])
    assert nonnegative_fit(features, features @ truth) == pytest.approx(truth)
    noisy = nonnegative_fit(features, np.array([1.0, 0.9, 0.8, 1.1]))  # faster with more work: overhead alone
    assert (noisy >= 0).all() and noisy[0] > 0


def test_calibration_times_the_target_and_predicts_more_for_more_work():
    p = Planner(GPT(SMALL), 4)
    p.calibrate()
    assert (p.coef >= 0).all() and 0 < p.target_s(1, 1, 20) <= p.target_s(64, 5, 20)


def test_nearest_prefers_the_same_batch_then_the_closest_one():
    table = {(8, 1): "8x1", (8, 5): "8x5", (32, 2): "32x2"}
    assert nearest(table, 8, 4) == "8x5" and nearest(table, 12, 2) == "8x1" and nearest(table, 30, 9) == "32x2"
    assert nearest({}, 8) is None
