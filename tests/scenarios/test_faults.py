"""Faults and bad input against `python -m mlperf run`: each ends in one line naming the culprit and a non-zero
exit, keeps its directory apart (with error.txt) and never moves `latest` to an incomplete or unscored run."""
import json
import resource
import subprocess
import sys

import pytest

from tests.helpers import cli_env, filed

PLUGINS = "tests.scenarios.faulty_suts"


def last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


def failed_cleanly(proc, results, message: str, kept: bool = True) -> None:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert message in last_line(proc), last_line(proc)
    assert not list(results.rglob("latest")) and not list(results.rglob("*.partial"))
    errors = list(results.rglob("*.failed/error.txt"))
    assert len(errors) == (1 if kept else 0) and (not kept or message in errors[0].read_text())


@pytest.mark.parametrize("plugin, problem", [  # every rule of result_problem: tests/suts/test_base.py
    ("TooManyTokens", "with 80 tokens, more than max_new_tokens (8)"),
    ("WrongFirstToken", "a first token streamed"),
    ("NeverStreams", "with no first token streamed"),
])
def test_a_sut_answering_outside_the_rules_fails_the_run_naming_the_sample(mlperf_run, plugin, problem):
    proc = mlperf_run("--sut", f"{PLUGINS}:{plugin}", "--mode", "accuracy", samples=3)
    failed_cleanly(proc, mlperf_run.results, problem)
    assert "error: SUT baseline answered sample " in last_line(proc)


@pytest.mark.parametrize("plugin, args, message", [
    ("ReturnsNone", (), "calibrating SUT tests.scenarios.faulty_suts:ReturnsNone: SUT baseline answered a "
                        "calibration prompt with NoneType instead of a Result"),
    ("StallsInCalibration", ("--stall-timeout", "0.5"), "no result within 3 s (a stalled SUT?)"),
    ("FailsToBuild", (), "SUT tests.scenarios.faulty_suts:FailsToBuild could not be built: RuntimeError: no "
                         "accelerator here"),
])
def test_a_sut_that_fails_before_loadgen_starts_is_one_line(mlperf_run, plugin, args, message):
    proc = mlperf_run("--sut", f"{PLUGINS}:{plugin}", *args)
    failed_cleanly(proc, mlperf_run.results, message, kept=False)


def test_logs_cut_short_by_a_file_size_limit_are_never_published(tiny_pair, tmp_path):
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "mlperf", "run", "--sut", "baseline", "--target", str(tiny_pair / "target"),
           "--samples", "4", "--max-new-tokens", "8", "--user-conf", str(tiny_pair / "fast.conf"),
           "--results", str(results)]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))  # LoadGen's detail log needs more
    proc = subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "incomplete" in last_line(proc) or "File too large" in last_line(proc), last_line(proc)
    assert not list(results.rglob("latest")) and not list(results.rglob("*.partial"))
    assert len(list(results.rglob("*.failed"))) == 1


def test_two_runs_started_together_both_succeed_in_directories_of_their_own(tiny_pair, tmp_path):
    cmd = [sys.executable, "-m", "mlperf", "run", "--sut", "baseline", "--target", str(tiny_pair / "target"),
           "--samples", "4", "--max-new-tokens", "8", "--user-conf", str(tiny_pair / "fast.conf"),
           "--mode", "accuracy", "--results", str(tmp_path)]
    procs = [subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    base = filed(tmp_path, "baseline", "SingleStream", "accuracy")
    runs = sorted(p.name for p in base.iterdir() if p.name != "latest")
    assert len(runs) == 2 and (base / "latest").resolve().name in runs
    assert json.loads((base / "latest" / "accuracy.json").read_text())["passed"]


def test_a_user_conf_value_loadgen_cannot_take_is_named_before_the_run(mlperf_run, tmp_path):
    bad = tmp_path / "bad.conf"  # every rule: tests/scenarios/test_settings.py
    bad.write_text("*.*.min_query_count = -5\n")
    proc = mlperf_run("--sut", "baseline", "--user-conf", str(bad))
    failed_cleanly(proc, mlperf_run.results, "bad.conf, line 1: min_query_count must be a whole number", kept=False)
    assert proc.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("config, message", [
    ({"gamma": "4"}, "gamma must be int, got '4'"),
    ({"sutt": "spec"}, "unknown run settings sutt"),
    ([1, 2], "expected a JSON object of run settings, got a list"),
])
def test_a_bad_config_file_is_one_line(tmp_path, config, message):
    from commands.options import config_file
    from scenarios.config import RunConfig
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        RunConfig(**config_file(path)).validate()


def test_an_existing_run_dir_is_refused_before_the_run(mlperf_run, tmp_path):
    (tmp_path / "taken").mkdir()
    proc = mlperf_run("--run-dir", str(tmp_path / "taken"))
    failed_cleanly(proc, mlperf_run.results, "exists already", kept=False)
    assert "calibrating" not in proc.stdout


def test_an_audit_config_where_a_run_starts_is_refused_in_one_line(mlperf_run):
    """LoadGen reads audit.config from the working directory at StartTest: one left there would silently turn
    every run into a compliance run."""
    (mlperf_run.results.parent / "audit.config").write_text("*.*.mode = 2\n")
    proc = mlperf_run("--sut", "baseline")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "audit.config would change this run's LoadGen settings" in proc.stderr.strip().splitlines()[-1]
    assert not mlperf_run.results.exists()
