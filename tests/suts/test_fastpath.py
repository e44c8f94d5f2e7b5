import copy
import mmap
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from mlperf.model import GPTConfig
from suts.baseline import Baseline
from suts import fastpath
from suts.fastpath import PackedLinear, pack_linears
from suts import native
from suts.native import rows_kernel
from suts.threads import ROUNDS, ThreadPicker
from tests.helpers import FP32_ATOL, SMALL, peaky_model

needs_kernel = pytest.mark.skipif(rows_kernel() is None, reason="the small-row kernel does not build here")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("features", [(64, 96), (40, 37)])  # 37 outputs: a last panel of the kernel's part-empty
@pytest.mark.parametrize("gelu", [None, nn.GELU(approximate="tanh"), nn.GELU()])
def test_packed_linear_matches_linear(bias, features, gelu):
    torch.manual_seed(0)
    linear = nn.Linear(*features, bias=bias)
    packed, plain = PackedLinear(linear, gelu), nn.Sequential(linear, gelu or nn.Identity())
    k, n = features
    for shape in [(1, 1, k), (k,), (2, 1, k), (1, 5, k), (3, 4, k), (1, 13, k), (3, 7, k),  # small rows
                  (1, 100, k), (3, 30, k)]:  # oneDNN's, the GELU fused
        x = torch.randn(shape)
        y = packed(x)
        assert y.shape == (*shape[:-1], n) and torch.allclose(y, plain(x), atol=FP32_ATOL)


# Weights of 80 KB count as cached (one row takes 4 adjacent panels a pass, 2 or 3 rows 2; 13 panels, so one is left
# for the groups of rows, split evenly), of 614 KB as streamed (up to 4 rows take 2 panels half the layer apart; 25
# panels, so one is left for the groups of rows, the first a full one).
WEIGHTS = [(96, 200), (384, 400)]


@needs_kernel
@pytest.mark.parametrize("features", WEIGHTS)
def test_a_row_gets_the_same_result_whatever_rows_come_with_it(features):
    """What makes a verify pass's logits those of decode steps, bit for bit, as far as the linears go."""
    torch.manual_seed(0)
    packed = PackedLinear(nn.Linear(*features))
    x = torch.randn(packed.max_rows, features[0])
    alone = torch.cat([packed(x[i:i + 1]) for i in range(len(x))])
    for rows in range(2, packed.max_rows + 1):
        assert torch.equal(packed(x[:rows]), alone[:rows]), rows


@needs_kernel
@pytest.mark.parametrize("features", WEIGHTS)
def test_the_kernel_splits_its_work_between_threads_without_changing_it(features):
    torch.manual_seed(0)
    packed, x = PackedLinear(nn.Linear(*features)), torch.randn(5, features[0])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [packed(x[:1]), packed(x)]  # one row takes several panels a pass, five rows one
        torch.set_num_threads(2)
        assert torch.equal(packed(x[:1]), one[0]) and torch.equal(packed(x), one[1])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("env, line", [({"MLPERF_ROWS_KERNEL": "0"}, "MLPERF_ROWS_KERNEL=0"),
                                       ({"CC": "no-such-compiler"}, "no C compiler"),
                                       ({"CC": "false"}, "false could not compile kernels.c")])
def test_without_the_kernel_one_line_says_why(monkeypatch, capsys, tmp_path, env, line):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert rows_kernel.__wrapped__() is None
    err = capsys.readouterr().err
    assert line in err and "every forward runs through the modules" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*.so"))  # nothing half-built left behind


def test_the_kernel_is_compiled_once_per_source_compiler_cpu_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if rows_kernel.__wrapped__() is None:
        pytest.skip("the small-row kernel does not build here")
    built = list(tmp_path.rglob("rows-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert rows_kernel.__wrapped__() is not None and built[0].stat().st_mtime_ns == stamp
    monkeypatch.setattr(native, "FLAG_SETS", ([],))  # other flags: a library of their own, not the cached one
    assert rows_kernel.__wrapped__() is not None and len(list(tmp_path.rglob("rows-*.so"))) == 2


def test_only_large_layers_are_packed():
    model = peaky_model(SMALL, 0)
    pack_linears(model, min_weights=32 * 96)  # c_attn (96x32) and the MLP (128x32) qualify; c_proj (32x32) not
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if name.startswith("transformer.h.0.")}
    assert kinds["transformer.h.0.attn.c_attn"] == "PackedLinear"
    assert kinds["transformer.h.0.mlp.c_fc"] == "PackedLinear"
    assert kinds["transformer.h.0.attn.c_proj"] == "Linear"
    assert kinds["transformer.h.0.mlp.gelu"] == "Identity"  # taken over by c_fc
    assert model.transformer.h[0].mlp.c_fc.gelu.approximate == "tanh"


def test_packed_model_decodes_the_same_tokens():
    plain, packed = peaky_model(SMALL, 0), pack_linears(peaky_model(SMALL, 0), min_weights=0)
    assert not any(type(m) is nn.Linear for m in packed.modules())
    for prompt in ([1, 2, 3], list(range(30)), [t % 32 for t in range(90)]):  # the last prefilled by oneDNN
        assert Baseline(packed).generate(prompt, 30).tokens == Baseline(plain).generate(prompt, 30).tokens


def test_half_precision_models_are_left_alone():
    model = peaky_model(SMALL, 0).half()
    pack_linears(model, min_weights=0)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


@needs_kernel
def test_the_modules_read_the_fused_steps_own_copy_of_the_panels():
    model = pack_linears(peaky_model(SMALL, 0), min_weights=0)
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    fused = {t.data_ptr() for t in model.fused.tensors if t is not None}
    assert packed and all(m.panels.data_ptr() in fused for m in packed)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # one buffer, in the order a forward reads them
        starts = [m.panels.data_ptr() for m in packed]
        assert len({m.panels.untyped_storage().data_ptr() for m in packed}) == 1 and starts == sorted(starts)


@needs_kernel
def test_the_fused_step_knows_where_its_weights_lie_end_to_end(monkeypatch):
    """What a chain asks the caches for before its first step: the panels' one buffer, or nothing where they are
    not in one (no huge_pages: the tensors themselves)."""
    model = pack_linears(peaky_model(SMALL, 0), min_weights=0)
    packed = [m.panels for m in model.modules() if isinstance(m, PackedLinear)]
    if hasattr(mmap, "MADV_HUGEPAGE"):
        end = packed[-1].data_ptr() + packed[-1].numel() * packed[-1].element_size()
        assert (model.fused.model.weights, model.fused.model.weights_bytes) == (packed[0].data_ptr(),
                                                                                end - packed[0].data_ptr())
    monkeypatch.setattr(fastpath, "huge_pages", lambda tensors: [t.clone() for t in tensors])
    apart = pack_linears(peaky_model(SMALL, 0), min_weights=0)
    assert (apart.fused.model.weights, apart.fused.model.weights_bytes) == (None, 0)


ODD = replace(SMALL, n_embd=72)  # rows of 4 vectors of 16 and a part of one, heads of 4 vectors of 8 and a part


def fused_pair(seed: int = 0, config: GPTConfig = SMALL):
    """A random model on the fast path (fused step on) and the same model as plain modules."""
    model = pack_linears(peaky_model(config, seed), min_weights=0)
    if model.fused is None:
        pytest.skip("the kernels do not build here")
    return model, peaky_model(config, seed)


def prefilled(model, lengths: list[int]):
    cache = model.new_cache(len(lengths))
    with torch.inference_mode():
        model(torch.arange(max(lengths))[None].repeat(len(lengths), 1) % SMALL.vocab_size, cache)
    cache.lengths[:] = torch.tensor(lengths)
    return cache


@pytest.mark.parametrize("T, last_only, config", [(1, True, SMALL), (1, False, SMALL), (5, False, SMALL),
                                                   (4, True, SMALL), (5, False, ODD)],
                         ids=["1 last", "1", "5", "4 last", "5 odd width"])
def test_the_fused_step_computes_what_the_modules_do(T, last_only, config):
    fused, plain = fused_pair(config=config)
    caches = [prefilled(m, [30, 17]) for m in (fused, plain)]
    x = torch.randint(0, SMALL.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        (a, fa), (b, fb) = (m(x, c, last_only=last_only, features=not last_only) if not last_only else
                            (m(x, c, last_only=True), None) for m, c in zip((fused, plain), caches))
    assert a.shape == b.shape and torch.allclose(a, b, atol=FP32_ATOL)
    assert fa is None or torch.allclose(fa, fb, atol=FP32_ATOL)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [30 + T, 17 + T]
    for k in ("k", "v"):  # each row's new keys and values, in its own slots
        new = [getattr(c, k)[:, :, :, :30 + T] for c in caches]
        assert torch.allclose(new[0][:, 0], new[1][:, 0], atol=FP32_ATOL)
        assert torch.allclose(new[0][:, 1, :, :17 + T], new[1][:, 1, :, :17 + T], atol=FP32_ATOL)


def test_a_packed_chunk_of_rows_with_their_own_counts_is_fused_too():
    fused, plain = fused_pair()
    caches = [prefilled(m, [30, 17, 5]) for m in (fused, plain)]
    x = torch.tensor([[3, 4, 5, 6, 7, 8]])
    with torch.inference_mode():
        a, b = (m(x, c, last_only=True, lens=[2, 1, 3]) for m, c in zip((fused, plain), caches))
    assert a.shape == b.shape == (3, 1, SMALL.vocab_size) and torch.allclose(a, b, atol=FP32_ATOL)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [32, 18, 8]


def test_a_verify_pass_gives_each_position_the_logits_its_decode_step_gives_bit_for_bit():
    """Why a speculative SUT on the fast path is token-identical to the baseline by construction at batch 1."""
    fused, _ = fused_pair()
    tokens = torch.tensor([[5, 9, 2, 7, 1]])
    steps, chunk = prefilled(fused, [20]), prefilled(fused, [20])
    with torch.inference_mode():
        one_by_one = torch.cat([fused(tokens[:, i:i + 1], steps) for i in range(5)], dim=1)
        assert torch.equal(fused(tokens, chunk), one_by_one)


@pytest.mark.parametrize("last_only", [False, True])
def test_a_chunk_of_many_rows_is_fused_in_groups_of_rows(last_only):
    """20 rows of 5 tokens: more than the kernel's 64 rows, in groups of 12 rows a call."""
    fused, plain = fused_pair()
    lengths = [3 + 4 * b for b in range(20)]
    caches = [prefilled(m, lengths) for m in (fused, plain)]
    x = torch.randint(0, SMALL.vocab_size, (20, 5), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        a, b = (m(x, c, last_only=last_only) for m, c in zip((fused, plain), caches))
    assert a.shape == b.shape == (20, 1 if last_only else 5, SMALL.vocab_size) and torch.allclose(a, b, atol=FP32_ATOL)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [n + 5 for n in lengths]
    for row, n in enumerate(lengths):
        assert torch.allclose(caches[0].v[:, row, :, :n + 5], caches[1].v[:, row, :, :n + 5], atol=FP32_ATOL)
    bad = x.clone()
    bad[-1, -1] = SMALL.vocab_size  # in the last group: found before the first group is written
    with torch.inference_mode(), pytest.raises(IndexError):
        fused(bad, caches[0])
    assert caches[0].lengths.tolist() == [n + 5 for n in lengths]


@pytest.mark.parametrize("last_only", [False, True])
def test_a_long_packed_chunk_is_fused_in_pieces_that_change_nothing(last_only):
    """A prefill of rows of 70, 3 and 100 tokens: more than the kernel's 64, in pieces that split rows. Every token
    gets, bit for bit, what it gets in short chunks of its own row (a chunked prefill), and the modules' result."""
    fused, plain = fused_pair()
    starts, lens = [3, 0, 10], [70, 3, 100]
    x = torch.randint(0, SMALL.vocab_size, (1, sum(lens)), generator=torch.Generator().manual_seed(4))
    pieces, short, modules = prefilled(fused, starts), prefilled(fused, starts), prefilled(plain, starts)
    features = not last_only
    with torch.inference_mode():
        a, b = (m(x, c, last_only=last_only, features=features, lens=lens) for m, c in ((fused, pieces),
                                                                                       (plain, modules)))
        rows = [torch.split(r, 7, dim=1) for r in torch.split(x, lens, dim=1)]
        outs = [[fused(t, short.rows(i, i + 1), last_only=last_only, features=features) for t in r]
                for i, r in enumerate(rows)]
    c = torch.cat([o[-1] for o in outs]) if last_only else \
        tuple(torch.cat([t[j] for o in outs for t in o], dim=1) for j in (0, 1))  # logits, features
    for got, in_short_chunks, by_modules in zip(a, c, b) if features else [(a, c, b)]:
        assert got.shape == by_modules.shape and torch.equal(got, in_short_chunks)
        assert torch.allclose(got, by_modules, atol=FP32_ATOL)
    assert pieces.lengths.tolist() == short.lengths.tolist() == [s + n for s, n in zip(starts, lens)]
    assert torch.equal(pieces.k, short.k) and torch.equal(pieces.v, short.v)
    bad = x.clone()
    bad[0, -1] = SMALL.vocab_size  # in the last piece: found before the first piece is written
    cache = prefilled(fused, starts)
    with torch.inference_mode(), pytest.raises(IndexError):
        fused(bad, cache, lens=lens)
    assert cache.lengths.tolist() == starts


def test_what_the_fused_step_does_not_take_runs_through_the_modules():
    fused, plain = fused_pair()
    many = torch.randint(0, SMALL.vocab_size, (2, 70))  # 2 rows of 70 tokens, not packed: more than its rows
    caches = [prefilled(m, [3, 5]) for m in (fused, plain)]
    with torch.inference_mode():
        assert torch.allclose(fused(many, caches[0]), plain(many, caches[1]), atol=FP32_ATOL)
        bad, long = prefilled(fused, [3]), prefilled(fused, [SMALL.block_size - 1])
        with pytest.raises(IndexError):  # a token id outside the vocabulary: the modules' own error
            fused(torch.tensor([[SMALL.vocab_size]]), bad)
        with pytest.raises(ValueError, match="exceeds the model's context"):
            fused(torch.tensor([[1, 2]]), long)
    assert bad.lengths.tolist() == [3] and long.lengths.tolist() == [SMALL.block_size - 1]  # the kernel wrote nothing


def test_an_int8_model_is_fused_with_its_int8_weights():
    """Weight-only int8 (suts/quantize.py's weights and scales, the activations left in float): the same logits
    as a float model holding the dequantised weights."""
    from suts.quantize import int8_per_channel, quantize_int8
    fused = pack_linears(quantize_int8(peaky_model(SMALL, 0)), min_weights=0)
    if fused.fused is None:
        pytest.skip("the kernels do not build here")
    plain = peaky_model(SMALL, 0)
    for m in [m for m in plain.modules() if isinstance(m, nn.Linear)]:
        q, scale = int8_per_channel(m.weight)
        m.weight = nn.Parameter(q.float() * scale[:, None])  # the LM head's too, untied from the embeddings
    caches = [prefilled(m, [20, 11]) for m in (fused, plain)]
    x = torch.tensor([[4, 5, 6], [7, 8, 9]])
    with torch.inference_mode():
        a, b = (m(x, c) for m, c in zip((fused, plain), caches))
    assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("lengths", [[30, 30], [30, 17], [30, 17] * 6])  # 12 rows: 84 nodes, in two groups
@pytest.mark.parametrize("chunk", [7, 4])  # the whole tree, or its last nodes after the first were written
def test_a_token_tree_is_fused_with_its_mask_and_depths(lengths, chunk):
    from mlperf.cache import TreeMask
    fused, plain = fused_pair()
    tree = TreeMask.of([-1, 0, 0, 1, 1, 2, 3])
    caches = [prefilled(m, lengths) for m in (fused, plain)]
    nodes = torch.randint(0, SMALL.vocab_size, (len(lengths), 7), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        if chunk < 7:
            for m, c in zip((fused, plain), caches):
                m(nodes[:, :7 - chunk], c, tree=tree.prefix(7 - chunk))
        a, b = (m(nodes[:, 7 - chunk:], c, tree=tree) for m, c in zip((fused, plain), caches))
    assert a.shape == b.shape == (len(lengths), chunk, SMALL.vocab_size) and torch.allclose(a, b, atol=FP32_ATOL)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [n + 7 for n in lengths]


@pytest.mark.parametrize("lens", [None, [2, 1]])
def test_an_eagle_head_is_fused_too(lens):
    from dataclasses import replace
    from mlperf.model import EagleHead
    target = peaky_model(SMALL, 0)
    torch.manual_seed(3)
    plain = EagleHead(replace(SMALL, n_layer=1))
    fused = pack_linears(copy.deepcopy(plain), min_weights=0)
    if fused.fused is None:
        pytest.skip("the kernels do not build here")
    caches = [m.new_cache(2) for m in (fused, plain)]
    for c in caches:
        c.lengths[:] = torch.tensor([9, 4])
    tokens = torch.tensor([[3, 4, 5]]) if lens else torch.tensor([[3, 4], [5, 6]])
    features = torch.randn(*tokens.shape, SMALL.n_embd)
    with torch.inference_mode():
        a, b = (m(features, tokens, target, c, lens=lens) for m, c in zip((fused, plain), caches))
    assert a.shape == b.shape and torch.allclose(a, b, atol=FP32_ATOL)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist()


@pytest.mark.parametrize("lens", [[1], [3, 1, 2]])
def test_greedy_drafting_in_one_call_takes_the_tokens_a_loop_of_steps_takes(lens):
    """GPT.greedy on the fast path (kernels.c's `chain`: argmaxes fed back inside C) against the modules' loop."""
    fused, plain = fused_pair()
    caches = [prefilled(m, [30, 17, 5][:len(lens)]) for m in (fused, plain)]
    ids = [3, 4, 5, 6, 7, 8][:sum(lens)]
    with torch.inference_mode():
        a, b = (m.greedy(ids, c, lens, 4) for m, c in zip((fused, plain), caches))
    assert a == b and len(a) == len(lens) and all(len(row) == 4 for row in a)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [n + k + 3 for n, k in zip([30, 17, 5], lens)]
    ends = caches[0].lengths.tolist()
    for row, end in enumerate(ends):  # every step's keys, in the row's own slots
        assert torch.allclose(caches[0].k[:, row, :, :end], caches[1].k[:, row, :, :end], atol=FP32_ATOL)


@pytest.mark.parametrize("tree", [False, True])
def test_a_greedy_verify_pass_takes_every_tokens_argmax_in_one_call(tree):
    """GPT.argmaxes on the fast path (kernels.c's `chain` with every token's outputs: no logits tensor) against the
    argmax of the same forward's logits, for 3 rows of 7 tokens (a chain's verify pass) or 7 nodes (a tree's)."""
    from mlperf.cache import TreeMask
    fused, _ = fused_pair()
    shape = TreeMask.of([-1, 0, 0, 1, 1, 2, 3]) if tree else None
    caches = [prefilled(fused, [30, 17, 5]) for _ in range(2)]
    ids = torch.randint(0, SMALL.vocab_size, (3, 7), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        got, logits = fused.argmaxes(ids.tolist(), caches[0], shape), fused(ids, caches[1], tree=shape)
    assert got == logits.argmax(-1).tolist() and len(set(map(tuple, got))) == 3  # the rows' own, each
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [37, 24, 12]


def test_a_prepared_call_serves_its_own_cache_and_outputs_are_never_shared():
    """A call's arguments are built once per shape and cache (FusedStep.prepare): two caches in turn each get
    their own rows, the same shape against one cache reuses them, and logits a call returned stay as they were."""
    fused, plain = fused_pair()
    pairs = [(prefilled(fused, lengths), prefilled(plain, lengths)) for lengths in ([30, 17], [9, 21])]
    kept, before = [], len(fused.fused.calls)  # the prefills' own
    with torch.inference_mode():
        for step in range(3):
            for a, b in pairs:
                x = torch.randint(0, SMALL.vocab_size, (2, 1), generator=torch.Generator().manual_seed(step))
                got, want = fused(x, a), plain(x, b)
                assert torch.allclose(got, want, atol=FP32_ATOL) and a.lengths.tolist() == b.lengths.tolist()
                kept.append((got, got.clone()))
    assert len(fused.fused.calls) == before + 2  # a decode step against each cache
    assert all(torch.equal(got, copy) for got, copy in kept)


def test_a_greedy_chain_that_would_run_past_the_context_writes_nothing():
    fused, _ = fused_pair()
    cache = prefilled(fused, [SMALL.block_size - 4])
    before = cache.k.clone()
    with torch.inference_mode(), pytest.raises(ValueError, match="exceeds the model's context"):
        fused.greedy([1, 2], cache, [2], 4)  # 2 tokens and 3 more steps: one past the context
    assert cache.lengths.tolist() == [SMALL.block_size - 4] and torch.equal(cache.k, before)


@pytest.mark.parametrize("T", [1, 7])
def test_a_fused_forward_gives_the_same_bits_on_any_thread_count(T):
    """The picker (suts/threads.py) may run each call on another count: decode steps and verify passes on 2 threads,
    where the picker tries 1 and then 2, against the same on 1."""
    fused, _ = fused_pair()
    x = torch.randint(0, SMALL.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    threads, outs = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            cache = prefilled(fused, [30, 17])
            with torch.inference_mode():
                outs.append(torch.cat([fused(x, cache) for _ in range(ROUNDS + 3)], dim=1))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])
    timed = fused.fused.threads.times[(ThreadPicker.size(2 * T, 1), 2)]
    assert {n: len(t) for n, t in timed.items()} == {1: ROUNDS + 1, 2: 2}  # both counts ran


@needs_kernel
def test_fp16_panels_give_the_fp32_panels_logits_bit_for_bit():
    """Weights that are fp16 numbers (as our checkpoints store them) stream as fp16 panels, widened in registers:
    every forward the fused step takes (a decode step, a verify chunk, a prefill in pieces) and the packed linears
    alone give exactly the fp32 panels' logits. Weights that are not fp16 numbers keep fp32 panels."""
    torch.manual_seed(0)
    config = replace(SMALL, n_layer=2, n_embd=384, n_head=6, vocab_size=256, block_size=256)  # layers the kernels pack
    model = peaky_model(config, 0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    half, full = (pack_linears(copy.deepcopy(model), weights=w) for w in ("fp16", "fp32"))
    assert fastpath.panel_bytes(half) == 2.0 and fastpath.panel_bytes(full) is None
    assert half.fused.half and all(m.panels.dtype == torch.float16 for m in half.modules() if isinstance(m, PackedLinear))
    ids = torch.randint(0, 256, (3, 130))
    with torch.inference_mode():
        for tokens in (1, 5, 64, 130):
            a, b = (m(ids[:, :tokens], m.new_cache(3)) for m in (half, full))
            assert torch.equal(a, b), tokens
        x = torch.randn(7, 384)
        layer = next(m for m in half.modules() if isinstance(m, PackedLinear))
        twin = next(m for m in full.modules() if isinstance(m, PackedLinear))
        assert torch.equal(layer(x), twin(x))
    assert fastpath.panel_bytes(pack_linears(peaky_model(config, 1), weights="fp16")) is None  # not fp16 numbers


def test_fp16_panels_widen_exactly_where_the_cpu_has_no_conversion_instruction(tmp_path):
    """kernels.c built without -march (no AVX, no F16C) widens fp16 panels by its own scalar conversion: normal,
    subnormal, zero and negative numbers give the fp32 panels' sums bit for bit."""
    import ctypes
    import shutil
    import subprocess
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = tmp_path / "plain.so"
    subprocess.run([cc, *native.BASE_FLAGS, str(native.SOURCE), "-o", str(lib), "-lm"], check=True, capture_output=True)
    kernel = ctypes.CDLL(str(lib))
    kernel.linear.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5
    torch.manual_seed(0)
    k, n = 96, 40
    weight = torch.randn(n, k) * torch.logspace(-9, 3, k)  # down to fp16's subnormals, and back up
    weight[0, :4] = torch.tensor([0.0, -0.0, 6e-8, -3e-5])
    weight = weight.half().float()
    bias = torch.randn(n)
    x = torch.randn(3, k)
    ys = []
    for half in (False, True):
        panels, panel_bias = fastpath.pack_panels(weight, bias, half)
        y = torch.empty(3, n)
        kernel.linear(x.data_ptr(), panels.data_ptr(), panel_bias.data_ptr(), None, y.data_ptr(), 3, k, n, 1, int(half))
        ys.append(y)
    assert torch.equal(ys[0], ys[1]) and torch.allclose(ys[0], x @ weight.T + bias, rtol=1e-4, atol=1e-3)
