"""Reading reward logs as trainers write them: CSV, JSON Lines, Parquet, NPZ and NPY.

:func:`read_log` turns a log file into grouped rewards (``rewards`` in CSR layout with
``offsets``), ready for :func:`advcal.scale_diagnostics` and the other array functions;
:func:`read_columns` reads ungrouped per-response columns and a label column (a judge log
with a category per response) with the same readers.
It reads in bounded chunks (a 10-million-row file never sits in memory as text), detects
the format and a gzip, zstd or bz2 compression from the file's first bytes, and skips
and counts bad rows (or stops at the first one, ``on_bad_row="error"``).  Only regular
files are opened (a FIFO or a device is refused without blocking), and every read is
bounded by ``max_bytes``, checked as the file streams (docs/cli.md, "Limits").

Presets name the columns of two trainers' logs:

* ``"verl"``: verl's rollout dumps (``trainer.rollout_data_dir``), JSON Lines with the
  keys ``input``, ``output``, ``gts``, ``score``, ``step`` and any extra reward infos.
  The reward is ``score``; the group is ``uid`` when the log has one, else the prompt
  text ``input``, within each ``step``.
* ``"trl"``: TRL's GRPO completion logs (``log_completions``, one Parquet file per
  step), with the columns ``step``, ``prompt``, ``completion``, one column per reward
  function, the ``log_extra`` columns of the reward functions, and ``advantage``.  The
  group is ``prompt`` within each ``step``.  The reward is the numeric column other than
  ``step`` and ``advantage`` when there is one; with several, the file cannot tell the
  reward functions from the ``log_extra`` columns, so they must be named
  (``reward_cols``) or weighted, one weight per numeric column (``reward_weights``,
  TRL's, 0 for a column TRL does not sum).  They combine as TRL combines them
  (``reward_agg``).

The readers need pyarrow (``pip install 'advcal[logs]'``); ``import advcal.io.logs`` does
not import it.  pyarrow is used rather than polars because it reads CSV and JSON in
streaming blocks with an explicit per-column type, hands back the rows it cannot parse
(with their line numbers, so they can be skipped and reported), decompresses gzip and
zstd as a stream, and reads Parquet by row batches.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from advcal._files import user_path
from advcal.io import _many, _npz
from advcal.io._common import (
    _TRL_EPS,
    FORMATS,
    PRESETS,
    REWARD_AGGREGATIONS,
    BadRows,
    ColumnLog,
    FileRead,
    LogError,
    MissingDependencyError,
    Preset,
    RewardLog,
    _array,
    _from_numpy,
    _numpy,
    _pa,
)
from advcal.io._csv import _read_csv
from advcal.io._detect import _open, detect_format
from advcal.io._digest import _Digest, _list, _Plan, _plan
from advcal.io._jsonl import _read_jsonl
from advcal.io._npz import _decompressed_copy, _read_npz
from advcal.io._parquet import _read_parquet

__all__ = ["FORMATS", "PRESETS", "REWARD_AGGREGATIONS", "BadRows", "ColumnLog", "FileRead",
           "LogError",
           "MissingDependencyError", "Preset", "RewardLog", "detect_format", "read_arrays",
           "read_columns", "read_log", "read_logs"]


def _read_iv(on_bad_row: Any, max_bytes: Any) -> None:
    if on_bad_row not in ("skip", "error"):
        raise LogError(f"on_bad_row must be 'skip' or 'error'; got {on_bad_row!r}")
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise LogError(f"max_bytes must be a positive integer; got {max_bytes!r}")


def _read_log_iv(preset: Any, group_cols: Any, reward_cols: Any, reward_weights: Any,
                 reward_agg: Any, extra_cols: Any, on_bad_row: Any, max_bytes: Any
                 ) -> tuple[Preset | None, tuple[str, ...], tuple[str, ...],
                            tuple[float, ...] | None, tuple[str, ...]]:
    if preset is not None and preset not in PRESETS:
        raise LogError(f"unknown preset {preset!r}: expected one of {', '.join(PRESETS)}")
    if reward_agg not in REWARD_AGGREGATIONS:
        raise LogError(f"unknown reward aggregation {reward_agg!r}: expected one of "
                       f"{', '.join(REWARD_AGGREGATIONS)}")
    _read_iv(on_bad_row, max_bytes)
    groups = (group_cols,) if isinstance(group_cols, str) else tuple(group_cols or ())
    rewards = (reward_cols,) if isinstance(reward_cols, str) else tuple(reward_cols or ())
    extras = (extra_cols,) if isinstance(extra_cols, str) else tuple(extra_cols or ())
    weights = None
    if reward_weights is not None:
        try:
            weights = tuple(float(w) for w in reward_weights)
        except (TypeError, ValueError):
            raise LogError("reward weights must be numbers") from None
        if not all(math.isfinite(w) for w in weights):
            raise LogError("reward weights must be finite")
        if rewards and len(weights) != len(rewards):
            raise LogError(f"{len(weights)} reward weights for {len(rewards)} reward columns")
    return (PRESETS[preset] if preset is not None else None), groups, rewards, weights, extras


def read_log(
    path: str | os.PathLike[str],
    *,
    preset: str | None = None,
    group_cols: Sequence[str] | str | None = None,
    reward_cols: Sequence[str] | str | None = None,
    reward_weights: Sequence[float] | None = None,
    reward_agg: str = "sum",
    extra_cols: Sequence[str] | str = (),
    optional_cols: Sequence[str] = (),
    format: str = "auto",
    on_bad_row: str = "skip",
    max_bytes: int = 1 << 30,
    progress: Callable[[int, int], None] | None = None,
) -> RewardLog:
    """Read a reward log into grouped rewards.

    Parameters
    ----------
    path : str or path-like
        A CSV, JSON Lines, Parquet, ``.npz`` or ``.npy`` file, optionally gzip-, zstd- or
        bz2-compressed; the format is read from the content (the extension only breaks
        the tie between CSV and JSON Lines, and a contradicting one is an error).
    preset : {"verl", "trl"}, optional
        Column names of a trainer's logs (see :data:`PRESETS`).  Without a preset and
        without ``group_cols``/``reward_cols``: columns ``group`` and ``reward``; for
        arrays, ``rewards`` (2-D: a group per row; 1-D: with ``offsets`` or
        ``group_ids``).
    group_cols : sequence of str, optional
        The column(s) whose values name the group (several: a group per combination).
    reward_cols : sequence of str, optional
        The reward column(s) (arrays in ``.npz``, fields of a structured ``.npy``).
    reward_weights : sequence of float, optional
        One weight per reward column (default: all 1), as TRL's ``reward_weights``.
    reward_agg : {"sum", "normalize_then_sum"}, default "sum"
        How several reward columns combine, as TRL's ``multi_objective_aggregation``:
        ``"sum"`` is the weighted sum with empty/NaN columns skipped (``nansum``);
        ``"normalize_then_sum"`` first standardises each column within its group,
        ``(r - nanmean) / (nanstd + 1e-4)`` (``nanstd`` with Bessel's correction, NaN
        for a group with one valid value, which then drops out of the sum).
    extra_cols : sequence of str, default ()
        Further numeric columns to return in :attr:`RewardLog.extra`, aligned with the
        rewards (e.g. a second scoring of the same responses); a row where one is empty,
        NaN or not a number is a bad row.
    optional_cols : sequence of str, default ()
        Like ``extra_cols``, read only when the file has them.
    format : {"auto", "csv", "jsonl", "parquet", "npz", "npy"}, default "auto"
        Expected format (an error when the content shows another binary format).
    on_bad_row : {"skip", "error"}, default "skip"
        A row with an empty, NaN, infinite or unparsable reward, an empty or NaN group id, a
        wrong number of fields or broken JSON is skipped and counted in
        :attr:`RewardLog.bad_rows` (``"skip"``), or stops the read (``"error"``).  With
        several reward columns, a row is bad only when all of them are empty or NaN.
    max_bytes : int, default 2**30
        The bound of the read (a :class:`LogError` past it, raised as the file streams):
        the largest array (``.npz``/``.npy``, checked from the headers before anything is
        decompressed); the decompressed size of a compressed file, counted as it
        streams; the memory the kept rows take while they are read (8 bytes per numeric
        column, 4 per group column, per row); for Parquet, the uncompressed size and the
        rows of the columns read, from the metadata before reading.  The longest text
        row is ``max_bytes // 16`` (at least 8 MiB): a longer JSON line is a bad line, a
        CSV row far longer stops the read.  Peak memory stays under about
        ``2 * max_bytes`` plus pyarrow's read buffers (some 200 MB).
    progress : callable(done, total), optional
        Called after each chunk with the bytes of the (compressed) file read so far
        and its size.

    Returns
    -------
    RewardLog

    Raises
    ------
    LogError
        A one-line description of what is wrong with the file or the options.
    TypeError
        ``path`` is not a str or path-like object (bytes paths included).
    MissingDependencyError
        pyarrow is not installed.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from advcal.io.logs import read_log
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "log.csv").write_text(
    ...     "prompt,accuracy,format\\nq1,1,0.5\\nq2,0,0\\nq1,0,0.5\\nq2,1,\\nq2,nan,nan\\n")
    >>> log = read_log(folder / "log.csv", preset="trl", reward_weights=[1.0, 0.5])
    >>> log.reward_cols, log.rewards, log.offsets
    (('accuracy', 'format'), array([1.25, 0.25, 0.  , 1.  ]), array([0, 2, 4]))
    >>> log.bad_rows.summary()
    'skipped 1 bad line (line 6: no reward (every reward column empty or NaN))'
    """
    path = user_path(path, "path")
    preset_obj, groups, rewards, weights, extras = _read_log_iv(
        preset, group_cols, reward_cols, reward_weights, reward_agg, extra_cols, on_bad_row,
        max_bytes)
    fmt, compression = detect_format(path, format)

    def plan_for(columns: Sequence[str] | None, numeric: Callable[[str], bool]) -> _Plan:
        plan = _plan(columns, numeric, preset_obj, preset is not None, groups, rewards,
                     extras, fmt in ("npz", "npy"), tuple(optional_cols))
        guessed = preset == "trl" and not rewards and len(plan.reward_cols) > 1
        trl_hint = ("; TRL logs its reward functions and its log_extra columns alike, and "
                    "sums only the reward functions, each times its weight: name them with "
                    "--reward-col (reward_cols) and their weights with --reward-weights, as "
                    "in GRPOConfig.reward_weights") if guessed else ""
        if weights is not None and len(weights) != len(plan.reward_cols):
            raise LogError(f"{len(weights)} reward weights for the {len(plan.reward_cols)} "
                           f"reward columns {', '.join(plan.reward_cols)}{trl_hint}")
        if guessed and weights is None:
            raise LogError(f"{len(plan.reward_cols)} numeric columns could be rewards "
                           f"({', '.join(plan.reward_cols)}){trl_hint}")
        return plan

    plan, digest = _read(path, fmt, compression, plan_for, on_bad_row, max_bytes, progress)
    return _assemble(path, fmt, compression, plan, digest,
                     weights or (1.0,) * len(plan.reward_cols), reward_agg)


def read_logs(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    preset: str | None = None,
    group_cols: Sequence[str] | str | None = None,
    reward_cols: Sequence[str] | str | None = None,
    reward_weights: Sequence[float] | None = None,
    reward_agg: str = "sum",
    extra_cols: Sequence[str] | str = (),
    optional_cols: Sequence[str] = (),
    format: str = "auto",
    on_bad_row: str = "skip",
    max_bytes: int = 1 << 30,
    progress: Callable[[int, int], None] | None = None,
) -> RewardLog:
    """Read a log written in several files (TRL writes one Parquet file per step, verl
    one JSON Lines file per step) as one reward log.

    Each file is read by :func:`read_log` with the same options, and its groups stay
    its own: a group never spans two files, so a group key that is only unique within a
    step (a prompt's text) cannot join two steps' groups, or two runs'.

    Parameters
    ----------
    paths : path or sequence of paths
        Files, folders (their regular files whose names do not start with a dot) and glob
        patterns (``"completions/*.parquet"``), read in the order given, a folder's or a
        pattern's files in natural order of their names (``2.jsonl`` before
        ``10.jsonl``).  A single file gives exactly :func:`read_log`'s result.
    preset, group_cols, reward_cols, reward_weights, reward_agg, extra_cols, optional_cols
        As in :func:`read_log`; every file must have the same group and reward columns.
        ``optional_cols`` are kept where every file has them.
    format, on_bad_row
        As in :func:`read_log`, for each file.
    max_bytes : int, default 2**30
        :func:`read_log`'s bound for each file, and the bound of the kept rows of all the
        files together (8 bytes per reward and extra column per response).
    progress : callable(done, total), optional
        Called after each chunk with the bytes read so far over all the files and their
        total size.

    Returns
    -------
    RewardLog
        ``path`` names the paths given (the folder or pattern when one), ``files`` gives
        each file's responses, groups and bad rows, and ``bad_rows`` their sum (the first
        few examples prefixed by their file).

    Raises
    ------
    LogError
        A one-line description naming the file that is wrong, or a path that names no
        file.
    TypeError
        ``paths`` is not a path or a sequence of paths.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from advcal.io.logs import read_logs
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "1.csv").write_text("step,prompt,accuracy\\n1,q1,1\\n1,q1,0\\n")
    >>> _ = (folder / "2.csv").write_text("step,prompt,accuracy\\n2,q1,0\\n2,q1,\\n")
    >>> log = read_logs(folder, preset="trl")
    >>> log.rewards, log.offsets
    (array([1., 0., 0.]), array([0, 2, 3]))
    >>> [(pathlib.Path(f.path).name, f.responses, f.bad_rows.count) for f in log.files]
    [('1.csv', 2, 0), ('2.csv', 1, 1)]
    """
    files, name = _many.expand_paths(paths)

    def read(path: Path, report: Callable[[int, int], None] | None) -> RewardLog:
        return read_log(path, preset=preset, group_cols=group_cols, reward_cols=reward_cols,
                        reward_weights=reward_weights, reward_agg=reward_agg,
                        extra_cols=extra_cols, optional_cols=optional_cols, format=format,
                        on_bad_row=on_bad_row, max_bytes=max_bytes, progress=report)

    if len(files) == 1 and isinstance(paths, (str, os.PathLike)) and files[0] == Path(
            os.fspath(paths)):
        return read(files[0], progress)
    sizes = [f.stat().st_size if f.is_file() else 0 for f in files]
    total, done = sum(sizes), 0
    parts = []
    for path, size in zip(files, sizes, strict=True):
        def report(bytes_read: int, _size: int, base: int = done) -> None:
            if progress is not None:
                progress(base + bytes_read, total)

        try:
            parts.append(read(path, report))
        except LogError as exc:
            if str(path) in str(exc):
                raise
            raise LogError(f"{path}: {exc}") from None
        done += size
    return _many.joined(parts, name, max_bytes)


def read_columns(
    path: str | os.PathLike[str],
    columns: Sequence[str] | str,
    *,
    label_col: str | None = None,
    format: str = "auto",
    on_bad_row: str = "skip",
    max_bytes: int = 1 << 30,
) -> ColumnLog:
    """Read numeric columns and an optional label column of a log, without grouping.

    For logs with one row per response and no groups, e.g. an LLM judge's scores next
    to reference rewards with a category per response.  The readers, formats, bad-row
    policy and limits are those of :func:`read_log`; the rows keep their file order.

    Parameters
    ----------
    path : str or path-like
        A CSV, JSON Lines, Parquet, ``.npz`` (one 1-D array per column) or structured
        ``.npy`` file, optionally gzip-, zstd- or bz2-compressed.
    columns : sequence of str
        The numeric columns (arrays in ``.npz``, fields of a ``.npy``).
    label_col : str, optional
        A column of labels, returned with their type (:attr:`ColumnLog.labels`).
    format : {"auto", "csv", "jsonl", "parquet", "npz", "npy"}, default "auto"
        As in :func:`read_log`.
    on_bad_row : {"skip", "error"}, default "skip"
        A row with an empty, NaN, infinite or unparsable value in one of ``columns``, an
        empty, NaN or non-scalar label, a wrong number of fields or broken JSON is
        skipped and counted in :attr:`ColumnLog.bad_rows` (``"skip"``), or stops the
        read (``"error"``).
    max_bytes : int, default 2**30
        As in :func:`read_log`.

    Returns
    -------
    ColumnLog

    Raises
    ------
    LogError
        A one-line description of what is wrong with the file or the options.
    TypeError
        ``path`` is not a str or path-like object (bytes paths included).
    MissingDependencyError
        pyarrow is not installed.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from advcal.io.logs import read_columns
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "judge.jsonl").write_text(
    ...     '{"judge": 0.9, "reference": 1, "level": 1}\\n'
    ...     '{"judge": 0.2, "reference": 0, "level": "1"}\\n'
    ...     '{"judge": null, "reference": 1, "level": "hard"}\\n')
    >>> log = read_columns(folder / "judge.jsonl", ["judge", "reference"], label_col="level")
    >>> log.columns["judge"], log.labels
    (array([0.9, 0.2]), [1, '1'])
    >>> log.bad_rows.summary()
    "skipped 1 bad line (line 3: empty or NaN value in column 'judge')"
    """
    path = user_path(path, "path")
    _read_iv(on_bad_row, max_bytes)
    names = (columns,) if isinstance(columns, str) else tuple(columns)
    if not names:
        raise LogError("no numeric column named: pass at least one")
    labels = () if label_col is None else (label_col,)
    fmt, compression = detect_format(path, format)

    def plan_for(found: Sequence[str] | None, numeric: Callable[[str], bool]) -> _Plan:
        missing = [c for c in (*names, *labels) if found is not None and c not in found]
        if found is not None and missing:
            kind = "array" if fmt in ("npz", "npy") else "column"
            raise LogError(f"no {kind} {missing[0]!r} (found: {_list(found)})")
        return _Plan(labels, names[:1], names[1:], grouped=False, key_name="label")

    plan, digest = _read(path, fmt, compression, plan_for, on_bad_row, max_bytes, None)
    bad, keys, values = _joined(digest, decode=True)
    found_labels = None
    if keys:
        codes, n_ids, decoded = keys[0]
        distinct = np.empty(n_ids, object)
        distinct[:] = decoded
        found_labels = distinct[codes].tolist()
    return ColumnLog(dict(zip(plan.value_cols, values, strict=True)), found_labels,
                     label_col, str(path), fmt, compression, bad)


def _key_value(key: str) -> Any:
    """The value a key of :func:`_keys_arrow` stands for: the type tag undone."""
    if not key.startswith("\x00"):
        return key
    tag, _, text = key[1:].partition(":")
    # a nested id (chat messages) stands for its JSON text
    parse: dict[str, Callable[[str], Any]] = {"int": int, "float": float,
                                              "bool": lambda t: t == "true", "json": str}
    try:
        return parse[tag](text)
    except (KeyError, ValueError):  # a string that starts with NUL itself
        return key


def _read(path: Path, fmt: str, compression: str | None, plan_for: Callable[..., _Plan],
          on_bad_row: str, max_bytes: int, progress: Callable[[int, int], None] | None
          ) -> tuple[_Plan, _Digest]:
    """Read a file of a detected format with the reader of that format."""
    f, total = _open(path)
    f.close()
    report = None if progress is None else (lambda done: progress(done, total))
    _pa()
    workdir = None
    try:
        if compression is not None and fmt in ("parquet", "npz", "npy"):
            workdir = tempfile.mkdtemp(prefix="advcal-")
            path_read = _decompressed_copy(path, compression, max_bytes, workdir)
        else:
            path_read = path
        if fmt == "csv":
            return _read_csv(path_read, compression, plan_for, on_bad_row, report, max_bytes)
        if fmt == "jsonl":
            return _read_jsonl(path_read, compression, plan_for, on_bad_row, report,
                               max_bytes)
        if fmt == "parquet":
            return _read_parquet(path_read, plan_for, on_bad_row, report, max_bytes)
        return _read_npz(path_read, fmt, plan_for, on_bad_row, max_bytes)
    except MemoryError:
        raise LogError("out of memory while reading") from None
    except UnicodeDecodeError as exc:  # e.g. column names that are not UTF-8
        raise LogError(f"not UTF-8 text ({exc.reason} at byte {exc.start}); if the file is "
                       "compressed with a codec other than gzip, zstd or bz2, decompress it "
                       "first") from None
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _joined(digest: _Digest, *, decode: bool = False
            ) -> tuple[BadRows, list[tuple[np.ndarray, int, list[Any]]], list[np.ndarray]]:
    """The bad rows; per key column its codes, the number of distinct keys and (``decode``)
    the value of each; the value columns; each joined from its batches.  An error when no
    row is left."""
    bad = BadRows(digest.bad, tuple(sorted(digest.examples)), digest.unit)
    pa = _pa()
    pa.default_memory_pool().release_unused()  # the reader's freed blocks
    keys = []
    # each column's batches are joined into one array as they are dropped, in turn (memory
    # stays near one copy of the kept rows)
    while digest.groups:
        codes, ids = _unified(digest.groups.pop(0))
        pa.default_memory_pool().release_unused()
        decoded = [_key_value(k) for k in ids.to_pylist()] if decode else []
        keys.append((codes, len(ids), decoded))
        del ids
    values = []
    while digest.values:
        values.append(_concat(digest.values.pop(0), np.dtype(np.float64)))
    pa.default_memory_pool().release_unused()
    if values[0].size == 0:
        raise LogError("no rows (the file holds no responses)" if not bad.count
                       else f"no valid rows: {bad.summary()}")
    return bad, keys, values


def _unified(batches: list[Any]) -> tuple[np.ndarray, Any]:
    """The codes of dictionary-encoded batches (no nulls) over one dictionary, and that
    dictionary: what ``unify_dictionaries`` gives (the same ids, in order of first
    appearance along the batches' dictionaries), from one hash pass over the batches'
    dictionaries put end to end.  Each batch is dropped once its codes are written."""
    pa = _pa()
    import pyarrow.compute as pc

    if not batches:
        return np.zeros(0, np.int32), _array([], pa.string())
    # large_string: the dictionaries together may hold over 2 GiB of text
    encoded = pc.dictionary_encode(pa.concat_arrays(
        [b.dictionary.cast(pa.large_string()) for b in batches]))
    where = _numpy(encoded.indices)
    ids = encoded.dictionary
    del encoded
    codes = np.empty(sum(len(b) for b in batches), np.int32)
    pool = pa.default_memory_pool()
    at = entry = freed = 0
    batches.reverse()
    while batches:
        batch = batches.pop()
        size = len(batch.dictionary)
        rows = _numpy(batch.indices)
        np.take(where[entry:entry + size], rows, out=codes[at:at + rows.size])
        at += rows.size
        entry += size
        del batch, rows
        if at - freed >= _CHUNK:  # hand the dropped batches back, or they stay resident
            pool.release_unused()
            freed = at
    return codes, ids


def _assemble(path: Path, fmt: str, compression: str | None, plan: _Plan, digest: _Digest,
              weights: tuple[float, ...], reward_agg: str) -> RewardLog:
    bad, keys, values = _joined(digest)
    codes = [(c, n_ids) for c, n_ids, _ in keys]  # per group column: codes, distinct ids
    del keys
    if len(codes) > 1:  # a column with one value (one step) does not split groups
        codes = [c for c in codes if c[1] > 1] or codes[:1]
    in_order = len(codes) == 1 and _consecutive(codes[0][0])
    if in_order:
        # a log written group by group, no group emptied by bad rows: codes are the groups
        group = codes.pop()[0]
        n_groups = int(group[-1]) + 1
    elif len(codes) == 1:  # codes follow the unified dictionary: order of first appearance
        c, n_ids = codes.pop()
        used = np.bincount(c, minlength=n_ids) > 0
        group = (np.cumsum(used) - 1).astype(c.dtype)[c]
        n_groups = int(np.count_nonzero(used))
        del c, used
    else:
        group, n_groups = _combined(codes)
    del codes
    sizes = np.bincount(group, minlength=n_groups)
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    del sizes
    if in_order or _nondecreasing(group):  # written group by group: in order
        ordered = values
    else:
        ordered = _grouped(values, group, offsets)
    del group
    k = len(plan.reward_cols)
    if reward_agg == "normalize_then_sum":
        columns = list(_normalize_within_groups(np.stack(ordered[:k], axis=1), offsets).T)
    else:
        columns = ordered[:k]
    if k == 1 and reward_agg == "sum":
        rewards = columns[0] if weights[0] == 1.0 else columns[0] * weights[0]
    else:  # TRL's nansum over the reward functions (every kept row has one value)
        rewards = np.zeros(columns[0].size)
        for column, w in zip(columns, weights, strict=True):
            term = column * w
            term[np.isnan(term)] = 0.0
            rewards += term
    extra = dict(zip(plan.extra_cols, ordered[k:], strict=True))
    return RewardLog(rewards, offsets, extra, str(path), fmt, compression, plan.group_cols,
                     plan.reward_cols, weights, reward_agg, bad)


_CHUNK = 1 << 22  # rows of a full-length array worked on at a time (bounded temporaries)


def _concat(chunks: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """``np.concatenate`` of ``chunks`` that drops each chunk once copied: the peak is the
    result and one chunk, not twice the result."""
    pool = _pa().default_memory_pool()
    out = np.empty(sum(len(c) for c in chunks), dtype)
    chunks.reverse()
    at = 0
    while chunks:
        piece = chunks.pop()
        out[at:at + piece.size] = piece
        at += piece.size
        del piece
        if at >= _CHUNK:  # hand pyarrow's freed batches back, or they stay resident
            pool.release_unused()
    return out


def _consecutive(codes: np.ndarray) -> bool:
    """Whether codes run 0, 0, 1, 2, 2, ... (each step 0 or 1), checked chunk by chunk."""
    if codes.size == 0 or codes[0] != 0:
        return False
    for lo in range(0, codes.size - 1, _CHUNK):
        step = np.diff(codes[lo:lo + _CHUNK + 1])
        if not np.all((step == 0) | (step == 1)):
            return False
    return True


def _nondecreasing(group: np.ndarray) -> bool:
    for lo in range(0, group.size - 1, _CHUNK):
        piece = group[lo:lo + _CHUNK + 1]
        if np.any(piece[1:] < piece[:-1]):
            return False
    return True


def _combined(codes: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
    """A group per combination of several key columns' codes, numbered in order of first
    appearance; pairs are combined and renumbered in turn (hashing, in pyarrow), so the
    combined key never overflows and no sort of all rows is made."""
    _pa()
    import pyarrow.compute as pc

    group, n_groups = codes[0][0], codes[0][1]
    for c, n_ids in codes[1:]:
        key = group.astype(np.int64)
        key *= n_ids
        key += c
        encoded = pc.dictionary_encode(_from_numpy(key))
        del key
        group = _numpy(encoded.indices)
        n_groups = len(encoded.dictionary)
        del encoded
    return group, n_groups


def _grouped(values: list[np.ndarray], group: np.ndarray, offsets: np.ndarray
             ) -> list[np.ndarray]:
    """Each of ``values`` in group order (stable: file order within a group).  A counting
    sort chunk by chunk: ``group`` is overwritten with each row's destination, and each
    column is moved and dropped in turn, so the peak is the columns plus one copy of one,
    not an argsort of every row next to them."""
    wide = group.size >= 2**31 and group.dtype != np.int64
    dest = group if group.flags.writeable and not wide else group.astype(
        np.int64 if wide else group.dtype)
    fill = offsets[:-1].copy()  # the next free slot of each group
    for lo in range(0, group.size, _CHUNK):
        g = group[lo:lo + _CHUNK]
        order = np.argsort(g, kind="stable")
        gs = g[order]
        starts = np.flatnonzero(np.concatenate(([True], gs[1:] != gs[:-1])))
        runs = np.diff(np.append(starts, gs.size))
        rank = np.arange(gs.size) - np.repeat(starts, runs)  # within its group, in the chunk
        where = fill[gs] + rank
        fill[gs[starts]] += runs
        dest[lo:lo + _CHUNK][order] = where
        del g, order, gs, starts, runs, rank, where
    out = []
    while values:
        v = values.pop(0)
        moved = np.empty_like(v)
        moved[dest] = v
        del v
        out.append(moved)
    return out


def _normalize_within_groups(columns: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """TRL's per-group standardisation of each reward column, NaN-aware."""
    sizes = np.diff(offsets)
    starts = offsets[:-1]
    valid = ~np.isnan(columns)
    filled = np.where(valid, columns, 0.0)
    count = np.add.reduceat(valid.astype(np.float64), starts, axis=0)
    total = np.add.reduceat(filled, starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
        dev = np.where(valid, columns - np.repeat(mean, sizes, axis=0), 0.0)
        var = np.add.reduceat(dev * dev, starts, axis=0) / count * count / (count - 1)
        std = np.where(count > 1, np.sqrt(var), np.nan)
        return (columns - np.repeat(mean, sizes, axis=0)) / (np.repeat(std, sizes, axis=0)
                                                             + _TRL_EPS)


def read_arrays(path: str | os.PathLike[str], *, max_bytes: int = 1 << 30
                ) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive (by member name) or of one ``.npy`` file, read
    without pickle and bounded: the members' sizes are checked against ``max_bytes`` from
    the zip directory before anything is decompressed.

    Parameters
    ----------
    path : str or path-like
        A regular ``.npz`` or ``.npy`` file (the format is told by its first bytes).
    max_bytes : int, default 2**30
        The most bytes the arrays may take in all.

    Returns
    -------
    dict of str to ndarray
        The archive's arrays, in native byte order; a plain ``.npy`` file's array under
        ``"rewards"``, a structured one's fields by name.

    Raises
    ------
    LogError
        Not an ``.npz``/``.npy`` file ("cannot read as .npz"), a member that is not a
        plain numeric array, or past ``max_bytes``.
    OSError
        The file cannot be opened, or is not a regular file.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from advcal.io.logs import read_arrays
    >>> path = os.path.join(tempfile.mkdtemp(), "batch.npz")
    >>> np.savez(path, a=np.zeros(3), offsets=np.array([0, 3]))
    >>> sorted(read_arrays(path))
    ['a', 'offsets']
    """
    _read_iv("skip", max_bytes)
    where = user_path(path, "path")
    fmt, _ = detect_format(where)  # anything but .npy is read as .npz (or refused as not one)
    return _npz._read_arrays(where, "npy" if fmt == "npy" else "npz", max_bytes)
