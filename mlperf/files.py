"""Files written whole or not at all: a temporary name beside the destination, then an atomic rename.

Every file another run reads (checkpoints, the peaks and reference caches, reports, results published after
a run) goes through `atomic`, so a crash, a signal or a full disk leaves the old file or none, never half.
"""
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable


def atomic(dest, write: Callable[[str], None]) -> None:
    """Call `write(tmp)` to fill a temporary file beside `dest`, then rename it to `dest`."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; these are ordinary shared files
    try:
        write(tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(dest, text: str) -> None:
    atomic(dest, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(dest, obj) -> None:
    write_text(dest, json.dumps(obj, indent=1) + "\n")


def read_text(path) -> str:
    """A text file a user gave, as UTF-8; a ValueError naming the file when it is not."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None


def read_json(path, what: str):
    """A JSON file another run wrote, or None (with one line on stderr saying so) when it does not parse."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        print(f"note: {path} is not valid JSON ({e}); {what}", file=sys.stderr, flush=True)
        return None
