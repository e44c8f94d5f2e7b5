"""The accuracy checker's reference cache (the gate itself runs end to end in test_run)."""
import json

from scenarios.accuracy import reference_outputs
from scenarios.config import RunConfig
from suts.fast import native


def test_a_reference_cache_that_does_not_parse_is_rebuilt(tiny_pair, tmp_path, capsys):
    cfg = RunConfig(target=str(tiny_pair / "target"), max_new_tokens=4)
    prompts = [[1, 2, 3], [4, 5]]
    first = reference_outputs(cfg, prompts, tmp_path)
    (cached,) = tmp_path.glob("*.json")
    for corrupt in ("[[1, 2", json.dumps([[1, 2, 3, 4]]), json.dumps([None, [1]])):  # cut short, too few, wrong type
        cached.write_text(corrupt)
        assert reference_outputs(cfg, prompts, tmp_path) == first
        assert json.loads(cached.read_text()) == first
    assert "computing the baseline's reference outputs again" in capsys.readouterr().err


def test_another_version_of_the_kernels_computes_its_own_reference(tiny_pair, tmp_path, monkeypatch):
    """Every build of the C kernels sums alike, but another version of their source may not: its reference is
    computed again, beside the first."""
    cfg = RunConfig(target=str(tiny_pair / "target"), max_new_tokens=4)
    reference_outputs(cfg, [[1, 2, 3]], tmp_path)
    monkeypatch.setattr(native, "source_text", lambda: "another version")
    reference_outputs(cfg, [[1, 2, 3]], tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_the_gate_fails_a_sut_whose_answers_stop_too_early(tmp_path):
    """Tokens per sample outside 0.9-1.1x of the baseline's fail the gate on their own: a SUT that ends every answer
    at EOS halfway is named for it (a band widened to 0-10x would let it through, and this test would fail)."""
    import pytest
    import torch
    from mlperf.checkpoint import save_checkpoint
    from mlperf.model import GPTConfig
    from tests.helpers import FAST_CONF, peaky_model, run_cli
    ByteLevelBPETokenizer = pytest.importorskip("tokenizers.implementations").ByteLevelBPETokenizer
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["def f(x):\n    return x + 1\n" * 50], vocab_size=300, special_tokens=["<|endoftext|>"])
    (tmp_path / "bpe").mkdir()
    bpe.save_model(str(tmp_path / "bpe"))
    eos = bpe.token_to_id("<|endoftext|>")
    target = peaky_model(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=300, block_size=512), 0)
    with torch.no_grad():
        target.lm_head.weight[eos] = 0.0  # greedy never chooses EOS itself: the baseline's answers are full length
    save_checkpoint(target, tmp_path / "target", dtype=torch.float32)
    (tmp_path / "fast.conf").write_text(FAST_CONF)
    proc = run_cli(tmp_path, tmp_path / "results", "--sut", "tests.scenarios.faulty_suts:StopsEarly", "--tokenizer",
                   str(tmp_path / "bpe"), "--mode", "accuracy", samples=6, tokens=16, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.splitlines()[-1]
    assert "tokens per sample 8.0 outside 0.9-1.1x of the baseline's 16.0" in last, proc.stderr[-800:]
