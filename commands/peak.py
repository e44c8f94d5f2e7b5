"""Server peak search: the highest target QPS whose LoadGen Server run is VALID under the fixed constraints,
judged at the 99th percentile as MLPerf judges LLM Server runs.

Every trial is an ordinary Server run at one QPS, in a fresh process (LoadGen reads its settings once per
process), kept under the search's directory. The search doubles or halves the QPS from a start until one
VALID and one INVALID run bracket the peak, then bisects (geometrically) until the bracket is within
PRECISION. Those trials use the profile's settings; where the profile judges below p99 (quick: p90 over 48
queries, minutes per trial), they only screen, and the peak is then confirmed at p99 with the P99_QUERIES
queries LoadGen's early stopping needs: from the screened peak down, a step at a time, until a run is VALID (a
p99 limit is never looser than a p90 one, so the screened peak bounds it from above). LoadGen's own
FindPeakPerformance mode searches inside one StartTest call and logs only its final answer; ordinary runs let
every trial be printed, kept and checked on its own.

    python -m mlperf run --scenario Server --mode find-peak [--qps START]
"""
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from commands.children import kept_apart, run_child
from mlperf.checkpoint import read_config
from mlperf.files import read_text
from reports.loadgen import headline
from scenarios.config import RunConfig
from scenarios.run import claim, point_latest
from scenarios.settings import model_name, user_conf
from scenarios.scenario import Server

PRECISION = 0.10  # the bracket [highest VALID, lowest INVALID] ends within 10%
MAX_TRIALS = 12
MIN_QPS = 1e-3
P99_QUERIES = 459  # LoadGen's early stopping passes p99 with this many queries when none is over its limits
CONFIRM_STEP = 1.25  # each confirmation trial that fails lowers the load by this factor
MAX_CONFIRMATIONS = 5
P99_LAYER = ("# the peak search's confirmation at the 99th percentile, with the queries early stopping needs\n"
             f"*.Server.target_latency_percentile = 99\n*.Server.min_query_count = {P99_QUERIES}\n")


@dataclass
class Trial:
    qps: float
    valid: bool
    tokens_per_s: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    tpot_p90_ms: float | None
    tpot_p99_ms: float | None
    run_dir: str  # the run's directory, relative to the search's (or sweep's): it outlives the .partial rename
    slo_attainment: float | None = None
    goodput_tokens_per_s: float | None = None
    judged_at: str | None = None

    def line(self) -> str:
        ms = lambda v: f"{v:.0f}" if v is not None and v >= 100 else ("-" if v is None else f"{v:.1f}")
        return (f"{self.qps:8.3f} QPS  {'VALID' if self.valid else 'INVALID':7s} at {self.judged_at or '-'}  TTFT "
                f"p90/p99 {ms(self.ttft_p90_ms)}/{ms(self.ttft_p99_ms)} ms  TPOT p90/p99 {ms(self.tpot_p90_ms)}/"
                f"{ms(self.tpot_p99_ms)} ms  {self.tokens_per_s or 0:.1f} tokens/s  SLO "
                f"{100 * (self.slo_attainment or 0):.0f}%, goodput {self.goodput_tokens_per_s or 0:.1f} tokens/s")


def run_trial(cfg: RunConfig, qps: float, root: Path, name: str) -> Trial:
    """One Server performance run at `qps`, in a child process, written to `root/name`."""
    out = root / name
    run_child(replace(cfg, mode="performance", qps=qps, run_dir=str(out)), f"the trial at {qps:.3f} QPS")
    h = headline(out)
    return Trial(qps, h.validity == "VALID", h.tokens_per_s, h.ttft_p90_ms, h.ttft_p99_ms, h.tpot_p90_ms,
                 h.tpot_p99_ms, name, h.slo_attainment, h.goodput_tokens_per_s, h.judged_at)


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


def server_settings(cfg: RunConfig) -> dict[str, str]:
    """The Server settings the profile, --qps and the user's user.conf resolve to for the run's model."""
    return user_conf(cfg.profile, Server(), model_name(read_config(cfg.target)[0]), qps=cfg.qps,
                     extra=Path(cfg.user_conf) if cfg.user_conf else None)[1]


def confirm(cfg: RunConfig, screened: Trial, work: Path) -> list[Trial]:
    """Trials at p99 from the screened peak down, CONFIRM_STEP at a time, until one is VALID."""
    conf = work / "p99.conf"
    conf.write_text(P99_LAYER + (read_text(cfg.user_conf) if cfg.user_conf else ""))
    (work / "p99").mkdir()
    confirmations, qps = [], screened.qps
    print(f"confirming at p99 ({P99_QUERIES} queries per run, about {P99_QUERIES / qps / 60:.0f} min at "
          f"{qps:.3f} QPS)", flush=True)
    while len(confirmations) < MAX_CONFIRMATIONS:
        confirmations.append(run_trial(replace(cfg, user_conf=str(conf)), qps, work, f"p99/qps-{qps:.4f}"))
        print(f"p99 {len(confirmations)}: {confirmations[-1].line()}", flush=True)
        if confirmations[-1].valid:
            break
        qps /= CONFIRM_STEP
    return confirmations


def find_peak(cfg: RunConfig) -> Path:
    """Search, print every trial, write peak.json and peak.txt; returns the search's directory."""
    cfg.validate()
    settings = server_settings(cfg)
    screening = float(settings.get("target_latency_percentile", 99)) < 99
    final, work = claim(cfg.results_of(scenario=Server(), mode="find-peak"))
    (work / "trials").mkdir()
    trials, confirmations = [], []
    qps = float(settings["target_qps"])
    print(f"find-peak: {cfg.sut}, Server, profile {cfg.profile}; each trial is a LoadGen Server run"
          + (", screening at the profile's percentile, then confirming at p99" if screening else ""), flush=True)
    with kept_apart(work, final, lambda: f"the search ({len(trials) + len(confirmations)} trials)"):
        while qps is not None and qps >= MIN_QPS and len(trials) < MAX_TRIALS:
            trials.append(run_trial(cfg, qps, work, f"trials/qps-{qps:.4f}"))
            print(f"trial {len(trials):2d}: {trials[-1].line()}", flush=True)
            qps = next_qps(trials)
        valid = [t for t in trials if t.valid]
        peak = max(valid, key=lambda t: t.qps) if valid else None
        above = min((t.qps for t in trials if not t.valid and (peak is None or t.qps > peak.qps)), default=None)
        if screening and peak is not None:
            confirmations = confirm(cfg, peak, work)
            peak = confirmations[-1] if confirmations[-1].valid else None
    result = {"sut": cfg.sut, "profile": cfg.profile, "precision": PRECISION, "bracketed": qps is None,
              "judged_at": peak.judged_at if peak else None, "peak": asdict(peak) if peak else None,
              "lowest_invalid_qps": above, "trials": [asdict(t) for t in trials],
              "p99_confirmations": [asdict(t) for t in confirmations]}
    (work / "peak.json").write_text(json.dumps(result, indent=1) + "\n")
    summary = ("no VALID load found" + (f" at p99 within {len(confirmations)} confirmation runs"
                                        if confirmations else "") if peak is None else
               f"peak {peak.qps:.3f} QPS at {peak.judged_at}, {peak.tokens_per_s:.1f} tokens/s, goodput "
               f"{peak.goodput_tokens_per_s or 0:.1f} tokens/s"
               + (f" (VALID; {above:.3f} QPS INVALID" + (" at the screening percentile)" if confirmations else ")")
                  if above else " (no INVALID load found above it)"))
    lines = [f"trial {i + 1:2d}: {t.line()}" for i, t in enumerate(trials)]
    lines += [f"p99 {i + 1}: {t.line()}" for i, t in enumerate(confirmations)]
    (work / "peak.txt").write_text("\n".join(lines) + f"\n{summary}\n")
    print(summary)
    work.rename(final)
    point_latest(final)
    return final
