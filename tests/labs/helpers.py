"""Grading a lab's files from the command line, as a student does."""
import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, cli_env


def grade_cli(lab: int, work: Path, *args) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`python -m labs grade LAB --work WORK` in a fresh process, its results (LoadGen runs, peaks) kept in WORK:
    the process and its JSON report (if written)."""
    out = work / "grade.json"
    proc = subprocess.run([sys.executable, "-m", "labs", "grade", str(lab), "--work", str(work), "--json", str(out),
                           "--results", str(work / "results"), *args], cwd=ROOT, env=cli_env(), capture_output=True,
                          text=True, timeout=600)
    return proc, json.loads(out.read_text()) if out.is_file() else None


def outcome(report: dict, name: str) -> dict:
    return next(o for o in report["outcomes"] if o["name"].startswith(name))
