import torch
import torch.nn as nn

from suts.fast.quantize import DynamicInt8Linear, WeightOnlyInt8Linear, int8_weight_bytes, quantize_int8
from tests.helpers import SMALL, peaky_model


def test_int8_copy_is_close_and_leaves_the_original_alone():
    model = peaky_model(SMALL, 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantize_int8(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(type(m) is nn.Linear for m in q.modules())
    x = torch.randint(0, 32, (2, 20))
    with torch.no_grad():
        ref, out = torch.softmax(model(x).logits, -1), torch.softmax(q(x).logits, -1)
    assert (ref - out).abs().max() < 0.1 and (ref.argmax(-1) == out.argmax(-1)).float().mean() > 0.8


def test_weight_only_int8_linear_is_within_quantisation_error():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    q = WeightOnlyInt8Linear(linear)
    assert q.weight.dtype == torch.int8 and q.scale.shape == (48,)
    x = torch.randn(4, 64)
    err = (q(x) - linear(x)).abs().max()
    assert 0 < err < 0.01 * linear(x).abs().max()


def test_int8_scales_are_per_output_channel():
    """Rows 1000x apart in magnitude: a per-tensor scale would round the small rows' weights to zero."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 8)
    with torch.no_grad():
        linear.weight[:4] *= 1e-3
        linear.bias.zero_()
    x = torch.randn(3, 64)
    ref = linear(x)
    for q in (DynamicInt8Linear(linear), WeightOnlyInt8Linear(linear)):
        rel = ((q(x) - ref).abs() / ref.abs().amax(0)).amax(0)
        assert (rel < 0.05).all(), rel


def test_an_int8_copy_says_it_holds_one_byte_per_weight():
    model = peaky_model(SMALL, 0)
    assert int8_weight_bytes(quantize_int8(model)) == 1.0 and int8_weight_bytes(model) is None
