"""Rows into columns as they stream: group keys coded per block, numbers parsed as plain
ASCII notation only, bad rows counted; and the plan of which columns to read."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from advcal.io._common import (
    _DEFAULT,
    _DEFAULT_ARRAYS,
    _EXAMPLES,
    PRESETS,
    LogError,
    Preset,
    _array,
    _from_numpy,
    _numpy,
    _pa,
    _RowError,
    _scalar,
)


def _key_type() -> Any:
    pa = _pa()
    return pa.dictionary(pa.int32(), pa.string())


def _keys_arrow(array: Any, nested: bool = True) -> Any:
    """Group ids as a dictionary array of strings (null: no id).

    Strings stay as they are; other scalars are tagged with their type ("\\x00int:1"), so
    JSON's 1, 1.0, true and "1" are four groups.  The dictionaries of all batches are
    unified once at the end, in C++: no id passes through Python, but for lists and structs
    (``nested``: a chat prompt's messages), keyed by their JSON text.
    """
    pa = _pa()
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if pa.types.is_dictionary(t):
        if pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type):
            array = _compact(array).cast(_key_type())
            empty = pc.equal(array.dictionary, _scalar("", pa.string()))
            if not pc.any(empty).as_py():
                return array
            # "": no id (the dictionary is kept, not decoded: Parquet ids stay encoded)
            blank = pc.is_in(array.indices, value_set=pc.indices_nonzero(empty).cast(
                pa.int32()))
            indices = pc.if_else(blank, _scalar(None, pa.int32()), array.indices)
            return pa.DictionaryArray.from_arrays(indices, array.dictionary)
        array = array.dictionary_decode()
        t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        encoded = pc.dictionary_encode(array).cast(_key_type())
        if not pc.any(pc.equal(encoded.dictionary, _scalar("", pa.string()))).as_py():
            return encoded
        # "": no id
        array = pc.if_else(pc.equal(array, _scalar("", t)), _scalar(None, t), array)
        return pc.dictionary_encode(array).cast(_key_type())
    if pa.types.is_nested(t):  # lists, structs (TRL's chat prompts): their JSON text
        return _keys_python(array.to_pylist(), nested)
    tag = ("int" if pa.types.is_integer(t) else "float" if pa.types.is_floating(t)
           else "bool" if pa.types.is_boolean(t) else None)
    if tag is None:  # binary, dates and other scalars: no group id
        return pa.nulls(len(array), _key_type())
    if tag == "float":  # NaN and infinities name no group
        array = pc.if_else(pc.is_finite(array), array, _scalar(None, t))
        text = pc.binary_join_element_wise(_scalar(f"\x00{tag}:", pa.string()),
                                           array.cast(pa.string()), _scalar("", pa.string()))
        return pc.dictionary_encode(text).cast(_key_type())
    # An integer's or a bool's text is one-to-one with its value: encode the values, and
    # write only the distinct ones as text (the same keys, in the same order).
    encoded = pc.dictionary_encode(array)
    text = pc.binary_join_element_wise(_scalar(f"\x00{tag}:", pa.string()),
                                       encoded.dictionary.cast(pa.string()),
                                       _scalar("", pa.string()))
    return pa.DictionaryArray.from_arrays(encoded.indices, text).cast(_key_type())


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
    lookup[_numpy(used)] = np.arange(len(used), dtype=np.int32)
    indices = pc.take(_from_numpy(lookup), array.indices)
    return pa.DictionaryArray.from_arrays(indices, array.dictionary.take(used))


def _json_key(value: list[Any] | dict[Any, Any]) -> str | None:
    """The key of a nested group id (a list of chat messages): its JSON text with sorted
    keys, tagged so that it never equals a string id; None (no id) when it is empty."""
    if not value:
        return None
    try:
        return "\x00json:" + json.dumps(value, sort_keys=True, separators=(",", ":"),
                                         ensure_ascii=False, default=repr)
    except RecursionError:  # nested beyond what the encoder follows: no id
        return None


def _keys_python(values: Sequence[Any], nested: bool = True) -> Any:
    """:func:`_keys_arrow` of Python values (the JSON lines parsed one by one).  With
    ``nested`` false (labels, which stay scalars) a list or an object names nothing."""
    pa = _pa()
    keys: list[str | None] = []
    for v in values:
        if v is None or v == "" or (isinstance(v, float) and not math.isfinite(v)):
            keys.append(None)
        elif isinstance(v, (list, dict)):
            keys.append(_json_key(v) if nested else None)
        elif isinstance(v, str):
            keys.append(v)
        elif isinstance(v, bool):
            keys.append(f"\x00bool:{str(v).lower()}")
        else:
            keys.append(f"\x00{type(v).__name__}:{v!r}")
    return _array(keys, pa.string()).dictionary_encode().cast(_key_type())


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
        missing = [_numpy(g.is_null()) for g in groups]
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
            mask = _from_numpy(keep)
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
    # default=str: a date or a timestamp cell
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
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
        codes = _numpy(array.indices.fill_null(_scalar(0, array.indices.type)))
        out = floats[codes] if floats.size else np.full(len(array), np.nan)
        null = _numpy(array.is_null())
        out[null] = np.nan
        if bad is None:
            return out, None
        marks = bad[codes] if bad.size else np.zeros(len(array), bool)
        marks[null] = False
        return out, marks
    if pa.types.is_null(t):
        return np.full(len(array), np.nan), None
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return _numpy(pc.cast(array, pa.float64(), safe=False)), None
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        # pyarrow's cast takes exactly the ASCII spellings _NUMBER takes (bar spaces)
        try:
            return _numpy(pc.cast(array, pa.float64())), None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _floats_python(array.to_pylist())
    # booleans, lists, structs: no reward
    out = np.full(len(array), np.nan)
    return out, _numpy(array.is_valid())


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




def _digest_arrow(digest: _Digest, plan: _Plan, batch: Any, lines: np.ndarray) -> None:
    flagged: list[tuple[np.ndarray, str]] = []
    codes = [_text_keys(_keys_arrow(batch.column(c), plan.grouped), plan, c, flagged)
             for c in plan.group_cols]
    values, unparsable, raw = [], [], []
    for c in plan.value_cols:
        column = batch.column(c)
        v, u = _floats_arrow(column)
        values.append(v)
        unparsable.append(u)
        raw.append(column)
    digest.add(codes, values, unparsable, raw, lines, flagged)


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


def _text_keys(keys: Any, plan: _Plan, column: str,
               flagged: list[tuple[np.ndarray, str]]) -> Any:
    """:func:`_utf8_checked` keys of ``column``, the rows of keys that are not UTF-8 text
    added to ``flagged`` as bad rows."""
    keys, mask = _utf8_checked(keys)
    if mask is not None:
        flagged.append((mask, f"{plan.key_name} in column {column!r} is not UTF-8 text"))
    return keys


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
    mask = np.isin(_numpy(indices.fill_null(_scalar(-1, indices.type))), broken)
    dictionary = _array(texts, pa.binary()).cast(pa.string())
    return pa.DictionaryArray.from_arrays(indices, dictionary), mask
