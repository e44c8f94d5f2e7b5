"""`python -m mlperf soak` (`make soak`): our server under a long mixed load, as a client population would give it.

N requests paced over the duration (a few at a time), of which a share is malformed (bad JSON, unknown fields,
token ids outside the vocabulary, an over-long prompt) and a share disconnects after its first streamed chunk;
the rest are greedy, whole or streamed, and each must equal the SUT's in-process answer for its prompt. The
server's resident memory is read every 100 requests: after the warm-up, the last 100's must lie within 5% of
the first 100's. Fails (exit 1) on any wrong answer, any status but the expected one, or growing memory.
"""
import asyncio
import json
import random
import time
from pathlib import Path

from commands.options import run_config
from commands.exits import GateFailed
from serving.server import child
from mlperf.data import load_prompts
from mlperf.extras import extra
from mlperf.tokenizer import load_tokenizer
from scenarios.config import RunConfig
from serving.wire import prometheus_sums

MEMORY_BAND = 0.05  # the last 100 requests' resident memory within this of the first 100's (after the warm-up)
WARM_UP = 100  # requests before memory is compared


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


REFUSED = ("malformed", "unknown field", "bad ids", "too long")  # kinds of request the server must answer 400
RUNNING = "vllm:num_requests_running"  # the server's gauge of rows decoding


def request_data(body: dict, kind: str) -> bytes:
    """The bytes a request of `kind` sends: `body` as it is, or spoiled as the kind says."""
    if kind == "unknown field":
        body = {**body, "frobnicate": True}
    elif kind == "bad ids":
        body = {**body, "prompt": [10 ** 6]}
    elif kind == "too long":
        body = {**body, "prompt": [1] * 100_000}
    data = json.dumps(body).encode()
    return data[:len(data) // 2] if kind == "malformed" else data


async def answered_right(response, kind: str, expected: list[int]) -> bool:
    """A 400 with a message for a spoiled request; for a good one, the in-process answer (streamed or whole); a
    client that leaves after its first chunk only needs its 200."""
    if kind in REFUSED:
        return response.status == 400 and "message" in (await response.json())["error"]
    if kind == "disconnect":
        await response.content.readline()
        response.close()
        return response.status == 200
    if kind == "stream":
        tokens = []
        async for line in response.content:
            if line.startswith(b"data: {"):
                tokens += (json.loads(line[6:])["choices"] or [{}])[0].get("token_ids", [])
        return response.status == 200 and tokens == expected
    answer = await response.json()
    return response.status == 200 and answer["choices"][0]["token_ids"] == expected


def soak(cfg: RunConfig, requests: int, seconds: float, bad_share: float, prompts_used: int = 16) -> dict:
    aiohttp = extra("aiohttp", "soak")
    tokenizer = load_tokenizer(cfg.target, cfg.tokenizer)
    prompts = [tokenizer.encode(p.text)[-200:] for p in load_prompts(cfg.prompts)[:prompts_used]]
    print(f"soak: the in-process answers of {len(prompts)} prompts ...", flush=True)
    sut = cfg.build_sut(tokenizer.eos_id)
    expected = [sut.generate(p, cfg.max_new_tokens).tokens for p in prompts]
    del sut
    rng = random.Random(cfg.seed)
    kinds = rng.choices(["good", "stream", "malformed", "unknown field", "bad ids", "too long", "disconnect"],
                        weights=[(1 - bad_share) / 2] * 2 + [bad_share / 8] * 4 + [bad_share / 2], k=requests)
    outcome = {"wrong": [], "memory": [], "counts": {}}

    async def one(session, url, i, kind):
        p = i % len(prompts)
        body = {"prompt": prompts[p], "max_tokens": cfg.max_new_tokens, "temperature": 0, "return_token_ids": True,
                "stream": kind in ("stream", "disconnect")}
        async with session.post(url + "/v1/completions", data=request_data(body, kind),
                                headers={"Content-Type": "application/json"}) as response:
            ok = await answered_right(response, kind, expected[p])
        outcome["counts"][kind] = outcome["counts"].get(kind, 0) + 1
        if not ok:
            outcome["wrong"].append(f"request {i} ({kind}): status {response.status}")

    async def drive(url, pid):
        gap, start = seconds / requests, time.perf_counter()
        async with aiohttp.ClientSession() as session:
            pending = set()
            for i, kind in enumerate(kinds):
                await asyncio.sleep(max(0.0, start + i * gap - time.perf_counter()))
                pending.add(asyncio.create_task(one(session, url, i, kind)))
                if (i + 1) % 100 == 0:
                    outcome["memory"].append(rss_bytes(pid))
                    print(f"soak: {i + 1} requests sent, {len(outcome['wrong'])} wrong, server resident "
                          f"{outcome['memory'][-1] / 2 ** 20:.1f} MiB", flush=True)
                pending = {t for t in pending if not t.done()}
            await asyncio.gather(*pending)
            for _ in range(100):  # every row freed: those of the clients that left too
                async with session.get(url + "/metrics") as response:
                    running = prometheus_sums(await response.text(), (RUNNING,)).get(RUNNING, 0.0)
                if not running:
                    break
                await asyncio.sleep(0.1)
            if running:
                outcome["wrong"].append(f"{running:.0f} rows still running after every request ended")

    with child(cfg) as (url, proc):
        asyncio.run(drive(url, proc.pid))
    memory = outcome["memory"][WARM_UP // 100:]
    growth = memory[-1] / memory[0] - 1 if len(memory) > 1 else 0.0
    result = {"requests": requests, "seconds": seconds, "counts": outcome["counts"], "wrong": outcome["wrong"],
              "resident_mib": [m / 2 ** 20 for m in outcome["memory"]], "growth": growth}
    print(f"soak: {requests} requests in {seconds:.0f} s, {len(outcome['wrong'])} wrong; kinds {outcome['counts']}; "
          f"server resident after the warm-up {memory[0] / 2 ** 20:.1f} -> {memory[-1] / 2 ** 20:.1f} MiB "
          f"({growth:+.1%})", flush=True)
    if outcome["wrong"]:
        raise GateFailed(f"soak: {len(outcome['wrong'])} requests answered wrongly, the first: {outcome['wrong'][0]}")
    if abs(growth) > MEMORY_BAND:
        raise GateFailed(f"soak: the server's resident memory moved {growth:+.1%} (more than {MEMORY_BAND:.0%})")
    return result


def main(args) -> None:
    cfg = run_config(args)
    cfg.validate()
    if args.requests < 2 * WARM_UP:
        raise ValueError(f"--requests must be at least {2 * WARM_UP} (memory is compared after {WARM_UP})")
    soak(cfg, args.requests, args.seconds, args.bad)
