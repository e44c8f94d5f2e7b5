"""What the machine's spells and caches do to a step: one step repeated, set against a read in turns, and a call
timed after itself and after a flush."""
import time

from mlperf.checkpoint import load_model
from mlperf.cost import forward_cost
from roofline.profile import CONTEXT
from roofline.spells import against_a_read, spells, warm_and_cold


def test_warm_and_cold_time_a_call_after_itself_and_after_the_flush():
    flushed = []

    def fn():  # dear only right after a flush, as a step's Python is after a forward
        if flushed:
            flushed.clear()
            time.sleep(0.002)

    warm, cold = warm_and_cold(fn, lambda: flushed.append(True), repeats=5)
    assert warm < 0.002 <= cold


def test_spells_summarise_one_step_repeated(tiny_pair):
    s = spells(load_model(tiny_pair / "target"), steps=60, span=20)
    assert s.steps == 60 and s.span == 20
    assert 0 < s.percentiles[10] <= s.percentiles[50] <= s.percentiles[90]
    assert s.percentiles[10] <= s.spans[0] <= s.spans[1] <= s.percentiles[90] and -1 <= s.correlation <= 1


def test_a_step_is_set_against_a_read_of_its_own_bytes_in_turns(tiny_pair):
    model = load_model(tiny_pair / "target")
    turns = against_a_read(model, pairs=21)
    assert turns.pairs == 21 and turns.bytes == forward_cost(model.config, CONTEXT, 1).bytes  # fp32 weights here
    assert 0 < turns.fractions[10] <= turns.fractions[50] <= turns.fractions[90]
