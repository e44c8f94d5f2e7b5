import mmap

import pytest
import torch

from mlperf.cache import KVCache
from mlperf.model import GPTConfig
from mlperf.pages import HUGE_PAGE, huge_pages, on_huge_pages, page_size


def huge_kb(address: int) -> int:
    """The kB of huge pages in the mapping of this process that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(a, 16) for a in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


def test_huge_pages_lays_copies_end_to_end_from_a_2_mib_boundary():
    tensors = [torch.randn(3, 5), torch.arange(100, dtype=torch.int8), torch.randn(1 << 20)]
    moved = huge_pages(tensors)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(moved, tensors))
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no transparent huge pages on this OS")
    starts = [t.data_ptr() for t in moved]
    assert starts[0] % HUGE_PAGE == 0 and all(p % 64 == 0 for p in starts) and starts == sorted(starts)
    assert len({t.untyped_storage().data_ptr() for t in moved}) == 1
    if page_size().startswith("2 MiB"):  # 4 MiB of floats: at least one whole 2 MiB page
        assert huge_kb(starts[2] + HUGE_PAGE) >= 2048


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no transparent huge pages on this OS")
def test_huge_pages_copies_onto_small_pages_where_the_kernel_refuses_huge_ones(monkeypatch):
    class Refusing(mmap.mmap):
        def madvise(self, *args):
            raise OSError(22, "Invalid argument")
    monkeypatch.setattr(mmap, "mmap", Refusing)
    tensors = [torch.randn(300), torch.empty(0)]
    assert all(torch.equal(a, b) for a, b in zip(huge_pages(tensors), tensors))


def test_a_cpu_kv_cache_lies_on_huge_pages_zeroed_and_its_rows_share_them():
    cache = KVCache(GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=32, block_size=4096), batch_size=2)
    assert cache.k.shape == cache.v.shape == (2, 2, 2, 4096, 32) and not cache.k.any() and not cache.v.any()
    row = cache.rows(1, 2)
    row.k[0, 0, 0, 5] = 1.0
    assert cache.k[0, 1, 0, 5].sum() == 32 and cache.k.sum() == 32  # a view: written through, nothing else moved
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no transparent huge pages on this OS")
    assert cache.k.data_ptr() % HUGE_PAGE == 0 and cache.v.data_ptr() > cache.k.data_ptr()
    if page_size().startswith("2 MiB"):  # 4 MiB of keys: at least one whole 2 MiB page
        assert huge_kb(cache.k.data_ptr() + HUGE_PAGE) >= 2048


def test_on_huge_pages_gives_zeros_of_each_shape_and_dtype():
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        assert on_huge_pages([((2, 3), torch.float32)]) is None
        return
    a, b, c = on_huge_pages([((2, 3), torch.float32), ((5,), torch.int8), ((0,), torch.float16)])
    assert (a.shape, a.dtype, b.shape, b.dtype, c.shape, c.dtype) == (
        (2, 3), torch.float32, (5,), torch.int8, (0,), torch.float16)
    assert not a.any() and not b.any() and b.data_ptr() - a.data_ptr() == 64  # each on a cache line of its own
