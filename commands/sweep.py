"""Batch sweep: each SUT through LoadGen Offline at max_batch 1, 2, 4, ..., and where speculative decoding
stops paying, measured and predicted.

Every point is an ordinary Offline performance run in a fresh process, and every run decodes the same
samples: the QSL is the first --samples prompts and LoadGen issues exactly that many queries (no minimum
duration), in its own fixed order. Batches go in turn, every SUT at one batch before the next batch, so drift
hits every SUT alike. The prediction (roofline/batching.py) is fitted on the batch-1 and batch-2 runs (batch 1
alone when the sweep has no batch 2) and compared with every other run at that run's mean rows per forward; an
-auto SUT's is the better of its chain's and the baseline's (it drafts only where drafting pays). Batches 1 and
2 run --fit-rounds times, the others --check-rounds times, spread over the sweep (`schedule`); the fit pools each
fit point's rounds, and the table shows each batch's mean, which the prediction is checked against. With two fit
rounds or more the sweep also prints what each round's own fit predicts at the largest batch (`fit_band`).

    python -m mlperf sweep [--batches 1,2,4,8,16,32,64] [--sut baseline --sut spec] [--samples 64] [--fit-rounds 3]
                           [--check-rounds 1]
    python -m mlperf sweep --explain results/sweep/<timestamp>   # the table and plot again, from its runs

With `--endpoint URL` the sweep compares that server (named by one --sut, default `http`) with the baseline in
process, the batch being how many queries the client keeps in flight; its prediction only where the server
reports its engine's steps (ours does), since tokens/s alone cannot be fitted.
"""
import json
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from commands.children import kept_apart, run_child
from commands.options import measurable
from mlperf import devices, env
from mlperf.checkpoint import read_config
from mlperf.env import set_threads
from mlperf.files import read_text
from reports.loadgen import headline
from reports.plots import sweep_plot
from roofline import peaks as machine_peaks
from roofline.batching import MAX_BATCH, crossover, fit
from roofline.speculative import decode_rate, generation_rate, mean_batch
from scenarios.config import DTYPES, RunConfig
from scenarios.records import RunRecord
from scenarios.run import claim, point_latest
from suts.registry import shape
from scenarios.scenario import Offline

BATCHES = (1, 2, 4, 8, 16, 32, 64)
FIT_ROUNDS = 3  # runs of each batch the prediction is fitted on; the rows beyond multiply a fit point's error
CHECK_ROUNDS = 1  # runs of each batch it is checked against (their mean): more where one run is noisier than a miss
SUTS = ("baseline", "spec", "spec-auto", "spec-tree", "spec-int8", "ngram", "eagle")


def series_folder(cfg: RunConfig, name: str, samples: int) -> tuple[Path, Path, Path]:
    """A series' new folder under results/NAME, its .partial work folder (with runs/ in it) and the user.conf every
    point runs with: the same `samples` samples however fast, then the run's own user.conf."""
    final, work = claim(Path(cfg.results) / name)
    (work / "runs").mkdir()
    conf = work / f"{name}.conf"
    conf.write_text(f"# {name}: every run decodes the same {samples} samples, however fast\n"
                    f"*.Offline.min_duration = 0\n*.Offline.min_query_count = {samples}\n"
                    + (read_text(cfg.user_conf) if cfg.user_conf else ""))
    return final, work, conf


def schedule(batches, rounds: int, checks: int = 1) -> list[tuple[int, int]]:
    """(batch, round) of every point in the order they run: the batches the prediction is fitted on (1 and 2)
    `rounds` times, each round ahead of an even share of the rest's `checks` rounds (every batch once, then every
    batch again), so that the fit averages over the sweep's minutes (one run of each inherits its minute's noise,
    which the rows beyond multiply) and a checked batch's rounds fall in different minutes."""
    fitted = [b for b in batches if b <= 2]
    rest = [(b, r) for r in range(checks) for b in batches if b > 2]
    return [point for r in range(rounds) for point in
            [(b, r) for b in fitted] + rest[len(rest) * r // rounds:len(rest) * (r + 1) // rounds]]


def sweep(cfg: RunConfig, suts=SUTS, batches=BATCHES, samples: int = 64, fit_rounds: int = FIT_ROUNDS,
          check_rounds: int = CHECK_ROUNDS) -> Path:
    """Run the sweep, print and write its table (sweep.csv, sweep.json) and plot (sweep.png)."""
    if "baseline" not in suts:
        raise ValueError("the sweep compares against the baseline: include --sut baseline")
    if sorted(set(batches)) != list(batches) or batches[0] != 1:
        raise ValueError("batches must rise from 1 without repeats (the prediction is fitted at batch 1), got "
                         f"{batches}")
    for name, rounds in (("--fit-rounds", fit_rounds), ("--check-rounds", check_rounds)):
        if rounds < 1:
            raise ValueError(f"{name} must be at least 1, got {rounds}")
    cfg, suts = offline_series(cfg, suts, samples, max(batches), "a sweep")
    final, work, conf = series_folder(cfg, "sweep", samples)
    times = {n: "once" if n == 1 else f"{n} times" for n in (fit_rounds, check_rounds)}
    print(f"sweep: {', '.join(suts)} through LoadGen Offline at batch {', '.join(map(str, batches))} (batch 1 and 2 "
          f"{times[fit_rounds]}, the others {times[check_rounds]}); {samples} samples x {cfg.max_new_tokens} new "
          "tokens each", flush=True)
    with kept_apart(work, final, lambda: "the sweep"):
        for batch, again in schedule(batches, fit_rounds, check_rounds):
            for sut in suts:
                out = work / "runs" / (f"{sut}-b{batch}" + (f"-r{again + 1}" if again else ""))
                run_child(replace(sut_config(cfg, sut, batch), run_dir=str(out), user_conf=str(conf)),
                          f"{sut} at batch {batch}")
                p = point(out)
                print(f"  batch {batch:3d}  {sut:14s} {p['tokens/s']:8.1f} tokens/s  {p['validity']}"
                      + (f"  (round {again + 1})" if again else ""), flush=True)
    write(work, cfg)
    work.rename(final)
    point_latest(final)
    return final


def offline_series(cfg: RunConfig, suts, samples: int, widest: int, what: str) -> tuple[RunConfig, tuple]:
    """The settings every point of a series of Offline runs shares, and the SUTs it measures, each checked at its
    widest point before any runs; the runs' thread count set here, so that a prediction uses the peaks they reach."""
    cfg = replace(cfg, scenario=Offline(), mode="performance", samples=samples)
    suts = tuple(measurable(suts, cfg.target, cfg.paths()))
    if cfg.endpoint and (len(suts) != 2 or cfg.sut not in suts):
        raise ValueError(f"{what} with --endpoint compares the one server (one --sut, its name) with the baseline")
    for sut in suts:
        sut_config(cfg, sut, widest).validate()
    set_threads(cfg.threads)
    return cfg, suts


def sut_config(cfg: RunConfig, sut: str, batch: int) -> RunConfig:
    """One point's settings: the server at `cfg.endpoint` under its name, any other SUT in process."""
    if cfg.endpoint and sut == cfg.sut:
        return replace(cfg, max_batch=batch)
    return replace(cfg, sut=sut, max_batch=batch, endpoint=None, model=None)


def write(sweep_dir: Path, cfg: RunConfig, peaks: dict | None = None) -> None:
    """Explain the sweep's runs against `peaks` (default: this machine's at the runs' dtype and threads): print and
    write its table (sweep.csv, sweep.json) and plot (sweep.png)."""
    runs = sorted(d for d in (sweep_dir / "runs").iterdir() if d.is_dir())
    table, summary = explain(pd.DataFrame([point(d) for d in runs]), sweep_dir, cfg, peaks)
    table.to_csv(sweep_dir / "sweep.csv")
    (sweep_dir / "sweep.json").write_text(json.dumps({**summary, "config": asdict(cfg)}, indent=1) + "\n")
    sweep_plot(table, summary, sweep_dir / "sweep.png")
    with pd.option_context("display.width", 200, "display.float_format", "{:.2f}".format):
        print(table.to_string())
    for line in summary["lines"]:
        print(line)


def explain_again(sweep_dir) -> None:
    """Write a finished sweep's table, prediction and plot again from its runs (after `make peaks`, say). A sweep
    measured on another machine is explained against the peaks it was measured with, not this machine's."""
    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / "sweep.json").is_file():
        raise ValueError(f"{sweep_dir} is not a finished sweep (no sweep.json)")
    summary = json.loads((sweep_dir / "sweep.json").read_text())
    cfg = RunConfig(**summary["config"])
    set_threads(cfg.threads)
    elsewhere = summary.get("machine") not in (None, env.machine()) and summary.get("peaks")
    if elsewhere:
        print(f"a sweep measured on {summary['machine']}: explained against the peaks it was measured with")
    write(sweep_dir, cfg, summary["peaks"] if elsewhere else None)


def point(run_dir: Path) -> dict:
    r, h = RunRecord.load(run_dir), headline(run_dir)
    return {"sut": r.config.sut, "batch": r.sut.batch, "tokens/s": h.tokens_per_s, "validity": h.validity,
            "mean batch": mean_batch(r.stats), "SUT tokens/s": generation_rate(r.stats),
            "decode tokens/s": decode_rate(r.stats), "acceptance": r.acceptance_rate,
            "run": f"runs/{run_dir.name}"}  # relative to the sweep: it outlives the .partial rename


def crossings(measured: pd.DataFrame, predicted: pd.DataFrame, models: dict, table: pd.DataFrame
              ) -> tuple[list[str], dict]:
    """Where each speculative SUT stops paying over the baseline (and a -tree SUT over its chain), measured and
    predicted, a line each; the speedup columns added to `table` on the way."""
    lines, crossovers = [], {}
    pairs = [(sut, "baseline") for sut in measured.columns if sut != "baseline"]
    pairs += [(sut, sut.removesuffix("-tree")) for sut in measured.columns  # where a tree stops paying over its chain
              if sut.endswith("-tree") and sut.removesuffix("-tree") in measured.columns]
    for sut, against in pairs:
        key = sut if against == "baseline" else f"{sut} vs {against}"
        auto = drafts_where_it_pays(sut)
        if against == "baseline":
            table[f"{sut} speedup"] = measured[sut] / measured["baseline"]
            table[f"{sut} predicted"] = (predicted[sut] / predicted["baseline"]).clip(lower=float(auto))
        slower = [b for b in measured.index if measured.loc[b, sut] < measured.loc[b, against]]
        crossovers[key] = {"measured": slower[0] if slower else None, "predicted": None if auto or sut not in models
                           else crossover(models[sut], models[against])}
        m, p = crossovers[key]["measured"], crossovers[key]["predicted"]
        lines.append(f"{key}: " + (f"slower than {against} from batch {m}" if m else
                                   f"faster than {against} at every batch up to {max(measured.index)}")
                     + "; predicted " + (f"from batch {p}" if p else f"never (up to {MAX_BATCH})"))
    return lines, crossovers


def explain(points: pd.DataFrame, work: Path, cfg: RunConfig, peaks: dict | None = None
            ) -> tuple[pd.DataFrame, dict]:
    """Tokens/s per SUT and batch, each speculative SUT's speedup over the baseline at the same batch, measured
    (LoadGen's tokens/s) and predicted; and the batch where each stops paying, over the baseline and, for a -tree
    SUT, over its chain."""
    measured = points.pivot_table(index="batch", columns="sut", values="tokens/s")  # a fit point's rounds: their mean
    target = read_config(cfg.target)[0]
    dtype = DTYPES.get(cfg.dtype) or devices.default_dtype(cfg.device)
    peaks = peaks or machine_peaks.load(cfg.device, dtype, machine_peaks.cache_in(cfg.results))
    one = {sut: pooled(work, points, sut, 1) for sut in measured.columns}
    one = {sut: r for sut, r in one.items() if steps_known(r)}  # the SUTs the prediction can be fitted on
    two = {sut: pooled(work, points, sut, 2) for sut in one} if 2 in measured.index else {}
    if not all(round(mean_batch(r.stats)) == 2 for r in two.values()):
        two = {}  # too few samples to keep two rows busy: fitted on batch 1 alone
    fitted = [1, 2] if two else [1]
    models = {sut: fit(r, target, r.draft_config(), peaks, two.get(sut)) for sut, r in one.items()}
    rows = points.pivot_table(index="batch", columns="sut", values="mean batch")  # the rows each run really had
    predicted = pd.DataFrame({sut: [models[sut].tokens_per_s(rows.loc[b, sut]) if sut in models else float("nan")
                                    for b in measured.index] for sut in measured.columns}, index=measured.index)
    table = measured.rename(columns=lambda s: f"{s} tokens/s")
    lines, crossovers = crossings(measured, predicted, models, table)
    lines.append(prediction_line(measured, predicted, table, fitted))
    if (spread := rounds_line(points)) is not None:
        lines.append(spread)
    lines += [f"{sut}: no prediction (its server reports no engine steps to fit)" for sut in measured.columns
              if sut not in models]
    refit = lambda a, b: fit(a, target, a.draft_config(), peaks, b)  # noqa: E731
    band = fit_band(work, points, rows[list(models)], refit) if two else None
    if band is not None:
        lines.append(band[0])
    overheads = {sut: {p: overhead for p, (_, _, overhead) in m.phases.items()} for sut, m in models.items()}
    # what a row costs beyond what it adds at the roofs, as the batch-2 runs showed it: two SUTs that run the same
    # verify pass should show the same overhead, and where they do not, the fit points disagree
    if two:
        lines.append("a row's time beyond what it adds at the roofs, fitted at batch 2 (ms a cycle): " + "; ".join(
            f"{sut} " + ", ".join(f"{p} {1e3 * s:.3f}" for p, s in phases.items())
            for sut, phases in overheads.items()))
    best = measured["baseline"].idxmax()
    lines.append(f"baseline: best at batch {best}, {measured.loc[best, 'baseline'] / measured.loc[1, 'baseline']:.2f}x "
                 f"its batch-1 tokens/s")
    summary = {"crossover": crossovers, "lines": lines, "machine": one["baseline"].machine,
               "versions": one["baseline"].versions, "peaks": peaks, "points": points.to_dict("records"),
               "row_overheads_s": overheads, "predicted_by_fit_round": band[1] if band else None,
               "predicted_tokens_per_s": {sut: {int(b): float(v) for b, v in predicted[sut].items()}
                                          for sut in models}}
    return table, summary


def steps_known(record: RunRecord) -> bool:
    """Whether a run's stats count its engine's steps, as the prediction needs: a SUT in process or our server
    (another server's are its requests' times alone)."""
    return not record.endpoint or record.endpoint.get("engine") == "ours"


def drafts_where_it_pays(sut: str) -> bool:
    """An -auto SUT drafts only where drafting pays: its predicted speedup is never below 1x."""
    return shape(sut) == "auto"


def pooled(work: Path, points: pd.DataFrame, sut: str, batch: int) -> RunRecord:
    """Every round of one SUT at one batch as a single run: its samples one after another."""
    runs = [RunRecord.load(work / run) for run in points[(points.sut == sut) & (points.batch == batch)].run]
    return replace(runs[0], samples=[s for r in runs for s in r.samples])


def fit_band(work: Path, points: pd.DataFrame, rows: pd.DataFrame, fitted) -> tuple[str, dict] | None:
    """What each fit round's own batch-1 and batch-2 runs (`fitted(one, two)`, a BatchModel) predict at the sweep's
    largest batch: how far the prediction moves with the minutes its fit points ran in. A line and, per SUT, the
    tokens/s of each round; None with fewer than two usable rounds."""
    top, predicted = rows.index.max(), {}
    for sut in rows.columns:
        runs = [sorted(points[(points.sut == sut) & (points.batch == b)].run) for b in (1, 2)]
        pairs = [(RunRecord.load(work / a), RunRecord.load(work / b)) for a, b in zip(*runs)]
        predicted[sut] = [fitted(one, two).tokens_per_s(rows.loc[top, sut]) for one, two in pairs
                          if round(mean_batch(two.stats)) == 2]  # a round too short to keep two rows busy: left out
    if len({len(v) for v in predicted.values()}) != 1 or len(predicted["baseline"]) < 2:
        return None
    speedups = {sut: [max(v / b, float(drafts_where_it_pays(sut)))  # as the table's predicted column
                      for v, b in zip(values, predicted["baseline"])] for sut, values in predicted.items()
                if sut != "baseline"}
    line = (f"each fit round alone (its batch-1 and batch-2 runs) predicts batch {top}: " + ", ".join(
        f"{sut} {min(v):.0f}-{max(v):.0f} tokens/s" for sut, v in predicted.items()) + "".join(
        f"; {sut} {min(v):.2f}-{max(v):.2f}x" for sut, v in speedups.items())
        + ": how far the fit moves with the minutes its points ran in")
    return line, predicted


def rounds_line(points: pd.DataFrame) -> str | None:
    """How far apart a batch's rounds came out (their highest tokens/s over their lowest): a prediction cannot be
    judged closer than the measurement it is judged against repeats. None with one round each."""
    runs = points.groupby(["sut", "batch"])["tokens/s"]
    spread = (runs.max() / runs.min() - 1)[runs.size() > 1]
    if spread.empty:
        return None
    sut, batch = spread.idxmax()
    return (f"run to run, a batch's rounds differ by up to {spread.max():.0%} ({sut} at batch {batch}): a floor "
            "under the prediction's misses")


def prediction_line(measured: pd.DataFrame, predicted: pd.DataFrame, table: pd.DataFrame,
                    fitted: list[int]) -> str:
    """How far the prediction lies from LoadGen's tokens/s, and its speedups from the measured ones, at the
    batches it was not fitted on."""
    rest, on = [b for b in measured.index if b not in fitted], " and ".join(map(str, fitted))
    if not rest:
        return f"prediction: fitted on batch {on}; no other batch to check it against"
    error = (predicted.loc[rest] / measured.loc[rest] - 1).abs().stack()
    worst = error.idxmax()
    line = (f"prediction (fitted on batch {on}): tokens/s within {error.max():.0%} of "
            f"LoadGen's at batch {', '.join(map(str, rest))} (worst: {worst[1]} at batch {worst[0]})")
    spec = [c.removesuffix(" speedup") for c in table.columns if c.endswith(" speedup")]
    if spec:
        miss = pd.DataFrame({s: table.loc[rest, f"{s} predicted"] - table.loc[rest, f"{s} speedup"]
                             for s in spec}).abs()
        worst = miss.stack().idxmax()
        line += f"; speedups within {miss.max().max():.2f} (worst: {worst[1]} at batch {worst[0]})"
    return line
