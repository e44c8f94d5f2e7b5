import pytest
import torch

from suts.engine.sampling import SamplingParams, probs, sample

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def test_temperature_one_is_softmax():
    assert torch.allclose(probs(LOGITS, SamplingParams(temperature=1.0)), torch.softmax(LOGITS, -1))


def test_temperature_sharpens_and_flattens():
    cold, hot = probs(LOGITS, SamplingParams(temperature=0.5)), probs(LOGITS, SamplingParams(temperature=2.0))
    assert cold[0] > torch.softmax(LOGITS, -1)[0] > hot[0]


def test_top_k_keeps_the_k_most_likely():
    p = probs(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.softmax(torch.tensor([2.0, 1.0, -1e9, -1e9, -1e9]), -1))


def test_top_p_keeps_the_smallest_set_reaching_p():
    full = torch.softmax(LOGITS, -1)  # [0.53, 0.20, 0.12, 0.07, 0.03]
    p = probs(LOGITS, SamplingParams(temperature=1.0, top_p=0.7))
    assert (p > 0).tolist() == [True, True, False, False, False]
    assert torch.allclose(p[:2], full[:2] / full[:2].sum())
    assert (probs(LOGITS, SamplingParams(temperature=1.0, top_p=0.5)) > 0).sum() == 1


def test_greedy_is_argmax_and_sampling_is_seeded():
    assert int(sample(LOGITS, SamplingParams(), None)) == 0
    params = SamplingParams(temperature=1.0, seed=7)
    draws = [int(sample(LOGITS, params, params.generator())) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same draw
    g = params.generator()
    assert len({int(sample(LOGITS, params, g)) for _ in range(50)}) > 1


def test_sampling_frequencies_follow_probs():
    params = SamplingParams(temperature=1.0, top_k=3)
    draws = sample(LOGITS.expand(20000, -1), params, params.generator())
    freq = torch.bincount(draws, minlength=5) / 20000
    assert torch.allclose(freq, probs(LOGITS, params), atol=0.015)


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_k=-1), dict(top_k=1.5), dict(top_p=0.0),
                                 dict(top_p=1.5)])
def test_bad_sampling_parameters(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)
