"""Cross-implementation check: our baseline's greedy tokens equal Hugging Face transformers' on the same weights."""
import pytest
import torch

from mlperf.data import load_prompts
from mlperf.hf import export
from suts.registry import build_sut
from tests.suts.test_shipped_pair import MODELS

transformers = pytest.importorskip("transformers")


def test_greedy_tokens_equal_transformers_on_the_shipped_target(tmp_path, monkeypatch):
    """The shipped target as a Hugging Face folder (`python -m mlperf export --hf`), read by transformers' Auto
    classes offline: the shipped prompts tokenized by its AutoTokenizer, decoded greedily by AutoModelForCausalLM,
    give the baseline's tokens; and our loader reads the folder back to the same tokens."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = export(str(MODELS / "target"), tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    baseline, read_back = build_sut("baseline", str(MODELS / "target")), build_sut("baseline", str(folder))
    for prompt in [tok.encode(p.text) for p in load_prompts()[:3]]:
        with torch.inference_mode():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False, pad_token_id=0)
        assert baseline.generate(prompt, 48).tokens == expected[0, len(prompt):].tolist()
        assert read_back.generate(prompt, 48).tokens == expected[0, len(prompt):].tolist()
