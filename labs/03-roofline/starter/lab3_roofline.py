"""Lab 3: a roofline of speculative decoding, by hand. Predict what one forward pass of a GPT-2-style model costs
in FLOPs and in bytes moved, which roof bounds it on your machine, and what speedup speculative decoding should
give from a measured acceptance. Read the handout (labs/03-roofline/README.md) before you start.

The model (mlperf/model.py): n_layer blocks of width d = n_embd, each with a qkv projection (d x 3d), an
attention output projection (d x d) and an MLP (d x 4d, then 4d x d); a final LayerNorm; the LM head shares the
token embedding's (vocab x d) weights. Count a multiply-add as 2 FLOPs. Batch 1, fp32 (4 bytes per value).
"""
from mlperf.model import GPTConfig


def forward_flops(c: GPTConfig, context: int, new_tokens: int) -> float:
    """FLOPs of one forward pass that feeds `new_tokens` tokens after `context` tokens already in the KV cache,
    with logits at every new position: every linear layer, the LM head, and attention (Q K^T and the weighted sum
    of V), each new token attending to all context + new_tokens keys (masked ones included: the kernel computes
    them). Ignore LayerNorms, softmax, GELU and biases: they are a few FLOPs per value."""
    raise NotImplementedError('TODO: linear layers, LM head and attention')


def forward_bytes(c: GPTConfig, context: int, new_tokens: int, bytes_per_value: int = 4) -> float:
    """Bytes one such forward pass moves to or from memory in the ideal case: every weight read once (each linear
    layer's and the token embedding's, which the LM head reads; not the position-embedding table, of which a pass
    reads only its new positions' rows, nor LayerNorms and biases), the KV cache
    read by attention (all context + new_tokens positions, keys and values, every layer), the new tokens' keys and
    values written, and the logits written. Activations stay in cache and are not counted."""
    raise NotImplementedError('TODO: weights, KV cache reads and writes, logits')


def regime(flops: float, bytes_moved: float, peak_flops_per_s: float, peak_bytes_per_s: float) -> str:
    """"compute-bound" or "memory-bound": which roof the pass sits under on a machine with these peaks."""
    raise NotImplementedError('TODO: arithmetic intensity against the ridge point')


def predicted_speedup(alpha: float, gamma: int, c: float, verify: float) -> float:
    """Decode speedup of speculative decoding over plain decoding (Leviathan et al. 2023, section 3.4), when each
    draft is accepted independently with probability `alpha`, a cycle drafts `gamma` tokens, one draft step costs
    `c` decode steps and one verify pass costs `verify` decode steps."""
    raise NotImplementedError("TODO: expected tokens per cycle over the cycle's cost in decode steps")
