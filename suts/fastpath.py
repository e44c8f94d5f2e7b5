"""CPU fast path: nn.Linear layers whose weights are prepacked once, for the two kinds of matmul a decoder runs,
and a fused forward for short chunks.

A few rows (a decode step, a speculative verify pass, a small batch: up to the kernel's max_rows) go through
suts/kernels.c, which streams the weights once at the memory's speed however many rows there are, and gives each row
the same result whatever its batch. More rows (a prefill, a large batch) go through oneDNN with the weight
reordered into its blocked layout (the kernels `torch.compile` uses with frozen weights). On a Zen 3 EPYC, one
thread, the target's 24 linears at 5 rows take 2.5 ms by the first against 4.5 ms by oneDNN and 5.9 ms by the
default (MKL) matmul. Packing pays off only for large layers, so small ones (a tiny draft's) stay on the default
path. A forward of a few tokens in all (a decode step, a verify pass, a draft step, a draft's catch-up) runs as
one C call instead (FusedStep: kernels.c's `step`), free of Python and dispatch between its ops; they were about
half of a tiny draft's step. Every SUT gets the same treatment, so the baseline is as fast as the speculative
SUTs' target.
"""
import ctypes

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

from mlperf.model import GPT, KVCache, TreeMask
from suts.native import rows_kernel

MIN_PACKED_WEIGHTS = 384 * 384  # below this many weights per layer the default kernel is faster here
PANEL = 16  # outputs per panel of the small-row kernel's weight layout (suts/kernels.c)


class PackedLinear(nn.Module):
    """y = x W^T + b (inference only) with W packed once for each kernel: panels of 16 outputs for the small-row
    kernel, oneDNN's layout for the rest (and for every size where the small-row kernel is unavailable)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight))
        self.register_buffer("bias", bias)
        self.kernel = rows_kernel()
        if self.kernel is not None:
            panels, panel_bias = pack_panels(weight, bias)
            self.register_buffer("panels", panels)
            self.register_buffer("panel_bias", panel_bias)
            self.max_rows = self.kernel.max_rows()

    def forward(self, x):
        rows = x.numel() // self.in_features
        if self.kernel is None or not 1 <= rows <= self.max_rows:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if torch.autograd.profiler._is_profiler_enabled:  # named for torch.profiler, which cannot see into C
            with record_function("rows_linear"):
                return self.small(x, rows)
        return self.small(x, rows)

    def small(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """Through the small-row kernel (suts/kernels.c), on torch's threads."""
        x = x.contiguous()
        y = torch.empty(*x.shape[:-1], self.out_features)
        self.kernel.linear(x.data_ptr(), self.panels.data_ptr(), self.panel_bias.data_ptr(), y.data_ptr(), rows,
                           self.in_features, self.out_features, torch.get_num_threads())
        return y


def pack_panels(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A (out, in) weight as the small-row kernel reads it, panels of 16 outputs (in, 16), the last padded with
    zeros; and the bias padded alike (zeros when there is none)."""
    out, k = weight.shape
    pad = -out % PANEL
    panels = F.pad(weight.detach(), (0, 0, 0, pad)).view(-1, PANEL, k).transpose(1, 2).contiguous()
    return panels, F.pad(torch.zeros(out) if bias is None else bias.detach(), (0, pad)).contiguous()


LAYER_FIELDS = ("ln1_w", "ln1_b", "attn_p", "attn_b", "proj_p", "proj_b", "ln2_w", "ln2_b", "fc_p", "fc_b",
                "out_p", "out_b")


class _Layer(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in LAYER_FIELDS]


class _Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in ("n_layer", "n_head", "n_embd", "vocab")] + \
        [(name, ctypes.c_void_p) for name in ("wte", "wpe", "lnf_w", "lnf_b", "head_p", "head_b", "layers")]


class FusedStep:
    """A GPT's forward of at most max_rows new tokens in all, against its KV cache, in one call of kernels.c's
    `step`; GPT.forward hands it every such chunk (its `fused` hook) and runs its modules for the rest."""

    def __init__(self, model: GPT, kernel):
        self.kernel, self.config, self.max_rows = kernel, model.config, kernel.max_rows()
        self.tensors = []  # what the structs point into, kept alive with them

        def vec(t: torch.Tensor | None, n: int) -> int:
            self.tensors.append(torch.zeros(n) if t is None else t.detach().contiguous())
            return self.tensors[-1].data_ptr()

        def lin(layer: nn.Module) -> tuple[int, int]:
            pair = (layer.panels, layer.panel_bias) if isinstance(layer, PackedLinear) else \
                pack_panels(layer.weight, layer.bias)
            self.tensors.extend(pair)
            return pair[0].data_ptr(), pair[1].data_ptr()

        C = model.config.n_embd
        layers = [_Layer(vec(b.ln_1.weight, C), vec(b.ln_1.bias, C), *lin(b.attn.c_attn), *lin(b.attn.c_proj),
                         vec(b.ln_2.weight, C), vec(b.ln_2.bias, C), *lin(b.mlp.c_fc), *lin(b.mlp.c_proj))
                  for b in model.transformer.h]
        self.layers = (_Layer * len(layers))(*layers)
        t, c = model.transformer, model.config
        self.model = _Model(c.n_layer, c.n_head, c.n_embd, c.vocab_size, vec(t.wte.weight, 0), vec(t.wpe.weight, 0),
                            vec(t.ln_f.weight, C), vec(t.ln_f.bias, C), *lin(model.lm_head),
                            ctypes.cast(self.layers, ctypes.c_void_p))

    @staticmethod
    def fits(model: nn.Module) -> bool:
        """A float32 CPU GPT whose every linear layer is a plain or packed one (an int8 draft's are not)."""
        linears = [m for m in model.modules() if "Linear" in type(m).__name__]
        return isinstance(model, GPT) and can_pack(model) and all(type(m) in (nn.Linear, PackedLinear)
                                                                  for m in linears)

    def __call__(self, idx: torch.Tensor, cache: KVCache, tree: TreeMask | None, lens: list[int] | None,
                 last_only: bool, features: bool):
        """What GPT.forward returns for this chunk (a tree's nodes, a packed chunk, each row's next tokens), or None
        where the fused step does not take it: more than max_rows tokens, an empty row in a packed chunk, features
        of the last tokens only, token ids outside the vocabulary (the modules raise the error), a cache not laid
        out as the kernel reads it."""
        B, T = idx.shape
        counts = [T] * B if lens is None else lens
        n = sum(counts)
        k = cache.k
        if n > self.max_rows or min(counts) < 1 or (features and last_only) or k.dtype != torch.float32 \
                or k.device.type != "cpu" or k.stride()[2:] != (k.shape[3] * k.shape[4], k.shape[4], 1):
            return None
        if lens is not None and len(lens) != len(cache.lengths):
            return None
        low, high = torch.aminmax(idx)
        if low < 0 or high >= self.config.vocab_size:
            return None
        starts = cache.lengths
        cache.check(int(starts.max()) + max(counts))
        rows = len(counts)
        threads = torch.get_num_threads()
        C, out = self.config.n_embd, rows if last_only else n
        ids, work = idx.contiguous(), torch.empty(10 * n * C + threads * cache.max_len)
        hidden, logits = torch.empty(out, C), torch.empty(out, self.config.vocab_size)
        depths = visible = None
        if tree is not None:
            depths, visible = tree.depths.contiguous(), tree.visible[-T:].to(torch.uint8).contiguous()
        args = (ctypes.byref(self.model), ids.data_ptr(), starts.data_ptr(), rows, (ctypes.c_int * rows)(*counts),
                None if tree is None else depths.data_ptr(), None if tree is None else visible.data_ptr(),
                0 if tree is None else visible.shape[1], k.data_ptr(), cache.v.data_ptr(), k.stride(0), k.stride(1),
                cache.max_len, work.data_ptr(), hidden.data_ptr(), logits.data_ptr(), int(last_only), threads)
        if torch.autograd.profiler._is_profiler_enabled:  # named for torch.profiler, which cannot see into C
            with record_function("fused_step"):
                self.kernel.step(*args)
        else:
            self.kernel.step(*args)
        cache.lengths += torch.tensor(counts) if lens is not None else T
        shape = (rows, 1) if last_only else (1, n) if lens is not None else (B, T)
        logits = logits.view(*shape, -1)
        return (logits, hidden.view(*shape, -1)) if features else logits


def can_pack(model: nn.Module) -> bool:
    p = next(model.parameters())
    return p.device.type == "cpu" and p.dtype == torch.float32 and torch.backends.mkldnn.is_available()


def pack_linears(model: nn.Module, min_weights: int = MIN_PACKED_WEIGHTS) -> nn.Module:
    """Replace, in place, every large enough nn.Linear of a float32 CPU model by a PackedLinear; and give a GPT
    that the kernels can run whole its FusedStep."""
    if not can_pack(model):
        return model
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear and child.weight.numel() >= min_weights:
                setattr(parent, name, PackedLinear(child))
    if (kernel := rows_kernel()) is not None and FusedStep.fits(model):
        model.fused = FusedStep(model, kernel)
    return model
