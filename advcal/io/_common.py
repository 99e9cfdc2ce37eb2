"""What the log readers share: limits, errors, presets and the result classes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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


# pyarrow's conversions (pa.array, pa.scalar, to_numpy, a compute function's Python
# argument) first ask pandas whether a value is a pandas object, importing it where it is
# installed: a large part of a short CLI run.  Arrays built from buffers skip the question.

def _from_numpy(values: np.ndarray) -> Any:
    """The Arrow array of a 1-d numeric or bool numpy array (no nulls)."""
    pa = _pa()
    values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
    if values.dtype == np.bool_:
        data = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), values.size, [None, pa.py_buffer(data)])
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), values.size,
                                 [None, pa.py_buffer(values)])


def _array(values: Sequence[str | bytes | None], type: Any) -> Any:
    """The Arrow array of Python strings or bytes (None: null) as ``type`` (string or
    binary).  Not validated: a string with a lone surrogate (JSON's "\\ud800") keeps its
    bytes, which are not UTF-8, for :func:`~advcal.io._digest._utf8_checked` to find."""
    pa = _pa()
    if type not in (pa.string(), pa.binary()):
        raise TypeError(f"text arrays are string or binary, not {type}")
    valid = np.fromiter((v is not None for v in values), bool, len(values))
    raw = [v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v
           for v in values if v is not None]
    if not all(isinstance(v, bytes) for v in raw):
        raise TypeError("text arrays hold str or bytes")
    lengths = np.zeros(len(values), np.int64)
    lengths[valid] = np.fromiter(map(len, raw), np.int64, len(raw))
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    if offsets[-1] >= 2**31:
        raise LogError("over 2 GiB of text in one batch of ids; pass fewer rows at a time")
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(type, len(values), [
        bitmap, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(raw))])


def _numpy(array: Any) -> np.ndarray:
    """A numpy array of a fixed-width Arrow array (numbers or bools), a read-only view where
    it can be; null floats are NaN (integers with nulls are not taken)."""
    pa = _pa()
    n, at = len(array), array.offset
    if pa.types.is_dictionary(array.type):
        raise TypeError("a dictionary array: take its indices")
    buffers = array.buffers()
    if pa.types.is_boolean(array.type):
        out = _bits(buffers[1], at, n)
    else:
        dtype = np.dtype(array.type.to_pandas_dtype())
        out = (np.frombuffer(buffers[1], dtype, count=n, offset=at * dtype.itemsize) if n
               else np.empty(0, dtype))
    if array.null_count:
        if out.dtype.kind != "f":
            raise ValueError("nulls in an array that is not of floats")
        out = out.copy()
        out[~_bits(buffers[0], at, n)] = np.nan
    return out


def _bits(buffer: Any, at: int, n: int) -> np.ndarray:
    """Bits ``at`` to ``at + n`` of an Arrow bitmap, as bools."""
    if n == 0:
        return np.zeros(0, bool)
    return np.unpackbits(np.frombuffer(buffer, np.uint8), count=at + n,
                         bitorder="little")[at:].astype(bool)


def _scalar(value: str | int | None, type: Any) -> Any:
    """The Arrow scalar ``value`` (None: null) of ``type`` (a string or an integer type)."""
    pa = _pa()
    if value is None:
        return pa.nulls(1, type)[0]
    if isinstance(value, str):
        return _array([value], type)[0]
    return _from_numpy(np.array([value])).cast(type)[0]


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


@dataclass(frozen=True)
class FileRead:
    """One file of a log read from several (:func:`read_logs`).

    Attributes
    ----------
    path : str
        The file.
    responses, groups : int
        The responses kept from it, and their groups (groups never span files).
    bad_rows : BadRows
        Its rows skipped.
    """

    path: str
    responses: int
    groups: int
    bad_rows: BadRows


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
    files : tuple of FileRead
        For a log read from several files (:func:`read_logs`), each file's counts, in
        reading order; empty for one file.
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
    files: tuple[FileRead, ...] = ()

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


