import pytest
import torch

from mlperf.cache import TreeMask
from mlperf.chunk import Chunk
from suts import distribution
from suts.baseline import Baseline
from suts.distribution import chi_square_vs_target
from suts.engine.sampling import SamplingParams
from suts.registry import make_sut
from suts.tree import branch, parents_of, parse_fanout, place
from tests.helpers import FP32_ATOL
from tests.suts.engine.test_scheduler import LENGTHS, PROMPTS, serve


def test_shapes_number_nodes_breadth_first():
    assert parse_fanout("4,2,1") == (4, 2, 1)
    assert parents_of((2, 2)) == [-1, 0, 0, 1, 1, 2, 2]
    assert len(parents_of((4, 2, 1))) == 1 + 4 + 8 + 8
    assert parents_of((2, 2), max_nodes=3) == [-1, 0, 0, 1]  # a prefix is a tree
    tree = TreeMask.of(parents_of((2, 2)))
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2, 2]
    assert tree.visible[5].nonzero().flatten().tolist() == [0, 2, 5]  # itself and its ancestors


def test_place_lays_distinct_continuations_on_the_shape_best_first():
    parents = tuple(parents_of((2, 1)))  # root; 1, 2; 3 under 1, 4 under 2
    tokens, children = place([[7, 8], [7, 9], [5, 6], [4, 4]], parents)
    assert tokens == [0, 7, 5, 8, 6] and children == [[1, 2], [3], [4], [], []]  # [7, 9] has no room; [4, 4] none
    assert place([[3]], parents) == ([0, 3, 0, 0, 0], [[1], [], [], [], []])
    assert place([], parents)[1] == [[], [], [], [], []]


@pytest.mark.parametrize("bad", ["", "4,0", "a,b", "-1", "2,,1"])
def test_a_bad_shape_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="children per depth as positive integers"):
        parse_fanout(bad)


def test_a_chain_sut_refuses_a_tree_and_a_tree_refuses_adaptive_gamma(pair):
    from suts.speculative import Speculative
    target, draft = pair
    with pytest.raises(ValueError, match="a tree is for the -tree SUTs"):
        Speculative(target, draft, tree="2,1")
    with pytest.raises(ValueError, match="a tree's fan-out is fixed"):
        make_sut("spec-tree", target, draft, adaptive=True)
    assert make_sut("spec-tree", target, draft, tree="3,1").gamma == 2  # the depth


@pytest.mark.parametrize("lengths", [[9, 9], [9, 4, 13]], ids=["uniform", "ragged"])
def test_every_node_sees_its_context_and_its_ancestors_only(pair, lengths):
    """A tree pass gives each node the logits of a plain forward over the context and the path to it."""
    target, _ = pair
    parents = parents_of((3, 2))
    tree = TreeMask.of(parents)
    g = torch.Generator().manual_seed(0)
    contexts = [torch.randint(0, target.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    nodes = torch.randint(0, target.config.vocab_size, (len(lengths), len(parents)), generator=g)
    cache = target.new_cache(len(lengths))
    with torch.inference_mode():
        for b, context in enumerate(contexts):  # each row's context but its last token, the tree's root
            view = cache.rows(b, b + 1)
            target(torch.tensor([context[:-1]]), Chunk(view))
        nodes[:, 0] = torch.tensor([c[-1] for c in contexts])
        logits = target(nodes, Chunk(cache, tree=tree)).logits
        for b, context in enumerate(contexts):
            for i in range(len(parents)):
                path, node = [], i
                while node > 0:
                    path.insert(0, int(nodes[b, node]))
                    node = parents[node]
                plain = target(torch.tensor([context + path])).logits[0, -1]
                assert torch.allclose(logits[b, i], plain, atol=FP32_ATOL), (b, i)


def test_keep_compacts_the_accepted_path_and_the_cache_continues_from_it(pair):
    target, _ = pair
    parents = parents_of((2, 2))
    tree = TreeMask.of(parents)
    context, nodes = [4, 9, 2, 7], [7, 11, 12, 13, 14, 15, 16]
    cache = target.new_cache(2)
    with torch.inference_mode():
        for b in range(2):
            target(torch.tensor([context[:-1]]), Chunk(cache.rows(b, b + 1)))
        target(torch.tensor([nodes, nodes]), Chunk(cache, tree=tree))
        cache.keep([3, 3], [[2, 6], []])  # row 0 keeps node 2 and its child 6; row 1 only the root
        assert cache.lengths.tolist() == [6, 4]
        for b, kept in enumerate([[12, 16], []]):
            continued = target(torch.tensor([[5]]), Chunk(cache.rows(b, b + 1))).logits[0, -1]
            fresh = target(torch.tensor([context + kept + [5]])).logits[0, -1]
            assert torch.allclose(continued, fresh, atol=FP32_ATOL)


@pytest.mark.parametrize("shape", ["4,2,1", "2,2,2,2", "1,1,1", "3"])
def test_greedy_tree_equals_baseline_token_for_token(pair, shape):
    target, draft = pair
    baseline, tree = Baseline(target), make_sut("spec-tree", target, draft, tree=shape)
    accepted = drafted = 0
    for prompt in PROMPTS:
        for n in (1, 3, 40):  # trees deeper than the budget, cut at max_new_tokens
            result = tree.generate(prompt, n)
            assert result.tokens == baseline.generate(prompt, n).tokens
            assert result.stats.n_tokens == n
            accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0 < accepted < drafted


def test_a_tree_accepts_more_than_its_first_branch(pair):
    """Second candidates are accepted too: more tokens per cycle than the chain of its first children."""
    target, draft = pair
    per_cycle = {}
    for shape in ("1,1,1", "3,3,1"):
        results = [make_sut("spec-tree", target, draft, tree=shape).generate(p, 40) for p in PROMPTS]
        per_cycle[shape] = sum(r.stats.n_tokens - 1 for r in results) / sum(r.stats.cycles for r in results)
    assert per_cycle["3,3,1"] > per_cycle["1,1,1"]


def test_generation_stops_at_eos_inside_a_tree(pair):
    target, draft = pair
    reference = Baseline(target).generate([5] * 9, 40).tokens
    eos = reference[10]
    cut = reference[:reference.index(eos) + 1]
    assert make_sut("spec-tree", target, draft, eos_id=eos, tree="3,2,2").generate([5] * 9, 40).tokens == cut


@pytest.mark.parametrize("max_batch", [2, 4])
def test_batched_trees_emit_the_unbatched_baseline_tokens(pair, max_batch):
    """Rows with a full tree, a cut one and none (a row with one token left) share each verify pass."""
    target, draft = pair
    expected = [Baseline(target).generate(p, n).tokens for p, n in zip(PROMPTS, LENGTHS)]
    tokens, sizes = serve(make_sut("spec-tree", target, draft, tree="2,2,1"), PROMPTS, LENGTHS, max_batch)
    assert tokens == expected and max(sizes) == max_batch


def test_the_caches_hold_exactly_what_was_committed(pair):
    target, draft = pair
    sut = make_sut("spec-tree", target, draft, tree="3,2,1")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    result = sut.generate(prompt, 30)
    committed = prompt + result.tokens
    for model, cache in ((target, sut.cache), (draft, sut.drafter.cache)):
        n = int(cache.lengths[0])
        assert len(committed) - 4 <= n < len(committed)  # the draft may lag by the tokens it never read
        with torch.inference_mode():
            continued = model(torch.tensor([committed[n:]]), Chunk(cache.rows(0, 1))).logits[:, -1]
            fresh = model(torch.tensor([committed])).logits[:, -1]
        assert torch.allclose(continued, fresh, atol=FP32_ATOL)


def test_branch_draws_distinct_children_and_their_conditional_distributions():
    logits = torch.tensor([2.0, 1.0, 0.5, -9.0, 0.0])
    params = SamplingParams(temperature=1.0, top_k=3)
    tokens, qs = branch(logits, 5, params, torch.Generator().manual_seed(0))
    assert sorted(tokens) == [0, 1, 2]  # no more children than the draft distribution has tokens
    for i, (token, q) in enumerate(zip(tokens, qs)):
        assert q[tokens[:i]].sum() == 0 and abs(float(q.sum()) - 1) < 1e-6 and q[token] > 0
    assert branch(logits, 2, SamplingParams(), None) == ([0, 1], [None, None])


SAMPLED = SamplingParams(temperature=1.0, top_k=6)  # the draft's and target's supports differ: a wrong rule shows


@pytest.fixture(scope="module")
def tiny_vocab():
    return distribution.tiny_vocab_pair()


@pytest.mark.parametrize("max_batch", [8])  # ragged rows; batch 1 runs the same rule (spec tests both)
def test_tree_sampling_is_distributed_exactly_as_the_target(tiny_vocab, max_batch):
    target, draft = tiny_vocab
    sut = make_sut("spec-tree", target, draft, tree="3,2")
    assert chi_square_vs_target(sut, target, [1, 2, 3], SAMPLED, 4000, max_batch=max_batch).pvalue > 1e-3


def test_the_distribution_test_fails_siblings_accepted_without_the_residual_update(tiny_vocab, monkeypatch):
    import suts.speculative
    monkeypatch.setattr(suts.speculative, "residual", lambda p, q: p)
    target, draft = tiny_vocab
    sut = make_sut("spec-tree", target, draft, tree="3,2")
    assert chi_square_vs_target(sut, target, [1, 2, 3], SAMPLED, 4000, max_batch=8).pvalue < 1e-6


def test_a_labs_acceptance_rule_plugged_into_a_tree_sut_is_called_and_stays_exact(tiny_vocab):
    """A chain rule other than the harness's (lab 2's accept_or_resample) judges each tree's principal chain: it is
    called on sampled rows, and what the SUT emits is still distributed as the target's."""
    import suts.speculative
    from suts.speculative import Speculative
    calls = []

    def students_rule(drafts, q, logits, params, generator):
        calls.append(len(drafts))
        return suts.speculative.accept(drafts, q, logits, params, generator)

    class StudentTree(Speculative):
        name = "student-tree"
        accept = staticmethod(students_rule)
    target, draft = tiny_vocab
    sut = StudentTree(target, draft, tree="3,2", shape="tree")
    assert chi_square_vs_target(sut, target, [1, 2, 3], SAMPLED, 4000, max_batch=8).pvalue > 1e-3
    assert calls and set(calls) <= {0, 1, 2}  # the principal chain: at most the tree's depth
