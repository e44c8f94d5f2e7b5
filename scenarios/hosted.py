"""Where a SUT runs, as a LoadGen run sees it: the engine that decodes its queries and what the run record says of it.

A SUT built in this process is hosted by InProcess; one that runs elsewhere (serving's HTTP SUT and Ray replicas)
meets the Host protocol itself. The run asks `host_of(sut)` and never which kind it has."""
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from mlperf.checkpoint import fingerprint
from mlperf.model import GPTConfig
from mlperf.tokenizer import load_tokenizer
from scenarios import accuracy
from scenarios.config import RunConfig
from scenarios.records import SUTInfo
from suts.base import SUT
from suts.engine.engine import LocalEngine
from suts.fast.runner import Runner
from suts.fast.threads import kept_threads
from suts.registry import part_of


@runtime_checkable
class Host(Protocol):
    """What a run needs of where its SUT runs, beyond the SUT's own generate and generate_batch."""

    def engine(self, max_batch: int, token_budget: int | None, on_error):
        """The engine LoadGen's queries go to: submit(sequences), halt(), close(), batch, busy_since."""

    def info(self, batch: int) -> SUTInfo:
        """The SUT as the run record describes it, decoding at most `batch` sequences together."""

    def local_runners(self) -> dict[str, Runner]:
        """The fast-path runners in this process whose operations the run tallies, by role; {} elsewhere."""

    def fused_threads(self) -> dict:
        """The threads each model's fused step ran on, where the host reports them."""

    def checkpoints(self, cfg: RunConfig) -> dict[str, dict]:
        """The fingerprints of the checkpoints the SUT decodes with, by kind."""

    def where(self) -> dict[str, dict]:
        """The run record's fields that say where the SUT ran ({"endpoint": ...}, {"replicas": ...}; {} here)."""


@dataclass
class InProcess:
    """A SUT built in this process: LoadGen's queries go to the in-process engine (suts/engine/engine.py)."""
    sut: SUT

    def engine(self, max_batch: int, token_budget: int | None, on_error) -> LocalEngine:
        return LocalEngine(self.sut, max_batch, token_budget, on_error)

    def info(self, batch: int) -> SUTInfo:
        return SUTInfo.of(self.sut, batch)

    def local_runners(self) -> dict[str, Runner]:
        return {role: r for role in ("target", "draft") if isinstance(r := getattr(self.sut, role, None), Runner)}

    def fused_threads(self) -> dict:
        return kept_threads(self.local_runners())

    def checkpoints(self, cfg: RunConfig) -> dict[str, dict]:
        return checkpoints_of(cfg)

    def where(self) -> dict[str, dict]:
        return {}


def checkpoints_of(cfg: RunConfig) -> dict[str, dict]:
    """The fingerprints of what `cfg`'s SUT loads: the target's, and its drafter's checkpoint by kind, if any."""
    part = part_of(cfg.sut)
    return {"target": fingerprint(cfg.target), **({part.kind: fingerprint(cfg.paths()[part.kind])} if part else {})}


def host_of(sut) -> Host:
    """Where `sut` runs: itself when it runs elsewhere, else InProcess."""
    return sut if isinstance(sut, Host) else InProcess(sut)


@contextmanager
def built_here(cfg: RunConfig, eos_id: int | None, config: GPTConfig):
    """The run's SUT built in this process (its drafts set synthetically where the run says so); a server or Ray
    replicas are opened by serving.hosts.open_sut."""
    if cfg.endpoint or cfg.replicas:
        raise ValueError("a SUT behind --endpoint or on --replicas is opened by serving.hosts.open_sut")
    yield cfg.build_sut(eos_id, reference=accuracy.synthetic_reference(cfg, load_tokenizer(cfg.target, cfg.tokenizer)))
