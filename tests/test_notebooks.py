"""The coverage notebooks: committed without outputs, in sync with their generator, and each
executed top to bottom at reduced size (each ends with an assertion of its property)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

if importlib.util.find_spec("nbclient") is None or importlib.util.find_spec("nbformat") is None:
    if os.environ.get("CI"):  # CI must execute the notebooks, never skip them silently
        raise ImportError("tests/test_notebooks.py needs nbclient, nbformat, ipykernel and "
                          "matplotlib (the dev extra).")
    pytest.skip("nbclient/nbformat not installed", allow_module_level=True)

import nbformat  # noqa: E402
from nbclient import NotebookClient  # noqa: E402

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
IDS = [path.stem for path in NOTEBOOKS]


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  NOTEBOOK_DIR / "make_notebooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_notebook_is_committed_and_current() -> None:
    generator = _generator()
    assert sorted(generator.NOTEBOOKS) == [path.name for path in NOTEBOOKS]
    for path in NOTEBOOKS:
        expected = generator.render(generator.NOTEBOOKS[path.name])
        assert path.read_text(encoding="utf-8") == expected, (
            f"{path.name} differs from notebooks/make_notebooks.py; regenerate it with "
            "`.venv/bin/python notebooks/make_notebooks.py`."
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_ends_with_an_assertion(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    last_code = [cell for cell in nb.cells if cell.cell_type == "code"][-1]
    assert "assert " in last_code.source, path.name
    assert "ADVCAL_NOTEBOOK_SIZE" in nb.cells[1].source, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_runs_at_reduced_size(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel inherits this process's environment: reduced size, no GUI backend.
    monkeypatch.setenv("ADVCAL_NOTEBOOK_SIZE", "reduced")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute()  # raises CellExecutionError, with the failing cell, on any error
    streams = "".join(
        output.get("text", "")
        for cell in nb.cells if cell.cell_type == "code"
        for output in cell.outputs if output.get("output_type") == "stream"
    )
    assert "size: reduced" in streams
