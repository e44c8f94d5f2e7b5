"""LoadGen's scenarios, one class each: what each issues, and every rule that follows from it, asked of the scenario
(`cfg.scenario.paced`: a RunConfig holds one) instead of found by comparing scenario names across the harness.

A scenario reads as its name (a str: records, paths and tables print it). Adding one is one subclass: it registers
under its class name, runs as its LoadGen scenario, and its LoadGen settings go under that scenario's name."""
from typing import ClassVar

import mlperf_loadgen as lg

# the Server scenario's tokens per batch iteration where a run gives none (a prefill chunks to fit), chosen by
# measurement: docs/batching.md, "Chunked prefill"
SERVER_TOKEN_BUDGET = 128


class Scenario(str):
    """One scenario, its name as its value: a subclass sets or overrides what differs from these defaults."""
    known: ClassVar[dict[str, "Scenario"]] = {}  # every scenario by name, in the order defined
    loadgen: ClassVar[lg.TestScenario]  # what LoadGen runs it as
    one_at_a_time: ClassVar[bool] = False  # LoadGen waits for each answer before the next query
    paced: ClassVar[bool] = False  # queries arrive at an offered load, judged against TTFT and TPOT limits
    first_tokens: ClassVar[bool] = True  # LoadGen is told each query's first token (TTFT), which TEST06 checks
    token_budget: ClassVar[int | None] = None  # tokens per batch iteration where the run gives none
    min_queries: ClassVar[int] = 1024  # the fewest queries MLPerf's LLM benchmarks accept in a full run
    categories: ClassVar[tuple[str, ...]] = ()  # the MLPerf system categories that must submit it

    def __new__(cls) -> "Scenario":
        """The scenario itself: one instance a class, made as the class is defined."""
        return Scenario.known.get(cls.__name__) or super().__new__(cls, cls.__name__)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Scenario.known[cls.__name__] = cls()

    @classmethod
    def named(cls, name: str) -> "Scenario":
        """The scenario of this name, or a one-line error naming those there are."""
        if name not in cls.known:
            raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(cls.known)}")
        return cls.known[name]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __reduce__(self):
        """Pickled and copied as its class: a copy is the scenario itself."""
        return type(self), ()

    @property
    def settings_name(self) -> str:
        """The scenario its user.conf lines name (`model.SCENARIO.key`): LoadGen's, whose settings it runs by."""
        return self.loadgen.name

    @property
    def takes_load(self) -> bool:
        """An offered load (--qps, target_qps) means something: the queries do not wait for each other's answers."""
        return not self.one_at_a_time

    def calibrated(self, samples_per_s: float) -> str:
        """The user.conf line a calibration at `samples_per_s` sizes: how many queries LoadGen prepares, never a
        limit or a load. On the high side: one query must outlast min_duration."""
        return f"*.{self.settings_name}.target_qps = {2 * samples_per_s:.4f}"

    def rows(self, max_batch: int) -> int:
        """How many queries decode together."""
        return max_batch

    @property
    def tokens_key(self) -> str:
        """The key LoadGen logs its token throughput under."""
        return "result_completed_tokens_per_second"

    @property
    def headline_key(self) -> str:
        """The result MLCommons' checker reads for an LLM: the token throughput, unless a scenario says otherwise."""
        return self.tokens_key

    @property
    def headline_unit(self) -> str | None:
        """The unit MLCommons' checker gives the headline where it is not its default (a latency)."""
        return "Tokens/s"


class SingleStream(Scenario):
    """One query at a time, the next when it is answered: one row decodes, LoadGen's latency is the sample's."""
    loadgen = lg.TestScenario.SingleStream
    one_at_a_time = True
    categories = ("edge",)

    def calibrated(self, samples_per_s: float) -> str:
        """On the low side, half the best timed: LoadGen must not run out of queries."""
        return f"*.{self.settings_name}.target_latency = {max(1, round(500 / samples_per_s))}"

    def rows(self, max_batch: int) -> int:
        return 1

    @property
    def headline_key(self) -> str:
        """A query's p90 latency (not early stopping's, which with token latencies on is the first token's)."""
        return "result_90.00_percentile_latency_ns"

    @property
    def headline_unit(self) -> str | None:
        return None


class Offline(Scenario):
    """Every query at once: LoadGen times throughput alone, no first tokens, no latency limit."""
    loadgen = lg.TestScenario.Offline
    first_tokens = False
    min_queries = 1
    categories = ("edge", "datacenter")

    @property
    def tokens_key(self) -> str:
        return "result_tokens_per_second"


class Server(Scenario):
    """Queries at an offered load (Poisson), judged against TTFT and TPOT limits fixed per model."""
    loadgen = lg.TestScenario.Server
    paced = True
    categories = ("datacenter",)
    token_budget = SERVER_TOKEN_BUDGET

    def calibrated(self, samples_per_s: float) -> str:
        """None: Server's load is fixed per model."""
        return ""


CATEGORIES = (("edge",), ("datacenter",), ("datacenter", "edge"))  # MLPerf's system types, as categories


def required_scenarios(categories: tuple[str, ...]) -> list[Scenario]:
    """The scenarios a system of these MLPerf categories must submit."""
    return [s for s in Scenario.known.values() if set(s.categories) & set(categories)]


def system_type(scenarios) -> str | None:
    """The MLPerf system type ("edge", "datacenter", "datacenter,edge") that requires exactly these scenarios."""
    return next((",".join(kinds) for kinds in CATEGORIES if set(required_scenarios(kinds)) == set(scenarios)), None)
