"""Int8 weights for a draft model: every nn.Linear quantised symmetrically per output channel.

CPU: fbgemm dynamic quantisation (int8 weights, activations quantised on the fly), called straight through
its op: `torch.ao`'s dynamic Linear module adds enough Python per call to make a small draft's step ~50%
slower than fp32, the bare op ~25% (quantising each input costs what the smaller weights save on 128-wide
layers; from 384x1152 weights up the op is 2-3x faster than fp32). On the CPU fast path (suts/fast/fused.py) the
fused step reads the same int8 weights and scales as weight-only int8, the activations left in float; fbgemm
takes only the chunks the fused step does not (long prefills).
CUDA: weight-only int8 (int8 weights and per-channel scales) through a Triton kernel that widens each tile in
registers (suts/fast/triton_kernels.py), never building an fp16 weight.
Only the draft is ever quantised, so greedy speculative output stays identical to the target's.
"""
import copy
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from mlperf.model import GPT
from suts.fast.graphs import triton_kernels


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 weights and the per-output-row scales that restore them."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127
    return torch.round(w / scale[:, None]).to(torch.int8), scale


class DynamicInt8Linear(nn.Module):
    """fbgemm's int8 linear, CPU: int8 weights prepacked once, each input quantised per call."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w, scale = int8_per_channel(linear.weight)
        with warnings.catch_warnings():  # quantized tensors are deprecated in favour of torchao, slower here
            warnings.simplefilter("ignore")
            zeros = torch.zeros_like(scale, dtype=torch.long)
            qweight = torch._make_per_channel_quantized_tensor(w, scale.double(), zeros, 0)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x):
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)  # reduce_range, as fbgemm on x86 needs


class WeightOnlyInt8Linear(nn.Module):
    """y = x @ (int8 W * per-row scale).T + b, for GPUs."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w, scale = int8_per_channel(linear.weight)
        self.register_buffer("weight", w)
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())

    def forward(self, x):
        if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and (kernels := triton_kernels()) is not None:
            return kernels.int8_linear(x, self.weight, self.scale, self.bias)
        return F.linear(x, self.weight.to(x.dtype) * self.scale[:, None], self.bias)  # the reference


def quantize_int8(model: GPT) -> GPT:
    """An int8 copy of `model` (the original is left untouched)."""
    model = copy.deepcopy(model).eval()
    cpu = model.transformer.wte.weight.device.type == "cpu"
    if cpu:
        model.float()  # fbgemm takes fp32 activations
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                setattr(parent, name, DynamicInt8Linear(child) if cpu else WeightOnlyInt8Linear(child))
    return model


def int8_weight_bytes(model: GPT) -> float | None:
    """1.0 (bytes per linear weight) for a model quantize_int8 made, None for one in its own dtype."""
    return 1.0 if any(isinstance(m, (DynamicInt8Linear, WeightOnlyInt8Linear)) for m in model.modules()) else None
