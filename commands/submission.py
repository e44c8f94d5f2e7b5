"""`python -m mlperf submission` and `check-submission`: an MLPerf submission tree from the runs in results/, and
MLCommons' own checker over it.

The tree is the checker's v6.x layout: <division>/<org>/systems/<system>.json, src/ and
results/<system>/<benchmark>/<Scenario>/{performance/run_1, accuracy, TEST06} with measurements.json, user.conf and
README.md beside them. One system per SUT on the machine its runs recorded; the benchmark is this project's (named
after the target's geometry, never an official model's name), described in src/benchmark.json, which
check-submission enters into the checker's tables. Only the newest VALID performance run, PASS accuracy run and
PASS compliance run (TEST06, MLCommons' script included) of each SUT and scenario go in; runs are copied, never
moved, and the accuracy logs are truncated by MLCommons' own script in the copy.
"""
import json
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from mlperf import env
from mlperf.checkpoint import read_config
from scenarios import mlcommons
from scenarios.config import RunConfig
from scenarios.logs import read_detail
from scenarios.records import RunRecord
from scenarios.settings import PROFILES, model_name, resolve
from scenarios.scenario import Server, required_scenarios, system_type

SUTS = ("baseline", "spec")
SCENARIOS = tuple(map(str, required_scenarios(("edge",))))  # what an edge system submits: SingleStream and Offline
MODES = ("performance", "accuracy", "compliance")
PERFORMANCE_FILES = ("mlperf_log_summary.txt", "mlperf_log_detail.txt")
ACCURACY_FILES = PERFORMANCE_FILES + ("mlperf_log_accuracy.json", "accuracy.txt")


def runs(results: Path, suts, scenarios, pair: RunConfig = RunConfig()) -> dict[tuple[str, str], dict[str, Path]]:
    """(sut, scenario) -> mode -> the newest run of `pair`'s models (its target and draft) that may go in; a
    ValueError naming every run that is missing or failing, one line each with the command that makes it."""
    found, problems = {}, []
    for sut in suts:
        for scenario in scenarios:
            for mode in MODES:
                latest = replace(pair, results=str(results)).results_of(sut, scenario, mode) / "latest"
                run = latest.resolve() if latest.exists() else None
                problem = why_not(run, mode) if run else "none in " + str(latest.parent)
                if problem:
                    problems.append(f"{sut} {scenario} {mode}: {problem}; make it with `python -m mlperf run "
                                    f"--sut {sut} --scenario {scenario} --mode {mode} --profile full`")
                else:
                    found.setdefault((sut, scenario), {})[mode] = run
    if problems:
        raise ValueError("not every run the submission needs is there and good:\n  " + "\n  ".join(problems))
    return found


def why_not(run: Path, mode: str) -> str | None:
    """Why a published run may not go into a submission (None: it may)."""
    try:
        if mode == "performance":
            validity = read_detail(run).get("result_validity")
            return None if validity == "VALID" else f"{run} is {validity or 'not a finished run'}"
        verdict = json.loads((run / f"{mode}.json").read_text())
    except (OSError, ValueError) as e:
        return f"{run} cannot be read ({e})"
    if not verdict.get("passed"):
        return f"{run} did not pass ({'; '.join(verdict.get('failures', []))[:200]})"
    if mode == "compliance" and verdict.get("official") != "passed":
        return f"{run} was not checked by MLCommons' TEST06 script ({verdict.get('official')})"
    return None


def benchmark(found: dict, records: dict) -> dict:
    """The benchmark every run measured (src/benchmark.json): what check-submission registers in the checker. A
    ValueError where two runs measured different ones (target, prompts, output length or sampling)."""
    keys = {}
    for (sut, scenario), modes in found.items():
        for mode, run in modes.items():
            record = records[run]
            c = record.config
            key = (record.checkpoints.get("target"), str(Path(c.prompts).resolve()), c.samples, c.max_new_tokens,
                   c.temperature, c.top_k, c.top_p, c.seed)
            keys.setdefault(key, []).append(f"{sut} {scenario} {mode} ({run})")
    if len(keys) > 1:
        raise ValueError("the runs measured different benchmarks (target, prompts, samples, output length or "
                         "sampling): " + " vs ".join(runs[0] for runs in keys.values()))
    some = next(iter(found.values()))["accuracy"]
    record, accuracy = records[some], json.loads((some / "accuracy.json").read_text())
    config = read_config(record.config.target)[0]
    model = model_name(config)
    server = resolve(PROFILES["full"].read_text(), model, Server().settings_name, "full.conf")
    reference = accuracy["reference_tokens_per_sample"]
    return {"name": f"{model}-{config.n_layer}x{config.n_embd}", "target": record.checkpoints.get("target"),
            "prompts": Path(record.config.prompts).name, "samples": accuracy["samples"],
            "max_new_tokens": record.config.max_new_tokens, "sampling": accuracy["sampling"],
            "reference_tokens_per_sample": reference,
            "accuracy_target": (["exact_match", 1.0] if accuracy["greedy"] else []) +
                               ["TOKENS_PER_SAMPLE", round(0.9 * reference, 4)],
            "accuracy_upper_limit": ["TOKENS_PER_SAMPLE", round(1.1 * reference, 4)],
            "server_limits_ns": {"ttft": int(float(server["ttft_latency"]) * 1e6),
                                 "tpot": int(float(server["tpot_latency"]) * 1e6)}}


def system_name(record: RunRecord, sut: str) -> str:
    """One system per SUT and machine: the processor (and accelerator), the cores, the SUT."""
    host = record.system or {}
    cores = host.get("cores") or re.search(r"(\d+) cores", record.machine or "").group(1)
    parts = [host.get("processor", record.machine.split(",")[0]), f"{cores}c"]
    if host.get("accelerators", "0") != "0":
        parts.append(host["accelerator"])
    return re.sub(r"[^a-z0-9]+", "-", " ".join(parts + [sut]).lower()).strip("-")


def system_json(record: RunRecord, sut: str, org: str, division: str, system_type: str) -> dict:
    """The checker's 35 fields, each a true value from what the run recorded or "N/A" where it records none."""
    host, versions = record.system or {}, record.versions
    na = "N/A"
    return {
        "division": division, "submitter": org, "status": "rdi", "system_type": system_type,
        "system_name": f"{host.get('processor', record.machine)}, {sut} SUT", "number_of_nodes": "1",
        "host_processor_model_name": host.get("processor", record.machine.split(",")[0]),
        "host_processors_per_node": host.get("sockets", na), "host_processor_core_count": host.get("cores", na),
        "host_memory_capacity": host.get("memory", na), "host_storage_capacity": na, "host_storage_type": na,
        "accelerators_per_node": host.get("accelerators", "0"), "accelerator_model_name": host.get("accelerator", na),
        "accelerator_memory_capacity": host.get("accelerator_memory", na),
        "framework": framework(record),
        "operating_system": host.get("os", na),
        "other_software_stack": ", ".join(f"{k} {v}" for k, v in versions.items() if k != "torch"),
        "host_processor_frequency": na, "host_processor_caches": na, "host_memory_configuration": na,
        "host_processor_interconnect": na, "host_networking": na, "host_networking_topology": na,
        "host_network_card_count": na, "accelerator_frequency": na, "accelerator_host_interconnect": na,
        "accelerator_interconnect": na, "accelerator_interconnect_topology": na,
        "accelerator_memory_configuration": na, "accelerator_on-chip_memories": na, "cooling": na,
        "hw_notes": record.machine, "system_type_detail": na,
        "sw_notes": f"SUT {sut} ({record.sut.cls}), {record.sut.dtype} on {record.sut.device}, "
                    f"{record.torch_threads} torch threads; harness commit {versions.get('harness', 'unknown')}"
                    + (f"; served over HTTP by {record.endpoint['engine']} at {record.endpoint['url']}, model "
                       f"{record.endpoint['model']}" if record.endpoint else ""),
    }


def framework(record: RunRecord) -> str:
    """What ran the model: PyTorch in process or behind our server; another engine by its name and build."""
    served = record.endpoint
    if not served or served["engine"] == "ours":
        return f"PyTorch {record.versions.get('torch', 'N/A')}"
    build = (served.get("props") or {}).get("build_info")
    return f"{served['engine']} {build}" if build else served["engine"]


def measurements(record: RunRecord) -> dict:
    """The checker's measurements fields: inputs, weights as the run streamed them, and what was done to them."""
    bytes_ = record.sut.target_weight_bytes
    return {"input_data_types": "int32 token ids", "retraining": "no",
            "starting_weights_filename": f"{Path(record.config.target).name} ({record.checkpoints.get('target')})",
            "weight_data_types": {1: "int8", 2: "fp16"}.get(bytes_, record.sut.dtype),
            "weight_transformations": {1: "int8 weight-only quantisation, one scale per output channel",
                                       2: "none: the checkpoint's fp16 weights, streamed as stored"}.get(
                bytes_, f"the checkpoint's weights loaded as {record.sut.dtype}")}


def speculation(record: RunRecord, compliance: Path) -> dict:
    """A speculative SUT's disclosure (drafter, its checkpoint's hash, shape, mean acceptance length) and its
    compliance run's checks of MLPerf v6.0's rules (greedy identity with the baseline, the drafter's manifest), as
    the submission carries them; nothing for a SUT that drafts nothing."""
    if not record.speculative:
        return {}
    checks = json.loads((compliance / "compliance.json").read_text()).get("speculative")
    return {"speculative_decoding": {"disclosure": record.speculative, "compliance": checks}}


def readme(found_modes: dict[str, Path], record: RunRecord, sut: str, scenario: str) -> str:
    """The scenario's README: each run's command again, and the performance run's machine and versions."""
    lines = [f"# {sut}, {scenario}", "", "Made by this repository's harness; each run again with its own settings:", ""]
    for mode, run in found_modes.items():
        lines.append(f"- {mode}: `python -m mlperf run --config {run / 'metrics.json'}` (from `{run}`)")
    lines += ["", f"Machine: {record.machine}.", "Versions: " + ", ".join(f"{k} {v}" for k, v in
                                                                     record.versions.items()) + "."]
    return "\n".join(lines) + "\n"


def copy(run: Path, dst: Path, names) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(run / name, dst / name)


def build(results: Path, org: str, out: Path, division: str = "closed", suts=SUTS, scenarios=SCENARIOS,
          pair: RunConfig = RunConfig()) -> Path:
    """The submission tree at `out` (which must not exist), from the newest good runs of `pair`'s models in
    `results`."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", org):
        raise ValueError(f"--org must be a plain name (letters, digits, _ . -), got {org!r}")
    if out.exists():
        raise ValueError(f"{out} exists already: name a new directory")
    kind = system_type(scenarios)
    if kind is None:
        raise ValueError(f"a submission has SingleStream and Offline (edge), Offline and Server (datacenter) or all "
                         f"three, not {', '.join(scenarios)}")
    mlcommons.required()  # before any run is read
    found = runs(results, suts, scenarios, pair)
    records = {run: RunRecord.load(run) for modes in found.values() for run in modes.values()}  # each read once
    bench = benchmark(found, records)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as stage:
        root = Path(stage) / division / org
        (root / "src").mkdir(parents=True)
        (root / "src" / "benchmark.json").write_text(json.dumps(bench, indent=1) + "\n")
        (root / "src" / "README.md").write_text(
            f"Source: this harness at commit {env.commit()} (its README says how to run it). benchmark.json "
            f"describes the benchmark `{bench['name']}`: this project's, not an official MLPerf model.\n")
        for (sut, scenario), modes in found.items():
            record = records[modes["performance"]]
            system = system_name(record, sut)
            (root / "systems").mkdir(exist_ok=True)
            (root / "systems" / f"{system}.json").write_text(
                json.dumps(system_json(record, sut, org, division, kind), indent=1) + "\n")
            here = root / "results" / system / bench["name"] / scenario
            copy(modes["performance"], here / "performance" / "run_1", PERFORMANCE_FILES)
            copy(modes["accuracy"], here / "accuracy", ACCURACY_FILES)
            copy(modes["compliance"] / "TEST06", here / "TEST06", ["verify_accuracy.txt"])
            shutil.copy2(modes["performance"] / "user.conf", here / "user.conf")
            (here / "measurements.json").write_text(
                json.dumps({**measurements(record), **speculation(record, modes["compliance"])}, indent=1) + "\n")
            (here / "README.md").write_text(readme(modes, record, sut, scenario))
        mlcommons.truncate(Path(stage), org, out)
    return out


def main(args) -> None:
    if args.mlc:
        mlcommons.use(args.mlc)
    pair = RunConfig(**{k: getattr(args, k) for k in ("target", "draft") if getattr(args, k)})
    out = build(Path(args.results), args.org, Path(args.out), args.division, tuple(args.suts or SUTS),
                tuple(args.scenarios or SCENARIOS), pair)
    print(f"submission tree: {out} (check it with `python -m mlperf check-submission {out}`)")


def check(args) -> int:
    """MLCommons' checker over a tree: its exit code."""
    if args.mlc:
        mlcommons.use(args.mlc)
    tree = Path(args.tree)
    orgs = sorted({p.parent.name for p in tree.glob("*/*/systems")})
    if len(orgs) != 1:
        raise ValueError(f"{tree} is not a submission tree of one organisation (<division>/<org>/systems/)")
    return mlcommons.check_submission(tree, orgs[0], tree.with_name(tree.name + "-summary.csv"))
