"""Linear layers packed once for the CPU's kernels: panels of 16 outputs for the small-row kernel
(suts/fast/kernels/linear.c), oneDNN's blocked layout for larger batches. The fused step (suts/fast/fused.py) reads the
same panels.
"""
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

from mlperf.model import MLP
from mlperf.pages import huge_pages
from suts.fast.native import rows_kernel
from suts.fast.quantize import DynamicInt8Linear, int8_weight_bytes

MIN_PACKED_WEIGHTS = 384 * 384  # below this many weights per layer the default kernel is faster here
PANEL = 16  # outputs per panel of the small-row kernel's weight layout (suts/fast/kernels/linear.c)


class PackedLinear(nn.Module):
    """y = x W^T + b (inference only) with W packed once for each kernel: panels of 16 outputs for the small-row
    kernel, oneDNN's layout for the rest (and for every size where the small-row kernel is unavailable). With
    `gelu` (an MLP's nn.GELU) it returns gelu(y): oneDNN applies it as y is written, not in a pass of its own."""

    def __init__(self, linear: nn.Linear, gelu: nn.GELU | None = None, half: bool = False):
        super().__init__()
        self.in_features, self.out_features, self.gelu = linear.in_features, linear.out_features, gelu
        self.half = half  # its small-row panels are fp16
        weight = linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight))
        self.register_buffer("bias", bias)
        self.kernel = rows_kernel()
        if self.kernel is not None:
            panels, panel_bias = pack_panels(weight, bias, half)
            self.register_buffer("panels", panels)
            self.register_buffer("panel_bias", panel_bias)
            self.max_rows = self.kernel.max_rows()

    def forward(self, x):
        rows = x.numel() // self.in_features
        if self.kernel is None or not 1 <= rows <= self.max_rows:
            return self.large(x)
        with profiled("rows_linear"):
            y = self.small(x, rows)
        return y if self.gelu is None else self.gelu(y)

    def large(self, x: torch.Tensor) -> torch.Tensor:
        """Through oneDNN's blocked kernels, the GELU (if any) fused."""
        if self.gelu is None:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "gelu", [], self.gelu.approximate)

    def small(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """Through the small-row kernel (suts/fast/kernels/linear.c), on torch's threads; not resident (a layer
        alone does not know whether its model fits the last-level cache)."""
        x = x.contiguous()
        y = torch.empty(*x.shape[:-1], self.out_features)
        self.kernel.linear(x.data_ptr(), self.panels.data_ptr(), self.panel_bias.data_ptr(), None, y.data_ptr(),
                           rows, self.in_features, self.out_features, torch.get_num_threads(), self.half, 0)
        return y


def profiled(name: str):
    """A call into C under `name` for torch.profiler where it is recording (it cannot see into C); else nothing."""
    return record_function(name) if torch.autograd.profiler._is_profiler_enabled else nullcontext()


def pack_panels(weight: torch.Tensor, bias: torch.Tensor | None, half: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A (out, in) weight, float or int8, as the small-row kernel reads it, panels of 16 outputs (in, 16), the last
    padded with zeros, in fp16 with `half`; and the bias padded alike (zeros when there is none)."""
    out, k = weight.shape
    pad = -out % PANEL
    weight = weight.detach().half() if half else weight.detach()
    panels = F.pad(weight, (0, 0, 0, pad)).view(-1, PANEL, k).transpose(1, 2).contiguous()
    return panels, pad_to(bias, out)


def panels_on_huge_pages(layers: list[PackedLinear]) -> None:
    """The small-row kernel's panels of `layers` moved onto huge pages, end to end in their order, as a fused step
    has its model's (what the profile and the peaks measure must stream the way the SUTs do)."""
    for layer, panels in zip(layers, huge_pages([layer.panels for layer in layers])):
        layer.panels = panels


def pad_to(vector: torch.Tensor | None, n: int) -> torch.Tensor:
    """A float vector of n entries (zeros when None), padded with zeros to the panels' multiple of 16."""
    return F.pad(torch.zeros(n) if vector is None else vector.detach().float(), (0, -n % PANEL)).contiguous()


def kernel_weights(layer: nn.Module, half: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A linear layer's panels, padded bias, and scales for int8 panels (None for float ones): a packed layer's
    own, a plain one's packed here (fp16 with `half`), an int8 one's (suts/fast/quantize.py) unpacked from fbgemm and
    packed here."""
    if isinstance(layer, PackedLinear):
        return layer.panels, layer.panel_bias, None
    if isinstance(layer, DynamicInt8Linear):
        qweight, bias = torch.ops.quantized.linear_unpack(layer.packed)
        panels, bias = pack_panels(qweight.int_repr(), bias)
        return panels, bias, pad_to(qweight.q_per_channel_scales(), qweight.shape[0])
    return (*pack_panels(layer.weight, layer.bias, half), None)


def can_pack(model: nn.Module) -> bool:
    p = next(model.parameters())
    return p.device.type == "cpu" and p.dtype == torch.float32 and torch.backends.mkldnn.is_available()


def pack_linears(model: nn.Module, min_weights: int = MIN_PACKED_WEIGHTS, half: bool = False) -> nn.Module:
    """Replace, in place, every large enough nn.Linear of a float32 CPU model by a PackedLinear (an MLP's first one
    taking over its GELU), with fp16 panels where `half` (streams_half says where they may be)."""
    if not can_pack(model):
        return model
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear and child.weight.numel() >= min_weights:
                fold = isinstance(parent, MLP) and name == "c_fc" and type(parent.gelu) is nn.GELU
                setattr(parent, name, PackedLinear(child, parent.gelu if fold else None, half))
                if fold:
                    parent.gelu = nn.Identity()
    return model


def streams_half(model: nn.Module, weights: str) -> bool:
    """The kernels' panels are fp16 with weights "fp16" where every float linear weight is one (as our checkpoints
    store them): half the bytes to stream, the same sums; otherwise fp32."""
    return weights == "fp16" and rows_kernel() is not None and halves_exactly(model)


def halves_exactly(model: nn.Module) -> bool:
    """Every float linear weight of `model` is an fp16 number (int8 ones are int8 either way)."""
    weights = [m.weight for m in model.modules() if type(m) is nn.Linear]
    return bool(weights) and all(torch.equal(w.detach().half().float(), w.detach()) for w in weights)


def panel_bytes(runner) -> float | None:
    """2.0 (bytes per linear weight) for a model, or a runner (suts/fast/runner.py) whose model or fast step
    streams fp16 panels; None for one that streams its own dtype."""
    step, model = getattr(runner, "fast_step", None), getattr(runner, "model", runner)  # a model has neither
    return 2.0 if any(m.half for m in model.modules() if isinstance(m, PackedLinear)) or \
        (step is not None and step.half) else None


def streamed(runner) -> str:
    """What a model's (or a runner's) linear weights stream as: int8, fp16 (fp16 panels, or an fp16 model) or fp32
    (or bf16: the model's own dtype)."""
    kind = {1.0: "int8", 2.0: "fp16"}.get(weight_bytes(runner))
    dtype = next(getattr(runner, "model", runner).parameters()).dtype
    return kind or {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, "fp32")


def weight_bytes(runner) -> float | None:
    """Bytes per linear weight that a model's (or a runner's) steps stream where that is not its dtype's (the
    roofline's act_bytes): 1.0 for int8 weights, 2.0 for fp16 panels, else None."""
    return int8_weight_bytes(getattr(runner, "model", runner)) or panel_bytes(runner)
