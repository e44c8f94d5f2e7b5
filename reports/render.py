"""The report: comparison table, plots and roofline points as one self-contained HTML page and a Markdown file.

    python -m mlperf report [RUN_DIR ...]     # default: the latest performance run of every SUT x scenario
"""
import base64
import html
from pathlib import Path

import pandas as pd

from mlperf import env
from mlperf.files import write_text
from reports import plots
from reports.tables import comparison, find_runs, peak_table, replica_table, roofline_points
from scenarios.logs import check_complete
from scenarios.records import RunRecord


def three_figures(v: float) -> str:
    """A table's number as the report shows it: three significant figures."""
    return f"{v:.3g}"


def markdown_table(df: pd.DataFrame) -> str:
    fmt = lambda v: ("" if v != v else three_figures(v)) if isinstance(v, float) else ("" if v is None else str(v))
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def build(run_dirs, out: Path, results="results") -> Path:
    """Write index.html, summary.md and the PNGs into `out`; returns the HTML path. Server peak searches under
    `results` get a table of their own (peak vs peak)."""
    if not run_dirs:
        raise ValueError("no runs to report: run `make run` first, or name run directories")
    out.mkdir(parents=True, exist_ok=True)
    table = comparison(run_dirs)
    points = roofline_points(run_dirs)
    pngs = {}
    if not points.empty:
        plots.roofline(points, out / "roofline.png")
        pngs["Roofline"] = "roofline.png"
    plots.latency_cdfs(run_dirs, out / "latency_cdf.png")
    pngs["Latency CDFs"] = "latency_cdf.png"
    if plots.accepted_histogram(run_dirs, out / "accepted_hist.png"):
        pngs["Accepted tokens per cycle"] = "accepted_hist.png"
    if table["speedup"].notna().any():
        plots.speedup_bars(table, out / "speedup.png")
        pngs["Speedup"] = "speedup.png"
    shown = table.drop(columns=["run"])
    peaks = peak_table(results)
    replicas = replica_table(run_dirs)
    roof_cols = ["sut", "scenario", "phase", "ms", "intensity", "achieved_flops_per_s", "fraction_of_roof", "regime"]
    if not points.empty and points["launch_floor_ms"].notna().any():  # runs on a GPU
        roof_cols.append("launch_floor_ms")
    roof = points[roof_cols] if not points.empty else points
    machine = f"{env.machine()}; " + ", ".join(f"{k} {v}" for k, v in env.versions().items())

    md = [f"# Benchmark report\n\nMachine: {machine}\n", "## Comparison\n", markdown_table(shown), ""]
    if not peaks.empty:
        md += ["## Server peak (highest VALID QPS under the same constraints)\n", markdown_table(peaks), ""]
    if not replicas.empty:
        md += ["## Ray replicas\n", markdown_table(replicas), ""]
    if not roof.empty:
        md += ["## Roofline per phase\n", markdown_table(roof), ""]
    md += [f"![{title}]({name})\n" for title, name in pngs.items()]
    md += ["Runs:\n"] + [f"- `{r}`" for r in run_dirs]
    write_text(out / "summary.md", "\n".join(md) + "\n")

    images = "".join(
        f"<h2>{title}</h2><img alt='{title}' src='data:image/png;base64,"
        f"{base64.b64encode((out / name).read_bytes()).decode()}'>" for title, name in pngs.items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Benchmark report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}} img{{max-width:100%}}</style></head><body>
<h1>Benchmark report</h1><p>Machine: {html.escape(machine)}</p>
<h2>Comparison</h2>{shown.to_html(index=False, float_format=three_figures, na_rep="")}
{"" if peaks.empty else "<h2>Server peak</h2>" + peaks.to_html(index=False, float_format=three_figures, na_rep="")}
{"" if replicas.empty else "<h2>Ray replicas</h2>" + replicas.to_html(index=False, na_rep="")}
{"" if roof.empty else "<h2>Roofline per phase</h2>" + roof.to_html(index=False, float_format=three_figures)}
{images}<h2>Runs</h2><ul>{"".join(f"<li>{html.escape(str(r))}</li>" for r in run_dirs)}</ul></body></html>
"""
    write_text(out / "index.html", page)
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
