import pytest

from mlperf.checkpoint import CheckpointError, save_checkpoint
from mlperf.model import GPT, GPTConfig
from mlperf.tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer

TEXT = "def f(x):\n    return 'é' + x\n"


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert len(tok.encode(TEXT)) == len(TEXT.encode()) and max(tok.encode(TEXT)) < 256


def test_our_checkpoints_use_the_byte_tokenizer(tmp_path):
    save_checkpoint(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, vocab_size=256, block_size=16)), tmp_path)
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)


def test_a_larger_vocab_reads_bytes_and_a_smaller_one_needs_its_tokenizer(tmp_path):
    """A random GPT-2 geometry (vocab 50257) is fed bytes; ids past them decode as U+FFFD."""
    save_checkpoint(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, vocab_size=300, block_size=16)), tmp_path / "big")
    tok = load_tokenizer(tmp_path / "big")
    assert tok.decode([104, 105, 299]) == "hi\ufffd"
    save_checkpoint(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, vocab_size=100, block_size=16)), tmp_path / "small")
    with pytest.raises(CheckpointError, match="name its tokenizer"):
        load_tokenizer(tmp_path / "small")


@pytest.fixture
def hf_dir(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=300, n_positions=16).save_pretrained(tmp_path)
    return tmp_path


def test_gpt2_bpe_from_vocab_and_merges(hf_dir):
    from tokenizers.implementations import ByteLevelBPETokenizer
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([TEXT * 20, "return x"], vocab_size=300, special_tokens=["<|endoftext|>"])
    trainer.save_model(str(hf_dir))
    tok = load_tokenizer(hf_dir)
    assert isinstance(tok, BPETokenizer) and tok.eos_id is not None
    ids = tok.encode(TEXT)
    assert len(ids) < len(TEXT.encode()) and tok.decode(ids) == TEXT


def test_hf_directory_without_tokenizer_files(hf_dir):
    with pytest.raises(CheckpointError, match="no tokenizer found"):
        load_tokenizer(hf_dir)
