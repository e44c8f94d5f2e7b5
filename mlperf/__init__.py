"""Model core: the GPT-2 model and KV cache, tokenizers, checkpoints, corpus, prompt dataset (and the CLI's entry)."""
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"  # what the repository ships: the prompt set and the models
MODELS = ASSETS / "models"  # the default target and draft, one checkpoint directory each
HEAD = MODELS / "eagle-head"  # the shipped target's EAGLE head
GATE = 1.4  # the smoke gate: spec's tokens/s over the baseline's at least this, in one process (`make test`)
WEIGHTS = "fp16"  # what the kernels stream unless a run says otherwise: the checkpoint's own fp16 numbers (fp32 panels
# where a model's weights are not all fp16 numbers), so the smoke gate's baseline is the fp16 one its design names
GAMMA = 5  # drafts a speculative cycle unless a run says otherwise: over fp16 weights a CPU's verify pass is bound by
# its arithmetic, and one of 6 rows costs less than one of 7 by more than a sixth draft brings (AVX2's kernels take 7
# rows as 6 + 1); spec ran 1.59-1.72x the baseline at 5 against 1.37-1.63x at 6 (docs/measurements.md: "Choosing
# gamma")
