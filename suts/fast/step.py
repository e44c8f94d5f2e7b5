"""The contract every fast step keeps: the CPU's FusedStep and FusedHead (suts/fast/fused.py), the GPU's GraphStep
(suts/fast/graphs.py) and the smoke gate's counter (commands/smoke.py).

A model's runner (suts/fast/runner.py) is called as its model is, with token ids and a Chunk (mlperf/chunk.py), and
asks the step once for its `plan` of an operation on that chunk: a Plan, which the operation then runs, or the reason
it has none, where the chunk runs through the model's modules and the runner's Tally counts it under that reason
(the run record's `fast_path`). A planned operation either runs or raises (a context too long, as the modules
would): it never declines afterwards.
"""
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import torch

from mlperf.chunk import Chunk, Output

if TYPE_CHECKING:  # named in an annotation alone: the pickers' module asks for the runner, which asks for this
    from suts.fast.threads import ThreadPicker

# what the kernels stream unless a run says otherwise: the checkpoint's own fp16 numbers (fp32 panels where a model's
# weights are not all fp16 numbers), so the smoke gate's baseline is the fp16 one it names
WEIGHTS = "fp16"

Op = Literal["forward", "greedy", "argmaxes"]


class Refusal(StrEnum):
    """Why a runner's chunk runs through the model's modules, not its fast step: every reason any step gives, in one
    table, counted under its words in the run record's `fast_path`."""
    NO_STEP = "no fast step"
    NO_CACHE = "a whole sequence (no cache)"
    IDS_NOT_INT64 = "token ids not int64"
    IDS_UNLIKE_ROWS = "ids unlike the chunk's rows"
    EMPTY_ROW = "an empty row"
    TOO_MANY_TOKENS = "more tokens than one call takes"
    PACKED_TREE = "a packed token tree"
    CACHE_NOT_FLOAT32_CPU = "a cache not float32 on the CPU"
    CACHE_LAYOUT = "a cache laid out unlike the kernels read it"
    PACKED_ROWS_UNLIKE_CACHE = "packed rows unlike the cache's"
    FEATURES_AT_LAST = "features at each row's last token"
    HEAD_OP = "a head's forward of int64 token ids, or its greedy chain"
    FEATURES_UNLIKE_TOKENS = "features not float32, one row per token"
    CHAIN_NOT_AFTER_LAST = "a greedy chain after anything but a packed chunk's last tokens"
    TREE = "a token tree"
    UNEQUAL_PACKED_ROWS = "packed rows of different lengths"
    ROWS_OR_IDS_UNLIKE_CACHE = "rows unlike the cache's, or token ids not int64"
    ROWS_UNLIKE_CACHE = "rows unlike the cache's"
    CACHE_OFF_GPU = "a cache off the GPU"
    LONG_CHUNK = "a long chunk of several rows, or past the context once padded"


@dataclass
class Plan:
    """How a fast step runs one operation on one chunk, decided once (FastStep.plan): the token ids and the chunk,
    what a head reads beside them (`inputs`: its features and its target's token embedding), and the step's calls
    (`pieces`, the step's own: FusedStep's spans of the tokens, each with its prepared call; none for GraphStep)."""
    ids: torch.Tensor | list[int]
    chunk: Chunk
    pieces: tuple = ()
    inputs: tuple = ()


@runtime_checkable
class FastStep(Protocol):
    kind: str  # what runs the model's steps, for the run record ("fused C step", "CUDA graphs")
    half: bool  # its linears stream fp16 panels (2 bytes a weight), whatever the model's dtype
    threads: "ThreadPicker | None"  # the thread count each size of call runs on, where the step picks them

    def plan(self, op: Op, ids: torch.Tensor | list[int], chunk: Chunk, *inputs) -> Plan | Refusal:
        """How the step runs `op` on these ids and this chunk (B and T filled in; `inputs`, a head's); else why not,
        from the table of Refusals (a chunk without a cache: a whole sequence, which no fast step runs)."""

    def forward(self, plan: Plan) -> Output | torch.Tensor:
        """What the model's forward returns for the plan's chunk (a GPT's Output; a head's features), the cache's
        lengths moved on."""

    def greedy(self, plan: Plan, n: int) -> list[list[int]]:
        """Each row's argmax at its last token of a packed chunk (last_only), then at n - 1 greedy steps fed each
        row's last argmax: a greedy draft, a greedy decode step."""

    def argmaxes(self, plan: Plan) -> list[list[int]]:
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
