"""Lab 3's grader: the student's FLOPs and bytes of a decode step, a verify pass, a draft step and a prefill
against roofline/analytic.py; their regimes against this machine's measured peaks; their speedup prediction
against roofline/speculative.py, at fixed points and at an acceptance measured here on the shipped pair."""
import importlib
import re
from pathlib import Path

from labs.grading import Check, Fail
from mlperf.checkpoint import read_config
from mlperf.data import load_prompts
from mlperf.tokenizer import load_tokenizer
from roofline import peaks
from roofline.analytic import forward_cost
from roofline.speculative import expected_tokens_per_cycle, speculative_figures
from scenarios.records import RunConfig
from suts.registry import build_sut

TOLERANCE = 0.02  # relative: LayerNorms, biases and softmax are under 1% of every count here
GAMMA = 4


def phases(target, draft) -> dict:
    """(config, context, new tokens) of each phase the handout asks about."""
    return {"decode step (target, context 256)": (target, 256, 1),
            f"verify pass (target, context 256, {GAMMA + 1} tokens)": (target, 256, GAMMA + 1),
            "draft step (draft, context 256)": (draft, 256, 1),
            "prefill (target, 200-token prompt)": (target, 0, 200),
            "long-context decode step (target, context 480)": (target, 480, 1)}


def checks(module_name: str, answers: Path | None = None) -> list[Check]:
    student = importlib.import_module(module_name)
    defaults = RunConfig()
    target, draft = read_config(defaults.target)[0], read_config(defaults.draft)[0]
    cases = phases(target, draft)
    machine = peaks.load()

    def compare(what: str, fn, attr: str):
        lines = []
        for name, (cfg, context, new) in cases.items():
            want = getattr(forward_cost(cfg, context, new), attr)
            got = float(fn(cfg, context, new))
            if abs(got - want) > TOLERANCE * want:
                raise Fail(f"{name}: your {what} {got:.4g}, expected {want:.4g} (within {TOLERANCE:.0%}). Hint: "
                           + ("count attention over context + new keys, and the LM head" if attr == "flops" else
                              "count the KV cache reads (context + new positions, K and V, every layer) and logits"))
            lines.append(f"{got / 1e6:.1f}M")
        return f"{what} within {TOLERANCE:.0%} for all {len(cases)} phases ({', '.join(lines)})"

    def regimes():
        ridge = machine["flops_per_s"] / machine["bytes_per_s"]
        probes = {name: forward_cost(cfg, context, new) for name, (cfg, context, new) in cases.items()}
        probes["a pass at 2x the ridge"] = None
        lines = []
        for name, cost in probes.items():
            flops, moved = (cost.flops, cost.bytes) if cost else (2 * ridge * 1e6, 1e6)
            want = "memory-bound" if flops / moved < ridge else "compute-bound"
            got = student.regime(flops, moved, machine["flops_per_s"], machine["bytes_per_s"])
            if got != want:
                raise Fail(f"{name}: intensity {flops / moved:.2f} FLOPs/byte against this machine's ridge "
                           f"{ridge:.2f}: expected {want!r}, got {got!r}. Hint: compare FLOPs per byte with peak "
                           f"FLOP/s over peak bytes/s")
            lines.append(f"{name.split(' (')[0]} {want}")
        return f"ridge {ridge:.2f} FLOPs/byte ({machine['fingerprint']}): " + ", ".join(lines)

    def reference_speedup(alpha, gamma, c, verify):
        return expected_tokens_per_cycle(alpha, gamma) / (gamma * c + verify)

    def speedup_formula():
        for point in ((0.8, 4, 0.17, 1.3), (0.5, 2, 0.05, 1.1), (1.0, 3, 0.1, 1.2), (0.0, 4, 0.2, 1.0)):
            want, got = reference_speedup(*point), float(student.predicted_speedup(*point))
            if abs(got - want) > 1e-6 * want:
                raise Fail(f"predicted_speedup(alpha, gamma, c, verify) = predicted_speedup{point} gave {got:.4f}, "
                           f"expected {want:.4f}. Hint: expected tokens per cycle (1 - alpha^(gamma+1)) / (1 - alpha) "
                           f"(gamma + 1 when alpha = 1) over the cycle's cost gamma c + verify")
        return "matches Leviathan et al.'s formula at 4 points, alpha 0 and 1 included"

    def speedup_measured():
        tokenizer = load_tokenizer(defaults.target)
        prompts = [tokenizer.encode(p.text)[-200:] for p in load_prompts()[:4]]
        runs = {name: [build_sut(name, defaults.target, defaults.draft, gamma=GAMMA).generate(p, 64).stats
                       for p in prompts] for name in ("baseline", "spec")}
        f = speculative_figures(runs["spec"], runs["baseline"])
        want = reference_speedup(f.alpha, GAMMA, f.draft_cost_ratio, f.verify_cost_ratio)
        got = float(student.predicted_speedup(f.alpha, GAMMA, f.draft_cost_ratio, f.verify_cost_ratio))
        if abs(got - want) > 1e-6 * want:
            raise Fail(f"at the acceptance measured here (alpha {f.alpha:.3f}, c {f.draft_cost_ratio:.3f}, verify "
                       f"{f.verify_cost_ratio:.2f}) you predict {got:.2f}x, expected {want:.2f}x")
        return (f"measured here on 4 prompts: alpha {f.alpha:.3f}, c {f.draft_cost_ratio:.3f}, verify "
                f"{f.verify_cost_ratio:.2f} decode steps; you predict {got:.2f}x, spec measured "
                f"{f.measured_speedup:.2f}x "
                f"(question 2 asks why they differ)")

    def written():
        text = answers.read_text() if answers and answers.is_file() else ""
        open_questions = len(re.findall(r"^\*Your answer here\.\*", text, re.M))
        if not text or open_questions:
            raise Fail(f"{open_questions or 'no'} written answer(s) missing in {answers}: your instructor grades them")
        return f"answered ({answers.name}): your instructor grades them"

    return [
        Check("FLOPs per phase", 25, lambda: compare("FLOPs", student.forward_flops, "flops"),
              "forward_flops(config, context, new_tokens) must return a number"),
        Check("bytes per phase", 25, lambda: compare("bytes", student.forward_bytes, "bytes"),
              "forward_bytes(config, context, new_tokens) must return a number"),
        Check("regimes", 20, regimes, "regime(...) returns 'compute-bound' or 'memory-bound'"),
        Check("speedup formula", 15, speedup_formula, "predicted_speedup(alpha, gamma, c, verify) returns a number"),
        Check("speedup from measured acceptance", 15, speedup_measured, "see the handout's section 4",
              needs=("speedup formula",)),
        Check("written answers (by hand)", 0, written, "fill in lab3_answers.md"),
    ]
