"""One forward's analytic FLOPs against torch's flop counter, and its bytes."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlperf.chunk import Chunk
from mlperf.cost import forward_cost, linear_params
from mlperf.model import GEOMETRIES, GPT, GPTConfig

CONFIGS = [GEOMETRIES["draft"], GEOMETRIES["target"], GPTConfig(n_layer=3, n_head=4, n_embd=64, vocab_size=300,
                                                                block_size=256)]


@pytest.mark.parametrize("config", CONFIGS, ids=["draft", "target", "small"])
@pytest.mark.parametrize("context, new, last_only", [(0, 40, True), (37, 1, False), (100, 5, False), (0, 64, False)])
@torch.inference_mode()
def test_matmul_flops_match_the_flop_counter(config, context, new, last_only):
    model = GPT(config).eval()
    cache = model.new_cache()
    if context:
        model(torch.zeros(1, context, dtype=torch.long), Chunk(cache))
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, new, dtype=torch.long), Chunk(cache, last_only=last_only))
    cost = forward_cost(config, context, new, logits_positions=1 if last_only else new)
    assert counter.get_total_flops() == pytest.approx(cost.matmul_flops, rel=0.02)


@pytest.mark.parametrize("context, new", [(0, 16), (50, 1), (50, 5)])
def test_attention_flops_match_explicit_attention(context, new):
    """CPU SDPA is invisible to the flop counter, so count the same attention written as two matmuls."""
    c = CONFIGS[2]
    kv = context + new
    q, k, v = (torch.randn(1, c.n_head, n, c.head_dim) for n in (new, kv, kv))
    with FlopCounterMode(display=False) as counter:
        torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    assert counter.get_total_flops() * c.n_layer == forward_cost(c, context, new).attention_flops


def test_bytes_are_dominated_by_weights_at_decode_and_scale_with_dtype():
    c = GEOMETRIES["target"]
    fp32, fp16 = forward_cost(c, 100, 1), forward_cost(c, 100, 1, act_bytes=2)
    assert fp32.weight_bytes == pytest.approx(c.n_layer * (12 * 384 ** 2 + 13 * 384) * 4 + (256 * 384 + 2 * 384) * 4)
    assert fp16.bytes == pytest.approx(fp32.bytes / 2, rel=0.01)
    assert fp32.kv_read_bytes == c.n_layer * 2 * 101 * 384 * 4
    assert linear_params(c) * 4 < fp32.bytes < 1.1 * linear_params(c) * 4
    int8 = forward_cost(c, 100, 1, weight_bytes_per_param=1)
    assert int8.weight_bytes < fp32.weight_bytes / 3


def test_fp16_weights_under_fp32_arithmetic_are_counted_as_widened():
    """A CPU's kernels widen fp16 weights as they read them: those bytes, and no others, are widened."""
    c = GEOMETRIES["target"]
    half = forward_cost(c, 100, 1, weight_bytes_per_param=2)
    assert half.widened_bytes == linear_params(c) * 2 < half.weight_bytes
    assert forward_cost(c, 100, 5, weight_bytes_per_param=2).widened_bytes == half.widened_bytes  # once a pass
    for kind in (forward_cost(c, 100, 1), forward_cost(c, 100, 1, act_bytes=2),  # fp32; a GPU's fp16 arithmetic
                 forward_cost(c, 100, 1, weight_bytes_per_param=1)):  # int8
        assert kind.widened_bytes == 0
    assert (half + half).widened_bytes == 2 * half.widened_bytes and (half * 3).widened_bytes == 3 * half.widened_bytes
