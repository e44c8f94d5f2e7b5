"""Benchmark clients the field runs against OpenAI-compatible servers, unmodified, against our server on loopback:
AIPerf and GuideLLM (their synthetic prompts and token counts from the tokenizer folder the target carries) and
lm-eval (log-likelihoods). They live in a virtual environment of their own (`.venv-clients`, which .ci/run makes;
MLPERF_CLIENTS names another), as their pins are not the harness's; without it these tests skip."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, our_server

CLIENTS = Path(os.environ.get("MLPERF_CLIENTS") or ROOT / ".venv-clients") / "bin"
REQUESTS, OUTPUT_TOKENS = 8, 12


def client(name: str) -> Path:
    path = CLIENTS / name
    if not path.is_file():
        pytest.skip(f"{name} is not installed in {CLIENTS.parent} (.ci/run installs it)")
    return path


def online() -> dict:
    """The environment without Hugging Face's offline switches: under HF_HUB_OFFLINE AIPerf 0.13 looks for a
    tokenizer in the hub's cache alone, never in the folder it is given (which it reads without the network)."""
    return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}


def metric(export: dict, name: str) -> dict:
    """One of AIPerf's exported metrics (avg, p50, p99, ... and its unit)."""
    found = export.get(name) or next((m for m in export.get("records", []) if m.get("tag") == name), None)
    assert found, f"AIPerf exported no {name}: {sorted(export)[:20]}"
    return found


def test_aiperf_runs_unmodified_against_our_server_with_fixed_output_lengths(tiny_pair, tmp_path):
    """Streamed completions at concurrency 2 with `ignore_eos` (what a fixed-length benchmark sends): every request
    succeeds with exactly its requested output tokens (the server's `usage`), AIPerf's tokenizer counts each prompt
    as ours does, and TTFT and ITL are measured. (AIPerf also counts the output by tokenizing its text again: the
    tiny pair's random bytes are not UTF-8, each a replacement character of three bytes, so that count runs high.)"""
    aiperf = client("aiperf")
    with our_server(tiny_pair, "--max-batch", "4") as (url, _):
        done = subprocess.run(
            [str(aiperf), "profile", "--model", "spec", "--url", url, "--endpoint-type", "completions", "--streaming",
             "--tokenizer", str(tiny_pair / "target"), "--request-count", str(REQUESTS), "--concurrency", "2",
             "--prompt-input-tokens-mean", "24", "--prompt-input-tokens-stddev", "0",
             "--prompt-output-tokens-mean", str(OUTPUT_TOKENS), "--prompt-output-tokens-stddev", "0",
             "--extra-inputs", "ignore_eos:true", "--random-seed", "0", "--ui-type", "none",
             "--output-artifact-dir", str(tmp_path / "aiperf")],
            capture_output=True, text=True, timeout=600, env=online())
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    export = json.loads(next((tmp_path / "aiperf").rglob("profile_export_aiperf.json")).read_text())
    assert metric(export, "request_count")["avg"] == REQUESTS
    assert metric(export, "usage_completion_tokens")["avg"] == OUTPUT_TOKENS
    assert metric(export, "input_sequence_length")["avg"] == metric(export, "usage_prompt_tokens")["avg"] == 24
    assert metric(export, "time_to_first_token")["avg"] > 0 and metric(export, "inter_token_latency")["avg"] > 0


def test_guidellm_runs_unmodified_against_our_server_through_chat(tiny_pair, tmp_path):
    """GuideLLM's default: streamed chat completions (content in OpenAI's list of parts), concurrency 2, its
    synthetic prompts, output lengths fixed by `ignore_eos`: every request succeeds with exactly its output tokens,
    its prompt the synthetic tokens plus our plain chat template's (`user: ` before, `\\nassistant: ` after)."""
    guidellm = client("guidellm")
    out = tmp_path / "guidellm.json"
    with our_server(tiny_pair, "--max-batch", "4") as (url, _):
        done = subprocess.run(
            [str(guidellm), "run", "--backend", f"kind=openai_http,target={url},model=spec",
             "--profile", "kind=concurrent,streams=2", "--constraint", f"kind=max_requests,count={REQUESTS}",
             "--data", f"kind=synthetic_text,prompt_tokens=24,output_tokens={OUTPUT_TOKENS}",
             "--tokenizer", f"kind=huggingface_auto,model={tiny_pair / 'target'}", "--output", f"kind=json,path={out}",
             "--disable-console-interactive"], capture_output=True, text=True, timeout=600, env=online(), cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    requests = json.loads(out.read_text())["benchmarks"][0]["requests"]
    assert len(requests["successful"]) == REQUESTS and not requests["errored"] and not requests["incomplete"]
    assert {r["output_tokens"] for r in requests["successful"]} == {OUTPUT_TOKENS}
    assert {r["prompt_tokens"] for r in requests["successful"]} == {24 + len("user: \nassistant: ")}
    assert all(r["time_to_first_token_ms"] > 0 for r in requests["successful"])


TASK = """task: mlperf_loglikelihood
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""
PAIRS = [("def add(a, b):\n    return", " a + b"), ("import os\nimport", " sys\n"), ("for i in range(", "10):")]
# (a context ending in whitespace would be scored with it moved to the continuation: lm-eval's `_encode_pair`)


def test_lm_eval_scores_our_server_as_the_model_itself_does(tiny_pair, tmp_path):
    """lm-eval's `local-completions` running a log-likelihood task of three (context, continuation) pairs through
    our server (`echo`, `logprobs`, token-id prompts): each continuation's log-likelihood equals the in-process
    model's within 1e-4 a token."""
    import torch
    from mlperf.checkpoint import load_model
    from mlperf.chunk import Chunk
    lm_eval = client("lm_eval")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"context": c, "continuation": t}) + "\n"
                                                 for c, t in PAIRS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "loglikelihood.yaml").write_text(TASK.format(data=tmp_path / "data.jsonl"))
    with our_server(tiny_pair, "--max-batch", "4") as (url, _):
        done = subprocess.run(
            [str(lm_eval), "--model", "local-completions", "--model_args",
             f"model=spec,base_url={url}/v1/completions,tokenizer={tiny_pair / 'target'},tokenizer_backend=huggingface,"
             "num_concurrent=1,max_retries=1", "--tasks", "mlperf_loglikelihood", "--include_path",
             str(tmp_path / "tasks"), "--output_path", str(tmp_path / "out"), "--log_samples"],
            capture_output=True, text=True, timeout=600, env={**online(), "HF_DATASETS_OFFLINE": "1"}, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    samples = [json.loads(line) for path in (tmp_path / "out").rglob("samples_mlperf_loglikelihood_*.jsonl")
               for line in path.read_text().splitlines()]
    assert len(samples) == len(PAIRS)
    model = load_model(tiny_pair / "target")
    for sample in samples:
        context, continuation = sample["doc"]["context"], sample["doc"]["continuation"]
        ids, tail = list(context.encode()), list(continuation.encode())
        with torch.inference_mode():
            lp = torch.log_softmax(model(torch.tensor([ids + tail]), Chunk()).logits[0].float(), -1)
        want = sum(float(lp[len(ids) + i - 1, t]) for i, t in enumerate(tail))
        got = sample["resps"][0][0][0]
        assert abs(float(got) - want) < 1e-4 * len(tail), (got, want)
