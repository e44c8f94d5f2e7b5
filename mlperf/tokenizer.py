"""Tokenizers: bytes for the default pair, GPT-2 BPE (through the `tokenizers` library) for Hugging Face checkpoints."""
from pathlib import Path

from mlperf.checkpoint import CheckpointError, read_config


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


def load_tokenizer(path):
    """The tokenizer that belongs to a checkpoint directory."""
    path = Path(path)
    config, kind = read_config(path)
    if kind == "mlperf":
        if config.vocab_size != ByteTokenizer.vocab_size:
            raise CheckpointError(f"{path}: vocab {config.vocab_size} but our checkpoints use the byte tokenizer (256)")
        return ByteTokenizer()
    if (path / "tokenizer.json").is_file() or all((path / f).is_file() for f in ("vocab.json", "merges.txt")):
        return BPETokenizer(path)
    raise CheckpointError(f"{path}: no tokenizer files (tokenizer.json, or vocab.json and merges.txt)")
