"""LoadGen's three scenarios as one type: what each issues, and every rule that follows from it, asked here by
name (`Scenario(cfg.scenario).paced`) instead of by comparing scenario names across the harness."""
from enum import Enum

import mlperf_loadgen as lg


class Scenario(str, Enum):
    SingleStream = "SingleStream"  # one query at a time, the next when it is answered
    Offline = "Offline"  # every query at once
    Server = "Server"  # queries at a load (Poisson), judged against latency limits

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

    def rows(self, max_batch: int) -> int:
        """How many queries decode together: `max_batch`, but one in SingleStream."""
        return 1 if self.one_at_a_time else max_batch
