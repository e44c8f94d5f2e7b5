"""Grading a lab's files from the command line, as a student does."""
import json
import subprocess
from pathlib import Path

from tests.helpers import ROOT, python_m


def grade_cli(lab: int, work: Path, *args) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`python -m labs grade LAB --work WORK` in a fresh process, its results (LoadGen runs, peaks) kept in WORK:
    the process and its JSON report (if written)."""
    out = work / "grade.json"
    proc = python_m("labs", "grade", lab, "--work", work, "--json", out, "--results", work / "results", *args,
                    cwd=ROOT, timeout=600)
    return proc, json.loads(out.read_text()) if out.is_file() else None


def outcome(report: dict, name: str) -> dict:
    return next(o for o in report["outcomes"] if o["name"].startswith(name))
