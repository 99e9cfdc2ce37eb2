"""MkDocs hooks of the docs site (registered in ``mkdocs.yml``).

* Notebooks: the notebooks live beside the code in ``notebooks/`` (not in ``docs/``) so that
  the tests execute them from the repository root; ``on_files`` adds every ``*.ipynb`` of this
  folder to the site under ``notebooks/`` before mkdocs-jupyter turns ``.ipynb`` files into
  pages (hence the high event priority).  Helper scripts here are not published.
* Sphinx roles: the numpydoc docstrings cross-reference with Sphinx roles
  (``:func:`grpo```), which mkdocstrings renders literally.  ``on_page_content`` turns each
  role into a link to the object's anchor on the same page when the page documents it, and
  into plain code otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

NOTEBOOK_DIR = Path(__file__).resolve().parent

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|data|attr|mod|obj|exc):<code>~?([\w.]+)</code>")
_ANCHOR = re.compile(r'id="(advcal(?:\.\w+)+)"')


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


def on_page_content(html: str, **kwargs: Any) -> str:
    anchors: dict[str, str] = {}
    for anchor in _ANCHOR.findall(html):
        parts = anchor.split(".")
        # "grpo", "advcal.grpo" and "RangeCalibration.ranges" all name advcal.estimators.grpo
        # etc.; the first anchor seen for a short name wins (module order on the page).
        for key in (parts[-1], "advcal." + parts[-1], ".".join(parts[-2:]), anchor):
            anchors.setdefault(key, anchor)

    def link(match: re.Match[str]) -> str:
        name = match.group(1)
        shown = name.split(".")[-1] if match.group(0).find("~") >= 0 else name
        target = anchors.get(name)
        code = f"<code>{shown}</code>"
        return f'<a href="#{target}">{code}</a>' if target else code

    return _ROLE.sub(link, html)
