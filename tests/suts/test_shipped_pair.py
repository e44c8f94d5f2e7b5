"""Greedy speculative decoding on the shipped pair is token-identical to the baseline (held-out prompts)."""
from pathlib import Path

import pytest

from mlperf.data import load_prompts
from mlperf.tokenizer import ByteTokenizer
from suts.registry import build_sut

MODELS = Path(__file__).resolve().parents[2] / "mlperf" / "assets" / "models"


@pytest.fixture(scope="module")
def prompts():
    tok = ByteTokenizer()
    return [tok.encode(p.text) for p in load_prompts()[:24]]


@pytest.fixture(scope="module")
def reference(prompts):
    baseline = build_sut("baseline", str(MODELS / "target"))
    return [baseline.generate(p, 64).tokens for p in prompts]


@pytest.mark.parametrize("name", ["spec", "spec-int8", "spec-self-int8"])
def test_speculative_suts_emit_the_baseline_tokens(name, prompts, reference):
    sut = build_sut(name, str(MODELS / "target"), str(MODELS / "draft"), gamma=4)
    accepted = drafted = 0
    for prompt, expected in zip(prompts, reference):
        result = sut.generate(prompt, 64)
        assert result.tokens == expected
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0.3 < accepted / drafted < 1.0
