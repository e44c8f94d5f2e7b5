"""What a model trains on: the shipped pair's corpus (the standard library's sources, as bytes) or a nanoGPT
dataset, with what the trainer and the model cards need to show it."""
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlperf import corpus
from mlperf.tokenizer import dataset_tokenizer


@dataclass
class Data:
    """What a model trains on: token ids (training and held out), how to show them, and a line for the card."""
    train: np.ndarray
    heldout: np.ndarray
    decode: Callable[[list[int]], str]
    newline: int | None  # the id of "\n", where the card's sample prompt starts after
    unit: str  # what one token is, for losses: "byte" or "token"
    description: str


def stdlib_data() -> Data:
    """The shipped pair's corpus: the standard library's sources as bytes, held out by the path-hash rule."""
    train_files, heldout_files = corpus.split()
    return Data(corpus.load_bytes(train_files), corpus.load_bytes(heldout_files),
                lambda ids: bytes(ids).decode("utf-8", "replace"), ord("\n"), "byte",
                f"Python {platform.python_version()} standard library, {len(train_files)} train files (list hash "
                f"{corpus.file_list_hash(train_files)}), {len(heldout_files)} held out (list hash "
                f"{corpus.file_list_hash(heldout_files)}); the `.py` sources (PSF license), without tests, idlelib "
                f"and site-packages; a file is held out when sha1(path) mod {corpus.HELDOUT_MODULUS} == 0")


def nanogpt_data(data_dir: Path, tokenizer_dir: Path | None = None) -> Data:
    """A nanoGPT dataset: train.bin and val.bin (uint16 token ids), meta.pkl for a character vocabulary."""
    files = [data_dir / f for f in ("train.bin", "val.bin")]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"{data_dir}: no {' or '.join(missing)} (nanoGPT's prepare.py writes them)")
    train_ids, val_ids = (np.memmap(f, dtype=np.uint16, mode="r") for f in files)
    tok = dataset_tokenizer(data_dir, tokenizer_dir)
    return Data(train_ids, val_ids, tok.decode, getattr(tok, "stoi", {}).get("\n"), "token",
                f"nanoGPT dataset {data_dir} ({len(train_ids):,} training tokens, {len(val_ids):,} held out in "
                "val.bin)")
