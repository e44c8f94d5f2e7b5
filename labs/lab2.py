"""Lab 2's grader: the student's accept / resample step must accept with probability min(1, p/q), resample from
the residual, use the draft's sampling parameters for the target, draw from the given generator, and make the
speculative SUT's samples distributed exactly as the target's (chi-square against the exact distribution). The
harness's own rule answers greedy cases only while the student's code runs (`own_rule`)."""
import importlib
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from statistics import NormalDist
from types import ModuleType

import torch

from labs.grading import Check, Fail
from mlperf.model import GPT
from suts.distribution import chi_square_vs_target, detectable, tiny_vocab_pair
from suts.engine.sampling import SamplingParams, probs


BANNED = ()  # the student's rule plugs into the harness's Speculative SUT, which the file imports


@contextmanager
def own_rule(student):
    """While the checks run, the harness's acceptance rule (suts.speculative.accept, under any name the student's
    module gave it, and as Speculative.accept) answers greedy cases only and fails a sampled one: that is the rule
    the student writes (the starter's greedy case calls greedy_prefix)."""
    from suts import speculative
    original = speculative.accept

    def greedy_only(drafts, q, logits, params, generator):
        if not params.greedy:
            raise Fail("your accept_or_resample handed a sampled case to the harness's own accept: write the sampled "
                       "rule yourself")
        return original(drafts, q, logits, params, generator)
    places = [(speculative, "accept", greedy_only), (speculative.Speculative, "accept", staticmethod(greedy_only))]
    places += [(student, name, greedy_only) for name, value in vars(student).items() if value is original]
    saved = [(where, name, vars(where)[name]) for where, name, _ in places]
    try:
        for where, name, value in places:
            setattr(where, name, value)
        yield
    finally:
        for where, name, value in saved:
            setattr(where, name, value)


PARAMS = SamplingParams(temperature=0.7, top_k=6)  # not 1: a target sampled at the wrong temperature shows
DRAWS = 4000  # per acceptance or residual probe
SAMPLES = 4000  # 4-token continuations for the exact-distribution test
P_MIN = 1e-4  # a correct sampler fails a chi-square test this rarely; the wrong ones score below 1e-10
SIGMAS = 5  # a rate check fails beyond this many standard errors: a correct sampler, about once in 2 million
POWER = 0.9  # each check states the smallest deviation it detects this often
DETECTS = SIGMAS + NormalDist().inv_cdf(POWER)  # standard errors: the deviation a rate check detects that often


# the probe: one draft position's draft logits, target logits (the position and the bonus row), their distributions
Q_LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -9.0])
P_LOGITS = torch.tensor([[0.0, 1.0, 2.0, 1.5, 0.5, -1.0, 0.0, -9.0], [0.0] * 8])
Q = probs(Q_LOGITS, PARAMS)[None]
P = probs(P_LOGITS[0], PARAMS)


@dataclass
class Lab2:
    """What lab 2's checks share: the student's module and the tiny-vocabulary pair its SUT runs on."""
    student: ModuleType
    target: GPT
    draft: GPT

    def sut(self):
        return self.student.StudentRejection(self.target, self.draft, gamma=2)

    def draws(self, drafts, q, logits, seed=0):
        """DRAWS calls of the student's rule on one case, from one seeded generator."""
        g = torch.Generator().manual_seed(seed)
        return [self.student.accept_or_resample(drafts, q, logits, PARAMS, g) for _ in range(DRAWS)]


def loads(lab: Lab2) -> str:
    spec = lab.sut()
    result = spec.generate([1, 5, 2], 4, SamplingParams())  # greedy: lab 1's rule, given
    return f"StudentRejection builds and decodes ({len(result.tokens)} greedy tokens)"


def acceptance(lab: Lab2) -> str:
    lines, detects = [], []
    for d in (0, 1, 2):  # p(d) much below q(d), about half of it, above it
        want = min(1.0, float(P[d] / Q[0, d]))
        got = sum(k == 1 for k, _ in lab.draws([d], Q, P_LOGITS)) / DRAWS
        sigma = (want * (1 - want) / DRAWS) ** 0.5
        detects.append(DETECTS * sigma)
        if abs(got - want) > SIGMAS * sigma + 1e-9:
            raise Fail(f"draft token {d} with q(d) = {float(Q[0, d]):.3f}, p(d) = {float(P[d]):.3f} (p at "
                       f"temperature {PARAMS.temperature}, top-k {PARAMS.top_k}) was accepted {got:.1%} of the "
                       f"time; expected min(1, p/q) = {want:.1%}. Hint: compute p with probs(logits, params), "
                       f"the same parameters q was drawn with, and accept when u < min(1, p(d)/q(d))")
        lines.append(f"{got:.0%} (expected {want:.0%})")
    return (f"acceptance rates {', '.join(lines)} over {DRAWS} draws each (detects a deviation of "
            f"{max(detects):.0%})")


def one_cycle(lab: Lab2) -> str:
    drafts = [1, 1, 1]  # p/q = 0.48 at every position: each draft is accepted about half the times it is tested
    q3 = Q.expand(3, -1)
    p3 = torch.stack([P_LOGITS[0]] * 3 + [P_LOGITS[1]])
    a = min(1.0, float(P[1] / Q[0, 1]))
    ks = [k for k, _ in lab.draws(drafts, q3, p3)]
    lines = []
    for i in (1, 2):  # draft i + 1, given that drafts 1..i were accepted
        tested = sum(k >= i for k in ks)
        rate = sum(k > i for k in ks) / max(1, tested)
        sigma = (a * (1 - a) / max(1, tested)) ** 0.5
        if abs(rate - a) > SIGMAS * sigma:
            raise Fail(f"in a cycle of three drafts, each accepted with probability {a:.0%}, draft {i + 1} was "
                       f"accepted {rate:.0%} of the times drafts 1-{i} were (expected {a:.0%}, within "
                       f"{SIGMAS * sigma:.0%}). Hint: draw a fresh uniform for each draft: decisions that share "
                       f"randomness are not exact")
        lines.append(f"draft {i + 1} {rate:.0%} of {tested} times (detects a deviation of "
                     f"{DETECTS * sigma:.0%})")
    return f"each draft accepted as often as the ones before it were (expected {a:.0%}): " + "; ".join(lines)


def resample(lab: Lab2) -> str:
    from scipy.stats import chisquare
    d = 0  # p(0) is small against q(0): mostly rejected
    out = [tok for k, tok in lab.draws([d], Q, P_LOGITS) if k == 0]
    residual = (P - Q[0]).clamp_min(0)
    residual = residual / residual.sum()
    counts = torch.bincount(torch.tensor(out), minlength=8).float()
    if counts[residual == 0].sum() > 0:
        bad = int(torch.nonzero(counts * (residual == 0))[0])
        raise Fail(f"after rejecting draft token {d} you emitted token {bad}, which the residual "
                   f"normalize(max(0, p - q)) never gives (p({bad}) <= q({bad})). Hint: after a rejection draw "
                   f"from the residual, not from p or q")
    keep = residual > 0
    pvalue = chisquare(counts[keep].numpy(), (residual[keep] * len(out)).numpy()).pvalue
    if pvalue < P_MIN:
        raise Fail(f"the {len(out)} tokens emitted after rejecting draft token {d} do not follow the residual "
                   f"normalize(max(0, p - q)) (chi-square p = {pvalue:.1e}). Hint: after a rejection "
                   f"draw from the residual, not from p or q")
    return (f"{len(out)} resampled tokens follow the residual (chi-square p = {pvalue:.2f}; detects Cohen's w >= "
            f"{detectable(len(out), int(keep.sum()), P_MIN, POWER):.2f})")


def reproducible(lab: Lab2) -> str:
    spec, seeded = lab.sut(), [PARAMS.for_sample(i) for i in range(8)]
    first = [r.tokens for r in spec.generate_batch([[1, 5, 2]] * 8, 8, seeded, max_batch=4)]
    again = [r.tokens for r in spec.generate_batch([[1, 5, 2]] * 8, 8, seeded, max_batch=4)]
    if first != again:
        raise Fail("the same seeds gave different tokens on a second run. Hint: draw every random number from "
                   "`generator` (torch.rand(n, generator=generator), torch.multinomial(..., generator=generator))")
    return "the same seeds give the same tokens"


def distribution(lab: Lab2) -> str:
    test = chi_square_vs_target(lab.sut(), lab.target, [1, 5, 2], PARAMS, SAMPLES, max_batch=8)
    if test.pvalue < P_MIN:
        raise Fail(f"{SAMPLES} sampled 4-token continuations are not distributed as the target's (chi-square p = "
                   f"{test.pvalue:.1e}). Hint: the bonus token after full acceptance is drawn from the target's "
                   f"last row; and see the checks above")
    return (f"{SAMPLES} samples of 4 tokens (cycles of up to 3) match the target's exact joint distribution "
            f"(chi-square p = {test.pvalue:.2f} over {test.bins} bins; detects Cohen's w >= "
            f"{detectable(test.samples, test.bins, P_MIN, POWER):.2f})")


def checks(module_name: str) -> list[Check]:
    student = importlib.import_module(module_name)
    lab = Lab2(student, *tiny_vocab_pair())

    def guarded(run):
        def call():
            with own_rule(student):
                return run()
        return call

    return [replace(check, run=guarded(check.run)) for check in [
        Check("loads", 5, partial(loads, lab), "StudentRejection(target, draft, gamma=2) must build and decode "
              "greedily"),
        Check("acceptance probability", 10, partial(acceptance, lab), "accept draft d with probability min(1, "
              "p(d)/q(d))"),
        Check("decisions within a cycle", 15, partial(one_cycle, lab), "decide each draft with a uniform of its own"),
        Check("residual resampling", 15, partial(resample, lab), "after a rejection draw from normalize(max(0, p - "
              "q))"),
        Check("seeded", 5, partial(reproducible, lab), "use the generator for every draw"),
        Check("exact distribution", 50, partial(distribution, lab), "see the handout's proof: q must be what the "
              "draft sampled from, p the target's distribution under the same parameters",
              needs=("loads", "acceptance probability", "decisions within a cycle", "residual resampling", "seeded")),
    ]]  # a sampler that is not exact, or not reproducible, earns at most 45
