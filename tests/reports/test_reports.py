"""Reports over real runs of a tiny model (one LoadGen process each)."""
import pytest

from reports.render import build, markdown_table
from reports.tables import comparison, find_runs, roofline_points
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_pair):
    results = tmp_path_factory.mktemp("results")
    for sut, scenario in [("baseline", "SingleStream"), ("spec", "SingleStream"), ("baseline", "Offline")]:
        proc = run_cli(tiny_pair, results, "--sut", sut, "--scenario", scenario)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return find_runs(results)


def test_comparison_table(runs):
    table = comparison(runs)
    assert list(table["sut"]) == ["baseline", "baseline", "spec"] and set(table["validity"]) == {"VALID"}
    single = table[table["scenario"] == "SingleStream"].set_index("sut")
    assert single.loc["baseline", "speedup"] == 1.0 and single.loc["spec", "speedup"] > 0
    assert single.loc["spec", "acceptance"] > 0 and single["TTFT p90 (ms)"].notna().all()


def test_roofline_points_cover_every_phase(runs):
    points = roofline_points(runs)
    assert set(points[points["sut"] == "spec"]["phase"]) == {"prefill", "draft", "verify", "cycle"}
    assert set(points["regime"]) <= {"overhead-bound", "memory-bound", "compute-bound"}


def test_html_and_markdown_report(runs, tmp_path):
    page = build(runs, tmp_path)
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 4 and "<table" in text  # self-contained
    summary = (tmp_path / "summary.md").read_text()
    assert "## Comparison" in summary and "| spec | SingleStream |" in summary
    for png in ("roofline", "latency_cdf", "accepted_hist", "speedup"):
        assert (tmp_path / f"{png}.png").read_bytes()[:4] == b"\x89PNG"


def test_no_runs_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no runs to report"):
        build([], tmp_path)


def test_markdown_table_blanks_missing_values():
    import pandas as pd
    assert markdown_table(pd.DataFrame({"a": [1.23456, float("nan")], "b": ["x", None]})).splitlines()[2:] == \
        ["| 1.23 | x |", "|  |  |"]
