"""The Makefile: `make help` lists every target; the first install takes torch's CPU wheel unless an NVIDIA GPU is
listed (make -n, nothing installed)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def make(*args, path: str | None = None) -> str:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=True).stdout


def test_make_help_lists_every_target():
    text = (ROOT / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY: (.*)$", text, re.M).group(1).split())
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.M))
    listed = set(re.findall(r"^  make (\S+)", make("help"), re.M))
    assert phony <= targets and targets == listed, targets ^ listed
    assert make() == make("help")  # the default goal


@pytest.mark.parametrize("gpu", [False, True])
def test_the_first_install_takes_the_cpu_wheel_unless_an_nvidia_gpu_is_listed(tmp_path, gpu):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # first on PATH: one that lists a GPU, or one that finds none (as a driver does)
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n" if gpu
                   else "#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    smi.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    install = [line for line in make("-n", "-B", ".venv/.installed", path=path).splitlines()
               if "pip install" in line and "torch==" in line]
    assert len(install) == 1
    assert ("--extra-index-url https://download.pytorch.org/whl/cpu" in install[0]) is not gpu
    own = make("-n", "-B", ".venv/.installed", "TORCH_INDEX=", path=path)
    assert "download.pytorch.org" not in own  # TORCH_INDEX= (empty): PyPI's default build
