"""End to end through the real LoadGen, on a tiny model, each run in its own process."""
import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from reports.loadgen import headline
from roofline.analysis import write_sidecar
from scenarios.records import RunRecord, weights_in_brief
from mlperf.env import set_threads
from suts.fast.native import rows_kernel
from tests.helpers import cli_env, filed, refused, run_args, run_cli


def only_run(results, sut, scenario, mode):
    base = filed(results, sut, scenario, mode)
    return base / "latest", sorted(p.name for p in base.iterdir())


PACED = "tests.scenarios.faulty_suts:PacedSpec"
EAGLE = "eagle"  # spec, paced so that Server arrivals overlap on any CPU


@pytest.mark.parametrize("sut, scenario", [("spec", "SingleStream"), ("baseline", "Offline"), (PACED, "Server"),
                                          ("spec-tree", "Offline")])
def test_each_scenario_gives_a_valid_result_with_token_latencies(mlperf_run, sut, scenario):
    proc = mlperf_run("--sut", sut, "--scenario", scenario, *(["--qps", "40"] if scenario == "Server" else []),
                      *(["--tree", "2,2"] if sut == "spec-tree" else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    latest, _ = only_run(mlperf_run.results, sut.replace(":", "."), scenario, "performance")
    table = headline(latest)
    assert table.validity == "VALID" and table.tokens_per_s > 0
    assert "No errors encountered during test" in (latest / "mlperf_log_summary.txt").read_text()
    if scenario != "Offline":
        assert table.ttft_p90_ms > 0 and table.tpot_p90_ms > 0
    record = RunRecord.load(latest)
    assert record.sut.dtype == "float32" and record.machine and record.versions["torch"]
    speculative = sut != "baseline"
    assert set(record.checkpoints) == ({"target", "draft"} if speculative else {"target"})
    assert (record.sut.draft is not None) == speculative and record.sut.draft_weight_bytes is None  # fp32 draft
    assert table.weights == weights_in_brief(record.sut.weights) != "-"  # the table says what streamed
    assert (table.acceptance or 0) > 0 if speculative else table.acceptance is None
    assert record.sut.batch == (1 if scenario == "SingleStream" else 8)
    assert record.sut.tree == ([2, 2] if sut == "spec-tree" else None)  # the shape it ran, for the roofline
    batches = {b for s in record.stats for b in s.batch_steps}
    if scenario == "Server":  # queries that arrive while others decode join the running batch
        assert max(batches) > 1, batches
    elif scenario == "Offline":
        assert max(batches) == 8
    roofline = json.loads((latest / "roofline.json").read_text())
    # per-step accounting agrees with what LoadGen measured: the SUT's busy time fits in LoadGen's duration, and no step
    # is lost or counted once per row (8x here). How much of a run this short (about 10 ms) passes outside the steps, in
    # LoadGen's threads and the adapter, depends on the machine: on this one 14-44% from run to run
    if scenario == "Offline":
        ratio = roofline["tokens_per_s"] / roofline["loadgen_tokens_per_s"]
        assert 0.95 < ratio < 2, ratio
    assert "VALID" in proc.stdout and "tokens/s" in proc.stdout


@pytest.mark.parametrize("cores, threads", [(None, 1), (1, 1), (2, 1), (3, 1), (4, 2), (16, 8)])
def test_runs_give_torch_half_the_cores_unless_told(monkeypatch, cores, threads):
    before = torch.get_num_threads()
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    try:
        set_threads(None)
        assert torch.get_num_threads() == threads
        set_threads(3)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_a_run_is_set_against_this_hours_peaks(mlperf_run, monkeypatch):
    """A VM's memory speed moves from hour to hour: peaks cached in another hour are measured again as a run ends,
    ones from the last RECENT_S are reused (a sweep's runs, a smoke's rounds), and ones the run beat are measured
    anew."""
    from roofline.peaks import RECENT_S
    monkeypatch.delenv("MLPERF_PEAKS_CACHE")  # this run's own cache, in its results folder
    assert mlperf_run("--sut", "baseline", "--scenario", "SingleStream").returncode == 0
    latest, _ = only_run(mlperf_run.results, "baseline", "SingleStream", "performance")
    sut = RunRecord.load(latest).sut
    assert sut.runners == {"target": "fused C step" if rows_kernel() else "modules"}
    assert sut.kernels == (rows_kernel().built if rows_kernel() else None)  # which build ran it: compiler, flags
    assert sut.fused_vs_modules is None  # MLPERF_ROWS_KERNEL=1 in the tests: the fused step untimed
    cache = mlperf_run.results / "peaks.json"
    (key, entry), = json.loads(cache.read_text()).items()
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    hour_ago = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - RECENT_S - 60))
    monkeypatch.chdir(mlperf_run.results.parent)
    monkeypatch.setattr("roofline.peaks.measure", lambda *args: {**entry, "measured": now})  # measured again
    threads = torch.get_num_threads()
    set_threads(RunRecord.load(latest).config.threads)  # the run's: the cache's key names them
    try:
        for peak, measured, anew in ((1e18, hour_ago, True), (1e18, now, False), (1.0, now, True)):
            cached = {**entry, "flops_per_s": peak, "bytes_per_s": peak, "measured": measured}
            cache.write_text(json.dumps({key: cached}))
            roof = write_sidecar(latest)
            assert (roof.peaks["flops_per_s"] != peak) == anew, (peak, measured)
    finally:
        torch.set_num_threads(threads)
    assert json.loads((latest / "roofline.json").read_text())["peaks"] == roof.peaks


def test_an_eagle_run_records_its_head_and_costs_its_draft_step(mlperf_run):
    proc = mlperf_run("--sut", EAGLE, "--scenario", "Offline")
    assert proc.returncode == 0, proc.stderr[-2000:]
    latest, _ = only_run(mlperf_run.results, EAGLE.replace(":", "."), "Offline", "performance")
    assert headline(latest).validity == "VALID"
    record = RunRecord.load(latest)
    assert set(record.checkpoints) == {"target", "head"} and record.sut.drafter == "head"
    assert record.sut.runners == dict.fromkeys(("target", "draft"), "fused C step" if rows_kernel() else "modules")
    assert record.sut.draft["n_layer"] == 1 and record.draft_config().n_embd == 32
    draft = json.loads((latest / "roofline.json").read_text())["phases"]["draft x8"]
    assert draft["flops"] > 0 and draft["bytes"] > 0


def test_accuracy_mode_logs_every_sample_once_and_spec_matches_baseline(mlperf_run):
    proc = mlperf_run("--sut", "spec", "--mode", "accuracy", samples=12, tokens=12)
    assert proc.returncode == 0, proc.stderr[-2000:]
    latest, _ = only_run(mlperf_run.results, "spec", "SingleStream", "accuracy")
    entries = json.loads((latest / "mlperf_log_accuracy.json").read_text())
    assert sorted(e["qsl_idx"] for e in entries) == list(range(12))
    accuracy = json.loads((latest / "accuracy.json").read_text())
    assert accuracy["exact_match"] == 1.0 and accuracy["tokens_per_sample"] == 12
    assert accuracy["mean_log_likelihood_nats_per_token"] < 0
    assert "exact match vs baseline greedy: 1.0000" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--sut", "turbo"], "unknown SUT 'turbo'; choose one of baseline, spec"),
    (["--scenario", "MultiStream"], "unknown scenario 'MultiStream'; choose one of SingleStream, Offline, Server"),
    (["--mode", "fast"], "unknown mode 'fast'; choose one of performance, accuracy"),
    (["--profile", "huge"], "unknown profile 'huge'; choose one of full, interactive, quick"),
    (["--max-new-tokens", "0"], "max_new_tokens must be a positive integer"),
    (["--qps", "-2"], "qps must be positive"),
    (["--gamma", "0"], "gamma must be a positive integer"),
    (["--max-batch", "0"], "max_batch must be a positive integer, got 0"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--dtype", "int4"], "unknown dtype 'int4'; choose one of float32, float16, bfloat16"),
    (["--target", "/no/such/checkpoint"], "checkpoint not found"),
    (["--user-conf", "/no/such.conf"], "user.conf not found"),
    (["--prompts", "/no/such.jsonl"], "prompt file not found"),
    (["--sut", "eagle", "--head", "/no/such/head"], "EAGLE head not found: /no/such/head"),
    (["--sut", "spec-tree", "--tree", "4,x"], "a tree is children per depth as positive integers"),
    (["--sut", "spec", "--tree", "2,1"], "SUT spec drafts no tree"),
    (["--sut", "spec", "--drafter", "collections:Counter"], "--drafter is for the ngram SUTs"),
    (["--sut", "ngram", "--drafter", "no_such_module:Drafter"], "cannot load drafter 'no_such_module:Drafter'"),
])
def test_bad_input_is_one_line_and_a_non_zero_exit(tiny_pair, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    code, err = refused(run_args(tiny_pair, tmp_path / "results", *args), capsys)
    assert code == 2  # BAD_INPUT
    assert err.strip().count("\n") == 0 and message in err, err[-2000:]
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("latest"))


def test_bad_input_through_the_entry_point_is_one_line(mlperf_run):
    """The cases above run in this process; one through `python -m mlperf`, as a user meets them."""
    proc = mlperf_run("--sut", "turbo")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: unknown SUT 'turbo'; choose one of baseline, spec")


def test_dtype_override_is_recorded(mlperf_run):
    proc = mlperf_run("--sut", "baseline", "--dtype", "bfloat16", "--mode", "accuracy", samples=4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    latest, _ = only_run(mlperf_run.results, "baseline", "SingleStream", "accuracy")
    assert json.loads((latest / "metrics.json").read_text())["sut"]["dtype"] == "bfloat16"


def test_a_prompt_longer_than_the_context_is_named(mlperf_run, tmp_path):
    prompts = tmp_path / "long.jsonl"
    prompts.write_text('{"id": 0, "source": "a.py", "offset": 0, "text": "x = 1\\n"}\n'
                       '{"id": 7, "source": "b.py", "offset": 0, "text": "' + "y" * 600 + '"}\n')
    proc = mlperf_run("--prompts", str(prompts), samples=2)
    assert proc.returncode == 2 and "prompt 7 (b.py) has 600 tokens" in proc.stderr


def test_a_sut_that_raises_ends_the_run_cleanly_and_keeps_the_good_result(mlperf_run):
    good = mlperf_run("--sut", "baseline")
    assert good.returncode == 0, good.stderr[-2000:]
    latest, before = only_run(mlperf_run.results, "baseline", "SingleStream", "performance")
    good_target = latest.resolve()
    proc = mlperf_run("--sut", "tests.scenarios.faulty_suts:RaisesInTest")
    assert proc.returncode == 2 and "simulated SUT crash" in proc.stderr.splitlines()[-1]
    failed = list(filed(mlperf_run.results, "tests.scenarios.faulty_suts.RaisesInTest").rglob("*.failed"))
    assert len(failed) == 1 and "simulated SUT crash" in (failed[0] / "error.txt").read_text()
    assert latest.resolve() == good_target  # the earlier good result is untouched


def test_a_stalled_sut_is_stopped_by_the_watchdog(mlperf_run):
    proc = mlperf_run("--sut", "tests.scenarios.faulty_suts:StallsInTest", "--stall-timeout", "2")
    assert proc.returncode == 2 and "stalled" in proc.stderr
    assert not list(mlperf_run.results.rglob("latest"))


def test_the_accuracy_gate_fails_a_sut_that_changes_one_token(mlperf_run):
    proc = mlperf_run("--sut", "tests.scenarios.faulty_suts:ChangesOneToken", "--mode", "accuracy", samples=6)
    assert proc.returncode == 1 and "ACCURACY FAIL" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == ("GATE FAIL: accuracy: greedy outputs differ from the baseline's "
                                                    "on 6 of 6 samples (first: sample 0)")


@pytest.mark.parametrize("sut, passes", [("spec", True), ("tests.scenarios.faulty_suts:HotSampler", False)])
def test_sampled_accuracy_compares_log_likelihood_with_the_baselines_samples(mlperf_run, sut, passes):
    proc = mlperf_run("--sut", sut, "--mode", "accuracy", "--temperature", "0.8", samples=16, tokens=24)
    assert (proc.returncode == 0) == passes, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert ("ACCURACY PASS" if passes else "beyond the tolerance") in proc.stdout


@pytest.mark.parametrize("signum, name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_ctrl_c_or_sigterm_ends_a_run_within_seconds_and_keeps_it_apart(tiny_pair, tmp_path, signum, name):
    long = tmp_path / "long.conf"
    long.write_text("*.SingleStream.min_duration = 600000\n")
    cmd = [sys.executable, "-m", "mlperf", "run", "--sut", "baseline", "--target", str(tiny_pair / "target"),
           "--samples", "8", "--max-new-tokens", "8", "--user-conf", str(long), "--results", str(tmp_path / "r")]
    # a test runner in the background may have SIGINT ignored, which the child would inherit: restore it
    proc = subprocess.Popen(cmd, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120  # polled, not slept: LoadGen has begun when its detail log exists
        while not list((tmp_path / "r").rglob("*.partial/mlperf_log_detail.txt")) and time.time() < deadline:
            time.sleep(0.1)
        proc.send_signal(signum)
        sent = time.time()
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()  # never leave a 10-minute run behind when the test fails
    assert proc.returncode == 128 + signum and time.time() - sent < 10, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(f"interrupted: {name} (logs kept in ")
    kept = list((tmp_path / "r").rglob("*.interrupted"))
    assert len(kept) == 1 and f"interrupted ({name})" in (kept[0] / "error.txt").read_text()
    assert not list((tmp_path / "r").rglob("latest"))


def test_the_fast_paths_thread_counts_are_recorded_and_printed(mlperf_run):
    """On more than one torch thread each size of fused call keeps the count it ran fastest on (suts/fast/threads.py):
    the record keeps them, so a phase's fraction of a roof measured on every thread can be read against them."""
    proc = mlperf_run("--sut", "spec", "--threads", "2", "--mode", "accuracy", samples=4, tokens=24)
    assert proc.returncode == 0, proc.stderr[-2000:]
    latest, _ = only_run(mlperf_run.results, "spec", "SingleStream", "accuracy")
    kept = RunRecord.load(latest).fused_threads
    if not kept:
        pytest.skip("the kernels do not build here")
    assert {k.split()[0] for k in kept} == {"target", "draft"} and set(kept.values()) <= {1, 2}
    assert "fast path's threads (of 2) by call size: target: " in proc.stdout


def test_what_the_fast_step_does_not_take_is_counted_by_reason_in_the_record(mlperf_run):
    """A plug-in SUT decoding with int32 ids: every decode step falls back to the modules, each prefill is a step."""
    proc = mlperf_run("--sut", "tests.scenarios.faulty_suts:DecodesInt32Ids", "--mode", "accuracy", samples=4,
                      tokens=12)
    assert proc.returncode == 0, proc.stderr[-2000:]
    latest, _ = only_run(mlperf_run.results, "tests.scenarios.faulty_suts.DecodesInt32Ids", "SingleStream",
                         "accuracy")
    target = RunRecord.load(latest).fast_path["target"]
    if target["fell_back"] == {"no fast step": 4 * 12}:
        pytest.skip("the kernels do not build here")
    assert target == {"steps": 4, "fell_back": {"token ids not int64": 4 * 11}}


def test_exit_codes_say_pass_verdict_failed_and_bad_input_apart(tiny_pair, tmp_path):
    """0: a VALID run; 1: a run that completed and LoadGen judged INVALID (published: its figures are a result);
    2: bad input, no run (docs/running.md, "Exit codes")."""
    (tiny_pair / "few-queries.conf").write_text("*.Server.min_duration = 0\n*.Server.min_query_count = 6\n")
    server = ("--sut", "baseline", "--scenario", "Server", "--qps", "20")
    valid = run_cli(tiny_pair, tmp_path, "--sut", "baseline")
    invalid = run_cli(tiny_pair, tmp_path, *server, conf="few-queries.conf")  # too few queries for early stopping
    bad = run_cli(tiny_pair, tmp_path, "--sut", "baseline", "--gamma", "0")
    assert valid.returncode == 0, valid.stderr[-2000:]
    assert invalid.returncode == 1 and invalid.stderr.strip().splitlines()[-1].startswith("INVALID: "), \
        invalid.stderr[-2000:]
    assert "validity         INVALID" in invalid.stdout
    assert filed(tmp_path, "baseline", "Server", "performance", "latest").is_dir()
    assert bad.returncode == 2 and bad.stderr.strip() == "error: gamma must be a positive integer, got 0"
