"""`--replicas N`: a SUT served by Ray replicas behind one LoadGen, on a local Ray instance or two simulated nodes,
each run in its own process; faults that kill, break or stall a replica; no Ray process left behind."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reports.loadgen import headline
from scenarios.records import RunRecord
from tests.helpers import cli_env, filed, live_processes, python_m, refused, run_args, run_cli

ray = pytest.importorskip("ray")
FAULTY = "tests.scenarios.faulty_suts:FailsMidRun"


def outputs(run_dir: Path) -> dict[int, str]:
    """QSL index -> the token data LoadGen logged for it; every sample exactly once."""
    entries = json.loads((run_dir / "mlperf_log_accuracy.json").read_text())
    by_index = {e["qsl_idx"]: e["data"] for e in entries}
    assert len(by_index) == len(entries), "a sample answered twice"
    return by_index


def latest(results: Path, sut: str, scenario: str, mode: str) -> Path:
    return filed(results, sut.replace(":", "."), scenario, mode, "latest")


@pytest.fixture(scope="module")
def single(tiny_pair, tmp_path_factory):
    """Accuracy-mode outputs of the baseline and spec in one process, Offline: what replicas must reproduce."""
    results = tmp_path_factory.mktemp("single")
    found = {}
    for sut in ("baseline", "spec"):
        proc = run_cli(tiny_pair, results, "--sut", sut, "--scenario", "Offline", "--mode", "accuracy", tokens=24)
        assert proc.returncode == 0, proc.stderr[-2000:]
        found[sut] = outputs(latest(results, sut, "Offline", "accuracy"))
    return found


def replicated(tiny_pair, results, *args, env=None, tokens=24, address=None):
    """A run of `--replicas` on a local Ray instance of its own, or on the cluster at `address` (whose replicas
    see the MLPERF_* variables of `env`, and no other)."""
    return python_m("mlperf", "run", "--target", tiny_pair / "target", "--draft", tiny_pair / "draft",
                    "--samples", "16", "--max-new-tokens", tokens, "--user-conf", tiny_pair / "fast.conf",
                    "--results", results, *args, *(["--ray-address", address] if address else []),
                    env={**cli_env(), **(env or {})})


@pytest.mark.parametrize("sut, scenario, joined", [("spec", "Offline", False),
                                                   ("tests.scenarios.faulty_suts:PacedSpec", "Server", True)])
def test_two_replicas_give_a_valid_run_and_share_its_queries(tiny_pair, tmp_path, request, sut, scenario, joined):
    """On a local Ray instance of the run's own, and on a cluster it joins."""
    proc = replicated(tiny_pair, tmp_path, "--sut", sut, "--scenario", scenario, "--replicas", "2",
                      *(["--qps", "40"] if scenario == "Server" else []), tokens=8,
                      address=request.getfixturevalue("ray_cluster") if joined else None)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = latest(tmp_path, sut, scenario, "performance")
    assert headline(run).validity == "VALID"
    record = RunRecord.load(run)
    members = record.replicas["replicas"]
    assert len(members) == 2 and record.replicas["reissued"] == 0 and record.torch_threads == 1
    assert all(m["served"] > 0 and m["died"] is None and m["threads"] == 1 for m in members)
    assert sum(m["served"] for m in members) == len(record.samples)  # every query answered once, by one replica
    assert len({m["pid"] for m in members} | {os.getpid()}) == 3
    assert (run / "roofline.json").is_file()
    if scenario == "Server":  # the first token streamed back before the rest: TTFT well under a sample's latency
        assert all(s.ttft_s < s.latency_s for s in record.samples)


def test_replicas_answer_accuracy_mode_as_one_process_does(tiny_pair, tmp_path, single, ray_cluster):
    proc = replicated(tiny_pair, tmp_path, "--sut", "spec", "--scenario", "Offline", "--mode", "accuracy",
                      "--replicas", "2", address=ray_cluster)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = latest(tmp_path, "spec", "Offline", "accuracy")
    assert outputs(run) == single["spec"]
    assert all(m["served"] > 0 for m in RunRecord.load(run).replicas["replicas"])


def test_two_simulated_nodes_hold_one_replica_each(tiny_pair, tmp_path, single, ray_cluster):
    proc = replicated(tiny_pair, tmp_path, "--sut", "baseline", "--scenario", "Offline", "--mode", "accuracy",
                      "--replicas", "2", address=ray_cluster)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = latest(tmp_path, "baseline", "Offline", "accuracy")
    assert outputs(run) == single["baseline"]
    members = RunRecord.load(run).replicas["replicas"]
    assert len({m["node"] for m in members}) == 2 and all(m["served"] > 0 for m in members)


@pytest.mark.parametrize("fault", ["kill", "stall"])
def test_a_replica_that_dies_mid_run_loses_no_query(tiny_pair, tmp_path, single, ray_cluster, fault):
    """Each replica decodes 63 rows in the warm-up and 184 in LoadGen's test (a step's rows counted): the first past
    100 fails."""
    env = {"MLPERF_FAULT": fault, "MLPERF_FAULT_TOKENS": "100", "MLPERF_FAULT_ONCE": str(tmp_path / "claimed")}
    proc = replicated(tiny_pair, tmp_path, "--sut", FAULTY, "--scenario", "Offline", "--mode", "accuracy",
                      "--replicas", "2", "--stall-timeout", "2", env=env, address=ray_cluster)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = latest(tmp_path, FAULTY, "Offline", "accuracy")
    assert outputs(run) == single["baseline"]  # every sample exactly once, identical
    record = RunRecord.load(run).replicas
    dead = [m for m in record["replicas"] if m["died"]]
    assert len(dead) == 1 and record["reissued"] > 0, record
    assert ("no answer within 2 s" if fault == "stall" else "died") in dead[0]["died"]


def test_when_every_replica_dies_the_run_fails_in_one_line(tiny_pair, tmp_path, ray_cluster):
    env = {"MLPERF_FAULT": "raise", "MLPERF_FAULT_TOKENS": "100"}
    proc = replicated(tiny_pair, tmp_path, "--sut", FAULTY, "--scenario", "Offline", "--mode", "accuracy",
                      "--replicas", "2", env=env, address=ray_cluster)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "every replica of SUT baseline has died" in last and "simulated replica fault" in last, last
    assert not list(tmp_path.rglob("latest")) and len(list(tmp_path.rglob("*.failed"))) == 1


def process_tree(pid: int) -> set[int]:
    """`pid` and every live process descended from it."""
    children = {}
    for p, fields in live_processes().items():
        children.setdefault(int(fields[1]), []).append(p)
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo += children.get(p, [])
    return tree


def test_sigterm_stops_every_ray_process_of_the_run(tiny_pair, tmp_path):
    long = tmp_path / "long.conf"
    long.write_text("*.Offline.min_duration = 600000\n*.Offline.target_qps = 1000\n")
    cmd = [sys.executable, "-m", "mlperf", "run", "--sut", "baseline", "--target", str(tiny_pair / "target"),
           "--scenario", "Offline", "--samples", "8", "--max-new-tokens", "8", "--user-conf", str(long),
           "--results", str(tmp_path / "r"), "--replicas", "2"]
    proc = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120  # polled: LoadGen has begun, and the replicas with it, when its log exists
        while not list((tmp_path / "r").rglob("*.partial/mlperf_log_detail.txt")) and time.time() < deadline:
            time.sleep(0.1)
        tree = process_tree(proc.pid)
        assert len(tree) > 3, tree  # the driver, Ray's own processes and the two replicas
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    deadline = time.time() + 30  # Ray's processes exit as they see their parents go
    while tree & live_processes().keys() and time.time() < deadline:
        time.sleep(0.2)
    assert not tree & live_processes().keys()
    assert len(list((tmp_path / "r").rglob("*.interrupted"))) == 1


@pytest.mark.parametrize("args, message", [
    (("--replicas", "0"), "replicas must be a positive integer, got 0"),
    (("--replicas", "2", "--ray-address", "nohost"), "ray_address must be auto or host:port"),
    (("--ray-address", "auto"), "--ray-address names the cluster that --replicas run on"),
])
def test_bad_replica_options_are_one_line_before_anything_starts(tiny_pair, tmp_path, capsys, args, message):
    code, err = refused(run_args(tiny_pair, tmp_path, "--sut", "baseline", *args), capsys)
    assert code == 2 and "Traceback" not in err
    assert message in err.strip().splitlines()[-1] and not tmp_path.joinpath("baseline").exists()


@pytest.mark.parametrize("args, message", [
    (("--sut", "tests.scenarios.faulty_suts:FailsToBuild"), "replicas of SUT tests.scenarios.faulty_suts:"
     "FailsToBuild did not start: SUT tests.scenarios.faulty_suts:FailsToBuild could not be built: RuntimeError: no "
     "accelerator here"),
    (("--sut", "baseline", "--threads", "64"), "2 replicas x 64 threads need 128 CPUs, the cluster has "),
])
def test_replicas_that_cannot_start_are_one_line(tiny_pair, tmp_path, ray_cluster, args, message):
    proc = replicated(tiny_pair, tmp_path, "--replicas", "2", *args, address=ray_cluster)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert message in proc.stderr.strip().splitlines()[-1] and not list(tmp_path.rglob("*.failed"))


def test_ray_is_installed_on_first_use_and_a_failed_install_is_one_line(monkeypatch):
    """A plain run never imports Ray; the first run with --replicas installs it, and a failed install says why."""
    import builtins
    import types
    from mlperf import extras
    from serving import replicas
    real_import, calls = builtins.__import__, []

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_ray)
    monkeypatch.setattr(extras.subprocess, "run", lambda cmd, **kwargs: calls.append(cmd) or types.SimpleNamespace(
        returncode=1, stderr="Looking in indexes ...\nERROR: No matching distribution found for ray==2.60.0\n"))
    with pytest.raises(ValueError, match=r"^--replicas needs ray, and pip could not install ray==2.60.0: ERROR: No "
                                         r"matching distribution found for ray==2.60.0$"):
        replicas.ray_module()
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", "ray==2.60.0"]]


def test_a_plain_run_does_not_import_ray(tiny_pair, tmp_path):
    code = ("import sys; from commands.cli import main; rc = main(sys.argv[1:]); "
            "assert 'ray' not in sys.modules, 'ray imported'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "run", "--sut", "baseline",
                           "--target", str(tiny_pair / "target"),
                           "--samples", "4", "--max-new-tokens", "4", "--mode", "accuracy", "--results", str(tmp_path)],
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
