import json
import time

import pytest
import torch

from mlperf.checkpoint import read_config, save_checkpoint
from mlperf.cost import Cost
from roofline.analysis import Roofline, analyze, matching_baseline, measured_times
from roofline.analytic import phase_costs
from roofline.peaks import PUSH_OUT_BYTES, bandwidth, draft_roofline_s, fingerprint, judged, load, roofline_s
from scenarios.config import RunConfig
from scenarios.records import RunRecord, SampleRecord, SUTInfo
from tests.helpers import SMALL, peaky_model
from tests.roofline.test_speculative import stats

PEAKS = {"flops_per_s": 100e9, "bytes_per_s": 10e9}  # ridge at 10 FLOP/byte


def record(target, samples, name="baseline", gamma=None, scenario="SingleStream", batch=1) -> RunRecord:
    return RunRecord(config=RunConfig(sut=name, scenario=scenario, target=str(target), draft=str(target)),
                     sut=SUTInfo(name, "x", "float32", "cpu", gamma, batch), machine="m", torch_threads=1,
                     versions={}, loadgen_model="llm", settings={}, calibration=None, wall_s=1.0, error=None,
                     samples=[SampleRecord(i, 20, 0.01, 0.05, s) for i, s in enumerate(samples)])


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "target"
    save_checkpoint(peaky_model(SMALL, 0), path, dtype=torch.float32)
    return path


def test_measured_times_per_phase():
    times = measured_times([stats(), stats(decode_s=0.064)])
    assert times["prefill"] == (pytest.approx(0.01), 1) and times["decode"] == (pytest.approx(0.096 / 64), 1)
    spec = measured_times([stats(cycles=[(4, 3), (4, 1)], draft_s=0.004, verify_s=0.006)])
    assert spec["draft"][0] == pytest.approx(0.0005) and spec["verify"][0] == pytest.approx(0.003)
    assert spec["cycle"][0] == pytest.approx(0.005) and "decode" not in spec
    batched = measured_times([stats(batch=8, decode_s=0.01, steps=32)] * 8)
    assert batched["decode x8"] == (pytest.approx(0.0025), 8) and "decode" not in batched
    spec8 = measured_times([stats(batch=8, steps=2, cycles=[(4, 3), (4, 1)], draft_s=0.004, verify_s=0.006)] * 8)
    assert spec8["verify x8"] == (pytest.approx(8 * 0.003), 8)  # each row carries 1/8 of every shared forward


def test_regimes_follow_the_stated_rule(target):
    base = analyze(record(target, [stats()]), PEAKS)
    decode = base.phases["decode"]
    assert decode.intensity < base.ridge_flops_per_byte
    # a tiny model's 1 ms decode step moves far less than 25% of what the memory roof allows: overhead
    assert decode.fraction_of_roof < 0.25 and decode.regime == "overhead-bound"
    fast = analyze(record(target, [stats(decode_s=32 * decode.ideal_seconds)]), PEAKS).phases["decode"]
    assert fast.fraction_of_roof == pytest.approx(1.0) and fast.regime == "memory-bound"
    assert not base.implausible()
    too_fast = analyze(record(target, [stats(decode_s=16 * decode.ideal_seconds)]), PEAKS)
    assert too_fast.implausible() == ["decode"]  # twice the memory roof: the cached peak must be wrong


def test_fp16_weights_read_faster_than_they_are_widened_are_held_to_the_widening_rate(target):
    """A decode step over fp16 weights: its roof is their bytes at the widening rate where that is the slowest of
    the three, and the phase is then widening-bound; without a measured rate nothing changes."""
    from dataclasses import replace
    half = record(target, [stats()])
    half = replace(half, sut=replace(half.sut, target_weight_bytes=2))
    plain = analyze(half, PEAKS).phases["decode"]
    cost = phase_costs(read_config(target)[0], 20, round(20 + 33 / 2), target_weight_bytes=2)["decode"]  # analyze's
    assert cost.widened_bytes > 0 and roofline_s(cost, PEAKS) == pytest.approx(cost.bytes / PEAKS["bytes_per_s"])
    slow = {**PEAKS, "widen_bytes_per_s": cost.widened_bytes / (2 * roofline_s(cost, PEAKS))}  # twice the memory time
    assert roofline_s(cost, slow) == pytest.approx(2 * roofline_s(cost, PEAKS))
    at_roof = replace(half, samples=[replace(s, stats=stats(decode_s=64 * plain.ideal_seconds)) for s in half.samples])
    timed = analyze(at_roof, slow).phases["decode"]
    assert timed.ideal_seconds == pytest.approx(2 * plain.ideal_seconds) and timed.fraction_of_roof == pytest.approx(1)
    assert timed.regime == "widening-bound" and analyze(at_roof, PEAKS).phases["decode"].regime == "memory-bound"
    fast = {**PEAKS, "widen_bytes_per_s": 1e15}
    assert roofline_s(cost, fast) == roofline_s(cost, PEAKS)


def test_a_lookup_drafts_in_host_time_and_its_verify_is_costed(target):
    """ngram drafts without a model: its draft step has no FLOPs or bytes, so all its time is overhead."""
    from dataclasses import replace
    plain = record(target, [stats(cycles=[(4, 3), (0, 0), (2, 2)], draft_s=0.0001, verify_s=0.006)], "ngram", 4)
    lookup = replace(plain, sut=replace(plain.sut, drafter="lookup"))
    assert lookup.draft_config() is None and plain.draft_config() is not None
    roof = analyze(lookup, PEAKS)
    draft, verify = roof.phases["draft"], roof.phases["verify"]
    assert draft.flops == draft.bytes == draft.fraction_of_roof == 0 and draft.regime == "overhead-bound"
    assert verify.flops > 0 and roof.phases["cycle"].flops == verify.flops
    assert not roof.implausible()


def test_a_batched_run_is_costed_at_its_batch_and_its_tokens_per_second_counts_each_step_once(target):
    rows = [stats(batch=8, decode_s=0.01, steps=32) for _ in range(8)]
    one, eight = (analyze(record(target, r, scenario="Offline", batch=b), PEAKS)
                  for r, b in ([[stats()], 1], [rows, 8]))
    assert eight.phases["decode x8"].flops == pytest.approx(8 * one.phases["decode"].flops, rel=1e-3)
    assert eight.tokens_per_s == pytest.approx(8 * 33 / 0.16)


def test_speculative_runs_get_the_prediction_only_against_a_matching_baseline(target):
    baseline = record(target, [stats()])  # 1 ms per decoded token
    spec = record(target, [stats(n_tokens=1 + 32, decode_s=8 * 0.0019, steps=8, cycles=[(4, 3)] * 8,
                                 draft_s=32 * 0.0001, verify_s=8 * 0.0015)], name="spec", gamma=4)
    sp = analyze(spec, PEAKS, baseline).speculative
    assert sp.acceptance_rate == 0.75 and sp.alpha == 0.75 and sp.draft_cost_ratio == pytest.approx(0.1)
    assert sp.verify_cost_ratio == pytest.approx(1.5) and sp.tokens_per_cycle == 4
    assert sp.measured_speedup == pytest.approx(32 / (8 * 0.0019) / 1000)
    assert "no baseline run matches" in analyze(spec, PEAKS).no_baseline
    # the pair's ceiling here: its measured tokens a cycle over the cycle's cost at the roof, in decode steps there
    roof = analyze(spec, PEAKS, baseline)
    context = roof.mean_prompt_tokens + round(roof.mean_new_tokens / 2)
    decode_at_roof = roofline_s(phase_costs(read_config(target)[0], 0, context)["decode"], PEAKS)
    assert sp.roof_cycle_steps == pytest.approx(roof.phases["cycle"].ideal_seconds / decode_at_roof)
    assert sp.roof_cycle_steps > 1 and sp.ceiling_speedup == pytest.approx(4 / sp.roof_cycle_steps)


def test_the_comparison_key_separates_runs_that_differ_in_what_changes_the_figure(target):
    a = record(target, [stats()])
    assert a.comparison_key() == record(target, [stats()], name="spec").comparison_key()
    assert a.comparison_key() != record(target, [stats()], batch=8).comparison_key()
    retrained = record(target, [stats()])  # the same path, other weights
    a.checkpoints, retrained.checkpoints = {"target": "0123"}, {"target": "4567"}
    assert a.comparison_key() != retrained.comparison_key()
    server = record(target, [stats()], scenario="Server")
    other = record(target, [stats()], scenario="Server")
    server.settings, other.settings = {"target_qps": "0.4"}, {"target_qps": "0.8"}
    assert server.comparison_key() != other.comparison_key()


def test_a_baseline_written_by_an_older_harness_is_passed_over(target, tmp_path):
    spec = record(target, [stats()], name="spec")
    spec.config.results = str(tmp_path)
    runs = spec.config.results_of("baseline", mode="performance")
    good, old = runs / "20260101-000000", runs / "20260102-000000"
    for run in (good, old):
        run.mkdir(parents=True)
    record(target, [stats()]).save(good)
    (old / "metrics.json").write_text('{"config": {}}')  # newer, but unreadable: not an error, not a match
    assert matching_baseline(spec)[1] == good


def test_run_records_round_trip(target, tmp_path):
    r = record(target, [stats(cycles=[(4, 2), (3, 3)])], name="spec", gamma=4)
    r.save(tmp_path)
    back = RunRecord.load(tmp_path)
    assert back == r and back.samples[0].stats.cycle_hist == {4: [0, 0, 1, 0, 0], 3: [0, 0, 0, 1]}
    (tmp_path / "metrics.json").write_text('{"config": {}}')
    with pytest.raises(ValueError, match="written by another version"):
        RunRecord.load(tmp_path)


def test_peaks_are_measured_once_and_cached(tmp_path, monkeypatch):
    first = load(cache=tmp_path / "peaks.json")
    assert first["flops_per_s"] > 1e8 and first["bytes_per_s"] > 1e8
    # the kernels the SUTs run are among those measured, and the entry says how it was measured
    assert first["flops_per_s"] == max(first["kernels_flops_per_s"].values())
    assert any(k.startswith("packed linear") for k in first["kernels_flops_per_s"]) and "best of" in first["method"]
    assert first["bytes_per_s"] == max(first["streams_bytes_per_s"].values()) and "read" in first["streams_bytes_per_s"]
    assert first["fingerprint"] == fingerprint("cpu", torch.float32)
    assert {2 ** 20, 256 * 2 ** 20} <= set(map(int, first["reads_by_size"]))  # working sets from 1 to 256 MiB
    assert "pages" in first["pages"]  # which pages the buffers and weights were on
    refill = {int(n): passes for n, passes in first["refill_by_size"].items()}  # 8 reads of each set after a stream
    assert min(refill) == 2 ** 20 and max(refill) == PUSH_OUT_BYTES // 2 and all(len(p) == 8 for p in refill.values())
    assert all(bw > 0 for passes in refill.values() for bw in passes)
    assert first["widen_bytes_per_s"] is None or first["widen_bytes_per_s"] > 1e8  # None: no fp16 panels
    assert load(cache=tmp_path / "peaks.json") == first  # from the cache, not measured again
    table = json.loads((tmp_path / "peaks.json").read_text())
    table[first["fingerprint"]]["measured"] = "2020-01-01 00:00:00"
    (tmp_path / "peaks.json").write_text(json.dumps(table))
    monkeypatch.setattr("roofline.peaks.measure", lambda *args: dict(first))  # measured again: as the first time
    assert load(cache=tmp_path / "peaks.json")["measured"] != "2020-01-01 00:00:00"  # stale: measured again


@pytest.mark.parametrize("speeds, note", [([2.0], None),  # plausible at once: measured once
                                          ([1.0, 2.0], "below what decode achieved; measured them again"),
                                          ([1.0, 1.0], "decode still exceeds them")])
def test_peaks_a_phase_ran_past_are_measured_once_more_and_said_so(speeds, note):
    measured = iter(speeds)
    result, said = judged(lambda peak: 1.5 / peak, lambda fraction: ["decode"] if fraction > 1.05 else [],
                          lambda again: next(measured))
    assert result == 1.5 / speeds[-1] and next(measured, None) is None  # every measurement taken, none more
    assert (said is None) if note is None else (note in said)


def test_a_cache_that_does_not_parse_or_holds_no_measurement_is_measured_again(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "peaks.json"
    cache.write_text('{"AMD EPYC | tor')  # a copy cut short
    first = load(cache=cache)
    assert first["flops_per_s"] > 0 and "measuring the peaks again" in capsys.readouterr().err
    assert json.loads(cache.read_text()) == {first["fingerprint"]: first}
    monkeypatch.setattr("roofline.peaks.measure", lambda *args: dict(first))  # measured again: as the first time
    cache.write_text(json.dumps({first["fingerprint"]: {"flops_per_s": "fast", "measured": "today"}}))
    assert load(cache=cache)["flops_per_s"] > 0
    assert json.loads(cache.read_text())[first["fingerprint"]]["measured"] != "today"
    for key in ("method", "reads_by_size", "pages", "widen_bytes_per_s", "refill_by_size"):  # from before each
        older = {k: v for k, v in first.items() if k != key}
        cache.write_text(json.dumps({first["fingerprint"]: {**older, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}}))
        assert key in load(cache=cache) and key in json.loads(cache.read_text())[first["fingerprint"]]


def test_a_working_set_that_fits_in_a_cache_is_held_to_the_caches_read_speed():
    mib = 2 ** 20
    curve = {**PEAKS, "reads_by_size": {str(mib): 40e9, str(4 * mib): 20e9, str(64 * mib): 8e9}}
    assert bandwidth(curve, mib) == pytest.approx(40e9) and bandwidth(curve, mib // 2) == pytest.approx(40e9)
    assert bandwidth(curve, 2 * mib) == pytest.approx(30e9)  # halfway in log size
    assert bandwidth(curve, 128 * mib) == bandwidth(curve, 48 * mib) == bandwidth(PEAKS, mib) == PEAKS["bytes_per_s"]


def test_a_cycle_is_held_to_its_draft_steps_and_verify_pass_each_at_its_own_roof(target):
    mib = 2 ** 20
    curve = {**PEAKS, "reads_by_size": {str(mib): 40e9, str(64 * mib): 8e9}}  # the test models fit in 1 MiB
    spec = record(target, [stats(cycles=[(4, 3), (4, 1)], draft_s=0.004, verify_s=0.006)], name="spec", gamma=4)
    streamed, cached = (analyze(spec, peaks).phases for peaks in (PEAKS, curve))
    for phase in ("draft", "verify"):  # memory-bound: the roof 4x as fast, the same time a quarter as near it
        assert streamed[phase].intensity < PEAKS["flops_per_s"] / 40e9  # below the ridge at either read speed
        assert cached[phase].ideal_seconds == pytest.approx(streamed[phase].ideal_seconds / 4)
        assert cached[phase].fraction_of_roof == pytest.approx(streamed[phase].fraction_of_roof / 4)
    assert cached["cycle"].ideal_seconds == pytest.approx(4 * cached["draft"].ideal_seconds +
                                                          cached["verify"].ideal_seconds)


def test_a_draft_step_reads_its_bytes_again_after_each_verify_pass(target):
    """Where the draft's bytes fit in a cache and the verify pass's with them do not, a cycle's first draft step
    is held to the slower roof and the other three to the faster."""
    spec = record(target, [stats(cycles=[(4, 3), (4, 1)], draft_s=0.004, verify_s=0.006)], name="spec", gamma=4)
    alone = analyze(spec, PEAKS).phases
    draft, verify = alone["draft"].bytes, alone["verify"].bytes
    curve = {**PEAKS, "reads_by_size": {str(int(draft) + 1): 40e9, str(int(draft + verify)): 10e9}}
    phases = analyze(spec, curve).phases
    assert PEAKS["bytes_per_s"] == 10e9 and alone["draft"].intensity < PEAKS["flops_per_s"] / 40e9
    assert phases["draft"].ideal_seconds == pytest.approx((draft / 10e9 + 3 * draft / 40e9) / 4)
    assert phases["cycle"].ideal_seconds == pytest.approx(4 * phases["draft"].ideal_seconds +
                                                          phases["verify"].ideal_seconds)
    assert alone["draft"].ideal_seconds == pytest.approx(draft / 10e9)  # one roof for every working set


def test_a_draft_step_after_a_long_stream_reads_at_the_measured_speed_of_that_read():
    """Where a cycle streams at least PUSH_OUT_BYTES, the draft's k-th step is held to the k-th read after a
    stream, never above its own roof, and past the reads measured to its own; a shorter cycle keeps the rule above."""
    mib = 2 ** 20
    draft, verify = Cost(0, 0, 16 * mib, 0, 0, 0), Cost(0, 0, PUSH_OUT_BYTES, 0, 0, 0)
    refill = {str(8 * mib): [10e9, 20e9, 60e9], str(32 * mib): [10e9, 20e9, 30e9]}  # 16 MiB: halfway in log size
    plain = {**PEAKS, "reads_by_size": {str(16 * mib): 40e9, str(64 * mib): 10e9}}
    curve = {**plain, "refill_by_size": refill}
    steps = [16 * mib / 10e9, 16 * mib / 20e9, 16 * mib / 40e9, 16 * mib / 40e9]  # the third: 45 GB/s held to 40
    assert draft_roofline_s({"draft": draft, "verify": verify}, curve, 4) == pytest.approx(sum(steps) / 4)
    assert draft_roofline_s({"draft": draft, "verify": verify}, plain, 4) == \
        pytest.approx((16 * mib / 10e9 + 3 * 16 * mib / 40e9) / 4)  # no reads after a stream measured
    short = {"draft": draft, "verify": Cost(0, 0, 8 * mib, 0, 0, 0)}
    assert draft_roofline_s(short, curve, 4) == draft_roofline_s(short, plain, 4)


def test_the_draft_is_costed_as_the_run_recorded_it_whatever_the_suts_name(target):
    """A plug-in under any name: its draft's geometry and int8 weights come from the record, not the name."""
    from dataclasses import asdict, replace
    from mlperf.model import GPTConfig
    spec = [stats(cycles=[(4, 3), (4, 1)], draft_s=0.004, verify_s=0.006)]
    plain = record(target, spec, name="my-drafter", gamma=4)
    small = asdict(GPTConfig(n_layer=1, n_head=1, n_embd=16, vocab_size=SMALL.vocab_size, block_size=SMALL.block_size))
    recorded = replace(plain, sut=replace(plain.sut, draft=small, draft_weight_bytes=1.0))
    draft_bytes = {name: analyze(r, PEAKS).phases["draft"].bytes for name, r in
                   (("checkpoint", plain), ("recorded", recorded))}
    assert recorded.draft_config() == GPTConfig(**small) and plain.draft_config() == GPTConfig(**asdict(SMALL))
    assert draft_bytes["recorded"] < draft_bytes["checkpoint"] / 4  # a smaller draft, one byte per weight
    assert record(target, [stats()]).draft_config() is None  # drafted nothing


def test_a_roofline_saves_and_loads_as_itself(target, tmp_path):
    spec = record(target, [stats(cycles=[(4, 3), (4, 1)], draft_s=0.004, verify_s=0.006)], name="spec", gamma=4)
    roof = analyze(spec, PEAKS, record(target, [stats()]))
    roof.save(tmp_path)
    assert Roofline.load(tmp_path) == roof and json.loads((tmp_path / "roofline.json").read_text())["phases"]
    (tmp_path / "roofline.json").write_text('{"phases": {}}')
    with pytest.raises(ValueError, match="is not a roofline this version reads"):
        Roofline.load(tmp_path)


def test_on_a_gpu_each_phase_is_held_to_its_launch_floor_and_a_cpu_has_none(target):
    from dataclasses import replace
    from roofline.analytic import kernels_per_forward
    spec = record(target, [stats(cycles=[(4, 3), (4, 1)], draft_s=0.004, verify_s=0.006)], name="spec", gamma=4)
    assert all(p.launch_floor_s is None for p in analyze(spec, PEAKS).phases.values())
    gpu = {**PEAKS, "launch_s": 10e-6, "graph_node_s": 1e-6}
    graphed = analyze(spec, gpu).phases
    step, verify = (kernels_per_forward(SMALL, tokens, True) * 1e-6 for tokens in (1, 5))
    assert graphed["draft"].launch_floor_s == pytest.approx(step)
    assert graphed["verify"].launch_floor_s == pytest.approx(verify)
    assert graphed["cycle"].launch_floor_s == pytest.approx(verify + 4 * step)
    assert graphed["prefill"].launch_floor_s == pytest.approx(kernels_per_forward(SMALL, 20, True) * 1e-6)
    batched = analyze(record(target, [stats()] * 4, batch=4), gpu).phases  # rows prefilled together: eager
    assert batched["prefill"].launch_floor_s == pytest.approx(kernels_per_forward(SMALL, 20, False) * 10e-6)
    eager = analyze(replace(spec, config=replace(spec.config, fast=False)), gpu).phases  # every kernel from Python
    assert eager["verify"].launch_floor_s == pytest.approx(kernels_per_forward(SMALL, 5, False) * 10e-6)
    assert eager["verify"].launch_floor_s > 5 * graphed["verify"].launch_floor_s


def test_runs_with_and_without_the_fast_path_are_not_compared(target):
    from dataclasses import replace
    a = record(target, [stats()])
    assert a.comparison_key() != replace(a, config=replace(a.config, fast=False)).comparison_key()
