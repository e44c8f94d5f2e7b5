import pandas as pd
import pytest

from commands import bench, peers


def test_bench_reports_greedy_and_sampled_settings_with_acceptance_spread(tiny_pair, tmp_path):
    target, draft = str(tiny_pair / "target"), str(tiny_pair / "draft")
    for setting, params in bench.SETTINGS.items():
        df = bench.run(target, draft, n_prompts=3, max_new_tokens=8, suts=("baseline", "spec"), reference_rows=False,
                       params=params, peaks_cache=tmp_path / "peaks.json")
        assert list(df.index) == ["baseline", "spec"] and (df["tokens"] == 24).all()
        assert df.loc["spec", "identical"] == (True if setting == "greedy" else None)
        low, mid, high = map(float, df.loc["spec", "per-prompt acc. min/med/max"].split("/"))
        assert 0 <= low <= mid <= high <= 1
        assert df.attrs["repetitive"] == [] or set(df.attrs["repetitive"]) <= {0, 1, 2}
    assert (tmp_path / "peaks.json").is_file()  # the peaks it measured cached where it was told, not in ./results
    assert df.attrs["peaks"]["bytes_per_s"] > 0  # what the roof rows were set against, printed beside them


def test_sampled_setting_is_seeded_per_prompt(tiny_pair, tmp_path):
    target, draft = str(tiny_pair / "target"), str(tiny_pair / "draft")
    sampled = bench.SETTINGS["sampled"]
    runs = [bench.run(target, draft, 2, 8, suts=("spec",), reference_rows=False, params=sampled,
                      peaks_cache=tmp_path / "peaks.json") for _ in range(2)]
    assert runs[0].loc["spec", "per-prompt acc. min/med/max"] == runs[1].loc["spec", "per-prompt acc. min/med/max"]


def test_a_tree_shape_reaches_the_tree_suts_only(tiny_pair, monkeypatch, tmp_path):
    """--tree goes to every -tree SUT (its depth becomes its gamma) and to no chain SUT, which would refuse it."""
    target, draft = str(tiny_pair / "target"), str(tiny_pair / "draft")
    built = {}
    build = bench.build_sut
    monkeypatch.setattr(bench, "build_sut", lambda name, *a, **k: built.setdefault(name, build(name, *a, **k)))
    df = bench.run(target, draft, 2, 8, suts=("baseline", "spec", "spec-tree"), reference_rows=False, tree="2,2",
                   peaks_cache=tmp_path / "peaks.json")
    assert built["spec-tree"].fanout == (2, 2) and built["spec"].fanout == () and df["identical"].all()


BROKEN = {"SIGILL in plain": "kill -ILL $$",  # an instruction the CPU refuses (AMX tiles on a VM that hides them)
          "plain hung": "exec sleep 30", "exit 0): no output": "exit 0"}


@pytest.mark.parametrize("why", BROKEN)
def test_a_failing_peer_is_one_row_and_every_other_row_runs(tiny_pair, tmp_path, monkeypatch, why):
    """A peer binary that dies of a signal, hangs or prints nothing: its row says why in one line, our SUTs' rows and
    the other peer's are measured as usual (fake llama.cpp tools; no build needed)."""
    def tool(name, body):
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path
    monkeypatch.setattr(peers, "PLAIN", tool("plain", BROKEN[why]))
    monkeypatch.setattr(peers, "SPECULATIVE", tool("spec", "printf 'xyz'; printf 'encoded 3 tokens in 0.010 seconds\\n"
                                                             "decoded 4 tokens in 0.020 seconds\\nn_drafted = 6\\n"
                                                             "n_accept = 3\\n' >&2"))
    monkeypatch.setattr(peers, "available", lambda: True)
    monkeypatch.setattr(peers, "convert", lambda checkpoint, precision: tmp_path / f"{precision}.gguf")
    monkeypatch.setattr(peers, "PRECISIONS", ("F16",))
    monkeypatch.setattr(peers, "RUN_TIMEOUT_S", 1.0)
    monkeypatch.setattr(bench, "hf_generators", lambda *args: {})
    df = bench.run(str(tiny_pair / "target"), str(tiny_pair / "draft"), 2, 8, suts=("baseline", "spec"),
                   peaks_cache=tmp_path / "peaks.json")
    assert why in df.loc["llama.cpp F16", "failed"] and len(df.loc["llama.cpp F16", "failed"].splitlines()) == 1
    assert df.loc[["baseline", "spec"], "tokens/s"].gt(0).all() and df.loc["spec", "identical"]
    assert df.loc["llama.cpp speculative F16 (draft max 5)", "tokens"] == 2 * 3  # the other peer measured


def test_rows_that_differ_are_named_and_only_a_quantised_peer_is_expected_to(capsys):
    bench.print_differences(pd.Series({"baseline": True, "spec": True, "llama.cpp Q8_0": False, "failed peer": None}))
    out = capsys.readouterr().out
    assert "llama.cpp Q8_0" in out and "WARNING" not in out
    bench.print_differences(pd.Series({"baseline": True, "spec": False, "llama.cpp speculative Q8_0": False}))
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "WARNING: outputs differ from the baseline's: spec"


def test_bench_on_someones_own_pair_skips_the_eagle_rows_and_writes_json_and_csv(tiny_pair, tmp_path):
    """The shipped EAGLE head reads the shipped target's features: on another pair its SUTs are skipped in one
    line each and the rest measured; bench.json and bench.csv hold every row beside the printed table."""
    import json
    from tests.helpers import python_m
    proc = python_m("mlperf", "bench", "--target", tiny_pair / "target", "--draft", tiny_pair / "draft",
                    "--samples", "2", "--max-new-tokens", "8", "--setting", "greedy", "--results", tmp_path,
                    *(a for s in ("baseline", "spec", "eagle", "eagle-tree") for a in ("--sut", s)), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("skipped ")]
    assert [line.split(":")[0] for line in skipped] == ["skipped eagle", "skipped eagle-tree"]
    assert all("reads the features of target" in line for line in skipped)
    out = tmp_path / "bench" / "latest"
    record = json.loads((out / "bench.json").read_text())
    suts = [r["sut"] for r in record["rows"]]  # ours, then transformers' reference rows where it is installed
    assert suts[:2] == ["baseline", "spec"] and not any("eagle" in s for s in suts)
    lossless = [r for r in record["rows"] if "Q8_0" not in r["sut"]]  # llama.cpp's 8-bit rows, where it is built
    assert record["setup"]["samples"] == 2 and all(r["setting"] == "greedy" and r["identical"] for r in lossless)
    csv = pd.read_csv(out / "bench.csv")
    assert list(csv["sut"]) == suts
    assert csv.loc[1, "end-to-end speedup"] == pytest.approx(record["rows"][1]["end-to-end speedup"])


def test_rounds_give_each_speedup_as_a_median_with_its_range_and_paste_into_a_page(tiny_pair, tmp_path):
    """Three rounds taken in turns: every speedup lies in its rounds' range, the baseline's is 1 in each; --into puts
    the greedy table between a page's markers, what surrounds them kept."""
    import json
    from commands.speed import COLUMNS, SPEED_BEGIN, SPEED_END, pasted
    from tests.helpers import python_m
    page = tmp_path / "page.md"
    page.write_text(f"before\n{SPEED_BEGIN}\nold table\n{SPEED_END}\nafter\n")
    proc = python_m("mlperf", "bench", "--target", tiny_pair / "target", "--draft", tiny_pair / "draft",
                    "--samples", "2", "--max-new-tokens", "8", "--setting", "greedy", "--results", tmp_path,
                    "--rounds", "3", "--threads", "1", "--sut", "baseline", "--sut", "spec", "--into", page,
                    timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["sut"]: r for r in json.loads((tmp_path / "bench" / "latest" / "bench.json").read_text())["rows"]}
    assert rows["baseline"]["decode range"] == rows["baseline"]["end-to-end range"] == [1.0, 1.0]
    for kind in ("decode", "end-to-end"):
        low, high = rows["spec"][f"{kind} range"]
        assert low <= rows["spec"][f"{kind} speedup"] <= high
    assert rows["spec"]["tokens"] == 3 * 2 * 8 and rows["spec"]["acceptance length"] >= 1
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith(f"{SPEED_END}\nafter\n") and "old table" not in text
    table = pasted(page).strip().splitlines()
    assert "median of 3 rounds" in table[0] and "1 torch thread as" in table[0]
    assert table[2] == "| " + " | ".join(COLUMNS) + " |" and table[5].startswith("| `spec` | ")
    bad = python_m("mlperf", "bench", "--rounds", "0")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: rounds")
