"""What a guide page names exists: every repository path, every `file.py`'s name, every section a page cites, every
default a page states beside a flag; docs/cli.md is the parsers' own reference. Each check is shown to fail on a
mutated page."""
import argparse
import re

import pytest

from commands.cli import parser
from commands.reference import PAGE, cell, commands, page, stated_default
from tests.helpers import ROOT
from tests.test_docs import GUIDE

TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} - {"results", "runs", "mylabs"}
PATH = re.compile(r"`([\w.-]+(?:/[\w.*-]+)+/?)(?::[\w.]+)?`")  # `suts/fast/kernels/*`, `commands/smoke.py:main`
NAMED = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.py)(?:`'s `|:)([A-Za-z_]\w*)")  # `choice.py`'s `choose`, `a/b.py:fn`
CITED = re.compile(r"([\w/.-]+\.md)\)?[,:]? \(?\"([^\"]{3,90})\"")  # running.md, "In CI"
HERE = re.compile(r"\"([^\"]{3,90})\" (?:below|above)|\bsee \"([^\"]{3,90})\"")  # "X" below; see "X"
FLAG_DEFAULT = re.compile(r"(--[a-z][a-z-]+|\b[A-Z][A-Z_]{2,}\b)`?(?: [^.;|()`]{0,30}|[,:]?)? ?\(?default:? ([^).;,]+)")
PAGES = [p for p in GUIDE if p != PAGE]
ids = {"ids": lambda p: str(p.relative_to(ROOT))}


def missing_paths(text: str) -> list[str]:
    """Repository paths a page names that no file or folder matches (a folder or file name in capitals is a
    placeholder: NAME, DIR)."""
    return [p for p in PATH.findall(text) if p.split("/")[0] in TOP and not any(part.isupper() for part in
                                                                                 p.split("/"))
            and not list(ROOT.glob(p.rstrip("/")))]


def undefined_names(text: str) -> list[str]:
    """`file.py`'s `name` (or `file.py:name`) where that file defines no such name."""
    found = []
    for path, name in NAMED.findall(text):
        files = [ROOT / path] if "/" in path else [f for f in ROOT.rglob(path) if ".venv" not in f.parts]
        defined = re.compile(rf"^\s*(?:def|class) {name}\b|^\s*{name}\b\s*[:=]", re.M)
        if not any(f.is_file() and defined.search(f.read_text()) for f in files):
            found.append(f"{path}: {name}")
    return found


def headings(page_path) -> list[str]:
    """A page's section titles: its headings and the bold words that open a paragraph (a run-in heading)."""
    lines = page_path.read_text().splitlines()
    titles = [line.lstrip("#") for line in lines if line.startswith("#")]
    titles += [m.group(1) for line in lines if (m := re.match(r"^\*\*([^*]+)\*\*", line))]
    return [title.strip().replace("`", "").lower() for title in titles]


def dangling_sections(text: str, where) -> list[str]:
    """Sections a page cites ("page.md, "Title"", or ""Title" below" in its own) that the page has no heading for."""
    flat = re.sub(r"\s+", " ", text)
    cited = [(name, title) for name, title in CITED.findall(flat)] + [(None, a or b) for a, b in HERE.findall(flat)]
    found = []
    for name, title in cited:
        candidates = [where] if name is None else [where.parent / name, ROOT / name, ROOT / "docs" / name]
        target = next((c for c in candidates if c.is_file()), None)
        wanted = title.replace("`", "").lower()
        if target is None or not any(h.startswith(wanted) for h in headings(target)):
            found.append(f"{name or where.name}: {title!r}")
    return found


def flag_defaults() -> dict[str, set[str]]:
    """Every flag's defaults over the commands: argparse's, else the one its help states."""
    found = {}
    for sub in commands(parser()).values():
        for action in sub._actions:
            stated = stated_default(cell(action.help or ""))[1]
            default = action.default if action.default not in (None, argparse.SUPPRESS, False) else stated
            for flag in action.option_strings:
                if str(default):
                    found.setdefault(flag, set()).add(str(default).strip("`").lower())
    return found


def misstated_flag_defaults(text: str, known: dict[str, set[str]]) -> list[str]:
    """`--flag` or its make variable, then "default X" nearby, where X is none of the flag's defaults (a number
    exactly, words within one)."""
    found = []
    for flag, value in FLAG_DEFAULT.findall(re.sub(r"\s+", " ", text)):
        flag = flag if flag.startswith("--") else "--" + flag.lower().replace("_", "-")
        value = value.strip().strip("`").lower()
        if flag not in known:
            continue
        if not any(value == d if value.replace(".", "").isdigit() else value in d or d in value for d in known[flag]):
            found.append(f"{flag} default {value!r}: the code's {sorted(known[flag])}")
    return found


def test_the_cli_reference_is_the_parsers():
    assert PAGE.read_text() == page(parser()), "make docs: docs/cli.md differs from the parsers"


@pytest.mark.parametrize("doc", PAGES, **ids)
def test_every_path_and_name_a_page_gives_exists(doc):
    text = doc.read_text()
    assert missing_paths(text) == [] and undefined_names(text) == []


@pytest.mark.parametrize("doc", PAGES, **ids)
def test_every_section_a_page_cites_exists(doc):
    assert dangling_sections(doc.read_text(), doc) == []


@pytest.mark.parametrize("doc", PAGES, **ids)
def test_every_default_a_page_states_beside_a_flag_is_the_codes(doc):
    assert misstated_flag_defaults(doc.read_text(), flag_defaults()) == []


def test_each_check_fails_on_a_mutated_page():
    running = ROOT / "docs" / "running.md"
    assert missing_paths("cached on `hashFiles(x)` of `suts/*.c` and `suts/fast/kernels/*`") == ["suts/*.c"]
    assert undefined_names("`suts/fast/fused.py`'s `choose` picks") == ["suts/fast/fused.py: choose"]
    assert undefined_names("`choice.py`'s `choose` picks") == []
    assert dangling_sections('as [measurements](measurements.md), "The smoke gate\'s rounds" says', running)
    assert dangling_sections('see "Exit codes" below', running) == []
    assert dangling_sections('see "Exit kodes" below', running)
    assert dangling_sections('drafts a tree (see "Token trees")', ROOT / "docs" / "suts.md")
    known = flag_defaults()
    assert misstated_flag_defaults("rows decode together (`MAX_BATCH`, default 16)", known)
    assert misstated_flag_defaults("torch threads (`--threads`, default all the cores)", known)
    assert misstated_flag_defaults("`--max-new-tokens` (default 12)", known)
    assert not misstated_flag_defaults("rows decode together (`MAX_BATCH`, default 8); `--gamma` (default 5)", known)
    assert page(parser()).replace("(default", "(default", 1) == PAGE.read_text()
    mutated = PAGE.read_text().replace("| `--rounds` | `3` |", "| `--rounds` | `4` |")
    assert mutated != page(parser())
