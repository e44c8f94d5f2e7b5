"""A model as a Hugging Face GPT-2 folder: `GPT2LMHeadModel`'s config and weights (mlperf.checkpoint.export_hf) and a
byte-level `tokenizer.json` that encodes and decodes as our ByteTokenizer does, so that the clients and tools that
want a Hugging Face tokenizer (AIPerf, GuideLLM, lm-eval, `transformers`) read our models offline."""
import json
from pathlib import Path

from mlperf.checkpoint import export_hf, load_model
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
    """`target` (ours) as a Hugging Face GPT-2 folder at `out`, with its byte-level tokenizer."""
    model = load_model(target)
    if not isinstance(load_tokenizer(target), ByteTokenizer):
        raise ValueError(f"{target}: only a byte-level model's tokenizer is written; a Hugging Face or nanoGPT "
                         "checkpoint keeps its own")
    export_hf(model, out)
    byte_tokenizer().save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model.config.block_size,
              "clean_up_tokenization_spaces": False, "add_prefix_space": False}
    write_text(out / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    return out
