import math

import pytest

from suts.engine.stats import acceptance, merged_cycles
from suts.baseline import Baseline
from suts.engine.sampling import SamplingParams
from suts.registry import make_sut
from suts.synthetic import Acceptance

PROMPTS = [[1, 2, 3], [5] * 9, list(range(8)), [7, 30, 2, 2, 9, 11], [4, 4, 8], [30, 1], [9, 9, 9, 2], [3, 17]]
RATES = (0.8, 0.5, 0.3, 0.1)  # unconditional: conditional 0.8, 0.625, 0.6, 0.333


def reference(target, tokens: int) -> dict:
    baseline = Baseline(target)
    return {tuple(p): baseline.generate(p, tokens).tokens for p in PROMPTS}


@pytest.mark.parametrize("name", ["spec", "ngram", "spec-auto"])
def test_synthetic_drafts_keep_the_baseline_tokens_at_any_rates(pair, name):
    target, draft = pair
    ref = reference(target, 40)
    spec = make_sut(name, target, draft, gamma=4, synthetic=(Acceptance(RATES), ref))
    for p in PROMPTS:
        assert spec.generate(p, 40).tokens == ref[tuple(p)]


def test_each_position_is_accepted_at_its_set_rate_within_three_standard_errors(pair):
    target, draft = pair
    ref = reference(target, 100)
    spec = make_sut("spec", target, draft, gamma=4, synthetic=(Acceptance(RATES), ref))
    stats = [spec.generate(p, 100).stats for p in PROMPTS]
    cycles = merged_cycles(stats)
    measured = acceptance(cycles)["conditional_acceptance"]
    for i, rate in enumerate(measured, start=1):
        want = Acceptance(RATES).conditional(i)
        tested = sum(c for g, counts in cycles.items() if g >= i for k, c in enumerate(counts) if k >= i - 1)
        assert tested > 30
        assert abs(rate - want) <= 3 * math.sqrt(want * (1 - want) / tested), (i, rate, want, tested)
    assert sum(s.cycles for s in stats) > 200


def test_a_wrong_coin_is_caught(pair):
    """The same check fails a drafter held at other rates: the test above can fail."""
    target, draft = pair
    ref = reference(target, 100)
    spec = make_sut("spec", target, draft, gamma=4, synthetic=(Acceptance((0.6, 0.2)), ref))
    cycles = merged_cycles([spec.generate(p, 100).stats for p in PROMPTS])
    first = acceptance(cycles)["conditional_acceptance"][0]
    assert abs(first - 0.8) > 3 * math.sqrt(0.8 * 0.2 / sum(sum(c) for c in cycles.values()))


def test_one_rate_is_a_conditional_rate_at_every_position():
    a = Acceptance((0.7,))
    assert [round(a.unconditional(i), 6) for i in (1, 2, 3)] == [0.7, 0.49, 0.343]
    assert a.mean_length(4) == pytest.approx((1 - 0.7 ** 5) / 0.3)  # Leviathan's expected tokens a cycle
    assert Acceptance((0.9, 0.45)).conditional(3) == pytest.approx(0.5)  # past the list: the last conditional rate


def test_a_mean_length_resolves_to_a_geometric_decay():
    a = Acceptance.of_length(3.0, 4)
    assert a.mean_length(4) == pytest.approx(3.0, abs=1e-9)
    assert Acceptance.of_length(5.0, 4).rates[0] == pytest.approx(1.0)


@pytest.mark.parametrize("text, why", [("0.5,0.7", "cannot increase"), ("1.2", r"\[0, 1\]"), ("a,b", "numbers")])
def test_bad_rates_are_one_line(text, why):
    with pytest.raises(ValueError, match=why):
        Acceptance.parse(text)
    with pytest.raises(ValueError, match="lies in"):
        Acceptance.of_length(6.0, 4)


def test_a_sampled_request_and_a_tree_are_refused(pair):
    target, draft = pair
    spec = make_sut("spec", target, draft, gamma=4, synthetic=(Acceptance((0.7,)), {}))
    with pytest.raises(ValueError, match="greedy only"):
        spec.generate([1, 2, 3], 10, SamplingParams(temperature=0.8))
    with pytest.raises(ValueError, match="chain"):
        make_sut("spec-tree", target, draft, synthetic=(Acceptance((0.7,)), {}))
