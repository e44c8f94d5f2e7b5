"""Optional packages, installed into this Python on first use, so that a plain run never pays for them: Ray for
`--replicas`, aiohttp for `serve` and `--endpoint`, prometheus_client for the server's /metrics and reading a
server's. The pins are setup.py's extras too (a test holds the two equal)."""
import importlib
import subprocess
import sys

PINS = {"ray": "ray==2.60.0", "aiohttp": "aiohttp==3.14.5", "prometheus_client": "prometheus-client==0.26.0"}


def extra(module: str, what: str, size: str = ""):
    """`module` (or a submodule of it, "aiohttp.web") imported, pip-installing its package's pin first if it is
    missing; a failed install is a one-line ValueError naming `what` needed it."""
    try:
        __import__(module)
        return sys.modules[module]
    except ImportError:
        pass
    pin = PINS[module.split(".")[0]]
    print(f"installing {pin} for {what} (first use only{', ' + size if size else ''}) ...", flush=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", pin], capture_output=True, text=True)
    if proc.returncode:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"{what} needs {module}, and pip could not install {pin}: {why}") from None
    importlib.invalidate_caches()
    __import__(module)
    return sys.modules[module]
