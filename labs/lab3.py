"""Lab 3's grader: the student's FLOPs and bytes of a decode step, a verify pass, a draft step and a prefill
against mlperf/cost.py and roofline/analytic.py, and on models and contexts drawn for each submission (from its
own hash, so a grade is the same twice and a table of answers is no use), term by term; the regimes of their own
counts against this machine's measured peaks, and of passes just either side of synthetic machines' ridges (only
once the counts are right); their speedup prediction against roofline/speculative.py, at fixed points and at an
acceptance measured here on the shipped pair (the written answers: labs/answers.py)."""
import hashlib
import importlib
import random
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import ModuleType

from labs.grading import Check, Fail
from mlperf.checkpoint import read_config
from mlperf.cost import forward_cost
from mlperf.model import GPTConfig
from mlperf.data import load_prompts
from mlperf.tokenizer import load_tokenizer
from roofline import peaks
from roofline.speculative import expected_tokens_per_cycle, speculative_figures
from scenarios.config import RunConfig
from suts.registry import build_sut


TOLERANCE = 0.02  # relative: LayerNorms, biases and softmax are under 1% of every count here
GAMMA = 4
BANNED = ("roofline", "mlperf.cost")  # the harness's own counts and formula answer this lab
TERMS = {  # what each probe isolates, and where that term comes from
    "in total": ("count every linear layer, the LM head and attention", "count the weights, the KV cache reads and "
                 "writes, and the logits"),
    "as the context grows": ("attention: Q K^T and the weighted sum of V over every context key, every layer",
                             "the KV cache reads: keys and values of every context position, every layer"),
    "per new token": ("every linear layer, the LM head and attention run once for each new token",
                      "each new token's keys and values are written and read back, and its logits are written"),
    "as the vocabulary grows": ("the LM head: 2 x d FLOPs per vocabulary entry per new token",
                                "the LM head's weights (read once) and the logits (one value per entry per new "
                                "token)"),
}


def phases(target, draft) -> dict:
    """(config, context, new tokens) of each phase the handout asks about."""
    return {"decode step (target, context 256)": (target, 256, 1),
            f"verify pass (target, context 256, {GAMMA + 1} tokens)": (target, 256, GAMMA + 1),
            "draft step (draft, context 256)": (draft, 256, 1),
            "prefill (target, 200-token prompt)": (target, 0, 200),
            "long-context decode step (target, context 480)": (target, 480, 1)}


def drawn(seed: int, n: int = 4) -> list[tuple[GPTConfig, int, int]]:
    """`n` (config, context, new tokens) of GPT-2-like models drawn from `seed`, vocabularies up to GPT-2's."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        heads = rng.choice([2, 4, 6, 8, 12])
        config = GPTConfig(n_layer=rng.randint(2, 12), n_head=heads, n_embd=heads * rng.choice([16, 32, 64]),
                           vocab_size=rng.choice([256, rng.randint(1000, 50257)]), block_size=4096)
        cases.append((config, rng.randint(0, 1024), rng.choice([1, rng.randint(2, 9), rng.randint(10, 512)])))
    return cases


def probes(config: GPTConfig, context: int, new: int) -> dict[str, tuple]:
    """Pairs of passes whose difference isolates one term, (a pass, the pass it is compared with or None); each
    term before the total, so that a failure names the term that is off."""
    return {"as the context grows": ((config, context + 256, new), (config, context, new)),
            "per new token": ((config, context, new + 8), (config, context, new)),
            "as the vocabulary grows": ((replace(config, vocab_size=config.vocab_size + 4096), context, new),
                                        (config, context, new)),
            "in total": ((config, context, new), None)}


@dataclass
class Lab3:
    """What lab 3's checks share: the student's module, the shipped pair's phases, a seed drawn from the file (the
    models it is checked on besides them), this machine's peaks."""
    student: ModuleType
    target: str
    draft: str
    cases: dict
    seed: int
    machine: dict


def compare(lab: Lab3, what: str, fn, attr: str) -> str:
    reference = lambda c, ctx, new: getattr(forward_cost(c, ctx, new), attr)
    mine = lambda c, ctx, new: float(fn(c, ctx, new))
    named = list(lab.cases.items())
    named += [(f"drawn model {i + 1} ({c.n_layer} layers, width {c.n_embd}, vocabulary {c.vocab_size}; context "
               f"{ctx}, {new} new tokens)", (c, ctx, new)) for i, (c, ctx, new) in enumerate(drawn(lab.seed))]
    lines = []
    for name, case in named:
        for term, (a, b) in probes(*case).items():
            want = reference(*a) - (reference(*b) if b else 0)
            got = mine(*a) - (mine(*b) if b else 0)
            if abs(got - want) > TOLERANCE * want:
                raise Fail(f"{name}: your {what} {term} are {100 * (got - want) / want:+.1f}% from what they "
                           f"should be (tolerance {TOLERANCE:.0%}). Hint: "
                           f"{TERMS[term][attr == 'bytes']}")
        if name in lab.cases:
            lines.append(f"{mine(*case) / 1e6:.1f}M")
    return (f"{what} within {TOLERANCE:.0%}, term by term, for the {len(lab.cases)} phases ({', '.join(lines)}) and "
            f"{len(named) - len(lab.cases)} drawn models")


def regimes(lab: Lab3) -> str:
    ridge = lab.machine["flops_per_s"] / lab.machine["bytes_per_s"]
    passes = {name: (float(lab.student.forward_flops(*case)), float(lab.student.forward_bytes(*case)),
                     lab.machine["flops_per_s"], lab.machine["bytes_per_s"]) for name, case in lab.cases.items()}
    for r in (1.5, 12.0, 80.0):  # synthetic machines: any ridge, probed just either side of it
        for side in (0.9, 1.1):
            passes[f"a pass at {side}x the ridge of a machine whose ridge is {r}"] = (side * r * 1e6, 1e6,
                                                                                      r * 1e11, 1e11)
    lines = []
    for name, (flops, moved, flops_per_s, bytes_per_s) in passes.items():
        want = "memory-bound" if flops / moved < flops_per_s / bytes_per_s else "compute-bound"
        got = lab.student.regime(flops, moved, flops_per_s, bytes_per_s)
        if got != want:
            raise Fail(f"{name}: intensity {flops / moved:.2f} FLOPs/byte against a ridge of "
                       f"{flops_per_s / bytes_per_s:.2f}: expected {want!r}, got {got!r}. Hint: compare FLOPs "
                       f"per byte with the peaks passed in, peak FLOP/s over peak bytes/s")
        if name in lab.cases:
            lines.append(f"{name.split(' (')[0]} {want}")
    return (f"ridge {ridge:.2f} FLOPs/byte ({lab.machine['fingerprint']}): " + ", ".join(lines)
            + "; and either side of 3 other ridges")


def reference_speedup(alpha, gamma, c, verify) -> float:
    return expected_tokens_per_cycle(alpha, gamma) / (gamma * c + verify)


def speedup_formula(lab: Lab3) -> str:
    for point in ((0.8, 4, 0.17, 1.3), (0.5, 2, 0.05, 1.1), (1.0, 3, 0.1, 1.2), (0.0, 4, 0.2, 1.0)):
        want, got = reference_speedup(*point), float(lab.student.predicted_speedup(*point))
        if abs(got - want) > 1e-6 * want:
            raise Fail(f"predicted_speedup(alpha, gamma, c, verify) = predicted_speedup{point} gave {got:.4f}, "
                       f"expected {want:.4f}. Hint: expected tokens per cycle (1 - alpha^(gamma+1)) / (1 - alpha) "
                       f"(gamma + 1 when alpha = 1) over the cycle's cost gamma c + verify")
    return "matches Leviathan et al.'s formula at 4 points, alpha 0 and 1 included"


def speedup_measured(lab: Lab3) -> str:
    tokenizer = load_tokenizer(lab.target)
    prompts = [tokenizer.encode(p.text)[-200:] for p in load_prompts()[:4]]
    runs = {name: [build_sut(name, lab.target, lab.draft, gamma=GAMMA).generate(p, 64).stats
                   for p in prompts] for name in ("baseline", "spec")}
    f = speculative_figures(runs["spec"], runs["baseline"])
    want = reference_speedup(f.alpha, GAMMA, f.draft_cost_ratio, f.verify_cost_ratio)
    got = float(lab.student.predicted_speedup(f.alpha, GAMMA, f.draft_cost_ratio, f.verify_cost_ratio))
    if abs(got - want) > 1e-6 * want:
        raise Fail(f"at the acceptance measured here (alpha {f.alpha:.3f}, c {f.draft_cost_ratio:.3f}, verify "
                   f"{f.verify_cost_ratio:.2f}) you predict {got:.2f}x, expected {want:.2f}x")
    return (f"measured here on 4 prompts: alpha {f.alpha:.3f}, c {f.draft_cost_ratio:.3f}, verify "
            f"{f.verify_cost_ratio:.2f} decode steps; you predict {got:.2f}x, spec measured "
            f"{f.measured_speedup:.2f}x "
            f"(question 2 asks why they differ)")


def checks(module_name: str, peaks_cache: Path | None = None) -> list[Check]:
    student = importlib.import_module(module_name)
    defaults = RunConfig()
    lab = Lab3(student, defaults.target, defaults.draft,
               phases(read_config(defaults.target)[0], read_config(defaults.draft)[0]),
               int(hashlib.sha256(Path(student.__file__).read_bytes()).hexdigest()[:8], 16),
               peaks.load(cache=peaks_cache))
    return [  # a phase's regime is only as right as its counts: any wrong part costs at least 30 points
        Check("FLOPs per phase", 20, partial(compare, lab, "FLOPs", student.forward_flops, "flops"),
              "forward_flops(config, context, new_tokens) must return a number"),
        Check("bytes per phase", 20, partial(compare, lab, "bytes", student.forward_bytes, "bytes"),
              "forward_bytes(config, context, new_tokens) must return a number"),
        Check("regimes", 30, partial(regimes, lab), "regime(...) returns 'compute-bound' or 'memory-bound'",
              needs=("FLOPs per phase", "bytes per phase")),
        Check("speedup formula", 15, partial(speedup_formula, lab), "predicted_speedup(alpha, gamma, c, verify) "
              "returns a number"),
        Check("speedup from measured acceptance", 15, partial(speedup_measured, lab), "see the handout's section 4",
              needs=("speedup formula",)),
    ]
