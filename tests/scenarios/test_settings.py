import pytest

from mlperf.model import GEOMETRIES, GPTConfig
from scenarios.scenario import Offline, Scenario, Server
from scenarios.settings import PROFILES, Calibration, loadgen_settings, model_name, resolve, user_conf
from suts.base import GREEDY

CAL = Calibration(latency_s=0.7, ttft_s=0.02, tpot_s=0.005, samples_per_s=1 / 0.7)


def test_layers_resolve_like_loadgen_and_later_layers_win():
    text = "*.*.min_duration = 1\n*.Server.min_duration = 2\nllm.*.min_duration = 3\nother.Server.min_duration = 9\n"
    assert resolve(text, "llm", "Server", "t") == {"min_duration": "2"}  # *.Server beats llm.*, as in LoadGen
    assert resolve(text + "llm.Server.min_duration = 4\n", "llm", "Server", "t") == {"min_duration": "4"}
    assert resolve(text, "llm", "Offline", "t") == {"min_duration": "3"}


@pytest.mark.parametrize("line, message", [
    ("llm.Server.target_qps = 1 # fast", "no trailing comment"),
    ("target_qps = 1", "expected 'model.scenario.key = number'"),
    ("*.Server.target_qps = fast", "target_qps must be a number"),
    # values LoadGen takes without a check and crashes on
    ("*.*.min_query_count = -5", "min_query_count must be a whole number >= 1, got -5"),
    ("*.*.min_query_count = 1.5", "min_query_count must be a whole number >= 1, got 1.5"),
    ("*.Server.target_latency_percentile = 250", "target_latency_percentile must be a percentage above 0"),
    ("*.SingleStream.target_latency = -1", "target_latency must be a positive number, got -1"),
    ("*.Server.target_qps = inf", "target_qps must be a positive number, got inf"),
    ("*.*.performance_issue_unique = 2", "performance_issue_unique must be 0 or 1"),
    ("*.*.mode = 2", "set the mode with --mode"),
])
def test_bad_conf_lines_are_named(line, message):
    with pytest.raises(ValueError, match=message) as e:
        resolve(line, "llm", "Server", "my.conf")
    assert str(e.value).startswith("my.conf, line 1: ")


def test_a_key_loadgen_does_not_read_is_refused_naming_the_key_and_the_file():
    """A typo would leave the setting at LoadGen's default without a word: refused, with the likely key."""
    with pytest.raises(ValueError, match=r"^my.conf, line 1: LoadGen has no setting 'min_duraton' \(did you mean "
                                         r"min_duration\?\)$"):
        resolve("*.SingleStream.min_duraton = 999999", "llm", "SingleStream", "my.conf")


def test_a_load_that_would_have_loadgen_prepare_too_many_queries_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"target_qps 1e\+09 \(--qps\) for min_duration 10000 ms would have LoadGen"):
        user_conf("quick", Offline(), "llm", qps=1e9)
    (tmp_path / "bad.conf").write_bytes(b"*.*.min_duration = 5 \xff\n")
    with pytest.raises(ValueError, match="bad.conf: not UTF-8 text"):
        user_conf("quick", Offline(), "llm", extra=tmp_path / "bad.conf")


def test_the_users_file_wins_over_the_profile_and_the_calibration_whatever_its_specificity(tmp_path):
    """The bug: LoadGen looks `target.Server.target_qps` up before `*.Server.target_qps`, whatever the line order."""
    extra = tmp_path / "user.conf"
    extra.write_text("*.Server.target_qps = 2.5\n*.*.ttft_latency = 999\n*.Offline.target_qps = 7\n")
    text, values = user_conf("quick", Server(), "target", extra=extra)
    assert values["target_qps"] == "2.5" and values["ttft_latency"] == "999"
    conf = tmp_path / "run.conf"
    conf.write_text(text)
    settings = loadgen_settings(conf, Server(), "performance", "target", 16)
    assert settings.server_target_qps == 2.5 and settings.ttft_latency == 999_000_000
    _, offline = user_conf("quick", Offline(), "target", CAL, extra=extra)
    assert offline["target_qps"] == "7"  # over the calibrated Offline QPS too


def test_server_constraints_and_load_are_fixed_per_model_not_per_sut():
    fast, slow = (Calibration(s, s / 20, s / 130, 1 / s) for s in (0.2, 3.0))
    assert user_conf("quick", Server(), "target", fast)[1] == user_conf("quick", Server(), "target", slow)[1]
    values = user_conf("quick", Server(), "target")[1]
    assert {"target_qps", "ttft_latency", "tpot_latency"} <= values.keys()
    assert user_conf("quick", Server(), "target", qps=1.5)[1]["target_qps"] == "1.5"
    with pytest.raises(ValueError, match="no Server load is fixed for model 'llm'.*--qps"):
        user_conf("quick", Server(), "llm")
    generic = user_conf("full", Server(), "llm", qps=1.0)[1]
    assert generic["ttft_latency"] == "2000" and generic["tpot_latency"] == "200"  # MLPerf's llama2-70b limits


def test_the_model_name_is_the_targets_named_geometry():
    assert model_name(GEOMETRIES["target"]) == "target" and model_name(GEOMETRIES["gpt2"]) == "gpt2"
    assert model_name(GPTConfig(n_layer=1, n_head=1, n_embd=8, vocab_size=10, block_size=16)) == "llm"


def test_loadgen_accepts_every_generated_conf(tmp_path):
    for profile in PROFILES:
        for scenario in Scenario.known.values():
            conf = tmp_path / f"{profile}-{scenario}.conf"
            conf.write_text(user_conf(profile, scenario, "target", CAL, qps=2.5)[0])
            loadgen_settings(conf, scenario, "performance", "target", 16)  # raises unless FromConfig returns 0


@pytest.mark.parametrize("slow", [{2}, {1, 2}], ids=["last batch", "both batches"])
def test_offline_is_sized_by_the_best_rate_calibration_timed(tiny_model, slow):
    """A slow moment during calibration (here a full batch held back 1 s, or both, as a server's batch can ramp up
    slower than one prompt alone) must not shrink Offline's query below min_duration: the rate is the best timed,
    a lone prompt's included, never the slowest."""
    import time
    from scenarios.settings import calibrate
    from suts.baseline import Baseline

    class SlowBatches(Baseline):
        batches = 0

        def generate_batch(self, *args, **kwargs):
            SlowBatches.batches += 1
            if SlowBatches.batches in slow:
                time.sleep(1.0)
            return super().generate_batch(*args, **kwargs)

    cal = calibrate(SlowBatches(tiny_model), [[1, 2, 3], [4, 5], [6]], 4, GREEDY, max_batch=4)
    assert SlowBatches.batches == 2 and cal.samples_per_s > 4 / 1.0
