"""Scenario settings in LoadGen's own user.conf format: a profile, values calibrated on the SUT, the user's file.

Each layer is a user.conf text. A layer's lines apply to the run when their model is the run's model (or
`*`) and their scenario the run's scenario (or `*`); within a layer the most specific line wins, as in
LoadGen. Later layers win over earlier ones: profile, calibration, `--qps`, then `--user-conf`. The run's
user.conf holds the result as explicit `model.scenario.key` lines, so LoadGen cannot pick a different value.

Server latency constraints and the Server's default load are fixed per model and profile, the same for every
SUT (as MLPerf fixes them per model): calibration only sizes what LoadGen needs to know in advance
(SingleStream's expected latency, the Offline QPS), which changes no verdict.
"""
import difflib
import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlperf_loadgen as lg

from mlperf.files import read_text
from mlperf.model import GEOMETRIES, GPTConfig
from suts.base import SUT, result_problem
from suts.engine.sampling import SamplingParams
from scenarios.scenario import Scenario

CONF_DIR = Path(__file__).parent / "conf"
PROFILES = {p.stem: p for p in sorted(CONF_DIR.glob("*.conf"))}
# compliance: LoadGen's performance mode with TEST06's accuracy-log sampling; find-peak: a search over Server runs
MODES = {"performance": lg.TestMode.PerformanceOnly, "accuracy": lg.TestMode.AccuracyOnly,
         "compliance": lg.TestMode.PerformanceOnly, "find-peak": lg.TestMode.PerformanceOnly}
GENERIC_MODEL = "llm"  # the LoadGen model name of a target whose geometry has no name: it gets the `*` lines
LINE = re.compile(r"^\s*([^.\s]+)\.([^.\s]+)\.(\w+)\s*=\s*(\S+)\s*$")
# The user.conf keys LoadGen reads, each with the values it can take: LoadGen itself checks none of them, and an
# out-of-range one crashes it (a negative count, a percentile of 250). Percentages are in percent, as LoadGen
# reads them; durations and latencies in ms. "mode" is not here: --mode sets it.
COUNT = (lambda x: x >= 0 and x.is_integer(), "a whole number >= 0")
FLAG = (lambda x: x in (0, 1), "0 or 1")
POSITIVE = (lambda x: 0 < x < math.inf, "a positive number")
KEYS = {**dict.fromkeys(("min_duration", "max_duration", "max_query_count", "qsl_rng_seed", "sample_index_rng_seed",
                         "schedule_rng_seed", "accuracy_log_rng_seed", "performance_issue_same_index",
                         "performance_sample_count_override", "accuracy_log_sampling_target", "samples_per_query",
                         "max_async_queries", "test05_qsl_rng_seed", "test05_sample_index_rng_seed",
                         "test05_schedule_rng_seed"), COUNT),
        **dict.fromkeys(("print_timestamps", "performance_issue_unique", "performance_issue_same", "coalesce_queries",
                         "use_token_latencies", "infer_token_latencies", "sample_concatenate_permutation", "test05"),
                        FLAG),
        **dict.fromkeys(("target_qps", "target_latency", "ttft_latency", "tpot_latency",
                         "token_latency_scaling_factor"), POSITIVE),
        "min_query_count": (lambda x: x >= 1 and x.is_integer(), "a whole number >= 1"),
        "target_latency_percentile": (lambda x: 0 < x < 100, "a percentage above 0 and below 100"),
        "accuracy_log_probability": (lambda x: 0 <= x <= 100, "a percentage from 0 to 100")}
MAX_QUERIES = 10_000_000  # LoadGen prepares target_qps x min_duration queries up front: more would exhaust memory


def model_name(config: GPTConfig) -> str:
    """The name LoadGen's settings are looked up under: the target's named geometry (mlperf/model.py)."""
    return next((name for name, geometry in GEOMETRIES.items() if geometry == config), GENERIC_MODEL)


@dataclass
class Calibration:
    latency_s: float  # one sample, alone
    ttft_s: float
    tpot_s: float
    samples_per_s: float  # as the scenario decodes (a full batch for Offline, where the SUT batches), at its best


def calibrate(sut: SUT, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams,
              max_batch: int = 1, token_budget: int | None = None) -> Calibration:
    """Time the SUT on a few prompts after one warm-up call (and a full batch twice, when Offline decodes in
    batches). The rate is the best one timed, a lone prompt's included: Offline sizes its query by it on the high
    side, and a slow moment (a busy core, a batch's requests ramping up through a server) must not shrink the query
    below what min_duration needs. An answer that is not a valid result is a ValueError, as it would fail the run."""
    def checked(result):
        problem = result_problem(result, max_new_tokens, sut.vocab_size, sut.eos_id)
        if problem:
            raise ValueError(f"SUT {sut.name} answered a calibration prompt with {problem}")
        return result

    checked(sut.generate(prompts[0], max_new_tokens, params))
    results = [checked(sut.generate(p, max_new_tokens, params.for_sample(i))) for i, p in enumerate(prompts[:3])]
    latency = sum(r.stats.total_s for r in results) / len(results)
    ttft = sum(r.stats.ttft_s for r in results) / len(results)
    tpot = sum((r.stats.total_s - r.stats.ttft_s) / max(1, r.stats.n_tokens - 1) for r in results) / len(results)
    rate = 1 / min(r.stats.total_s for r in results)
    if getattr(sut, "batched", False) and max_batch > 1:
        batch = (prompts * max_batch)[:max_batch]
        per_row = [params.for_sample(i) for i in range(len(batch))]
        rates = []
        for _ in range(2):  # the first also warms up
            t0 = time.perf_counter()
            timed = sut.generate_batch(batch, max_new_tokens, per_row, token_budget=token_budget)
            rates.append(len(batch) / (time.perf_counter() - t0))
            for result in timed:
                checked(result)
        rate = max(rate, *rates)  # a batch slower than a lone prompt was held back: not the SUT's rate
    return Calibration(latency, ttft, tpot, rate)


def resolve(text: str, model: str, scenario: str, source: str) -> dict[str, str]:
    """The keys one user.conf layer sets for (model, scenario), most specific line first, as LoadGen ranks them:
    model.scenario, then *.scenario, then model.*, then *.*; among equals the last line wins."""
    rank = {(model, scenario): 3, ("*", scenario): 2, (model, "*"): 1, ("*", "*"): 0}
    best: dict[str, tuple[int, str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = LINE.match(line)
        if not match:
            raise ValueError(f"{source}, line {n}: expected 'model.scenario.key = number' (no trailing comment), "
                             f"got {line.strip()!r}")
        m, s, key, value = match.groups()
        check_value(key, value, f"{source}, line {n}")
        r = rank.get((m, s))
        if r is not None and r >= best.get(key, (-1, ""))[0]:
            best[key] = (r, value)
    return {key: value for key, (_, value) in best.items()}


def check_value(key: str, value: str, where: str) -> None:
    """A ValueError naming `where` for a value LoadGen cannot take or a key it does not read (a typo would leave the
    setting at its default, and MLPerf's settings must be exact)."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{where}: {key} must be a number, got {value!r}") from None
    if key == "mode":
        raise ValueError(f"{where}: set the mode with --mode, not in user.conf")
    if key not in KEYS:
        near = difflib.get_close_matches(key, KEYS, n=1)
        raise ValueError(f"{where}: LoadGen has no setting {key!r}" + (f" (did you mean {near[0]}?)" if near else ""))
    valid, expected = KEYS[key]
    if not valid(number):
        raise ValueError(f"{where}: {key} must be {expected}, got {value}")


def calibrated(scenario: Scenario, cal: Calibration | None) -> str:
    """The user.conf lines a calibration sizes: how many queries LoadGen prepares, never a limit or a load."""
    return "" if cal is None else scenario.calibrated(cal.samples_per_s)


def user_conf(profile: str, scenario: Scenario, model: str, cal: Calibration | None = None, qps: float | None = None,
              extra: Path | None = None, layers: tuple[tuple[str, str], ...] = ()) -> tuple[str, dict[str, str]]:
    """The run's user.conf text and the settings it resolves to; `layers` (name, text) go before `extra`."""
    sources = [(f"profile {profile}", PROFILES[profile].read_text()), ("calibration", calibrated(scenario, cal))]
    named = scenario.settings_name  # the scenario its lines name
    if qps is not None and scenario.takes_load:
        sources.append(("--qps", f"*.{named}.target_qps = {qps}"))
    sources += list(layers)
    if extra is not None:
        sources.append((str(extra), read_text(extra)))
    values, origin = {}, {}
    for name, text in sources:
        for key, value in resolve(text, model, named, name).items():
            values[key], origin[key] = value, name
    queries = float(values.get("target_qps", 0)) * float(values.get("min_duration", 0)) / 1000
    if queries > MAX_QUERIES:
        raise ValueError(f"target_qps {float(values['target_qps']):g} ({origin['target_qps']}) for min_duration "
                         f"{values['min_duration']} ms would have LoadGen prepare {queries:.3g} queries, more than "
                         f"{MAX_QUERIES:,}: lower the load or the duration")
    if scenario.paced and "target_qps" not in values:
        raise ValueError(f"no Server load is fixed for model {model!r} in profile {profile}: give one with --qps "
                         f"(the same for every SUT you compare), or search for the peak with --mode find-peak")
    lines = [f"# LoadGen settings for model {model}, scenario {scenario}; each key's source is named above it"]
    if cal is not None:
        lines.append(f"# calibration: {asdict(cal)}")
    for key, value in values.items():
        lines += [f"# from {origin[key]}", f"{model}.{named}.{key} = {value}"]
    return "\n".join(lines) + "\n", values


def loadgen_settings(conf: Path, scenario: Scenario, mode: str, model: str,
                     performance_sample_count: int) -> lg.TestSettings:
    settings = lg.TestSettings()
    settings.scenario, settings.mode = scenario.loadgen, MODES[mode]
    settings.use_token_latencies = True
    settings.performance_sample_count_override = performance_sample_count
    rc = settings.FromConfig(str(conf), model, scenario.settings_name)
    if rc != 0:
        reason = {-2: "file not found", -22: "a line LoadGen cannot parse (a trailing comment?)"}.get(rc, "error")
        raise ValueError(f"{conf}: LoadGen rejected the settings (FromConfig returned {rc}: {reason})")
    return settings
