"""MkDocs hook: publish the notebooks of ``notebooks/`` under ``notebooks/`` on the site.

The notebooks live beside the code (not in ``docs/``) so that the tests execute them from
the repository root; this hook adds them to the site's files before mkdocs-jupyter turns
``.ipynb`` files into pages (hence the high event priority).  Only ``*.ipynb`` files are
added; helper scripts in this folder are not published.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

NOTEBOOK_DIR = Path(__file__).resolve().parent


@event_priority(100)
def on_files(files: Files, config: Any) -> Files:
    for path in sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        files.append(
            File(
                f"notebooks/{path.name}",
                src_dir=str(NOTEBOOK_DIR.parent),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files
