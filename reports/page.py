"""The report's HTML page: per model, headline cards, predicted against measured speedup, the figures, and the
tables in boxes of their own that scroll sideways, so the page itself fits a phone's width."""
import base64
import html
from pathlib import Path

import pandas as pd

STYLE = """
body{font-family:system-ui,sans-serif;margin:0 auto;padding:1em;max-width:1200px;color:#222;line-height:1.4}
h1{font-size:1.6em} h2{font-size:1.3em;margin-top:1.6em} h3{font-size:1.05em}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(230px,1fr));gap:12px}
.card{border:1px solid #ccd;border-radius:8px;padding:10px 12px;background:#f8f9fc}
.card .title{font-weight:600} .card .big{font-size:1.7em;font-weight:600}
.card dl{display:grid;grid-template-columns:auto auto;gap:2px 10px;margin:6px 0 0;font-size:.9em}
.card dd{margin:0;text-align:right}
.valid{color:#176b2c;font-weight:600} .invalid{color:#a11;font-weight:600}
.scroll{overflow-x:auto;max-width:100%;border:1px solid #eee}
table{border-collapse:collapse;font-size:14px} td,th{border:1px solid #ccc;padding:4px 8px;white-space:nowrap}
th{background:#f0f2f6;text-align:left} td{text-align:right}
img{max-width:100%;height:auto} .meta{overflow-wrap:anywhere}
"""
PERCENT = ("acceptance", "of roof")
SPEEDUPS = ("speedup", "predicted speedup", "measured decode speedup")


def shown(v, column: str) -> str:
    """A cell as people read it: percentages for fractions, 1.38x for speedups, three figures for the rest (whole
    numbers from 1000)."""
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        if column in PERCENT:
            return f"{100 * v:.1f}%"
        if column in SPEEDUPS:
            return f"{v:.2f}x"
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return str(v)


def table_html(df: pd.DataFrame) -> str:
    """A table in a box of its own that scrolls sideways."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(shown(v, c))}</td>" for c, v in zip(df.columns, row))
                   + "</tr>" for row in df.itertuples(index=False))
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"


def card(row: pd.Series) -> str:
    """One run's headline: tokens/s, its speedup over the baseline of the same model and machine, TTFT and TPOT
    at the percentile LoadGen judged, acceptance and validity; a run at synthetic acceptance, its set rates."""
    validity = str(row["validity"])
    verdict = f"<span class='{'valid' if validity == 'VALID' else 'invalid'}'>{html.escape(validity)}</span>"
    ms = lambda v: f"{shown(v, '')} ms" if shown(v, "") else "-"  # noqa: E731 (Offline logs no token latencies)
    facts = {"speedup": shown(row["speedup"], "speedup") or "no matching baseline",
             f"TTFT {row['judged at']}": ms(row["TTFT judged (ms)"]),
             f"TPOT {row['judged at']}": ms(row["TPOT judged (ms)"]),
             "acceptance": shown(row["acceptance"], "acceptance") or "-",
             "validity": verdict}
    if isinstance(row.get("synthetic acceptance"), str):  # the mechanism measured, not the drafter: said on its card
        facts["set"] = f"{row['synthetic acceptance']} (not the drafter's quality)"
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{v if k == 'validity' else html.escape(v)}</dd>"
                    for k, v in facts.items())
    return (f"<div class='card'><div class='title'>{html.escape(row['sut'])} · {html.escape(row['scenario'])}</div>"
            f"<div class='big'>{row['tokens/s']:.1f} <small>tokens/s</small></div><dl>{items}</dl></div>")


def image(title: str, png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode()
    return f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>"


def page(sections: list[str], machine: str) -> str:
    """The whole page: sections already rendered, the renderer's machine named as such."""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>Benchmark report</title>
<style>{STYLE}</style></head><body>
<h1>Benchmark report</h1><p class="meta">Each run names the machine it ran on; this page was written on
{html.escape(machine)}.</p>
{"".join(sections)}</body></html>
"""
