import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlperf.model import GEOMETRIES, GPT, GPTConfig
from roofline.analytic import forward_cost, linear_params, phase_costs

CONFIGS = [GEOMETRIES["draft"], GEOMETRIES["target"], GPTConfig(n_layer=3, n_head=4, n_embd=64, vocab_size=300,
                                                                block_size=256)]


@pytest.mark.parametrize("config", CONFIGS, ids=["draft", "target", "small"])
@pytest.mark.parametrize("context, new, last_only", [(0, 40, True), (37, 1, False), (100, 5, False), (0, 64, False)])
@torch.inference_mode()
def test_matmul_flops_match_the_flop_counter(config, context, new, last_only):
    model = GPT(config).eval()
    cache = model.new_cache()
    if context:
        model(torch.zeros(1, context, dtype=torch.long), cache)
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, new, dtype=torch.long), cache, last_only=last_only)
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


def test_verify_reads_the_weights_once_for_gamma_plus_one_tokens():
    p = phase_costs(GEOMETRIES["target"], prompt_len=100, context=150, draft=GEOMETRIES["draft"], gamma=4)
    assert p["verify"].weight_bytes == p["decode"].weight_bytes
    assert p["verify"].matmul_flops == pytest.approx(5 * p["decode"].matmul_flops)
    assert p["verify"].intensity > 4 * p["decode"].intensity
    assert p["cycle"].flops == pytest.approx(4 * p["draft"].flops + p["verify"].flops)
    assert set(phase_costs(GEOMETRIES["target"], 100, 150)) == {"prefill", "decode"}
    lookup = phase_costs(GEOMETRIES["target"], 100, 150, gamma=4, drafter="lookup")  # no model
    assert lookup["draft"].flops == lookup["draft"].bytes == lookup["draft"].intensity == 0
    assert lookup["cycle"] == lookup["verify"] == p["verify"]
    head = dataclasses.replace(GEOMETRIES["target"], n_layer=1)
    eagle = phase_costs(GEOMETRIES["target"], 100, 150, draft=head, gamma=4, drafter="head")["draft"]
    block = phase_costs(GEOMETRIES["target"], 100, 150, draft=head, gamma=4)["draft"]
    assert eagle.matmul_flops - block.matmul_flops == 2 * 2 * 384 * 384  # the 2d -> d input layer
    with pytest.raises(ValueError, match="unknown drafter 'oracle'"):
        phase_costs(GEOMETRIES["target"], 100, 150, drafter="oracle")


def test_a_tree_verifies_every_node_and_drafts_a_level_per_step():
    """Tree 2,2,1: 2 + 4 + 4 nodes and the root verified together; the draft reads the root, 2 and 4 nodes in its
    3 steps (7/3 tokens a step, once per step for the weights)."""
    t, d = GEOMETRIES["target"], GEOMETRIES["draft"]
    tree = phase_costs(t, 100, 150, draft=d, tree=[2, 2, 1])
    one = phase_costs(t, 100, 150, draft=d, gamma=1)
    assert tree["verify"].matmul_flops == pytest.approx(11 / 2 * one["verify"].matmul_flops)
    assert tree["verify"].weight_bytes == one["verify"].weight_bytes
    assert tree["draft"].matmul_flops == pytest.approx(7 / 3 * one["draft"].matmul_flops)
    assert tree["draft"].weight_bytes == one["draft"].weight_bytes
    assert tree["cycle"].flops == pytest.approx(3 * tree["draft"].flops + tree["verify"].flops)


def test_a_batched_decode_step_reads_the_weights_once_for_every_row():
    one, eight = (phase_costs(GEOMETRIES["target"], 100, 150, batch=b)["decode"] for b in (1, 8))
    assert eight.weight_bytes == one.weight_bytes and eight.flops == pytest.approx(8 * one.flops)
    assert eight.intensity > 5 * one.intensity
