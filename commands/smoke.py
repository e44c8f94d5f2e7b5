"""The smoke gate: the baseline and the SUTs under test (by default spec and spec-int8; any registered name or
`package.module:Class` plug-in) through LoadGen SingleStream on the same prompts, in one process.

Fails unless every SUT under test emits exactly the baseline's tokens and the first one decodes at least `gate`
times the baseline's tokens/s after the first token (LoadGen's mean time per output token: the seed's tokens/s,
which times the decode phase alone, the prompt's prefill being the same work in both) without running slower
than the baseline end to end (than `gate` times it, for a gate below 1). With `--endpoint URL` (or `--engine
llama-server`, started here) the SUT under test is that server, over HTTP, against the baseline in this process.
Settings are set directly rather than read from a user.conf, since LoadGen reads its conf files once per process;
each SUT sees every prompt once, in the same order.
"""
import json
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import mlperf_loadgen as lg

from commands.peers import engine
from commands.exits import GateFailed
from commands.options import measurable
from commands.runs import ROOFLINE_HEADER, roofline_lines
from mlperf import env
from mlperf.checkpoint import read_config
from mlperf.data import Prompt, load_prompts
from mlperf.env import set_threads
from mlperf.files import write_json
from mlperf.rules import positive_int
from mlperf.tokenizer import load_tokenizer
from roofline.analysis import Roofline, write_sidecar
from roofline.peaks import PLAUSIBLE
from scenarios.logs import read_detail, token_latencies_s, tokens_per_second
from scenarios.qsl import QSL
from scenarios.config import RunConfig
from scenarios.records import RunRecord, weights_in_brief
from scenarios.hosted import Host
from scenarios.run import RunError, claim, loadgen_test
from serving.hosts import open_sut
from serving.replicas import cluster
from suts.base import GREEDY
from suts.drafting import GAMMA
from suts.fast.native import kernels_build
from scenarios.scenario import SingleStream


class SUTFailed(RuntimeError):
    """A SUT under test crashed or stalled: the gate fails."""


@dataclass
class Figures:
    """One SUT's figures in a smoke run."""
    tokens_per_s: float  # LoadGen's, end to end: the first token (the prompt's prefill) included
    errors: int
    roofline: Roofline
    target_forwards_per_token: float  # counted by a hook on the target during LoadGen's run
    weights: dict | None = None  # what each of its models' weights streamed as (its run record's): "target" -> fp16
    ttft_s: float = float("nan")  # LoadGen's mean time to the first token
    tpot_s: float = float("nan")  # LoadGen's mean time per output token after the first: the decode the gate times

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens a second after the first: what the gate compares, the seed's tokens/s (its decode phase alone)."""
        return 1 / self.tpot_s


@dataclass
class Smoke:
    """What a smoke run measured (smoke.json); the caller applies the gate."""
    dir: str
    prompts: int
    max_new_tokens: int
    gamma: int
    figures: dict[str, Figures]  # the baseline first, then each SUT under test
    mismatches: dict[str, list[int]]  # per SUT under test, the prompts whose output is not the baseline's
    rounds: int = 1  # the SUTs took turns this many times, each round on every prompt
    # per SUT under test, its "decode" and "end_to_end" ratio to the baseline in each round: the spread the gate's
    # ratios came with
    by_round: dict[str, dict[str, list[float]]] = field(default_factory=dict)


GATE = 1.4  # the smoke gate: spec's tokens/s over the baseline's at least this, in one process (`make test`)
SUTS = ("spec", "spec-int8")  # compared against the baseline by default; the first is gated
ROUNDS, PROMPTS, TOKENS = 4, 6, 96  # the gate's load: SUTs take turns 4 rounds, each of 6 prompts x 96 new tokens


def settings(n: int, expected_latency_s: float) -> lg.TestSettings:
    s = lg.TestSettings()
    s.scenario, s.mode = lg.TestScenario.SingleStream, lg.TestMode.PerformanceOnly
    s.use_token_latencies = True
    s.min_duration_ms, s.min_query_count, s.max_query_count = 0, n, n
    s.performance_issue_unique = True  # every prompt exactly once
    s.performance_sample_count_override = n
    s.single_stream_expected_latency_ns = int(expected_latency_s * 1e9)
    return s


class CountedStep:
    """A runner's fast step (suts/fast/step.py's contract) that adds one to `forwards` for each forward it runs,
    which no forward hook sees: a chunk it plans, each of a greedy chain's n steps, a verify pass's argmaxes."""

    def __init__(self, step, forwards: list):
        self.step, self.forwards = step, forwards
        self.kind, self.half, self.threads = step.kind, step.half, step.threads  # what the run record says of it

    def plan(self, op, ids, chunk, *inputs):
        return self.step.plan(op, ids, chunk, *inputs)

    def forward(self, plan):
        self.forwards.append(1)
        return self.step.forward(plan)

    def greedy(self, plan, n: int):
        self.forwards.extend([1] * n)
        return self.step.greedy(plan, n)

    def argmaxes(self, plan):
        self.forwards.append(1)
        return self.step.argmaxes(plan)


@contextmanager
def counting_forwards(runner, forwards: list):
    """While inside, add to `forwards` one entry per forward of the runner's model (or of a plug-in's plain model):
    through its modules (a forward hook) or its fast step (CountedStep)."""
    step = getattr(runner, "fast_step", None)
    hook = getattr(runner, "model", runner).register_forward_hook(lambda *_: forwards.append(1))
    if step is not None:
        runner.fast_step = CountedStep(step, forwards)
    try:
        yield
    finally:
        hook.remove()
        if step is not None:
            runner.fast_step = step


def smoke_test(sut, name: str, qsl: QSL, n_prompts: int, max_new_tokens: int, out: Path, cfg: RunConfig):
    """One SUT's LoadGen SingleStream test in the smoke run; its adapter and the target forwards counted during
    it (None on replicas and servers, whose models are in other processes)."""
    try:
        warm = sut.generate(qsl.tokens[0], max_new_tokens, GREEDY)  # warm-up; LoadGen's expected latency
    except Exception as e:
        raise SUTFailed(f"SUT {name} raised {type(e).__name__}: {e}") from None
    run_dir = out / name.replace(":", ".")
    run_dir.mkdir(parents=True)
    test = lambda: loadgen_test(sut, qsl, settings(n_prompts, warm.stats.total_s), run_dir, cfg,  # noqa: E731
                                echo_summary=False)[0]
    if isinstance(sut, Host):  # its models run in other processes
        return test(), None
    forwards = []
    with counting_forwards(sut.target, forwards):
        return test(), forwards


def run_smoke(target: str, draft: str, n_prompts: int = 24, max_new_tokens: int = 96, gamma: int = GAMMA,
              results: str = "results", suts=SUTS, prompts: list[Prompt] | None = None,
              stall_timeout_s: float = RunConfig.stall_timeout_s, replicas: int | None = None,
              ray_address: str | None = None, rounds: int = 1, server: RunConfig | None = None,
              weights: str = RunConfig.weights) -> Smoke:
    """Run the baseline, then `suts`; returns per-SUT figures and the output comparison (the caller applies
    the gate). The prompts are the first `n_prompts` held-out ones unless `prompts` are given. Each SUT's target
    forwards during LoadGen's run are counted from outside it (a forward hook), whatever it records itself; on
    Ray `replicas` (one Ray connection for every SUT) they are not counted. With `rounds` > 1 the SUTs take turns
    round by round (every prompt once a round, round r's tests in round<r>/), so a load that comes and goes on the
    machine falls on every SUT alike: a SUT's tokens/s is its tokens over its LoadGen time in all rounds, and an
    output that differs from the baseline's in any round is a mismatch. `server` is a server under test (its
    endpoint set, named by its sut, one of `suts`), measured over HTTP like any SUT here. `weights` is every SUT's
    (default fp16, the checkpoint's as stored)."""
    names = ("baseline", *(name for name in suts if name != "baseline"))
    shared = dict(target=target, draft=draft, gamma=gamma, max_new_tokens=max_new_tokens, samples=n_prompts,
                  results=results, stall_timeout_s=stall_timeout_s, weights=weights)  # every SUT's, a server's too
    configs = {name: RunConfig(sut=name, replicas=replicas, ray_address=ray_address, **shared) for name in names}
    if server:  # llama-server's GGUF at the baseline's precision
        configs[server.sut] = replace(server, **shared)
    for cfg in configs.values():
        cfg.validate()  # an unknown SUT or a bad option is a one-line error before anything runs
    set_threads(None)
    tokenizer = load_tokenizer(target)
    config = read_config(target)[0]
    prompts = prompts or load_prompts()[:n_prompts]
    n_prompts = len(prompts)
    qsl = QSL(prompts, tokenizer, config.block_size, max_new_tokens)
    final, out = claim(Path(results) / "smoke")  # written under .partial, renamed only when every SUT has run
    runs = {name: [] for name in names}  # per SUT, a Round each
    try:
        with cluster(ray_address) if replicas else nullcontext():
            for r in range(rounds):
                where = out / f"round{r + 1}" if rounds > 1 else out
                for name, cfg in configs.items():
                    with open_sut(cfg, tokenizer.eos_id, config) as sut:
                        adapter, forwards = smoke_test(sut, name, qsl, n_prompts, max_new_tokens, where, cfg)
                    if adapter.error:
                        raise SUTFailed(f"{name}: {adapter.error}")
                    run_dir = where / name.replace(":", ".")
                    detail = read_detail(run_dir)
                    roofline = write_sidecar(run_dir, (RunRecord.load(where / "baseline"),
                                                       final / run_dir.parent.relative_to(out) / "baseline"))
                    runs[name].append(Round(adapter.outputs, tokens_per_second(detail, SingleStream()),
                                            detail.get("num_errors", 0), roofline,
                                            RunRecord.load(run_dir).sut.weights, forwards,
                                            token_latencies_s(detail) or (float("nan"),) * 2))
    except BaseException as e:  # a failed or interrupted smoke is kept apart, never taken for a finished one
        out.rename(final.with_name(final.name + (".interrupted" if isinstance(e, KeyboardInterrupt) else ".failed")))
        raise
    finally:
        qsl.destroy()
    smoke = Smoke(str(final), n_prompts, max_new_tokens, gamma, rounds=rounds, **summarised(runs))
    write_json(out / "smoke.json", asdict(smoke))
    out.rename(final)
    return smoke


def summarised(runs: dict[str, list["Round"]]) -> dict:
    """Smoke's fields from each SUT's rounds (the baseline's first): each SUT's combined `figures`, the prompts
    whose output differs from the baseline's first round in any round (`mismatches`), and its ratios to the
    baseline round by round (`by_round`)."""
    reference = runs["baseline"][0].outputs
    under = [name for name in runs if name != "baseline"]
    return {"figures": {name: combined(each) for name, each in runs.items()},
            "mismatches": {name: sorted(i for i in reference if any(r.outputs.get(i) != reference[i]
                                                                    for r in runs[name])) for name in under},
            "by_round": {name: ratios_by_round(runs[name], runs["baseline"]) for name in under}}


@dataclass
class Round:
    """What one SUT's LoadGen test measured in one round."""
    outputs: dict  # sample -> tokens
    tokens_per_s: float
    errors: int
    roofline: Roofline
    weights: dict
    forwards: list | None
    latencies_s: tuple  # LoadGen's mean TTFT and TPOT


def combined(rounds: list[Round]) -> Figures:
    """One SUT's figures over its rounds: its tokens over its LoadGen time in all of them, its mean TTFT and TPOT
    over every sample (each round has the same samples); the last round's roofline and weights."""
    tokens = [sum(len(t) for t in r.outputs.values()) for r in rounds]
    seconds = sum(n / r.tokens_per_s for n, r in zip(tokens, rounds))
    forwards = [r.forwards for r in rounds]
    counted = float("nan") if None in forwards else sum(map(len, forwards)) / max(1, sum(tokens))
    ttft, tpot = (sum(each) / len(rounds) for each in zip(*(r.latencies_s for r in rounds)))
    return Figures(sum(tokens) / seconds, sum(r.errors for r in rounds), rounds[-1].roofline, counted,
                   rounds[-1].weights, ttft, tpot)


def ratios_by_round(rounds: list[Round], baseline: list[Round]) -> dict[str, list[float]]:
    """A SUT's decode ratio (the baseline's mean TPOT over its own) and end-to-end ratio to the baseline, round by
    round: each against the baseline's turn in the same round."""
    return {"decode": [b.latencies_s[1] / r.latencies_s[1] for r, b in zip(rounds, baseline)],
            "end_to_end": [r.tokens_per_s / b.tokens_per_s for r, b in zip(rounds, baseline)]}


def server_under_test(args) -> RunConfig | None:
    """With --endpoint or --engine, the server under test: named by the first --sut (for llama-server, plain
    `baseline` or speculative `spec`, the default), else `http`."""
    if not (args.endpoint or args.engine):
        return None
    if args.replicas or (args.suts and len(args.suts) > 1):
        raise ValueError("smoke with --endpoint or --engine gates the one server against the baseline in process: "
                         "no --replicas, at most one --sut (its name)")
    sut = (args.suts or ["spec" if args.engine else "http"])[0]
    return RunConfig(sut=sut, target=args.target, draft=args.draft, gamma=args.gamma, endpoint=args.endpoint,
                     model=args.model, engine=args.engine)


def main(args):
    """The smoke gate: the baseline and the SUTs under test (default spec, spec-int8) through LoadGen in one
    process; fails unless their outputs are token-identical, the first decodes at GATE x the baseline's tokens/s
    after the first token and is no slower end to end, and no phase runs above 1.05 times its measured roof."""
    if args.synthetic_acceptance_rates is not None or args.synthetic_acceptance_length is not None:
        raise ValueError("the smoke gate judges a drafter's own acceptance: a run at synthetic acceptance measures the "
                         "mechanism and is never gated (use bench or whatif)")
    if not 0 < args.gate < float("inf"):
        raise ValueError(f"gate must be positive, got {args.gate}")
    positive_int("rounds", args.rounds)
    try:
        server = server_under_test(args)
        with engine(server) if server else nullcontext() as server:
            suts = (server.sut,) if server else measurable(args.suts or SUTS, args.target)
            if not suts:
                raise ValueError("no SUT under test is left to gate: the pair lacks what each needs (above)")
            s = run_smoke(args.target, args.draft, args.samples, args.max_new_tokens, args.gamma, args.results,
                          suts, replicas=args.replicas,
                          ray_address=args.ray_address, rounds=args.rounds, server=server, weights=args.weights)
    except SUTFailed as e:  # a crash, not a verdict: no smoke.json, exit 2
        raise RunError(str(e)) from None
    base = s.figures["baseline"]
    gated = next(name for name in s.figures if name != "baseline")
    width = max(10, *(len(name) for name in s.figures))
    print(f"\nsmoke gate: {s.prompts} held-out prompts x {s.max_new_tokens} new tokens x {s.rounds} rounds taking "
          f"turns, greedy, gamma {s.gamma}, LoadGen SingleStream, one process ({s.dir})")
    print(f"machine: {env.machine()}; " + ", ".join(f"{k} {v}" for k, v in env.versions().items()))
    print(f"fast path: {kernels_build()}")
    print(f"{'sut':{width}s} {'decode tok/s':>12s} {'vs base':>8s} {'tokens/s':>9s} {'vs base':>8s} {'TTFT ms':>8s} "
          f"{'accept':>7s} {'fwd/token':>9s} {'weights':>10s}  identical")
    for name, f in s.figures.items():
        accept = f.roofline.speculative.acceptance_rate if f.roofline.speculative else float("nan")
        same = "-" if name == "baseline" else ("yes" if not s.mismatches[name] else
                                               f"NO ({len(s.mismatches[name])} samples differ)")
        print(f"{name:{width}s} {f.decode_tokens_per_s:12.1f} {base.tpot_s / f.tpot_s:7.2f}x {f.tokens_per_s:9.1f} "
              f"{f.tokens_per_s / base.tokens_per_s:7.2f}x {f.ttft_s * 1e3:8.1f} {accept:7.2f} "
              f"{f.target_forwards_per_token:9.3f} {weights_in_brief(f.weights):>10s}  {same}")
    print(ROOFLINE_HEADER)
    for name, f in s.figures.items():
        for i, line in enumerate(roofline_lines(f.roofline)):
            print(f"  {'' if i else name:{width}s} {line}")
    verdict = judge(s, gated, args.gate)
    for name, r in verdict["suts"].items():
        print(f"{name} over {s.rounds} round{'s' * (s.rounds > 1)}: decode {r['decode']:.2f}x (rounds "
              f"{r['decode_range'][0]:.2f}-{r['decode_range'][1]:.2f}x), end to end {r['end_to_end']:.2f}x (rounds "
              f"{r['end_to_end_range'][0]:.2f}-{r['end_to_end_range'][1]:.2f}x)")
    record = Path(s.dir) / "smoke.json"
    write_json(record, {**json.loads(record.read_text()), "verdict": verdict})
    if verdict["failures"]:
        raise GateFailed("; ".join(verdict["failures"]))
    print(f"GATE PASS: {gated} decodes at {verdict['decode_ratio']:.2f}x the baseline's tokens/s after the first "
          f"token (gate {args.gate}x) and runs at {verdict['end_to_end_ratio']:.2f}x end to end, outputs "
          "token-identical")


def judge(s: Smoke, gated: str, gate: float) -> dict:
    """The smoke gate's verdict, as smoke.json states it: PASS or FAIL, the gate, each SUT's ratios to the baseline
    and whether its tokens matched, and every failure in one line each."""
    base, under = s.figures["baseline"], s.figures[gated]
    ratio, overall = base.tpot_s / under.tpot_s, under.tokens_per_s / base.tokens_per_s
    failures = [f"{n} output differs from baseline on {len(m)} samples" for n, m in s.mismatches.items() if m]
    failures += [f"{n}'s {', '.join(f.roofline.implausible())} ran above {PLAUSIBLE:.0%} of the measured roof "
                 f"({f.roofline.peaks['method']}): a faster kernel than the peaks measured"
                 for n, f in s.figures.items() if f.roofline.implausible()]
    if not ratio >= gate:  # a SUT that streamed no token latencies (NaN) fails too
        failures.append(f"{gated} decodes at {ratio:.2f}x the baseline's tokens/s after the first token, below the "
                        f"gate of {gate}x")
    if overall < min(1.0, gate):  # no slower than the baseline end to end (a gate below 1 allows as much)
        failures.append(f"{gated} runs at {overall:.2f}x the baseline's tokens/s end to end: slower than the "
                        f"baseline{f' by more than the gate of {gate}x allows' if gate < 1 else ''}")
    ratios = {name: {"decode": base.tpot_s / f.tpot_s, "end_to_end": f.tokens_per_s / base.tokens_per_s,
                     "decode_range": spread(s.by_round[name]["decode"]),
                     "end_to_end_range": spread(s.by_round[name]["end_to_end"]),
                     "tokens_identical": not s.mismatches[name]} for name, f in s.figures.items() if name != "baseline"}
    return {"result": "FAIL" if failures else "PASS", "gate": gate, "gated": gated, "rounds": s.rounds,
            "decode_ratio": ratio, "end_to_end_ratio": overall, "tokens_identical": not any(s.mismatches.values()),
            "suts": ratios, "failures": failures}


def spread(values: list[float]) -> list[float]:
    """[lowest, highest] of a SUT's per-round ratios."""
    return [min(values), max(values)]
