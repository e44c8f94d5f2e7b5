"""What `python -m mlperf whatif` prints and writes of its points: each point beside the roofline's prediction
(roofline/whatif.py), the break-even acceptance measured and predicted, the seed's claim beside its point, llama.cpp's
row beside the fp16 baseline's; whatif.csv, whatif-peers.csv and whatif.png.
"""
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd

from commands import peers
from reports.plots import whatif_plot
from roofline.whatif import Pair, best_gamma, break_even, predict
from scenarios.run import point_latest
from suts.synthetic import Acceptance

SEED_CLAIM = {"theoretical": 2.1, "practical": (1.4, 1.7)}  # the seed's own expectation at acceptance 0.7, gamma 4
GATE = 1.4  # the smoke gate's decode speedup, drawn on the figure


def streamed(pair: Pair, point: dict) -> Pair:
    """The pair as a point's run streamed it: each model's bytes per linear weight, as measured."""
    target_bytes, draft_bytes = point["weight bytes"]
    return replace(pair, target_weight_bytes=target_bytes, draft_weight_bytes=draft_bytes)


def predicted(point: dict, pair: Pair) -> dict:
    """The roofline's figures for a measured point, from the peaks it was judged against."""
    pair = streamed(pair, point)
    acceptance, peaks = Acceptance((point["acceptance"],)), point["peaks"]
    p = predict(pair, acceptance, point["gamma"], point["prefill"], point["decode"], peaks)
    return {"predicted decode speedup": p.decode_speedup, "predicted end-to-end speedup": p.end_to_end_speedup,
            "predicted verify steps": p.verify_steps, "predicted c": p.draft_ratio,
            "roofline's best gamma": best_gamma(pair, acceptance, point["prefill"], point["decode"], peaks)}


def measured_break_even(points: pd.DataFrame) -> float | None:
    """Where the measured decode speedup crosses 1 between two acceptance points (linear), else None."""
    pts = points.sort_values("acceptance")[["acceptance", "decode speedup"]].to_numpy()
    for (a0, s0), (a1, s1) in zip(pts, pts[1:]):
        if s0 < 1 <= s1:
            return float(a0 + (1 - s0) * (a1 - a0) / (s1 - s0))
    return None if len(pts) == 0 or pts[0][1] < 1 else float("nan")  # nan: pays at every point measured


def summary(df: pd.DataFrame, pairs: dict[str, Pair]) -> pd.DataFrame:
    """Each measured point beside the roofline's figures for it; the break-even acceptance per pair and gamma,
    predicted and measured, in df.attrs."""
    df = pd.concat([df, pd.DataFrame([predicted(point, pairs[point["pair"]]) for point in df.to_dict("records")],
                                     index=df.index)], axis=1)
    df.attrs["break_even"] = {}
    for (p, g), rows in df.groupby(["pair", "gamma"]):
        first = rows.iloc[0]
        df.attrs["break_even"][f"{p} gamma {g}"] = {
            "predicted": break_even(streamed(pairs[p], first), g, first["prefill"], first["decode"], first["peaks"]),
            "measured": measured_break_even(rows)}
    return df


def peer_report(df: pd.DataFrame, rows: list[dict], folder: Path) -> None:
    """llama.cpp's rows beside the fp16 baseline's decode on the same target (its TPOT, the median point's),
    printed and written to whatif-peers.csv; a line saying how to get them where there are none."""
    if not rows:
        print(peers.MISSING if not peers.available() else "llama.cpp's rows: no pair with a byte vocabulary")
        return
    ours = [{"pair": row["pair"], "engine": "ours, fp16 baseline",
             "TPOT ms": float(df[df["pair"] == row["pair"]]["baseline TPOT ms"].median())} for row in rows]
    table = pd.DataFrame(ours + rows).sort_values(["pair", "engine"], ascending=[True, False])
    table["against ours"] = [tpot / next(o["TPOT ms"] for o in ours if o["pair"] == pair)
                             for pair, tpot in zip(table["pair"], table["TPOT ms"])]
    print("plain decoding on each pair's target, seconds a token (llama.cpp's decode phase; ours, LoadGen's TPOT):")
    print(table.to_string(index=False, float_format="{:.3f}".format))
    table.to_csv(folder / "whatif-peers.csv", index=False)


def report(df: pd.DataFrame, folder: Path, name: str) -> None:
    """The table printed, whatif.csv and whatif.png written, results/whatif/latest pointed at them."""
    shown = ["pair", "gamma", "acceptance", "set acceptance length", "measured acceptance length", "decode speedup",
             "turns' range", "predicted decode speedup", "end-to-end speedup", "predicted end-to-end speedup",
             "verify steps", "predicted verify steps", "c", "predicted c", "roofline's best gamma", "baseline TPOT ms",
             "decode of roof", "verify of roof", "draft of roof", "Offline batch", "Offline speedup",
             "spec-auto's gamma", "spec-auto decode speedup"]
    turns = df.assign(**{"turns' range": [f"{lo:.2f}-{hi:.2f}" for lo, hi in
                                          zip(df["decode speedup low"], df["decode speedup high"])]})
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.3f}".format):
        print(turns[[c for c in shown if c in turns]].to_string(index=False))
    for key, even in df.attrs["break_even"].items():
        print(f"break-even acceptance, {key}: roofline {fmt(even['predicted'])}, measured {fmt(even['measured'])}")
    if name == "seed":
        row = df.iloc[0]
        print(f"the seed's claim at acceptance 0.7, gamma 4: theoretical {SEED_CLAIM['theoretical']}x, practical "
              f"{SEED_CLAIM['practical'][0]}-{SEED_CLAIM['practical'][1]}x; here the roofline predicts "
              f"{row['predicted decode speedup']:.2f}x and LoadGen measured {row['decode speedup']:.2f}x (decode), "
              f"{row['end-to-end speedup']:.2f}x end to end")
    df.drop(columns=["peaks", "weight bytes"]).to_csv(folder / "whatif.csv", index=False)
    whatif_plot(df, folder / "whatif.png", GATE)
    point_latest(folder)
    print(f"results: {folder / 'whatif.csv'}, {folder / 'whatif.png'} (synthetic acceptance: the mechanism, not a "
          "drafter's quality)")


def fmt(value) -> str:
    """A break-even acceptance as printed: None never pays, nan pays at every point measured."""
    if value is None:
        return "none (never pays)"
    return "below every point measured" if math.isnan(value) else f"{value:.3f}"
