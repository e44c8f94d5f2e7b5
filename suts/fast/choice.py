"""Whether a GPT's fused C step (suts/fast/fused.py) runs it faster than its modules on this machine: timed once
per machine, kernels build, geometry, weights and threads, and the verdict cached beside the kernels' library."""
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.nn as nn

from mlperf.chunk import Chunk
from mlperf.model import GPT
from suts.fast import native
from suts.fast.fused import FusedStep

# the choice's timing: a decode step and a verify pass of 7 tokens (gamma 6) after 64 tokens, each the best of 12 calls
# after as many untimed
CONTEXT, VERIFY, REPEATS = 64, 7, 12


def choose(step: FusedStep | None, model: nn.Module) -> tuple[FusedStep | None, float | None]:
    """The fused step where it runs this GPT faster than its modules, else None (the modules), and how much faster
    (the modules' time over the step's; None where not timed). Timed once per machine, kernels build, geometry,
    weights and threads (`timings`, cached beside the library); one choice for both phases, since a lossless SUT's
    verify pass must sum as the baseline's decode steps do. An EAGLE head's step is taken untimed (its forward needs
    its target)."""
    if step is None or not isinstance(model, GPT):
        return step, None
    key = hashlib.sha256(json.dumps([Path(step.kernel._name).name, native.cpu_id(), torch.get_num_threads(),
                                     type(model).__name__, str(model.config), step.half,
                                     sorted({type(m).__name__ for m in model.modules()})]).encode()).hexdigest()[:16]
    path = native.cache_dir() / "fused-vs-modules.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        fused, modules = timings(step, model)
        known[key] = modules / fused
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known))
            os.replace(tmp, path)  # atomic: a process beside this one reads the old table or the new, never half
        except OSError:  # a cache that cannot be written (a read-only home): timed again by the next process
            pass
    return (step if known[key] >= 1 else None), known[key]


@torch.inference_mode()
def timings(step: FusedStep, model: GPT) -> tuple[float, float]:
    """Seconds of a decode step plus a verify pass after CONTEXT tokens: (the fused step's, the modules')."""
    cache = model.new_cache(1)
    model(torch.arange(CONTEXT).remainder(model.config.vocab_size)[None], Chunk(cache))
    best = []
    for forward in (lambda ids, cache: step.forward(step.plan("forward", ids, Chunk(cache).of(ids))),
                    lambda ids, cache: model(ids, Chunk(cache))):
        total = 0.0
        for T in (1, VERIFY):
            ids, seconds = torch.zeros(1, T, dtype=torch.long), []
            for _ in range(2 * REPEATS):
                start = time.perf_counter()
                forward(ids, cache)
                seconds.append(time.perf_counter() - start)
                cache.restart(CONTEXT)
            total += min(seconds[REPEATS:])
        best.append(total)
    return best[0], best[1]
