"""How a model's forwards run, decided in one place: the CPU's fused C step, CUDA graphs, or the modules.

A SUT holds each of its models through a Runner (SUT.__init__), and `SUT.use_fast_path` gives each its fast step in
place, so a drafter holding the same runner drafts on it too: suts/fast/fused.py's FusedStep on a CPU,
suts/fast/graphs.py's GraphStep on a GPU, both keeping suts/fast/step.py's contract. A runner is called as its model
is, `runner(ids, chunk)` (mlperf/chunk.py; a head's `runner(ids, chunk, feats, wte)`), and returns what the model
returns: it asks the step for its plan of the chunk once, and runs the plan or the model's modules, counting each
(`tally`: by reason where the modules ran). `greedy` and `argmaxes` are what a greedy step asks for: on a fast path
one call that returns token ids, no logits. The model itself stays a plain nn.Module, reached as `runner.model` for
anything else (its lm_head, its modules); a runner answers only what it names below."""
from dataclasses import replace

import torch
import torch.nn as nn

from mlperf.cache import KVCache, TreeMask
from mlperf.chunk import Chunk
from mlperf.model import GPT
from suts.fast.step import WEIGHTS, FastStep, Op, Plan, Refusal, Tally


PATHS = ("auto", "graph", "fused", "modules")  # what use_fast_path may be told to run a model's steps on
FAST_STEP = ("kind", "half", "threads", "plan", "forward", "greedy", "argmaxes")  # what FastStep asks of a step


class Runner:
    def __init__(self, model: nn.Module, fast_step=None):
        self.model = model
        self.fast_step = fast_step
        self.vs_modules: float | None = None  # the fused step's speed over the modules', where timed at load
        self.tally = Tally()

    def use_fast_path(self, weights: str = WEIGHTS, path: str = "auto", **packing) -> "Runner":
        """How the model's steps run, decided here alone, in place. `path` "graph": CUDA graphs (on a CPU their eager
        stand-in); "fused": the CPU's fused C step where the kernels can run the model whole (fp16 panels with
        weights "fp16"; `packing`: min_weights, see suts/fast/packed.py); "modules"; or "auto": graphs for a GPT on
        an NVIDIA GPU, on a CPU the fused step where it times faster than the modules (suts/fast/choice.py;
        MLPERF_ROWS_KERNEL=1 takes it untimed, =0 builds no kernels), elsewhere the modules. The fast paths are
        imported here: a SUT's interface (suts/base.py), which reports read, loads no kernel."""
        from suts.fast import native
        from suts.fast.choice import choose
        from suts.fast.fused import fused_step
        from suts.fast.graphs import Graph, GraphStep, Replayed
        if path not in PATHS:
            raise ValueError(f"unknown path {path!r}; choose one of {', '.join(PATHS)}")
        device = next(self.model.parameters()).device.type
        if device == "cuda":  # cuDNN's attention plans a kernel for each new key count, taking milliseconds: every
            torch.backends.cuda.enable_cudnn_sdp(False)  # prefill and eager step would pay it (process-wide)
        timed = path == "auto" and native.kernel_setting() != "1"
        if path == "auto":
            path = {"cuda": "graph", "cpu": "fused"}.get(device, "modules")
        self.vs_modules = None
        if path == "graph" and isinstance(self.model, GPT):
            self.fast_step = GraphStep(self.model, Graph if device == "cuda" else Replayed)
        elif path == "fused" and device == "cpu":
            self.fast_step = fused_step(self.model, weights, **packing)
            if timed:
                self.fast_step, self.vs_modules = choose(self.fast_step, self.model)
        else:
            self.fast_step = None
        return self

    @property
    def fast_step(self) -> FastStep | None:
        """The model's fast step (suts/fast/step.py), or None: the modules alone."""
        return self._fast_step

    @fast_step.setter
    def fast_step(self, step: FastStep | None) -> None:
        if step is not None and not isinstance(step, FastStep):
            raise TypeError(f"{type(step).__name__} is not a FastStep (suts/fast/step.py): it lacks "
                            + ", ".join(n for n in FAST_STEP if not hasattr(step, n)))
        self._fast_step = step

    @property
    def kind(self) -> str:
        """What runs the model's steps, for the run record."""
        return "modules" if self.fast_step is None else self.fast_step.kind

    def choice(self) -> str:
        """What runs its steps and, where the choice was timed at load, by how much it beat the other path."""
        if self.vs_modules is None:
            return self.kind
        faster = self.vs_modules if self.fast_step is not None else 1 / self.vs_modules
        return f"{self.kind}, {faster:.2f}x the {'modules' if self.fast_step is not None else 'fused C step'} (timed)"

    @property
    def config(self):
        return self.model.config

    def embedding_and_head(self) -> tuple[nn.Embedding, nn.Linear]:
        """A GPT's token embedding and LM head (tied): what a drafter shares with its target."""
        return self.model.transformer.wte, self.model.lm_head

    def new_cache(self, *args, **kwargs) -> KVCache:
        """A KV cache for the model (GPT.new_cache)."""
        return self.model.new_cache(*args, **kwargs)

    def plan(self, op: Op, ids, chunk: Chunk, *inputs) -> Plan | None:
        """The fast step's plan for `op` on this chunk, counted a step; None where it has none (its caller then runs
        the chunk's forwards, each counted where it runs: a fall-back is a forward through the modules alone)."""
        plan = Refusal.NO_STEP if self.fast_step is None else self.fast_step.plan(op, ids, chunk, *inputs)
        if isinstance(plan, Refusal):
            if op == "forward":
                self.tally.fell_back[plan] += 1
            return None
        self.tally.steps += 1
        return plan

    def __call__(self, ids: torch.Tensor, chunk: Chunk | None = None, *inputs):
        chunk = (chunk or Chunk()).of(ids)
        if (plan := self.plan("forward", ids, chunk, *inputs)) is not None:
            return self.fast_step.forward(plan)
        return self.model(ids, chunk, *inputs)

    def greedy(self, ids: list[int], cache: KVCache, lens: list[int], n: int) -> list[list[int]]:
        """Each row's n greedy tokens after a packed chunk (its token ids, lens[b] for row b): the argmax at its last
        token, then n - 1 steps, each fed the row's last argmax. One call on a fast path, else a loop."""
        chunk = Chunk(cache, lens=lens, last_only=True, B=len(lens), T=max(lens))
        if (plan := self.plan("greedy", ids, chunk)) is not None:  # greedy_in_one_call inlined: a call less a token
            return self.fast_step.greedy(plan, n)
        packed = torch.tensor([ids], device=cache.k.device)  # (1, sum(lens))
        if lens == [chunk.T] * chunk.B:  # rows of one length: (B, T), as a batch's decode step is, not packed
            packed, chunk = packed.view(chunk.B, chunk.T), replace(chunk, lens=None)
        tokens = self(packed, chunk).logits[:, -1].argmax(-1)
        drafts, one = [tokens], Chunk(cache, last_only=True)  # each step after: one token a row
        for _ in range(n - 1):
            drafts.append(self(drafts[-1].view(-1, 1), one).logits[:, -1].argmax(-1))
        return torch.stack(drafts, 1).tolist()

    def greedy_in_one_call(self, ids: list[int], chunk: Chunk, n: int, *inputs) -> list[list[int]] | None:
        """Each row's n greedy tokens after the packed chunk from one call of the fast step where it has a plan for
        them (`inputs`: an EAGLE head's features and embedding), else None: the caller decodes them its own way (the
        EAGLE head's; a GPT's is `greedy`)."""
        plan = self.plan("greedy", ids, chunk, *inputs)
        return None if plan is None else self.fast_step.greedy(plan, n)

    def argmaxes(self, rows: list[list[int]], cache: KVCache, tree: TreeMask | None = None) -> list[list[int]]:
        """Each token's argmax, for B rows of T token ids: what a greedy verify pass needs of its logits. One call on
        the CPU's fast path, which makes no tensors; elsewhere the forward's logits' argmax."""
        chunk, ids = Chunk(cache, tree, B=len(rows), T=len(rows[0])), [t for row in rows for t in row]
        if (plan := self.plan("argmaxes", ids, chunk)) is not None:
            return self.fast_step.argmaxes(plan)
        return self(torch.tensor(rows, device=cache.k.device), chunk).logits.argmax(-1).tolist()


def as_runner(model: "nn.Module | Runner") -> Runner:
    """A model's runner: itself if it is one, else its modules."""
    return model if isinstance(model, Runner) else Runner(model)
