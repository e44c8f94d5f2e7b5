"""The rules settings are checked by: one line that names the setting, whatever the source."""
import pytest

from mlperf.rules import positive_int


def test_a_positive_integer_and_nothing_else():
    assert positive_int("gamma", 1) == 1 and positive_int("gamma", 64) == 64
    for bad in (0, -3, True, 2.0, "4", None):
        with pytest.raises(ValueError) as e:
            positive_int("--max-batch", bad)
        assert str(e.value) == f"--max-batch must be a positive integer, got {bad!r}"
