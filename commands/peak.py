"""Server peak search: the highest target QPS whose LoadGen Server run is VALID under the fixed constraints.

Every trial is an ordinary Server run at one QPS, in a fresh process (LoadGen reads its settings once per
process), kept under the search's directory. The search doubles or halves the QPS from a start until one
VALID and one INVALID run bracket the peak, then bisects (geometrically) until the bracket is within
PRECISION. LoadGen's own FindPeakPerformance mode searches inside one StartTest call and logs only its final
answer; ordinary runs let every trial be printed, kept and checked on its own.

    python -m mlperf run --scenario Server --mode find-peak [--qps START]
"""
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from commands.children import kept_apart, run_child
from mlperf.checkpoint import read_config
from reports.loadgen import headline
from scenarios.records import RunConfig
from scenarios.run import claim, point_latest
from scenarios.settings import model_name, user_conf

PRECISION = 0.10  # the bracket [highest VALID, lowest INVALID] ends within 10%
MAX_TRIALS = 12
MIN_QPS = 1e-3


@dataclass
class Trial:
    qps: float
    valid: bool
    tokens_per_s: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    tpot_p90_ms: float | None
    tpot_p99_ms: float | None
    run_dir: str

    def line(self) -> str:
        ms = lambda v: f"{v:.0f}" if v is not None and v >= 100 else ("-" if v is None else f"{v:.1f}")
        return (f"{self.qps:8.3f} QPS  {'VALID' if self.valid else 'INVALID':7s}  TTFT p90/p99 {ms(self.ttft_p90_ms)}/"
                f"{ms(self.ttft_p99_ms)} ms  TPOT p90/p99 {ms(self.tpot_p90_ms)}/{ms(self.tpot_p99_ms)} ms  "
                f"{self.tokens_per_s or 0:.1f} tokens/s")


def run_trial(cfg: RunConfig, qps: float, out: Path) -> Trial:
    """One Server performance run at `qps`, in a child process, written to `out`."""
    run_child(replace(cfg, mode="performance", qps=qps, run_dir=str(out)), f"the trial at {qps:.3f} QPS")
    h = headline(out)
    return Trial(qps, h.validity == "VALID", h.tokens_per_s, h.ttft_p90_ms, h.ttft_p99_ms, h.tpot_p90_ms,
                 h.tpot_p99_ms, str(out))


def next_qps(trials: list[Trial]) -> float | None:
    """Double until INVALID, halve until VALID, then bisect; None once the bracket is within PRECISION."""
    valid = [t.qps for t in trials if t.valid]
    invalid = [t.qps for t in trials if not t.valid]
    if not invalid:
        return 2 * max(valid)
    if not valid:
        return min(invalid) / 2
    lo, hi = max(valid), min(invalid)
    if hi <= lo:  # a noisy machine: a lower load failed where a higher one passed; keep the lower pair
        lo = max(q for q in valid if q < hi) if any(q < hi for q in valid) else hi / 2
    return None if hi / lo <= 1 + PRECISION else math.sqrt(lo * hi)


def start_qps(cfg: RunConfig) -> float:
    """--qps if given, else the Server load the profile fixes for the model."""
    if cfg.qps is not None:
        return cfg.qps
    _, values = user_conf(cfg.profile, "Server", model_name(read_config(cfg.target)[0]),
                          extra=Path(cfg.user_conf) if cfg.user_conf else None)
    return float(values["target_qps"])


def find_peak(cfg: RunConfig) -> Path:
    """Search, print every trial, write peak.json and peak.txt; returns the search's directory."""
    cfg.validate()
    final, work = claim(Path(cfg.results) / cfg.sut.replace(":", ".") / "Server" / "find-peak")
    (work / "trials").mkdir()
    trials: list[Trial] = []
    qps = start_qps(cfg)
    print(f"find-peak: {cfg.sut}, Server, profile {cfg.profile}; each trial is a LoadGen Server run", flush=True)
    with kept_apart(work, final, lambda: f"the search ({len(trials)} trials)"):
        while qps is not None and qps >= MIN_QPS and len(trials) < MAX_TRIALS:
            trials.append(run_trial(cfg, qps, work / "trials" / f"qps-{qps:.4f}"))
            print(f"trial {len(trials):2d}: {trials[-1].line()}", flush=True)
            qps = next_qps(trials)
    valid = [t for t in trials if t.valid]
    peak = max(valid, key=lambda t: t.qps) if valid else None
    above = min((t.qps for t in trials if not t.valid and (peak is None or t.qps > peak.qps)), default=None)
    result = {"sut": cfg.sut, "profile": cfg.profile, "precision": PRECISION, "bracketed": qps is None,
              "peak": asdict(peak) if peak else None, "lowest_invalid_qps": above, "trials": [asdict(t) for t in trials]}
    (work / "peak.json").write_text(json.dumps(result, indent=1) + "\n")
    summary = ("no VALID load found" if peak is None else
               f"peak {peak.qps:.3f} QPS, {peak.tokens_per_s:.1f} tokens/s"
               + (f" (VALID; {above:.3f} QPS INVALID)" if above else " (no INVALID load found above it)"))
    (work / "peak.txt").write_text("\n".join(f"trial {i + 1:2d}: {t.line()}" for i, t in enumerate(trials))
                                   + f"\n{summary}\n")
    print(summary)
    work.rename(final)
    point_latest(final)
    return final

