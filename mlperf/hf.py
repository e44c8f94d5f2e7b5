"""A model as a Hugging Face GPT-2 folder: `GPT2LMHeadModel`'s config and weights (every checkpoint we save is one,
mlperf.checkpoint.save_checkpoint) and a byte-level `tokenizer.json` that encodes and decodes as our ByteTokenizer
does, so that the clients and tools that want a Hugging Face model or tokenizer (AIPerf, GuideLLM, lm-eval,
`transformers`) read our models offline. The shipped target and draft folders carry the tokenizer's two files
(`write_tokenizer`), so a client or `transformers` is given the folder itself.
"""
import json
from pathlib import Path

from mlperf.checkpoint import load_model, read_meta, save_checkpoint
from mlperf.files import write_text
from mlperf.tokenizer import ByteTokenizer, load_tokenizer


def byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: byte b's printable stand-in, as its ByteLevel pre-tokenizer writes it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def byte_tokenizer():
    """Token b is byte b: a BPE of the 256 byte symbols and no merges, byte-level in and out, no special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE({s: b for b, s in enumerate(byte_symbols())}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def export(target: str, out: Path) -> Path:
    """`target` (ours, of either layout) as a Hugging Face GPT-2 folder at `out`, with its byte-level tokenizer."""
    model = load_model(target)
    if not isinstance(load_tokenizer(target), ByteTokenizer):
        raise ValueError(f"{target}: only a byte-level model's tokenizer is written; a Hugging Face or nanoGPT "
                         "checkpoint keeps its own")
    save_checkpoint(model, out, meta=read_meta(target))
    write_tokenizer(out, model.config.block_size)
    return out


def tokenizer_files(block_size: int) -> dict[str, str]:
    """The byte-level tokenizer as Hugging Face's files: tokenizer.json and tokenizer_config.json, by name."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
              "clean_up_tokenization_spaces": False, "add_prefix_space": False}
    return {"tokenizer.json": byte_tokenizer().to_str(pretty=True) + "\n",
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}


def write_tokenizer(out: Path, block_size: int) -> None:
    """The byte-level tokenizer's files into folder `out`, beside a model of context `block_size`."""
    for name, text in tokenizer_files(block_size).items():
        write_text(Path(out) / name, text)


def tokenizer_folder(target: str, tokenizer: str | None = None) -> str | None:
    """The folder a client loads the target's tokenizer from (AIPerf's --tokenizer, lm-eval's tokenizer=): the
    run's --tokenizer where it is a folder, else the target's where Hugging Face's files lie in it; None where no
    folder holds them (`python -m mlperf export --hf DIR` writes one)."""
    for folder in (tokenizer, target):
        if folder and Path(folder).is_dir() and any((Path(folder) / name).is_file()
                                                    for name in ("tokenizer.json", "vocab.json")):
            return str(folder)
    return None
