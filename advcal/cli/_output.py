"""What the commands print and draw, written once: numbers for JSON, the SRGO table, the
progress bar on stderr, and the checks and saving of figures and calibration targets.

Every problem found here is a :class:`~advcal.cli._errors.CommandError` (one line, exit
code 2), raised before the work where it can be (targets, matplotlib, plot formats).
"""

from __future__ import annotations

import math
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from advcal import _files
from advcal.cli._errors import CommandError, describe, printable

# --------------------------------------------------------------------------- numbers


def _finite(value: float | None) -> float | None:
    """``value`` as a float for JSON, or None where it is missing or not finite (JSON has
    no NaN or infinity)."""
    return None if value is None or not math.isfinite(value) else float(value)


class Column(NamedTuple):
    """A column of :func:`srgo_table`: header, width and how a row's value is written."""

    header: str
    width: int
    field: str
    format: Callable[[Any], str]


def srgo_table(sel: Any, columns: Sequence[Column], *, mark_selected: bool = False) -> str:
    """The SRGO table of a :class:`~advcal.ThresholdSelection`, a row per threshold: the
    ``columns``, then ``feasible`` (yes/no) and, with ``mark_selected``, ``<- tau_sel``
    on the selected row."""
    lines = ["".join(f"{c.header:>{c.width}}" for c in columns) + "  feasible"]
    for j in range(sel.tau.size):
        cells = "".join(f"{c.format(getattr(sel, c.field)[j]):>{c.width}}" for c in columns)
        mark = (" <- tau_sel" if mark_selected and sel.tau_sel is not None
                and sel.tau[j] == sel.tau_sel else "")
        lines.append(f"{cells}  {'yes' if sel.feasible[j] else 'no'}{mark}")
    return "\n".join(lines)


def print_reads(log: Any) -> None:
    """The bad rows of a log: their count and first few, and for a log of several files
    its files' count and each file that had some."""
    files = getattr(log, "files", ())
    if files:
        responses = sum(f.responses for f in files)
        groups = sum(f.groups for f in files)
        print(f"{_count(len(files), 'file')}: {_count(responses, 'response')} in "
              f"{_count(groups, 'group')} (a group never spans files)")
    if log.bad_rows.count:
        print(log.bad_rows.summary())
        for f in files:
            if f.bad_rows.count:
                print(f"  {printable(f.path)}: {f.bad_rows.count} bad {f.bad_rows.unit}"
                      f"{'s' if f.bad_rows.count != 1 else ''}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def files_json(log: Any) -> list[dict[str, Any]]:
    """Each file of the log (one for a log read from one): its responses, groups and bad
    rows."""
    files = getattr(log, "files", ())
    if not files:
        return [{"file": log.path, "responses": int(log.rewards.size),
                 "groups": log.n_groups, "bad_rows": log.bad_rows.count}]
    return [{"file": f.path, "responses": f.responses, "groups": f.groups,
             "bad_rows": f.bad_rows.count} for f in files]


# --------------------------------------------------------------------------- progress


class _Bar:
    """A one-line text progress bar on a stream: ``label [#####-----]  50%  1.2 s  note``.

    Redrawn at most ten times a second and erased when the step ends, so it never mixes
    with the report on stdout.  A disabled bar does nothing.
    """

    WIDTH = 24

    def __init__(self, label: str, total: int, stream: Any, enabled: bool) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.stream = stream
        self.enabled = enabled
        self.done = 0
        self.note = ""
        self._start = time.perf_counter()
        self._drawn_at = -math.inf
        self._length = 0

    def __enter__(self) -> _Bar:
        self._draw(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self._length:
            self.stream.write("\r" + " " * self._length + "\r")
            self.stream.flush()

    def advance(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        self._draw(force=self.done == self.total)

    def describe(self, note: str) -> None:
        """Name the sub-step that runs next (a long single call shows what it is doing)."""
        self.note = note
        self._draw(force=True)

    def _draw(self, *, force: bool) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._drawn_at < 0.1:
            return
        self._drawn_at = now
        filled = self.WIDTH * self.done // self.total
        line = (f"{self.label} [{'#' * filled}{'-' * (self.WIDTH - filled)}] "
                f"{100 * self.done // self.total:3d}% {now - self._start:5.1f} s  {self.note}")
        line = line[:shutil.get_terminal_size().columns - 1]
        self.stream.write("\r" + line.ljust(self._length))
        self.stream.flush()
        self._length = len(line)


def _progress_enabled(no_progress: bool, stream: Any) -> bool:
    """Bars only on a terminal: a log file or a pipe gets no carriage-return clutter."""
    if no_progress:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def _no_bar() -> _Bar:
    return _Bar("", 1, None, enabled=False)


# Reads that take longer than this many seconds show a progress bar on a terminal.
_PROGRESS_AFTER = 2.0


def _read_progress(label: str, enabled: bool) -> tuple[Callable[[int, int], None], _Bar]:
    """A ``read_log`` progress callback that shows a bar once the read passes
    ``_PROGRESS_AFTER`` seconds (a fast read shows nothing)."""
    start = time.perf_counter()
    bar = _Bar(label, 1, sys.stderr, enabled=False)

    def report(done: int, total: int) -> None:
        if not enabled or time.perf_counter() - start < _PROGRESS_AFTER:
            return
        if not bar.enabled:
            bar.enabled = True
            bar.total = max(total, 1)
            bar._start = start
        bar.done = min(done, bar.total)
        bar._draw(force=False)

    return report, bar


# --------------------------------------------------------------------------- targets

_PLOT_FORMATS = ("png", "pdf", "svg")


def check_plot_target(path: str) -> None:
    """An ``OSError`` where ``path`` (a symlink followed) exists and is not a regular file:
    a figure written to a FIFO would block until a reader comes, one on a device goes
    nowhere."""
    try:
        info = os.stat(path)
    except OSError:  # missing (written anew), or a folder that is not one: savefig says
        return
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path}: {_files.kind(info.st_mode)}, not a regular file; a figure "
                      "is written only to a regular file's path")


def need_matplotlib(option: str) -> None:
    """A :class:`CommandError` naming ``option`` where matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CommandError(f"{option} needs matplotlib, which is not installed "
                           "(pip install 'advcal[plot]')") from None


def check_plot(path: str | None) -> None:
    """Before the work: ``--plot PATH`` can be drawn (matplotlib), names a format
    (.png, .pdf, .svg) and is not a FIFO or device."""
    if path is None:
        return
    need_matplotlib("--plot")
    if Path(path).suffix.lower().lstrip(".") not in _PLOT_FORMATS:
        raise CommandError(f"cannot write the plot {path}: name a .png, .pdf or .svg file")
    try:
        check_plot_target(path)
    except OSError as exc:
        raise CommandError(f"cannot write the plot {path}: {exc}") from None


def check_out(path: str | None, option: str) -> None:
    """Before the work: refuse an ``option`` target (``-o``, ``--sets-out``) that exists
    and is not a regular file, or whose folder is missing."""
    if path is None:
        return
    try:
        _files.check_target(Path(path), option)
    except OSError as exc:
        raise CommandError(describe(exc)) from None
    folder = Path(path).parent
    if not folder.is_dir():
        raise CommandError(f"{option} {printable(path)}: cannot write it, "
                           f"{printable(str(folder))} is not a folder")


# --------------------------------------------------------------------------- figures


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(*grid: int, figsize: tuple[float, float] = (7, 4), **options: Any) -> Any:
    """A new ``(figure, axes)`` pair of the headless backend (``plt.subplots``'s
    arguments)."""
    return _pyplot().subplots(*grid, figsize=figsize, **options)


def _save_figure(fig: Any, path: str | Path) -> None:
    """Save ``fig`` in the format ``path``'s extension names (folders created, the target
    checked again), and close it whatever happens."""
    import matplotlib.pyplot as plt

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        check_plot_target(str(path))
        fig.tight_layout()
        fig.savefig(path, format=Path(path).suffix.lower().lstrip("."), dpi=100)
    finally:
        plt.close(fig)


def write_plot(draw: Callable[[str], None], path: str | None) -> None:
    """``draw(path)``, where ``--plot PATH`` was given; what saving raises is one line."""
    if path is None:
        return
    try:
        draw(path)
    except (OSError, ValueError) as exc:
        raise CommandError(f"cannot write the plot {path}: {exc}") from None
