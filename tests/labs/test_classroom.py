"""Instructor-only (left out of the student tree: it grades the reference). Grading a class of lab submissions
at once, two at a time, while another process keeps a core busy: each in a process of its own, a crashing one
graded without stopping the others, a hanging one ended by its clock, the CSV and the Gradescope files agreeing with
the grade files."""
import csv
import json
import shutil
import subprocess
import sys
import zipfile

import pytest

from labs import kit
from tests.helpers import ROOT, cli_env, python_m

LAB2, LAB3 = kit.get(2), kit.get(3)


@pytest.mark.alone  # a class graded beside a process that keeps a core busy: its own load
def test_a_class_is_graded_each_in_isolation_and_written_in_every_format(tmp_path):
    """Lab 3's class (its grading the quickest, two files a student)."""
    sub, py, md = tmp_path / "class", *LAB3.files
    for name, files in {"alice": {f: LAB3.path / "solution" / f for f in LAB3.files},
                        "bob/deep/er": {f: LAB3.path / "starter" / f for f in LAB3.files},  # found at any depth
                        "carl": {md: LAB3.path / "starter" / md}}.items():
        (sub / name).mkdir(parents=True)
        for f, source in files.items():
            shutil.copy(source, sub / name / f)
    (sub / "carl" / py).write_text("raise RuntimeError('boom')\n")
    with zipfile.ZipFile(sub / "frank.zip", "w") as z:
        for f in LAB3.files:  # graded as bob's folder is: one reference graded here, not two
            z.write(LAB3.path / "starter" / f, f"lab3/{f}")
    (sub / "emil").mkdir()
    out = tmp_path / "grades"
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy machine
    try:  # the reference's grading takes a few seconds beside the hog on a 2-core Zen 3: 60 s on the clock is ample
        proc = python_m("labs", "grade-all", "3", sub, "--jobs", "2", "--out", out, "--timeout", "60", cwd=ROOT,
                        timeout=600)
    finally:
        hog.kill()
        hog.wait()
    assert proc.returncode == 0, proc.stderr[-2000:]
    grades = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if not p.stem.endswith(".results")}
    assert set(grades) == {"alice", "bob", "carl", "emil", "frank"}
    assert grades["alice"]["full_marks"]  # the reference, busy machine or not
    assert grades["frank"]["earned"] == grades["bob"]["earned"] and grades["frank"]["flags"] == grades["bob"]["flags"]
    assert grades["bob"]["earned"] < 50 and not grades["bob"]["full_marks"]
    assert grades["carl"]["earned"] == 0 and "boom" in grades["carl"]["outcomes"][0]["message"]
    assert grades["emil"]["flags"][0] == "missing file"
    with (out / "lab3-class.csv").open() as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    for name, grade in grades.items():
        assert int(rows[name]["automatic total"]) == grade["earned"]
        assert rows[name]["full marks"] == ("yes" if grade["full_marks"] else "no")
        gradescope = json.loads((out / f"{name}.results.json").read_text())
        assert gradescope["score"] == grade["earned"] and gradescope["max_score"] == 100
        assert sum(t["score"] for t in gradescope["tests"]) == grade["earned"]
    summary = (out / "lab3-summary.txt").read_text()
    assert "5 students, 1 with full marks" in summary and "emil (missing file" in summary
    again = python_m("labs", "grade-all", "3", sub, "--out", out, cwd=ROOT, timeout=120)
    assert again.returncode == 0 and "5 graded before (kept), 0 to grade" in again.stdout


def test_a_submission_that_hangs_is_ended_by_its_clock_and_flagged(tmp_path):
    (tmp_path / "class" / "dora").mkdir(parents=True)
    (tmp_path / "class" / "dora" / LAB2.files[0]).write_text("import time\ntime.sleep(3600)\n")
    out = tmp_path / "grades"
    proc = python_m("labs", "grade-all", "2", tmp_path / "class", "--out", out, "--timeout", "2", cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    grade = json.loads((out / "dora.json").read_text())
    assert grade["flags"] == ["timed out"] and grade["earned"] == 0 and not grade["full_marks"]
    assert "killed after 2 s on the clock" in grade["outcomes"][0]["message"]
    assert "dora (timed out)" in (out / "lab2-summary.txt").read_text()


def test_a_missing_class_folder_is_one_line(tmp_path):
    proc = python_m("labs", "grade-all", "2", tmp_path / "nobody", cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: no folder") and "Traceback" not in proc.stderr


def test_the_gradescope_autograder_grades_a_submission_laid_out_as_gradescope_lays_it_out(tmp_path):
    """The zip an instructor uploads, unpacked into source/ as Gradescope unpacks it, its run script run on a
    submission folder: results.json with the reference's full marks; no reference solution in the zip."""
    import os
    zip_path = tmp_path / "lab3.zip"  # lab 3's: its grading the quickest, and two files to hand in
    proc = python_m("labs", "autograder", "3", zip_path, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zip_path) as z:
        names = z.namelist()
        assert {"setup.sh", "run_autograder"} <= set(names) and not any("/solution/" in n for n in names)
        z.extractall(root / "source")
    (root / "submission").mkdir()
    for name in LAB3.files:
        shutil.copy(LAB3.path / "solution" / name, root / "submission" / name)
    env = {**cli_env(), "AUTOGRADER_ROOT": str(root), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH")  # the run script grades with the kit it unpacked, not this checkout
    run = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == results["max_score"] == 100 and len(results["tests"]) == 6
