"""The shipped prompt dataset (what the QSL serves): excerpts of held-out standard-library files.

    python -m mlperf.data                    # regenerates mlperf/assets/prompts-v2.jsonl reproducibly
    python -m mlperf.data --from data/shakespeare_char [--out FILE] [--count N]
                                             # prompts cut from a nanoGPT dataset's val.bin

Each record: id, source (path under the standard library), offset (byte offset in that file), text.
Excerpts start and end on line boundaries, are 64-384 bytes (so prompt + 128 new tokens fits the default
pair's 512-byte context), and never occur verbatim anywhere in the training files. Three rules keep out prompts
whose continuation is trivially predictable: at least CONTINUATION bytes of the file follow the excerpt (never
its end), the excerpt and that continuation are not repetitive text (zlib keeps at least MIN_ZLIB_RATIO of their
size; this rejects about one cut in seven, half of them in locale's alias table, most others in codec
charmaps), and no file gives more than MAX_PER_FILE prompts (so that no one file weighs on every figure).
"""
import argparse
import json
import platform
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlperf import ASSETS, corpus
from mlperf.files import read_text

PROMPTS = ASSETS / "prompts-v2.jsonl"
N_PROMPTS, MIN_BYTES, MAX_BYTES, SEED = 240, 64, 384, 20261122
CONTINUATION, MIN_ZLIB_RATIO, MAX_PER_FILE = 128, 0.4, 16


def repetitive_tail(text: str, span: int = 48, max_period: int = 16) -> bool:
    """Does `text` end in a degenerate run: its last `span` characters all whitespace, or one unit of at most
    `max_period` characters repeated over them ("the string the string ...")? Both models predict such runs."""
    tail = text[-span:]
    return len(tail) == span and (not tail.strip() or any(tail[:-p] == tail[p:] for p in range(1, max_period + 1)))


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
    for n, line in enumerate(read_text(path).splitlines(), 1):
        try:
            rec = json.loads(line)
            if not isinstance(rec["text"], str):
                raise ValueError(f"text must be a string, got {type(rec['text']).__name__}")
            prompts.append(Prompt(int(rec["id"]), str(rec["source"]), int(rec["offset"]), rec["text"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{path}:{n}: bad prompt record ({e})") from None
    if not prompts:
        raise DatasetError(f"{path}: no prompts")
    return prompts


def trivially_predictable(excerpt_and_continuation: bytes) -> bool:
    """Repetitive text such as a table's rows, rather than code: zlib shrinks it below MIN_ZLIB_RATIO of its size."""
    return len(zlib.compress(excerpt_and_continuation, 9)) < MIN_ZLIB_RATIO * len(excerpt_and_continuation)


def build_prompts(root: Path | None = None) -> list[Prompt]:
    """Cut N_PROMPTS excerpts from the held-out files, deterministically: files drawn in proportion to their
    size until each has given MAX_PER_FILE, a random line in the file, then whole lines up to a random length."""
    root = root or corpus.stdlib_root()
    train_files, heldout_files = corpus.split(root)
    train_text = corpus.load_bytes(train_files, root).tobytes()
    files = {f: (root / f).read_bytes() for f in heldout_files}
    names = sorted(files)
    weights = np.array([len(files[f]) for f in names], dtype=np.float64)
    rng = np.random.default_rng(SEED)
    prompts, seen = [], set()
    for _ in range(100 * N_PROMPTS):
        if len(prompts) == N_PROMPTS or not weights.any():
            break
        i = rng.choice(len(names), p=weights / weights.sum())
        data = files[names[i]]
        start = data.rfind(b"\n", 0, int(rng.integers(0, len(data)))) + 1  # back to a line start
        want = int(rng.integers(MIN_BYTES, MAX_BYTES + 1))
        end = data.rfind(b"\n", start, start + want) + 1  # keep whole lines only
        excerpt = data[start:end]
        if (len(excerpt) < MIN_BYTES or excerpt in seen or not excerpt.strip() or len(data) - end < CONTINUATION
                or trivially_predictable(data[start:end + CONTINUATION]) or excerpt in train_text):
            continue
        try:
            text = excerpt.decode("utf-8")
        except UnicodeDecodeError:
            continue
        seen.add(excerpt)
        prompts.append(Prompt(len(prompts), names[i], start, text))
        if sum(p.source == names[i] for p in prompts) == MAX_PER_FILE:
            weights[i] = 0.0
    if len(prompts) < N_PROMPTS:
        raise DatasetError(f"{root}: found only {len(prompts)} of {N_PROMPTS} prompts that meet the rules")
    return prompts


def prompts_from_nanogpt(data_dir: Path, tokenizer, count: int = 64, min_tokens: int = 32,
                         max_tokens: int = 128) -> list[Prompt]:
    """Cut `count` prompts of min..max tokens from a nanoGPT dataset's val.bin (uint16 token ids),
    deterministically; a character vocabulary's prompts start at a line's beginning."""
    path = Path(data_dir) / "val.bin"
    if not path.is_file():
        raise DatasetError(f"{data_dir}: no val.bin (nanoGPT's prepare.py writes train.bin and val.bin)")
    ids = np.memmap(path, dtype=np.uint16, mode="r")
    if len(ids) < 2 * max_tokens:
        raise DatasetError(f"{path}: {len(ids)} tokens, too few to cut prompts of up to {max_tokens} tokens")
    newline = getattr(tokenizer, "stoi", {}).get("\n")
    rng = np.random.default_rng(SEED)
    prompts, seen = [], set()
    for _ in range(100 * count):
        if len(prompts) == count:
            break
        start = int(rng.integers(0, len(ids) - max_tokens))
        if newline is not None:  # back to the start of a line, when one begins shortly before
            window = max(0, start - max_tokens)
            breaks = np.flatnonzero(ids[window:start] == newline)
            start = window + int(breaks[-1]) + 1 if len(breaks) else start
        chunk = ids[start:start + int(rng.integers(min_tokens, max_tokens + 1))].tolist()
        text = tokenizer.decode(chunk)
        if text.strip() and text not in seen and tokenizer.encode(text) == chunk:
            seen.add(text)
            prompts.append(Prompt(len(prompts), path.name, start, text))
    if len(prompts) < count:
        raise DatasetError(f"{path}: found only {len(prompts)} distinct prompts that decode and re-encode exactly")
    return prompts


def write_prompts(prompts: list[Prompt], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(vars(p)) + "\n" for p in prompts), encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlperf.data", description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="source", help="a nanoGPT dataset directory (val.bin, and meta.pkl for characters)")
    p.add_argument("--tokenizer", help="for GPT-2 BPE datasets: a directory with GPT-2's tokenizer files")
    p.add_argument("--out", help="where to write the prompts (default: DIR/prompts.jsonl)")
    p.add_argument("--count", type=int, default=64)
    p.add_argument("--min-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128, help="prompt + max_new_tokens must fit the model's context")
    args = p.parse_args(argv)
    if args.source is None:
        prompts = build_prompts()
        write_prompts(prompts, PROMPTS)
        lengths = [len(p.text.encode()) for p in prompts]
        print(f"wrote {len(prompts)} prompts ({min(lengths)}-{max(lengths)} bytes, from "
              f"{len({p.source for p in prompts})} held-out files of Python {platform.python_version()}) to {PROMPTS}")
        return 0
    from mlperf.checkpoint import CheckpointError
    from mlperf.tokenizer import dataset_tokenizer
    try:
        if args.count < 1 or not 1 <= args.min_tokens <= args.max_tokens:
            raise DatasetError("count must be positive and 1 <= min-tokens <= max-tokens")
        prompts = prompts_from_nanogpt(Path(args.source), dataset_tokenizer(args.source, args.tokenizer), args.count,
                                       args.min_tokens, args.max_tokens)
    except (DatasetError, CheckpointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else Path(args.source) / "prompts.jsonl"
    write_prompts(prompts, out)
    print(f"wrote {len(prompts)} prompts from {Path(args.source) / 'val.bin'} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
