"""Scaling across Ray replicas: Offline tokens/s at each replica count, beside one process on the same cores.

    python -m mlperf scale --sut spec --replica-counts 1,2,4 [--threads T] [--samples N]

Count n runs n replicas of T torch threads each (default: this machine's cores over the largest count), and one
process of n x T threads (the single-process engine on the same cores). Scaling efficiency is n replicas'
tokens/s over n times one replica's. Every run decodes the same samples (LoadGen Offline, min_duration 0), each
in a child process kept under results/scale/<time>/runs; the table is scale.csv, the plot scale.png.
"""
import os
from dataclasses import replace
from pathlib import Path

import pandas as pd

from commands.children import kept_apart, run_child
from commands.sweep import series_folder
from reports.loadgen import headline
from scenarios.config import RunConfig
from scenarios.records import RunRecord
from scenarios.run import point_latest
from scenarios.scenario import Offline

COUNTS = (1, 2)


def scale(cfg: RunConfig, counts=COUNTS, samples: int = 128) -> Path:
    if sorted(set(counts)) != list(counts) or counts[0] != 1:
        raise ValueError(f"replica counts must rise from 1 without repeats (efficiency is against one replica), "
                         f"got {','.join(map(str, counts))}")
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // counts[-1])
    if cfg.ray_address is None and counts[-1] * threads > (os.cpu_count() or 1):
        raise ValueError(f"{counts[-1]} replicas x {threads} threads need {counts[-1] * threads} cores; this machine "
                         f"has {os.cpu_count()} (join a cluster with --ray-address, or lower --threads)")
    cfg = replace(cfg, scenario=Offline(), mode="performance", samples=samples, threads=threads)
    replace(cfg, replicas=counts[-1]).validate()
    final, work, conf = series_folder(cfg, "scale", samples)
    print(f"scale: {cfg.sut} through LoadGen Offline, {samples} samples x {cfg.max_new_tokens} new tokens, at "
          f"{', '.join(map(str, counts))} replicas of {threads} threads, each beside one process on the same cores",
          flush=True)
    rows = []
    with kept_apart(work, final, lambda: "the scaling runs"):
        for n in counts:
            runs = {"replicas": replace(cfg, replicas=n), "one process": replace(cfg, threads=n * threads,
                                                                                 ray_address=None)}
            row = {"replicas": n, "threads each": threads, "cores": n * threads}
            for what, run_cfg in runs.items():
                out = work / "runs" / f"{'r' if run_cfg.replicas else 'p'}{n}"
                run_child(replace(run_cfg, run_dir=str(out), user_conf=str(conf)), f"{what} at {n * threads} cores")
                table = headline(out)
                row[f"{what} tokens/s"] = table.tokens_per_s
                row[f"{what} validity"] = table.validity
                if run_cfg.replicas:
                    row["reissued"] = RunRecord.load(out).replicas["reissued"]
                print(f"  {n * threads:3d} cores  {what:12s} {table.tokens_per_s:8.1f} tokens/s  {table.validity}",
                      flush=True)
            rows.append(row)
    frame = pd.DataFrame(rows)
    frame["efficiency"] = frame["replicas tokens/s"] / (frame["replicas"] * frame["replicas tokens/s"].iloc[0])
    frame["replicas / one process"] = frame["replicas tokens/s"] / frame["one process tokens/s"]
    frame.to_csv(work / "scale.csv", index=False)
    plot(frame, cfg.sut, work / "scale.png")
    with pd.option_context("display.width", 200, "display.float_format", "{:.2f}".format):
        print(frame.to_string(index=False))
    work.rename(final)
    point_latest(final)
    return final


def plot(frame: pd.DataFrame, sut: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(frame["cores"], frame["replicas"] * frame["replicas tokens/s"].iloc[0], ":", color="grey",
            label="n x one replica (ideal)")
    ax.plot(frame["cores"], frame["replicas tokens/s"], "o-", label="replicas")
    ax.plot(frame["cores"], frame["one process tokens/s"], "s-", label="one process, same cores")
    for _, r in frame.iterrows():
        ax.annotate(f"{r['efficiency']:.2f}", (r["cores"], r["replicas tokens/s"]), textcoords="offset points",
                    xytext=(4, -12), fontsize=8)
    ax.set(xlabel="cores", ylabel="tokens/s (LoadGen Offline)", title=f"{sut}: replicas against one process")
    ax.set_xticks(list(frame["cores"]))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
