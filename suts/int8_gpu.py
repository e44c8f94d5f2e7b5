"""Weight-only int8 linear on a GPU without an fp16 copy of the weight: a Triton kernel reads the int8 weight
tile by tile, widens it in registers, and applies the per-output-row scale to the sums, so a layer reads one
byte per weight. (Dequantising the whole weight first, y = x @ (W * s).T, reads one byte, writes two and reads
two again: an int8 draft slower than an fp16 one.) Imported only where Triton and a GPU are.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _int8_linear(x, w, scale, bias, y, M, N, K, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr):
    """y[m, n] = sum_k x[m, k] w[n, k] * scale[n] (+ bias[n]); x, y row-major (M, K), (M, N); w (N, K) int8."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(x + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(w + rn[None, :] * K + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0)
        acc += tl.dot(a, b.to(a.dtype))
    acc *= tl.load(scale + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y + rm[:, None] * N + rn[None, :], acc.to(y.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def int8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) fp16/bf16 times int8 weight (N, K) with per-row scales (N,), plus bias: (..., N)."""
    N, K = weight.shape
    x2 = x.reshape(-1, K).contiguous()
    M = x2.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M <= 16:  # a step's few rows: narrow tiles, so that many programs stream the weight at once (the best
        BM, BN, BK, warps = 16, 16, 256 if K >= 1024 else 128, 2  # of 12 tilings at GPT-2 widths on an H100)
    else:
        BM, BN, BK, warps = 64, 64, 128, 4
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _int8_linear[grid](x2, weight, scale, bias if bias is not None else scale, y, M, N, K, HAS_BIAS=bias is not None,
                       BM=BM, BN=BN, BK=BK, num_warps=warps)
    return y.view(*x.shape[:-1], N)
