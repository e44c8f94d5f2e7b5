"""Train an EAGLE draft head for a target, distilled from the target's own features and logits.

    python -m training.train head --target mlperf/assets/models/target          # the shipped target, stdlib data
    python -m training.train head --target out-shakespeare-char --data data/shakespeare_char --device cuda

The target is frozen. On each window, the head reads the target's features at every position t (with uniform
noise, so that it learns to draft from imperfect features too, as it must from its own) and the token at t+1,
and is trained to predict the features at t+1 (smooth L1) and, through the target's LM head, the target's
next-token distribution there (cross-entropy against it), as EAGLE (Li et al. 2024) trains its heads.
"""
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from mlperf.chunk import Chunk
from mlperf.model import GPT, EagleHead, GPTConfig

FEATURE_WEIGHT, TOKEN_WEIGHT, NOISE = 1.0, 0.1, 0.1  # EAGLE's loss weights and feature noise (uniform +-0.1)


def head_geometry(target: GPTConfig) -> GPTConfig:
    """One block at the target's width, heads and context."""
    return replace(target, n_layer=1)


def head_losses(head: EagleHead, target: GPT, x: torch.Tensor, noise: float = 0.0,
                agreement: bool = False) -> dict[str, torch.Tensor]:
    """On windows x (batch, T): the feature and token losses and the objective; with `agreement` (evaluation
    only: it costs a second head pass) also how often the head's first draft (from the target's features) and
    second draft (from its own first prediction) match the target's argmax, what greedy acceptance of one and
    two drafts depends on."""
    with torch.no_grad():
        logits, features = target(x, Chunk(features=True))
    given = features[:, :-1]
    if noise:
        given = given + (torch.rand_like(given) * 2 - 1) * noise
    predicted = head(x[:, 1:], Chunk(), given, target.transformer.wte.weight)  # features at 1..T-1
    feature_loss = F.smooth_l1_loss(predicted, features[:, 1:])
    head_logits = target.lm_head(predicted)
    token_loss = -(F.softmax(logits[:, 1:], -1) * F.log_softmax(head_logits, -1)).sum(-1).mean()
    losses = {"objective": FEATURE_WEIGHT * feature_loss + TOKEN_WEIGHT * token_loss, "feature_loss": feature_loss,
              "token_loss": token_loss}
    if not agreement:
        return losses
    choice = logits.argmax(-1)
    with torch.no_grad():  # the second draft: the head fed its own prediction at t+1 with the token at t+2
        second = target.lm_head(head(x[:, 2:], Chunk(), predicted[:, :-1], target.transformer.wte.weight))
        second = second.argmax(-1)
    return {**losses, "top1": (head_logits.argmax(-1) == choice[:, 1:]).float().mean(),
            "top1_second": (second == choice[:, 2:]).float().mean()}


def heldout_figures(head: EagleHead, target: GPT, data: np.ndarray, windows: int, seq: int, batch: int) -> dict:
    """head_losses and the drafts' agreement averaged over `windows` fixed, evenly spaced held-out windows (no
    noise)."""
    device = next(head.parameters()).device
    starts = np.linspace(0, len(data) - seq - 1, windows).astype(np.int64)
    totals: dict[str, float] = {}
    for i in range(0, len(starts), batch):
        x = torch.from_numpy(np.stack([data[s:s + seq] for s in starts[i:i + batch]]).astype(np.int64)).to(device)
        for k, v in head_losses(head, target, x, agreement=True).items():
            totals[k] = totals.get(k, 0.0) + v.item() * len(x)
    figures = {k: v / len(starts) for k, v in totals.items()}
    return {"heldout_loss": figures.pop("objective"), **figures}
