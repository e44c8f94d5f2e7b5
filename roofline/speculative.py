"""The speedup speculative decoding should give, from acceptance and measured costs (Leviathan et al. 2023)."""


def expected_tokens_per_cycle(alpha: float, gamma: int) -> float:
    """Tokens one cycle emits when each draft is accepted independently with probability alpha."""
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, draft_cost: float, verify_cost: float) -> float:
    """Speedup over one-token-per-target-step decoding.

    draft_cost: one draft step / one target decode step (Leviathan's c);
    verify_cost: one verify pass of gamma+1 tokens / one target decode step (1 in the paper's ideal).
    """
    return expected_tokens_per_cycle(alpha, gamma) / (gamma * draft_cost + verify_cost)
