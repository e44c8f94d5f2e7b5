"""Instructor-only, slow (`make class-bank`; `make test` skips it): each lab's whole bank (the reference, the
starter, every known-wrong variant of tests/labs/test_solutions.py, the correct-but-different control) graded as a
class twice: alone, one student at a time on an idle machine, then two at a time while another process keeps a
core busy. Every student gets the same grade, check by check, both times; references and controls lose nothing
(lab 1's control that drafts without a cache aside: its speed check), and no wrong one gets full marks."""
import json
import os
import subprocess
import sys
import time

import pytest

from labs import kit
from tests.helpers import ROOT, python_m
from tests.labs.test_solutions import (CONTROLS, LAB1_VARIANTS, LAB2_VARIANTS, LAB3_VARIANTS, SLOW_CONTROLS,
                                       WRONG_AT_MOST, reference_table, solution)

pytestmark = pytest.mark.skipif(os.environ.get("MLPERF_CLASS_BANK") != "1",
                                reason="slow (4 minutes on 2 cores): `make class-bank` runs it")
VARIANTS = {1: LAB1_VARIANTS, 2: LAB2_VARIANTS, 3: LAB3_VARIANTS}


def patched(source: str, patches: list[tuple[str, str]]) -> str:
    for old, new in patches:
        assert old in source, f"the reference no longer contains {old!r}: update the bank"
        source = source.replace(old, new)
    return source


def bank(lab: int) -> dict[str, dict[str, str]]:
    """Each student of the bank and the files they hand in: the lab's code (the reference's, patched) and the
    reference's other files (its written answers); the starter's own."""
    files = kit.get(lab).files
    reference = solution(lab).read_text()
    others = {name: solution(lab, name).read_text() for name in files[1:]}
    students = {"reference": {files[0]: reference, **others},
                "starter": {name: (kit.get(lab).path / "starter" / name).read_text() for name in files}}
    for name, (patches, _) in VARIANTS[lab].items():
        table = reference_table() if name == "answers-from-a-table" else ""
        students[f"wrong-{name}"] = {files[0]: patched(reference, patches) + table, **others}
    for (number, name), patches in CONTROLS.items():
        if number == lab:
            students[f"control-{name}"] = {files[0]: patched(reference, patches), **others}
    return students


def grade_all(lab: int, folder, out, jobs: int, busy: bool) -> dict[str, dict]:
    """`python -m labs grade-all` over the folder; each student's grade file."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    start = time.perf_counter()
    try:
        proc = python_m("labs", "grade-all", lab, folder, "--jobs", jobs, "--out", out, cwd=ROOT, timeout=3600)
    finally:
        if hog:
            hog.kill()
            hog.wait()
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(f"lab {lab}, {jobs} at a time{', a core kept busy' if busy else ''}: {time.perf_counter() - start:.0f} s")
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if not p.stem.endswith(".results")}


@pytest.mark.parametrize("lab", [1, 2, 3])
def test_the_bank_graded_as_a_busy_class_gets_the_grades_it_gets_alone(lab, tmp_path):
    students = bank(lab)
    for name, files in students.items():
        (tmp_path / "class" / name).mkdir(parents=True)
        for file, text in files.items():
            (tmp_path / "class" / name / file).write_text(text)
    alone = grade_all(lab, tmp_path / "class", tmp_path / "alone", 1, busy=False)
    loaded = grade_all(lab, tmp_path / "class", tmp_path / "loaded", 2, busy=True)
    assert set(alone) == set(loaded) == set(students)
    for name in students:
        a, b = ({o["name"]: (o["status"], o["earned"]) for o in g[name]["outcomes"]} for g in (alone, loaded))
        assert a == b, (name, a, b)
        assert alone[name]["earned"] == loaded[name]["earned"] and alone[name]["flags"] == loaded[name]["flags"], name
        assert not {"timed out", "grader crashed"} & set(loaded[name]["flags"]), name
    for name in students:
        if name == "reference" or name.startswith("control-"):
            lost = {o["name"] for o in loaded[name]["outcomes"] if o["status"] != "pass"}
            slow = {n for n in lost if name.removeprefix("control-") in SLOW_CONTROLS and n.startswith("LoadGen")}
            assert lost == slow, (name, lost)
    assert loaded["reference"]["full_marks"]
    for name in students:
        if name.startswith("wrong-") or name == "starter":
            assert not loaded[name]["full_marks"] and loaded[name]["earned"] <= WRONG_AT_MOST, name
    print(f"lab {lab}: " + ", ".join(f"{n} {g['earned']}" for n, g in sorted(loaded.items())))
