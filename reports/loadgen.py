"""Read a run directory: LoadGen's detail log and our RunRecord, as the short table a run prints."""
from dataclasses import asdict, dataclass

from scenarios.logs import read_detail, tokens_per_second
from scenarios.records import RunRecord, weights_in_brief
from scenarios.scenario import Scenario


LATENCIES = {"TTFT": "result_first_token_{}_percentile_latency_ns",
             "TPOT": "result_time_per_output_token_{}_percentile_ns"}


def latency_ms(detail: dict, what: str, percentile: str) -> float | None:
    """LoadGen's TTFT or TPOT (`what`) at `percentile` ("90.00") in ms; None where it logged none."""
    value = detail.get(LATENCIES[what].format(percentile))
    return value / 1e6 if isinstance(value, (int, float)) else None


@dataclass
class Headline:
    """The short table a run prints: throughput, token latencies, acceptance, validity; a Server run's also the
    percentile it is judged at, its SLO attainment and its goodput (tokens/s of the queries that met both limits)."""
    sut: str
    scenario: Scenario
    mode: str
    dtype: str
    weights: str  # what its models' linear weights streamed as: fp16, or fp16/int8 (the target's, then the draft's)
    device: str
    tokens_per_s: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    tpot_p90_ms: float | None
    tpot_p99_ms: float | None
    acceptance: float | None
    validity: str
    judged_at: str | None = None  # Server: the latency percentile LoadGen judges, e.g. "p99"
    slo_attainment: float | None = None
    goodput_tokens_per_s: float | None = None

    def labelled(self) -> dict:
        """The fields under the labels a run prints them with ("TTFT p90 (ms)", ...); the Server-only ones only for
        Server."""
        return {LABELS.get(name, name): value for name, value in asdict(self).items()
                if self.scenario.paced or name not in SERVER_ONLY}


SERVER_ONLY = ("judged_at", "slo_attainment", "goodput_tokens_per_s")
LABELS = {"tokens_per_s": "tokens/s", "judged_at": "judged at", "slo_attainment": "SLO attainment",
          "goodput_tokens_per_s": "goodput tokens/s",
          **{f"{what.lower()}_p{p}_ms": f"{what} p{p} (ms)" for what in LATENCIES for p in ("90", "99")}}


def headline(run_dir) -> Headline:
    d, r = read_detail(run_dir), RunRecord.load(run_dir)
    scenario, slo = r.config.scenario, r.slo()
    tokens_per_s = tokens_per_second(d, scenario)
    percentile = r.settings.get("target_latency_percentile") if scenario.paced else None
    return Headline(r.sut.name, scenario, r.config.mode, r.sut.dtype, weights_in_brief(r.sut.weights), r.sut.device,
                    tokens_per_s,
                    *(latency_ms(d, what, p) for what in LATENCIES for p in ("90.00", "99.00")), r.acceptance_rate,
                    d.get("result_validity", "n/a (accuracy mode)"), percentile and f"p{float(percentile):g}",
                    slo and slo[0], slo and tokens_per_s and tokens_per_s * slo[1])
