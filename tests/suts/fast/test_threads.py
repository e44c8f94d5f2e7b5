import pytest
import torch

from suts.fast.runner import Runner
from suts.fast.threads import ROUNDS, ThreadPicker, candidates, describe, kept_threads


@pytest.mark.parametrize("most, counts", [(1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (15, [1, 2, 4, 8, 15])])
def test_the_counts_tried_are_the_powers_of_two_below_the_most_and_the_most(most, counts):
    assert candidates(most) == counts


def test_each_count_is_timed_on_a_streak_and_the_fastest_by_median_is_kept():
    picker, size, seen = ThreadPicker(), ThreadPicker.size(7, 1), []
    slow = {1: 3.0, 2: 1.0, 4: 2.0, 8: 5.0}
    for call in range(4 * (ROUNDS + 1)):
        n = picker.pick(size, 8)
        first = not seen or seen[-1] != n
        seen.append(n)
        stall = 100.0 if first and n == 2 or call == ROUNDS + 2 else 0.0  # a streak's first call, and one more stall
        picker.record(size, 8, n, slow[n] + stall)
    assert seen == [n for n in (1, 2, 4, 8) for _ in range(ROUNDS + 1)]  # a streak each, so no switch is timed
    assert picker.pick(size, 8) == 2 and picker.best == {(size, 8): 2}  # neither stall counted against 2
    picker.record(size, 8, 2, 99.0)  # once kept, a count stays
    assert picker.pick(size, 8) == 2


def test_sizes_and_thread_budgets_are_picked_apart():
    picker = ThreadPicker()
    for n in (1, 2) * (ROUNDS + 1):
        picker.record(picker.size(1, 1), 2, n, 1.0 if n == 1 else 2.0)
    assert picker.pick(picker.size(1, 1), 2) == 1
    assert picker.size(5, 1) == picker.size(8, 1) != picker.size(9, 1)  # tokens rounded up to a power of two
    assert picker.size(1, 2) == picker.size(1, 6) != picker.size(1, 1)  # a chain of any length: one size
    assert picker.pick(picker.size(1, 6), 2) == 1 and (picker.size(1, 6), 2) not in picker.best
    assert picker.pick(picker.size(1, 1), 4) == 1 and (picker.size(1, 1), 4) not in picker.best  # more threads


def test_a_single_thread_is_never_timed():
    picker = ThreadPicker()
    picker.record(picker.size(1, 1), 1, 1, 1.0)
    assert picker.pick(picker.size(1, 1), 1) == 1 and picker.times == {} and picker.best == {}


def test_every_count_is_timed_again_after_repick_calls_on_the_kept_one(monkeypatch):
    """What a count gets changes within a run (LoadGen's threads start after the warm-up): a kept count that has
    turned slow is dropped at the next trials."""
    monkeypatch.setattr("suts.fast.threads.REPICK", 5)
    picker, size = ThreadPicker(), ThreadPicker.size(1, 1)

    def trials(slow: int) -> None:
        while True:
            n = picker.pick(size, 2)
            picker.record(size, 2, n, 2.0 if n == slow else 1.0)
            if (size, 2) in picker.best:
                return

    trials(slow=2)
    assert [picker.pick(size, 2) for _ in range(5)] == [1] * 5
    trials(slow=1)  # the sixth call starts the trials again
    assert picker.best == {(size, 2): 2}


class Picking:
    """A fast step that only picks threads: what kept_threads reads of one."""
    kind, half = "picking", False

    def __init__(self, threads: ThreadPicker):
        self.threads = threads

    def plan(self, op, ids, chunk):
        return "never"

    forward = greedy = argmaxes = plan


def test_kept_counts_are_named_by_size_and_described_by_role():
    picker = ThreadPicker()
    for size, fast in ((picker.size(1, 1), 2), (picker.size(7, 1), 1), (picker.size(1, 6), 2)):
        for n in (1, 2) * (ROUNDS + 1):
            picker.record(size, 2, n, 1.0 if n == fast else 2.0)
    assert picker.kept() == {"1 token": 2, "1-token chains": 2, "8 tokens": 1}
    assert kept_threads({"target": Runner(torch.nn.Identity(), Picking(picker)), "draft": None,
                         "head": Runner(torch.nn.Identity())}) == {
        "target 1 token": 2, "target 1-token chains": 2, "target 8 tokens": 1}
    assert describe({"target 1 token": 2, "target 8 tokens": 1, "target 64 tokens": 2, "draft 1 token": 1,
                     "draft 2 tokens": 1}) == \
        "target: 1 thread for 8 tokens; 2 for 1 token, 64 tokens | draft: 1 thread for all 2 sizes"
