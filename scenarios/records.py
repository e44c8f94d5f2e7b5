"""What a run measured, as dataclasses: `RunRecord` (with the `RunConfig` it was asked to run, scenarios/config.py).

The run writes a `RunRecord` as metrics.json; the roofline, the reports, the smoke gate and the accuracy
checker read it back with `RunRecord.load`, so every figure is computed from the same typed fields.
"""
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlperf.checkpoint import read_config
from mlperf.model import GPTConfig
from scenarios.config import RunConfig
from scenarios.settings import Calibration
from suts.families import drafts_on_host
from suts.engine.stats import Stats


@dataclass
class SampleRecord:
    """One completed sample: LoadGen-side latencies and the SUT's own statistics."""
    index: int  # QSL index
    prompt_tokens: int
    ttft_s: float  # from LoadGen's issue to the first token
    latency_s: float  # from LoadGen's issue to completion
    stats: Stats


def weights_in_brief(weights: dict | None) -> str:
    """A SUT's weights (SUTInfo.weights) in a word or two: the target's, then the draft's where they differ
    (fp16/int8); "-" where a record does not say (an engine behind an endpoint)."""
    w = weights or {}
    return "/".join(dict.fromkeys(w[m] for m in ("target", "draft") if m in w)) or "-"


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
    # the drafter's family (suts.families.FAMILIES): a draft "model", an EAGLE "head" (geometry in `draft`), a "lookup",
    # or one of your own
    drafter: str = "model"
    tree: list[int] | None = None  # a token tree's children per depth; None: a chain of gamma drafts
    # bytes per target linear weight when not the run's dtype (2: fp16; 1: an int8 target)
    target_weight_bytes: float | None = None
    # what ran each model's steps (suts/fast/runner.py): "fused C step", "CUDA graphs" or "modules"
    runners: dict | None = None
    # each model's fused step's speed over its modules', where the choice between them was timed when the SUT was built
    # (suts/fast/choice.py)
    fused_vs_modules: dict | None = None
    kernels: str | None = None  # the build of the C kernels that ran a fused step (compiler and flags), if any did
    weights: dict | None = None  # what each model's linear weights streamed as: "target" -> fp16, fp32 or int8

    @classmethod
    def of(cls, sut, batch: int) -> "SUTInfo":
        from suts.fast.packed import streamed, weight_bytes
        draft, target = getattr(sut, "draft", None), getattr(sut, "target", None)
        return cls(sut.name, f"{type(sut).__module__}.{type(sut).__qualname__}", str(sut.dtype).removeprefix("torch."),
                   str(sut.device), getattr(sut, "gamma", None), batch,
                   asdict(draft.config) if draft is not None else None,
                   weight_bytes(draft) if draft is not None else None,
                   getattr(getattr(sut, "drafter", None), "name", "model"), list(getattr(sut, "fanout", ())) or None,
                   weight_bytes(target) if target is not None else None,
                   sut.paths() if callable(getattr(sut, "paths", None)) else None,
                   {name: model.vs_modules for name, model in (("target", target), ("draft", draft))
                    if getattr(model, "vs_modules", None) is not None} or None,
                   kernels_used(sut),
                   {name: streamed(model) for name, model in (("target", target), ("draft", draft))
                    if model is not None} or None)


def kernels_used(sut) -> str | None:
    """Which build of the C kernels ran the SUT's fused steps (native.rows_kernel's), None where none ran: a SUT on the
    modules or a GPU loads no kernel for the record."""
    if "fused C step" not in (sut.paths() if callable(getattr(sut, "paths", None)) else {}).values():
        return None
    from suts.fast.native import rows_kernel
    return rows_kernel().built


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
    # the threads each size of fused call kept, of torch_threads (suts/fast/threads.py): "target 1 token" -> 4
    fused_threads: dict[str, int] = field(default_factory=dict)
    # per model ("target", "draft") over the test: the operations its fast step ran and those that fell back to its
    # modules, by reason (suts/fast/step.py's Tally)
    fast_path: dict[str, dict] = field(default_factory=dict)
    replicas: dict | None = None  # a run on Ray replicas: where each ran, what it served, the queries re-issued
    endpoint: dict | None = None  # a run against a server: its URL, model, engine, what it reports, its counters
    system: dict[str, str] = field(default_factory=dict)  # the host (mlperf.env.system): a submission describes it
    model: str | None = None  # the model pair's folder in results/ (mlperf.checkpoint.pair_key): a report's groups
    # what a speculative run discloses (scenarios/speculation.py): drafter, its checkpoint's hash, shape, gamma, tree
    # size, mean acceptance length
    speculative: dict | None = None

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
        if not self.config.scenario.paced or not self.samples or "ttft_latency" not in self.settings:
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
        if drafts_on_host(self.sut.drafter) or not any(s.drafted for s in self.stats):
            return None
        return GPTConfig(**self.sut.draft) if self.sut.draft else read_config(self.config.draft)[0]

    def comparison_key(self) -> dict:
        """Everything that changes a throughput or latency figure: two runs are compared only when these match."""
        c = self.config
        key = {"machine": self.machine, "target": str(Path(c.target).resolve()),
               "target_sha": self.checkpoints.get("target"),
               "scenario": c.scenario, "batch": self.sut.batch, "token_budget": c.budget,
               "max_new_tokens": c.max_new_tokens, "dtype": self.sut.dtype, "device": self.sut.device, "fast": c.fast,
               "target_weight_bytes": self.sut.target_weight_bytes,
               "threads": self.torch_threads, "replicas": len(self.replicas["replicas"]) if self.replicas else None,
               "prompts": str(Path(c.prompts).resolve()), "samples": c.samples,
               "temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p}
        if c.scenario.paced:  # the same offered load under the same constraints
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
                "batch_steps": {int(b): n for b, n in s["stats"]["batch_steps"].items()}})})
                for s in raw.pop("samples")]
            return cls(**{**raw, "config": RunConfig(**raw["config"]), "sut": SUTInfo(**raw["sut"]),
                          "calibration": Calibration(**raw["calibration"]) if raw["calibration"] else None,
                          "samples": samples})
        except (TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"{path}: written by another version of the harness ({e}); run it again") from None
