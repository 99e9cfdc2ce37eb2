"""The coverage notebooks: jupytext percent-format scripts in ``notebooks/`` (the source of
truth; no ``.ipynb`` is committed), each published on the docs site and executed top to bottom
at reduced size (each ends with an assertion of its property)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest

_NEEDED = ("nbclient", "nbformat", "jupytext")
if any(importlib.util.find_spec(name) is None for name in _NEEDED):
    if os.environ.get("CI"):  # CI must execute the notebooks, never skip them silently
        raise ImportError("tests/test_notebooks.py needs nbclient, nbformat, jupytext, "
                          "ipykernel and matplotlib (the dev extra).")
    pytest.skip("nbclient/nbformat/jupytext not installed", allow_module_level=True)

import jupytext  # noqa: E402
import nbformat  # noqa: E402
from nbclient import NotebookClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
# Notebooks are named NN-title.py; other .py files there (the mkdocs hook) are not notebooks.
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]-*.py"))
IDS = [path.stem for path in NOTEBOOKS]


def test_notebooks_found() -> None:
    assert len(NOTEBOOKS) >= 4, NOTEBOOKS
    # A local `jupytext --to ipynb` copy is fine; a committed one would be neither tested nor
    # published.
    tracked = subprocess.run(["git", "ls-files", "notebooks/*.ipynb"], cwd=ROOT,
                             capture_output=True, text=True, check=False).stdout.split()
    assert not tracked, (
        f"{tracked}: notebooks are jupytext percent-format scripts, notebooks/NN-name.py; "
        "write the notebook as one (`jupytext --to py:percent NAME.ipynb`)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_percent_format_and_valid(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "format_name: percent" in text and "\n# %%" in text, path.name
    nb = jupytext.read(path)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3", path.name
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_ends_with_an_assertion(path: Path) -> None:
    nb = jupytext.read(path)
    last_code = [cell for cell in nb.cells if cell.cell_type == "code"][-1]
    assert "assert " in last_code.source, path.name
    assert "ADVCAL_NOTEBOOK_SIZE" in nb.cells[1].source, path.name


def test_every_notebook_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r"notebooks/([0-9][0-9]-[\w.-]+\.py)\s*$", nav, flags=re.MULTILINE))
    assert listed == {path.name for path in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_runs_at_reduced_size(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel inherits this process's environment: reduced size.
    monkeypatch.setenv("ADVCAL_NOTEBOOK_SIZE", "reduced")
    # The inline backend, as on the docs site, so that the figures are outputs to count.
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = jupytext.read(path)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute()  # raises CellExecutionError, with the failing cell, on any error
    streams = "".join(
        output.get("text", "")
        for cell in nb.cells if cell.cell_type == "code"
        for output in cell.outputs if output.get("output_type") == "stream"
    )
    assert "size: reduced" in streams
    figures = sum("image/png" in output.get("data", {})
                  for cell in nb.cells if cell.cell_type == "code" for output in cell.outputs)
    assert figures >= 1, f"{path.name} drew no figure"
