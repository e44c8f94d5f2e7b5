"""`python -m mlperf scale` on the tiny pair: replicas beside one process at each count, a table and a plot."""
import pandas as pd
import pytest

from tests.helpers import python_m

pytest.importorskip("ray")


def scale(tiny_pair, results, *args):
    return python_m("mlperf", "scale", "--sut", "baseline", "--target", tiny_pair / "target", "--max-new-tokens", "6",
                    "--samples", "8", "--results", results, *args)


def test_scale_runs_each_count_beside_one_process_on_the_same_cores(tiny_pair, tmp_path, ray_cluster):
    proc = scale(tiny_pair, tmp_path, "--replica-counts", "1,2", "--threads", "1", "--ray-address", ray_cluster)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "scale" / "latest"
    table = pd.read_csv(out / "scale.csv")
    assert list(table["replicas"]) == [1, 2] and list(table["cores"]) == [1, 2]
    assert set(table["replicas validity"]) == set(table["one process validity"]) == {"VALID"}
    assert table["efficiency"].iloc[0] == 1.0 and table["efficiency"].iloc[1] > 0
    assert list(table["reissued"]) == [0, 0] and (out / "scale.png").stat().st_size > 10_000
    assert sorted(p.name for p in (out / "runs").iterdir() if p.is_dir()) == ["p1", "p2", "r1", "r2"]


@pytest.mark.parametrize("args, message", [(("--replica-counts", "2,1"), "must rise from 1"),
                                           (("--replica-counts", "1,2", "--threads", "64"), "need 128 cores")])
def test_bad_counts_are_one_line(tiny_pair, tmp_path, args, message):
    proc = scale(tiny_pair, tmp_path, *args)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-1000:]
