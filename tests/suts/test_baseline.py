from suts.baseline import Baseline
from suts.sampling import SamplingParams

PROMPTS = [[1, 2, 3], [5] * 9, list(range(20)), [7, 30, 2, 2, 9, 11]]


def test_batched_decoding_matches_one_prompt_at_a_time(pair):
    target, _ = pair
    baseline = Baseline(target)
    results = baseline.generate_batch(PROMPTS, 30)
    assert [r.tokens for r in results] == [baseline.generate(p, 30).tokens for p in PROMPTS]
    assert all(r.stats.n_tokens == 30 for r in results)


def test_first_token_callback_and_sampling_seed(pair):
    target, _ = pair
    seen = []
    greedy = Baseline(target).generate([1, 2], 10, on_first_token=seen.append)
    assert seen == greedy.tokens[:1] and len(greedy.tokens) == 10
    params = SamplingParams(temperature=1.0, seed=5)
    a, b = (Baseline(target).generate([1, 2], 20, params).tokens for _ in range(2))
    assert a == b  # seeded
    assert Baseline(target).generate([1, 2], 20, SamplingParams(temperature=1.0, seed=6)).tokens != a
