"""Speculative decoding: a draft proposes gamma tokens, the target scores all gamma+1 positions in one forward.

Greedy: accept the longest prefix of drafts that equal the target's argmax, then emit the target's own token
(a correction, or a bonus after full acceptance): the output is token-identical to the baseline's.
Sampling: modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft token d with
probability min(1, p(d)/q(d)), else draw from normalize(max(0, p - q)); the output is distributed exactly as
the target's. After each cycle the target's KV cache is rolled back to the committed length (an O(1) length reset),
and the drafter rolls back its own (a draft model's).
Rows of a batch run their cycles together and accept independently (ragged acceptance).
One SUT for every drafter and shape: the drafting part (suts/drafting.py: a draft model, an int8 one, an int8 copy
of the target; an EAGLE head, suts/eagle.py; prompt lookup or a user's Drafter, suts/ngram.py) proposes, and this
class verifies, accepts, rolls back and counts. Its shape: a "chain" of gamma drafts; a "tree" (suts/tree.py),
whose every node the target scores in one forward with a tree mask, `accept_tree` walks, and every cache keeps
the accepted path of (KVCache.keep); or "auto", a chain whose length a Planner chooses each cycle for the batch.
The registered names are (drafter, shape) pairs (suts/registry.py).
"""
import time

import torch

from mlperf.cache import TreeMask
from mlperf.chunk import Chunk
from mlperf.model import GPT, EagleHead
from mlperf.rules import positive_int
from suts.base import SUT
from suts.drafting import GAMMA, DraftModel, Proposer
from suts.eagle import Head
from suts.planner import Planner
from suts.sampling import SamplingParams, probs
from suts.scheduler import Sequence
from suts.tree import grown, parse_shape, widths

SHAPES = ("chain", "tree", "auto")  # what a speculative SUT drafts: a chain, a token tree, a chain of planned gamma


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution to resample from after a rejection: normalize(max(0, p - q)); p itself if p == q."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else p


def greedy_prefix(drafts: list[int], choice: list[int]) -> tuple[int, int]:
    """The greedy rule: how many drafts equal the target's argmaxes `choice` (len(drafts)+1, at the positions before
    each draft and after the last) in a row, and the target's token after them."""
    k = 0
    while k < len(drafts) and choice[k] == drafts[k]:
        k += 1
    return k, choice[k]


def accept(drafts: list[int], q: torch.Tensor | None, logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None) -> tuple[int, int]:
    """How many drafts the target accepts and the token it emits after them.

    `logits` (len(drafts)+1, vocab) are the target's at the positions before each draft and after the last;
    `q` (len(drafts), vocab) the draft's probabilities the drafts were drawn from (None when greedy).
    """
    if params.greedy:
        return greedy_prefix(drafts, logits.argmax(-1).tolist())
    p = probs(logits, params)
    u = torch.rand(len(drafts), generator=generator, device=p.device).tolist()
    for i, d in enumerate(drafts):
        if u[i] * float(q[i, d]) >= float(p[i, d]):  # reject: the draft over-proposed d
            return i, int(torch.multinomial(residual(p[i], q[i]), 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[-1], 1, generator=generator))


def accept_tree(children: list[list[int]], tokens: list[int], q: list, logits: torch.Tensor, *,
                params: SamplingParams, generator: torch.Generator | None) -> tuple[list[int], int]:
    """The accepted path through a token tree (node indices, root excluded) and the token the target emits after it.

    `children[i]`: the children of node i the row may accept, in the order they were drawn; `tokens[i]`: node i's
    token; `q[i]`: the draft distribution node i was drawn from (sampled rows); `logits` (nodes, vocab): the
    target's at every node. Greedy: follow the child equal to the target's argmax while there is one. Sampled:
    recursive rejection over siblings (SpecInfer; without replacement as in Jeon et al. 2024): each sibling is one
    speculative test against p, and a rejection replaces p by residual(p, q) before the next sibling is tested."""
    if params.greedy:
        return greedy_path(children, tokens, logits.argmax(-1).tolist())
    path, node, p_all = [], 0, probs(logits, params)
    while True:
        p = p_all[node]
        for child in children[node]:
            d = tokens[child]
            if float(torch.rand(1, generator=generator)) * float(q[child][d]) < float(p[d]):
                break
            p = residual(p, q[child])
        else:
            return path, int(torch.multinomial(p, 1, generator=generator))
        path.append(child)
        node = child


def greedy_path(children: list[list[int]], tokens: list[int], choice: list[int]) -> tuple[list[int], int]:
    """accept_tree's greedy rule from the target's argmax at every node (`choice`): follow the child whose token
    it is while there is one."""
    path, node = [], 0
    while (nxt := next((c for c in children[node] if tokens[c] == choice[node]), None)) is not None:
        path.append(nxt)
        node = nxt
    return path, choice[node]


def check_options(shape: str, gamma: int, adaptive: bool, tree: str | None, name: str = "this SUT") -> None:
    """The rules a speculative SUT's options follow, whether given to its constructor or to a run: one line each."""
    positive_int("gamma", gamma)
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if tree is not None:
        if shape != "tree":
            raise ValueError(f"{name} drafts no tree; a tree is for the -tree SUTs (spec-tree, ...)")
        parse_shape(tree)
    if adaptive and shape != "chain":
        raise ValueError("adaptive gamma changes a chain's length; a tree's shape is fixed" if shape == "tree" else
                         "an -auto SUT chooses every cycle's number of drafts itself; --adaptive is for the other "
                         "chains")


class Speculative(SUT):
    """Speculative decoding with any drafter and shape: `Speculative(target, draft)` drafts with a draft model (an
    EAGLE head if `draft` is one); `drafter` gives another part (suts/drafting.py), `shape` "tree" or "auto"."""
    name = "spec"
    needs_draft = True  # a plug-in subclass is given the run's draft model
    accept = staticmethod(accept)  # the acceptance rule of a batch with sampled rows (an all-greedy batch's is
    # greedy_prefix, on the argmaxes alone); lab 2 plugs a student's in here

    def __init__(self, target: GPT, draft: GPT | EagleHead | None = None, eos_id: int | None = None, *,
                 gamma: int = GAMMA, adaptive: bool = False, tree: str | None = None, drafter: Proposer | None = None,
                 shape: str = "chain"):
        check_options(shape, gamma, adaptive, tree)
        self.drafter = drafter or (Head() if isinstance(draft, EagleHead) else DraftModel())
        self.fanout = parse_shape(tree or self.drafter.default_tree) if shape == "tree" else ()  # a tree's children per
        # depth; () for a chain
        super().__init__(target, self.drafter.drafting_model(target, draft), eos_id)
        self.drafter.bind(self.target, self.draft)
        self.gamma, self.adaptive = (len(self.fanout) or gamma), adaptive
        self.max_gamma = 2 * gamma if adaptive else gamma
        self.planner = Planner(target, gamma) if shape == "auto" else None

    def reserve(self, rows: int) -> None:
        """The pool and the drafter's own state (a draft model's cache, ...); an -auto SUT also times the target's
        forwards once, before its first request (Planner)."""
        if self.cache is None or self.cache.batch_size < rows:
            super().reserve(rows)
            self.drafter.reserve(rows)
        if self.planner and self.planner.coef is None:
            self.planner.calibrate(self.target)

    def move_row(self, src: int, dst: int) -> None:
        super().move_row(src, dst)
        self.drafter.move_row(src, dst)

    def prefill(self, first: int, seqs: list[Sequence], chunks: list[int]) -> list[int | None]:
        """The prompts' chunks into every model's cache (a draft model's too); each sequence starts at the SUT's
        gamma."""
        for s in seqs:
            s.gamma = self.gamma
        return super().prefill(first, seqs, chunks)

    def prefill_rows(self, first: int, chunks: list[list[int]], starts: list[int]) -> torch.Tensor:
        """The target's logits at each chunk's last token, all rows in one packed forward; then the drafter reads the
        chunks (a draft model into its cache; the EAGLE head the target's features)."""
        logits, features = self.read_chunks(first, chunks, starts, features=self.drafter.reads_features)
        self.drafter.read_prompt(first, chunks, starts, features)
        return logits[:, -1]

    def step_tokens(self, seqs: list[Sequence]) -> int:
        """A verify pass's tokens: each row's last one and its drafts (chain), or every node of the tree."""
        return len(seqs) * (1 + sum(widths(self.fanout))) if self.fanout else sum(1 + s.gamma for s in seqs)

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        """One cycle for every running row: the drafter proposes for all rows, the target verifies every row's
        drafts in one forward, and each row accepts its own number and rolls back its own cache lengths.

        Each row drafts at most min(its gamma, what it may still emit - 1), so it never drafts past
        max_new_tokens or the context; rows with fewer drafts than others are padded in the verify pass, and a
        row with none takes a plain decode step in it. An -auto SUT's planner sets the cycle's gamma for all rows
        (0: a plain decode step, the drafter left to catch up later)."""
        if self.fanout:
            return self.tree_step(seqs)
        n = len(seqs)
        lengths = [s.length for s in seqs]  # committed tokens; the target's cache holds all but the last
        width = min(self.target.config.block_size - length for length in lengths)
        caps = [min(s.budget - 1, width) for s in seqs]
        if self.planner:
            gamma = self.planner.choose(caps, sum(lengths) // n)
            wants = [min(gamma, c) for c in caps]
        else:
            wants = [min(s.gamma, c) for s, c in zip(seqs, caps)]
        t_draft = time.perf_counter()
        drafts, q = self.drafter.draft_chain(seqs, wants, lengths)
        t_verify = time.perf_counter()
        T = 1 + max(map(len, drafts))
        tcache = self.cache.rows(0, n)
        greedy = all(s.params.greedy for s in seqs)
        scored = self.verify([s.tokens[-1:] + d + [0] * (T - 1 - len(d)) for s, d in zip(seqs, drafts)], tcache,
                             greedy=greedy)
        new, kept, cycles = [], [], []
        for b, (s, d) in enumerate(zip(seqs, drafts)):
            g = len(d)
            k, nxt = greedy_prefix(d, scored[b]) if greedy else \
                self.accept(d, q[b], scored[b, :g + 1], s.params, s.generator)
            kept.append(lengths[b] + k)  # roll back the rejected drafts
            cycles.append((g, k))
            s.stats.record_cycle(g, k)
            if self.adaptive and g == s.gamma:  # grow after a fully accepted cycle, shrink after a rejection
                s.gamma = min(s.gamma + 1, self.max_gamma) if k == g else max(1, s.gamma - 1)
            new.append(d[:k] + [nxt])
        tcache.roll_back(kept)
        self.drafter.roll_back(kept)  # a draft model's cache: no more than the target accepted
        draft_s, verify_s = self._time(seqs, t_draft, t_verify)
        if self.planner:
            self.planner.observe(n, T - 1, sum(lengths) // n, draft_s, verify_s, cycles=cycles)
        return new

    def tree_step(self, seqs: list[Sequence]) -> list[list[int]]:
        """One tree cycle for every running row: the drafter grows the batch's tree (the shape cut to the depth any
        row may still emit and to the context left), the target scores every node in one forward with the tree
        mask, each row accepts its own path (accept_tree), and every cache keeps that path and nothing after it."""
        n = len(seqs)
        lengths = [s.length for s in seqs]
        width = min(self.target.config.block_size - length for length in lengths)
        wants = [min(len(self.fanout), s.budget - 1, width) for s in seqs]  # how deep each row may accept
        parents, tree = grown(self.fanout[:max(wants)], width)
        t_draft = time.perf_counter()
        tokens, children, q = self.drafter.draft_tree(seqs, wants, lengths, parents, tree)
        t_verify = time.perf_counter()
        greedy = all(s.params.greedy for s in seqs)
        tcache = self.cache.rows(0, n)
        scored = self.verify(tokens, tcache, tree, greedy)
        new, paths = [], []
        for b, s in enumerate(seqs):
            path, nxt = greedy_path(children[b], tokens[b], scored[b]) if greedy else \
                accept_tree(children[b], tokens[b], q[b], scored[b], params=s.params, generator=s.generator)
            s.stats.record_cycle(wants[b], len(path))
            paths.append(path)
            new.append([tokens[b][i] for i in path] + [nxt])
        roots = [length - 1 for length in lengths]
        tcache.keep(roots, paths)  # every cache keeps each row's accepted path after its root
        self.drafter.keep(roots, paths)
        self._time(seqs, t_draft, t_verify)
        return new

    @staticmethod
    def _time(seqs, t_draft: float, t_verify: float) -> tuple[float, float]:
        """Each row's share of the cycle's drafting and verifying time; the cycle's seconds of each."""
        draft_s, verify_s = t_verify - t_draft, time.perf_counter() - t_verify
        for s in seqs:
            s.stats.draft_s += draft_s / len(seqs)
            s.stats.verify_s += verify_s / len(seqs)
        return draft_s, verify_s

    def verify(self, rows: list[list[int]], cache, tree: TreeMask | None = None,
               greedy: bool = False) -> torch.Tensor | list[list[int]]:
        """The target's logits at every position of each row's last token and drafts (`rows`, equal lengths), or at
        every node of the batch's tree (one forward); for a greedy batch only their argmaxes, all the greedy rules
        read (Runner.argmaxes: on a CPU one C call, no tensors). A drafter that reads the target's features gets
        every position's."""
        if self.drafter.reads_features:
            starts = cache.held()
            logits, features = self.target(self.tensor(rows), Chunk(cache, tree, features=True))
            self.drafter.verified(starts, rows, features)
            return logits.argmax(-1).tolist() if greedy else logits
        if greedy:
            return self.target.argmaxes(rows, cache, tree)
        return self.target(self.tensor(rows), Chunk(cache, tree)).logits
