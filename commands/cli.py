"""Command line: `python -m mlperf COMMAND ...`. Errors are one line on stderr and a non-zero exit.

Each command is a parser (its options) and a function of the parsed arguments; the work is in the command's own
module (commands/runs.py, smoke.py, bench.py, profile.py; the series' parsers in series.py: sweep.py, pareto.py,
scale.py, qps.py) or the package it names.
"""
import argparse
import os
import re
import signal
import sys
from pathlib import Path

from commands.options import (COUNTS, SYNTHETIC, add_pair_options, add_rounds, add_run_options, add_several,
                              options_of, run_config, run_defaults)
from commands.series import add_series_commands
from commands.smoke import GATE, PROMPTS, ROUNDS, SUTS as SMOKE_SUTS, TOKENS
from commands.speed import ROUNDS as BENCH_ROUNDS
from commands.exits import BAD_INPUT, VERDICT_FAILED, GateFailed, VerdictFailed
from mlperf.checkpoint import CheckpointError
from mlperf.data import DatasetError

SERVE_OPTIONS = ("sut", "target", "draft", "head", "tokenizer", "gamma", "adaptive", "tree", "drafter", "device",
                 "dtype", "fast", "weights", "max_batch", "token_budget", "threads", "prompts", "samples", *SYNTHETIC)


def cmd_run(args):
    """Run one LoadGen test (SUT x scenario x mode) and print LoadGen's summary and a short table; find-peak
    searches the Server's highest VALID QPS, compliance runs TEST06; accuracy and compliance are gates."""
    from commands import runs
    runs.main(args)


def cmd_accuracy(args):
    """Score an accuracy-mode run directory (exact match vs baseline, log-likelihood, tokens per sample); a gate."""
    from commands import runs
    runs.accuracy(args)


def cmd_bench(args):
    """Every SUT on the same prompts in one process: tokens/s, speedups, acceptance, predicted speedup."""
    from commands import bench
    run_defaults(args, ("device", "weights", "fast", "threads", "results", *COUNTS))
    bench.main(args)


def cmd_peers(args):
    """Build llama.cpp once from the pinned llama-cpp-python source distribution, for bench's llama.cpp rows, and
    check each tool on the shipped pair (rebuilt once, portable, where one dies of a signal)."""
    from commands import peer_build
    peer_build.main()


def cmd_smoke(args):
    """The smoke gate: the baseline and the SUTs under test (default spec, spec-int8) through LoadGen in one
    process; fails unless their outputs are token-identical, the first decodes at GATE x the baseline's tokens/s
    after the first token and is no slower end to end, and no phase runs above 1.05 times its measured roof."""
    from commands import smoke
    run_defaults(args, ("weights", "results", *COUNTS))
    smoke.main(args)


def cmd_serve(args):
    """Serve a SUT on our engine over an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models,
    /health, /metrics)."""
    from serving.listen import Listen
    from serving.server import serve
    serve(run_config(args), options_of(args, Listen))


def cmd_report(args):
    """Comparison table, plots, HTML page and Markdown summary over runs (default: every latest run)."""
    from reports import render
    run_defaults(args, ("results",))
    render.main(args)


def cmd_submission(args):
    """An MLPerf submission tree (MLCommons' v6.x layout) from the newest VALID/PASS runs in results/."""
    from commands import submission
    run_defaults(args, ("results",))
    submission.main(args)


def cmd_check_submission(args):
    """MLCommons' own submission checker over a tree, this benchmark registered in its tables; its exit code."""
    from commands import submission
    sys.exit(submission.check(args))


def cmd_peaks(args):
    """Measure this machine's peak FLOP/s and memory bandwidth again (cached in results/peaks.json), at the
    torch thread count runs use (half the cores), since a roof measured on more threads is out of reach."""
    from mlperf.devices import default_dtype
    from roofline import peaks
    from scenarios.config import DTYPES
    from mlperf.env import set_threads
    run_defaults(args, ("device", "dtype", "threads"))
    set_threads(args.threads)
    p = peaks.load(args.device, DTYPES.get(args.dtype) or default_dtype(args.device), max_age_s=0)
    print(f"{p['fingerprint']}: {peaks.summary(p)}")


def cmd_profile(args):
    """Where each phase's time goes on this machine: a forward of every phase the roofline costs, profiled by kind
    of operator and set against its roof; then the SUTs' own decode step and cycle against those bare forwards."""
    from commands import profile
    profile.main(args)


def cmd_generate(args):
    """Greedy continuation of a prompt by the baseline SUT (a quick look at what a model has learned)."""
    from suts.registry import build_sut
    from mlperf.tokenizer import load_tokenizer
    tok = load_tokenizer(args.target)
    sut = build_sut("baseline", args.target, eos_id=tok.eos_id)
    print(args.prompt + tok.decode(sut.generate(tok.encode(args.prompt), args.max_new_tokens).tokens))


def cmd_export(args):
    """Our checkpoint as a Hugging Face GPT-2 folder with a byte-level tokenizer.json, for the clients and tools that
    read a model or its tokenizer the Hugging Face way (AIPerf, GuideLLM, lm-eval, transformers), offline."""
    from mlperf.hf import export
    run_defaults(args, ("target",))
    print(f"wrote {export(args.target, args.hf)}: load it with transformers' AutoTokenizer and AutoModelForCausalLM")


def cmd_whatif(args):
    """Where speculative decoding pays here: spec at set synthetic acceptance rates against the fp16 baseline, per
    model pair and gamma, through LoadGen, beside the roofline's prediction of every point (resumable)."""
    from commands import whatif
    whatif.main(args)


def cmd_defaults(args):
    """The defaults a user meets (gamma, weights, max batch, the profiles' limits, the gate), as Markdown."""
    from commands import defaults
    defaults.main(args)


def cmd_random_model(args):
    """A checkpoint of a named geometry with random weights (GPT-2's init, seeded), for timing on real sizes:
    random weights decide a run's speed, not what a draft's acceptance would be with trained ones."""
    from mlperf.checkpoint import random_checkpoint
    run_defaults(args, ("device",))
    model = random_checkpoint(args.geometry, args.out, args.seed, args.device)
    print(f"{args.out}: {args.geometry}, {model.num_params() / 1e6:.1f}M parameters, random weights (seed {args.seed})")


def add_out(parser, what: str, **options) -> None:
    parser.add_argument("--out", help=f"{what} (default {options['default']})" if "default" in options else what,
                        **options)


def add_mlc(parser) -> None:
    parser.add_argument("--mlc", help="a checkout of mlcommons/inference (default: $MLC_INFERENCE_DIR, else "
                                      "../shared/mlcommons-inference)")


def add_config(parser) -> None:
    parser.add_argument("--config", help="a JSON file of run settings, or a run's metrics.json to repeat it (options "
                                         "win)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mlperf", description="MLPerf-style harness for LLM decoding SUTs")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, fn) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=fn.__doc__)
        parser.set_defaults(fn=fn)
        return parser
    for add in (add_test_commands, add_series_commands, add_machine_commands):
        add(command)
    return p


def add_test_commands(command) -> None:
    """The commands that run LoadGen tests or read them: run, accuracy, bench, smoke, report."""
    r = command("run", cmd_run)
    add_run_options(r)
    add_config(r)
    command("accuracy", cmd_accuracy).add_argument("run_dir")

    b = command("bench", cmd_bench)
    add_pair_options(b, tokens=128, samples=24)
    from commands.bench import SUTS as BENCH_SUTS
    add_several(b, "sut", BENCH_SUTS)
    # results: the peaks' cache and the bench's own folder
    add_run_options(b, ("device", "weights", "tree", "fast", "threads", "results", *SYNTHETIC))
    b.add_argument("--setting", choices=("greedy", "sampled", "both"), default="both",
                   help="greedy, sampled (temperature 0.8, top-p 0.95, seeded) or both (default)")
    add_rounds(b, BENCH_ROUNDS, f"the SUTs take turns this many rounds, each on every prompt: each speedup is the "
               f"median round's, with the range (default {BENCH_ROUNDS})")
    b.add_argument("--into", type=Path, help="a page (README.md) whose speed table's markers get the greedy table's "
                   "rows of our SUTs")

    command("peers", cmd_peers)

    sm = command("smoke", cmd_smoke)
    sm.add_argument("--gate", type=float, default=GATE,
                    help=f"minimum ratio of the first SUT's tokens/s after the first token (LoadGen's time per output "
                    f"token) to the baseline's (default {GATE})")
    add_rounds(sm, ROUNDS, f"SUTs take turns this many rounds, each on every prompt (default {ROUNDS} of {PROMPTS} "
               "prompts: a load that comes and goes on the machine falls on every SUT alike)")
    add_several(sm, "sut", f"{', '.join(SMOKE_SUTS)}; the first is gated")
    add_pair_options(sm, tokens=TOKENS, samples=PROMPTS)
    add_run_options(sm, ("replicas", "ray_address", "endpoint", "model", "engine", "weights", "results", *SYNTHETIC))

    sv = command("serve", cmd_serve)
    add_run_options(sv, SERVE_OPTIONS)
    add_config(sv)
    from serving.listen import Listen
    add_run_options(sv, settings=Listen)

    rp = command("report", cmd_report)
    rp.add_argument("runs", nargs="*", help="run directories (default: results/*/*/*/performance/latest)")
    add_run_options(rp, ("results",))
    add_out(rp, "the folder the page goes in", default="results/report")

    su = command("submission", cmd_submission)
    su.add_argument("--org", required=True, help="the submitting organisation (a plain name)")
    add_out(su, "the tree to write (a new directory)", required=True)
    su.add_argument("--division", choices=("closed", "open"), default="closed")
    add_several(su, "sut", "baseline, spec")
    add_several(su, "scenario", "SingleStream, Offline")
    add_run_options(su, ("results", "target", "draft"))  # the runs of this pair
    add_mlc(su)
    cs = command("check-submission", cmd_check_submission)
    cs.add_argument("tree", help="a tree `python -m mlperf submission` wrote")
    add_mlc(cs)


def add_machine_commands(command) -> None:
    """The commands about the machine and the models: profile, peaks, generate, random-model."""
    pf = command("profile", cmd_profile)
    add_pair_options(pf, tokens=64)
    pf.add_argument("--compile", action="store_true", help="also time every phase through torch.compile")
    add_run_options(pf, ("weights", "threads"))

    pk = command("peaks", cmd_peaks)
    add_run_options(pk, ("device", "dtype", "threads"))

    g = command("generate", cmd_generate)
    add_pair_options(g, tokens=128, draft=False)
    g.add_argument("--prompt", default="def fibonacci(n):\n")

    command("defaults", cmd_defaults)

    wi = command("whatif", cmd_whatif)
    from commands.whatif import PAIRS, PRESETS
    wi.add_argument("--preset", choices=tuple(PRESETS), default="sweep",
                    help="sweep (6 acceptance rates x gamma 2 and 4 over the seed's pair and GPT-2 medium's, 128-token "
                         "prompts) or seed (the seed's own point: prefill 2048, decode 64, gamma 4, acceptance 0.7)")
    add_several(wi, "pair", f"the preset's; any of {', '.join(PAIRS)}")
    wi.add_argument("--auto", action="store_true", help="spec-auto at each point too: the chain length its planner "
                    "chooses beside the roofline's best gamma")
    add_rounds(wi, 1, "the baseline and spec take turns this many rounds at each point: each figure is the median "
                      "turn's, with the range of the turns' speedups (default 1)")
    add_run_options(wi, ("target", "draft", "threads", "results"), defaults={"target": None, "draft": None,
                                                                          "results": "results"})

    ex = command("export", cmd_export)
    ex.add_argument("--hf", type=Path, required=True, help="the Hugging Face folder to write")
    add_run_options(ex, ("target",))

    rm = command("random-model", cmd_random_model)
    rm.add_argument("geometry", help="a named geometry: target, draft, seed-target, seed-draft, gpt2, gpt2-medium, "
                                     "gpt2-large, gpt2-xl, gpt2-medium-draft, gpt2-large-draft, gpt2-xl-draft")
    rm.add_argument("out", help="the checkpoint directory to write")
    rm.add_argument("--init-seed", dest="seed", type=int, default=0, help="the weights' seed (default 0)")
    add_run_options(rm, ("device",))  # where to draw the weights (cuda: faster for gpt2-xl)


def main(argv=None):
    """Exit 0 on a pass, VERDICT_FAILED (1) when a verdict failed (GATE FAIL, INVALID, an accuracy or TEST06 FAIL),
    BAD_INPUT (2) on bad input or a crash, 128 + the signal when interrupted (docs/running.md, "Exit codes")."""
    args = parser().parse_args(argv)  # a bad flag: argparse's usage line and exit 2 (BAD_INPUT)
    from serving.endpoint import API_KEY
    from scenarios.run import Interrupted, RunError, on_signal, signum_of
    signal.signal(signal.SIGTERM, on_signal)  # SIGTERM ends any command as Ctrl-C does, exit 143
    if getattr(args, "api_key", None) and args.command != "serve":  # for the run and the runs it starts
        os.environ[API_KEY] = args.api_key
    try:
        args.fn(args)
    except GateFailed as e:
        print(f"GATE FAIL: {e}", file=sys.stderr)
        return VERDICT_FAILED
    except VerdictFailed as e:
        print(f"{e}", file=sys.stderr)
        return VERDICT_FAILED
    except RunError as e:
        print("interrupted: " + re.sub(r"^interrupted [(]([^)]*)[)]", r"\1", str(e)) if isinstance(e, Interrupted)
              else f"error: {e}", file=sys.stderr)
        # After a failed or interrupted LoadGen test, native teardown at interpreter exit can abort ("terminate
        # called without an active exception") or wait on LoadGen; everything is written, so leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + e.signum if isinstance(e, Interrupted) else BAD_INPUT)
    except (CheckpointError, DatasetError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt as e:
        print("interrupted", file=sys.stderr)
        return 128 + signum_of(e)
    except Exception as e:  # a crash: one line, never a traceback (MLPERF_TRACEBACK=1 shows it)
        if os.environ.get("MLPERF_TRACEBACK"):
            raise
        print(f"error: {type(e).__name__}: {e} (MLPERF_TRACEBACK=1 shows where)", file=sys.stderr)
        return BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
