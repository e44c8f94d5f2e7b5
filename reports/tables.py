"""Runs in results/ as one pandas comparison table (model x SUT x scenario)."""
import json
from pathlib import Path

import pandas as pd

from reports.loadgen import latency_ms
from roofline.analysis import Roofline
from scenarios.logs import read_detail, tokens_per_second
from scenarios.records import RunRecord, weights_in_brief

PERCENTILES = {"TTFT": ("50.00", "90.00", "99.00"), "TPOT": ("50.00", "90.00")}


def find_runs(results="results") -> list[Path]:
    """The `latest` good performance run of every model x SUT x scenario under `results`."""
    return sorted(p.resolve() for p in Path(results).glob("*/*/*/performance/latest") if p.is_dir())


def model_of(record: RunRecord) -> str:
    """The model pair a run measured, as the report groups runs: its folder in results/ (its target's and draft's
    names and a hash of both checkpoints), else its target's name and hash."""
    return record.model or f"{Path(record.config.target).stem}-{record.checkpoints.get('target', '?')[:8]}"


def checkpoints_of(record: RunRecord) -> str:
    """Each checkpoint the run loaded, with its hash: "target 4f4e2312, draft 1a2b3c4d"."""
    return ", ".join(f"{role} {Path(getattr(record.config, role)).stem} {sha[:8]}"
                     for role, sha in record.checkpoints.items())


def judged_percentile(record: RunRecord) -> str:
    """The latency percentile LoadGen judged the run at ("90.00"); p90 where it judges none (Offline)."""
    return f"{float(record.settings.get('target_latency_percentile', 90)):.2f}"


def started(run_dir: Path) -> str:
    """When a run started, from its directory's name (YYYYMMDD-HHMMSS): "YYYY-MM-DD HH:MM"."""
    stamp = run_dir.name
    return f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]} {stamp[9:11]}:{stamp[11:13]}" if len(stamp) >= 15 else stamp


def run_row(run_dir) -> dict:
    run_dir = Path(run_dir)
    d, r = read_detail(run_dir), RunRecord.load(run_dir)
    scenario, judged = r.config.scenario, judged_percentile(r)
    row = {"model": model_of(r), "sut": r.sut.name, "scenario": scenario, "tokens/s": tokens_per_second(d, scenario)}
    if scenario.paced:
        row["QPS"] = float(r.settings["target_qps"]) if "target_qps" in r.settings else None
    for what, percentiles in PERCENTILES.items():
        for p in percentiles:
            row[f"{what} p{p[:2]} (ms)"] = latency_ms(d, what, p)
    row.update({"judged at": f"p{float(judged):g}", "TTFT judged (ms)": latency_ms(d, "TTFT", judged),
                "TPOT judged (ms)": latency_ms(d, "TPOT", judged)})
    roof = Roofline.load(run_dir).speculative if (run_dir / "roofline.json").is_file() else None
    row.update({"predicted speedup": roof.predicted_speedup if roof else None,
                "measured decode speedup": roof.measured_speedup if roof else None})
    disclosed = r.speculative or {}
    row.update({"acceptance": r.acceptance_rate, "acceptance length": disclosed.get("mean_acceptance_length"),
                "synthetic acceptance": disclosed.get("synthetic_acceptance"),
                "validity": d.get("result_validity"), "batch": r.sut.batch,
                "replicas": len(r.replicas["replicas"]) if r.replicas else None, "dtype": r.sut.dtype,
                "weights": weights_in_brief(r.sut.weights), "device": r.sut.device, "machine": r.machine,
                "checkpoints": checkpoints_of(r), "date": started(run_dir), "run": str(run_dir),
                "key": r.comparison_key()})
    return row


def comparison(run_dirs) -> pd.DataFrame:
    """One row per run. The speedup is over a baseline run among them that matches it on every key that changes
    the figure (RunRecord.comparison_key: for Server, the same QPS and constraints); where none does, the
    "compared with" column says so and there is no speedup."""
    df = pd.DataFrame([run_row(r) for r in run_dirs])
    if df.empty:
        return df
    baselines = df[df["sut"] == "baseline"]
    speedups, against = [], []
    for _, row in df.iterrows():
        match = baselines[baselines["key"].map(lambda k: k == row["key"])]
        speedups.append(row["tokens/s"] / match["tokens/s"].iloc[0] if len(match) else None)
        against.append(Path(match["run"].iloc[0]).name if len(match) else "no matching baseline run")
    df.insert(3, "speedup", pd.array(speedups, dtype="Float64").astype(float))
    df["compared with"] = against
    return df.drop(columns=["key"]).sort_values(["model", "scenario", "sut"]).reset_index(drop=True)


def replica_table(run_dirs) -> pd.DataFrame:
    """Every replica of every run served by Ray replicas: where it ran, its threads, the queries it answered, and
    why it died if it did (its unfinished queries were re-issued to the others)."""
    rows = []
    for r in map(Path, run_dirs):
        record = RunRecord.load(r)
        if record.replicas:
            rows += [{"sut": record.sut.name, "scenario": record.config.scenario, "cluster": record.replicas["address"],
                      **replica, "re-issued (run)": record.replicas["reissued"]}
                     for replica in record.replicas["replicas"]]
    return pd.DataFrame(rows)


def peak_table(results="results") -> pd.DataFrame:
    """The latest Server peak search of every SUT: peak vs peak is the fair Server comparison."""
    rows = []
    for path in sorted(Path(results).glob("*/*/Server/find-peak/latest/peak.json")):
        p = json.loads(path.read_text())
        peak = p["peak"] or {}
        rows.append({"sut": p["sut"], "profile": p["profile"], "peak QPS": peak.get("qps"),
                     "tokens/s": peak.get("tokens_per_s"), "TTFT p99 (ms)": peak.get("ttft_p99_ms"),
                     "TPOT p99 (ms)": peak.get("tpot_p99_ms"), "lowest INVALID QPS": p["lowest_invalid_qps"],
                     "trials": len(p["trials"]), "search": str(path.parent.resolve())})
    return pd.DataFrame(rows)


def roofline_points(run_dirs) -> pd.DataFrame:
    """Every phase of every run as (sut, scenario, phase, intensity, achieved FLOP/s, regime, and on a GPU its
    launch floor)."""
    rows = []
    for r in map(Path, run_dirs):
        if not (r / "roofline.json").is_file():
            continue
        roof, record = Roofline.load(r), RunRecord.load(r)
        for phase, v in roof.phases.items():
            rows.append({"run": str(r), "label": f"{record.sut.name} {record.config.scenario}",
                         "sut": record.sut.name, "scenario": record.config.scenario, "phase": phase,
                         "intensity": v.intensity, "achieved_flops_per_s": v.achieved_flops_per_s,
                         "fraction_of_roof": v.fraction_of_roof, "regime": v.regime, "ms": v.seconds * 1e3,
                         "launch_floor_ms": None if v.launch_floor_s is None else v.launch_floor_s * 1e3,
                         "peak_flops_per_s": roof.peaks["flops_per_s"], "peak_bytes_per_s": roof.peaks["bytes_per_s"],
                         "cache_bytes_per_s": max(roof.peaks.get("reads_by_size", {}).values(),
                                                  default=roof.peaks["bytes_per_s"]),
                         "widen_bytes_per_s": roof.peaks.get("widen_bytes_per_s") or 0.0})
    return pd.DataFrame(rows)
