"""Command line: `python -m mlperf COMMAND ...`. Errors are one line on stderr and a non-zero exit."""
import argparse
import json
import os
import re
import signal
import sys
from dataclasses import fields

from mlperf.checkpoint import CheckpointError
from mlperf.data import DatasetError


class GateFailed(RuntimeError):
    """The smoke gate's verdict."""


def cmd_run(args):
    """Run one LoadGen test (SUT x scenario x mode) and print LoadGen's summary and a short table; find-peak
    searches the Server's highest VALID QPS, compliance runs TEST06; accuracy and compliance are gates."""
    from commands.peak import find_peak
    from reports.loadgen import headline
    from roofline.analysis import Roofline, write_sidecar
    from scenarios import compliance
    from scenarios.records import RunConfig, RunRecord
    from scenarios.run import run
    from suts.threads import describe
    given = {f.name: getattr(args, f.name) for f in fields(RunConfig) if getattr(args, f.name, None) is not None}
    cfg = RunConfig(**{**config_file(args.config), **given}) if args.config else RunConfig(**given)
    if cfg.mode == "find-peak":
        print(f"results: {find_peak(cfg)}")
        return
    run_dir = run(cfg, (compliance.LAYER,) if cfg.mode == "compliance" else (), explain=write_sidecar)
    print(f"\nresults: {run_dir}")
    for key, value in headline(run_dir).labelled().items():
        print(f"  {key:16s} {value:.3f}" if isinstance(value, float) else f"  {key:16s} {value}")
    if (run_dir / "roofline.json").is_file():
        roof = Roofline.load(run_dir)
        phases, *speculative = roofline_lines(roof)
        print(f"{ROOFLINE_HEADER} {phases}")
        print(f"{roof.tokens_per_s:.1f} tokens/s of SUT time"
              + (f" (LoadGen: {roof.loadgen_tokens_per_s:.1f})" if roof.loadgen_tokens_per_s else ""))
        for line in speculative:
            print(f"speculative: {line} (vs {roof.baseline})")
        for note in (roof.no_baseline, roof.peaks_note):
            if note:
                print(f"note: {note}")
    record = RunRecord.load(run_dir)
    if record.fused_threads:
        print(f"fast path's threads (of {record.torch_threads}) by call size: {describe(record.fused_threads)}")
    if cfg.mode == "accuracy":  # scored before the run was published
        result = json.loads((run_dir / "accuracy.json").read_text())
        print((run_dir / "accuracy.txt").read_text(), end="")
        if not result["passed"]:
            raise GateFailed(f"accuracy: {'; '.join(result['failures'])}")
    if cfg.mode == "compliance":
        result = json.loads((run_dir / "compliance.json").read_text())
        print((run_dir / "compliance.txt").read_text(), end="")
        if not result["passed"]:
            raise GateFailed(f"TEST06: {result['failures'][0]} ({len(result['failures'])} failures, see {run_dir})")


ROOFLINE_HEADER = "roofline per phase (ms, FLOP/byte, % of roof, regime; on a GPU, the launch floor):"


def roofline_lines(roof) -> list[str]:
    """How a run's roofline (roofline.analysis.Roofline) prints: its phases on one line, then its speculative
    figures if it has them."""
    lines = ["; ".join(f"{p} {v.seconds * 1e3:.2f} ms (batch {v.batch}), {v.intensity:.1f}, "
                       f"{100 * v.fraction_of_roof:.0f}%, {v.regime}" + (
                           f", {v.launch_floor_s * 1e3:.2f} ms launch floor ({v.seconds / v.launch_floor_s:.1f}x)"
                           if v.launch_floor_s else "") for p, v in roof.phases.items())]
    if roof.speculative:
        sp = roof.speculative
        lines.append(f"alpha {sp.alpha:.3f} (tested drafts), draft acceptance rate {sp.acceptance_rate:.3f}, "
                     f"tokens/cycle {sp.tokens_per_cycle:.2f} measured, {sp.expected_tokens_per_cycle:.2f} "
                     f"expected; c {sp.draft_cost_ratio:.3f}, verify {sp.verify_cost_ratio:.2f} steps; decode "
                     f"speedup: Leviathan predicts {sp.predicted_speedup:.2f}x, measured {sp.measured_speedup:.2f}x")
    return lines


def config_file(path) -> dict:
    """Run settings from a JSON file: a RunConfig's fields, or a run's metrics.json (its config is reused)."""
    from scenarios.records import RunConfig
    try:
        raw = json.loads(open(path, encoding="utf-8").read())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read run settings from {path}: {e}") from None
    raw = raw.get("config", raw) if isinstance(raw, dict) else raw
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object of run settings, got a {type(raw).__name__}")
    unknown = sorted(raw.keys() - {f.name for f in fields(RunConfig)})
    if unknown:
        raise ValueError(f"{path}: unknown run settings {', '.join(unknown)}")
    return raw


def cmd_accuracy(args):
    """Score an accuracy-mode run directory (exact match vs baseline, log-likelihood, tokens per sample); a gate."""
    from scenarios import accuracy
    result = accuracy.check(args.run_dir)
    print(open(f"{args.run_dir}/accuracy.txt").read(), end="")
    if not result["passed"]:
        raise GateFailed(f"accuracy: {'; '.join(result['failures'])}")


def cmd_bench(args):
    """Every SUT on the same prompts in one process: tokens/s, speedups, acceptance, Leviathan prediction."""
    from commands import bench
    check_pair_options(args)
    bench.main(args)


def cmd_smoke(args):
    """The smoke gate: the baseline and the SUTs under test (default spec, spec-int8) through LoadGen in one
    process; fails unless their outputs are token-identical, the first reaches GATE x baseline tokens/s, and no
    phase runs above 1.05 times its measured roof."""
    from commands.smoke import SUTS, SUTFailed, run_smoke
    from mlperf import env
    from roofline.peaks import PLAUSIBLE
    if not 0 < args.gate < float("inf"):
        raise ValueError(f"gate must be positive, got {args.gate}")
    check_pair_options(args)
    try:
        s = run_smoke(args.target, args.draft, args.prompts, args.tokens, args.gamma, args.results, args.sut or SUTS,
                      replicas=args.replicas, ray_address=args.ray_address)
    except SUTFailed as e:
        raise GateFailed(str(e)) from None
    base = s.figures["baseline"].tokens_per_s
    gated = next(name for name in s.figures if name != "baseline")
    width = max(10, *(len(name) for name in s.figures))
    print(f"\nsmoke gate: {s.prompts} held-out prompts x {s.max_new_tokens} new tokens, greedy, gamma "
          f"{s.gamma}, LoadGen SingleStream, one process ({s.dir})")
    print(f"machine: {env.machine()}; " + ", ".join(f"{k} {v}" for k, v in env.versions().items()))
    print(f"{'sut':{width}s} {'tokens/s':>9s} {'vs base':>8s} {'accept':>7s} {'fwd/token':>9s}  identical")
    for name, f in s.figures.items():
        accept = f.roofline.speculative.acceptance_rate if f.roofline.speculative else float("nan")
        same = "-" if name == "baseline" else ("yes" if not s.mismatches[name] else
                                               f"NO ({len(s.mismatches[name])} samples differ)")
        print(f"{name:{width}s} {f.tokens_per_s:9.1f} {f.tokens_per_s / base:7.2f}x "
              f"{accept:7.2f} {f.target_forwards_per_token:9.3f}  {same}")
    print(ROOFLINE_HEADER)
    for name, f in s.figures.items():
        for i, line in enumerate(roofline_lines(f.roofline)):
            print(f"  {'' if i else name:{width}s} {line}")
    ratio = s.figures[gated].tokens_per_s / base
    failures = [f"{n} output differs from baseline on {len(m)} samples" for n, m in s.mismatches.items() if m]
    failures += [f"{n}'s {', '.join(f.roofline.implausible())} ran above {PLAUSIBLE:.0%} of the measured roof "
                 f"({f.roofline.peaks['method']}): a faster kernel than the peaks measured"
                 for n, f in s.figures.items() if f.roofline.implausible()]
    if ratio < args.gate:
        failures.append(f"{gated} runs at {ratio:.2f}x baseline tokens/s, below the gate of {args.gate}x")
    if failures:
        raise GateFailed("; ".join(failures))
    print(f"GATE PASS: {gated} at {ratio:.2f}x baseline tokens/s (gate {args.gate}x), outputs token-identical")


def cmd_report(args):
    """Comparison table, plots, HTML page and Markdown summary over runs (default: every latest run)."""
    from reports import render
    render.main(args)


def cmd_sweep(args):
    """Every SUT through LoadGen Offline at a rising max batch: tokens/s, speedups, where spec stops paying."""
    from commands.sweep import BATCHES, CHECK_ROUNDS, FIT_ROUNDS, SUTS, explain_again, sweep
    from scenarios.records import RunConfig
    if args.explain:
        explain_again(args.explain)
        return
    try:
        batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else BATCHES
    except ValueError:
        raise ValueError(f"--batches takes comma-separated integers, got {args.batches!r}") from None
    given = {k: v for k, v in vars(args).items() if k in {f.name for f in fields(RunConfig)} and v is not None}
    rounds = FIT_ROUNDS if args.fit_rounds is None else args.fit_rounds
    checks = CHECK_ROUNDS if args.check_rounds is None else args.check_rounds
    print(f"results: {sweep(RunConfig(**given), tuple(args.sut or SUTS), batches, args.samples, rounds, checks)}")


def cmd_scale(args):
    """Offline tokens/s on 1, 2, 4 ... Ray replicas beside one process on the same cores: scaling efficiency."""
    from commands.scale import scale
    from scenarios.records import RunConfig
    try:
        counts = tuple(int(n) for n in args.replicas.split(","))
    except ValueError:
        raise ValueError(f"--replicas takes comma-separated integers, got {args.replicas!r}") from None
    given = {k: v for k, v in vars(args).items() if k in {f.name for f in fields(RunConfig)} and v is not None
             and k != "replicas"}
    print(f"results: {scale(RunConfig(**given), counts, args.samples)}")


def cmd_qps_sweep(args):
    """Every SUT through LoadGen Server at a range of loads: p99 TTFT, p99 TPOT and goodput against QPS."""
    from commands.qps import LOADS, SUTS, qps_sweep
    from scenarios.records import RunConfig
    try:
        loads = tuple(float(q) for q in args.qps.split(",")) if args.qps else LOADS
    except ValueError:
        raise ValueError(f"--qps takes comma-separated numbers, got {args.qps!r}") from None
    given = {k: v for k, v in vars(args).items() if k in {f.name for f in fields(RunConfig)} and v is not None
             and k != "qps"}
    print(f"results: {qps_sweep(RunConfig(**given), tuple(args.sut or SUTS), loads)}")


def cmd_peaks(args):
    """Measure this machine's peak FLOP/s and memory bandwidth again (cached in results/peaks.json), at the
    torch thread count runs use (half the cores), since a roof measured on more threads is out of reach."""
    from roofline import peaks
    from scenarios.records import DTYPES, RunConfig
    from scenarios.run import set_threads
    if args.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {args.dtype!r}; choose one of {', '.join(DTYPES)}")
    RunConfig(device=args.device, threads=args.threads).validate()  # the device and thread count
    set_threads(args.threads)
    p = peaks.load(args.device, DTYPES[args.dtype], remeasure=True)
    print(f"{p['fingerprint']}: {peaks.summary(p)}")


def cmd_profile(args):
    """Where each phase's time goes on this machine: a forward of every phase the roofline costs, profiled by kind
    of operator and set against its roof; then the SUTs' own decode step and cycle against those bare forwards."""
    from mlperf import env
    from mlperf.checkpoint import load_model
    from mlperf.data import load_prompts
    from mlperf.tokenizer import load_tokenizer
    from roofline import peaks
    from roofline.analytic import phase_costs
    from roofline.profile import (CONTEXT, PROMPT, SHORT, against, bookkeeping_s, context_cost, decode_in_forwards,
                                  draft_chain_s, matvec_streams, profile_pair, spells, table)
    from scenarios.run import set_threads
    from suts.registry import build_sut
    check_pair_options(args)
    if args.tokens < 2:
        raise ValueError(f"--tokens must be at least 2 (decode steps follow the prefill's token), got {args.tokens}")
    set_threads(args.threads)
    suts = {name: build_sut(name, args.target, args.draft, gamma=args.gamma) for name in ("baseline", "spec")}
    timed = profile_pair(suts["spec"].target, suts["spec"].draft, args.gamma)
    (roof, listed), note = peaks.judged(  # this hour's peaks, as the phases were timed
        lambda p: (p, against(timed, p)), lambda r: peaks.implausible({x.name: x.fraction_of_roof for x in r[1]}),
        lambda: peaks.load(remeasure=True))
    profiles = {p.name.split(" (")[0]: p for p in listed}
    print(f"machine: {env.machine()}; " + ", ".join(f"{k} {v}" for k, v in env.versions().items()))
    print(f"peaks: {peaks.summary(roof)}" + (f"\n({note})" if note else ""))
    print("one forward per phase, batch 1, context 256 (prefill: a 200-token prompt); % of the profiled time by kind:")
    print(table(list(profiles.values())))
    added = {name: context_cost(suts["spec"].target, new, roof) for name, new in
             (("decode", 1), (f"verify ({args.gamma + 1} tokens)", args.gamma + 1))}
    print(f"what {CONTEXT - SHORT} more keys add to a forward (context {CONTEXT} against {SHORT}): " + ", ".join(
        f"{name} +{took * 1e3:.3f} ms (+{ideal * 1e3:.3f} at the roofs)" for name, (took, ideal) in added.items())
        + " (attention: each head's keys and values, read after the weights' stream has pushed them out)")
    print_row_costs(suts["spec"].target, args.gamma, roof)
    plain = load_model(args.target)  # unpacked: what torch.compile and the kernels' stream comparison start from
    if args.compile:
        print_compiled(suts["spec"], plain, load_model(args.draft), args.gamma)
    streams = matvec_streams(plain)
    print("one row through the target's linear weights, layer after layer: " + ", ".join(
        f"{name} {bps / 1e9:.1f} GB/s" for name, bps in streams.items()))
    prompt = load_tokenizer(args.target).encode(load_prompts()[0].text)[-200:]
    for name, sut in suts.items():
        stats, inside, _ = decode_in_forwards(sut, prompt, args.tokens)
        if name == "baseline":
            per, step, what = stats.steps, stats.decode_s / stats.steps, "decode step"
            bare = profiles["decode"].seconds
        else:
            per, step, what = stats.cycles, (stats.draft_s + stats.verify_s) / stats.cycles, "cycle"
            bare = stats.drafted / stats.cycles * profiles["draft step"].seconds + profiles["verify"].seconds
        if inside is None:
            print(f"{name} {what} in the SUT: {step * 1e3:.3f} ms, its bare forwards {bare * 1e3:.3f} ms "
                  f"({100 * (step - bare) / step:.0f}% outside them: sampling, acceptance, the loop)")
            continue
        forwards = inside / per
        print(f"{name} {what} in the SUT: {step * 1e3:.3f} ms, {forwards * 1e3:.3f} of it in its forwards "
              f"({100 * (step - forwards) / step:.0f}% outside them: sampling, acceptance, the loop); the bare "
              f"forwards above {bare * 1e3:.3f} ms, timed at their best (the run's "
              f"{100 * (forwards / bare - 1):+.0f}%: its contexts, and the spells below)")
    s = spells(suts["baseline"].target)
    print(f"the decode step at context {CONTEXT}, {s.steps} times in a row: p10 {s.percentiles[10]:.3f}, median "
          f"{s.percentiles[50]:.3f}, p90 {s.percentiles[90]:.3f} ms; the median of {s.span} steps in a row from "
          f"{s.spans[0]:.3f} to {s.spans[1]:.3f} ms (one step's time against the next's: correlation "
          f"{s.correlation:.2f}): this machine's spells, which a run's mean step inherits and a best-of timing does "
          "not")
    warm, cold = bookkeeping_s(suts["baseline"].target)
    print(f"a step's bookkeeping in tensors, as a sampled step keeps it (ids to a tensor, argmax to a list, a cache's "
          f"length set; a greedy step's ids and argmaxes go through ctypes buffers instead): {warm * 1e6:.0f} us "
          f"straight after itself, {cold * 1e6:.0f} us right after a decode forward (its weights' stream evicts "
          "the interpreter's data from the caches)")
    target, draft = suts["spec"].target, suts["spec"].draft
    warm, cold = draft_chain_s(target, draft, args.gamma)
    in_cycle = peaks.draft_roofline_s(phase_costs(target.config, PROMPT, CONTEXT, draft.config, args.gamma), roof,
                                      args.gamma)
    print(f"the draft's chain of {args.gamma} steps: {warm * 1e3:.3f} ms straight after itself, {cold * 1e3:.3f} ms right "
          f"after a verify pass (whose stream evicts the draft's weights: {warm / args.gamma * 1e3:.3f} against "
          f"{cold / args.gamma * 1e3:.3f} ms a step, {100 * in_cycle * args.gamma / cold:.0f}% of a step's roof in a "
          f"cycle, {in_cycle * 1e3:.3f} ms: the first step's bytes at the read speed of the cycle's working set)")


def print_row_costs(target, gamma: int, roof: dict) -> None:
    """What each row of a batch adds to the target's greedy step, as the batch sweep's rows (roofline.profile's
    row_costs), for a decode step and a verify pass."""
    import pandas as pd
    from commands.sweep import BATCHES
    from roofline.profile import CONTEXT, row_costs
    steps = {"decode": 1, f"verify ({gamma + 1} tokens)": gamma + 1}
    table = pd.concat({name: row_costs(target, new, BATCHES, roof) for name, new in steps.items()}, axis=1)
    print(f"a batch's greedy step at context {CONTEXT}, by rows: what a row adds, at the roofs (its arithmetic in "
          "full, its logits and attention) and beyond them (the cost a row the batching model fits at batch 2 and "
          "holds fixed):")
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(table.to_string())


def print_compiled(sut, target, draft, gamma: int) -> None:
    """`profile --compile`: every phase's forward through torch.compile against the SUTs' eager one, or one line
    saying why torch.compile could not run here."""
    from roofline.profile import compile_phase, phases
    print("torch.compile (inductor, frozen weights) of the plain models against the SUTs' eager forwards:")
    for (name, eager, context, new), (_, plain, _, _) in zip(phases(sut.target, sut.draft, gamma),
                                                             phases(target, draft, gamma)):
        try:
            c = compile_phase(name, eager, plain, context, new)
        except Exception as e:  # no C++ compiler, an operator inductor cannot lower: the eager figures stand
            print(f"  torch.compile is unavailable here ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            return
        print(f"  {name}: eager {c.eager_s * 1e3:.3f} ms, compiled {c.compiled_s * 1e3:.3f} ms "
              f"({c.eager_s / c.compiled_s:.2f}x; first call {c.compile_s:.1f} s; max |logit diff| {c.max_diff:.1e})")


def cmd_generate(args):
    """Greedy continuation of a prompt by the baseline SUT (a quick look at what a model has learned)."""
    from suts.registry import build_sut
    from mlperf.tokenizer import load_tokenizer
    tok = load_tokenizer(args.target)
    sut = build_sut("baseline", args.target, eos_id=tok.eos_id)
    print(args.prompt + tok.decode(sut.generate(tok.encode(args.prompt), args.tokens).tokens))


def cmd_random_model(args):
    """A checkpoint of a named geometry with random weights (GPT-2's init, seeded), for timing on real sizes:
    random weights decide a run's speed, not what a draft's acceptance would be with trained ones."""
    import torch
    from mlperf.checkpoint import save_checkpoint
    from mlperf.model import GEOMETRIES, GPT
    if args.geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {args.geometry!r}; choose one of {', '.join(GEOMETRIES)}")
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = GPT(GEOMETRIES[args.geometry])
    save_checkpoint(model, args.out, meta={"weights": f"random, GPT-2's init, seed {args.seed}"})
    print(f"{args.out}: {args.geometry}, {model.num_params() / 1e6:.1f}M parameters, random weights (seed {args.seed})")


def add_pair_options(parser, defaults, tokens: int) -> None:
    """The options bench and smoke share: the model pair, how many held-out prompts, tokens each, gamma."""
    parser.add_argument("--target", default=defaults.target)
    parser.add_argument("--draft", default=defaults.draft)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=tokens)
    parser.add_argument("--gamma", type=int, default=defaults.gamma)


def check_pair_options(args) -> None:
    for name in ("prompts", "tokens", "gamma"):
        if getattr(args, name, 1) < 1:
            raise ValueError(f"--{name} must be a positive integer, got {getattr(args, name)}")


def add_replica_options(parser) -> None:
    parser.add_argument("--replicas", type=int, help="serve the SUT from N Ray replicas, LoadGen in this process "
                        "(default: the SUT in this process)")
    parser.add_argument("--ray-address", dest="ray_address", help="with --replicas: the Ray cluster to join, auto "
                        "or host:port (default: a local Ray instance on this machine, stopped after the run)")


def main(argv=None):
    from scenarios.records import SERVER_TOKEN_BUDGET, RunConfig
    from suts.registry import SUTS
    defaults = RunConfig()
    p = argparse.ArgumentParser(prog="python -m mlperf", description="MLPerf-style harness for LLM decoding SUTs")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help=cmd_run.__doc__)
    r.add_argument("--sut", help=f"{', '.join(SUTS)} or package.module:Class (default {defaults.sut})")
    r.add_argument("--scenario", help="SingleStream, Offline or Server")
    r.add_argument("--mode", help="performance, accuracy, compliance (TEST06) or find-peak (Server)")
    r.add_argument("--config", help="a JSON file of run settings, or a run's metrics.json to repeat it (options win)")
    r.add_argument("--profile", help="quick (1-2 minutes) or full (MLPerf-like durations)")
    r.add_argument("--target", help="our checkpoint or a Hugging Face GPT-2 directory (default: shipped target)")
    r.add_argument("--draft", help="draft checkpoint (default: shipped draft)")
    r.add_argument("--head", help="eagle: the EAGLE head's checkpoint (default: the shipped target's)")
    r.add_argument("--tokenizer", help="the target's tokenizer when it is not beside it: a nanoGPT meta.pkl (or its "
                                       "dataset directory) or a directory with GPT-2's tokenizer files")
    r.add_argument("--gamma", type=int, help="draft tokens per speculative cycle (a -tree SUT's depth is its tree's)")
    r.add_argument("--adaptive", action="store_true", default=None, help="adapt gamma to acceptance")
    r.add_argument("--tree", help="the -tree SUTs: children per depth, e.g. 4,2,1 (default: the SUT's own)")
    r.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    r.add_argument("--samples", type=int, help="use only the first N prompts")
    r.add_argument("--prompts", help="prompt JSONL (default: the shipped held-out prompts)")
    r.add_argument("--temperature", type=float)
    r.add_argument("--top-k", dest="top_k", type=int)
    r.add_argument("--top-p", dest="top_p", type=float)
    r.add_argument("--seed", type=int)
    r.add_argument("--device")
    r.add_argument("--dtype", help="float32, float16 or bfloat16 (default: fp16 on CUDA, fp32 on CPU)")
    r.add_argument("--no-fast", dest="fast", action="store_false", default=None,
                   help="no fast path (fused C steps on a CPU, CUDA graphs on a GPU): what it buys, measured")
    r.add_argument("--qps", type=float, help="Offline/Server target QPS; find-peak's starting QPS (Server default: "
                                             "the profile's load for the model)")
    r.add_argument("--max-batch", dest="max_batch", type=int,
                   help="Offline/Server: sequences decoding together at most (continuous batching)")
    r.add_argument("--token-budget", dest="token_budget", type=int,
                   help="Offline/Server: tokens the target takes per scheduler iteration, the step's first, then "
                        f"prefill chunks (default: {SERVER_TOKEN_BUDGET} in Server, whole prompts in Offline)")
    r.add_argument("--threads", type=int, help="torch threads (default: half the cores, the rest left to LoadGen)")
    r.add_argument("--stall-timeout", dest="stall_timeout_s", type=float, help="seconds before a stuck SUT fails")
    r.add_argument("--user-conf", dest="user_conf", help="LoadGen user.conf lines that win over every other setting")
    r.add_argument("--run-dir", dest="run_dir", help="write the run here instead of results/SUT/SCENARIO/MODE/TIME")
    r.add_argument("--results", help="results root (default results/)")
    add_replica_options(r)
    r.set_defaults(fn=cmd_run)

    a = sub.add_parser("accuracy", help=cmd_accuracy.__doc__)
    a.add_argument("run_dir")
    a.set_defaults(fn=cmd_accuracy)

    b = sub.add_parser("bench", help=cmd_bench.__doc__)
    add_pair_options(b, defaults, tokens=128)
    b.add_argument("--device", default="cpu")
    b.add_argument("--no-fast", dest="fast", action="store_false",
                   help="no fast path (fused C steps on a CPU, CUDA graphs on a GPU)")
    b.add_argument("--sut", action="append", help="SUT to include (repeatable; default baseline, spec, "
                                                          "spec-tree, spec-int8, spec-self-int8, ngram, ngram-tree, eagle, eagle-tree)")
    b.add_argument("--tree", help="the shape every -tree SUT drafts, children per depth (default: each one's own)")
    b.add_argument("--setting", choices=("greedy", "sampled", "both"), default="both",
                   help="greedy, sampled (temperature 0.8, top-p 0.95, seeded) or both (default)")
    b.add_argument("--results", default="results", help="results root, where the peaks are cached (default results/)")
    b.set_defaults(fn=cmd_bench)

    sm = sub.add_parser("smoke", help=cmd_smoke.__doc__)
    sm.add_argument("--gate", type=float, default=1.4, help="minimum tokens/s ratio of the first SUT to the baseline")
    sm.add_argument("--sut", action="append", help="a SUT under test, registered or package.module:Class (repeatable; "
                                                   "default spec, spec-int8; the first is gated)")
    add_pair_options(sm, defaults, tokens=96)
    sm.add_argument("--results", default="results")
    add_replica_options(sm)
    sm.set_defaults(fn=cmd_smoke)

    rp = sub.add_parser("report", help=cmd_report.__doc__)
    rp.add_argument("runs", nargs="*", help="run directories (default: results/*/*/performance/latest)")
    rp.add_argument("--results", default="results")
    rp.add_argument("--out", default="results/report")
    rp.set_defaults(fn=cmd_report)

    sw = sub.add_parser("sweep", help=cmd_sweep.__doc__)
    sw.add_argument("--sut", action="append", help="SUT to include (repeatable; default baseline, spec, "
                                                           "spec-tree, spec-int8, ngram, eagle)")
    sw.add_argument("--batches", help="comma-separated max batches, rising from 1 (default 1,2,4,8,16,32,64)")
    sw.add_argument("--samples", type=int, default=64, help="prompts every run decodes (default 64)")
    sw.add_argument("--fit-rounds", dest="fit_rounds", type=int,
                    help="runs of batch 1 and of batch 2, which the prediction is fitted on, spread over the sweep "
                         "(default 3)")
    sw.add_argument("--check-rounds", dest="check_rounds", type=int,
                    help="runs of every other batch, which the prediction is checked against (their mean), spread "
                         "over the sweep (default 1)")
    sw.add_argument("--explain", metavar="SWEEP_DIR", help="write a finished sweep's table and plot again from its runs")
    for name in ("target", "draft", "device", "dtype", "results", "user_conf"):
        sw.add_argument(f"--{name.replace('_', '-')}", dest=name)
    sw.add_argument("--gamma", type=int)
    sw.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    sw.add_argument("--threads", type=int)
    add_replica_options(sw)
    sw.set_defaults(fn=cmd_sweep)

    sc = sub.add_parser("scale", help=cmd_scale.__doc__)
    sc.add_argument("--sut", default="spec", help="the SUT to scale (default spec)")
    sc.add_argument("--replicas", default="1,2", help="comma-separated replica counts, rising from 1 (default 1,2)")
    sc.add_argument("--samples", type=int, default=128, help="prompts every run decodes (default 128)")
    sc.add_argument("--threads", type=int, help="torch threads of each replica (default: the cores over the largest "
                                                "count)")
    sc.add_argument("--ray-address", dest="ray_address", help="the Ray cluster to join (default: a local instance)")
    for name in ("target", "draft", "device", "dtype", "results", "user_conf"):
        sc.add_argument(f"--{name.replace('_', '-')}", dest=name)
    for name in ("gamma", "max_batch", "max_new_tokens"):
        sc.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int)
    sc.set_defaults(fn=cmd_scale)

    qs = sub.add_parser("qps-sweep", help=cmd_qps_sweep.__doc__)
    qs.add_argument("--sut", action="append", help="SUT to include (repeatable; default baseline, spec)")
    qs.add_argument("--qps", help="comma-separated Server loads, rising (default 0.25,0.5,1,2)")
    for name in ("profile", "target", "draft", "head", "device", "dtype", "results", "user_conf"):
        qs.add_argument(f"--{name.replace('_', '-')}", dest=name)
    for name in ("gamma", "max_batch", "token_budget", "max_new_tokens", "threads"):
        qs.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int)
    qs.set_defaults(fn=cmd_qps_sweep)

    pf = sub.add_parser("profile", help=cmd_profile.__doc__)
    pf.add_argument("--target", default=defaults.target)
    pf.add_argument("--draft", default=defaults.draft)
    pf.add_argument("--gamma", type=int, default=defaults.gamma)
    pf.add_argument("--tokens", type=int, default=64, help="tokens the SUTs generate for their step times")
    pf.add_argument("--threads", type=int, help="torch threads (default: as runs use, half the cores)")
    pf.add_argument("--compile", action="store_true", help="also time every phase through torch.compile")
    pf.set_defaults(fn=cmd_profile)

    pk = sub.add_parser("peaks", help=cmd_peaks.__doc__)
    pk.add_argument("--device", default="cpu")
    pk.add_argument("--dtype", default="float32")
    pk.add_argument("--threads", type=int, help="torch threads (default: as runs use, half the cores)")
    pk.set_defaults(fn=cmd_peaks)

    g = sub.add_parser("generate", help=cmd_generate.__doc__)
    g.add_argument("--target", default=defaults.target)
    g.add_argument("--prompt", default="def fibonacci(n):\n")
    g.add_argument("--tokens", type=int, default=128)
    g.set_defaults(fn=cmd_generate)

    rm = sub.add_parser("random-model", help=cmd_random_model.__doc__)
    rm.add_argument("geometry", help="a named geometry: target, draft, gpt2, gpt2-medium, gpt2-large, gpt2-xl")
    rm.add_argument("out", help="the checkpoint directory to write")
    rm.add_argument("--seed", type=int, default=0)
    rm.add_argument("--device", default="cpu", help="where to draw the weights (cuda: faster for gpt2-xl)")
    rm.set_defaults(fn=cmd_random_model)

    args = p.parse_args(argv)
    from scenarios.run import Interrupted, RunError, on_signal, signum_of
    signal.signal(signal.SIGTERM, on_signal)  # SIGTERM ends any command as Ctrl-C does, exit 143
    try:
        args.fn(args)
    except GateFailed as e:
        print(f"GATE FAIL: {e}", file=sys.stderr)
        return 1
    except RunError as e:
        print("interrupted: " + re.sub(r"^interrupted [(]([^)]*)[)]", r"\1", str(e)) if isinstance(e, Interrupted)
              else f"error: {e}", file=sys.stderr)
        # After a failed or interrupted LoadGen test, native teardown at interpreter exit can abort ("terminate
        # called without an active exception") or wait on LoadGen; everything is written, so leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + e.signum if isinstance(e, Interrupted) else 1)
    except (CheckpointError, DatasetError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print("interrupted", file=sys.stderr)
        return 128 + signum_of(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
