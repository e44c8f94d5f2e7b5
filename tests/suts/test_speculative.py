import copy

import pytest
import torch

from mlperf.chunk import Chunk
from mlperf.model import GPTConfig
from suts.baseline import Baseline
from suts import distribution
from suts.distribution import chi_square_vs_target
from suts.engine.sampling import SamplingParams
from suts.registry import make_sut
from suts.speculative import Speculative
from tests.helpers import FP32_ATOL, exploring, peaky_model
from tests.suts.engine.test_scheduler import LENGTHS, PROMPTS as ROWS, serve

PROMPTS = [[1, 2, 3], [5] * 9, list(range(20)), [7, 30, 2, 2, 9, 11]]


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_greedy_spec_equals_baseline_token_for_token(pair, gamma):
    target, draft = pair
    baseline, spec = Baseline(target), Speculative(target, draft, gamma=gamma)
    accepted = drafted = 0
    for prompt in PROMPTS:
        expected = baseline.generate(prompt, 40).tokens
        result = spec.generate(prompt, 40)
        assert result.tokens == expected
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0 < accepted < drafted  # both the accept and the reject paths ran


@pytest.mark.parametrize("name", ["spec-int8", "spec-self-int8"])
def test_quantised_drafts_keep_greedy_output_identical(pair, name):
    target, draft = pair
    baseline, spec = Baseline(target), make_sut(name, target, draft, gamma=4)
    for prompt in PROMPTS:
        result = spec.generate(prompt, 40)
        assert result.tokens == baseline.generate(prompt, 40).tokens
        assert result.stats.accepted > 0


def test_adaptive_gamma_is_still_lossless(pair):
    target, draft = pair
    spec = Speculative(target, draft, gamma=2, adaptive=True)
    for prompt in PROMPTS:
        assert spec.generate(prompt, 50).tokens == Baseline(target).generate(prompt, 50).tokens


def test_a_perfect_draft_is_always_accepted(pair):
    target, _ = pair
    result = Speculative(target, target, gamma=4).generate([3, 4], 41)  # 1 + 8 cycles of 4 drafts + bonus
    assert result.stats.acceptance_rate == 1.0 and result.stats.cycles == 8
    assert result.stats.cycle_hist == {4: [0, 0, 0, 0, 8]}


def test_a_batch_catches_its_draft_up_in_rows_of_equal_length(pair):
    """Rows 1 and 2 tokens behind the target both read 2 (one chunk of equal rows, a GPU's one graph), and every
    row drafts and accepts in a batch exactly as alone: re-reading a token recomputes what its cache held."""
    target, draft = pair
    spec = Speculative(target, draft, gamma=3)
    alone = [spec.generate(p, 30).stats.cycle_hist for p in PROMPTS]
    lens, greedy = [], spec.draft.greedy_in_one_call
    spec.draft.greedy_in_one_call = lambda ids, chunk, n: lens.append(list(chunk.lens)) or greedy(ids, chunk, n)
    batch = spec.generate_batch(PROMPTS, 30, [SamplingParams()] * len(PROMPTS))
    assert [r.stats.cycle_hist for r in batch] == alone
    assert all(len(set(b)) == 1 for b in lens if max(b) <= 2) and any(b[0] == 2 and len(b) > 1 for b in lens)


@pytest.mark.parametrize("n", [1, 4, 5, 7, 33])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, seed=3)],
                         ids=["greedy", "sampled"])
def test_exact_lengths(pair, n, params):
    target, draft = pair
    for gamma in (1, 4):
        result = Speculative(target, draft, gamma=gamma).generate([1, 2, 3], n, params)
        assert len(result.tokens) == result.stats.n_tokens == n


def test_generation_stops_at_eos(pair):
    target, draft = pair
    reference = Baseline(target).generate([1, 2, 3], 40).tokens
    eos = reference[10]
    cut = reference[:reference.index(eos) + 1]
    assert Baseline(target, eos_id=eos).generate([1, 2, 3], 40).tokens == cut
    assert Speculative(target, draft, eos_id=eos, gamma=4).generate([1, 2, 3], 40).tokens == cut


def test_rollback_leaves_no_stale_entries(pair):
    """After a generation with many rejections, the caches' valid lengths match what was committed."""
    target, draft = pair
    caches = []
    new_cache = target.new_cache
    spec = Speculative(target, draft, gamma=8)
    target.new_cache = lambda *a, **k: caches.append(new_cache(*a, **k)) or caches[-1]
    try:
        result = spec.generate(list(range(10)), 30)
    finally:
        del target.new_cache
    assert result.stats.accepted < result.stats.drafted
    # the target's cache holds the prompt and every emitted token but the last; a fresh prefill of exactly
    # those tokens must give the same next-token logits as continuing from the rolled-back cache
    committed = list(range(10)) + result.tokens[:-1]
    assert int(caches[0].lengths[0]) == len(committed)
    with torch.inference_mode():  # the cache was made in inference mode
        continued = target(torch.tensor([[result.tokens[-1]]]), Chunk(caches[0])).logits
        fresh = target(torch.tensor([committed + result.tokens[-1:]])).logits[:, -1:]
    assert torch.allclose(continued, fresh, atol=FP32_ATOL)


def test_stats_account_for_every_token(pair):
    target, draft = pair
    calls = []
    result = Speculative(target, draft, gamma=3).generate([1, 2], 30, on_first_token=calls.append)
    s = result.stats
    assert calls == result.tokens[:1]
    assert s.accepted + s.cycles + 1 == s.n_tokens == 30  # each cycle emits accepted + 1; the first from prefill
    assert sum(s.cycle_hist[3]) == s.cycles == s.steps and s.drafted == 3 * s.cycles
    assert 0 < s.accepted < s.drafted and 0 < s.prefill_s <= s.ttft_s
    assert s.decode_s == pytest.approx(s.total_s - s.ttft_s, rel=0.1)  # the steps' time, without the emitting
    assert 0 < s.ttft_s <= s.total_s and s.draft_s > 0 and s.verify_s > 0 and s.draft_s + s.verify_s <= s.decode_s
    assert s.token_times_s == sorted(s.token_times_s)


def test_bad_arguments_are_clear_errors(pair):
    target, draft = pair
    other_vocab = peaky_model(GPTConfig(n_layer=1, n_head=1, n_embd=16, vocab_size=40, block_size=128), 0)
    with pytest.raises(ValueError, match=r"draft vocab \(40\) does not match target vocab \(32\)"):
        Speculative(target, other_vocab)
    for gamma in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="gamma must be a positive integer"):
            Speculative(target, draft, gamma=gamma)
    with pytest.raises(ValueError, match="needs a draft model"):
        Speculative(target, None)
    spec = Speculative(target, draft)
    with pytest.raises(ValueError, match="empty prompt"):
        spec.generate([], 5)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        spec.generate([1], 0)
    with pytest.raises(ValueError, match="exceeds the model's context of 128"):
        spec.generate([1] * 100, 29)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        spec.generate([1, 32], 5)
    with pytest.raises(ValueError, match="an -auto SUT chooses every cycle's number of drafts itself"):
        make_sut("spec-auto", target, draft, adaptive=True)


SAMPLED = SamplingParams(temperature=1.0, top_k=6)


@pytest.fixture(scope="module")
def tiny_vocab_pair():
    return distribution.tiny_vocab_pair()


@pytest.mark.parametrize("max_batch", [1, 8])
def test_spec_sampling_is_distributed_exactly_as_the_target(tiny_vocab_pair, max_batch):
    target, draft = tiny_vocab_pair
    spec = Speculative(target, draft, gamma=2)  # the first token comes from prefill, the next 3 from cycles
    assert chi_square_vs_target(spec, target, [1, 5, 2], SAMPLED, 4000, max_batch=max_batch).pvalue > 1e-3


@pytest.mark.parametrize("max_batch, budget", [(1, None), (3, 5)])
def test_spec_auto_is_lossless_whatever_lengths_it_chooses(pair, monkeypatch, max_batch, budget):
    target, draft = pair
    expected = [Baseline(target).generate(p, n).tokens for p, n in zip(ROWS, LENGTHS)]
    sut, chosen = exploring(make_sut("spec-auto", target, draft, gamma=4), monkeypatch)
    assert serve(sut, ROWS, LENGTHS, max_batch, token_budget=budget)[0] == expected
    assert 0 in chosen and max(chosen) > 1  # plain decode steps and speculative cycles, in one run


def test_spec_auto_sampling_is_distributed_exactly_as_the_target(tiny_vocab_pair, monkeypatch):
    target, draft = tiny_vocab_pair
    sut, chosen = exploring(make_sut("spec-auto", target, draft, gamma=2), monkeypatch)
    assert chi_square_vs_target(sut, target, [1, 5, 2], SAMPLED, 4000, max_batch=8).pvalue > 1e-3
    assert set(chosen) == {0, 1, 2}


def test_the_distribution_test_fails_a_wrong_sampler(tiny_vocab_pair, monkeypatch):
    """Resampling from p instead of the residual max(0, p - q) after a rejection is biased; the test sees it."""
    import suts.speculative
    monkeypatch.setattr(suts.speculative, "residual", lambda p, q: p)
    target, draft = tiny_vocab_pair
    spec = Speculative(target, draft, gamma=2)
    assert chi_square_vs_target(spec, target, [1, 5, 2], SAMPLED, 3000, max_batch=8).pvalue < 1e-6



@pytest.mark.parametrize("name", ["spec", "spec-tree"])
def test_a_wide_batch_on_the_fast_path_is_fused_whole_and_stays_lossless(pair, name):
    """16 rows: a greedy verify pass of more tokens than one call takes runs in groups of rows; token-identical
    to the baseline, and nothing falls back to the modules."""
    target, draft = pair
    prompts = [ROWS[i % len(ROWS)] + [i] for i in range(16)]
    expected = [Baseline(target).generate(p, 24).tokens for p in prompts]
    sut = make_sut(name, copy.deepcopy(target), copy.deepcopy(draft), gamma=4).use_fast_path(min_weights=0)
    if sut.target.fast_step is None:
        pytest.skip("the kernels do not build here")
    got = sut.generate_batch(prompts, 24, [SamplingParams()] * len(prompts), max_batch=16)
    assert [r.tokens for r in got] == expected
    for runner in sut.runners():
        assert runner.tally.steps > 0 and not runner.tally.fell_back


def test_on_the_fast_path_spec_stays_lossless_and_exact(pair, tiny_vocab_pair):
    """Both models fused (suts/fast/fused.py): greedy token-identical to the baseline alone and in a batch, and
    sampling still distributed exactly as the target."""
    target, draft = pair
    baseline = Baseline(target)
    expected = [baseline.generate(p, 40).tokens for p in PROMPTS]
    spec = Speculative(copy.deepcopy(target), copy.deepcopy(draft), gamma=4).use_fast_path(min_weights=0)
    if spec.target.fast_step is None:
        pytest.skip("the kernels do not build here")
    assert [spec.generate(p, 40).tokens for p in PROMPTS] == expected
    greedy = [SamplingParams()] * len(PROMPTS)
    assert [r.tokens for r in spec.generate_batch(PROMPTS, 40, greedy, max_batch=2)] == expected
    small_target, small_draft = tiny_vocab_pair
    spec = Speculative(copy.deepcopy(small_target), copy.deepcopy(small_draft), gamma=2).use_fast_path(min_weights=0)
    assert chi_square_vs_target(spec, small_target, [1, 5, 2], SAMPLED, 4000, max_batch=8).pvalue > 1e-3
