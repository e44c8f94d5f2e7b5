"""Any OpenAI-compatible server as the SUT (`--endpoint URL`): ours (`python -m mlperf serve`), llama.cpp's
llama-server, vLLM, SGLang, TGI.

LoadGen and every LoadGen call stay in this process (scenarios/adapter.py); each query is one streamed
`POST /v1/completions` of the prompt's token ids on one asyncio loop with a keep-alive connection pool. The first
chunk that carries a token is LoadGen's first token; token ids come from the server (ours and vLLM's `token_ids`,
llama.cpp's `tokens` from its native `/completion`), never from re-tokenized text, and must agree with its own
count (`usage.completion_tokens`, llama.cpp's `tokens_predicted`). Offline
and Server keep at most `max_batch` requests in flight (never one giant request), the rest waiting here as they
would wait for a row in process. A server that is down at the start is one line before LoadGen starts; an HTTP error, a
dropped connection, garbage, or no bytes within the stall timeout fails the run in one line (no silent retry).
"""
import asyncio
import json
import os
import re
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, replace

import numpy as np

from mlperf.checkpoint import fingerprint, read_config
from mlperf.extras import extra
from mlperf.model import GPTConfig
from scenarios.config import RunConfig
from scenarios.records import SUTInfo
from suts.engine.sampling import SamplingParams
from suts.engine.scheduler import Result, Sequence
from serving.wire import (EndpointError, chunk_tokens, error_line, parse_chunk, prometheus_sums, server_stats,
                          timed_stats)

API_KEY = "MLPERF_API_KEY"  # the environment variable a key is read from (`--api-key` sets it for the run)
GGUF_BYTES = {"fp32": 4.0, "fp16": 2.0, "int8": 34 / 32}  # bytes a weight streams as F32, F16, Q8_0 (32 + a scale)
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


def api_key() -> str | None:
    """The server's key from $MLPERF_API_KEY, read here alone: what a client sends and our server asks for."""
    return os.environ.get(API_KEY) or None


def base_url(url: str) -> str:
    """The server's root: `http://host:port` from that, or from its `/v1` (or `/v1/completions`) address."""
    return re.sub(r"/v1(/completions)?/?$", "", url.rstrip("/"))


class Endpoint:
    """The server as the run sees it: what calibration and the warm-up call on a SUT (`generate`,
    `generate_batch`), the engine LoadGen's adapter hands queries to (`engine`), and what the run records."""
    batched = True

    def __init__(self, cfg: RunConfig, eos_id: int | None, config: GPTConfig):
        self.aiohttp = extra("aiohttp", "--endpoint")
        self.url, self.name, self.eos_id, self.cfg = base_url(cfg.endpoint), cfg.sut, eos_id, cfg
        self.vocab_size = config.vocab_size  # what every answer is checked against, as a SUT in process has it
        self.stall_timeout_s, self.max_batch = cfg.stall_timeout_s, cfg.max_batch
        self._bounds: dict[int, asyncio.Semaphore] = {}  # bound(): a batch size's requests in flight
        key = api_key()
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="endpoint-client", daemon=True)
        self._thread.start()
        self.session = self.call(self._session(), 10)
        try:
            listed = self.call(self._get_json("/v1/models"), self.stall_timeout_s)["data"]
            names = [m["id"] for m in listed]
        except (EndpointError, KeyError, TypeError) as e:
            self.close()
            raise EndpointError(f"cannot use the server at {self.url}: {e}") from None
        if not names or (cfg.model is not None and cfg.model not in names):
            self.close()
            raise EndpointError(f"the server at {self.url} serves {', '.join(names) or 'no model'}"
                                + (f", not {cfg.model!r}" if cfg.model else ""))
        self.model = cfg.model or names[0]
        self.served = next(m for m in listed if m["id"] == self.model)
        ours = self.served.get("owned_by") == "mlperf-spec"
        llama = self.served.get("owned_by") == "llamacpp"
        self.engine_name = "ours" if ours else "llama.cpp" if llama else self.served.get("owned_by", "unknown")
        # llama-server drops kept-alive connections under concurrent streams without saying so (a reused one fails
        # as the next request is written): a connection of its own for each of its requests
        self.closing = {"Connection": "close"} if llama else None
        self._metrics_at_start: dict[str, float] = {}
        self.drafted = self.accepted = 0  # llama.cpp's per-request `timings` over LoadGen's test
        self.overheads_s: list[tuple[float, float]] = []  # per request of the test: see `overhead`

    async def _session(self):
        connector = self.aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        timeout = self.aiohttp.ClientTimeout(total=None, sock_connect=self.stall_timeout_s,
                                             sock_read=self.stall_timeout_s)
        return self.aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self.headers)

    def call(self, coro, timeout_s: float):
        """A coroutine run on the client's loop, from any other thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _get(self, path: str) -> str:
        try:
            async with self.session.get(self.url + path) as response:
                text = await response.text()
                if response.status != 200:
                    raise EndpointError(f"GET {path}: HTTP {response.status}: {error_line(text)}")
                return text
        except (self.aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise EndpointError(f"GET {path}: {why(e)}") from None

    async def _get_json(self, path: str):
        text = await self._get(path)
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise EndpointError(f"GET {path}: not JSON: {text[:80]!r}") from None

    def request(self, prompt: list[int], max_new_tokens: int, params: SamplingParams) -> tuple[str, dict]:
        """The path and body of one streamed completion. llama.cpp's through its native API (its OpenAI one
        streams no token ids), asked not to reuse cached prompts (every engine does the same work), to sample from
        the run's distribution alone (no min-p, no default top-k) and to run past an EOS the model does not have;
        every other server's through OpenAI's, asking for the ids by vLLM's name (ours takes it too)."""
        if self.engine_name == "llama.cpp":
            return "/completion", {"prompt": prompt, "n_predict": max_new_tokens, "temperature": params.temperature,
                                   "top_k": params.top_k, "top_p": params.top_p, "min_p": 0.0,
                                   "seed": params.seed % 2 ** 32, "stream": True, "return_tokens": True,
                                   "cache_prompt": False, "ignore_eos": self.eos_id is None}
        return "/v1/completions", {
            "model": self.model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "seed": params.seed, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True, **({"top_k": params.top_k} if params.top_k else {})}

    async def complete(self, prompt: list[int], max_new_tokens: int, params: SamplingParams,
                       on_first_token=None) -> Result:
        """One streamed completion: its token ids, each timed as its chunk arrives, and the server's own Stats
        where it sends them (ours does: prefill, steps, drafts and acceptance)."""
        t0, tokens, times, stats, count, timings = time.perf_counter(), [], [], None, None, None
        path, body = self.request(prompt, max_new_tokens, params)
        try:
            async with self.session.post(self.url + path, json=body, headers=self.closing) as response:
                if response.status != 200:
                    raise EndpointError(f"HTTP {response.status}: {error_line(await response.text())}")
                async for line in response.content:
                    data = line.strip().removeprefix(b"data:").strip()
                    if not line.startswith(b"data:") or not data:
                        continue
                    if data == b"[DONE]":
                        break
                    chunk = parse_chunk(data)
                    new = chunk_tokens(chunk)
                    if self.engine_name == "llama.cpp":
                        new = self.held_back(chunk, new, len(tokens))
                    if new:
                        if not tokens and on_first_token is not None:
                            on_first_token(new[0])
                        tokens += new
                        times += [time.perf_counter() - t0] * len(new)
                    stats, timings = chunk.get("stats") or stats, chunk.get("timings") or timings
                    if isinstance(chunk.get("usage"), dict):  # OpenAI's count; llama.cpp's native one
                        count = chunk["usage"].get("completion_tokens")
                    elif chunk.get("stop") is True:
                        count = chunk.get("tokens_predicted")
        except (self.aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise EndpointError(why(e)) from None
        if not tokens:
            raise EndpointError("the stream carried no token ids (the harness counts the server's ids, never "
                                "re-tokenized text: ask the server for them)")
        if count is not None and count != len(tokens):
            raise EndpointError(f"{len(tokens)} token ids streamed but the server counts {count}")
        if isinstance(timings, dict):
            self.drafted += int(timings.get("draft_n", 0))
            self.accepted += int(timings.get("draft_n_accepted", 0))
            return Result(tokens, timed_stats(timings, times))
        served = server_stats(stats, times)
        with suppress(TypeError, ValueError, AttributeError):  # only our server sends its engine's token times
            engine_times = stats.get("token_times_s")
            if len(engine_times) == len(times):
                self.overheads_s.append((times[0] - float(engine_times[0]), times[-1] - float(engine_times[-1])))
        return Result(tokens, served)

    def held_back(self, chunk: dict, new: list[int], had: int) -> list[int]:
        """A llama.cpp chunk's ids, where it held tokens back until their text was whole: it then streams the last
        id alone (`tokens_predicted` counts them all). Over the byte vocabulary the chunk's text is those bytes
        whenever it is valid UTF-8; a chunk whose ids cannot be known fails the query rather than guess them."""
        held = chunk.get("tokens_predicted", had + len(new)) - had
        if held == len(new):
            return new
        text = chunk.get("content", "")
        if self.vocab_size == 256 and "\ufffd" not in text and len(text.encode()) == held:
            return list(text.encode())
        raise EndpointError(f"llama-server streamed {len(new)} of the ids of {held} tokens it held back (a "
                            "character split across tokens that is not valid UTF-8): the run cannot know them")

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams, on_first_token=None) -> Result:
        return self.call(self.complete(prompt, max_new_tokens, params, on_first_token), None)

    def bound(self, n: int) -> asyncio.Semaphore:
        """The one bound on this client's requests in flight at a batch of n, whoever sends them (a LoadGen test's
        engine, generate_batch); used on the client's loop alone."""
        if n not in self._bounds:
            self._bounds[n] = asyncio.Semaphore(n)
        return self._bounds[n]

    def generate_batch(self, prompts, max_new_tokens: int, params, max_batch=None, token_budget=None):
        """Every prompt, at most `max_batch` (default: the run's) requests in flight at once."""
        async def one(prompt, ps):
            async with self.bound(max_batch or self.max_batch):
                return await self.complete(prompt, max_new_tokens, ps)

        async def fan_out():
            return await asyncio.gather(*(one(p, ps) for p, ps in zip(prompts, params)))
        return self.call(fan_out(), None)

    def engine(self, max_batch: int, token_budget: int | None, on_error) -> "HTTPEngine":
        self._metrics_at_start, self.drafted, self.accepted = self.spec_counters(), 0, 0
        self.overheads_s = []
        return HTTPEngine(self, max_batch, on_error)

    def spec_counters(self) -> dict[str, float]:
        """The server's speculative counters from /metrics (vLLM's names), or {} where it has none."""
        with suppress(EndpointError):
            return prometheus_sums(self.call(self._get("/metrics"), self.stall_timeout_s), SPEC_COUNTERS)
        return {}

    def info(self, batch: int) -> SUTInfo:
        own = self.served.get("mlperf", {}).get("sut")
        if own:
            return replace(SUTInfo(**own), batch=batch)
        if self.cfg.engine == "llama-server":  # our checkpoints, converted: what the roofline costs
            spec, weight = self.cfg.sut.endswith("-spec"), GGUF_BYTES[self.cfg.weights]
            return SUTInfo(self.name, "llama.cpp llama-server", "float32", "cpu", self.cfg.gamma if spec else None,
                           batch, asdict(read_config(self.cfg.draft)[0]) if spec else None, weight if spec else None,
                           "model", None, weight)
        return SUTInfo(self.name, f"http:{self.engine_name}", "unknown", "remote", None, batch, drafter="unknown")

    def record(self) -> dict:
        """What the SUT was (URL, model, engine, what the server reports of itself), and its speculative
        counters over the run (/metrics after minus before)."""
        after = self.spec_counters()
        return {"url": self.url, "model": self.model, "engine": self.engine_name,
                "served": {k: v for k, v in self.served.items() if k != "id"},
                "spec_counters": {k: after[k] - self._metrics_at_start.get(k, 0.0) for k in after},
                **({"timings": {"draft_n": self.drafted, "draft_n_accepted": self.accepted}} if self.drafted else {}),
                **({"props": self.props()} if self.engine_name == "llama.cpp" else {}),
                **({"http_overhead_ms": self.overhead()} if self.overheads_s else {})}

    def overhead(self) -> dict:
        """What HTTP adds to a request, free of the engine's own pace: the time this client saw its first (and last)
        token at, less the time our server's engine emitted it at (from when the server had read and checked the
        request), at p50, p90 and p99 over the test's requests, in ms."""
        first, last = (np.array(each) * 1e3 for each in zip(*self.overheads_s))
        return {"requests": len(first), **{f"{name} p{q}": round(float(np.percentile(v, q)), 3)
                                           for name, v in (("first token", first), ("last token", last))
                                           for q in (50, 90, 99)}}

    def props(self) -> dict:
        """What llama-server says of itself (/props): its build and the settings it runs with."""
        with suppress(EndpointError):
            props = self.call(self._get_json("/props"), self.stall_timeout_s)
            return {k: props[k] for k in ("build_info", "total_slots", "model_path", "default_generation_settings")
                    if k in props}
        return {}

    def fused_threads(self) -> dict:
        """The run record's: a server's threads are its own, not reported."""
        return {}

    def local_runners(self) -> dict:
        return {}

    def checkpoints(self, cfg: RunConfig) -> dict[str, dict]:
        """The target's alone (the tokenizer's source here): what the server loads is its own."""
        return {"target": fingerprint(cfg.target)}

    def where(self) -> dict[str, dict]:
        return {"endpoint": self.record()}

    def close(self) -> None:
        with suppress(Exception):
            self.call(self.session.close(), 5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


class HTTPEngine:
    """Queries to the server as LoadGen issues them, each streamed on the client's loop, `max_batch` at once."""
    busy_since = None  # each request is watched by its own read timeout

    def __init__(self, endpoint: Endpoint, max_batch: int, on_error):
        self.endpoint, self.batch, self.on_error = endpoint, max_batch, on_error
        self.halted = False
        self.tasks: set = set()

    def submit(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            future = asyncio.run_coroutine_threadsafe(self._serve(seq), self.endpoint._loop)
            self.tasks.add(future)
            future.add_done_callback(self.tasks.discard)

    async def _serve(self, seq: Sequence) -> None:
        try:
            async with self.endpoint.bound(self.batch):  # Offline and Server: the run's batch; SingleStream one
                result = await self.endpoint.complete(seq.prompt, seq.max_new_tokens, seq.params, seq.on_first_token)
        except EndpointError as e:
            if not self.halted:
                self.on_error(f"the server at {self.endpoint.url} failed a query: {e}")
            return
        if not self.halted:
            seq.on_done(result)

    def halt(self) -> None:
        self.halted = True

    def close(self) -> None:
        for future in list(self.tasks):
            future.cancel()


def why(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "no answer within the stall timeout (stalled)"
    return str(e) or type(e).__name__


@contextmanager
def endpoint(cfg: RunConfig, eos_id: int | None, config: GPTConfig):
    """The server at cfg.endpoint as the run's SUT, for the block."""
    served = Endpoint(cfg, eos_id, config)
    try:
        yield served
    finally:
        served.close()

