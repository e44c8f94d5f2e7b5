"""Command line: `python -m mlperf COMMAND ...`. Errors are one line on stderr and a non-zero exit."""
import argparse
import sys
from pathlib import Path

from mlperf.checkpoint import CheckpointError
from mlperf.data import DatasetError

ASSETS = Path(__file__).parent / "assets" / "models"
DEFAULT_TARGET, DEFAULT_DRAFT = str(ASSETS / "target"), str(ASSETS / "draft")


def cmd_generate(args):
    """Greedy continuation of a prompt by one checkpoint (a quick look at what a model has learned)."""
    import torch

    from mlperf.checkpoint import load_model
    from mlperf.tokenizer import load_tokenizer
    from mlperf.train import greedy_sample
    model, tok = load_model(args.model), load_tokenizer(args.model)
    if not args.prompt:
        raise ValueError("empty prompt")
    ids = tok.encode(args.prompt)
    with torch.no_grad():
        print(args.prompt + greedy_sample(model, bytes(ids), args.tokens).decode("utf-8", "replace"))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m mlperf", description="MLPerf-style harness for LLM decoding SUTs")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help=cmd_generate.__doc__)
    g.add_argument("--model", default=DEFAULT_TARGET)
    g.add_argument("--prompt", default="def fibonacci(n):\n")
    g.add_argument("--tokens", type=int, default=128)
    g.set_defaults(fn=cmd_generate)
    b = sub.add_parser("bench", help="every SUT on the same prompts in one process; prints tokens/s, speedups, "
                                     "acceptance and the Leviathan prediction")
    b.add_argument("--target", default=DEFAULT_TARGET)
    b.add_argument("--draft", default=DEFAULT_DRAFT)
    b.add_argument("--prompts", type=int, default=24)
    b.add_argument("--tokens", type=int, default=128)
    b.add_argument("--gamma", type=int, default=4)
    b.add_argument("--device", default="cpu")
    b.add_argument("--sut", action="append", help="SUT to include (repeatable; default: all four)")
    b.set_defaults(fn=lambda args: __import__("suts.bench").bench.main(args))
    args = p.parse_args(argv)
    try:
        args.fn(args)
    except (CheckpointError, DatasetError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
