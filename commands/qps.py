"""QPS sweep: each SUT through LoadGen Server at a range of loads, and what each load costs its users: p99 TTFT,
p99 TPOT, SLO attainment and goodput (tokens/s of the queries that met both limits) against QPS, all SUTs on one
figure.

Every point is an ordinary Server run in a fresh process (the peak search's trial), under the profile's fixed
limits; loads go in turn, every SUT at one load before the next, so that drift hits every SUT alike.

    python -m mlperf qps-sweep [--sut baseline --sut spec] [--loads 0.25,0.5,1,2] [--profile quick]
"""
import json
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from commands.children import kept_apart
from commands.peak import run_trial
from reports.plots import qps_plot
from scenarios.config import RunConfig
from scenarios.records import RunRecord
from scenarios.run import claim, point_latest
from scenarios.scenario import Server

LOADS = (0.25, 0.5, 1.0, 2.0)
SUTS = ("baseline", "spec", "spec-auto")


def qps_sweep(cfg: RunConfig, suts=SUTS, loads=LOADS) -> Path:
    """Run the sweep, print and write its table (qps-sweep.csv, qps-sweep.json) and figure (qps-sweep.png)."""
    if not loads or any(not 0 < q < float("inf") for q in loads) or sorted(set(loads)) != list(loads):
        raise ValueError(f"loads must be positive and rising without repeats, got {loads}")
    cfg = replace(cfg, scenario=Server(), mode="performance")
    for sut in suts:
        replace(cfg, sut=sut, qps=loads[-1]).validate()
    final, work = claim(Path(cfg.results) / "qps-sweep")
    (work / "runs").mkdir()
    print(f"qps-sweep: {', '.join(suts)} through LoadGen Server at {', '.join(f'{q:g}' for q in loads)} QPS, "
          f"profile {cfg.profile}", flush=True)
    rows = []
    with kept_apart(work, final, lambda: f"the QPS sweep ({len(rows)} runs)"):
        for qps in loads:
            for sut in suts:
                trial = run_trial(replace(cfg, sut=sut), qps, work, f"runs/{sut}-qps-{qps:g}")
                rows.append({"sut": sut, **asdict(trial)})
                print(f"  {sut:14s} {trial.line()}", flush=True)
    table = pd.DataFrame(rows)
    record = RunRecord.load(work / rows[0]["run_dir"])
    limits = {key: float(record.settings[key]) for key in ("ttft_latency", "tpot_latency")}
    table.to_csv(work / "qps-sweep.csv", index=False)
    (work / "qps-sweep.json").write_text(json.dumps({"limits_ms": limits, "machine": record.machine,
                                                     "versions": record.versions, "config": asdict(cfg),
                                                     "points": rows}, indent=1) + "\n")
    qps_plot(table, limits, work / "qps-sweep.png")
    work.rename(final)
    point_latest(final)
    return final
