"""`python -m mlperf whatif`: where speculative decoding pays on this machine. For each model pair, gamma and
acceptance, spec at that synthetic acceptance (suts/synthetic.py: the drafter runs, its proposals are set, the
output stays the baseline's) and the fp16 baseline take turns through LoadGen SingleStream in this process (and
Offline at one batch), beside what the roofline predicts of the point (roofline/whatif.py).

Synthetic acceptance measures the mechanism, never a drafter's quality: the pairs are random weights of real
geometries (`random-model`, made once and cached outside the repository), or any TARGET and DRAFT. The sweep is
resumable: each point is appended to points.jsonl as it finishes, and a run of the same preset skips what is
there. Writes whatif.csv and whatif.png under results/whatif/PRESET/ (and points results/whatif/latest at it).
Where `make peers` has built llama.cpp, its plain F16 decode of each byte-vocabulary target on the same prompts is
the peer row beside the fp16 baseline's (whatif-peers.csv).
"""
import json
import math
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import mlperf_loadgen as lg
import pandas as pd
import torch

from commands import peers
from commands.smoke import settings as single_stream
from commands.whatif_table import peer_report, report, summary
from mlperf.checkpoint import pair_key, random_checkpoint, read_config
from mlperf.corpus import load_bytes, split
from mlperf.data import Prompt, load_prompts, write_prompts
from mlperf.env import set_threads
from mlperf.rules import positive_int
from mlperf.tokenizer import load_tokenizer
from roofline.analysis import write_sidecar
from roofline.whatif import LONGEST, Pair
from scenarios.accuracy import reference_by_prompt
from scenarios.config import RunConfig
from scenarios.logs import read_detail, token_latencies_s, tokens_per_second
from scenarios.qsl import QSL
from scenarios.records import RunRecord
from scenarios.run import loadgen_test
from suts.fast.packed import weight_bytes
from suts.registry import build_sut, labelled
from suts.synthetic import Acceptance
from scenarios.scenario import Offline

PAIRS = {"seed": ("seed-target", "seed-draft"), "gpt2-medium": ("gpt2-medium", "gpt2-medium-draft"),
         "gpt2-large": ("gpt2-large", "gpt2-large-draft"), "gpt2-xl": ("gpt2-xl", "gpt2-xl-draft")}
AUTO_GAMMA = LONGEST  # the most drafts a cycle spec-auto may plan (--auto): the roofline's longest


@dataclass(frozen=True)
class Preset:
    """A sweep: model pairs, one conditional acceptance rate per point, chain lengths, each sample's load, and the
    batch of each point's Offline test (None: SingleStream alone)."""
    pairs: tuple[str, ...]
    acceptance: tuple[float, ...]
    gammas: tuple[int, ...]
    prefill: int
    decode: int
    samples: int
    offline_batch: int | None = None


PRESETS = {
    "sweep": Preset(("seed", "gpt2-medium"), (0.5, 0.6, 0.7, 0.8, 0.9, 0.95), (2, 4), prefill=128, decode=64,
                     samples=6, offline_batch=3),
    "seed": Preset(("seed",), (0.7,), (4,), prefill=2048, decode=64, samples=4),  # the seed's own configuration
}


def cache_dir() -> Path:
    """Where the random pairs and the prompt sets are made once: outside the repository."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlperf-harness"


def pair_paths(name: str, target: str | None, draft: str | None) -> tuple[str, str]:
    """A named pair's checkpoints, made once with random weights (seed 0); or the TARGET and DRAFT given."""
    if target or draft:
        if not (target and draft):
            raise ValueError("whatif measures a pair: give both --target and --draft, or neither")
        return target, draft
    paths = []
    for geometry in PAIRS[name]:
        path = cache_dir() / "models" / geometry
        if not (path / "config.json").is_file():
            print(f"making {geometry} (random weights, once) in {path} ...", flush=True)
            random_checkpoint(geometry, path, seed=0)
        paths.append(str(path))
    return paths[0], paths[1]


def prompt_set(target: str, prefill: int, samples: int) -> Path:
    """`samples` held-out source excerpts of `prefill` tokens each of the target's tokenizer, as a prompt file (made
    once per tokenizer and length)."""
    tokenizer = load_tokenizer(target)
    path = cache_dir() / "prompts" / f"{type(tokenizer).__name__}-{tokenizer.vocab_size}-{prefill}x{samples}.jsonl"
    if path.is_file():
        return path
    text = load_bytes(split()[1]).tobytes().decode("ascii", "replace")
    stride = len(text) // samples
    prompts = [Prompt(i, "stdlib (held out)", i * stride, tokenizer.decode(tokenizer.encode(
        text[i * stride:i * stride + 4 * prefill])[:prefill])) for i in range(samples)]
    write_prompts(prompts, path)
    return path


def measure(sut, qsl: QSL, cfg: RunConfig, run_dir: Path, baseline_dir: Path | None) -> dict:
    """One LoadGen SingleStream test of `sut` into `run_dir` (made anew): LoadGen's tokens/s, TTFT and TPOT, each
    phase's fraction of its roof, and for a speculative SUT its verify and draft ratios against `baseline_dir`'s
    run."""
    shutil.rmtree(run_dir, ignore_errors=True)  # a point cut short before it was recorded
    run_dir.mkdir(parents=True)
    warm = sut.generate(qsl.tokens[0], cfg.max_new_tokens, cfg.sampling())
    n = len(qsl.tokens)
    settings = single_stream(n, warm.stats.total_s) if cfg.scenario.one_at_a_time else offline(n)
    adapter, _ = loadgen_test(sut, qsl, settings, run_dir, cfg, echo_summary=False)
    if adapter.error:
        raise RuntimeError(f"{cfg.sut}: {adapter.error}")
    detail = read_detail(run_dir)
    ttft, tpot = token_latencies_s(detail) or (math.nan, math.nan)  # Offline logs no token latencies
    base = baseline_dir or run_dir
    roof = write_sidecar(run_dir, (RunRecord.load(base), base))
    out = {"tokens/s": tokens_per_second(detail, cfg.scenario), "ttft_s": ttft, "tpot_s": tpot, "roof": roof.peaks,
           "of roof": {phase: v.fraction_of_roof for phase, v in roof.phases.items()}}
    if roof.speculative:
        sp = roof.speculative
        out.update({"verify steps": sp.verify_cost_ratio, "c": sp.draft_cost_ratio,
                    "measured acceptance length": sp.tokens_per_cycle, "mean gamma": sp.gamma})
    return out


def offline(n: int) -> lg.TestSettings:
    """LoadGen Offline settings for `n` samples, every one once, all issued at the start."""
    s = lg.TestSettings()
    s.scenario, s.mode = lg.TestScenario.Offline, lg.TestMode.PerformanceOnly
    s.use_token_latencies = True
    s.min_duration_ms, s.min_query_count = 0, n
    s.performance_issue_unique = True
    s.performance_sample_count_override = n
    s.offline_expected_qps = n
    return s


def sweep_pair(name: str, preset: Preset, paths: tuple[str, str], folder: Path, done: dict, rounds: int,
               auto: bool) -> None:
    """Every (gamma, acceptance) point of one pair not in `done`, appended to folder/points.jsonl as it finishes;
    with `auto`, spec-auto (up to AUTO_GAMMA drafts a cycle) at each point too."""
    target, draft = paths
    prompts = prompt_set(target, preset.prefill, preset.samples)
    shared = dict(target=target, draft=draft, prompts=str(prompts), samples=preset.samples,
                  max_new_tokens=preset.decode, results=str(folder / "results"))
    tokenizer = load_tokenizer(target)
    qsl = QSL(load_prompts(prompts), tokenizer, read_config(target)[0].block_size, preset.decode)
    by_prompt = reference_by_prompt(RunConfig(**shared), qsl.tokens, folder / "reference")
    baseline = build_sut("baseline", target)
    planned = (lambda acceptance: build_sut("spec-auto", target, draft, gamma=AUTO_GAMMA,
                                            synthetic=(acceptance, by_prompt))) if auto else None
    try:
        for gamma in preset.gammas:
            todo = [a for a in preset.acceptance if (name, gamma, a, rounds, auto) not in done]
            spec = build_sut("spec", target, draft, gamma=gamma,
                             synthetic=(Acceptance(tuple(todo[:1])), by_prompt)) if todo else None
            for alpha in todo:
                cfg = RunConfig(sut="spec", gamma=gamma, synthetic_acceptance_rates=str(alpha), **shared)
                where = folder / "runs" / name / f"gamma{gamma}" / f"acceptance{alpha:.2f}"
                point = measure_point(baseline, spec, qsl, cfg, where, preset.offline_batch, rounds)
                if planned is not None:
                    point.update(auto_point(planned, qsl, replace(cfg, sut="spec-auto", gamma=AUTO_GAMMA), where))
                point.update(pair=name, gamma=gamma, acceptance=alpha, rounds=rounds, auto=auto)
                with open(folder / "points.jsonl", "a") as f:
                    f.write(json.dumps(point) + "\n")
                done[(name, gamma, alpha, rounds, auto)] = point
                print(f"  {name} gamma {gamma} acceptance {alpha:.2f}: decode {point['decode speedup']:.2f}x, end to "
                      f"end {point['end-to-end speedup']:.2f}x", flush=True)
    finally:
        qsl.destroy()


def measure_point(baseline, spec, qsl: QSL, cfg: RunConfig, where: Path, offline_batch: int | None,
                  rounds: int = 1) -> dict:
    """One acceptance point, the baseline and spec (its drafts set to it) taking turns `rounds` times through
    SingleStream, then through Offline at `offline_batch`: each figure is the median turn's (by its speedup), with
    the range of the turns' speedups, so that the machine's drift skews no ratio. With what the roofline needs to
    predict the point: the prompt's mean length, both models' weight bytes, the peaks the runs were judged against."""
    acceptance = Acceptance.parse(cfg.synthetic_acceptance_rates)
    spec.drafter.acceptance = acceptance
    spec.name = labelled("spec", acceptance)
    plain = replace(cfg, sut="baseline", synthetic_acceptance_rates=None)
    base, run, spread = median_turn(baseline, spec, qsl, (plain, cfg), where, rounds, "tpot_s")
    point = {"decode speedup": base["tpot_s"] / run["tpot_s"], "decode speedup low": spread[0],
             "decode speedup high": spread[1],
             "end-to-end speedup": run["tokens/s"] / base["tokens/s"],
             "set acceptance length": acceptance.mean_length(cfg.gamma),
             "measured acceptance length": run["measured acceptance length"],
             "verify steps": run["verify steps"], "c": run["c"],
             "baseline tokens/s": base["tokens/s"], "spec tokens/s": run["tokens/s"],
             "baseline TPOT ms": 1e3 * base["tpot_s"], "spec TPOT ms": 1e3 * run["tpot_s"],
             "decode of roof": base["of roof"]["decode"], "verify of roof": run["of roof"]["verify"],
             "draft of roof": run["of roof"]["draft"],
             "prefill": round(sum(map(len, qsl.tokens)) / len(qsl.tokens)), "decode": cfg.max_new_tokens,
             "weight bytes": [weight_bytes(spec.target), weight_bytes(spec.draft)], "peaks": run["roof"]}
    if offline_batch:
        batched = {"scenario": Offline(), "max_batch": offline_batch}
        base, run, spread = median_turn(baseline, spec, qsl, (replace(plain, **batched), replace(cfg, **batched)),
                                        where / Offline(), rounds, "tokens/s")
        point.update({"Offline batch": offline_batch, "Offline speedup": run["tokens/s"] / base["tokens/s"],
                      "Offline speedup low": spread[0], "Offline speedup high": spread[1]})
    return point


def auto_point(planned, qsl: QSL, cfg: RunConfig, where: Path) -> dict:
    """spec-auto (`planned(acceptance)`, built anew: its planner starts from nothing, as a run's does) at the
    point's acceptance, against the point's first turn's baseline: the chain length it chose on average, and its
    decode speedup."""
    auto = planned(Acceptance.parse(cfg.synthetic_acceptance_rates))
    base_dir = where / "round1" / "baseline"
    run = measure(auto, qsl, cfg, where / "spec-auto", base_dir)
    base_tpot_s = token_latencies_s(read_detail(base_dir))[1]
    return {"spec-auto's gamma": run["mean gamma"], "spec-auto decode speedup": base_tpot_s / run["tpot_s"]}


def median_turn(baseline, spec, qsl: QSL, configs: tuple, where: Path, rounds: int, key: str):
    """`rounds` turns of the baseline then spec (configs: theirs), each into where/roundN/: the turn whose speedup
    by `key` (seconds a token, or tokens/s) is the median's measurements, and the range of every turn's speedup."""
    turns = []
    for r in range(rounds):
        at = where / f"round{r + 1}"
        base = measure(baseline, qsl, configs[0], at / "baseline", None)
        turns.append((base, measure(spec, qsl, configs[1], at / "spec", at / "baseline")))
    speedup = (lambda t: t[0][key] / t[1][key]) if key == "tpot_s" else (lambda t: t[1][key] / t[0][key])
    turns.sort(key=speedup)
    base, run = turns[len(turns) // 2]
    return base, run, [speedup(turns[0]), speedup(turns[-1])]


def peer_row(name: str, target: str, prompts: Path, decode: int, folder: Path) -> dict | None:
    """llama.cpp's plain F16 decode of the pair's target on the sweep's prompts (`make peers`): its decode phase's
    seconds a token, the median sample's, measured once a pair (folder/peers.jsonl); None where llama.cpp is not
    built or the target's vocabulary is not bytes (its GGUF's)."""
    done = {row["pair"]: row for row in read_lines(folder / "peers.jsonl")}
    if name in done or not peers.available() or read_config(target)[0].vocab_size != 256:
        return done.get(name)
    tokenizer = load_tokenizer(target)
    tokens = [tokenizer.encode(p.text) for p in load_prompts(prompts)]
    model = peers.convert(target, "F16")
    try:
        outs = [peers.generate(model, t, decode, torch.get_num_threads()) for t in tokens]
    except peers.PeerFailed as e:
        print(f"  {name}: llama.cpp's row left out: {e}", flush=True)
        return None
    per_token = sorted(o.decode_s / o.decoded for o in outs)
    row = {"pair": name, "engine": "llama.cpp F16 (plain)", "TPOT ms": 1e3 * per_token[len(per_token) // 2]}
    with open(folder / "peers.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def read_lines(path: Path) -> list[dict]:
    """The JSON lines a sweep has appended so far; a line cut short is left out (measured again)."""
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else ():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def measured(path: Path) -> dict:
    """The points a sweep has appended so far, by (pair, gamma, acceptance, rounds, whether spec-auto ran); a line
    cut short is measured again."""
    return {(point["pair"], point["gamma"], point["acceptance"], point["rounds"], point["auto"]): point
            for point in read_lines(path)}


def main(args) -> None:
    preset = PRESETS[args.preset]
    if args.pairs:
        unknown = sorted(set(args.pairs) - set(PAIRS))
        if unknown:
            raise ValueError(f"unknown pair {unknown[0]!r}; choose among {', '.join(PAIRS)}")
        preset = replace(preset, pairs=tuple(args.pairs))
    if args.target or args.draft:
        pair_paths("", args.target, args.draft)  # both given, or a one-line error
        preset = replace(preset, pairs=(pair_key(args.target, args.draft),))  # a pair's points filed by its hash
    positive_int("rounds", args.rounds)
    set_threads(args.threads)
    folder = Path(args.results) / "whatif" / args.preset
    folder.mkdir(parents=True, exist_ok=True)
    done = measured(folder / "points.jsonl")
    total = len(preset.pairs) * len(preset.gammas) * len(preset.acceptance)
    print(f"whatif {args.preset}: {total} points ({len(done)} measured already in {folder}), prompts of "
          f"{preset.prefill} tokens x {preset.decode} new, {preset.samples} samples a point, {args.rounds} turn(s) of "
          "the baseline and spec each; synthetic acceptance: the mechanism measured, not a drafter's quality",
          flush=True)
    pairs, peer_rows = {}, []
    for name in preset.pairs:
        paths = pair_paths(name, args.target, args.draft)
        sweep_pair(name, preset, paths, folder, done, args.rounds, args.auto)
        pairs[name] = Pair(*(read_config(p)[0] for p in paths))
        peer_rows.append(peer_row(name, paths[0], prompt_set(paths[0], preset.prefill, preset.samples), preset.decode,
                                  folder))
    wanted = {(p, g, a, args.rounds, args.auto) for p in preset.pairs for g in preset.gammas for a in preset.acceptance}
    df = pd.DataFrame([p for k, p in done.items() if k in wanted]).sort_values(["pair", "gamma", "acceptance"])
    df = summary(df.reset_index(drop=True), pairs)
    report(df, folder, args.preset)
    peer_report(df, [row for row in peer_rows if row], folder)


