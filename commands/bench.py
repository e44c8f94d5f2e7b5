"""Benchmark: every SUT on the same held-out prompts, in one process, greedy and sampled (temperature 0.8,
top-p 0.95, one seed per prompt); prints figures, asserts nothing.

The SUTs take turns prompt by prompt, round after round, so a machine that slows down or speeds up mid-run skews no
ratio; the table of speed (commands/speed.py) gives each speedup as the median round's with the rounds' range. The
speculative figures (alpha from tested drafts, tokens per cycle, c, verify ratio, predicted and measured decode
speedups) come from `roofline.speculative`, as in the roofline sidecar and the smoke gate. Reference rows run
Hugging Face `transformers` on the same weights (plain greedy, assisted generation with the draft as its
assistant, and prompt lookup, the peer of `ngram`), checked token-identical to our baseline; they are greedy only,
and left out when `transformers` is not installed. So are llama.cpp's rows (commands/peers.py: plain and
speculative at F32, F16 and Q8_0, whose quantised target may differ), left out until `make peers` has built it; a
peer that crashes, hangs or prints nothing is a row saying why, and the rest run. Sampled outputs differ from the
baseline's token by token (each SUT draws differently) but not in distribution; `suts/distribution.py` tests that.

    python -m mlperf bench [--samples 24] [--max-new-tokens 128] [--gamma 4] [--tree 2,2,1]
                           [--setting greedy|sampled|both] [--rounds 3] [--threads T] [--into README.md]
                           [--device cuda] [--no-fast]
"""
import json
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from commands import peer_build, peers
from commands.options import measurable
from commands.speed import markdown, paste, speed_columns
from mlperf import devices, env
from mlperf.checkpoint import fingerprint, load_model, save_checkpoint
from mlperf.env import set_threads
from mlperf.files import write_json
from mlperf.rules import positive_int
from mlperf.data import PROMPTS, load_prompts, repetitive_tail
from mlperf.tokenizer import load_tokenizer
from roofline import peaks as machine_peaks
from roofline.analytic import phase_costs
from roofline.peaks import cycle_roofline_s, roofline_s
from roofline.speculative import (decode_rate, generation_rate, positional_tokens_per_cycle, row_step_s,
                                  speculative_figures)
from scenarios.accuracy import reference_by_prompt
from scenarios.config import RunConfig
from scenarios.run import claim, point_latest
from suts.base import GREEDY, SUT
from suts.drafting import GAMMA
from suts.fast.step import WEIGHTS
from suts.ngram import MAX_NGRAM
from suts.fast.packed import weight_bytes
from suts.registry import build_sut, labelled, shape
from suts.synthetic import Acceptance
from suts.engine.sampling import SamplingParams
from suts.engine.stats import merged_cycles
from suts.tree import parse_fanout

SUTS = ("baseline", "spec", "spec-auto", "spec-tree", "spec-int8", "spec-self-int8", "ngram", "ngram-tree", "eagle",
        "eagle-tree")
SETTINGS = {"greedy": GREEDY, "sampled": SamplingParams(temperature=0.8, top_p=0.95)}


def hf_generators(target: str, draft: str, gamma: int, max_new_tokens: int, tmp: Path) -> dict:
    """transformers' greedy generation, assisted generation (constant gamma, and its default schedule) and prompt
    lookup (gamma tokens, n-grams up to ngram's largest) on our weights exported to GPT-2 directories; {} when
    transformers is not installed."""
    try:
        from transformers import GPT2LMHeadModel
        from transformers.utils import logging
    except ImportError:
        return {}
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    for name, path in (("target", target), ("draft", draft)):
        save_checkpoint(load_model(path), tmp / name, dtype=torch.float32)
    models = {name: GPT2LMHeadModel.from_pretrained(tmp / name.removesuffix("-default")).eval()
              for name in ("target", "draft", "draft-default")}
    constant = models["draft"].generation_config
    constant.num_assistant_tokens, constant.num_assistant_tokens_schedule = gamma, "constant"
    constant.assistant_confidence_threshold = 0.0  # no early exit: exactly gamma drafts per cycle

    def generate(**how):
        def fn(prompt):
            with torch.inference_mode():
                out = models["target"].generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                                pad_token_id=0, **how)
            return out[0, len(prompt):].tolist()
        return fn
    return {"hf greedy": generate(), f"hf assisted (gamma {gamma})": generate(assistant_model=models["draft"]),
            "hf assisted (its default schedule)": generate(assistant_model=models["draft-default"]),
            f"hf prompt lookup ({gamma} tokens)": generate(prompt_lookup_num_tokens=gamma,
                                                           max_matching_ngram_size=MAX_NGRAM)}


def roof_figures(sut: SUT, prompts: list[list[int]], stats: list, peaks: dict) -> dict:
    """A SUT's decode at the roofline (roofline/): the baseline's decode step against its roof, and a speculative
    SUT's decode speedup as the roofline predicts it from its measured alpha (expected tokens per cycle over a
    cycle's draft steps and verify pass, each at its roof, per decode step at its roof)."""
    context = round(sum(map(len, prompts)) / len(prompts) + sum(s.n_tokens for s in stats) / len(stats) / 2)
    act = sut.target.model.transformer.wte.weight.element_size()
    target_bytes = weight_bytes(sut.target)  # int8 or fp16 panels, else the dtype's
    draft = getattr(sut, "draft", None)
    if not any(s.drafted for s in stats):
        decode = roofline_s(phase_costs(sut.target.config, 0, context, act_bytes=act,
                                        target_weight_bytes=target_bytes)["decode"], peaks)
        return {"decode % of roof": decode / row_step_s(stats)}
    drafter = getattr(sut, "drafter", None)
    if not (drafter and drafter.draft_forward) or getattr(sut, "fanout", ()) or draft is None:
        return {}
    gamma = round(sum(s.drafted for s in stats) / sum(s.cycles for s in stats))
    costs = phase_costs(sut.target.config, 0, context, draft.config, gamma, act_bytes=act,
                        draft_weight_bytes=weight_bytes(draft),
                        target_weight_bytes=target_bytes)
    return {"decode speedup at the roofline": positional_tokens_per_cycle(merged_cycles(stats)) *
            roofline_s(costs["decode"], peaks) / cycle_roofline_s(costs, peaks, gamma)}


def run(target: str, draft: str, n_prompts: int = 24, max_new_tokens: int = 128, gamma: int = GAMMA,
        suts=SUTS, device: str = "cpu", reference_rows: bool = True, params: SamplingParams = GREEDY,
        tree: str | None = None, fast: bool = True, peaks_cache: Path | None = None,
        weights: str = WEIGHTS, acceptance: Acceptance | None = None,
        reference_dir: Path = Path("results/reference"), rounds: int = 1) -> pd.DataFrame:
    """One row per SUT; `df.attrs["repetitive"]` lists the prompts whose baseline output ends in a degenerate run.
    `tree` is the shape every -tree SUT drafts (default: each one's own); `fast=False` runs every SUT without
    the fast path (suts/fast/: fused.py, graphs.py); `weights` is what its kernels stream (fp32, or fp16 where the
    weights are); the peaks measured after it are cached in `peaks_cache`. With `acceptance`, every chain SUT drafts
    at those synthetic rates (suts/synthetic.py), from the baseline's reference outputs cached in `reference_dir`.
    The SUTs take turns prompt by prompt, `rounds` times over every prompt; the speedups (commands/speed.py) are the
    median round's, with their range."""
    tok = load_tokenizer(target)
    prompts = [tok.encode(p.text) for p in load_prompts()[:n_prompts]]
    cfg = RunConfig(target=target, draft=draft, max_new_tokens=max_new_tokens, samples=n_prompts, device=device,
                    weights=weights)
    suts, synthetic = measurable(suts, target, cfg.paths()), set_drafts(cfg, prompts, acceptance, reference_dir)
    built = {labelled(name, acceptance if synthetic(name) else None):
             build_sut(name, target, draft, device=device, gamma=gamma, tree=tree if name.endswith("-tree") else None,
                       fast=fast, weights=weights, synthetic=synthetic(name))
             for name in suts}
    runners = {name: (lambda p, i, sut=sut: sut.generate(p, max_new_tokens, params.for_sample(i)))
               for name, sut in built.items()}
    with tempfile.TemporaryDirectory() as tmp:
        if reference_rows and device == "cpu" and params.greedy:
            runners.update({name: (lambda p, i, fn=fn: fn(p))
                            for name, fn in hf_generators(target, draft, gamma, max_new_tokens, Path(tmp)).items()})
            runners.update({name: (lambda p, i, fn=fn: fn(p))
                            for name, fn in peers.generators(target, draft, gamma, max_new_tokens).items()})
        turns, failed = take_turns(runners, prompts, rounds)
    turns = {name: each for name, each in turns.items() if name not in failed}
    results = {name: [o for outs, _ in each for o in outs] for name, each in turns.items()}
    wall = {name: sum(seconds for _, seconds in each) for name, each in turns.items()}
    peaks = machine_peaks.load(device, next(iter(built.values())).dtype, peaks_cache, max_age_s=0)  # as they ran
    base = [r.stats for r in results["baseline"]] if "baseline" in results else None
    reference = [r.tokens for r in results["baseline"]] if base else None
    rows = [figures(name, outs, wall[name], built.get(name), reference, base, prompts, peaks, params.greedy)
            for name, outs in results.items()] + [{"sut": name, "failed": why, "build": peer_build.describe()}
                                                  for name, why in failed.items()]
    df = pd.DataFrame(rows).set_index("sut")
    df = df.join(speed_columns(turns)) if turns else df
    df.attrs["peaks"] = peaks
    if base:
        df.attrs["repetitive"] = [i for i, t in enumerate(reference[:len(prompts)]) if repetitive_tail(tok.decode(t))]
    return df


def take_turns(runners: dict, prompts: list[list[int]], rounds: int) -> tuple[dict, dict]:
    """Every runner warmed up, then each prompt through every runner in turn, `rounds` times: per runner, a round's
    (outputs, seconds) each, and the peers that crashed, hung or printed nothing -> why (the rest go on)."""
    failed = {}

    def attempt(name, p, i):
        try:
            return runners[name](p, i)
        except peers.PeerFailed as e:
            failed[name] = str(e)
            del runners[name]
    for name in list(runners):  # warm-up, untimed: first-call allocations, oneDNN primitives, Triton kernels,
        for p in (min(prompts, key=len), max(prompts, key=len)):  # and a CUDA graph for each bucket of keys
            if name in runners:
                attempt(name, p, 0)  # from the shortest context to the longest
    turns = {name: [([], 0.0) for _ in range(rounds)] for name in runners}
    for r in range(rounds):
        for i, p in enumerate(tqdm(prompts, desc=f"bench round {r + 1}/{rounds}", dynamic_ncols=True)):
            for name in list(runners):  # interleaved: drift hits all alike
                outs, seconds = turns[name][r]
                t0 = time.perf_counter()
                out = attempt(name, p, i)
                outs.append(out)
                # llama.cpp's own timing: its prompt and decode phases, not its process's start
                turns[name][r] = (outs, seconds + (getattr(out, "seconds", None) or time.perf_counter() - t0))
    return turns, failed


def set_drafts(cfg: RunConfig, prompts: list[list[int]], acceptance: Acceptance | None, reference_dir: Path):
    """What each SUT's drafts are set to: a chain SUT's (the acceptance, the baseline's reference outputs by
    prompt) where `acceptance` is given, else None (its drafter's own)."""
    if acceptance is None:
        return lambda name: None
    synthetic = (acceptance, reference_by_prompt(cfg, prompts, reference_dir))
    return lambda name: synthetic if shape(name) in ("chain", "auto") else None


def figures(name: str, outs: list, wall: float, sut, reference, base, prompts, peaks: dict, greedy: bool) -> dict:
    """One SUT's (or peer's) figures from its outputs and seconds: tokens/s, identity with the baseline and, for
    our SUTs, the decode rate, acceptance, roof and the speculative model's prediction against the baseline's."""
    tokens = [o if isinstance(o, list) else o.tokens for o in outs]
    n = sum(len(t) for t in tokens)
    same = tokens == reference if base and greedy else None
    row = {"sut": name, "tokens": n, "tokens/s": n / wall, "identical": same}
    if outs and isinstance(outs[0], peers.Output):
        row["build"] = peer_build.describe()
        row["decode ms/token"] = 1e3 * sum(o.decode_s for o in outs) / sum(o.decoded for o in outs)
        if any(o.drafted for o in outs):
            row["draft acceptance rate"] = sum(o.accepted for o in outs) / sum(o.drafted for o in outs)
    if sut is None:
        return row
    stats = [o.stats for o in outs]
    row["SUT tokens/s (prefill + decode)"] = generation_rate(stats)
    row["decode ms/token"] = 1e3 / decode_rate(stats)
    if any(s.drafted for s in stats):
        row["draft acceptance rate"] = sum(s.accepted for s in stats) / sum(s.drafted for s in stats)
        row["per-prompt acc. min/med/max"] = "/".join(f"{q:.2f}" for q in _spread([s.acceptance_rate for s in stats]))
    row.update(roof_figures(sut, prompts, stats, peaks))
    if base and any(s.drafted for s in stats):
        f = speculative_figures(stats, base)
        row.update({
            "alpha (tested drafts)": f.alpha, "tokens/cycle measured": f.tokens_per_cycle,
            "tokens/cycle expected": f.expected_tokens_per_cycle, "c (draft/target)": f.draft_cost_ratio,
            "verify/step": f.verify_cost_ratio, "decode speedup predicted": f.predicted_speedup,
            "decode speedup measured": f.measured_speedup})
    return row


def print_differences(identical: pd.Series) -> None:
    """Names the rows whose greedy tokens differ from the baseline's: a warning for any that should match, a note
    for llama.cpp's rows over a target quantised to 8 bits (its Q8_0 weights are not the baseline's numbers)."""
    differ = [name for name, same in identical.items() if same is False]
    quantised = [name for name in differ if peers.QUANTISED in name]
    if quantised:
        print(f"note: {', '.join(quantised)} differ from the baseline's tokens, as a target quantised to "
              f"{peers.QUANTISED} may")
    if len(differ) > len(quantised):
        print(f"WARNING: outputs differ from the baseline's: {', '.join(n for n in differ if n not in quantised)}")


def _spread(values):
    return min(values), statistics.median(values), max(values)


def main(args) -> None:
    devices.check(args.device)
    if args.tree is not None:
        parse_fanout(args.tree)  # a bad fan-out is one line before anything runs
    positive_int("rounds", args.rounds)
    if args.into and (not args.into.is_file() or args.setting == "sampled"):
        raise ValueError(f"--into {args.into}: pastes the greedy table into a page that exists")
    set_threads(args.threads)  # a run's (half the cores) unless --threads says otherwise
    print(f"machine: {env.machine()}")
    print(f"versions: {', '.join(f'{k} {v}' for k, v in env.versions().items())}")
    print(f"setup: {args.samples} held-out prompts of {PROMPTS.name} x {args.max_new_tokens} new tokens, "
          f"{args.rounds} round{'s' * (args.rounds > 1)} taking turns, gamma {args.gamma}, "
          + (f"tree {args.tree}, " if args.tree else "") +
          ("" if devices.accelerated(args.device) else f"{args.weights} panels, ") +
          f"target {args.target} ({fingerprint(args.target)}), draft {args.draft} ({fingerprint(args.draft)})")
    synthetic = RunConfig(gamma=args.gamma, synthetic_acceptance_rates=args.synthetic_acceptance_rates,
                          synthetic_acceptance_length=args.synthetic_acceptance_length).acceptance()
    if synthetic is not None and args.setting != "greedy":
        raise ValueError("synthetic acceptance is greedy only: give --setting greedy")
    if synthetic is not None:
        print(f"{synthetic.label(args.gamma)} on every chain SUT: the mechanism measured, not the drafter's quality")
    tables = {}
    for setting in SETTINGS if args.setting == "both" else (args.setting,):
        params = SETTINGS[setting]
        print(f"\n{setting}" + ("" if params.greedy else f" (temperature {params.temperature}, top-p {params.top_p}, "
                                                         f"one seed per prompt from seed {params.seed})"))
        torch.manual_seed(0)
        df = run(args.target, args.draft, args.samples, args.max_new_tokens, args.gamma, args.suts or SUTS, args.device,
                 params=params, tree=args.tree, fast=args.fast,
                 peaks_cache=machine_peaks.cache_in(args.results), weights=args.weights,
                 acceptance=synthetic, reference_dir=Path(args.results) / "reference", rounds=args.rounds)
        with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format",
                               "{:.3f}".format):
            print(df.T.to_string())
        print("the roof rows are set against the peaks measured after the runs (they move with the machine's spells, "
              f"and the roof figures with them): {machine_peaks.summary(df.attrs['peaks'])}")
        if "repetitive" in df.attrs:
            print(f"baseline outputs ending in a repeated run or whitespace: {len(df.attrs['repetitive'])} of "
                  f"{args.samples} (prompts {df.attrs['repetitive']})")
        for name, why in df["failed"].dropna().items() if "failed" in df else ():
            print(f"note: {name} failed ({why}): its row is empty, every other row ran")
        print("\n" + markdown(df, caption(args, setting)))
        if params.greedy and "identical" in df:
            print_differences(df["identical"])
        if params.greedy and not any(name.startswith("hf ") for name in df.index):
            print("note: transformers is not installed, so the Hugging Face reference rows are left out")
        if params.greedy and args.device == "cpu" and not peers.available():
            print("note: " + peers.MISSING)
        tables[setting] = df
    final = save(tables, args)
    print(f"\nresults: {final}")
    if args.into:
        greedy = tables["greedy"]
        paste(args.into, markdown(greedy[greedy["TTFT ms"].notna()], caption(args, "greedy")))
        print(f"pasted the greedy table of speed (our SUTs' rows) into {args.into}")


def caption(args, setting: str) -> str:
    """How a table of speed was measured, in one line: the load, the setting, the threads, the rounds (bench prints
    the machine above it; a page that pastes it names the machine where its figures are recorded)."""
    threads = torch.get_num_threads()
    return (f"`python -m mlperf bench` ({args.samples} held-out prompts x {args.max_new_tokens} new tokens, {setting}, "
            f"gamma {args.gamma}, {args.weights} weights, {threads} torch thread{'s' * (threads > 1)} as `make run` "
            f"uses, no LoadGen): each speedup over the fp16 baseline is the median of {args.rounds} rounds taken in "
            "turns, the rounds' range in brackets; decode is tokens/s after the first token (the smoke gate's "
            "measure), end to end counts the prefill too.")


def save(tables: dict[str, pd.DataFrame], args) -> Path:
    """bench.json (the setup and every row) and bench.csv (a row per SUT and setting) under results/bench/TIME."""
    final, work = claim(Path(args.results) / "bench")
    rows = pd.concat([df.reset_index().assign(setting=setting) for setting, df in tables.items()], ignore_index=True)
    rows = rows[["setting", *(c for c in rows.columns if c != "setting")]]
    rows.to_csv(work / "bench.csv", index=False)
    setup = {"machine": env.machine(), "versions": env.versions(), "commit": env.commit(), "target": args.target,
             "target_fingerprint": fingerprint(args.target), "draft": args.draft,
             "draft_fingerprint": fingerprint(args.draft), "samples": args.samples,
             "max_new_tokens": args.max_new_tokens, "gamma": args.gamma, "tree": args.tree, "weights": args.weights,
             "device": args.device, "rounds": args.rounds, "threads": torch.get_num_threads()}
    write_json(work / "bench.json", {"setup": setup, "rows": json.loads(rows.to_json(orient="records"))})
    for setting, df in tables.items():
        (work / f"speed-{setting}.md").write_text(markdown(df, caption(args, setting)))
    work.rename(final)
    point_latest(final)
    return final
