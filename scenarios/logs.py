"""Reading LoadGen's detail log (`:::MLLOG {json}` lines)."""
import json
from pathlib import Path

MLLOG = ":::MLLOG "


def read_detail(run_dir) -> dict:
    """Every key LoadGen logged in mlperf_log_detail.txt, with its value (the last one wins)."""
    values = {}
    for line in (Path(run_dir) / "mlperf_log_detail.txt").read_text(errors="replace").splitlines():
        if line.startswith(MLLOG):
            try:
                entry = json.loads(line[len(MLLOG):])
            except json.JSONDecodeError:
                continue
            values[entry.get("key")] = entry.get("value")
    return values


def tokens_per_second(detail: dict, scenario: str) -> float | None:
    """LoadGen's own token throughput: Offline logs it under one key, SingleStream and Server under another."""
    return detail.get("result_tokens_per_second" if scenario == "Offline" else "result_completed_tokens_per_second")
