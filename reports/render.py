"""The report: per model, headline cards, the comparison table, predicted against measured speedup, plots and
roofline points, as one self-contained HTML page (reports/page.py) and a Markdown file.

    python -m mlperf report [RUN_DIR ...]     # default: the latest performance run of every model x SUT x scenario
"""
import html
from pathlib import Path

import pandas as pd

from mlperf import env
from mlperf.files import write_text
from reports import page, plots
from reports.tables import comparison, find_runs, peak_table, replica_table, roofline_points
from scenarios.logs import check_complete
from scenarios.records import RunRecord


def markdown_table(df: pd.DataFrame) -> str:
    """A table as summary.md shows it, each cell as the page shows it (reports/page.py: shown)."""
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(page.shown(v, c) for c, v in zip(df.columns, row)) + " |"
              for row in df.itertuples(index=False)]
    return "\n".join(lines)


COMPARISON = ["sut", "scenario", "tokens/s", "speedup", "QPS", "TTFT p50 (ms)", "TTFT p90 (ms)", "TTFT p99 (ms)",
              "TPOT p50 (ms)", "TPOT p90 (ms)", "acceptance", "acceptance length", "synthetic acceptance", "validity",
              "batch", "replicas", "weights", "device", "compared with"]
RUNS = ["sut", "scenario", "checkpoints", "weights", "dtype", "device", "machine", "date", "run"]
ROOF = {"sut": "sut", "scenario": "scenario", "phase": "phase", "ms": "ms", "intensity": "FLOP/byte",
        "achieved GFLOP/s": "achieved GFLOP/s", "fraction_of_roof": "of roof", "regime": "regime",
        "launch_floor_ms": "launch floor (ms)"}
SERIES = {"Batch sweep (make sweep)": "sweep/latest/sweep.png",
          "Concurrency Pareto curves (make pareto)": "pareto/latest/pareto.png",
          "Server loads (make qps-sweep)": "qps-sweep/latest/qps-sweep.png",
          "Ray replicas (make scale)": "scale/latest/scale.png",
          "Where speculation pays, at synthetic acceptance: the mechanism, not a drafter (make whatif)":
          "whatif/latest/whatif.png"}


def figures(runs: list, points: pd.DataFrame, table: pd.DataFrame, out: Path, n: int) -> dict[str, Path]:
    """A model's PNGs (roofline, latency CDFs, accepted lengths, speedups) in `out`, numbered by model."""
    pngs = {}
    if not points.empty:
        plots.roofline(points, out / f"roofline-{n}.png")
        pngs["Roofline: each run against its own roofs"] = out / f"roofline-{n}.png"
    plots.latency_cdfs(runs, out / f"latency_cdf-{n}.png")
    pngs["Latency CDFs"] = out / f"latency_cdf-{n}.png"
    if plots.accepted_histogram(runs, out / f"accepted_hist-{n}.png"):
        pngs["Accepted tokens per cycle"] = out / f"accepted_hist-{n}.png"
    if table["speedup"].notna().any():
        plots.speedup_bars(table, out / f"speedup-{n}.png")
        pngs["Speedup over the baseline"] = out / f"speedup-{n}.png"
    return pngs


def roof_table(points: pd.DataFrame) -> pd.DataFrame:
    """Each run's phases against their roofs, under readable headers (a GPU's launch floor only where it has one)."""
    if points.empty:
        return points
    points = points.assign(**{"achieved GFLOP/s": points["achieved_flops_per_s"] / 1e9})
    columns = [c for c in ROOF if c != "launch_floor_ms" or points[c].notna().any()]
    return points[columns].rename(columns=ROOF)


def predictions(table: pd.DataFrame) -> pd.DataFrame:
    """Each speculative run's decode speedup as predicted from its measured acceptance per draft position and its
    measured costs, beside the one measured against the baseline."""
    spec = table[table["predicted speedup"].notna()]
    return spec[["sut", "scenario", "acceptance", "acceptance length", "predicted speedup", "measured decode speedup"]]


def model_section(model: str, table: pd.DataFrame, out: Path, n: int) -> tuple[str, list[str]]:
    """One model's HTML section and its Markdown lines."""
    runs = list(table["run"])
    points = roofline_points(runs)
    pngs = figures(runs, points, table, out, n)
    shown = table[[c for c in COMPARISON if c in table]].dropna(axis=1, how="all")
    roof, predicted = roof_table(points), predictions(table)
    parts = [f"<h2>Model: {html.escape(model)}</h2>",
             "<div class='cards'>" + "".join(page.card(row) for _, row in table.iterrows()) + "</div>",
             "<h3>Comparison</h3>", page.table_html(shown)]
    md = [f"## Model: {model}\n", markdown_table(shown), ""]
    if not predicted.empty:
        parts += ["<h3>Predicted against measured decode speedup</h3>", page.table_html(predicted)]
        md += ["### Predicted against measured decode speedup\n", markdown_table(predicted), ""]
    parts += [page.image(title, png) for title, png in pngs.items()]
    md += [f"![{title}]({png.name})\n" for title, png in pngs.items()]
    if not roof.empty:
        parts += ["<h3>Roofline per phase</h3>", page.table_html(roof)]
        md += ["### Roofline per phase\n", markdown_table(roof), ""]
    parts += ["<h3>Runs</h3>", page.table_html(table[RUNS])]
    md += ["### Runs\n", markdown_table(table[RUNS]), ""]
    return "".join(parts), md


def build(run_dirs, out: Path, results="results") -> Path:
    """Write index.html, summary.md and the PNGs into `out`, a section per model; returns the HTML path. Server
    peak searches, Ray replicas and the latest sweeps under `results` get sections of their own."""
    if not run_dirs:
        raise ValueError("no runs to report: run `make run` first, or name run directories")
    out.mkdir(parents=True, exist_ok=True)
    table = comparison(run_dirs)
    sections, md = [], ["# Benchmark report\n"]
    for n, (model, runs) in enumerate(table.groupby("model", sort=True), 1):
        html_part, md_part = model_section(model, runs.reset_index(drop=True), out, n)
        sections.append(html_part)
        md += md_part
    peaks, replicas = peak_table(results), replica_table(run_dirs)
    if not peaks.empty:
        sections += ["<h2>Server peak (highest VALID QPS under the same constraints)</h2>", page.table_html(peaks)]
        md += ["## Server peak (highest VALID QPS under the same constraints)\n", markdown_table(peaks), ""]
    if not replicas.empty:
        sections += ["<h2>Ray replicas</h2>", page.table_html(replicas)]
        md += ["## Ray replicas\n", markdown_table(replicas), ""]
    series = {title: Path(results) / png for title, png in SERIES.items() if (Path(results) / png).is_file()}
    sections += [page.image(title, png) for title, png in series.items()]
    md += [f"![{title}]({png.resolve()})\n" for title, png in series.items()]
    write_text(out / "summary.md", "\n".join(md) + "\n")
    machine = f"{env.machine()}; " + ", ".join(f"{k} {v}" for k, v in env.versions().items())
    write_text(out / "index.html", page.page(sections, machine))
    return out / "index.html"


def main(args) -> None:
    runs, passed = [Path(r) for r in args.runs], []
    if not runs:  # every latest run this version reads; an older version's are passed over, one line each
        for r in find_runs(args.results):
            try:
                RunRecord.load(r)
                runs.append(r)
            except ValueError as e:
                passed.append(r)
                print(f"passed over: {e}")
        if passed and not runs:
            raise ValueError(f"no runs to report: the {len(passed)} latest run(s) under {args.results} were passed "
                             "over (above); run them again")
    for r in runs:  # a directory named by hand may be anything: each must be a whole run
        config = RunRecord.load(r).config
        check_complete(r, config.scenario, config.mode)
    page = build(runs, Path(args.out), args.results)
    print(f"wrote {page} and {page.parent / 'summary.md'} ({len(runs)} runs)")
