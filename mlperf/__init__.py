"""Model core: the GPT-2 model and KV cache, tokenizers, checkpoints, corpus, prompt dataset (and the CLI's entry)."""
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"  # what the repository ships: the prompt set and the models
MODELS = ASSETS / "models"  # the default target and draft, one checkpoint directory each
HEAD = MODELS / "eagle-head"  # the shipped target's EAGLE head
GATE = 1.4  # the smoke gate: spec's tokens/s over the baseline's at least this, in one process (`make test`)
WEIGHTS = "fp16"  # what the kernels stream unless a run says otherwise: the checkpoint's own fp16 numbers (fp32 panels
# where a model's weights are not all fp16 numbers), so the smoke gate's baseline is the fp16 one its design names
GAMMA = 6  # drafts a speculative cycle unless a run says otherwise: on a CPU at batch 1 a verify pass of 7 tokens
# costs little more than one of 5, so every drafter here ran fastest at 6 or 7 (docs/measurements.md: "Choosing gamma")
