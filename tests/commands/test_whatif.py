import pandas as pd

from commands.whatif import PRESETS, measured
from tests.helpers import cli_env, python_m


def test_whatif_measures_every_point_with_its_prediction_and_resumes(tiny_pair, tmp_path):
    env = {**cli_env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    args = ("whatif", "--target", tiny_pair / "target", "--draft", tiny_pair / "draft", "--results", tmp_path / "r",
            "--rounds", "2", "--auto")
    first = python_m("mlperf", *args, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    sweep = PRESETS["sweep"]
    df = pd.read_csv(tmp_path / "r" / "whatif" / "sweep" / "whatif.csv")
    assert len(df) == len(sweep.acceptance) * len(sweep.gammas) >= 6 * 2
    assert df["predicted decode speedup"].gt(0).all() and df["decode speedup"].gt(0).all()
    assert df["Offline speedup"].gt(0).all() and set(df["Offline batch"]) == {sweep.offline_batch}
    assert (df["decode speedup low"] <= df["decode speedup"]).all() and \
        (df["decode speedup"] <= df["decode speedup high"]).all()  # the median of two turns: one of them
    assert df[["decode of roof", "verify of roof", "draft of roof"]].gt(0).all().all()
    assert df["spec-auto's gamma"].between(0, 8).all() and df["spec-auto decode speedup"].gt(0).all()
    for gamma, rows in df.groupby("gamma"):
        predicted = rows.sort_values("acceptance")["predicted decode speedup"].tolist()
        assert predicted == sorted(predicted)  # the roofline's speedup grows with the acceptance it is given
    assert (tmp_path / "r" / "whatif" / "latest" / "whatif.png").is_file()
    assert "synthetic acceptance" in first.stdout
    again = python_m("mlperf", *args, env=env, timeout=600)  # every point is there: nothing runs again
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"({len(df)} measured already" in again.stdout and "SingleStream performance" not in again.stderr


def test_a_point_cut_short_is_measured_again(tmp_path):
    path = tmp_path / "points.jsonl"
    path.write_text('{"pair": "seed", "gamma": 4, "acceptance": 0.7, "rounds": 1, "auto": false}\n{"pai')
    assert list(measured(path)) == [("seed", 4, 0.7, 1, False)]
    assert measured(tmp_path / "none.jsonl") == {}
