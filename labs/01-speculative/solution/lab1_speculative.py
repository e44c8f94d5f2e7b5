"""Lab 1: greedy speculative decoding, one prompt at a time.

A small draft model proposes gamma tokens; the target scores the last committed token and all gamma drafts in
one forward pass; the longest prefix of drafts that match the target's own greedy choices is kept, followed by
the target's token at the first mismatch (or a bonus token when every draft matched). The output must be exactly
the baseline's, token for token. Read the handout (labs/01-speculative/README.md) before you start.

What you are given: `self.target` and `self.draft` (mlperf/model.py: `model(ids, Chunk(cache))` feeds ids of
shape (1, T) after what `cache` already holds, appends their keys and values to it, and returns an Output whose
`.logits` are (1, T, vocab); `Chunk(cache, last_only=True)` asks for the last position's alone, (1, 1, vocab)),
their KV caches `self.cache` (the target's) and `self.draft_cache` (mlperf/cache.py's KVCache: `cache.lengths[0]`
is how many positions are valid; lowering it rolls the cache back), and `Sequence` (suts/engine/scheduler.py), which
holds the prompt, the tokens emitted so far, and stats.
"""
import time

import torch

from mlperf.chunk import Chunk
from suts.base import GREEDY, SUT
from suts.engine.sampling import SamplingParams
from suts.engine.scheduler import Result, Sequence


class StudentSpeculative(SUT):
    """Greedy speculative decoding as a SUT: `make grade LAB=1` runs it beside the baseline through LoadGen."""
    name = "lab1-spec"
    needs_draft = True  # the harness loads the draft checkpoint and passes it in

    def __init__(self, target, draft=None, eos_id=None, gamma: int = 4):
        if draft is None:
            raise ValueError("lab 1's SUT needs a draft model")
        super().__init__(target, draft, eos_id)
        self.gamma = gamma
        self.draft_cache = self.draft.new_cache(1)  # one row: this SUT decodes one prompt at a time

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams = GREEDY,
                 on_first_token=None) -> Result:
        """Emit exactly max_new_tokens tokens (fewer only at EOS), the same ones the baseline emits."""
        self.check(prompt, max_new_tokens)
        seq = Sequence(prompt, max_new_tokens, params, on_first_token)
        self.reserve(1)  # self.cache: the target's, one row
        tcache, dcache = self.cache.rows(0, 1), self.draft_cache
        start = time.perf_counter()
        target_logits = self.prefill_row(0, prompt)  # the target's cache now holds the prompt
        dcache.restart(0)
        self.draft(self.tensor(prompt), Chunk(dcache, last_only=True))  # and so does the draft's
        seq.stats.prefill_s = time.perf_counter() - start
        done = seq.emit([int(target_logits.argmax())], self.eos_id)
        while not done:
            start = time.perf_counter()
            gamma = min(self.gamma, seq.budget - 1)  # never draft past max_new_tokens
            drafts = self.propose(seq, dcache, gamma)
            drafted = time.perf_counter()
            new = self.verify(seq, drafts, tcache, dcache)
            done_at = time.perf_counter()
            seq.stats.draft_s += drafted - start  # the split the roofline costs drafts and verify passes by
            seq.stats.verify_s += done_at - drafted
            seq.stats.record_step(done_at - start, 1)
            done = seq.emit(new, self.eos_id)
        return seq.result

    def propose(self, seq: Sequence, dcache, gamma: int) -> list[int]:
        """The draft's `gamma` greedy tokens after the committed ones (seq.prompt + seq.tokens).

        The draft's cache holds a prefix of the committed tokens (it is behind by 1 or 2 after a cycle): feed it
        the committed tokens it has not seen yet, then each draft token in turn."""
        # BEGIN SOLUTION the draft's catch-up and gamma greedy draft tokens
        fresh = seq.tail(seq.length - int(dcache.lengths[0]))
        drafts = []
        for _ in range(gamma):
            logits = self.draft(self.tensor(fresh), Chunk(dcache, last_only=True)).logits[0, -1]
            fresh = [int(logits.argmax())]
            drafts.append(fresh[0])
        return drafts
        # END SOLUTION

    def verify(self, seq: Sequence, drafts: list[int], tcache, dcache) -> list[int]:
        """The tokens this cycle commits: the accepted drafts, then the target's own next token.

        One target forward over [last committed token] + drafts gives, at position i, the target's choice for the
        token drafts[i] stands in. Roll both caches back so that they hold only committed tokens (the target's
        holds all but the last one, which the next cycle feeds), and record the cycle in seq.stats."""
        # BEGIN SOLUTION one verify pass, the accepted prefix, and both caches rolled back
        logits = self.target(self.tensor(seq.tokens[-1:] + drafts), Chunk(tcache)).logits[0]
        choice = logits.argmax(-1).tolist()
        k = 0
        while k < len(drafts) and choice[k] == drafts[k]:
            k += 1
        tcache.roll_back([seq.length + k])  # committed after this cycle: seq.length + k + 1, all but the last
        dcache.roll_back([seq.length + k])  # at most as many: the draft may be behind
        seq.stats.record_cycle(len(drafts), k)
        return drafts[:k] + [choice[k]]
        # END SOLUTION
