"""A drafter family added from outside the package: its cost, its checkpoint kind and one `register` line, run as
chain, tree and auto SUTs through LoadGen, token-identical to the baseline, its roofline written."""
import json

import pytest

from mlperf.model import GPTConfig
from roofline.analytic import phase_costs
from tests.helpers import filed, python_m, run_args

FAMILY = "tests.suts.twin_family"


@pytest.fixture
def twin():
    """The family registered in this process too, and unregistered after: other tests see the registry as shipped."""
    from suts import families, registry
    kept = dict(registry.DRAFTERS), dict(registry.SPECULATIVE), list(registry.SUTS), dict(families.FAMILIES)
    import tests.suts.twin_family
    families.register_family(tests.suts.twin_family.Twin)
    yield
    for live, saved in zip((registry.DRAFTERS, registry.SPECULATIVE, registry.SUTS, families.FAMILIES), kept):
        live.clear()
        live.update(saved) if isinstance(live, dict) else live.extend(saved)


def test_the_roofline_costs_a_draft_step_as_its_family_states(twin):
    geometry = GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=256, block_size=256)
    costs = {family: phase_costs(geometry, 16, 32, draft=geometry, drafter=family)["draft"]
             for family in ("model", "twin")}
    assert costs["twin"].matmul_flops == 2 * costs["model"].matmul_flops > 0


def test_a_family_is_declared_and_a_nameless_one_refused_at_definition():
    from suts.drafting import DraftModel
    from suts.families import FAMILIES, draft_forward
    assert set(FAMILIES) == {"model", "head", "lookup"}  # the package's, declared in one list
    assert draft_forward("model") and not draft_forward("head") and not draft_forward("lookup")
    with pytest.raises(TypeError, match="^Nameless names no drafter family: give it a `name` of its own"):
        class Nameless(DraftModel):
            pass


def tokens(run_dir) -> list[str]:
    """Each sample's logged tokens, in sample order."""
    logged = json.loads((run_dir / "mlperf_log_accuracy.json").read_text())
    return [entry["data"] for entry in sorted(logged, key=lambda entry: entry["qsl_idx"])]


def test_a_family_of_its_own_runs_as_chain_tree_and_auto_token_identical_to_the_baseline(tiny_pair, tmp_path):
    results = tmp_path / "results"
    parts = ["--parts", f"twin={tiny_pair / 'draft'}"]
    runs = [(sut, "accuracy") for sut in ("baseline", "twin", "twin-tree", "twin-auto")] + [("twin", "performance")]
    for sut, mode in runs:
        proc = python_m(FAMILY, *run_args(tiny_pair, results, "--sut", sut, "--mode", mode, *parts, samples=6,
                                          tokens=16), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
    baseline = tokens(filed(results, "baseline", "SingleStream", "accuracy", "latest"))
    for sut in ("twin", "twin-tree", "twin-auto"):
        latest = filed(results, sut, "SingleStream", "accuracy", "latest")
        assert tokens(latest) == baseline, sut
        metrics = json.loads((latest / "metrics.json").read_text())
        assert metrics["sut"]["drafter"] == "twin" and set(metrics["checkpoints"]) == {"target", "twin"}
        assert metrics["speculative"]["checkpoint"] == metrics["checkpoints"]["twin"]
    measured = filed(results, "twin", "SingleStream", "performance", "latest")
    assert json.loads((measured / "roofline.json").read_text())["phases"]["draft"]["flops"] > 0
