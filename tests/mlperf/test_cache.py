"""The KV cache's lengths: set through its own methods alone, views included."""
import re

from tests.helpers import ROOT

SETS_LENGTHS = re.compile(r"\.lengths(\[[^]]*\])? *[-+*]?= |\.lengths\.\w+_\(")  # an assignment or an in-place op


def test_roll_back_cuts_each_row_to_at_most_its_length_through_a_view_too(tiny_model):
    cache = tiny_model.new_cache(3)
    cache.restart([7, 4, 9])
    cache.rows(1, 3).roll_back([6, 5])  # row 1 is shorter than 6 already: it stays
    assert cache.lengths.tolist() == [7, 4, 5]
    cache.roll_back([2, 9, 0])
    assert cache.lengths.tolist() == [2, 4, 0]


def test_held_reads_what_the_lengths_hold_whoever_wrote_them_through_a_view_too(tiny_model):
    cache = tiny_model.new_cache(3)
    cache.restart([7, 4, 9])
    view = cache.rows(1, 3)
    assert cache.held() == [7, 4, 9] and view.held() == [4, 9]
    cache.advance(2)
    assert cache.held() == [9, 6, 11] and view.held() == [6, 11]


def test_restart_and_advance_set_every_row_through_a_view_too(tiny_model):
    cache = tiny_model.new_cache(3)
    cache.rows(1, 3).restart([4, 7])
    assert cache.lengths.tolist() == [0, 4, 7]
    cache.restart(2)
    cache.rows(0, 2).advance(3)
    assert cache.lengths.tolist() == [5, 5, 2]


def test_only_the_cache_sets_its_lengths():
    """One owner of each row's length: the cache's methods (and the C kernels, through the pointer fused.py hands
    it). The labs are left out: lab 1 teaches a rollback as lowering `lengths` by hand."""
    found = [f"{path.relative_to(ROOT)}:{n}" for package in ("mlperf", "suts", "scenarios", "roofline", "reports",
                                                             "training", "commands")
             for path in sorted((ROOT / package).rglob("*.py")) if path != ROOT / "mlperf" / "cache.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if SETS_LENGTHS.search(line)]
    assert not found
