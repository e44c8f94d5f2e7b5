"""Command line: `python -m mlperf COMMAND ...`. Errors are one line on stderr and a non-zero exit."""
import argparse
import sys
from dataclasses import fields

from mlperf.checkpoint import CheckpointError
from mlperf.data import DatasetError


def cmd_run(args):
    """Run one LoadGen test (SUT x scenario x mode) and print LoadGen's summary and a short table."""
    from reports.loadgen import headline
    from scenarios import accuracy
    from scenarios.run import RunConfig, run
    cfg = RunConfig(**{f.name: getattr(args, f.name) for f in fields(RunConfig) if getattr(args, f.name, None) is not None})
    run_dir = run(cfg)
    print(f"\nresults: {run_dir}")
    for key, value in headline(run_dir).items():
        print(f"  {key:14s} {value:.3f}" if isinstance(value, float) else f"  {key:14s} {value}")
    if cfg.mode == "accuracy":
        accuracy.check(run_dir)
        print((run_dir / "accuracy.txt").read_text(), end="")


def cmd_accuracy(args):
    """Score an accuracy-mode run directory (exact match vs baseline, log-likelihood, tokens per sample)."""
    from scenarios import accuracy
    accuracy.check(args.run_dir)
    print(open(f"{args.run_dir}/accuracy.txt").read(), end="")


def cmd_bench(args):
    """Every SUT on the same prompts in one process: tokens/s, speedups, acceptance, Leviathan prediction."""
    from suts import bench
    bench.main(args)


def cmd_generate(args):
    """Greedy continuation of a prompt by the baseline SUT (a quick look at what a model has learned)."""
    from suts.registry import build_sut
    from mlperf.tokenizer import load_tokenizer
    tok = load_tokenizer(args.target)
    sut = build_sut("baseline", args.target, eos_id=tok.eos_id)
    print(args.prompt + tok.decode(sut.generate(tok.encode(args.prompt), args.tokens).tokens))


def main(argv=None):
    from scenarios.run import RunConfig
    defaults = RunConfig()
    p = argparse.ArgumentParser(prog="python -m mlperf", description="MLPerf-style harness for LLM decoding SUTs")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help=cmd_run.__doc__)
    r.add_argument("--sut", help=f"baseline, spec, spec-int8, spec-self-int8 or package.module:Class "
                                 f"(default {defaults.sut})")
    r.add_argument("--scenario", help="SingleStream, Offline or Server")
    r.add_argument("--mode", help="performance or accuracy")
    r.add_argument("--profile", help="quick (about a minute) or full (MLPerf-like durations)")
    r.add_argument("--target", help="our checkpoint or a Hugging Face GPT-2 directory (default: shipped target)")
    r.add_argument("--draft", help="draft checkpoint (default: shipped draft)")
    r.add_argument("--gamma", type=int, help="draft tokens per speculative cycle")
    r.add_argument("--adaptive", action="store_true", default=None, help="adapt gamma to acceptance")
    r.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    r.add_argument("--samples", type=int, help="use only the first N prompts")
    r.add_argument("--prompts", help="prompt JSONL (default: the shipped held-out prompts)")
    r.add_argument("--temperature", type=float)
    r.add_argument("--top-k", dest="top_k", type=int)
    r.add_argument("--top-p", dest="top_p", type=float)
    r.add_argument("--seed", type=int)
    r.add_argument("--device")
    r.add_argument("--qps", type=float, help="Offline/Server target QPS (default: calibrated)")
    r.add_argument("--offline-batch", dest="offline_batch", type=int)
    r.add_argument("--stall-timeout", dest="stall_timeout_s", type=float, help="seconds before a stuck SUT fails")
    r.add_argument("--user-conf", dest="user_conf", help="extra LoadGen user.conf lines, applied last")
    r.add_argument("--results", help="results root (default results/)")
    r.set_defaults(fn=cmd_run)

    a = sub.add_parser("accuracy", help=cmd_accuracy.__doc__)
    a.add_argument("run_dir")
    a.set_defaults(fn=cmd_accuracy)

    b = sub.add_parser("bench", help=cmd_bench.__doc__)
    b.add_argument("--target", default=defaults.target)
    b.add_argument("--draft", default=defaults.draft)
    b.add_argument("--prompts", type=int, default=24)
    b.add_argument("--tokens", type=int, default=128)
    b.add_argument("--gamma", type=int, default=4)
    b.add_argument("--device", default="cpu")
    b.add_argument("--sut", action="append", help="SUT to include (repeatable; default: all four)")
    b.set_defaults(fn=cmd_bench)

    g = sub.add_parser("generate", help=cmd_generate.__doc__)
    g.add_argument("--target", default=defaults.target)
    g.add_argument("--prompt", default="def fibonacci(n):\n")
    g.add_argument("--tokens", type=int, default=128)
    g.set_defaults(fn=cmd_generate)

    args = p.parse_args(argv)
    from scenarios.run import RunError
    try:
        args.fn(args)
    except (CheckpointError, DatasetError, RunError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
