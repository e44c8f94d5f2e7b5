"""Scenario settings in LoadGen's own user.conf format: a profile file plus values calibrated on the SUT.

A short calibration run sizes what LoadGen needs to know in advance (SingleStream's expected latency, the
Offline and Server QPS, the Server's latency limits in the quick profile), so that LoadGen neither runs out
of queries nor misses its minimum duration.
"""
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlperf_loadgen as lg

from suts.base import SUT
from suts.sampling import SamplingParams

CONF_DIR = Path(__file__).parent / "conf"
PROFILES = {p.stem: p for p in sorted(CONF_DIR.glob("*.conf"))}
SCENARIOS = {"SingleStream": lg.TestScenario.SingleStream, "Offline": lg.TestScenario.Offline,
             "Server": lg.TestScenario.Server}
MODES = {"performance": lg.TestMode.PerformanceOnly, "accuracy": lg.TestMode.AccuracyOnly}
MODEL = "llm"  # the model name in user.conf lines (`*` lines apply to it too)


@dataclass
class Calibration:
    latency_s: float  # one sample, alone
    ttft_s: float
    tpot_s: float
    samples_per_s: float  # through the entry point the scenario uses (batched for Offline where possible)


def calibrate(sut: SUT, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams,
              offline_batch: int = 1) -> Calibration:
    """Time the SUT on a few prompts after one warm-up call (and a batch, when Offline decodes in batches)."""
    sut.generate(prompts[0], max_new_tokens, params)
    results = [sut.generate(p, max_new_tokens, params) for p in prompts[:3]]
    latency = sum(r.stats.total_s for r in results) / len(results)
    ttft = sum(r.stats.ttft_s for r in results) / len(results)
    tpot = sum((r.stats.total_s - r.stats.ttft_s) / max(1, r.stats.n_tokens - 1) for r in results) / len(results)
    rate = 1 / latency
    if getattr(sut, "batched", False) and offline_batch > 1:
        batch = (prompts * offline_batch)[:offline_batch]
        sut.generate_batch(batch, max_new_tokens, params)  # warm-up: batched shapes are new to the kernels
        t0 = time.perf_counter()
        sut.generate_batch(batch, max_new_tokens, params)
        rate = len(batch) / (time.perf_counter() - t0)
    return Calibration(latency, ttft, tpot, rate)


SERVER_LOAD = (0.3, 0.7)  # the Server's offered load, as a fraction of the SUT's single-stream rate
QUICK_SERVER_ARRIVALS_S = 80  # quick profile: issue the Server's queries within about this long


def server_load(profile_text: str, quick: bool, latency_s: float) -> float:
    """The Server's load factor: 30% where it fits, higher (at most 70%) when the quick profile's queries would
    otherwise take longer than QUICK_SERVER_ARRIVALS_S to arrive at 30% of a slow SUT's rate."""
    low, high = SERVER_LOAD
    if not quick:
        return low
    match = re.search(r"^\*\.Server\.min_query_count\s*=\s*(\d+)", profile_text, re.M)
    queries = int(match.group(1)) if match else 0
    return min(high, max(low, queries * latency_s / QUICK_SERVER_ARRIVALS_S))


def user_conf(profile: str, scenario: str, cal: Calibration | None, qps: float | None = None,
              extra: Path | None = None) -> str:
    """The user.conf text for one run: the profile, calibrated values, a QPS asked for, the user's overrides."""
    text = PROFILES[profile].read_text().rstrip()
    lines = [text, f"# calibrated on this SUT: {asdict(cal) if cal else 'n/a'}"]
    if cal is not None:
        ms = lambda s: max(1, round(s * 1000))  # LoadGen reads times in ms
        if scenario == "SingleStream":  # on the low side: LoadGen must not run out of queries
            lines.append(f"{MODEL}.SingleStream.target_latency = {ms(0.5 * cal.latency_s)}")
        elif scenario == "Offline":  # on the high side: one query must outlast min_duration
            lines.append(f"{MODEL}.Offline.target_qps = {2 * cal.samples_per_s:.4f}")
        else:  # Poisson bursts and per-query overheads queue up at this load, but not without bound
            load = server_load(text, profile == "quick", cal.latency_s)
            lines.append(f"# Server load {load:.0%} of the single-stream rate")
            lines.append(f"{MODEL}.Server.target_qps = {load / cal.latency_s:.4f}")
            if profile == "quick":  # generous limits (queueing at up to 70% load), floored for tiny models
                lines.append(f"{MODEL}.Server.ttft_latency = {max(100, ms(8 * cal.latency_s))}")
                lines.append(f"{MODEL}.Server.tpot_latency = {max(10, ms(4 * cal.tpot_s))}")
    if qps is not None and scenario != "SingleStream":
        lines.append(f"{MODEL}.{scenario}.target_qps = {qps}")
    if extra is not None:
        lines += [f"# from {extra}", extra.read_text().rstrip()]
    return "\n".join(lines) + "\n"


def loadgen_settings(conf: Path, scenario: str, mode: str, performance_sample_count: int) -> lg.TestSettings:
    settings = lg.TestSettings()
    settings.scenario, settings.mode = SCENARIOS[scenario], MODES[mode]
    settings.use_token_latencies = True
    settings.performance_sample_count_override = performance_sample_count
    rc = settings.FromConfig(str(conf), MODEL, scenario)
    if rc != 0:
        reason = {-2: "file not found", -22: "a line LoadGen cannot parse (a trailing comment?)"}.get(rc, "error")
        raise ValueError(f"{conf}: LoadGen rejected the settings (FromConfig returned {rc}: {reason})")
    return settings
