"""One benchmark run: SUT + QSL + settings -> LoadGen -> a results directory.

results/<sut>/<scenario>/<mode>/<timestamp>/ holds LoadGen's logs, user.conf and metrics.json (a RunRecord);
`latest` beside it points at the newest good run. A run is written under <timestamp>.partial while it runs and
renamed only when it succeeds; a failed one becomes <timestamp>.failed (with error.txt), an interrupted one
<timestamp>.interrupted, so neither ever replaces a good result.
"""
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import mlperf_loadgen as lg
import torch

from mlperf import env
from mlperf.checkpoint import fingerprint, read_config
from mlperf.data import load_prompts
from mlperf.tokenizer import load_tokenizer
from roofline.analysis import write_sidecar
from scenarios.adapter import SUTAdapter
from scenarios.qsl import QSL
from scenarios.records import DTYPES, RunConfig, RunRecord, SUTInfo
from scenarios.settings import calibrate, loadgen_settings, model_name, user_conf
from suts.registry import build_sut

INTERRUPT_GRACE_S = 5.0  # after Ctrl-C, how long LoadGen may take to wind down before the process leaves


class RunError(RuntimeError):
    """The run failed; its directory was kept apart as .failed."""


class Interrupted(RunError):
    """Ctrl-C ended the run; its directory was kept apart as .interrupted."""


class ChildFailed(RunError):
    """A run made in a child process failed (a failure, not an INVALID result)."""


def run_child(cfg: RunConfig, what: str) -> Path:
    """`cfg` (with its run_dir set) as a run in a fresh process, as LoadGen runs one test per process. The
    caller reports the result (the child's stdout is dropped, its errors pass through); Ctrl-C in the child
    is raised here as KeyboardInterrupt."""
    out = Path(cfg.run_dir)
    spec = out.parent / f"{out.name}.json"
    spec.write_text(json.dumps(asdict(cfg)))
    proc = subprocess.run([sys.executable, "-m", "mlperf", "run", "--config", str(spec)], stdout=subprocess.PIPE, text=True)
    if proc.returncode == 130:
        raise KeyboardInterrupt
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
    except KeyboardInterrupt:
        work.rename(final.with_name(final.name + ".interrupted"))
        raise Interrupted(f"interrupted (Ctrl-C); {what()} kept in {final}.interrupted") from None


def set_threads(threads: int | None) -> None:
    """Leave a core to LoadGen: with every core given to torch, LoadGen's threads oversubscribe them and a
    2-core CPU decodes about half as fast."""
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) - 1))


def run(cfg: RunConfig, layers: tuple[tuple[str, str], ...] = ()) -> Path:
    """Run one LoadGen test; returns the result directory (raises RunError, keeping a .failed directory).
    `layers` are extra user.conf layers (name, text) that the user's own file still overrides."""
    cfg.validate()
    set_threads(cfg.threads)
    tokenizer = load_tokenizer(cfg.target, cfg.tokenizer)
    config = read_config(cfg.target)[0]
    model = model_name(config)
    sut = build_sut(cfg.sut, cfg.target, cfg.draft, device=cfg.device, dtype=DTYPES.get(cfg.dtype),
                    gamma=cfg.gamma, adaptive=cfg.adaptive, eos_id=tokenizer.eos_id)
    prompts = load_prompts(cfg.prompts)[:cfg.samples]
    qsl = QSL(prompts, tokenizer, config.block_size, cfg.max_new_tokens)
    calibration = None
    if cfg.mode == "performance" and cfg.scenario != "Server":  # Server's load and limits are fixed
        print(f"calibrating {cfg.sut} on {min(3, len(prompts))} prompts ...", flush=True)
        calibration = calibrate(sut, qsl.tokens, cfg.max_new_tokens, cfg.sampling(),
                                cfg.max_batch if cfg.scenario == "Offline" else 1)
    text, values = user_conf(cfg.profile, cfg.scenario, model, calibration, cfg.qps,
                             Path(cfg.user_conf) if cfg.user_conf else None, layers)

    final = Path(cfg.run_dir) if cfg.run_dir else (Path(cfg.results) / cfg.sut.replace(":", ".") / cfg.scenario /
                                                   cfg.mode / time.strftime("%Y%m%d-%H%M%S"))
    work = final.with_name(final.name + ".partial")
    work.mkdir(parents=True)
    (work / "user.conf").write_text(text)
    settings = loadgen_settings(work / "user.conf", cfg.scenario, cfg.mode, model, len(prompts))
    adapter = None
    try:
        adapter, _ = loadgen_test(sut, qsl, settings, work, cfg, calibration, model=model, settings_used=values)
    finally:
        if adapter is None or not adapter.interrupted:  # an interrupted LoadGen may still hold the QSL
            qsl.destroy()
    if adapter.error:
        kind = "interrupted" if adapter.interrupted else "failed"
        kept = final.with_name(f"{final.name}.{kind}")
        (work / "error.txt").write_text(adapter.error + "\n")
        work.rename(kept)
        raise (Interrupted if adapter.interrupted else RunError)(f"{adapter.error} (logs kept in {kept})")
    if cfg.mode == "performance":
        write_sidecar(work)
    work.rename(final)
    if not cfg.run_dir:
        point_latest(final)
    return final


def point_latest(final: Path) -> None:
    """Make `latest` beside `final` point at it, atomically."""
    tmp = final.parent / "latest.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(final.name)
    os.replace(tmp, final.parent / "latest")


def loadgen_test(sut, qsl: QSL, settings: lg.TestSettings, out: Path, cfg: RunConfig, calibration=None,
                 echo_summary: bool = True, model: str | None = None, settings_used: dict | None = None):
    """One LoadGen test of `sut` on `qsl`; its logs and metrics.json are written into `out`.

    LoadGen's StartTest blocks in native code, where Python never sees Ctrl-C; it runs in a helper thread so
    that the main thread can: on Ctrl-C the adapter answers everything at once, LoadGen gets a few seconds to
    return, and the run is marked interrupted (the process then leaves, see mlperf.__main__)."""
    log = lg.LogSettings()
    log.log_output.outdir = str(out)
    log.log_output.copy_summary_to_stdout = echo_summary
    log.enable_trace = False
    adapter = SUTAdapter(sut, qsl.tokens, cfg.max_new_tokens, cfg.sampling(),
                         cfg.max_batch if cfg.scenario != "SingleStream" else 1, cfg.stall_timeout_s,
                         progress=f"{cfg.sut} {cfg.scenario} {cfg.mode}")
    if cfg.scenario != "SingleStream":
        print(f"{cfg.scenario}: {sut.name} decodes " + (f"up to {adapter.batch} samples at once (continuous batching)"
                                                         if adapter.batch > 1 else "one sample at a time"), flush=True)
    t0 = time.perf_counter()
    test = threading.Thread(target=lg.StartTestWithLogSettings, args=(adapter.handle, qsl.handle, settings, log),
                            name="loadgen", daemon=True)
    test.start()
    try:
        while test.is_alive():
            test.join(0.2)
    except KeyboardInterrupt:
        adapter.interrupt()
        test.join(INTERRUPT_GRACE_S)
    finally:
        adapter.close(destroy=not adapter.interrupted)
    record = RunRecord(
        config=cfg, sut=SUTInfo(sut.name, f"{type(sut).__module__}.{type(sut).__qualname__}",
                                str(sut.dtype).removeprefix("torch."), str(sut.device), getattr(sut, "gamma", None),
                                adapter.batch),
        machine=env.machine(), torch_threads=torch.get_num_threads(), versions=env.versions(), loadgen_model=model,
        settings=settings_used or {}, calibration=calibration, wall_s=time.perf_counter() - t0, error=adapter.error,
        samples=sorted(adapter.records, key=lambda r: r.index),
        checkpoints={"target": fingerprint(cfg.target),
                     **({"draft": fingerprint(cfg.draft)} if getattr(sut, "needs_draft", False) else {})})
    record.save(out)
    return adapter, record
