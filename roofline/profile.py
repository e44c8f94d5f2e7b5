"""Where a forward pass's time goes: each phase the roofline costs (prefill, decode step, verify pass, draft step)
run alone on a model pair under torch.profiler, its operators' own time grouped by kind, beside the time the
phase would take at its roof (its analytic bytes and FLOPs at this machine's measured peaks).

The kinds are what the issue of overhead is about: the fast path's fused C step (a whole forward in one call,
suts/fast/fused.py), the matmuls (the work itself), attention, LayerNorms and small elementwise ops, the KV cache's
writes and masks, views and allocations, and the rest of the profiled time, which no operator accounts for:
Python and dispatch between them. `compile_phase` times a phase through torch.compile instead, to say whether
compiling would take that overhead out on this machine. `decode_in_forwards` splits a SUT's own steps into its
forwards' calls and the Python around them; roofline/spells.py, what the machine's spells and caches do to a step.
"""
import statistics
import time
from dataclasses import dataclass, replace

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from mlperf.chunk import Chunk
from mlperf.cost import Cost, forward_cost, widened
from mlperf.model import GPT
from mlperf.pages import huge_pages
from roofline.peaks import best_time, roofline_s, rows_s
from suts.fast.fused import FusedStep
from suts.fast.packed import PackedLinear, can_pack, panels_on_huge_pages, weight_bytes
from suts.fast.runner import as_runner
from suts.engine.stats import Stats

KINDS = {  # operator name fragments, in the order they are matched
    "fused step (C)": ("fused_step",),
    "matmuls": ("rows_linear", "_linear_pointwise", "aten::mm", "aten::addmm", "aten::linear", "_weight_int8pack_mm"),
    "attention": ("scaled_dot_product", "aten::bmm", "softmax", "baddbmm"),
    "norms, GELU, adds": ("layer_norm", "gelu", "aten::add", "aten::mul", "aten::embedding", "index_select",
                          "aten::argmax"),
    "cache writes, masks": ("copy_", "index_put", "aten::arange", "aten::le", "aten::lt", "aten::fill_",
                            "aten::zeros", "aten::to", "masked_fill", "aten::minimum"),
    "views, allocation": ("view", "reshape", "transpose", "as_strided", "empty", "slice", "select", "narrow",
                          "split", "expand", "contiguous", "aten::t", "unsqueeze", "permute", "clone", "detach",
                          "alias", "lift_fresh", "unbind"),
}
OTHER = "other operators"
DISPATCH = "Python, dispatch"
COLUMNS = (*KINDS, OTHER, DISPATCH)
CONTEXT, PROMPT = 256, 200  # the roofline's and lab 3's reference phases
SHORT = 8  # a context whose attention costs next to nothing, to time a step at against CONTEXT


@dataclass
class PhaseProfile:
    name: str
    seconds: float  # one forward, measured without the profiler
    cost: Cost  # its analytic FLOPs and bytes
    shares: dict[str, float]  # kind -> fraction of the profiled forward's time
    ideal_s: float = float("nan")  # at the roof of the peaks it is set against (`against`)

    @property
    def fraction_of_roof(self) -> float:
        return self.ideal_s / self.seconds


def against(profiles: list[PhaseProfile], peaks: dict) -> list[PhaseProfile]:
    """The profiles set against `peaks`: each phase's time at its roof (roofline_s)."""
    return [replace(p, ideal_s=roofline_s(p.cost, peaks)) for p in profiles]


def kind(op: str) -> str:
    return next((k for k, fragments in KINDS.items() if any(f in op for f in fragments)), OTHER)


def reference_ids(model: GPT, new_tokens: int, rows: int = 1) -> torch.Tensor:
    """The (rows, new_tokens) token ids every phase is timed on (seeded: the same in every run)."""
    return torch.randint(0, model.config.vocab_size, (rows, new_tokens), generator=torch.Generator().manual_seed(0))


def phase_forward(model: GPT, context: int, new_tokens: int, call=None):
    """A function running one forward of `new_tokens` after `context` cached tokens (the cache rolled back before
    each), through `call` (default: the model itself, its logits); returns what `call` does."""
    cache, x = model.new_cache(1), reference_ids(model, new_tokens)
    call = (lambda ids, chunk: model(ids, chunk).logits) if call is None else call

    def forward():
        cache.restart(context)
        return call(x, Chunk(cache, last_only=context == 0))  # a prefill keeps only its last position's logits
    return forward


def greedy_step(model: GPT, context: int, new_tokens: int):
    """phase_forward's, as a greedy SUT runs a step: every new token's argmax through Runner.argmaxes (on the CPU fast
    path one C call, its ids and argmaxes in buffers, no tensors)."""
    rows = reference_ids(model, new_tokens).tolist()
    return phase_forward(model, context, new_tokens, call=lambda x, chunk: as_runner(model).argmaxes(rows, chunk.cache))


@torch.inference_mode()
def profile_phase(name: str, model: GPT, context: int, new_tokens: int, cost: Cost) -> PhaseProfile:
    """One forward of `new_tokens` after `context` cached tokens: a prompt's through the model (its last position's
    logits), a step's as a greedy SUT runs it (greedy_step)."""
    forward = greedy_step(model, context, new_tokens) if context else phase_forward(model, context, new_tokens)
    seconds = best_time(forward, repeats=7, calls=10)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(10):
            forward()
        wall = time.perf_counter() - start
    spent = dict.fromkeys(COLUMNS, 0.0)
    for event in prof.key_averages():
        spent[kind(event.key)] += event.self_cpu_time_total / 1e6
    spent[DISPATCH] = max(0.0, wall - sum(spent.values()))
    return PhaseProfile(name, seconds, cost, {k: v / wall for k, v in spent.items()})


def phases(target: GPT, draft: GPT | None, gamma: int) -> list[tuple[str, GPT, int, int]]:
    """The four phases at the roofline's reference shapes, (name, model, context, new tokens): a 200-token
    prefill and, at context 256, a decode step, a verify pass of gamma + 1 tokens and a draft step."""
    return [("prefill", target, 0, PROMPT), ("decode", target, CONTEXT, 1),
            (f"verify ({gamma + 1} tokens)", target, CONTEXT, gamma + 1)] + (
        [("draft step", draft, CONTEXT, 1)] if draft is not None else [])


def profile_pair(target: GPT, draft: GPT | None, gamma: int) -> list[PhaseProfile]:
    """Every phase of `phases`, profiled (set against peaks by `against`)."""
    return [profile_phase(name, model, context, new, forward_cost(
        model.config, context, new, logits_positions=1 if context == 0 else None,
        weight_bytes_per_param=weight_bytes(model)))
            for name, model, context, new in phases(target, draft, gamma)]


@dataclass
class Compiled:
    name: str
    eager_s: float  # the model as the SUTs run it (prepacked linears on the CPU fast path)
    compiled_s: float  # the plain model through torch.compile
    compile_s: float  # the first call: tracing, code generation, C++ compilation
    max_diff: float  # largest |logit difference| against the eager model


@torch.inference_mode()
def compile_phase(name: str, eager: GPT, plain: GPT, context: int, new_tokens: int) -> Compiled:
    """One phase's forward through torch.compile (inductor, weights frozen as constants so that it prepacks them
    itself: it cannot lower the SUTs' own prepacked linears) against the SUTs' eager forward. The model is
    compiled as it is: the cache's bookkeeping, which reads lengths back to Python, breaks the graph around it."""
    import torch._inductor.config as inductor
    with inductor.patch(freezing=True):
        fn = torch.compile(plain)
        compiled = phase_forward(plain, context, new_tokens, lambda ids, chunk: fn(ids, chunk).logits)
        start = time.perf_counter()
        out = compiled()
        compile_s = time.perf_counter() - start
        compiled_s = best_time(compiled, repeats=7, calls=10)
    forward = phase_forward(eager, context, new_tokens)
    return Compiled(name, best_time(forward, repeats=7, calls=10), compiled_s, compile_s,
                    float((out - forward()).abs().max()))


def block_linears(model: GPT) -> list[nn.Linear]:
    """The linear layers of a GPT's blocks, in the order a step runs them (no LM head)."""
    return [m for m in model.transformer.h.modules() if isinstance(m, nn.Linear)]


def matvec_streams(model: GPT) -> dict[str, float]:
    """Bytes/s at which one row streams through the linear weights of `model` (a plain one, not packed), layer
    after layer as a decode step does, by kernel: MKL through F.linear, and where the fast path runs, oneDNN
    packed and its small-row kernel (what the SUTs run, its panels on huge pages as theirs are); and a plain read
    of as many bytes, on huge pages too, the memory roof's own measure."""
    linears = block_linears(model)
    weights = [m.weight.detach() for m in linears]
    rows = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    kernels = {"F.linear": lambda: [F.linear(rows[w.shape[1]], w) for w in weights]}
    if can_pack(model):
        packed = [PackedLinear(m) for m in linears]
        kernels["oneDNN packed"] = lambda: [m.large(rows[m.in_features]) for m in packed]
        if packed[0].kernel is not None:
            panels_on_huge_pages(packed)
            kernels["small-row kernel"] = lambda: [m(rows[m.in_features]) for m in packed]
    flat = huge_pages([torch.cat([w.flatten() for w in weights])])[0]
    kernels["plain read"] = flat.sum
    moved = flat.numel() * flat.element_size()
    with torch.inference_mode():
        return {name: moved / best_time(fn, repeats=7, calls=3) for name, fn in kernels.items()}


LINEAR_ROWS = (1, 2, 3, 4, 5, 6, 8)  # a decode step's row, a verify pass's gamma + 1 up to gamma 7


@torch.inference_mode()
def linears_by_rows(model: GPT, half: bool, peaks: dict) -> dict[int, tuple[float, float]]:
    """Rows -> (seconds, fraction of the roof) of `model`'s block linears, packed as the SUTs pack them (fp16 panels
    with `half`) and run layer after layer as a step does, its weights streaming: the linears of a verify pass of
    that many tokens, set against the longer of their bytes at the memory roof and their FLOPs at the compute peak."""
    if not can_pack(model):
        return {}
    packed = [PackedLinear(m, half=half) for m in block_linears(model)]
    if packed[0].kernel is None:
        return {}
    panels_on_huge_pages(packed)
    params, wbytes = sum(m.in_features * m.out_features for m in packed), 2 if half else 4
    out = {}
    for rows in LINEAR_ROWS:
        xs = {k: torch.randn(rows, k) for k in {m.in_features for m in packed}}
        seconds = best_time(lambda: [m(xs[m.in_features]) for m in packed], repeats=9)
        cost = Cost(matmul_flops=2 * rows * params, attention_flops=0, weight_bytes=params * wbytes,
                    kv_read_bytes=0, kv_write_bytes=0, logits_bytes=0,
                    widened_bytes=widened(params * wbytes, wbytes, act_bytes=4))
        out[rows] = seconds, roofline_s(cost, peaks) / seconds
    return out


@torch.inference_mode()
def context_cost(model: GPT, new_tokens: int, peaks: dict, pairs: int = 51) -> tuple[float, float]:
    """What the keys between SHORT and CONTEXT add to a forward of `new_tokens`: measured (the median difference of
    `pairs` forwards at each context, one after the other, so that a VM's memory speed, which moves from minute to
    minute, moves both alike) and at the roofs (roofline_s at each). Attention alone grows with the context:
    reading each head's keys and values, and its multiply-adds over them."""
    near, far = (phase_forward(model, c, new_tokens) for c in (SHORT, CONTEXT))
    added = []
    for _ in range(pairs):
        start = time.perf_counter()
        near()
        middle = time.perf_counter()
        far()
        added.append((time.perf_counter() - middle) - (middle - start))
    roofs = [roofline_s(forward_cost(model.config, c, new_tokens, weight_bytes_per_param=weight_bytes(model)), peaks)
             for c in (SHORT, CONTEXT)]
    return sorted(added)[pairs // 2], roofs[1] - roofs[0]


@torch.inference_mode()
def row_costs(model: GPT, new_tokens: int, batches, peaks: dict, rounds: int = 9) -> pd.DataFrame:
    """A greedy step of `new_tokens` a row at each number of rows in `batches` (the first 1), at context CONTEXT and
    SHORT (medians of `rounds` rounds, each timing every batch at both in turn, so that a VM's slow spell falls on
    all of them alike), in ms: its time, what each row beyond the first adds to it, what a row adds at the roofs
    (roofline/peaks.py's rows_s: its arithmetic in full, its logits and attention; the batching model takes the
    arithmetic at the rate its run's prefill achieved, below the peak), the difference, and what the keys between
    SHORT and CONTEXT cost a row (attention). The batching model fits a row's cost beyond its arithmetic and bytes at
    batch 2 and holds it fixed: this shows how it moves."""
    steps = {b: (model.new_cache(b, max_len=CONTEXT + new_tokens), reference_ids(model, new_tokens, b).tolist())
             for b in batches}
    times = {(b, context): [] for b in batches for context in (SHORT, CONTEXT)}
    for _ in range(rounds):
        for (b, context), spent in times.items():
            cache, ids = steps[b]
            cache.restart(context)
            start = time.perf_counter()
            as_runner(model).argmaxes(ids, cache)
            spent.append(time.perf_counter() - start)
    rows = {b: {"near": statistics.median(times[b, SHORT]), "far": statistics.median(times[b, CONTEXT]),
                "roof": rows_s(forward_cost(model.config, CONTEXT, new_tokens, batch=b,
                                         weight_bytes_per_param=weight_bytes(model)), peaks)} for b in batches}
    one = rows[batches[0]]
    added = {b: (r["far"] - one["far"]) / (b - 1) if b > 1 else float("nan") for b, r in rows.items()}
    at_roof = {b: (r["roof"] - one["roof"]) / (b - 1) if b > 1 else float("nan") for b, r in rows.items()}
    return 1e3 * pd.DataFrame({
        "ms": [r["far"] for r in rows.values()], "+ms a row": added.values(), "roof +ms a row": at_roof.values(),
        "beyond the roof": [added[b] - at_roof[b] for b in rows],
        f"{CONTEXT - SHORT} keys ms a row": [(r["far"] - r["near"]) / b for b, r in rows.items()],
    }, index=pd.Index(list(rows), name="rows"))


class CallTimer:
    """A fused step's kernel library as FusedStep calls it, counting its forwards' calls (`forward`, `chain`) and
    adding up their seconds: how much of a SUT's step its forwards are, and how much the Python around them."""

    def __init__(self, library):
        self.library, self.seconds, self.calls = library, 0.0, 0

    def __getattr__(self, name):
        call = getattr(self.library, name)
        if name not in ("forward", "chain"):
            return call

        def timed(*args):
            start = time.perf_counter()
            try:
                return call(*args)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
        return timed


def decode_in_forwards(sut, prompt: list[int], tokens: int) -> tuple[Stats, float | None, int]:
    """A greedy generation's Stats (after two untimed ones), and the seconds and number of its models' fused
    forward calls from its first token on (its steps'); None and 0 off the CPU fast path, where a forward is not
    one call."""
    for _ in range(2):
        sut.generate(prompt, tokens)
    steps = [m.fast_step for m in sut.runners() if isinstance(m.fast_step, FusedStep)]
    if not steps:
        return sut.generate(prompt, tokens).stats, None, 0
    timers = [CallTimer(step.kernel) for step in steps]
    for step, timer in zip(steps, timers):
        step.kernel = timer

    def decoding(_):  # the prefill's forwards are not a step's
        for timer in timers:
            timer.seconds, timer.calls = 0.0, 0
    try:
        stats = sut.generate(prompt, tokens, on_first_token=decoding).stats
    finally:
        for step, timer in zip(steps, timers):
            step.kernel = timer.library
    return stats, sum(timer.seconds for timer in timers), sum(timer.calls for timer in timers)


def table(profiles: list[PhaseProfile]) -> str:
    width = max(len(p.name) for p in profiles)
    head = f"{'phase':{width}s} {'ms':>7s} {'roof ms':>7s} {'% roof':>6s}  " + "  ".join(f"{c:>{max(6, len(c))}s}"
                                                                                         for c in COLUMNS)
    lines = [head]
    for p in profiles:
        lines.append(f"{p.name:{width}s} {p.seconds * 1e3:7.3f} {p.ideal_s * 1e3:7.3f} "
                     f"{100 * p.fraction_of_roof:5.0f}%  "
                     + "  ".join(f"{100 * p.shares[c]:>{max(6, len(c)) - 1}.0f}%" for c in COLUMNS))
    return "\n".join(lines)
