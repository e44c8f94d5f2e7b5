"""Tensors on 2 MiB pages: a stream of weights or of a KV cache then misses the TLB once per 2 MiB, not once per
4 KiB (under a VM each miss is a two-level page walk; docs/measurements.md: what it bought)."""
import contextlib
import math
import mmap
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def on_huge_pages(specs: list[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor] | None:
    """Zeroed CPU tensors of these (shape, dtype) end to end, each on a cache line of its own, in one mapping that
    starts on a 2 MiB boundary and is advised for Linux's transparent huge pages; None where mmap cannot advise
    (not Linux)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in specs]
    lines = [-(-size // 64) * 64 for size in sizes]
    # private: a shared mapping is shmem, which follows another setting (no huge pages by default)
    pages = mmap.mmap(-1, sum(lines) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # a kernel built without huge pages refuses the advice: 4 KiB pages then
        pages.madvise(mmap.MADV_HUGEPAGE)
    buffer = torch.frombuffer(pages, dtype=torch.uint8)  # keeps the mapping alive as long as a view of it lives
    at, out = -buffer.data_ptr() % HUGE_PAGE, []
    for (shape, dtype), size, line in zip(specs, sizes, lines):
        out.append(buffer[at:at + size].view(dtype).view(shape))
        at += line
    return out


def huge_pages(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of CPU `tensors` end to end on huge pages (on_huge_pages); elsewhere, the tensors themselves."""
    copies = on_huge_pages([(tuple(t.shape), t.dtype) for t in tensors])
    return tensors if copies is None else [c.copy_(t) for c, t in zip(copies, tensors)]


def page_size() -> str:
    """The pages on_huge_pages gets on this machine, as a run records it beside its peaks."""
    try:
        mode = THP.read_text().split("[")[1].split("]")[0] if hasattr(mmap, "MADV_HUGEPAGE") else "unavailable"
    except (OSError, IndexError):
        mode = "unavailable"
    return f"{'4 KiB' if mode in ('never', 'unavailable') else '2 MiB'} pages (transparent huge pages: {mode})"
