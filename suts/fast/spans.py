"""How the fused step (suts/fast/fused.py) cuts a chunk into calls of the kernels, and what of a chunk no call can
run: one call where its tokens fit, a prefill in pieces, a verify pass or a greedy batch in groups of whole rows."""
import bisect
import itertools
from dataclasses import replace
from typing import NamedTuple

import torch

from mlperf.chunk import Chunk
from suts.fast.step import Refusal


class Span(NamedTuple):
    """One call's share of a chunk: tokens a..b-1 of it (counted row after row), the chunk of the rows they belong
    to, and the rows of outputs a forward keeps of it (None: all)."""
    a: int
    b: int
    chunk: Chunk
    keep: int | None = None


def spans(op: str, chunk: Chunk, most: int) -> list[Span]:
    """The calls of at most `most` tokens each that run `op` on the chunk: one where its tokens fit; a forward of a
    packed chunk or of one row (a prefill) in pieces; else groups of whole rows (a verify pass of many rows, a greedy
    batch), a row too long for a call a group alone (which `refuses`)."""
    counts = chunk.counts
    ends = list(itertools.accumulate(counts))
    if ends[-1] <= most:
        return [Span(0, ends[-1], chunk)]
    if op == "forward" and chunk.tree is None and (chunk.lens is not None or chunk.B == 1):
        return pieces(packed(chunk), ends, most)
    starts, lens = [0, *ends], chunk.lens
    return [Span(starts[a], starts[b], chunk.rows(a, b, None if lens is None else lens[a:b]))
            for a, b in row_groups(counts, most)]


def pieces(chunk: Chunk, ends: list[int], most: int) -> list[Span]:
    """A packed chunk in pieces of `most` tokens, each the packed chunk of the rows it holds tokens of (a token's
    result is the same in any chunk, so the pieces change nothing); a last_only piece keeps the outputs of the rows
    whose last token it holds."""
    lens, cut = chunk.lens, []
    for a in range(0, ends[-1], most):
        b = min(a + most, ends[-1])
        first, last = bisect.bisect_right(ends, a), bisect.bisect_left(ends, b)  # the rows a..b-1 hold
        counts = [min(ends[r], b) - max(ends[r] - lens[r], a) for r in range(first, last + 1)]
        keep = len(counts) - (ends[last] > b) if chunk.last_only else None
        cut.append(Span(a, b, chunk.rows(first, last + 1, counts), keep))
    return cut


def row_groups(counts: list[int], most: int) -> list[tuple[int, int]]:
    """Rows a..b-1 in groups of as many whole rows as a call of `most` tokens takes, in order (a row of more tokens
    is a group alone)."""
    groups, a = [], 0
    while a < len(counts):
        b, n = a + 1, counts[a]
        while b < len(counts) and n + counts[b] <= most:
            n, b = n + counts[b], b + 1
        groups.append((a, b))
        a = b
    return groups


def packed(chunk: Chunk) -> Chunk:
    """A chunk of one row as the packed chunk of it."""
    return chunk if chunk.lens is not None else replace(chunk, lens=[chunk.T])


def key(chunk: Chunk) -> tuple:
    """What a call of the chunk rests on: its shape and its cache's pointers."""
    lens = chunk.lens
    return chunk.B, chunk.T, None if lens is None else tuple(lens), chunk.last_only, chunk.cache.layout


def refuses(chunk: Chunk, most: int) -> Refusal | None:
    """Why one call of at most `most` tokens cannot run the chunk (of no empty row: FusedStep.plan has turned those
    away before cutting); None where it can."""
    if sum(chunk.counts) > most:
        return Refusal.TOO_MANY_TOKENS
    return unlike(chunk)


def unlike(chunk: Chunk) -> Refusal | None:
    """What of the chunk's layout the kernels do not read (None: nothing)."""
    cache, k, lens = chunk.cache, chunk.cache.k, chunk.lens
    if chunk.tree is not None and lens:
        return Refusal.PACKED_TREE
    if k.dtype != torch.float32 or k.device.type != "cpu":
        return Refusal.CACHE_NOT_FLOAT32_CPU
    if k.stride()[2:] != (k.shape[3] * k.shape[4], k.shape[4], 1) or not cache.lengths.is_contiguous():
        return Refusal.CACHE_LAYOUT
    if lens is not None and len(lens) != len(cache.lengths):
        return Refusal.PACKED_ROWS_UNLIKE_CACHE
    return None
