"""TEST06 through the real LoadGen on a tiny model, and the checker's rules on crafted accuracy logs."""
import json
import re

import numpy as np
import pytest

from scenarios import mlcommons
from scenarios.compliance import QUERIES, check
from scenarios.scenario import Offline, SingleStream
from tests.helpers import filed


def test_a_shipped_sut_passes(mlperf_run):
    proc = mlperf_run("--sut", "spec", "--mode", "compliance")
    assert proc.returncode == 0, proc.stderr[-2000:]
    latest = filed(mlperf_run.results, "spec", "SingleStream", "compliance", "latest")
    # LoadGen logs every query it issues here (probability 100 of 100 expected); how many it issues past
    # min_query_count depends on how fast its issue loop sees the last completion, so only the floor is fixed
    logged = re.match(r"TEST06 PASS: (\d+) logged samples", (latest / "compliance.txt").read_text())
    assert logged and int(logged.group(1)) >= QUERIES
    if mlcommons.checkout() is not None:  # MLCommons' own script passed it too
        assert (latest / "TEST06" / "verify_accuracy.txt").read_text().endswith("TEST06 verification complete\n")
    speculative = json.loads((latest / "compliance.json").read_text())["speculative"]
    assert speculative["checked"] and speculative["greedy_identity"] == "checked" and not speculative["failures"]
    disclosed = json.loads((latest / "metrics.json").read_text())["speculative"]
    assert disclosed == speculative["disclosed"] and disclosed["drafter"] == "model" and disclosed["shape"] == "chain"
    assert disclosed["checkpoint"] and disclosed["gamma"] == 5 and 1 <= disclosed["mean_acceptance_length"] <= 6


def test_a_run_at_synthetic_acceptance_passes_accuracy_and_test06_and_says_so(mlperf_run):
    """Its drafts are set from the baseline's reference (suts/synthetic.py): lossless, so both gates pass; its
    record, its folder and its printout name the rates."""
    for mode in ("accuracy", "compliance"):
        proc = mlperf_run("--sut", "spec", "--mode", mode, "--synthetic-acceptance-rates", "0.9,0.6", "--gamma", "3",
                          tokens=24)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "synthetic acceptance 0.90,0.60,0.40" in proc.stdout and "not the drafter's quality" in proc.stdout
    latest = filed(mlperf_run.results, "spec+synthetic-0.9,0.6", "SingleStream", "compliance", "latest")
    disclosed = json.loads((latest / "metrics.json").read_text())["speculative"]
    assert disclosed["synthetic_acceptance"] == "synthetic acceptance 0.90,0.60,0.40"
    assert len(disclosed["conditional_acceptance"]) == 3 and sum(disclosed["accepted_per_cycle"]) > 0
    sampled = mlperf_run("--sut", "spec", "--synthetic-acceptance-rates", "0.9", "--temperature", "0.7")
    assert sampled.returncode == 2 and "greedy only" in sampled.stderr.strip().splitlines()[-1]


def test_a_drafter_manifest_fails_another_drafts_hash_and_passes_its_own(mlperf_run, tiny_pair, tmp_path):
    """MLPerf v6.0 fixes the draft a speculative submission may use: `--manifest` names its checkpoint's hash."""
    from mlperf.checkpoint import fingerprint
    wrong, right = tmp_path / "wrong.json", tmp_path / "right.json"
    wrong.write_text(json.dumps({"drafter": "model", "checkpoint": fingerprint(tiny_pair / "target")}))
    right.write_text(json.dumps({"drafter": "model", "checkpoint": fingerprint(tiny_pair / "draft")}))
    failed = mlperf_run("--sut", "spec", "--mode", "compliance", "--manifest", str(wrong))
    assert failed.returncode == 1 and "is not the manifest's" in failed.stderr.strip().splitlines()[-1], \
        failed.stderr[-2000:]
    passed = mlperf_run("--sut", "spec", "--mode", "compliance", "--manifest", str(right))
    assert passed.returncode == 0 and "drafter manifest" in passed.stdout, passed.stderr[-2000:]
    baseline = mlperf_run("--sut", "baseline", "--mode", "compliance", "--manifest", str(right))  # drafts nothing
    assert baseline.returncode == 0 and "speculative" not in baseline.stdout


def log(tmp_path, *entries):
    hexed = lambda ids: np.array(ids, dtype=np.int32).tobytes().hex().upper()
    (tmp_path / "mlperf_log_accuracy.json").write_text(json.dumps([
        {"seq_id": i, "qsl_idx": i, "data": hexed(out), "token_data": hexed(out[:1] if first is None else first),
         "token_count": len(out) if count is None else count} for i, (out, first, count) in enumerate(entries)]))
    return tmp_path


@pytest.mark.parametrize("entry, message", [
    (([5, 6, 7], None, 4), "3 tokens in the output, 4 reported"),
    (([5, 6, 0, 0], None, None), "more than one EOS"),
    (([5, 6, 7], [6], None), "first token reported [6]"),
])
def test_each_rule_fails_what_it_should(tmp_path, entry, message):
    """Our rules, and MLCommons' own TEST06 script where its checkout is found, each fail the broken log."""
    result = check(log(tmp_path, ([1, 2, 0], None, None), entry), SingleStream(), eos_id=0)
    official = mlcommons.checkout() is not None
    assert not result["passed"] and message in result["failures"][0]
    assert result["failures"][1:] == (["MLCommons' TEST06 script failed it (TEST06/verify_accuracy.txt)"]
                                      if official else [])
    if official:
        assert "TEST06 verification failed" in (tmp_path / "TEST06" / "verify_accuracy.txt").read_text()
    passing = check(log(tmp_path, ([1, 2, 0], None, None)), SingleStream(), eos_id=0)
    assert passing["passed"] and passing["official"] == ("passed" if official else mlcommons.missing())


def test_offline_reports_no_first_token(tmp_path):
    assert check(log(tmp_path, ([5, 6, 7], [], None)), Offline(), eos_id=None)["passed"]
