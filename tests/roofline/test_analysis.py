import pytest
import torch

from mlperf.checkpoint import save_checkpoint
from roofline.analysis import analyze, measured_times
from roofline.peaks import fingerprint, load
from tests.helpers import SMALL, peaky_model

PEAKS = {"flops_per_s": 100e9, "bytes_per_s": 10e9}  # ridge at 10 FLOP/byte


def record(n_tokens=33, prefill_s=0.01, decode_s=0.032, drafted=0, accepted=0, cycles=0, draft_s=0.0, verify_s=0.0):
    return dict(index=0, prompt_tokens=20, n_tokens=n_tokens, ttft_s=prefill_s, latency_s=prefill_s + decode_s,
                prefill_s=prefill_s, decode_s=decode_s, cycles=cycles, drafted=drafted, accepted=accepted,
                accepted_hist=[], draft_s=draft_s, verify_s=verify_s)


def metrics(target, records, name="baseline", gamma=None, draft=None):
    return {"config": {"target": str(target), "draft": str(draft or target), "scenario": "SingleStream",
                       "offline_batch": 8}, "samples": records,
            "sut": {"name": name, "gamma": gamma, "dtype": "float32", "batched_offline": name == "baseline"}}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "target"
    save_checkpoint(peaky_model(SMALL, 0), path, dtype=torch.float32)
    return path


def test_measured_times_per_phase():
    times = measured_times([record(), record(decode_s=0.064)], batch=1)
    assert times["prefill"] == pytest.approx(0.01) and times["decode"] == pytest.approx((0.001 + 0.002) / 2)
    spec = measured_times([record(drafted=8, cycles=2, draft_s=0.004, verify_s=0.006)], batch=1)
    assert spec["draft"] == pytest.approx(0.0005) and spec["verify"] == pytest.approx(0.003)
    assert spec["cycle"] == pytest.approx(0.005) and "decode" not in spec


def test_regimes_follow_the_stated_rule(target):
    base = analyze(metrics(target, [record()]), PEAKS)
    decode = base["phases"]["decode"]
    assert decode["intensity"] < base["ridge_flops_per_byte"]
    # a tiny model's 1 ms decode step moves far less than 25% of what the memory roof allows: overhead
    assert decode["fraction_of_roof"] < 0.25 and decode["regime"] == "overhead-bound"
    fast = analyze(metrics(target, [record(decode_s=32 * decode["ideal_seconds"])]), PEAKS)["phases"]["decode"]
    assert fast["fraction_of_roof"] == pytest.approx(1.0) and fast["regime"] == "memory-bound"


def test_speculative_runs_get_the_leviathan_prediction_beside_the_measured_speedup(target):
    baseline = metrics(target, [record()])  # 1 ms per decoded token
    spec = metrics(target, [record(drafted=32, accepted=24, cycles=8, draft_s=32 * 0.0001, verify_s=8 * 0.0015,
                                   decode_s=8 * 0.0019)], name="spec", gamma=4)
    sp = analyze(spec, PEAKS, baseline)["speculative"]
    assert sp["acceptance"] == 0.75 and sp["draft_cost_ratio"] == pytest.approx(0.1)
    assert sp["verify_cost_ratio"] == pytest.approx(1.5)
    assert sp["predicted_speedup"] == pytest.approx((1 - 0.75 ** 5) / 0.25 / 1.9)
    assert sp["measured_speedup"] > 1


def test_peaks_are_measured_once_and_cached(tmp_path):
    first = load(cache=tmp_path / "peaks.json")
    assert first["flops_per_s"] > 1e8 and first["bytes_per_s"] > 1e8
    assert first["fingerprint"] == fingerprint("cpu", torch.float32)
    assert load(cache=tmp_path / "peaks.json") == first  # from the cache, not measured again
