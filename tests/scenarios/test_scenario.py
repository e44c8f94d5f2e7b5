"""The Scenario type: each rule that follows from a scenario asked of it, no scenario named anywhere else in the
package code, and a new scenario one class."""
import re

import mlperf_loadgen as lg
import pytest

from scenarios.scenario import (SERVER_TOKEN_BUDGET, Offline, Scenario, Server, SingleStream, required_scenarios,
                                system_type)
from tests.helpers import ROOT

PACKAGES = ["mlperf", "suts", "scenarios", "serving", "roofline", "reports", "training", "commands", "labs"]
NAMED = re.compile(r"""["'](?:SingleStream|Offline|Server)["']""")  # a scenario's name as a string of its own


SCENARIOS = list(Scenario.known.values())


def test_each_scenarios_rules():
    assert SCENARIOS == [SingleStream(), Offline(), Server()] and SCENARIOS == ["SingleStream", "Offline", "Server"]
    assert [s.rows(8) for s in SCENARIOS] == [1, 8, 8]
    assert [s for s in SCENARIOS if s.paced] == [Server()]
    assert [s for s in SCENARIOS if s.one_at_a_time] == [SingleStream()]
    assert Scenario.named("Server").loadgen == lg.TestScenario.Server and Scenario.named("Offline") is Offline()
    with pytest.raises(ValueError, match="^unknown scenario 'Batch'; choose one of SingleStream, Offline, Server$"):
        Scenario.named("Batch")
    assert [s for s in SCENARIOS if s.takes_load] == [Offline(), Server()]
    assert [s for s in SCENARIOS if s.first_tokens] == [SingleStream(), Server()]
    assert [s.token_budget for s in SCENARIOS] == [None, None, SERVER_TOKEN_BUDGET]


def test_mlperfs_system_types_are_read_from_the_scenarios_categories():
    assert required_scenarios(("edge",)) == [SingleStream(), Offline()]
    assert required_scenarios(("datacenter",)) == [Offline(), Server()]
    assert [system_type(s) for s in (["Offline", "SingleStream"], ["Server", "Offline"], SCENARIOS, ["Server"])] \
        == ["edge", "datacenter", "datacenter,edge", None]


def test_a_calibration_sizes_the_queries_loadgen_prepares_never_a_load():
    """At 4 samples a second: SingleStream expects half the best latency (125 ms), Offline twice the best rate, and
    Server's load stays the one fixed per model."""
    assert [s.calibrated(4.0) for s in SCENARIOS] == ["*.SingleStream.target_latency = 125",
                                                      "*.Offline.target_qps = 8.0000", ""]


def test_no_scenario_is_named_outside_the_scenario_type():
    """Compared, chosen (`replace(cfg, scenario=...)`) or listed, a scenario is its class, never its name: a rule
    about one scenario lives in scenarios/scenario.py."""
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for package in PACKAGES
             for path in sorted((ROOT / package).rglob("*.py")) if path.name != "scenario.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if NAMED.search(line)]
    assert found == []


def test_a_run_config_holds_a_scenario_that_reads_as_its_name(tmp_path):
    import copy
    import pickle
    from dataclasses import replace
    from pathlib import Path

    from scenarios.config import RunConfig
    cfg = replace(RunConfig(), scenario="Server")
    assert cfg.scenario is Server() and cfg.scenario.paced and cfg.budget == SERVER_TOKEN_BUDGET
    assert f"{cfg.scenario}" == str(cfg.scenario) == "Server" and Path("r") / cfg.scenario == Path("r/Server")
    assert pickle.loads(pickle.dumps(cfg)).scenario is copy.deepcopy(cfg).scenario is Server()
    assert [s.tokens_key for s in SCENARIOS] == ["result_completed_tokens_per_second", "result_tokens_per_second",
                                                 "result_completed_tokens_per_second"]
    assert SingleStream().headline_unit is None and Offline().min_queries == 1


@pytest.fixture
def pairs():
    """Pairs defined in this process too, to read its run back, and forgotten after: other tests see the scenarios
    as shipped."""
    kept = dict(Scenario.known)
    from tests.scenarios.pairs import Pairs
    Scenario.known["Pairs"] = Pairs()
    yield
    Scenario.known.clear()
    Scenario.known.update(kept)


def test_a_new_scenario_is_one_class_and_runs_through_loadgen(pairs, tiny_pair, tmp_path):
    """tests/scenarios/pairs.py defines Pairs and nothing else: the command line takes it, LoadGen runs it under
    Offline's settings, and the run is filed, recorded and batched as Pairs."""
    from reports.loadgen import headline
    from scenarios.records import RunRecord
    from tests.helpers import filed, python_m, run_args
    proc = python_m("tests.scenarios.pairs", *run_args(tiny_pair, tmp_path, "--sut", "baseline", "--scenario", "Pairs",
                                                       "--max-batch", "8"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Pairs: baseline decodes up to 2 samples at once" in proc.stdout
    latest = filed(tmp_path, "baseline", "Pairs", "performance") / "latest"
    record = RunRecord.load(latest)
    assert record.config.scenario == "Pairs" and record.sut.batch == 2
    assert max(b for s in record.stats for b in s.batch_steps) == 2
    assert headline(latest).validity == "VALID"
    assert "Offline.min_duration" in (latest / "user.conf").read_text()
    assert "Scenario : Offline" in (latest / "mlperf_log_summary.txt").read_text()
