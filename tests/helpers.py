"""Small random models and a CLI runner shared by the tests."""
import atexit
import copy
import functools
import itertools
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

import torch

from mlperf.model import GPT, GPTConfig
from suts.distribution import peaky_model  # noqa: F401 (the tests' random models)

ROOT = Path(__file__).resolve().parents[1]
# Two different fp32 computations of the same values (cached vs uncached attention, one chunk vs several,
# packed vs plain linears) sum in different orders and, on some CPUs, through different SIMD kernels: they
# agree to about 1e-7 relative, never bit for bit everywhere. Logits of these small models are O(1).
FP32_ATOL = 1e-5
SMALL = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=32, block_size=128)


def min_durations(offline_ms: int) -> str:
    """A LoadGen user.conf for tests' short runs: SingleStream and Server runs of half a second (64 queries are
    still enough for early stopping at the 90th percentile), Offline ones of `offline_ms`."""
    return "".join(f"*.{scenario}.min_duration = {ms}\n" for scenario, ms in
                   (("SingleStream", 500), ("Server", 500), ("Offline", offline_ms)))


FAST_CONF = min_durations(500)
# VALID whatever the machine's load: an Offline run's samples are sized by a rate calibrated under one load and may run
# under another
ANY_LOAD_CONF = min_durations(0)


def perturbed(model: GPT, seed: int, noise: float) -> GPT:
    """A copy of `model` with Gaussian noise on every weight: a draft that agrees with it part of the time."""
    torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * noise * p.std().clamp_min(1e-3))
    return draft


def filed(results, *parts) -> Path:
    """results/MODEL/parts...: under the one model folder of `results` that holds parts[0] (a SUT's runs)."""
    models = [d for d in Path(results).iterdir() if (d / parts[0]).is_dir()]
    assert len(models) == 1, f"{parts[0]} under {len(models)} model folders of {results}"
    return models[0].joinpath(*parts)


def cli_env() -> dict:
    """The environment of a harness subprocess in the tests: one torch thread, this checkout importable."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def run_args(pair: Path, results: Path, *args, samples: int = 16, tokens: int = 8,
             conf: str = "fast.conf") -> list[str]:
    """`run`'s arguments on the tiny pair, with one of its LoadGen user confs."""
    return ["run", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--head", str(pair / "head"),
            "--samples", str(samples), "--max-new-tokens", str(tokens), "--user-conf", str(pair / conf),
            "--results", str(results), *args]


def run_cli(pair: Path, results: Path, *args, samples: int = 16, tokens: int = 8, conf: str = "fast.conf",
            cwd=None):
    """`python -m mlperf run ...` on the tiny pair in a fresh process (LoadGen allows one test per process)."""
    return python_m("mlperf", *run_args(pair, results, *args, samples=samples, tokens=tokens, conf=conf), cwd=cwd)


PRELOADED = ("commands.cli", "labs.classroom", "scenarios.run", "suts.registry", "mlperf_loadgen")  # imported once
STARTING = threading.Lock()


def forks() -> multiprocessing.context.BaseContext:
    """Where python_m's processes come from (started_forks), the first caller starting it while any other waits:
    tests call python_m from threads, and starting it changes this process's environment for a moment."""
    with STARTING:
        return started_forks()


@functools.cache
def started_forks() -> multiprocessing.context.BaseContext:
    """A forkserver that imported the harness once, started in cli_env's environment (its OMP_NUM_THREADS read as
    torch loads) with this checkout first on its path (a test may have put another `tests` package on ours)."""
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(list(PRELOADED))
    environ, path = os.environ.copy(), sys.path.copy()
    os.environ.update(cli_env())
    sys.path.insert(0, str(ROOT))
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path
    return forks


def run_module(module: str, argv: list[str], cwd: str, env: dict, out: str, err: str) -> None:
    """A forked child's life as `python -m module argv...`: in `cwd` (first on its path, as -m puts it) and `env`,
    its stdout and stderr into files, the exit handlers run at its end as an interpreter's are."""
    os.chdir(cwd)
    sys.path.insert(0, cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()


def python_m(module: str, *args, cwd=None, env: dict | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m module args...` in a new process, as subprocess.run(capture_output=True, text=True) gives it
    (cli_env's environment, or `env`), forked from forks() rather than started afresh: the ~2 s of imports paid
    once a test worker, not once a call. Not for an environment variable read as the harness imports
    (MLPERF_MARCH): that takes a fresh interpreter."""
    command = [sys.executable, "-m", module, *map(str, args)]
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        child = forks().Process(target=run_module, args=(module, command[3:], str(cwd or os.getcwd()),
                                                         env or cli_env(), out, err))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(command, timeout)
        with open(out) as stdout, open(err) as stderr:
            return subprocess.CompletedProcess(command, child.exitcode, stdout.read(), stderr.read())


def refused(argv: list[str], capsys) -> tuple[int, str]:
    """A command that must refuse its input before LoadGen starts, run in this process (commands.cli.main, what
    `python -m mlperf` calls; a fresh interpreter would spend most of the test importing torch): its exit code
    and stderr. What a run sets for itself before it refuses (its torch threads, a SIGTERM handler) is put back."""
    from commands.cli import main
    handler, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's refusals
        code = e.code
    finally:
        signal.signal(signal.SIGTERM, handler)
        torch.set_num_threads(threads)
    return code, capsys.readouterr().err


def live_processes() -> dict[int, list[str]]:
    """Every live process on this machine, from /proc: pid -> its stat's fields after the command name (state,
    parent, process group, session, ...); zombies left out."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(stat.parent.name)] = fields
    return found


def exploring(sut, monkeypatch):
    """An -auto SUT that drafts 0, 1, ..., gamma tokens in turn, cycle after cycle (its planner still asked, its
    choice, which rests on this machine's timings, overridden: every length is met on any machine under any load),
    and the list of the lengths it drafted."""
    chosen, choose, turns = [], sut.planner.choose, itertools.count()

    def in_turn(*args) -> int:
        choose(*args)
        chosen.append(next(turns) % (sut.planner.max_gamma + 1))
        return chosen[-1]
    monkeypatch.setattr(sut.planner, "choose", in_turn)
    return sut, chosen


@contextmanager
def our_server(pair: Path, *args, sut: str = "spec"):
    """Our server of the tiny pair on a free loopback port, for the block: (its URL, the process)."""
    from serving.server import child
    from scenarios.config import RunConfig
    cfg = RunConfig(sut=sut, target=str(pair / "target"), draft=str(pair / "draft"), head=str(pair / "head"))
    with child(cfg, *args) as served:
        yield served


def http(url: str, body=None, headers=None, method=None) -> tuple[int, dict | str]:
    """One request with the standard library: (status, the JSON body, or its text where it is not JSON)."""
    import json
    import urllib.error
    import urllib.request
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})},
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def prometheus(url: str, headers=None) -> dict[str, float]:
    """A server's /metrics as {name with labels: value}."""
    lines = http(url + "/metrics", headers=headers)[1].splitlines()
    return {name: float(value) for line in lines if line and line[0] != "#" for name, value in [line.rsplit(" ", 1)]}


def fast_runner(model, weights: str | None = None, **packing):
    """A model through its fast path, as a SUT gives it one (Runner.use_fast_path; `weights` default the SUTs')."""
    from suts.fast.runner import Runner
    from suts.fast.step import WEIGHTS
    return Runner(model).use_fast_path(weights or WEIGHTS, **packing)
