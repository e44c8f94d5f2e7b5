"""The graders' shared machinery: checks worth points, run in order, reported as a table and a JSON file.

A check is a function that returns a one-line account of what it saw, or raises `Fail` with a message for the
student: what was expected, what happened, and a hint where the bug usually is. Any other exception from the
student's code fails the check too, with the exception in the message and the check's own hint.
"""
import ast
import importlib.util
import json
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable


class Fail(Exception):
    """A failed check: the message says what was expected, what happened and where to look."""


@dataclass
class Check:
    name: str
    points: int
    run: Callable[[], str]
    hint: str  # shown when the student's code raises, where the check has no more specific message
    needs: tuple[str, ...] = ()  # checks that must pass first (e.g. speed is only credited for correct output)
    timeout_s: float = 60  # seconds of work: an endless loop in the student's code fails the check instead of hanging
    threads: int = 1  # the threads the check's work runs on: its CPU-time limit is timeout_s on each


GRADE_BUDGET_S = 300  # CPU seconds a whole grade may use, hanging submissions included; a reference uses under 30


@dataclass
class Outcome:
    name: str
    points: int
    earned: int
    status: str  # "pass", "FAIL" or "not run"
    message: str
    seconds: float = 0.0


@dataclass
class Report:
    lab: int
    title: str
    file: str
    outcomes: list[Outcome] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)  # written answers, for the instructor to read

    @property
    def earned(self) -> int:
        return sum(o.earned for o in self.outcomes)

    @property
    def total(self) -> int:
        return sum(o.points for o in self.outcomes)

    @property
    def full_marks(self) -> bool:
        """Every check passed, those worth no points included (lab 3's written answers)."""
        return all(o.status == "pass" for o in self.outcomes)

    def table(self) -> str:
        width = max(len(o.name) for o in self.outcomes)
        lines = [f"Lab {self.lab}: {self.title} ({self.file})", ""]
        for o in self.outcomes:
            lines.append(f"  {o.status:7s} {o.name:{width}s} {o.earned:3d}/{o.points:<3d} {o.message}")
        failed = [o.name for o in self.outcomes if o.status != "pass" and not o.points]
        by_hand = [o.name for o in self.outcomes if o.status == "pass" and not o.points]
        verdict = (" (full marks)" if self.full_marks else
                   f" automatic points; NOT FULL MARKS: {', '.join(failed)} must pass too" if failed else "")
        verdict += f"; {', '.join(by_hand)}: there, to be graded by hand" if by_hand else ""
        seconds = sum(o.seconds for o in self.outcomes)
        lines += ["", f"  total {self.earned}/{self.total}{verdict}; graded in {seconds:.0f} s"]
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        payload = {**asdict(self), "earned": self.earned, "total": self.total, "full_marks": self.full_marks}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1) + "\n")


def load_student(path: Path, module_name: str):
    """Import the student's file as module `module_name` (registered, so `module_name:Class` names its SUT)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def borrowed(path: Path, banned: tuple[str, ...]) -> str | None:
    """Where the student's file imports, or names in a string (importlib), a module of the harness that answers
    the lab: a submission built on it earns nothing. None if it does not."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value.split(":")[0]]
        else:
            continue
        for name in names:
            if any(name == b or name.startswith(b + ".") for b in banned):
                return f"line {node.lineno} uses {name}"
    return None


def where(e: BaseException, path: Path, code: bool = True) -> str:
    """The line of the student's file `path` an exception came from, if it came from there."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    if not frames:
        return ""
    return f" ({path.name} line {frames[-1].lineno}" + (f": {frames[-1].line})" if code else ")")


class TimedOut(Exception):
    signum = signal.SIGALRM  # how a LoadGen run cut short by it names what ended it
    cpu = False  # True: its CPU time ran out (not the clock)


# a check's wall-clock ceiling, in multiples of its CPU-time limit: only a wait that never ends (a lock, a queue, a
# sleep) reaches it, however busy the machine
WALL_FACTOR = 10


@contextmanager
def time_limit(cpu_s: float, wall_s: float | None = None):
    """Raise TimedOut in the main thread once this process has used `cpu_s` seconds of CPU time (all its threads),
    or `wall_s` (default WALL_FACTOR x cpu_s) have passed on the clock. CPU time measures the work a submission
    does, which another busy process on the machine hardly changes, where elapsed time may double; the clock's
    ceiling catches a submission that waits forever without working. Where the platform has no such timers, no
    limit. Python runs the handler between bytecodes, so a call into C (LoadGen's StartTest) is cut only when it
    returns."""
    if not hasattr(signal, "SIGPROF") or not hasattr(signal, "SIGALRM"):
        yield
        return
    wall_s = WALL_FACTOR * cpu_s if wall_s is None else wall_s

    def worked(*_):
        e = TimedOut(f"still running after {cpu_s:.0f} s of CPU time, far more work than the lab needs: an "
                     "endless loop?")
        e.cpu = True
        raise e

    def waited(*_):
        raise TimedOut(f"no result after {wall_s:.0f} s on the clock while using little CPU time: waiting for "
                       "something that never comes?")
    previous = signal.signal(signal.SIGPROF, worked), signal.signal(signal.SIGALRM, waited)
    signal.setitimer(signal.ITIMER_PROF, max(cpu_s, 0.01))
    signal.setitimer(signal.ITIMER_REAL, max(wall_s, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, previous[0])
        signal.signal(signal.SIGALRM, previous[1])


def max_earned(checks: list[Check], failed: set[str]) -> int:
    """The most a submission can earn when the checks in `failed` fail: those, and every check that needs one of
    them, earn nothing. What the bank of wrong submissions is held to."""
    lost = set(failed)
    for check in checks:  # in order: a check's prerequisites come before it
        if lost & set(check.needs):
            lost.add(check.name)
    return sum(c.points for c in checks if c.name not in lost)


def grade(report: Report, checks: list[Check], student_file: Path, budget_s: float = GRADE_BUDGET_S) -> Report:
    """Run every check in order, each within its own limit and all within `budget_s` of CPU time (WALL_FACTOR
    times that on the clock); a check whose prerequisites failed, or that the budget has no time left for, is not
    run and earns nothing."""
    passed, cpu_end = set(), time.process_time() + budget_s
    wall_end = time.monotonic() + WALL_FACTOR * budget_s
    for check in checks:
        missing = [n for n in check.needs if n not in passed]
        start, cpu_start = time.monotonic(), time.process_time()
        if missing:
            outcome = Outcome(check.name, check.points, 0, "not run", f"needs {', '.join(missing)} to pass first")
        elif cpu_start >= cpu_end or start >= wall_end:
            outcome = Outcome(check.name, check.points, 0, "not run", f"the grade's {budget_s:.0f} s of CPU time "
                                                                      "were spent by the checks above")
        else:
            cpu_left = cpu_end - cpu_start
            try:
                with time_limit(min(check.timeout_s * check.threads, cpu_left),
                                min(WALL_FACTOR * check.timeout_s, wall_end - start)):
                    outcome = Outcome(check.name, check.points, check.points, "pass", check.run())
                passed.add(check.name)
            except Fail as e:
                outcome = Outcome(check.name, check.points, 0, "FAIL", str(e))
            except NotImplementedError as e:
                outcome = Outcome(check.name, check.points, 0, "FAIL",
                                  f"not written yet: {e}{where(e, student_file, code=False)}")
            except TimedOut as e:
                outcome = Outcome(check.name, check.points, 0, "FAIL",
                                  f"{e}{where(e, student_file)} Hint: {check.hint}")
                if e.cpu and cpu_left <= check.timeout_s * check.threads:  # the grade's budget ran out, not the
                    cpu_end = 0.0  # check's own limit: the CPU timer may fire a tick before process_time gets there
            except Exception as e:  # the student's code crashed: say where, and where to look
                outcome = Outcome(check.name, check.points, 0, "FAIL", f"your code raised {type(e).__name__}: {e}"
                                                                       f"{where(e, student_file)}. Hint: {check.hint}")
        outcome.seconds = round(time.monotonic() - start, 2)
        report.outcomes.append(outcome)
    return report
