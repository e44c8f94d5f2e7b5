"""The shipped prompt dataset (what the QSL serves): excerpts of held-out standard-library files.

    python -m mlperf.data            # regenerates mlperf/assets/prompts-v1.jsonl reproducibly

Each record: id, source (path under the standard library), offset (byte offset in that file), text.
Excerpts start and end on line boundaries, are 64-384 bytes (so prompt + 128 new tokens fits the default
pair's 512-byte context), and never occur verbatim anywhere in the training files.
"""
import json
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlperf import corpus

ASSETS = Path(__file__).parent / "assets"
PROMPTS = ASSETS / "prompts-v1.jsonl"
N_PROMPTS, MIN_BYTES, MAX_BYTES, SEED = 240, 64, 384, 20261122


class DatasetError(ValueError):
    """A prompt file that cannot be read; the message is one line."""


@dataclass(frozen=True)
class Prompt:
    id: int
    source: str
    offset: int
    text: str


def load_prompts(path=PROMPTS) -> list[Prompt]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"prompt file not found: {path}")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
            prompts.append(Prompt(int(rec["id"]), str(rec["source"]), int(rec["offset"]), str(rec["text"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{path}:{n}: bad prompt record ({e})") from None
    if not prompts:
        raise DatasetError(f"{path}: no prompts")
    return prompts


def build_prompts(root: Path | None = None) -> list[Prompt]:
    """Cut N_PROMPTS excerpts from the held-out files, deterministically."""
    root = root or corpus.stdlib_root()
    train_files, heldout_files = corpus.split(root)
    train_text = corpus.load_bytes(train_files, root).tobytes()
    files = {f: (root / f).read_bytes() for f in heldout_files}
    names = sorted(files)
    weights = np.array([len(files[f]) for f in names], dtype=np.float64)
    rng = np.random.default_rng(SEED)
    prompts, seen = [], set()
    while len(prompts) < N_PROMPTS:
        name = names[rng.choice(len(names), p=weights / weights.sum())]
        data = files[name]
        start = data.rfind(b"\n", 0, int(rng.integers(0, len(data)))) + 1  # back to a line start
        want = int(rng.integers(MIN_BYTES, MAX_BYTES + 1))
        end = data.rfind(b"\n", start, start + want) + 1  # keep whole lines only
        excerpt = data[start:end]
        if len(excerpt) < MIN_BYTES or excerpt in seen or not excerpt.strip() or excerpt in train_text:
            continue
        try:
            text = excerpt.decode("utf-8")
        except UnicodeDecodeError:
            continue
        seen.add(excerpt)
        prompts.append(Prompt(len(prompts), name, start, text))
    return prompts


def main():
    prompts = build_prompts()
    ASSETS.mkdir(exist_ok=True)
    PROMPTS.write_text("".join(json.dumps(vars(p)) + "\n" for p in prompts), encoding="utf-8")
    lengths = [len(p.text.encode()) for p in prompts]
    print(f"wrote {len(prompts)} prompts ({min(lengths)}-{max(lengths)} bytes, from "
          f"{len({p.source for p in prompts})} held-out files of Python {platform.python_version()}) to {PROMPTS}")


if __name__ == "__main__":
    main()
