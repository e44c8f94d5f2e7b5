"""MLCommons' own tools, run unmodified from a checkout of mlcommons/inference, never copied into the project.

The checkout is MLC_INFERENCE_DIR, else ../shared/mlcommons-inference beside this repository where it exists (an
unmodified copy at commit b66003e, with its Apache-2.0 license). TEST06's `run_verification.py` is loaded from
it and its three checks called in-process: its command line takes the EOS id as a string, which no token equals,
so its EOS check would always pass; here it gets an integer (-1, which no token is, where the tokenizer has no EOS,
as the byte tokenizer has none).
"""
import importlib.util
import json
import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "b66003e10e2db4b8c36a448b0545ec90fcc6e9e9"
TEST06 = Path("compliance") / "TEST06" / "run_verification.py"


def checkout() -> Path | None:
    """The mlcommons/inference checkout to run from, or None."""
    for candidate in (os.environ.get("MLC_INFERENCE_DIR"), ROOT.parent / "shared" / "mlcommons-inference"):
        if candidate and (Path(candidate) / TEST06).is_file():
            return Path(candidate)
    return None


def missing() -> str:
    return (f"MLCommons' tools not found: set MLC_INFERENCE_DIR to a checkout of github.com/mlcommons/inference "
            f"(tested at commit {COMMIT[:7]})")


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verify_test06(run_dir: Path, scenario: str, eos_id: int | None, out: Path) -> bool | None:
    """TEST06's official verification of a compliance run's accuracy log, its report written as the script writes
    it (out/TEST06/verify_accuracy.txt); whether it passed, or None where the tools are not found."""
    mlc = checkout()
    if mlc is None:
        return None
    script = load(mlc / TEST06, "mlcommons_test06")
    entries = json.loads((Path(run_dir) / "mlperf_log_accuracy.json").read_text())
    dtype = np.int32  # what the harness logs
    first = script.first_token_check(entries, dtype) if scenario != "Offline" else None
    eos = script.eos_check(entries, dtype, -1 if eos_id is None else int(eos_id))
    length = script.sample_len_check(entries, dtype)
    passed = eos and length and first is not False
    text = (f"First token check pass: {'Skipped' if first is None else first}\nEOS check pass: {eos}\n"
            f"Sample length check pass: {length}\nTEST06 verification {'complete' if passed else 'failed'}\n")
    (out / "TEST06").mkdir(parents=True, exist_ok=True)
    (out / "TEST06" / "verify_accuracy.txt").write_text(text)
    return passed
