"""CUDA fast path: a model's short chunks replayed from CUDA graphs, one launch a step instead of one a kernel.

On a GPU a small model's decode step is host-bound: its hundred-odd kernels each cost microseconds to launch,
more than their bytes take to stream. GraphStep, a GPT's step on its runner (suts/fast/runner.py; the CPU's FusedStep
is the other), captures the modules' forward of a (rows, T) chunk once per bucket (rows, T, keys read, outputs)
and replays it: positions, the attention mask and the cache writes are computed on the GPU from the rows'
lengths, which are copied in beside the token ids, so a step reads nothing back and creates no tensors on the
host. Attention reads the cache up to a power of two past the longest row (every key after a row's own end
masked), and a batch is padded to a power of two of rows with the pool's next rows (`pool_rows`), so a bucket
serves many steps; a step's few queries (half precision) attend in a split-key Triton kernel
(suts/fast/triton_kernels.py), where PyTorch's gives each head one program. A greedy draft's catch-up and its steps
are one graph (`greedy`), and one row's prefill is padded to a multiple of MAX_TOKENS tokens. Chunks it
does not take (a token tree, a packed chunk of rows of different lengths, a prefill of several rows) run through
the modules; `fast=False` (`--no-fast`) turns it off so the two can be compared. `Replayed`, an eager stand-in
for a captured graph, runs the same bookkeeping (buckets, input buffers, padding, pooled rows) on any device, so
that the tests check it on a CPU.
"""
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mlperf.cache import KVCache
from mlperf.chunk import Chunk, Output
from mlperf.model import GPT
from suts.fast.step import Plan, Refusal

MAX_TOKENS = 64  # a chunk of more tokens a row (one row's prefill) is padded to a multiple of this
MIN_KEYS = 64  # the smallest bucket of keys attention reads


class StaticCache:
    """The KV cache as a captured step sees it (the interface the modules call): rows' lengths on the GPU, and
    from them the chunk's positions, mask and write slots, all computed inside the graph."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, T: int, keys: int):
        self.k, self.v, self.keys = k, v, keys
        self.pos = lengths[:, None] + torch.arange(T, device=k.device)  # (rows, T)
        self.rows = torch.arange(len(lengths), device=k.device)[:, None].expand(-1, T)

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        """The additive mask PyTorch's attention reads, built (and captured) only where a layer takes that path."""
        visible = (torch.arange(self.keys, device=self.k.device) <= self.pos[:, :, None])[:, None]  # (rows, 1, T, keys)
        return torch.zeros(visible.shape, dtype=self.k.dtype, device=self.k.device).masked_fill_(~visible, -torch.inf)

    def begin(self, T: int, tree=None, lens=None) -> torch.Tensor:
        return self.pos

    def end(self) -> None:
        pass

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write the chunk's keys/values at the rows' positions; attend over the keys bucket, a step's few queries
        in the split-key Triton kernel (suts/fast/triton_kernels.py), a longer chunk in PyTorch's."""
        self.k[layer][self.rows, :, self.pos] = k.transpose(1, 2)
        self.v[layer][self.rows, :, self.pos] = v.transpose(1, 2)
        k, v = self.k[layer, :, :, :self.keys], self.v[layer, :, :, :self.keys]
        if q.is_cuda and (kernels := triton_kernels()) is not None and kernels.attends(q):
            return kernels.attend(q, k, v, self.pos, self.keys)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


class Graph:
    """One captured forward: its input buffer (`tokens` token ids, then the rows' lengths) and its outputs."""
    device = "cuda"  # where it captures: a cache elsewhere runs through the modules

    @staticmethod
    def new_pool():
        """The memory pool a model's graphs share."""
        return torch.cuda.graph_pool_handle()

    def __init__(self, fn, inputs: torch.Tensor, tokens: int, pool):
        self.inputs, self.tokens = inputs, tokens
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture, as CUDA graphs need (cuBLAS workspaces, ...)
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn()

    def __call__(self, idx: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The outputs, static: the next replay overwrites them (clone what outlives it)."""
        self.inputs[:idx.numel()].copy_(idx.reshape(-1), non_blocking=True)  # a padded chunk's last ids: any
        self.inputs[self.tokens:].copy_(lengths, non_blocking=True)
        self.replay()
        return self.outputs

    def replay(self) -> None:
        self.graph.replay()


class Replayed(Graph):
    """A captured graph's eager stand-in, on any device: it captures by running the forward once into its static
    outputs and replays by running it again, from the same input buffer, into the same outputs."""
    device = None  # any

    @staticmethod
    def new_pool():
        return None

    def __init__(self, fn, inputs: torch.Tensor, tokens: int, pool):
        self.inputs, self.tokens, self.fn = inputs, tokens, fn
        self.outputs = fn()

    def replay(self) -> None:
        for static, fresh in zip(self.outputs, self.fn()):
            static.copy_(fresh)


class GraphStep:
    """A GPT's chunks of up to MAX_TOKENS tokens a row, each replayed from the graph of its bucket."""
    kind = "CUDA graphs"
    half = False  # its linears are the model's own
    threads = None  # the GPU's, not picked

    def __init__(self, model: GPT, capture: type[Graph] = Graph):
        self.model, self.graphs, self.storage = model, {}, None
        self.capture = capture  # Graph, or its eager stand-in (Replayed)
        self.pool = capture.new_pool()  # one memory pool for all of a model's graphs

    def plan(self, op: str, ids, chunk: Chunk) -> Plan | Refusal:
        """The chunk itself where a graph replays `op` on it (a greedy chain: after a packed chunk's last tokens; a
        verify pass's argmaxes: of its replayed forward's logits); else why not."""
        cache = chunk.cache
        if cache is None:
            return Refusal.NO_CACHE
        if chunk.tree is not None:
            return Refusal.TREE
        if chunk.lens is not None and not equal_rows(chunk.lens, cache):
            return Refusal.UNEQUAL_PACKED_ROWS
        if op == "greedy" and (not chunk.last_only or chunk.lens is None):
            return Refusal.CHAIN_NOT_AFTER_LAST
        if op == "forward" and (chunk.lens is None and chunk.B != cache.batch_size or ids.dtype != torch.long):
            return Refusal.ROWS_OR_IDS_UNLIKE_CACHE
        if op == "argmaxes" and chunk.B != cache.batch_size:
            return Refusal.ROWS_UNLIKE_CACHE
        if self.capture.device not in (None, cache.k.device.type):
            return Refusal.CACHE_OFF_GPU
        T = chunk.T  # every row's
        if T > MAX_TOKENS:  # a prefill, padded: one row whose padding's keys fit in the context
            start, padded = max(cache.held()), -(-T // MAX_TOKENS) * MAX_TOKENS
            if cache.batch_size > 1 or op == "greedy" or start + padded > cache.limit:
                return Refusal.LONG_CHUNK
        return Plan(ids, chunk)

    def forward(self, plan: Plan) -> Output:
        """What GPT.forward returns for the chunk."""
        chunk = plan.chunk
        out = self.replay(plan.ids.view(chunk.cache.batch_size, -1), chunk.cache, chunk.last_only, 0)
        if chunk.lens is not None and not chunk.last_only:  # a packed chunk's outputs are (1, tokens)
            out = tuple(t.view(1, -1, t.shape[-1]) for t in out)
        return Output(out[0].clone(), out[1].clone() if chunk.features else None)

    def greedy(self, plan: Plan, n: int) -> list[list[int]]:
        """Each row's n greedy argmaxes after a packed chunk of equal rows (Runner.greedy): the chunk and n - 1
        greedy steps in one graph."""
        chunk = plan.chunk
        idx = torch.tensor(plan.ids, device=chunk.cache.k.device).view(chunk.B, -1)
        return self.replay(idx, chunk.cache, True, n)[0].tolist()

    def argmaxes(self, plan: Plan) -> list[list[int]]:
        """Each token's argmax for B rows of T (Runner.argmaxes): the chunk's replayed logits, their argmax taken on
        the GPU."""
        chunk = plan.chunk
        idx = torch.tensor(plan.ids, device=chunk.cache.k.device).view(chunk.B, -1)
        return self.replay(idx, chunk.cache, False, 0)[0].argmax(-1).tolist()

    def replay(self, idx: torch.Tensor, cache: KVCache, last_only: bool, steps: int) -> tuple:
        """Run the chunk from its graph, capturing it first if it is new; with steps >= 1 it is a greedy chain
        (`captured`). A row's prefill of more than MAX_TOKENS tokens is padded to a multiple of it (the padding's
        keys land past the row's length, where nothing reads them). The rows' lengths move on past everything
        written."""
        B, T = idx.shape
        written = T + max(steps - 1, 0)
        start = max(cache.held())
        cache.check(start + written)  # raises, writing nothing, as the modules would
        padded = T if T <= MAX_TOKENS else -(-T // MAX_TOKENS) * MAX_TOKENS
        end = start + written + padded - T
        keys = min(cache.max_len, max(MIN_KEYS, 1 << (end - 1).bit_length()))
        k, v, lengths = pool_rows(cache, 1 << (B - 1).bit_length(), cache.limit - written - (padded - T))
        rows = len(lengths)
        storage = k.untyped_storage().data_ptr()
        if storage != self.storage:  # a new cache pool: the graphs wrote into the old one, and their memory
            self.graphs, self.storage, self.pool = {}, storage, self.capture.new_pool()  # goes with them
        last_in_graph = last_only and padded == T  # a padded chunk's last real token is not its last
        bucket = Bucket(rows, padded, keys, last_in_graph, steps)
        key = (bucket, k.data_ptr(), k.stride())
        if key not in self.graphs:
            ids = torch.zeros(rows, padded, dtype=torch.long, device=idx.device)
            ids[:B, :T] = idx
            inputs = torch.cat([ids.reshape(-1), lengths.to(idx.device)])
            fn = functools.partial(self.captured, inputs, k, v, bucket)
            self.graphs[key] = self.capture(fn, inputs, rows * padded, self.pool)
        out = tuple(t[:B] for t in self.graphs[key](idx, lengths))
        cache.advance(written)
        if padded > T:
            logits, hidden = out
            out = logits[:, T - 1:T] if last_only else logits[:, :T], hidden[:, :T]
        return out

    def captured(self, inputs: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bucket: "Bucket") -> tuple:
        """What a graph captures: the modules' forward of the chunk (ids and lengths read from `inputs`, keys and
        values in k, v), its logits and final hidden states; with steps >= 1 a greedy chain, each row's argmax fed
        back steps - 1 times, and its drafts (rows, steps) before the last step's outputs."""
        B, T, keys = bucket.rows, bucket.tokens, bucket.keys
        idx, lengths = inputs[:B * T].view(B, T), inputs[B * T:]
        static = StaticCache(k, v, lengths, T, keys)
        logits, hidden = self.model.forward(idx, Chunk(static, last_only=bucket.last_only, features=True))
        if bucket.steps == 0:
            return logits, hidden
        drafts = [logits[:, -1].argmax(-1)]
        for i in range(1, bucket.steps):
            static = StaticCache(k, v, lengths + T + i - 1, 1, keys)
            logits, hidden = self.model.forward(drafts[-1][:, None], Chunk(static, last_only=True, features=True))
            drafts.append(logits[:, -1].argmax(-1))
        return torch.stack(drafts, 1), logits, hidden


@dataclass(frozen=True)
class Bucket:
    """What one graph is captured for: rows (a power of two), tokens a row (padded), keys attended (a power of two
    past the longest row), logits at the last token only, and greedy steps chained after the chunk (0: none)."""
    rows: int
    tokens: int
    keys: int
    last_only: bool
    steps: int


def pool_rows(cache: KVCache, rows: int, longest: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys, values and lengths of `rows` rows from the cache's first on: its own, then the next rows of the pool it
    views, so that a running batch replays the graph of a power of two of rows however many of them have finished
    (as serving engines pad a batch to a captured size). A row taken in this way only has keys written past its
    length, where nothing reads; so the cache's own rows are all it gets where the pool ends first or a row is
    longer than `longest` (the chunk's writes would run past the cache or the model's positions)."""
    B = cache.batch_size
    if rows > B:
        shape = (cache.k.shape[0], rows, *cache.k.shape[2:])
        wider = widen(cache.k, shape), widen(cache.v, shape), widen(cache.lengths, (rows,))
        if all(t is not None for t in wider) and int(wider[2][B:].max()) <= longest:
            return wider
    return cache.k, cache.v, cache.lengths


def widen(t: torch.Tensor, shape: tuple) -> torch.Tensor | None:
    """t's storage seen with a larger `shape` (t's strides, t's first element first), or None where it ends sooner."""
    end = t.storage_offset() + sum((n - 1) * step for n, step in zip(shape, t.stride())) + 1
    fits = end * t.element_size() <= t.untyped_storage().nbytes()
    return t.as_strided(shape, t.stride(), t.storage_offset()) if fits else None


def equal_rows(lens: list[int], cache: KVCache) -> bool:
    """A packed chunk that is a (rows, T) chunk: as many tokens for every row of the cache."""
    return len(set(lens)) == 1 and len(lens) == cache.batch_size


@functools.cache
def triton_kernels():
    """suts/fast/triton_kernels.py, or None (with one line saying so) where Triton is not installed."""
    try:
        import suts.fast.triton_kernels as kernels
    except ImportError as e:
        print(f"GPU kernels: Triton is unavailable ({e}); attention and int8 linears take PyTorch's own paths",
              flush=True)
        return None
    return kernels
