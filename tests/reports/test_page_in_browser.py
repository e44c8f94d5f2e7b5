"""The report page as people see it: rendered by headless Chromium (Debian's, driven by Playwright) at a laptop's
and a phone's width; fails on a page wider than the window, an image that did not load, a missing headline or a
console error. Its screenshots are written beside the page."""
import shutil

import pytest

from reports.render import build
from tests.reports.test_reports import runs  # noqa: F401 (the module's runs, made once)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SIZES = [(1280, 800), (390, 844)]
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium with a fresh profile (Playwright's), none of its calls out to a network this machine lacks."""
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.mark.parametrize("width, height", SIZES)
def test_the_report_page_renders_whole_at_a_laptops_and_a_phones_width(runs, browser, tmp_path, width,  # noqa: F811
                                                                        height):
    page_file = build(runs, tmp_path)
    page = browser.new_page(viewport={"width": width, "height": height})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_file.as_uri())
    page.wait_for_load_state("load")
    shot = page_file.parent / f"screenshot-{width}x{height}.png"
    page.screenshot(path=str(shot), full_page=True)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    broken = page.evaluate("[...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt)")
    cards = page.locator(".card").count()
    headline = page.locator(".card .big").first.inner_text()
    page.close()
    assert shot.read_bytes()[:4] == b"\x89PNG"
    assert overflow <= 0, f"the page is {overflow} px wider than a {width} px window"
    assert broken == [] and page_file.read_text().count("<img") >= 4
    assert cards == len(runs) and "tokens/s" in headline
    assert errors == []
