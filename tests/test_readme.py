"""The README's commands run as printed: every make target it names exists, every `python -m mlperf` command it
names answers --help, its links lead to files, and its own-SUT example runs under LoadGen on the tiny pair."""
import json
import re

import pytest

from tests.helpers import ROOT, filed, python_m, run_cli

README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_guide_and_every_page_it_links_exists():
    assert len(README.splitlines()) <= 400
    links = re.findall(r"\]\(([^)#]+)\)", README)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert links and not missing, missing
    for page in (ROOT / "docs").glob("*.md"):
        for link in re.findall(r"\]\((?!https?:)([^)#]+)\)", page.read_text()):
            assert (page.parent / link).exists(), f"{page.name}: {link}"


def test_every_make_target_the_readme_names_exists():
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"(?:^|`)make ([a-z][\w-]*)", README, re.M))  # in code, not prose
    assert named and named <= targets, named - targets


def test_every_command_the_readme_names_answers_help(capsys):
    """Through the entry point once, then each command's help from the same parser in this process."""
    from commands.cli import parser
    proc = python_m("mlperf", "--help", timeout=60)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-500:]
    commands = set(re.findall(r"python -m mlperf ([a-z][\w-]*)", README)) | {
        "run", "accuracy", "bench", "sweep", "scale", "qps-sweep", "profile", "report", "smoke", "peaks"}
    for command in sorted(commands):
        with pytest.raises(SystemExit) as done:
            parser().parse_args([command, "--help"])
        assert done.value.code == 0 and "usage:" in capsys.readouterr().out, command


def test_the_readmes_own_sut_runs_batched_under_loadgen(tiny_pair, tmp_path):
    code = re.search(r"```python\n(# mysut\.py.*?)```", README, re.S).group(1)
    (tmp_path / "mysut.py").write_text(code)
    proc = run_cli(tiny_pair, tmp_path / "results", "--sut", "mysut:NoRepeats", "--scenario", "Offline", "--mode",
                   "accuracy", samples=8, tokens=16, cwd=tmp_path)
    assert "Offline: no-repeats decodes up to 8 samples at once" in proc.stdout, proc.stderr[-2000:]
    run = filed(tmp_path / "results", "mysut.NoRepeats", "Offline", "accuracy")
    logged = json.loads(next(run.glob("*/mlperf_log_accuracy.json")).read_text())
    outputs = [bytes.fromhex(e["data"]) for e in logged]
    tokens = [[int.from_bytes(o[i:i + 4], "little") for i in range(0, len(o), 4)] for o in outputs]
    assert len(tokens) == 8 and all(len(t) == 16 for t in tokens)
    assert not any(a == b for t in tokens for a, b in zip(t, t[1:])), tokens
    if proc.returncode:  # its tokens are not the baseline's: the accuracy gate may fail it, in one line
        assert "ACCURACY FAIL" in proc.stdout + proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_each_docs_page_names_itself_in_the_readme_or_the_pages(page):
    assert f"docs/{page}" in README or any(f"]({page})" in p.read_text() for p in (ROOT / "docs").glob("*.md"))


def test_the_guides_own_drafter_is_lossless_under_loadgen(tiny_pair, tmp_path):
    code = re.search(r"```python\n(# mydrafter\.py.*?)```", (ROOT / "docs" / "suts.md").read_text(), re.S).group(1)
    (tmp_path / "mydrafter.py").write_text(code)
    proc = run_cli(tiny_pair, tmp_path / "results", "--sut", "ngram-tree", "--drafter", "mydrafter:Bigrams",
                   "--mode", "accuracy", samples=8, tokens=24, cwd=tmp_path)
    assert proc.returncode == 0 and "ACCURACY PASS" in proc.stdout, proc.stdout[-1000:] + proc.stderr[-2000:]
    record = json.loads(next((tmp_path / "results").glob("*/ngram-tree/*/accuracy/*/metrics.json")).read_text())
    assert record["config"]["drafter"] == "mydrafter:Bigrams"
    accepted = sum(k * c for s in record["samples"] for counts in s["stats"]["cycle_hist"].values()
                   for k, c in enumerate(counts))
    assert accepted > 0  # it drafted, and the target kept some


def test_the_readmes_speed_table_is_benchs_with_the_codes_columns():
    """The SUT speeds are bench's generated table (`bench --into README.md`): its columns the code's, its rows our
    SUTs', each speedup a median with its rounds' range."""
    from commands.bench import SUTS
    from commands.speed import COLUMNS, pasted
    lines = pasted(ROOT / "README.md").strip().splitlines()
    assert lines[0].startswith("`python -m mlperf bench`") and "median of" in lines[0]
    assert lines[2] == "| " + " | ".join(COLUMNS) + " |"
    rows = [line.split(" | ") for line in lines[4:]]
    assert [row[0].strip("|` ") for row in rows] == [name for name in SUTS]
    assert all(re.fullmatch(r"\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)", row[i]) for row in rows for i in (1, 2))
