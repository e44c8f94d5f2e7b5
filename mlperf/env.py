"""What machine and software a figure was measured on, recorded beside every result."""
import os
import platform
import sys

import torch


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine() -> str:
    desc = f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    if torch.cuda.is_available():
        desc += f"; GPU {torch.cuda.get_device_name()}"
    return desc


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    for pkg in ("mlcommons-loadgen", "numpy", "pandas"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out
