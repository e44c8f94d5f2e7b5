"""Held-out loss and sample continuations: what the trainer logs, and the evaluation section of the model cards.

    python -m training.evaluate     # rewrites that section in both shipped cards (make cards)

The section shows both models of the pair on the same windows, so a reader sees at once how much stronger the
target is than its draft, how many tokens each has seen per parameter, and what each writes after three held-out
prompts, greedy and sampled.
"""
import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F

from mlperf import MODELS
from mlperf.checkpoint import load_model, read_meta
from mlperf.model import GPT
from suts.baseline import Baseline
from suts.engine.sampling import SamplingParams
from training.data import stdlib_data

CARD_WINDOWS, CARD_SEQ = 128, 512  # the cards' evaluation: 128 evenly spaced held-out windows of 512 tokens
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=0)
HEADING = "## Evaluation"


@torch.no_grad()
def heldout_loss(model: GPT, data: np.ndarray, windows: int, seq: int, batch: int = 8) -> float:
    """Mean next-token loss (nats per token) over `windows` fixed, evenly spaced held-out windows of `seq` tokens."""
    was_training = model.training
    device = model.transformer.wte.weight.device
    model.eval()
    starts = np.linspace(0, len(data) - seq - 1, windows).astype(np.int64)
    total = 0.0
    for i in range(0, len(starts), batch):
        chunk = np.stack([data[s:s + seq + 1] for s in starts[i:i + batch]]).astype(np.int64)
        chunk = torch.from_numpy(chunk).to(device)
        logits = model(chunk[:, :-1]).logits
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
    model.train(was_training)
    return total / (len(starts) * seq)


def card_prompts(data, count: int = 3, length: int = 200) -> list[list[int]]:
    """`count` evenly spaced held-out excerpts of about `length` tokens, each starting after a line break and ending
    with one, so that a continuation starts on a fresh line."""
    length = min(length, len(data.heldout) // (count + 1))
    prompts = []
    for start in np.linspace(0, len(data.heldout) - length, count + 2).astype(np.int64)[1:-1]:
        ids = list(map(int, data.heldout[start:start + length]))
        if data.newline in ids[:-1]:
            ids = ids[ids.index(data.newline) + 1:]
        if data.newline in ids[:-1]:
            ids = ids[:len(ids) - ids[::-1].index(data.newline)]
        prompts.append(ids)
    return prompts


def section(models: dict[str, GPT], metas: dict[str, dict], data, show: str, n_new: int = 160) -> str:
    """The evaluation section of `show`'s card: every model's held-out loss and tokens per parameter, then
    `show`'s greedy and sampled continuations of the card prompts."""
    unit = data.unit
    seq = min(CARD_SEQ, len(data.heldout) - 1, *(m.config.block_size for m in models.values()))
    rows = {name: (heldout_loss(m, data.heldout, CARD_WINDOWS, seq), m.num_params(), metas[name].get("tokens_seen"))
            for name, m in models.items()}
    names = list(models)
    lines = [HEADING, "",
             f"{CARD_WINDOWS} evenly spaced held-out windows of {seq} {unit}s, the same for every model in the "
             f"table (`training/evaluate.py`).", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
             f"| held-out loss (nats/{unit}) | " + " | ".join(f"{r[0]:.3f}" for r in rows.values()) + " |",
             "| parameters | " + " | ".join(f"{r[1]:,}" for r in rows.values()) + " |",
             "| tokens seen | " + " | ".join(f"{r[2]:,}" if r[2] else "?" for r in rows.values()) + " |",
             "| tokens seen per parameter | " + " | ".join(f"{r[2] / r[1]:.2f}" if r[2] else "?"
                                                         for r in rows.values()) + " |", ""]
    model = models[show].eval()
    decoder = Baseline(model)  # plain decoding, greedy or seeded sampling, as every SUT samples
    n_new = min(n_new, model.config.block_size // 3)
    for i, prompt in enumerate(card_prompts(data), 1):
        prompt = prompt[-(model.config.block_size - n_new):]
        lines += [f"### Held-out prompt {i}", "", "```python", data.decode(prompt), "```", ""]
        for label, params in (("greedy", SamplingParams()), (f"sampled (temperature {SAMPLED.temperature}, top-p "
                                                                f"{SAMPLED.top_p}, seed {SAMPLED.seed})", SAMPLED)):
            lines += [f"{show}, {label}, {n_new} {unit}s:", "", "```python",
                      data.decode(decoder.generate(prompt, n_new, params).tokens), "```", ""]
    return "\n".join(lines)


def with_section(card: str, text: str) -> str:
    """`card` with its evaluation section (from HEADING up to the next "## " heading) replaced by `text`."""
    head, found, rest = card.partition(HEADING + "\n")
    tail = rest[rest.find("\n## ") + 1:] if found and "\n## " in rest else ""
    return head.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n" + ("\n" + tail if tail else "")


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m training.evaluate", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    paths = {name: MODELS / name for name in ("target", "draft")}
    try:
        models = {name: load_model(path) for name, path in paths.items()}
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    metas = {name: read_meta(path) for name, path in paths.items()}
    data = stdlib_data()
    for name, path in paths.items():
        card = path / "MODEL_CARD.md"
        card.write_text(with_section(card.read_text(), section(models, metas, data, name)))
        print(f"wrote the evaluation section of {card}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
