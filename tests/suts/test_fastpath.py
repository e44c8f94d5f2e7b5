import pytest
import torch
import torch.nn as nn

from suts.baseline import Baseline
from suts import fastpath
from suts.fastpath import PackedLinear, pack_linears
from tests.helpers import FP32_ATOL, SMALL, peaky_model


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("one_row", [True, False])
def test_packed_linear_matches_linear(bias, one_row):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=bias)
    packed = PackedLinear(linear)
    packed.one_row = one_row
    for shape in [(1, 1, 64), (64,), (2, 1, 64), (1, 5, 64), (3, 7, 64)]:  # one row (addmm), then oneDNN's
        x = torch.randn(shape)
        y = packed(x)
        assert y.shape == (*shape[:-1], 96) and torch.allclose(y, linear(x), atol=FP32_ATOL)


def test_only_large_layers_are_packed():
    model = peaky_model(SMALL, 0)
    pack_linears(model, min_weights=32 * 96)  # c_attn (96x32) and the MLP (128x32) qualify; c_proj (32x32) not
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if name.startswith("transformer.h.0.")}
    assert kinds["transformer.h.0.attn.c_attn"] == "PackedLinear"
    assert kinds["transformer.h.0.mlp.c_fc"] == "PackedLinear"
    assert kinds["transformer.h.0.attn.c_proj"] == "Linear"


def test_packed_model_decodes_the_same_tokens():
    plain, packed = peaky_model(SMALL, 0), pack_linears(peaky_model(SMALL, 0), min_weights=0)
    assert not any(type(m) is nn.Linear for m in packed.modules())
    for prompt in ([1, 2, 3], list(range(30))):
        assert Baseline(packed).generate(prompt, 40).tokens == Baseline(plain).generate(prompt, 40).tokens


def test_half_precision_models_are_left_alone():
    model = peaky_model(SMALL, 0).half()
    pack_linears(model, min_weights=0)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


@pytest.mark.parametrize("faster", [True, False])
def test_a_model_takes_the_one_row_path_whole_or_not_at_all(monkeypatch, faster):
    monkeypatch.setattr(fastpath, "one_row_faster", lambda layers: faster)
    model = pack_linears(peaky_model(SMALL, 0), min_weights=0)
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert layers and all(m.one_row == faster for m in layers)
    assert all((m.weight_t is not None) == faster for m in layers)  # the copy is kept only where it is read
    plain = peaky_model(SMALL, 0)
    assert Baseline(model).generate([1, 2, 3], 20).tokens == Baseline(plain).generate([1, 2, 3], 20).tokens


def test_the_one_row_choice_is_measured_once_per_thread_count_and_shapes(monkeypatch):
    first = fastpath.one_row_faster([PackedLinear(nn.Linear(32, 48)) for _ in range(2)])
    monkeypatch.setattr(fastpath.time, "perf_counter", lambda: pytest.fail("measured twice"))
    assert fastpath.one_row_faster([PackedLinear(nn.Linear(32, 48)) for _ in range(2)]) == first
    with pytest.raises(pytest.fail.Exception):  # other shapes are measured on their own
        fastpath.one_row_faster([PackedLinear(nn.Linear(32, 40))])
