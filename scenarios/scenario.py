"""LoadGen's three scenarios as one type: what each issues, and every rule that follows from it, asked here by
name (`cfg.scenario.paced`: a RunConfig holds a Scenario) instead of by comparing scenario names across the
harness."""
from enum import Enum

import mlperf_loadgen as lg


class Scenario(str, Enum):
    SingleStream = "SingleStream"  # one query at a time, the next when it is answered
    Offline = "Offline"  # every query at once
    Server = "Server"  # queries at a load (Poisson), judged against latency limits

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def loadgen(self) -> lg.TestScenario:
        return getattr(lg.TestScenario, self.value)

    @property
    def one_at_a_time(self) -> bool:
        """LoadGen waits for each answer before the next query: one row decodes, LoadGen's latency is the sample's."""
        return self is Scenario.SingleStream

    @property
    def all_at_once(self) -> bool:
        """Every query is issued at the start: LoadGen times throughput alone, no first tokens, no latency limit."""
        return self is Scenario.Offline

    @property
    def paced(self) -> bool:
        """Queries arrive at an offered load and are judged against TTFT and TPOT limits fixed per model."""
        return self is Scenario.Server

    @property
    def takes_load(self) -> bool:
        """An offered load (--qps, target_qps) means something: the queries do not wait for each other's answers."""
        return not self.one_at_a_time

    @property
    def first_tokens(self) -> bool:
        """LoadGen is told each query's first token as it comes (TTFT), which TEST06 checks against the output."""
        return not self.all_at_once

    def calibrated(self, samples_per_s: float) -> str:
        """The user.conf line a calibration at `samples_per_s` sizes: how many queries LoadGen prepares, never a
        limit or a load (Server's load is fixed per model: none)."""
        if self.one_at_a_time:  # on the low side, half the best timed: LoadGen must not run out of queries
            return f"*.SingleStream.target_latency = {max(1, round(500 / samples_per_s))}"
        if self.all_at_once:  # on the high side: one query must outlast min_duration
            return f"*.Offline.target_qps = {2 * samples_per_s:.4f}"
        return ""

    def rows(self, max_batch: int) -> int:
        """How many queries decode together: `max_batch`, but one in SingleStream."""
        return 1 if self.one_at_a_time else max_batch

    @property
    def tokens_key(self) -> str:
        """The key LoadGen logs its token throughput under: Offline has its own, SingleStream and Server another."""
        return "result_tokens_per_second" if self.all_at_once else "result_completed_tokens_per_second"

    @property
    def headline_key(self) -> str:
        """The result MLCommons' checker reads for an LLM: a query's p90 latency in SingleStream (not early
        stopping's, which with token latencies on is the first token's), else the token throughput."""
        return "result_90.00_percentile_latency_ns" if self.one_at_a_time else self.tokens_key

    @property
    def headline_unit(self) -> str | None:
        """The unit MLCommons' checker gives the headline where it is not its default (a latency)."""
        return None if self.one_at_a_time else "Tokens/s"

    @property
    def min_queries(self) -> int:
        """The fewest queries MLPerf's LLM benchmarks accept in a full run."""
        return 1 if self.all_at_once else 1024
