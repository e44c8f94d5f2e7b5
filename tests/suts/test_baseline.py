from suts.baseline import Baseline
from suts.engine.sampling import SamplingParams

PROMPTS = [[1, 2, 3], [5] * 9, list(range(20)), [7, 30, 2, 2, 9, 11]]


def test_batched_decoding_matches_one_prompt_at_a_time(pair):
    target, _ = pair
    baseline = Baseline(target)
    results = baseline.generate_batch(PROMPTS, 30, [SamplingParams()] * len(PROMPTS))
    assert [r.tokens for r in results] == [baseline.generate(p, 30).tokens for p in PROMPTS]
    assert all(r.stats.n_tokens == 30 and r.stats.batch_steps == {4: 29} and r.stats.steps == 29 for r in results)
    # per-step accounting: every row carries an equal share of the batch's decode steps and its own prefill
    assert len({r.stats.decode_s for r in results}) == 1
    assert all(0 < r.stats.prefill_s < r.stats.ttft_s for r in results)


def test_batched_sampling_uses_each_rows_own_seed(pair):
    target, _ = pair
    params = [SamplingParams(temperature=1.0).for_sample(i) for i in range(4)]
    first = [r.tokens for r in Baseline(target).generate_batch(PROMPTS, 20, params)]
    assert [r.tokens for r in Baseline(target).generate_batch(PROMPTS, 20, params)] == first  # reproducible
    swapped = Baseline(target).generate_batch([PROMPTS[0], PROMPTS[0]], 20, [params[1], params[0]])
    assert swapped[1].tokens == first[0]  # a row's tokens follow its own seed, not its place in the batch


def test_first_token_callback_and_sampling_seed(pair):
    target, _ = pair
    seen = []
    greedy = Baseline(target).generate([1, 2], 10, on_first_token=seen.append)
    assert seen == greedy.tokens[:1] and len(greedy.tokens) == 10
    params = SamplingParams(temperature=1.0, seed=5)
    a, b = (Baseline(target).generate([1, 2], 20, params).tokens for _ in range(2))
    assert a == b  # seeded
    assert Baseline(target).generate([1, 2], 20, SamplingParams(temperature=1.0, seed=6)).tokens != a
