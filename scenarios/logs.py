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
