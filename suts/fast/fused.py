"""CPU fast path: a model's forward of a few tokens against its KV cache as one C call (FusedStep).

A forward of up to 64 tokens in all (a decode step, a verify pass, a draft step, a catch-up chunk, a tree's nodes)
of a GPT or an EAGLE head, in fp32 or with int8 linears, runs as one call of suts/fast/kernels/forward.c's
`forward`, free of Python and dispatch between its ops; `greedy` adds greedy steps and returns argmaxes alone,
`argmaxes` a verify pass's argmaxes. Its linears stream each weight once however many rows there are, and give each
row the same result whatever its batch. More tokens (a verify pass of many rows, a prefill) run as several such
calls. A model's runner (suts/fast/runner.py) asks the step whether it `takes` a chunk (suts/fast/step.py's
contract) and runs its modules where it does not. The panels lie on 2 MiB pages (mlperf/pages.py), and each call
runs on the thread count its size was timed fastest on (suts/fast/threads.py).
"""
import bisect
import ctypes
import itertools
import time
from dataclasses import dataclass, replace
from functools import partialmethod

import torch
import torch.nn as nn

from mlperf.chunk import Chunk, Output
from mlperf.model import GPT, EagleHead
from mlperf.pages import huge_pages
from suts.fast.native import CALL, LAYER, MODEL, rows_kernel
from suts.fast.packed import (MIN_PACKED_WEIGHTS, PackedLinear, can_pack, kernel_weights, pack_linears, pack_panels,
                         profiled, streams_half)
from suts.fast.quantize import DynamicInt8Linear
from suts.fast.step import WEIGHTS
from suts.fast.threads import ThreadPicker

TOO_LONG = 2  # forward.c's `forward` returns 0 when done, 1 for a token id outside the vocabulary, 2 for this
MAX_CALLS = 256  # prepared calls a model keeps (a shape and a cache each) before it starts again


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


class FusedStep:
    """A GPT's forward of at most max_rows new tokens in all, against the KV cache, in one call of forward.c's
    `forward` (more as several), or its argmaxes alone (`greedy`, `argmaxes`): suts/fast/step.py's contract."""
    kind = "fused C step"

    def __init__(self, model: GPT | EagleHead, kernel, half: bool = False):
        self.kernel, self.config, self.max_rows, self.half = kernel, model.config, kernel.max_rows(), half
        self.tensors = []  # what the structs point into, kept alive with them
        self.calls: dict[tuple, Call] = {}  # prepared calls by shape and cache (prepare)
        self.threads = ThreadPicker()  # each size of call's thread count (suts/fast/threads.py)
        self.work = torch.empty(10 * self.max_rows * model.config.n_embd)  # every call's scratch (one at a time)
        self.chained = torch.empty(self.max_rows * (model.config.n_embd + model.config.vocab_size))  # a chain's
        # last hidden states and logits, which it does not return
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
        together = all(0 <= p.data_ptr() - end < 64 for end, p in zip(ends, panels[1:]))  # end to end (huge_pages)
        self.model = MODEL(n_layer=len(blocks), n_head=c.n_head, n_embd=C, vocab=c.vocab_size, wte=wte, wpe=wpe,
                           in_b=in_b, lnf_w=vec(ln_f.weight, C), lnf_b=vec(ln_f.bias, C), head_b=head_b, head_s=head_s,
                           in_p=in_p, head_p=head_p, layers=ctypes.cast(self.layers, ctypes.c_void_p),
                           weights=panels[0].data_ptr() if together else None,
                           weights_bytes=ends[-1] - panels[0].data_ptr() if together else 0, half=int(half))

    @staticmethod
    def fits(model: nn.Module) -> bool:
        """A float32 CPU GPT or EAGLE head whose every linear layer is a plain, packed or int8 one."""
        linears = [m for m in model.modules() if "Linear" in type(m).__name__]
        return isinstance(model, (GPT, EagleHead)) and can_pack(model) and \
            all(type(m) in (nn.Linear, PackedLinear, DynamicInt8Linear) for m in linears)

    def takes(self, op: str, ids, chunk: Chunk) -> str | None:
        """None where the kernels run `op` on the chunk (a forward of more than max_rows tokens as several calls:
        `split`; one of every token's features as a pass of every token's outputs: `whole`); else why not."""
        if chunk.cache is None:
            return "a whole sequence (no cache)"
        if chunk.features and chunk.last_only and op != "forward":
            return "features at each row's last token"
        chunk = self.whole(chunk)
        if op == "forward" and ids.dtype != torch.long:
            return "token ids not int64"
        if chunk.tree is None and self.key(chunk) in self.calls:  # this shape ran before against this cache
            return None
        if op != "forward":
            if len(ids) != sum(chunk.counts):
                return "ids unlike the chunk's rows"
            return next(filter(None, (self.refuses(part) for _, part in self.in_groups(ids, chunk))), None)
        split = self.split(chunk)
        if split == "rows":  # every group laid out as the first
            return self.refuses(chunk.rows(*self.row_groups(chunk.counts)[0]))
        if split == "pieces":  # every piece of at most max_rows tokens, laid out alike
            return "an empty row" if min(chunk.counts) < 1 else self.unlike(self.packed(chunk))
        return self.refuses(chunk)

    def split(self, chunk: Chunk) -> str:
        """How a forward runs the chunk: in groups of whole rows ("rows": a verify pass of many rows), in pieces of
        a packed chunk ("pieces": a prefill), or in one call ("one")."""
        if chunk.lens is None and chunk.B * chunk.T > self.max_rows >= chunk.T:
            return "rows"
        if chunk.tree is None and (chunk.lens is not None or chunk.B == 1) and sum(chunk.counts) > self.max_rows:
            return "pieces"
        return "one"

    @staticmethod
    def packed(chunk: Chunk) -> Chunk:
        """A chunk of one row as the packed chunk of it."""
        return chunk if chunk.lens is not None else replace(chunk, lens=[chunk.T])

    @staticmethod
    def whole(chunk: Chunk) -> Chunk:
        """The chunk a forward runs: every token's outputs where it asks for every token's features (an EAGLE SUT's
        prefill), the kernel writing features only where it writes logits; else the chunk itself."""
        return replace(chunk, last_only=False) if chunk.features else chunk

    def forward(self, ids: torch.Tensor, chunk: Chunk) -> Output:
        """What GPT.forward returns for the chunk (of a `whole` one, the last logits of each row)."""
        logits, hidden = self.outputs(ids, None, self.whole(chunk))
        if chunk.features:
            return Output(chunk.lasts(logits) if chunk.last_only else logits, hidden)
        return Output(logits)

    def outputs(self, ids: torch.Tensor, feats: torch.Tensor | None, chunk: Chunk) -> tuple[torch.Tensor, ...]:
        """Logits and final hidden states of a chunk `takes` said the kernels run, in the calls `split` says."""
        split = self.split(chunk)
        return self.by_rows(ids, feats, chunk) if split == "rows" else \
            self.by_pieces(ids, feats, self.packed(chunk)) if split == "pieces" else self.run(ids, feats, chunk)

    def check_ids(self, idx: torch.Tensor) -> None:
        """Ids inside the vocabulary, checked once for a chunk that runs as several calls: the kernel checks each
        call's only when its turn comes, after the calls before it have written. IndexError, as the modules raise."""
        low, high = torch.aminmax(idx)
        if low < 0 or high >= self.config.vocab_size:
            raise IndexError(f"a token id outside the vocabulary of {self.config.vocab_size}")

    def by_rows(self, idx: torch.Tensor, feats: torch.Tensor | None, chunk: Chunk) -> tuple[torch.Tensor, ...]:
        """A chunk of more than max_rows tokens in all but not in a row (a verify pass of many rows), in groups of
        rows that each fit: the weights stream once a group, and every batch takes the path a small one takes
        (oneDNN, the alternative, was slower here at 16 and 32 rows of 5). Outputs as run's."""
        self.check_ids(idx)
        chunk.cache.check(max(chunk.cache.held()) + chunk.T)  # for every group here, as the ids
        outs = [self.run(idx[a:b], None if feats is None else feats[a:b], chunk.rows(a, b))
                for a, b in self.row_groups(chunk.counts)]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])

    def by_pieces(self, idx: torch.Tensor, feats: torch.Tensor | None, chunk: Chunk) -> tuple[torch.Tensor, ...]:
        """A packed chunk (lens) of more than max_rows tokens (a prefill) in pieces of max_rows tokens, each the packed
        chunk of the rows it holds tokens of; a token's result is the same in any chunk, so the pieces change nothing.
        Outputs as run's."""
        lens, cache = chunk.lens, chunk.cache
        self.check_ids(idx)
        cache.check(max(s + n for s, n in zip(cache.held(), lens)))  # for every piece here, as the ids
        ids, ends, logits, hidden = idx.view(1, -1), list(itertools.accumulate(lens)), [], []
        for a in range(0, ends[-1], self.max_rows):
            b = min(a + self.max_rows, ends[-1])
            first, last = bisect.bisect_right(ends, a), bisect.bisect_left(ends, b)  # the rows a..b-1 hold
            counts = [min(ends[r], b) - max(ends[r] - lens[r], a) for r in range(first, last + 1)]
            out = self.run(ids[:, a:b], None if feats is None else feats[:, a:b], chunk.rows(first, last + 1, counts))
            done = len(counts) - (ends[last] > b)  # last_only: the rows whose last token is in this piece
            logits.append(out[0][:done] if chunk.last_only else out[0])
            hidden.append(out[1][:done] if chunk.last_only else out[1])
        dim = 0 if chunk.last_only else 1
        return torch.cat(logits, dim), torch.cat(hidden, dim)

    def greedy(self, ids: list[int], chunk: Chunk, n: int) -> list[list[int]]:
        """Each row's argmax at its last token of the chunk (last_only) and at n - 1 greedy steps after it (a greedy
        draft, a greedy decode step), as forward.c's `chain` computes them: one call, or one for each group of rows
        that fits one where the chunk has more tokens (`in_groups`)."""
        rows = []
        for part_ids, part in [(ids, chunk)] if sum(chunk.counts) <= self.max_rows else self.in_groups(ids, chunk):
            call = self.load(part_ids, part, n)
            self.invoke(call, part, n)
            rows += self.by_row(call, part.B, n)
        return rows

    # Each token's argmax (every token's outputs: a greedy verify pass, a tree's nodes): `greedy` with no step after
    # the chunk, as a partial, so that no call stands between the two.
    argmaxes = partialmethod(greedy, n=1)

    def row_groups(self, counts: list[int]) -> list[tuple[int, int]]:
        """Rows a..b-1 in groups of as many whole rows as one call takes, in order (a row of more tokens than a call
        takes is a group alone, which `refuses`)."""
        groups, a = [], 0
        while a < len(counts):
            b, n = a + 1, counts[a]
            while b < len(counts) and n + counts[b] <= self.max_rows:
                n, b = n + counts[b], b + 1
            groups.append((a, b))
            a = b
        return groups

    def in_groups(self, ids: list[int], chunk: Chunk):
        """A greedy call's (ids, chunk) for each of `row_groups`, with its rows' ids and features."""
        counts, starts = chunk.counts, [0, *itertools.accumulate(chunk.counts)]
        for a, b in self.row_groups(counts):
            part = chunk if (a, b) == (0, len(counts)) else \
                chunk.rows(a, b, None if chunk.lens is None else counts[a:b])
            if part is not chunk and chunk.feats is not None:
                part = replace(part, feats=chunk.feats.reshape(-1, chunk.feats.shape[-1])[starts[a]:starts[b]])
            yield ids[starts[a]:starts[b]], part

    def load(self, ids: list[int], chunk: Chunk, n: int) -> "Call":
        """The prepared call of a greedy chain or argmaxes with its ids, outputs and argmaxes pointed at ctypes buffers:
        right after a forward has streamed the weights through every cache, making a tensor costs several times
        what writing a buffer does."""
        call = self.prepare(chunk)
        if call.out * n > len(self.choices):
            self.choices = (ctypes.c_long * (call.out * n))()
        self.ids[:call.n] = ids
        hidden_p = self.chained.data_ptr()  # the last forward's outputs, which it does not return
        args = call.args
        feats = None if chunk.feats is None else chunk.feats.data_ptr()  # an EAGLE head's, contiguous (its greedy)
        args.tokens, args.feats, args.hidden, args.drafts = \
            ctypes.addressof(self.ids), feats, hidden_p, ctypes.addressof(self.choices)
        args.logits = hidden_p + self.chained.element_size() * call.out * self.config.n_embd
        return call

    def by_row(self, call: "Call", B: int, n: int) -> list[list[int]]:
        """The argmaxes a chain wrote, row by row."""
        flat, width = self.choices[:call.out * n], call.out * n // B
        return [flat[b * width:(b + 1) * width] for b in range(B)]

    def run(self, idx: torch.Tensor, feats: torch.Tensor | None, chunk: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and final hidden states of a chunk `takes` said one call runs. The kernel checks the ids and the
        context, and moves the rows' lengths on."""
        C, call = self.config.n_embd, self.prepare(chunk)
        ids, feats = idx.contiguous(), None if feats is None else feats.contiguous()
        hidden, logits = torch.empty(call.out, C), torch.empty(call.out, self.config.vocab_size)
        args = call.args
        args.tokens, args.feats, args.hidden, args.logits, args.drafts = \
            ids.data_ptr(), None if feats is None else feats.data_ptr(), hidden.data_ptr(), logits.data_ptr(), None
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

    def key(self, chunk: Chunk) -> tuple:
        """A prepared call's key: the chunk's shape and its cache's pointers."""
        lens = chunk.lens
        return chunk.B, chunk.T, None if lens is None else tuple(lens), chunk.last_only, chunk.cache.layout

    def refuses(self, chunk: Chunk) -> str | None:
        """Why one call of the kernels cannot run the chunk; None where it can."""
        counts = chunk.counts
        if sum(counts) > self.max_rows:
            return f"more than {self.max_rows} tokens in one call"
        if min(counts) < 1:
            return "an empty row"
        return self.unlike(chunk)

    @staticmethod
    def unlike(chunk: Chunk) -> str | None:
        """What of the chunk's layout the kernels do not read (None: nothing)."""
        cache, k, lens = chunk.cache, chunk.cache.k, chunk.lens
        if chunk.tree is not None and lens:
            return "a packed token tree"
        if k.dtype != torch.float32 or k.device.type != "cpu":
            return "a cache not float32 on the CPU"
        if k.stride()[2:] != (k.shape[3] * k.shape[4], k.shape[4], 1) or not cache.lengths.is_contiguous():
            return "a cache laid out unlike the kernels read it"
        if lens is not None and len(lens) != len(cache.lengths):
            return "packed rows unlike the cache's"
        return None

    def prepare(self, chunk: Chunk) -> "Call":
        """What every call of this shape against this cache passes alike: built once, and kept for chunks without a
        tree. Between steps the Python runs on caches that the weights' stream has just flushed, where each check
        and allocation costs several times what it does warm."""
        cache, tree = chunk.cache, chunk.tree
        key = self.key(chunk)
        if tree is None and (call := self.calls.get(key)) is not None:
            return call
        k, counts = cache.k, chunk.counts
        n = sum(counts)
        lens_c = (ctypes.c_int * len(counts))(*counts)
        call = Call(counts, n, len(counts) if chunk.last_only else n, lens_c, CALL(
            m=ctypes.addressof(self.model), starts=cache.lengths.data_ptr(), B=len(counts),
            lens=ctypes.addressof(lens_c), k=k.data_ptr(), v=cache.v.data_ptr(), layer_stride=k.stride(0),
            row_stride=k.stride(1), max_len=cache.max_len, work=self.work.data_ptr(), last_only=int(chunk.last_only),
            limit=cache.limit))
        if tree is None:
            if len(self.calls) >= MAX_CALLS:
                self.calls.clear()
            self.calls[key] = call
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


class FusedHead(FusedStep):
    """An EAGLE head's forward in one call, called as the head is (EagleHead.forward); and its greedy chain, each
    step fed its own features and the argmax of its target's LM head over them (the target's token embedding, tied
    to that head, comes with every chunk and is packed here once)."""
    lm_head: tuple | None = None  # (the target's embedding, its panels, their bias) once a chunk has brought it

    def use(self, wte: torch.Tensor) -> None:
        """The target's token embedding, as the head's embedding and (packed) its LM head."""
        self.model.wte = wte.data_ptr()
        if self.lm_head is None or self.lm_head[0] is not wte:
            self.lm_head = (wte, *pack_panels(wte, None, self.half))
            self.model.head_p, self.model.head_b = self.lm_head[1].data_ptr(), self.lm_head[2].data_ptr()

    def takes(self, op: str, ids, chunk: Chunk) -> str | None:
        if chunk.cache is None:
            return "a whole sequence (no cache)"
        if op == "argmaxes" or op == "forward" and ids.dtype != torch.long:
            return "a head's forward of int64 token ids, or its greedy chain"
        feats = chunk.feats
        if feats.dtype != torch.float32 or feats.numel() != sum(chunk.counts) * self.config.n_embd:
            return "features not float32, one row per token"
        if op == "greedy" and (not chunk.last_only or len(ids) != sum(chunk.counts)):
            return "a greedy chain after anything but a packed chunk's last tokens"
        return super().takes(op, ids, chunk)

    def forward(self, ids: torch.Tensor, chunk: Chunk) -> torch.Tensor:
        self.use(chunk.wte)
        return self.outputs(ids, chunk.feats, chunk)[1]

    def greedy(self, ids: list[int], chunk: Chunk, n: int) -> list[list[int]]:
        """Each row's argmax after its last token of the chunk, and at n - 1 steps after it, each fed the row's last
        argmax and the head's own features (forward.c's `chain`)."""
        self.use(chunk.wte)
        return super().greedy(ids, replace(chunk, feats=chunk.feats.contiguous()), n)
