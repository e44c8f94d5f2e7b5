"""Where the models run: the CPU, an NVIDIA GPU (cuda, cuda:N) or Apple's GPU (mps). Every question the harness
asks of a device is answered here, so that nothing but the CUDA fast path (suts/fast/graphs.py,
suts/fast/triton_kernels.py) branches on which one it is."""
import os

import torch

KINDS = ("cpu", "cuda", "mps")


def check(device: str) -> None:
    """A one-line ValueError for a device that is not one of ours or that this machine does not have."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in KINDS:
        raise ValueError(f"unknown device {device!r}; use cpu, cuda, cuda:N or mps")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    if kind == "mps" and not torch.backends.mps.is_available():
        why = "this machine has no Apple GPU" if torch.backends.mps.is_built() else "this torch was built without MPS"
        raise ValueError(f"device {device!r} requested but Apple's GPU (MPS) is not available: {why}")


def present() -> str | None:
    """This machine's GPU, "cuda" or "mps"; None where it has none."""
    return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else None


def accelerated(device: str) -> bool:
    """A GPU, whose kernels run asynchronously and in half precision."""
    return torch.device(device).type != "cpu"


def default_dtype(device: str) -> torch.dtype:
    """fp16 on a GPU (CUDA or MPS); fp32 on a CPU, where half precision has no fast arithmetic."""
    return torch.float16 if accelerated(device) else torch.float32


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued kernels (a timer reads the time after them); nothing on a CPU."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def describe(device: str) -> str | None:
    """The accelerator by name ("GPU NVIDIA H100 80GB HBM3", "Apple GPU (MPS)"); None for a CPU."""
    kind = torch.device(device).type
    return f"GPU {torch.cuda.get_device_name(device)}" if kind == "cuda" else "Apple GPU (MPS)" if kind == "mps" \
        else None


def memory(device: str) -> int:
    """Bytes the device's tensors can take: a GPU's own memory, what Metal recommends on a Mac (memory it shares
    with the CPU), the host's on a CPU."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if kind == "mps":
        return torch.mps.recommended_max_memory()
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
