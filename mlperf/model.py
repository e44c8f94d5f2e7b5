"""The one GPT-2-architecture model (its KV cache is mlperf/cache.py).

Prefill, decode and speculative verify all go through `GPT.forward(idx, chunk)` (mlperf/chunk.py: the pass's cache,
tree, packed rows and outputs in one object; it returns an Output): a chunk of T new tokens per
row is written into a preallocated cache at each row's current length, attends to everything valid before it,
and advances the length. Rolling back a rejected draft is `cache.roll_back(kept)`: O(1), no tensor copies;
stale keys/values past a row's length are masked out and later overwritten. A chunk may also be a token tree
(TreeMask): each node attends to the context and its own ancestors, and `cache.keep` compacts the accepted path.
Or it may be packed: rows of different lengths one after another in a (1, N) chunk (`lens`), as a batched and
chunked prefill feeds them; the linears see only real tokens, and attention unpacks them per row.
The model is plain modules; how a SUT runs it fast (one C call a step on a CPU, CUDA graphs on a GPU) is decided
by its runner (suts/fast/runner.py), and tested against these modules.
"""
import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from mlperf.cache import KVCache
from mlperf.chunk import Chunk, Output
from mlperf.rules import positive_int


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    vocab_size: int = 256
    block_size: int = 512  # the longest context (prompt + generated) the model has position embeddings for
    bias: bool = True  # biases in the linears and LayerNorms (GPT-2 has them; nanoGPT can train without)

    def __post_init__(self):
        for name, value in asdict(self).items():
            if name == "bias":
                if not isinstance(value, bool):
                    raise ValueError(f"model config: bias must be true or false, got {value!r}")
            else:
                positive_int(f"model config: {name}", value)
        if self.n_embd % self.n_head:
            raise ValueError(f"model config: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# Named geometries: the shipped default pair; the seed's pair (a GPT-2-small target, bytes in, a context for 2048
# prompt tokens and 64 new ones, and a draft of the shipped target's geometry); the four public GPT-2 sizes, and a
# draft for each of the larger three with half its layers and half its width (an eighth of its blocks' weights).
GEOMETRIES = {
    "target": GPTConfig(n_layer=6, n_head=6, n_embd=384, vocab_size=256, block_size=512),
    "draft": GPTConfig(n_layer=2, n_head=2, n_embd=128, vocab_size=256, block_size=512),
    "seed-target": GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=256, block_size=2176),
    "seed-draft": GPTConfig(n_layer=6, n_head=6, n_embd=384, vocab_size=256, block_size=2176),
    "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024, vocab_size=50257, block_size=1024),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280, vocab_size=50257, block_size=1024),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600, vocab_size=50257, block_size=1024),
    "gpt2-medium-draft": GPTConfig(n_layer=12, n_head=16, n_embd=512, vocab_size=50257, block_size=1024),
    "gpt2-large-draft": GPTConfig(n_layer=18, n_head=20, n_embd=640, vocab_size=50257, block_size=1024),
    "gpt2-xl-draft": GPTConfig(n_layer=24, n_head=25, n_embd=800, vocab_size=50257, block_size=1024),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.layer, self.n_head = layer, config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x, cache: KVCache | None):
        B, T, C = x.shape  # batch, new tokens, n_embd
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, n_head, T, head_dim) each
                   for t in self.c_attn(x).split(C, dim=2))
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = cache.attend(self.layer, q, k, v)  # (B, n_head, T, head_dim), over the cached context too
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))  # heads side by side again: (B, T, C)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new" (the CPU fast path folds it into c_fc)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache):
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        # Built on the meta device (load_model: the checkpoint brings the weights), nothing is drawn: normal_ on meta
        # tensors imports torch._dynamo, a second of every command's start.
        meta = torch.get_default_device().type == "meta"

        def embedding(rows: int) -> nn.Embedding:
            return nn.Embedding(rows, config.n_embd, _weight=torch.empty(rows, config.n_embd) if meta else None)

        self.transformer = nn.ModuleDict(dict(
            wte=embedding(config.vocab_size),
            wpe=embedding(config.block_size),
            h=nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
        if meta:
            return
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch_size: int = 1, max_len: int | None = None) -> KVCache:
        p = self.transformer.wte.weight
        return KVCache(self.config, batch_size, max_len, device=p.device, dtype=p.dtype)

    def forward(self, idx: torch.Tensor, chunk: Chunk | None = None) -> Output:
        """Logits for a (batch, T) chunk of token ids: a whole sequence (no chunk, or no cache in it), or new tokens
        continuing each row's context in the chunk's cache: a token tree's last T nodes with `tree`, packed rows
        (1, sum(lens)) with `lens` (see KVCache.begin); each row's last position only with `last_only` (packed:
        (batch, 1, vocab)), every position's final hidden states beside them with `features`."""
        chunk = chunk or Chunk()
        B, T = idx.shape
        cache, lens = chunk.cache, chunk.lens
        if cache is None:
            if T > self.config.block_size:
                raise ValueError(f"sequence of {T} tokens exceeds the model's context of {self.config.block_size}")
            pos = torch.arange(T, device=idx.device)
        else:
            pos = cache.begin(T, chunk.tree, lens)  # checks the context against the model's and the cache's lengths
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, n_embd); pos (T,), or (B, T) from a cache
        for block in self.transformer.h:
            x = block(x, cache)
        if cache is not None:
            cache.end()
        x = self.transformer.ln_f(x)
        logits = self.lm_head(chunk.lasts(x) if chunk.last_only else x)  # (B, T or 1, vocab)
        return Output(logits, x if chunk.features else None)


class EagleHead(nn.Module):
    """An EAGLE draft head (Li et al. 2024): from the target's features at position t and the embedding of the
    token at t+1, one transformer block predicts the target's features at t+1, which the target's own LM head
    turns into a draft distribution; fed its own predictions, it drafts several tokens ahead.

    `config` is the block's geometry (one layer at the target's width, heads and context); the embedding and
    the LM head are the target's, passed in, never copied.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.n_embd, config.n_embd, bias=config.bias)
        self.block = Block(config, 0)
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)  # into the space of the target's final features

    def new_cache(self, batch_size: int = 1, max_len: int | None = None) -> KVCache:
        """Room for twice the context: the head has no position embeddings, and a batch's catch-up chunk is padded
        past the pairs of rows that have fewer to catch up on."""
        p = self.fc.weight
        return KVCache(replace(self.config, block_size=2 * self.config.block_size), batch_size, max_len,
                       device=p.device, dtype=p.dtype)

    def forward(self, tokens: torch.Tensor, chunk: Chunk, feats: torch.Tensor, wte: torch.Tensor) -> torch.Tensor:
        """Predicted features (batch, T, n_embd) at t+1 from the target's features `feats` (batch, T, n_embd) at t and
        token ids (batch, T) at t+1, embedded by the target's token embedding (`wte`, its weight); with a cache the
        chunk continues each row's pairs, or with `tree` is the last T nodes of a tree, or with `lens` is packed (as
        GPT.forward's)."""
        x = self.fc(torch.cat([F.embedding(tokens, wte), feats], dim=-1))
        cache = chunk.cache
        if cache is not None:
            cache.begin(tokens.shape[1], chunk.tree, chunk.lens)
        x = self.block(x, cache)
        if cache is not None:
            cache.end()
        return self.ln_f(x)
