"""llama.cpp's rows without building llama.cpp: the byte vocabulary's GGUF alphabet, the conversion (where the
source distribution is unpacked, as `make peers` leaves it), and the reading of its tools' outputs (fake tools)."""
import pytest
import torch

from commands import peers
from mlperf.checkpoint import save_checkpoint
from mlperf.model import GPT, GPTConfig


def test_the_byte_vocabulary_is_gpt2s_alphabet_in_byte_order():
    tokens = peers.byte_tokens()
    assert len(set(tokens)) == 256 and all(len(t) == 1 for t in tokens)
    assert tokens[ord("a")] == "a" and tokens[ord("~")] == "~" and tokens[ord(" ")] == "Ġ" and tokens[ord("\n")] == "Ċ"


@pytest.mark.skipif(not (peers.SOURCE / "gguf-py").is_dir(), reason="llama.cpp's source is unpacked by `make peers`")
@pytest.mark.parametrize("precision", peers.PRECISIONS)
def test_a_checkpoint_converts_to_llama_cpps_gpt2(tmp_path, monkeypatch, precision):
    monkeypatch.syspath_prepend(str(peers.SOURCE / "gguf-py"))
    from gguf import GGUFReader
    monkeypatch.setattr(peers, "HOME", tmp_path)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=256, block_size=64))
    save_checkpoint(model, tmp_path / "tiny", dtype=torch.float32)
    reader = GGUFReader(peers.convert(str(tmp_path / "tiny"), precision))
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 4 + 12 * 2 - 0 and "output.weight" not in tensors  # the LM head is the embedding's
    assert tensors["blk.1.attn_qkv.weight"].tensor_type.name == precision
    assert tensors["blk.1.attn_qkv.bias"].tensor_type.name == "F32"
    if precision == "F32":
        got = torch.from_numpy(tensors["blk.1.ffn_up.weight"].data.copy()).reshape(256, 64)
        assert torch.equal(got, model.transformer.h[1].mlp.c_fc.weight.detach())


def test_only_the_byte_vocabulary_converts(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "HOME", tmp_path)
    save_checkpoint(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=61, block_size=64)), tmp_path / "m")
    with pytest.raises(ValueError, match="byte vocabulary"):
        peers.convert(str(tmp_path / "m"), "F32")


def fake_tool(path, stdout: bytes, log: str, code: int = 0):
    path.write_text(f"#!/bin/sh\nprintf '{stdout.decode()}'\nprintf '%s' '{log}' >&2\nexit {code}\n")
    path.chmod(0o755)
    return path


def test_llama_cpps_outputs_and_own_timings_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "PLAIN", fake_tool(tmp_path / "plain", b"xyz", (
        "prompt eval time =      12.00 ms /    5 tokens\n"
        "       eval time =      20.00 ms /     2 runs   (10 ms per token)\n")))
    out = peers.generate(tmp_path / "m.gguf", list(b"abc"), 3, 1)
    assert out.tokens == list(b"xyz") and out.seconds == pytest.approx(0.032) and out.decoded == 2
    monkeypatch.setattr(peers, "SPECULATIVE", fake_tool(tmp_path / "spec", b"abcxyzw", (
        "encoded    3 tokens in    0.010 seconds\ndecoded    4 tokens in    0.020 seconds\n"
        "n_drafted = 6\nn_accept  = 3\n")))
    out = peers.generate(tmp_path / "m.gguf", list(b"abc"), 3, 1, draft=tmp_path / "d.gguf")
    assert out.tokens == list(b"xyz") and (out.drafted, out.accepted) == (6, 3) and out.seconds == pytest.approx(0.03)
    monkeypatch.setattr(peers, "PLAIN", fake_tool(tmp_path / "broken", b"", "error: unable to load model", 1))
    with pytest.raises(ValueError, match=r"llama.cpp failed \(broken, exit 1\): error: unable to load model"):
        peers.generate(tmp_path / "m.gguf", list(b"abc"), 3, 1)


@pytest.mark.skipif(not peers.SERVER.is_file(), reason="llama-server is built by `make peers`")
@pytest.mark.parametrize("sut", ["baseline", "spec"])
def test_llama_server_under_loadgen_answers_as_our_baseline_and_is_stopped_after(tmp_path, sut):
    """--engine llama-server at F32 on the shipped pair (whose text is whole characters: over a random model's
    bytes llama.cpp's stream loses ids, and such a run fails): accuracy mode passes the exact-match gate, plain
    or speculative, and no llama-server is left running."""
    import subprocess
    from tests.helpers import filed, python_m
    proc = python_m("mlperf", "run", "--engine", "llama-server", "--sut", sut, "--samples", "8",
                    "--max-new-tokens", "32", "--mode", "accuracy", "--results", tmp_path, timeout=600)
    assert proc.returncode == 0 and "ACCURACY PASS" in proc.stdout, proc.stderr[-2000:]
    assert filed(tmp_path, f"llama-server-{sut}", "SingleStream", "accuracy", "latest").is_dir()
    left = subprocess.run(["pgrep", "-f", str(peers.SERVER)], capture_output=True, text=True).stdout
    assert not left.strip()
