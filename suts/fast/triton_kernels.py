"""The GPU fast path's Triton kernels, imported only where Triton and a GPU are (suts/graphs.triton_kernels).

- int8_linear: weight-only int8 without an fp16 copy of the weight. The kernel reads the int8 weight tile by tile,
  widens it in registers, and applies the per-output-row scale to the sums, so a layer reads one byte per weight.
  (Dequantising the whole weight first, y = x @ (W * s).T, reads one byte, writes two and reads two again: an
  int8 draft slower than an fp16 one.)
- attend: attention of a step's few queries a row over the KV cache, split across programs by keys (as
  flash-decoding does) and then combined. PyTorch's memory-efficient kernel gives each (row, head) one program
  that walks every key, about three times the split kernel's time for one query over hundreds of keys.
"""
import math

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
        BM, BN, BK, warps = 16, 16, 256 if K >= 1024 else 128, 2  # of the tilings tried at GPT-2 widths)
    else:
        BM, BN, BK, warps = 64, 64, 128, 4
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _int8_linear[grid](x2, weight, scale, bias if bias is not None else scale, y, M, N, K, HAS_BIAS=bias is not None,
                       BM=BM, BN=BN, BK=BK, num_warps=warps)
    return y.view(*x.shape[:-1], N)


MAX_QUERIES = 16  # queries a row `attend` takes (tl.dot's smallest tile); longer chunks take PyTorch's kernel
SPLIT = 64  # keys a program reads


@triton.jit
def _attend_split(q, k, v, pos, m_out, l_out, acc_out, sq_b, sq_h, sq_t, sk_b, sk_h, sk_n, H, T, keys, scale,
                  D: tl.constexpr, TQ: tl.constexpr, S: tl.constexpr, NS: tl.constexpr):
    """One (row, head) and S keys: each query's scores' max, its softmax's sum and its weighted values there."""
    bh, s = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    t, d, n = tl.arange(0, TQ), tl.arange(0, D), s * S + tl.arange(0, S)
    qs = tl.load(q + b * sq_b + h * sq_h + t[:, None] * sq_t + d[None, :], mask=t[:, None] < T, other=0.0)
    last = tl.load(pos + b * T + t, mask=t < T, other=-1)  # the last key each query sees
    at = b * sk_b + h * sk_h + n[:, None] * sk_n + d[None, :]
    ks = tl.load(k + at, mask=n[:, None] < keys, other=0.0)
    scores = tl.dot(qs, tl.trans(ks)) * scale
    scores = tl.where(n[None, :] <= last[:, None], scores, float("-inf"))
    top = tl.max(scores, 1)
    p = tl.exp(scores - tl.where(top == float("-inf"), 0.0, top)[:, None])  # a query that sees no key here: 0
    vs = tl.load(v + at, mask=n[:, None] < keys, other=0.0)
    out = (bh * NS + s) * TQ + t
    tl.store(m_out + out, top)
    tl.store(l_out + out, tl.sum(p, 1))
    tl.store(acc_out + out[:, None] * D + d[None, :], tl.dot(p.to(vs.dtype), vs))


@triton.jit
def _attend_combine(m_in, l_in, acc_in, o, so_b, so_h, so_t, H, T, splits, D: tl.constexpr, TQ: tl.constexpr,
                    NS: tl.constexpr):
    """One (row, head): the splits' partial softmaxes rescaled to their common max and summed."""
    bh = tl.program_id(0)
    b, h = bh // H, bh % H
    s, t, d = tl.arange(0, NS), tl.arange(0, TQ), tl.arange(0, D)
    at = (bh * NS + s[:, None]) * TQ + t[None, :]  # (NS, TQ)
    live = s[:, None] < splits
    m = tl.load(m_in + at, mask=live, other=float("-inf"))
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - tl.max(m, 0)[None, :]))
    total = tl.sum(w * tl.load(l_in + at, mask=live, other=0.0), 0)
    acc = tl.sum(w[:, :, None] * tl.load(acc_in + at[:, :, None] * D + d[None, None, :], mask=live[:, :, None],
                                         other=0.0), 0)
    tl.store(o + b * so_b + h * so_h + t[:, None] * so_t + d[None, :], (acc / total[:, None]).to(o.dtype.element_ty),
             mask=t[:, None] < T)


def attends(q: torch.Tensor) -> bool:
    """Whether `attend` takes these queries (rows, heads, T, head_dim): a few, half precision, a power-of-two head."""
    T, D = q.shape[2:]
    return T <= MAX_QUERIES and q.dtype in (torch.float16, torch.bfloat16) and 16 <= D <= 256 and D & (D - 1) == 0


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, keys: int) -> torch.Tensor:
    """Attention of q (rows, heads, T, d) over the first `keys` of k, v (rows, heads, >= keys, d), query t of row b
    seeing keys 0..pos[b, t] (pos: (rows, T), contiguous): (rows, heads, T, d)."""
    B, H, T, D = q.shape
    splits = triton.cdiv(keys, SPLIT)
    NS = triton.next_power_of_2(splits)
    m = torch.empty(B * H * NS * MAX_QUERIES, device=q.device, dtype=torch.float32)
    total = torch.empty_like(m)
    acc = torch.empty(B * H * NS * MAX_QUERIES * D, device=q.device, dtype=torch.float32)
    o = torch.empty(B, T, H, D, device=q.device, dtype=q.dtype).transpose(1, 2)  # as the model reshapes it next
    _attend_split[(B * H, splits)](q, k, v, pos, m, total, acc, *q.stride()[:3], *k.stride()[:3], H, T, keys,
                                   1 / math.sqrt(D), D=D, TQ=MAX_QUERIES, S=SPLIT, NS=NS)
    _attend_combine[(B * H,)](m, total, acc, o, *o.stride()[:3], H, T, splits, D=D, TQ=MAX_QUERIES, NS=NS)
    return o
