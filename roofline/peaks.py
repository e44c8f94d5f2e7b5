"""Machine peaks, measured rather than assumed: matmul FLOP/s at a dtype and streaming memory bandwidth.

Cached per machine fingerprint (CPU or GPU name, cores, torch threads, torch version, dtype) in
results/peaks.json for STALE_DAYS; `make peaks` measures again, and so does a run that beats the cached roof.
A cache that does not parse, or an entry that is not a usable measurement, is measured again.
"""
import json
import time
from pathlib import Path

import torch

from mlperf import env
from mlperf.files import read_json, write_json

CACHE = Path("results") / "peaks.json"
STALE_DAYS = 30


def fingerprint(device: str, dtype: torch.dtype) -> str:
    where = torch.cuda.get_device_name(device) if device.startswith("cuda") else env.machine()
    return f"{where} | torch {torch.__version__} | {str(dtype).removeprefix('torch.')}"


def _best_time(fn, device: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """Best-of-N large matmul (FLOP/s) and large copy (bytes/s, read + write)."""
    n = 4096 if device.startswith("cuda") else 1536
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    a @ b  # warm-up
    flops = 2 * n ** 3 / _best_time(lambda: a @ b, device, 5)
    elements = (512 if device.startswith("cuda") else 64) * 2 ** 20 // 4  # 512 MiB / 64 MiB of fp32
    src = torch.empty(elements, device=device, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    bandwidth = 2 * src.numel() * src.element_size() / _best_time(lambda: dst.copy_(src), device, 5)
    return {"flops_per_s": flops, "bytes_per_s": bandwidth, "fingerprint": fingerprint(device, dtype),
            "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "matmul_n": n, "copy_bytes": src.numel() * 4}


def usable(entry) -> bool:
    """A measurement this module wrote, less than STALE_DAYS old (the machine may have changed under the same
    name: a new VM, other firmware)."""
    try:
        measured = time.mktime(time.strptime(entry["measured"], "%Y-%m-%d %H:%M:%S"))
        positive = all(float(entry[k]) > 0 for k in ("flops_per_s", "bytes_per_s"))
    except (TypeError, KeyError, ValueError):
        return False
    return positive and time.time() - measured <= STALE_DAYS * 86400


def load(device: str = "cpu", dtype: torch.dtype = torch.float32, cache: Path = CACHE, remeasure: bool = False) -> dict:
    """The peaks of this machine at `dtype`, measured once and then read from the cache until they are stale."""
    key = fingerprint(device, dtype)
    table = read_json(cache, "measuring the peaks again") if cache.is_file() else {}
    table = table if isinstance(table, dict) else {}
    if remeasure or not usable(table.get(key)):
        table[key] = measure(device, dtype)
        write_json(cache, table)
    return table[key]
