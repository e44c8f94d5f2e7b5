"""Read a run directory: LoadGen's detail log and our RunRecord, as the short table a run prints."""
from scenarios.logs import read_detail, tokens_per_second
from scenarios.records import RunRecord


def headline(run_dir) -> dict:
    """The short table a run prints: throughput, token latencies, acceptance, validity."""
    d, r = read_detail(run_dir), RunRecord.load(run_dir)
    scenario = r.config.scenario
    ns = lambda key: d.get(key) / 1e6 if isinstance(d.get(key), (int, float)) else None
    return {
        "sut": r.sut.name, "scenario": scenario, "mode": r.config.mode,
        "dtype": r.sut.dtype, "device": r.sut.device,
        "tokens/s": tokens_per_second(d, scenario),
        "TTFT p90 (ms)": ns("result_first_token_90.00_percentile_latency_ns"),
        "TTFT p99 (ms)": ns("result_first_token_99.00_percentile_latency_ns"),
        "TPOT p90 (ms)": ns("result_time_per_output_token_90.00_percentile_ns"),
        "TPOT p99 (ms)": ns("result_time_per_output_token_99.00_percentile_ns"),
        "acceptance": r.acceptance_rate,
        "validity": d.get("result_validity", "n/a (accuracy mode)"),
    }
