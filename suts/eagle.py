"""EAGLE-style speculative decoding: a one-block head drafts from the target's own features.

The target's verify pass (and its prefill) returns its final hidden states; the head reads the features at t
with the token chosen at t+1 and predicts the features at t+1, which the target's LM head turns into a draft
distribution; fed its own predictions it drafts gamma tokens ahead (EAGLE, Li et al. 2024; chain drafting, top-1
as in MLPerf's Interactive LLM rules). Acceptance is the one speculative rule, so greedy output is
token-identical to the baseline's and sampled output exact.

The head's cache holds one pair (target features at t, token at t+1) per committed position whose features the
target computed. Pairs built on the head's own predictions stay in it until the SUT keeps each row's accepted
path (`keep`, chain and tree alike), as a draft model's keys do; the head then keeps only the pairs of the
target's own features, even of drafts that were accepted, and the next cycle first catches up on the pairs the
verify pass made real (the accepted drafts and the target's token).
`eagle-tree` grows a token tree from the same head (EAGLE-2's trees, with a fixed shape).
"""
import itertools

import torch

from mlperf.checkpoint import CheckpointError, fingerprint, is_head, load_head, read_meta
from mlperf.chunk import Chunk
from mlperf.cost import Cost, widened
from mlperf.model import GPT, EagleHead
from suts.drafting import CacheProposer, Part, Proposer


def head_problem(head: str, target: str) -> str | None:
    """Why `head` cannot draft for `target` (none there, or made for another target's features), else None."""
    if not is_head(head):
        return f"it needs an EAGLE head and {head} is none (`python -m training.train head --target DIR` trains one)"
    made_for = read_meta(head).get("target_fingerprint")
    try:
        this = fingerprint(target)
    except (CheckpointError, OSError):
        return None  # the run reports a bad target itself
    if made_for and made_for != this:
        return (f"its EAGLE head {head} reads the features of target {made_for}, not of this one ({this}); "
                "--head DIR names one trained for it")
    return None


class Head(CacheProposer):
    """The EAGLE head drafts (the SUT's draft runner); it owns its cache of pairs and each row's target features at
    every position."""
    name = "head"
    part = Part("head", load_head, head_problem)  # --head's checkpoint, read against the target it drafts for
    reads_features = True

    @staticmethod
    def step_cost(draft, context, tokens, *, batch, act_bytes, weight_bytes) -> Cost:
        """The head's block (geometry `draft`), its 2d -> d input layer and the target's LM head."""
        d, wbytes = draft.n_embd, weight_bytes or act_bytes
        layer = Cost(matmul_flops=2 * batch * 2 * d * d, attention_flops=0, weight_bytes=2 * d * d * wbytes +
                     d * act_bytes, kv_read_bytes=0, kv_write_bytes=0, logits_bytes=0,
                     widened_bytes=widened(2 * d * d * wbytes, wbytes, act_bytes))
        return Proposer.step_cost(draft, context, tokens, batch=batch, act_bytes=act_bytes,
                                  weight_bytes=weight_bytes) + layer

    def drafting_model(self, target: GPT, draft) -> EagleHead:
        """The head, checked against the target whose features and LM head it uses."""
        if not isinstance(draft, EagleHead):
            raise ValueError(f"this SUT needs an EAGLE head (python -m training.train head), got "
                             f"{type(draft).__name__}")
        h, t = draft.config, target.config
        if (h.n_embd, h.vocab_size) != (t.n_embd, t.vocab_size) or h.block_size < t.block_size:
            raise ValueError(f"the EAGLE head (width {h.n_embd}, vocab {h.vocab_size}, context {h.block_size}) was "
                             f"not made for this target (width {t.n_embd}, vocab {t.vocab_size}, context "
                             f"{t.block_size})")
        return draft

    def reserve(self, rows: int) -> None:
        """The head's cache, and each row's target features at every position (as long as the head's cache)."""
        super().reserve(rows)
        self.real = [0] * rows  # each row's pairs of the target's own features when it last drafted, at most
        self.features = torch.zeros(rows, self.cache.max_len, self.target.config.n_embd, device=self.device,
                                    dtype=self.dtype)

    def move_row(self, src: int, dst: int) -> None:
        super().move_row(src, dst)
        self.features[dst] = self.features[src]

    def read_prompt(self, first, chunks, starts, features) -> None:
        """The chunks' features kept; then the head reads every pair they complete (pair t: the features at t with
        the token at t+1, so a chunk's tokens pair with the features one before each), all rows in one forward."""
        hcache = self.cache.rows(first, first + len(chunks))
        hcache.restart([max(0, start - 1) for start in starts])
        pairs, tokens, counts = [], [], []
        for j, (chunk, start, ends) in enumerate(zip(chunks, starts, itertools.accumulate(map(len, chunks)))):
            self.features[first + j, start:start + len(chunk)] = features[0, ends - len(chunk):ends]
            paired = chunk if start else chunk[1:]
            pairs.append(self.features[first + j, start + len(chunk) - 1 - len(paired):start + len(chunk) - 1])
            tokens += paired
            counts.append(len(paired))
        if tokens:
            self.draft(self.ids([tokens]), Chunk(hcache, lens=counts), torch.cat(pairs)[None], self.wte.weight)

    def verified(self, starts: list[int], rows: list[list[int]], features: torch.Tensor) -> None:
        """Every position's features into the rows' buffers, where the pairs of the tokens that get accepted will be
        read from."""
        for b, start in enumerate(starts):
            self.features[b, start:start + len(rows[b])] = features[b]

    @staticmethod
    def unread_pairs(hcache, lengths: list[int]) -> tuple[list[int], list[int]]:
        """Each row's pairs in the head's cache (pairs 0..have-1) and the new pairs it has yet to read: a row of
        `length` committed tokens has features at 0..length-2, so length - 1 - have of them."""
        have = hcache.held()
        return have, [length - 1 - h for length, h in zip(lengths, have)]

    def catch_up(self, seqs, lengths) -> torch.Tensor:
        """Catch up on each row's new pairs in one chunk (padded past the rows that have fewer); returns each row's
        predicted features at its last committed token (rows, 1, n_embd), whose LM head gives the first draft."""
        n = len(seqs)
        hcache = self.cache.rows(0, n)
        have, new = self.unread_pairs(hcache, lengths)
        T = max(new)
        features = torch.stack([self.features[b, h:h + T] for b, h in enumerate(have)])
        tokens = self.ids([s.tail(k) + [0] * (T - k) for s, k in zip(seqs, new)])
        predicted = self.draft(tokens, Chunk(hcache), features, self.wte.weight)
        hcache.restart([n - 1 for n in lengths])  # the padding is not kept
        return predicted[torch.arange(n), torch.tensor(new) - 1][:, None]  # each row's last real pair

    def draft_chain(self, seqs, wants, lengths):
        """Each row's pairs up to its last committed token are what the head reads now, then drafts as a CacheProposer
        does."""
        self.real[:len(seqs)] = [length - 1 for length in lengths]
        return super().draft_chain(seqs, wants, lengths)

    def greedy_inputs(self, seqs, lengths):
        """The pairs the head has not read, packed (on the CPU's fast path FusedHead.greedy catches up on them and
        drafts in one call), with their target features and the target's token embedding."""
        hcache = self.cache.rows(0, len(seqs))
        have, new = self.unread_pairs(hcache, lengths)
        ids = [t for s, k in zip(seqs, new) for t in s.tail(k)]
        feats = torch.cat([self.features[b, h:h + k] for b, (h, k) in enumerate(zip(have, new))])
        return ids, Chunk(hcache, lens=new, last_only=True, B=len(seqs), T=max(new)), (feats, self.wte.weight)

    def stepper(self, seqs, lengths):
        """Catch up, then each step feeds the head its own predicted features with the drafted tokens."""
        hcache = self.cache.rows(0, len(seqs))
        predicted = self.catch_up(seqs, lengths)  # the head's features at each row's newest token

        def step(chosen: list[int]) -> torch.Tensor:
            nonlocal predicted
            predicted = self.draft(self.ids(chosen).view(len(seqs), 1), Chunk(hcache), predicted, self.wte.weight)
            return self.lm_head(predicted)[:, -1]

        return self.lm_head(predicted)[:, -1], step

    def tree_feed(self, seqs, lengths, parents, mask):
        """A level's pairs are its parents' predicted features with its own tokens, one tree chunk in the head's
        cache (the root's pair is the row's last real one), there until `keep`."""
        hcache = self.cache.rows(0, len(seqs))
        predicted = {0: self.catch_up(seqs, lengths)[:, 0]}  # node -> (rows, n_embd)

        def feed(nodes, tokens):
            features = torch.stack([predicted[parents[i]] for i in nodes], 1)
            out = self.draft(self.ids(tokens), Chunk(hcache, mask.prefix(nodes[-1] + 1)), features, self.wte.weight)
            predicted.update({i: out[:, j] for j, i in enumerate(nodes)})
            return self.lm_head(out)

        return self.lm_head(predicted[0][:, None]), feed

    def keep(self, roots: list[int], paths: list[list[int]]) -> None:
        """The head's cache keeps the pairs the target's features made, the root's the last: none built while
        drafting, on the head's own features (the next cycle reads the accepted ones anew). The rows' feature
        buffers keep the accepted paths, as the caches do (the next pairs read them); a chain's are in place."""
        self.cache.rows(0, len(roots)).roll_back(roots)
        for b, (root, path) in enumerate(zip(roots, paths)):
            if path and path[-1] != len(path):  # a tree's path, not 1..k
                self.features[b, root + 1:root + 1 + len(path)] = self.features[b, [root + i for i in path]]
