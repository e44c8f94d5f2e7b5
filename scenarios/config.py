"""What a run is asked to do: `RunConfig`, each setting defined once with its default and its help (the command
line's flags are made from it, commands/options.py), and the rules its values are checked by (`validate`)."""
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import get_args

import torch

from mlperf import HEAD, MODELS, devices
from mlperf.checkpoint import pair_key
from mlperf.data import PROMPTS
from mlperf.rules import positive_int
from scenarios.settings import MODES, PROFILES
from scenarios.scenario import SERVER_TOKEN_BUDGET, Scenario, SingleStream
from suts.drafting import GAMMA
from suts.fast.step import WEIGHTS as DEFAULT_WEIGHTS
from suts.engine.sampling import SamplingParams

RAY_ADDRESS = re.compile(r"auto|[A-Za-z0-9][A-Za-z0-9.\-]*:\d{1,5}")  # a cluster to join: auto, or its head's host:port
ENDPOINT = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(/[\w./-]*)?")  # a server's root or its /v1 address
LABEL = re.compile(r"[A-Za-z0-9][\w.\-]*")  # a results directory's name for an endpoint's runs
ENGINES = {"llama-server": ("baseline", "spec")}  # peer engines a run can start (`--engine`), and the SUTs each runs
WEIGHTS = ("fp32", "fp16", "int8")  # the target's weights as the kernels stream them (RunConfig.weights)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_weights(weights: str) -> str:
    """`weights` if the kernels stream it (WEIGHTS), else a one-line error."""
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")
    return weights


def taken(run_dir: Path) -> bool:
    """Whether a run directory's name is in use: by a result, a run under way (.partial), or one kept apart."""
    return any(Path(str(run_dir) + kept).exists() for kept in ("", ".partial", ".failed", ".interrupted"))


def setting(default, text: str, flag: str | None = None):
    """A RunConfig field: its default, its flag's help and the flag where it is not --the-field-s-name."""
    return field(default=default, metadata={"help": text, "flag": flag})


@dataclass
class RunConfig:
    """Every setting of a run, each with its default and its flag's help (`python -m mlperf run --help`)."""
    sut: str = setting("spec", "the SUT, a registered one or package.module:Class (with --endpoint: only "
                                "the results' name, http where none is given)")
    scenario: str = setting(SingleStream(), ", ".join(Scenario.known))
    mode: str = setting("performance", "performance, accuracy, compliance (TEST06) or find-peak (Server)")
    profile: str = setting("quick", "quick (1-2 minutes), interactive (tighter Server limits, p99) or full "
                                    "(MLPerf-like durations)")
    target: str = setting(str(MODELS / "target"), "our checkpoint or a Hugging Face GPT-2 directory (default: the "
                                                  "shipped target)")
    draft: str = setting(str(MODELS / "draft"), "draft checkpoint (default: the shipped draft)")
    head: str = setting(str(HEAD), "eagle: the EAGLE head's checkpoint (default: the shipped target's)")
    parts: str | None = setting(None, "a drafter family's own checkpoints beside the target, KIND=DIR[,KIND=DIR] "
                                      "(the draft and the EAGLE head: --draft, --head)")
    tokenizer: str | None = setting(None, "the target's tokenizer when it is not beside it: a nanoGPT meta.pkl (or its "
                                          "dataset directory) or a directory with GPT-2's tokenizer files")
    gamma: int = setting(GAMMA, "draft tokens per speculative cycle (a -tree SUT's depth is its tree's)")
    adaptive: bool = setting(False, "adapt gamma to acceptance")
    tree: str | None = setting(None, "the -tree SUTs: children per depth, e.g. 4,2,1 (default: the SUT's own)")
    drafter: str | None = setting(None, "the ngram SUTs: your drafter, package.module:Class (a suts.ngram.Drafter; "
                                        "default: prompt lookup)")
    synthetic_acceptance_rates: str | None = setting(
        None, "benchmark the mechanism, not the drafter: each draft is the target's own greedy token with these "
              "per-position unconditional rates R1,R2,... (R_i: the first i drafts all accepted; one rate a: a, a^2, "
              "...), a token certain to be rejected otherwise; greedy, lossless (suts/synthetic.py)")
    synthetic_acceptance_length: float | None = setting(
        None, "as --synthetic-acceptance-rates, from a mean acceptance length (tokens a cycle, 1 to gamma+1): one "
              "conditional rate at every position")
    max_new_tokens: int = setting(128, "tokens each sample generates at most")
    samples: int | None = setting(None, "use only the first N prompts (default: all)")
    prompts: str = setting(str(PROMPTS), "prompt JSONL (default: the shipped held-out prompts)")
    temperature: float = setting(0.0, "sampling temperature (0: greedy)")
    top_k: int = setting(0, "sample from the k most likely tokens (0: all)")
    top_p: float = setting(1.0, "sample from the smallest set of tokens with this much probability (1: all)")
    seed: int = setting(0, "the sampling seed (each sample's is derived from it)")
    device: str = setting("cpu", "cpu, cuda, cuda:N or mps")
    dtype: str | None = setting(None, "float32, float16 or bfloat16 (default: fp16 on CUDA, fp32 on CPU)")
    fast: bool = setting(True, "no fast path (fused C steps on a CPU, CUDA graphs on a GPU): what it buys, measured",
                         flag="--no-fast")
    weights: str = setting(DEFAULT_WEIGHTS, "the target's weights as the kernels stream them: fp16 (the checkpoint's "
                                            "own fp16 numbers, as ours store them: fp32 panels where they are not), "
                                            "fp32 (the same results from twice the bytes) or int8 (weight-only, "
                                            "per channel: not lossless; `make accuracy` reports what it costs)")
    qps: float | None = setting(None, "Offline/Server target QPS; find-peak's starting QPS (Server default: the "
                                      "profile's load for the model)")
    max_batch: int = setting(8, "Offline/Server: sequences decoding together at most (continuous batching; "
                                "SingleStream: 1)")
    token_budget: int | None = setting(None, "Offline/Server: tokens the target takes per scheduler iteration, the "
                                             f"step's first, then prefill chunks (default: {SERVER_TOKEN_BUDGET} in "
                                             "Server, whole prompts in Offline)")
    threads: int | None = setting(None, "torch threads (default: half the cores, the rest left to LoadGen; with "
                                        "--replicas, each replica's: the cluster's cores over the replicas)")
    stall_timeout_s: float = setting(120.0, "seconds before a stuck SUT fails (with --replicas: before a silent "
                                            "replica is replaced)", flag="--stall-timeout")
    replicas: int | None = setting(None, "serve the SUT from N Ray replicas (serving/replicas.py), LoadGen in this "
                                         "process (default: the SUT in this process)")
    ray_address: str | None = setting(None, "with --replicas: the Ray cluster to join, auto or host:port (default: a "
                                            "local Ray instance on this machine, stopped after the run)")
    endpoint: str | None = setting(None, "an OpenAI-compatible server as the SUT (ours: `python -m mlperf serve`; "
                                         "llama-server, vLLM, ...); --sut then only names the results (default "
                                         "http); the key from --api-key or $MLPERF_API_KEY")
    engine: str | None = setting(None, "llama-server: llama.cpp's server (`make peers` builds it) started for the run "
                                       "on the target (and, for --sut spec, the draft) at --weights (F32, F16, Q8_0), "
                                       "--threads and a slot per --max-batch row")
    model: str | None = setting(None, "with --endpoint: the served model, checked against the server's /v1/models "
                                      "(default: the first)")
    user_conf: str | None = setting(None, "LoadGen user.conf lines that win over every other setting")
    manifest: str | None = setting(None, "compliance of a speculative SUT: a JSON file naming the drafter's checkpoint "
                                         "hash ({\"checkpoint\": ...}) the run must have drafted with")
    results: str = setting("results", "results root")
    run_dir: str | None = setting(None, "write the run here instead of results/MODEL/SUT/SCENARIO/MODE/TIME")

    def __post_init__(self):
        self.scenario = Scenario.named(self.scenario)  # a RunConfig holds a Scenario, given its name

    def validate(self) -> None:
        """One-line errors for every bad value, before anything is loaded."""
        from suts.ngram import load_drafter  # imported here: reading a record never loads the SUTs
        from suts.registry import drafts_by_lookup, shape, sut_class
        from suts.speculative import check_options
        for f in fields(self):  # values from a --config file may be of any JSON type
            if not of_type(getattr(self, f.name), f.type):
                raise ValueError(f"{f.name} must be {' or '.join(t.__name__ for t in get_args(f.type) or (f.type,))},"
                                 f" got {getattr(self, f.name)!r}")
        if self.engine is not None and self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; choose {', '.join(ENGINES)}")
        if self.endpoint is not None:
            check_endpoint(self)
        elif self.engine is not None:
            if self.sut not in ENGINES[self.engine]:
                raise ValueError(f"{self.engine} runs SUT {' or '.join(ENGINES[self.engine])}, not {self.sut!r}")
            if self.replicas is not None:
                raise ValueError("--engine and --replicas both say where the SUT runs: give one")
        else:
            sut_class(self.sut)
        for name, value, choices in [("mode", self.mode, MODES), ("profile", self.profile, PROFILES)]:
            if value not in choices:
                raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
        if self.mode == "find-peak" and not self.scenario.paced:
            raise ValueError(f"find-peak searches the Server scenario's highest valid QPS, not {self.scenario}")
        self.paths()
        for name in ("gamma", "max_new_tokens", "max_batch", "threads", "token_budget", "samples", "replicas"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        if shape(self.sut) is not None:
            check_options(shape(self.sut), self.gamma, self.adaptive, self.tree, f"SUT {self.sut}")
        elif self.tree is not None:
            raise ValueError(f"SUT {self.sut} drafts no tree; a tree is for the -tree SUTs (spec-tree, ...)")
        if self.drafter is not None:
            if not drafts_by_lookup(self.sut):
                raise ValueError(f"SUT {self.sut} drafts with its own model; --drafter is for the ngram SUTs (ngram, "
                                 "ngram-tree, ngram-auto)")
            load_drafter(self.drafter)
        if self.max_new_tokens < 2:
            raise ValueError("max_new_tokens must be at least 2 (LoadGen's token latencies need two tokens)")
        if self.qps is not None and not 0 < self.qps < math.inf:
            raise ValueError(f"qps must be positive and finite, got {self.qps!r}")
        if not 0 < self.stall_timeout_s < math.inf:
            raise ValueError(f"stall timeout must be positive and finite, got {self.stall_timeout_s!r}")
        if self.ray_address is not None:
            if self.replicas is None:
                raise ValueError("--ray-address names the cluster that --replicas run on: give --replicas too")
            if not RAY_ADDRESS.fullmatch(self.ray_address):
                raise ValueError(f"ray_address must be auto or host:port (a cluster started with `ray start --head`),"
                                 f" got {self.ray_address!r}")
        check_paths(self)
        check_weights(self.weights)
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        devices.check(self.device)
        self.sampling()  # checks temperature / top-k / top-p
        if self.acceptance() is not None:
            check_synthetic(self)

    def label(self) -> str:
        """The SUT as this run names and files it: a synthetic run's marked with its rates (suts.registry.labelled)."""
        from suts.registry import labelled
        return labelled(self.sut, self.acceptance())

    def acceptance(self):
        """The synthetic acceptance the run sets (suts/synthetic.py's Acceptance), or None for the drafter's own."""
        from suts.synthetic import Acceptance
        if self.synthetic_acceptance_rates is not None and self.synthetic_acceptance_length is not None:
            raise ValueError("--synthetic-acceptance-rates and --synthetic-acceptance-length both set the rates: give "
                             "one")
        if self.synthetic_acceptance_length is not None:
            return Acceptance.of_length(self.synthetic_acceptance_length, self.gamma)
        if self.synthetic_acceptance_rates is not None:
            return Acceptance.parse(self.synthetic_acceptance_rates)
        return None

    def results_of(self, sut: str | None = None, scenario: str | None = None, mode: str | None = None) -> Path:
        """Where this model pair's runs of a SUT, scenario and mode are filed: results/MODEL/SUT/SCENARIO/MODE
        (MODEL: mlperf.checkpoint.pair_key; SUT: its label), each of the three this run's unless given."""
        return (Path(self.results) / pair_key(self.target, self.draft) / (sut or self.label()).replace(":", ".")
                / (scenario or self.scenario) / (mode or self.mode))

    @property
    def budget(self) -> int | None:
        """The scheduler's token budget per iteration: --token-budget, else SERVER_TOKEN_BUDGET in Server (a step
        of running rows never waits behind a whole prompt) and whole prompts in Offline (throughput alone counts)."""
        return self.token_budget or self.scenario.token_budget

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    def paths(self) -> dict[str, str]:
        """The checkpoints a drafter may load beside the target, by kind: the draft, the EAGLE head and --parts'."""
        given = {}
        for item in filter(None, (self.parts or "").split(",")):
            kind, eq, path = item.partition("=")
            if not (eq and kind.strip() and path.strip()):
                raise ValueError(f"parts must be KIND=DIR, comma-separated, got {item!r}")
            given[kind.strip()] = path.strip()
        return {"draft": self.draft, "head": self.head, **given}

    def build_sut(self, eos_id: int | None, device: str | None = None, reference: dict | None = None):
        """The SUT these settings ask for, its checkpoints loaded (on `device` instead of the run's, where given: a
        replica's one GPU); with synthetic acceptance, its drafts set from `reference` (the baseline's outputs by
        prompt, scenarios/accuracy.py: synthetic_reference)."""
        from suts.registry import build_sut
        acceptance = self.acceptance()
        synthetic = (acceptance, reference or {}) if acceptance is not None else None
        return build_sut(self.sut, self.target, self.draft, device=device or self.device, dtype=DTYPES.get(self.dtype),
                         gamma=self.gamma, adaptive=self.adaptive, tree=self.tree, drafter=self.drafter, eos_id=eos_id,
                         head=self.head, fast=self.fast, weights=self.weights, parts=self.paths(), synthetic=synthetic)


def check_paths(cfg: RunConfig) -> None:
    """The files a run reads must be there, and the directory it writes must not."""
    if cfg.run_dir and taken(Path(cfg.run_dir)):
        raise ValueError(f"run directory {cfg.run_dir} exists already: name a new one")
    if cfg.user_conf and not Path(cfg.user_conf).is_file():
        raise ValueError(f"user.conf not found: {cfg.user_conf}")
    if cfg.manifest and not Path(cfg.manifest).is_file():
        raise ValueError(f"drafter manifest not found: {cfg.manifest}")


def check_synthetic(cfg: RunConfig) -> None:
    """Synthetic acceptance: a speculative chain built here, decoding greedily (one line otherwise)."""
    from suts.registry import check_synthetic as check_sut
    if cfg.endpoint or cfg.replicas or cfg.engine:
        raise ValueError("synthetic acceptance sets the drafts of a SUT built in this process: not with --endpoint, "
                         "--replicas or --engine (serve one with `python -m mlperf serve --synthetic-acceptance-...`)")
    check_sut(cfg.sut)
    if not cfg.sampling().greedy:
        raise ValueError("synthetic acceptance is greedy only (--temperature 0): a sampled row's acceptance is the "
                         "draft's and target's distributions', which no reference stands in for")


def check_endpoint(cfg: RunConfig) -> None:
    """With --endpoint: a URL, a SUT name that only labels the results, and nothing that builds a SUT here."""
    if not ENDPOINT.fullmatch(cfg.endpoint):
        raise ValueError(f"endpoint must be a server's http(s)://host:port (or its /v1 address), got {cfg.endpoint!r}")
    if not LABEL.fullmatch(cfg.sut):
        raise ValueError(f"with --endpoint, --sut only names the results: letters, digits, '.', '_', '-', got "
                         f"{cfg.sut!r}")
    if cfg.replicas is not None:
        raise ValueError("--endpoint and --replicas both say where the SUT runs: give one")


def of_type(value, kind) -> bool:
    """`value` fits the annotation `kind` (a type or a union of types with None); an int stands for a float."""
    allowed = get_args(kind) or (kind,)
    if isinstance(value, bool) or value is None:
        return type(value) in allowed
    return isinstance(value, allowed) or (float in allowed and isinstance(value, int))
