"""`python -m labs start N | grade N [--check NAME] | submit N | starters | release DIR`: the lab kit's command
line (see labs/README.md).

Errors are one line on stderr and exit 2; `grade` exits 0 on full marks and 1 otherwise."""
import argparse
import importlib
import sys
from pathlib import Path

import torch

from labs import kit
from labs.answers import answers_of, written_check
from labs.classroom import STUDENT_TIMEOUT_S, autograder, grade_all, gradescope_one
from labs.grading import Check, Outcome, Report, borrowed, grade, load_student, time_limit, where
from labs.lab1 import SPEC_SHARE
from roofline import peaks


def cmd_start(args):
    lab = kit.get(args.lab)
    for line in kit.start(lab, args.work):
        print(line)
    print(f"Lab {lab.number} ({lab.title}): read {lab.path.relative_to(kit.ROOT)}/README.md, edit the files above, "
          f"then run: make grade LAB={lab.number}")


def cmd_grade(args) -> int:
    lab = kit.get(args.lab)
    student, answers = args.work / lab.files[0], args.work / lab.answers
    if not student.is_file():
        raise ValueError(f"no {student}: run `make lab LAB={lab.number}` first")
    module_name = f"student_{lab.module}"
    report = Report(lab.number, lab.title, str(student))
    torch.set_num_threads(1)  # a check's CPU time is then its work, which a busy machine hardly changes
    try:
        with time_limit(Check.timeout_s, 2 * Check.timeout_s):  # code at the top of the file runs on import
            load_student(student, module_name)
    except Exception as e:  # a syntax error or a failing import: no check can run
        report.outcomes.append(Outcome("your file imports", 100, 0, "FAIL",
                                       f"importing it raised {type(e).__name__}: {e}{where(e, student)}"))
    else:
        grader = importlib.import_module(f"labs.lab{lab.number}")
        copied = borrowed(student, grader.BANNED)
        if copied:
            report.outcomes.append(Outcome("your own code", 100, 0, "FAIL", f"{copied}, the harness's own answer to "
                                           f"this lab: no credit. Write the parts yourself (see the handout)"))
        else:
            checks = grader.checks(module_name, **grader_options(args)) + [
                written_check(answers, lab.path / "starter" / lab.answers, lab.path / "README.md")]
            grade(report, chosen(checks, args.check), student)
        report.answers = answers_of(answers)
    print(report.table())
    if args.check:  # one check is not a grade: the grade file keeps the last whole grading
        print(f"  one check ({args.check}) and what it needs: no grade file written; `make grade LAB={lab.number}` "
              "grades them all")
        return 0 if report.full_marks else 1
    out = args.json or args.work / f"lab{lab.number}-grade.json"
    report.write(out)
    print(f"  written to {out}")
    return 0 if report.full_marks else 1


def chosen(checks: list[Check], name: str | None) -> list[Check]:
    """The check named `name` (any part of its name, any case) and those it needs, in order; every check if None."""
    if name is None:
        return checks
    hits = [c for c in checks if name.lower() in c.name.lower()]
    if len(hits) != 1:
        raise ValueError(f"{'no' if not hits else 'more than one'} check matches {name!r}; the checks: "
                         + ", ".join(repr(c.name) for c in checks))
    wanted = {hits[0].name}
    for check in reversed(checks):  # a check's prerequisites come before it
        if check.name in wanted:
            wanted |= set(check.needs)
    return [c for c in checks if c.name in wanted]


def cmd_submit(args) -> int:
    """The zip a student hands in (Gradescope's upload): the lab's files from the working folder, nothing else."""
    lab = kit.get(args.lab)
    missing = [f for f in lab.files if not (args.work / f).is_file()]
    if missing:
        raise ValueError(f"no {', '.join(str(args.work / f) for f in missing)}: run `make lab LAB={lab.number}` and "
                         "fill it in first")
    out = args.out or args.work / f"lab{lab.number}-submission.zip"
    kit.zip_files(out, {f: args.work / f for f in lab.files})
    print(f"wrote {out} ({', '.join(lab.files)}): upload it to Gradescope, which grades it as `make grade "
          f"LAB={lab.number}` does")
    grade_file = args.work / f"lab{lab.number}-grade.json"
    if not grade_file.is_file():
        print(f"note: no {grade_file}: run `make grade LAB={lab.number}` to see your points before you hand in")
    return 0


def cmd_grade_all(args) -> int:
    out = args.out or args.submissions.with_name(args.submissions.name + "-grades")
    print(f"class CSV: {grade_all(args.lab, args.submissions, out, args.jobs, args.regrade, args.timeout)}")
    return 0


def grader_options(args) -> dict:
    """Lab 3 reads this machine's peaks, cached under --results; lab 1 takes
    the speed gate (a share of spec's speed) and keeps its LoadGen runs under --results."""
    lab = kit.get(args.lab)
    if lab.number == 3:
        return {"peaks_cache": peaks.cache_in(args.results)}
    if lab.number == 1:
        return {"results": str(args.results / "labs"), **({} if args.gate is None else {"gate": args.gate})}
    return {}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m labs", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="copy a lab's starter files into your working folder (never overwrites)")
    s.add_argument("lab")
    s.add_argument("--work", type=Path, default=kit.WORK, help="your working folder (default mylabs/)")
    s.set_defaults(fn=cmd_start)
    g = sub.add_parser("grade", help="grade your copy of a lab: a table of checks, a JSON file, exit 0 on full marks")
    g.add_argument("lab")
    g.add_argument("--work", type=Path, default=kit.WORK, help="the folder holding your lab files (default mylabs/)")
    g.add_argument("--json", type=Path, help="where to write the grade (default WORK/labN-grade.json)")
    g.add_argument("--gate", type=float, help=f"lab 1: the speed gate, a share of the harness's spec's tokens/s "
                                              f"measured in the same grading (default {SPEC_SHARE})")
    g.add_argument("--results", type=Path, default=Path("results"),
                   help="where lab 1 keeps its LoadGen runs and lab 3 reads the peaks (default results/)")
    g.add_argument("--check", help="run only the check whose name contains this, and the checks it needs (no grade "
                                   "file)")
    g.set_defaults(fn=cmd_grade)
    sb = sub.add_parser("submit", help="the zip to hand in: your lab's files from your working folder")
    sb.add_argument("lab")
    sb.add_argument("--work", type=Path, default=kit.WORK, help="the folder holding your lab files (default mylabs/)")
    sb.add_argument("--out", type=Path, help="the zip to write (default WORK/labN-submission.zip)")
    sb.set_defaults(fn=cmd_submit)
    ga = sub.add_parser("grade-all", help="instructors: grade a class, one folder or .zip per student, each in a "
                                          "process of its own: a grade file each, a class CSV, a summary")
    ga.add_argument("lab")
    ga.add_argument("submissions", type=Path, help="a folder with one folder (or .zip) per student")
    ga.add_argument("--jobs", type=int, default=1, help="students graded at a time (default 1)")
    ga.add_argument("--out", type=Path, help="where the grades go (default SUBMISSIONS-grades/)")
    ga.add_argument("--regrade", action="store_true", help="grade again the students already graded")
    ga.add_argument("--timeout", type=float, default=STUDENT_TIMEOUT_S,
                    help=f"seconds on the clock before a student's grader is killed (default {STUDENT_TIMEOUT_S})")
    ga.set_defaults(fn=cmd_grade_all)
    az = sub.add_parser("autograder", help="instructors: the zip to upload to Gradescope for a lab (setup and run "
                                           "scripts, the kit without its solutions)")
    az.add_argument("lab")
    az.add_argument("out", type=Path, help="the .zip to write")
    az.set_defaults(fn=lambda args: print(f"wrote {autograder(args.lab, args.out)}: upload it as the autograder"))
    gs = sub.add_parser("gradescope", help="grade one submission folder into Gradescope's results.json (what the "
                                           "autograder's run script calls)")
    gs.add_argument("lab")
    gs.add_argument("submission", type=Path)
    gs.add_argument("results", type=Path)
    gs.set_defaults(fn=lambda args: print(f"{gradescope_one(args.lab, args.submission, args.results)['earned']} "
                                          f"points; wrote {args.results}"))
    st = sub.add_parser("starters", help="instructors: regenerate every starter/ from solution/")
    st.set_defaults(fn=lambda args: print("\n".join(f"wrote {f.relative_to(kit.ROOT)}" for f in kit.make_starters())))
    r = sub.add_parser("release", help="instructors: write the student tree (no solutions) to a new directory")
    r.add_argument("out", type=Path)
    r.set_defaults(fn=lambda args: print(f"wrote {kit.release(args.out)} files to {args.out} (no reference solutions)"))
    args = p.parse_args(argv)
    try:
        return args.fn(args) or 0
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
