"""The contract every fast step keeps: the CPU's FusedStep and FusedHead (suts/fast/fused.py), the GPU's GraphStep
(suts/fast/graphs.py) and the smoke gate's counter (commands/smoke.py).

A model's runner (suts/fast/runner.py) is called as its model is, with token ids and a Chunk (mlperf/chunk.py), asks the
step whether it `takes` that chunk for an operation, and calls the operation only where it does; a chunk not taken
runs through the model's modules, and the runner's Tally counts it under the step's reason (the run record's
`fast_path`). An operation the step said it takes either runs or raises (a context too long, as the modules would):
it never declines afterwards.
"""
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import torch

from mlperf.chunk import Chunk, Output

if TYPE_CHECKING:  # named in an annotation alone: the pickers' module asks for the runner, which asks for this
    from suts.fast.threads import ThreadPicker

WEIGHTS = "fp16"  # what the kernels stream unless a run says otherwise: the checkpoint's own fp16 numbers (fp32
# panels where a model's weights are not all fp16 numbers), so the smoke gate's baseline is the fp16 one it names

Op = Literal["forward", "greedy", "argmaxes"]


@runtime_checkable
class FastStep(Protocol):
    kind: str  # what runs the model's steps, for the run record ("fused C step", "CUDA graphs")
    half: bool  # its linears stream fp16 panels (2 bytes a weight), whatever the model's dtype
    threads: "ThreadPicker | None"  # the thread count each size of call runs on, where the step picks them

    def takes(self, op: Op, ids: torch.Tensor | list[int], chunk: Chunk) -> str | None:
        """None where the step runs `op` on these ids and this chunk (B and T filled in); else why not, in a few
        words (a chunk without a cache: a whole sequence, which no fast step runs)."""

    def forward(self, ids: torch.Tensor, chunk: Chunk) -> Output | torch.Tensor:
        """What the model's forward returns for the chunk (a GPT's Output; a head's features), the cache's lengths
        moved on."""

    def greedy(self, ids: list[int], chunk: Chunk, n: int) -> list[list[int]]:
        """Each row's argmax at its last token of a packed chunk (last_only), then at n - 1 greedy steps fed each
        row's last argmax: a greedy draft, a greedy decode step."""

    def argmaxes(self, ids: list[int], chunk: Chunk) -> list[list[int]]:
        """Each token's argmax: a greedy verify pass, a tree's nodes."""


@dataclass
class Tally:
    """A runner's operations: those its fast step ran, and those that fell back to the modules, by reason."""
    steps: int = 0
    fell_back: Counter = field(default_factory=Counter)

    def asdict(self) -> dict:
        return {"steps": self.steps, "fell_back": dict(self.fell_back)}

    def summary(self) -> str:
        """On one line: '96 steps, 2 fell back (a whole sequence (no cache) 2)'."""
        fell = sum(self.fell_back.values())
        why = ", ".join(f"{reason} {n}" for reason, n in self.fell_back.most_common())
        return f"{self.steps} steps, " + (f"{fell} fell back ({why})" if fell else "none fell back")
