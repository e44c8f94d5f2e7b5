"""The batching model: fitted on batch-1 (and batch-2) runs, it predicts tokens/s at any batch and where spec stops
paying."""
import pytest
import torch

from mlperf.checkpoint import save_checkpoint
from mlperf.model import GEOMETRIES, GPT
from roofline.analytic import phase_costs
from roofline.batching import crossover, fit, roofline_s
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
    spec = record(target, [stats(n_tokens=33, decode_s=0.0, steps=8, cycles=[(4, 4)] * 4 + [(4, 2), (4, 3), (4, 0), (4, 4)],
                                 draft_s=32 * 0.001, verify_s=8 * 0.012)], name="spec", gamma=4)
    return baseline, spec


def test_at_batch_one_the_model_gives_back_what_was_measured(shipped_geometry):
    target, draft = shipped_geometry
    baseline, _ = runs(target)
    model = fit(baseline, GEOMETRIES["target"], None, PEAKS)
    assert model.tokens_per_s(1) == pytest.approx(generation_rate(baseline.stats))


def models(target, device):
    fitted = []
    for r in runs(target):
        r.sut.device = device
        fitted.append(fit(r, GEOMETRIES["target"], GEOMETRIES["draft"], PEAKS))
    return fitted


def test_with_overlap_rows_are_cheap_until_the_verify_pass_turns_compute_bound(shipped_geometry):
    target, _ = shipped_geometry
    baseline, spec = models(target, "cuda")  # a GPU overlaps memory traffic and arithmetic: the roofline's max
    ratio = [spec.tokens_per_s(b) / baseline.tokens_per_s(b) for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    assert ratio[0] > 1.5  # memory-bound: the verify pass costs about a decode step
    assert all(a >= b for a, b in zip(ratio, ratio[1:]))  # every doubling makes verifying drafts relatively dearer
    assert baseline.tokens_per_s(16) > 4 * baseline.tokens_per_s(1)
    cross = crossover(spec, baseline)
    assert cross is not None and spec.tokens_per_s(cross) < baseline.tokens_per_s(cross)
    assert spec.tokens_per_s(cross - 1) >= baseline.tokens_per_s(cross - 1)


def test_without_overlap_batching_gains_less(shipped_geometry):
    """On a CPU core compute and memory take turns: each row adds its arithmetic to the weight reads."""
    target, _ = shipped_geometry
    (cpu_base, cpu_spec), (gpu_base, gpu_spec) = models(target, "cpu"), models(target, "cuda")
    assert cpu_base.tokens_per_s(1) == pytest.approx(gpu_base.tokens_per_s(1))  # both fitted on batch 1
    for b in (2, 8, 32):
        assert cpu_base.tokens_per_s(b) < gpu_base.tokens_per_s(b) and cpu_spec.tokens_per_s(b) < gpu_spec.tokens_per_s(b)


def test_the_model_is_fitted_on_batch_one_only(shipped_geometry):
    target, _ = shipped_geometry
    batched = record(target, [stats(batch=8, decode_s=0.01, steps=32)] * 8, scenario="Offline", batch=8)
    with pytest.raises(ValueError, match="fitted on a batch-1 run, not one at batch 8.0"):
        fit(batched, GEOMETRIES["target"], None, PEAKS)


def test_fitted_on_batch_one_and_two_it_gives_back_both_and_rows_cost_what_batch_two_showed(shipped_geometry):
    """At 2 rows a step takes 10.5 ms, 0.5 ms more than one row, where the roofline adds less: each further row
    costs that factor times its roofline time too."""
    target, _ = shipped_geometry
    one, _ = runs(target)
    two = record(target, [stats(batch=2, decode_s=32 * 0.0105 / 2)] * 2, scenario="Offline", batch=2)
    model = fit(one, GEOMETRIES["target"], None, PEAKS, two)
    assert model.tokens_per_s(1) == pytest.approx(generation_rate(one.stats))
    assert model.tokens_per_s(2) == pytest.approx(generation_rate(two.stats))
    costs = [roofline_s(phase_costs(GEOMETRIES["target"], 20, 36, batch=b)["decode"], PEAKS, False) for b in (1, 2, 8)]
    factor = 0.0005 / (costs[1] - costs[0])
    assert factor > 1 and model.phases["decode"][2] == pytest.approx(factor)
    step = 0.010 + factor * (costs[2] - costs[0])  # at 8 rows
    assert model.tokens_per_s(8) == pytest.approx(33 / (0.01 + 32 * step / 8))
    alone = fit(one, GEOMETRIES["target"], None, PEAKS)
    assert alone.tokens_per_s(8) > model.tokens_per_s(8)  # fitted on batch 1 alone, a row costs its roofline time
    with pytest.raises(ValueError, match="second run is at batch 2, not 1.0"):
        fit(one, GEOMETRIES["target"], None, PEAKS, one)
