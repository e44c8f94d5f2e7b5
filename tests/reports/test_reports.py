"""Reports over real runs of a tiny model (one LoadGen process each)."""
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch

from mlperf.model import GPTConfig

from reports.plots import draw_roof
from reports.render import build, markdown_table
from reports.tables import comparison, find_runs, peak_table, roofline_points
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_pair):
    results = tmp_path_factory.mktemp("results")
    for sut, scenario in [("baseline", "SingleStream"), ("spec", "SingleStream"), ("baseline", "Offline")]:
        proc = run_cli(tiny_pair, results, "--sut", sut, "--scenario", scenario, conf="any-load.conf")  # all VALID
        assert proc.returncode == 0, proc.stderr[-2000:]
    return find_runs(results)


def test_comparison_table(runs):
    table = comparison(runs)
    assert list(table["sut"]) == ["baseline", "baseline", "spec"] and set(table["validity"]) == {"VALID"}
    single = table[table["scenario"] == "SingleStream"].set_index("sut")
    assert single.loc["baseline", "speedup"] == 1.0 and single.loc["spec", "speedup"] > 0
    assert single.loc["spec", "compared with"] == single.loc["baseline", "compared with"]  # the SingleStream baseline
    assert single.loc["spec", "acceptance"] > 0 and single["TTFT p90 (ms)"].notna().all()
    assert (table["weights"] != "-").all()  # each run says what its weights streamed as


def test_a_run_with_no_matching_baseline_gets_no_speedup(runs, tiny_pair, tmp_path):
    proc = run_cli(tiny_pair, tmp_path, "--sut", "spec", "--scenario", "Offline", "--max-batch", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "note: no baseline run matches" in proc.stdout  # none in its own results directory
    table = comparison(runs + find_runs(tmp_path)).set_index(["sut", "scenario"])
    spec_offline = table.loc[("spec", "Offline")]  # batch 4 against the baseline's batch 8: not comparable
    assert spec_offline["compared with"] == "no matching baseline run"
    assert spec_offline["speedup"] != spec_offline["speedup"]  # NaN


def test_peak_searches_get_a_table_of_their_own(tmp_path):
    search = tmp_path / "target+draft-0123abcd" / "spec" / "Server" / "find-peak" / "20260101-000000"
    search.mkdir(parents=True)
    (search.parent / "latest").symlink_to(search.name)
    (search / "peak.json").write_text(json.dumps({
        "sut": "spec", "profile": "quick", "lowest_invalid_qps": 2.2, "trials": [{}, {}, {}],
        "peak": {"qps": 2.0, "tokens_per_s": 250.0, "ttft_p99_ms": 900.0, "tpot_p99_ms": 6.0}}))
    row = peak_table(tmp_path).iloc[0]
    assert (row["sut"], row["peak QPS"], row["lowest INVALID QPS"], row["trials"]) == ("spec", 2.0, 2.2, 3)


def test_roofline_points_cover_every_phase(runs):
    points = roofline_points(runs)
    assert set(points[points["sut"] == "spec"]["phase"]) == {"prefill", "draft", "verify", "cycle"}
    assert set(points["regime"]) <= {"overhead-bound", "widening-bound", "memory-bound", "compute-bound"}
    assert points["launch_floor_ms"].isna().all()  # a CPU run has no launch floor


def test_html_and_markdown_report(runs, tmp_path):
    page = build(runs, tmp_path, results=tmp_path / "results")  # no series: the figures are the runs' own
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 4 and "<table" in text  # self-contained
    assert 'name="viewport"' in text and text.count("class='card'") == 3 and "Model: target+draft-" in text
    assert "Predicted against measured decode speedup" in text and "achieved_flops_per_s" not in text
    summary = (tmp_path / "summary.md").read_text()
    assert "## Model: target+draft-" in summary and "| spec | SingleStream |" in summary
    assert "launch floor" not in summary  # a column only for runs on a GPU
    assert "%" in summary and "x |" in summary  # acceptance as a percentage, speedups as 1.38x
    for png in ("roofline", "latency_cdf", "accepted_hist", "speedup"):
        assert (tmp_path / f"{png}-1.png").read_bytes()[:4] == b"\x89PNG"


def test_two_models_keep_their_own_latest_and_their_own_rows(runs, tiny_pair, tmp_path_factory):
    """A second pair's runs are filed under its own model folder: the first pair's `latest` stays, and the report
    has a section for each model, each speedup over its own model's baseline."""
    from mlperf.checkpoint import save_checkpoint
    from tests.helpers import peaky_model
    other = tmp_path_factory.mktemp("other")
    for name in ("target", "draft"):
        save_checkpoint(peaky_model(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=256, block_size=512), 7),
                        other / name, dtype=torch.float32)
    (other / "any-load.conf").write_text((tiny_pair / "any-load.conf").read_text())
    import shutil
    results = shutil.copytree(runs[0].parents[4], tmp_path_factory.mktemp("copy") / "results", symlinks=True)
    before = {r: r.parent.joinpath("latest").resolve() for r in find_runs(results)}
    proc = run_cli(other, results, "--sut", "baseline", conf="any-load.conf")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(r.parent.joinpath("latest").resolve() == latest for r, latest in before.items())
    models = sorted(p.name for p in results.iterdir() if (p / "baseline").is_dir())
    assert len(models) == 2 and len(find_runs(results)) == len(runs) + 1
    table = comparison(find_runs(results))
    assert table["model"].nunique() == 2 and (table[table["sut"] == "baseline"]["speedup"] == 1.0).all()
    text = build(find_runs(results), tmp_path_factory.mktemp("report")).read_text()
    assert text.count("<h2>Model: ") == 2


def test_no_runs_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no runs to report"):
        build([], tmp_path)


@pytest.mark.parametrize("cut, message", [("mlperf_log_detail.txt", "mlperf_log_detail.txt is incomplete"),
                                          ("metrics.json", "metrics.json: not valid JSON")])
def test_a_run_cut_short_is_a_one_line_error(runs, tmp_path, cut, message):
    import shutil
    from argparse import Namespace
    from reports.render import main
    run = shutil.copytree(runs[0], tmp_path / "run")
    whole = (run / cut).read_bytes()
    (run / cut).write_bytes(whole[:len(whole) // 2])  # as a file-size limit or a full disk leaves it
    with pytest.raises(ValueError, match=message):
        main(Namespace(runs=[str(run)], results=str(tmp_path), out=str(tmp_path / "report")))


def test_a_run_an_older_version_wrote_is_passed_over_in_the_default_report(runs, tmp_path, capsys):
    import shutil
    from argparse import Namespace
    from reports.render import main
    results = shutil.copytree(runs[0].parents[4], tmp_path / "results", symlinks=True)
    old = results / runs[0].relative_to(runs[0].parents[4]) / "metrics.json"
    raw = json.loads(old.read_text())
    raw["sut"]["drafts_by_lookup"] = False  # a field this version no longer has
    old.write_text(json.dumps(raw))
    main(Namespace(runs=[], results=str(results), out=str(tmp_path / "report")))
    out = capsys.readouterr().out
    assert out.count("passed over:") == 1 and "written by another version" in out
    assert f"({len(runs) - 1} runs)" in out and (tmp_path / "report" / "index.html").is_file()


def test_markdown_table_blanks_missing_values():
    import pandas as pd
    assert markdown_table(pd.DataFrame({"a": [1.23456, float("nan")], "b": ["x", None]})).splitlines()[2:] == \
        ["| 1.23 | x |", "|  |  |"]


def test_reading_runs_loads_no_sut_and_no_kernel(runs):
    """A report reads records and LoadGen's logs: it imports no SUT, no fast path and no Ray."""
    import subprocess
    import sys
    from tests.helpers import cli_env
    code = ("import sys; from reports.render import build; from scenarios.records import RunRecord; "
            f"[RunRecord.load(r) for r in {[str(r) for r in runs]!r}]; "
            "loaded = [m for m in ('suts.registry', 'suts.fast.fused', 'suts.fast.native', 'suts.speculative', 'ray') "
            "if m in sys.modules]; assert not loaded, loaded")
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]


def test_a_report_whose_every_run_is_cut_short_says_so(runs, tmp_path, capsys):
    """A metrics.json cut short (a full disk, a killed process) is passed over by name, and a report left with no
    run says why rather than that there are none."""
    import shutil
    from argparse import Namespace
    from reports.render import main
    results = shutil.copytree(runs[0].parents[4], tmp_path / "results", symlinks=True)
    for latest in results.glob("*/*/*/performance/latest"):
        metrics = latest / "metrics.json"
        metrics.write_text(metrics.read_text()[:300])
    with pytest.raises(ValueError, match=rf"the {len(runs)} latest run\(s\) under {results} were passed over"):
        main(Namespace(runs=[], results=str(results), out=str(tmp_path / "report")))
    out = capsys.readouterr().out
    assert out.count("passed over:") == len(runs) and out.count("a run cut short?") == len(runs)


def test_the_latest_sweeps_figures_join_the_page_where_they_exist(runs, tmp_path):
    results = tmp_path / "results"
    for folder, png in (("sweep", "sweep.png"), ("qps-sweep", "qps-sweep.png")):
        (results / folder / "20260101-000000").mkdir(parents=True)
        (results / folder / "latest").symlink_to("20260101-000000")
        (results / folder / "latest" / png).write_bytes(b"\x89PNG\r\n\x1a\n")  # a PNG's signature: embedded as it is
    text = build(runs, tmp_path / "report", results).read_text()
    assert "Batch sweep (make sweep)" in text and "Server loads (make qps-sweep)" in text
    assert "Ray replicas (make scale)" not in text  # no scaling run here


@pytest.mark.parametrize("widen, drawn", [(52e9, True), (0.0, False), (200e9, False)])
def test_the_roofline_chart_draws_the_widening_ceiling_where_it_lies_between_the_roofs(widen, drawn):
    """fp16 weights widened slower than the cache reads them and faster than DRAM streams them: a ceiling of its
    own between the two lines; none where the peaks have no widening rate, or where it lies above the cache's."""
    fig, ax = plt.subplots()
    peaks = pd.Series({"peak_flops_per_s": 113e9, "peak_bytes_per_s": 34e9, "cache_bytes_per_s": 91e9,
                       "widen_bytes_per_s": widen})
    draw_roof(ax, np.logspace(-1, 3), peaks, "k", "")
    labels = [line.get_label() for line in ax.get_lines()]
    plt.close(fig)
    assert any("widened: 52 GB/s" in label for label in labels) == drawn and len(labels) == 2 + drawn
