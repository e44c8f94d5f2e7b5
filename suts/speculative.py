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
The registered names are (drafter, shape) pairs (suts/registry.py). `step` is the cycle of every shape; what
differs between a chain and a tree (how the drafts are laid out for the verify pass, accepted and kept) is in
Chains and Tree.
"""
import time
from dataclasses import dataclass

import torch

from mlperf.cache import TreeMask
from mlperf.chunk import Chunk
from mlperf.model import GPT, EagleHead
from mlperf.rules import positive_int
from suts.base import SUT
from suts.drafting import GAMMA, DraftModel, Proposer
from suts.eagle import Head
from suts.planner import Planner
from suts.engine.sampling import SamplingParams, probs
from suts.engine.scheduler import Sequence
from suts.tree import grown, parse_fanout, widths

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
        parse_fanout(tree)
    if adaptive and shape != "chain":
        raise ValueError("adaptive gamma changes a chain's length; a tree's fan-out is fixed" if shape == "tree" else
                         "an -auto SUT chooses every cycle's number of drafts itself; --adaptive is for the other "
                         "chains")


@dataclass
class Scored:
    """What one verify pass tells the acceptance rules about a batch's drafts: for a greedy batch each position's
    argmax (all its rules read), else the target's logits there (a sampled row's rule reads p from them)."""
    argmaxes: list[list[int]] | None = None
    logits: torch.Tensor | None = None

    @property
    def greedy(self) -> bool:
        return self.argmaxes is not None


@dataclass
class Chains:
    """A cycle's chains: `rows` (each row's last committed token, its drafts, padding), the drafts themselves and
    each sampled row's draft distributions; a path is the accepted drafts' nodes 1..k."""
    rows: list[list[int]]
    drafts: list[list[int]]
    q: list
    mask = None  # a chain is verified causally

    @classmethod
    def laid_out(cls, seqs: list[Sequence], drafts: list[list[int]], q: list) -> "Chains":
        """The rows of a verify pass: each row's last committed token and its drafts, padded to the longest."""
        T = 1 + max(map(len, drafts))
        return cls([s.tokens[-1:] + d + [0] * (T - 1 - len(d)) for s, d in zip(seqs, drafts)], drafts, q)

    def accept(self, b: int, s: Sequence, scored: Scored, rule) -> tuple[list[int], int]:
        """Row b's accepted path and the target's token after it: the greedy prefix, or `rule` (Speculative.accept)."""
        d = self.drafts[b]
        k, nxt = greedy_prefix(d, scored.argmaxes[b]) if scored.greedy else \
            rule(d, self.q[b], scored.logits[b, :len(d) + 1], s.params, s.generator)
        return list(range(1, k + 1)), nxt

    def count(self, b: int) -> int:
        return len(self.drafts[b])

    def tokens(self, b: int, path: list[int]) -> list[int]:
        return self.drafts[b][:len(path)]


@dataclass
class Tree:
    """A cycle's token tree: `rows` (every node's token, row by row; node 0 the row's last committed token), the
    tree mask, each row's children per node and draft distributions, and how deep each row may accept."""
    rows: list[list[int]]
    mask: TreeMask
    children: list
    q: list
    wants: list[int]

    def accept(self, b: int, s: Sequence, scored: Scored, rule) -> tuple[list[int], int]:
        """Row b's accepted path of nodes and the target's token after it. Sampled, the harness's own rule walks the
        whole tree (accept_tree); any other chain rule (a lab's) judges the tree's principal chain, each node's
        first child, which keeps it exact: the siblings go untested."""
        if scored.greedy:
            return greedy_path(self.children[b], self.rows[b], scored.argmaxes[b])
        if rule is accept:
            return accept_tree(self.children[b], self.rows[b], self.q[b], scored.logits[b], params=s.params,
                               generator=s.generator)
        nodes, node = [], 0
        while self.children[b][node]:
            node = self.children[b][node][0]
            nodes.append(node)
        drafts = [self.rows[b][n] for n in nodes]
        q = torch.stack([self.q[b][n] for n in nodes]) if nodes else None
        k, token = rule(drafts, q, scored.logits[b, [0, *nodes]], s.params, s.generator)
        return nodes[:k], token

    def count(self, b: int) -> int:
        return self.wants[b]

    def tokens(self, b: int, path: list[int]) -> list[int]:
        return [self.rows[b][i] for i in path]


class Speculative(SUT):
    """Speculative decoding with any drafter and shape: `Speculative(target, draft)` drafts with a draft model (an
    EAGLE head if `draft` is one); `drafter` gives another part (suts/drafting.py), `shape` "tree" or "auto"."""
    name = "spec"
    needs_draft = True  # a plug-in subclass is given the run's draft model
    # the acceptance rule of a batch with sampled rows (an all-greedy batch's is greedy_prefix, on the argmaxes alone);
    # lab 2 plugs a student's in here
    accept = staticmethod(accept)

    def __init__(self, target: GPT, draft: GPT | EagleHead | None = None, eos_id: int | None = None, *,
                 gamma: int = GAMMA, adaptive: bool = False, tree: str | None = None, drafter: Proposer | None = None,
                 shape: str = "chain"):
        check_options(shape, gamma, adaptive, tree)
        self.drafter = drafter or (Head() if isinstance(draft, EagleHead) else DraftModel())
        # a tree's children per depth; () for a chain
        self.fanout = parse_fanout(tree or self.drafter.default_tree) if shape == "tree" else ()
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
        """One cycle for every running row, top to bottom: draft (a chain per row, or the batch's tree), verify
        every row's drafts in one forward of the target, accept each row's own prefix or path, roll every cache
        back to what was accepted, record.

        Each row drafts at most min(its gamma or the tree's depth, what it may still emit - 1), so it never drafts
        past max_new_tokens or the context; a chain row with fewer drafts than others is padded in the verify pass,
        and a row with none takes a plain decode step in it."""
        n = len(seqs)
        lengths = [s.length for s in seqs]  # committed tokens: the target's cache holds positions 0..length-2
        width = min(self.target.config.block_size - length for length in lengths)  # context the fullest row has left
        caps = [min(s.budget - 1, width) for s in seqs]  # drafts a row may accept: the token after them is the target's
        greedy = all(s.params.greedy for s in seqs)  # the greedy rule (argmaxes alone) or exact rejection sampling
        t_draft = time.perf_counter()
        if self.fanout:
            drafted = self.drafted_tree(seqs, caps, lengths, width)
        else:  # the drafter called from here, directly: every Python call above its C call adds to each cycle
            drafts, q = self.drafter.draft_chain(seqs, self.chain_wants(seqs, caps, lengths), lengths)
            drafted = Chains.laid_out(seqs, drafts, q)
        t_verify = time.perf_counter()
        tcache = self.cache.rows(0, n)
        # row b's token i at position lengths[b] - 1 + i (a chain), or at its node's depth after it (a tree)
        scored = self.verify(drafted.rows, tcache, drafted.mask, greedy)
        accepted = [drafted.accept(b, s, scored, self.accept) for b, s in enumerate(seqs)]
        roots = [length - 1 for length in lengths]  # each row's last committed token, where its drafts hang
        paths = [path for path, _ in accepted]
        # what a cycle keeps, chain and tree alike: every cache positions 0..root, then the accepted path
        tcache.keep(roots, paths)
        self.drafter.keep(roots, paths)
        cycles = [(drafted.count(b), len(path)) for b, path in enumerate(paths)]
        for s, (g, k) in zip(seqs, cycles):
            s.stats.record_cycle(g, k)
            if self.adaptive and g == s.gamma:  # grow after a fully accepted cycle, shrink after a rejection
                s.gamma = min(s.gamma + 1, self.max_gamma) if k == g else max(1, s.gamma - 1)
        draft_s, verify_s = self._time(seqs, t_draft, t_verify)
        if self.planner:
            self.planner.observe(n, len(drafted.rows[0]) - 1, sum(lengths) // n, draft_s, verify_s, cycles=cycles)
        return [drafted.tokens(b, path) + [nxt] for b, (path, nxt) in enumerate(accepted)]

    def chain_wants(self, seqs: list[Sequence], caps: list[int], lengths: list[int]) -> list[int]:
        """Each row's number of drafts: its gamma, or the planner's for the batch (an -auto SUT; 0: a plain decode
        step, the drafter left to catch up later), each cut to the row's cap."""
        if self.planner:
            gamma = self.planner.choose(caps, sum(lengths) // len(seqs))
            return [min(gamma, c) for c in caps]
        return [min(s.gamma, c) for s, c in zip(seqs, caps)]

    def drafted_tree(self, seqs: list[Sequence], caps: list[int], lengths: list[int], width: int) -> "Tree":
        """The batch's token tree: its fan-out cut to the depth any row may accept and to the context left."""
        wants = [min(len(self.fanout), c) for c in caps]  # how deep each row may accept
        parents, mask = grown(self.fanout[:max(wants)], width)
        tokens, children, q = self.drafter.draft_tree(seqs, wants, lengths, parents, mask)
        return Tree(tokens, mask, children, q, wants)

    @staticmethod
    def _time(seqs, t_draft: float, t_verify: float) -> tuple[float, float]:
        """Each row's share of the cycle's drafting and verifying time; the cycle's seconds of each."""
        draft_s, verify_s = t_verify - t_draft, time.perf_counter() - t_verify
        for s in seqs:
            s.stats.draft_s += draft_s / len(seqs)
            s.stats.verify_s += verify_s / len(seqs)
        return draft_s, verify_s

    def verify(self, rows: list[list[int]], cache, tree: TreeMask | None = None,
               greedy: bool = False) -> Scored:
        """The target's logits at every position of each row's last token and drafts (`rows`, equal lengths), or at
        every node of the batch's tree (one forward); for a greedy batch only their argmaxes, all the greedy rules
        read (Runner.argmaxes: on a CPU one C call, no tensors). A drafter that reads the target's features gets
        every position's."""
        if self.drafter.reads_features:
            starts = cache.held()
            logits, features = self.target(self.tensor(rows), Chunk(cache, tree, features=True))
            self.drafter.verified(starts, rows, features)
            return Scored(argmaxes=logits.argmax(-1).tolist()) if greedy else Scored(logits=logits)
        if greedy:
            return Scored(argmaxes=self.target.argmaxes(rows, cache, tree))
        return Scored(logits=self.target(self.tensor(rows), Chunk(cache, tree)).logits)
