"""The runner (suts/fast/runner.py): how a model runs, decided in one place; a greedy step's argmaxes in one fast call
give what the modules' loop gives."""
import copy

import pytest
import torch

from mlperf.chunk import Chunk
from suts.baseline import Baseline
from suts.fast.runner import Runner
from suts.fast.step import Refusal
from suts.speculative import Speculative
from tests.helpers import FP32_ATOL, SMALL
from tests.suts.fast.test_fused import fused_pair, prefilled


@pytest.mark.parametrize("lens", [[1], [3, 1, 2]])
def test_greedy_drafting_in_one_call_takes_the_tokens_a_loop_of_steps_takes(lens):
    """Runner.greedy on the fast path (forward.c's `chain`: argmaxes fed back inside C) against the modules' loop."""
    fused, plain = fused_pair()
    kvs = [prefilled(m, [30, 17, 5][:len(lens)]) for m in (fused, plain)]
    ids = [3, 4, 5, 6, 7, 8][:sum(lens)]
    with torch.inference_mode():
        a, b = (m.greedy(ids, c, lens, 4) for m, c in zip((fused, Runner(plain)), kvs))
    assert a == b and len(a) == len(lens) and all(len(row) == 4 for row in a)
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == [n + k + 3 for n, k in zip([30, 17, 5], lens)]
    ends = kvs[0].lengths.tolist()
    for row, end in enumerate(ends):  # every step's keys, in the row's own slots
        assert torch.allclose(kvs[0].k[:, row, :, :end], kvs[1].k[:, row, :, :end], atol=FP32_ATOL)


@pytest.mark.parametrize("tree", [False, True])
def test_a_greedy_verify_pass_takes_every_tokens_argmax_in_one_call(tree):
    """Runner.argmaxes on the fast path (forward.c's `chain` with every token's outputs: no logits tensor) against the
    argmax of the same forward's logits, for 3 rows of 7 tokens (a chain's verify pass) or 7 nodes (a tree's)."""
    from mlperf.cache import TreeMask
    fused, _ = fused_pair()
    shape = TreeMask.of([-1, 0, 0, 1, 1, 2, 3]) if tree else None
    kvs = [prefilled(fused, [30, 17, 5]) for _ in range(2)]
    ids = torch.randint(0, SMALL.vocab_size, (3, 7), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        got, logits = fused.argmaxes(ids.tolist(), kvs[0], shape), fused(ids, Chunk(kvs[1], tree=shape)).logits
    assert got == logits.argmax(-1).tolist() and len(set(map(tuple, got))) == 3  # the rows' own, each
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == [37, 24, 12]


def test_a_greedy_chain_that_would_run_past_the_context_writes_nothing():
    fused, _ = fused_pair()
    cache = prefilled(fused, [SMALL.block_size - 4])
    before = cache.k.clone()
    with torch.inference_mode(), pytest.raises(ValueError, match="exceeds the model's context"):
        fused.greedy([1, 2], cache, [2], 4)  # 2 tokens and 3 more steps: one past the context
    assert cache.lengths.tolist() == [SMALL.block_size - 4] and torch.equal(cache.k, before)


def test_a_greedy_tokens_way_from_the_scheduler_to_the_kernels_is_at_most_five_calls(pair):
    """Every C call a greedy decode step or speculative cycle makes (a draft's chain, a verify pass's argmaxes, a
    baseline step) is at most 5 Python calls below the scheduler's iteration: step, (verify or the drafter's chain),
    Runner.greedy/argmaxes, FusedStep.greedy/argmaxes, invoke."""
    import sys

    from suts.baseline import Baseline
    from suts.speculative import Speculative
    depths = []

    class Kernel:  # the C library as FusedStep calls it, noting how deep below Scheduler.iterate each call is
        def __init__(self, library):
            self.library = library

        def __getattr__(self, name):
            call = getattr(self.library, name)
            if name not in ("forward", "chain"):
                return call

            def noted(*args):
                frames, frame = [], sys._getframe(1)
                while frame is not None and frame.f_code.co_name != "iterate":
                    frames.append(frame.f_code.co_name)
                    frame = frame.f_back
                if frame is not None and frames[-1] == "step":  # a decode step's, not a prefill's
                    depths.append(len(frames))
                return call(*args)
            return noted

    target, draft = pair
    for sut in (Baseline(target).use_fast_path(), Speculative(target, draft, gamma=3).use_fast_path()):
        if sut.target.fast_step is None:
            pytest.skip("the kernels do not build here")
        for runner in sut.runners():
            runner.fast_step.kernel = Kernel(runner.fast_step.kernel)
        sut.generate([1, 2, 3, 4], 12)
    assert depths and max(depths) <= 5


def test_a_runner_takes_only_a_fast_step_and_says_what_one_lacks():
    """FastStep is checked where a step is set, not where a forward first reaches for a missing attribute."""
    class NoThreads:
        kind, half = "mine", False

        def plan(self, op, ids, chunk):
            return None
    model = fused_pair()[1]
    with pytest.raises(TypeError, match=r"^NoThreads is not a FastStep \(suts/fast/step.py\): it lacks threads, "
                                        r"forward, greedy, argmaxes$"):
        Runner(model, NoThreads())
    assert Runner(model).kind == "modules"


@pytest.mark.parametrize("path, kind", [("graph", "CUDA graphs"), ("fused", "fused C step"), ("modules", "modules")])
def test_each_path_is_forced_in_one_place_and_counts_no_fall_back_where_it_ran(pair, path, kind):
    """use_fast_path(path=...) on a CPU: CUDA graphs through their eager stand-in, the fused C step, or the modules.
    The baseline's and spec's greedy tokens are the modules' baseline's, and where a fast path ran, every forward
    and greedy call of each model ran on it (the run record's `fell_back` is empty)."""
    target, draft = pair
    prompt = [5, 9, 2, 7, 1]
    want = Baseline(target).generate(prompt, 16).tokens
    for sut in (Baseline(copy.deepcopy(target)), Speculative(copy.deepcopy(target), copy.deepcopy(draft), gamma=3)):
        sut.use_fast_path(path=path, min_weights=0)
        if path == "fused" and sut.target.fast_step is None:
            pytest.skip("the kernels do not build here")
        assert sut.generate(prompt, 16).tokens == want
        assert set(sut.paths().values()) == {kind}
        for runner in sut.runners():
            if path == "modules":
                assert runner.tally.steps == 0 and set(runner.tally.fell_back) == {Refusal.NO_STEP}
            else:
                assert runner.tally.steps > 0 and not runner.tally.fell_back
