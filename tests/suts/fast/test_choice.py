"""Whether a GPT's fused step or its modules run it (suts/fast/choice.py): the faster as timed, the verdict cached."""
import copy
from dataclasses import replace

import pytest

from suts.fast import choice
from suts.fast.fused import fused_step
from suts.fast.native import rows_kernel
from suts.fast.runner import Runner
from tests.helpers import fast_runner
from tests.helpers import SMALL, peaky_model

needs_kernel = pytest.mark.skipif(rows_kernel() is None, reason="the small-row kernel does not build here")


@needs_kernel
def test_the_runner_keeps_whichever_path_its_timing_says_is_faster(monkeypatch, tmp_path):
    """Timed at load (suts/fast/choice.py's timings, stubbed here so that the verdict does not rest on this machine's
    speed): the modules when they are faster, the fused step when it is; each verdict cached, so a second SUT over the
    same model (the baseline's and spec's target) takes the same path without timing again; MLPERF_ROWS_KERNEL=1
    takes the fused step untimed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MLPERF_ROWS_KERNEL")
    timed = []
    for fused_s, modules_s, path in ((2.0, 1.0, "modules"), (1.0, 3.0, "fused C step")):
        monkeypatch.setattr(choice, "timings", lambda step, model: timed.append(model) or (fused_s, modules_s))
        model = peaky_model(replace(SMALL, n_embd=SMALL.n_embd + 16 * len(timed)), 0)  # a geometry of its own
        runners = [fast_runner(copy.deepcopy(model), min_weights=0) for _ in range(2)]
        assert [r.kind for r in runners] == [path] * 2 and len(timed) in (1, 2) and timed[-1] is not runners[1].model
        assert runners[0].vs_modules == modules_s / fused_s
        assert runners[0].choice() == f"{path}, {max(fused_s, modules_s) / min(fused_s, modules_s):.2f}x the " \
                                      f"{'fused C step' if path == 'modules' else 'modules'} (timed)"
        tokens = [Runner(model).greedy([1, 2, 3], model.new_cache(1), [3], 6)]
        assert [r.greedy([1, 2, 3], r.new_cache(1), [3], 6) for r in runners] == tokens * 2
    monkeypatch.setenv("MLPERF_ROWS_KERNEL", "1")
    forced = fast_runner(peaky_model(replace(SMALL, n_embd=SMALL.n_embd + 64), 0), min_weights=0)
    assert forced.kind == "fused C step" and forced.vs_modules is None and len(timed) == 2


@needs_kernel
def test_the_choice_times_a_decode_step_and_a_verify_pass_on_each_path():
    model = peaky_model(SMALL, 0)
    step, seen, forward = fused_step(model, min_weights=0), [], model.forward
    model.forward = lambda idx, cache=None, **kw: seen.append(("modules", idx.shape[1])) or forward(idx, cache, **kw)
    run = step.forward
    step.forward = lambda plan: seen.append(("fused", plan.ids.shape[1])) or run(plan)
    fused_s, modules_s = choice.timings(step, model)
    assert fused_s > 0 and modules_s > 0
    assert set(seen) == {("modules", choice.CONTEXT), *((path, T) for path in ("fused", "modules") for T in (1, 7))}


@needs_kernel
def test_a_cache_that_cannot_be_written_costs_a_timing_not_the_run(monkeypatch, tmp_path):
    (tmp_path / "mlperf-spec").write_text("a file where the cache's folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MLPERF_ROWS_KERNEL")
    monkeypatch.setattr(choice, "timings", lambda step, model: (1.0, 2.0))
    runner = fast_runner(peaky_model(SMALL, 0), min_weights=0)
    assert runner.kind == "fused C step" and runner.vs_modules == 2.0
