"""Read a run directory: LoadGen's detail log and our RunRecord, as the short table a run prints."""
from scenarios.logs import read_detail, tokens_per_second
from scenarios.records import RunRecord


LATENCIES = {"TTFT": "result_first_token_{}_percentile_latency_ns",
             "TPOT": "result_time_per_output_token_{}_percentile_ns"}


def latency_ms(detail: dict, what: str, percentile: str) -> float | None:
    """LoadGen's TTFT or TPOT (`what`) at `percentile` ("90.00") in ms; None where it logged none."""
    value = detail.get(LATENCIES[what].format(percentile))
    return value / 1e6 if isinstance(value, (int, float)) else None


def headline(run_dir) -> dict:
    """The short table a run prints: throughput, token latencies, acceptance, validity."""
    d, r = read_detail(run_dir), RunRecord.load(run_dir)
    scenario = r.config.scenario
    return {
        "sut": r.sut.name, "scenario": scenario, "mode": r.config.mode,
        "dtype": r.sut.dtype, "device": r.sut.device,
        "tokens/s": tokens_per_second(d, scenario),
        **{f"{what} p{p[:2]} (ms)": latency_ms(d, what, p) for what in LATENCIES for p in ("90.00", "99.00")},
        "acceptance": r.acceptance_rate,
        "validity": d.get("result_validity", "n/a (accuracy mode)"),
    }
