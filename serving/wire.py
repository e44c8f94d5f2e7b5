"""What an OpenAI-compatible server's answers say, read one way for every server: a stream chunk, the token ids it
carries, the request's statistics (ours) or timings (llama.cpp's), its /metrics counters and the one line an error
body says. serving/endpoint.py asks; anything it cannot read is an EndpointError in one line."""
import json
from contextlib import suppress

from mlperf.extras import extra
from suts.engine.stats import Stats


class EndpointError(ValueError):
    """The server failed a request or cannot be used: one line."""


def parse_chunk(data: bytes) -> dict:
    try:
        chunk = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EndpointError(f"a stream chunk that is not JSON: {data[:80]!r}") from None
    if not isinstance(chunk, dict):
        raise EndpointError(f"a stream chunk that is not a JSON object: {data[:80]!r}")
    if "error" in chunk:
        raise EndpointError(f"the server's stream ended in an error: {error_line(json.dumps(chunk))}")
    return chunk


def chunk_tokens(chunk: dict) -> list[int]:
    """The token ids a stream chunk carries: ours and vLLM's `choices[0].token_ids`, llama.cpp's `tokens`."""
    choice = (chunk.get("choices") or [{}])[0]
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    ids = ids if ids is not None else chunk.get("tokens", choice.get("tokens") if isinstance(choice, dict) else None)
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        raise EndpointError(f"token ids that are not a list of integers: {str(ids)[:80]}")
    return ids


def server_stats(stats: dict | None, times: list[float]) -> Stats:
    """Stats of a completion: the server's own where it sent them (ours), the token times as this client saw
    them (what LoadGen's latencies are)."""
    if not isinstance(stats, dict):
        return Stats(token_times_s=times)
    try:
        return Stats(**{**stats, "token_times_s": times,
                        "cycle_hist": {int(g): c for g, c in stats.get("cycle_hist", {}).items()},
                        "batch_steps": {int(b): n for b, n in stats.get("batch_steps", {}).items()}})
    except (TypeError, ValueError, AttributeError):
        raise EndpointError(f"stats the harness cannot read: {str(stats)[:80]}") from None


def timed_stats(timings: dict, times: list[float]) -> Stats:
    """Stats from llama.cpp's per-request `timings`: its prompt phase as prefill, its generation as decoding, each
    decode step taken to run alone (exact in SingleStream). A speculative request's steps are left uncounted:
    llama.cpp does not split its cycles into drafting and verifying, so the roofline costs its prefill alone."""
    try:
        steps = 0 if timings.get("draft_n") else max(0, int(timings["predicted_n"]) - 1)
        return Stats(token_times_s=times, prefill_s=float(timings["prompt_ms"]) / 1e3,
                     decode_s=float(timings["predicted_ms"]) / 1e3, steps=steps,
                     batch_steps={1: steps} if steps else {})
    except (KeyError, TypeError, ValueError):
        raise EndpointError(f"timings the harness cannot read: {str(timings)[:80]}") from None


def prometheus_sums(text: str, names) -> dict[str, float]:
    """Each named counter summed over its labels, from Prometheus text (prometheus_client's parser; a counter `x` is
    exposed as `x_total`, beside `x_created`); {} where the text is not Prometheus'."""
    parser = extra("prometheus_client.parser", "reading a server's /metrics")
    sums = {}
    try:
        for family in parser.text_string_to_metric_families(text):
            name = family.name.removesuffix("_total")  # an untyped `x_total`'s family keeps the suffix
            if name in names:
                sums[name] = sums.get(name, 0.0) + sum(s.value for s in family.samples
                                                       if s.name in (name, name + "_total"))
    except ValueError:
        return {}
    return sums


def error_line(text: str) -> str:
    """The one line a server's error body says: OpenAI's {"error": {"message"}}, else its first line."""
    with suppress(ValueError, TypeError, AttributeError):
        error = json.loads(text)["error"]
        return str(error.get("message", error) if isinstance(error, dict) else error)
    return (text.strip().splitlines() or ["no body"])[0][:200]
