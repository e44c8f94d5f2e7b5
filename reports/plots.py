"""PNG plots of a set of runs: roofline chart, latency CDFs, accepted-length histogram, speedup bars."""
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mlperf.files import atomic  # noqa: E402
from suts.engine.stats import merged_cycles  # noqa: E402
from scenarios.records import RunRecord  # noqa: E402

MARKERS = {"prefill": "s", "decode": "o", "draft": "v", "verify": "^", "cycle": "D"}


def save(fig, path: Path) -> None:
    """Write the figure as a PNG, whole or not at all."""
    atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))


def roofline(points: pd.DataFrame, path: Path) -> None:
    """Every phase of every run against the roofs measured with it: one black roof where all runs share it, else
    each run's own in its colour."""
    fig, ax = plt.subplots(figsize=(7, 5))
    x = np.logspace(np.log10(min(points["intensity"].min(), 0.1) / 2),
                    np.log10(max(points["intensity"].max(), 1e3) * 2))
    runs = list(points.groupby("run", sort=False))
    roofs = points[["peak_flops_per_s", "peak_bytes_per_s", "cache_bytes_per_s", "widen_bytes_per_s"]].drop_duplicates()
    for i, (_, group) in enumerate(runs):
        first = group.iloc[0]
        if len(roofs) == 1 and i == 0:
            draw_roof(ax, x, first, "k", "")
        elif len(roofs) > 1:
            draw_roof(ax, x, first, f"C{i}", f"{first['label']} ")
        for _, p in group.iterrows():
            ax.scatter(p["intensity"], p["achieved_flops_per_s"], color=f"C{i}", marker=MARKERS.get(p["phase"], "o"),
                       s=50, label=p["label"] if p["phase"] == first["phase"] else None)
            ax.annotate(p["phase"], (p["intensity"], p["achieved_flops_per_s"]), fontsize=7,
                        xytext=(4, 2), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="achieved FLOP/s",
           title="Roofline: every phase against the measured roofs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def draw_roof(ax, x, peaks: pd.Series, color: str, who: str) -> None:
    """A run's roof: min(peak FLOP/s, intensity x bandwidth), the faster one of reads from a cache, and on a CPU the
    ceiling of one row's pass over fp16 weights from cache (their widening, whose bytes are nearly all its bytes)."""
    peak_f, peak_b, cache_b = peaks["peak_flops_per_s"], peaks["peak_bytes_per_s"], peaks["cache_bytes_per_s"]
    widen = peaks["widen_bytes_per_s"]
    ax.plot(x, np.minimum(peak_f, x * peak_b), "-", color=color, lw=2 if color == "k" else 1,
            label=f"{who}roof: {peak_f / 1e9:.0f} GFLOP/s, {peak_b / 1e9:.0f} GB/s")
    if cache_b > peak_b:  # a phase whose bytes stay in a cache reads them faster: its roof lies between the two
        ax.plot(x, np.minimum(peak_f, x * cache_b), ":", color=color, lw=1,
                label=f"{who}reads from cache: {cache_b / 1e9:.0f} GB/s")
    if peak_b < widen < cache_b:  # fp16 weights from cache come faster than they are widened
        ax.plot(x, np.minimum(peak_f, x * widen), "-.", color=color, lw=1,
                label=f"{who}fp16 weights widened: {widen / 1e9:.0f} GB/s")


def latency_cdfs(run_dirs, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for run in run_dirs:
        r = RunRecord.load(run)
        label = f"{r.sut.name} {r.config.scenario}"
        for ax, key in zip(axes, ("ttft_s", "latency_s")):
            values = np.sort([getattr(s, key) * 1e3 for s in r.samples])
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=label)
    for ax, title in zip(axes, ("time to first token", "sample latency")):
        ax.set(xscale="log", xlabel="ms", ylabel="fraction of samples", title=title)
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def accepted_histogram(run_dirs, path: Path) -> bool:
    """Cycles by number of accepted drafts, per speculative run; False when there is none."""
    hists = {}
    for run in run_dirs:
        r = RunRecord.load(run)
        cycles = merged_cycles(r.stats)
        if cycles:  # every gamma the cycles used, by accepted drafts
            hist = np.zeros(max(cycles) + 1)
            for counts in cycles.values():
                hist[:len(counts)] += counts
            hists[f"{r.sut.name} {r.config.scenario}"] = hist
    if not hists:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(hists)
    for i, (label, h) in enumerate(hists.items()):
        ax.bar(np.arange(len(h)) + i * width, h / h.sum(), width, label=label)
    ax.set(xlabel="draft tokens accepted in a cycle", ylabel="fraction of cycles", title="Accepted length per cycle")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
    return True


def speedup_bars(table: pd.DataFrame, path: Path) -> None:
    pivot = table.pivot_table(index="scenario", columns="sut", values="speedup")
    ax = pivot.plot.bar(figsize=(7, 4), rot=0)
    ax.axhline(1.0, color="k", lw=1)
    ax.set(ylabel="tokens/s relative to baseline", title="Speedup over the baseline, per scenario")
    ax.figure.tight_layout()
    save(ax.figure, path)
    plt.close(ax.figure)


def sweep_plot(table: pd.DataFrame, summary: dict, path: Path) -> None:
    """Tokens/s against batch per SUT (LoadGen's, with the prediction dashed), and each speculative SUT's
    speedup over the baseline at the same batch, measured against predicted."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    batches = list(table.index)
    suts = [c.removesuffix(" tokens/s") for c in table.columns if c.endswith(" tokens/s")]
    for i, sut in enumerate(suts):
        left.plot(batches, table[f"{sut} tokens/s"], "o-", color=f"C{i}", label=f"{sut} (LoadGen)")
        predicted = summary["predicted_tokens_per_s"].get(sut)  # none for a server that reports no steps
        if predicted:
            left.plot(batches, [predicted[b] for b in batches], "--", color=f"C{i}", alpha=0.6,
                      label=f"{sut} predicted")
        if sut == "baseline":
            continue
        right.plot(batches, table[f"{sut} speedup"], "o-", color=f"C{i}", label=f"{sut} measured")
        if predicted:
            right.plot(batches, table[f"{sut} predicted"], "--", color=f"C{i}", alpha=0.6, label=f"{sut} predicted")
        cross = summary["crossover"][sut]["measured"]
        if cross:
            right.axvline(cross, color=f"C{i}", lw=0.8, ls=":")
    right.axhline(1.0, color="k", lw=1)
    left.set(xscale="log", yscale="log", xlabel="max batch (Offline)", ylabel="tokens/s", title="throughput")
    right.set(xscale="log", xlabel="max batch (Offline)", ylabel="speculative / baseline tokens/s",
              title="where speculative decoding stops paying")
    for ax in (left, right):
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def pareto_plot(points: pd.DataFrame, stops: dict, path: Path) -> None:
    """Per SUT, per-user tokens/s against total tokens/s, a point per concurrency (labelled), each speculative
    SUT's first point that no longer beats the baseline ringed; beside it, total tokens/s over the baseline's by
    concurrency."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    total = points.pivot(index="concurrency", columns="sut", values="total tokens/s")
    for i, (sut, curve) in enumerate(points.groupby("sut", sort=False)):
        curve = curve.sort_values("concurrency")
        left.plot(curve["total tokens/s"], curve["per-user tokens/s"], "o-", color=f"C{i}", label=sut)
        for _, p in curve.iterrows():
            left.annotate(str(p["concurrency"]), (p["total tokens/s"], p["per-user tokens/s"]), fontsize=7,
                          xytext=(3, 3), textcoords="offset points", color=f"C{i}")
        if sut == "baseline":
            continue
        right.plot(total.index, total[sut] / total["baseline"], "o-", color=f"C{i}", label=sut)
        if stops.get(sut):
            at = curve[curve["concurrency"] == stops[sut]].iloc[0]
            left.scatter(at["total tokens/s"], at["per-user tokens/s"], s=180, facecolors="none", edgecolors="k",
                         label=f"{sut} stops paying (concurrency {stops[sut]})")
            right.axvline(stops[sut], color=f"C{i}", lw=0.8, ls=":")
    right.axhline(1.0, color="k", lw=1)
    left.set(xlabel="total tokens/s (LoadGen)", ylabel="tokens/s per user (1 / mean time per output token)",
             title="per-user against total, a point per concurrency")
    right.set(xscale="log", xlabel="concurrency (queries in flight)", ylabel="total tokens/s / the baseline's",
              title="where speculative decoding stops paying")
    right.set_xticks(list(total.index), [str(c) for c in total.index])
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def qps_plot(table: pd.DataFrame, limits_ms: dict, path: Path) -> None:
    """Against the offered load, per SUT: p99 TTFT and p99 TPOT beside their limits, and goodput beside throughput
    (the gap is the tokens of queries that missed a limit)."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for i, (sut, points) in enumerate(table.groupby("sut", sort=False)):
        points = points.sort_values("qps")
        axes[0].plot(points["qps"], points["ttft_p99_ms"], "o-", color=f"C{i}", label=sut)
        axes[1].plot(points["qps"], points["tpot_p99_ms"], "o-", color=f"C{i}", label=sut)
        axes[2].plot(points["qps"], points["goodput_tokens_per_s"], "o-", color=f"C{i}", label=f"{sut} goodput")
        axes[2].plot(points["qps"], points["tokens_per_s"], "--", color=f"C{i}", alpha=0.6, label=f"{sut} tokens/s")
    for ax, key, what in ((axes[0], "ttft_latency", "p99 TTFT (ms)"), (axes[1], "tpot_latency", "p99 TPOT (ms)")):
        ax.axhline(limits_ms[key], color="k", lw=1, ls=":", label=f"limit {limits_ms[key]:g} ms")
        ax.set(yscale="log", ylabel=what, title=what.replace(" (ms)", ""))
    axes[2].set(ylabel="tokens/s", title="goodput (queries within both limits)")
    loads = sorted(table["qps"].unique())
    for ax in axes:
        ax.set(xscale="log", xlabel="offered load (QPS, LoadGen Server)")
        ax.set_xticks(loads, [f"{q:g}" for q in loads])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def whatif_plot(df: pd.DataFrame, path: Path, gate: float) -> None:
    """Decode speedup over the fp16 baseline against the set acceptance: measured (solid) and the roofline's
    prediction (dashed), a line per model pair and gamma, the gate and break-even (1x) drawn, each line's measured
    break-even acceptance marked."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, ((pair, gamma), rows) in enumerate(df.groupby(["pair", "gamma"])):
        rows = rows.sort_values("acceptance")
        ax.plot(rows["acceptance"], rows["decode speedup"], "o-", color=f"C{i}", label=f"{pair}, gamma {gamma}")
        ax.plot(rows["acceptance"], rows["predicted decode speedup"], "--", color=f"C{i}", alpha=0.6)
        even = df.attrs.get("break_even", {}).get(f"{pair} gamma {gamma}", {}).get("measured")
        if even is not None and not math.isnan(even):
            ax.plot([even], [1.0], "x", color=f"C{i}", ms=9, mew=2)
    ax.axhline(gate, color="g", lw=1, ls=":", label=f"the smoke gate ({gate}x)")
    ax.axhline(1.0, color="k", lw=1, label="break-even (x: where a line crosses it)")
    ax.plot([], [], "k--", alpha=0.6, label="roofline's prediction")
    ax.set(xlabel="set acceptance (one conditional rate at every draft position)",
           ylabel="decode tokens/s over the fp16 baseline's",
           title="Where speculation pays here (synthetic acceptance: the mechanism, not a drafter)")
    ax.title.set_fontsize(9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
