"""Runs in results/ as one pandas comparison table (SUT x scenario)."""
import json
from pathlib import Path

import pandas as pd

from reports.loadgen import read_metrics
from scenarios.logs import read_detail, tokens_per_second

PERCENTILES = {"TTFT": ("result_first_token_{}_percentile_latency_ns", ("50.00", "90.00", "99.00")),
               "TPOT": ("result_time_per_output_token_{}_percentile_ns", ("50.00", "90.00"))}


def find_runs(results="results") -> list[Path]:
    """The `latest` good performance run of every SUT x scenario under `results`."""
    return sorted(p.resolve() for p in Path(results).glob("*/*/performance/latest") if p.is_dir())


def run_row(run_dir) -> dict:
    run_dir = Path(run_dir)
    d, m = read_detail(run_dir), read_metrics(run_dir)
    scenario = m["config"]["scenario"]
    row = {"sut": m["sut"]["name"], "scenario": scenario,
           "tokens/s": tokens_per_second(d, scenario)}
    for name, (key, pcts) in PERCENTILES.items():
        for p in pcts:
            value = d.get(key.format(p))
            row[f"{name} p{p[:2]} (ms)"] = value / 1e6 if isinstance(value, (int, float)) else None
    row.update({"acceptance": m["totals"]["acceptance_rate"], "validity": d.get("result_validity"),
                "dtype": m["sut"]["dtype"], "device": m["sut"]["device"], "run": str(run_dir)})
    return row


def comparison(run_dirs) -> pd.DataFrame:
    """One row per run, with the speedup over the baseline run of the same scenario where there is one."""
    df = pd.DataFrame([run_row(r) for r in run_dirs])
    if df.empty:
        return df
    base = df[df["sut"] == "baseline"].set_index("scenario")["tokens/s"]
    df.insert(3, "speedup", df["tokens/s"] / df["scenario"].map(base))
    return df.sort_values(["scenario", "sut"]).reset_index(drop=True)


def roofline_points(run_dirs) -> pd.DataFrame:
    """Every phase of every run as (sut, scenario, phase, intensity, achieved FLOP/s, regime)."""
    rows = []
    for r in map(Path, run_dirs):
        if not (r / "roofline.json").is_file():
            continue
        roof, m = json.loads((r / "roofline.json").read_text()), read_metrics(r)
        for phase, v in roof["phases"].items():
            rows.append({"sut": m["sut"]["name"], "scenario": m["config"]["scenario"], "phase": phase,
                         "intensity": v["intensity"], "achieved_flops_per_s": v["achieved_flops_per_s"],
                         "fraction_of_roof": v["fraction_of_roof"], "regime": v["regime"], "ms": v["seconds"] * 1e3,
                         "peak_flops_per_s": roof["peaks"]["flops_per_s"], "peak_bytes_per_s": roof["peaks"]["bytes_per_s"]})
    return pd.DataFrame(rows)
