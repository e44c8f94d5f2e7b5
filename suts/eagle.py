"""EAGLE-style speculative decoding: a one-block head drafts from the target's own features.

The target's verify pass (and its prefill) returns its final hidden states; the head reads the features at t
with the token chosen at t+1 and predicts the features at t+1, which the target's LM head turns into a draft
distribution; fed its own predictions it drafts gamma tokens ahead (EAGLE, Li et al. 2024; chain drafting, top-1
as in MLPerf's Interactive LLM rules). Acceptance is the one speculative rule, so greedy output is
token-identical to the baseline's and sampled output exact.

The head's cache holds one pair (target features at t, token at t+1) per committed position whose features the
target computed; pairs built on the head's own predictions are rolled back after each cycle, and the next
cycle first catches up on the pairs the verify pass made real (the accepted drafts and the target's token).
`eagle-tree` grows a token tree from the same head (EAGLE-2's trees, with a fixed shape).
"""
import torch

from mlperf.cache import TreeMask
from mlperf.model import GPT, EagleHead
from suts.speculative import Speculative, draw
from suts.tree import grow


class Eagle(Speculative):
    name = "eagle"
    needs_draft = False
    needs_head = True  # the registry loads the run's `head` checkpoint and passes it in as the draft
    drafter = "head"  # the roofline costs a draft step as the head's block, its input layer and the LM head

    def draft_model(self, target: GPT, draft) -> EagleHead:
        """The head, checked against the target whose features and LM head it uses."""
        if not isinstance(draft, EagleHead):
            raise ValueError(f"SUT {self.name} needs an EAGLE head (python -m training.train head), "
                             f"got {type(draft).__name__}")
        h, t = draft.config, target.config
        if (h.n_embd, h.vocab_size) != (t.n_embd, t.vocab_size) or h.block_size < t.block_size:
            raise ValueError(f"the EAGLE head (width {h.n_embd}, vocab {h.vocab_size}, context {h.block_size}) was "
                             f"not made for this target (width {t.n_embd}, vocab {t.vocab_size}, context "
                             f"{t.block_size})")
        return draft

    def reserve(self, rows: int) -> None:
        """The caches, and each row's target features at every position (as long as the head's cache)."""
        if not self.caches or self.caches[0].batch_size < rows:
            super().reserve(rows)
            self.features = torch.zeros(rows, self.caches[1].max_len, self.target.config.n_embd,
                                        device=self.device, dtype=self.dtype)

    def move_row(self, src: int, dst: int) -> None:
        super().move_row(src, dst)
        self.features[dst] = self.features[src]

    def prefill_rows(self, first: int, chunks: list[list[int]], starts: list[int]) -> list[torch.Tensor]:
        """The chunks through the target, their features kept; then the head reads every pair they complete (pair
        t: the features at t with the token at t+1, so a chunk's tokens pair with the features one before each),
        every row in one packed forward of each."""
        n, lens = len(chunks), [len(c) for c in chunks]
        tcache, hcache = (cache.rows(first, first + n) for cache in self.caches)
        tcache.lengths[:] = torch.tensor(starts)
        hcache.lengths[:] = torch.tensor([max(0, start - 1) for start in starts])
        logits, features = self.target(self.tensor([[t for c in chunks for t in c]]), tcache, last_only=True,
                                       features=True, lens=lens)
        pairs, tokens, counts = [], [], []
        for j, (chunk, start, ends) in enumerate(zip(chunks, starts, torch.tensor(lens).cumsum(0).tolist())):
            self.features[first + j, start:start + len(chunk)] = features[0, ends - len(chunk):ends]
            paired = chunk if start else chunk[1:]
            pairs.append(self.features[first + j, start + len(chunk) - 1 - len(paired):start + len(chunk) - 1])
            tokens += paired
            counts.append(len(paired))
        if tokens:
            self.draft(torch.cat(pairs)[None], self.tensor(tokens), self.target, hcache, lens=counts)
        return [logits[:, -1]]

    def verify(self, rows: list[list[int]], cache, tree=None, greedy: bool = False) -> torch.Tensor | list[list[int]]:
        """The target's logits (a greedy batch: their argmaxes); every position's features go into the rows' feature
        buffers, where the pairs of the tokens that get accepted will be read from."""
        starts = cache.lengths.tolist()
        logits, features = self.target(self.tensor(rows), cache, features=True, tree=tree)
        for b, start in enumerate(starts):
            self.features[b, start:start + len(rows[b])] = features[b]
        return logits.argmax(-1).tolist() if greedy else logits

    def _catch_up_head(self, seqs, lengths) -> torch.Tensor:
        """Catch up on each row's new pairs in one chunk (padded past the rows that have fewer); returns each row's
        predicted features at its last committed token (rows, 1, n_embd), whose LM head gives the first draft."""
        n = len(seqs)
        hcache = self.caches[1].rows(0, n)
        have = hcache.lengths.tolist()  # pairs 0..have-1 are in the head's cache; 0..length-2 have features
        new = [length - 1 - h for length, h in zip(lengths, have)]
        T = max(new)
        features = torch.stack([self.features[b, h:h + T] for b, h in enumerate(have)])
        tokens = self.tensor([s.tail(k) + [0] * (T - k) for s, k in zip(seqs, new)])
        predicted = self.draft(features, tokens, self.target, hcache)
        hcache.lengths[:] = torch.tensor(lengths) - 1  # the padding is not kept
        return predicted[torch.arange(n), torch.tensor(new) - 1][:, None]  # each row's last real pair

    def _propose(self, seqs, wants, lengths) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Catch up, then draft max(wants) tokens from the head's own features; each row keeps its first wants[b]."""
        n = len(seqs)
        drafts, qs = [[] for _ in seqs], [[] for _ in seqs]
        if max(wants) > 0:
            hcache = self.caches[1].rows(0, n)
            predicted = self._catch_up_head(seqs, lengths)
            for i in range(max(wants)):
                if i:
                    predicted = self.draft(predicted, x, self.target, hcache)
                chosen = draw(self.target.lm_head(predicted)[:, -1], seqs, wants, i, drafts, qs)
                x = torch.tensor(chosen, device=self.device).view(n, 1)
            hcache.lengths[:] = torch.tensor(lengths) - 1  # pairs built on the head's own features go
        return [d[:g] for d, g in zip(drafts, wants)], [torch.stack(q) if q else None for q in qs]

    def _propose_tree(self, seqs, wants, lengths, parents: tuple[int, ...], tree: TreeMask):
        """The head's tree: a level's pairs are its parents' predicted features with its own tokens, one tree chunk
        in the head's cache (the root's pair is the row's last real one); afterwards only real pairs stay."""
        if len(parents) == 1:
            return grow(seqs, wants, parents, None, None)
        hcache = self.caches[1].rows(0, len(seqs))
        predicted = {0: self._catch_up_head(seqs, lengths)[:, 0]}  # node -> (rows, n_embd)

        def feed(nodes, tokens):
            out = self.draft(torch.stack([predicted[parents[i]] for i in nodes], 1), self.tensor(tokens), self.target,
                             hcache, tree=tree.prefix(nodes[-1] + 1))
            predicted.update({i: out[:, j] for j, i in enumerate(nodes)})
            return self.target.lm_head(out)

        out = grow(seqs, wants, parents, self.target.lm_head(predicted[0][:, None]), feed)
        hcache.lengths[:] = torch.tensor(lengths) - 1
        return out

    def keep(self, n: int, roots: list[int], paths: list[list[int]]) -> None:
        """The caches keep the accepted paths, and so do the rows' feature buffers (the next pairs read them)."""
        super().keep(n, roots, paths)
        for b, (root, path) in enumerate(zip(roots, paths)):
            if path:
                self.features[b, root + 1:root + 1 + len(path)] = self.features[b, [root + i for i in path]]


class EagleTree(Eagle):
    """EAGLE drafting a token tree (EAGLE-2's trees, with a fixed shape)."""
    name = "eagle-tree"
    default_tree = "2,1,1,1,1,1"


class EagleAuto(Eagle):
    """EAGLE whose number of drafts per cycle is chosen for the batch (spec-auto's planner)."""
    name = "eagle-auto"
    auto = True
