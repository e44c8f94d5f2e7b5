"""Tokenizers: bytes for the default pair, GPT-2 BPE (through the `tokenizers` library) for Hugging Face
checkpoints, and nanoGPT's character vocabulary (meta.pkl) for nanoGPT checkpoints."""
import pickle
from pathlib import Path

from mlperf.checkpoint import CheckpointError, nanogpt_file, read_config

META = "meta.pkl"


class ByteTokenizer:
    """UTF-8 bytes are the token ids (vocab 256); no special tokens."""
    vocab_size = 256
    eos_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


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


def dataset_tokenizer(data_dir, tokenizer_dir=None):
    """The tokenizer of a nanoGPT dataset directory: its meta.pkl (characters), else GPT-2 BPE read from
    `tokenizer_dir` (nanoGPT's GPT-2 datasets are tokenised by tiktoken, whose files are not here)."""
    data_dir = Path(data_dir)
    if (data_dir / META).is_file():
        return CharTokenizer(data_dir / META)
    if tokenizer_dir is None:
        raise CheckpointError(f"{data_dir}: no {META}; for GPT-2 BPE data give a directory with GPT-2's tokenizer files")
    return BPETokenizer(Path(tokenizer_dir))


def load_tokenizer(path):
    """The tokenizer that belongs to a checkpoint (a nanoGPT checkpoint's meta.pkl sits beside its ckpt.pt)."""
    path = Path(path)
    config, kind = read_config(path)
    if kind == "nanogpt":
        meta = nanogpt_file(path).parent / META
        if not meta.is_file():
            raise CheckpointError(f"{path}: no {META} beside the checkpoint (copy the dataset's meta.pkl there)")
        tokenizer = CharTokenizer(meta)
        if tokenizer.vocab_size > config.vocab_size:
            raise CheckpointError(f"{meta}: {tokenizer.vocab_size} characters but the model's vocab is {config.vocab_size}")
        return tokenizer
    if kind == "mlperf":
        if config.vocab_size != ByteTokenizer.vocab_size:
            raise CheckpointError(f"{path}: vocab {config.vocab_size} but our checkpoints use the byte tokenizer (256)")
        return ByteTokenizer()
    if (path / "tokenizer.json").is_file() or all((path / f).is_file() for f in ("vocab.json", "merges.txt")):
        return BPETokenizer(path)
    raise CheckpointError(f"{path}: no tokenizer files (tokenizer.json, or vocab.json and merges.txt)")
