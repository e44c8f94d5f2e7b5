"""The per-phase profile: every operator lands in one kind, the shares add up, and the command prints it; a
compiled phase gives the eager logits, and a machine without torch.compile gets one line."""
import copy
from types import SimpleNamespace

import pytest
import torch

from commands.profile import print_compiled
from suts.drafting import GAMMA
from mlperf.checkpoint import load_model
from mlperf.cost import forward_cost, linear_params
from mlperf.model import GPTConfig
from roofline.peaks import roofline_s, rows_s
from roofline.profile import (COLUMNS, CONTEXT, DISPATCH, LINEAR_ROWS, OTHER, SHORT, CallTimer, against, compile_phase,
                              context_cost, decode_in_forwards, kind, linears_by_rows, matvec_streams, profile_pair,
                              row_costs, table)
from suts.fast.native import rows_kernel
from suts.registry import build_sut
from tests.helpers import fast_runner
from tests.helpers import peaky_model, python_m

PEAKS = {"flops_per_s": 1e11, "bytes_per_s": 1e10}


@pytest.mark.parametrize("op, expected", [("mkldnn::_linear_pointwise", "matmuls"), ("aten::addmm", "matmuls"),
                                          ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
                                          ("aten::native_layer_norm", "norms, GELU, adds"),
                                          ("aten::copy_", "cache writes, masks"), ("aten::as_strided",
                                                                                  "views, allocation"),
                                          ("aten::frobnicate", OTHER)])
def test_each_operator_has_one_kind(op, expected):
    assert kind(op) == expected


def test_a_pair_is_profiled_phase_by_phase(tiny_pair):
    target, draft = (load_model(tiny_pair / name) for name in ("target", "draft"))
    profiles = against(profile_pair(target, draft, 3), PEAKS)
    assert [p.name for p in profiles] == ["prefill", "decode", "verify (4 tokens)", "draft step"]
    for p in profiles:
        assert p.seconds > 0 and p.ideal_s > 0 and set(p.shares) == set(COLUMNS)
        assert sum(p.shares.values()) == pytest.approx(1.0) and p.shares["matmuls"] > 0
    assert profiles[2].ideal_s > profiles[1].ideal_s  # 4 tokens move more bytes than 1
    assert table(profiles).splitlines()[0].split()[:4] == ["phase", "ms", "roof", "ms"]
    assert DISPATCH in table(profiles)
    streams = matvec_streams(target)
    kernels = {"F.linear", "oneDNN packed", "plain read"} | ({"small-row kernel"} if rows_kernel() else set())
    assert kernels == set(streams)
    assert all(bps > 0 for bps in streams.values())



@pytest.mark.skipif(rows_kernel() is None, reason="no C compiler: no fp16 panels")
def test_each_phase_is_costed_at_the_bytes_its_weights_stream():
    """fp16 panels (`profile --weights fp16`) stream half the fp32 panels' bytes of every linear weight."""
    config = GPTConfig(n_layer=1, n_head=6, n_embd=384, vocab_size=256, block_size=512)  # layers the kernels pack
    model = peaky_model(config, 0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())  # fp16 numbers, as our checkpoints store them
    full, half = (profile_pair(fast_runner(copy.deepcopy(model), weights=w), None, 3) for w in ("fp32", "fp16"))
    for f, h in zip(full, half):  # the blocks' linears and the head, 4 bytes a weight -> 2
        assert f.cost.weight_bytes - h.cost.weight_bytes == 2 * linear_params(config), f.name

def test_what_the_context_adds_is_timed_and_costed_between_two_contexts(tiny_pair):
    target = load_model(tiny_pair / "target")
    _, ideal = context_cost(target, 4, PEAKS)  # the measured part: how large depends on the machine
    assert ideal == roofline_s(forward_cost(target.config, CONTEXT, 4), PEAKS) - roofline_s(
        forward_cost(target.config, SHORT, 4), PEAKS) and ideal > 0  # 248 more keys to read and attend over


def test_a_rows_cost_is_timed_and_costed_at_each_batch(tiny_pair):
    target = load_model(tiny_pair / "target")
    t = row_costs(target, 3, (1, 2, 4), PEAKS, rounds=3)
    assert list(t.index) == [1, 2, 4] and (t["ms"] > 0).all()
    assert t["+ms a row"].isna().tolist() == [True, False, False]  # a first row adds nothing to itself
    roof = [rows_s(forward_cost(target.config, CONTEXT, 3, batch=b), PEAKS) for b in (1, 2, 4)]
    assert t["roof +ms a row"].iloc[2] == pytest.approx(1e3 * (roof[2] - roof[0]) / 3)
    assert t["roof +ms a row"].iloc[1] > 0  # each row reads its own KV cache
    beyond = (t["+ms a row"] - t["roof +ms a row"]).iloc[1:]
    assert t["beyond the roof"].iloc[1:].tolist() == pytest.approx(beyond.tolist())


def test_the_profile_command_prints_every_phase_and_the_suts_steps(tiny_pair, tmp_path):
    proc = python_m("mlperf", "profile", "--target", tiny_pair / "target", "--draft", tiny_pair / "draft",
                    "--max-new-tokens", "8", cwd=tmp_path)  # its peaks cached in tmp_path/results, not ours
    assert proc.returncode == 0, proc.stderr[-2000:]
    for line in ("prefill", "decode", f"verify ({GAMMA + 1} tokens)", "draft step",
                 "one row through the target's linear", "baseline decode step in the SUT", "spec cycle in the SUT",
                 "a step's bookkeeping in tensors", "the draft's chain of", "of it in its forwards",
                 f"the decode step at context {CONTEXT}, 1000 times in a row", f"what {CONTEXT - SHORT} more keys add",
                 f"a batch's greedy step at context {CONTEXT}, by rows", "fast path: kernels ",
                 "baseline's target ", "spec's draft "):
        assert line in proc.stdout
    bad = python_m("mlperf", "profile", "--gamma", "0")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: gamma must be a positive integer, got 0"
    bad = python_m("mlperf", "profile", "--weights", "fp8")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: unknown weights 'fp8'; choose one of fp32, fp16, int8"


@pytest.mark.skipif(rows_kernel() is None, reason="no C compiler: no fused forwards to time")
@pytest.mark.parametrize("name", ["baseline", "spec"])
def test_a_runs_steps_are_split_into_its_forwards_and_the_python_around_them(tiny_pair, name):
    sut = build_sut(name, str(tiny_pair / "target"), str(tiny_pair / "draft"), gamma=6)  # 23 tokens: 1 + 6 a cycle
    stats, inside, calls = decode_in_forwards(sut, list(range(1, 40)), 24)
    stepped = stats.decode_s if name == "baseline" else stats.draft_s + stats.verify_s
    # the forwards are part of the steps one call a decode step, or a draft chain and a verify pass a cycle: the
    # prefill's, before the first token, not
    assert 0 < inside < stepped
    assert calls == (stats.steps if name == "baseline" else 2 * stats.cycles)
    assert not any(isinstance(m.fast_step.kernel, CallTimer) for m in sut.runners())  # the libraries put back
    plain = build_sut(name, str(tiny_pair / "target"), str(tiny_pair / "draft"), fast=False)
    assert decode_in_forwards(plain, list(range(1, 40)), 4)[1:] == (None, 0)  # no one call to time off the fast path


def test_a_compiled_phase_gives_the_eager_logits(tiny_pair):
    plain = load_model(tiny_pair / "target")
    c = compile_phase("decode", load_model(tiny_pair / "target"), plain, 16, 1)
    assert c.eager_s > 0 and c.compiled_s > 0 and c.compile_s > 0
    assert c.max_diff < 1e-4  # the same arithmetic in another kernel's order: equal within float32 rounding


def test_without_torch_compile_the_profile_says_so_in_one_line(tiny_pair, monkeypatch, capsys):
    def unavailable(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nmore detail")
    monkeypatch.setattr(torch, "compile", unavailable)
    target, draft = (load_model(tiny_pair / name) for name in ("target", "draft"))
    print_compiled(SimpleNamespace(target=target, draft=draft), target, draft, 3)
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["  torch.compile is unavailable here (RuntimeError: no C++ compiler found)"]


def test_the_linears_by_rows_are_timed_at_every_row_count_against_the_longer_roof(tiny_pair):
    """Every row count a verify pass may have, each timed with its fraction of the roof."""
    if rows_kernel() is None:
        pytest.skip("the small-row kernel does not build here")
    by_rows = linears_by_rows(load_model(tiny_pair / "target"), True, PEAKS)
    assert list(by_rows) == list(LINEAR_ROWS)
    assert all(seconds > 0 and fraction > 0 for seconds, fraction in by_rows.values())
