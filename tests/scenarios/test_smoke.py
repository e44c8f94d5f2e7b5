"""The smoke gate on the tiny pair: verdicts both ways, through the CLI (one LoadGen process)."""
import subprocess
import sys

from tests.helpers import cli_env


def smoke(pair, tmp_path, gate, *args):
    cmd = [sys.executable, "-m", "mlperf", "smoke", "--gate", str(gate), "--target", str(pair / "target"),
           "--draft", str(pair / "draft"), "--prompts", "6", "--tokens", "8", "--results", str(tmp_path), *args]
    return subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=300)


def test_smoke_passes_a_low_gate_and_prints_the_figures(tiny_pair, tmp_path):
    proc = smoke(tiny_pair, tmp_path, 0.01)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "GATE PASS" in out and "Leviathan predicts" in out and "roofline per phase" in out
    assert "verify" in out and "-bound" in out
    for sut in ("baseline", "spec", "spec-int8"):
        assert f"\n{sut} " in out
    assert list(tmp_path.glob("smoke/*/smoke.json"))


def test_smoke_fails_a_gate_no_sut_can_meet(tiny_pair, tmp_path):
    proc = smoke(tiny_pair, tmp_path, 1000)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("GATE FAIL: spec runs at")


def test_smoke_gates_any_sut_against_the_baseline(tiny_pair, tmp_path):
    """A plug-in is compared with the baseline like the shipped SUTs: one that changes a token fails."""
    plugin = "tests.scenarios.faulty_suts:ChangesOneToken"
    proc = smoke(tiny_pair, tmp_path, 0.01, "--sut", plugin)
    assert proc.returncode == 1 and f"\n{plugin} " in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == f"GATE FAIL: {plugin} output differs from baseline on 6 samples"
    crash = smoke(tiny_pair, tmp_path, 0.01, "--sut", "tests.scenarios.faulty_suts:RaisesInTest")
    assert crash.returncode == 1 and "Traceback" not in crash.stderr
    last = crash.stderr.strip().splitlines()[-1]
    assert last.startswith("GATE FAIL: tests.scenarios.faulty_suts:RaisesInTest: ") and "simulated SUT crash" in last
    unknown = smoke(tiny_pair, tmp_path, 0.01, "--sut", "turbo")
    assert unknown.returncode == 1 and unknown.stderr.strip().startswith("error: unknown SUT 'turbo'")
