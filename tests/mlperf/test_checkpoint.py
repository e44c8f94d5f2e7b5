import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from mlperf.checkpoint import CheckpointError, fingerprint, load_model, read_config, save_checkpoint
from mlperf.chunk import Chunk
from mlperf.model import GPTConfig
from tests.helpers import FP32_ATOL, cli_env

torch.set_grad_enabled(False)


@pytest.fixture
def saved(tiny_model, tmp_path):
    save_checkpoint(tiny_model, tmp_path / "ckpt", dtype=torch.float32, meta={"note": "test"})
    return tmp_path / "ckpt"


def test_round_trip_is_exact_in_fp32(tiny_model, saved):
    loaded = load_model(saved)
    assert loaded.config == tiny_model.config
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # still tied
    saved_weights, loaded_weights = tiny_model.state_dict(), loaded.state_dict()
    assert all(torch.equal(saved_weights[k], loaded_weights[k]) for k in saved_weights)  # bit for bit
    x = torch.randint(0, 61, (2, 16))
    # freshly allocated tensors may take other kernels
    assert torch.allclose(loaded(x).logits, tiny_model(x).logits, atol=FP32_ATOL)
    assert json.loads((saved / "config.json").read_text())["meta"] == {"note": "test"}


def test_loading_draws_no_random_weights_and_imports_no_compiler(saved):
    """The model is built on the meta device and the checkpoint's tensors take its tensors' places: nothing is
    drawn or allocated there first, since normal_ on meta tensors imports torch._dynamo and to_empty torch.fx's
    shape machinery, together about two seconds of every command's start (in a fresh process: this one may have
    imported both already)."""
    code = ("import sys; from mlperf.checkpoint import load_model; m = load_model(sys.argv[1]); "
            "print('torch._dynamo' in sys.modules, 'torch.fx.experimental.symbolic_shapes' in sys.modules, "
            "m.lm_head.weight is m.transformer.wte.weight, all(p.requires_grad for p in m.parameters()))")
    out = subprocess.run([sys.executable, "-c", code, str(saved)], env=cli_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "True", "True"]


def test_fp16_storage_loads_at_the_requested_dtype(tiny_model, tmp_path):
    save_checkpoint(tiny_model, tmp_path / "half")
    assert all(t.dtype == torch.float16 for t in load_file(tmp_path / "half" / "model.safetensors").values())
    loaded = load_model(tmp_path / "half", dtype=torch.float32)
    assert loaded.transformer.wte.weight.dtype == torch.float32
    x = torch.randint(0, 61, (1, 16))
    assert (loaded(x).logits - tiny_model(x).logits).abs().max() < 1e-2


def test_the_fingerprint_follows_the_weights_not_the_path_or_the_card(tiny_model, saved, tmp_path):
    copy = tmp_path / "copy"
    save_checkpoint(tiny_model, copy, dtype=torch.float32, meta={"note": "test"})
    (copy / "MODEL_CARD.md").write_text("# a card\n")
    assert fingerprint(copy) == fingerprint(saved)
    edit_tensors(copy, lambda t: t["ln_f.weight"].add_(1e-3))
    assert fingerprint(copy) != fingerprint(saved)
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        fingerprint(tmp_path / "nope")


def one_line_error(path, match):
    with pytest.raises(CheckpointError, match=match) as e:
        load_model(path)
    assert "\n" not in str(e.value)


def edit_config(path, **model):
    """Geometry edited in config.json as a user would, in our copy and in the Hugging Face one alike."""
    raw = json.loads((path / "config.json").read_text())
    raw["model"].update(model)
    hf_names = {"block_size": "n_positions"}
    raw.update({hf_names.get(k, k): v for k, v in model.items() if hf_names.get(k, k) in raw})
    (path / "config.json").write_text(json.dumps(raw))


def edit_tensors(path, fn):
    tensors = load_file(path / "model.safetensors")
    fn(tensors)
    save_file(tensors, path / "model.safetensors")


def test_missing_directory(tmp_path):
    one_line_error(tmp_path / "nope", "checkpoint not found")


def test_missing_config(saved):
    (saved / "config.json").unlink()
    one_line_error(saved, "no config.json")


def test_config_not_json(saved):
    (saved / "config.json").write_text("{not json")
    one_line_error(saved, "not valid JSON")


def test_config_of_unknown_kind(saved):
    (saved / "config.json").write_text('{"model_type": "llama"}')
    one_line_error(saved, "neither")


def test_bad_config_values(saved):
    edit_config(saved, n_head=3)
    one_line_error(saved, "bad model config.*divisible")


def test_missing_weights_file(saved):
    (saved / "model.safetensors").unlink()
    one_line_error(saved, "no weights file")


def test_truncated_weights_file(saved):
    data = (saved / "model.safetensors").read_bytes()
    (saved / "model.safetensors").write_bytes(data[: len(data) // 2])
    one_line_error(saved, "corrupt or truncated")


def test_garbage_weights_file(saved):
    (saved / "model.safetensors").write_bytes(b"\x00" * 64)
    one_line_error(saved, "corrupt or truncated")


def test_missing_tensor(saved):
    edit_tensors(saved, lambda t: t.pop("h.1.mlp.c_fc.bias"))
    one_line_error(saved, "missing tensors: transformer.h.1.mlp.c_fc.bias")


def test_unexpected_tensor(saved):
    edit_tensors(saved, lambda t: t.update(extra=torch.zeros(2)))
    one_line_error(saved, "unexpected tensors: transformer.extra")


def test_misshaped_tensor(saved):
    edit_tensors(saved, lambda t: t.update({"ln_f.weight": torch.zeros(31)}))
    one_line_error(saved, r"transformer.ln_f.weight has shape \(31,\), config implies \(32,\)")


def test_config_that_does_not_match_the_weights(saved):
    edit_config(saved, n_embd=64)
    one_line_error(saved, "does not match the geometry its weights were saved with: n_embd 64 \\(saved with 32\\)")
    edit_tensors(saved, lambda t: None)  # a weights file with no recorded geometry: the shapes still disagree
    one_line_error(saved, "config does not match weights")


def test_a_head_count_edited_after_saving_is_caught(saved):
    edit_config(saved, n_head=1)  # no tensor's shape depends on it
    one_line_error(saved, "n_head 1 \\(saved with 2\\)")


def test_a_hugging_face_key_edited_apart_from_ours_is_caught(saved):
    raw = json.loads((saved / "config.json").read_text())
    raw["n_head"] = 1  # what transformers would build, no longer our model
    (saved / "config.json").write_text(json.dumps(raw))
    one_line_error(saved, "its Hugging Face keys disagree with its model: n_head 1 \\(the model's 2\\)")


def test_a_config_with_layers_the_weights_lack_fails_before_building_them(saved):
    edit_tensors(saved, lambda t: None)
    edit_config(saved, n_layer=10_000_000)
    one_line_error(saved, "config has n_layer 10000000, the weights hold 2 layers")


@pytest.mark.parametrize("edit, match", [
    (lambda t: t["h.1.attn.c_attn.weight"].fill_(float("nan")), "c_attn.weight holds NaN or infinite"),
    (lambda t: t["wte.weight"].fill_(3e38), "logits are not finite in float32"),
])
def test_a_model_that_cannot_give_finite_logits_is_refused_at_load(saved, edit, match):
    edit_tensors(saved, edit)
    one_line_error(saved, match)


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=97, n_positions=48)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_hugging_face_parity(hf_model, tmp_path, safe):
    hf_model.save_pretrained(tmp_path, safe_serialization=safe)
    ours = load_model(tmp_path)
    assert read_config(tmp_path) == (GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=97, block_size=48), "hf")
    x = torch.randint(0, 97, (2, 40))
    expected = hf_model(x).logits
    assert (ours(x).logits - expected).abs().max() <= 1e-4
    cache = ours.new_cache(2)
    # token by token through the KV cache
    steps = torch.cat([ours(x[:, t:t + 1], Chunk(cache)).logits for t in range(40)], 1)
    assert (steps - expected).abs().max() <= 1e-4


def test_hugging_face_checkpoint_with_missing_tensor(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    edit_tensors(tmp_path, lambda t: t.pop(next(k for k in t if k.endswith("h.0.ln_1.weight"))))
    one_line_error(tmp_path, "missing tensors: transformer.h.0.ln_1.weight")


def test_a_hub_name_instead_of_a_folder_says_how_to_make_a_local_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder named gpt2 here
    with pytest.raises(CheckpointError, match="checkpoint not found: gpt2 is not a directory") as e:
        read_config("gpt2")
    assert "`huggingface-cli download openai-community/gpt2 --local-dir gpt2`" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_model_exported_as_a_hugging_face_folder_tokenizes_and_generates_as_ours(tiny_pair, tmp_path, monkeypatch):
    """`python -m mlperf export --hf DIR`: transformers' AutoTokenizer encodes and decodes every byte as our
    tokenizer does, offline, and AutoModelForCausalLM decodes the baseline's tokens greedily."""
    transformers = pytest.importorskip("transformers")
    from commands.cli import main
    from mlperf.tokenizer import ByteTokenizer
    from suts.registry import build_sut
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["export", "--hf", str(tmp_path / "hf"), "--target", str(tiny_pair / "target")]) == 0
    ours, theirs = ByteTokenizer(), transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "def f(x):\n\treturn x  # héllo wörld 🚀\r\n" + "".join(chr(c) for c in range(1, 0x800))
    assert theirs.encode(text) == ours.encode(text) and theirs.decode(ours.encode(text)) == text
    assert [theirs.decode([i]) for i in range(256)] == [ours.decode([i]) for i in range(256)]
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    baseline = build_sut("baseline", str(tiny_pair / "target"))
    for prompt in ("import os\n", "class A:\n    def f(self):"):
        ids = ours.encode(prompt)
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0)
        assert out[0, len(ids):].tolist() == baseline.generate(ids, 16).tokens
    assert read_config(tmp_path / "hf")[1] == "mlperf"  # and our loader reads the folder back
