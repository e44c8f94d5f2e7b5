"""One benchmark run: SUT + QSL + settings -> LoadGen -> a results directory.

results/<model>/<sut>/<scenario>/<mode>/<timestamp>/ holds LoadGen's logs, user.conf and metrics.json (a RunRecord);
`latest` beside it points at the newest good run. A run is written under <timestamp>.partial while it runs and
renamed only when it succeeds; a failed one becomes <timestamp>.failed (with error.txt), an interrupted one
<timestamp>.interrupted, so neither ever replaces a good result.
"""
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import mlperf_loadgen as lg
import torch

from mlperf import devices, env
from mlperf.checkpoint import pair_key, read_config
from mlperf.data import load_prompts
from mlperf.env import set_threads
from mlperf.model import GPTConfig
from mlperf.tokenizer import load_tokenizer
from scenarios import accuracy, compliance
from scenarios.adapter import SUTAdapter, signal_name
from scenarios.logs import check_complete
from scenarios.qsl import QSL
from scenarios.config import DTYPES, RunConfig, taken
from scenarios.hosted import built_here
from scenarios.records import RunRecord
from scenarios.speculation import disclosure
from scenarios.settings import calibrate, loadgen_settings, model_name, user_conf
from suts.fast.step import Tally

INTERRUPT_GRACE_S = 5.0  # after Ctrl-C, how long LoadGen may take to wind down before the process leaves
CALIBRATION_CALLS = 6  # calibration's calls to the SUT at most: its time limit is this many stall timeouts


class RunError(RuntimeError):
    """The run failed; its directory was kept apart as .failed."""


class Interrupted(RunError):
    """Ctrl-C or SIGTERM ended the run; its directory was kept apart as .interrupted."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = signum


class Signalled(KeyboardInterrupt):
    """SIGTERM (what `timeout`, CI runners and schedulers send), raised in the main thread as Ctrl-C is, so that a
    run ends the same way; commands.cli installs `on_signal` for it."""

    def __init__(self, signum: int):
        super().__init__()
        self.signum = signum


def on_signal(signum, frame):
    raise Signalled(signum)


def signum_of(e: BaseException) -> int:
    return getattr(e, "signum", signal.SIGINT)


def run(cfg: RunConfig, layers: tuple[tuple[str, str], ...] = (), explain: Callable[[Path], object] | None = None,
        open_sut=built_here) -> Path:
    """Run one LoadGen test; returns the result directory (raises RunError, keeping a .failed directory).
    `layers` are extra user.conf layers (name, text) that the user's own file still overrides; `explain` writes
    what explains a performance run beside its logs (the command line passes the roofline's writer). The run is
    published (renamed into place, `latest` moved to it) only once LoadGen's logs are complete, a performance run
    explained, and an accuracy or compliance run scored. `open_sut(cfg, eos_id, config)` opens the SUT for the
    test (serving.hosts.open_sut: a server or Ray replicas too)."""
    cfg.validate()
    env.commit()  # the code this run runs, recorded as it starts
    if Path("audit.config").exists():  # LoadGen reads it from the working directory at StartTest, silently
        raise ValueError(f"{Path('audit.config').resolve()} would change this run's LoadGen settings (LoadGen reads "
                         "an audit.config where it starts): remove it, or run from another directory")
    set_threads(cfg.threads)
    tokenizer = load_tokenizer(cfg.target, cfg.tokenizer)
    config = read_config(cfg.target)[0]
    check_cache_fits(config, cfg.scenario.rows(cfg.max_batch), cfg)
    with open_sut(cfg, tokenizer.eos_id, config) as sut:
        return measure(cfg, sut, tokenizer, config, layers, explain)


def measure(cfg: RunConfig, sut, tokenizer, config: GPTConfig, layers, explain) -> Path:
    """`run`'s LoadGen test of a SUT already serving."""
    model = model_name(config)
    prompts = load_prompts(cfg.prompts)[:cfg.samples]
    qsl = QSL(prompts, tokenizer, config.block_size, cfg.max_new_tokens)
    calibration = None
    if cfg.mode == "performance" and not cfg.scenario.paced:  # Server's load and limits are fixed
        print(f"calibrating {cfg.sut} on {min(3, len(prompts))} prompts (untimed by LoadGen: also the warm-up) ...",
              flush=True)
        batch = cfg.scenario.rows(cfg.max_batch * (cfg.replicas or 1))  # every replica's
        calibration = guarded(lambda: calibrate(sut, qsl.tokens, cfg.max_new_tokens, cfg.sampling(), batch,
                                                cfg.budget),
                              CALIBRATION_CALLS * cfg.stall_timeout_s, f"calibrating SUT {cfg.sut}")
    else:  # every SUT alike: first calls (allocation, kernel choices) stay out of LoadGen's timed part
        seconds = guarded(lambda: warm_up(sut, qsl.tokens, cfg), CALIBRATION_CALLS * cfg.stall_timeout_s,
                          f"warming SUT {cfg.sut} up")
        print(f"warm-up: {seconds:.1f} s of untimed calls before LoadGen's run", flush=True)
    text, values = user_conf(cfg.profile, cfg.scenario, model, calibration, cfg.qps,
                             Path(cfg.user_conf) if cfg.user_conf else None, layers)

    if cfg.run_dir:  # validate() refused one that exists
        final = Path(cfg.run_dir)
        work = final.with_name(final.name + ".partial")
        work.mkdir(parents=True)
    else:
        final, work = claim(cfg.results_of())
    adapter = None
    try:
        (work / "user.conf").write_text(text)
        settings = loadgen_settings(work / "user.conf", cfg.scenario, cfg.mode, model, len(prompts))
        adapter, _ = loadgen_test(sut, qsl, settings, work, cfg, calibration, model=model, settings_used=values)
        if adapter.error:
            raise Interrupted(adapter.error, adapter.interrupted) if adapter.interrupted else RunError(adapter.error)
        check_complete(work, cfg.scenario, cfg.mode)
        if cfg.mode == "performance" and explain:
            explain(work)
        elif cfg.mode == "accuracy":
            accuracy.check(work)
        elif cfg.mode == "compliance":
            compliance.check(work, cfg.scenario, tokenizer.eos_id, cfg.manifest)
    except BaseException as e:
        signum = e.signum if isinstance(e, Interrupted) else signum_of(e) if isinstance(e, KeyboardInterrupt) else 0
        message = (f"interrupted ({signal_name(signum)})" if isinstance(e, KeyboardInterrupt) else
                   str(e) if isinstance(e, (RunError, ValueError)) else f"{type(e).__name__}: {e}")
        kept = final.with_name(f"{final.name}.{'interrupted' if signum else 'failed'}")
        with suppress(OSError):  # a full disk may refuse even this; the directory's name still says what happened
            (work / "error.txt").write_text(message + "\n")
        work.rename(kept)
        message += f" (logs kept in {kept})"
        raise Interrupted(message, signum) if signum else RunError(message) from None
    finally:
        if adapter is None or not adapter.interrupted:  # an interrupted LoadGen may still hold the QSL
            qsl.destroy()
    work.rename(final)
    if not cfg.run_dir:
        point_latest(final)
    return final


def warm_up(sut, prompts: list[list[int]], cfg: RunConfig) -> float:
    """Untimed calls before LoadGen's run where no calibration made them: one prompt alone, then a full batch when
    the scenario batches (a few tokens each); returns the seconds they took."""
    t0 = time.perf_counter()
    tokens = min(8, cfg.max_new_tokens)
    batch = cfg.scenario.rows(cfg.max_batch * (cfg.replicas or 1))  # every replica's
    sut.generate(prompts[0], tokens, cfg.sampling())
    if getattr(sut, "batched", False) and batch > 1:
        sut.generate_batch((prompts * batch)[:batch], tokens, [cfg.sampling().for_sample(i) for i in range(batch)],
                           batch, cfg.budget)
    return time.perf_counter() - t0


def check_cache_fits(config: GPTConfig, rows: int, cfg: RunConfig) -> None:
    """A KV cache pool of more than half the memory would swap or be killed midway: refuse it in one line."""
    itemsize = torch.empty(0, dtype=DTYPES.get(cfg.dtype) or devices.default_dtype(cfg.device)).element_size()
    need = 2 * config.n_layer * rows * config.block_size * config.n_embd * itemsize  # keys and values
    total = devices.memory(cfg.device)
    if need > total / 2:
        raise ValueError(f"max_batch {rows}: the target's KV cache alone would take {need / 2 ** 30:.1f} GiB, more "
                         f"than half of the {total / 2 ** 30:.1f} GiB of {cfg.device} memory")


def guarded(fn: Callable, timeout_s: float, what: str):
    """`fn()` on a helper thread, as LoadGen's watchdog guards a SUT: an exception from it, or no result
    within `timeout_s`, is a RunError naming `what` (a stalled thread dies with the process)."""
    outcome = {}

    def call():
        try:
            outcome["value"] = fn()
        except Exception as e:
            outcome["error"] = e
    helper = threading.Thread(target=call, name=what, daemon=True)
    helper.start()
    helper.join(timeout_s)
    if helper.is_alive():
        raise RunError(f"{what}: no result within {timeout_s:.0f} s (a stalled SUT?)")
    if "error" in outcome:
        e = outcome["error"]
        raise RunError(f"{what}: {e}" if isinstance(e, ValueError) else f"{what}: {type(e).__name__}: {e}")
    return outcome["value"]


def claim(base: Path) -> tuple[Path, Path]:
    """A new directory under `base` and its .partial work directory, created. Named by the second it started,
    with -2, -3, ... when another run took that name (mkdir is atomic: two runs never share a directory)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        final = base / (stamp if n == 1 else f"{stamp}-{n}")
        if taken(final):
            continue
        work = final.with_name(final.name + ".partial")
        try:
            work.mkdir(parents=True)
        except FileExistsError:
            continue
        return final, work


def point_latest(final: Path) -> None:
    """Make `latest` beside `final` point at it, atomically (a temporary link of this process's own)."""
    tmp = final.parent / f".latest.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(final.name)
    os.replace(tmp, final.parent / "latest")


def loadgen_test(sut, qsl: QSL, settings: lg.TestSettings, out: Path, cfg: RunConfig, calibration=None,
                 echo_summary: bool = True, model: str | None = None, settings_used: dict | None = None):
    """One LoadGen test of `sut` on `qsl`; its logs and metrics.json are written into `out`.

    LoadGen's StartTest blocks in native code, where Python never sees Ctrl-C; it runs in a helper thread so
    that the main thread can: on Ctrl-C the adapter answers everything at once, LoadGen gets a few seconds to
    return, and the run is marked interrupted (the process then leaves, see commands.cli)."""
    log = lg.LogSettings()
    log.log_output.outdir = str(out)
    log.log_output.copy_summary_to_stdout = echo_summary
    log.enable_trace = False
    adapter = SUTAdapter(sut, qsl.tokens, cfg.max_new_tokens, cfg.sampling(),
                         cfg.scenario.rows(cfg.max_batch), cfg.stall_timeout_s,
                         progress=f"{cfg.sut} {cfg.scenario} {cfg.mode}", token_budget=cfg.budget)
    if not cfg.scenario.one_at_a_time:
        budget = f", at most {cfg.budget} tokens per iteration" if cfg.budget else ""
        how = f"up to {adapter.batch} samples at once (continuous batching{budget})" if adapter.batch > 1 else \
            "one sample at a time"
        print(f"{cfg.scenario}: {sut.name} decodes {how}", flush=True)
    host = adapter.host
    runners = host.local_runners()
    for r in runners.values():
        r.tally = Tally()  # the test's own operations: which the fast path ran, which fell back and why
    t0 = time.perf_counter()
    test = threading.Thread(target=lg.StartTestWithLogSettings, args=(adapter.handle, qsl.handle, settings, log),
                            name="loadgen", daemon=True)
    test.start()
    try:
        while test.is_alive():
            test.join(0.2)
    except BaseException as e:  # Ctrl-C, SIGTERM or a caller's time limit: answer everything so LoadGen returns
        adapter.interrupt(signum_of(e))
        test.join(INTERRUPT_GRACE_S)
        if not isinstance(e, KeyboardInterrupt):
            raise
    finally:
        adapter.close(destroy=not adapter.interrupted)
    record = RunRecord(
        config=cfg, sut=host.info(adapter.batch), machine=env.machine(), torch_threads=torch.get_num_threads(),
        versions=env.versions(), loadgen_model=model, settings=settings_used or {}, calibration=calibration,
        wall_s=time.perf_counter() - t0, error=adapter.error, samples=sorted(adapter.records, key=lambda r: r.index),
        checkpoints=host.checkpoints(cfg), fused_threads=host.fused_threads(),
        fast_path={role: r.tally.asdict() for role, r in runners.items()}, system=env.system(),
        model=pair_key(cfg.target, cfg.draft), **host.where())
    record.speculative = disclosure(record)
    record.save(out)
    return adapter, record
