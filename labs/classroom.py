"""Grading a class: `python -m labs grade-all N SUBMISSIONS [--jobs J] [--out DIR]`.

Each student's folder (or .zip) is graded in isolation: its lab files copied into a temporary folder of its own and
graded there by `python -m labs grade` in a process of its own, with its own LoadGen runs and peaks, so that a crash
or a hang of one never touches another; J students at a time. Each grade is written as the student's JSON file and
in Gradescope's autograder format, and the class as one CSV (a column per check, the automatic total, whether the
written answers are still to be graded by hand, full marks, flags) and a summary. A student already graded is
skipped unless `regrade`.
"""
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from dataclasses import asdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from labs import kit
from labs.grading import GRADE_BUDGET_S, Outcome, Report
from mlperf.rules import positive_int

# on the clock, a grade process is killed after this: the grade's own limits (labs/grading.py) end every check long
# before, so only a grader that is itself stuck reaches it
STUDENT_TIMEOUT_S = 2 * GRADE_BUDGET_S


def students(submissions: Path) -> dict[str, Path]:
    """Student name -> their folder or .zip, one per entry of `submissions`."""
    if not submissions.is_dir():
        raise ValueError(f"no folder {submissions}: give a folder with one folder (or .zip) per student")
    found = {p.stem if p.suffix == ".zip" else p.name: p for p in sorted(submissions.iterdir())
             if p.is_dir() or p.suffix == ".zip"}
    if not found:
        raise ValueError(f"{submissions} holds no student folders or .zip files")
    return found


def unpack(lab: kit.Lab, submission: Path, work: Path) -> list[str]:
    """The lab's files from a student's folder or .zip (found at any depth) into `work`; the ones missing."""
    if submission.suffix == ".zip":
        with zipfile.ZipFile(submission) as z:
            names = {Path(n).name: n for n in z.namelist() if not n.endswith("/")}
            for f in lab.files:
                if f in names:
                    (work / f).write_bytes(z.read(names[f]))
    else:
        for f in lab.files:
            hit = next(iter(sorted(submission.rglob(f))), None)
            if hit is not None:
                shutil.copy(hit, work / f)
    return [f for f in lab.files if not (work / f).is_file()]


def grade_one(lab: kit.Lab, name: str, submission: Path, out: Path, timeout_s: float) -> dict:
    """One student's grade, graded in a process of its own; its JSON file and its output kept in `out`."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"grade-{name}-") as tmp:
        work = Path(tmp)
        missing = unpack(lab, submission, work)
        report = None if lab.files[0] in missing else run_grader(lab, name, work, out, timeout_s)
    if report is None:
        report = failed(lab, name, f"no {lab.files[0]} in the submission", "missing file")
    report.update(student=name, seconds=round(time.monotonic() - started, 1),
                  flags=report.get("flags", []) + report_flags(report, missing))
    (out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{name}.results.json").write_text(json.dumps(gradescope(report), indent=1) + "\n")
    return report


def run_grader(lab: kit.Lab, name: str, work: Path, out: Path, timeout_s: float) -> dict:
    """`python -m labs grade` on the files in `work`, its LoadGen runs and peaks kept there too."""
    grade_file = work / "grade.json"
    cmd = [sys.executable, "-m", "labs", "grade", str(lab.number), "--work", str(work), "--json", str(grade_file),
           "--results", str(work / "results")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=kit.ROOT)
    except subprocess.TimeoutExpired:
        return failed(lab, name, f"the grader was killed after {timeout_s:.0f} s on the clock", "timed out")
    (out / f"{name}.txt").write_text(proc.stdout + proc.stderr)
    if not grade_file.is_file():
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return failed(lab, name, f"the grader stopped with exit {proc.returncode} and no grade: {why}",
                      "grader crashed")
    return json.loads(grade_file.read_text())


def failed(lab: kit.Lab, name: str, why: str, flag: str) -> dict:
    """The grade of a submission no check could run on: every point lost, the reason given and flagged."""
    report = Report(lab.number, lab.title, name, [Outcome("graded", 100, 0, "FAIL", why)])
    return {**asdict(report), "earned": 0, "total": 100, "full_marks": False, "flags": [flag]}


def report_flags(report: dict, missing: list[str]) -> list[str]:
    """What an instructor should look at: borrowed code, written answers missing, files missing."""
    flags = [f"no {f}" for f in missing[1:]]
    for o in report["outcomes"]:
        if o["name"] == "your own code" and o["status"] != "pass":
            flags.append("borrowed code")
        if o["name"].startswith("written answers") and o["status"] != "pass":
            flags.append("written answers missing")
    return flags


def gradescope(report: dict) -> dict:
    """The grade in Gradescope's autograder format (results.json): automatic checks as tests with points; written
    answers as a manual item worth no automatic points, visible to the student."""
    automatic = [o for o in report["outcomes"] if o["points"] or not o["name"].startswith("written")]
    by_hand = [o for o in report["outcomes"] if o not in automatic]
    tests = [{"name": o["name"], "score": o["earned"], "max_score": o["points"], "output": o["message"],
              "visibility": "visible"} for o in automatic]
    tests += [{"name": o["name"], "score": 0, "max_score": 0, "output": f"to be graded by hand: {o['message']}",
               "visibility": "visible"} for o in by_hand]
    return {"score": report["earned"], "max_score": report["total"], "tests": tests,
            "output": "full marks" if report["full_marks"] else "not full marks: see the checks below"}


def grade_all(lab_number, submissions: Path, out: Path, jobs: int = 1, regrade: bool = False,
              timeout_s: float = STUDENT_TIMEOUT_S) -> Path:
    """Grade every student in `submissions` into `out`; returns the class CSV."""
    lab = kit.get(lab_number)
    positive_int("--jobs", jobs)
    everyone = students(submissions)
    out.mkdir(parents=True, exist_ok=True)
    todo = {n: s for n, s in everyone.items() if regrade or not (out / f"{n}.json").is_file()}
    print(f"lab {lab.number}: {len(everyone)} students, {len(everyone) - len(todo)} graded before (kept), "
          f"{len(todo)} to grade, {jobs} at a time", flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        for report in pool.map(lambda item: grade_one(lab, *item, out, timeout_s), todo.items()):
            print(f"  {report['student']:24s} {report['earned']:3d}/{report['total']}"
                  + (" full marks" if report["full_marks"] else "") + (f"  [{', '.join(report['flags'])}]"
                                                                         if report["flags"] else ""), flush=True)
    reports = [json.loads((out / f"{n}.json").read_text()) for n in everyone]
    path = write_csv(reports, out / f"lab{lab.number}-class.csv")
    summary = summarize(reports)
    (out / f"lab{lab.number}-summary.txt").write_text(summary + "\n")
    print(summary)
    return path


def write_csv(reports: list[dict], path: Path) -> Path:
    checks = list(dict.fromkeys(o["name"] for r in reports for o in r["outcomes"]))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", *checks, "automatic total", "automatic max", "written answers", "full marks", "flags"])
        for r in reports:
            earned = {o["name"]: o["earned"] for o in r["outcomes"]}
            written = next((o["status"] for o in r["outcomes"] if o["name"].startswith("written")), None)
            w.writerow([r["student"], *(earned.get(c, "") for c in checks), r["earned"], r["total"],
                        "" if written is None else "to grade by hand" if written == "pass" else "missing",
                        "yes" if r["full_marks"] else "no", "; ".join(r["flags"])])
    return path


def summarize(reports: list[dict]) -> str:
    totals = Counter(min(r["earned"] // 10 * 10, 90) for r in reports)
    failing = Counter(o["name"] for r in reports for o in r["outcomes"] if o["status"] == "FAIL")
    lines = [f"{len(reports)} students, {sum(r['full_marks'] for r in reports)} with full marks; automatic totals:"]
    lines += [f"  {lo:3d}-{lo + 9 if lo < 90 else 100:3d}: {'#' * totals[lo]} {totals[lo]}" for lo in range(0, 100, 10)]
    lines += ["checks failed most:"] + [f"  {n:3d}  {name}" for name, n in failing.most_common(5)]
    flagged = [f"{r['student']} ({', '.join(r['flags'])})" for r in reports if r["flags"]]
    return "\n".join(lines + ([f"flagged: {'; '.join(flagged)}"] if flagged else []))


SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, in /autograder/source where the autograder zip is unpacked: the kit's own install
# (torch's CPU build, then this package and LoadGen from PyPI).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
python3 -m pip install --quiet -e .
"""
RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: the student's files are in $ROOT/submission, and the grade is written
# to $ROOT/results/results.json (AUTOGRADER_ROOT: another root, to try it elsewhere).
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
cd "$ROOT/source"
mkdir -p "$ROOT/results"
python3 -m labs gradescope {lab} "$ROOT/submission" "$ROOT/results/results.json"
"""


def autograder(lab_number, out: Path) -> Path:
    """The zip an instructor uploads to Gradescope for lab N: the student tree (no reference solutions), a setup
    script that installs it, and a run script that grades one submission into results.json."""
    lab = kit.get(lab_number)
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "source"
        kit.release(tree)
        (tree / "setup.sh").write_text(SETUP)
        (tree / "run_autograder").write_text(RUN.format(lab=lab.number))
        files = {f.relative_to(tree).as_posix(): f for f in tree.rglob("*") if f.is_file()}
        return kit.zip_files(out, files, executable=("setup.sh", "run_autograder"))


def gradescope_one(lab_number, submission: Path, results: Path, timeout_s: float = STUDENT_TIMEOUT_S) -> dict:
    """One submission graded as grade_all grades each student, its grade written as Gradescope's results.json."""
    lab = kit.get(lab_number)
    with tempfile.TemporaryDirectory() as out:
        report = grade_one(lab, "submission", submission, Path(out), timeout_s)
        shutil.copy(Path(out) / "submission.results.json", results)
    return report
