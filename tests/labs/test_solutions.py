"""Instructor-only (left out of the student tree): the reference solutions earn full marks, the starters are
their stripped copies with no solution code left, the release leaves the solutions out, and the known-wrong
variants students write fail with the messages that point at their bug."""
import importlib
from dataclasses import replace
from pathlib import Path

import pytest

from commands.smoke import Figures, Smoke
from labs import kit
from labs.grading import Fail, Outcome, Report, borrowed, grade, load_student, max_earned
from roofline.analysis import Roofline
from tests.labs.helpers import grade_cli, outcome


def solution(lab: int, name: str | None = None) -> Path:
    return kit.LABS[lab].path / "solution" / (name or kit.LABS[lab].files[0])


@pytest.mark.parametrize("lab", [1, 2, 3])
def test_starters_are_the_stripped_solutions_with_no_solution_code(lab):
    for name in kit.LABS[lab].files:
        reference = solution(lab, name).read_text()
        starter = (kit.LABS[lab].path / "starter" / name).read_text()
        assert starter == kit.strip(reference, name.endswith(".md")), "run: python -m labs starters"
        secrets = kit.solution_lines(reference)
        assert secrets and not secrets & {line.strip() for line in starter.splitlines()}


@pytest.mark.parametrize("lab", [1, 2, 3])
def test_the_reference_solution_earns_full_marks(lab, tmp_path):
    """Lab 1's speed check runs through LoadGen with its gate at 0, so no verdict here rests on time (whether a
    6-prompt run clears its share of spec's speed depends on the machine's load at that moment; the verdict is
    tested below, on fixed figures; the reference's shares on two builds, docs/measurements.md)."""
    for name in kit.LABS[lab].files:
        (tmp_path / name).write_text(solution(lab, name).read_text())
    proc, report = grade_cli(lab, tmp_path, *(["--gate", "0"] if lab == 1 else []))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert report["full_marks"] and report["earned"] == report["total"] == 100
    assert "(full marks)" in proc.stdout
    if lab == 1:
        assert "x the harness's spec" in outcome(report, "LoadGen speed")["message"]


@pytest.mark.parametrize("share, forwards, passes", [(0.59, 0.3, False), (0.61, 0.3, True),
                                                          (0.61, 0.3 * 1.2, False), (3.0, 0.3 * 0.8, False)])
def test_lab1s_speed_check_judges_the_share_of_spec_and_the_forwards(share, forwards, passes, monkeypatch):
    """The verdict on fixed figures: the student's tokens/s over spec's, measured in the same grading, against the
    share; and a loop that runs the target more (or less) often than spec fails whatever its speed. The baseline's
    figure (here 1.1x slower than spec, as on a slow CPU's build) decides nothing."""
    from labs import lab1
    load_student(solution(1), "reference_lab1")
    name = "reference_lab1:StudentSpeculative"
    roof = Roofline({}, 1.0, "", 200, 64.0, {}, 100.0, None)
    figures = {"baseline": Figures(100.0, 0, roof, 1.0), name: Figures(110.0 * share, 0, roof, forwards),
               "spec": Figures(110.0, 0, roof, 0.3)}
    monkeypatch.setattr(lab1, "run_smoke", lambda *args, **kwargs: Smoke("", 6, 64, 4, figures, {name: [], "spec": []}))
    speed = next(c for c in lab1.checks("reference_lab1") if c.name == "LoadGen speed >= 0.6x spec's")
    if passes:
        assert f"{share:.2f}x the harness's spec (110.0)" in speed.run()
    elif forwards == 0.3:
        with pytest.raises(Fail, match=f"{share:.2f}x the harness's spec .*; the gate is 0.6x spec's speed"):
            speed.run()
    else:
        with pytest.raises(Fail, match="runs the target as often as spec does"):
            speed.run()


def test_the_release_leaves_out_the_solutions(tmp_path):
    out = tmp_path / "student"
    assert kit.release(out) > 50
    assert (out / "labs" / "01-speculative" / "starter" / "lab1_speculative.py").is_file()
    assert (out / "labs" / "03-roofline" / "README.md").is_file()
    assert not list(out.glob("labs/*/solution")) and not (out / "tests" / "labs" / "test_solutions.py").exists()
    assert (out / "tests" / "labs" / "test_kit.py").is_file()
    assert "class-bank" not in (out / "Makefile").read_text()  # its test is left out, so is its target
    with pytest.raises(ValueError, match="is not empty"):
        kit.release(out)


def leaked_line(text: str) -> str:
    return text + "\n" + next(iter(kit.solution_lines(solution(2).read_text()))) + "\n"


def borrowing(text: str) -> str:
    """Lab 2's starter calling the harness's own acceptance rule, which would hand the lab's answer over."""
    return text.replace("import Speculative, greedy_prefix", "import Speculative, accept")


@pytest.mark.parametrize("change, why", [(leaked_line, "contains solution code"),
                                         (borrowing, "contains solution code .*suts.speculative.accept")])
def test_the_release_refuses_a_starter_that_leaks_or_borrows_its_answer(tmp_path, monkeypatch, change, why):
    starter = kit.LABS[2].path / "starter" / "lab2_rejection.py"
    changed = change(starter.read_text())
    real_copy = kit.shutil.copy2
    monkeypatch.setattr(kit.shutil, "copy2", lambda src, dest: (real_copy(src, dest), Path(src) == starter
                                                                and Path(dest).write_text(changed)))
    with pytest.raises(ValueError, match=f"lab2_rejection.py {why}"):
        kit.release(tmp_path / "student")
    assert not (tmp_path / "student").exists()


WRONG_AT_MOST = 70  # what any wrong or borrowed submission may score, out of 100


def grade_variant(lab: int, variant: str, patches: list[tuple[str, str]], tmp_path, only: set[str] | None = None,
                  extra: str = "", bounded: bool = True):
    """Grade the reference with `patches` applied (each must apply) and `extra` code appended. Every check runs
    as `make grade` runs it, except lab 1's LoadGen speed check (the slowest, and these variants never get that
    far), or only the checks named in `only` (without their prerequisites). Returns the outcomes by name and what
    it earned; the most a wrong variant can earn in a full grade (the failed checks and every check that needs
    them earn nothing) is held to WRONG_AT_MOST."""
    source = solution(lab).read_text()
    for old, new in patches:
        assert old in source, f"the reference no longer contains {old!r}: update this variant"
        source = source.replace(old, new)
    source += extra
    path = tmp_path / f"{variant}.py"
    path.write_text(source)
    module = f"variant_lab{lab}_{variant}"
    load_student(path, module)
    kept = {1: {"results": str(tmp_path / "results")}, 3: {"peaks_cache": tmp_path / "peaks.json"}}  # not ./results
    checks = importlib.import_module(f"labs.lab{lab}").checks(module, **kept.get(lab, {}))
    report = grade(Report(lab, "", str(path)), [replace(c, needs=()) if only else c for c in checks
                                                 if (c.name in only if only else not c.name.startswith("LoadGen"))],
                   path)
    bound = max_earned(checks, {o.name for o in report.outcomes if o.status == "FAIL"})
    assert bound <= WRONG_AT_MOST or not bounded, f"{variant} could score {bound}/100"
    return {o.name: o for o in report.outcomes}, report.earned


LAB1_VARIANTS = {  # the two (the seed implementation's bugs), then two more students write
    "never-rolls-back": ([("        tcache.roll_back([seq.length + k])", "        pass"),
                          ("        dcache.roll_back([seq.length + k])  # at most as many: the draft may be behind\n",
                           "")],
                         {"identical to baseline": "rolled back",  # the tokens differ, or a cache runs ahead
                          "caches rolled back": "roll the target's"}),
    "shifted-positions": ([("choice[k] == drafts[k]", "choice[k + 1] == drafts[k]")],
                          {"identical to baseline": "first difference", "perfect draft accepted": "not logits[i + 1]"}),
    "draft-not-rolled-back": ([("        dcache.roll_back([seq.length + k])  # at most as many: the draft may be "
                                "behind\n", "")],
                              {"caches rolled back": "the draft's to at most that"}),
    "accepts-nothing": ([("choice[k] == drafts[k]", "choice[k] == drafts[k:k + 1]")],  # an int against a list
                        {"perfect draft accepted": "every draft must be accepted"}),
    "drafts-4-whatever-gamma": ([("        for _ in range(gamma):", "        for _ in range(4):")],
                                {"perfect draft accepted": "gamma 1, with the target as its own draft"}),
    "never-records-cycles": ([("        seq.stats.record_cycle(len(drafts), k)\n", "")],
                             {"perfect draft accepted": "seq.stats records 0 cycles",
                              "acceptance recorded": "call seq.stats.record_cycle"}),
    "records-each-cycle-twice": ([("        seq.stats.record_cycle(len(drafts), k)\n",
                                   "        seq.stats.record_cycle(len(drafts), k)\n" * 2)],
                                 {"acceptance recorded": "drafted tokens on 4 held-out prompts, where the same"}),
    "stops-at-eos-only-after-its-cycle": ([("            done = seq.emit(new, self.eos_id)",
                                            "            done = seq.emit(new, None) or self.eos_id in new")],
                                          {"exact lengths": "expected to stop at its first occurrence"}),
}


def test_lab1_counts_the_target_forwards_of_the_timed_run(tmp_path):
    """An answer kept from an earlier call (the warm-up's, here) is fast and token-identical, and runs the target
    less often than a speculative loop must."""
    memo = [("        self.check(prompt, max_new_tokens)\n",
             "        self.check(prompt, max_new_tokens)\n        key = (tuple(prompt), max_new_tokens, self.eos_id)\n"
             "        if key in self.__dict__.setdefault('memo', {}):\n            if on_first_token:\n"
             "                on_first_token(self.memo[key].tokens[0])\n            return self.memo[key]\n"),
            ("        return seq.result\n", "        self.memo[key] = seq.result\n        return seq.result\n")]
    outcomes, _ = grade_variant(1, "memoizes_answers", memo, tmp_path, only={"LoadGen speed >= 0.6x spec's"})
    speed = outcomes["LoadGen speed >= 0.6x spec's"]
    assert speed.status == "FAIL" and "target forwards a token (the harness's spec" in speed.message, speed.message


@pytest.mark.parametrize("variant", LAB1_VARIANTS)
def test_lab1_fails_the_known_wrong_variants(variant, tmp_path):
    patches, failures = LAB1_VARIANTS[variant]
    seed_bug = variant in ("never-rolls-back", "shifted-positions")  # graded whole: wrong output scores little
    outcomes, earned = grade_variant(1, variant.replace("-", "_"), patches, tmp_path,
                                     only=None if seed_bug else set(failures))
    for name, message in failures.items():
        assert outcomes[name].status == "FAIL" and message in outcomes[name].message, (name, outcomes[name].message)
    if seed_bug:  # no speed points either
        assert earned <= 35


def reference_table() -> str:
    """Lab 3's answers for its five fixed phases, as a student copies them from an earlier grade's output."""
    from labs import lab3
    from mlperf.checkpoint import read_config
    from mlperf.cost import forward_cost
    defaults = lab3.RunConfig()
    cases = lab3.phases(read_config(defaults.target)[0], read_config(defaults.draft)[0]).values()
    table = {(c.n_layer, c.n_embd, ctx, new): forward_cost(c, ctx, new).flops for c, ctx, new in cases}
    return (f"\n\nTABLE = {table!r}\n\n\ndef forward_flops(c, context, new_tokens):\n"
            f"    return TABLE[(c.n_layer, c.n_embd, context, new_tokens)]\n")


LAB3_VARIANTS = {
    "no-logits-bytes": ([("    return weights + kv_read + kv_write + logits",
                          "    return weights + kv_read + kv_write")],
                        {"bytes per phase": "per new token are"}),
    "no-kv-writes": ([("    return weights + kv_read + kv_write + logits", "    return weights + kv_read + logits")],
                     {"bytes per phase": "keys and values are written"}),
    "no-lm-head-flops": ([("    return linear + head + attention", "    return linear + attention")],
                         {"FLOPs per phase": "as the vocabulary grows are"}),
    "attention-over-new-tokens-only": ([("    attention = 2 * 2 * L * T * (context + T) * d",
                                         "    attention = 2 * 2 * L * T * T * d")],
                                       {"FLOPs per phase": "as the context grows are"}),
    "hard-coded-ridge": ([("    ridge = peak_flops_per_s / peak_bytes_per_s", "    ridge = 5.0")],
                         {"regimes": "against a ridge of"}),
    "linear-expected-tokens": ([("(1 - alpha ** (gamma + 1)) / (1 - alpha)", "1 + gamma * alpha")],
                               {"speedup formula": "expected tokens per cycle"}),
    "answers-from-a-table": ([], {"FLOPs per phase": "raised KeyError"}),
}


@pytest.mark.parametrize("variant", LAB3_VARIANTS)
def test_lab3_fails_the_known_wrong_counts_on_the_term_they_miss(variant, tmp_path):
    patches, failures = LAB3_VARIANTS[variant]
    outcomes, _ = grade_variant(3, variant.replace("-", "_"), patches, tmp_path, only=set(failures),
                                extra=reference_table() if variant == "answers-from-a-table" else "")
    for name, message in failures.items():
        assert outcomes[name].status == "FAIL" and message in outcomes[name].message, (name, outcomes[name].message)
        assert "expected" not in outcomes[name].message or name in ("regimes", "speedup formula")


def handout_paragraph(lab: int) -> str:
    paragraphs = kit.LABS[lab].path.joinpath("README.md").read_text().split("\n\n")
    return next(p for p in paragraphs if len(p) > 250 and not p.lstrip().startswith(("#", "|", "`")))


@pytest.mark.parametrize("lab", [1, 2, 3])
def test_every_lab_needs_every_written_answer_for_full_marks(lab, tmp_path):
    from labs.answers import written_check
    folder = kit.LABS[lab]
    check = lambda answers: written_check(answers, folder.path / "starter" / folder.answers,  # noqa: E731
                                          folder.path / "README.md")
    assert "3 answered" in check(solution(lab, folder.answers)).run()
    reference = solution(lab, folder.answers).read_text()
    first = reference.index("<!-- BEGIN SOLUTION -->"), reference.index("<!-- END SOLUTION -->")
    for answer, why in [("*Your answer here.*", "1. missing"), ("Memory.", "only 7 characters"),
                        ("x" * 250, "no figure you measured"),
                        (handout_paragraph(lab), "the question or the handout copied")]:
        (tmp_path / "answers.md").write_text(reference[:first[0]] + answer + "\n" + reference[first[1]:])
        with pytest.raises(Fail, match=why):
            check(tmp_path / "answers.md").run()
    report = Report(3, "", "")
    report.outcomes = [Outcome("written answers (by hand)", 0, 0, "FAIL", "missing")]
    assert not report.full_marks and report.earned == report.total  # 0 of 0 points, still not full marks


@pytest.mark.parametrize("lab, line, found", [
    (1, "from suts.speculative import Speculative", "line 1 uses suts.speculative"),
    (1, "from suts import speculative", "uses suts.speculative"),
    (3, "import roofline.analytic as a", "uses roofline.analytic"),
    (3, "mod = __import__('importlib').import_module('roofline.analytic')", "uses roofline.analytic"),
])
def test_a_file_built_on_the_harness_answer_earns_nothing(lab, line, found, tmp_path):
    path = tmp_path / "student.py"
    path.write_text(line + "\n" + solution(lab).read_text())
    assert found in borrowed(path, importlib.import_module(f"labs.lab{lab}").BANNED)
    assert borrowed(solution(lab), importlib.import_module(f"labs.lab{lab}").BANNED) is None


def test_grading_a_borrowed_file_gives_no_credit(tmp_path):
    (tmp_path / "lab1_speculative.py").write_text(
        "from suts.speculative import Speculative\n\n\nclass StudentSpeculative(Speculative):\n    pass\n")
    proc, report = grade_cli(1, tmp_path)
    assert proc.returncode == 1 and report["earned"] == 0 and not report["full_marks"]
    assert "line 1 uses suts.speculative" in report["outcomes"][0]["message"]


LAB2_VARIANTS = {
    "resamples-from-p": ([("            r = r / r.sum() if r.sum() > 0 else p[i]", "            r = p[i]")],
                         {"residual resampling": "draw from the residual"}),
    "ratio-without-min": ([("        if u[i] * float(q[i, d]) >= float(p[i, d]):",
                            "        if not torch.bernoulli(torch.tensor(float(p[i, d] / q[i, d])), "
                            "generator=generator):")],
                          {"acceptance probability": "min(1, p(d)/q(d))"}),
    "target-at-another-temperature": ([("    p = probs(logits, params)", "    p = torch.softmax(logits.float(), -1)")],
                                      {"acceptance probability": "the same parameters q was drawn with"}),
    "hands-sampling-to-the-harness": ([("import Speculative, greedy_prefix", "import Speculative, accept"),
                                       ("    if params.greedy:  # greedy decoding", "    if True:  # greedy decoding"),
                                       ("return greedy_prefix(drafts, logits.argmax(-1).tolist())",
                                        "return accept(drafts, q, logits, params, generator)")],
                                      {"acceptance probability": "handed a sampled case to the harness's own accept",
                                       "residual resampling": "handed a sampled case"}),
    "bonus-token-as-argmax": ([("    return len(drafts), int(torch.multinomial(p[-1], 1, generator=generator))",
                                "    return len(drafts), int(p[-1].argmax())")],
                              {"exact distribution": "not distributed as the target's"}),
    "global-random-numbers": ([("    u = torch.rand(len(drafts), generator=generator).tolist()",
                                "    u = torch.rand(len(drafts)).tolist()")],
                              {"seeded": "different tokens on a second run"}),
}


def test_lab2_fails_a_sampler_whose_decisions_in_a_cycle_share_one_uniform(tmp_path):
    patches = [("    u = torch.rand(len(drafts), generator=generator).tolist()",
                "    u = [float(torch.rand(1, generator=generator))] * len(drafts)")]
    outcomes, earned = grade_variant(2, "shared_uniform", patches, tmp_path)
    assert outcomes["decisions within a cycle"].status == "FAIL" and \
        "share randomness" in outcomes["decisions within a cycle"].message
    assert outcomes["exact distribution"].status == "not run" and earned <= 35


@pytest.mark.parametrize("variant", LAB2_VARIANTS)
def test_lab2_fails_the_known_wrong_samplers(variant, tmp_path):
    """Each wrong sampler fails its own check with its hint, and the inexact ones fail the exact-distribution test
    too, run on its own (a sampler that ignores the generator is exact, and not reproducible). Only those checks
    run; grade_variant holds the full grade's bound."""
    patches, failures = LAB2_VARIANTS[variant]
    exact = variant == "global-random-numbers"
    outcomes, _ = grade_variant(2, variant.replace("-", "_"), patches, tmp_path,
                                only=set(failures) | (set() if exact else {"exact distribution"}))
    for name, message in failures.items():
        assert outcomes[name].status == "FAIL" and message in outcomes[name].message, outcomes[name].message
    assert exact or outcomes["exact distribution"].status == "FAIL"


CONTROLS = {  # correct code written another way: it loses nothing (lab 1's draft without its cache: its speed aside)
    (1, "draft-without-cache"): [
        ("            logits = self.draft(self.tensor(fresh), Chunk(dcache, last_only=True)).logits[0, -1]\n"
         "            fresh = [int(logits.argmax())]\n            drafts.append(fresh[0])",
         "            logits = self.draft(self.tensor(seq.prompt + seq.tokens + drafts)).logits[0, -1]  # no cache\n"
         "            drafts.append(int(logits.argmax()))")],
    (1, "prefix-by-zip-and-clamp"): [
        ("        k = 0\n        while k < len(drafts) and choice[k] == drafts[k]:\n            k += 1\n",
         "        k = next((i for i, (c, d) in enumerate(zip(choice, drafts)) if c != d), len(drafts))\n"),
        ("        dcache.roll_back([seq.length + k])  # at most as many: the draft may be behind",
         "        dcache.lengths.clamp_(max=seq.length + k)  # the lengths written by hand")],
    (2, "unnormalised-residual"): [
        ("            r = r / r.sum() if r.sum() > 0 else p[i]", "            r = r if r.sum() > 0 else p[i]"),
        ("        if u[i] * float(q[i, d]) >= float(p[i, d]):", "        if u[i] * float(q[i, d]) > float(p[i, d]):")],
}
SLOW_CONTROLS = {"draft-without-cache"}  # correct, and too slow for lab 1's speed check


@pytest.mark.parametrize("lab, name", CONTROLS)
def test_correct_code_written_another_way_loses_nothing(lab, name, tmp_path):
    """Lab 1: a draft without its cache; the accepted prefix found by zip and the draft's cache clamped; lab 2: a
    residual that torch.multinomial normalises, and > for >= on an event of probability zero."""
    outcomes, _ = grade_variant(lab, name.replace("-", "_"), CONTROLS[lab, name], tmp_path, bounded=False)
    assert all(o.status == "pass" for o in outcomes.values()), [o.message for o in outcomes.values()]
