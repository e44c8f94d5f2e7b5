"""What one forward pass of a GPT geometry computes and moves: analytic FLOPs and DRAM bytes from the config alone.

Counts what the kernels actually compute: every linear layer, attention over every key a query is given
(masked positions included, as SDPA computes them), and the LM head at the positions whose logits are used.
Bytes are DRAM traffic in the ideal case: every weight read once per forward, the KV cache read by attention
and written for the new tokens, and the logits written. Weights stored in fp16 for a CPU's fp32 arithmetic are
counted once more as `widened_bytes`: each is converted as it is read, work that no FLOP counts. The roofline
(roofline/analytic.py) costs each decoding phase with it; spec-auto's planner (suts/planner.py) predicts a verify
pass with it.
"""
from dataclasses import dataclass

from mlperf.model import GPTConfig


@dataclass(frozen=True)
class Cost:
    matmul_flops: float  # linear layers and the LM head
    attention_flops: float  # Q K^T and softmax(.) V
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    logits_bytes: float
    widened_bytes: float = 0.0  # fp16 weights a CPU's kernels widen to fp32 as they read them (each once a pass)

    @property
    def flops(self) -> float:
        return self.matmul_flops + self.attention_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.logits_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte (0 for a phase that moves nothing)."""
        return self.flops / self.bytes if self.bytes else 0.0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(*(a + b for a, b in zip(self._values(), other._values())))

    def __mul__(self, k: float) -> "Cost":
        return Cost(*(a * k for a in self._values()))

    def _values(self):
        return (self.matmul_flops, self.attention_flops, self.weight_bytes, self.kv_read_bytes, self.kv_write_bytes,
                self.logits_bytes, self.widened_bytes)


NOTHING = Cost(0, 0, 0, 0, 0, 0)


def widened(weight_bytes: float, bytes_per_weight: float, act_bytes: int) -> float:
    """The bytes of weights a CPU's kernels widen as they read them: fp16 weights (2 bytes) under fp32 arithmetic
    (4), none otherwise."""
    return weight_bytes if (bytes_per_weight, act_bytes) == (2, 4) else 0.0


def linear_params(c: GPTConfig) -> int:
    """Weights of the matmuls: per layer qkv (3d^2), attention out (d^2), MLP (8d^2); plus the tied head (Vd)."""
    return c.n_layer * 12 * c.n_embd ** 2 + c.vocab_size * c.n_embd


def forward_cost(c: GPTConfig, context: int, new_tokens: int, batch: int = 1, logits_positions: int | None = None,
                 act_bytes: int = 4, weight_bytes_per_param: float | None = None) -> Cost:
    """One forward of `new_tokens` per row after `context` cached tokens.

    act_bytes: bytes per activation / KV element (4 for fp32, 2 for fp16);
    weight_bytes_per_param: bytes per linear weight (default act_bytes; 1 for int8 weights; 2 with fp32 activations:
    fp16 weights widened as read, `widened_bytes`).
    """
    d, L, V, T = c.n_embd, c.n_layer, c.vocab_size, new_tokens
    logits_positions = T if logits_positions is None else logits_positions
    kv_len = context + T
    wbytes = act_bytes if weight_bytes_per_param is None else weight_bytes_per_param
    linear = 2 * batch * T * L * 12 * d * d
    attention = 2 * 2 * batch * L * T * kv_len * d  # Q K^T and softmax(.) V
    head = 2 * batch * logits_positions * d * V
    other_params = L * 13 * d + 2 * d if c.bias else L * 2 * d + d  # biases and LayerNorms
    return Cost(
        matmul_flops=linear + head,
        attention_flops=attention,
        weight_bytes=linear_params(c) * wbytes + other_params * act_bytes,
        kv_read_bytes=batch * L * 2 * kv_len * d * act_bytes,
        kv_write_bytes=batch * L * 2 * T * d * act_bytes,
        logits_bytes=batch * logits_positions * V * 4,
        widened_bytes=widened(linear_params(c) * wbytes, wbytes, act_bytes),
    )
