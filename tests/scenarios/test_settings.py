import re

import pytest

from scenarios.settings import PROFILES, QUICK_SERVER_ARRIVALS_S, SERVER_LOAD, Calibration, loadgen_settings, user_conf


def calibration(latency_s: float) -> Calibration:
    return Calibration(latency_s=latency_s, ttft_s=latency_s / 20, tpot_s=latency_s / 130, samples_per_s=1 / latency_s)


def conf_value(text: str, key: str) -> float:
    return float(re.findall(rf"^llm\.{re.escape(key)} = (\S+)$", text, re.M)[-1])


@pytest.mark.parametrize("latency_s", [0.01, 0.5, 1.3, 5.0])
def test_quick_server_load_fits_its_queries_in_the_time_budget_when_it_can(latency_s):
    text = user_conf("quick", "Server", calibration(latency_s))
    queries = int(re.search(r"^\*\.Server\.min_query_count = (\d+)$", text, re.M).group(1))
    load = conf_value(text, "Server.target_qps") * latency_s
    assert SERVER_LOAD[0] - 1e-3 <= load <= SERVER_LOAD[1] + 1e-3
    arrivals_s = queries / conf_value(text, "Server.target_qps")
    if load < SERVER_LOAD[1] - 1e-3:  # not capped: the queries arrive within the budget
        assert arrivals_s <= QUICK_SERVER_ARRIVALS_S + 1
    assert conf_value(text, "Server.ttft_latency") >= 8 * latency_s * 1000 - 1  # queueing at that load fits


def test_full_server_stays_at_the_low_load_with_the_profiles_fixed_limits():
    text = user_conf("full", "Server", calibration(1.3))
    assert conf_value(text, "Server.target_qps") == pytest.approx(SERVER_LOAD[0] / 1.3, rel=1e-3)
    assert "llm.Server.ttft_latency" not in text


def test_a_qps_asked_for_wins_and_loadgen_accepts_every_generated_conf(tmp_path):
    for profile in PROFILES:
        for scenario in ("SingleStream", "Offline", "Server"):
            conf = tmp_path / f"{profile}-{scenario}.conf"
            conf.write_text(user_conf(profile, scenario, calibration(0.7), qps=2.5))
            if scenario != "SingleStream":
                assert conf_value(conf.read_text(), f"{scenario}.target_qps") == 2.5
            loadgen_settings(conf, scenario, "performance", 16)  # raises unless FromConfig returns 0
