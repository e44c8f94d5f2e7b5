"""Runs made in child processes (LoadGen runs one test per process): the Server peak search's trials and the
sweep's points, each `python -m mlperf run` on a config file, and the rule that keeps a failed or interrupted
series apart from the good results."""
import json
import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from scenarios.adapter import signal_name
from scenarios.config import RunConfig
from scenarios.run import Interrupted, RunError, Signalled, signum_of


class ChildFailed(RunError):
    """A run made in a child process failed (a failure, not an INVALID result)."""


def run_child(cfg: RunConfig, what: str) -> Path:
    """`cfg` (with its run_dir set) as a run in a fresh process, as LoadGen runs one test per process. The
    caller reports the result (the child's stdout is dropped, its errors pass through); Ctrl-C in the child
    or SIGTERM in the child is raised here as KeyboardInterrupt (Signalled)."""
    out = Path(cfg.run_dir)
    spec = out.parent / f"{out.name}.json"
    spec.write_text(json.dumps(asdict(cfg)))
    proc = subprocess.run([sys.executable, "-m", "mlperf", "run", "--config", str(spec)], stdout=subprocess.PIPE, text=True)
    if proc.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        raise Signalled(proc.returncode - 128)
    if proc.returncode != 0 or not out.is_dir():
        raise ChildFailed(f"{what} failed (exit {proc.returncode}); see {out.parent}")
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
