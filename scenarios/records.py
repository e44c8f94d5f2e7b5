"""What a run was asked to do and what it measured, as dataclasses: `RunConfig` in, `RunRecord` out.

The run writes a `RunRecord` as metrics.json; the roofline, the reports, the smoke gate and the accuracy
checker read it back with `RunRecord.load`, so every figure is computed from the same typed fields.
"""
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import get_args

import torch

from mlperf import GAMMA, HEAD, MODELS
from mlperf.checkpoint import read_config
from mlperf.data import PROMPTS
from mlperf.model import GPTConfig
from scenarios.settings import MODES, PROFILES, SCENARIOS, Calibration
from suts.sampling import SamplingParams
from suts.stats import Stats

SERVER_TOKEN_BUDGET = 128  # chosen by measurement: docs/batching.md, "Chunked prefill"
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


@dataclass
class RunConfig:
    sut: str = "spec"
    scenario: str = "SingleStream"
    mode: str = "performance"
    profile: str = "quick"
    target: str = str(MODELS / "target")
    draft: str = str(MODELS / "draft")
    head: str = str(HEAD)  # the EAGLE head the `eagle` SUTs draft with
    tokenizer: str | None = None  # a meta.pkl or GPT-2 tokenizer files, when the target's own are elsewhere
    gamma: int = GAMMA
    adaptive: bool = False
    tree: str | None = None  # the -tree SUTs: children per depth, e.g. "4,2,1" (default: the SUT's own)
    drafter: str | None = None  # the ngram SUTs: a suts.ngram.Drafter as package.module:Class (default: prompt lookup)
    max_new_tokens: int = 128
    samples: int | None = None  # the first N prompts; default all
    prompts: str = str(PROMPTS)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    device: str = "cpu"
    dtype: str | None = None  # float32, float16 or bfloat16; default fp16 on CUDA, fp32 on CPU
    fast: bool = True  # the fast path: fused C steps on a CPU, CUDA graphs on a GPU (False: the modules alone)
    weights: str = "fp32"  # the CPU fast path's panels; "fp16": fp16 where the checkpoint's weights are fp16 numbers
    # (bit-identical results from half the bytes), else fp32; "int8": the target quantised to int8 (not lossless)
    qps: float | None = None  # Offline / Server target QPS instead of the profile's or the calibrated one
    max_batch: int = 8  # Offline and Server: sequences decoding together at most (SingleStream: 1)
    token_budget: int | None = None  # tokens per scheduler iteration (chunked prefill); default: see `budget`
    threads: int | None = None  # torch threads; default: half the cores, the rest left to LoadGen's threads
    stall_timeout_s: float = 120.0
    replicas: int | None = None  # serve the SUT from this many Ray replicas (scenarios/replicas.py); None: in process
    ray_address: str | None = None  # the Ray cluster to join (auto or host:port); None: a local instance for the run
    endpoint: str | None = None  # an OpenAI-compatible server as the SUT (scenarios/endpoint.py); `sut` then labels it
    engine: str | None = None  # a peer engine the run starts and serves through `endpoint` (ENGINES): sut says how
    model: str | None = None  # with endpoint: the served model to ask for (default: the first it lists)
    user_conf: str | None = None  # LoadGen user.conf lines that win over every other setting
    results: str = "results"
    run_dir: str | None = None  # write the run here instead of results/<sut>/<scenario>/<mode>/<timestamp>

    def validate(self) -> None:
        """One-line errors for every bad value, before anything is loaded."""
        from suts.ngram import load_drafter  # imported here: reading a record never loads the SUTs
        from suts.registry import drafts_by_lookup, shape, sut_class
        from suts.tree import parse_shape
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
        for name, value, choices in [("scenario", self.scenario, SCENARIOS), ("mode", self.mode, MODES),
                                     ("profile", self.profile, PROFILES)]:
            if value not in choices:
                raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
        if self.mode == "find-peak" and self.scenario != "Server":
            raise ValueError(f"find-peak searches the Server scenario's highest valid QPS, not {self.scenario}")
        for name in ("gamma", "max_new_tokens", "max_batch") + tuple(
                name for name in ("threads", "token_budget") if getattr(self, name) is not None):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.tree is not None:
            parse_shape(self.tree)
            if shape(self.sut) != "tree":
                raise ValueError(f"SUT {self.sut} drafts no tree; --tree is for the -tree SUTs (spec-tree, ...)")
        if self.drafter is not None:
            if not drafts_by_lookup(self.sut):
                raise ValueError(f"SUT {self.sut} drafts with its own model; --drafter is for the ngram SUTs (ngram, "
                                 "ngram-tree, ngram-auto)")
            load_drafter(self.drafter)
        if self.max_new_tokens < 2:
            raise ValueError("max_new_tokens must be at least 2 (LoadGen's token latencies need two tokens)")
        if self.samples is not None and self.samples < 1:
            raise ValueError(f"samples must be a positive integer, got {self.samples!r}")
        if self.qps is not None and not 0 < self.qps < math.inf:
            raise ValueError(f"qps must be positive and finite, got {self.qps!r}")
        if not 0 < self.stall_timeout_s < math.inf:
            raise ValueError(f"stall timeout must be positive and finite, got {self.stall_timeout_s!r}")
        if self.replicas is not None and (isinstance(self.replicas, bool) or self.replicas < 1):
            raise ValueError(f"replicas must be a positive integer, got {self.replicas!r}")
        if self.ray_address is not None:
            if self.replicas is None:
                raise ValueError("--ray-address names the cluster that --replicas run on: give --replicas too")
            if not RAY_ADDRESS.fullmatch(self.ray_address):
                raise ValueError(f"ray_address must be auto or host:port (a cluster started with `ray start --head`),"
                                 f" got {self.ray_address!r}")
        if self.run_dir and taken(Path(self.run_dir)):
            raise ValueError(f"run directory {self.run_dir} exists already: name a new one")
        if self.user_conf and not Path(self.user_conf).is_file():
            raise ValueError(f"user.conf not found: {self.user_conf}")
        check_weights(self.weights)
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        try:
            torch.device(self.device)
        except RuntimeError:
            raise ValueError(f"unknown device {self.device!r}; use cpu, cuda or cuda:N") from None
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} requested but CUDA is not available")
        self.sampling()  # checks temperature / top-k / top-p

    @property
    def budget(self) -> int | None:
        """The scheduler's token budget per iteration: --token-budget, else SERVER_TOKEN_BUDGET in Server (a step
        of running rows never waits behind a whole prompt) and whole prompts in Offline (throughput alone counts)."""
        return self.token_budget or (SERVER_TOKEN_BUDGET if self.scenario == "Server" else None)

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    def build_sut(self, eos_id: int | None, device: str | None = None):
        """The SUT these settings ask for, its checkpoints loaded (on `device` instead of the run's, where given: a
        replica's one GPU)."""
        from suts.registry import build_sut
        return build_sut(self.sut, self.target, self.draft, device=device or self.device, dtype=DTYPES.get(self.dtype),
                         gamma=self.gamma, adaptive=self.adaptive, tree=self.tree, drafter=self.drafter, eos_id=eos_id,
                         head=self.head, fast=self.fast, weights=self.weights)


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


@dataclass
class SampleRecord:
    """One completed sample: LoadGen-side latencies and the SUT's own statistics."""
    index: int  # QSL index
    prompt_tokens: int
    ttft_s: float  # from LoadGen's issue to the first token
    latency_s: float  # from LoadGen's issue to completion
    stats: Stats


@dataclass
class SUTInfo:
    name: str
    cls: str
    dtype: str
    device: str
    gamma: int | None
    batch: int  # at most this many sequences decoded together (max_batch when the scheduler ran), else 1
    draft: dict | None = None  # the draft's geometry (a GPTConfig), whatever checkpoint it came from
    draft_weight_bytes: float | None = None  # bytes per draft linear weight where not the dtype's (1: int8; 2: fp16)
    drafter: str = "model"  # what drafts: a draft "model", an EAGLE "head" (geometry in `draft`), or a "lookup"
    tree: list[int] | None = None  # a token tree's children per depth; None: a chain of gamma drafts
    target_weight_bytes: float | None = None  # bytes per target linear weight when not the run's dtype (2: fp16; 1:
    # an int8 target)
    runners: dict | None = None  # what ran each model's steps (suts/runner.py): "fused C step", "CUDA graphs" or
    # "modules"

    @classmethod
    def of(cls, sut, batch: int) -> "SUTInfo":
        from suts.packed import weight_bytes
        draft, target = getattr(sut, "draft", None), getattr(sut, "target", None)
        return cls(sut.name, f"{type(sut).__module__}.{type(sut).__qualname__}", str(sut.dtype).removeprefix("torch."),
                   str(sut.device), getattr(sut, "gamma", None), batch,
                   asdict(draft.config) if draft is not None else None,
                   weight_bytes(draft) if draft is not None else None,
                   getattr(getattr(sut, "drafter", None), "kind", "model"), list(getattr(sut, "shape", ())) or None,
                   weight_bytes(target) if target is not None else None,
                   sut.runners() if callable(getattr(sut, "runners", None)) else None)


@dataclass
class RunRecord:
    config: RunConfig
    sut: SUTInfo
    machine: str
    torch_threads: int
    versions: dict[str, str]
    loadgen_model: str | None  # the model name LoadGen's settings were looked up under (None: set directly)
    settings: dict[str, str]  # the LoadGen settings the run used, resolved (user.conf keys -> values)
    calibration: Calibration | None
    wall_s: float
    error: str | None
    samples: list[SampleRecord] = field(default_factory=list)
    checkpoints: dict[str, str] = field(default_factory=dict)  # "target" (and "draft") -> checkpoint.fingerprint
    fused_threads: dict[str, int] = field(default_factory=dict)  # the threads each size of fused call kept, of
    # torch_threads (suts/threads.py): "target 1 token" -> 4
    replicas: dict | None = None  # a run on Ray replicas: where each ran, what it served, the queries re-issued
    endpoint: dict | None = None  # a run against a server: its URL, model, engine, what it reports, its counters
    system: dict[str, str] = field(default_factory=dict)  # the host (mlperf.env.system): a submission describes it

    @property
    def stats(self) -> list[Stats]:
        return [s.stats for s in self.samples]

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted over the whole run; None for a SUT that drafts nothing."""
        drafted = sum(s.drafted for s in self.stats)
        return sum(s.accepted for s in self.stats) / drafted if drafted else None

    def slo(self) -> tuple[float, float] | None:
        """Server: the share of queries that met both the TTFT and the TPOT limit (SLO attainment), and the share of
        the tokens that those queries emitted (goodput over throughput); None outside Server. A query's TPOT is
        LoadGen's: (latency - TTFT) / (tokens - 1)."""
        if self.config.scenario != "Server" or not self.samples or "ttft_latency" not in self.settings:
            return None
        ttft_s, tpot_s = (float(self.settings[key]) / 1000 for key in ("ttft_latency", "tpot_latency"))
        good = [s for s in self.samples if s.ttft_s <= ttft_s and
                (s.latency_s - s.ttft_s) / max(1, s.stats.n_tokens - 1) <= tpot_s]
        tokens = sum(s.stats.n_tokens for s in self.samples)
        return len(good) / len(self.samples), sum(s.stats.n_tokens for s in good) / tokens

    def draft_config(self) -> GPTConfig | None:
        """The geometry of the draft the run drafted with, as the SUT recorded it (a self-drafting SUT's is its
        target's); for a record older than that field, the configured draft checkpoint's; None if it drafted
        nothing or drafted by lookup."""
        if self.sut.drafter == "lookup" or not any(s.drafted for s in self.stats):
            return None
        return GPTConfig(**self.sut.draft) if self.sut.draft else read_config(self.config.draft)[0]

    def comparison_key(self) -> dict:
        """Everything that changes a throughput or latency figure: two runs are compared only when these match."""
        c = self.config
        key = {"target": str(Path(c.target).resolve()), "target_sha": self.checkpoints.get("target"),
               "scenario": c.scenario, "batch": self.sut.batch, "token_budget": c.budget,
               "max_new_tokens": c.max_new_tokens, "dtype": self.sut.dtype, "device": self.sut.device, "fast": c.fast,
               "target_weight_bytes": self.sut.target_weight_bytes,
               "threads": self.torch_threads, "replicas": len(self.replicas["replicas"]) if self.replicas else None,
               "prompts": str(Path(c.prompts).resolve()), "samples": c.samples,
               "temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p}
        if c.scenario == "Server":  # the same offered load under the same constraints
            key.update({k: self.settings.get(k) for k in
                        ("target_qps", "ttft_latency", "tpot_latency", "target_latency_percentile")})
        return key

    def save(self, run_dir) -> None:
        (Path(run_dir) / "metrics.json").write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, run_dir) -> "RunRecord":
        path = Path(run_dir) / "metrics.json"
        if not path.is_file():
            raise ValueError(f"{run_dir} is not a run directory (no metrics.json)")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not valid JSON ({e}); a run cut short?") from None
        try:
            samples = [SampleRecord(**{**s, "stats": Stats(**{
                **s["stats"], "cycle_hist": {int(g): counts for g, counts in s["stats"]["cycle_hist"].items()},
                "batch_steps": {int(b): n for b, n in s["stats"]["batch_steps"].items()}})}) for s in raw.pop("samples")]
            return cls(**{**raw, "config": RunConfig(**raw["config"]), "sut": SUTInfo(**raw["sut"]),
                          "calibration": Calibration(**raw["calibration"]) if raw["calibration"] else None,
                          "samples": samples})
        except (TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"{path}: written by another version of the harness ({e}); run it again") from None
