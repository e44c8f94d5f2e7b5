import pytest
import torch

from suts.quantize import WeightOnlyInt8Linear

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels need a GPU")


def test_the_int8_kernel_matches_the_dequantised_weight():
    torch.manual_seed(0)
    for k, n in ((32, 48), (96, 200), (1600, 50)):
        linear = torch.nn.Linear(k, n).cuda().half()
        q = WeightOnlyInt8Linear(linear)
        for rows in (1, 5, 40):
            x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
            want = torch.nn.functional.linear(x.float(), q.weight.float() * q.scale.float()[:, None], q.bias.float())
            assert torch.allclose(q(x).float(), want, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("rows, heads, T, keys, d", [(1, 25, 1, 512, 64), (3, 2, 5, 100, 16), (2, 6, 16, 64, 64),
                                                      (4, 3, 7, 1000, 32)])
def test_split_attention_matches_pytorchs(rows, heads, T, keys, d):
    """Each query sees the keys up to its own position (rows at different lengths; keys past a split's end, and
    splits a query sees none of, included)."""
    from suts.triton_kernels import attend, attends
    torch.manual_seed(0)
    q = torch.randn(rows, heads, T, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(rows, heads, keys + 24, d, device="cuda", dtype=torch.float16) for _ in range(2))
    pos = torch.stack([torch.arange(T) + keys - T - 37 * b % (keys - T) for b in range(rows)]).cuda()
    visible = torch.arange(keys, device="cuda") <= pos[:, None, :, None]
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k[:, :, :keys].float(), v[:, :, :keys].float(),
                                                            attn_mask=visible)
    assert attends(q)
    assert torch.allclose(attend(q, k, v, pos, keys).float(), want, atol=2e-3)


def test_split_attention_takes_a_steps_half_precision_queries_only():
    from suts.triton_kernels import attends
    q = torch.zeros(1, 2, 4, 64, dtype=torch.float16)
    assert attends(q) and attends(q.bfloat16())
    assert not attends(q.float()) and not attends(torch.zeros(1, 2, 17, 64, dtype=torch.float16))
    assert not attends(torch.zeros(1, 2, 4, 48, dtype=torch.float16))
