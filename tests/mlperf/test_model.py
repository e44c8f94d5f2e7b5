import pytest
import torch

from mlperf.chunk import Chunk
from mlperf.model import GEOMETRIES, GPT, GPTConfig
from tests.helpers import FP32_ATOL

torch.set_grad_enabled(False)


def test_prefill_then_decode_equals_one_full_forward(tiny_model):
    x = torch.randint(0, 61, (3, 30))
    full = tiny_model(x).logits
    cache = tiny_model.new_cache(3)
    steps = [tiny_model(x[:, :11], Chunk(cache)).logits]
    steps += [tiny_model(x[:, t:t + 1], Chunk(cache)).logits for t in range(11, 30)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=FP32_ATOL)
    assert cache.lengths.tolist() == [30, 30, 30]


def test_multi_token_chunks_continue_the_context(tiny_model):
    x = torch.randint(0, 61, (1, 25))
    cache = tiny_model.new_cache()
    chunks = [tiny_model(x[:, a:b], Chunk(cache)).logits for a, b in [(0, 7), (7, 12), (12, 13), (13, 25)]]
    assert torch.allclose(torch.cat(chunks, 1), tiny_model(x).logits, atol=FP32_ATOL)


def test_decode_after_rollback_equals_decoding_fresh(tiny_model):
    prompt, rejected, accepted = (torch.randint(0, 61, (1, n)) for n in (9, 5, 6))
    cache = tiny_model.new_cache()
    tiny_model(prompt, Chunk(cache))
    tiny_model(rejected, Chunk(cache))  # e.g. a draft the target rejected
    cache.lengths[:] = 9  # roll back: O(1), the stale entries stay in memory
    after_rollback = tiny_model(accepted, Chunk(cache)).logits
    fresh = tiny_model.new_cache()
    tiny_model(prompt, Chunk(fresh))
    assert torch.allclose(after_rollback, tiny_model(accepted, Chunk(fresh)).logits, atol=FP32_ATOL)
    # one token at a time after a rollback takes the T == 1 path; stale entries must not leak into it either
    cache.lengths[:] = 9
    steps = torch.cat([tiny_model(accepted[:, t:t + 1], Chunk(cache)).logits for t in range(6)], 1)
    assert torch.allclose(steps, after_rollback, atol=FP32_ATOL)


def test_rows_of_different_lengths_decode_together(tiny_model):
    x = torch.randint(0, 61, (3, 20))
    full = tiny_model(x).logits
    cache = tiny_model.new_cache(3)
    lengths = [4, 9, 13]
    for row, n in enumerate(lengths):  # prefill each row alone through a view sharing the cache's storage
        tiny_model(x[row:row + 1, :n], Chunk(cache.rows(row, row + 1)))
    assert cache.lengths.tolist() == lengths
    out = tiny_model(torch.stack([x[r, n:n + 3] for r, n in enumerate(lengths)]), Chunk(cache)).logits
    for r, n in enumerate(lengths):
        assert torch.allclose(out[r], full[r, n:n + 3], atol=FP32_ATOL)


def test_a_view_of_some_rows_writes_into_the_cache_and_a_view_of_all_is_the_cache(tiny_model):
    cache = tiny_model.new_cache(3)
    view = cache.rows(1, 3)
    tiny_model(torch.randint(0, 61, (2, 5)), Chunk(view))
    assert cache.lengths.tolist() == [0, 5, 5] and cache.k[:, 0].abs().sum() == 0 and cache.k[:, 1:].abs().sum() > 0
    assert view.rows(0, 2) is view and cache.rows(0, 3) is cache  # a step of every row makes no views


def test_packed_chunks_of_different_lengths_continue_each_row(tiny_model):
    """Rows' chunks one after another in one (1, N) chunk (a batched, chunked prefill): each row continues its own
    context, a row may feed nothing, and `last_only` gives each row's last position."""
    x = torch.randint(0, 61, (4, 30))
    full = tiny_model(x).logits
    cache = tiny_model.new_cache(4)
    cuts = [(0, 7, 30), (0, 0, 12), (0, 30, 30), (0, 1, 5)]  # row r feeds x[r, a:b], then x[r, b:c]
    for first, last in ((0, 1), (1, 2)):
        lens = [c[last] - c[first] for c in cuts]
        ids = torch.cat([x[r, c[first]:c[last]] for r, c in enumerate(cuts)])[None]
        out = tiny_model(ids, Chunk(cache, lens=lens)).logits
        ends = torch.tensor(lens).cumsum(0).tolist()
        for r, c in enumerate(cuts):
            assert torch.allclose(out[0, ends[r] - lens[r]:ends[r]], full[r, c[first]:c[last]], atol=FP32_ATOL)
    assert cache.lengths.tolist() == [30, 12, 30, 5]
    cache.lengths[:] = torch.tensor([7, 0, 30, 1])  # the second chunks again, each row's last logits only
    tops = tiny_model(ids, Chunk(cache, lens=lens, last_only=True)).logits
    assert tops.shape == (4, 1, 61)
    for r in (0, 1, 3):  # row 2 fed nothing: its entry means nothing
        assert torch.allclose(tops[r, 0], full[r, cuts[r][2] - 1], atol=FP32_ATOL)
    with pytest.raises(ValueError, match="packed chunk"):
        tiny_model(ids[:, :3], Chunk(tiny_model.new_cache(2), lens=[0, 0]))


def test_last_only_returns_the_last_position(tiny_model):
    x = torch.randint(0, 61, (2, 8))
    last = tiny_model(x, Chunk(tiny_model.new_cache(2), last_only=True)).logits  # cached attention: another kernel path
    assert last.shape == (2, 1, 61) and torch.allclose(last, tiny_model(x).logits[:, -1:], atol=FP32_ATOL)


def test_context_overflow_is_a_clear_error(tiny_model):
    cache = tiny_model.new_cache()
    tiny_model(torch.zeros(1, 60, dtype=torch.long), Chunk(cache))
    with pytest.raises(ValueError, match="exceeds the model's context of 64"):
        tiny_model(torch.zeros(1, 5, dtype=torch.long), Chunk(cache))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        tiny_model(torch.zeros(1, 65, dtype=torch.long))


@pytest.mark.parametrize("bad", [dict(n_embd=30, n_head=4), dict(n_layer=0), dict(vocab_size=-1), dict(n_head=2.5)])
def test_bad_config_values_are_rejected(bad):
    with pytest.raises(ValueError, match="model config"):
        GPTConfig(**bad)


def test_named_geometries_have_the_published_sizes():
    with torch.device("meta"):
        params = {name: GPT(GEOMETRIES[name]).num_params() for name in ("gpt2", "gpt2-medium")}
    assert params["gpt2"] == 124_439_808  # GPT-2 small, tied head
    assert params["gpt2-medium"] == 354_823_168
    assert GEOMETRIES["gpt2-xl"].n_layer == 48 and GEOMETRIES["gpt2-large"].n_embd == 1280
