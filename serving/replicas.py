"""Any SUT served by data-parallel replicas on a Ray cluster, LoadGen in front (`--replicas N`).

Each replica is a Ray actor, a process of its own holding its share of CPU cores (torch threads = that share) or
one GPU, that builds the SUT from the run's arguments and serves it on the same engine as a single-process run
(suts/engine/engine.py: continuous batching, chunked prefill, speculative cycles). LoadGen, the QSL and every LoadGen
call stay in the driver (scenarios/adapter.py): a query goes to the replica with the fewest tokens (prompt + max
new tokens) in flight, so an Offline batch is split across replicas by tokens and each batches its share; its
first token streams back the moment it exists, and it completes with plain data (token ids and Stats), since
LoadGen's response objects do not pickle. A replica that dies (its process killed, out of memory, its SUT
raising, or no word from it past the stall timeout while it holds queries) is marked dead and its unfinished
queries go to live ones: each query completes once and reports its first token at most once.
"""
import asyncio
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace

import torch

from mlperf.extras import extra
from mlperf.model import GPTConfig
from scenarios.config import RunConfig
from scenarios.hosted import InProcess, checkpoints_of
from scenarios.records import SUTInfo
from suts.engine.engine import LocalEngine
from suts.engine.sampling import SamplingParams
from suts.engine.scheduler import Result, Sequence

START_TIMEOUT_S = 300.0  # for every replica to load its SUT (a slow disk, a large checkpoint, a busy cluster)


def ray_module():
    """Ray, installed into this Python on first use (about 240 MB: a plain run does not pay for it)."""
    return extra("ray", "--replicas", "about 240 MB")


@contextmanager
def cluster(address: str | None):
    """Ray, connected for the block: a local instance on this machine's cores started for it and stopped after
    (address None), or the cluster at `address` joined and left; its replicas see the driver's MLPERF_* variables
    and import what it imports. Inside another such block, that connection."""
    ray = ray_module()
    if ray.is_initialized():
        yield ray
        return
    path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)  # plug-ins import there
    ours = {name: value for name, value in os.environ.items() if name.startswith("MLPERF_")}  # the run's own settings
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        ray.init(address=address or "local", num_cpus=None if address else os.cpu_count(), include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR", runtime_env={"env_vars": {**ours, "PYTHONPATH": path}})
    except Exception as e:
        ray.shutdown()
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise ValueError(f"cannot connect to {where}: {first_line(e)}") from None
    finally:  # Ray's driver installs its own: Ctrl-C and SIGTERM end a run as they do without it
        for signum, handler in handlers.items():
            if threading.current_thread() is threading.main_thread():
                signal.signal(signum, handler)
    try:
        yield ray
    finally:
        ray.shutdown()


def first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


class Replica:
    """One replica: the SUT built in a Ray worker process, served on its own engine."""

    def __init__(self, cfg: RunConfig, threads: int, eos_id: int | None):
        torch.set_num_threads(threads)
        device = "cuda" if cfg.device.startswith("cuda") else cfg.device  # Ray shows the replica its one GPU
        self.sut = cfg.build_sut(eos_id, device)
        self.engine: LocalEngine | None = None
        self.calls: dict[int, object] = {}  # the serve calls under way: id -> how to hand them an event

    def describe(self) -> dict:
        import ray
        hosted = InProcess(self.sut)
        return {"node": ray.get_runtime_context().get_node_id()[:12], "host": socket.gethostname(),
                "pid": os.getpid(), "device": str(self.sut.device), "threads": torch.get_num_threads(),
                "batched": getattr(self.sut, "batched", False), "sut": asdict(hosted.info(1)),
                "fused_threads": hosted.fused_threads()}

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams) -> Result:
        return self.sut.generate(prompt, max_new_tokens, params)

    def generate_batch(self, prompts, max_new_tokens: int, params, token_budget: int | None) -> list[Result]:
        return self.sut.generate_batch(prompts, max_new_tokens, params, token_budget=token_budget)

    def start(self, max_batch: int, token_budget: int | None) -> None:
        self.engine = LocalEngine(self.sut, max_batch, token_budget, self._failed)

    def _failed(self, message: str) -> None:
        for tell in list(self.calls.values()):
            tell(("error", message))

    async def serve(self, prompt: list[int], max_new_tokens: int, params: SamplingParams):
        """Yields ("first", token) the moment the first token exists, then ("done", Result)."""
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        tell = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)  # noqa: E731 (the engine's thread)
        key = id(events)
        self.calls[key] = tell
        try:
            self.engine.submit([Sequence(prompt, max_new_tokens, params, on_first_token=lambda t: tell(("first", t)),
                                         on_done=lambda result: tell(("done", result)))])
            while True:
                kind, value = await events.get()
                if kind == "error":
                    raise RuntimeError(value)
                yield kind, value
                if kind == "done":
                    return
        finally:
            del self.calls[key]


@dataclass(eq=False)
class Member:
    """The driver's view of one replica."""
    actor: object
    info: dict
    load: int = 0  # tokens (prompt + max new) of the queries it holds
    served: int = 0
    died: str | None = None
    heard_s: float = 0.0  # when it last answered anything (the watchdog's clock while it holds queries)

    def record(self) -> dict:
        return {k: self.info[k] for k in ("node", "host", "pid", "device", "threads")} | {
            "served": self.served, "died": self.died}


class Replicas:
    """The replicas as the run sees them: what calibration and the warm-up call on a SUT (`generate`,
    `generate_batch`), the engine LoadGen's adapter hands queries to (`engine`), and what the run records."""

    def __init__(self, ray, cfg: RunConfig, count: int, eos_id: int | None, config: GPTConfig):
        gpus, have = cfg.device.startswith("cuda"), ray.cluster_resources()
        self.threads = cfg.threads or max(1, int(have.get("CPU", 0)) // count)
        need = {"CPU": count * self.threads} | ({"GPU": count} if gpus else {})
        short = [f"{n:g} {kind}s, the cluster has {have.get(kind, 0):g}" for kind, n in need.items()
                 if have.get(kind, 0) < n]
        if short:
            raise ValueError(f"{count} replicas x {self.threads} threads{' and a GPU' if gpus else ''} need "
                             + "; ".join(short))
        remote = ray.remote(Replica).options(num_cpus=self.threads, num_gpus=1 if gpus else 0, max_restarts=0,
                                             max_concurrency=100_000, scheduling_strategy="SPREAD")
        actors = [remote.remote(cfg, self.threads, eos_id) for _ in range(count)]
        self.ray, self.members = ray, []
        try:
            infos = ray.get([a.describe.remote() for a in actors], timeout=START_TIMEOUT_S)
        except Exception as e:
            self.members = [Member(a, {}) for a in actors]
            self.close()
            raise ValueError(f"replicas of SUT {cfg.sut} did not start: {cause(e)}") from None
        self.members = [Member(a, info) for a, info in zip(actors, infos)]
        self.name, self.eos_id, self.batched = infos[0]["sut"]["name"], eos_id, infos[0]["batched"]
        self.vocab_size = config.vocab_size  # what every answer is checked against, as a SUT in process has it
        self.address, self.stall_timeout_s = cfg.ray_address or "local", cfg.stall_timeout_s
        self.reissued = 0

    def live(self) -> list[Member]:
        return [m for m in self.members if m.died is None]

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams, on_first_token=None
                 ) -> Result:
        """One prompt on every replica at once (each warms up alike); the first replica's answer."""
        results = self.get([m.actor.generate.remote(prompt, max_new_tokens, params) for m in self.live()])
        if on_first_token is not None and results[0].tokens:
            on_first_token(results[0].tokens[0])
        return results[0]

    def generate_batch(self, prompts, max_new_tokens: int, params, max_batch=None, token_budget=None):
        """The prompts split across the replicas by tokens, each replica decoding its share as one batch."""
        shares = split(prompts, max_new_tokens, len(self.live()))
        calls = [m.actor.generate_batch.remote([prompts[i] for i in share], max_new_tokens,
                                                [params[i] for i in share], token_budget)
                 for m, share in zip(self.live(), shares) if share]
        results = {}
        for share, answers in zip([s for s in shares if s], self.get(calls)):
            results.update(zip(share, answers))
        return [results[i] for i in range(len(prompts))]

    def get(self, calls: list):
        """The answers to calls made outside LoadGen's test (calibration, the warm-up): a replica's failure there
        fails the run, in one line."""
        try:
            return self.ray.get(calls)
        except self.ray.exceptions.RayError as e:
            raise RuntimeError(f"a replica failed: {cause(e)}") from None

    def engine(self, max_batch: int, token_budget: int | None, on_error) -> "RemoteEngine":
        return RemoteEngine(self, max_batch, token_budget, on_error)

    def info(self, batch: int) -> SUTInfo:
        return replace(SUTInfo(**self.members[0].info["sut"]), batch=batch)

    def fused_threads(self) -> dict:
        return self.members[0].info["fused_threads"]

    def local_runners(self) -> dict:
        return {}

    def checkpoints(self, cfg: RunConfig) -> dict[str, dict]:
        return checkpoints_of(cfg)

    def where(self) -> dict[str, dict]:
        return {"replicas": self.record()}

    def record(self) -> dict:
        return {"address": self.address, "ray": self.ray.__version__, "threads": self.threads,
                "reissued": self.reissued, "replicas": [m.record() for m in self.members]}

    def close(self) -> None:
        for m in self.members:
            self.ray.kill(m.actor, no_restart=True)


def split(prompts: list[list[int]], max_new_tokens: int, n: int) -> list[list[int]]:
    """Prompt indices in n shares of about equal tokens (prompt + max new), longest first to the lightest share."""
    shares, loads = [[] for _ in range(n)], [0] * n
    for i in sorted(range(len(prompts)), key=lambda i: -len(prompts[i])):
        j = loads.index(min(loads))
        shares[j].append(i)
        loads[j] += len(prompts[i]) + max_new_tokens
    return [sorted(s) for s in shares]


def cause(e: BaseException) -> str:
    """The one line that says why a Ray call failed: the SUT's own error where there is one (a ValueError is a
    one-line message of the harness's, given without its type)."""
    inner = getattr(e, "cause", None)
    if isinstance(inner, BaseException) and inner is not e:
        return cause(inner)
    return first_line(e).removeprefix("ValueError: ")


class RemoteEngine:
    """Queries to replicas: routed, streamed back, and re-issued when a replica dies, on the driver's event loop."""
    busy_since = None  # no single call to watch: each replica is watched on its own (`_watch`)

    def __init__(self, replicas: Replicas, max_batch: int, token_budget: int | None, on_error):
        self.replicas, self.batch, self.on_error = replicas, max_batch, on_error
        self.stall_timeout_s = replicas.stall_timeout_s
        self.halted = False
        replicas.get([m.actor.start.remote(max_batch, token_budget) for m in replicas.live()])
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="replica-router", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._watch(), self._loop)

    def submit(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            asyncio.run_coroutine_threadsafe(self._serve(seq), self._loop)

    def halt(self) -> None:
        self.halted = True

    async def _serve(self, seq: Sequence) -> None:
        ray, cost, streamed = self.replicas.ray, len(seq.prompt) + seq.max_new_tokens, False
        while not self.halted:
            live = self.replicas.live()
            if not live:
                last = next((m.died for m in reversed(self.replicas.members) if m.died), "")
                self.on_error(f"every replica of SUT {self.replicas.name} has died (the last: {last})")
                return
            member = min(live, key=lambda m: m.load)
            if not member.load:
                member.heard_s = time.perf_counter()
            member.load += cost
            try:
                async for ref in member.actor.serve.options(num_returns="streaming").remote(
                        seq.prompt, seq.max_new_tokens, seq.params):
                    kind, value = await ref
                    member.heard_s = time.perf_counter()
                    if kind == "first" and not streamed:
                        streamed = True
                        seq.on_first_token(value)
                    elif kind == "done":
                        member.served += 1
                        seq.on_done(value)
                        return
            except ray.exceptions.RayError as e:
                self._bury(member, cause(e))
                self.replicas.reissued += 1
            finally:
                member.load -= cost

    def _bury(self, member: Member, why: str) -> None:
        if member.died is None:
            member.died = why
            self.replicas.ray.kill(member.actor, no_restart=True)
            print(f"replica {member.info['pid']} on {member.info['host']} died: {why}; its queries go to the "
                  f"{len(self.replicas.live())} left", file=sys.stderr, flush=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.perf_counter()
            for m in self.replicas.live():
                if m.load and now - m.heard_s > self.stall_timeout_s:
                    self._bury(m, f"no answer within {self.stall_timeout_s:.0f} s (stalled)")

    def close(self) -> None:
        """Cancel what is under way and stop the driver's loop."""
        async def cancel():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        with suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


@contextmanager
def replicas(cfg: RunConfig, eos_id: int | None, config: GPTConfig):
    """`cfg.replicas` replicas of `cfg.sut`, on the cluster at cfg.ray_address (or a local one), for the block;
    every actor is stopped after it, and a local Ray instance with them."""
    with cluster(cfg.ray_address) as ray:
        pool = Replicas(ray, cfg, cfg.replicas, eos_id, config)
        try:
            yield pool
        finally:
            pool.close()
