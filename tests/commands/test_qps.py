"""`python -m mlperf qps-sweep` on the tiny pair: every point a LoadGen Server run, one table, one figure."""
import json

import pandas as pd

from tests.helpers import python_m, refused


def test_a_qps_sweep_writes_its_table_and_figure(tiny_pair, tmp_path):
    conf = tmp_path / "short.conf"  # few queries: INVALID verdicts, but every point measured
    conf.write_text("*.Server.min_duration = 0\n*.Server.min_query_count = 6\n")
    proc = python_m("mlperf", "qps-sweep", "--target", tiny_pair / "target", "--draft", tiny_pair / "draft",
                    "--max-new-tokens", "4", "--results", tmp_path, "--user-conf", conf, "--sut", "baseline", "--sut",
                    "spec", "--loads", "20,40", "--token-budget", "16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "qps-sweep" / "latest"
    table = pd.read_csv(out / "qps-sweep.csv")
    assert sorted(zip(table["sut"], table["qps"])) == [("baseline", 20), ("baseline", 40), ("spec", 20), ("spec", 40)]
    assert table["tpot_p99_ms"].notna().all() and table["goodput_tokens_per_s"].notna().all()
    assert (table["goodput_tokens_per_s"] <= table["tokens_per_s"] + 1e-9).all()
    assert all((out / run).is_dir() for run in table["run_dir"])  # relative to the sweep, which was renamed
    summary = json.loads((out / "qps-sweep.json").read_text())
    assert summary["limits_ms"] == {"ttft_latency": 2000.0, "tpot_latency": 200.0}  # the model's, for every SUT
    assert (out / "qps-sweep.png").stat().st_size > 10_000 and "SLO" in proc.stdout


def test_bad_loads_are_one_line_errors(tiny_pair, tmp_path, capsys):
    for qps, message in (("1,x", "comma-separated numbers"), ("2,1", "rising"), ("0,1", "positive")):
        code, err = refused(["qps-sweep", "--target", str(tiny_pair / "target"), "--loads", qps, "--results",
                             str(tmp_path)], capsys)
        assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "qps-sweep").exists()
