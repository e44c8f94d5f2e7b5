"""Tokenizers: bytes for the default pair, GPT-2 BPE (through the `tokenizers` library) for Hugging Face
checkpoints, and nanoGPT's character vocabulary (meta.pkl) for nanoGPT checkpoints."""
import pickle
from pathlib import Path

from mlperf.checkpoint import CheckpointError, nanogpt_file, read_config

META = "meta.pkl"


class ByteTokenizer:
    """UTF-8 bytes are the token ids (vocab 256); no special tokens. A model of a larger vocab (random weights of
    a GPT-2 geometry, `python -m mlperf random-model`) reads bytes too; ids past them decode as U+FFFD."""
    vocab_size = 256
    eos_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return b"".join(bytes([i]) if i < 256 else "\ufffd".encode() for i in ids).decode("utf-8", errors="replace")


class BPETokenizer:
    """GPT-2's byte-level BPE read from a checkpoint's tokenizer.json, or vocab.json + merges.txt."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer
        from tokenizers.implementations import ByteLevelBPETokenizer
        if (path / "tokenizer.json").is_file():
            self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        else:
            self._tok = ByteLevelBPETokenizer(str(path / "vocab.json"), str(path / "merges.txt"))
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_id = self._tok.token_to_id("<|endoftext|>")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids))


class CharTokenizer:
    """nanoGPT's character-level vocabulary: `stoi` and `itos` from a dataset's meta.pkl; no special tokens."""
    eos_id = None

    def __init__(self, meta_file: Path):
        meta = _read_meta(meta_file)
        self.stoi, self.itos = meta["stoi"], meta["itos"]
        self.vocab_size = len(self.itos)

    def encode(self, text: str) -> list[int]:
        unknown = next((c for c in text if c not in self.stoi), None)
        if unknown is not None:
            raise ValueError(f"character {unknown!r} is not in the model's character vocabulary")
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.itos[i] for i in ids)


class _PlainUnpickler(pickle.Unpickler):
    """Reads dicts, strings and numbers only: a meta.pkl that names any class or function is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _read_meta(file: Path) -> dict:
    try:
        with open(file, "rb") as f:
            meta = _PlainUnpickler(f).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as e:
        raise CheckpointError(f"{file}: not a readable nanoGPT meta.pkl ({e})") from None
    if not (isinstance(meta, dict) and isinstance(meta.get("stoi"), dict) and isinstance(meta.get("itos"), dict)):
        raise CheckpointError(f"{file}: a nanoGPT meta.pkl needs stoi and itos dictionaries")
    return meta


def tokenizer_at(source: Path):
    """The tokenizer a path holds: a meta.pkl (characters), a directory with one, or GPT-2 BPE files."""
    meta = source if source.suffix == ".pkl" else source / META
    if meta.is_file():
        return CharTokenizer(meta)
    if (source / "tokenizer.json").is_file() or all((source / f).is_file() for f in ("vocab.json", "merges.txt")):
        return BPETokenizer(source)
    raise CheckpointError(f"{source}: no tokenizer found ({META}, tokenizer.json, or vocab.json and merges.txt)")


def dataset_tokenizer(data_dir, tokenizer=None):
    """The tokenizer of a nanoGPT dataset directory: its meta.pkl, else `tokenizer` (nanoGPT's GPT-2 datasets are
    tokenised by tiktoken, whose files are not here: give a directory with GPT-2's tokenizer files)."""
    return tokenizer_at(Path(tokenizer) if tokenizer else Path(data_dir))


def load_tokenizer(path, tokenizer=None):
    """The tokenizer of a checkpoint: `tokenizer` (a meta.pkl, a directory holding one, or a directory with
    GPT-2's tokenizer files) when given, else its own: bytes for ours, the files beside a Hugging Face or
    nanoGPT checkpoint."""
    path = Path(path)
    config, kind = read_config(path)
    if tokenizer is None and kind == "mlperf":
        if config.vocab_size < ByteTokenizer.vocab_size:
            raise CheckpointError(f"{path}: vocab {config.vocab_size} but our checkpoints use the byte tokenizer "
                                  "(256); name its tokenizer with --tokenizer")
        return ByteTokenizer()
    source = Path(tokenizer) if tokenizer else nanogpt_file(path).parent if kind == "nanogpt" else path
    tok = tokenizer_at(source)
    if tok.vocab_size > config.vocab_size:
        raise CheckpointError(f"{source}: {tok.vocab_size} tokens but the model's vocab is {config.vocab_size}")
    return tok
