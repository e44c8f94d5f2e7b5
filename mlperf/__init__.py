"""Model core: the GPT-2 model and KV cache, tokenizers, checkpoints, corpus, prompt dataset (and the CLI's entry)."""
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"  # what the repository ships: the prompt set and the models
MODELS = ASSETS / "models"  # the default target and draft, one checkpoint directory each
HEAD = MODELS / "eagle-head"  # the shipped target's EAGLE head
