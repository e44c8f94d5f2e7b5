"""The lab kit as a student meets it: starting a lab, grading the untouched starter code, bad input."""
import time

import pytest

from labs import kit
from labs.__main__ import main
from tests.labs.helpers import grade_cli, outcome


def test_strip_replaces_each_solution_block_with_a_stub():
    source = ("def f(x):\n    \"\"\"Doubles x.\"\"\"\n    # BEGIN SOLUTION double it\n    y = 2 * x\n    return y\n"
              "    # END SOLUTION\n\n\ndef g():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n")
    assert kit.strip(source) == ("def f(x):\n    \"\"\"Doubles x.\"\"\"\n    raise NotImplementedError('TODO: double "
                                 "it')\n\n\ndef g():\n    raise NotImplementedError('TODO')\n")
    answer = "## Q1\n\n<!-- BEGIN SOLUTION -->\nBecause.\n<!-- END SOLUTION -->\n"
    assert kit.strip(answer, markdown=True) == "## Q1\n\n*Your answer here.*\n"
    assert kit.solution_lines(source) == set()  # lines of 12 characters or fewer are too common to be secrets
    secret = "# BEGIN SOLUTION\nanswer = compute_it(x)\n# END SOLUTION\n"
    assert kit.solution_lines(secret) == {"answer = compute_it(x)"}


def test_no_starter_borrows_the_harness_code_that_holds_its_answer():
    for lab in kit.LABS.values():
        assert kit.borrowed(lab, (lab.path / "starter" / lab.files[0]).read_text()) == []
    lab1, lab2, lab3 = kit.LABS[1], kit.LABS[2], kit.LABS[3]
    assert kit.borrowed(lab2, "from suts.speculative import Speculative, accept\n") == ["suts.speculative.accept"]
    assert kit.borrowed(lab2, "from suts.speculative import Speculative, greedy_prefix\n") == []
    assert kit.borrowed(lab1, "from suts.speculative import Speculative\n") == ["suts.speculative",
                                                                               "suts.speculative.Speculative"]
    assert kit.borrowed(lab3, "import roofline.analytic\nx = roofline.analytic.phase_costs(c, 0, 1)\n") == [
        "roofline.analytic", "roofline.analytic.phase_costs"]
    assert kit.borrowed(lab3, "from mlperf import cost\n") == ["mlperf.cost"]


def test_the_students_makefile_keeps_only_targets_their_tree_can_run():
    makefile = kit.student_makefile((kit.ROOT / "Makefile").read_text())
    assert "class-bank" not in makefile and "test_class_bank" not in makefile
    assert "\ngrade:" in makefile and "\nhelp:" in makefile and " grade " in makefile.split(".PHONY:")[1]


@pytest.mark.parametrize("source, error", [
    ("# BEGIN SOLUTION\nx = 1\n", "BEGIN SOLUTION without END SOLUTION"),
    ("x = 1\n# END SOLUTION\n", "line 2: END SOLUTION without BEGIN SOLUTION"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "line 2: BEGIN SOLUTION inside another"),
])
def test_unbalanced_markers_are_errors(source, error):
    with pytest.raises(ValueError, match=error):
        kit.strip(source)


def test_start_copies_the_starter_and_never_overwrites_work(tmp_path, capsys):
    work = tmp_path / "mylabs"
    assert main(["start", "3", "--work", str(work)]) == 0
    for name in kit.LABS[3].files:
        assert (work / name).read_text() == (kit.LABS[3].path / "starter" / name).read_text()
    assert (work / "__init__.py").is_file()
    (work / "lab3_roofline.py").write_text("# my work\n")
    assert main(["start", "3", "--work", str(work)]) == 0
    assert (work / "lab3_roofline.py").read_text() == "# my work\n"
    assert "kept your" in capsys.readouterr().out


@pytest.mark.parametrize("argv, error", [
    (["start", "7"], "no lab '7'; the labs are 1, 2, 3"),
    (["grade", "x"], "no lab 'x'"),
    (["grade", "2", "--work", "/nonexistent"], "no /nonexistent/lab2_rejection.py: run `make lab LAB=2` first"),
])
def test_bad_input_is_a_one_line_error(argv, error, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and error in err


@pytest.mark.parametrize("lab", [1, 2, 3])
def test_the_untouched_starter_scores_near_zero_and_says_what_is_missing(lab, tmp_path):
    kit.start(kit.LABS[lab], tmp_path)
    proc, report = grade_cli(lab, tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["earned"] <= 5 and report["total"] == 100 and not report["full_marks"]
    failed = [o for o in report["outcomes"] if o["status"] != "pass"]
    assert failed and all("not written yet: TODO" in o["message"] or o["status"] == "not run"
                          or o["name"].startswith("written") for o in failed)
    assert f"total {report['earned']}/100" in proc.stdout
    assert "1. missing" in outcome(report, "written")["message"]  # every lab's answers file, untouched


def test_one_check_runs_with_what_it_needs_and_writes_no_grade(tmp_path):
    """`make grade LAB=2 CHECK=...`: the check asked for and its prerequisites, in order; the last whole grade stays."""
    kit.start(kit.LABS[2], tmp_path)
    (tmp_path / "grade.json").write_text("{}")
    proc, report = grade_cli(2, tmp_path, "--check", "exact distribution")
    assert proc.returncode == 1 and report == {}, proc.stderr[-2000:]
    rows = proc.stdout.split("\n\n")[1].splitlines()  # the table: the check and the five it needs, in order
    assert len(rows) == 6 and rows[0].split()[:2] == ["pass", "loads"] and "not run exact distribution" in rows[-1]
    assert "no grade file written" in proc.stdout and "written answers" not in proc.stdout
    ambiguous = grade_cli(2, tmp_path, "--check", "e")[0]
    assert ambiguous.returncode == 2 and "more than one check matches 'e'" in ambiguous.stderr


def test_submit_zips_the_labs_files_for_the_autograder(tmp_path, capsys):
    import zipfile
    from labs.classroom import unpack
    work = tmp_path / "mylabs"
    assert main(["submit", "1", "--work", str(work)]) == 2  # nothing to hand in yet
    assert "run `make lab LAB=1`" in capsys.readouterr().err
    kit.start(kit.LABS[1], work)
    assert main(["submit", "1", "--work", str(work)]) == 0
    out = capsys.readouterr().out
    zipped = work / "lab1-submission.zip"
    assert f"wrote {zipped}" in out and "no " in out  # not graded yet: it says so
    assert sorted(zipfile.ZipFile(zipped).namelist()) == sorted(kit.LABS[1].files)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    assert unpack(kit.LABS[1], zipped, unpacked) == []  # what the autograder reads from it: every file


def test_a_file_that_does_not_import_scores_zero_with_the_reason(tmp_path):
    (tmp_path / "lab2_rejection.py").write_text("def accept_or_resample(:\n")
    proc, report = grade_cli(2, tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (only,) = report["outcomes"]
    assert only["status"] == "FAIL" and report["earned"] == 0 and "SyntaxError" in only["message"]


def test_an_endless_loop_fails_its_check_and_grading_goes_on(tmp_path):
    from labs.grading import Check, Report, grade
    student = tmp_path / "loop.py"
    student.write_text("def spin():\n    while True:\n        pass\n")
    namespace = {}
    exec(compile(student.read_text(), str(student), "exec"), namespace)
    report = grade(Report(0, "t", str(student)), [Check("spins", 10, namespace["spin"], "stop the loop", timeout_s=1),
                                                   Check("after", 5, lambda: "ran", "")], student)
    spins, after = report.outcomes
    assert spins.status == "FAIL" and "still running after 1 s" in spins.message and "loop.py line" in spins.message
    assert after.status == "pass" and report.earned == 5


def test_a_whole_grade_ends_within_its_budget(tmp_path):
    from labs.grading import Check, Report, grade
    student = tmp_path / "loop.py"
    student.write_text("def spin():\n    while True:\n        pass\n")
    namespace = {}
    exec(compile(student.read_text(), str(student), "exec"), namespace)
    report = grade(Report(0, "t", str(student)), [Check("spins", 10, namespace["spin"], "stop the loop"),
                                                   Check("after", 5, lambda: "ran", "")], student, budget_s=1)
    spins, after = report.outcomes
    assert spins.status == "FAIL" and "still running after 1 s" in spins.message and 0.9 < spins.seconds < 30
    assert after.status == "not run" and "the grade's 1 s of CPU time were spent" in after.message
    assert report.earned == 0


def test_a_check_that_waits_forever_is_ended_by_the_clock_and_says_so(tmp_path):
    """A submission that waits without working (a lock, a queue) uses no CPU time: the clock's ceiling ends it,
    and the message says it waited, not that it looped."""
    from labs.grading import WALL_FACTOR, Check, Report, grade
    report = grade(Report(0, "t", str(tmp_path / "x.py")), [Check("waits", 10, lambda: time.sleep(3600), "",
                                                                  timeout_s=0.2)], tmp_path / "x.py")
    (waits,) = report.outcomes
    assert waits.status == "FAIL" and "while using little CPU time" in waits.message, waits.message
    assert "endless loop" not in waits.message and waits.seconds < 30 * WALL_FACTOR * 0.2


def burn(n: int) -> int:
    """A fixed amount of work."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


@pytest.mark.alone
def test_a_busy_machine_does_not_fail_a_check_that_does_its_work_in_time(tmp_path):
    """The check's limit is 2.5 times the CPU time its work takes alone; two other processes share its one core and
    about triple its time on the clock: a limit on the clock would fail it, one on the work does not."""
    import os
    import subprocess
    import sys
    from labs.grading import Check, Report, grade
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs CPU affinity (Linux)")
    core, before = min(os.sched_getaffinity(0)), os.sched_getaffinity(0)
    n, start = 200_000, time.process_time()
    while time.process_time() - start < 0.3:  # as much work as 0.5-1 s of CPU time alone, whatever the machine
        burn(n)
        n *= 2
    alone = []
    for _ in range(3):  # the most of three: a quiet moment of a shared VM does not set the limit
        t = time.process_time()
        burn(n)
        alone.append(time.process_time() - t)
    limit = 2.5 * max(alone)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             preexec_fn=lambda: os.sched_setaffinity(0, {core})) for _ in range(2)]
    try:
        os.sched_setaffinity(0, {core})
        wall = time.monotonic()
        report = grade(Report(0, "t", str(tmp_path / "x.py")),
                       [Check("works", 10, lambda: str(burn(n)), "", timeout_s=limit)], tmp_path / "x.py")
        wall = time.monotonic() - wall
    finally:
        os.sched_setaffinity(0, before)
        for hog in hogs:
            hog.kill()
            hog.wait()
    (works,) = report.outcomes
    assert works.status == "pass", works.message
    if wall <= limit:  # the premise, not the grader: the other processes did not take the core from the check
        pytest.skip(f"the busy processes did not slow the check ({wall:.2f} s on the clock, limit {limit:.2f} s): "
                    "nothing was tested")


@pytest.mark.parametrize("fused_s, path", [(1.0, "fused C step"), (3.0, "modules")])
def test_lab1s_speed_check_runs_the_students_loop_on_the_harness_path(fused_s, path, tiny_pair, monkeypatch,
                                                                       tmp_path):
    """The student's SUT and the harness's spec each get the path the machine's timing chose (stubbed here: the
    modules faster, as on a laptop where torch's kernels beat the C ones, or the fused step): the same one."""
    from suts.fast import choice
    from suts.fast.native import rows_kernel
    from suts.registry import build_sut
    if rows_kernel() is None:
        pytest.skip("no fused step to choose here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MLPERF_ROWS_KERNEL")
    monkeypatch.setattr(choice, "timings", lambda step, model: (fused_s, 2.0))
    monkeypatch.syspath_prepend(str(kit.LABS[1].path / "solution"))
    suts = [build_sut(name, str(tiny_pair / "target"), str(tiny_pair / "draft"))
            for name in ("lab1_speculative:StudentSpeculative", "spec")]
    assert [s.paths() for s in suts] == [{"target": path, "draft": path}] * 2


@pytest.mark.parametrize("lab", [1, 2, 3])
def test_every_path_a_handout_names_is_real(lab):
    """The repository's files it points students to exist; the mylabs/ files it names are the ones `make lab`,
    `make grade` and `make submit` write; its deliverables box names the lab's own files."""
    import re
    folder = kit.LABS[lab]
    text = (folder.path / "README.md").read_text()
    named = set(re.findall(r"`((?:mylabs|mlperf|suts|roofline|scenarios|labs)/[\w./-]+)`", text))
    written = {f"mylabs/{f}" for f in folder.files} | {f"mylabs/lab{lab}-grade.json", f"mylabs/lab{lab}-submission.zip"}
    missing = [p for p in named if not (p in written if p.startswith("mylabs/") else (kit.ROOT / p).exists())]
    assert named and missing == []
    box = text.split("\n\n")[1]
    assert box.startswith("> **Deliverables**") and all(f"mylabs/{f}" in box for f in folder.files)
    assert f"make submit LAB={lab}" in box and "about" in box and "before you start" in box
