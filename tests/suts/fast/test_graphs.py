from dataclasses import dataclass

import pytest
import torch

from mlperf.chunk import Chunk
from mlperf.model import GPT
from suts.baseline import Baseline
from suts.base import GREEDY
from suts.fast.graphs import Graph, GraphStep, Replayed, StaticCache, pool_rows
from suts.fast.runner import Runner
from tests.helpers import fast_runner
from suts.fast.quantize import quantize_int8
from suts.speculative import Speculative
from tests.helpers import SMALL, peaky_model, perturbed



@dataclass(frozen=True)
class Where:
    """Where a test's graphs run: captured on a GPU, or their eager stand-in on the CPU, with the same bookkeeping."""
    device: str
    capture: type
    half: torch.dtype  # a SUT's models' dtype there: fp16 on a GPU, fp32 on a CPU

    def step(self, model: GPT) -> GraphStep:
        return GraphStep(model, self.capture)

    def graphed(self, sut):
        """The SUT with every GPT of its on graph steps: its fast path on a GPU, the stand-in's steps on a CPU."""
        return sut.use_fast_path(path="graph")


@pytest.fixture(params=["cpu", "cuda"])
def on(request) -> Where:
    """Each graph test on a CPU through the eager stand-in (every machine, CI's included), and on a GPU where there
    is one."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA graphs need a GPU")
    if request.param == "cuda":
        return Where("cuda", Graph, torch.float16)
    return Where("cpu", Replayed, torch.float32)


def prefilled(model: GPT, lengths: list[int]):
    """A cache whose rows hold random prompts of these lengths."""
    torch.manual_seed(1)
    cache = model.new_cache(len(lengths))
    model(torch.randint(0, SMALL.vocab_size, (len(lengths), max(lengths)), device=cache.k.device), Chunk(cache))
    cache.lengths[:] = torch.tensor(lengths)
    return cache


@pytest.mark.parametrize("T", [1, 4])
def test_the_static_cache_gives_the_modules_forward(T):
    """What a graph captures (positions, mask and cache writes from lengths on the device) is the forward the
    KV cache gives, rows at different lengths included (CPU: no graph, the same modules)."""
    torch.manual_seed(0)
    model = GPT(SMALL).eval()
    lengths = [10, 7, 9]
    ref, static = prefilled(model, lengths), prefilled(model, lengths)
    idx = torch.randint(0, SMALL.vocab_size, (3, T))
    with torch.inference_mode():
        want = model(idx, Chunk(ref)).logits
        got, _ = model(idx, Chunk(StaticCache(static.k, static.v, static.lengths.clone(), T, 32), features=True))
    assert torch.allclose(got, want, atol=1e-5)
    for b, n in enumerate(ref.lengths.tolist()):  # the chunk's keys went to each row's own slots
        assert torch.allclose(static.k[:, b, :, :n], ref.k[:, b, :, :n], atol=1e-6)


def test_a_running_batch_is_widened_to_the_pools_next_rows():
    """Rows 0-4 of a pool of 8 widen to rows 0-7, the pool's own memory; not past the pool's end, nor onto a row
    whose length leaves no room for the chunk."""
    cache = GPT(SMALL).new_cache(8)
    cache.lengths[:] = torch.arange(8) * 10
    k, v, lengths = pool_rows(cache.rows(0, 5), 8, 100)
    assert torch.equal(k, cache.k) and torch.equal(v, cache.v) and k.data_ptr() == cache.k.data_ptr()
    assert lengths.tolist() == list(range(0, 80, 10))
    lengths[0] = 5  # the same lengths, not a copy
    assert cache.lengths[0] == 5
    assert pool_rows(cache.rows(2, 5), 4, 100)[2].tolist() == [20, 30, 40, 50]
    assert pool_rows(cache.rows(5, 8), 4, 100)[2].tolist() == [50, 60, 70]  # the pool ends
    assert pool_rows(cache.rows(0, 5), 8, 60)[2].tolist() == [5, 10, 20, 30, 40]  # row 7 (70) is too long


def test_graphs_are_for_cuda_models_only():
    assert not isinstance(fast_runner(GPT(SMALL)).fast_step, GraphStep)


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # fp16: attention in the split-key kernel
def test_a_replayed_step_matches_the_modules(T, dtype, on):
    torch.manual_seed(0)
    model = GPT(SMALL).to(on.device, dtype).eval()
    lengths = [12, 5, 9]
    ref, graphed = prefilled(model, lengths), prefilled(model, lengths)
    step = on.step(model)
    with torch.inference_mode():
        for _ in range(3):  # the first call captures, the next ones replay
            idx = torch.randint(0, SMALL.vocab_size, (3, T), device=on.device)
            want = model(idx, Chunk(ref)).logits
            got = Runner(model, step)(idx, Chunk(graphed)).logits
            assert torch.allclose(got, want, atol=1e-4 if dtype == torch.float32 else 1e-2)
            assert torch.equal(graphed.lengths, ref.lengths)
    assert len(step.graphs) == 1


def test_three_running_rows_replay_the_graph_of_four(on):
    """The pool's fourth row pads the batch: the three rows get the modules' logits, and the fourth keeps its
    length and every key below it."""
    torch.manual_seed(0)
    model = GPT(SMALL).to(on.device).eval()
    ref, graphed = prefilled(model, [12, 5, 9, 7]), prefilled(model, [12, 5, 9, 7])
    kept = graphed.k[:, 3, :, :7].clone()
    step = on.step(model)
    with torch.inference_mode():
        for _ in range(2):
            idx = torch.randint(0, SMALL.vocab_size, (3, 2), device=on.device)
            want = model(idx, Chunk(ref.rows(0, 3))).logits
            assert torch.allclose(Runner(model, step)(idx, Chunk(graphed.rows(0, 3))).logits, want, atol=1e-4)
    assert graphed.lengths.tolist() == ref.lengths.tolist() == [16, 9, 13, 7]
    assert torch.equal(graphed.k[:, 3, :, :7], kept)
    assert [key[0].rows for key in step.graphs] == [4]


def test_a_batch_of_finishing_rows_is_lossless_with_graphs(on):
    """Five prompts through a pool of four, rows finishing at different cycles: the batch shrinks, and each step
    replays a graph of a power of two of rows."""
    target = peaky_model(SMALL, 0).to(on.device, on.half)
    draft = perturbed(target, 1, 0.3).to(on.device, on.half)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15], [16, 17, 18, 19, 20]]
    want = [Baseline(target).generate(p, 24).tokens for p in prompts]
    for sut in (on.graphed(Baseline(target)), on.graphed(Speculative(target, draft, gamma=3))):
        assert set(sut.paths().values()) == {"CUDA graphs"}
        assert [r.tokens for r in sut.generate_batch(prompts, 24, [GREEDY] * 5, 4)] == want
        assert all(key[0].rows & (key[0].rows - 1) == 0 for key in sut.target.fast_step.graphs)


def test_a_prefill_is_padded_into_a_bucket_and_gives_the_modules_logits(on):
    torch.manual_seed(0)
    model = GPT(SMALL).to(on.device).eval()
    step = on.step(model)
    for n in (70, 100):  # one bucket of 128 tokens serves both
        ref, graphed = model.new_cache(1), model.new_cache(1)
        idx = torch.randint(0, SMALL.vocab_size, (1, n), device=on.device)
        with torch.inference_mode():
            want = model(idx, Chunk(ref, last_only=True, lens=[n])).logits
            got = Runner(model, step)(idx, Chunk(graphed, last_only=True, lens=[n])).logits
            assert torch.allclose(got, want, atol=1e-4)
        assert graphed.lengths.tolist() == [n]
        assert torch.allclose(graphed.k[:, :, :, :n], ref.k[:, :, :, :n], atol=1e-5)
    assert len(step.graphs) == 1


def test_a_graphed_greedy_chain_equals_its_steps(on):
    torch.manual_seed(0)
    model = GPT(SMALL).to(on.device).eval()
    ref, graphed = prefilled(model, [6, 6]), prefilled(model, [6, 6])
    ids = torch.randint(0, SMALL.vocab_size, (4,)).tolist()
    with torch.inference_mode():
        want = Runner(model).greedy(ids, ref, [2, 2], 4)
        assert Runner(model, on.step(model)).greedy(ids, graphed, [2, 2], 4) == want
    assert torch.equal(graphed.lengths, ref.lengths)


def test_a_greedy_verify_pass_runs_from_its_graph_and_counts_no_fall_back(on):
    """A verify pass's argmaxes come from the replayed forward's logits: one step counted, no fall-back, the
    modules' argmaxes."""
    torch.manual_seed(0)
    model = GPT(SMALL).to(on.device).eval()
    ref, graphed = prefilled(model, [6, 6]), prefilled(model, [6, 6])
    rows = torch.randint(0, SMALL.vocab_size, (2, 4)).tolist()
    runner = Runner(model, on.step(model))
    with torch.inference_mode():
        assert runner.argmaxes(rows, graphed) == Runner(model).argmaxes(rows, ref)
    assert runner.tally.steps == 1 and not runner.tally.fell_back
    assert torch.equal(graphed.lengths, ref.lengths)


def test_a_new_cache_pool_gets_new_graphs(on):
    """A SUT's pool grows (a larger batch): graphs of the old one are dropped, and new ones captured."""
    torch.manual_seed(0)
    model = GPT(SMALL).to(on.device).eval()
    step = on.step(model)
    for rows in (1, 2, 1, 3):
        ref, graphed = prefilled(model, [5] * rows), prefilled(model, [5] * rows)
        idx = torch.randint(0, SMALL.vocab_size, (rows, 1), device=on.device)
        with torch.inference_mode():
            got, want = Runner(model, step)(idx, Chunk(graphed)).logits, model(idx, Chunk(ref)).logits
            assert torch.allclose(got, want, atol=1e-4)
        assert len(step.graphs) == 1


def test_a_graph_refuses_a_context_too_long_and_writes_nothing(on):
    model = GPT(SMALL).to(on.device).eval()
    cache = prefilled(model, [SMALL.block_size - 1])
    step = on.step(model)
    with pytest.raises(ValueError, match="exceeds"), torch.inference_mode():
        Runner(model, step)(torch.zeros(1, 2, dtype=torch.long, device=on.device), Chunk(cache))
    assert cache.lengths.tolist() == [SMALL.block_size - 1] and not step.graphs


@pytest.mark.parametrize("quantized", [False, True])
def test_speculative_decoding_is_lossless_with_graphs(quantized, on):
    target = peaky_model(SMALL, 0).to(on.device, on.half)  # far from ties, which fp16's kernels could break either way
    draft = perturbed(target, 1, 0.3).to(on.device, on.half)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]]
    want = [Baseline(target).generate(p, 24).tokens for p in prompts]
    sut = on.graphed(Speculative(target, quantize_int8(draft) if quantized else draft, gamma=3))
    assert sut.paths() == {"target": "CUDA graphs", "draft": "CUDA graphs"}
    assert [sut.generate(p, 24).tokens for p in prompts] == want
    assert sut.target.fast_step.graphs and sut.draft.fast_step.graphs
