"""Read a run directory: LoadGen's detail log and our metrics.json."""
import json
from pathlib import Path

from scenarios.logs import read_detail, tokens_per_second


def read_metrics(run_dir) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def headline(run_dir) -> dict:
    """The short table a run prints: throughput, token latencies, acceptance, validity."""
    d, m = read_detail(run_dir), read_metrics(run_dir)
    scenario = m["config"]["scenario"]
    ns = lambda key: d.get(key) / 1e6 if isinstance(d.get(key), (int, float)) else None
    return {
        "sut": m["sut"]["name"], "scenario": scenario, "mode": m["config"]["mode"],
        "dtype": m["sut"]["dtype"], "device": m["sut"]["device"],
        "tokens/s": tokens_per_second(d, scenario),
        "TTFT p90 (ms)": ns("result_first_token_90.00_percentile_latency_ns"),
        "TTFT p99 (ms)": ns("result_first_token_99.00_percentile_latency_ns"),
        "TPOT p90 (ms)": ns("result_time_per_output_token_90.00_percentile_ns"),
        "TPOT p99 (ms)": ns("result_time_per_output_token_99.00_percentile_ns"),
        "acceptance": m["totals"]["acceptance_rate"],
        "validity": d.get("result_validity", "n/a (accuracy mode)"),
    }
