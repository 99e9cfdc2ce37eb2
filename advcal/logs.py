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
* ``"trl"``: TRL's GRPO completion logs (``log_completions``), with the columns
  ``step``, ``prompt``, ``completion``, one column per reward function and
  ``advantage``.  The group is ``prompt`` within each ``step``; the rewards are the
  numeric columns other than ``step`` and ``advantage`` unless named, combined as TRL
  does (``reward_agg``).

The readers need pyarrow (``pip install 'advcal[logs]'``); ``import advcal.logs`` does
not import it.  pyarrow is used rather than polars because it reads CSV and JSON in
streaming blocks with an explicit per-column type, hands back the rows it cannot parse
(with their line numbers, so they can be skipped and reported), decompresses gzip and
zstd as a stream, and reads Parquet by row batches.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from advcal import _npy
from advcal._files import open_regular, user_path

__all__ = ["FORMATS", "PRESETS", "REWARD_AGGREGATIONS", "BadRows", "ColumnLog", "LogError",
           "MissingDependencyError", "Preset", "RewardLog", "detect_format", "read_columns",
           "read_log"]

#: File formats :func:`read_log` reads (each also gzip-, zstd- or bz2-compressed).
FORMATS = ("csv", "jsonl", "parquet", "npz", "npy")
#: How several reward columns combine into one reward (TRL's two aggregations).
REWARD_AGGREGATIONS = ("sum", "normalize_then_sum")

INSTALL_HINT = "pip install 'advcal[logs]'"
_EXAMPLES = 5  # bad rows reported by line
_BLOCK = 8 << 20  # bytes of text parsed at a time
# The longest text row (a CSV row or a JSON line) is max_bytes / _ROW_SHARE: 64 MiB at the
# default.  A longer JSON line is a bad line; a longer CSV row cannot be cut out (quotes may
# span lines), so it stops the read.
_ROW_SHARE = 16
# Bytes a kept row costs while it is read: 8 per numeric column, 4 per group/label code.
_VALUE_BYTES = 8
_CODE_BYTES = 4
_NPZ_ROWS = 1 << 20  # rows of an array digested at a time
_NPZ_MEMBERS = 1024  # arrays of an .npz log (checked before its directory is read)
# The TRL epsilon added to the per-group standard deviation in normalize_then_sum.
_TRL_EPS = 1e-4


class LogError(ValueError):
    """A problem with a log file or with the options that read it (a one-line message)."""


class _RowError(LogError):
    """A bad row with ``on_bad_row="error"`` (knows its number, to report the first)."""

    def __init__(self, number: int, message: str) -> None:
        super().__init__(message)
        self.number = number


class MissingDependencyError(ImportError):
    """The optional reader library is not installed (the message says what to install)."""


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise MissingDependencyError(
            f"reading reward logs needs pyarrow, which is not installed ({INSTALL_HINT})"
        ) from None
    return pyarrow


@dataclass(frozen=True)
class Preset:
    """Column names of one trainer's logs.

    Attributes
    ----------
    name : str
        The preset's name.
    group_cols : tuple of tuple of str
        Alternatives for the group columns, in order of preference: the first whose
        columns are all in the file is used (several columns: a group per combination).
    reward_cols : tuple of str
        The reward columns; empty: every numeric column not in ``not_rewards``.
    not_rewards : tuple of str
        Columns that are never rewards (when ``reward_cols`` is empty).
    """

    name: str
    group_cols: tuple[tuple[str, ...], ...]
    reward_cols: tuple[str, ...] = ()
    not_rewards: tuple[str, ...] = ()

    def fits(self, columns: Sequence[str]) -> bool:
        """Whether a file with these columns can be read with this preset."""
        has_group = any(all(c in columns for c in alt) for alt in self.group_cols)
        has_reward = (all(c in columns for c in self.reward_cols) if self.reward_cols
                      else any(c not in self.not_rewards for c in columns))
        return has_group and has_reward


#: The presets: ``PRESETS["verl"]`` and ``PRESETS["trl"]``.
PRESETS = {
    "verl": Preset("verl", (("step", "uid"), ("uid",), ("step", "input"), ("input",)),
                   reward_cols=("score",)),
    "trl": Preset("trl", (("step", "prompt"), ("prompt",)),
                  not_rewards=("step", "prompt", "completion", "advantage", "image",
                               "images")),
}
_DEFAULT = Preset("default", (("group",),), reward_cols=("reward",))
_DEFAULT_ARRAYS = Preset("default", (("group_ids",), ("offsets",)), reward_cols=("rewards",))


@dataclass(frozen=True)
class BadRows:
    """Rows that were skipped: how many, and the first few with their reason.

    Attributes
    ----------
    count : int
        Number of rows (or broken lines) skipped.
    examples : tuple of (int, str)
        ``(number, reason)`` of the first few, ``number`` counted in ``unit``.
    unit : str
        ``"line"`` (text files: the line in the file, header included) or ``"row"``
        (Parquet and arrays: 1-based row).
    """

    count: int = 0
    examples: tuple[tuple[int, str], ...] = ()
    unit: str = "line"

    def summary(self) -> str:
        """One line: the count and the first few rows with their reason ("" if none)."""
        if not self.count:
            return ""
        shown = "; ".join(f"{self.unit} {n}: {why}" for n, why in self.examples)
        more = ", ..." if self.count > len(self.examples) else ""
        plural = "s" if self.count != 1 else ""
        return f"skipped {self.count} bad {self.unit}{plural} ({shown}{more})"


@dataclass(frozen=True, eq=False)
class RewardLog:
    """A reward log read by :func:`read_log`: grouped rewards and what was read.

    Attributes
    ----------
    rewards : ndarray of float64, shape (N,)
        One finite reward per kept response, grouped: group ``q`` is
        ``rewards[offsets[q]:offsets[q + 1]]`` (groups in order of first appearance,
        responses in file order within a group).
    offsets : ndarray of int64, shape (B + 1,)
        CSR group boundaries.
    extra : dict of str to ndarray
        The ``extra_cols`` read, float64, in the order of ``rewards``.
    path : str
        The file.
    format : str
        One of :data:`FORMATS`.
    compression : str or None
        ``"gzip"``, ``"zstd"``, ``"bz2"`` or None.
    group_cols, reward_cols : tuple of str
        The columns (arrays) used.
    reward_weights : tuple of float
        The weight of each reward column.
    reward_agg : str
        How the reward columns were combined (one of :data:`REWARD_AGGREGATIONS`).
    bad_rows : BadRows
        The rows skipped.
    """

    rewards: np.ndarray = field(repr=False)
    offsets: np.ndarray = field(repr=False)
    extra: dict[str, np.ndarray] = field(repr=False)
    path: str
    format: str
    compression: str | None
    group_cols: tuple[str, ...]
    reward_cols: tuple[str, ...]
    reward_weights: tuple[float, ...]
    reward_agg: str
    bad_rows: BadRows

    @property
    def n_groups(self) -> int:
        """Number of groups (including those with one response)."""
        return int(self.offsets.size - 1)

    @property
    def n_singletons(self) -> int:
        """Groups with a single response (they carry no relative information)."""
        return int(np.count_nonzero(np.diff(self.offsets) == 1))


@dataclass(frozen=True, eq=False)
class ColumnLog:
    """Per-response columns read by :func:`read_columns`, ungrouped, in file order.

    Attributes
    ----------
    columns : dict of str to ndarray
        Each numeric column asked for: float64, shape (N,), one finite value per kept row.
    labels : list or None
        The label of each kept row (None without ``label_col``), of its type in the file:
        str, int, float or bool from JSON Lines, Parquet and arrays (JSON's ``1`` and
        ``"1"`` are two labels); str from CSV.
    label_col : str or None
        The label column.
    path : str
        The file.
    format : str
        One of :data:`FORMATS`.
    compression : str or None
        ``"gzip"``, ``"zstd"``, ``"bz2"`` or None.
    bad_rows : BadRows
        The rows skipped.
    """

    columns: dict[str, np.ndarray] = field(repr=False)
    labels: list[Any] | None = field(repr=False)
    label_col: str | None
    path: str
    format: str
    compression: str | None
    bad_rows: BadRows


# --------------------------------------------------------------------------- detection

_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bz2"}
_EXTENSIONS = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl",
               ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet", ".npz": "npz",
               ".npy": "npy"}
_COMPRESSED_SUFFIXES = (".gz", ".gzip", ".zst", ".zstd", ".bz2")
_NAMES = {"csv": "CSV", "jsonl": "JSON Lines", "parquet": "Parquet", "npz": ".npz",
          "npy": ".npy"}


def _compression(head: bytes) -> str | None:
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    return None


def _content_format(head: bytes) -> str | None:
    """The format the first bytes show, None for bytes that are no log format."""
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "npz"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"PAR1"):
        return "parquet"
    rows = [r.strip() for r in head.removeprefix(b"\xef\xbb\xbf").split(b"\n")]
    rows = [r for r in rows if r]
    if not rows:
        return "csv"
    # JSON Lines when the first line or most lines are objects: one broken line (a stray
    # byte, a NUL) near the start is a bad line, not a file of another kind
    objects = [r.startswith((b"{", b"[")) and b"\x00" not in r for r in rows]
    if objects[0] or 2 * sum(objects) >= len(rows):
        return "jsonl"
    # CSV when the header is text and the rest mostly is (random bytes: ~10% controls)
    controls = sum(head.count(bytes([c])) for c in (*range(9), *range(14, 32)))
    if b"\x00" in rows[0] or controls > len(head) // 20:
        return None
    return "csv"


def _extension_format(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes]
    while suffixes and suffixes[-1] in _COMPRESSED_SUFFIXES:
        suffixes.pop()
    return _EXTENSIONS.get(suffixes[-1]) if suffixes else None


def _open(path: Path) -> tuple[IO[bytes], int]:
    """The regular file at ``path`` and its size (:func:`advcal._files.open_regular`: a
    FIFO or a device is refused without blocking), errors as :class:`LogError`."""
    try:
        return open_regular(path, "log file")
    except FileNotFoundError:
        raise LogError("no such file") from None
    except OSError as exc:
        if exc.errno is None:  # open_regular's "a FIFO, not a regular file; ..."
            raise LogError(str(exc).removeprefix(f"log file {path}: ").split(";")[0]
                           ) from None
        raise LogError(f"cannot open ({exc.strerror or exc})") from None


class _Capped:
    """A decompressed stream that counts what it yields and stops past ``limit`` bytes
    (a decompression bomb is refused as it streams, before it fills memory or disk)."""

    def __init__(self, stream: Any, limit: int) -> None:
        self.stream = stream
        self.limit = limit
        self.done = 0
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        chunk = self.stream.read(min(n, self.limit + 1 - self.done) if n >= 0
                                 else self.limit + 1 - self.done)
        self.done += len(chunk)
        if self.done > self.limit:
            raise LogError(f"decompresses to over {self.limit:,} bytes (max_bytes); "
                           "decompress it first to read it whole, or raise max_bytes")
        return bytes(chunk)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self.stream.close()


def _open_stream(path: Path, compression: str | None, limit: int | None = None
                 ) -> tuple[Any, Any]:
    """``(stream, raw)``: the decompressed stream (at most ``limit`` bytes of it, when
    given) and the raw file (for progress)."""
    pa = _pa()
    f, _ = _open(path)
    try:
        raw = pa.PythonFile(f, mode="r")
    except BaseException:
        f.close()
        raise
    if compression is None:
        return raw, raw
    stream = pa.CompressedInputStream(raw, compression)
    return (stream if limit is None else _Capped(stream, limit)), raw


def _head(path: Path, compression: str | None, n: int = 4096) -> bytes:
    if compression is None:
        f, _ = _open(path)
        with f:
            return f.read(n)
    stream, raw = _open_stream(path, compression)
    try:
        return bytes(stream.read(n))
    except OSError as exc:
        raise LogError(f"cannot decompress ({compression}): {_first_line(exc)}") from None
    finally:
        stream.close()
        raw.close()


def detect_format(path: str | os.PathLike[str], format: str = "auto"
                  ) -> tuple[str, str | None]:
    """The format and compression of a log file, from its first bytes.

    Parameters
    ----------
    path : str or path-like
        The file.
    format : {"auto", "csv", "jsonl", "parquet", "npz", "npy"}, default "auto"
        A format the caller expects; an error when the content shows another binary
        format (a text file may be read as CSV or JSON Lines as asked).

    Returns
    -------
    (format, compression) : (str, str or None)

    Raises
    ------
    LogError
        The file is missing, not a regular file, empty, compressed in a broken way, or
        not a log format.
    TypeError
        ``path`` is not a str or path-like object (bytes paths included).
    """
    path = user_path(path, "path")
    f, _ = _open(path)
    with f:
        head = f.read(4096)
    compression = _compression(head)
    if compression is not None:
        _pa()  # decompression is pyarrow's
        head = _head(path, compression)
    if not head.strip():
        raise LogError("empty file (no header row)" if not head else "empty file (no rows)")
    found = _content_format(head)
    by_name = _extension_format(path)
    if format != "auto":
        if format not in FORMATS:
            raise LogError(f"unknown format {format!r}: expected one of {', '.join(FORMATS)}")
        textual = ("csv", "jsonl")
        if found != format and not (found in textual and format in textual):
            what = "not a log format" if found is None else f"a {_NAMES[found]} file"
            raise LogError(f"the content is {what}, not {_NAMES[format]}"
                           + (f" (drop --format, or pass --format {found})" if found else ""))
        return format, compression
    if found is None:
        raise LogError("not a log format: expected CSV, JSON Lines, Parquet, .npz or .npy "
                       "(each optionally gzip/zstd/bz2-compressed)")
    binary = ("parquet", "npz", "npy")
    if by_name in binary and found != by_name:
        raise LogError(f"the extension says {_NAMES[by_name]}, but the content is "
                       f"{'text' if found in ('csv', 'jsonl') else 'a ' + _NAMES[found] + ' file'}")
    if by_name in ("csv", "jsonl") and found in binary:
        raise LogError(f"the extension says {_NAMES[by_name]}, but the content is a "
                       f"{_NAMES[found]} file (pass --format {found})")
    if by_name in ("csv", "jsonl") and found in ("csv", "jsonl"):
        return by_name, compression
    return found, compression


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# --------------------------------------------------------------------------- digest


def _key_type() -> Any:
    pa = _pa()
    return pa.dictionary(pa.int32(), pa.string())


def _keys_arrow(array: Any) -> Any:
    """Group ids as a dictionary array of strings (null: no id).

    Strings stay as they are; other scalars are tagged with their type ("\\x00int:1"), so
    JSON's 1, 1.0, true and "1" are four groups.  The dictionaries of all batches are
    unified once at the end, in C++: no id passes through Python.
    """
    pa = _pa()
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if pa.types.is_dictionary(t):
        if pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type):
            array = _compact(array).cast(_key_type())
            empty = pc.equal(array.dictionary, "")
            if not pc.any(empty).as_py():
                return array
            # "": no id (the dictionary is kept, not decoded: Parquet ids stay encoded)
            blank = pc.is_in(array.indices, value_set=pc.indices_nonzero(empty).cast(
                pa.int32()))
            indices = pc.if_else(blank, pa.scalar(None, pa.int32()), array.indices)
            return pa.DictionaryArray.from_arrays(indices, array.dictionary)
        array = array.dictionary_decode()
        t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        encoded = pc.dictionary_encode(array).cast(_key_type())
        if not pc.any(pc.equal(encoded.dictionary, "")).as_py():
            return encoded
        array = pc.if_else(pc.equal(array, ""), pa.scalar(None, t), array)  # "": no id
        return pc.dictionary_encode(array).cast(_key_type())
    tag = ("int" if pa.types.is_integer(t) else "float" if pa.types.is_floating(t)
           else "bool" if pa.types.is_boolean(t) else None)
    if tag is None:  # lists, structs: no group id
        return pa.nulls(len(array), _key_type())
    if tag == "float":  # NaN and infinities name no group
        array = pc.if_else(pc.is_finite(array), array, pa.scalar(None, t))
    text = pc.binary_join_element_wise(f"\x00{tag}:", array.cast(pa.string()), "")
    return pc.dictionary_encode(text).cast(_key_type())


def _compact(array: Any) -> Any:
    """A dictionary array with only the dictionary entries its rows use.  pyarrow's
    Parquet reader hands each batch the dictionary of its row group so far, so keeping
    batches as read would hold that dictionary once per batch."""
    pa = _pa()
    import pyarrow.compute as pc

    used = pc.unique(array.indices.drop_null())
    if len(used) == len(array.dictionary):
        return array
    lookup = np.zeros(len(array.dictionary), np.int32)
    lookup[used.to_numpy(zero_copy_only=False)] = np.arange(len(used), dtype=np.int32)
    indices = pc.take(pa.array(lookup), array.indices)
    return pa.DictionaryArray.from_arrays(indices, array.dictionary.take(used))


def _keys_python(values: Sequence[Any]) -> Any:
    """:func:`_keys_arrow` of Python values (the JSON lines parsed one by one)."""
    pa = _pa()
    keys: list[str | None] = []
    for v in values:
        if v is None or v == "" or isinstance(v, (list, dict)) or (
                isinstance(v, float) and not math.isfinite(v)):
            keys.append(None)
        elif isinstance(v, str):
            keys.append(v)
        elif isinstance(v, bool):
            keys.append(f"\x00bool:{str(v).lower()}")
        else:
            keys.append(f"\x00{type(v).__name__}:{v!r}")
    return pa.array(keys, pa.string()).dictionary_encode().cast(_key_type())


class _Digest:
    """Everything kept of a file: group codes, column values, bad-row bookkeeping."""

    def __init__(self, plan: _Plan, on_bad_row: str, unit: str, limit: int | None = None
                 ) -> None:
        self.limit = limit  # bytes the kept rows may take (max_bytes), None: unchecked
        self.held = 0
        self.rows = 0
        self.group_cols = plan.group_cols
        self.value_cols = plan.value_cols
        self.n_rewards = len(plan.reward_cols)
        self.key_name = plan.key_name
        self.on_bad_row = on_bad_row
        self.unit = unit
        self.groups: list[list[Any]] = [[] for _ in self.group_cols]
        self.values: list[list[np.ndarray]] = [[] for _ in self.value_cols]
        self.bad = 0
        self.examples: list[tuple[int, str]] = []

    def broken(self, number: int, reason: str) -> None:
        """A row that could not be parsed at all."""
        if self.on_bad_row == "error":
            raise _RowError(number, f"{self.unit} {number}: {reason}")
        self.bad += 1
        self._example(number, reason)

    def _example(self, number: int, reason: str) -> None:
        # the first few by number (a block reports its broken lines before its bad values)
        self.examples.append((number, reason))
        self.examples.sort()
        del self.examples[_EXAMPLES:]

    def add(self, groups: list[Any], values: list[np.ndarray],
            unparsable: Sequence[np.ndarray | None], raw: list[Any], lines: np.ndarray,
            flagged: Sequence[tuple[np.ndarray, str]] = ()) -> None:
        """One batch: ``groups`` (:func:`_keys_arrow`) per group column, float64 ``values``
        per value column
        (NaN = missing), ``unparsable`` masks (or None), ``raw`` source of each column
        for messages, ``lines`` the number of each row; ``flagged``: further bad rows
        (mask, reason)."""
        n = lines.size
        bad = np.zeros(n, bool)
        for m, _ in flagged:
            bad |= m
        missing = [np.asarray(g.is_null().to_numpy(zero_copy_only=False), bool)
                   for g in groups]
        for m in missing:
            bad |= m
        rewards = values[:self.n_rewards]
        finite = [np.isfinite(v) for v in values]
        if self.n_rewards == 1:
            bad |= ~finite[0]
        else:  # TRL: a missing reward function is skipped (nansum), all missing is not
            bad |= ~np.any(finite[:self.n_rewards], axis=0)
            for v in rewards:
                bad |= np.isinf(v)
        for f in finite[self.n_rewards:]:
            bad |= ~f
        for u in unparsable:
            if u is not None:
                bad |= u
        if bad.any():
            rows = np.flatnonzero(bad)
            for i in rows[:_EXAMPLES]:
                reason = next((why for m, why in flagged if m[i]), None) or self._reason(
                    int(i), missing, values, unparsable, raw)
                if self.on_bad_row == "error":
                    raise _RowError(int(lines[i]), f"{self.unit} {int(lines[i])}: {reason}")
                self._example(int(lines[i]), reason)
            self.bad += rows.size
            keep = ~bad
            mask = _pa().array(keep)
            groups = [g.filter(mask) for g in groups]
            values = [v[keep] for v in values]
        self.rows += values[0].size if values else 0
        self.held += sum(v.nbytes for v in values) + sum(g.nbytes for g in groups)
        if self.limit is not None and self.held > self.limit:
            raise LogError(f"the {self.rows:,} rows kept so far take over {self.limit:,} "
                           "bytes (max_bytes); raise max_bytes to read them")
        for store, g in zip(self.groups, groups, strict=True):
            store.append(g)
        for vstore, v in zip(self.values, values, strict=True):
            vstore.append(v)

    def _reason(self, i: int, missing: list[np.ndarray], values: list[np.ndarray],
                unparsable: Sequence[np.ndarray | None], raw: list[Any]) -> str:
        for col, m in zip(self.group_cols, missing, strict=True):
            if m[i]:
                return f"empty {self.key_name} in column {col!r}"
        for k, (col, v) in enumerate(zip(self.value_cols, values, strict=True)):
            u = unparsable[k]
            if u is not None and u[i]:
                return f"{col!r} value {_show(raw[k], i)} is not a number"
            if np.isinf(v[i]):
                return f"{col!r} value {_show(raw[k], i)} is not a finite number"
            if np.isnan(v[i]) and (k >= self.n_rewards or self.n_rewards == 1):
                return f"empty or NaN value in column {col!r}"
        return "no reward (every reward column empty or NaN)"


def _show(source: Any, i: int) -> str:
    try:
        value = source[i]
        value = value.as_py() if hasattr(value, "as_py") else value
    except Exception:  # noqa: BLE001 - only for a message
        return "?"
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, bytes):  # a CSV cell read as bytes: it may not be UTF-8
        value = value.decode("utf-8", "backslashreplace")
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _floats_arrow(array: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """float64 values of an Arrow column (NaN = null) and a mask of unparsable cells."""
    pa = _pa()
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if pa.types.is_dictionary(t):
        # parse the distinct values once, then index: a long repeated string is never
        # copied once per row
        array = _compact(array)
        floats, bad = _floats_arrow(array.dictionary)
        codes = array.indices.fill_null(0).to_numpy(zero_copy_only=False)
        out = floats[codes] if floats.size else np.full(len(array), np.nan)
        null = np.asarray(array.is_null().to_numpy(zero_copy_only=False), bool)
        out[null] = np.nan
        if bad is None:
            return out, None
        marks = bad[codes] if bad.size else np.zeros(len(array), bool)
        marks[null] = False
        return out, marks
    if pa.types.is_null(t):
        return np.full(len(array), np.nan), None
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        floats = pc.cast(array, pa.float64(), safe=False)
        return floats.to_numpy(zero_copy_only=False).astype(np.float64, copy=False), None
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        # pyarrow's cast takes exactly the ASCII spellings _NUMBER takes (bar spaces)
        try:
            floats = pc.cast(array, pa.float64())
            return floats.to_numpy(zero_copy_only=False).astype(np.float64, copy=False), None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _floats_python(array.to_pylist())
    # booleans, lists, structs: no reward
    out = np.full(len(array), np.nan)
    return out, np.asarray(array.is_valid().to_numpy(zero_copy_only=False), bool)


def _mostly_numbers(values: Sequence[Any]) -> bool:
    """Whether most non-empty values of a column's first rows are numbers (a reward
    column with a few unparsable cells is still one)."""
    v, bad = _floats_python(values[:1000])
    parsed = int(np.count_nonzero(~np.isnan(v)))
    return parsed > 0 and parsed >= 4 * int(np.count_nonzero(bad))


# A number written as text: ASCII decimal or scientific notation, or an infinity or NaN,
# with ASCII spaces around it.  float() alone would also take "1_0" (10.0) and other
# scripts' digits ("１"), which no trainer writes and pyarrow does not read as numbers.
_NUMBER = re.compile(rb"[ \t\r\n\f\v]*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                     rb"|(?i:inf|infinity|nan))[ \t\r\n\f\v]*")
_BLANK = re.compile(rb"[ \t\r\n\f\v]*")


def _floats_python(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """float64 values of Python cells (NaN = empty) and a mask of the unparsable ones:
    numbers, and strings (or bytes) that :data:`_NUMBER` matches."""
    out = np.full(len(values), np.nan)
    bad = np.zeros(len(values), bool)
    for i, v in enumerate(values):
        if v is None:
            continue
        if isinstance(v, str):
            try:
                v = v.encode("ascii")
            except UnicodeEncodeError:
                bad[i] = True
                continue
        if isinstance(v, bytes):
            if _BLANK.fullmatch(v):
                continue
            if not _NUMBER.fullmatch(v):
                bad[i] = True
                continue
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            bad[i] = True
            continue
        try:
            out[i] = float(v)
        except (ValueError, OverflowError):
            bad[i] = True
    return out, bad


# --------------------------------------------------------------------------- columns


class _Plan:
    """Which columns to read and how to combine them.  ``grouped=False``
    (:func:`read_columns`): the rows are not grouped; ``group_cols`` hold at most the
    label column, named ``key_name`` in messages."""

    def __init__(self, group_cols: tuple[str, ...], reward_cols: tuple[str, ...],
                 extra_cols: tuple[str, ...], *, grouped: bool = True,
                 key_name: str = "group id") -> None:
        self.group_cols = group_cols
        self.reward_cols = reward_cols
        self.extra_cols = extra_cols
        self.grouped = grouped
        self.key_name = key_name

    @property
    def value_cols(self) -> tuple[str, ...]:
        return self.reward_cols + self.extra_cols

    @property
    def needed(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.group_cols + self.value_cols))


def _plan(columns: Sequence[str] | None, numeric: Callable[[str], bool], preset: Preset | None,
          explicit_preset: bool, group_cols: Sequence[str] | None,
          reward_cols: Sequence[str] | None, extra_cols: Sequence[str], is_array: bool,
          optional_cols: Sequence[str] = ()) -> _Plan:
    base = preset if preset is not None else (_DEFAULT_ARRAYS if is_array else _DEFAULT)
    if columns is None:  # unknown: take the columns as asked
        groups = tuple(group_cols) if group_cols else base.group_cols[-1]
        rewards = tuple(reward_cols) if reward_cols else base.reward_cols
        if not rewards:
            raise LogError("no line of the file's start parses as a JSON object, so the "
                           "reward columns are unknown; name them with --reward-col")
        return _Plan(groups, rewards, tuple(extra_cols))
    if group_cols:
        groups = tuple(group_cols)
    else:
        groups = next((alt for alt in base.group_cols if all(c in columns for c in alt)),
                      base.group_cols[-1] if not is_array else ())
    if reward_cols:
        rewards = tuple(reward_cols)
    elif base.reward_cols:
        rewards = base.reward_cols
    else:
        rewards = tuple(c for c in columns
                        if c not in base.not_rewards and c not in groups
                        and c not in extra_cols and numeric(c))
        if not rewards:
            raise LogError(f"no numeric reward column (columns: {_list(columns)}); name "
                           "them with --reward-col")
    extra_cols = tuple(extra_cols) + tuple(
        c for c in optional_cols if c in columns and c not in (*extra_cols, *rewards, *groups))
    missing = [c for c in (*groups, *rewards, *extra_cols) if c not in columns]
    if missing:
        kind = "array" if is_array else "column"
        fits = [p.name for p in PRESETS.values() if p.fits(columns)
                and not (explicit_preset and preset is not None and p.name == preset.name)]
        hint = ("pass --reward-col NAME and --group-col NAME"
                + (f", or --preset {' / --preset '.join(fits)}" if fits else ""))
        raise LogError(f"no {kind} {missing[0]!r} (found: {_list(columns)}); {hint}")
    return _Plan(groups, rewards, tuple(extra_cols))


def _list(columns: Sequence[str]) -> str:
    shown = ", ".join(str(c) for c in list(columns)[:30])
    return (shown or "none") + (", ..." if len(columns) > 30 else "")


# --------------------------------------------------------------------------- CSV


class _Careful(Exception):
    """The fast pass over a CSV met a row it cannot take: read again, carefully."""


class _Grow(Exception):
    """A CSV row (or the header) is longer than the block: read again with a larger one."""


def _straddles(exc: BaseException) -> bool:
    """Whether pyarrow refused a block because a row did not fit in it."""
    text = str(exc)
    return "straddl" in text or "cannot infer number of columns" in text


def _larger_block(size: int, longest: int) -> int:
    if size >= longest:
        raise LogError(f"a row (or the header) is longer than {longest:,} bytes, the "
                       "longest row read (max_bytes / 16), or a quote is never closed; "
                       "raise max_bytes to read a longer row")
    return min(4 * size, longest)


def _read_csv(path: Path, compression: str | None, plan_for: Callable[..., _Plan],
              on_bad_row: str, progress: Callable[[int], None] | None, max_bytes: int
              ) -> tuple[_Plan, _Digest]:
    pa = _pa()
    import pyarrow.csv as pcsv

    def reader(plan: _Plan | None, handler: Any, careful: bool, block: int) -> Any:
        stream, raw = _open_stream(path, compression, max_bytes)
        include = plan.needed if plan is not None else None
        # group ids straight into dictionary arrays; values as numbers (the fast pass, on
        # both cores) or as bytes parsed per batch (the careful pass: a cell that is not a
        # number must not fail the whole block, and only one thread knows line numbers).
        # UTF-8 is checked per cell, after the read (_utf8_checked): a stray byte in one
        # row must not fail its block.
        types = None if plan is None else {
            **{c: pa.binary() if careful else pa.float64() for c in plan.value_cols},
            **{c: _key_type() for c in plan.group_cols}}
        convert = pcsv.ConvertOptions(include_columns=list(include) if include else None,
                                      column_types=types, strings_can_be_null=True,
                                      check_utf8=plan is None)
        parse = pcsv.ParseOptions(newlines_in_values=True, invalid_row_handler=handler)
        read = pcsv.ReadOptions(block_size=block, use_threads=not careful)
        try:
            return pcsv.open_csv(stream, read_options=read, parse_options=parse,
                                 convert_options=convert), raw
        except BaseException:
            raw.close()
            raise

    # the header and the first block's types (numeric columns: TRL's reward functions);
    # a small block, grown while the header or the first row does not fit in it
    longest = max(max_bytes // _ROW_SHARE, _BLOCK)
    block = 1 << 16
    while True:
        try:
            peek, raw = reader(None, lambda row: "skip", True, block)
        except pa.ArrowInvalid as exc:
            if not _straddles(exc):
                raise _csv_error(exc) from None
            block = _larger_block(block, longest)
            continue
        with raw:
            schema = peek.schema
            try:
                first = peek.read_next_batch()
            except StopIteration:
                first = None
            except pa.ArrowInvalid as exc:
                if not _straddles(exc):
                    first = None
                elif block < longest:
                    block = _larger_block(block, longest)
                    continue
                else:
                    first = None  # the main pass reports it
        break
    numeric = {f.name for f in schema if pa.types.is_integer(f.type)
               or pa.types.is_floating(f.type)
               or (first is not None and _mostly_numbers(first.column(f.name).to_pylist()))}
    plan = plan_for(schema.names, lambda c: c in numeric)
    careful = False
    block = max(block, _BLOCK)
    while True:
        try:
            return plan, _csv_pass(reader, plan, on_bad_row, progress, careful=careful,
                                   block=block, limit=max_bytes)
        except _Careful:
            careful = True
        except _Grow:
            block = _larger_block(block, longest)


def _csv_pass(reader: Callable[..., Any], plan: _Plan, on_bad_row: str,
              progress: Callable[[int], None] | None, *, careful: bool, block: int,
              limit: int) -> _Digest:
    pa = _pa()
    digest = _Digest(plan, on_bad_row, "line", limit)
    invalid: list[int] = []  # 0-based data-row index of each row with a wrong field count
    pending: list[_RowError] = []  # on_bad_row="error": raised once earlier rows are checked

    def handler(row: Any) -> str:
        if not careful:
            return "error"
        number = int(row.number) if row.number is not None else -1
        reason = f"{row.actual_columns} fields, expected {row.expected_columns}"
        if on_bad_row == "error":
            pending.append(_RowError(number, f"line {number}: {reason}"))
        else:
            digest.broken(number, reason)
        invalid.append(number - 2)
        return "skip"

    try:
        batches, raw = reader(plan, handler, careful, block)
    except pa.ArrowInvalid as exc:
        if _straddles(exc):
            raise _Grow from None
        if not careful:
            raise _Careful from None
        raise _csv_error(exc) from None
    seen = 0
    with raw:
        while True:
            try:
                batch = batches.read_next_batch()
            except StopIteration:
                break
            except pa.ArrowInvalid as exc:
                if _straddles(exc):
                    raise _Grow from None
                if not careful:
                    raise _Careful from None
                raise _csv_error(exc) from None
            n = batch.num_rows
            valid = np.arange(seen, seen + n)
            if invalid:  # valid row v sits at data row v + (invalid rows up to there)
                s = np.asarray(invalid) - np.arange(len(invalid))
                valid = valid + np.searchsorted(s, valid, side="right")
            seen += n
            try:
                _digest_arrow(digest, plan, batch, valid + 2)
            except _RowError as exc:
                if pending and pending[0].number < exc.number:
                    raise pending[0] from None
                raise
            if pending:
                raise pending[0]
            if progress is not None:
                progress(raw.tell())
    return digest


def _csv_error(exc: BaseException) -> LogError:
    text = _first_line(exc)
    if "UTF8" in text or "UTF-8" in text:
        return LogError("not a UTF-8 text file")
    if "Empty CSV file" in text:
        return LogError("empty file (no header row)")
    return LogError(f"malformed CSV ({text})")


def _digest_arrow(digest: _Digest, plan: _Plan, batch: Any, lines: np.ndarray) -> None:
    codes, flagged = [], []
    for c in plan.group_cols:
        keys, mask = _utf8_checked(_keys_arrow(batch.column(c)))
        codes.append(keys)
        if mask is not None:
            flagged.append((mask, f"{plan.key_name} in column {c!r} is not UTF-8 text"))
    values, unparsable, raw = [], [], []
    for c in plan.value_cols:
        column = batch.column(c)
        v, u = _floats_arrow(column)
        values.append(v)
        unparsable.append(u)
        raw.append(column)
    digest.add(codes, values, unparsable, raw, lines, flagged)


def _utf8_checked(keys: Any) -> tuple[Any, np.ndarray | None]:
    """Dictionary-encoded keys, those that are not UTF-8 text (a stray byte in a CSV cell,
    read unchecked so that it costs one row, not the file) replaced, and a mask of their
    rows (None if all are text)."""
    pa = _pa()
    try:
        keys.dictionary.validate(full=True)
        return keys, None
    except pa.ArrowInvalid:
        pass
    texts = keys.dictionary.cast(pa.binary()).to_pylist()
    broken = []
    for k, text in enumerate(texts):
        try:
            if text is not None:
                text.decode("utf-8")
        except UnicodeDecodeError:
            broken.append(k)
            texts[k] = f"\x00bad:{k}".encode()  # distinct, valid, used by no kept row
    indices = keys.indices
    mask = np.isin(indices.fill_null(-1).to_numpy(zero_copy_only=False), broken)
    dictionary = pa.array(texts, pa.binary()).cast(pa.string())
    return pa.DictionaryArray.from_arrays(indices, dictionary), mask


# --------------------------------------------------------------------------- JSON Lines


def _read_jsonl(path: Path, compression: str | None, plan_for: Callable[..., _Plan],
                on_bad_row: str, progress: Callable[[int], None] | None, max_bytes: int
                ) -> tuple[_Plan, _Digest]:
    stream, raw = _open_stream(path, compression, max_bytes)
    longest = max(max_bytes // _ROW_SHARE, _BLOCK)
    with raw:
        blocks = _line_blocks(stream, longest)
        first = next(blocks, None)
        columns: dict[str, list[Any]] = {}  # column -> its values in the first lines
        if first is not None:
            for line in first[0].split(b"\n")[:1000]:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(row, dict):
                    for k, v in row.items():
                        columns.setdefault(k, []).append(v)
        # no line of the first block parses: the columns are taken as asked, and every
        # line is a bad one
        plan = plan_for(list(columns) if columns else None,
                        lambda c: _mostly_numbers(columns.get(c, [])))
        digest = _Digest(plan, on_bad_row, "line", max_bytes)
        parser = _JsonBlocks(plan, digest, longest)
        if first is not None:
            # pyarrow parses the next block (releasing the GIL) while this one is digested
            with ThreadPoolExecutor(max_workers=1) as pool:
                (block, start), parsed = first, None
                for following in itertools.chain(blocks, [None]):
                    ahead = None
                    if following is not None:
                        types = dict(parsed[1] if parsed else parser.group_types)
                        ahead = (types, pool.submit(parser.parse, following[0], types))
                    parser.block(block, start, parsed)
                    if following is None or ahead is None:
                        break
                    if progress is not None:
                        progress(raw.tell())
                    (block, start), parsed = following, ahead[1].result()
                    if ahead[0] != parser.group_types:  # a rejected block switched a type
                        parsed = None
    return plan, digest


# Stands in for a line longer than the longest read: parsed, it is a bad line.
_LONG_LINE = b"\x00 line too long"


def _line_blocks(stream: Any, longest: int) -> Iterator[tuple[bytes, int]]:
    """``(block, first line number)``: whole lines, about ``_BLOCK`` bytes at a time.  A
    line longer than ``longest`` bytes (at least ``_BLOCK``: a line within one chunk is
    never longer) is dropped as it streams and :data:`_LONG_LINE` stands in for it (memory
    stays bounded by ``longest`` and the block)."""
    pieces: list[bytes] = []  # the line not yet ended
    held = 0
    skipping = False  # inside a line already too long
    line = 1
    while True:
        try:
            chunk = bytes(stream.read(_BLOCK))
        except OSError as exc:
            raise LogError(f"cannot decompress: {_first_line(exc)}") from None
        if not chunk:
            break
        end = chunk.find(b"\n")  # of the line begun in an earlier chunk
        if end < 0:
            if not skipping:
                pieces.append(chunk)
                held += len(chunk)
                if held > longest:
                    pieces, held, skipping = [], 0, True
            continue
        if skipping or held + end > longest:
            chunk = chunk[end:]
            pieces, skipping = [_LONG_LINE], False
        cut = chunk.rfind(b"\n")
        block = b"".join((*pieces, chunk[:cut + 1]))
        rest = chunk[cut + 1:]
        pieces, held = [rest], len(rest)
        if line == 1:
            block = block.removeprefix(b"\xef\xbb\xbf")
        yield block, line
        line += block.count(b"\n")
    carry = _LONG_LINE if skipping else b"".join(pieces)
    if carry.strip():
        yield (carry.removeprefix(b"\xef\xbb\xbf") if line == 1 else carry), line


class _JsonBlocks:
    """Parses blocks of JSON lines with pyarrow; a block pyarrow rejects is split in halves
    until the offending lines are found and parsed one by one (so one broken line costs
    little and is reported with its line number)."""

    _SPLIT = 512  # lines below which a rejected block is parsed line by line

    def __init__(self, plan: _Plan, digest: _Digest, longest: int) -> None:
        pa = _pa()
        self.plan = plan
        self.digest = digest
        self.longest = longest
        self.group_types = {c: pa.string() for c in plan.group_cols}

    def _schema(self, types: dict[str, Any]) -> Any:
        pa = _pa()
        fields = [pa.field(c, t) for c, t in types.items()]
        fields += [pa.field(c, pa.float64()) for c in self.plan.value_cols
                   if c not in types]
        return pa.schema(fields)

    def parse(self, block: bytes, types: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """pyarrow's table of a block (None if it rejects it) and the group column types
        that parsed it; touches no state, so it may run on another thread."""
        pa = _pa()
        import pyarrow.json as pj

        types = dict(types)
        read = pj.ReadOptions(block_size=_BLOCK // 2, use_threads=True)
        for _ in range(len(types) + 1):
            parse = pj.ParseOptions(explicit_schema=self._schema(types),
                                    unexpected_field_behavior="ignore")
            try:
                return pj.read_json(pa.BufferReader(block), read_options=read,
                                    parse_options=parse), types
            except pa.ArrowInvalid as exc:
                # a group column of integers (a numeric uid or step): switch its type once
                text = str(exc)
                switched = False
                for c, t in types.items():
                    if (f"Column(/{c}) changed from string to number" in text
                            and t == pa.string()):
                        types[c] = pa.int64()
                        switched = True
                    elif (f"Column(/{c}) changed from number to string" in text
                            and t == pa.int64()):
                        types[c] = pa.string()
                        switched = True
                if not switched:
                    return None, types
        return None, types

    def block(self, block: bytes, start: int, parsed: tuple[Any, dict[str, Any]] | None = None
              ) -> None:
        """Digest a block, with ``parse``'s result for it if it was parsed ahead."""
        table, self.group_types = parsed or self.parse(block, self.group_types)
        if table is not None:
            lines = _nonblank_lines(block, start)
            if lines is not None and lines.size == table.num_rows:
                batch = table.combine_chunks()
                _digest_arrow(self.digest, self.plan, batch, lines)
                return
        if not block.strip():
            return
        parts = block.split(b"\n")
        if block.endswith(b"\n"):
            parts.pop()
        if len(parts) <= self._SPLIT:
            self._python(parts, start)
            return
        half = len(parts) // 2
        self.block(b"\n".join(parts[:half]) + b"\n", start)
        self.block(b"\n".join(parts[half:]) + (b"\n" if block.endswith(b"\n") else b""),
                   start + half)

    def _python(self, parts: list[bytes], start: int) -> None:
        digest = self.digest
        rows: list[dict[str, Any]] = []
        lines: list[int] = []
        broken: list[tuple[int, str]] = []
        for k, line in enumerate(parts):
            if not line.strip():
                continue
            number = start + k
            if line == _LONG_LINE:
                broken.append((number, f"longer than {self.longest:,} bytes, the longest "
                                       "line read (max_bytes / 16)"))
                continue
            try:
                row = json.loads(line)
            except UnicodeDecodeError:
                broken.append((number, "not UTF-8 text"))
                continue
            except RecursionError:
                broken.append((number, "JSON nested too deeply"))
                continue
            except ValueError as exc:  # broken JSON, or an integer of over 4300 digits
                broken.append((number, f"not valid JSON ({_first_line(exc).split(':')[0]})"))
                continue
            if not isinstance(row, dict):
                broken.append((number, f"expected a JSON object, got {type(row).__name__}"))
                continue
            rows.append(row)
            lines.append(number)
        try:
            if rows:
                self._python_rows(rows, lines)
        except _RowError as exc:  # with on_bad_row="error": the first bad line of all
            if not broken or exc.number < broken[0][0]:
                raise
        for number, reason in broken:
            digest.broken(number, reason)

    def _python_rows(self, rows: list[dict[str, Any]], lines: list[int]) -> None:
        plan, digest = self.plan, self.digest
        codes = [_keys_python([r.get(c) for r in rows]) for c in plan.group_cols]
        values, unparsable, raw = [], [], []
        for c in plan.value_cols:
            column = [r.get(c) for r in rows]
            v, u = _floats_python(column)
            values.append(v)
            unparsable.append(u)
            raw.append(column)
        digest.add(codes, values, unparsable, raw, np.asarray(lines, np.int64))


def _nonblank_lines(block: bytes, start: int) -> np.ndarray | None:
    """Line numbers of the non-blank lines of a block (pyarrow skips blank lines)."""
    buf = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(buf == 10)
    if not block.endswith(b"\n"):
        ends = np.append(ends, buf.size)
    begins = np.concatenate(([0], ends[:-1] + 1))
    length = ends - begins
    blank = length == 0
    cr = length == 1
    if cr.any():
        blank[cr] = buf[begins[cr]] == 13
    if (length > 1).any() and not (length[~blank] > 1).all():
        return None
    return start + np.flatnonzero(~blank)


# --------------------------------------------------------------------------- Parquet


def _read_parquet(path: Path, plan_for: Callable[..., _Plan], on_bad_row: str,
                  progress: Callable[[int], None] | None, max_bytes: int
                  ) -> tuple[_Plan, _Digest]:
    pa = _pa()
    import pyarrow.parquet as pq

    f, size = _open(path)
    with f:
        try:
            schema = pq.ParquetFile(f).schema_arrow
        except (pa.ArrowException, OSError) as exc:
            raise LogError(f"cannot read as Parquet ({_first_line(exc)})") from None
        numeric = {fl.name for fl in schema if pa.types.is_integer(fl.type)
                   or pa.types.is_floating(fl.type)}
        plan = plan_for(schema.names, lambda c: c in numeric)
        # text columns stay dictionary-encoded as they are in the file: a long string
        # repeated on every row is held once, not once per row
        text = [c for c in plan.needed if c in schema.names and _is_text(schema.field(c).type)]
        try:
            f.seek(0)
            pf = pq.ParquetFile(f, read_dictionary=text)
            batch_rows = _parquet_budget(pf.metadata, plan, max_bytes)
            digest = _Digest(plan, on_bad_row, "row", max_bytes)
            total = max(pf.metadata.num_rows, 1)
            row = 1
            for batch in pf.iter_batches(batch_size=batch_rows, columns=list(plan.needed)):
                n = batch.num_rows
                _digest_arrow(digest, plan, batch, np.arange(row, row + n))
                row += n
                if progress is not None:
                    progress(int(size * min(1.0, row / total)))
        except (pa.ArrowException, OSError) as exc:
            raise LogError(f"cannot read as Parquet ({_first_line(exc)})") from None
    return plan, digest


def _is_text(t: Any) -> bool:
    pa = _pa()
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t))


def _parquet_budget(meta: Any, plan: _Plan, max_bytes: int) -> int:
    """Rows per batch for about ``_BLOCK`` bytes of the needed columns, after checking the
    sizes the metadata gives before anything is read: the needed columns' uncompressed
    size and the kept rows' size may each be at most ``max_bytes``."""
    needed = plan.needed
    unpacked = 0
    per_row = 0.0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        in_group = 0
        for k in range(group.num_columns):
            chunk = group.column(k)
            name = chunk.path_in_schema
            if any(name == c or name.startswith(c + ".") for c in needed):
                in_group += max(int(chunk.total_uncompressed_size), 0)
        unpacked += in_group
        per_row = max(per_row, in_group / max(group.num_rows, 1))
    if unpacked > max_bytes:
        raise LogError(f"the columns read ({_list(needed)}) take {unpacked:,} bytes "
                       f"uncompressed, over {max_bytes:,} (max_bytes); raise max_bytes to "
                       "read them")
    kept = meta.num_rows * (_VALUE_BYTES * len(plan.value_cols)
                            + _CODE_BYTES * len(plan.group_cols))
    if kept > max_bytes:
        raise LogError(f"its {meta.num_rows:,} rows would take {kept:,} bytes once read, "
                       f"over {max_bytes:,} (max_bytes); raise max_bytes to read them")
    return int(min(1 << 18, max(1, _BLOCK // max(per_row, 1.0))))


# --------------------------------------------------------------------------- NPZ / NPY


def _npy_read(fp: IO[bytes], name: str, limit: int, size: int | None) -> np.ndarray:
    """The array of a .npy stream of ``size`` bytes (when known), in native byte order, by
    advcal's one bounded .npy reader (:mod:`advcal._npy`): refused past ``limit`` bytes
    (an empty dimension counted as 1) before anything is read."""
    try:
        return _npy.read_npy(fp, name, limit, size=size, native=True)
    except _npy.NpyError as exc:
        raise LogError(str(exc)) from None


def _read_arrays(path: Path, fmt: str, limit: int) -> dict[str, np.ndarray]:
    """The arrays of a .npy file (its fields, if structured) or of an .npz archive (its
    members, at most ``_NPZ_MEMBERS``, ``limit`` bytes in all, checked from the zip
    directory before anything is decompressed), read by :mod:`advcal._npy`."""
    f, size = open_regular(path, "log")
    with f:
        if fmt == "npy":
            array = _npy_read(f, "the .npy file", limit, size)
            if array.dtype.names:
                return {n: _native(array[n]) for n in array.dtype.names}
            return {"rewards": array}
        try:
            archive = _npy.open_zip(f, size, _NPZ_MEMBERS)
        except _npy.NpyError as exc:
            raise LogError(f"cannot read as .npz ({exc})") from None
        with archive:
            infos = archive.infolist()
            total = sum(i.file_size for i in infos)
            if total > limit:  # before anything is decompressed: a zip bomb stops here
                raise LogError(f"the .npz members decompress to {total:,} bytes, over the "
                               f"limit of {limit:,} bytes")
            arrays = {}
            for info in infos:
                name = info.filename.removesuffix(".npy")
                try:
                    arrays[name] = _npy.read_member(archive, info, f"member {name!r}", limit,
                                                    native=True)
                except _npy.NpyError as exc:
                    raise LogError(str(exc)) from None
    return arrays


def _native(array: np.ndarray) -> np.ndarray:
    if array.dtype.byteorder not in ("=", "|"):
        return array.astype(array.dtype.newbyteorder("="))
    return array


def _read_npz(path: Path, fmt: str, plan_for: Callable[..., _Plan], on_bad_row: str,
              limit: int) -> tuple[_Plan, _Digest]:
    pa = _pa()
    arrays = _read_arrays(path, fmt, limit)
    numeric = {k for k, a in arrays.items() if a.dtype.kind in "iuf"}
    plan = plan_for(list(arrays), lambda c: c in numeric)
    digest = _Digest(plan, on_bad_row, "row")
    value_arrays = []
    dims = (1, 2) if plan.grouped else (1,)  # ungrouped: one value per row
    for c in plan.value_cols:
        a = arrays[c]
        if a.dtype.kind not in "iuf" or a.ndim not in dims:
            raise LogError(f"array {c!r} must hold numbers in {' or '.join(map(str, dims))} "
                           f"dimension{'s' if plan.grouped else ''}; got {a.ndim}-D {a.dtype}")
        value_arrays.append(a)
    shape = value_arrays[0].shape
    for c, a in zip(plan.value_cols, value_arrays, strict=True):
        if a.shape != shape:
            raise LogError(f"array {c!r} has shape {a.shape}, {plan.value_cols[0]!r} has "
                           f"{shape}")
    n = math.prod(shape)
    group_pieces: list[Callable[[int, int], np.ndarray]]  # rows lo:hi -> their group ids
    if len(shape) == 2:
        if plan.group_cols:
            raise LogError("2-D rewards are grouped by row; drop --group-col")
        width = shape[1]  # row ids made per chunk: (2**28, 0) rewards take no memory
        group_pieces = [lambda lo, hi: np.arange(lo, hi) // width]
        plan = _Plan(("row",), plan.reward_cols, plan.extra_cols)
        digest = _Digest(plan, on_bad_row, "row")
    elif plan.grouped and plan.group_cols == ("offsets",):
        off = _offsets(arrays["offsets"], n)
        # the group of each row by a search per chunk, not an array of n group ids
        group_pieces = [lambda lo, hi: np.searchsorted(off, np.arange(lo, hi), "right") - 1]
    elif not plan.group_cols:
        if plan.grouped:
            raise LogError("1-D rewards need exactly one of `offsets` or `group_ids` (or "
                           "--group-col NAME)")
        group_pieces = []
    else:
        group_pieces = []
        for c in plan.group_cols:
            g = arrays[c]
            if g.ndim != 1 or g.size != n:
                raise LogError(f"array {c!r} must be 1-D with one label per row ({n}); "
                               f"got shape {g.shape}")

            def labels(lo: int, hi: int, g: np.ndarray = g) -> np.ndarray:
                return g[lo:hi]

            group_pieces.append(labels)
    flat = [a.reshape(-1) for a in value_arrays]
    for lo in range(0, n, _NPZ_ROWS):
        hi = min(n, lo + _NPZ_ROWS)
        codes = []
        for piece_of in group_pieces:
            piece = piece_of(lo, hi)
            if piece.dtype.kind in "iu":
                codes.append(_keys_arrow(pa.array(piece.astype(np.int64))))
            elif piece.dtype.kind in "USb":
                ids = piece.tolist()
                if piece.dtype.kind == "S":  # bytes: UTF-8 text, as in the text formats
                    ids = [b.decode() for b in ids]
                codes.append(_keys_arrow(pa.array(ids)))
            else:
                raise LogError(f"{plan.key_name}s must be integers or strings; got "
                               f"{piece.dtype}")
        values = [np.asarray(a[lo:hi], np.float64) for a in flat]
        digest.add(codes, values, [None] * len(values), [a[lo:hi] for a in flat],
                   np.arange(lo + 1, hi + 1))
    return plan, digest


def _offsets(off: np.ndarray, n: int) -> np.ndarray:
    """An .npz log's ``offsets`` as int64, checked: 1-D integers (unsigned ones too, when
    they fit int64) non-decreasing from 0 to ``n``."""
    message = f"array 'offsets' must be non-decreasing integers from 0 to {n}"
    if off.dtype.kind not in "iu" or off.ndim != 1 or off.size < 1:
        raise LogError(f"{message}; got {off.ndim}-D {off.dtype} of size {off.size}")
    if off.dtype.kind == "u" and off.max() > np.iinfo(np.int64).max:
        raise LogError(f"{message}; got {off.max()}, beyond int64")
    off = off.astype(np.int64, copy=False)
    if off[0] != 0 or off[-1] != n or np.any(off[1:] < off[:-1]):
        raise LogError(message)
    return off


def _decompressed_copy(path: Path, compression: str, limit: int, workdir: str) -> Path:
    """A compressed binary file (Parquet, .npz, .npy) decompressed to a temporary file,
    refused past ``limit`` bytes."""
    stream, raw = _open_stream(path, compression)
    target = Path(workdir) / path.name
    written = 0
    try:
        with raw, open(target, "wb") as out:
            while True:
                chunk = stream.read(1 << 22)
                if not chunk:
                    break
                written += len(chunk)
                if written > limit:
                    raise LogError(f"decompresses to over the limit of {limit:,} bytes")
                out.write(chunk)
    except OSError as exc:
        raise LogError(f"cannot decompress ({compression}): {_first_line(exc)}") from None
    return target


# --------------------------------------------------------------------------- read_log


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
    >>> from advcal.logs import read_log
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
        if weights is not None and len(weights) != len(plan.reward_cols):
            raise LogError(f"{len(weights)} reward weights for the {len(plan.reward_cols)} "
                           f"reward columns {', '.join(plan.reward_cols)}")
        return plan

    plan, digest = _read(path, fmt, compression, plan_for, on_bad_row, max_bytes, progress)
    return _assemble(path, fmt, compression, plan, digest,
                     weights or (1.0,) * len(plan.reward_cols), reward_agg)


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
    >>> from advcal.logs import read_columns
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
    parse: dict[str, Callable[[str], Any]] = {"int": int, "float": float,
                                              "bool": lambda t: t == "true"}
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
        unified = pa.chunked_array(digest.groups.pop(0), type=_key_type())
        unified = unified.unify_dictionaries()
        pa.default_memory_pool().release_unused()
        ids = unified.chunk(0).dictionary if unified.num_chunks else pa.array([], pa.string())
        chunks = [c.indices for c in unified.chunks]
        del unified
        codes = _concat(chunks, np.dtype(np.int32),
                        lambda a: a.to_numpy(zero_copy_only=False))
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


def _concat(chunks: list[Any], dtype: np.dtype, convert: Callable[[Any], np.ndarray] =
            np.asarray) -> np.ndarray:
    """``np.concatenate`` of ``chunks`` that drops each chunk once copied: the peak is the
    result and one chunk, not twice the result."""
    pool = _pa().default_memory_pool()
    out = np.empty(sum(len(c) for c in chunks), dtype)
    chunks.reverse()
    at = 0
    while chunks:
        piece = convert(chunks.pop())
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
    pa = _pa()
    import pyarrow.compute as pc

    group, n_groups = codes[0][0], codes[0][1]
    for c, n_ids in codes[1:]:
        key = group.astype(np.int64)
        key *= n_ids
        key += c
        encoded = pc.dictionary_encode(pa.array(key))
        del key
        group = encoded.indices.to_numpy(zero_copy_only=False)
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
