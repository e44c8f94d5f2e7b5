"""SUTs by name, plus `package.module:ClassName` plug-ins, and building one from checkpoint paths."""
import inspect

import torch

from mlperf import HEAD
from mlperf.checkpoint import load_head, load_model
from suts.base import SUT
from suts.baseline import Baseline
from suts.eagle import Eagle, EagleAuto, EagleTree
from suts.ngram import PromptLookup, PromptLookupAuto, PromptLookupTree
from suts.plugins import plugin
from suts.quantize import quantize_int8
from suts.speculative import (SelfSpeculativeInt8, Speculative, SpeculativeAuto, SpeculativeInt8, SpeculativeInt8Tree,
                              SpeculativeTree)

SUTS = {cls.name: cls for cls in (Baseline, Speculative, SpeculativeInt8, SelfSpeculativeInt8, PromptLookup,
                                      Eagle, SpeculativeTree, SpeculativeInt8Tree, PromptLookupTree, EagleTree,
                                      SpeculativeAuto, PromptLookupAuto, EagleAuto)}


def sut_class(name: str) -> type[SUT]:
    """The SUT class for a registered name or a `package.module:ClassName` plug-in."""
    if name in SUTS:
        return SUTS[name]
    if ":" not in name:
        raise ValueError(f"unknown SUT {name!r}; choose one of {', '.join(SUTS)} or give package.module:ClassName")
    cls = plugin(name, "SUT plug-in")
    if not (inspect.isclass(cls) and callable(getattr(cls, "generate", None))):
        raise ValueError(f"SUT plug-in {name!r} is not a class with a generate() method")
    return cls


def default_dtype(device: str) -> torch.dtype:
    """fp16 on CUDA; fp32 on CPU, where half precision has no fast arithmetic."""
    return torch.float16 if torch.device(device).type == "cuda" else torch.float32


def build_sut(name: str, target: str, draft: str | None = None, device: str = "cpu",
              dtype: torch.dtype | None = None, eos_id: int | None = None, fast: bool = True,
              head: str = str(HEAD), weights: str = "fp32", **options) -> SUT:
    """Load the checkpoints a SUT needs (a draft model, or an EAGLE head) and construct it; options (gamma,
    adaptive, ...) go to the constructor when it takes them. `fast` puts every SUT's models on the fast path
    alike: the CPU's fused steps (suts/fastpath.py), or CUDA graphs on a GPU (suts/graphs.py); `weights` is what
    the CPU's kernels stream (fp16 panels where a model's weights are fp16, or fp32), or "int8" for a target
    quantised to int8 weights (every SUT then verifies exactly against that int8 target)."""
    cls = sut_class(name)
    dtype = dtype or default_dtype(device)
    if torch.device(device).type == "cuda":  # cuDNN's attention plans a kernel for each new key count, taking
        torch.backends.cuda.enable_cudnn_sdp(False)  # milliseconds: every prefill and eager step would pay it
    target_model = load_model(target, device, dtype)
    if weights == "int8":  # weight-only int8 per output channel: not lossless against the checkpoint's weights
        target_model = quantize_int8(target_model)
    draft_model = load_model(draft, device, dtype) if getattr(cls, "needs_draft", False) and draft else None
    if getattr(cls, "needs_head", False):
        draft_model = load_head(head, target_model, device, dtype)
    accepted = inspect.signature(cls).parameters
    kwargs = {k: v for k, v in options.items() if k in accepted and v is not None}
    try:
        sut = cls(target_model, draft_model, eos_id=eos_id, **kwargs)
    except ValueError:
        raise
    except Exception as e:  # a plug-in's constructor may raise anything: one line naming the SUT
        raise ValueError(f"SUT {name} could not be built: {type(e).__name__}: {e}") from None
    if fast and isinstance(sut, SUT):  # after construction, so an int8 draft is quantised from the plain model
        sut.use_fast_path(weights)
    return sut
