"""The rules every SUT's answer must keep (suts/base.py: result_problem); the adapter applies them to every
sample of every run (tests/scenarios/test_faults.py)."""
import numpy as np
import pytest

from suts.base import result_problem
from suts.engine.scheduler import Result
from suts.engine.stats import Stats


def answer(tokens):
    return Result(tokens, Stats())


@pytest.mark.parametrize("tokens, problem", [
    ([5, 6, 7, 8], None),
    ([5, 0], None),  # stopped at EOS
    ([0], None),  # EOS first: one token is a whole answer
    (list(np.array([5, 6, 7, 8])), None),  # numpy integers are token ids too
    ([], "no tokens"),
    ([5, 6, 7, 8, 9], "5 tokens, more than max_new_tokens (4)"),
    ([5, 61, 7, 8], "token id 61, outside the vocabulary (0..60)"),
    ([5, -1, 7, 8], "token id -1, outside the vocabulary (0..60)"),
    ([5, 0, 7, 8], "tokens after EOS (EOS at position 1 of 4)"),
    ([5, 6], "2 tokens of 4, not ending at EOS"),
    ([5, 6.0, 7, 8], "token ids that are not integers"),
    ([5, True, 7, 8], "token ids that are not integers"),
])
def test_each_rule_an_answer_must_keep(tokens, problem):
    assert result_problem(answer(tokens), max_new_tokens=4, vocab_size=61, eos_id=0) == problem


def test_an_answer_that_is_not_a_result_is_named():
    assert result_problem(None, 4, 61, 0) == "NoneType instead of a Result (token ids and Stats)"
    assert result_problem([5, 6, 7, 8], 4, 61, 0) == "list instead of a Result (token ids and Stats)"
    assert result_problem(answer([5, 6]), 4, 61, eos_id=None) == "2 tokens of 4, not ending at EOS"  # no EOS
