"""The lab kit's shell (the Makefile, CI's script, the Gradescope scripts the kit writes) spelled as macOS's BSD tools
and bash 3.2 also take it: no GNU-only options or commands."""
import re

from labs import classroom
from tests.helpers import ROOT

GNU_ONLY = {  # spelling -> why: what BSD/macOS lacks
    r"\bsed -i(?![ ]*'')": "sed -i without a suffix argument (BSD sed needs one: sed -i '' ...)",
    r"\breadlink -f\b": "readlink -f (macOS before 12.3 lacks it)",
    r"\bnproc\b": "nproc (macOS: sysctl -n hw.ncpu)",
    r"(?<![\w.-])timeout \d": "timeout (GNU coreutils; not on macOS)",
    r"\bgrep -P\b": "grep -P (BSD grep has no PCRE)",
    r"\bdate -d\b": "date -d (BSD date: -j -f)",
    r"\bstat -c\b": "stat -c (BSD stat: -f)",
    r"\bxargs -r\b": "xargs -r (BSD xargs: the default)",
    r"\bmktemp -p\b": "mktemp -p (BSD mktemp: a template)",
    r"\bdeclare -A\b": "associative arrays (bash 3.2, macOS's, has none)",
}


def shell_sources() -> dict[str, str]:
    return {"Makefile": (ROOT / "Makefile").read_text(), ".ci/run": (ROOT / ".ci" / "run").read_text(),
            "labs/classroom.py SETUP": classroom.SETUP, "labs/classroom.py RUN": classroom.RUN}


def test_no_gnu_only_spellings_in_the_kits_shell():
    found = [f"{name}: {why}" for name, text in shell_sources().items() for pattern, why in GNU_ONLY.items()
             if re.search(pattern, text)]
    assert not found, found


def test_the_scan_finds_what_it_looks_for():
    for bad in ("sed -i 's/a/b/' f", "X=$(nproc)", "timeout 60 make", "readlink -f x", "declare -A m"):
        assert any(re.search(pattern, bad) for pattern in GNU_ONLY), bad
    assert not any(re.search(pattern, "sed -i '' 's/a/b/' f") for pattern in GNU_ONLY)
