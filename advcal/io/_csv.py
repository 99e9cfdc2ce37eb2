"""CSV logs, read by pyarrow in blocks that grow to hold the longest row."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from advcal.io import _common
from advcal.io._common import _ROW_SHARE, LogError, _pa, _RowError
from advcal.io._detect import _first_line, _open_stream
from advcal.io._digest import _Digest, _digest_arrow, _key_type, _mostly_numbers, _Plan


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
    longest = max(max_bytes // _ROW_SHARE, _common._BLOCK)
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
    block = max(block, _common._BLOCK)
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
