"""What machine and software a figure was measured on, recorded beside every result."""
import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from mlperf import devices


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine() -> str:
    desc = f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    gpu = devices.present()
    return desc + (f"; {devices.describe(gpu)}" if gpu else "")


def sockets() -> int:
    """Physical processors (sockets) in this host, 1 where /proc/cpuinfo does not say."""
    try:
        with open("/proc/cpuinfo") as f:
            return len({line.split(":", 1)[1] for line in f if line.startswith("physical id")}) or 1
    except OSError:
        return 1


def system() -> dict[str, str]:
    """The host as a submission's system description wants it (commands/submission.py): processor, sockets, cores,
    memory, operating system and accelerators."""
    gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    gpu = devices.present()
    return {"processor": cpu_name(), "sockets": str(sockets()), "cores": str(os.cpu_count()),
            "memory": f"{gib:.0f} GB", "os": platform.platform(),
            "accelerators": str(torch.cuda.device_count() if gpu == "cuda" else 1) if gpu else "0",
            "accelerator": devices.describe(gpu).removeprefix("GPU ") if gpu else "N/A",
            "accelerator_memory": f"{devices.memory(gpu) / 2 ** 30:.0f} GB" if gpu else "N/A"}


@functools.cache
def commit() -> str:
    """This harness's git commit (with "+changes" where the work tree differs from it), or "unknown": as it was at
    this process's first call (a run makes it as it starts), not when the run, perhaps an hour later, ends."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode:
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": sys.version.split()[0], "torch": torch.__version__, "harness": commit()}
    for pkg in ("mlcommons-loadgen", "numpy", "pandas"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def default_threads() -> int:
    """Torch's threads unless a run says otherwise: half the cores (at least one), the rest left to LoadGen, whose
    threads would otherwise oversubscribe them (docs/measurements.md: what that costs)."""
    return max(1, (os.cpu_count() or 1) // 2)


def set_threads(threads: int | None) -> None:
    """Torch's threads: `threads`, else default_threads()."""
    torch.set_num_threads(threads or default_threads())
