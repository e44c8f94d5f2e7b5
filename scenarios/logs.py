"""Reading LoadGen's logs: the detail log (`:::MLLOG {json}` lines) and the accuracy log's response data."""
import json
from pathlib import Path

import numpy as np

from scenarios.scenario import Scenario

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


def check_complete(run_dir, scenario: Scenario, mode: str) -> None:
    """Raise ValueError unless LoadGen's logs hold everything the harness reads from them: a log cut short (a
    full disk, a file-size limit) must fail the run, not be published with its figures missing. (That an
    accuracy log holds every sample is the accuracy checker's rule.)"""
    run_dir = Path(run_dir)
    summary = run_dir / "mlperf_log_summary.txt"
    if not summary.is_file() or "encountered during test" not in summary.read_text(errors="replace").lower():
        raise ValueError(f"{summary} is missing or incomplete (no errors line): LoadGen could not write its logs")
    detail = read_detail(run_dir) if (run_dir / "mlperf_log_detail.txt").is_file() else {}
    wanted = ["power_end"] + (["result_validity", "num_errors", scenario.tokens_key]
                              if mode != "accuracy" else [])
    missing = [key for key in wanted if key not in detail]
    if missing:
        raise ValueError(f"{run_dir / 'mlperf_log_detail.txt'} is incomplete (no {', '.join(missing)}): "
                         f"LoadGen could not write its logs")
    if mode in ("accuracy", "compliance"):
        try:
            entries = json.loads((run_dir / "mlperf_log_accuracy.json").read_text())
            if not all(isinstance(e, dict) and "qsl_idx" in e for e in entries):
                raise ValueError("an entry names no sample")
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"{run_dir / 'mlperf_log_accuracy.json'} is unreadable or cut short ({e})") from None


def response_tokens(hex_data: str) -> list[int]:
    """The int32 token ids a SUT answered with, from the hex string LoadGen's accuracy log holds."""
    return np.frombuffer(bytes.fromhex(hex_data), dtype=np.int32).tolist()


def tokens_per_second(detail: dict, scenario: Scenario) -> float | None:
    """LoadGen's own token throughput, None if it logged none."""
    return detail.get(scenario.tokens_key)


def token_latencies_s(detail: dict) -> tuple[float, float] | None:
    """LoadGen's mean time to first token and mean time per output token after it (each sample's (latency - TTFT) /
    (tokens - 1), averaged over samples), in seconds; None unless it measured token latencies."""
    keys = ("result_first_token_mean_latency_ns", "result_time_to_output_token_mean")
    return tuple(detail[k] / 1e9 for k in keys) if all(k in detail for k in keys) else None
