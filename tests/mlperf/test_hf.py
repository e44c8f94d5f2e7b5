"""The shipped models as Hugging Face tokenizer folders: what AIPerf, GuideLLM, lm-eval and `transformers` load."""
import json

import pytest

from mlperf import MODELS
from mlperf.checkpoint import read_config
from mlperf.hf import tokenizer_files, tokenizer_folder
from mlperf.tokenizer import ByteTokenizer

TEXT = "def f(x):\n\treturn x  # héllo wörld 🚀\r\n" + "".join(chr(c) for c in range(1, 0x800))


@pytest.mark.parametrize("model", ["target", "draft"])
def test_a_shipped_folder_loads_offline_as_a_tokenizer_that_round_trips_every_byte(model, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = MODELS / model
    ours, theirs = ByteTokenizer(), transformers.AutoTokenizer.from_pretrained(folder)
    assert theirs.encode(TEXT) == ours.encode(TEXT) and theirs.decode(ours.encode(TEXT)) == TEXT
    assert [theirs.decode([i]) for i in range(256)] == [ours.decode([i]) for i in range(256)]
    assert theirs.model_max_length == read_config(folder)[0].block_size
    assert tokenizer_folder(str(folder)) == str(folder)


@pytest.mark.parametrize("model", ["target", "draft"])
def test_the_shipped_tokenizer_files_are_what_the_code_writes(model):
    """The committed files are `write_tokenizer`'s, read as JSON (their spacing is the tokenizers library's)."""
    folder = MODELS / model
    for name, text in tokenizer_files(read_config(folder)[0].block_size).items():
        assert json.loads((folder / name).read_text()) == json.loads(text), name


def test_a_folder_without_the_files_names_no_tokenizer(tmp_path):
    assert tokenizer_folder(str(tmp_path)) is None and tokenizer_folder(str(tmp_path / "none")) is None
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    assert tokenizer_folder(str(tmp_path), str(tmp_path / "tok")) == str(tmp_path / "tok")
