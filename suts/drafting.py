"""Drafting: the part of a speculative SUT that proposes tokens (suts/speculative.py verifies them).

A proposer proposes each row's chain of drafts (`draft_chain`) or grows the batch's token tree (`draft_tree`), with
the draft distributions a sampled row's exact acceptance needs; the SUT verifies, accepts, rolls the target's cache
back, keeps the accepted path and the statistics, whatever the proposer. Three families (`name`): a draft model
(DraftModel, here: a small GPT, fp32 or int8, or an int8 copy of the target), an EAGLE head (suts/eagle.py) and
proposers that read only a row's own tokens (suts/ngram.py: prompt lookup, or a user's Drafter). A family is one
Proposer class: what a draft step costs (`step_cost`, which the roofline asks by the family's name) and the
checkpoint it loads beside the target (`part`), so that a new one is a class and a `register` line
(suts/registry.py).

A proposer owns its state (a draft model's KV cache, the EAGLE head's features), one row per row of the SUT's
pool: it makes, moves, fills and rolls it back when the SUT tells it what happened to the rows (the methods after
`draft_tree`, which do nothing for a proposer with no state). The SUT hands it rows' tokens and lengths, never
itself.
"""
from dataclasses import dataclass
from typing import Callable

import torch

from mlperf.checkpoint import load_model
from mlperf.chunk import Chunk
from mlperf.cost import Cost, forward_cost
from mlperf.model import GPT, GPTConfig
from suts.fast.quantize import quantize_int8
from suts.fast.runner import Runner
from suts.engine.sampling import probs
from suts.tree import grow

# drafts a speculative cycle unless a run says otherwise: the best over fp16 weights on a CPU, whose verify pass is
# bound by its arithmetic (docs/measurements.md: "Choosing gamma")
GAMMA = 5
# the tree a model drafts when the run gives none: measured best of the trees tried on the shipped pair
# (docs/measurements.md: Token trees)
TREE = "2,1,1,1,1,1"


def draw(logits: torch.Tensor, seqs, wants: list[int], i: int, *, drafts: list[list[int]], qs: list[list]) -> list[int]:
    """Draft step i's token for every row from the drafter's logits (rows, vocab), appended to `drafts`: a
    sampled row draws from its own generator and keeps the probabilities in `qs`; a greedy row, or one past
    its own want, takes the argmax (so a row's random draws do not depend on its batch)."""
    if all(s.params.greedy for s in seqs):
        tokens = logits.argmax(-1).tolist()
    else:
        tokens = []
        for b, s in enumerate(seqs):
            if s.params.greedy or i >= wants[b]:
                tokens.append(int(logits[b].argmax()))
            else:
                qs[b].append(probs(logits[b], s.params))
                tokens.append(int(torch.multinomial(qs[b][-1], 1, generator=s.generator)))
    for b, tok in enumerate(tokens):
        drafts[b].append(tok)
    return tokens


def chain(logits: torch.Tensor, step, seqs, wants: list[int]) -> tuple[list[list[int]], list]:
    """The drafting loop of every drafter that steps a model: from its logits (rows, vocab) after each row's
    committed tokens, max(wants) draws (`draw`), each fed back through `step(tokens)` for the next logits but the
    last; each row keeps its first wants[b] drafts, and a sampled row its draft probabilities, (drafts, vocab)."""
    drafts, qs = [[] for _ in seqs], [[] for _ in seqs]
    for i in range(max(wants)):
        tokens = draw(logits, seqs, wants, i, drafts=drafts, qs=qs)
        if i + 1 < max(wants):
            logits = step(tokens)
    return [d[:g] for d, g in zip(drafts, wants)], [torch.stack(q) if q else None for q in qs]


@dataclass(frozen=True)
class Part:
    """A checkpoint a drafter family loads beside the target: its kind (the run's fingerprints name it; "draft" and
    "head" come from --draft and --head, any other from --parts KIND=DIR), how it loads, and why a folder cannot
    serve a target (None: it can)."""
    kind: str
    load: Callable  # (path, target GPT, device, dtype) -> the model the proposer drafts with
    check: Callable = lambda path, target: None  # (path, target's path) -> None, or why not


class Proposer:
    """What a speculative SUT asks of its drafting part, and tells it. Every subclass is a drafter family and names
    it (`name`); suts/families.py registers the package's and `register_family` anyone else's."""
    name: str  # the family, as the run records it and the roofline asks for a draft step's cost
    part: Part | None = None  # the checkpoint the registry loads for it, or None
    host = False  # True: it drafts on the host from tokens alone (no draft model, no geometry to record)
    draft_forward = False  # True: a draft step is one forward of a GPT of the draft's geometry (its launches counted)
    reads_features = False  # True: the SUT hands it the target's final hidden states of every prefill and verify pass
    default_tree = TREE  # the tree it grows when the run gives none

    def __init_subclass__(cls, family: bool = True, **kwargs):
        """A subclass is a family, named; a scaffold the families share says `family=False`."""
        super().__init_subclass__(**kwargs)
        if family and not isinstance(cls.__dict__.get("name"), str):
            raise TypeError(f"{cls.__name__} names no drafter family: give it a `name` of its own (what its runs "
                            "record and the roofline costs a draft step by)")

    @staticmethod
    def step_cost(draft: GPTConfig | None, context: int, tokens: float, *, batch: int, act_bytes: int,
                  weight_bytes: float | None) -> Cost:
        """One draft step of `batch` rows, `tokens` each, at `context`: a forward of the draft model (geometry
        `draft`, linear weights of `weight_bytes` each where not act_bytes)."""
        return forward_cost(draft, context, tokens, batch=batch, act_bytes=act_bytes,
                            weight_bytes_per_param=weight_bytes)

    def drafting_model(self, target: GPT, draft):
        """The model that drafts beside the target, made from the run's draft checkpoint (checked; an int8 copy
        where the SUT says so) or from the target itself; None for none."""
        return None

    def bind(self, target: Runner, draft: Runner | None) -> None:
        """The SUT's runners of the target and of drafting_model(): the proposer drafts through them (on their fast
        path), and reads the target's token embedding and LM head (shared by an EAGLE head) from here alone."""
        self.target, self.draft = target, draft
        self.wte, self.lm_head = target.embedding_and_head()
        self.device, self.dtype = self.wte.weight.device, self.wte.weight.dtype

    def ids(self, tokens: list) -> torch.Tensor:
        """Token ids (a list, or a list of rows) as a tensor on the models' device."""
        return torch.tensor(tokens, device=self.device)

    def draft_chain(self, seqs, wants: list[int], lengths: list[int]) -> tuple[list[list[int]], list]:
        """Each row's wants[b] drafts after its `lengths[b]` committed tokens, and each sampled row's draft
        probabilities for them, (drafts, vocab) (None when greedy)."""
        raise NotImplementedError

    def draft_tree(self, seqs, wants: list[int], lengths: list[int], parents: tuple[int, ...], mask):
        """The batch's token tree (suts.tree.grow's tokens, children and draft distributions per row)."""
        raise NotImplementedError

    # Its state, told what happens to the SUT's rows (rows 0..n-1 are the running ones).
    def reserve(self, rows: int) -> None:
        """State for `rows` rows, made anew: the SUT's pool has grown."""

    def move_row(self, src: int, dst: int) -> None:
        """Row src now lives in row dst."""

    def read_prompt(self, first: int, chunks: list[list[int]], starts: list[int], features) -> None:
        """Rows first.. have read these prompt chunks after their first starts[j] tokens (the target's `features`
        at every chunk token, when it reads them)."""

    def verified(self, starts: list[int], rows: list[list[int]], features: torch.Tensor) -> None:
        """The target has verified these rows' tokens after their first starts[b] (its `features` at each)."""

    def keep(self, roots: list[int], paths: list[list[int]]) -> None:
        """Row b's drafts were cut to its accepted path of nodes after position roots[b] (a chain's 1..k, a tree's
        any; KVCache.keep): its state keeps that and nothing after it."""


class CacheProposer(Proposer, family=False):
    """A proposer that steps a model on a KV cache of its own (the draft model, the EAGLE head): the cycle's scaffold
    is here, its parts the family's. A greedy batch drafts in one call where its runner's fast step has one
    (`greedy_inputs`); otherwise the model catches up on the rows' committed tokens and steps once a draft
    (`stepper`), or grows the batch's tree a level at a time (`tree_feed`)."""

    def reserve(self, rows: int) -> None:
        self.cache = self.draft.new_cache(rows)

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)

    def greedy_inputs(self, seqs, lengths: list[int]) -> tuple[list[int], Chunk, tuple]:
        """What a greedy batch's drafts in one call read (Runner.greedy_in_one_call): the packed token ids the model
        has yet to see, their chunk, and what else the model reads beside them."""
        raise NotImplementedError

    def stepper(self, seqs, lengths: list[int]) -> tuple[torch.Tensor, Callable]:
        """The logits (rows, vocab) after each row's committed tokens, and the step that feeds each row a draft and
        returns the next logits."""
        raise NotImplementedError

    def tree_feed(self, seqs, lengths: list[int], parents: tuple[int, ...], mask) -> tuple[torch.Tensor, Callable]:
        """The root's logits and how a level of nodes goes through the model: suts.tree.grow's `root` and `feed`."""
        raise NotImplementedError

    def draft_chain(self, seqs, wants, lengths):
        """max(wants) drafts for the batch, a row's past its own want dropped: in one call for a greedy batch where
        the runner's fast step has one, else step by step (`chain`)."""
        n = len(seqs)
        if max(wants) == 0:
            return [[] for _ in seqs], [None] * n
        if all(s.params.greedy for s in seqs):
            ids, chunk, inputs = self.greedy_inputs(seqs, lengths)
            if (drafts := self.draft.greedy_in_one_call(ids, chunk, max(wants), *inputs)) is not None:
                return [d[:g] for d, g in zip(drafts, wants)], [None] * n
        return chain(*self.stepper(seqs, lengths), seqs, wants)

    def draft_tree(self, seqs, wants, lengths, parents, mask):
        """A root alone is the drafter's first draws; a deeper tree grows through the model a level at a time."""
        if len(parents) == 1:
            return grow(seqs, wants, parents, None, None)
        return grow(seqs, wants, parents, *self.tree_feed(seqs, lengths, parents, mask))


DRAFT = Part("draft", lambda path, target, device, dtype: load_model(path, device, dtype))  # --draft's checkpoint


class DraftModel(CacheProposer):
    """A small GPT drafts: its own KV cache, caught up on the committed tokens it has not seen at the start of each
    cycle, then gamma greedy or sampled steps (a greedy batch's in one call, Runner.greedy_in_one_call). `int8`: its
    linear weights in int8; `self_int8`: an int8 copy of the target itself (no draft checkpoint)."""
    name = "model"
    part = DRAFT
    draft_forward = True

    def __init__(self, int8: bool = False, self_int8: bool = False):
        self.int8, self.self_int8 = int8 or self_int8, self_int8
        if self_int8:
            self.part = None

    def drafting_model(self, target: GPT, draft: GPT | None) -> GPT:
        if self.self_int8:
            return quantize_int8(target)
        if draft is None:
            raise ValueError("this SUT needs a draft model")
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocab ({draft.config.vocab_size}) does not match target vocab "
                             f"({target.config.vocab_size})")
        if draft.config.block_size < target.config.block_size:
            raise ValueError(f"draft context ({draft.config.block_size}) is shorter than the target's "
                             f"({target.config.block_size})")
        return quantize_int8(draft) if self.int8 else draft

    def read_prompt(self, first, chunks, starts, features) -> None:
        view = self.cache.rows(first, first + len(chunks))
        view.restart(starts)
        chunk = Chunk(view, lens=[len(c) for c in chunks], last_only=True)
        self.draft(self.ids([[t for c in chunks for t in c]]), chunk)

    def keep(self, roots: list[int], paths: list[list[int]]) -> None:
        self.cache.rows(0, len(roots)).keep(roots, paths)

    @staticmethod
    def unseen(seqs, lengths, dcache) -> tuple[list[int], list[int]]:
        """The committed tokens the draft model's cache (`dcache`, the batch's rows) has not seen (1 after a
        rejection, 2 after a full acceptance, more after a tree or an -auto SUT's plain decode steps), each row its
        own number: one packed chunk's token ids and the numbers. Rows 1 and 2 behind all read 2, a row 1 behind its
        last seen token again (rolled back, its keys and values computed anew): a chunk of equal rows, which a GPU
        replays from one graph (suts/fast/graphs.py) where rows of unequal lengths would run kernel by kernel."""
        counts = [length - d for length, d in zip(lengths, dcache.held())]
        if sorted(set(counts)) == [1, 2]:
            dcache.roll_back([length - 2 for length in lengths])
            counts = [2] * len(counts)
        return [t for s, k in zip(seqs, counts) for t in s.tail(k)], counts

    def catch_up(self, seqs, lengths) -> torch.Tensor:
        """The draft model reads what it is behind; returns its logits at each row's last token, (rows, 1, vocab)."""
        dcache = self.cache.rows(0, len(seqs))
        ids, counts = self.unseen(seqs, lengths, dcache)
        return self.draft(self.ids([ids]), Chunk(dcache, lens=counts, last_only=True)).logits

    def greedy_inputs(self, seqs, lengths):
        """The tokens the draft model has not seen, packed: it catches up on them and drafts in the same call."""
        dcache = self.cache.rows(0, len(seqs))
        ids, counts = self.unseen(seqs, lengths, dcache)
        return ids, Chunk(dcache, lens=counts, last_only=True, B=len(seqs), T=max(counts)), ()

    def stepper(self, seqs, lengths):
        step = Chunk(self.cache.rows(0, len(seqs)), last_only=True)
        return self.catch_up(seqs, lengths)[:, -1], lambda tokens: self.draft(
            self.ids(tokens).view(len(seqs), 1), step).logits[:, -1]

    def tree_feed(self, seqs, lengths, parents, mask):
        """Its catch-up chunk gives the root's distribution, and each level but the deepest goes through it as one
        tree chunk."""
        dcache = self.cache.rows(0, len(seqs))

        def feed(nodes, tokens):
            return self.draft(self.ids(tokens), Chunk(dcache, mask.prefix(nodes[-1] + 1))).logits

        return self.catch_up(seqs, lengths), feed
