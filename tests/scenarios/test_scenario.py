"""The Scenario type: each rule that follows from a scenario asked of it, and no scenario name compared anywhere
else in the package code."""
import re

import mlperf_loadgen as lg
import pytest

from scenarios.scenario import Scenario
from tests.helpers import ROOT

PACKAGES = ["mlperf", "suts", "scenarios", "roofline", "reports", "training", "commands", "labs"]
NAME = r"""["'](?:SingleStream|Offline|Server)["']"""
COMPARED = re.compile(rf"(?:==|!=|\bin)\s*\(?\s*{NAME}|{NAME}\s*(?:==|!=)")


def test_each_scenarios_rules():
    assert [s.rows(8) for s in Scenario] == [1, 8, 8]
    assert [s for s in Scenario if s.paced] == [Scenario.Server]
    assert [s for s in Scenario if s.all_at_once] == [Scenario.Offline]
    assert Scenario("Server").loadgen == lg.TestScenario.Server and Scenario("Offline") == "Offline"
    with pytest.raises(ValueError):
        Scenario("Batch")
    assert [s for s in Scenario if s.takes_load] == [Scenario.Offline, Scenario.Server]
    assert [s for s in Scenario if s.first_tokens] == [Scenario.SingleStream, Scenario.Server]


def test_a_calibration_sizes_the_queries_loadgen_prepares_never_a_load():
    """At 4 samples a second: SingleStream expects half the best latency (125 ms), Offline twice the best rate, and
    Server's load stays the one fixed per model."""
    assert [s.calibrated(4.0) for s in Scenario] == ["*.SingleStream.target_latency = 125",
                                                     "*.Offline.target_qps = 8.0000", ""]


def test_no_scenario_name_is_compared_outside_the_scenario_type():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for package in PACKAGES
             for path in sorted((ROOT / package).rglob("*.py")) if path.name != "scenario.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if COMPARED.search(line)]
    assert found == []


def test_a_run_config_holds_a_scenario_that_reads_as_its_name(tmp_path):
    from dataclasses import replace
    from pathlib import Path

    from scenarios.config import RunConfig
    cfg = replace(RunConfig(), scenario="Server")
    assert cfg.scenario is Scenario.Server and cfg.scenario.paced and cfg.budget is not None
    assert f"{cfg.scenario}" == str(cfg.scenario) == "Server" and Path("r") / cfg.scenario == Path("r/Server")
    assert [s.tokens_key for s in Scenario] == ["result_completed_tokens_per_second", "result_tokens_per_second",
                                                "result_completed_tokens_per_second"]
    assert Scenario.SingleStream.headline_unit is None and Scenario.Offline.min_queries == 1
