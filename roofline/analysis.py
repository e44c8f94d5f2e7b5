"""Per-phase roofline analysis of a run: analytic FLOPs/bytes against measured time and measured peaks.

Regime rule: a phase whose achieved FLOP/s is below 25% of its roof (the lower of peak FLOP/s and intensity x
peak bandwidth) is overhead-bound (dispatch, Python, synchronisation dominate); otherwise it is memory-bound
when its arithmetic intensity is below the ridge point (peak FLOP/s / peak bandwidth), else compute-bound.
"""
import json
from pathlib import Path

import torch

from mlperf.checkpoint import read_config
from roofline import peaks as machine_peaks
from roofline.analytic import phase_costs
from roofline.speculative import predicted_speedup

OVERHEAD_FRACTION = 0.25
ACT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def measured_times(records: list[dict], batch: int) -> dict[str, float]:
    """Mean seconds per phase, from the per-sample records in metrics.json."""
    def total(key):
        return sum(r[key] for r in records)
    times = {"prefill": total("prefill_s") / len(records) / batch}  # a batched SUT prefills rows one by one
    if total("drafted"):
        times["draft"] = total("draft_s") / total("drafted")
        times["verify"] = total("verify_s") / total("cycles")
        times["cycle"] = (total("draft_s") + total("verify_s")) / total("cycles")
    else:
        steps = [r["decode_s"] / (r["n_tokens"] - 1) for r in records if r["n_tokens"] > 1]
        times["decode"] = sum(steps) / len(steps)
    return times


def generation_rate(records: list[dict]) -> float:
    """Tokens per second of SUT time (prefill + decode), independent of LoadGen's scheduling."""
    return sum(r["n_tokens"] for r in records) / sum(r["prefill_s"] + r["decode_s"] for r in records)


def analyze(metrics: dict, peaks: dict, baseline: dict | None = None) -> dict:
    """The roofline sidecar for one run's metrics; `baseline` (a baseline run's metrics, same target) adds the
    measured and the Leviathan-predicted speedups."""
    cfg, sut, records = metrics["config"], metrics["sut"], metrics["samples"]
    target = read_config(cfg["target"])[0]
    speculative = any(r["drafted"] for r in records)
    draft = None
    if speculative:
        draft = target if sut["name"] == "spec-self-int8" else read_config(cfg["draft"])[0]
    batch = cfg["offline_batch"] if sut["batched_offline"] and cfg["scenario"] == "Offline" else 1
    prompt_len = sum(r["prompt_tokens"] for r in records) / len(records)
    n_tokens = sum(r["n_tokens"] for r in records) / len(records)
    costs = phase_costs(target, round(prompt_len), round(prompt_len + n_tokens / 2), draft, sut["gamma"] or 1,
                        act_bytes=ACT_BYTES.get(sut["dtype"], 4),
                        draft_weight_bytes=1 if "int8" in sut["name"] else None, batch=batch)
    ridge = peaks["flops_per_s"] / peaks["bytes_per_s"]
    phases = {}
    for name, seconds in measured_times(records, batch).items():
        cost = costs[name]
        roof = min(peaks["flops_per_s"], cost.intensity * peaks["bytes_per_s"])
        achieved = cost.flops / seconds
        fraction = achieved / roof
        regime = ("overhead-bound" if fraction < OVERHEAD_FRACTION
                  else "memory-bound" if cost.intensity < ridge else "compute-bound")
        phases[name] = {"seconds": seconds, "flops": cost.flops, "bytes": cost.bytes, "intensity": cost.intensity,
                        "achieved_flops_per_s": achieved, "achieved_bytes_per_s": cost.bytes / seconds,
                        "roof_flops_per_s": roof, "fraction_of_roof": fraction, "regime": regime,
                        "ideal_seconds": max(cost.flops / peaks["flops_per_s"], cost.bytes / peaks["bytes_per_s"])}
    out = {"peaks": peaks, "ridge_flops_per_byte": ridge, "regime_rule": __doc__.split("\n\n")[1].replace("\n", " "),
           "batch": batch, "mean_prompt_tokens": prompt_len, "mean_new_tokens": n_tokens, "phases": phases,
           "tokens_per_s": generation_rate(records)}
    if speculative and baseline is not None:
        step = measured_times(baseline["samples"], 1)["decode"]
        alpha = sum(r["accepted"] for r in records) / sum(r["drafted"] for r in records)
        c, v = phases["draft"]["seconds"] / step, phases["verify"]["seconds"] / step
        out["speculative"] = {
            "acceptance": alpha, "gamma": sut["gamma"], "draft_cost_ratio": c, "verify_cost_ratio": v,
            "predicted_speedup": predicted_speedup(alpha, sut["gamma"], c, v),
            "measured_speedup": out["tokens_per_s"] / generation_rate(baseline["samples"]),
        }
    return out


def latest_baseline(metrics: dict) -> dict | None:
    """The newest good baseline run of the same scenario and target, if there is one."""
    cfg = metrics["config"]
    path = Path(cfg["results"]) / "baseline" / cfg["scenario"] / "performance" / "latest" / "metrics.json"
    if not path.is_file():
        return None
    baseline = json.loads(path.read_text())
    return baseline if baseline["config"]["target"] == cfg["target"] else None


def write_sidecar(run_dir, baseline: dict | None = None) -> dict:
    """Analyse a performance run and write roofline.json beside its LoadGen logs; the speedups are measured
    against `baseline` (a baseline run's metrics), by default the newest good baseline run like it."""
    run_dir = Path(run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    dtype = getattr(torch, metrics["sut"]["dtype"])
    peaks = machine_peaks.load(metrics["config"]["device"], dtype, Path(metrics["config"]["results"]) / "peaks.json")
    result = analyze(metrics, peaks, baseline or latest_baseline(metrics))
    (run_dir / "roofline.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
