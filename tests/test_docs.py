"""The runnable snippets of the documentation pages (``pycon`` blocks) run as doctests.

The recipe pages' trainer glue needs verl or TRL and is illustrative, but their advcal calls
are in ``pycon`` blocks too; those pages need torch and are skipped without it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = ["getting-started.md", "conformance.md"]
TORCH_PAGES = ["recipes-verl.md", "recipes-trl.md"]


def test_page_snippets_run() -> None:
    pages = PAGES + (TORCH_PAGES if importlib.util.find_spec("torch") is not None else [])
    for page in PAGES + TORCH_PAGES:
        assert ">>> " in (DOCS / page).read_text(encoding="utf-8"), f"docs/{page}: no snippet"
    # pytest's doctest runner with the project's doctest flags (NUMBER, NORMALIZE_WHITESPACE,
    # from pyproject.toml), in a subprocess so the pages' names stay out of this session.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
         "--doctest-glob=*.md", *(str(DOCS / page) for page in pages)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert f"{len(pages)} passed" in result.stdout, result.stdout[-2000:]
