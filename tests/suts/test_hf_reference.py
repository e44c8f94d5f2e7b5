"""Cross-implementation check: our baseline's greedy tokens equal Hugging Face transformers' on the same weights."""
import pytest
import torch

from mlperf.data import load_prompts
from mlperf.hf import export
from suts.registry import build_sut
from tests.suts.test_shipped_pair import MODELS

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["target", "draft"])
def test_transformers_loads_the_shipped_folder_and_decodes_the_baselines_tokens(name, monkeypatch):
    """A shipped model folder as it is, read by transformers' Auto classes offline (its own default dtype): the
    shipped prompts tokenized by its AutoTokenizer, decoded greedily by AutoModelForCausalLM, give the baseline's
    tokens."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = MODELS / name
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    baseline = build_sut("baseline", str(folder))
    for prompt in [tok.encode(p.text) for p in load_prompts()[:3]]:
        with torch.inference_mode():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False, pad_token_id=0)
        assert baseline.generate(prompt, 48).tokens == expected[0, len(prompt):].tolist()


def test_an_exported_folder_reads_back_to_the_same_tokens(tmp_path):
    """`python -m mlperf export --hf` writes the folder again with the tokenizer's files; our loader reads it back."""
    folder = export(str(MODELS / "target"), tmp_path / "hf")
    baseline, read_back = build_sut("baseline", str(MODELS / "target")), build_sut("baseline", str(folder))
    prompt = list(load_prompts()[0].text.encode())
    assert read_back.generate(prompt, 48).tokens == baseline.generate(prompt, 48).tokens
