"""A speculative run disclosed and checked as MLPerf Inference v6.0 asks of speculative decoding: the record names
the drafter (its kind and checkpoint hash), the shape (chain or tree, gamma, the tree's size), the acceptance as
engines report it (mean acceptance length, conditional acceptance per draft position, accepted drafts a cycle) and
whether it was set synthetically (suts/synthetic.py: the mechanism measured, not the drafter); a compliance run of
a speculative SUT also checks that its greedy outputs are the non-speculative baseline's and, given a manifest,
that the drafter is the one the manifest names."""
import json
from pathlib import Path

from mlperf.data import load_prompts
from mlperf.tokenizer import load_tokenizer
from scenarios.accuracy import read_outputs, reference_outputs
from scenarios.records import RunRecord
from suts.engine.stats import acceptance, merged_cycles
from suts.registry import shape
from suts.tree import widths


def disclosure(record: RunRecord) -> dict | None:
    """What a speculative run discloses; None for a run that drafted nothing."""
    stats = record.stats
    cycles = sum(s.cycles for s in stats)
    if not cycles:
        return None
    tree = record.sut.tree
    synthetic = record.config.acceptance()
    return {"drafter": record.sut.drafter,
            "checkpoint": next((h for kind, h in record.checkpoints.items() if kind != "target"), None),
            "shape": shape(record.config.sut) or ("tree" if tree else "chain"), "gamma": record.sut.gamma,
            "tree_nodes": sum(widths(tree)) if tree else None,
            "synthetic_acceptance": synthetic.label(record.config.gamma) if synthetic else None,
            **acceptance(merged_cycles(stats))}


def manifest_problem(disclosed: dict, manifest: Path) -> str | None:
    """Why the run's drafter is not the manifest's ({"checkpoint": hash}, and its "drafter" kind if named)."""
    try:
        want = json.loads(manifest.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the drafter manifest {manifest}: {e}") from None
    if not isinstance(want, dict) or "checkpoint" not in want:
        raise ValueError(f"{manifest}: a drafter manifest is a JSON object with its \"checkpoint\" hash")
    if want["checkpoint"] != disclosed["checkpoint"]:
        return (f"the drafter's checkpoint {disclosed['checkpoint']} is not the manifest's {want['checkpoint']} "
                f"({manifest})")
    if want.get("drafter", disclosed["drafter"]) != disclosed["drafter"]:
        return f"the drafter is a {disclosed['drafter']}, the manifest's a {want['drafter']}"
    return None


def check(run_dir, manifest: Path | None) -> dict:
    """The speculative rules over a compliance run: {"checked", "failures", ...}; nothing to check for a SUT that
    drafted nothing."""
    record = RunRecord.load(run_dir)
    disclosed = record.speculative  # what the run saved of itself (`disclosure`)
    if disclosed is None:
        return {"checked": False, "failures": []}
    failures, cfg = [], record.config
    if cfg.sampling().greedy:
        tokenizer = load_tokenizer(cfg.target, cfg.tokenizer)
        prompts = [tokenizer.encode(p.text) for p in load_prompts(cfg.prompts)[:cfg.samples]]
        logged = read_outputs(run_dir)
        indices = sorted(logged)  # greedy: each sample's reference is its own, whatever the others are
        reference = reference_outputs(cfg, [prompts[i] for i in indices], Path(cfg.results) / "reference")
        differ = [i for i, want in zip(indices, reference) if logged[i] != want]
        if differ:
            failures.append(f"greedy outputs differ from the non-speculative baseline's on {len(differ)} logged "
                            f"samples (first: sample {differ[0]})")
    if manifest is not None and (why := manifest_problem(disclosed, Path(manifest))):
        failures.append(why)
    return {"checked": True, "disclosed": disclosed, "greedy_identity": "checked" if cfg.sampling().greedy else
            "not applicable: a sampled run is held to the accuracy gate's log-likelihood rule",
            "manifest": str(manifest) if manifest else "none given (--manifest FILE checks the drafter's hash)",
            "failures": failures}
