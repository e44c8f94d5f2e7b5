"""Command-line options in one place: every run flag made from a RunConfig field (its type, its help below), the
RunConfig built back from parsed arguments, and the options bench and smoke share."""
import json
from dataclasses import fields
from typing import get_args

HELP = {
    "scenario": "SingleStream, Offline or Server",
    "mode": "performance, accuracy, compliance (TEST06) or find-peak (Server)",
    "profile": "quick (1-2 minutes), interactive (tighter Server limits, p99) or full (MLPerf-like durations)",
    "target": "our checkpoint or a Hugging Face GPT-2 directory (default: the shipped target)",
    "draft": "draft checkpoint (default: the shipped draft)",
    "head": "eagle: the EAGLE head's checkpoint (default: the shipped target's)",
    "tokenizer": "the target's tokenizer when it is not beside it: a nanoGPT meta.pkl (or its dataset directory) or "
                 "a directory with GPT-2's tokenizer files",
    "gamma": "draft tokens per speculative cycle (a -tree SUT's depth is its tree's)",
    "adaptive": "adapt gamma to acceptance",
    "tree": "the -tree SUTs: children per depth, e.g. 4,2,1 (default: the SUT's own)",
    "drafter": "the ngram SUTs: your drafter, package.module:Class (a suts.ngram.Drafter; default: prompt lookup)",
    "samples": "use only the first N prompts",
    "prompts": "prompt JSONL (default: the shipped held-out prompts)",
    "dtype": "float32, float16 or bfloat16 (default: fp16 on CUDA, fp32 on CPU)",
    "weights": "the target's weights as the kernels stream them: fp32 (default), fp16 (fp16 panels where the "
               "checkpoint's weights are fp16 numbers, as ours are: bit-identical results from half the bytes) or "
               "int8 (weight-only, per channel: not lossless; `make accuracy` reports what it costs)",
    "fast": "no fast path (fused C steps on a CPU, CUDA graphs on a GPU): what it buys, measured",
    "qps": "Offline/Server target QPS; find-peak's starting QPS (Server default: the profile's load for the model)",
    "max_batch": "Offline/Server: sequences decoding together at most (continuous batching)",
    "token_budget": "Offline/Server: tokens the target takes per scheduler iteration, the step's first, then prefill "
                    "chunks (default: 128 in Server, whole prompts in Offline)",
    "threads": "torch threads (default: half the cores, the rest left to LoadGen; with --replicas, each replica's: "
               "the cluster's cores over the replicas)",
    "stall_timeout_s": "seconds before a stuck SUT fails (with --replicas: before a silent replica is replaced)",
    "user_conf": "LoadGen user.conf lines that win over every other setting",
    "results": "results root (default results/)",
    "run_dir": "write the run here instead of results/SUT/SCENARIO/MODE/TIME",
    "endpoint": "an OpenAI-compatible server as the SUT (ours: `python -m mlperf serve`; llama-server, vLLM, ...); "
                "--sut then only names the results (default http); the key from --api-key or $MLPERF_API_KEY",
    "engine": "llama-server: llama.cpp's server (`make peers` builds it) started for the run on the target (and, for "
              "--sut spec, the draft) at --weights (F32, F16, Q8_0), --threads and a slot per --max-batch row",
    "model": "with --endpoint: the served model, checked against the server's /v1/models (default: the first)",
    "replicas": "serve the SUT from N Ray replicas, LoadGen in this process (default: the SUT in this process)",
    "ray_address": "with --replicas: the Ray cluster to join, auto or host:port (default: a local Ray instance on "
                   "this machine, stopped after the run)",
}
FLAGS = {"stall_timeout_s": "--stall-timeout", "fast": "--no-fast"}  # where a flag is not its field's name


def add_run_options(parser, names=None) -> None:
    """A flag for each RunConfig field (or each of `names`), typed as the field is; a flag left out is None, so
    that the field's default, or a --config file's value, stands."""
    from scenarios.records import RunConfig
    from suts.registry import SUTS
    for f in fields(RunConfig):
        if names is not None and f.name not in names:
            continue
        kind = next(t for t in get_args(f.type) or (f.type,) if t is not type(None))
        helps = HELP.get(f.name) or (f"{', '.join(SUTS)} or package.module:Class (default {f.default})"
                                     if f.name == "sut" else None)
        flag, options = FLAGS.get(f.name, "--" + f.name.replace("_", "-")), {"dest": f.name, "help": helps}
        if kind is bool:
            options.update(action="store_false" if f.default else "store_true", default=None)
        elif kind in (int, float):
            options["type"] = kind
        elif kind is not str:
            raise TypeError(f"RunConfig.{f.name}: no flag for a field of type {f.type}")
        parser.add_argument(flag, **options)
        if f.name == "endpoint":
            parser.add_argument("--api-key", help="with --endpoint: the server's key, sent as a Bearer token "
                                                  "(default: $MLPERF_API_KEY; never written to the results)")


def run_config(args, **overrides):
    """The RunConfig the arguments ask for: a --config file's settings, then the flags given, then `overrides`."""
    from scenarios.records import RunConfig
    given = {f.name: getattr(args, f.name) for f in fields(RunConfig) if getattr(args, f.name, None) is not None}
    base = config_file(args.config) if getattr(args, "config", None) else {}
    if (given.get("endpoint") or base.get("endpoint")) and "sut" not in given and "sut" not in base:
        overrides = {"sut": "http", **overrides}  # the results' name for a server that --sut did not name
    return RunConfig(**{**base, **given, **overrides})


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


def add_pair_options(parser, tokens: int, prompts: bool = True, draft: bool = True) -> None:
    """The options bench, smoke, profile and generate share: the model pair, how many held-out prompts, tokens
    each, gamma."""
    from scenarios.records import RunConfig
    defaults = RunConfig()
    parser.add_argument("--target", default=defaults.target)
    if draft:
        parser.add_argument("--draft", default=defaults.draft)
        parser.add_argument("--gamma", type=int, default=defaults.gamma)
    if prompts:
        parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=tokens)


def check_pair_options(args) -> None:
    for name in ("prompts", "tokens", "gamma"):
        if getattr(args, name, 1) < 1:
            raise ValueError(f"--{name} must be a positive integer, got {getattr(args, name)}")


def check_weights(args) -> None:
    """--weights as given, RunConfig's default where it is not: a clear error for one the kernels do not stream."""
    from scenarios import records
    args.weights = records.check_weights(args.weights or records.RunConfig.weights)
