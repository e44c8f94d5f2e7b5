"""A submission tree from quick runs of the tiny pair, judged by MLCommons' own checker (where its checkout is)."""
import hashlib
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from scenarios import mlcommons
from scenarios.records import RunRecord
from tests.helpers import ROOT, filed, python_m, refused, run_cli

pytestmark = pytest.mark.skipif(mlcommons.checkout() is None, reason=mlcommons.missing())
SUTS, SCENARIOS, MODES = ("baseline", "spec"), ("SingleStream", "Offline"), ("performance", "accuracy", "compliance")


def cli(*args, cwd):
    return python_m("mlperf", *args, cwd=cwd)


def digest(tree) -> dict:
    """Every file under `tree` (links as their targets' names) -> its bytes' hash."""
    return {str(p.relative_to(tree)): str(p.readlink()) if p.is_symlink() else hashlib.sha256(p.read_bytes()).digest()
            for p in sorted(tree.rglob("*")) if p.is_file() or p.is_symlink()}


@pytest.fixture(scope="module")
def results(tiny_pair, tmp_path_factory):
    """Quick runs (LoadGen's durations shortened) of 2 SUTs x 2 scenarios x performance, accuracy, compliance."""
    work = tmp_path_factory.mktemp("submission")
    runs = [(sut, scenario, mode) for sut in SUTS for scenario in SCENARIOS for mode in MODES]
    with ThreadPoolExecutor(2) as pool:  # two runs at a time, one a core
        done = pool.map(lambda run: run_cli(tiny_pair, work / "results", "--sut", run[0], "--scenario", run[1],
                                            "--mode", run[2], cwd=work), runs)
        for proc in done:
            assert proc.returncode == 0, proc.stderr[-2000:]
    return work / "results"


def pair(tiny_pair) -> list:
    """The flags that name the tiny pair, whose runs the submission takes."""
    return ["--target", str(tiny_pair / "target"), "--draft", str(tiny_pair / "draft")]


def errors(output: str) -> set[str]:
    """The checker's ERROR lines, without their time stamps."""
    return {re.sub(r"^\[[^]]*ERROR\] ", "", line) for line in output.splitlines() if " ERROR] " in line}


def test_the_official_checker_finds_only_the_quick_runs_short(results, tiny_pair, tmp_path):
    before = digest(results)
    built = cli("submission", "--org", "Course", "--out", tmp_path / "tree", "--results", results, *pair(tiny_pair),
                cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert digest(results) == before  # copied, never moved or changed
    tree = tmp_path / "tree"
    system = json.loads(next((tree / "closed" / "Course" / "systems").glob("*-spec.json")).read_text())
    assert len(system) == 35 and system["accelerators_per_node"] == "0" and system["system_type"] == "edge"
    for verdict in tree.rglob("TEST06/verify_accuracy.txt"):  # MLCommons' TEST06 script passed every run
        assert verdict.read_text().endswith("TEST06 verification complete\n")
    assert len(list(tree.rglob("TEST06/verify_accuracy.txt"))) == 4
    assert all(re.search(r"^hash=\w+$", t.read_text(), re.M) for t in tree.rglob("accuracy/accuracy.txt"))
    found = {path: json.loads(path.read_text()).get("speculative_decoding") for path in
             tree.rglob("measurements.json")}  # a speculative SUT's disclosure and MLPerf v6.0's checks go in
    assert sorted("-spec" in str(path) for path in found) == [False, False, True, True]
    for path, carried in found.items():
        if "-spec" not in str(path):
            assert carried is None, path
            continue
        assert carried["disclosure"]["checkpoint"] and carried["disclosure"]["mean_acceptance_length"] > 1
        assert carried["compliance"]["greedy_identity"] == "checked" and carried["compliance"]["failures"] == []

    checked = cli("check-submission", tree, cwd=tmp_path)
    assert checked.returncode == 1
    assert "Execution occurred in running check" not in checked.stderr  # no check raised
    perf = sorted(str(p) for p in tree.rglob("performance/run_1/mlperf_log_detail.txt"))
    assert len(perf) == 4
    assert errors(checked.stderr) == {
        *(f"{p} Test duration less than 600s in user config. expected=600000, found=500" for p in perf),
        *(f"Some performance checks Checks failed for: {p}" for p in perf),
        *(f"NoResults {p}" for p in perf), "SUMMARY: submission has errors"}


def test_a_missing_or_invalid_run_is_refused_in_one_line_each(results, tiny_pair, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(results, copy, symlinks=True)
    filed(copy, "spec", "Offline", "accuracy", "latest").unlink()
    detail = filed(copy, "baseline", "SingleStream", "performance", "latest", "mlperf_log_detail.txt")
    detail.write_text(detail.read_text().replace('"value": "VALID"', '"value": "INVALID"'))
    proc = cli("submission", "--org", "Course", "--out", tmp_path / "tree", "--results", copy, *pair(tiny_pair),
               cwd=tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "tree").exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3 and "Traceback" not in proc.stderr
    assert "baseline SingleStream performance:" in lines[1] and "is INVALID" in lines[1]
    assert "spec Offline accuracy: none in" in lines[2] and "--mode accuracy" in lines[2]


def test_bad_requests_are_one_line(results, tiny_pair, tmp_path, monkeypatch, capsys):
    """In this process (commands.cli.main); the last through `python -m mlperf`."""
    (tmp_path / "taken").mkdir()
    monkeypatch.chdir(tmp_path)
    for args, message in [(("--org", "Course", "--out", tmp_path / "taken"), "exists already"),
                          (("--org", "a b", "--out", tmp_path / "t"), "--org must be a plain name"),
                          (("--org", "Course", "--out", tmp_path / "t", "--scenario", "Server"), "not Server"),
                          (("--org", "Course", "--out", tmp_path / "t", "--mlc", tmp_path), "is not a checkout")]:
        code, err = refused(["submission", *map(str, args), "--results", str(results), *pair(tiny_pair)], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    proc = cli("check-submission", tmp_path, cwd=ROOT)
    assert proc.returncode == 2 and "is not a submission tree" in proc.stderr


def test_a_server_under_test_is_described_by_its_engine(results):
    from commands.submission import framework, system_json
    record = RunRecord.load(next(results.glob("*/spec/Offline/performance/*/metrics.json")).parent)
    assert framework(record).startswith("PyTorch ")
    record.endpoint = {"engine": "llama.cpp", "url": "http://127.0.0.1:8080", "model": "m",
                       "props": {"build_info": "b1-abc"}}
    system = system_json(record, "llama-server-spec", "Course", "closed", "edge")
    assert system["framework"] == "llama.cpp b1-abc"
    assert system["sw_notes"].endswith("; served over HTTP by llama.cpp at http://127.0.0.1:8080, model m")
