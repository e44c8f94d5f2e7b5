"""`python -m mlperf pareto` on the tiny pair: a LoadGen Offline run per SUT and concurrency, the curves' CSV,
summary and figure, and where speculation stops paying."""
import json

import pandas as pd

from commands.pareto import stops_paying
from tests.helpers import python_m, refused


def test_pareto_writes_seven_points_a_sut_and_its_figure(tiny_pair, tmp_path):
    proc = python_m("mlperf", "pareto", "--target", tiny_pair / "target", "--draft", tiny_pair / "draft",
                    "--max-new-tokens", "6", "--results", tmp_path, "--concurrency", "1,2,3,4,5,6,8", "--samples", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "pareto" / "latest"
    points = pd.read_csv(out / "pareto.csv")
    assert sorted(set(points["sut"])) == ["baseline", "spec"]
    assert list(points[points["sut"] == "spec"]["concurrency"]) == [1, 2, 3, 4, 5, 6, 8]
    assert (points["total tokens/s"] > 0).all() and (points["per-user tokens/s"] > 0).all()
    assert set(points["validity"]) == {"VALID"} and (out / "pareto.png").stat().st_size > 10_000
    summary = json.loads((out / "pareto.json").read_text())
    assert set(summary["stops_paying"]) == set(summary["per_user_stops_paying"]) == {"spec"}
    assert len(summary["points"]) == 14
    assert "spec: " in proc.stdout


def test_the_point_where_speculation_stops_paying_is_its_first_at_or_below_the_baseline():
    points = pd.DataFrame([{"sut": sut, "concurrency": c, "total tokens/s": t, "per-user tokens/s": u}
                           for sut, totals, users in [("baseline", [100, 180, 300], [100, 90, 75]),
                                                      ("spec", [150, 200, 290], [150, 90, 72]),
                                                      ("ngram", [120, 190, 310], [120, 95, 78])]
                           for c, t, u in zip((1, 2, 4), totals, users)])
    assert stops_paying(points) == {"spec": 4, "ngram": None}
    assert stops_paying(points, "per-user tokens/s") == {"spec": 2, "ngram": None}


def test_bad_pareto_sweeps_are_one_line_errors(tiny_pair, tmp_path, capsys):
    for args, message in [(["--concurrency", "1,2,3"], "at least 7 positive points"),
                          (["--concurrency", "1,2,3,4,5,6,6"], "rising without repeats"),
                          (["--sut", "spec"], "include --sut baseline"),
                          (["--samples", "4"], "cannot keep 16 queries in flight")]:
        code, err = refused(["pareto", "--target", str(tiny_pair / "target"), "--draft", str(tiny_pair / "draft"),
                             "--results", str(tmp_path), *args], capsys)
        assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "pareto").exists()
