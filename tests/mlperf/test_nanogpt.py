"""nanoGPT's own files: ckpt.pt (with and without biases, with and without torch.compile's prefix), meta.pkl,
and prompts cut from val.bin."""
import pickle

import numpy as np
import pytest
import torch

from mlperf.checkpoint import CheckpointError, fingerprint, load_model, read_config
from mlperf.data import Prompt, load_prompts
from mlperf.data import main as data_main
from mlperf.model import GPT, GPTConfig
from mlperf.tokenizer import CharTokenizer, load_tokenizer
from training.train import main as train_main
from mlperf.cost import forward_cost
from scenarios.qsl import QSL
from suts.speculative import Speculative
from tests.helpers import FP32_ATOL, python_m

torch.set_grad_enabled(False)
CHARS = sorted(set("def f(x):\n    return x + 1\n"))


def nanogpt_checkpoint(path, bias=True, compiled=False, vocab_size=len(CHARS), n_layer=2, n_embd=16, **override):
    """A ckpt.pt laid out as nanoGPT's train.py writes it, a meta.pkl beside it, and its model."""
    torch.manual_seed(0)
    model_args = {"n_layer": n_layer, "n_head": 2, "n_embd": n_embd, "block_size": 64, "bias": bias,
                  "vocab_size": vocab_size}
    model = GPT(GPTConfig(**model_args)).eval()
    state = {("_orig_mod." if compiled else "") + k: v for k, v in model.state_dict().items()}
    model_args = {**model_args, "dropout": 0.0, **override}
    path.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state, "optimizer": {"state": {}, "param_groups": []}, "model_args": model_args,
                "iter_num": 100, "best_val_loss": torch.tensor(1.5), "config": {"dataset": "tiny"}}, path / "ckpt.pt")
    with open(path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(CHARS), "itos": dict(enumerate(CHARS)),
                     "stoi": {c: i for i, c in enumerate(CHARS)}}, f)
    return model


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("compiled", [False, True])
def test_a_nanogpt_checkpoint_loads_with_the_same_logits(tmp_path, bias, compiled):
    original = nanogpt_checkpoint(tmp_path / "out", bias=bias, compiled=compiled)
    for path in (tmp_path / "out", tmp_path / "out" / "ckpt.pt"):  # the out-dir or the file itself
        config, kind = read_config(path)
        assert kind == "nanogpt" and config.bias == bias
        loaded = load_model(path)
        x = torch.randint(0, len(CHARS), (2, 20))
        assert torch.allclose(loaded(x).logits, original(x).logits, atol=FP32_ATOL)
    assert (loaded.transformer.h[0].attn.c_attn.bias is not None) == bias
    assert (loaded.transformer.ln_f.bias is not None) == bias
    assert fingerprint(tmp_path / "out") == fingerprint(tmp_path / "out" / "ckpt.pt")  # the file's own bytes


def test_the_char_tokenizer_round_trips_and_names_unknown_characters(tmp_path):
    nanogpt_checkpoint(tmp_path / "out")
    tok = load_tokenizer(tmp_path / "out")
    assert isinstance(tok, CharTokenizer) and tok.decode(tok.encode("def f(x):")) == "def f(x):"
    with pytest.raises(ValueError, match="character 'z' is not in the model's character vocabulary"):
        tok.encode("fuzz")
    prompts = [Prompt(id=3, source="a.py", offset=0, text="def f(x):"),
               Prompt(id=7, source="b.py", offset=0, text="x + z")]
    with pytest.raises(ValueError, match=r"prompt 7 \(b.py\): character 'z' is not in"):
        QSL(prompts, tok, context=64, max_new_tokens=8)


def test_the_tokenizer_can_be_named_when_it_is_not_beside_the_checkpoint(tmp_path):
    nanogpt_checkpoint(tmp_path / "out")
    (tmp_path / "data").mkdir()
    (tmp_path / "out" / "meta.pkl").rename(tmp_path / "data" / "meta.pkl")
    with pytest.raises(CheckpointError, match="no tokenizer found"):
        load_tokenizer(tmp_path / "out")
    for given in (tmp_path / "data", tmp_path / "data" / "meta.pkl"):  # the dataset directory, or the file
        assert load_tokenizer(tmp_path / "out", given).encode("def") == [CHARS.index(c) for c in "def"]


def test_a_meta_pkl_that_names_code_is_refused(tmp_path):
    nanogpt_checkpoint(tmp_path / "out")
    with open(tmp_path / "out" / "meta.pkl", "wb") as f:
        pickle.dump({"stoi": {}, "itos": {}, "hook": print}, f)  # a reference to a function
    with pytest.raises(CheckpointError, match="refusing to load builtins.print"):
        load_tokenizer(tmp_path / "out")


def edit_args(path, **changes):
    """Rewrite a saved checkpoint's model_args (None deletes a key)."""
    ckpt = torch.load(path / "ckpt.pt", weights_only=True)
    for key, value in changes.items():
        if value is None:
            del ckpt["model_args"][key]
        else:
            ckpt["model_args"][key] = value
    torch.save(ckpt, path / "ckpt.pt")


@pytest.mark.parametrize("damage, message", [
    (lambda p: edit_args(p, n_embd=None), "model_args lacks n_embd"),
    (lambda p: edit_args(p, n_embd=32), "config does not match weights"),
    (lambda p: edit_args(p, bias=False), "unexpected tensors"),
    (lambda p: (p / "ckpt.pt").write_bytes(b"not a checkpoint"), "not a loadable nanoGPT checkpoint"),
])
def test_malformed_checkpoints_are_one_line_errors(tmp_path, damage, message):
    nanogpt_checkpoint(tmp_path / "out")
    damage(tmp_path / "out")
    with pytest.raises(CheckpointError, match=message) as e:
        load_model(tmp_path / "out")
    assert "\n" not in str(e.value) and str(tmp_path / "out") in str(e.value)


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    nanogpt_checkpoint(tmp_path / "t")
    nanogpt_checkpoint(tmp_path / "d", vocab_size=len(CHARS) + 5)
    with pytest.raises(ValueError, match=r"draft vocab \(20\) does not match target vocab \(15\)"):
        Speculative(load_model(tmp_path / "t"), load_model(tmp_path / "d"))


def test_prompts_are_cut_from_a_nanogpt_datasets_val_bin(tmp_path):
    nanogpt_checkpoint(tmp_path / "data")  # writes meta.pkl there
    tok = load_tokenizer(tmp_path / "data")
    text = "def f(x):\n    return x + 1\n" * 40
    np.array(tok.encode(text), dtype=np.uint16).tofile(tmp_path / "data" / "val.bin")
    assert data_main(["--from", str(tmp_path / "data"), "--count", "5"]) == 0
    prompts = load_prompts(tmp_path / "data" / "prompts.jsonl")
    assert len(prompts) == 5 and all(p.text in text and p.text.startswith(("def", "    ")) for p in prompts)
    assert prompts == load_prompts(tmp_path / "data" / "prompts.jsonl")  # what the QSL reads


def test_a_dataset_without_val_bin_or_vocabulary_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert data_main(["--from", str(tmp_path / "empty")]) == 1
    assert "no tokenizer found (meta.pkl" in capsys.readouterr().err
    nanogpt_checkpoint(tmp_path / "data")
    assert data_main(["--from", str(tmp_path / "data")]) == 1
    assert "no val.bin" in capsys.readouterr().err


def test_a_draft_trained_like_a_nanogpt_target_runs_spec_losslessly_through_loadgen(tmp_path):
    """The two commands of the README's "Your own nanoGPT model", on a tiny target and dataset."""
    nanogpt_checkpoint(tmp_path / "out", n_layer=3, n_embd=64)
    tok = load_tokenizer(tmp_path / "out")
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.pkl").write_bytes((tmp_path / "out" / "meta.pkl").read_bytes())
    text = "def f(x):\n    return x + 1\n" * 200
    for split in ("train", "val"):
        np.array(tok.encode(text), dtype=np.uint16).tofile(data / f"{split}.bin")
    assert train_main(["draft", "--like", str(tmp_path / "out"), "--data", str(data), "--steps", "3",
                       "--workdir", str(tmp_path / "work")]) == 0
    draft = tmp_path / "out-draft"  # beside the target, by default
    assert "draft --like" in (draft / "MODEL_CARD.md").read_text()
    target_cost, draft_cost = (forward_cost(read_config(p)[0], 32, 1).flops for p in (tmp_path / "out", draft))
    assert target_cost > 4 * draft_cost and read_config(draft)[0].vocab_size == len(CHARS)
    assert data_main(["--from", str(data), "--count", "6", "--min-tokens", "8", "--max-tokens", "40"]) == 0
    proc = python_m("mlperf", "run", "--sut", "spec", "--mode", "accuracy", "--target", tmp_path / "out",
                    "--draft", draft, "--tokenizer", data, "--prompts", data / "prompts.jsonl",
                    "--max-new-tokens", "12", "--results", tmp_path / "results")
    assert proc.returncode == 0 and "exact match vs baseline greedy: 1.0000" in proc.stdout, proc.stderr[-2000:]


def test_like_needs_a_dataset(tmp_path, capsys):
    nanogpt_checkpoint(tmp_path / "out")
    assert train_main(["draft", "--like", str(tmp_path / "out")]) == 1
    assert "--like trains a draft" in capsys.readouterr().err
    assert train_main(["draft", "--like", str(tmp_path / "out"), "--data", str(tmp_path)]) == 1
    assert "no train.bin or val.bin" in capsys.readouterr().err

