"""The peak search's bracketing, bisection and confirmation at p99 (each trial is an ordinary Server run, tested in
test_run; here a stand-in that is VALID up to a known load)."""
import json

import pytest

from commands import peak as search_module
from commands.peak import CONFIRM_STEP, P99_QUERIES, PRECISION, Trial, next_qps, server_settings
from scenarios.config import RunConfig


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
    assert float(server_settings(RunConfig(qps=1.7, scenario="Server"))["target_qps"]) == 1.7
    assert float(server_settings(RunConfig(scenario="Server"))["target_qps"]) > 0  # fixed for the shipped target


@pytest.mark.parametrize("profile, p99_peak, judged", [("quick", 0.8, "p99"), ("quick", 0.01, None),
                                                       ("interactive", 0.8, "p99")])
def test_a_screened_peak_is_confirmed_at_p99_from_above(tmp_path, monkeypatch, profile, p99_peak, judged):
    """quick screens at p90 (VALID up to 1.3 QPS here), then confirms at p99 with the queries early stopping needs,
    stepping down until a run is VALID; a profile that judges at p99 already needs no confirmation."""
    asked = []

    def trial(cfg, qps, root, name):
        conf = cfg.user_conf and open(cfg.user_conf).read()
        at_p99 = profile == "interactive" or bool(conf and f"min_query_count = {P99_QUERIES}" in conf)
        asked.append((qps, at_p99))
        (root / name).mkdir(parents=True)
        return Trial(qps, qps <= (p99_peak if at_p99 else 1.3), 10.0 * qps, None, None, None, None, name,
                     judged_at="p99" if at_p99 else "p90")
    monkeypatch.setattr(search_module, "run_trial", trial)
    search = search_module.find_peak(RunConfig(sut="baseline", scenario="Server", mode="find-peak",
                                               profile=profile, qps=0.4, results=str(tmp_path)))
    found = json.loads((search / "peak.json").read_text())
    assert all((search / t["run_dir"]).is_dir() for t in found["trials"] + found["p99_confirmations"])
    confirmations = [q for q, at_p99 in asked if at_p99] if profile == "quick" else []
    assert [t["qps"] for t in found["p99_confirmations"]] == confirmations
    if profile == "quick":
        assert confirmations[0] == max(q for q, _ in asked if q <= 1.3)  # from the screened peak down
        assert all(b == pytest.approx(a / CONFIRM_STEP) for a, b in zip(confirmations, confirmations[1:]))
    assert found["judged_at"] == judged
    assert (found["peak"]["qps"] <= p99_peak) if judged else found["peak"] is None


def test_find_peak_is_for_the_server_scenario_only():
    with pytest.raises(ValueError, match="find-peak searches the Server scenario"):
        RunConfig(mode="find-peak", scenario="Offline").validate()
