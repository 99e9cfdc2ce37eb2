"""JSON Lines logs, read in blocks of whole lines; a line longer than the limit is skipped
and counted as it streams."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from advcal.io import _common
from advcal.io._common import _ROW_SHARE, LogError, _pa, _RowError
from advcal.io._detect import _first_line, _open_stream
from advcal.io._digest import (
    _Digest,
    _digest_arrow,
    _floats_python,
    _keys_python,
    _mostly_numbers,
    _Plan,
    _text_keys,
)


def _read_jsonl(path: Path, compression: str | None, plan_for: Callable[..., _Plan],
                on_bad_row: str, progress: Callable[[int], None] | None, max_bytes: int
                ) -> tuple[_Plan, _Digest]:
    stream, raw = _open_stream(path, compression, max_bytes)
    longest = max(max_bytes // _ROW_SHARE, _common._BLOCK)
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
            chunk = bytes(stream.read(_common._BLOCK))
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
        read = pj.ReadOptions(block_size=_common._BLOCK // 2, use_threads=True)
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
        flagged: list[tuple[np.ndarray, str]] = []
        codes = [_text_keys(_keys_python([r.get(c) for r in rows], plan.grouped), plan, c,
                            flagged) for c in plan.group_cols]
        values, unparsable, raw = [], [], []
        for c in plan.value_cols:
            column = [r.get(c) for r in rows]
            v, u = _floats_python(column)
            values.append(v)
            unparsable.append(u)
            raw.append(column)
        digest.add(codes, values, unparsable, raw, np.asarray(lines, np.int64), flagged)


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


