"""Prompt lookup (n-gram) decoding: speculative decoding whose drafts are copied from the sequence itself.

No draft model: a row proposes the tokens that followed the most recent earlier occurrence of its last n
tokens (n from `max_ngram` down to `min_ngram`) in its prompt and what it has emitted, as `transformers`'
prompt-lookup decoding, llama.cpp's lookup decoding and vLLM's n-gram drafting do; text that repeats its own
context (code edits, quoting) is proposed for free. A proposal is a draft distribution with all its mass on
one token, so the speculative acceptance rule stays exact: a sampled row accepts draft d with probability
p(d), else draws from p with d removed. A row with no match takes a plain decode step in the batch's verify pass.
"""
import torch

from mlperf.model import GPT
from suts.speculative import Speculative

MAX_NGRAM = 3  # the longest suffix looked up (vLLM 4, transformers 2): 2, 3 and 4 tie on the shipped prompts


def lookup(context: list[int], n_tokens: int, max_ngram: int = MAX_NGRAM, min_ngram: int = 1) -> list[int]:
    """Up to `n_tokens` tokens that followed the most recent earlier occurrence of the context's last n tokens,
    for the largest n in max_ngram..min_ngram that occurs; [] when none does.

    Plain Python on purpose: `list.index` scans in C, and a numpy call right after a forward pass costs ~200 us
    here, 20x this whole search."""
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


class PromptLookup(Speculative):
    name = "ngram"
    needs_draft = False
    drafter = "lookup"  # no draft model: the roofline costs its drafting as host time

    def __init__(self, target: GPT, draft: GPT | None = None, eos_id: int | None = None, gamma: int = 4,
                 adaptive: bool = False, max_ngram: int = MAX_NGRAM, min_ngram: int = 1):
        for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) is larger than max_ngram ({max_ngram})")
        super().__init__(target, None, eos_id, gamma, adaptive)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def draft_model(self, target: GPT, draft: GPT | None) -> None:
        return None

    def models(self) -> list[GPT]:
        return [self.target]

    def _propose(self, seqs, wants, lengths) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Each row's lookup (at most wants[b] tokens), and for sampled rows its one-hot draft distribution."""
        drafts = [lookup(s.prompt + s.tokens, g, self.max_ngram, self.min_ngram) for s, g in zip(seqs, wants)]
        vocab = self.target.config.vocab_size
        qs = [None if s.params.greedy or not d else
              torch.zeros(len(d), vocab, device=self.device).scatter_(1, self.tensor(d).T, 1.0)
              for s, d in zip(seqs, drafts)]
        return drafts, qs
