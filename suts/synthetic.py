"""Synthetic acceptance: a speculative SUT's drafter runs as always (its cost is real), but each of its proposals
is then the target's own greedy token with a set probability and a token certain to differ otherwise.

It measures the mechanism apart from the drafter's quality (vLLM's `synthetic_acceptance_rates`, llama.cpp's
benchmark-only options), and stays lossless: the target verifies every proposal as always, so the output is the
baseline's token for token whatever the rates. The target's greedy tokens come from the reference outputs the
accuracy gate computes for the same model, prompts and length (scenarios/accuracy.py); a prompt outside them, or a
position past its reference, keeps the drafter's own proposal. Greedy only: a sampled row's acceptance is a
distribution's, which a reference cannot stand in for.
"""
import random
from dataclasses import dataclass

from mlperf.rules import positive_int

SEED = 0  # the coins' seed: the same rates give the same accepted lengths run after run


@dataclass(frozen=True)
class Acceptance:
    """Per-position unconditional acceptance rates, as vLLM states them: rates[i-1] is the probability that the
    first i drafts of a cycle are all accepted (non-increasing, each in [0, 1]). A position past the list keeps
    the last position's conditional rate, so one rate alpha stands for alpha, alpha^2, alpha^3, ..."""
    rates: tuple[float, ...]

    def __post_init__(self):
        if not self.rates:
            raise ValueError("synthetic acceptance needs at least one rate")
        for r in self.rates:
            if not 0 <= r <= 1:
                raise ValueError(f"a synthetic acceptance rate is a probability in [0, 1], got {r}")
        if any(b > a for a, b in zip(self.rates, self.rates[1:])):
            raise ValueError("synthetic acceptance rates are unconditional (R_i: the first i drafts all accepted), so "
                             f"they cannot increase: got {','.join(map(str, self.rates))}")

    @classmethod
    def parse(cls, text: str) -> "Acceptance":
        """R1,R2,... from the command line (--synthetic-acceptance-rates)."""
        try:
            rates = tuple(float(r) for r in text.split(","))
        except ValueError:
            raise ValueError(f"synthetic acceptance rates are numbers R1,R2,..., got {text!r}") from None
        return cls(rates)

    @classmethod
    def of_length(cls, length: float, gamma: int) -> "Acceptance":
        """The rates whose mean acceptance length over a chain of `gamma` drafts is `length` (tokens a cycle, the
        target's own included): one conditional rate at every position (a geometric decay), found by bisection."""
        positive_int("gamma", gamma)
        if not 1 <= length <= gamma + 1:
            raise ValueError(f"a mean acceptance length over {gamma} drafts lies in [1, {gamma + 1}], got {length}")
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if cls((mid,)).mean_length(gamma) < length else (lo, mid)
        return cls(((lo + hi) / 2,))

    def conditional(self, i: int) -> float:
        """The probability that draft i (1-based) is accepted given that the ones before it were."""
        j = min(i, len(self.rates))
        before = self.rates[j - 2] if j >= 2 else 1.0
        return self.rates[j - 1] / before if before > 0 else 0.0

    def unconditional(self, i: int) -> float:
        """R_i: the probability that the first i drafts are all accepted."""
        r = 1.0
        for k in range(1, i + 1):
            r *= self.conditional(k)
        return r

    def mean_length(self, gamma: int) -> float:
        """Tokens a cycle of `gamma` drafts emits on average: 1 + R_1 + ... + R_gamma."""
        return 1 + sum(self.unconditional(i) for i in range(1, gamma + 1))

    def tag(self) -> str:
        """What a synthetic run's SUT is named and filed by beside the drafter's own: "synthetic-0.8,0.5"."""
        return "synthetic-" + ",".join(f"{r:.3g}" for r in self.rates)

    def label(self, gamma: int) -> str:
        """How a record, table or plot names such a run: "synthetic acceptance 0.70,0.49,...", one rate per draft."""
        return "synthetic acceptance " + ",".join(f"{self.unconditional(i):.2f}" for i in range(1, gamma + 1))


class Synthetic:
    """A drafter (`inner`, any family, drafting chains: suts.registry.check_synthetic) whose proposals are replaced
    after it has made them: draft i of a row is its reference token with probability acceptance.conditional(i)
    while the ones before it were, else that token plus one (certain to be rejected). Everything but the proposals
    is the inner drafter's, its family's name and costs included."""

    def __init__(self, inner, acceptance: Acceptance, reference: dict[tuple[int, ...], list[int]]):
        self.inner, self.acceptance, self.reference = inner, acceptance, reference
        self.coins = random.Random(SEED)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft_chain(self, seqs, wants: list[int], lengths: list[int]) -> tuple[list[list[int]], list]:
        """The inner drafter's chains (their time is the cycle's drafting time), each then set by the coins."""
        if not all(s.params.greedy for s in seqs):
            raise ValueError("synthetic acceptance is greedy only: a sampled request's acceptance is the draft's "
                             "and target's distributions', which no reference stands in for")
        drafts, q = self.inner.draft_chain(seqs, wants, lengths)
        vocab = self.inner.target.config.vocab_size
        return [self.set(s, d, vocab) for s, d in zip(seqs, drafts)], q

    def set(self, seq, drafts: list[int], vocab: int) -> list[int]:
        """One row's drafts: the reference's next tokens while the coins say accept, then one certain to differ;
        the drafter's own where the row has no reference (an unknown prompt, or past its reference's end)."""
        want = self.reference.get(tuple(seq.prompt))
        done = len(seq.tokens)
        if want is None or want[:done] != seq.tokens:
            return drafts
        out = list(drafts)
        for i in range(len(drafts)):
            if done + i >= len(want):
                return out
            token = want[done + i]
            if self.coins.random() >= self.acceptance.conditional(i + 1):
                out[i] = (token + 1) % vocab
                return out
            out[i] = token
        return out
