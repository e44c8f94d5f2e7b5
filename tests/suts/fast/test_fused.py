import copy
import mmap
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from mlperf.chunk import Chunk
from mlperf.model import GPTConfig
from suts.fast import fused as fastpath
from suts.fast.native import rows_kernel
from suts.fast.packed import PackedLinear, panel_bytes
from suts.fast.runner import Runner
from tests.helpers import fast_runner
from suts.fast.threads import ROUNDS, ThreadPicker
from tests.helpers import FP32_ATOL, SMALL, peaky_model

needs_kernel = pytest.mark.skipif(rows_kernel() is None, reason="the small-row kernel does not build here")


@needs_kernel
def test_the_modules_read_the_fused_steps_own_copy_of_the_panels():
    model = fast_runner(peaky_model(SMALL, 0), min_weights=0)
    packed = [m for m in model.model.modules() if isinstance(m, PackedLinear)]
    fused = {t.data_ptr() for t in model.fast_step.tensors if t is not None}
    assert packed and all(m.panels.data_ptr() in fused for m in packed)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # one buffer, in the order a forward reads them
        starts = [m.panels.data_ptr() for m in packed]
        assert len({m.panels.untyped_storage().data_ptr() for m in packed}) == 1 and starts == sorted(starts)


@needs_kernel
def test_the_fused_step_knows_where_its_weights_lie_end_to_end(monkeypatch):
    """What a chain asks the caches for before its first step: the panels' one buffer, or nothing where they are
    not in one (no huge_pages: the tensors themselves)."""
    model = fast_runner(peaky_model(SMALL, 0), min_weights=0)
    packed = [m.panels for m in model.model.modules() if isinstance(m, PackedLinear)]
    if hasattr(mmap, "MADV_HUGEPAGE"):
        end = packed[-1].data_ptr() + packed[-1].numel() * packed[-1].element_size()
        assert (model.fast_step.model.weights, model.fast_step.model.weights_bytes) == (packed[0].data_ptr(),
                                                                                end - packed[0].data_ptr())
    monkeypatch.setattr(fastpath, "huge_pages", lambda tensors: [t.clone() for t in tensors])
    apart = fast_runner(peaky_model(SMALL, 0), min_weights=0)
    assert (apart.fast_step.model.weights, apart.fast_step.model.weights_bytes) == (None, 0)


ODD = replace(SMALL, n_embd=72)  # rows of 4 vectors of 16 and a part of one, heads of 4 vectors of 8 and a part


def fused_pair(seed: int = 0, config: GPTConfig = SMALL) -> tuple[Runner, nn.Module]:
    """A random model on the fast path (its runner, with its fused step) and the same model as plain modules."""
    runner = fast_runner(peaky_model(config, seed), min_weights=0)
    if runner.fast_step is None:
        pytest.skip("the kernels do not build here")
    return runner, peaky_model(config, seed)


def prefilled(model, lengths: list[int]):
    cache = model.new_cache(len(lengths))
    with torch.inference_mode():
        model(torch.arange(max(lengths))[None].repeat(len(lengths), 1) % SMALL.vocab_size, Chunk(cache))
    cache.lengths[:] = torch.tensor(lengths)
    return cache


@pytest.mark.parametrize("T, last_only, config", [(1, True, SMALL), (1, False, SMALL), (5, False, SMALL),
                                                   (4, True, SMALL), (5, False, ODD)],
                         ids=["1 last", "1", "5", "4 last", "5 odd width"])
def test_the_fused_step_computes_what_the_modules_do(T, last_only, config):
    fused, plain = fused_pair(config=config)
    kvs = [prefilled(m, [30, 17]) for m in (fused, plain)]
    x = torch.randint(0, SMALL.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        (a, fa), (b, fb) = (m(x, Chunk(c, last_only=last_only, features=not last_only)) if not last_only else
                            (m(x, Chunk(c, last_only=True)).logits, None) for m, c in zip((fused, plain), kvs))
    assert a.shape == b.shape and torch.allclose(a, b, atol=FP32_ATOL)
    assert fa is None or torch.allclose(fa, fb, atol=FP32_ATOL)
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == [30 + T, 17 + T]
    for k in ("k", "v"):  # each row's new keys and values, in its own slots
        new = [getattr(c, k)[:, :, :, :30 + T] for c in kvs]
        assert torch.allclose(new[0][:, 0], new[1][:, 0], atol=FP32_ATOL)
        assert torch.allclose(new[0][:, 1, :, :17 + T], new[1][:, 1, :, :17 + T], atol=FP32_ATOL)


def test_a_packed_chunk_of_rows_with_their_own_counts_is_fused_too():
    fused, plain = fused_pair()
    kvs = [prefilled(m, [30, 17, 5]) for m in (fused, plain)]
    x = torch.tensor([[3, 4, 5, 6, 7, 8]])
    with torch.inference_mode():
        a, b = (m(x, Chunk(c, last_only=True, lens=[2, 1, 3])).logits for m, c in zip((fused, plain), kvs))
    assert a.shape == b.shape == (3, 1, SMALL.vocab_size) and torch.allclose(a, b, atol=FP32_ATOL)
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == [32, 18, 8]


def test_a_verify_pass_gives_each_position_the_logits_its_decode_step_gives_bit_for_bit():
    """Why a speculative SUT on the fast path is token-identical to the baseline by construction at batch 1."""
    fused, _ = fused_pair()
    tokens = torch.tensor([[5, 9, 2, 7, 1]])
    steps, at_once = prefilled(fused, [20]), prefilled(fused, [20])
    with torch.inference_mode():
        one_by_one = torch.cat([fused(tokens[:, i:i + 1], Chunk(steps)).logits for i in range(5)], dim=1)
        assert torch.equal(fused(tokens, Chunk(at_once)).logits, one_by_one)


@pytest.mark.parametrize("last_only", [False, True])
def test_a_chunk_of_many_rows_is_fused_in_groups_of_rows(last_only):
    """20 rows of 5 tokens: more than the kernel's 64 rows, in groups of 12 rows a call."""
    fused, plain = fused_pair()
    lengths = [3 + 4 * b for b in range(20)]
    kvs = [prefilled(m, lengths) for m in (fused, plain)]
    x = torch.randint(0, SMALL.vocab_size, (20, 5), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        a, b = (m(x, Chunk(c, last_only=last_only)).logits for m, c in zip((fused, plain), kvs))
    assert a.shape == b.shape == (20, 1 if last_only else 5, SMALL.vocab_size) and torch.allclose(a, b, atol=FP32_ATOL)
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == [n + 5 for n in lengths]
    for row, n in enumerate(lengths):
        assert torch.allclose(kvs[0].v[:, row, :, :n + 5], kvs[1].v[:, row, :, :n + 5], atol=FP32_ATOL)
    bad = x.clone()
    bad[-1, -1] = SMALL.vocab_size  # in the last group: found before the first group is written
    with torch.inference_mode(), pytest.raises(IndexError):
        fused(bad, Chunk(kvs[0]))
    assert kvs[0].lengths.tolist() == [n + 5 for n in lengths]


def test_a_greedy_verify_pass_of_many_rows_is_fused_in_groups_of_rows():
    """20 rows of 5 tokens, each token's argmax (a greedy verify pass at batch 20): more than a call's 64 tokens,
    in groups of whole rows, each token's argmax what the modules' logits give it; nothing falls back."""
    fused, plain = fused_pair()
    lengths = [3 + 4 * b for b in range(20)]
    kvs = [prefilled(m, lengths) for m in (fused, plain)]
    rows = torch.randint(0, SMALL.vocab_size, (20, 5), generator=torch.Generator().manual_seed(6)).tolist()
    before = fused.tally.steps, dict(fused.tally.fell_back)  # the prefill above, 20 rows of 79, fell back
    with torch.inference_mode():
        expected = plain(torch.tensor(rows), Chunk(kvs[1])).logits.argmax(-1).tolist()
        assert fused.argmaxes(rows, kvs[0]) == expected
    assert (fused.tally.steps, dict(fused.tally.fell_back)) == (before[0] + 1, before[1])
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == [n + 5 for n in lengths]


def test_a_greedy_chain_after_a_long_packed_chunk_is_fused_in_groups_of_rows():
    """A catch-up of 30 tokens in each of 3 rows, then 3 greedy steps (90 tokens, more than one call takes): each
    group of rows its own chain, the tokens the modules' loop gives."""
    fused, plain = fused_pair()
    ids = torch.randint(0, SMALL.vocab_size, (90,), generator=torch.Generator().manual_seed(7)).tolist()
    kvs = [prefilled(m, [4, 9, 2]) for m in (fused, plain)]
    runner = Runner(fused.model, fused.fast_step)  # its own tally
    with torch.inference_mode():
        got, expected = (r.greedy(ids, c, [30, 30, 30], 3) for r, c in zip((runner, Runner(plain)), kvs))
    assert got == expected and kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == [36, 41, 34]
    assert runner.tally.steps == 1 and not runner.tally.fell_back


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
        a, b = (m(x, Chunk(c, last_only=last_only, features=features, lens=lens)) for m, c in ((fused, pieces),
                                                                                       (plain, modules)))
        rows = [torch.split(r, 7, dim=1) for r in torch.split(x, lens, dim=1)]
        outs = [[fused(t, Chunk(short.rows(i, i + 1), last_only=last_only, features=features)) for t in r]
                for i, r in enumerate(rows)]
    c = torch.cat([o[-1].logits for o in outs]) if last_only else \
        tuple(torch.cat([t[j] for o in outs for t in o], dim=1) for j in (0, 1))  # logits, features
    for got, in_short_chunks, by_modules in zip(a, c, b) if features else [(a.logits, c, b.logits)]:
        assert got.shape == by_modules.shape and torch.equal(got, in_short_chunks)
        assert torch.allclose(got, by_modules, atol=FP32_ATOL)
    assert pieces.lengths.tolist() == short.lengths.tolist() == [s + n for s, n in zip(starts, lens)]
    assert torch.equal(pieces.k, short.k) and torch.equal(pieces.v, short.v)
    bad = x.clone()
    bad[0, -1] = SMALL.vocab_size  # in the last piece: found before the first piece is written
    cache = prefilled(fused, starts)
    with torch.inference_mode(), pytest.raises(IndexError):
        fused(bad, Chunk(cache, lens=lens))
    assert cache.lengths.tolist() == starts


@pytest.mark.parametrize("lens", [[5, 3], [70, 3, 100]], ids=["one call", "in pieces"])
def test_every_tokens_features_with_each_rows_last_logits_are_fused(lens):
    """An EAGLE SUT's prefill: every token's features for its head, the logits at each row's last token alone.
    The kernels run it as a pass of every token's outputs and keep the last logits; nothing falls back."""
    fused, plain = fused_pair()
    starts = [3, 0, 10][:len(lens)]
    kvs = [prefilled(m, starts) for m in (fused, plain)]
    x = torch.randint(0, SMALL.vocab_size, (1, sum(lens)), generator=torch.Generator().manual_seed(5))
    before = fused.tally.steps
    with torch.inference_mode():
        a, b = (m(x, Chunk(c, lens=lens, last_only=True, features=True)) for m, c in zip((fused, plain), kvs))
    assert a.logits.shape == b.logits.shape == (len(lens), 1, SMALL.vocab_size)
    assert a.hidden.shape == b.hidden.shape == (1, sum(lens), SMALL.n_embd)
    assert torch.allclose(a.logits, b.logits, atol=FP32_ATOL) and torch.allclose(a.hidden, b.hidden, atol=FP32_ATOL)
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == [s + n for s, n in zip(starts, lens)]
    assert fused.tally.steps == before + 1 and not fused.tally.fell_back


def test_what_the_fused_step_does_not_take_runs_through_the_modules():
    fused, plain = fused_pair()
    many = torch.randint(0, SMALL.vocab_size, (2, 70))  # 2 rows of 70 tokens, not packed: more than its rows
    kvs = [prefilled(m, [3, 5]) for m in (fused, plain)]
    with torch.inference_mode():
        assert torch.allclose(fused(many, Chunk(kvs[0])).logits, plain(many, Chunk(kvs[1])).logits, atol=FP32_ATOL)
        bad, long = prefilled(fused, [3]), prefilled(fused, [SMALL.block_size - 1])
        with pytest.raises(IndexError):  # a token id outside the vocabulary: the modules' own error
            fused(torch.tensor([[SMALL.vocab_size]]), Chunk(bad))
        with pytest.raises(ValueError, match="exceeds the model's context"):
            fused(torch.tensor([[1, 2]]), Chunk(long))
    assert bad.lengths.tolist() == [3] and long.lengths.tolist() == [SMALL.block_size - 1]  # the kernel wrote nothing


def test_an_int8_model_is_fused_with_its_int8_weights():
    """Weight-only int8 (suts/fast/quantize.py's weights and scales, the activations left in float): the same logits
    as a float model holding the dequantised weights."""
    from suts.fast.quantize import int8_per_channel, quantize_int8
    fused = fast_runner(quantize_int8(peaky_model(SMALL, 0)), min_weights=0)
    if fused.fast_step is None:
        pytest.skip("the kernels do not build here")
    plain = peaky_model(SMALL, 0)
    for m in [m for m in plain.modules() if isinstance(m, nn.Linear)]:
        q, scale = int8_per_channel(m.weight)
        m.weight = nn.Parameter(q.float() * scale[:, None])  # the LM head's too, untied from the embeddings
    kvs = [prefilled(m, [20, 11]) for m in (fused, plain)]
    x = torch.tensor([[4, 5, 6], [7, 8, 9]])
    with torch.inference_mode():
        a, b = (m(x, Chunk(c)).logits for m, c in zip((fused, plain), kvs))
    assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("lengths", [[30, 30], [30, 17], [30, 17] * 6])  # 12 rows: 84 nodes, in two groups
@pytest.mark.parametrize("chunk", [7, 4])  # the whole tree, or its last nodes after the first were written
def test_a_token_tree_is_fused_with_its_mask_and_depths(lengths, chunk):
    from mlperf.cache import TreeMask
    fused, plain = fused_pair()
    tree = TreeMask.of([-1, 0, 0, 1, 1, 2, 3])
    kvs = [prefilled(m, lengths) for m in (fused, plain)]
    nodes = torch.randint(0, SMALL.vocab_size, (len(lengths), 7), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        if chunk < 7:
            for m, c in zip((fused, plain), kvs):
                m(nodes[:, :7 - chunk], Chunk(c, tree=tree.prefix(7 - chunk)))
        a, b = (m(nodes[:, 7 - chunk:], Chunk(c, tree=tree)).logits for m, c in zip((fused, plain), kvs))
    assert a.shape == b.shape == (len(lengths), chunk, SMALL.vocab_size) and torch.allclose(a, b, atol=FP32_ATOL)
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == [n + 7 for n in lengths]


def head_pair(seed: int = 3):
    """A random EAGLE head on the fast path and as plain modules, a cache of each with rows at lengths 9 and 4, and
    the target whose embedding and LM head it drafts with: (target, fused, plain, caches)."""
    from mlperf.model import EagleHead
    target = peaky_model(SMALL, 0)
    torch.manual_seed(seed)
    plain = EagleHead(replace(SMALL, n_layer=1))
    fused = fast_runner(copy.deepcopy(plain), min_weights=0)
    if fused.fast_step is None:
        pytest.skip("the kernels do not build here")
    kvs = [m.new_cache(2) for m in (fused, plain)]
    for c in kvs:
        c.lengths[:] = torch.tensor([9, 4])
    return target, fused, plain, kvs


@pytest.mark.parametrize("lens", [None, [2, 1], [70, 30]], ids=["rows", "packed", "a prompt's pairs, in pieces"])
def test_an_eagle_head_is_fused_too(lens):
    target, fused, plain, kvs = head_pair()
    tokens = torch.tensor([[3, 4], [5, 6]]) if lens is None else torch.arange(sum(lens))[None] % SMALL.vocab_size
    features = torch.randn(*tokens.shape, SMALL.n_embd)
    with torch.inference_mode():
        a, b = (m(tokens, Chunk(c, lens=lens), features, target.transformer.wte.weight)
                for m, c in zip((fused, plain), kvs))
    assert a.shape == b.shape and torch.allclose(a, b, atol=FP32_ATOL)
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist()
    assert fused.tally.steps == 1 and not fused.tally.fell_back


@pytest.mark.parametrize("seed, lens", [(3, [3, 1]), (4, [3, 1]), (3, [40, 30])],
                         ids=["3", "4", "in groups of rows"])
def test_an_eagle_heads_greedy_chain_is_one_call_drafting_what_its_modules_draft(seed, lens):
    """FusedHead.greedy: a packed catch-up chunk, then steps each fed its own features and the argmax of the
    target's LM head over them, in one call of the kernels (a call for each group of rows where the catch-up is
    more than one call takes, each with its rows' features); the modules step by step draft the same tokens and
    leave the caches alike."""
    target, fused, plain, kvs = head_pair(seed)
    ids, wte = [3 + i % 20 for i in range(sum(lens))], target.transformer.wte.weight
    feats = torch.randn(len(ids), SMALL.n_embd, generator=torch.Generator().manual_seed(seed))
    chunk = Chunk(kvs[0], lens=lens, last_only=True, B=2, T=max(lens))
    with torch.inference_mode():
        plan = fused.plan("greedy", ids, chunk, feats, wte)
        assert plan is not None and not fused.tally.fell_back
        got = fused.fast_step.greedy(plan, 4)
        out = plain(torch.tensor([ids]), Chunk(kvs[1], lens=lens), feats[None], wte)
        predicted, drafts = out[0, [lens[0] - 1, sum(lens) - 1]][:, None], []  # each row's last token's features
        for i in range(4):
            drafts.append(target.lm_head(predicted)[:, -1].argmax(-1))
            if i < 3:
                predicted = plain(drafts[-1].view(2, 1), Chunk(kvs[1]), predicted, wte)
    assert got == torch.stack(drafts, 1).tolist()
    ends = [9 + lens[0] + 3, 4 + lens[1] + 3]
    assert kvs[0].lengths.tolist() == kvs[1].lengths.tolist() == ends
    assert torch.allclose(kvs[0].k[:, :, :, :max(ends)], kvs[1].k[:, :, :, :max(ends)], atol=FP32_ATOL)


def test_a_prepared_call_serves_its_own_cache_and_outputs_are_never_shared():
    """A plan's calls are built once per shape and cache (FusedStep.plan): two caches in turn each get their own
    rows, the same shape against one cache reuses them, and logits a call returned stay as they were."""
    fused, plain = fused_pair()
    pairs = [(prefilled(fused, lengths), prefilled(plain, lengths)) for lengths in ([30, 17], [9, 21])]
    kept, before = [], len(fused.fast_step.plans)  # the prefills' own
    with torch.inference_mode():
        for step in range(3):
            for a, b in pairs:
                x = torch.randint(0, SMALL.vocab_size, (2, 1), generator=torch.Generator().manual_seed(step))
                got, want = fused(x, Chunk(a)).logits, plain(x, Chunk(b)).logits
                assert torch.allclose(got, want, atol=FP32_ATOL) and a.lengths.tolist() == b.lengths.tolist()
                kept.append((got, got.clone()))
    assert len(fused.fast_step.plans) == before + 2  # a decode step against each cache
    assert all(torch.equal(got, copy) for got, copy in kept)


@pytest.mark.parametrize("T", [1, 7])
def test_a_fused_forward_gives_the_same_bits_on_any_thread_count(T):
    """The picker (suts/fast/threads.py) may run each call on another count: decode steps and verify passes on 2
    threads, where the picker tries 1 and then 2, against the same on 1."""
    fused, _ = fused_pair()
    x = torch.randint(0, SMALL.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    threads, outs = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            cache = prefilled(fused, [30, 17])
            with torch.inference_mode():
                outs.append(torch.cat([fused(x, Chunk(cache)).logits for _ in range(ROUNDS + 3)], dim=1))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])
    timed = fused.fast_step.threads.times[(ThreadPicker.size(2 * T, 1), 2)]
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
    half, full = (fast_runner(copy.deepcopy(model), weights=w) for w in ("fp16", "fp32"))
    assert panel_bytes(half) == 2.0 and panel_bytes(full) is None
    assert half.fast_step.half
    assert all(m.panels.dtype == torch.float16 for m in half.model.modules() if isinstance(m, PackedLinear))
    ids = torch.randint(0, 256, (3, 130))
    with torch.inference_mode():
        for tokens in (1, 5, 64, 130):
            a, b = (m(ids[:, :tokens], Chunk(m.new_cache(3))).logits for m in (half, full))
            assert torch.equal(a, b), tokens
        x = torch.randn(7, 384)
        layer = next(m for m in half.model.modules() if isinstance(m, PackedLinear))
        twin = next(m for m in full.model.modules() if isinstance(m, PackedLinear))
        assert torch.equal(layer(x), twin(x))
    assert panel_bytes(fast_runner(peaky_model(config, 1), weights="fp16")) is None  # not fp16 numbers


def test_resident_weights_outgrow_l2_and_fit_in_three_quarters_of_the_last_level_cache(monkeypatch):
    """Where one row's passes ask for a model's weights ahead (linear.c's `resident`): not a model already in L2,
    nor one streamed from memory, nor anything where the caches are not known."""
    monkeypatch.setattr(fastpath, "cache_levels", lambda: {1: 32 << 10, 2: 1 << 20, 3: 32 << 20})
    sizes = (1 << 20, (1 << 20) + 1, 24 << 20, (24 << 20) + 1)
    assert [fastpath.is_resident(size) for size in sizes] == [False, True, True, False]
    monkeypatch.setattr(fastpath, "cache_levels", lambda: {})
    assert not fastpath.is_resident(4 << 20)
