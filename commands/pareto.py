"""Concurrency Pareto curves: each SUT through LoadGen Offline with 1, 2, 3, ... queries in flight, per-user
tokens/s against total tokens/s, and the concurrency where speculative decoding stops paying.

A point is an ordinary Offline performance run in a fresh process with `max_batch` = its concurrency: LoadGen
issues every sample at once and the SUT (or, with --endpoint, the client, which keeps that many requests open)
decodes at most that many together, as MLPerf Endpoints' concurrency-bounded load does. Every run decodes the
same samples. A user's tokens/s is one over the point's mean time per output token after the first (what a reader
of one stream sees); the total is LoadGen's tokens/s. Concurrencies go in turn, every SUT at one before the next.

    python -m mlperf pareto [--concurrency 1,2,3,4,6,8,12,16] [--sut baseline --sut spec] [--samples 32]
"""
from dataclasses import replace
from pathlib import Path

import pandas as pd

from commands.children import kept_apart, run_child
from commands.sweep import offline_series, series_folder, sut_config
from mlperf.files import write_json
from reports.loadgen import headline
from reports.plots import pareto_plot
from scenarios.config import RunConfig
from scenarios.records import RunRecord
from scenarios.run import point_latest

CONCURRENCY = (1, 2, 3, 4, 6, 8, 12, 16)
MIN_POINTS = 7  # MLPerf Endpoints' least number of concurrency points on a curve
SUTS = ("baseline", "spec")


def pareto(cfg: RunConfig, suts=SUTS, concurrency=CONCURRENCY, samples: int = 32) -> Path:
    """Run every SUT at every concurrency; write pareto.csv, pareto.json and pareto.png; return the folder."""
    if "baseline" not in suts:
        raise ValueError("the curves are read against the baseline: include --sut baseline")
    if sorted(set(concurrency)) != list(concurrency) or len(concurrency) < MIN_POINTS or concurrency[0] < 1:
        raise ValueError(f"concurrency must be at least {MIN_POINTS} positive points, rising without repeats, got "
                         f"{list(concurrency)}")
    if samples < max(concurrency):
        raise ValueError(f"--samples {samples} cannot keep {max(concurrency)} queries in flight: give at least that")
    cfg, suts = offline_series(cfg, suts, samples, max(concurrency), "pareto")
    final, work, conf = series_folder(cfg, "pareto", samples)
    print(f"pareto: {', '.join(suts)} through LoadGen Offline at concurrency {', '.join(map(str, concurrency))}; "
          f"{samples} samples x {cfg.max_new_tokens} new tokens each", flush=True)
    rows = []
    with kept_apart(work, final, lambda: "the Pareto sweep"):
        for users in concurrency:
            for sut in suts:
                out = work / "runs" / f"{sut}-c{users}"
                run_child(replace(sut_config(cfg, sut, users), run_dir=str(out), user_conf=str(conf)),
                          f"{sut} at concurrency {users}")
                rows.append(point(out, sut, users))
                print(f"  concurrency {users:3d}  {sut:14s} {rows[-1]['total tokens/s']:8.1f} tokens/s in all, "
                      f"{rows[-1]['per-user tokens/s']:7.1f} per user  {rows[-1]['validity']}", flush=True)
    write(work, pd.DataFrame(rows))
    work.rename(final)
    point_latest(final)
    return final


def point(run_dir: Path, sut: str, users: int) -> dict:
    """One run's place on its SUT's curve: LoadGen's total tokens/s, and a user's (one over the mean time per
    output token after the first)."""
    record, line = RunRecord.load(run_dir), headline(run_dir)
    decode_s = sum(s.latency_s - s.ttft_s for s in record.samples)
    later = sum(s.stats.n_tokens - 1 for s in record.samples)
    return {"sut": sut, "concurrency": users, "total tokens/s": line.tokens_per_s,
            "per-user tokens/s": later / decode_s if decode_s > 0 else float("nan"), "validity": line.validity,
            "run": f"runs/{run_dir.name}"}


def stops_paying(points: pd.DataFrame, figure: str = "total tokens/s") -> dict[str, int | None]:
    """Each speculative SUT's lowest concurrency whose `figure` (total or per-user tokens/s) is no more than the
    baseline's there (None: it pays at every point measured)."""
    value = points.pivot(index="concurrency", columns="sut", values=figure)
    return {sut: next((int(c) for c in value.index if value.loc[c, sut] <= value.loc[c, "baseline"]), None)
            for sut in value.columns if sut != "baseline"}


def write(folder: Path, points: pd.DataFrame) -> None:
    """The curves as a CSV, a JSON summary and a figure; one line each on where speculation stops paying."""
    points.to_csv(folder / "pareto.csv", index=False)
    stops, users_lose = stops_paying(points), stops_paying(points, "per-user tokens/s")
    write_json(folder / "pareto.json", {"stops_paying": stops, "per_user_stops_paying": users_lose,
                                        "points": points.to_dict(orient="records")})
    pareto_plot(points, stops, folder / "pareto.png")
    for sut, users in stops.items():
        print(f"{sut}: " + (f"stops paying at concurrency {users} (total tokens/s no more than the baseline's)"
                            if users else "pays at every concurrency measured"))
        lose = users_lose[sut]
        print(f"{sut}: " + (f"a user's tokens/s no more than the baseline's from concurrency {lose}" if lose else
                            "a user's tokens/s above the baseline's at every concurrency measured"))
