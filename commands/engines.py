"""`python -m mlperf engines` (`make engines`): serving engines side by side under the same LoadGen tests, on the
same weights, prompts, limits and cores: our SUT in process, the same SUT behind our server over HTTP, and
llama.cpp's llama-server plain and speculative on our checkpoints converted to GGUF.

Each engine gets, each test in a child process: accuracy mode in SingleStream (greedy: the share of samples
token-identical to our baseline's), SingleStream (tokens/s, TTFT p50 and p99), Offline (tokens/s) and the Server
scenario's peak QPS under the fixed limits (find-peak). Servers are started once per engine with a slot per row
of --max-batch and stopped after. One table (engines.csv, engines.md) and one plot (engines.png); a llama.cpp
engine that dies, hangs or answers garbage is a row saying why (and its build's flags), and the others run.
"""
import json
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pandas as pd

from commands.children import ChildFailed, kept_apart, run_child
from commands.peak import find_peak
from commands.peer_build import describe
from commands.peers import PeerFailed, available, engine
from serving.server import child
from reports.loadgen import headline, latency_ms
from reports.render import markdown_table
from scenarios.logs import read_detail
from scenarios.config import RunConfig
from scenarios.records import RunRecord
from scenarios.run import claim
from scenarios.scenario import Offline, Server, SingleStream

ENGINES = ("in process", "our server", "llama-server", "llama-server spec")


@contextmanager
def started(name: str, cfg: RunConfig):
    """The run settings of engine `name` (its server started for the block): each measures the SUT spec, or
    llama.cpp's plain decoding beside it."""
    spec = replace(cfg, sut="spec")
    if name == "in process":
        yield spec
    elif name == "our server":
        with child(spec, "--max-batch", str(cfg.max_batch)) as (url, _):
            yield replace(spec, endpoint=url, sut="ours-spec")
    else:
        sut = "spec" if name.endswith("spec") else "baseline"
        with engine(replace(cfg, sut=sut, engine="llama-server", scenario=Offline())) as served:  # a slot a row
            yield replace(served, scenario=SingleStream())


def measure(cfg: RunConfig, work: Path, peak: bool) -> dict:
    """One engine's row of the table."""
    work.mkdir()
    def test(scenario: str, mode: str = "performance") -> Path:
        return run_child(replace(cfg, scenario=scenario, mode=mode, run_dir=str(work / f"{scenario}-{mode}")),
                         f"{cfg.sut} {scenario} {mode}")
    try:
        accuracy = test(SingleStream(), "accuracy")
    except ChildFailed:  # a gate that failed has still scored the run
        accuracy = work / "SingleStream-accuracy"
    scored = json.loads((accuracy / "accuracy.json").read_text())
    single, offline = test(SingleStream()), test(Offline())
    detail, record = read_detail(single), RunRecord.load(single)
    row = {"identical to baseline": scored.get("exact_match"),
           "SingleStream tokens/s": headline(single).tokens_per_s,
           "TTFT p50 (ms)": latency_ms(detail, "TTFT", "50.00"), "TTFT p99 (ms)": latency_ms(detail, "TTFT", "99.00"),
           "Offline tokens/s": headline(offline).tokens_per_s, "acceptance": acceptance(record)}
    if peak:
        search = find_peak(replace(cfg, scenario=Server(), mode="find-peak", results=str(work)))
        found = json.loads((search / "peak.json").read_text())["peak"]
        row["Server peak QPS"] = found["qps"] if found else 0.0
    return row


def acceptance(record: RunRecord) -> float | None:
    """Drafted tokens accepted, of those drafted: from our statistics, or llama.cpp's per-request timings."""
    timings = (record.endpoint or {}).get("timings")
    if timings:
        return timings["draft_n_accepted"] / timings["draft_n"]
    return record.acceptance_rate


def engines(cfg: RunConfig, names: tuple[str, ...], peak: bool = True) -> Path:
    """Every engine in `names` measured in turn; returns the directory with the table and the plot."""
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine {unknown[0]!r}; choose from {', '.join(ENGINES)}")
    if any(n.startswith("llama") for n in names) and not available():
        raise ValueError("llama-server's rows need llama.cpp: `make peers` builds it (or --engine 'in process' "
                         "--engine 'our server')")
    replace(cfg, sut="spec").validate()
    final, work = claim(Path(cfg.results) / "engines")
    rows = []
    with kept_apart(work, final, lambda: f"the comparison ({len(rows)} engines measured)"):
        for name in names:
            print(f"engines: {name} ...", flush=True)
            try:
                with started(name, cfg) as settings:
                    rows.append({"engine": name, **measure(settings, work / name.replace(" ", "-"), peak)})
            except (PeerFailed, ChildFailed) as e:
                if not name.startswith("llama"):  # our own engines' failures fail the comparison
                    raise
                rows.append({"engine": name, "failed": str(e)})
            if name.startswith("llama"):
                rows[-1]["build"] = describe()
            print("  " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in
                                   rows[-1].items()), flush=True)
    table = pd.DataFrame(rows).set_index("engine")
    table.to_csv(work / "engines.csv")
    header = (f"{cfg.weights} weights, {cfg.samples or 'all'} prompts x {cfg.max_new_tokens} tokens, max batch "
              f"{cfg.max_batch}, threads {cfg.threads or 'default'}, profile {cfg.profile}")
    (work / "engines.md").write_text(f"# Engines side by side\n\n{header}\n\n{markdown_table(table.reset_index())}\n")
    plot(table, work / "engines.png", header)
    work.rename(final)
    print(f"\n{header}\n{table.to_string(float_format=lambda v: f'{v:.3f}')}")
    return final


def plot(table: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figures = [c for c in ("SingleStream tokens/s", "Offline tokens/s", "Server peak QPS") if c in table]
    if not figures:  # every engine failed: their rows say why
        return
    fig, axes = plt.subplots(1, len(figures), figsize=(4.5 * len(figures), 3.8))
    for ax, column in zip(axes if len(figures) > 1 else [axes], figures):
        ax.bar(range(len(table)), table[column], color=[f"C{i}" for i in range(len(table))])
        ax.set_xticks(range(len(table)), table.index, rotation=20, ha="right")
        ax.set_title(column)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
