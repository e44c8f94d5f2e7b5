"""The KV cache every model writes its keys and values into, and the shape of a token tree (TreeMask).

One preallocated tensor a layer for keys and one for values, a row per sequence of the SUT's pool; each row's
valid length is the only state, so rolling back a rejected draft is setting it lower (O(1), no copies), and a
tree's accepted path is compacted after its root by `keep`. A chunk's writes and its attention mask are set up
once per forward (`begin`) and used by every layer (`update`, `attend`).
"""
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mlperf.pages import on_huge_pages


@dataclass(frozen=True)
class TreeMask:
    """The shape of a token tree, nodes in breadth-first order from the root (node 0): each node's depth, and
    visible[i, j], True when node j is node i or one of its ancestors."""
    depths: torch.Tensor  # (n,) int64
    visible: torch.Tensor  # (n, n) bool

    @staticmethod
    def of(parents: list[int]) -> "TreeMask":
        """From each node's parent (-1 for the root; a parent comes before its children)."""
        n = len(parents)
        visible = torch.eye(n, dtype=torch.bool)
        depths = [0] * n
        for i, parent in enumerate(parents[1:], 1):
            visible[i] |= visible[parent]
            depths[i] = depths[parent] + 1
        return TreeMask(torch.tensor(depths), visible)

    def prefix(self, n: int) -> "TreeMask":
        """The tree of the first n nodes."""
        return TreeMask(self.depths[:n], self.visible[:n, :n])


class KVCache:
    """Keys and values for every layer, shape (n_layer, batch, heads, max_len, head_dim), plus each row's valid length,
    for a model of `config`'s geometry (a GPTConfig). On a CPU they lie on 2 MiB pages (mlperf/pages.py): a step
    reads them head by head from memory.

    `lengths` (a CPU int64 tensor, one entry per row) is the only state that says what is valid, and only the
    cache's own methods set it (`restart`, `roll_back`, `keep`, `advance`, a chunk's `end`; and the C kernels' steps,
    which suts/fast/fused.py calls on it). `rows(a, b)` is a view onto rows a..b-1 that shares storage, e.g. to
    prefill one row of a batch or to step the running rows of a pool.
    """

    def __init__(self, config, batch_size: int, max_len: int | None = None,
                 device="cpu", dtype=torch.float32):
        max_len = max_len or config.block_size
        shape = (config.n_layer, batch_size, config.n_head, max_len, config.head_dim)
        kv = on_huge_pages([(shape, dtype)] * 2) if torch.device(device).type == "cpu" else None
        self.k, self.v = kv or [torch.zeros(shape, device=device, dtype=dtype) for _ in range(2)]
        self.lengths = torch.zeros(batch_size, dtype=torch.long)
        self._host = memoryview(self.lengths.numpy())  # the same memory, read and cut as plain ints (held, roll_back)
        self.block_size = config.block_size
        self._write = None  # (start, T) for a uniform chunk, else (row index, position index) tensors
        self.mask = None  # attention mask for the chunk being written, None when every key is valid
        self._packed = None  # a packed chunk: (where each row's i-th token is in it, where its tokens are unpacked)
        self._grow = 0  # what end() adds to the lengths: T, or each row's own count

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def move(self, src: int, dst: int) -> None:
        """Copy row `src`'s valid keys/values and length into row `dst` (a freed row taking over a running one)."""
        n = self._host[src]
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst] = n

    @functools.cached_property
    def layout(self) -> tuple:
        """Where its keys, values and lengths lie and how the keys are laid out: what a fused call's pointers rest on
        (suts/fast/fused.py), read once per cache object, not at every step (after a forward each read costs us)."""
        return self.k.data_ptr(), self.k.stride(), tuple(self.k.shape), self.v.data_ptr(), self.lengths.data_ptr()

    def held(self) -> list[int]:
        """Each row's valid length, as plain ints. Through a memoryview of `lengths`: right after a forward has
        streamed its weights through every cache, a tensor op (`lengths.tolist()`) costs about three times this."""
        return self._host.tolist()

    def roll_back(self, lengths: list[int]) -> None:
        """Cut each row b to at most lengths[b] tokens (a speculative cycle's rejected drafts). Through the memoryview
        `held` reads, not tensors or arrays: right after a forward, a numpy view of `lengths` costs several times
        this (docs/measurements.md)."""
        now = self._host
        for b, keep in enumerate(lengths):
            if keep < now[b]:
                now[b] = keep

    def restart(self, lengths: "int | list[int]") -> None:
        """Each row holds exactly lengths[b] tokens from now on (an int: every row): a prompt's chunk read from its
        middle starts there, a timing's repeat begins again."""
        self.lengths[:] = lengths if isinstance(lengths, int) else torch.tensor(lengths)

    def advance(self, n: int) -> None:
        """Every row's length moved on by n: what a step run outside the modules wrote (a replayed CUDA graph)."""
        self.lengths += n

    def rows(self, start: int, end: int) -> "KVCache":
        if (start, end) == (0, self.batch_size):  # all of them: the cache itself (no views to make every step)
            return self
        view = KVCache.__new__(KVCache)
        view.k, view.v = self.k[:, start:end], self.v[:, start:end]
        view.lengths, view.block_size = self.lengths[start:end], self.block_size
        view._host = self._host[start:end]
        view._write, view.mask, view._packed, view._grow = None, None, None, 0
        return view

    def begin(self, T: int, tree: TreeMask | None = None, lens: list[int] | None = None) -> torch.Tensor:
        """Prepare to write T new tokens per row at each row's length; returns their positions, shape (batch, T).

        Without `tree` the chunk continues each row's sequence (causal). With it the chunk is the last T nodes of a
        token tree whose n nodes, from its root on, occupy one slot each from slot `lengths - (n - T)`: a node's
        position is the root's plus its depth, and it attends to everything before the root and to its ancestors.
        With `lens` the chunk is packed: T = sum(lens) tokens, row b's lens[b] of them in turn; positions (1, T)
        (one row's packed chunk is its plain chunk, and takes the plain path: no gathers)."""
        starts = self.held()  # plain ints: the per-token path stays free of small tensor ops
        if lens is not None and (len(lens) != len(starts) or min(lens) < 0 or sum(lens) < 1):
            raise ValueError(f"a packed chunk needs a token count >= 0 for each of {len(starts)} rows, got {lens}")
        kv_len = max(s + n for s, n in zip(starts, lens)) if lens is not None else max(starts) + T
        self.check(kv_len)
        self._packed, self._grow = None, T
        if lens is not None and len(lens) > 1:
            return self._begin_packed(starts, lens, kv_len)
        device = self.k.device
        slots = torch.arange(T)
        if tree is not None:
            n = tree.visible.shape[-1]
            base = self.lengths - (n - T)  # each row's root slot
            pos = base[:, None] + tree.depths[-T:]
            if min(starts) == max(starts):  # every row: the context before the root, then the tree
                mask = torch.cat([torch.ones(T, starts[0] - (n - T), dtype=torch.bool), tree.visible[-T:]], 1)
            else:
                rel = torch.arange(kv_len)[None, :] - base[:, None]  # (batch, kv_len): key slots from the root on
                inside = tree.visible[-T:][:, rel.clamp(0, n - 1)].permute(1, 0, 2) & (rel < n)[:, None]
                mask = (rel < 0)[:, None] | inside  # (batch, T, kv_len)
            self.mask = mask.expand(len(starts), T, kv_len)[:, None].to(device)
        else:
            pos = self.lengths[:, None] + slots
            if T == 1 and min(starts) == max(starts):  # one new token per row attends to every valid key
                self.mask = None
            else:
                self.mask = (torch.arange(kv_len)[None, None, :] <= pos[:, :, None])[:, None].to(device)
        if min(starts) == max(starts):
            self._write = (starts[0], T)
        else:
            rows = torch.arange(len(starts))[:, None].expand(-1, T)
            self._write = (rows.to(device), (self.lengths[:, None] + slots).to(device))
        return pos.to(device)

    @property
    def limit(self) -> int:
        """The most tokens a row holds: the model's context or the cache's length, whichever is shorter."""
        return min(self.block_size, self.max_len)

    def check(self, kv_len: int) -> None:
        """Raise unless a context of kv_len tokens fits in the model's context and in this cache (`limit`)."""
        for limit, what in ((self.block_size, "the model's context"), (self.max_len, "the KV cache's length")):
            if kv_len > limit:
                raise ValueError(f"context of {kv_len} tokens exceeds {what} of {limit}")

    def _begin_packed(self, starts: list[int], lens: list[int], kv_len: int) -> torch.Tensor:
        """A packed chunk (see begin): each token is written at its row's next slot; for attention the queries are
        unpacked into (batch, max(lens)) rows, padding included (it sees the row's keys and is dropped after)."""
        device, n, width = self.k.device, sum(lens), max(lens)
        counts, start = torch.tensor(lens), torch.tensor(starts)
        rows = torch.arange(len(lens)).repeat_interleave(counts)  # each token's row
        first = counts.cumsum(0) - counts  # each row's first token in the chunk
        pos = start[rows] + torch.arange(n) - first[rows]
        self._write = (rows[None].to(device), pos[None].to(device))
        slot = torch.arange(width)
        queries = start[:, None] + slot  # (batch, width): each unpacked query's position
        self.mask = (torch.arange(kv_len)[None, None, :] <= queries[:, :, None])[:, None].to(device)
        into = (first[:, None] + slot).clamp(max=n - 1)  # the chunk's token each unpacked query reads
        real = (torch.arange(len(lens))[:, None] * width + slot)[slot < counts[:, None]]  # unpacked -> chunk order
        self._packed, self._grow = (into.to(device), real.to(device)), counts
        return pos[None].to(device)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(1, heads, N, d) packed queries -> (batch, heads, max(lens), d), one row per sequence."""
        return x[0][:, self._packed[0]].transpose(0, 1) if self._packed is not None else x

    def pack(self, y: torch.Tensor) -> torch.Tensor:
        """(batch, heads, max(lens), d) -> (1, heads, N, d): the real tokens, back in the chunk's order."""
        if self._packed is None:
            return y
        B, H, W, d = y.shape
        return y.transpose(0, 1).reshape(H, B * W, d)[:, self._packed[1]][None]

    def end(self) -> None:
        """The chunk begun is written: every row's length advances past it."""
        self.lengths += self._grow

    def keep(self, roots: list[int], paths: list[list[int]]) -> None:
        """After a verify pass: row b keeps, of the drafts whose root sits at slot roots[b], the nodes paths[b] (an
        accepted path, root excluded, as many of them as the row has written; a chain's are 1..k, already in
        place), moved to follow the root in order; everything after them is rolled back. A row that has not written
        the root is left as it is."""
        rows, src, dst = [], [], []
        for b, (root, path) in enumerate(zip(roots, paths)):
            have = self._host[b]
            if have <= root:  # this row's cache holds none of the tree
                continue
            written = [node for node in path if root + node < have]
            for i, node in enumerate(written, 1):
                if node != i:  # a chain's path (1, 2, ...) stays where it is
                    rows.append(b), src.append(root + node), dst.append(root + i)
            self._host[b] = root + 1 + len(written)
        if rows:
            r, s, d = (torch.tensor(ix, device=self.k.device) for ix in (rows, src, dst))
            self.k[:, r, :, d] = self.k[:, r, :, s]
            self.v[:, r, :, d] = self.v[:, r, :, s]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write this chunk's (batch, heads, T, head_dim) keys/values; return all keys/values up to the chunk's end."""
        kv_len = self.mask.shape[-1] if self.mask is not None else self._write[0] + 1
        if isinstance(self._write[0], int):
            s, T = self._write
            self.k[layer, :, :, s:s + T] = k
            self.v[layer, :, :, s:s + T] = v
        else:
            rows, pos = self._write
            self.k[layer][rows, :, pos] = k.transpose(1, 2)
            self.v[layer][rows, :, pos] = v.transpose(1, 2)
        return self.k[layer, :, :, :kv_len], self.v[layer, :, :, :kv_len]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write the chunk's keys/values, then its queries' attention over everything each may see."""
        k, v = self.update(layer, k, v)
        return self.pack(F.scaled_dot_product_attention(self.unpack(q), k, v, attn_mask=self.mask))
