"""Instructor-only (left out of the student tree): the reference solutions earn full marks, the starters are
their stripped copies with no solution code left, the release leaves the solutions out, and the known-wrong
variants students write fail with the messages that point at their bug."""
import importlib
from dataclasses import replace
from pathlib import Path

import pytest

from labs import kit
from labs.grading import Fail, Report, grade, load_student
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
    """Lab 1's speed check runs through LoadGen with its gate at 0: whether a 6-prompt run clears 1.4x depends
    on the machine and its load at that moment (the verdict itself is tested below, on fixed figures)."""
    for name in kit.LABS[lab].files:
        (tmp_path / name).write_text(solution(lab, name).read_text())
    proc, report = grade_cli(lab, tmp_path, *(["--gate", "0"] if lab == 1 else []))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert report["full_marks"] and report["earned"] == report["total"] == 100
    assert "(full marks)" in proc.stdout
    if lab == 1:
        assert "x the baseline's" in outcome(report, "LoadGen speed")["message"]


@pytest.mark.parametrize("ratio, passes", [(1.39, False), (1.41, True)])
def test_lab1s_speed_check_applies_its_gate_to_the_ratio_measured(ratio, passes, monkeypatch):
    from labs import lab1
    load_student(solution(1), "reference_lab1")
    name = "reference_lab1:StudentSpeculative"
    figures = {"baseline": {"tokens_per_s": 100.0}, name: {"tokens_per_s": 100.0 * ratio, "roofline": {}}}
    monkeypatch.setattr(lab1, "run_smoke", lambda *args, **kwargs: {"figures": figures, "mismatches": {name: []}})
    speed = next(c for c in lab1.checks("reference_lab1") if c.name == "LoadGen speed >= 1.4x")
    if passes:
        assert f"{ratio:.2f}x the baseline's 100.0" in speed.run()
    else:
        with pytest.raises(Fail, match=f"{ratio:.2f}x the baseline's 100.0 .*; the gate is 1.4x"):
            speed.run()


def test_the_release_leaves_out_the_solutions(tmp_path):
    out = tmp_path / "student"
    assert kit.release(out) > 50
    assert (out / "labs" / "01-speculative" / "starter" / "lab1_speculative.py").is_file()
    assert (out / "labs" / "03-roofline" / "README.md").is_file()
    assert not list(out.glob("labs/*/solution")) and not (out / "tests" / "labs" / "test_solutions.py").exists()
    assert (out / "tests" / "labs" / "test_kit.py").is_file()
    with pytest.raises(ValueError, match="is not empty"):
        kit.release(out)


def test_the_release_refuses_a_tree_that_leaks_a_solution(tmp_path, monkeypatch):
    starter = kit.LABS[2].path / "starter" / "lab2_rejection.py"
    leaked = starter.read_text() + "\n" + next(iter(kit.solution_lines(solution(2).read_text()))) + "\n"
    real_copy = kit.shutil.copy2
    monkeypatch.setattr(kit.shutil, "copy2", lambda src, dest: (real_copy(src, dest), Path(src) == starter
                                                                and Path(dest).write_text(leaked)))
    with pytest.raises(ValueError, match="lab2_rejection.py contains solution code"):
        kit.release(tmp_path / "student")
    assert not (tmp_path / "student").exists()


def grade_variant(lab: int, variant: str, patches: list[tuple[str, str]], tmp_path, alone: str | None = None):
    """Grade the reference with `patches` applied (each must apply). Every check runs as `make grade` runs it,
    except lab 1's LoadGen speed check (the slowest, and these variants never get that far); `alone` names a
    check to run once more on its own, without its prerequisites."""
    source = solution(lab).read_text()
    for old, new in patches:
        assert old in source, f"the reference no longer contains {old!r}: update this variant"
        source = source.replace(old, new)
    path = tmp_path / f"{variant}.py"
    path.write_text(source)
    module = f"variant_lab{lab}_{variant}"
    load_student(path, module)
    checks = importlib.import_module(f"labs.lab{lab}").checks(module)
    report = grade(Report(lab, "", str(path)), [c for c in checks if not c.name.startswith("LoadGen")], path)
    if alone:
        report.outcomes += grade(Report(lab, "", str(path)), [replace(c, name=f"{alone} alone", needs=())
                                                              for c in checks if c.name == alone], path).outcomes
    return {o.name: o for o in report.outcomes}, report.earned


LAB1_VARIANTS = {  # the two (the seed implementation's bugs), then two more students write
    "never-rolls-back": ([("        tcache.lengths[:] = seq.length + k", "        pass"),
                          ("        dcache.lengths[:] = torch.minimum(dcache.lengths, tcache.lengths)\n", "")],
                         {"identical to baseline": "rolled back",  # the tokens differ, or a cache runs ahead
                          "caches rolled back": "roll the target's"}),
    "shifted-positions": ([("choice[k] == drafts[k]", "choice[k + 1] == drafts[k]")],
                          {"identical to baseline": "first difference", "perfect draft accepted": "not logits[i + 1]"}),
    "draft-not-rolled-back": ([("        dcache.lengths[:] = torch.minimum(dcache.lengths, tcache.lengths)\n", "")],
                              {"caches rolled back": "the draft's to at most that"}),
    "accepts-nothing": ([("choice[k] == drafts[k]", "choice[k] == drafts[k:k + 1]")],  # an int against a list
                        {"perfect draft accepted": "every draft must be accepted"}),
}


@pytest.mark.parametrize("variant", LAB1_VARIANTS)
def test_lab1_fails_the_known_wrong_variants(variant, tmp_path):
    patches, failures = LAB1_VARIANTS[variant]
    outcomes, earned = grade_variant(1, variant.replace("-", "_"), patches, tmp_path)
    for name, message in failures.items():
        assert outcomes[name].status == "FAIL" and message in outcomes[name].message, (name, outcomes[name].message)
    if variant in ("never-rolls-back", "shifted-positions"):  # wrong output: no speed points either
        assert earned <= 35


LAB2_VARIANTS = {
    "resamples-from-p": ([("            r = r / r.sum() if r.sum() > 0 else p[i]", "            r = p[i]")],
                         {"residual resampling": "draw from the residual"}),
    "ratio-without-min": ([("        if u[i] * float(q[i, d]) >= float(p[i, d]):",
                            "        if not torch.bernoulli(torch.tensor(float(p[i, d] / q[i, d])), "
                            "generator=generator):")],
                          {"acceptance probability": "min(1, p(d)/q(d))"}),
    "target-at-another-temperature": ([("    p = probs(logits, params)", "    p = torch.softmax(logits.float(), -1)")],
                                      {"acceptance probability": "the same parameters q was drawn with"}),
}


@pytest.mark.parametrize("variant", LAB2_VARIANTS)
def test_lab2_fails_the_known_wrong_samplers(variant, tmp_path):
    """Each wrong sampler scores low, fails its own check with its hint, and fails the exact-distribution test
    even when that test runs on its own."""
    patches, failures = LAB2_VARIANTS[variant]
    outcomes, earned = grade_variant(2, variant.replace("-", "_"), patches, tmp_path, alone="exact distribution")
    for name, message in failures.items():
        assert outcomes[name].status == "FAIL" and message in outcomes[name].message, outcomes[name].message
    assert outcomes["exact distribution"].status == "not run" and earned <= 35
    assert outcomes["exact distribution alone"].status == "FAIL"
