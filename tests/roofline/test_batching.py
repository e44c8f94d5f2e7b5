"""The batching model: fitted on batch-1 (and batch-2) runs, it predicts tokens/s at any batch and where spec stops
paying."""
import pytest
import torch

from mlperf.checkpoint import save_checkpoint
from mlperf.model import GEOMETRIES, GPT
from roofline.analytic import phase_costs
from roofline.batching import crossover, fit
from roofline.peaks import bandwidth, roofline_s, rows_s
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


def test_rows_arithmetic_runs_at_the_rate_the_runs_prefill_achieved(shipped_geometry):
    """On a CPU, a run whose prefill took twice as long as its FLOPs at the peak costs each row's arithmetic at half
    the peak; one that beat the peak is held to it. A GPU's prefill, bound by its launches, leaves the peak alone."""
    target, _ = shipped_geometry
    prefill = phase_costs(GEOMETRIES["target"], 20, 36)["prefill"].flops
    peak = PEAKS["flops_per_s"]
    for device, prefill_s, rate in (("cpu", 2 * prefill / peak, peak / 2), ("cpu", prefill / peak / 2, peak),
                                    ("cuda", 2 * prefill / peak, peak)):
        run = record(target, [stats(decode_s=32 * 0.010, prefill_s=prefill_s)])
        run.sut.device = device
        model = fit(run, GEOMETRIES["target"], None, PEAKS)
        assert model.peaks["flops_per_s"] == pytest.approx(rate)
        assert model.peaks["bytes_per_s"] == PEAKS["bytes_per_s"]


def test_a_row_adds_its_arithmetic_in_full_while_the_weights_dominate_the_bytes():
    """At 1 and 2 rows of a decode step the weights' stream outweighs the rows' arithmetic, and at the roofs the
    second row adds only its bytes; the batching model's row adds its arithmetic as well (a core does not hide it
    all under the stream), its logits, and its attention, and the shared weights add nothing."""
    one, two = (phase_costs(GEOMETRIES["target"], 270, 300, batch=b)["decode"] for b in (1, 2))
    bytes_s = (two.bytes - one.bytes) / PEAKS["bytes_per_s"]
    assert roofline_s(two, PEAKS) - roofline_s(one, PEAKS) == pytest.approx(bytes_s)
    attention = max(one.attention_flops / PEAKS["flops_per_s"],
                    (one.kv_read_bytes + one.kv_write_bytes) / bandwidth(PEAKS, two.bytes))
    row = one.matmul_flops / PEAKS["flops_per_s"] + one.logits_bytes / bandwidth(PEAKS, two.bytes) + attention
    assert rows_s(two, PEAKS) - rows_s(one, PEAKS) == pytest.approx(row, rel=0.01)


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
    """At 2 rows a step takes 11.5 ms, 1.5 ms more than one row, where a row's arithmetic and bytes add less: each
    further row costs those plus that overhead, a fixed one (not a multiple of what the row adds at the roofs)."""
    target, _ = shipped_geometry
    one, _ = runs(target)
    two = record(target, [stats(batch=2, decode_s=32 * 0.0115 / 2)] * 2, scenario="Offline", batch=2)
    model = fit(one, GEOMETRIES["target"], None, PEAKS, two)
    assert model.tokens_per_s(1) == pytest.approx(generation_rate(one.stats))
    assert model.tokens_per_s(2) == pytest.approx(generation_rate(two.stats))
    costs = [rows_s(phase_costs(GEOMETRIES["target"], 20, 36, batch=b)["decode"], model.peaks) for b in (1, 2, 64)]
    overhead = 0.0015 - (costs[1] - costs[0])
    assert overhead > 0 and model.phases["decode"][2] == pytest.approx(overhead)
    step = 0.010 + (costs[2] - costs[0]) + 63 * overhead  # at 64 rows
    assert model.tokens_per_s(64) == pytest.approx(33 / (0.01 + 32 * step / 64))
    alone = fit(one, GEOMETRIES["target"], None, PEAKS)
    assert alone.tokens_per_s(64) > model.tokens_per_s(64)  # fitted on batch 1 alone, a row costs its roofline time
    with pytest.raises(ValueError, match="second run is at batch 2, not 1.0"):
        fit(one, GEOMETRIES["target"], None, PEAKS, one)
