"""Token trees: the fan-outs a drafter grows, how it picks a node's children, and the level-by-level growing
(SpecInfer, Medusa, EAGLE-2).

A fan-out gives the children per node at each depth: "4,2,1" is 4 candidates for the next token, 2 under each of
those and 1 under each of theirs, 4 + 8 + 8 = 20 nodes after the root (the row's last committed token). Nodes are
numbered breadth-first, so a node's parent always comes before it and a prefix of the numbering is a tree.
Every row of a batch grows the same fan-out, so node i sits at the same cache slot in every row; a node a row may
not use (deeper than it may emit, or past the tokens its draft distribution has) is dead for that row: it is
computed like padding and never accepted.
"""
import functools
import math

import torch

from mlperf.cache import TreeMask
from suts.engine.sampling import SamplingParams, probs


def parse_fanout(text: str) -> tuple[int, ...]:
    """"4,2,1" -> (4, 2, 1); a clear error for anything else."""
    try:
        fanout = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        fanout = ()
    if not fanout or min(fanout) < 1:
        raise ValueError(f"a tree is children per depth as positive integers, e.g. 4,2,1; got {text!r}")
    return fanout


def parents_of(fanout: tuple[int, ...], max_nodes: int | None = None) -> list[int]:
    """Each node's parent, breadth-first, for `fanout`; -1 for the root. At most `max_nodes` nodes after the root."""
    parents, level = [-1], [0]
    for k in fanout:
        level_start = len(parents)
        for node in level:
            parents += [node] * k
        level = list(range(level_start, len(parents)))
    return parents[:1 + max_nodes] if max_nodes is not None else parents


def widths(fanout) -> list[int]:
    """Nodes at each depth below the root: "4,2,1" -> [4, 8, 8]."""
    return [math.prod(fanout[:d + 1]) for d in range(len(fanout))]


def grown(fanout: tuple[int, ...], max_nodes: int) -> tuple[tuple[int, ...], TreeMask]:
    """The tree of `fanout` cut to at most `max_nodes` nodes after the root: each node's parent, and its mask
    (built once per fanout and cut)."""
    return _grown(fanout, min(max_nodes, sum(widths(fanout))))


@functools.lru_cache(maxsize=256)
def _grown(fanout: tuple[int, ...], max_nodes: int) -> tuple[tuple[int, ...], TreeMask]:
    parents = parents_of(fanout, max_nodes)
    return tuple(parents), TreeMask.of(parents)


def place(candidates: list[list[int]], parents: tuple[int, ...]) -> tuple[list[int], list[list[int]]]:
    """Lay candidate continuations (best first) on a tree of the batch's fanout: a node's children take the
    distinct next tokens of the candidates that run through it, best first, as many as it has children. Returns
    each node's token (0 where unused; the root's is the caller's) and each node's used children."""
    slots, depths = [[] for _ in parents], [0] * len(parents)
    for i, parent in enumerate(parents[1:], 1):
        slots[parent].append(i)
        depths[i] = depths[parent] + 1
    tokens, children, through = [0] * len(parents), [[] for _ in parents], {0: candidates}
    for node in range(len(parents)):  # breadth-first: a node is placed before its children
        taken = {}
        for candidate in through.get(node, ()):
            if len(candidate) <= depths[node]:
                continue
            token = candidate[depths[node]]
            if token not in taken:
                if len(taken) == len(slots[node]):
                    continue
                taken[token] = slot = slots[node][len(taken)]
                tokens[slot] = token
                children[node].append(slot)
                through[slot] = []
            through[taken[token]].append(candidate)
    return tokens, children


def branch(logits: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
           ) -> tuple[list[int], list[torch.Tensor | None]]:
    """Up to k distinct child tokens from a node's drafter logits (vocab,), and the distribution each was drawn
    from. Greedy: the top k. Sampled: k draws from q without replacement, in draw order (Gumbel top-k), the i-th
    drawn from q with the earlier draws removed and renormalised (what the recursive acceptance rule needs)."""
    if params.greedy:
        return logits.topk(k).indices.tolist(), [None] * k
    q = probs(logits, params)
    k = min(k, int((q > 0).sum()))
    tokens = (q / torch.empty_like(q).exponential_(generator=generator)).topk(k).indices.tolist()
    qs = [q]
    for token in tokens[:-1]:
        q = q.clone()
        q[token] = 0
        qs.append(q / q.sum())
        q = qs[-1]
    return tokens, qs


def grow(seqs, wants, parents: tuple[int, ...], root: torch.Tensor | None, feed):
    """Grow the batch's tree level by level from the drafter's logits at the root (rows, 1, vocab): every live
    node branches into its children (branch), and `feed(nodes, tokens)` returns the drafter's logits
    (rows, len(nodes), vocab) at a level's nodes, given each row's tokens for them (every level but the deepest
    is fed). A row's node is live when its parent is and it is no deeper than wants[b]. Returns each row's node
    tokens (the root is its last committed token), each node's live children, and the distribution each node was
    drawn from (sampled rows)."""
    N = len(parents)
    tokens = [s.tail(1) + [0] * (N - 1) for s in seqs]
    children = [[[] for _ in parents] for _ in seqs]
    q = [[None] * N for _ in seqs]
    depth, level, logits = 0, [0], root
    live = [{0} for _ in seqs]
    while below := [i for i in range(level[-1] + 1, N) if parents[i] in level]:
        for j, node in enumerate(level):
            kids = [i for i in below if parents[i] == node]
            for b, s in enumerate(seqs):
                if kids and node in live[b] and depth < wants[b]:
                    chosen, drawn_from = branch(logits[b, j], len(kids), s.params, s.generator)
                    for i, token, qi in zip(kids, chosen, drawn_from):
                        tokens[b][i], q[b][i] = token, qi
                        children[b][node].append(i)
                        live[b].add(i)
        if below[-1] == N - 1:  # the deepest level: its distributions are never needed
            break
        logits = feed(below, [[t[i] for i in below] for t in tokens])
        depth, level = depth + 1, below
    return tokens, children, q
