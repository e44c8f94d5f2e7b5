"""Machine peaks, measured rather than assumed: the best FLOP/s of the kernels the SUTs run at a dtype, the
best streaming memory bandwidth, the read speed at each working-set size (a phase whose bytes fit in a cache
reads them at the cache's speed: a draft model's few MB do, step after step), and on a CPU the rate at which the
kernels widen fp16 weights to fp32 (a ceiling where weights come from cache faster than that) and the speed of each
read of a working set after a stream has pushed it out of the caches (a cache takes a set back over several reads).

Measured again (in 1-3 s on a CPU) wherever a phase is set against them: by `make profile` and `make bench`, and
as a run ends unless they were measured in the last RECENT_S (a sweep's runs, a smoke's rounds share them), since a
VM's memory speed can move by 2x from one hour to the next. Cached per machine fingerprint (CPU or GPU name, cores,
torch threads, torch version, dtype) in results/peaks.json (`cache_in`) for STALE_DAYS, for what reads them later (a
sweep's model, the labs); `make peaks` measures again. A cache that does not parse, or an entry that is not a usable
measurement, is measured again.
"""
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from mlperf import devices, env
from mlperf.cost import Cost
from mlperf.files import read_json, write_json
from mlperf.pages import huge_pages, page_size
from roofline.analytic import drafts_per_cycle

STALE_DAYS = 30
RECENT_S = 600  # a run's roofline reuses peaks measured this recently, within the hour they describe
PLAUSIBLE = 1.05  # a phase measured above 105% of a peak means the peaks were measured in a slow spell


def cache_in(results) -> Path:
    """Where a command writing its results to `results` caches the peaks: RESULTS/peaks.json, or one file for every
    results folder where $MLPERF_PEAKS_CACHE names it (the test suite's runs share one)."""
    return Path(os.environ.get("MLPERF_PEAKS_CACHE") or Path(results) / "peaks.json")


def fingerprint(device: str, dtype: torch.dtype) -> str:
    where = devices.describe(device) or env.machine()
    return f"{where} | torch {torch.__version__} | {str(dtype).removeprefix('torch.')}"


def best_time(fn, device: str = "cpu", repeats: int = 5, calls: int = 1, warm: bool = True, before=None) -> float:
    """Seconds of one call of `fn`: the best of `repeats` timings of `calls` calls in a row (several when one
    call is too short to time alone); `warm` makes a first, untimed call, which allocates and creates kernels;
    `before`, untimed before each timing (a read that pushes fn's data out of the caches)."""
    if warm:
        fn()
    best = float("inf")
    for _ in range(repeats):
        if before is not None:
            before()
        devices.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        devices.synchronize(device)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


LINEAR_SHAPES = [(m, k, n) for m in (64, 256) for k, n in ((384, 1536), (1536, 384), (768, 3072), (768, 2304))]
# on a CPU, several times the last-level cache, like a model's weights and KV cache: a cache that resists thrashing
# keeps part of a set only twice its size, which then reads faster than a stream (docs/measurements.md)
STREAM_BYTES = 256 * 2 ** 20
PUSH_OUT_BYTES = 64 * 2 ** 20  # a stream past a CPU's last-level cache, as a verify pass is: what pushes a set out
LINEAR_BYTES = 64 * 2 ** 20  # the one-row linears' weights, each pass read from memory as a decode step's layers are
READ_BYTES = 16 * 2 ** 20  # on a CPU a working set's reads are timed this many bytes at a time (1 MiB: 16 reads)
# a VM's memory has slow spells of a few hundred ms: the best of few reads can be a roof below what a phase then reads
# (docs/measurements.md)
MEMORY_REPEATS = 20
REFILL_PASSES, REFILL_REPEATS = 8, 7  # reads of a working set timed one by one after a stream: a draft chain's steps
WIDEN_BYTES, WIDEN_CALLS = 4 * 2 ** 20, 16  # fp16 weights that stay in cache, timed 16 passes at a time


def measure(device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """The best FLOP/s and bytes/s of the kernels the SUTs run, so that no phase can beat its roof: on a CPU the
    packed linears of suts/fast/packed.py at GPT-2-like widths and batch rows, elsewhere (a GPU, a dtype the fast path
    does not pack) a large matmul; a read-only reduction, (GPU) a copy, and (CPU) one row through a weight-sized
    linear by the fast path's one-row kernel (`linear_streams`), as a decode step streams its weights; and reads of
    1 MiB to all of the reduction's buffer, sizes a factor sqrt(2) apart, each again and again. Only kernels the SUTs
    run: another (a 1536^3 matmul, a copy on a CPU) never set a CPU's peak and took two thirds of the 2.4 s a run
    spent measuring."""
    from suts.fast.packed import PackedLinear, can_pack  # here: a report loads no kernel
    gpu = devices.accelerated(device)
    packed = not gpu and can_pack(nn.Linear(8, 8).to(dtype))
    flops, bandwidth = {}, {}
    if not packed:
        n = 4096 if gpu else 1536
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        flops[f"matmul {n}^3"] = 2 * n ** 3 / best_time(lambda: a @ b, device)
    src = torch.ones(2 * STREAM_BYTES // 4 if gpu else STREAM_BYTES // 4, device=device)
    moved = src.numel() * 4
    if gpu:
        dst = torch.empty_like(src)
        bandwidth["copy"] = 2 * moved / best_time(lambda: dst.copy_(src), device, MEMORY_REPEATS)
    else:  # on the pages the SUTs' weights are on (suts/fast/packed.py)
        src, = huge_pages([src])
    bandwidth["read"] = moved / best_time(lambda: src.sum(), device, MEMORY_REPEATS)
    sizes = [int(2 ** (20 + i / 2)) // 4096 * 4096 for i in range(2 * int(math.log2(moved >> 20)) + 1)]  # 1 MiB up
    per_timing = moved if gpu else READ_BYTES  # a GPU's: enough calls that the sync's cost fades
    reads = {str(n): n / best_time(lambda: src[:n // 4].sum(), device, MEMORY_REPEATS, max(1, per_timing // n))
             for n in sizes}
    push_out = src[-PUSH_OUT_BYTES // 4:]  # on a CPU, what pushes a set at src's start out of the caches
    refill = {} if gpu else refills(src, push_out, [n for n in sizes if n <= PUSH_OUT_BYTES // 2])
    if packed:
        for m, k, out in LINEAR_SHAPES:
            x, layer = torch.randn(m, k, dtype=dtype), PackedLinear(nn.Linear(k, out).to(dtype))
            flops[f"packed linear {m}x{k}x{out}"] = 2 * m * k * out / best_time(lambda: layer(x), device)
        bandwidth.update(linear_streams(push_out))
    widen = widen_rate() if packed else None
    best_flops, best_bytes = max(flops, key=flops.get), max(bandwidth, key=bandwidth.get)
    launches = launch_costs(device) if device.startswith("cuda") else {} if gpu else {"pages": page_size()}
    after = "" if gpu else f", {REFILL_PASSES} reads of each to {PUSH_OUT_BYTES // 2 ** 21} MiB after a stream"
    return {**launches, "flops_per_s": flops[best_flops], "bytes_per_s": bandwidth[best_bytes],
            "fingerprint": fingerprint(device, dtype), "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
            "method": f"compute: best of {len(flops)} kernels ({best_flops}); memory: best of {', '.join(bandwidth)} "
                      f"({best_bytes}; the read over {moved // 2 ** 20} MiB); working sets: 1 to {moved // 2 ** 20} MiB"
                      f"{after}; {torch.get_num_threads()} torch threads",
            "kernels_flops_per_s": flops, "streams_bytes_per_s": bandwidth, "reads_by_size": reads,
            **({} if gpu else {"widen_bytes_per_s": widen, "refill_by_size": refill})}


def linear_streams(push_out: torch.Tensor) -> dict[str, float]:
    """Bytes/s of one row through a LINEAR_BYTES linear by the fast path's one-row kernel, its small-row kernel's
    fp32 and fp16 panels where it builds (else oneDNN), each pass straight after a read of `push_out` has pushed the
    weights out of the caches, as a decode step finds each layer's (the best of MEMORY_REPEATS)."""
    from suts.fast.packed import PackedLinear, panels_on_huge_pages
    from suts.fast.native import rows_kernel
    k, x, out = 2048, torch.randn(1, 2048), {}
    for half in (False, True) if rows_kernel() is not None else (False,):  # the weights' streams the SUTs run:
        linear = nn.Linear(k, LINEAR_BYTES // (2 if half else 4) // k, bias=False)  # fp32, and fp16 as stored
        layer = PackedLinear(linear, half=half)
        if layer.kernel is not None:
            panels_on_huge_pages([layer])
        kind = "oneDNN" if layer.kernel is None else f"small-row kernel, {'fp16' if layer.half else 'fp32'}"
        best = best_time(lambda: layer(x), "cpu", MEMORY_REPEATS, warm=False, before=push_out.sum)
        out[f"one-row linear ({kind}), {LINEAR_BYTES // 2 ** 20} MiB"] = LINEAR_BYTES / best
    return out


def refills(src: torch.Tensor, push_out: torch.Tensor, sizes: list[int]) -> dict[str, list[float]]:
    """Bytes/s of each of REFILL_PASSES reads of a working set of each size at the start of `src`, one after
    another, straight after a read of `push_out` has pushed it out of the caches (the best of REFILL_REPEATS at each
    pass): how many passes a cache takes to hold the set again, as a draft's steps read its weights after each verify
    pass."""
    best = {n: [math.inf] * REFILL_PASSES for n in sizes}
    for _ in range(REFILL_REPEATS):
        for n in sizes:
            push_out.sum()
            for k in range(REFILL_PASSES):
                start = time.perf_counter()
                src[:n // 4].sum()
                best[n][k] = min(best[n][k], time.perf_counter() - start)
    return {str(n): [n / s for s in seconds] for n, seconds in best.items()}


def widen_rate() -> float | None:
    """Bytes of fp16 weights a second that the small-row kernel widens to fp32 and sums for one row on torch's
    threads, from a layer that stays in cache, called straight (a layer's own Python call would count against it):
    the ceiling of a pass whose weights come faster than it converts them (a draft's from L3: a conversion
    instruction that issues every other cycle widens 16 weights in 2). None where the kernel has no fp16 panels."""
    from suts.fast.packed import PackedLinear
    k, x = 512, torch.randn(1, 512)
    layer = PackedLinear(nn.Linear(k, WIDEN_BYTES // 2 // k, bias=False), half=True)
    if layer.kernel is None or not layer.half:
        return None
    y = torch.empty(1, layer.out_features)
    args = (x.data_ptr(), layer.panels.data_ptr(), layer.panel_bias.data_ptr(), None, y.data_ptr(), 1, k,
            layer.out_features, torch.get_num_threads(), 1, 0)  # one row, fp16 panels, not resident
    return WIDEN_BYTES / best_time(lambda: layer.kernel.linear(*args), "cpu", MEMORY_REPEATS, WIDEN_CALLS)


def implausible(fractions: dict[str, float]) -> list[str]:
    """The phases (name -> fraction of its roof) that ran faster than the peaks allow."""
    return [name for name, fraction in fractions.items() if fraction > PLAUSIBLE]


def judged(judge: Callable[[dict], object], too_fast: Callable[[object], list[str]],
           measure: Callable[[bool], dict]):
    """`judge(peaks)` (phases set against the peaks) at this hour's peaks, `measure(False)`, and a note, or None:
    where a phase ran faster than they allow (`too_fast` names such phases of a result), they are measured anew,
    `measure(True)`, and judged again."""
    result = judge(measure(False))
    if not (stale := too_fast(result)):
        return result, None
    result = judge(measure(True))
    note = f"the peaks measured first were below what {', '.join(stale)} achieved; measured them again"
    if still := too_fast(result):
        verb = "exceeds" if len(still) == 1 else "exceed"
        note += f", and {', '.join(still)} still {verb} them: treat the regimes with care"
    return result, note


def launch_costs(device: str, kernels: int = 200) -> dict:
    """A GPU's cost of one tiny kernel: launched from Python (`launch_s`, what a step's every op pays without
    CUDA graphs) and as a node of a replayed CUDA graph (`graph_node_s`, with them)."""
    t = torch.zeros(1, device=device)

    def launch():
        for _ in range(kernels):
            t.add_(1)
    launch()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    return {"launch_s": best_time(launch, device) / kernels, "graph_node_s": best_time(graph.replay, device) / kernels}


def launch_floor_s(peaks: dict, kernels: int, graphs: bool) -> float | None:
    """A forward's time at its launch floor, its kernels one after another at the measured cost of each; None
    where the peaks have no launch cost (a CPU)."""
    cost = peaks.get("graph_node_s" if graphs else "launch_s")
    return None if cost is None else kernels * cost


def by_size(speeds: dict[str, float], working_set: float) -> float | None:
    """A speed measured by working-set size (bytes as keys) at `working_set`, interpolated in log size between the
    sizes measured and held flat past either end; None where none was measured."""
    curve = sorted((int(n), speed) for n, speed in speeds.items())
    if not curve or working_set <= 0:
        return None
    sizes, values = zip(*curve)
    return float(np.interp(np.log(working_set), np.log(sizes), values))


def bandwidth(peaks: dict, working_set: float) -> float:
    """The memory roof of a phase that reads `working_set` bytes again and again: the read speed measured over a
    buffer of that size (`by_size`), never below the streaming peak."""
    between = by_size(peaks.get("reads_by_size", {}), working_set)
    return peaks["bytes_per_s"] if between is None else max(peaks["bytes_per_s"], between)


def summary(peaks: dict) -> str:
    """One line: the peaks, the read speed at each working-set size, a GPU's launch costs, and how they were
    measured."""
    reads = ", ".join(f"{int(n) / 2 ** 20:.3g} MiB {bw / 1e9:.0f}" for n, bw in peaks.get("reads_by_size", {}).items())
    launch = (f"; a kernel launched {peaks['launch_s'] * 1e6:.1f} us, in a CUDA graph {peaks['graph_node_s'] * 1e6:.2f}"
              f" us" if "launch_s" in peaks else "")
    pages = f", {peaks['pages']}" if "pages" in peaks else ""
    widen = f"; fp16 weights widened at {peaks['widen_bytes_per_s'] / 1e9:.0f} GB/s" \
        if peaks.get("widen_bytes_per_s") else ""
    return (f"{peaks['flops_per_s'] / 1e9:.1f} GFLOP/s, {peaks['bytes_per_s'] / 1e9:.1f} GB/s; reads of a working set "
            f"(GB/s): {reads}{widen}{launch} ({peaks['method']}{pages})")


def widen_s(cost: Cost, peaks: dict) -> float:
    """A forward's fp16 weights widened as read, at the widening rate (none measured: no such ceiling, 0)."""
    widen = peaks.get("widen_bytes_per_s")
    return cost.widened_bytes / widen if widen else 0.0


def compute_s(cost: Cost, peaks: dict) -> float:
    """A forward's time at the compute roofs: the longer of its FLOPs at the compute peak and `widen_s`."""
    return max(cost.flops / peaks["flops_per_s"], widen_s(cost, peaks))


def roofline_s(cost: Cost, peaks: dict) -> float:
    """A forward's time at the roofs: the longer of its time at the compute roofs (`compute_s`) and its bytes at the
    memory roof of its working set (`bandwidth`)."""
    return max(compute_s(cost, peaks), cost.bytes / bandwidth(peaks, cost.bytes))


def rows_s(cost: Cost, peaks: dict) -> float:
    """The part of a forward's time at the roofs that grows with its rows, the batching model's
    (roofline/batching.py): each row's arithmetic at the compute peak (not hidden under the weights' stream, which the
    rows share and which is left out) and its logits at the memory roof, then its attention, the longer of its FLOPs
    and its KV cache's bytes."""
    bw, peak = bandwidth(peaks, cost.bytes), peaks["flops_per_s"]
    return cost.matmul_flops / peak + cost.logits_bytes / bw + \
        max(cost.attention_flops / peak, (cost.kv_read_bytes + cost.kv_write_bytes) / bw)


def refill_bandwidth(peaks: dict, working_set: float, read: int) -> float | None:
    """The speed of the `read`-th read (from 1) of a working set after a stream pushed it out of the caches
    (`by_size`); None where the peaks did not measure that read."""
    passes = peaks.get("refill_by_size", {}).items()
    return by_size({n: speeds[read - 1] for n, speeds in passes if len(speeds) >= read}, working_set)


def draft_roofline_s(costs: dict[str, Cost], peaks: dict, gamma: int, tree: list[int] | None = None) -> float:
    """A draft step's time at the roofs inside a speculative cycle (phase_costs'), averaged over the cycle's steps.
    The verify pass before them streams the target's bytes through the caches and pushes the draft's out (the
    shipped target's 45 MB through a 32 MiB L3). A cache takes the draft's bytes back over several steps: where the
    cycle streams at least PUSH_OUT_BYTES, step k reads them at the measured speed of the k-th read after such a
    stream (`refill_bandwidth`, never above the draft's own roof); else the first step reads at the roof of the
    whole cycle's working set and the others at their own."""
    draft, steps = costs["draft"], drafts_per_cycle(gamma, tree)
    cycle, own = draft.bytes + costs["verify"].bytes, bandwidth(peaks, draft.bytes)
    if cycle >= PUSH_OUT_BYTES and "refill_by_size" in peaks:
        speeds = [min(own, refill_bandwidth(peaks, draft.bytes, k) or own) for k in range(1, steps + 1)]
    else:
        speeds = [bandwidth(peaks, cycle)] + [own] * (steps - 1)
    return sum(max(compute_s(draft, peaks), draft.bytes / speed) for speed in speeds) / steps


def cycle_roofline_s(costs: dict[str, Cost], peaks: dict, gamma: int, tree: list[int] | None = None) -> float:
    """A speculative cycle at the roofs: its verify pass and its draft steps (draft_roofline_s)."""
    steps = drafts_per_cycle(gamma, tree)
    return roofline_s(costs["verify"], peaks) + steps * draft_roofline_s(costs, peaks, gamma, tree)


def usable(entry, max_age_s: float = STALE_DAYS * 86400) -> bool:
    """A measurement this version of the module wrote (it names its method and, on a CPU, its pages, its widening
    rate, None where there is none, and its reads after a stream), at most max_age_s old (by default STALE_DAYS: the
    machine may have changed under the same name, a new VM, other firmware)."""
    try:
        measured = time.mktime(time.strptime(entry["measured"], "%Y-%m-%d %H:%M:%S"))
        positive = all(float(entry[k]) > 0 for k in ("flops_per_s", "bytes_per_s")) and "method" in entry \
            and all(float(bw) > 0 for bw in entry["reads_by_size"].values()) \
            and (float(entry["launch_s"]) > 0 if "GPU" in entry["fingerprint"] else
                 "pages" in entry and "widen_bytes_per_s" in entry and "refill_by_size" in entry)
    except (TypeError, KeyError, ValueError):
        return False
    return positive and time.time() - measured <= max_age_s


def load(device: str = "cpu", dtype: torch.dtype = torch.float32, cache: Path | None = None,
         max_age_s: float = STALE_DAYS * 86400) -> dict:
    """The peaks of this machine at `dtype`, read from the cache (default: ./results's) where they were measured at
    most max_age_s ago, else measured now (max_age_s 0: always) and kept."""
    key, cache = fingerprint(device, dtype), cache or cache_in("results")
    table = read_json(cache, "measuring the peaks again") if cache.is_file() else {}
    table = table if isinstance(table, dict) else {}
    if max_age_s <= 0 or not usable(table.get(key), max_age_s):
        print(f"measuring this machine's peaks ({key}; kept in {cache}) ...", flush=True)
        table[key] = measure(device, dtype)
        write_json(cache, table)
    return table[key]
