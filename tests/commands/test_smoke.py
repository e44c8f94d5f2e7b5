"""The smoke gate on the tiny pair: verdicts both ways, through the CLI (one LoadGen process)."""
import json
import signal
import time

import pytest

from commands.smoke import run_smoke
from tests.helpers import python_m


def smoke(pair, tmp_path, gate, *args):
    return python_m("mlperf", "smoke", "--gate", gate, "--target", pair / "target", "--draft", pair / "draft",
                    "--samples", "6", "--max-new-tokens", "8", "--rounds", "1", "--results", tmp_path, *args)


def test_smoke_passes_a_low_gate_and_prints_the_figures(tiny_pair, tmp_path):
    proc = smoke(tiny_pair, tmp_path, 0.01)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "GATE PASS" in out and "roofline per phase" in out
    assert "predicted (from the acceptance per draft position)" in out
    assert "verify" in out and "-bound" in out
    for sut in ("baseline", "spec", "spec-int8"):
        assert f"\n{sut} " in out
    figures = json.loads(next(tmp_path.glob("smoke/*/smoke.json")).read_text())["figures"]
    assert figures["baseline"]["target_forwards_per_token"] == 1.0  # its fused greedy steps counted too
    assert figures["spec"]["target_forwards_per_token"] < 1.0
    # LoadGen's token latencies, the gate's each SUT's weights as streamed: the tiny pair's random weights are no fp16
    # numbers, so fp32 panels
    assert all(0 < f["tpot_s"] < f["ttft_s"] for f in figures.values())
    assert figures["baseline"]["weights"] == {"target": "fp32"}
    assert figures["spec-int8"]["weights"] == {"target": "fp32", "draft": "int8"} and "fp32/int8" in out
    verdict = json.loads(next(tmp_path.glob("smoke/*/smoke.json")).read_text())["verdict"]
    assert verdict["result"] == "PASS" and verdict["gate"] == 0.01 and verdict["tokens_identical"]
    assert verdict["gated"] == "spec" and verdict["decode_ratio"] == verdict["suts"]["spec"]["decode"] > 0.01
    assert verdict["suts"]["spec-int8"]["tokens_identical"] and verdict["failures"] == []
    assert verdict["rounds"] == 1 and verdict["suts"]["spec"]["decode_range"] == [verdict["decode_ratio"]] * 2


def test_smoke_fails_a_gate_no_sut_can_meet(tiny_pair, tmp_path):
    proc = smoke(tiny_pair, tmp_path, 1000)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("GATE FAIL: spec decodes at")
    verdict = json.loads(next(tmp_path.glob("smoke/*/smoke.json")).read_text())["verdict"]  # the figures kept
    assert verdict["result"] == "FAIL" and verdict["gate"] == 1000 and verdict["tokens_identical"]
    assert verdict["failures"][0].startswith("spec decodes at") and verdict["decode_ratio"] < 1000


def test_smoke_gates_any_sut_against_the_baseline(tiny_pair, tmp_path):
    """A plug-in is compared with the baseline like the shipped SUTs: one that changes a token fails."""
    plugin = "tests.scenarios.faulty_suts:ChangesOneToken"
    proc = smoke(tiny_pair, tmp_path, 0.01, "--sut", plugin)
    assert proc.returncode == 1 and f"\n{plugin} " in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]  # then its speed, which a baseline's copy cannot reach either
    assert last.startswith(f"GATE FAIL: {plugin} output differs from baseline on 6 samples")
    crash = smoke(tiny_pair, tmp_path, 0.01, "--sut", "tests.scenarios.faulty_suts:RaisesInTest")
    assert crash.returncode == 2 and "Traceback" not in crash.stderr  # a crash: no verdict
    last = crash.stderr.strip().splitlines()[-1]
    assert last.startswith("error: tests.scenarios.faulty_suts:RaisesInTest: ") and "simulated SUT crash" in last
    runs = list((tmp_path / "smoke").iterdir())  # the crashed smoke kept apart, the finished one whole
    assert sorted(r.suffix for r in runs) == ["", ".failed"]
    assert all((r / "smoke.json").is_file() == (r.suffix == "") for r in runs)
    front = smoke(tiny_pair, tmp_path, 0.99, "--sut", "tests.scenarios.faulty_suts:FrontLoaded")
    assert front.returncode == 1 and "slower than the baseline" in front.stderr.strip().splitlines()[-1]
    unknown = smoke(tiny_pair, tmp_path, 0.01, "--sut", "turbo")
    assert unknown.returncode == 2 and unknown.stderr.strip().startswith("error: unknown SUT 'turbo'")


def test_in_rounds_the_suts_take_turns_and_every_round_counts(tiny_pair, tmp_path):
    from scenarios.logs import read_detail, tokens_per_second
    from scenarios.scenario import SingleStream
    s = run_smoke(str(tiny_pair / "target"), str(tiny_pair / "draft"), 4, 8, results=str(tmp_path), suts=("spec",),
                  rounds=2)
    run = tmp_path / "smoke" / s.dir.rsplit("/", 1)[-1]
    rounds = sorted(p.name for p in run.iterdir() if p.is_dir())
    assert rounds == ["round1", "round2"] and not s.mismatches["spec"]
    assert len(s.by_round["spec"]["decode"]) == len(s.by_round["spec"]["end_to_end"]) == 2  # the spread it came with
    for name in ("baseline", "spec"):
        rates = [tokens_per_second(read_detail(run / r / name), SingleStream()) for r in rounds]
        tokens = 2 * 4 * 8  # every prompt once a round, 8 tokens each (no EOS in the byte vocabulary)
        assert s.figures[name].tokens_per_s == pytest.approx(tokens / sum(tokens / 2 / rate for rate in rates))


class Expired(Exception):
    signum = signal.SIGALRM


def test_a_callers_time_limit_winds_loadgen_down(tiny_pair, tmp_path):
    """A caller's alarm (a lab grader's time limit) that fires while a SUT hangs inside LoadGen's test comes back
    to the caller within seconds, and LoadGen runs again in the same process."""
    def expire(*_):
        raise Expired()
    previous = signal.signal(signal.SIGALRM, expire)
    start = time.monotonic()
    try:
        with pytest.raises(Expired):
            run_smoke(str(tiny_pair / "target"), str(tiny_pair / "draft"), 6, 8, results=str(tmp_path),
                      suts=("tests.scenarios.faulty_suts:AlarmsThenStalls",))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < 60  # the stall watchdog would take 120 s
    again = run_smoke(str(tiny_pair / "target"), str(tiny_pair / "draft"), 2, 4, results=str(tmp_path), suts=())
    assert again.figures["baseline"].tokens_per_s > 0


def test_smoke_on_ray_replicas_compares_the_same_tokens(tiny_pair, tmp_path, ray_cluster):
    proc = smoke(tiny_pair, tmp_path, 0.01, "--sut", "spec", "--replicas", "2", "--ray-address", ray_cluster)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "GATE PASS" in proc.stdout and f"2 replicas of spec on Ray ({ray_cluster})" in proc.stdout
    figures = json.loads(next(tmp_path.glob("smoke/*/smoke.json")).read_text())["figures"]
    assert set(figures) == {"baseline", "spec"}  # the forwards happen in the replicas, where no hook counts them
    assert all(f["target_forwards_per_token"] != f["target_forwards_per_token"] for f in figures.values())
