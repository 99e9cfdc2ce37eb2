"""A log in several files: the paths a user names (files, folders, glob patterns) as a list
of files, and the logs read from them joined into one, groups never spanning files."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from advcal._files import user_path
from advcal.io._common import _EXAMPLES, BadRows, FileRead, LogError, RewardLog

_MAGIC = re.compile(r"[*?[]")


def _natural(path: Path) -> list[Any]:
    # step 2 before step 10, as trainers name their per-step files
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def expand_paths(paths: Any) -> tuple[list[Path], str]:
    """The files named by ``paths`` (a path, or a sequence of paths; each a file, a folder
    or a glob pattern), and a name for them all.  A folder gives its regular files whose
    names do not start with a dot, a pattern its matching regular files, each in natural
    order of their names."""
    single = isinstance(paths, (str, os.PathLike))
    items = [paths] if single else paths
    if isinstance(items, (bytes, bytearray)) or not isinstance(items, Sequence):
        raise TypeError("`paths` must be a path or a sequence of paths; got "
                        f"{type(paths).__name__}.")
    if not items:
        raise LogError("no log file given")
    files: list[Path] = []
    for item in items:
        path = user_path(item, "paths")
        if path.is_dir():
            found = sorted((c for c in path.iterdir()
                            if not c.name.startswith(".") and c.is_file()), key=_natural)
            if not found:
                raise LogError(f"{path}: a folder without log files")
        elif path.exists() or not _MAGIC.search(str(path)):
            found = [path]  # read_log names a missing or irregular file itself
        else:
            found = sorted((Path(m) for m in glob.glob(str(path)) if Path(m).is_file()),
                           key=_natural)
            if not found:
                raise LogError(f"{path}: no file matches the pattern")
        files.extend(found)
    seen: set[str] = set()
    for path in files:
        key = os.path.realpath(path)
        if key in seen:
            raise LogError(f"{path}: named twice (its rows would count twice)")
        seen.add(key)
    name = str(items[0]) if len(items) == 1 else f"{len(files)} files"
    return files, name


def joined(parts: Sequence[RewardLog], name: str, max_bytes: int) -> RewardLog:
    """The logs of several files as one: groups in file order, each within its file."""
    first = parts[0]
    for part in parts[1:]:
        for what in ("reward_cols", "group_cols"):
            if getattr(part, what) != getattr(first, what):
                label = what.replace("_cols", "")
                raise LogError(f"{part.path}: its {label} columns "
                               f"{', '.join(getattr(part, what))} differ from "
                               f"{first.path}'s ({', '.join(getattr(first, what))})")
    keys = [k for k in first.extra if all(k in part.extra for part in parts)]
    responses = sum(part.rewards.size for part in parts)
    if responses * 8 * (1 + len(keys)) > max_bytes:
        raise LogError(f"the {len(parts)} files' rows take more than max_bytes = {max_bytes} "
                       "bytes of memory")
    offsets = [np.zeros(1, dtype=np.int64)]
    start = 0
    for part in parts:
        offsets.append(part.offsets[1:] + start)
        start += int(part.rewards.size)
    examples = tuple((n, f"{part.path}: {why}") for part in parts
                     for n, why in part.bad_rows.examples)[:_EXAMPLES]
    bad = BadRows(sum(part.bad_rows.count for part in parts), examples, first.bad_rows.unit)
    formats = {part.format for part in parts}
    compressions = {part.compression for part in parts}
    return RewardLog(
        np.concatenate([part.rewards for part in parts]), np.concatenate(offsets),
        {k: np.concatenate([part.extra[k] for part in parts]) for k in keys}, name,
        formats.pop() if len(formats) == 1 else "mixed",
        compressions.pop() if len(compressions) == 1 else "mixed",
        first.group_cols, first.reward_cols, first.reward_weights, first.reward_agg, bad,
        tuple(FileRead(part.path, int(part.rewards.size), part.n_groups, part.bad_rows)
              for part in parts))
