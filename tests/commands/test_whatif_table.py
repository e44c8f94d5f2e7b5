import pandas as pd

from commands.whatif_table import measured_break_even, peer_report


def test_the_measured_break_even_is_where_the_speedup_crosses_one():
    points = pd.DataFrame({"acceptance": [0.5, 0.6, 0.7], "decode speedup": [0.8, 0.9, 1.1]})
    assert abs(measured_break_even(points) - 0.65) < 1e-9
    assert measured_break_even(points.assign(**{"decode speedup": [0.5, 0.6, 0.7]})) is None


def test_llama_cpps_row_stands_beside_the_baselines_median_tpot_of_the_same_pair(tmp_path, capsys):
    points = pd.DataFrame({"pair": ["seed", "seed", "seed", "gpt2-medium"], "baseline TPOT ms": [6.0, 7.0, 9.0, 28.0]})
    peer_report(points, [{"pair": "seed", "engine": "llama.cpp F16 (plain)", "TPOT ms": 10.5}], tmp_path)
    table = pd.read_csv(tmp_path / "whatif-peers.csv")
    assert table["engine"].tolist() == ["ours, fp16 baseline", "llama.cpp F16 (plain)"]
    assert table["TPOT ms"].tolist() == [7.0, 10.5] and table["against ours"].tolist() == [1.0, 1.5]
    assert "llama.cpp F16" in capsys.readouterr().out
