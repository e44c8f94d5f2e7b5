"""The batching model: fitted on batch-1 (and batch-2) runs, it predicts tokens/s at any batch and where spec stops
paying."""
import pytest
import torch

from mlperf.checkpoint import save_checkpoint
from mlperf.model import GEOMETRIES, GPT
from roofline.analytic import phase_costs
from roofline.batching import crossover, fit
from roofline.peaks import bandwidth, in_turn_s, roofline_s
from roofline.speculative import generation_rate
from tests.roofline.test_analysis import PEAKS, record
from tests.roofline.test_speculative import stats


@pytest.fixture(scope="module")
def shipped_geometry(tmp_path_factory):
    """Checkpoints with the shipped pair's geometry (random weights: only the shapes matter here)."""
    root = tmp_path_factory.mktemp("geometry")
    for name in ("target", "draft"):
        save_checkpoint(GPT(GEOMETRIES[name]), root / name, dtype=torch.float32)
    return root / "target", root / "draft"


def runs(target):
    """Batch-1 runs: baseline 10 ms a step; spec at alpha 0.8 with a 1 ms draft step and a 12 ms verify pass."""
    baseline = record(target, [stats(decode_s=32 * 0.010)])
    spec = record(target, [stats(n_tokens=33, decode_s=32 * 0.001 + 8 * 0.012, steps=8, draft_s=32 * 0.001,
                                 verify_s=8 * 0.012, cycles=[(4, 4)] * 4 + [(4, 2), (4, 3), (4, 0), (4, 4)])],
                  name="spec", gamma=4)
    return baseline, spec


def models(target):
    return [fit(r, GEOMETRIES["target"], GEOMETRIES["draft"], PEAKS) for r in runs(target)]


def test_at_batch_one_the_model_gives_back_what_was_measured(shipped_geometry):
    """Spec's cycles emit the tokens the run measured (33 in 8 cycles, where one alpha would predict fewer), at the
    times it measured."""
    target, _ = shipped_geometry
    for run, model in zip(runs(target), models(target)):
        assert model.tokens_per_s(1) == pytest.approx(generation_rate(run.stats))
    assert models(target)[1].tokens_per_cycle == 32 / 8


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_phase_below_compute_plus_memory_time_is_kept_as_measured(shipped_geometry, device):
    """A CPU core overlaps a linear's weight stream with its arithmetic: a verify pass that takes less than its FLOPs
    and its bytes in turn would (but more than its linears and its attention in turn) is not raised to their sum."""
    target, _ = shipped_geometry
    costs = phase_costs(GEOMETRIES["target"], 20, 36, GEOMETRIES["draft"], gamma=4)
    compute, memory = costs["verify"].flops / PEAKS["flops_per_s"], costs["verify"].bytes / PEAKS["bytes_per_s"]
    verify_s = max(compute, memory) + 0.5 * min(compute, memory)
    spec = record(target, [stats(n_tokens=33, decode_s=0.032 + 8 * verify_s, steps=8, cycles=[(4, 4)] * 8,
                                 draft_s=0.032, verify_s=8 * verify_s)], name="spec", gamma=4)
    spec.sut.device = device
    model = fit(spec, GEOMETRIES["target"], GEOMETRIES["draft"], PEAKS)
    assert roofline_s(costs["verify"], PEAKS) <= in_turn_s(costs["verify"], PEAKS) < verify_s < compute + memory
    assert model.phases["verify"][1] == pytest.approx(verify_s)
    assert model.tokens_per_s(1) == pytest.approx(generation_rate(spec.stats))


def test_a_forward_costs_its_linears_and_its_attention_in_turn():
    """At 64 rows of 270 tokens of context the linears are bound by their arithmetic and attention by its KV cache
    reads, and the kernels run them one after the other: the two add up, where the forward's roofline time is the
    longer of its FLOPs and its bytes. At one row the weights' stream outweighs everything and the two agree."""
    one, many = (phase_costs(GEOMETRIES["target"], 270, 300, batch=b)["decode"] for b in (1, 64))
    kv_s = (many.kv_read_bytes + many.kv_write_bytes) / bandwidth(PEAKS, many.bytes)
    assert in_turn_s(many, PEAKS) == pytest.approx(many.matmul_flops / PEAKS["flops_per_s"] + kv_s)
    assert in_turn_s(many, PEAKS) > 1.2 * roofline_s(many, PEAKS)
    assert in_turn_s(one, PEAKS) == pytest.approx(roofline_s(one, PEAKS))


def test_rows_are_cheap_until_the_verify_pass_turns_compute_bound(shipped_geometry):
    target, _ = shipped_geometry
    baseline, spec = models(target)
    ratio = [spec.tokens_per_s(b) / baseline.tokens_per_s(b) for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    assert ratio[0] > 1.5  # memory-bound: the verify pass costs about a decode step
    assert all(a >= b for a, b in zip(ratio, ratio[1:]))  # every doubling makes verifying drafts relatively dearer
    assert baseline.tokens_per_s(16) > 4 * baseline.tokens_per_s(1)
    cross = crossover(spec, baseline)
    assert cross is not None and spec.tokens_per_s(cross) < baseline.tokens_per_s(cross)
    assert spec.tokens_per_s(cross - 1) >= baseline.tokens_per_s(cross - 1)


def test_the_model_is_fitted_on_batch_one_only(shipped_geometry):
    target, _ = shipped_geometry
    batched = record(target, [stats(batch=8, decode_s=0.01, steps=32)] * 8, scenario="Offline", batch=8)
    with pytest.raises(ValueError, match="fitted on a batch-1 run, not one at batch 8.0"):
        fit(batched, GEOMETRIES["target"], None, PEAKS)


def test_fitted_on_batch_one_and_two_it_gives_back_both_and_rows_cost_what_batch_two_showed(shipped_geometry):
    """At 2 rows a step takes 10.5 ms, 0.5 ms more than one row, where the roofline adds less: each further row
    costs its own roofline time plus that overhead, a fixed one (not a multiple of its roofline time, which grows
    from row to row once the rows' arithmetic or cache reads outweigh the weights)."""
    target, _ = shipped_geometry
    one, _ = runs(target)
    two = record(target, [stats(batch=2, decode_s=32 * 0.0105 / 2)] * 2, scenario="Offline", batch=2)
    model = fit(one, GEOMETRIES["target"], None, PEAKS, two)
    assert model.tokens_per_s(1) == pytest.approx(generation_rate(one.stats))
    assert model.tokens_per_s(2) == pytest.approx(generation_rate(two.stats))
    costs = [in_turn_s(phase_costs(GEOMETRIES["target"], 20, 36, batch=b)["decode"], PEAKS) for b in (1, 2, 64)]
    overhead = 0.0005 - (costs[1] - costs[0])
    assert overhead > 0 and model.phases["decode"][2] == pytest.approx(overhead)
    assert costs[2] - costs[1] > 62 * 2 * (costs[1] - costs[0])  # compute-bound: rows 3 to 64 add twice row 2's
    step = 0.010 + (costs[2] - costs[0]) + 63 * overhead  # at 64 rows
    assert model.tokens_per_s(64) == pytest.approx(33 / (0.01 + 32 * step / 64))
    alone = fit(one, GEOMETRIES["target"], None, PEAKS)
    assert alone.tokens_per_s(64) > model.tokens_per_s(64)  # fitted on batch 1 alone, a row costs its roofline time
    with pytest.raises(ValueError, match="second run is at batch 2, not 1.0"):
        fit(one, GEOMETRIES["target"], None, PEAKS, one)
