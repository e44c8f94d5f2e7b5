import copy
from dataclasses import replace

import pytest
import torch

from mlperf.checkpoint import CheckpointError, save_checkpoint
from mlperf.model import EagleHead
from suts.base import SUT
from suts.engine.sampling import SamplingParams
from suts.engine.scheduler import Sequence
from suts.baseline import Baseline
from suts.fast.packed import PackedLinear
from suts import registry
from suts.drafting import DraftModel
from suts.registry import SPECULATIVE, SUTS, build_sut, make_sut, sut_class
from suts.speculative import Speculative
from tests.helpers import SMALL, peaky_model


class FirstTokenForever(SUT):
    """A student's SUT: repeats the target's first greedy token (a plug-in loaded by module:Class)."""

    def generate(self, prompt, max_new_tokens, params=None, on_first_token=None):
        tok = int(self.target(torch.tensor([prompt])).logits[0, -1].argmax())
        seq = Sequence(prompt, max_new_tokens, params, on_first_token)
        seq.emit([tok] * max_new_tokens, self.eos_id)
        return seq.result


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    target = peaky_model(SMALL, 0)
    save_checkpoint(target, root / "target", dtype=torch.float32)
    save_checkpoint(peaky_model(SMALL, 1), root / "draft", dtype=torch.float32)
    return str(root / "target"), str(root / "draft")


def test_registered_names():
    assert list(SUTS) == ["baseline", "spec", "spec-int8", "spec-self-int8", "ngram", "eagle", "spec-tree",
                          "spec-int8-tree", "ngram-tree", "eagle-tree", "spec-auto", "ngram-auto", "eagle-auto"]
    assert sut_class("spec-int8") is Speculative


def test_every_speculative_name_is_a_drafter_and_a_shape(pair):
    """The 12 speculative names are one SUT class, each a (drafter, shape) pair of the table."""
    target, draft = pair
    for name, (drafter, form) in SPECULATIVE.items():
        head = EagleHead(replace(target.config, n_layer=1))
        sut = make_sut(name, target, head if drafter == "eagle" else draft)
        assert type(sut) is Speculative and sut.name == name
        assert bool(sut.fanout) == (form == "tree") and (sut.planner is not None) == (form == "auto")
        assert sut.drafter.name == {"eagle": "head", "ngram": "lookup"}.get(drafter, "model")
    with pytest.raises(ValueError, match="drafts with its own model; drafter: options of the ngram SUTs"):
        make_sut("spec", target, draft, drafter="tests.suts.test_ngram:Echo")


def test_a_drafter_registered_in_one_line_runs_as_chain_tree_and_auto_token_identical(pair, monkeypatch):
    """A new drafter is one class and one line: its three SUTs by name, each the baseline's tokens."""
    class SelfDraft(DraftModel):
        """Drafts with a copy of the target itself: every greedy draft is accepted."""
        name = "self"

        def drafting_model(self, target, draft):
            return copy.deepcopy(target)
    for table in ("DRAFTERS", "SPECULATIVE", "SUTS"):
        monkeypatch.setattr(registry, table, copy.copy(getattr(registry, table)))
    registry.register("self", lambda **_: SelfDraft())
    assert registry.SUTS[-1] == "self-auto" and sut_class("self-tree") is Speculative
    target, draft = pair
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    want = [make_sut("baseline", target).generate(p, 20).tokens for p in prompts]
    for name in ("self", "self-tree", "self-auto"):
        sut = registry.make_sut(name, target, draft, gamma=3)
        results = [sut.generate(p, 20) for p in prompts]
        assert [r.tokens for r in results] == want, name
        assert all(r.stats.accepted == r.stats.drafted > 0 for r in results) or name == "self-auto", name


@pytest.mark.parametrize("name", SUTS)
def test_on_the_fast_path_every_sut_runs_wide_batches_of_long_prompts_with_nothing_falling_back(pair, eagle, name):
    """16 rows, some prompts longer than one kernel call takes, greedy then sampled: every forward and greedy call of
    each registered SUT's models runs on its fused step, none on the modules (the run record's `fell_back`)."""
    target, draft = pair
    part = registry.part_of(name)
    drafts_with = {None: None, "draft": draft, "head": eagle[1]}[part and part.kind]
    sut = make_sut(name, copy.deepcopy(target), copy.deepcopy(drafts_with), gamma=4).use_fast_path(min_weights=0)
    if sut.target.fast_step is None:
        pytest.skip("the kernels do not build here")
    prompts = [[(5 * i + j) % SMALL.vocab_size for i in range(70 if j % 3 == 0 else 10 + j)] for j in range(16)]
    for params in (SamplingParams(), SamplingParams(1.0, seed=1)):
        sut.generate_batch(prompts, 12, [params] * len(prompts), max_batch=16)
    assert {i: dict(r.tally.fell_back) for i, r in enumerate(sut.runners()) if r.tally.fell_back} == {}
    assert all(r.tally.steps > 0 for r in sut.runners())


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="unknown SUT 'fast'; choose one of baseline, spec, spec-int8, spec-self-int8, "
                                         "ngram, eagle, spec-tree, spec-int8-tree, ngram-tree, eagle-tree, spec-auto, "
                                         "ngram-auto, eagle-auto"):
        sut_class("fast")


def test_plug_in_by_module_and_class(checkpoints):
    sut = build_sut("tests.suts.test_registry:FirstTokenForever", checkpoints[0])
    assert isinstance(sut, FirstTokenForever)
    first = []
    result = sut.generate([1, 2], 5, on_first_token=first.append)
    assert result.tokens == first * 5


@pytest.mark.parametrize("name, match", [("no.such.module:X", "cannot load SUT plug-in"),
                                         ("tests.suts.test_registry:Nope", "cannot load SUT plug-in"),
                                         ("tests.suts.test_registry:SMALL", "not a class with a generate")])
def test_bad_plug_ins(name, match):
    with pytest.raises(ValueError, match=match):
        sut_class(name)


def test_build_applies_options_and_the_fast_path(checkpoints):
    spec = build_sut("spec", *checkpoints, gamma=3, adaptive=True)
    assert spec.gamma == 3 and spec.adaptive and spec.dtype == torch.float32
    baseline = build_sut("baseline", *checkpoints, gamma=3)  # options a SUT does not take are left out
    plain = build_sut("baseline", *checkpoints, fast=False)
    packed = build_sut("baseline", checkpoints[0], fast=True)
    assert not any(isinstance(m, PackedLinear) for m in plain.target.model.modules())
    assert isinstance(baseline, Baseline)
    assert packed.generate([1, 2, 3], 20).tokens == plain.generate([1, 2, 3], 20).tokens


def test_a_built_sut_leaves_the_collector_only_what_comes_after(checkpoints):
    """Everything loaded is frozen (gc.freeze): a full collection in a timed call scans only the objects made since."""
    import gc
    gc.unfreeze()
    sut = build_sut("spec", *checkpoints)
    assert gc.get_freeze_count() > 0 and all(gc.get_count()[g] < 50 for g in (1, 2))
    objects = len(gc.get_objects())  # the generations the collector scans
    assert objects < gc.get_freeze_count() and sut.generate([1, 2, 3], 4).tokens


def test_build_errors(checkpoints, tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        build_sut("baseline", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="needs a draft model"):
        build_sut("spec", checkpoints[0])
