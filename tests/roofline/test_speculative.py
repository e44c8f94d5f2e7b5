import math
import random

import pytest

from roofline.speculative import (alpha_from_tested, decode_rate, decode_step_s, expected_tokens_per_cycle,
                                  generation_rate, mean_batch, positional_tokens_per_cycle, speculative_figures)
from suts.engine.stats import Stats, merged_cycles


def test_expected_tokens_per_cycle():
    assert expected_tokens_per_cycle(0.0, 4) == 1.0  # only the target's own token
    assert expected_tokens_per_cycle(1.0, 4) == 5.0  # every draft plus the bonus
    assert expected_tokens_per_cycle(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)


def synthetic(alpha: float, gamma: int, cycles: int, seed: int = 0) -> Stats:
    """A speculative run in which every draft is accepted independently with probability alpha: a cycle stops at
    its first rejection."""
    rng, stats = random.Random(seed), Stats()
    for _ in range(cycles):
        k = 0
        while k < gamma and rng.random() < alpha:
            k += 1
        stats.record_cycle(gamma, k)
    return stats


@pytest.mark.parametrize("alpha, gamma", [(0.6, 4), (0.8, 4), (0.9, 8), (0.3, 2)])
def test_alpha_from_tested_drafts_recovers_alpha_and_the_tokens_per_cycle(alpha, gamma):
    n = 20000
    s = synthetic(alpha, gamma, n)
    estimate = alpha_from_tested(s.cycle_hist)
    tested = s.accepted + (n - s.cycle_hist[gamma][gamma])  # each tested draft is a Bernoulli(alpha) trial
    assert abs(estimate - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / tested)
    measured = (s.accepted + s.cycles) / s.cycles
    assert expected_tokens_per_cycle(estimate, gamma) == pytest.approx(measured, rel=0.02)
    # accepted / drafted counts untested drafts as rejected: it is biased low, as the formula's input
    assert s.acceptance_rate < alpha - 0.05


def test_a_cycle_with_no_rejection_tells_alpha_is_one():
    assert alpha_from_tested({4: [0, 0, 0, 0, 10]}) == 1.0
    assert alpha_from_tested({4: [10, 0, 0, 0, 0]}) == 0.0
    assert math.isnan(alpha_from_tested({}))


def stats(n_tokens=33, prefill_s=0.01, decode_s=0.032, batch=1, steps=None, cycles=(), draft_s=0.0, verify_s=0.0):
    """One row's statistics; decode_s, draft_s and verify_s are the row's shares of its steps (all at `batch`)."""
    steps = n_tokens - 1 if steps is None else steps
    s = Stats(token_times_s=[0.0] * n_tokens, prefill_s=prefill_s, decode_s=decode_s, steps=steps,
              batch_steps={batch: steps}, draft_s=draft_s, verify_s=verify_s)
    for g, k in cycles:
        s.record_cycle(g, k)
    return s


def test_one_decode_step_definition_excludes_prefill_and_shares_batch_steps():
    assert decode_step_s([stats(), stats(decode_s=0.064)]) == pytest.approx(0.096 / 64)
    rows = [stats(batch=8, decode_s=0.01, steps=32) for _ in range(8)]  # 8 rows, 32 shared steps of 2.5 ms
    assert decode_step_s(rows) == pytest.approx(0.0025) and mean_batch(rows) == 8
    # the batch's decode time counts once, not once per row: 8 x 33 tokens in 8 x 10 ms + 80 ms
    assert generation_rate(rows) == pytest.approx(8 * 33 / (0.08 + 0.08))
    assert decode_rate(rows) == pytest.approx(8 * 32 / 0.08)


def test_adaptive_runs_are_costed_with_each_cycles_own_gamma():
    baseline = [stats()]  # 1 ms per decode step
    spec = [stats(n_tokens=1 + 3 + 6, decode_s=0.005, steps=2, cycles=[(2, 2), (6, 5)], draft_s=0.0008,
                  verify_s=0.003)]
    f = speculative_figures(spec, baseline)
    assert f.gamma == 4 and f.acceptance_rate == 7 / 8
    assert f.alpha == pytest.approx(7 / 8)  # 7 accepted, 1 rejection
    assert f.expected_tokens_per_cycle == pytest.approx(
        (expected_tokens_per_cycle(7 / 8, 2) + expected_tokens_per_cycle(7 / 8, 6)) / 2)
    assert f.tokens_per_cycle == 4.5 and f.draft_cost_ratio == pytest.approx(0.1)
    assert f.verify_cost_ratio == pytest.approx(1.5)
    assert f.positional_tokens_per_cycle == pytest.approx(4.5)  # every tested draft accepted: p_i = 1 throughout
    assert f.predicted_speedup == pytest.approx(4.5 / (4 * 0.1 + 1.5))
    assert f.measured_speedup == pytest.approx((9 / 0.005) / (32 / 0.032))
    assert merged_cycles(spec + spec) == {2: [0, 0, 2], 6: [0, 0, 0, 0, 0, 2, 0]}


def test_the_prediction_takes_acceptance_per_position_where_one_alpha_misjudges_runs():
    """Half the cycles accept all 4 drafts, half none: alpha is 0.8 (200 of 250 tested), which predicts 3.36 tokens
    a cycle; the positions' rates (0.5, then 1, 1, 1) give the 3 the cycles emitted."""
    cycles = {4: [50, 0, 0, 0, 50]}
    assert alpha_from_tested(cycles) == pytest.approx(0.8)
    assert expected_tokens_per_cycle(0.8, 4) == pytest.approx(3.3616)
    assert positional_tokens_per_cycle(cycles) == pytest.approx(3.0)
    mixed = {2: [10, 0, 10], 4: [0, 0, 0, 0, 20]}  # position 1: 30 of 40 pass; 2: 30 of 30; 3, 4: 20 of 20
    assert positional_tokens_per_cycle(mixed) == pytest.approx((20 * (1 + 0.75 * 2) + 20 * (1 + 0.75 * 4)) / 40)
    assert math.isnan(positional_tokens_per_cycle({}))
