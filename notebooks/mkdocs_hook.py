"""MkDocs hooks of the docs site (registered in ``mkdocs.yml``).

* Notebooks: the notebooks are jupytext percent-format scripts that live beside the code in
  ``notebooks/`` (not in ``docs/``) so that the tests execute them from the repository root;
  ``on_files`` adds every ``notebooks/NN-*.py`` to the site under ``notebooks/`` before
  mkdocs-jupyter turns them into pages (hence the high event priority).  This hook file is
  not published.
* Math without a network: the site serves MathJax itself.  ``on_files`` adds the browser
  build of the npm package ``mathjax`` (version 3; ``make docs`` installs it under
  ``.venv/docs-npm``, or set ``ADVCAL_MATHJAX`` to its ``es5`` folder) under
  ``javascripts/mathjax/``, and ``docs/javascripts/mathjax.js`` configures it for both
  arithmatex's ``\\(…\\)`` and the notebooks' ``$…$``.  Notebook pages lose the inert
  MathJax 2 loader that nbconvert's template writes.
* Sphinx roles: the numpydoc docstrings cross-reference with Sphinx roles
  (``:func:`grpo```), which mkdocstrings renders literally.  ``on_page_content`` turns each
  role into a link to the object's anchor on the same page when the page documents it, and
  into plain code otherwise.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

NOTEBOOK_DIR = Path(__file__).resolve().parent
ROOT = NOTEBOOK_DIR.parent
MATHJAX_DEFAULT = ROOT / ".venv" / "docs-npm" / "node_modules" / "mathjax" / "es5"
# The one combined component the pages load (every TeX extension, CommonHTML output), its
# fonts, and what its right-click menu loads on demand (accessibility, speech).
MATHJAX_PARTS = ("tex-chtml-full.js", "output/chtml/fonts/woff-v2", "a11y", "sre", "ui")

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|data|attr|mod|obj|exc):<code>~?([\w.]+)</code>")
_ANCHOR = re.compile(r'id="(advcal(?:\.\w+)+)"')
# nbconvert's MathJax 2 loader: an empty src (mkdocs-jupyter's custom_mathjax_url) and a
# text/x-mathjax-config block that MathJax 3 ignores.
_NB_MATHJAX2 = re.compile(
    r'<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->', re.DOTALL)


def _mathjax_dir() -> Path:
    es5 = Path(os.environ.get("ADVCAL_MATHJAX", MATHJAX_DEFAULT))
    package = es5.parent / "package.json"
    if not (es5 / MATHJAX_PARTS[0]).is_file() or not package.is_file():
        raise PluginError(
            f"MathJax not found at {es5}: `make docs` installs the npm package mathjax@3 "
            "there, or set ADVCAL_MATHJAX to the es5 folder of an installed mathjax@3.")
    version = json.loads(package.read_text(encoding="utf-8"))["version"]
    if not version.startswith("3."):
        raise PluginError(f"docs/javascripts/mathjax.js configures MathJax 3; found {version}")
    return es5


@event_priority(100)
def on_files(files: Files, config: Any) -> Files:
    for path in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]-*.py")):
        files.append(
            File(
                f"notebooks/{path.name}",
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    es5 = _mathjax_dir()
    for part in MATHJAX_PARTS:
        source = es5 / part
        for path in sorted([source] if source.is_file() else source.rglob("*")):
            if path.is_file():
                uri = "javascripts/mathjax/" + path.relative_to(es5).as_posix()
                files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri.startswith("notebooks/"):
        html = _NB_MATHJAX2.sub("", html)
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
