"""CPU fast path: nn.Linear layers whose weights are prepacked once into oneDNN's blocked layout (and, for a single
row, kept transposed for addmm where that streams them faster).

On this kind of CPU the default (MKL) matmul makes a 5-row verify pass cost 2.5-3x a 1-row decode step; a
prepacked oneDNN weight brings that to about 1.3-1.6x (the same kernels `torch.compile` uses with frozen
weights). Packing pays off only for large layers, so small ones (a tiny draft's) stay on the default path.
Every SUT gets the same treatment, so the baseline is as fast as the speculative SUTs' target.
"""
import math
import time

import torch
import torch.nn as nn

MIN_PACKED_WEIGHTS = 384 * 384  # below this many weights per layer the default kernel is faster here


class PackedLinear(nn.Module):
    """y = x W^T + b through oneDNN with W reordered once (inference only). With `one_row` set, a single row (a
    decode step at batch 1) goes through addmm over a contiguous copy of W^T instead, where pack_linears measured
    that faster; oneDNN keeps every chunk of two rows or more."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach()))
        self.register_buffer("weight_t", linear.weight.detach().t().contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.one_row = False

    def forward(self, x):
        if self.one_row and x.numel() == self.in_features:
            row = x.reshape(1, -1)
            y = row @ self.weight_t if self.bias is None else torch.addmm(self.bias, row, self.weight_t)
            return y.view(*x.shape[:-1], self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


_ONE_ROW: dict[tuple, bool] = {}  # (torch threads, layer shapes) -> whether addmm won, once per process


@torch.inference_mode()
def one_row_faster(layers: list[PackedLinear]) -> bool:
    """Whether one row streams through these layers faster by addmm over W^T than by oneDNN, at the current thread
    count: it depends on both (on a Zen 3 EPYC addmm was 20% faster on one thread, 8% slower on two). Measured
    once per process and set of shapes, so that every SUT built in it runs the same kernels."""
    key = (torch.get_num_threads(), tuple((layer.in_features, layer.out_features) for layer in layers))
    if key not in _ONE_ROW:
        rows = {layer.in_features: torch.randn(1, layer.in_features) for layer in layers}
        best = {True: math.inf, False: math.inf}
        for _ in range(6):  # alternating, so that a drift in the machine's speed hits both alike
            for one_row in best:
                for layer in layers:
                    layer.one_row = one_row
                start = time.perf_counter()
                for layer in layers:
                    layer(rows[layer.in_features])
                best[one_row] = min(best[one_row], time.perf_counter() - start)
        _ONE_ROW[key] = best[True] < best[False]
    return _ONE_ROW[key]


def can_pack(model: nn.Module) -> bool:
    p = next(model.parameters())
    return p.device.type == "cpu" and p.dtype == torch.float32 and torch.backends.mkldnn.is_available()


def pack_linears(model: nn.Module, min_weights: int = MIN_PACKED_WEIGHTS) -> nn.Module:
    """Replace, in place, every large enough nn.Linear of a float32 CPU model by a PackedLinear, all of them on
    the one-row path or none (one_row_faster); the transposed copies are dropped where it is not taken."""
    if not can_pack(model):
        return model
    layers = []
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear and child.weight.numel() >= min_weights:
                layers.append(PackedLinear(child))
                setattr(parent, name, layers[-1])
    one_row = bool(layers) and one_row_faster(layers)
    for layer in layers:
        layer.one_row = one_row
        if not one_row:
            layer.weight_t = None
    return model
