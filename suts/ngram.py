"""Prompt lookup (n-gram) decoding: speculative decoding whose drafts are copied from the sequence itself.

No draft model: a row proposes the tokens that followed the most recent earlier occurrence of its last n
tokens (n from `max_ngram` down to `min_ngram`) in its prompt and what it has emitted, as `transformers`'
prompt-lookup decoding, llama.cpp's lookup decoding and vLLM's n-gram drafting do; text that repeats its own
context (code edits, quoting) is proposed for free. A proposal is a draft distribution with all its mass on
one token, so the speculative acceptance rule stays exact: a sampled row accepts draft d with probability
p(d), else draws from p with d removed. A row with no match takes a plain decode step in the batch's verify pass.
`ngram-tree` verifies several distinct matches at once, each a branch of one token tree.

The proposing is a part (`Drafter`): prompt lookup is one; a drafter of the user's own (`--drafter pkg.mod:Class`)
takes its place and gets chains, trees, the planner (-auto), batching and exact verification unchanged
(`HostDrafter`, the speculative SUT's proposer for any of them).
"""
import torch

from mlperf.cost import NOTHING, Cost
from mlperf.rules import positive_int
from suts.drafting import Proposer
from suts.plugins import plugin
from suts.tree import place

MAX_NGRAM = 3  # the longest suffix looked up (vLLM 4, transformers 2): 2, 3 and 4 tie on the shipped prompts


def lookup(context: list[int], n_tokens: int, max_ngram: int = MAX_NGRAM, min_ngram: int = 1) -> list[int]:
    """Up to `n_tokens` tokens that followed the most recent earlier occurrence of the context's last n tokens,
    for the largest n in max_ngram..min_ngram that occurs; [] when none does.

    Plain Python on purpose: `list.index` scans in C, and a numpy call right after a forward pass costs more than
    this whole search."""
    if n_tokens <= 0 or not context:
        return []
    rev = context[::-1]  # rev[0] is the last token; an earlier occurrence ending at position j starts rev[len-1-j:]
    best, best_at, at = 0, 0, 0
    while best < max_ngram:
        try:
            at = rev.index(rev[0], at + 1)
        except ValueError:
            break
        n = 1
        while n < max_ngram and at + n < len(rev) and rev[at + n] == rev[n]:
            n += 1
        if n > best:
            best, best_at = n, at
    if best < min_ngram:
        return []
    start = len(context) - best_at  # just after the occurrence
    return context[start:start + n_tokens]


def continuations(context: list[int], n_tokens: int, limit: int, max_ngram: int = MAX_NGRAM,
                  min_ngram: int = 1) -> list[list[int]]:
    """Up to `limit` distinct continuations of up to `n_tokens` tokens, best first: what followed each earlier
    occurrence of the context's last n tokens, longer n first and, for one n, the most recent first (the first
    is lookup()'s). Several of them make a token tree's branches."""
    if n_tokens <= 0 or not context:
        return []
    last, matched = context[-1], []
    for end in range(len(context) - 2, -1, -1):  # occurrences ending at `end`, most recent first
        if context[end] == last:
            n = 1
            while n < max_ngram and end - n >= 0 and context[end - n] == context[-1 - n]:
                n += 1
            if n >= min_ngram:
                matched.append((n, end))
    found = []
    for n, end in sorted(matched, key=lambda m: -m[0]):  # stable: the most recent first within each n
        candidate = context[end + 1:end + 1 + n_tokens]
        if candidate not in found:
            found.append(candidate)
            if len(found) == limit:
                break
    return found


class Drafter:
    """Proposes drafts from a row's own tokens (its prompt and what it has emitted so far), with no model of its own:
    the part a drafting idea (suffix lookup, a retrieval index, a table learned from the prompt) replaces."""

    def propose(self, context: list[int], n: int) -> list[int]:
        """Up to n token ids to follow `context`; [] when there is nothing worth verifying (a plain decode step)."""
        raise NotImplementedError

    def branches(self, context: list[int], n: int, limit: int) -> list[list[int]]:
        """Up to `limit` distinct continuations of up to n tokens, best first, for a token tree's branches (default:
        propose's one)."""
        first = self.propose(context, n)
        return [first] if first else []


class Lookup(Drafter):
    """Prompt lookup: what followed the latest longest earlier occurrence of the context's last n tokens."""

    def __init__(self, max_ngram: int = MAX_NGRAM, min_ngram: int = 1):
        positive_int("max_ngram", max_ngram)
        positive_int("min_ngram", min_ngram)
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) is larger than max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context: list[int], n: int) -> list[int]:
        return lookup(context, n, self.max_ngram, self.min_ngram)

    def branches(self, context: list[int], n: int, limit: int) -> list[list[int]]:
        return continuations(context, n, limit, self.max_ngram, self.min_ngram)


def load_drafter(spec: str) -> Drafter:
    """A drafter from `package.module:Class` (constructed without arguments), or a one-line ValueError."""
    cls = plugin(spec, "drafter")
    try:
        drafter = cls()
    except (ValueError, TypeError) as e:
        raise ValueError(f"cannot construct drafter {spec!r} without arguments: {type(e).__name__}: {e}") from None
    if not callable(getattr(drafter, "propose", None)):
        raise ValueError(f"drafter {spec!r} has no propose(context, n) method")
    return drafter


class HostDrafter(Proposer):
    """A Drafter as a speculative SUT's proposer: no model of its own, its proposals checked against the vocabulary
    and laid on chains or trees. A proposal is a draft distribution with all its mass on one token."""
    name = "lookup"
    host = True
    default_tree = "2,1,1,1"

    @staticmethod
    def step_cost(draft, context, tokens, *, batch, act_bytes, weight_bytes) -> Cost:
        """Nothing: a lookup in host memory, which the roofline counts as host time."""
        return NOTHING

    def __init__(self, drafter: Drafter | None = None):
        self.drafter = drafter or Lookup()

    def proposed(self, drafts: list[list[int]], n: int, vocab: int) -> list[list[int]]:
        """The drafter's proposals, at most n tokens each, checked: a token id outside the vocabulary would fail the
        verify pass far from its cause."""
        for d in drafts if isinstance(drafts, (list, tuple)) else [drafts]:
            if not isinstance(d, (list, tuple)) or not all(type(t) is int and 0 <= t < vocab for t in d):
                raise ValueError(f"drafter {type(self.drafter).__name__} proposed {d!r}: not token ids of the "
                                 f"vocabulary (0..{vocab - 1})")
        return [list(d)[:n] for d in drafts]

    def draft_chain(self, seqs, wants, lengths):
        """Each row's proposal (at most wants[b] tokens), and for sampled rows its one-hot draft distribution."""
        vocab = self.target.config.vocab_size
        drafts = [self.proposed([self.drafter.propose(s.prompt + s.tokens, g)], g, vocab)[0] if g else []
                  for s, g in zip(seqs, wants)]
        qs = [None if s.params.greedy or not d else
              torch.zeros(len(d), vocab, device=self.device).scatter_(1, self.ids([d]).T, 1.0)
              for s, d in zip(seqs, drafts)]
        return drafts, qs

    def draft_tree(self, seqs, wants, lengths, parents, mask):
        """Each row's distinct continuations laid on the batch's tree (suts.tree.place), one branch per distinct
        next token; a sampled row's node is a one-hot draft distribution, so the recursive rule over siblings stays
        exact."""
        leaves = sum(1 for i in range(len(parents)) if i not in parents)
        vocab = self.target.config.vocab_size
        tokens, children, q = [], [], []
        for s, want in zip(seqs, wants):
            context = s.prompt + s.tokens
            placed, used = place(self.proposed(self.drafter.branches(context, want, leaves), want, vocab)[:leaves],
                                 parents)
            placed[0] = context[-1]
            tokens.append(placed)
            children.append(used)
            q.append([None] * len(parents))
            for node in (node for kids in used for node in kids) if not s.params.greedy else ():
                q[-1][node] = torch.zeros(vocab, device=self.device)
                q[-1][node][placed[node]] = 1.0
        return tokens, children, q


def host_drafter(drafter: "str | Drafter | None" = None) -> HostDrafter:
    """The proposer of the ngram SUTs: the run's `--drafter` (a `package.module:Class` or a Drafter, such as a
    Lookup of other n-gram lengths), else prompt lookup."""
    if isinstance(drafter, str):
        drafter = load_drafter(drafter)
    return HostDrafter(drafter or Lookup())
