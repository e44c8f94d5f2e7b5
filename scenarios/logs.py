"""Reading LoadGen's logs: the detail log (`:::MLLOG {json}` lines) and the accuracy log's response data."""
import json
from pathlib import Path

import numpy as np

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


def response_tokens(hex_data: str) -> list[int]:
    """The int32 token ids a SUT answered with, from the hex string LoadGen's accuracy log holds."""
    return np.frombuffer(bytes.fromhex(hex_data), dtype=np.int32).tolist()


def tokens_per_second(detail: dict, scenario: str) -> float | None:
    """LoadGen's own token throughput: Offline logs it under one key, SingleStream and Server under another."""
    return detail.get("result_tokens_per_second" if scenario == "Offline" else "result_completed_tokens_per_second")
