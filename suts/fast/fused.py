"""CPU fast path: a model's forward of a few tokens against its KV cache as one C call (FusedStep).

A forward of up to 64 tokens in all (a decode step, a verify pass, a draft step, a catch-up chunk, a tree's nodes)
of a GPT or an EAGLE head, in fp32 or with int8 linears, runs as one call of suts/fast/kernels/forward.c's
`forward`, free of Python and dispatch between its ops; `greedy` adds greedy steps and returns argmaxes alone,
`argmaxes` a verify pass's argmaxes. Its linears stream each weight once however many rows there are, and give each
row the same result whatever its batch. More tokens (a verify pass of many rows, a prefill) run as several such
calls, cut as suts/fast/spans.py cuts them. A model's runner (suts/fast/runner.py) asks the step for its `plan` of
a chunk (suts/fast/step.py's contract) and runs its modules where it has none. The panels lie on 2 MiB pages
(mlperf/pages.py), and each call runs on the thread count its size was timed fastest on (suts/fast/threads.py).
"""
import ctypes
import time
from dataclasses import dataclass, replace
from functools import partialmethod
from typing import NamedTuple

import torch
import torch.nn as nn

from mlperf.chunk import Chunk, Output
from mlperf.model import GPT, EagleHead
from mlperf.pages import huge_pages
from suts.fast import spans
from suts.fast.native import CALL, LAYER, MODEL, cache_levels, rows_kernel
from suts.fast.packed import (MIN_PACKED_WEIGHTS, PackedLinear, can_pack, kernel_weights, pack_linears, pack_panels,
                         profiled, streams_half)
from suts.fast.quantize import DynamicInt8Linear
from suts.fast.step import WEIGHTS, Plan, Refusal
from suts.fast.threads import ThreadPicker

TOO_LONG = 2  # forward.c's `forward` returns 0 when done, 1 for a token id outside the vocabulary, 2 for this
MAX_PLANS = 256  # plans a model keeps (an operation, a shape and a cache each) before it starts again


def fused_step(model: nn.Module, weights: str = WEIGHTS, min_weights: int = MIN_PACKED_WEIGHTS) -> "FusedStep | None":
    """Pack the model's large linears (suts/fast/packed.py, for its modules) and, for a GPT or an EAGLE head the kernels
    can run whole, its fused step (FusedHead for a head); None where there is none."""
    if not can_pack(model):
        return None
    half = streams_half(model, weights)  # before packing: it reads the plain linears' weights
    pack_linears(model, min_weights, half)
    if (kernel := rows_kernel()) is None or not FusedStep.fits(model):
        return None
    return (FusedStep if isinstance(model, GPT) else FusedHead)(model, kernel, half)


def is_resident(weight_bytes: int) -> bool:
    """Whether a model's weights stay in the last-level cache between calls (within three quarters of it, beside the
    activations and the KV cache) but outgrow L2: where one row's passes gain by asking for them ahead (linear.c)."""
    levels = cache_levels()
    return bool(levels) and levels.get(2, 0) < weight_bytes <= levels[max(levels)] * 3 // 4


class FusedStep:
    """A GPT's forward of at most max_rows new tokens in all, against the KV cache, in one call of forward.c's
    `forward` (more as several), or its argmaxes alone (`greedy`, `argmaxes`): suts/fast/step.py's contract."""
    kind = "fused C step"

    def __init__(self, model: GPT | EagleHead, kernel, half: bool = False):
        self.kernel, self.config, self.max_rows, self.half = kernel, model.config, kernel.max_rows(), half
        self.tensors = []  # what the structs point into, kept alive with them
        self.plans: dict[tuple, tuple[Piece, ...]] = {}  # each plan's calls, by operation, shape and cache (plan)
        self.threads = ThreadPicker()  # each size of call's thread count (suts/fast/threads.py)
        self.work = torch.empty(10 * self.max_rows * model.config.n_embd)  # every call's scratch (one at a time)
        # a chain's last hidden states and logits, which it does not return
        self.chained = torch.empty(self.max_rows * (model.config.n_embd + model.config.vocab_size))
        self.ids = (ctypes.c_long * self.max_rows)()  # a chain's token ids, and its argmaxes (no tensors)
        self.choices = (ctypes.c_long * self.max_rows)()

        def vec(t: torch.Tensor | None, n: int = 0) -> int:
            self.tensors.append(torch.zeros(n) if t is None else t.detach().contiguous())
            return self.tensors[-1].data_ptr()

        c, C = model.config, model.config.n_embd
        gpt = isinstance(model, GPT)
        blocks = model.transformer.h if gpt else [model.block]
        per_block = [(b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj) for b in blocks]  # as a forward runs them
        linears = [m for four in per_block for m in four]
        linears = [*linears, model.lm_head] if gpt else [model.fc, *linears]
        weights = [kernel_weights(m, half) for m in linears]
        panels = huge_pages([w[0] for w in weights])  # end to end, in the order a forward reads them
        for m, p in zip(linears, panels):
            if isinstance(m, PackedLinear):
                m.panels = p  # the modules' path reads the same copy
        by_layer = {id(m): (p, b, s) for m, p, (_, b, s) in zip(linears, panels, weights)}

        def lin(layer: nn.Module) -> tuple[int, int, int | None]:
            self.tensors.extend(by_layer[id(layer)])
            return tuple(None if t is None else t.data_ptr() for t in by_layer[id(layer)])

        layers = []
        for b, four in zip(blocks, per_block):
            (attn_p, attn_b, attn_s), (proj_p, proj_b, proj_s), (fc_p, fc_b, fc_s), (out_p, out_b, out_s) = \
                (lin(m) for m in four)
            layers.append(LAYER(ln1_w=vec(b.ln_1.weight, C), ln1_b=vec(b.ln_1.bias, C), ln2_w=vec(b.ln_2.weight, C),
                                ln2_b=vec(b.ln_2.bias, C), attn_p=attn_p, proj_p=proj_p, fc_p=fc_p, out_p=out_p,
                                attn_b=attn_b, proj_b=proj_b, fc_b=fc_b, out_b=out_b, attn_s=attn_s, proj_s=proj_s,
                                fc_s=fc_s, out_s=out_s))
        self.layers = (LAYER * len(layers))(*layers)
        ln_f = model.transformer.ln_f if gpt else model.ln_f
        in_p, in_b, _ = (None, None, None) if gpt else lin(model.fc)
        head_p, head_b, head_s = lin(model.lm_head) if gpt else (None, None, None)
        wte, wpe = (vec(model.transformer.wte.weight), vec(model.transformer.wpe.weight)) if gpt else \
            (None, None)  # a head's token embeddings are its target's, given at each call
        ends = [p.data_ptr() + p.numel() * p.element_size() for p in panels]
        resident = is_resident(sum(p.numel() * p.element_size() for p in panels))
        together = all(0 <= p.data_ptr() - end < 64 for end, p in zip(ends, panels[1:]))  # end to end (huge_pages)
        self.model = MODEL(n_layer=len(blocks), n_head=c.n_head, n_embd=C, vocab=c.vocab_size, wte=wte, wpe=wpe,
                           in_b=in_b, lnf_w=vec(ln_f.weight, C), lnf_b=vec(ln_f.bias, C), head_b=head_b, head_s=head_s,
                           in_p=in_p, head_p=head_p, layers=ctypes.cast(self.layers, ctypes.c_void_p),
                           weights=panels[0].data_ptr() if together else None,
                           weights_bytes=ends[-1] - panels[0].data_ptr() if together else 0, half=int(half),
                           resident=int(resident))

    @staticmethod
    def fits(model: nn.Module) -> bool:
        """A float32 CPU GPT or EAGLE head whose every linear layer is a plain, packed or int8 one."""
        linears = [m for m in model.modules() if "Linear" in type(m).__name__]
        return isinstance(model, (GPT, EagleHead)) and can_pack(model) and \
            all(type(m) in (nn.Linear, PackedLinear, DynamicInt8Linear) for m in linears)

    def plan(self, op: str, ids, chunk: Chunk, *inputs) -> Plan | Refusal:
        """The calls of the kernels that run `op` on the chunk (`pieces`), worked out once for a shape against a cache
        and kept (a chunk with a tree anew each time); else why the kernels do not run it."""
        if chunk.cache is None:
            return Refusal.NO_CACHE
        if chunk.features and chunk.last_only and op != "forward":
            return Refusal.FEATURES_AT_LAST
        if op == "forward" and ids.dtype != torch.long:
            return Refusal.IDS_NOT_INT64
        runs = self.whole(chunk)
        key = (op, spans.key(runs))
        if (pieces := self.plans.get(key)) is not None:  # this shape ran before against this cache
            return Plan(ids, chunk, pieces, inputs)
        if op != "forward" and len(ids) != sum(chunk.counts):
            return Refusal.IDS_UNLIKE_ROWS
        if min(runs.counts) < 1:
            return Refusal.EMPTY_ROW
        cut = spans.spans(op, runs, self.max_rows)
        if (why := next(filter(None, (spans.refuses(span.chunk, self.max_rows) for span in cut)), None)) is not None:
            return why
        pieces = tuple(Piece(*span, self.prepare(span.chunk)) for span in cut)
        if runs.tree is None:
            if len(self.plans) >= MAX_PLANS:
                self.plans.clear()
            self.plans[key] = pieces
        return Plan(ids, chunk, pieces, inputs)

    @staticmethod
    def whole(chunk: Chunk) -> Chunk:
        """The chunk a forward runs: every token's outputs where it asks for every token's features (an EAGLE SUT's
        prefill), the kernel writing features only where it writes logits; else the chunk itself."""
        return replace(chunk, last_only=False) if chunk.features else chunk

    def forward(self, plan: Plan) -> Output:
        """What GPT.forward returns for the chunk (of a `whole` one, the last logits of each row)."""
        logits, hidden = self.outputs(plan, None)
        chunk = plan.chunk
        if chunk.features:
            return Output(chunk.lasts(logits) if chunk.last_only else logits, hidden)
        return Output(logits)

    def outputs(self, plan: Plan, feats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and final hidden states of the plan's chunk, every token's (a `whole` one), from its calls in turn;
        `feats`, a head's, one row a token."""
        pieces = plan.pieces
        if len(pieces) == 1:
            return self.run(plan.ids, feats, pieces[0])
        ids, cache = plan.ids.reshape(-1), plan.chunk.cache
        self.check_ids(ids)
        cache.check(max(s + n for s, n in zip(cache.held(), plan.chunk.counts)))  # for every call here, as the ids
        outs = [self.run(ids[p.a:p.b], feats, p) for p in pieces]
        first = pieces[0].chunk
        dim = 0 if first.last_only or first.lens is None else 1  # rows of logits, or one packed row of them
        return tuple(torch.cat([out[i][:p.keep] for out, p in zip(outs, pieces)], dim) for i in (0, 1))

    def check_ids(self, idx: torch.Tensor) -> None:
        """Ids inside the vocabulary, checked once for a chunk that runs as several calls: the kernel checks each
        call's only when its turn comes, after the calls before it have written. IndexError, as the modules raise."""
        low, high = torch.aminmax(idx)
        if low < 0 or high >= self.config.vocab_size:
            raise IndexError(f"a token id outside the vocabulary of {self.config.vocab_size}")

    def greedy(self, plan: Plan, n: int, feats: torch.Tensor | None = None) -> list[list[int]]:
        """Each row's argmax at its last token of the chunk (last_only) and at n - 1 greedy steps after it (a greedy
        draft, a greedy decode step), as forward.c's `chain` computes them: one call of each of the plan's pieces,
        groups of whole rows where the chunk has more tokens than one call takes. `feats`, a head's."""
        rows = []
        for piece in plan.pieces:
            self.load(plan.ids[piece.a:piece.b], self.feats_at(feats, piece), piece.call, n)
            self.invoke(piece.call, piece.chunk, n)
            rows += self.by_row(piece.call, piece.chunk.B, n)
        return rows

    # Each token's argmax (every token's outputs: a greedy verify pass, a tree's nodes): `greedy` with no step after
    # the chunk, as a partial, so that no call stands between the two.
    argmaxes = partialmethod(greedy, n=1)

    @staticmethod
    def feats_at(feats: torch.Tensor | None, piece: "Piece") -> int | None:
        """Where the features of the piece's first token lie (a head's, contiguous, one row a token); None: a GPT's."""
        return None if feats is None else feats.data_ptr() + piece.a * feats.stride(0) * feats.element_size()

    def load(self, ids: list[int], feats: int | None, call: "Call", n: int) -> None:
        """A greedy chain's or argmaxes' ids, outputs and argmaxes pointed at ctypes buffers: right after a forward
        has streamed the weights through every cache, making a tensor costs several times what writing a buffer
        does."""
        if call.out * n > len(self.choices):
            self.choices = (ctypes.c_long * (call.out * n))()
        self.ids[:call.n] = ids
        hidden_p = self.chained.data_ptr()  # the last forward's outputs, which it does not return
        args = call.args
        args.tokens, args.feats, args.hidden, args.drafts = \
            ctypes.addressof(self.ids), feats, hidden_p, ctypes.addressof(self.choices)
        args.logits = hidden_p + self.chained.element_size() * call.out * self.config.n_embd

    def by_row(self, call: "Call", B: int, n: int) -> list[list[int]]:
        """The argmaxes a chain wrote, row by row."""
        flat, width = self.choices[:call.out * n], call.out * n // B
        return [flat[b * width:(b + 1) * width] for b in range(B)]

    def run(self, idx: torch.Tensor, feats: torch.Tensor | None, piece: "Piece") -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and final hidden states of one call of a plan. The kernel checks the ids and the context, and moves
        the rows' lengths on."""
        C, call, chunk = self.config.n_embd, piece.call, piece.chunk
        ids = idx.contiguous()
        hidden, logits = torch.empty(call.out, C), torch.empty(call.out, self.config.vocab_size)
        args = call.args
        args.tokens, args.feats, args.hidden, args.logits, args.drafts = \
            ids.data_ptr(), self.feats_at(feats, piece), hidden.data_ptr(), logits.data_ptr(), None
        self.invoke(call, chunk, 0)
        packed = chunk.lens is not None
        shape = (len(call.counts), 1) if chunk.last_only else (1, call.n) if packed else (chunk.B, chunk.T)
        return logits.view(*shape, -1), hidden.view(*shape, -1)

    def invoke(self, call: "Call", chunk: Chunk, steps: int) -> None:
        """One call of forward.c's `forward` (steps 0) or `chain` (steps >= 1, its argmaxes into the call's drafts),
        its other pointers set by the caller, on the thread count picked for its size. Where the kernel refuses the
        chunk, having written nothing, the modules' error: IndexError for an id outside the vocabulary, ValueError
        for a context too long."""
        args, tree = call.args, chunk.tree
        args.n = steps
        if tree is not None:
            depths, visible = tree.depths.contiguous(), tree.visible[-chunk.T:].to(torch.uint8).contiguous()
            args.depths, args.visible, args.nodes = depths.data_ptr(), visible.data_ptr(), visible.shape[1]
        else:
            args.depths = args.visible = None
            args.nodes = 0
        size, most = self.threads.size(call.n, max(steps, 1)), torch.get_num_threads()
        args.threads = threads = self.threads.pick(size, most)
        start = time.perf_counter()
        with profiled("fused_step_chain" if steps else "fused_step"):
            refused = (self.kernel.chain if steps else self.kernel.forward)(ctypes.byref(args))
        if refused == TOO_LONG:
            cache = chunk.cache
            cache.check(max(cache.held()) + max(call.counts) + max(steps, 1) - 1)  # raises: which context
        if refused:
            raise IndexError(f"a token id outside the vocabulary of {self.config.vocab_size}")
        self.threads.record(size, most, threads, (time.perf_counter() - start) / max(steps, 1))

    def prepare(self, chunk: Chunk) -> "Call":
        """What every call of this shape against this cache passes alike, built once for a plan (which is kept):
        between steps the Python runs on caches that the weights' stream has just flushed, where each check and
        allocation costs several times what it does warm."""
        cache = chunk.cache
        k, counts = cache.k, chunk.counts
        n = sum(counts)
        lens_c = (ctypes.c_int * len(counts))(*counts)
        call = Call(counts, n, len(counts) if chunk.last_only else n, lens_c, CALL(
            m=ctypes.addressof(self.model), starts=cache.lengths.data_ptr(), B=len(counts),
            lens=ctypes.addressof(lens_c), k=k.data_ptr(), v=cache.v.data_ptr(), layer_stride=k.stride(0),
            row_stride=k.stride(1), max_len=cache.max_len, work=self.work.data_ptr(), last_only=int(chunk.last_only),
            limit=cache.limit))
        return call


@dataclass
class Call:
    """A fused call of one shape against one cache: its rows' token counts, and kernels.h's `struct call` with what
    does not change from step to step filled in (the rows, the cache's layout, the context); `invoke` fills the rest."""
    counts: list[int]
    n: int  # tokens in all
    out: int  # rows of logits it returns
    lens: ctypes.Array  # the counts as the struct points at them, kept alive with it
    args: ctypes.Structure


class Piece(NamedTuple):
    """One call of a plan: its share of the chunk (a spans.Span's fields) and the call prepared for it."""
    a: int
    b: int
    chunk: Chunk
    keep: int | None
    call: Call


class FusedHead(FusedStep):
    """An EAGLE head's forward in one call, called as the head is (EagleHead.forward); and its greedy chain, each
    step fed its own features and the argmax of its target's LM head over them (the target's token embedding, tied
    to that head, comes with every call and is packed here once)."""
    lm_head: tuple | None = None  # (the target's embedding, its panels, their bias) once a call has brought it

    def use(self, wte: torch.Tensor) -> None:
        """The target's token embedding, as the head's embedding and (packed) its LM head."""
        self.model.wte = wte.data_ptr()
        if self.lm_head is None or self.lm_head[0] is not wte:
            self.lm_head = (wte, *pack_panels(wte, None, self.half))
            self.model.head_p, self.model.head_b = self.lm_head[1].data_ptr(), self.lm_head[2].data_ptr()

    def plan(self, op: str, ids, chunk: Chunk, *inputs) -> Plan | Refusal:
        """As FusedStep's, for a head's inputs (feats, wte): its target's features, one per token, and its target's
        token embedding."""
        if chunk.cache is None:
            return Refusal.NO_CACHE
        if op == "argmaxes" or op == "forward" and ids.dtype != torch.long:
            return Refusal.HEAD_OP
        feats = inputs[0]
        if feats.dtype != torch.float32 or feats.numel() != sum(chunk.counts) * self.config.n_embd:
            return Refusal.FEATURES_UNLIKE_TOKENS
        if op == "greedy" and (not chunk.last_only or len(ids) != sum(chunk.counts)):
            return Refusal.CHAIN_NOT_AFTER_LAST
        return super().plan(op, ids, chunk, *inputs)

    def flat_feats(self, plan: Plan) -> torch.Tensor:
        """The plan's features, one contiguous row a token, with its target's embedding put to use."""
        feats, wte = plan.inputs
        self.use(wte)
        return feats.reshape(-1, self.config.n_embd).contiguous()

    def forward(self, plan: Plan) -> torch.Tensor:
        return self.outputs(plan, self.flat_feats(plan))[1]

    def greedy(self, plan: Plan, n: int) -> list[list[int]]:
        """Each row's argmax after its last token of the chunk, and at n - 1 steps after it, each fed the row's last
        argmax and the head's own features (forward.c's `chain`)."""
        return super().greedy(plan, n, self.flat_feats(plan))
