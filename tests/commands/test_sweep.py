"""`python -m mlperf sweep` on the tiny pair: every point a LoadGen Offline run, a table, a plot, a verdict."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from commands import sweep as sweep_module
from commands.sweep import fit_band, prediction_line, rounds_line, schedule
from tests.helpers import cli_env, live_processes, python_m, refused, our_server


def sweep(tiny_pair, results, *args):
    return python_m("mlperf", "sweep", "--target", tiny_pair / "target", "--draft", tiny_pair / "draft",
                    "--max-new-tokens", "6", "--results", results, *args)


def test_a_sweep_writes_its_table_plot_and_crossover(tiny_pair, tmp_path):
    proc = sweep(tiny_pair, tmp_path, "--sut", "baseline", "--sut", "spec", "--sut", "spec-tree", "--batches", "1,2,4",
                 "--samples", "4", "--fit-rounds", "2", "--check-rounds", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "sweep" / "latest"
    table = pd.read_csv(out / "sweep.csv", index_col="batch")
    assert list(table.index) == [1, 2, 4]
    assert {"baseline tokens/s", "spec tokens/s", "spec speedup", "spec predicted"} <= set(table.columns)
    summary = json.loads((out / "sweep.json").read_text())
    assert {p["validity"] for p in summary["points"]} == {"VALID"} and set(summary["crossover"]) == {
        "spec", "spec-tree", "spec-tree vs spec"}
    assert {p["batch"] for p in summary["points"]} == {1, 2, 4} and (out / "sweep.png").stat().st_size > 10_000
    assert len(summary["points"]) == (2 + 2 + 1) * 3  # the fitted batches twice: the table shows their mean
    spec = [p["tokens/s"] for p in summary["points"] if p["sut"] == "spec" and p["batch"] == 2]
    assert len(spec) == 2 and table.loc[2, "spec tokens/s"] == sum(spec) / 2
    assert all((out / p["run"]).is_dir() for p in summary["points"])  # relative to the sweep, which was renamed
    assert "spec: " in proc.stdout and "spec-tree vs spec: " in proc.stdout and "predicted" in proc.stdout
    assert "prediction (fitted on batch 1 and 2): tokens/s within " in proc.stdout
    assert "at batch 4 (worst" in proc.stdout
    assert "(batch 1 and 2 2 times, the others once)" in proc.stdout
    assert "run to run, a batch's rounds differ by up to " in proc.stdout
    assert "fitted at batch 2 (ms a cycle): baseline decode " in proc.stdout and "; spec draft " in proc.stdout
    assert "each fit round alone (its batch-1 and batch-2 runs) predicts batch 4: baseline " in proc.stdout
    by_round = summary["predicted_by_fit_round"]  # each round's own fit, at the largest batch
    assert set(by_round) == {"baseline", "spec", "spec-tree"}
    assert all(len(v) == 2 and min(v) > 0 for v in by_round.values())
    overheads = summary["row_overheads_s"]
    assert set(overheads["spec"]) == {"draft", "verify"} and overheads["baseline"]["decode"] >= 0
    again = sweep(tiny_pair, tmp_path, "--explain", str(out))  # from its runs alone: the same table
    assert again.returncode == 0, again.stderr[-2000:]
    pd.testing.assert_frame_equal(pd.read_csv(out / "sweep.csv", index_col="batch"), table)
    elsewhere = {**summary, "machine": "another machine", "peaks": {**summary["peaks"], "flops_per_s": 1e15}}
    (out / "sweep.json").write_text(json.dumps(elsewhere))  # copied from another machine, with its own peaks
    again = sweep(tiny_pair, tmp_path, "--explain", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "a sweep measured on another machine: explained against the peaks it was measured with" in again.stdout
    assert json.loads((out / "sweep.json").read_text())["peaks"]["flops_per_s"] == 1e15  # not this machine's


def test_bad_sweeps_are_one_line_errors(tiny_pair, tmp_path, capsys):
    """One through the command line, the rest through its main() in this process (each a ValueError)."""
    proc = sweep(tiny_pair, tmp_path, "--batches", "2,4")
    assert proc.returncode == 2 and "batches must rise from 1" in proc.stderr and "Traceback" not in proc.stderr
    for args, message in [(["--batches", "1,x"], "comma-separated"), (["--sut", "spec"], "include --sut baseline"),
                          (["--batches", "1,0"], "batches must rise"),
                          (["--fit-rounds", "0"], "--fit-rounds must be at least 1"),
                          (["--check-rounds", "0"], "--check-rounds must be at least 1"),
                          (["--explain", str(tmp_path)], "is not a finished sweep")]:
        code, err = refused(["sweep", "--target", str(tiny_pair / "target"), "--draft", str(tiny_pair / "draft"),
                             "--results", str(tmp_path), *args], capsys)
        assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "sweep").exists()


def test_ctrl_c_ends_a_sweep_and_every_process_it_started(tiny_pair, tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) after the first point: exit 130, the sweep kept apart as
    .interrupted, and nothing it started left running (its points' forkserver and its helper included)."""
    cmd = [sys.executable, "-m", "mlperf", "sweep", "--target", str(tiny_pair / "target"), "--draft",
           str(tiny_pair / "draft"), "--max-new-tokens", "6", "--results", str(tmp_path), "--sut", "baseline",
           "--batches", "1,2,4", "--samples", "4"]
    proc = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,  # a pytest worker has SIGINT ignored, which the sweep would inherit
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:  # the first point measured: its children's server is up
            if line.startswith("  batch"):
                break
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted: Ctrl-C; the sweep kept in" in err, err[-2000:]
    assert [p.suffix for p in (tmp_path / "sweep").iterdir()] == [".interrupted"]
    deadline = time.time() + 30
    while in_session(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not in_session(proc.pid)


def in_session(sid: int) -> list[int]:
    return [pid for pid, fields in live_processes().items() if int(fields[3]) == sid]


def test_fit_and_checked_points_run_in_rounds_spread_over_the_sweep():
    assert schedule((1, 2, 4, 8, 16, 32, 64), 3) == [(1, 0), (2, 0), (4, 0), (1, 1), (2, 1), (8, 0), (16, 0),
                                                    (1, 2), (2, 2), (32, 0), (64, 0)]
    assert schedule((1, 2, 4), 1) == [(1, 0), (2, 0), (4, 0)] and schedule((1, 4, 8), 2) == [(1, 0), (4, 0), (1, 1),
                                                                                           (8, 0)]
    assert schedule((1, 2), 2) == [(1, 0), (2, 0), (1, 1), (2, 1)]
    # checked batches in rounds too: every batch once, then every batch again, shared out between the fit rounds
    assert schedule((1, 2, 4, 8, 16), 3, 2) == [(1, 0), (2, 0), (4, 0), (8, 0), (1, 1), (2, 1), (16, 0), (4, 1),
                                               (1, 2), (2, 2), (8, 1), (16, 1)]
    assert schedule((1, 4), 1, 3) == [(1, 0), (4, 0), (4, 1), (4, 2)]


def test_a_sweep_compares_a_server_with_the_baseline_and_predicts_only_what_it_can_fit(tiny_pair, tmp_path):
    with our_server(tiny_pair, "--max-batch", "2") as (url, _):
        proc = sweep(tiny_pair, tmp_path, "--endpoint", url, "--sut", "ours", "--batches", "1,2", "--samples", "4",
                     "--fit-rounds", "1")
        assert proc.returncode == 0, proc.stderr[-2000:]
        bad = sweep(tiny_pair, tmp_path, "--endpoint", url, "--sut", "a", "--sut", "b")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: a sweep with --endpoint compares the one server (one --sut, its name) with the baseline")
    out = tmp_path / "sweep" / "latest"
    table = pd.read_csv(out / "sweep.csv", index_col="batch")
    assert {"baseline tokens/s", "ours tokens/s", "ours speedup", "ours predicted"} <= set(table.columns)
    assert table["ours predicted"].notna().all()  # our server reports its engine's steps: fitted like any SUT
    for run in (out / "runs").glob("ours-b?"):  # as if another engine had served them: its times alone
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["endpoint"]["url"] == url
        metrics["endpoint"]["engine"] = "another"
        (run / "metrics.json").write_text(json.dumps(metrics))
    again = sweep(tiny_pair, tmp_path, "--explain", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "ours: no prediction (its server reports no engine steps to fit)" in again.stdout
    table = pd.read_csv(out / "sweep.csv", index_col="batch")
    assert table["ours predicted"].isna().all() and table["ours speedup"].notna().all()
    assert set(json.loads((out / "sweep.json").read_text())["predicted_tokens_per_s"]) == {"baseline"}


def test_the_prediction_line_names_its_worst_miss_beyond_batch_one():
    batches = pd.Index([1, 2, 4], name="batch")
    measured = pd.DataFrame({"baseline": [100.0, 150.0, 200.0], "spec": [200.0, 240.0, 260.0]}, index=batches)
    predicted = pd.DataFrame({"baseline": [100.0, 165.0, 200.0], "spec": [200.0, 240.0, 390.0]}, index=batches)
    table = pd.DataFrame({"spec speedup": measured["spec"] / measured["baseline"],
                          "spec predicted": predicted["spec"] / predicted["baseline"]})
    line = prediction_line(measured, predicted, table, [1])
    assert line.startswith("prediction (fitted on batch 1): tokens/s within 50% of LoadGen's at batch 2, 4 "
                           "(worst: spec at batch 4)")
    assert line.endswith("speedups within 0.65 (worst: spec at batch 4)")  # 390/200 against 260/200
    assert prediction_line(measured, predicted, table, [1, 2]).startswith(
        "prediction (fitted on batch 1 and 2): tokens/s within 50% of LoadGen's at batch 4 (worst: spec at batch 4)")
    assert "no other batch" in prediction_line(measured.loc[[1]], predicted.loc[[1]], table.loc[[1]], [1])


def test_the_rounds_spread_is_reported_as_the_floor_under_the_misses():
    points = pd.DataFrame({"sut": ["baseline"] * 3 + ["spec"] * 4 + ["spec"],
                           "batch": [1, 1, 2, 1, 1, 2, 2, 4],
                           "tokens/s": [100.0, 110.0, 190.0, 200.0, 204.0, 300.0, 360.0, 50.0]})
    assert rounds_line(points) == (  # batch 4 ran once
        "run to run, a batch's rounds differ by up to 20% (spec at batch 2): a floor under the prediction's misses")
    assert rounds_line(points.drop_duplicates(["sut", "batch"])) is None  # one round each: nothing to say
    checked = pd.concat([points, pd.DataFrame({"sut": ["spec"], "batch": [4], "tokens/s": [65.0]})])
    assert "up to 30% (spec at batch 4)" in rounds_line(checked)  # a checked batch's rounds count too


def test_each_fit_round_is_fitted_on_its_own_batch_1_and_batch_2_runs(monkeypatch):
    points = pd.DataFrame([{"sut": sut, "batch": b, "run": f"runs/{sut}-b{b}" + (f"-r{r}" if r > 1 else "")}
                           for sut in ("baseline", "spec") for b in (1, 2, 4) for r in (1, 2, 3)])
    rows = pd.DataFrame({"baseline": [1.0, 2.0, 4.0], "spec": [1.0, 2.0, 3.5]}, index=[1, 2, 4])
    short = set()  # batch-2 runs too short to keep two rows busy
    monkeypatch.setattr(sweep_module.RunRecord, "load", lambda path: SimpleNamespace(name=Path(path).name, stats=path))
    monkeypatch.setattr(sweep_module, "mean_batch", lambda stats: 1.0 if Path(stats).name in short else 2.0)
    seen = []

    def fitted(one, two):
        seen.append((one.name, two.name))
        k = len(seen)
        return SimpleNamespace(tokens_per_s=lambda b: 100.0 * k * b)

    line, predicted = fit_band(Path("sweep"), points, rows, fitted)
    assert seen == [(f"{sut}-b1{r}", f"{sut}-b2{r}") for sut in ("baseline", "spec") for r in ("", "-r2", "-r3")]
    assert predicted == {"baseline": [400.0, 800.0, 1200.0], "spec": [1400.0, 1750.0, 2100.0]}  # at batch 4's rows
    assert line.startswith("each fit round alone (its batch-1 and batch-2 runs) predicts batch 4: baseline 400-1200 "
                           "tokens/s, spec 1400-2100 tokens/s; spec 1.75-3.50x")
    short.add("spec-b2-r3")  # spec keeps two rounds, the baseline three: not comparable round by round
    assert fit_band(Path("sweep"), points, rows, fitted) is None
    assert fit_band(Path("sweep"), points[~points.run.str.contains("-r")], rows, fitted) is None  # one round
