"""Our engine as an OpenAI-compatible server: `python -m mlperf serve --sut spec` (`make serve`).

Any SUT runs on the same engine as a LoadGen run (suts/engine/engine.py: continuous batching, chunked prefill,
speculative cycles), behind aiohttp: `POST /v1/completions` (a prompt as text or token ids; streamed as
server-sent events or whole; `return_token_ids` adds the generated ids), `GET /v1/models` (with what the SUT is),
`GET /health` and `GET /metrics` (Prometheus text under vLLM's names, the speculative counters included, so that
tools written for vLLM read ours). Bad requests get a 4xx and a one-line JSON error before any work; a client
that goes away frees its row at the next step; SIGTERM or Ctrl-C stops taking requests, answers those in flight
and exits 0.
"""
import asyncio
import hmac
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace

from mlperf import env
from mlperf.env import set_threads
from mlperf.extras import extra
from mlperf.hf import tokenizer_folder
from mlperf.tokenizer import load_tokenizer
from scenarios.accuracy import synthetic_reference
from scenarios.config import RunConfig
from scenarios.scenario import Server
from scenarios.records import SUTInfo
from serving.endpoint import api_key
from serving.listen import Listen
from serving.logprobs import scored
from serving.protocol import BadRequest, Completion, parse
from suts.engine.engine import LocalEngine
from suts.engine.scheduler import Result, Sequence
from suts.engine.stats import Stats

MAX_BODY = 1 << 20  # bytes of a request body at most (a prompt of the longest context fits many times over)
SHUTDOWN_S = 60.0  # after SIGTERM, how long the requests in flight get to finish


class Text:
    """A request's text as its tokens arrive: each delta ends where the text decoded so far is whole (a
    character split across byte tokens waits for its last byte)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.tokens, self.sent = tokenizer, [], 0

    def delta(self, new: list[int], last: bool = False) -> str:
        self.tokens += new
        text = self.tokenizer.decode(self.tokens)
        if not last and text.endswith("\ufffd"):
            return ""
        out, self.sent = text[self.sent:], len(text)
        return out


class Metrics:
    """Prometheus metrics under vLLM's names and meanings (a counter `x` is exposed as `x_total`)."""

    def __init__(self, engine: LocalEngine):
        pc = extra("prometheus_client", "the server's /metrics")
        self.registry, self.exposition = pc.CollectorRegistry(), pc.generate_latest
        r = dict(registry=self.registry)
        pc.Gauge("vllm:num_requests_running", "Requests holding a row of the batch", **r).set_function(
            lambda: engine.load[0])
        pc.Gauge("vllm:num_requests_waiting", "Requests waiting for a row", **r).set_function(lambda: engine.load[1])
        self.success = pc.Counter("vllm:request_success", "Requests answered", ["finished_reason"], **r)
        self.rejected = pc.Counter("mlperf:requests_rejected", "Requests refused, by HTTP status", ["status"], **r)
        self.prompt = pc.Counter("vllm:prompt_tokens", "Prompt tokens of the requests answered", **r)
        self.generated = pc.Counter("vllm:generation_tokens", "Tokens generated for the requests answered", **r)
        buckets = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
        self.ttft = pc.Histogram("vllm:time_to_first_token_seconds", "Time to first token", buckets=buckets, **r)
        self.tpot = pc.Histogram("vllm:time_per_output_token_seconds", "Time per output token after the first",
                                 buckets=buckets, **r)
        self.e2e = pc.Histogram("vllm:e2e_request_latency_seconds", "Request latency", buckets=buckets, **r)
        self.drafts = pc.Counter("vllm:spec_decode_num_drafts", "Speculative cycles that drafted", **r)
        self.draft_tokens = pc.Counter("vllm:spec_decode_num_draft_tokens", "Tokens drafted", **r)
        self.accepted = pc.Counter("vllm:spec_decode_num_accepted_tokens", "Drafted tokens accepted", **r)
        self.per_pos = pc.Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                  "Drafted tokens accepted at each position of a draft", ["position"], **r)

    def answered(self, prompt_tokens: int, result: Result, reason: str) -> None:
        s = result.stats
        self.success.labels(reason).inc()
        self.prompt.inc(prompt_tokens)
        self.generated.inc(len(result.tokens))
        if not result.tokens:  # a prompt scored alone (echo, max_tokens 0): no token was timed
            return
        self.ttft.observe(s.ttft_s)
        self.e2e.observe(s.total_s)
        if len(result.tokens) > 1:
            self.tpot.observe((s.total_s - s.ttft_s) / (len(result.tokens) - 1))
        for drafted, counts in s.cycle_hist.items():
            if drafted:
                self.drafts.inc(sum(counts))
                self.draft_tokens.inc(drafted * sum(counts))
                self.accepted.inc(sum(k * c for k, c in enumerate(counts)))
                for pos in range(drafted):  # a cycle that accepted k drafts accepted positions 0..k-1
                    self.per_pos.labels(str(pos)).inc(sum(counts[pos + 1:]))

    def text(self) -> bytes:
        return self.exposition(self.registry)


@dataclass(frozen=True)
class Served:
    """What the server answers as and how its engine batches, beside its SUT: the server's own settings, made from
    the run settings that built the SUT (`served`), which /v1/models reports under `mlperf.config`."""
    model_id: str  # the model's name in the API
    root: str  # the target checkpoint
    tokenizer: str  # the folder a client loads the tokenizer from
    max_batch: int
    token_budget: int  # tokens the target takes per engine iteration
    greedy_only: bool  # drafts whose acceptance is set synthetically: greedy requests alone
    api_key: str | None
    max_requests: int  # requests in flight at most; past it 503
    settings: dict  # the run settings, as a client reads what it measures


def served(cfg: RunConfig, listen: Listen) -> Served:
    """The server's settings for `cfg`'s SUT at `listen`: its engine takes the Server scenario's token budget unless
    told otherwise."""
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("results", "run_dir", "user_conf")}
    return Served(listen.served_model_name or cfg.sut, cfg.target, tokenizer_folder(cfg.target, cfg.tokenizer),
                  cfg.max_batch, cfg.token_budget or Server.token_budget, cfg.acceptance() is not None,
                  listen.api_key, listen.max_requests, settings)


class ApiServer:
    """One SUT on one engine, and the HTTP handlers in front of it: the OpenAI-compatible API."""

    def __init__(self, sut, tokenizer, served: Served):
        self.sut, self.tokenizer, self.served = sut, tokenizer, served
        self.engine = LocalEngine(sut, served.max_batch, served.token_budget, self._failed, thread=False)
        self.metrics = Metrics(self.engine)
        self.calls: dict[int, object] = {}  # requests in flight: id -> how to hand them an event
        self.failed: str | None = None
        self.created = int(time.time())
        self.web = extra("aiohttp.web", "the server")

    def app(self):
        web = self.web
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors, self._auth])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        return app

    def error(self, status: int, message: str):
        self.metrics.rejected.labels(str(status)).inc()
        kind = "invalid_request_error" if status < 500 else "server_error"
        return self.web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)

    @property
    def _errors(self):
        web = self.web

        @web.middleware
        async def errors(request, handler):
            try:
                return await handler(request)
            except BadRequest as e:
                return self.error(e.status, str(e))
            except web.HTTPException as e:  # aiohttp's own: an unknown path, a wrong method, a body too large
                return self.error(e.status, e.reason if e.status != 413 else f"request body over {MAX_BODY} bytes")
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as e:  # never a traceback to a client
                print(f"serve: {request.path}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                return self.error(500, f"{type(e).__name__}: {e}")
        return errors

    @property
    def _auth(self):
        @self.web.middleware
        async def auth(request, handler):
            if self.served.api_key and request.path != "/health":
                given = request.headers.get("Authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {self.served.api_key}".encode()):
                    return self.error(401, "a missing or wrong API key (Authorization: Bearer KEY)")
            return await handler(request)
        return auth

    def _failed(self, message: str) -> None:
        """The engine stopped (its SUT raised): every request in flight and every later one gets a 500/503."""
        self.failed = message
        print(f"serve: {message}", file=sys.stderr, flush=True)
        for tell in list(self.calls.values()):
            tell(("error", message))

    async def health(self, request):
        if self.failed:
            return self.error(503, f"the engine has stopped: {self.failed}")
        return self.web.json_response({"status": "ok"})

    async def models(self, request):
        info = asdict(SUTInfo.of(self.sut, self.engine.batch))
        return self.web.json_response({"object": "list", "data": [{
            "id": self.served.model_id, "object": "model", "created": self.created, "owned_by": "mlperf-spec",
            "max_model_len": self.sut.target.config.block_size, "root": self.served.root,
            "mlperf": {"sut": info, "config": self.served.settings, "version": env.commit(),
                       "tokenizer": self.served.tokenizer}}]})

    async def prometheus(self, request):
        return self.web.Response(body=self.metrics.text(), content_type="text/plain", charset="utf-8")

    async def chat(self, request):
        return await self.completions(request, chat=True)

    async def completions(self, request, chat: bool = False):
        if self.failed:
            return self.error(503, f"the engine has stopped: {self.failed}")
        if len(self.calls) >= self.served.max_requests:
            return self.error(503, f"busy: {len(self.calls)} requests in flight, the most this server takes "
                                   "(--max-requests)")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"the body is not JSON: {e}") from None
        req = parse(body, self.tokenizer, self.sut, self.served.model_id, chat)
        if not req.params.greedy and self.served.greedy_only:
            raise BadRequest("this server sets its drafts' acceptance synthetically, which is greedy only: send "
                             "temperature 0")
        if req.max_tokens == 0:  # echo alone: the prompt scored, nothing generated
            return await self._answer(req, Result([], Stats()))
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def tell(event):  # from the engine on this loop, or from a plug-in's thread (LocalEngine.drive)
            if on_loop(loop):
                events.put_nowait(event)  # its handler writes it as soon as the engine yields
            else:
                with suppress(RuntimeError):  # the loop has closed: nobody is listening
                    loop.call_soon_threadsafe(events.put_nowait, event)
        seq = Sequence(req.prompt, req.max_tokens, req.params, on_tokens=lambda new: tell(("tokens", new)),
                       on_done=lambda result: tell(("done", result)), min_tokens=req.min_tokens)
        self.calls[id(seq)] = tell
        try:
            self.engine.submit([seq])
            return await (self._stream(request, req, events) if req.stream else self._whole(req, events))
        finally:
            seq.cancelled = True  # a client gone mid-request frees its row at the next step (no-op once done)
            del self.calls[id(seq)]

    def _choice(self, text: str, new: list[int], req: Completion, reason: str | None, whole: bool = False) -> dict:
        """A choice as the endpoint writes it: the text (a completion), the reply as a message (a whole chat) or
        the message's next delta (a streamed chat)."""
        said = {"text": text} if not req.chat else {"message": {"role": "assistant", "content": text}} if whole \
            else {"delta": {"role": "assistant", "content": text}}
        return {"index": 0, **said, "logprobs": None, "finish_reason": reason,
                **({"token_ids": new} if req.token_ids else {})}

    def _body(self, req: Completion, choices: list, whole: bool = False, **extra_fields) -> dict:
        kind = "text_completion" if not req.chat else "chat.completion" if whole else "chat.completion.chunk"
        return {"id": req.id, "object": kind, "created": int(time.time()), "model": self.served.model_id,
                "choices": choices, **extra_fields}

    def _finished(self, req: Completion, result: Result) -> tuple[str, dict, dict]:
        reason = "stop" if result.tokens and result.tokens[-1] == self.sut.eos_id and not req.ignore_eos else "length"
        self.metrics.answered(len(req.prompt), result, reason)
        usage = {"prompt_tokens": len(req.prompt), "completion_tokens": len(result.tokens),
                 "total_tokens": len(req.prompt) + len(result.tokens),
                 "prompt_tokens_details": {"cached_tokens": 0}}  # vLLM's field: no prefix is reused from a cache
        return reason, usage, asdict(result.stats)

    async def _whole(self, req: Completion, events: asyncio.Queue):
        while True:
            kind, value = await events.get()
            if kind == "error":
                return self.error(500, value)
            if kind == "done":
                return await self._answer(req, value)

    async def _answer(self, req: Completion, result: Result):
        """A whole answer: the text (after the prompt's with echo), and its tokens' log-probabilities where asked,
        from one forward of the target beside the engine (read-only, on a thread of its own)."""
        reason, usage, stats = self._finished(req, result)
        text = (self.tokenizer.decode(req.prompt) if req.echo else "") + self.tokenizer.decode(result.tokens)
        choice = self._choice(text, result.tokens, req, reason, whole=True)
        if req.logprobs is not None:
            choice["logprobs"] = await asyncio.get_running_loop().run_in_executor(
                None, scored, self.sut.target.model, self.tokenizer, req.prompt, result.tokens, req.logprobs, req.echo,
                req.as_ids)
        return self.web.json_response(self._body(req, [choice], whole=True, usage=usage, stats=stats))

    async def _stream(self, request, req: Completion, events: asyncio.Queue):
        response = self.web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        text = Text(self.tokenizer)
        send = lambda body: response.write(f"data: {json.dumps(body)}\n\n".encode())  # noqa: E731
        while True:
            kind, value = await events.get()
            if kind == "tokens":
                await send(self._body(req, [self._choice(text.delta(value), value, req, None)]))
            elif kind == "error":
                await send({"error": {"message": value, "type": "server_error", "code": 500}})
                break
            else:
                reason, usage, stats = self._finished(req, value)
                rest = value.tokens[len(text.tokens):]  # a plug-in that decodes whole streams only its first token
                await send(self._body(req, [self._choice(text.delta(rest, last=True), rest, req, reason)],
                                      stats=stats, **({} if req.usage_chunk else {"usage": usage})))
                if req.usage_chunk:
                    await send(self._body(req, [], usage=usage))
                break
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def run(self, host: str, port: int) -> None:
        """Serve until SIGTERM or Ctrl-C, then answer what is in flight (SHUTDOWN_S at most) and return."""
        runner = self.web.AppRunner(self.app(), handler_cancellation=True, access_log=None,
                                    shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        engine = asyncio.create_task(self.engine.drive())
        try:
            await self.web.TCPSite(runner, host, port).start()
            bound = runner.addresses[0][1]
            stop, loop = asyncio.Event(), asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            print(f"serving SUT {self.sut.name} as model {self.served.model_id!r} on http://{host}:{bound}/v1 "
                  f"(up to {self.engine.batch} rows; Ctrl-C or SIGTERM to stop)", flush=True)
            await stop.wait()
            print(f"stopping: answering {len(self.calls)} requests in flight", flush=True)
        finally:
            await runner.cleanup()
            engine.cancel()


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running `loop`."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


@contextmanager
def child(cfg: RunConfig, *args: str):
    """`python -m mlperf serve` of `cfg` (and `args`: --api-key, --max-requests, ...) in a child process on a free
    loopback port, for the block: (its URL, the process). SIGTERM after (it answers what is in flight, exits 0)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(asdict(cfg), f)
    proc = subprocess.Popen([sys.executable, "-m", "mlperf", "serve", "--config", f.name, "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = next((m[1] for line in proc.stdout if (m := re.search(r" on (http://[\d.]+:\d+)/v1 ", line))), None)
        if url is None:
            why = (proc.stderr.read().strip().splitlines() or ["no output"])[-1]
            raise ValueError(f"our server of SUT {cfg.sut} did not start: {why}")
        yield url, proc
    finally:
        os.unlink(f.name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(SHUTDOWN_S + 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def serve(cfg: RunConfig, listen: Listen) -> None:
    """Serve `cfg`'s SUT on our engine at `listen`'s address until SIGTERM or Ctrl-C."""
    listen = replace(listen, api_key=listen.api_key or api_key())
    cfg.validate()
    listen.validate()
    extra("aiohttp", "the server")
    extra("prometheus_client", "the server's /metrics")
    set_threads(cfg.threads)
    tokenizer = load_tokenizer(cfg.target, cfg.tokenizer)
    print(f"loading SUT {cfg.sut} ...", flush=True)
    sut = cfg.build_sut(tokenizer.eos_id, reference=synthetic_reference(cfg, tokenizer))
    sut.generate(tokenizer.encode("def main():\n") or [0], 8, cfg.sampling())  # first calls out of the first request
    server = ApiServer(sut, tokenizer, served(cfg, listen))
    asyncio.run(server.run(listen.host, listen.port))
