"""The guide agrees with the code: no dates or commit ids in the README and the guide pages (figures and history
live in the record), every default a page states is the code's, and the defaults table is the code's output."""
import re

import pytest

from commands import defaults
from commands.smoke import GATE
from suts.drafting import GAMMA
from suts.fast.step import WEIGHTS
from scenarios.config import RunConfig
from scenarios.scenario import SERVER_TOKEN_BUDGET
from tests.helpers import ROOT

INDEX = ROOT / "docs" / "index.md"
RECORD = {"measurements.md", "history.md"}  # the record: every figure with its command, machine and commit
GUIDE = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in RECORD),
         ROOT / "labs" / "README.md", *sorted((ROOT / "labs").glob("*/README.md"))]
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMIT = re.compile(r"(?<![\w-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
TABLE = re.compile(r"<!-- defaults: python -m mlperf defaults -->\n(.*?)<!-- /defaults -->", re.S)
# What a page may say of a default, and the code's value: each pattern's group is the value the page states
STATED = [
    (r"gamma['’]?s? (?:\w+ ){0,3}default (?:is |of )?(\d+)", str(GAMMA)),
    (r"gamma[^.;|]{0,30}\(default:? (\d+)", str(GAMMA)),
    (r"default gamma(?: of| is)? (\d+)", str(GAMMA)),
    (r"gamma (\d+)[,;]? \(?(?:is |as )?the default", str(GAMMA)),
    (r"max[-_ ]batch`?[^.;|]{0,30}\(?default:? (\d+)", str(RunConfig.max_batch)),
    (r"token[-_ ]budget`?[^.;|]{0,40}\(default:? (\d+)", str(SERVER_TOKEN_BUDGET)),
    (r"--gate`?[^.;|]{0,20}\(default:? ([\d.]+)\)", str(GATE)),
    (r"default weights?(?: are| is)? `?(fp32|fp16|int8)", WEIGHTS),
    (r"weights[^.;|]{0,30}\(default:? `?(fp32|fp16|int8)", WEIGHTS),
    (r"`--weights (fp32|fp16|int8)`[^.;|]{0,40}opt[- ]in", "not opt-in"),
]


def misstated(text: str) -> list[str]:
    """Each default `text` states that the code does not have, as 'stated -> the code's'."""
    flat = re.sub(r"\s+", " ", text)
    return [f"{m.group(0)!r}: the code's is {value}" for pattern, value in STATED
            for m in re.finditer(pattern, flat, re.I) if m.group(1) != value]


@pytest.mark.parametrize("page", GUIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_guide_holds_no_dates_and_no_commit_ids(page):
    text = page.read_text()
    assert not DATE.findall(text) and not COMMIT.findall(text), (DATE.findall(text), COMMIT.findall(text))


def test_the_readme_is_at_most_200_lines_and_the_index_splits_guide_and_record():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    index = INDEX.read_text()
    guide, record = index.split("## Guide")[1].split("## Record")
    assert all(f"({name})" in record for name in RECORD)
    linked = set(re.findall(r"\]\(([\w./-]+\.md)\)", guide))
    pages = {p.name for p in GUIDE if p.parent.name == "docs" and p != INDEX} | {"../labs/README.md"}
    assert pages <= linked, pages - linked


def test_a_page_that_states_another_default_fails():
    assert misstated("The gamma's default is 6, and a run drafts more.")
    assert misstated("each cycle drafts gamma tokens (default 6)")
    assert misstated("`--weights fp16` streams half the bytes, an opt-in for now")
    assert misstated("rows decode together (`--max-batch`, default 16)")
    assert not misstated(f"gamma tokens a cycle (default {GAMMA}); `MAX_BATCH` (default {RunConfig.max_batch})")


@pytest.mark.parametrize("page", GUIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_default_the_guide_states_is_the_codes(page):
    assert misstated(page.read_text()) == []


def test_the_defaults_table_is_the_codes_output():
    tables = [TABLE.search(p.read_text()) for p in GUIDE]
    found = [t.group(1) for t in tables if t]
    assert found and all(t == defaults.markdown() for t in found), "run `python -m mlperf defaults` into the page"
