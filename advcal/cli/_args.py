"""The commands' shape (:class:`Command`) and the argparse types of their options:
paths, finite numbers, integers in a range, seeds, comma-separated numbers.  Every number
is plain ASCII decimal (Python's ``float`` and ``int`` also read ``1_0`` and other
scripts' digits; an option does not)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, NamedTuple


class Command(NamedTuple):
    """A subcommand: its name and help line, how it adds its options to its parser, and
    how it runs (it returns the exit code)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def path_arg(text: str) -> str:
    """An argparse type for a file path: not empty (``""`` would name the current
    folder) and without a NUL character."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a path cannot hold a NUL character")
    return text


class LogPaths(argparse.Action):
    """A log's paths (``nargs="+"``): every one in ``paths``, and in ``file`` the one
    path, or all of them joined, to name the log in the report and its errors."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        paths = list(values)
        namespace.paths = paths
        setattr(namespace, self.dest, paths[0] if len(paths) == 1 else " ".join(paths))


def _plain_number(text: str, kind: str) -> str:
    if not text.isascii() or "_" in text:
        raise argparse.ArgumentTypeError(f"invalid {kind} {text[:40]!r}")
    return text


def finite_arg(text: str) -> float:
    """An argparse type for a finite float (``nan``, ``inf`` and ``1e999`` refused)."""
    try:
        value = float(_plain_number(text, "number"))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"invalid number {text[:40]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number")
    return value


def numbers(text: str, option: str) -> list[float]:
    """A comma-separated option value (``--reward-weights``, ``--thresholds``) as finite
    numbers, by the rule of :func:`finite_arg`; a ``ValueError`` naming ``option``
    otherwise."""
    try:
        return [finite_arg(part.strip()) for part in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{option} {text[:80]!r}: expected comma-separated numbers "
                         f"({exc})") from None


def int_arg(text: str, *, low: int, high: int, what: str = "integer") -> int:
    """``text`` as an integer in ``[low, high]``, else an argparse error."""
    try:
        value = int(_plain_number(text, what))
    except ValueError:  # also a number of more digits than int() reads
        raise argparse.ArgumentTypeError(f"invalid {what} {text[:40]!r}: not an "
                                         "integer") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"invalid {what} {text[:40]!r}: must lie in "
                                         f"[{low}, {high}]")
    return value


def seed_arg(text: str) -> int:
    """An argparse type for a seed: an integer >= 0 (numpy's generators take any size)."""
    try:
        seed = int(_plain_number(text, "seed"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seed {text[:40]!r}: not an integer"
                                         ) from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"invalid seed {seed}: must be >= 0")
    return seed


def max_bytes_arg(text: str) -> int:
    """An argparse type for ``--max-bytes``: a positive byte count (``1_000`` is refused, as
    every number option refuses it)."""
    return int_arg(text, low=1, high=2**62, what="byte count")
