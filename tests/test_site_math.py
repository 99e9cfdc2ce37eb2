"""The built docs site renders its math in a browser without a network.

Run by ``make docs`` after the build (``ADVCAL_SITE_DIR=site``); skipped in the ordinary test
run, which has no site, and where no Chromium is installed (CI installs Debian's).  Every
page is served from 127.0.0.1 while every other host is unresolvable and loaded in headless
Chromium; its DOM after the scripts ran must hold no raw ``$`` / ``\\(`` / ``\\[``
delimiters outside code, and a page with math (arithmatex's markup, or a notebook) must hold
typeset math (MathJax's ``mjx-container``).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

SITE = os.environ.get("ADVCAL_SITE_DIR")
if not SITE:
    pytest.skip("ADVCAL_SITE_DIR not set (`make docs` runs this check on the built site)",
                allow_module_level=True)
SITE_DIR = Path(SITE).resolve()
BROWSER = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                if (found := shutil.which(name))), None)
if BROWSER is None:
    if os.environ.get("CI"):  # `make docs` installs chromium in CI: never skip there
        raise ImportError("tests/test_site_math.py needs chromium (apt-get install chromium)")
    pytest.skip("no chromium to render the site with", allow_module_level=True)

PAGES = sorted(str(p.relative_to(SITE_DIR)) for p in SITE_DIR.rglob("index.html"))
NOTEBOOK_PAGES = [page for page in PAGES if page.startswith("notebooks/")]
# Pages with math: arithmatex's markup, or a notebook (its markdown cells keep $...$).
MATH_PAGES = [page for page in PAGES if page in NOTEBOOK_PAGES or
              'class="arithmatex"' in (SITE_DIR / page).read_text(encoding="utf-8")]
_SKIPPED = {"script", "style", "code", "pre", "textarea", "mjx-container", "noscript", "svg"}
_RAW_MATH = re.compile(r"\$|\\\(|\\\)|\\\[|\\\]")


class _Text(HTMLParser):
    """Visible prose outside code and typeset math, and the count of typeset formulas."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.text: list[str] = []
        self.formulas = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "mjx-container":
            self.formulas += 1
        if tag in _SKIPPED:
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth == 0:
            self.text.append(data)


REQUESTED: list[str] = []  # paths the local server was asked for


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        REQUESTED.append(self.path)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(SITE_DIR))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
        httpd.shutdown()


def _rendered_dom(url: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [BROWSER, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", f"--user-data-dir={profile}",
             # offline: any host but the local server fails to resolve
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
             "--virtual-time-budget=20000", "--dump-dom", url],
            capture_output=True, text=True, timeout=180,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_site_has_pages_to_check() -> None:
    assert NOTEBOOK_PAGES, f"no notebook pages under {SITE_DIR}/notebooks"
    assert {"index.html", "maxnorm/index.html"} <= set(MATH_PAGES), MATH_PAGES


def test_no_page_loads_a_script_or_font_from_another_host() -> None:
    remote = re.compile(r"""<(?:script|link)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//""")
    offenders = [str(p.relative_to(SITE_DIR)) for p in SITE_DIR.rglob("*.html")
                 if remote.search(p.read_text(encoding="utf-8"))]
    assert not offenders, offenders


@pytest.mark.parametrize("page", PAGES)
def test_math_is_typeset_offline(server: str, page: str) -> None:
    REQUESTED.clear()
    dom = _rendered_dom(server + page.removesuffix("index.html"))
    parser = _Text()
    parser.feed(dom)
    if page in MATH_PAGES:
        assert parser.formulas > 0, f"{page}: no typeset math (mjx-container)"
        # The glyphs are CSS rules MathJax adds through the CSSOM, absent from the DOM: a
        # glyph font fetched from the site shows they were laid out (not blank formulas).
        fonts = [path for path in REQUESTED if "/fonts/woff-v2/" in path
                 and "MathJax_Zero" not in path]
        assert fonts, f"{page}: MathJax drew no glyph (no font of the site was loaded)"
    assert "<mjx-merror" not in dom, f"{page}: a TeX error"
    text = " ".join(parser.text)
    raw = [text[max(0, m.start() - 40):m.end() + 40] for m in _RAW_MATH.finditer(text)]
    assert not raw, f"{page}: raw math delimiters left in the text: {raw[:5]}"
