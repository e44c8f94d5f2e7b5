"""Per-phase roofline analysis of a run: analytic FLOPs/bytes against measured time and measured peaks.

Regime rule: a phase whose achieved FLOP/s is below 25% of its roof (the lower of peak FLOP/s and intensity x
the memory roof of its working set, the read speed over its bytes; a cycle's first draft step reads its bytes
at the roof of the whole cycle's, since the verify pass streams the target's through the caches) is
overhead-bound (dispatch, Python, synchronisation dominate); otherwise it is widening-bound where a CPU's conversion
of its fp16 weights to fp32 sets the roof (their bytes at the measured widening rate: weights read from cache faster
than the kernels convert them), memory-bound where the memory roof lies below peak FLOP/s, else compute-bound.

Time is accounted per step: a row's own prefill, and each decode step once for all the rows that ran in it,
costed at the batch that ran (`roofline.speculative` defines the step).
"""
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mlperf.checkpoint import read_config
from mlperf.files import write_json
from roofline import peaks as machine_peaks
from roofline.analytic import drafts_per_cycle, kernels_per_forward, phase_costs
from roofline.peaks import cycle_roofline_s, draft_roofline_s, launch_floor_s, roofline_s, widen_s
from roofline.speculative import (SpeculativeFigures, decode_step_s, generation_rate, mean_batch,
                                  speculative_figures)
from scenarios.logs import read_detail, tokens_per_second
from scenarios.records import RunRecord
from suts.engine.stats import Stats
from suts.families import draft_forward

OVERHEAD_FRACTION = 0.25
ACT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def measured_times(stats: list[Stats]) -> dict[str, tuple[float, int]]:
    """Seconds per phase and the batch it ran at: prefill (one row), then the draft step, verify pass and cycle
    of a speculative run, or the decode step; a batched run's phases at its mean batch ("decode x8")."""
    times = {"prefill": (sum(s.prefill_s for s in stats) / len(stats), 1)}
    batch = mean_batch(stats)
    label = "" if round(batch) == 1 else f" x{round(batch)}"
    drafted, cycles = sum(s.drafted for s in stats), sum(s.cycles for s in stats)
    if drafted:  # per row, times the rows that shared each forward
        draft_s, verify_s = sum(s.draft_s for s in stats) * batch, sum(s.verify_s for s in stats) * batch
        times.update({f"draft{label}": (draft_s / drafted, round(batch)),
                      f"verify{label}": (verify_s / cycles, round(batch)),
                      f"cycle{label}": ((draft_s + verify_s) / cycles, round(batch))})
    else:
        times[f"decode{label}"] = (decode_step_s(stats), round(batch))
    return times


@dataclass
class Phase:
    """One phase of a run against its roof: measured seconds per forward, analytic FLOPs and bytes."""
    seconds: float
    batch: int
    flops: float
    bytes: float
    intensity: float
    achieved_flops_per_s: float
    achieved_bytes_per_s: float
    roof_flops_per_s: float
    fraction_of_roof: float
    regime: str
    ideal_seconds: float
    launch_floor_s: float | None = None  # on a GPU: its kernels, one after another, at the measured launch cost


@dataclass
class Roofline:
    """A run's roofline sidecar, roofline.json beside LoadGen's logs."""
    peaks: dict
    ridge_flops_per_byte: float
    regime_rule: str
    mean_prompt_tokens: int
    mean_new_tokens: float
    phases: dict[str, Phase]
    tokens_per_s: float
    loadgen_tokens_per_s: float | None
    baseline: str | None = None  # the baseline run the speculative figures are costed against
    speculative: SpeculativeFigures | None = None
    no_baseline: str | None = None  # why a speculative run has no speculative figures
    peaks_note: str | None = None  # peaks measured again during the analysis

    def implausible(self) -> list[str]:
        """Phases that ran faster than the peaks allow: the peaks were measured on a busy machine."""
        return machine_peaks.implausible({name: v.fraction_of_roof for name, v in self.phases.items()})

    def save(self, run_dir) -> None:
        write_json(Path(run_dir) / "roofline.json", asdict(self))

    @classmethod
    def load(cls, run_dir) -> "Roofline":
        path = Path(run_dir) / "roofline.json"
        try:
            raw = json.loads(path.read_text())
            return cls(**{**raw, "phases": {name: Phase(**v) for name, v in raw["phases"].items()},
                          "speculative": SpeculativeFigures(**raw["speculative"]) if raw.get("speculative") else None})
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise ValueError(f"{path} is not a roofline this version reads ({type(e).__name__}: {e}); run "
                             f"`python -m mlperf run` again or delete it") from None


def analyze(record: RunRecord, peaks: dict, baseline: RunRecord | None = None,
            loadgen_tokens_per_s: float | None = None) -> Roofline:
    """The roofline sidecar for one run; `baseline` (a baseline run that matches it) adds the speculative
    speedup model, `loadgen_tokens_per_s` the check of the per-step accounting against LoadGen's figure."""
    cfg, sut, stats = record.config, record.sut, record.stats
    target = read_config(cfg.target)[0]
    speculative = any(s.drafted for s in stats)
    draft = record.draft_config()
    prompt_len = round(sum(s.prompt_tokens for s in record.samples) / len(stats))
    n_tokens = sum(s.n_tokens for s in stats) / len(stats)
    gamma = max(1, round(sum(s.drafted for s in stats) / max(1, sum(s.cycles for s in stats))))
    ridge = peaks["flops_per_s"] / peaks["bytes_per_s"]
    phases, roof_cycle_steps = {}, math.nan
    for name, (seconds, batch) in measured_times(stats).items():
        if not seconds > 0:  # a SUT that emits everything at once has no decode steps to analyse
            continue
        costs = phase_costs(target, prompt_len, round(prompt_len + n_tokens / 2), draft, gamma,
                            act_bytes=ACT_BYTES.get(sut.dtype, 4), batch=batch,
                            draft_weight_bytes=sut.draft_weight_bytes, target_weight_bytes=sut.target_weight_bytes,
                            drafter=sut.drafter if speculative else None, tree=sut.tree)
        kind = name.split()[0]
        cost = costs[kind]
        ideal = (cycle_roofline_s(costs, peaks, gamma, sut.tree) if kind == "cycle" else
                 draft_roofline_s(costs, peaks, gamma, sut.tree) if kind == "draft" else roofline_s(cost, peaks))
        roof = cost.flops / ideal if ideal else 0.0
        if kind == "cycle" and ideal:
            roof_cycle_steps = ideal / roofline_s(costs["decode"], peaks)
        fraction = ideal / seconds  # = achieved FLOP/s / roof; 0 for a lookup's drafting, all host time
        widen = widen_s(cost, peaks)
        widening = widen > 0 and widen >= 0.999 * ideal
        regime = ("overhead-bound" if fraction < OVERHEAD_FRACTION else "widening-bound" if widening
                  else "memory-bound" if roof < 0.999 * peaks["flops_per_s"] else "compute-bound")
        phases[name] = Phase(seconds, batch, cost.flops, cost.bytes, cost.intensity, cost.flops / seconds,
                             cost.bytes / seconds, roof, fraction, regime, ideal,
                             launch_floor(kind, peaks, record, target, draft, prompt_len, gamma))
    out = Roofline(peaks, ridge, __doc__.split("\n\n")[1].replace("\n", " "), prompt_len, n_tokens, phases,
                   generation_rate(stats), loadgen_tokens_per_s)
    if speculative and baseline is not None:
        out.speculative = speculative_figures(stats, baseline.stats)
        out.speculative.roof_cycle_steps = roof_cycle_steps
        out.speculative.ceiling_speedup = out.speculative.tokens_per_cycle / roof_cycle_steps
    elif speculative:
        out.no_baseline = "no baseline run matches this one on " + ", ".join(record.comparison_key())
    return out


def launch_floor(kind: str, peaks: dict, record: RunRecord, target, draft, prompt_len: int, gamma: int
                 ) -> float | None:
    """A phase's launch floor on a GPU (peaks.launch_floor_s): when the run took the fast path, every chunk but
    a tree's nodes and a prefill of several rows at once runs from a CUDA graph (suts/fast/graphs.py). None on a CPU,
    and for a drafter that is no GPT (an EAGLE head, a lookup)."""
    graphs, tree = record.config.fast, record.sut.tree
    if kind == "prefill":
        alone = graphs and record.sut.batch == 1
        return launch_floor_s(peaks, kernels_per_forward(target, prompt_len, alone), alone)
    if kind == "decode":
        return launch_floor_s(peaks, kernels_per_forward(target, 1, graphs), graphs)
    verify = launch_floor_s(peaks, kernels_per_forward(target, gamma + 1, graphs and not tree), graphs and not tree)
    step = None if draft is None or not draft_forward(record.sut.drafter) else \
        launch_floor_s(peaks, kernels_per_forward(draft, 1, graphs), graphs)
    if kind == "verify" or verify is None:
        return verify
    if step is None:
        return None
    return step if kind == "draft" else verify + drafts_per_cycle(gamma, tree) * step


def matching_baseline(record: RunRecord) -> tuple[RunRecord, Path] | tuple[None, None]:
    """The newest good baseline performance run that matches `record` on every key of its comparison_key
    (runs written by an older version of the harness are passed over)."""
    base = record.config.results_of("baseline", mode="performance")
    key = record.comparison_key()
    for run in sorted((p for p in base.glob("2*") if p.suffix == "" and (p / "metrics.json").is_file()), reverse=True):
        try:
            candidate = RunRecord.load(run)
        except ValueError:
            continue
        if candidate.comparison_key() == key:
            return candidate, run
    return None, None


def write_sidecar(run_dir, baseline: tuple[RunRecord, Path] | None = None) -> Roofline:
    """Analyse a performance run and write roofline.json beside its LoadGen logs; speculative figures are
    costed against `baseline` (a baseline record and its directory), by default the newest matching run. The
    peaks are this hour's: measured again as the run ends unless measured in the last RECENT_S (a VM's memory speed
    moves by 2x from one hour to the next: a roof from another hour says nothing of this one), and anew if the run
    exceeds them."""
    run_dir = Path(run_dir)
    record = RunRecord.load(run_dir)
    base, base_dir = baseline or matching_baseline(record)
    loadgen_rate = tokens_per_second(read_detail(run_dir), record.config.scenario)
    dtype, device = getattr(torch, record.sut.dtype), record.config.device
    cache = machine_peaks.cache_in(record.config.results)
    result, note = machine_peaks.judged(lambda p: analyze(record, p, base, loadgen_rate), Roofline.implausible,
                                        lambda again: machine_peaks.load(device, dtype, cache,
                                                                         0 if again else machine_peaks.RECENT_S))
    result.peaks_note = note
    result.baseline = str(base_dir) if base_dir else None
    result.save(run_dir)
    return result
