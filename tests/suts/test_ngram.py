import random

import pytest
import torch

from mlperf.chunk import Chunk
from suts import distribution
from suts.baseline import Baseline
from suts.distribution import chi_square_vs_target
from suts.ngram import Drafter, Lookup, lookup
from suts.registry import make_sut
from suts.engine.sampling import SamplingParams
from suts.engine.stats import Stats
from tests.helpers import FP32_ATOL, exploring
from tests.suts.engine.test_scheduler import LENGTHS, PROMPTS, serve


def slow_lookup(context, n_tokens, max_ngram, min_ngram):
    """The definition, spelled out: for n from max_ngram down, the most recent earlier occurrence wins."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        key = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == key:
                return context[start + n:start + n + n_tokens]
    return []


def test_lookup_copies_what_followed_the_latest_longest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 3], 4) == [9, 1, 2, 3]  # "1 2 3" occurred before, followed by 9
    assert lookup([2, 3, 7, 1, 3, 8, 2, 3], 2) == [7, 1]  # "2 3" (n=2) beats the later lone "3"
    assert lookup([5, 3, 7, 5, 3, 8, 0, 3], 3) == [8, 0, 3]  # only n=1 matches: the most recent "3"
    assert lookup([4, 4, 4], 3) == [4]  # a match may run into the key itself; proposals stop at the context's end


@pytest.mark.parametrize("context", [[7], [1, 2, 3, 4], []], ids=["start", "no-match", "empty"])
def test_lookup_proposes_nothing_without_an_earlier_occurrence(context):
    assert lookup(context, 4) == []


def test_lookup_respects_its_limits():
    assert lookup([1, 2, 9, 1, 2], 0) == []  # nothing wanted: at max_new_tokens
    assert lookup([6, 1, 2, 9, 7, 2], 3, max_ngram=3, min_ngram=2) == []  # only a 1-gram matches
    assert lookup([6, 1, 2, 9, 7, 2], 3, max_ngram=1) == [9, 7, 2]


def test_lookup_matches_its_definition_on_random_contexts():
    rng = random.Random(0)
    for _ in range(2000):
        context = [rng.randrange(5) for _ in range(rng.randrange(1, 40))]
        for max_ngram in (1, 2, 3, 4):
            for min_ngram in range(1, max_ngram + 1):
                n_tokens = rng.randrange(5)
                assert lookup(context, n_tokens, max_ngram, min_ngram) == \
                    slow_lookup(context, n_tokens, max_ngram, min_ngram)


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_ngram_equals_baseline_token_for_token(pair, gamma):
    target, _ = pair
    baseline, ngram = Baseline(target), make_sut("ngram", target, gamma=gamma)
    total = Stats()
    for prompt in PROMPTS:
        result = ngram.generate(prompt, 40)
        assert result.tokens == baseline.generate(prompt, 40).tokens
        s = result.stats
        assert s.accepted + s.cycles + 1 == s.n_tokens == 40  # a cycle without a proposal is a decode step
        for g, counts in s.cycle_hist.items():
            for k, c in enumerate(counts):
                for _ in range(c):
                    total.record_cycle(g, k)
    assert 0 in total.cycle_hist and 0 < total.accepted < total.drafted  # no proposal; accepted and rejected ones


@pytest.mark.parametrize("n", [1, 2, 5, 33])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, seed=3)],
                         ids=["greedy", "sampled"])
def test_exact_lengths(pair, n, params):
    target, _ = pair
    result = make_sut("ngram", target, gamma=4).generate([5] * 9, n, params)  # proposals from the first cycle on
    assert len(result.tokens) == result.stats.n_tokens == n


def test_generation_stops_at_eos(pair):
    target, _ = pair
    reference = Baseline(target).generate([5] * 9, 40).tokens
    eos = reference[10]
    cut = reference[:reference.index(eos) + 1]
    assert make_sut("ngram", target, eos_id=eos, gamma=4).generate([5] * 9, 40).tokens == cut


@pytest.mark.parametrize("max_batch", [2, 4])
def test_batched_ngram_emits_the_unbatched_baseline_tokens(pair, max_batch):
    """Rows with and without a proposal, and proposals of different lengths, share each verify pass."""
    target, _ = pair
    expected = [Baseline(target).generate(p, n).tokens for p, n in zip(PROMPTS, LENGTHS)]
    ngram = make_sut("ngram", target, gamma=4)
    widths = []
    propose = ngram.drafter.draft_chain
    ngram.drafter.draft_chain = lambda *a: (lambda out: widths.append(sorted(map(len, out[0]))) or out)(propose(*a))
    tokens, sizes = serve(ngram, PROMPTS, LENGTHS, max_batch)
    assert tokens == expected and max(sizes) == max_batch
    assert any(w[0] == 0 and w[-1] > 0 for w in widths)  # a row at a plain decode step beside one verifying
    assert ngram.draft is None and not hasattr(ngram.drafter, "cache")  # no draft model, no draft cache


def test_ngram_auto_is_lossless(pair, monkeypatch):
    target, _ = pair
    expected = [Baseline(target).generate(p, n).tokens for p, n in zip(PROMPTS, LENGTHS)]
    sut, chosen = exploring(make_sut("ngram-auto", target, gamma=4), monkeypatch)
    assert serve(sut, PROMPTS, LENGTHS, 3)[0] == expected and 0 in chosen and max(chosen) > 1


def test_the_cache_holds_exactly_what_was_committed(pair):
    target, _ = pair
    ngram = make_sut("ngram", target, gamma=8)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 2
    result = ngram.generate(prompt, 30)
    assert result.stats.accepted < result.stats.drafted
    committed = prompt + result.tokens[:-1]
    cache = ngram.cache
    assert int(cache.lengths[0]) == len(committed)
    with torch.inference_mode():
        continued = target(torch.tensor([[result.tokens[-1]]]), Chunk(cache.rows(0, 1))).logits
        fresh = target(torch.tensor([committed + result.tokens[-1:]])).logits[:, -1:]
    assert torch.allclose(continued, fresh, atol=FP32_ATOL)


def test_bad_arguments_are_clear_errors(pair):
    target, _ = pair
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_ngram must be a positive integer"):
            Lookup(max_ngram=bad)
    with pytest.raises(ValueError, match=r"min_ngram \(3\) is larger than max_ngram \(2\)"):
        Lookup(max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="gamma must be a positive integer"):
        make_sut("ngram", target, gamma=0)


SAMPLED = SamplingParams(temperature=1.0, top_k=6)
REPEATING = [1, 5, 2, 1, 5]  # the lookup proposes from the first cycle on


@pytest.fixture(scope="module")
def tiny_target():
    return distribution.tiny_vocab_pair()[0]


@pytest.mark.parametrize("max_batch", [8])  # ragged rows; batch 1 runs the same rule (spec tests both)
def test_ngram_sampling_is_distributed_exactly_as_the_target(tiny_target, max_batch):
    ngram = make_sut("ngram", tiny_target, gamma=2)
    assert chi_square_vs_target(ngram, tiny_target, REPEATING, SAMPLED, 4000, max_batch=max_batch).pvalue > 1e-3


def test_the_distribution_test_fails_a_wrong_acceptance_rule(tiny_target, monkeypatch):
    """Resampling from p itself after rejecting a proposal d gives d a second chance; the test sees it."""
    import suts.speculative
    monkeypatch.setattr(suts.speculative, "residual", lambda p, q: p)
    ngram = make_sut("ngram", tiny_target, gamma=2)
    assert chi_square_vs_target(ngram, tiny_target, REPEATING, SAMPLED, 4000, max_batch=8).pvalue < 1e-6


def test_continuations_rank_longer_then_more_recent_matches_and_the_first_is_lookups():
    from suts.ngram import continuations
    assert continuations([1, 2, 9, 7, 2, 5, 0, 1, 2], 2, 4) == [[9, 7], [5, 0]]  # "1 2" beats the later lone "2"
    assert continuations([3, 1, 3, 2, 3], 3, 1) == [[2, 3]]  # limited; the most recent first
    assert continuations([3, 1, 3, 1, 3], 2, 4) == [[1, 3]]  # the same continuation twice is one candidate
    rng = random.Random(1)
    for _ in range(500):
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        first = continuations(context, 3, 5, 3, 1)[:1]
        assert first == ([lookup(context, 3)] if lookup(context, 3) else [])


@pytest.mark.parametrize("shape", ["2,1,1,1", "3,2,1"])
def test_greedy_ngram_tree_equals_baseline_token_for_token(pair, shape):
    target, _ = pair
    baseline, sut = Baseline(target), make_sut("ngram-tree", target, tree=shape)
    widths, propose = [], sut.drafter.draft_tree
    sut.drafter.draft_tree = lambda *a: (lambda out: widths.extend(len(c[0]) for c in out[1]) or out)(propose(*a))
    for prompt in PROMPTS + [[3, 1, 4, 1, 5, 1, 4, 1, 3] * 2]:
        for n in (1, 3, 40):
            result = sut.generate(prompt, n)
            assert result.tokens == baseline.generate(prompt, n).tokens and result.stats.n_tokens == n
    assert {0, 1, 2} <= set(widths)  # no match, one, and two distinct continuations at the root
    tokens, sizes = serve(make_sut("ngram-tree", target, tree=shape), PROMPTS, LENGTHS, 4)
    assert tokens == [Baseline(target).generate(p, n).tokens for p, n in zip(PROMPTS, LENGTHS)]


def test_ngram_tree_sampling_is_distributed_exactly_as_the_target(tiny_target):
    """Sibling matches are one-hot draft distributions under the tree rule (whose wrong variant test_tree fails)."""
    ngram = make_sut("ngram-tree", tiny_target, tree="2,1")
    assert chi_square_vs_target(ngram, tiny_target, REPEATING, SAMPLED, 4000, max_batch=8).pvalue > 1e-3


class Echo(Drafter):
    """A drafter of the user's kind: proposes the last token again, n times (right only sometimes); its branches are
    the last two distinct tokens, repeated."""

    def propose(self, context, n):
        return context[-1:] * n

    def branches(self, context, n, limit):
        distinct = list(dict.fromkeys(reversed(context)))[:limit]
        return [[t] * n for t in distinct]


@pytest.mark.parametrize("sut", ["ngram", "ngram-tree", "ngram-auto"])
def test_a_drafter_of_ones_own_is_lossless_in_every_shape(pair, sut, monkeypatch):
    target, _ = pair
    expected = [Baseline(target).generate(p, n).tokens for p, n in zip(PROMPTS, LENGTHS)]
    drafting = make_sut(sut, target, gamma=4, drafter=Echo())
    if drafting.planner:
        drafting, _ = exploring(drafting, monkeypatch)
    tokens, _ = serve(drafting, PROMPTS, LENGTHS, 3)
    assert tokens == expected
    one = drafting.generate(PROMPTS[0], 40)
    assert one.tokens == Baseline(target).generate(PROMPTS[0], 40).tokens and 0 < one.stats.accepted


@pytest.mark.parametrize("sut", ["ngram", "ngram-tree"])
def test_a_drafter_of_ones_own_samples_exactly_as_the_target(tiny_target, sut):
    drafting = make_sut(sut, tiny_target, gamma=2, drafter=Echo(), **({"tree": "2,1"} if sut == "ngram-tree" else {}))
    assert chi_square_vs_target(drafting, tiny_target, REPEATING, SAMPLED, 4000, max_batch=8).pvalue > 1e-3


def test_a_drafter_is_loaded_by_name_and_its_mistakes_are_one_line(pair):
    target, _ = pair
    assert isinstance(make_sut("ngram", target, drafter="tests.suts.test_ngram:Echo").drafter.drafter, Echo)
    for spec, message in [("no.such.module:X", "cannot load drafter"), ("tests.suts.test_ngram:Nope", "cannot load"),
                          ("collections:Counter", "no propose")]:
        with pytest.raises(ValueError, match=message):
            make_sut("ngram", target, drafter=spec)

    class OutOfVocabulary(Drafter):
        def propose(self, context, n):
            return [target.config.vocab_size] * n

    with pytest.raises(ValueError, match=r"proposed \[32, 32\]: not token ids of the vocabulary \(0..31\)"):
        make_sut("ngram", target, gamma=2, drafter=OutOfVocabulary()).generate(PROMPTS[0], 8)
