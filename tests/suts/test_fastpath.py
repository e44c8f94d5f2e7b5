import torch
import torch.nn as nn

from suts.baseline import Baseline
from suts.fastpath import PackedLinear, pack_linears
from tests.helpers import FP32_ATOL, SMALL, peaky_model


def test_packed_linear_matches_linear():
    torch.manual_seed(0)
    linear = nn.Linear(64, 96)
    packed = PackedLinear(linear)
    for shape in [(1, 1, 64), (1, 5, 64), (3, 7, 64)]:
        x = torch.randn(shape)
        assert torch.allclose(packed(x), linear(x), atol=FP32_ATOL)


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
