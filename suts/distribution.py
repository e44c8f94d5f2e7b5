"""Is a sampling SUT distributed exactly as its target? A chi-square test of its sampled continuations against
the target's exact joint distribution, on a tiny vocabulary where every continuation can be enumerated.

Used by the tests and by lab 2's grader: a correct rejection sampler passes (p-value well above 1e-3) and the
wrong ones students write (resampling from p, a mismatched temperature) fail with p-values near zero.
"""
from typing import NamedTuple

import torch

from mlperf.model import GPT, GPTConfig
from suts.engine.sampling import SamplingParams, probs

TINY_VOCAB = GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=8, block_size=16)


def peaky_model(config: GPTConfig, seed: int, sharpness: float = 4.0) -> GPT:
    """A random model with varied, far-from-uniform next-token distributions.

    GPT-2's init (std 0.02) makes a random model repeat its input token with near-uniform probabilities;
    larger matrices let the blocks shape the output, and a scaled final LayerNorm sharpens it.
    """
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
        model.transformer.ln_f.weight.mul_(sharpness / config.n_embd ** 0.5)
    return model


def tiny_vocab_pair() -> tuple[GPT, GPT]:
    """A target and an unrelated draft over 8 tokens: about half the drafts are rejected, so the residual
    distribution matters, and every 4-token continuation (4096) can be enumerated."""
    return peaky_model(TINY_VOCAB, 0, sharpness=2.0), peaky_model(TINY_VOCAB, 1, sharpness=2.0)


def detectable(samples: int, bins: int, alpha: float, power: float = 0.9) -> float:
    """The smallest deviation (Cohen's w, sqrt(sum (observed - expected)^2 / expected) over probabilities) that
    a chi-square test of `samples` draws over `bins` bins, failing at p < `alpha`, detects with probability
    `power`: from the noncentral chi-square its statistic follows under that deviation."""
    from scipy.optimize import brentq
    from scipy.stats import chi2, ncx2
    critical = chi2.isf(alpha, bins - 1)
    noncentrality = brentq(lambda nc: ncx2.sf(critical, bins - 1, nc) - power, 1e-9, 1e9)
    return (noncentrality / samples) ** 0.5


class ChiSquare(NamedTuple):
    pvalue: float
    bins: int
    samples: int


def chi_square_vs_target(sut, target, prompt: list[int], params: SamplingParams, n_samples: int, *,
                         max_batch: int = 1, n_new: int = 4) -> ChiSquare:
    """A chi-square test of `sut`'s samples of `n_new` tokens after `prompt` (one seed per sample, `max_batch`
    decoding together) against the target's exact distribution of those tokens under `params`."""
    from scipy.stats import chisquare
    vocab = target.config.vocab_size
    continuations = torch.cartesian_prod(*[torch.arange(vocab)] * n_new)  # every possible output
    seqs = torch.cat([torch.tensor(prompt).expand(len(continuations), -1), continuations], 1)
    with torch.no_grad():
        p = probs(target(seqs[:, :-1]).logits[:, len(prompt) - 1:], params)  # (outputs, n_new, vocab)
    expected = p.gather(-1, continuations[..., None])[..., 0].prod(-1) * n_samples
    counts = torch.zeros(len(continuations))
    seeded = [SamplingParams(params.temperature, params.top_k, params.top_p, seed) for seed in range(n_samples)]
    for result in sut.generate_batch([prompt] * n_samples, n_new, seeded, max_batch=max_batch):
        counts[sum(t * vocab ** (n_new - 1 - i) for i, t in enumerate(result.tokens))] += 1
    rare = expected < 5  # pool rare outputs into one bin so the chi-square approximation holds
    observed = torch.cat([counts[~rare], counts[rare].sum()[None]])
    pvalue = chisquare(observed.numpy(), torch.cat([expected[~rare], expected[rare].sum()[None]]).numpy()).pvalue
    return ChiSquare(float(pvalue), len(observed), n_samples)
