"""MLCommons' own tools, run unmodified from a checkout of mlcommons/inference, never copied into the project.

The checkout is MLC_INFERENCE_DIR (or a --mlc path), else ../shared/mlcommons-inference beside this repository
where it exists (an unmodified copy at commit b66003e, with its Apache-2.0 license). TEST06's `run_verification.py`
is loaded from it and its three checks called in-process: its command line takes the EOS id as a string, which no
token equals, so its EOS check would always pass; here it gets an integer (-1, which no token is, where the
tokenizer has no EOS, as the byte tokenizer has none). The submission checker runs as its own `main()`, this
project's benchmark registered in its tables in-process first (`register`), and `truncate_accuracy_log.py` as a
script on a staging copy of a submission tree: their files stay as they are.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from scenarios.scenario import CATEGORIES, Scenario, required_scenarios

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "b66003e10e2db4b8c36a448b0545ec90fcc6e9e9"
TEST06 = Path("compliance") / "TEST06" / "run_verification.py"
TOOLS = Path("tools") / "submission"  # the checker package (submission_checker/) and truncate_accuracy_log.py
VERSION = "v6.1"  # the checker's rules whose RNG seeds are the ones LoadGen 6.0.x logs


def checkout() -> Path | None:
    """The mlcommons/inference checkout to run from, or None."""
    for candidate in (os.environ.get("MLC_INFERENCE_DIR"), ROOT.parent / "shared" / "mlcommons-inference"):
        if candidate and (Path(candidate) / TEST06).is_file():
            return Path(candidate)
    return None


def required() -> Path:
    """The checkout, or a one-line ValueError saying what to check out."""
    mlc = checkout()
    if mlc is None:
        raise ValueError(missing())
    return mlc


def use(path) -> None:
    """Run MLCommons' tools from `path` (a --mlc option), which must be a checkout of mlcommons/inference."""
    if not (Path(path) / TEST06).is_file() or not (Path(path) / TOOLS / "submission_checker").is_dir():
        raise ValueError(f"{path} is not a checkout of github.com/mlcommons/inference (no {TEST06} or "
                         f"{TOOLS / 'submission_checker'})")
    os.environ["MLC_INFERENCE_DIR"] = str(Path(path).resolve())


def missing() -> str:
    return (f"MLCommons' tools not found: set MLC_INFERENCE_DIR (or --mlc) to a checkout of "
            f"github.com/mlcommons/inference (tested at commit {COMMIT[:7]})")


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verify_test06(run_dir: Path, scenario: Scenario, eos_id: int | None, out: Path) -> bool | None:
    """TEST06's official verification of a compliance run's accuracy log, its report written as the script writes
    it (out/TEST06/verify_accuracy.txt); whether it passed, or None where the tools are not found."""
    mlc = checkout()
    if mlc is None:
        return None
    script = load(mlc / TEST06, "mlcommons_test06")
    entries = json.loads((Path(run_dir) / "mlperf_log_accuracy.json").read_text())
    dtype = np.int32  # what the harness logs
    first = script.first_token_check(entries, dtype) if scenario.first_tokens else None
    eos = script.eos_check(entries, dtype, -1 if eos_id is None else int(eos_id))
    length = script.sample_len_check(entries, dtype)
    passed = eos and length and first is not False
    text = (f"First token check pass: {'Skipped' if first is None else first}\nEOS check pass: {eos}\n"
            f"Sample length check pass: {length}\nTEST06 verification {'complete' if passed else 'failed'}\n")
    (out / "TEST06").mkdir(parents=True, exist_ok=True)
    (out / "TEST06" / "verify_accuracy.txt").write_text(text)
    return passed


def register(benchmark: dict) -> None:
    """Enter this project's benchmark (src/benchmark.json of a tree) into the checker's tables, as MLCommons enters
    a model of a new round: its scenarios, accuracy bounds, sample counts, TEST06, LLM latency limits and result
    fields. Every check then runs as it runs on an official model. The tables are changed in this process only."""
    from submission_checker import constants as c
    from submission_checker.configuration.configuration import Config
    name, rules = benchmark["name"], c.MODEL_CONFIG[VERSION]
    if name in rules["models"]:
        return
    rules["models"].append(name)
    for kinds in CATEGORIES:
        kind = "-".join(kinds)
        rules[f"required-scenarios-{kind}"][name] = [str(s) for s in required_scenarios(kinds)]
        rules[f"optional-scenarios-{kind}"][name] = []
    rules["accuracy-target"][name] = tuple(benchmark["accuracy_target"])
    rules["accuracy-upper-limit"][name] = tuple(benchmark["accuracy_upper_limit"])
    for key in ("performance-sample-count", "dataset-size"):
        rules[key][name] = benchmark["samples"]
    scenarios = Scenario.known.values()
    rules["min-queries"][name] = {str(s): s.min_queries for s in scenarios}  # as MLPerf's LLMs
    rules["models_TEST06"].append(name)
    c.OFFLINE_MIN_SPQ_SINCE_V4[name] = benchmark["samples"]  # every prompt at least once in the Offline query
    c.LLM_LATENCY_LIMITS[name] = {str(s): benchmark["server_limits_ns"] for s in scenarios if s.paced}
    c.RESULT_FIELD_BENCHMARK_OVERWRITE[VERSION][name] = {str(s): s.headline_key for s in scenarios}
    c.SPECIAL_UNIT_DICT[name] = {str(s): s.headline_unit for s in scenarios if s.headline_unit}
    llm_models = Config.get_llm_models
    Config.get_llm_models = lambda self: llm_models(self) + [name]


def check_submission(tree: Path, org: str, csv: Path) -> int:
    """MLCommons' submission checker over `tree` (rules VERSION), every benchmark of the tree registered; its exit
    code. It logs its findings and its summary line ("SUMMARY: submission looks OK") on stderr."""
    mlc = required()
    sys.path.insert(0, str(mlc / TOOLS))
    try:
        from submission_checker import main as checker
    except ImportError as e:
        raise ValueError(f"MLCommons' submission checker at {mlc / TOOLS} does not load: {e} (it needs PyYAML)"
                         ) from None
    for path in sorted(Path(tree).glob("*/*/src/benchmark.json")):
        register(json.loads(path.read_text()))
    sys.argv = ["submission_checker", "--input", str(tree), "--version", VERSION, "--submitter", org,
                "--csv", str(csv)]
    return checker.main()


def truncate(stage: Path, org: str, out: Path) -> None:
    """MLCommons' truncate_accuracy_log.py: the submission tree at `stage` copied to `out` (a new directory), each
    accuracy log cut to its first and last 4 KB and its hash written into accuracy.txt, as the checker wants."""
    mlc = required()
    done = subprocess.run([sys.executable, str(mlc / TOOLS / "truncate_accuracy_log.py"), "--input", str(stage),
                           "--submitter", org, "--output", str(out)], capture_output=True, text=True)
    if done.returncode or not out.is_dir():
        shutil.rmtree(out, ignore_errors=True)
        raise ValueError(f"MLCommons' truncate_accuracy_log.py failed: {(done.stderr or done.stdout).strip()[-300:]}")
