"""The smoke gate: baseline, spec and spec-int8 through LoadGen SingleStream on the same prompts, in one process.

Fails unless the speculative SUTs emit exactly the baseline's tokens and spec's LoadGen-measured tokens/s is
at least `gate` times the baseline's. Settings are set directly rather than read from a user.conf, since
LoadGen reads its conf files once per process; each SUT sees every prompt once, in the same order.
"""
import json
import time
from pathlib import Path

import mlperf_loadgen as lg

from mlperf.checkpoint import read_config
from mlperf.data import load_prompts
from mlperf.tokenizer import load_tokenizer
from roofline.analysis import write_sidecar
from scenarios.logs import read_detail, tokens_per_second
from scenarios.qsl import QSL
from scenarios.records import RunConfig, RunRecord
from scenarios.run import loadgen_test, set_threads
from suts.registry import build_sut

SUTS = ("baseline", "spec", "spec-int8")


def settings(n: int, expected_latency_s: float) -> lg.TestSettings:
    s = lg.TestSettings()
    s.scenario, s.mode = lg.TestScenario.SingleStream, lg.TestMode.PerformanceOnly
    s.use_token_latencies = True
    s.min_duration_ms, s.min_query_count, s.max_query_count = 0, n, n
    s.performance_issue_unique = True  # every prompt exactly once
    s.performance_sample_count_override = n
    s.single_stream_expected_latency_ns = int(expected_latency_s * 1e9)
    return s


def run_smoke(target: str, draft: str, n_prompts: int = 24, max_new_tokens: int = 96, gamma: int = 4,
              results: str = "results") -> dict:
    """Run the three SUTs; returns per-SUT figures and the output comparison (the caller applies the gate)."""
    set_threads(None)
    tokenizer = load_tokenizer(target)
    prompts = load_prompts()[:n_prompts]
    qsl = QSL(prompts, tokenizer, read_config(target)[0].block_size, max_new_tokens)
    out = Path(results) / "smoke" / time.strftime("%Y%m%d-%H%M%S")
    figures, outputs = {}, {}
    try:
        for name in SUTS:
            cfg = RunConfig(sut=name, target=target, draft=draft, gamma=gamma, max_new_tokens=max_new_tokens,
                            samples=n_prompts, results=results)
            sut = build_sut(name, target, draft, gamma=gamma, eos_id=tokenizer.eos_id)
            warm = sut.generate(qsl.tokens[0], max_new_tokens)  # warm-up, and LoadGen's expected latency
            (out / name).mkdir(parents=True)
            adapter, _ = loadgen_test(sut, qsl, settings(n_prompts, warm.stats.total_s), out / name, cfg,
                                      echo_summary=False)
            if adapter.error:
                raise RuntimeError(adapter.error)
            outputs[name] = adapter.outputs
            detail = read_detail(out / name)
            roofline = write_sidecar(out / name, (RunRecord.load(out / "baseline"), out / "baseline"))
            figures[name] = {"tokens_per_s": tokens_per_second(detail, "SingleStream"),
                             "errors": detail.get("num_errors", 0), "roofline": roofline}
    finally:
        qsl.destroy()
    mismatches = {name: sorted(i for i in outputs["baseline"] if outputs[name].get(i) != outputs["baseline"][i])
                  for name in SUTS[1:]}
    summary = {"dir": str(out), "prompts": n_prompts, "max_new_tokens": max_new_tokens, "gamma": gamma,
               "figures": figures, "mismatches": mismatches}
    (out / "smoke.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary
