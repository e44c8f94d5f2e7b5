"""Analytic FLOPs and bytes of one forward pass, and of each decoding phase, from the model config alone.

Counts what the kernels actually compute: every linear layer, attention over every key a query is given
(masked positions included, as SDPA computes them), and the LM head at the positions whose logits are used.
Bytes are DRAM traffic in the ideal case: every weight read once per forward, the KV cache read by attention
and written for the new tokens, and the logits written.
"""
from dataclasses import dataclass

from mlperf.model import GPTConfig
from suts.tree import widths


@dataclass(frozen=True)
class Cost:
    matmul_flops: float  # linear layers and the LM head
    attention_flops: float  # Q K^T and softmax(.) V
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    logits_bytes: float

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
                self.logits_bytes)


NOTHING = Cost(0, 0, 0, 0, 0, 0)


def linear_params(c: GPTConfig) -> int:
    """Weights of the matmuls: per layer qkv (3d^2), attention out (d^2), MLP (8d^2); plus the tied head (Vd)."""
    return c.n_layer * 12 * c.n_embd ** 2 + c.vocab_size * c.n_embd


def forward_cost(c: GPTConfig, context: int, new_tokens: int, batch: int = 1, logits_positions: int | None = None,
                 act_bytes: int = 4, weight_bytes_per_param: float | None = None) -> Cost:
    """One forward of `new_tokens` per row after `context` cached tokens.

    act_bytes: bytes per activation / KV element (4 for fp32, 2 for fp16);
    weight_bytes_per_param: bytes per linear weight (default act_bytes; 1 for int8 weights).
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
    )


def phase_costs(target: GPTConfig, prompt_len: int, context: int, draft: GPTConfig | None = None,
                gamma: int = 4, act_bytes: int = 4, draft_weight_bytes: float | None = None,
                batch: int = 1, drafter: str | None = None, tree: list[int] | None = None) -> dict[str, Cost]:
    """Prefill (one row), and of `batch` rows together: one decode step, and for a speculative SUT one draft step,
    one verify pass and one speculative cycle. `drafter` (default "model" when a draft is given): a draft
    "model" of geometry `draft`; an EAGLE "head" (its block of geometry `draft`, its 2d -> d input layer and the
    target's LM head); or a "lookup" in host memory, whose draft step costs no FLOPs and no DRAM bytes.
    `tree` (children per depth): the verify pass reads every node and the root, and the draft's step is one level,
    as many tokens as the levels it reads (the root and every level but the deepest) average; gamma is its depth."""
    phases = {
        "prefill": forward_cost(target, 0, prompt_len, logits_positions=1, act_bytes=act_bytes),
        "decode": forward_cost(target, context, 1, batch=batch, act_bytes=act_bytes),
    }
    drafter = drafter or ("model" if draft is not None else None)
    if drafter not in (None, "model", "head", "lookup"):
        raise ValueError(f"unknown drafter {drafter!r}")
    if drafter is not None:
        verified, drafted = gamma + 1, 1
        if tree:
            levels = widths(tree)
            gamma, verified, drafted = len(tree), 1 + sum(levels), (1 + sum(levels[:-1])) / len(tree)
        phases["draft"] = NOTHING if drafter == "lookup" else forward_cost(
            draft, context, drafted, batch=batch, act_bytes=act_bytes, weight_bytes_per_param=draft_weight_bytes)
        if drafter == "head":
            d, wbytes = draft.n_embd, draft_weight_bytes or act_bytes
            phases["draft"] += Cost(matmul_flops=2 * batch * 2 * d * d, attention_flops=0,
                                    weight_bytes=2 * d * d * wbytes + d * act_bytes, kv_read_bytes=0,
                                    kv_write_bytes=0, logits_bytes=0)
        phases["verify"] = forward_cost(target, context, verified, batch=batch, act_bytes=act_bytes)
        phases["cycle"] = phases["draft"] * gamma + phases["verify"]
    return phases
