"""The peak search's bracketing and bisection (each trial is an ordinary Server run, tested in test_run)."""
import pytest

from commands.peak import PRECISION, Trial, next_qps, start_qps
from scenarios.records import RunConfig


def search(peak: float, start: float) -> list[float]:
    """The QPS the search tries against a SUT that is VALID exactly up to `peak`."""
    trials = []
    qps = start
    while qps is not None:
        trials.append(Trial(qps, qps <= peak, None, None, None, None, None, ""))
        qps = next_qps(trials)
    return [t.qps for t in trials]


@pytest.mark.parametrize("peak, start", [(0.55, 0.4), (3.1, 0.4), (0.07, 0.4), (0.4, 0.4)])
def test_the_search_brackets_the_peak_within_the_precision(peak, start):
    tried = search(peak, start)
    lo, hi = max(q for q in tried if q <= peak), min(q for q in tried if q > peak)
    assert lo <= peak < hi and hi / lo <= 1 + PRECISION
    assert len(tried) <= 9


def test_it_starts_at_the_qps_asked_for_or_the_profiles_load_for_the_model():
    assert start_qps(RunConfig(qps=1.7, scenario="Server")) == 1.7
    assert start_qps(RunConfig(scenario="Server")) > 0  # the shipped target has a fixed Server load


def test_find_peak_is_for_the_server_scenario_only():
    with pytest.raises(ValueError, match="find-peak searches the Server scenario"):
        RunConfig(mode="find-peak", scenario="Offline").validate()
