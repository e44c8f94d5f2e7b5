import ast
from pathlib import Path

import torch

from suts.fast.step import Refusal
from tests.suts.fast.test_fused import fused_pair

FAST = Path(__file__).resolve().parents[3] / "suts" / "fast"
DECIDE = {"plan", "refuses", "unlike"}  # where a fast step says whether it runs a chunk


def test_every_refusal_is_one_reason_from_the_table():
    """No step words its own reason: each `plan` (and the span checks it asks) returns a Plan, None or a Refusal,
    never a string of its own; so the run record's reasons are the table's, whatever step gave them."""
    worded = []
    for path in sorted(FAST.glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef) and fn.name in DECIDE:
                worded += [f"{path.name}:{r.lineno}" for r in ast.walk(fn) if isinstance(r, ast.Return) and (
                    isinstance(r.value, ast.JoinedStr) or isinstance(r.value, ast.Constant) and isinstance(
                        r.value.value, str))]
    assert not worded, f"reasons worded outside suts/fast/step.py's Refusal: {worded}"


def test_a_fall_back_is_counted_under_the_table_s_words():
    runner, _ = fused_pair()
    with torch.inference_mode():
        runner(torch.zeros(1, 3, dtype=torch.long))  # a whole sequence: no cache, so no fast step runs it
    assert runner.tally.asdict() == {"steps": 0, "fell_back": {Refusal.NO_CACHE.value: 1}}
    assert runner.tally.summary() == "0 steps, 1 fell back (a whole sequence (no cache) 1)"
