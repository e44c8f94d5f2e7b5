"""Lab 2: the accept / resample step of speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

With temperature, top-k or top-p, the draft samples each token d from its distribution q; the target's
distribution at the same position is p. Accepting d with probability min(1, p(d) / q(d)) and, at the first
rejection, drawing a replacement from normalize(max(0, p - q)) makes every emitted token distributed exactly as
if the target had sampled it alone. Read the handout (labs/02-rejection/README.md) before you start.

The harness's speculative SUT (suts/speculative.py) runs the rest of the loop and calls your function once per
cycle and row; `make grade LAB=2` tests the distribution of what it emits.
"""
import torch

from suts.engine.sampling import SamplingParams, probs
from suts.speculative import Speculative, greedy_prefix


def accept_or_resample(drafts: list[int], q: torch.Tensor | None, logits: torch.Tensor, params: SamplingParams,
                       generator: torch.Generator | None) -> tuple[int, int]:
    """How many of `drafts` the target accepts, and the token it emits after them.

    drafts: the draft's tokens for this cycle, gamma of them.
    q: (gamma, vocab) the draft's probabilities each draft token was drawn from (temperature, top-k and top-p
       already applied with `params`).
    logits: (gamma + 1, vocab) the target's raw logits: row i scores the token drafts[i] stands in for, and the
       last row the token after all of them.
    generator: draw every random number from it (torch.rand(..., generator=generator), torch.multinomial(...,
       generator=generator)), so a seeded run is reproducible.
    Returns (k, token): the first k drafts are accepted, then `token` is emitted: a draw from the residual after
    a rejection at draft k, or a bonus draw from the target's last row when all gamma are accepted.
    """
    if params.greedy:  # greedy decoding is lab 1's rule, already written
        return greedy_prefix(drafts, logits.argmax(-1).tolist())
    # BEGIN SOLUTION the acceptance test, the residual draw after a rejection, the bonus draw
    p = probs(logits, params)  # the target's distribution under the same parameters as the draft's
    u = torch.rand(len(drafts), generator=generator).tolist()
    for i, d in enumerate(drafts):
        if u[i] * float(q[i, d]) >= float(p[i, d]):  # reject with probability 1 - min(1, p/q)
            r = (p[i] - q[i]).clamp_min(0)
            r = r / r.sum() if r.sum() > 0 else p[i]
            return i, int(torch.multinomial(r, 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[-1], 1, generator=generator))
    # END SOLUTION


class StudentRejection(Speculative):
    """The harness's speculative SUT with your acceptance rule."""
    name = "lab2-rejection"
    accept = staticmethod(accept_or_resample)
