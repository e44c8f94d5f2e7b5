"""One benchmark run: SUT + QSL + settings -> LoadGen -> a results directory.

results/<sut>/<scenario>/<mode>/<timestamp>/ holds LoadGen's logs, user.conf and metrics.json; `latest`
beside it points at the newest good run. A run is written under <timestamp>.partial while it runs and
renamed only when it succeeds; a failed one becomes <timestamp>.failed (with error.txt), an interrupted
one stays .partial, so neither ever replaces a good result.
"""
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlperf_loadgen as lg
import torch

from mlperf import env
from mlperf.checkpoint import read_config
from mlperf.data import PROMPTS, load_prompts
from mlperf.tokenizer import load_tokenizer
from roofline.analysis import write_sidecar
from scenarios.adapter import SUTAdapter
from scenarios.qsl import QSL
from scenarios.settings import MODES, PROFILES, SCENARIOS, calibrate, loadgen_settings, user_conf
from suts.registry import build_sut, resolve
from suts.sampling import SamplingParams

ASSETS = Path(__file__).resolve().parent.parent / "mlperf" / "assets" / "models"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class RunError(RuntimeError):
    """The run failed; its directory was kept apart as .failed."""


@dataclass
class RunConfig:
    sut: str = "spec"
    scenario: str = "SingleStream"
    mode: str = "performance"
    profile: str = "quick"
    target: str = str(ASSETS / "target")
    draft: str = str(ASSETS / "draft")
    gamma: int = 4
    adaptive: bool = False
    max_new_tokens: int = 128
    samples: int | None = None  # the first N prompts; default all
    prompts: str = str(PROMPTS)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    device: str = "cpu"
    dtype: str | None = None  # float32, float16 or bfloat16; default fp16 on CUDA, fp32 on CPU
    qps: float | None = None  # Offline / Server target QPS instead of the calibrated one
    offline_batch: int = 8
    threads: int | None = None  # torch threads; default: all cores but one, which LoadGen's own threads keep busy
    stall_timeout_s: float = 120.0
    user_conf: str | None = None  # extra user.conf lines applied last
    results: str = "results"

    def validate(self) -> None:
        """One-line errors for every bad value, before anything is loaded."""
        resolve(self.sut)
        for name, value, choices in [("scenario", self.scenario, SCENARIOS), ("mode", self.mode, MODES),
                                     ("profile", self.profile, PROFILES)]:
            if value not in choices:
                raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
        for name in ("gamma", "max_new_tokens", "offline_batch") + (("threads",) if self.threads is not None else ()):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.max_new_tokens < 2:
            raise ValueError("max_new_tokens must be at least 2 (LoadGen's token latencies need two tokens)")
        if self.samples is not None and self.samples < 1:
            raise ValueError(f"samples must be a positive integer, got {self.samples!r}")
        if self.qps is not None and not self.qps > 0:
            raise ValueError(f"qps must be positive, got {self.qps!r}")
        if self.stall_timeout_s <= 0:
            raise ValueError(f"stall timeout must be positive, got {self.stall_timeout_s!r}")
        if self.user_conf and not Path(self.user_conf).is_file():
            raise ValueError(f"user.conf not found: {self.user_conf}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} requested but CUDA is not available")
        self.sampling()  # checks temperature / top-k / top-p

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)


def set_threads(threads: int | None) -> None:
    """Leave a core to LoadGen: with every core given to torch, LoadGen's threads oversubscribe them and a
    2-core CPU decodes about half as fast."""
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) - 1))


def run(cfg: RunConfig) -> Path:
    """Run one LoadGen test; returns the result directory (raises RunError, keeping a .failed directory)."""
    cfg.validate()
    set_threads(cfg.threads)
    tokenizer = load_tokenizer(cfg.target)
    sut = build_sut(cfg.sut, cfg.target, cfg.draft, device=cfg.device, dtype=DTYPES.get(cfg.dtype),
                    gamma=cfg.gamma, adaptive=cfg.adaptive, eos_id=tokenizer.eos_id)
    prompts = load_prompts(cfg.prompts)[:cfg.samples]
    context = read_config(cfg.target)[0].block_size
    qsl = QSL(prompts, tokenizer, context, cfg.max_new_tokens)
    calibration = None
    if cfg.mode == "performance":
        print(f"calibrating {cfg.sut} on {min(3, len(prompts))} prompts ...", flush=True)
        calibration = calibrate(sut, qsl.tokens, cfg.max_new_tokens, cfg.sampling(),
                                cfg.offline_batch if cfg.scenario == "Offline" else 1)

    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.results) / cfg.sut.replace(":", ".") / cfg.scenario / cfg.mode
    work = base / f"{stamp}.partial"
    work.mkdir(parents=True)
    conf = work / "user.conf"
    conf.write_text(user_conf(cfg.profile, cfg.scenario, calibration, cfg.qps,
                              Path(cfg.user_conf) if cfg.user_conf else None))
    settings = loadgen_settings(conf, cfg.scenario, cfg.mode, len(prompts))
    try:
        adapter = loadgen_test(sut, qsl, settings, work, cfg, calibration)
    finally:
        qsl.destroy()
    if adapter.error:
        failed = base / f"{stamp}.failed"
        (work / "error.txt").write_text(adapter.error + "\n")
        work.rename(failed)
        raise RunError(f"{adapter.error} (logs kept in {failed})")
    if cfg.mode == "performance":
        write_sidecar(work)
    final = base / stamp
    work.rename(final)
    latest = base / "latest.tmp"
    latest.unlink(missing_ok=True)
    latest.symlink_to(stamp)
    os.replace(latest, base / "latest")
    return final


def loadgen_test(sut, qsl: QSL, settings: lg.TestSettings, out: Path, cfg: RunConfig, calibration=None,
                 echo_summary: bool = True) -> SUTAdapter:
    """One LoadGen test of `sut` on `qsl`, its logs and metrics.json written into `out`."""
    log = lg.LogSettings()
    log.log_output.outdir = str(out)
    log.log_output.copy_summary_to_stdout = echo_summary
    log.enable_trace = False
    adapter = SUTAdapter(sut, qsl.tokens, cfg.max_new_tokens, cfg.sampling(), cfg.offline_batch, cfg.stall_timeout_s,
                         progress=f"{cfg.sut} {cfg.scenario} {cfg.mode}")
    if cfg.scenario == "Offline":
        print(f"Offline: {sut.name} decodes " + (f"in batches of {adapter.batch}" if adapter.batch > 1
                                                   else "one sample at a time"), flush=True)
    t0 = time.perf_counter()
    try:
        lg.StartTestWithLogSettings(adapter.handle, qsl.handle, settings, log)
    finally:
        adapter.close()
    write_metrics(out / "metrics.json", cfg, sut, adapter, calibration, time.perf_counter() - t0)
    return adapter


def write_metrics(path: Path, cfg: RunConfig, sut, adapter: SUTAdapter, calibration, wall_s: float) -> None:
    records = adapter.records
    hist = [0] * max((len(r.accepted_hist) for r in records), default=0)
    for r in records:
        for k, count in enumerate(r.accepted_hist):
            hist[k] += count
    totals = {k: sum(getattr(r, k) for r in records) for k in ("n_tokens", "cycles", "drafted", "accepted",
                                                                "draft_s", "verify_s", "latency_s")}
    metrics = {
        "config": asdict(cfg),
        "sut": {"name": sut.name, "class": f"{type(sut).__module__}.{type(sut).__qualname__}",
                "dtype": str(sut.dtype).removeprefix("torch."), "device": str(sut.device),
                "batched_offline": adapter.batch > 1, "gamma": getattr(sut, "gamma", None)},
        "machine": env.machine(), "torch_threads": torch.get_num_threads(), "versions": env.versions(), "seed": cfg.seed,
        "calibration": asdict(calibration) if calibration else None,
        "wall_s": wall_s, "error": adapter.error,
        "totals": {**totals, "acceptance_rate": totals["accepted"] / totals["drafted"] if totals["drafted"] else None,
                   "accepted_hist": hist},
        "samples": [asdict(r) for r in records],
    }
    path.write_text(json.dumps(metrics, indent=1) + "\n")
