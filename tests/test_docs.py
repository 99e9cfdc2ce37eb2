"""The runnable snippets of the documentation pages (``pycon`` blocks) run as doctests.

The pages in ``TORCH_PAGES`` need torch; the recipe pages also run against the installed
TRL or verl (a tiny local trainer, verl's own ``compute_advantage``) and are left out where
their framework is not installed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TORCH_PAGES = ["recipes-verl.md", "recipes-trl.md", "gram.md"]
FRAMEWORK = {"recipes-verl.md": "verl", "recipes-trl.md": "trl"}
# Every other page with a ``>>>`` snippet: a page that gains one is tested without a list edit.
PAGES = sorted(page.name for page in DOCS.glob("*.md")
               if page.name not in TORCH_PAGES and ">>> " in page.read_text(encoding="utf-8"))


def test_page_snippets_run() -> None:
    pages = PAGES + [page for page in TORCH_PAGES
                     if importlib.util.find_spec("torch") is not None
                     and importlib.util.find_spec(FRAMEWORK.get(page, "torch")) is not None]
    assert {"getting-started.md", "conformance.md", "estimators.md"} <= set(PAGES)
    for page in TORCH_PAGES:
        assert ">>> " in (DOCS / page).read_text(encoding="utf-8"), f"docs/{page}: no snippet"
    # pytest's doctest runner in a subprocess, so the pages' names stay out of this session.
    # No NUMBER or NORMALIZE_WHITESPACE here (the project's flags for docstrings): a page
    # shows exactly what the REPL prints, so a reader who pastes the example sees the same.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
         "-o", "doctest_optionflags=ELLIPSIS",
         "--doctest-glob=*.md", *(str(DOCS / page) for page in pages)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert f"{len(pages)} passed" in result.stdout, result.stdout[-2000:]


def test_recipe_pages_hold_only_runnable_blocks() -> None:
    # Every code block of a recipe page is a ``pycon`` block, so the run above executes it.
    for page in FRAMEWORK:
        lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
        fences = [line.strip()[3:] for line in lines if line.strip().startswith("```")]
        assert len(fences) % 2 == 0 and fences[0::2] == ["pycon"] * (len(fences) // 2), page


def test_pages_import_what_a_user_types() -> None:
    # A reader pastes the snippets without pytest; the skip where a framework is absent is
    # this module's (``FRAMEWORK``, ``TORCH_PAGES``), not the page's.
    for page in DOCS.glob("*.md"):
        text = page.read_text(encoding="utf-8")
        assert "importorskip" not in text and ">>> import pytest" not in text, page.name


def test_readme_module_table_names_every_public_module() -> None:
    # Public modules: no part of the dotted name private; a command's module is the CLI's.
    package = ROOT / "advcal"
    names = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] in ("__init__", "__main__"):
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts) or len(parts) < 2:
            continue
        names.add(".".join(parts[:2]) if parts[1] == "cli" else ".".join(parts))
    names -= {"advcal.io", "advcal.integrations"}  # folders: their modules are listed
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| module | what |"):]
    table = table[:table.index("\n\n")]
    missing = sorted(name for name in names if f"`{name}`" not in table)
    assert not missing, f"README.md's module table does not name {missing}"


def _public_objects() -> list[tuple[str, object]]:
    import advcal
    import advcal.simulate
    import advcal.torch

    found = []
    for module in (advcal, advcal.simulate, advcal.torch):
        for name in module.__all__:
            found.append((f"{module.__name__}.{name}", getattr(module, name)))
    return found


def test_every_public_function_has_a_runnable_example() -> None:
    import inspect

    lacking = [
        name for name, obj in _public_objects()
        if inspect.isfunction(obj)
        and not ("Examples\n--------" in (inspect.getdoc(obj) or "")
                 and ">>> " in (inspect.getdoc(obj) or ""))
    ]
    undocumented = [name for name, obj in _public_objects()
                    if inspect.isclass(obj) and not inspect.getdoc(obj)]
    assert not lacking, f"public functions without a runnable Examples section: {lacking}"
    assert not undocumented, f"public classes without a docstring: {undocumented}"


def test_api_page_covers_every_public_module() -> None:
    import inspect

    page = (DOCS / "api.md").read_text(encoding="utf-8")
    modules = {inspect.getmodule(obj).__name__ for _, obj in _public_objects()
               if (inspect.isfunction(obj) or inspect.isclass(obj))
               and inspect.getmodule(obj) is not None}
    missing = sorted(m for m in modules if f"::: {m}\n" not in page)
    assert not missing, f"docs/api.md has no section for {missing}"


def test_reader_facing_text_does_not_cite_the_internal_spec() -> None:
    # The pages, README, notebooks and public modules' docstrings must stand alone: a reader
    # of the site or of help() cannot open the project's internal specification.
    paths = [ROOT / "README.md", *DOCS.glob("*.md"), *(ROOT / "notebooks").glob("*.py"),
             *(ROOT / "advcal").rglob("*.py"),
             *(p for p in (ROOT / "tests").glob("*.py") if p.name != Path(__file__).name)]
    citing = [str(path.relative_to(ROOT)) for path in paths
              if "DESIGN" in path.read_text(encoding="utf-8")]
    assert not citing, f"cite DESIGN (the internal spec): {citing}"
