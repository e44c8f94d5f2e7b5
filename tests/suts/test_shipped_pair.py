"""Greedy speculative decoding on the shipped pair is token-identical to the baseline (held-out prompts),
one prompt at a time and in batches."""
from pathlib import Path

import pytest

from mlperf.data import load_prompts
from mlperf.tokenizer import ByteTokenizer
from suts.registry import build_sut
from suts.engine.sampling import SamplingParams
from suts.engine.scheduler import Scheduler, Sequence

MODELS = Path(__file__).resolve().parents[2] / "mlperf" / "assets" / "models"


@pytest.fixture(scope="module")
def prompts():
    tok = ByteTokenizer()
    return [tok.encode(p.text) for p in load_prompts()[:12]]  # few and short; `make accuracy` checks all 240


@pytest.fixture(scope="module")
def reference(prompts):
    baseline = build_sut("baseline", str(MODELS / "target"), weights="fp32")  # every SUT (fp16 by default) matches it
    return [baseline.generate(p, 64).tokens for p in prompts]


@pytest.mark.parametrize("name", ["spec", "spec-int8", "spec-self-int8", "ngram", "eagle"])
def test_speculative_suts_emit_the_baseline_tokens(name, prompts, reference):
    sut = build_sut(name, str(MODELS / "target"), str(MODELS / "draft"), gamma=4)
    accepted = drafted = 0
    for prompt, expected in zip(prompts, reference):
        result = sut.generate(prompt, 64)
        assert result.tokens == expected
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0.3 < accepted / drafted < 1.0


@pytest.mark.parametrize("name", ["baseline", "spec", "ngram", "eagle"])
def test_batched_decoding_emits_the_unbatched_baseline_tokens(name, prompts, reference):
    """Eight prompts of different lengths through max_batch 4: rows finish, and others join, mid-run."""
    sut = build_sut(name, str(MODELS / "target"), str(MODELS / "draft"), gamma=4)
    lengths = [64 - 7 * i for i in range(8)]
    seqs = [Sequence(p, n, SamplingParams()) for p, n in zip(prompts, lengths)]
    Scheduler(sut, 4).run(seqs)
    assert [s.tokens for s in seqs] == [r[:n] for r, n in zip(reference, lengths)]
    assert max(b for s in seqs for b in s.stats.batch_steps) == 4


def test_fp16_panels_stream_half_the_bytes_and_emit_the_fp32_paths_tokens(prompts, reference):
    """The shipped checkpoints store fp16 weights: by default (weights="fp16") the kernels stream them as stored and
    give the tokens the fp32 panels give (the reference above), greedy; the run record says so."""
    from scenarios.records import SUTInfo
    from suts.fast.packed import panel_bytes
    sut = build_sut("baseline", str(MODELS / "target"))
    assert panel_bytes(sut.target) == (2.0 if sut.target.fast_step else None)
    assert SUTInfo.of(sut, 1).weights == {"target": "fp16" if sut.target.fast_step else "fp32"}
    assert [sut.generate(p, 64).tokens for p in prompts[:6]] == reference[:6]


def test_an_int8_target_is_verified_exactly_against_itself(prompts):
    """--weights int8 quantises the target: not the fp32 baseline's tokens in general, but every speculative SUT
    over it emits exactly what the baseline over the same int8 target emits, and the record costs 1 byte a weight."""
    from scenarios.records import SUTInfo
    base = build_sut("baseline", str(MODELS / "target"), weights="int8")
    spec = build_sut("spec", str(MODELS / "target"), str(MODELS / "draft"), gamma=4, weights="int8")
    for prompt in prompts[:4]:
        assert spec.generate(prompt, 48).tokens == base.generate(prompt, 48).tokens
    assert SUTInfo.of(base, 1).target_weight_bytes == 1.0
