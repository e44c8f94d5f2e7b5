"""The offline training corpus: the Python standard library's own .py sources, split into train and held-out files.

A file is held out when sha1(relative path) mod 20 == 0, a rule that depends only on the path, so the split is
the same on every Python version and never moves a file between the sides as the library grows.
Tests, idlelib and site-packages are left out.
"""
import hashlib
import sysconfig
from pathlib import Path

import numpy as np

EXCLUDED_PARTS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}
HELDOUT_MODULUS = 20
SEPARATOR = b"\n\n"  # between files in the concatenated corpus


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path | None = None) -> list[str]:
    """Sorted relative paths of every corpus file under the standard library."""
    root = root or stdlib_root()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if EXCLUDED_PARTS.isdisjoint(rel.parts[:-1]) and not rel.name.startswith("test_"):
            files.append(rel.as_posix())
    return sorted(files)


def is_heldout(relpath: str) -> bool:
    return int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % HELDOUT_MODULUS == 0


def split(root: Path | None = None) -> tuple[list[str], list[str]]:
    """(train files, held-out files)."""
    files = corpus_files(root)
    return [f for f in files if not is_heldout(f)], [f for f in files if is_heldout(f)]


def file_list_hash(files: list[str]) -> str:
    return hashlib.sha256("\n".join(files).encode()).hexdigest()[:16]


def load_bytes(files: list[str], root: Path | None = None) -> np.ndarray:
    """The files' bytes concatenated with a blank-line separator, as a uint8 array (the byte tokenizer's ids)."""
    root = root or stdlib_root()
    return np.frombuffer(SEPARATOR.join((root / f).read_bytes() for f in files), dtype=np.uint8)
