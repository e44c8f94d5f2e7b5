import copy
from dataclasses import replace

import pytest
import torch

from mlperf.checkpoint import CheckpointError, load_head, save_checkpoint
from mlperf.chunk import Chunk
from mlperf.model import EagleHead
from suts import distribution
from suts.baseline import Baseline
from suts.distribution import chi_square_vs_target
from suts.registry import make_sut
from suts.engine.sampling import SamplingParams
from tests.helpers import FP32_ATOL, SMALL, exploring, peaky_model
from tests.suts.engine.test_scheduler import LENGTHS, PROMPTS, serve


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_eagle_equals_baseline_token_for_token(eagle, gamma):
    target, head, _ = eagle
    baseline, sut = Baseline(target), make_sut("eagle", target, head, gamma=gamma)
    accepted = drafted = 0
    for prompt in PROMPTS:
        result = sut.generate(prompt, 40)
        assert result.tokens == baseline.generate(prompt, 40).tokens
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0 < accepted < drafted


def test_on_the_fast_path_every_eagle_forward_is_fused_and_tokens_stay_the_baselines(eagle):
    """A prompt longer than the kernel's 64 rows: the target's prefill (every token's features, its last logits)
    and the head's read of its pairs run in pieces of fused calls, as every step after them, and a batch of 16 rows
    in groups of rows; nothing falls back."""
    target, head, _ = eagle
    prompts = [[t % target.config.vocab_size for t in range(80)], *PROMPTS[:3]]
    expected = [Baseline(target).generate(p, 40).tokens for p in prompts]
    sut = make_sut("eagle", copy.deepcopy(target), copy.deepcopy(head), gamma=4).use_fast_path(min_weights=0)
    if sut.target.fast_step is None:
        pytest.skip("the kernels do not build here")
    assert [sut.generate(p, 40).tokens for p in prompts] == expected
    wide = [PROMPTS[i % len(PROMPTS)] + [i] for i in range(16)]  # the head's catch-ups in groups of rows too
    got = sut.generate_batch(wide, 24, [SamplingParams()] * 16, max_batch=16)
    assert [r.tokens for r in got] == [Baseline(target).generate(p, 24).tokens for p in wide]
    for runner in sut.runners():
        assert runner.tally.steps > 0 and not runner.tally.fell_back


@pytest.mark.parametrize("max_batch, budget", [(2, None), (4, None), (3, 16)])
def test_batched_rows_at_different_lengths_emit_the_unbatched_baseline_tokens(eagle, max_batch, budget):
    """Rows catch up on different numbers of pairs in one padded chunk; rows join and leave mid-run; with a token
    budget, prompts prefill in chunks, the head reading each chunk's pairs."""
    target, head, _ = eagle
    expected = [Baseline(target).generate(p, n).tokens for p, n in zip(PROMPTS, LENGTHS)]
    tokens, sizes = serve(make_sut("eagle", target, head, gamma=4), PROMPTS, LENGTHS, max_batch, token_budget=budget)
    assert tokens == expected and max(sizes) == max_batch


def test_eagle_auto_is_lossless_through_plain_decode_steps(eagle, monkeypatch):
    """After plain decode steps the head catches up on every pair the target's passes made."""
    target, head, _ = eagle
    expected = [Baseline(target).generate(p, n).tokens for p, n in zip(PROMPTS, LENGTHS)]
    sut, chosen = exploring(make_sut("eagle-auto", target, head, gamma=4), monkeypatch)
    assert serve(sut, PROMPTS, LENGTHS, 3)[0] == expected and 0 in chosen and max(chosen) > 1


@pytest.mark.parametrize("shape", ["2,2,1", "3,1,1,1"])
def test_greedy_eagle_tree_equals_baseline_token_for_token_batched_or_not(eagle, shape):
    target, head, _ = eagle
    baseline, sut = Baseline(target), make_sut("eagle-tree", target, head, tree=shape)
    for prompt in PROMPTS:
        for n in (1, 3, 40):  # trees deeper than the budget
            assert sut.generate(prompt, n).tokens == baseline.generate(prompt, n).tokens
    tokens, sizes = serve(make_sut("eagle-tree", target, head, tree=shape), PROMPTS, LENGTHS, 4)
    assert tokens == [baseline.generate(p, n).tokens for p, n in zip(PROMPTS, LENGTHS)] and max(sizes) == 4


@pytest.mark.parametrize("n", [1, 2, 5, 33])
def test_exact_lengths_and_eos(eagle, n):
    target, head, _ = eagle
    sut = make_sut("eagle", target, head, gamma=4)
    result = sut.generate([4], n, SamplingParams(temperature=1.0, seed=2))  # a 1-token prompt
    assert len(result.tokens) == result.stats.n_tokens == n
    reference = Baseline(target).generate([1, 2, 3], 40).tokens
    eos = reference[10]
    sut = make_sut("eagle", target, head, eos_id=eos)
    assert sut.generate([1, 2, 3], 40).tokens == reference[:reference.index(eos) + 1]


@pytest.mark.parametrize("make", [lambda t, h: make_sut("eagle", t, h, gamma=4),
                                  lambda t, h: make_sut("eagle-tree", t, h, tree="3,2,1")],
                         ids=["chain", "tree"])
def test_the_heads_cache_holds_only_pairs_of_the_targets_own_features(eagle, make):
    """After a generation, the head's cache caught up on the rest of the committed pairs (features from the
    SUT's buffer) predicts what a fresh pass over the committed tokens' target features predicts: nothing built
    on the head's own guesses was kept, and the buffer holds the target's features (a tree's accepted path's
    moved into place)."""
    target, head, _ = eagle
    sut = make(target, head)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    result = sut.generate(prompt, 30)
    assert result.stats.accepted < result.stats.drafted
    committed = prompt + result.tokens
    tcache, hcache = sut.cache, sut.drafter.cache
    have = int(hcache.lengths[0])
    assert int(tcache.lengths[0]) == len(committed) - 1 and 0 < have < len(committed) - 1
    with torch.inference_mode():
        _, features = target(torch.tensor([committed]), Chunk(features=True))
        wte = target.transformer.wte.weight
        fresh = head(torch.tensor([committed[1:]]), Chunk(), features[:, :-1], wte)[:, -1]
        kept = sut.drafter.features[:1, have:len(committed) - 1]
        continued = head(torch.tensor([committed[have + 1:]]), Chunk(hcache.rows(0, 1)), kept, wte)[:, -1]
    assert torch.allclose(continued, fresh, atol=FP32_ATOL)


def test_the_head_round_trips_and_a_mismatched_one_is_a_clear_error(eagle, tmp_path):
    target, head, root = eagle
    assert (root / "head" / "MODEL_CARD.md").read_text().count("greedy acceptance") == 1
    save_checkpoint(head, tmp_path / "h", dtype=torch.float32)
    again = load_head(tmp_path / "h", target)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), head.state_dict().values()))
    wider = peaky_model(replace(SMALL, n_embd=64), 0)
    with pytest.raises(CheckpointError, match="the head was made for a target 32 wide"):
        load_head(tmp_path / "h", wider)
    with pytest.raises(CheckpointError, match="not an EAGLE head"):
        load_head(root / "target", target)
    with pytest.raises(ValueError, match="needs an EAGLE head"):
        make_sut("eagle", target, target)


SAMPLED = SamplingParams(temperature=1.0, top_k=6)


@pytest.fixture(scope="module")
def tiny_eagle():
    """The tiny-vocabulary target and a random head: about half its drafts are rejected."""
    target = distribution.tiny_vocab_pair()[0]
    torch.manual_seed(0)
    head = EagleHead(replace(target.config, n_layer=1)).eval()
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0, 1.0)
    return target, head


@pytest.mark.parametrize("max_batch", [8])  # ragged rows; batch 1 runs the same rule (spec tests both)
def test_eagle_sampling_is_distributed_exactly_as_the_target(tiny_eagle, max_batch):
    target, head = tiny_eagle
    sut = make_sut("eagle", target, head, gamma=2)
    assert chi_square_vs_target(sut, target, [1, 5, 2], SAMPLED, 4000, max_batch=max_batch).pvalue > 1e-3


def test_eagle_tree_sampling_is_distributed_exactly_as_the_target(tiny_eagle):
    target, head = tiny_eagle
    sut = make_sut("eagle-tree", target, head, tree="2,2")
    assert chi_square_vs_target(sut, target, [1, 5, 2], SAMPLED, 4000, max_batch=8).pvalue > 1e-3


def test_the_distribution_test_fails_a_wrong_acceptance_rule(tiny_eagle, monkeypatch):
    import suts.speculative
    monkeypatch.setattr(suts.speculative, "residual", lambda p, q: p)
    target, head = tiny_eagle
    sut = make_sut("eagle", target, head, gamma=2)
    assert chi_square_vs_target(sut, target, [1, 5, 2], SAMPLED, 4000, max_batch=8).pvalue < 1e-6
