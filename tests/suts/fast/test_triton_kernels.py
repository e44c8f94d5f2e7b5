"""The Triton kernels against PyTorch: on a GPU as the graphs run them, and on a CPU-only machine (CI) under
Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py where there is no GPU), so that a change that
breaks them fails without a GPU."""
import pytest
import torch

from suts.fast.quantize import WeightOnlyInt8Linear

pytest.importorskip("triton", reason="Triton is not installed (pip install triton; the test extras install it)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: the interpreter runs the kernels' code in numpy


def test_the_int8_kernel_matches_the_dequantised_weight():
    from suts.fast.triton_kernels import int8_linear
    torch.manual_seed(0)
    for k, n in ((32, 48), (96, 200), (1600, 50)):
        linear = torch.nn.Linear(k, n).to(DEVICE).half()
        q = WeightOnlyInt8Linear(linear)
        for rows in (1, 5, 40):
            x = torch.randn(rows, k, device=DEVICE, dtype=torch.float16)
            want = torch.nn.functional.linear(x.float(), q.weight.float() * q.scale.float()[:, None], q.bias.float())
            got = q(x) if DEVICE == "cuda" else int8_linear(x, q.weight, q.scale, q.bias)  # the module's CUDA path
            assert torch.allclose(got.float(), want, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("rows, heads, T, keys, d", [(1, 25, 1, 512, 64), (3, 2, 5, 100, 16), (2, 6, 16, 64, 64),
                                                      (4, 3, 7, 1000, 32)])
def test_split_attention_matches_pytorchs(rows, heads, T, keys, d):
    """Each query sees the keys up to its own position (rows at different lengths; keys past a split's end, and
    splits a query sees none of, included)."""
    from suts.fast.triton_kernels import attend, attends
    torch.manual_seed(0)
    q = torch.randn(rows, heads, T, d, device=DEVICE, dtype=torch.float16)
    k, v = (torch.randn(rows, heads, keys + 24, d, device=DEVICE, dtype=torch.float16) for _ in range(2))
    pos = torch.stack([torch.arange(T) + keys - T - 37 * b % (keys - T) for b in range(rows)]).to(DEVICE)
    visible = torch.arange(keys, device=DEVICE) <= pos[:, None, :, None]
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k[:, :, :keys].float(), v[:, :, :keys].float(),
                                                            attn_mask=visible)
    assert attends(q)
    assert torch.allclose(attend(q, k, v, pos, keys).float(), want, atol=2e-3)


def test_split_attention_takes_a_steps_half_precision_queries_only():
    from suts.fast.triton_kernels import attends
    q = torch.zeros(1, 2, 4, 64, dtype=torch.float16)
    assert attends(q) and attends(q.bfloat16())
    assert not attends(q.float()) and not attends(torch.zeros(1, 2, 17, 64, dtype=torch.float16))
    assert not attends(torch.zeros(1, 2, 4, 48, dtype=torch.float16))
