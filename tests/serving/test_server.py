"""`python -m mlperf serve`: our engine over an OpenAI-compatible API, started on a free loopback port and stopped
(SIGTERM, exit 0) by each test; bad requests, keys, limits and clients that leave."""
from http.client import HTTPConnection
import json
import time
from urllib.parse import urlparse

import pytest

from mlperf.tokenizer import ByteTokenizer
from suts.registry import build_sut
from tests.helpers import cli_env, http, prometheus, python_m, our_server

PROMPT = "def fib(n):\n    "


@pytest.fixture(scope="module")
def server(tiny_pair):
    with our_server(tiny_pair, "--max-batch", "4") as (url, proc):
        yield url
    assert proc.returncode == 0, proc.stderr.read()[-2000:]


def test_a_completion_is_the_in_process_greedy_decode_whole_streamed_and_through_openais_client(server, tiny_pair):
    import openai
    expected = build_sut("baseline", str(tiny_pair / "target")).generate(list(PROMPT.encode()), 24).tokens
    status, body = http(server + "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                                     "return_token_ids": True})
    assert status == 200 and body["choices"][0]["token_ids"] == expected, body
    assert body["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 24, "total_tokens": len(PROMPT) + 24,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    status, models = http(server + "/v1/models")  # the folder a client loads the tokenizer from: the target's
    assert status == 200 and models["data"][0]["mlperf"]["tokenizer"] == str(tiny_pair / "target")
    assert body["choices"][0]["text"] == ByteTokenizer().decode(expected)
    status, ids = http(server + "/v1/completions", {"prompt": list(PROMPT.encode()), "max_tokens": 24, "temperature": 0,
                                                    "return_token_ids": True})
    assert ids["choices"][0]["token_ids"] == expected  # a prompt of token ids is the same prompt

    client = openai.OpenAI(base_url=server + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["spec"]
    chunks = list(client.completions.create(model="spec", prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == body["choices"][0]["text"]
    assert chunks[-1].usage.completion_tokens == 24 and chunks[-2].choices[0].finish_reason == "length"


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "the body is not JSON"),
    ([1, 2], 400, "the body must be a JSON object"),
    ({"prompt": "x", "max_tokens": 4, "frobnicate": 1}, 400, "unknown field 'frobnicate'"),
    ({"prompt": "x", "max_tokens": 4, "n": 2}, 400, "n=2 is not supported"),
    ({"prompt": "x", "max_tokens": "4"}, 400, "max_tokens: input should be a valid integer"),
    ({"prompt": "x", "max_tokens": 10 ** 400}, 400, "exceeds the model's context"),
    ({"prompt": "x", "max_tokens": 4, "temperature": -1}, 400, "temperature must be >= 0"),
    ({"prompt": "x", "max_tokens": 4, "temperature": 1, "seed": 2 ** 70}, 400, "seed: input should be less than"),
    ({"prompt": "", "max_tokens": 4}, 400, "prompt must be a non-empty string"),
    ({"prompt": [1, 999], "max_tokens": 4}, 400, "outside the vocabulary"),
    ({"prompt": "x" * 600, "max_tokens": 4}, 400, "exceeds the model's context of 512"),
    ({"prompt": "x", "max_tokens": 4, "stream": "yes"}, 400, "stream: input should be a valid boolean"),
    ({"prompt": "x", "max_tokens": 4, "ignore_eos": "yes"}, 400, "ignore_eos: input should be a valid boolean"),
    ({"prompt": "x", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens (5) must not exceed max_tokens (4)"),
    ({"prompt": "x", "max_tokens": 4, "min_tokens": -1}, 400, "min_tokens: input should be greater than or equal"),
    ({"prompt": "x", "max_tokens": 4, "model": "gpt-4"}, 404, "model 'gpt-4' is not served here"),
    (b"{" + b" " * (1 << 20) + b"}", 413, "request body over"),
])
def test_a_bad_request_is_its_status_and_one_line_and_the_server_answers_the_next(server, body, status, message):
    got, answer = http(server + "/v1/completions", body)
    assert got == status and message in answer["error"]["message"] and "\n" not in answer["error"]["message"], answer
    assert http(server + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200


def test_the_fixed_length_fields_benchmark_clients_send_reach_the_engine(server, tiny_pair):
    """ignore_eos (AIPerf's `--extra-inputs ignore_eos:true`, `vllm bench serve`) and min_tokens are taken: an EOS
    before max_tokens (ignore_eos) or min_tokens no longer ends the completion (tests/suts/engine/test_scheduler.py
    decodes through EOS; the byte vocabulary here has none)."""
    from serving.protocol import parse
    sut = build_sut("baseline", str(tiny_pair / "target"))
    fixed = parse({"prompt": [1, 2], "max_tokens": 8, "ignore_eos": True}, ByteTokenizer(), sut, "spec")
    assert (fixed.min_tokens, fixed.ignore_eos) == (8, True)
    assert parse({"prompt": [1, 2], "max_tokens": 8, "min_tokens": 3}, ByteTokenizer(), sut, "spec").min_tokens == 3
    status, body = http(server + "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True,
                                                     "min_tokens": 4, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] == 12
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_chat_is_the_completion_of_its_plain_template_whole_and_streamed(server, tiny_pair):
    """/v1/chat/completions (what AIPerf and GuideLLM send by default): the messages through the stated plain
    template (serving/protocol.py, CHAT_TEMPLATE) are the prompt; the reply is that prompt's greedy completion,
    as a message whole and as deltas streamed (through openai's client too); a bad message is one 400 line."""
    import openai
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "A fib function"}]
    prompt = "system: You write Python.\nuser: A fib function\nassistant: "
    want = http(server + "/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0})[1]
    status, body = http(server + "/v1/chat/completions", {"messages": messages, "max_tokens": 16, "temperature": 0})
    assert status == 200 and body["object"] == "chat.completion", body
    assert body["choices"][0]["message"] == {"role": "assistant", "content": want["choices"][0]["text"]}
    assert body["usage"] == want["usage"] and body["choices"][0]["finish_reason"] == "length"
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused")
    chunks = list(client.chat.completions.create(model="spec", messages=messages, max_completion_tokens=16,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want["choices"][0]["text"]
    assert chunks[-1].usage.completion_tokens == 16
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"][:4]},
                                             {"type": "text", "text": m["content"][4:]}]} for m in messages]
    status, listed = http(server + "/v1/chat/completions", {"messages": parts, "max_tokens": 16, "temperature": 0})
    assert status == 200 and listed["choices"][0]["message"] == body["choices"][0]["message"]  # OpenAI's list form
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    for bad, message in [({"messages": []}, "messages: list should have at least 1 item"),
                         ({"messages": image}, "messages.0.content"),
                         ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role: input should be"),
                         ({"messages": messages, "prompt": "x"}, "unknown field 'prompt'")]:
        got, answer = http(server + "/v1/chat/completions", bad)
        assert got == 400 and message in answer["error"]["message"], answer


def test_echo_and_logprobs_are_the_models_own_log_probabilities(server, tiny_pair):
    """lm-eval's log-likelihood request (`echo`, `logprobs`, max_tokens 0 or 1): every prompt token's
    log-probability (the first has none) and the generated token's, each equal to log_softmax of the target's own
    forward within 1e-4, with the top alternatives (the token's own beside them); the text begins with the
    prompt's."""
    import torch
    from mlperf.checkpoint import load_model
    from mlperf.chunk import Chunk
    model = load_model(tiny_pair / "target")
    ids = list(PROMPT.encode())
    for max_tokens in (0, 1):
        status, body = http(server + "/v1/completions", {"prompt": PROMPT, "max_tokens": max_tokens, "echo": True,
                                                         "logprobs": 2, "temperature": 0, "return_token_ids": True,
                                                         "return_tokens_as_token_ids": True})
        assert status == 200, body
        choice = body["choices"][0]
        full = ids + choice["token_ids"]
        assert len(choice["token_ids"]) == max_tokens and choice["text"].startswith(PROMPT)
        with torch.inference_mode():
            lp = torch.log_softmax(model(torch.tensor([full]), Chunk()).logits[0].float(), -1)
        want = [None] + [float(lp[t - 1, full[t]]) for t in range(1, len(full))]
        got = choice["logprobs"]["token_logprobs"]
        assert got[0] is None and len(got) == len(want)
        assert max(abs(g - w) for g, w in zip(got[1:], want[1:])) < 1e-4
        top, row = choice["logprobs"]["top_logprobs"][-1], lp[len(full) - 2]
        assert choice["logprobs"]["tokens"][-1] == f"token_id:{full[-1]}" and f"token_id:{full[-1]}" in top
        best = row.topk(2).indices.tolist()
        assert all(abs(top[f"token_id:{i}"] - float(row[i])) < 1e-4 for i in best) and len(top) <= 3
    status, body = http(server + "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "logprobs": 0,
                                                     "temperature": 0})
    assert status == 200 and len(body["choices"][0]["logprobs"]["token_logprobs"]) == 3  # the completion's alone
    for bad, message in [({"prompt": "x", "max_tokens": 0}, "max_tokens 0 scores the prompt alone"),
                         ({"prompt": "x", "logprobs": 21}, "logprobs: input should be less than or equal to 20"),
                         ({"prompt": "x", "logprobs": 1, "stream": True}, "logprobs are served whole")]:
        got, answer = http(server + "/v1/completions", bad)
        assert got == 400 and message in answer["error"]["message"], answer


def test_a_vanishing_temperature_is_greedy_and_sampling_is_seeded(server):
    greedy = http(server + "/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                               "return_token_ids": True})[1]["choices"][0]["token_ids"]
    tiny = http(server + "/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 1e-300,
                                             "return_token_ids": True})
    assert tiny[0] == 200 and tiny[1]["choices"][0]["token_ids"] == greedy
    sampled = [http(server + "/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "seed": seed,
                                                 "return_token_ids": True})[1]["choices"][0]["token_ids"]
               for seed in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]


def test_unknown_paths_and_methods_are_json_errors(server):
    assert http(server + "/v2/nothing")[0] == 404
    status, answer = http(server + "/v1/completions", method="GET")
    assert status == 405 and answer["error"]["code"] == 405
    assert http(server + "/health") == (200, {"status": "ok"})


def test_a_non_loopback_bind_without_a_key_is_refused(tiny_pair):
    proc = python_m("mlperf", "serve", "--target", tiny_pair / "target", "--host", "0.0.0.0",
                    env={**cli_env(), "MLPERF_API_KEY": ""}, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --host 0.0.0.0 is reachable from other machines: give --api-key (or MLPERF_API_KEY) too"]


def stream_first_chunk(url: str, key: str, max_tokens: int):
    """A streamed request left open after its first chunk: (the connection, that chunk's line)."""
    where = urlparse(url)
    conn = HTTPConnection(where.hostname, where.port, timeout=60)
    conn.request("POST", "/v1/completions", body=f'{{"prompt": "abc", "max_tokens": {max_tokens}, "stream": true}}',
                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    line = next(line for line in iter(response.fp.readline, b"") if line.startswith(b"data:"))
    return conn, line


def test_keys_the_limit_in_flight_and_a_client_that_leaves(tiny_pair):
    """With --api-key every path but /health needs the key; past --max-requests a request is 503; a client that
    closes its stream frees its row (running rows back to 0) without its request counted as answered."""
    key = {"Authorization": "Bearer s3cret"}
    with our_server(tiny_pair, "--max-requests", "1", "--api-key", "s3cret",
                 sut="tests.commands.slow_sut:Slow") as (url, proc):
        assert http(url + "/health")[0] == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            status, answer = http(url + "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers)
            assert status == 401 and "API key" in answer["error"]["message"]
        assert http(url + "/v1/completions", {"prompt": "x", "max_tokens": 2}, key)[0] == 200

        conn, first = stream_first_chunk(url, "s3cret", 400)  # 400 steps of 5 ms at least: in flight for 2 s
        assert prometheus(url, key)["vllm:num_requests_running"] == 1
        status, answer = http(url + "/v1/completions", {"prompt": "x", "max_tokens": 2}, key)
        assert status == 503 and "1 requests in flight" in answer["error"]["message"]
        answered = prometheus(url, key)['vllm:request_success_total{finished_reason="length"}']
        conn.close()
        deadline = time.monotonic() + 30
        while prometheus(url, key)["vllm:num_requests_running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        metrics = prometheus(url, key)
        assert metrics["vllm:num_requests_running"] == 0
        assert metrics['vllm:request_success_total{finished_reason="length"}'] == answered  # dropped, not finished
        assert http(url + "/v1/completions", {"prompt": "x", "max_tokens": 2}, key)[0] == 200
    assert proc.returncode == 0


def test_a_plug_in_that_decodes_whole_streams_beside_a_loop_that_still_answers(tiny_pair):
    """The engine runs on the server's event loop; a plug-in that implements only `generate` runs on a thread
    beside it: its first token streams out while it decodes, the loop answers other requests meanwhile, and the
    stream carries every token it returns."""
    with our_server(tiny_pair, sut="tests.commands.slow_sut:SlowWhole") as (url, proc):
        where = urlparse(url)
        conn = HTTPConnection(where.hostname, where.port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "abc", "max_tokens": 400, "stream": True,
                                                                 "return_token_ids": True}))  # 2 s at least
        lines = (json.loads(line[5:]) for line in iter(conn.getresponse().fp.readline, b"")
                 if line.startswith(b"data: {"))
        ids = next(lines)["choices"][0]["token_ids"]
        assert http(url + "/health")[0] == 200 and prometheus(url)["vllm:num_requests_running"] == 1
        for chunk in lines:
            ids += chunk["choices"][0]["token_ids"] if chunk["choices"] else []
            if chunk["choices"] and chunk["choices"][0]["finish_reason"]:
                break
        assert len(ids) == 400
        conn.close()
    assert proc.returncode == 0


def test_a_server_at_synthetic_acceptance_answers_greedy_requests_exactly_and_refuses_sampled_ones(tiny_pair):
    from mlperf.data import load_prompts
    prompt = load_prompts()[0].text
    expected = build_sut("baseline", str(tiny_pair / "target")).generate(list(prompt.encode()), 24).tokens
    with our_server(tiny_pair, "--synthetic-acceptance-rates", "0.8", "--samples", "2") as (url, proc):
        status, body = http(url + "/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                                      "return_token_ids": True})
        assert status == 200 and body["choices"][0]["token_ids"] == expected, body
        status, body = http(url + "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0.8})
        assert status == 400 and "greedy only" in body["error"]["message"], body
    assert proc.returncode == 0, proc.stderr.read()[-2000:]
