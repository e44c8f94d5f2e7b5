import dataclasses

import pytest
import torch

from mlperf.chunk import Chunk
from mlperf.model import GEOMETRIES, GPT
from roofline.analytic import phase_costs


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
    with pytest.raises(ValueError, match="unknown drafter family 'oracle'"):
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


def test_a_forwards_kernels_grow_with_its_layers():
    from roofline.analytic import kernels_per_forward
    t, d = GEOMETRIES["target"], GEOMETRIES["draft"]
    for graphs in (True, False):
        assert kernels_per_forward(t, 1, graphs) > kernels_per_forward(d, 1, graphs)
        assert kernels_per_forward(t, 5, graphs) >= kernels_per_forward(t, 1, graphs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts kernels on a GPU")
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("tokens", [1, 5, 64])
def test_the_kernel_counts_are_what_a_forward_launches(graphs, tokens):
    """kernels_per_forward's table against torch.profiler's count (measured on an H100 for the shipped pair,
    within 10% at GPT-2's width), attention on the kernels the SUTs use (suts/registry.py turns cuDNN's off)."""
    from torch.profiler import ProfilerActivity, profile
    from roofline.analytic import kernels_per_forward
    from suts.fast.graphs import StaticCache
    torch.backends.cuda.enable_cudnn_sdp(False)
    counted, table = {}, {}
    for name in ("target", "draft", "gpt2"):
        model = GPT(GEOMETRIES[name]).cuda().half().eval()
        cache, idx = model.new_cache(1), torch.zeros(1, tokens, dtype=torch.long, device="cuda")
        lengths = torch.full((1,), 100, device="cuda")

        def forward():
            cache.lengths[:] = 100
            if graphs:  # what a graph captures
                model(idx, Chunk(StaticCache(cache.k, cache.v, lengths, tokens, 256), features=True))
            else:
                model(idx, Chunk(cache))
        with torch.inference_mode():
            forward()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                forward()
                torch.cuda.synchronize()
        counted[name] = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())
        table[name] = kernels_per_forward(model.config, tokens, graphs)
    assert counted["target"] == table["target"] and counted["draft"] == table["draft"] and \
        abs(counted["gpt2"] - table["gpt2"]) <= 0.1 * table["gpt2"], f"counted {counted}, the table says {table}"
