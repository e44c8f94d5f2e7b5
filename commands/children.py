"""Runs made in child processes (LoadGen runs one test per process): the Server peak search's trials, the
sweep's and the scaling's points, each `python -m mlperf run --config` in a process forked from one that imported
the harness once; and the rule that keeps a failed or interrupted series apart from the good results."""
import json
import multiprocessing
import os
import runpy
import signal
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict
from functools import cache
from pathlib import Path

from commands.exits import VERDICT_FAILED
from scenarios.adapter import signal_name
from scenarios.config import RunConfig
from scenarios.run import Interrupted, RunError, Signalled, signum_of


class ChildFailed(RunError):
    """A run made in a child process failed (a failure, not an INVALID result)."""


@cache
def processes() -> multiprocessing.context.BaseContext:
    """Where children come from: forked from one server process that imported the harness once (the ~2 s of
    imports paid once a series, not once a run; it never runs a test itself), or spawned where there is no fork."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(["commands.cli"])
    return forks


def run_config(spec: str) -> None:
    """A child's whole life: `python -m mlperf run --config spec`, run as that command line runs it (the entry
    point by name), its stdout dropped."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.argv = ["mlperf", "run", "--config", spec]
    runpy.run_module("mlperf", run_name="__main__")


def run_child(cfg: RunConfig, what: str) -> Path:
    """`cfg` (with its run_dir set) as a run in a fresh process, as LoadGen runs one test per process. The
    caller reports the result (the child's stdout is dropped, its errors pass through); Ctrl-C in the child
    or SIGTERM in the child is raised here as KeyboardInterrupt (Signalled)."""
    out = Path(cfg.run_dir)
    spec = out.parent / f"{out.name}.json"
    spec.write_text(json.dumps(asdict(cfg)))
    child = processes().Process(target=run_config, args=(str(spec),), name=what)
    child.start()
    try:
        child.join()
    finally:  # Ctrl-C or SIGTERM here: a moment for the child to end its own run (it saw Ctrl-C too), then it ends
        child.join(0.25)
        child.kill()
        child.join()
    code = child.exitcode if child.exitcode >= 0 else 128 - child.exitcode  # killed by a signal: as a shell says
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        raise Signalled(code - 128)
    if code not in (0, VERDICT_FAILED) or not out.is_dir():  # an INVALID run is a result, published as any
        raise ChildFailed(f"{what} failed (exit {code}); see {out.parent}")
    return out


@contextmanager
def kept_apart(work: Path, final: Path, what: Callable[[], str]):
    """Around runs made in children into `work`: a failed child or Ctrl-C keeps `work` apart as
    `final`.failed or `final`.interrupted (never in place of a good result) and says so with `what()`."""
    try:
        yield
    except ChildFailed as e:
        work.rename(final.with_name(final.name + ".failed"))
        raise ChildFailed(f"{e}; {what()} kept in {final}.failed") from None
    except KeyboardInterrupt as e:
        work.rename(final.with_name(final.name + ".interrupted"))
        raise Interrupted(f"interrupted ({signal_name(signum_of(e))}); {what()} kept in {final}.interrupted",
                          signum_of(e)) from None
