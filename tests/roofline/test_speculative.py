import pytest

from roofline.speculative import expected_tokens_per_cycle, predicted_speedup


def test_expected_tokens_per_cycle():
    assert expected_tokens_per_cycle(0.0, 4) == 1.0  # only the target's own token
    assert expected_tokens_per_cycle(1.0, 4) == 5.0  # every draft plus the bonus
    assert expected_tokens_per_cycle(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)


def test_predicted_speedup():
    # the paper's ideal verify (cost of one step): alpha 0.8, gamma 4, c 0.05 -> 3.3616 / 1.2
    assert predicted_speedup(0.8, 4, 0.05, 1.0) == pytest.approx(3.3616 / 1.2)
    assert predicted_speedup(0.0, 4, 0.1, 1.5) == pytest.approx(1 / 1.9)  # a useless draft slows decoding down
