import pytest
import torch

from mlperf import devices
from suts.base import GREEDY
from suts.registry import build_sut
from tests.helpers import run_cli

no_mps = pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has Apple's GPU")


@pytest.mark.parametrize("device, line", [("tpu", "unknown device 'tpu'; use cpu, cuda, cuda:N or mps"),
                                          ("cuda:x", "unknown device 'cuda:x'")])
def test_an_unknown_device_is_one_line(device, line):
    with pytest.raises(ValueError, match=line):
        devices.check(device)


@no_mps
def test_mps_where_there_is_none_is_one_line_from_the_command_line(tiny_pair, tmp_path):
    with pytest.raises(ValueError, match=r"^device 'mps' requested but Apple's GPU \(MPS\) is not available: "):
        devices.check("mps")
    proc = run_cli(tiny_pair, tmp_path / "results", "--sut", "baseline", "--device", "mps")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "Apple's GPU (MPS) is not available" in proc.stderr and not (tmp_path / "results").exists()


def test_apples_gpu_is_asked_what_a_gpu_is_asked(monkeypatch):
    """The MPS branches with the CPU standing in for the calls they make: fp16 as on CUDA, its own synchronize and
    memory, its name in the run record."""
    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("synchronize"))
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: calls.append("memory") or 16 * 2 ** 30)
    devices.synchronize("mps")
    assert devices.memory("mps") == 16 * 2 ** 30 and calls == ["synchronize", "memory"]
    assert devices.default_dtype("mps") == devices.default_dtype("cuda") == torch.float16
    assert devices.default_dtype("cpu") == torch.float32 and devices.accelerated("mps")
    assert devices.describe("mps") == "Apple GPU (MPS)" and devices.describe("cpu") is None
    devices.synchronize("cpu")  # nothing to wait for
    assert calls == ["synchronize", "memory"]


def test_what_mps_runs_fp16_through_the_modules_is_lossless_with_the_cpu_standing_in(tiny_pair):
    """On Apple's GPU every model runs on its modules in fp16 (no fused step, no graphs): here the same, on the CPU,
    spec emits exactly the baseline's tokens."""
    suts = [build_sut(name, str(tiny_pair / "target"), str(tiny_pair / "draft"), dtype=torch.float16, fast=False)
            for name in ("baseline", "spec")]
    assert all(s.dtype == torch.float16 and s.paths() == dict.fromkeys(s.paths(), "modules") for s in suts)
    for prompt in ([1, 2, 3, 4, 5], list(range(10, 40))):
        tokens = [s.generate(prompt, 20, GREEDY).tokens for s in suts]
        assert tokens[0] == tokens[1] and len(tokens[0]) == 20
