"""MLPerf's LLM compliance test TEST06, checked on our own runs.

LoadGen runs in performance mode with accuracy-log sampling (at least 100 queries, no minimum duration, every
sample's output logged); the checker then reads mlperf_log_accuracy.json and applies TEST06's three rules to
every logged sample: the tokens reported through FirstTokenComplete begin the final output (not checked in
Offline, which reports no first token), the output has as many tokens as the count passed to LoadGen, and it
ends in at most one EOS token. MLCommons' own TEST06 script checks the same log too (scenarios/mlcommons.py), and
the run passes only if both do.
"""
import json
from pathlib import Path

from mlperf.files import write_json, write_text
from scenarios import mlcommons, speculation
from scenarios.logs import response_tokens
from scenarios.scenario import Scenario

QUERIES = 100
LAYER = ("TEST06", f"""\
*.*.min_query_count = {QUERIES}
*.*.min_duration = 0
*.*.accuracy_log_sampling_target = {QUERIES}
*.*.accuracy_log_rng_seed = 720381539243781796
*.*.sample_concatenate_permutation = 0
""")  # TEST06's audit.config, under every profile (equal issue off), as MLCommons runs it


def check(run_dir, scenario: Scenario, eos_id: int | None, manifest: str | None = None) -> dict:
    """Apply the rules to every logged sample, and a speculative SUT's (scenarios/speculation.py: its greedy outputs
    the baseline's, its drafter the manifest's); write compliance.json and compliance.txt (PASS or FAIL)."""
    run_dir = Path(run_dir)
    entries = json.loads((run_dir / "mlperf_log_accuracy.json").read_text())
    failures = []
    for e in entries:
        out, where = response_tokens(e["data"]), f"sample {e['qsl_idx']} (seq {e['seq_id']})"
        first = response_tokens(e.get("token_data", ""))
        if scenario.first_tokens and (not first or out[:len(first)] != first):
            failures.append(f"{where}: first token reported {first}, but the output begins {out[:3]}")
        if len(out) != e["token_count"]:
            failures.append(f"{where}: {len(out)} tokens in the output, {e['token_count']} reported to LoadGen")
        if eos_id is not None and out[-2:] == [eos_id, eos_id]:
            failures.append(f"{where}: the output ends in more than one EOS token")
    official = mlcommons.verify_test06(run_dir, scenario, eos_id, run_dir)  # writes TEST06/verify_accuracy.txt
    if official is False:
        failures.append("MLCommons' TEST06 script failed it (TEST06/verify_accuracy.txt)")
    speculative = speculation.check(run_dir, manifest) if (run_dir / "metrics.json").is_file() else \
        {"checked": False, "failures": []}  # a log checked alone, with no run record: TEST06's rules only
    failures += speculative["failures"]
    result = {"test": "TEST06", "samples_checked": len(entries), "passed": bool(entries) and not failures,
              "failures": failures if entries else ["the accuracy log holds no samples"],
              "eos_rule": "checked" if eos_id is not None else "not applicable: the tokenizer has no EOS token",
              "official": {True: "passed", False: "failed", None: mlcommons.missing()}[official],
              "speculative": speculative}
    write_json(run_dir / "compliance.json", result)
    verdict = "PASS" if result["passed"] else "FAIL"
    lines = [f"TEST06 {verdict}: {len(entries)} logged samples checked ({scenario}); EOS rule {result['eos_rule']}; "
             f"MLCommons' own TEST06 script: {result['official']}"]
    if speculative["checked"]:
        lines.append(f"speculative (MLPerf v6.0's rules): greedy identity with the baseline "
                     f"{speculative['greedy_identity']}; drafter manifest {speculative['manifest']}")
    lines += [f"  {f}" for f in result["failures"][:20]]
    write_text(run_dir / "compliance.txt", "\n".join(lines) + "\n")
    return result
