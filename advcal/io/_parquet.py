"""Parquet logs, read by row batches after their metadata is checked against the limit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from advcal.io import _common
from advcal.io._common import _CODE_BYTES, _VALUE_BYTES, LogError, _pa
from advcal.io._detect import _first_line, _open
from advcal.io._digest import _Digest, _digest_arrow, _list, _Plan


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
    return int(min(1 << 18, max(1, _common._BLOCK // max(per_row, 1.0))))


