"""Lab 1's grader: greedy speculative decoding must be token-identical to the baseline, exact in length, stop at
an EOS inside a cycle, roll both caches back, draft as many tokens as gamma asks, record each cycle's acceptance
(all of them for a perfect draft; as the harness's `spec` records them on the shipped pair), and, once all of that
holds, run through LoadGen on prompts drawn at grading time with as many target forwards a token as `spec` (counted
by a hook, not by the student's code) at a set share of `spec`'s speed measured in the same grading: what a correct
loop controls, where a fixed ratio over the baseline moves with the CPU and its kernels. A file that uses the
harness's own speculative SUT earns nothing (labs/__main__.py)."""
import functools
from functools import partial
import math
import os
import random
from dataclasses import dataclass, field, replace

import torch

from labs.grading import Check, Fail
from mlperf.chunk import Chunk
from mlperf.data import Prompt, load_prompts
from mlperf.env import default_threads
from mlperf.tokenizer import load_tokenizer
from scenarios.config import RunConfig
from commands.smoke import SUTFailed, counting_forwards, run_smoke
from suts.registry import build_sut


GAMMAS = (1, 4)
N_NEW = 40
SPEED_PROMPTS, SPEED_TOKENS = 6, 64
SPEED_ROUNDS = 3  # the baseline, yours and spec take turns: a load that comes and goes slows all three alike
SPEED_STALL_S = 30  # a timed sample that makes no progress for this long fails the speed check
BANNED = ("suts.speculative",)  # the harness's batched implementation of this lab
# the speed check: a correct loop runs at least this share of the harness's spec's tokens/s (a Python loop drafting
# token by token, against spec's drafts in one C call: docs/measurements.md, "Lab 1 on both builds", 0.87-1.09 there)
SPEC_SHARE = 0.6
ACCEPTANCE_TOLERANCE = 0.05  # relative: a draft computed another correct way may break a near-tie differently


def eos_cuts(tokens: list[int], cycle: int = 5) -> list[tuple[int, list[int]]]:
    """Up to 3 tokens of `tokens` whose first occurrence lies inside a cycle of `cycle` tokens (the prefill gives
    token 0; a cycle ends every `cycle` tokens after it when all drafts are accepted), each with the output that
    stops there: an EOS mid-cycle tells a loop that stops at it from one that emits its whole cycle."""
    first = {}
    for i, tok in enumerate(tokens):
        first.setdefault(tok, i)
    inside = sorted(i for i in first.values() if i >= 2 and i % cycle not in (0, 1))
    picks = inside[::max(1, len(inside) // 3)][:3]
    return [(tokens[i], tokens[:i + 1]) for i in picks]


def timed_prompts() -> list[Prompt]:
    """SPEED_PROMPTS held-out prompts drawn at grading time, each cut at a random point: the speed check times
    inputs nobody knew before it ran, so answers prepared before the timed run are no use."""
    rng = random.Random(os.urandom(8))
    chosen = rng.sample(load_prompts(), SPEED_PROMPTS)
    return [replace(p, text=p.text[:rng.randint(len(p.text) // 2, len(p.text))]) for p in chosen]


def stop_at_eos(s, prompt: list[int], eos: int, cut: list[int], where: str) -> None:
    """Fail unless SUT `s`, with `eos` as its EOS token, emits exactly `cut` for `prompt`."""
    saved, s.eos_id = s.eos_id, eos
    try:
        got = s.generate(prompt, N_NEW).tokens
    finally:
        s.eos_id = saved
    if got != cut:
        raise Fail(f"{where}, EOS = token {eos}: expected to stop at its first occurrence, after {len(cut)} tokens, "
                   f"got {len(got)}. Hint: hand every cycle's tokens to seq.emit, which stops at EOS")


def first_difference(a: list[int], b: list[int]) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first difference at token {i}: expected {b[i:i + 5]}..., got {a[i:i + 5]}..."


@functools.lru_cache(maxsize=None)
def reference(target: str, count: int = 4) -> tuple[list[list[int]], list[list[int]]]:
    """The last `count` held-out prompts (not among `make smoke`'s) whose baseline continuation is text, with that
    continuation: a run of spaces cannot tell a correct loop from a wrong one. Cached: graders share it."""
    tokenizer = load_tokenizer(target)
    baseline = build_sut("baseline", target, eos_id=tokenizer.eos_id)
    prompts, expected = [], []
    for p in reversed(load_prompts()):
        prompt = tokenizer.encode(p.text)[-200:]
        tokens = baseline.generate(prompt, N_NEW).tokens
        if len(set(tokens)) >= N_NEW // 4:
            prompts.append(prompt)
            expected.append(tokens)
        if len(prompts) == count:
            return prompts, expected
    raise RuntimeError(f"fewer than {count} held-out prompts have a baseline continuation that is not a run")


@dataclass
class Lab1:
    """What lab 1's checks share: the student's class (by name) on the shipped pair, its SUTs by gamma, the held-out
    prompts and the baseline's tokens for them, and the speed check's gate (a share of spec's speed)."""
    name: str
    target: str
    draft: str
    eos_id: int | None
    prompts: list[list[int]]
    expected: list[list[int]]
    gate: float
    results: str
    suts: dict = field(default_factory=dict)

    def sut(self, gamma: int = 4):
        if gamma not in self.suts:
            self.suts[gamma] = build_sut(self.name, self.target, self.draft, gamma=gamma, eos_id=self.eos_id)
        return self.suts[gamma]


def loads(g: Lab1) -> str:
    s = g.sut()
    if getattr(s, "gamma", None) != 4:
        raise Fail(f"StudentSpeculative(..., gamma=4).gamma is {getattr(s, 'gamma', None)!r}, expected 4")
    return "StudentSpeculative builds on the shipped pair (gamma 4)"


def identical(g: Lab1) -> str:
    for gamma in GAMMAS:
        for i, (prompt, want) in enumerate(zip(g.prompts, g.expected)):
            got = g.sut(gamma).generate(prompt, N_NEW).tokens
            if got != want:
                raise Fail(f"held-out prompt {i}, gamma {gamma}: your tokens differ from the baseline's; "
                           f"{first_difference(got, want)}. Hint: keep only the drafts up to the first mismatch, "
                           f"then the target's token at that position; and check the caches are rolled back")
    return f"{len(g.prompts)} held-out prompts x gamma {GAMMAS}: {N_NEW} tokens each, identical to the baseline"


def lengths(g: Lab1) -> str:
    s, prompt = g.sut(4), g.prompts[0]
    for n in (1, 4, 5, 11):
        got = s.generate(prompt, n).tokens
        if len(got) != n:
            raise Fail(f"max_new_tokens={n} (gamma 4) gave {len(got)} tokens. Hint: a cycle may emit up to "
                       f"gamma+1 tokens; draft at most min(gamma, tokens still allowed - 1)")
        if got != g.expected[0][:n]:
            raise Fail(f"max_new_tokens={n}: {first_difference(got, g.expected[0][:n])}")
    cuts = eos_cuts(g.expected[0])
    for gamma in GAMMAS:
        for eos, cut in cuts:
            stop_at_eos(g.sut(gamma), prompt, eos, cut, f"gamma {gamma}")
    return (f"max_new_tokens 1, gamma, gamma+1 and 11 give exactly that many tokens; generation stops at an EOS "
            f"inside a cycle ({len(cuts)} positions x gamma {GAMMAS})")


def rollback(g: Lab1) -> str:
    s = g.sut(4)
    for prompt in g.prompts[:2]:
        result = s.generate(prompt, N_NEW)
        committed = len(prompt) + len(result.tokens) - 1  # the last token has not been fed yet
        if getattr(s, "draft_cache", None) is None:
            raise Fail("self.draft_cache is gone: the starter's __init__ makes it, and propose and verify use it")
        t, d = int(s.cache.lengths[0]), int(s.draft_cache.lengths[0])
        if t != committed:
            raise Fail(f"after {len(result.tokens)} tokens from a {len(prompt)}-token prompt the target's cache "
                       f"holds {t} positions; expected {committed} (prompt + tokens - 1). Hint: after verify, "
                       f"roll tcache back to the committed length (tcache.roll_back), dropping the rejected drafts")
        if d > committed:
            raise Fail(f"the draft's cache holds {d} positions, more than the {committed} committed ones: it "
                       f"keeps rejected drafts and proposes from a wrong context. Hint: roll the draft's cache "
                       f"back too (to at most the target's length)")
        with torch.inference_mode():
            view = s.cache.rows(0, 1)
            continued = s.target(s.tensor(result.tokens[-1:]), Chunk(view)).logits[0, -1]
            fresh = s.target(s.tensor(prompt + result.tokens)).logits[0, -1]
        if not torch.allclose(continued, fresh, atol=1e-3, rtol=1e-3):
            raise Fail("the target's cache has the right length but holds stale keys/values: continuing from "
                       "it differs from a fresh forward. Hint: feed [last committed token] + drafts, so each "
                       "position's keys are written where the committed token will stay")
    return "both caches hold exactly the committed tokens after generation (2 prompts)"


def perfect_draft(g: Lab1) -> str:
    lines = []
    for gamma in GAMMAS:
        s = build_sut(g.name, g.target, g.target, gamma=gamma, eos_id=g.eos_id)  # the target as its own draft
        forwards = {"target": [], "draft": []}  # counted from outside the SUT, whichever way they run
        with counting_forwards(s.target, forwards["target"]), counting_forwards(s.draft, forwards["draft"]):
            result = s.generate(g.prompts[1], N_NEW)
        calls = {model: len(seen) for model, seen in forwards.items()}
        cycles = math.ceil((N_NEW - 1) / (gamma + 1))  # after the prefill's token, gamma + 1 tokens a cycle
        drafts = N_NEW - 1 - cycles
        if calls["target"] != 1 + cycles:
            raise Fail(f"gamma {gamma}, with the target as its own draft every draft must be accepted: expected "
                       f"{1 + cycles} target forwards for {N_NEW} tokens, saw {calls['target']}. Hint: draft i "
                       f"stands in for the target's choice at position i of the verify pass (logits[i]), not "
                       f"logits[i + 1]; compare token ids as ints; and draft `self.gamma` tokens, no more")
        if not 1 + drafts <= calls["draft"] <= 1 + drafts + cycles:  # prefill, one a draft (+ a catch-up)
            raise Fail(f"gamma {gamma}: {calls['draft']} draft forwards for {drafts} drafted tokens in {cycles} "
                       f"cycles (expected about one a drafted token). Hint: draft min(gamma, budget - 1) tokens a "
                       f"cycle, the gamma you were given")
        stats = result.stats
        if (stats.cycles, stats.drafted, stats.accepted) != (cycles, drafts, drafts):
            raise Fail(f"gamma {gamma}: seq.stats records {stats.cycles} cycles, {stats.drafted} drafts, "
                       f"{stats.accepted} accepted; expected {cycles} cycles of {drafts} drafts, all accepted. "
                       f"Hint: call seq.stats.record_cycle(drafted, accepted) once per verify pass")
        for eos, cut in eos_cuts(result.tokens, gamma + 1):
            stop_at_eos(s, g.prompts[1], eos, cut, f"gamma {gamma}, a perfect draft")
        lines.append(f"gamma {gamma}: {1 + cycles} target forwards")
    return f"a draft identical to the target is always accepted ({'; '.join(lines)} for {N_NEW} tokens)"


def acceptance(g: Lab1) -> str:
    lines = []
    for gamma in GAMMAS[-1:]:  # the perfect draft already observes every gamma
        harness = build_sut("spec", g.target, g.draft, gamma=gamma, eos_id=g.eos_id)
        mine = [g.sut(gamma).generate(p, N_NEW).stats for p in g.prompts]
        want = [harness.generate(p, N_NEW).stats for p in g.prompts]
        for what in ("drafted", "accepted"):
            got, ref = (sum(getattr(st, what) for st in runs) for runs in (mine, want))
            if abs(got - ref) > ACCEPTANCE_TOLERANCE * ref:
                raise Fail(f"gamma {gamma}: seq.stats records {got} {what} tokens on {len(g.prompts)} held-out "
                           f"prompts, where the same greedy loop drafts and accepts the same tokens ({ref} "
                           f"{what}). Hint: call seq.stats.record_cycle(len(drafts), k) once per verify pass: "
                           f"the roofline's acceptance and speedup prediction are built on it")
        lines.append(f"gamma {gamma}: {sum(st.accepted for st in mine)}/{sum(st.drafted for st in mine)}")
    return (f"acceptance as the harness's spec records it on {len(g.prompts)} prompts ({', '.join(lines)} "
            f"accepted/drafted)")


def speed(g: Lab1) -> str:
    try:
        s = run_smoke(g.target, g.draft, max_new_tokens=SPEED_TOKENS, results=g.results, suts=(g.name, "spec"),
                      prompts=timed_prompts(), stall_timeout_s=SPEED_STALL_S, rounds=SPEED_ROUNDS)
    except SUTFailed as e:
        raise Fail(str(e)) from None
    base, harness = (s.figures[n].tokens_per_s for n in ("baseline", "spec"))
    mine = s.figures[g.name]
    share = mine.tokens_per_s / harness
    accept = mine.roofline.speculative.acceptance_rate if mine.roofline.speculative else float("nan")
    forwards, spec = (s.figures[n].target_forwards_per_token for n in (g.name, "spec"))
    line = (f"{mine.tokens_per_s:.1f} tokens/s = {share:.2f}x the harness's spec ({harness:.1f}) and "
            f"{mine.tokens_per_s / base:.2f}x the baseline's {base:.1f} through LoadGen SingleStream ({SPEED_PROMPTS} "
            f"prompts drawn now x {SPEED_TOKENS} tokens, {SPEED_ROUNDS} rounds taking turns in one process), "
            f"acceptance {accept:.2f}, {forwards:.3f} target forwards a token (the harness's spec: {spec:.3f})")
    if s.mismatches[g.name]:
        raise Fail(f"your outputs differ from the baseline's on {len(s.mismatches[g.name])} of {SPEED_PROMPTS} "
                   f"prompts")
    if abs(forwards - spec) > ACCEPTANCE_TOLERANCE * spec:
        raise Fail(f"{line}: the same greedy loop runs the target as often as spec does. Hint: one target "
                   f"forward per cycle, through self.target(...); an answer kept from an earlier call is not "
                   f"decoding")
    if share < g.gate:
        raise Fail(f"{line}; the gate is {g.gate}x spec's speed. Hint: one target forward per cycle, no extra "
                   f"forwards or copies of the cache; an acceptance near 0 means drafts are compared wrongly")
    return line


def checks(module_name: str, gate: float = SPEC_SHARE, results: str = "results/labs") -> list[Check]:
    defaults = RunConfig()
    g = Lab1(f"{module_name}:StudentSpeculative", defaults.target, defaults.draft,
             load_tokenizer(defaults.target).eos_id, *reference(defaults.target), gate, results)
    correct = [
        Check("loads", 5, partial(loads, g), "the class must build from (target, draft, eos_id=..., gamma=...)"),
        Check("identical to baseline", 25, partial(identical, g), "compare your loop with the handout's pseudocode, "
              "and check both caches are rolled back after each verify"),
        Check("exact lengths", 10, partial(lengths, g), "draft at most min(gamma, seq.budget - 1) tokens per cycle"),
        Check("caches rolled back", 15, partial(rollback, g), "after each verify, roll the target's cache back to the "
              "committed length - 1 and the draft's to at most that; a draft cache ahead of the committed tokens "
              "leaves propose nothing to feed"),
        Check("perfect draft accepted", 10, partial(perfect_draft, g), "compare drafts with the target's argmax"),
        Check("acceptance recorded", 5, partial(acceptance, g), "record each cycle with seq.stats.record_cycle",
              needs=("identical to baseline",)),
    ]
    # speed is credited only to a correct loop (as MLPerf counts performance only with valid accuracy), so any
    # wrong part costs at least 35 points; a correct loop that is slow, or that runs the target less often than
    # spec (a cheat), loses these 30
    return correct + [Check(f"LoadGen speed >= {gate}x spec's", 30, partial(speed, g),
                            "see the handout's section on speed", needs=tuple(c.name for c in correct),
                            timeout_s=150, threads=default_threads())]
