"""`--endpoint URL`: LoadGen in front of an OpenAI-compatible server, here ours (`python -m mlperf serve` of the
tiny pair on a free loopback port, started and stopped by the tests): VALID in every scenario, accuracy outputs
identical to the SUT in process, the server's counters equal to the record's; a server down, gone or unknown is
one line and nothing published."""
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reports.loadgen import headline
from serving.endpoint import base_url
from serving.wire import chunk_tokens, prometheus_sums
from scenarios.records import RunRecord
from tests.helpers import cli_env, filed, prometheus, python_m, refused, run_args, run_cli, our_server

SLOW = "tests.commands.slow_sut:Slow"  # 5 ms a step: a run outlasts the kill


@pytest.fixture(scope="module")
def server(tiny_pair):
    with our_server(tiny_pair, "--max-batch", "4") as (url, proc):
        yield url


def outputs(run_dir) -> dict[int, str]:
    return {e["qsl_idx"]: e["data"] for e in json.loads((run_dir / "mlperf_log_accuracy.json").read_text())}


@pytest.mark.parametrize("scenario", ["SingleStream", "Offline", "Server"])
def test_our_server_under_loadgen_is_valid_and_its_counters_are_the_records(server, tiny_pair, tmp_path, scenario):
    proc = run_cli(tiny_pair, tmp_path, "--endpoint", server + "/v1", "--sut", "ours", "--scenario", scenario,
                   "--max-batch", "4", *(["--qps", "20"] if scenario == "Server" else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = filed(tmp_path, "ours", scenario, "performance", "latest")
    assert headline(run).validity == "VALID"
    record = RunRecord.load(run)
    assert record.sut.name == "spec" and record.endpoint["engine"] == "ours" and record.endpoint["url"] == server
    counters = record.endpoint["spec_counters"]  # /metrics after the test minus before it: LoadGen's queries alone
    assert counters["vllm:spec_decode_num_accepted_tokens"] == sum(s.accepted for s in record.stats) > 0
    assert counters["vllm:spec_decode_num_draft_tokens"] == sum(s.drafted for s in record.stats)
    assert (run / "roofline.json").is_file()
    overhead = record.endpoint["http_overhead_ms"]  # a client's duration holds the server's: always above 0
    assert overhead["requests"] == len(record.stats) and 0 < overhead["first token p50"] <= overhead["first token p99"]
    assert 0 < overhead["last token p50"] and "HTTP's share of each request" in proc.stdout


def test_accuracy_mode_through_the_server_is_token_identical_to_the_sut_in_process(server, tiny_pair, tmp_path):
    found = {}
    for name, args in (("spec", ()), ("ours", ("--endpoint", server))):
        proc = run_cli(tiny_pair, tmp_path, "--sut", name, *args, "--scenario", "Offline", "--mode", "accuracy",
                       "--max-batch", "4", tokens=24)
        assert proc.returncode == 0 and "ACCURACY PASS" in proc.stdout, proc.stderr[-2000:]
        found[name] = outputs(filed(tmp_path, name, "Offline", "accuracy", "latest"))
    assert len(found["ours"]) == 16 and found["ours"] == found["spec"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_smoke_gate_judges_a_server_against_the_baseline_in_process(server, tiny_pair, tmp_path):
    from commands.smoke import run_smoke
    from scenarios.config import RunConfig
    s = run_smoke(str(tiny_pair / "target"), str(tiny_pair / "draft"), 4, 8, results=str(tmp_path), suts=("ours",),
                  server=RunConfig(sut="ours", endpoint=server))
    assert list(s.figures) == ["baseline", "ours"] and s.mismatches == {"ours": []}
    assert s.figures["ours"].errors == 0 and s.figures["ours"].roofline.speculative.acceptance_rate > 0
    assert RunRecord.load(tmp_path / "smoke" / Path(s.dir).name / "ours").endpoint["url"] == server
    proc = python_m("mlperf", "smoke", "--endpoint", server, "--sut", "a", "--sut", "b", "--results", tmp_path,
                    timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: smoke with --endpoint or --engine gates the one server against the baseline in process: no "
        "--replicas, at most one --sut (its name)")


def test_a_server_down_or_a_model_it_does_not_serve_is_one_line_before_loadgen(server, tiny_pair, tmp_path):
    port = free_port()
    proc = run_cli(tiny_pair, tmp_path, "--endpoint", f"http://127.0.0.1:{port}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: cannot use the server at http://127.0.0.1:{port}: GET /v1/models: Cannot connect")
    proc = run_cli(tiny_pair, tmp_path, "--endpoint", server, "--model", "gpt-4")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == \
        f"error: the server at {server} serves spec, not 'gpt-4'"
    assert not list(tmp_path.rglob("*.partial")) and not list(tmp_path.rglob("latest"))


def test_a_server_killed_mid_run_fails_it_in_one_line_and_publishes_nothing(tiny_pair, tmp_path):
    with our_server(tiny_pair, sut=SLOW) as (url, server):
        cmd = [sys.executable, "-m", "mlperf", "run", "--endpoint", url, "--target", str(tiny_pair / "target"),
               "--samples", "8", "--max-new-tokens", "8", "--results", str(tmp_path)]  # the quick profile: 20 s
        run = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while prometheus(url).get('vllm:request_success_total{finished_reason="length"}', 0) < 10:
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        server.kill()
        server.wait()
        _, err = run.communicate(timeout=300)
    assert run.returncode == 2 and "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: the server at {url} failed a query: ") and "(logs kept in" in last, last
    assert not list(tmp_path.rglob("latest")) and len(list(tmp_path.rglob("*.failed"))) == 1


def test_what_a_client_reads_of_other_servers():
    assert base_url("http://h:1/v1/completions") == base_url("http://h:1/v1/") == base_url("http://h:1") == "http://h:1"
    assert chunk_tokens({"choices": [{"text": "a", "token_ids": [5]}]}) == [5]  # ours, vLLM's return_token_ids
    assert chunk_tokens({"choices": [{"text": "a"}], "tokens": [7, 8]}) == [7, 8]  # llama.cpp's return_tokens
    assert chunk_tokens({"choices": [], "usage": {"completion_tokens": 3}}) == []
    text = ('# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total 4.0\n'
            'vllm:spec_decode_num_drafts_created 1.7e9\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 5.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="1"} 2.0\n')
    assert prometheus_sums(text, ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")) == {
        "vllm:spec_decode_num_drafts": 4.0, "vllm:spec_decode_num_accepted_tokens": 7.0}


@pytest.mark.parametrize("args, message", [
    (("--endpoint", "ftp://127.0.0.1:1"), "endpoint must be a server's http(s)://host:port"),
    (("--endpoint", "http://127.0.0.1:1", "--sut", "a/b"), "with --endpoint, --sut only names the results"),
    (("--endpoint", "http://127.0.0.1:1", "--replicas", "2"), "--endpoint and --replicas both say where"),
    (("--engine", "vllm"), "unknown engine 'vllm'; choose llama-server"),
    (("--engine", "llama-server", "--sut", "ngram"), "llama-server runs SUT baseline or spec, not 'ngram'"),
])
def test_bad_endpoint_or_engine_settings_are_one_line(tiny_pair, tmp_path, capsys, args, message):
    code, err = refused(run_args(tiny_pair, tmp_path, *args), capsys)
    assert code == 2 and "Traceback" not in err, err[-500:]
    assert err.strip().splitlines()[-1].startswith("error: " + message)
    assert not tmp_path.exists() or not any(tmp_path.rglob("*.partial"))
