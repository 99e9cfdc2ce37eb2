"""NPZ and NPY logs, read by the one bounded, pickle-free reader (``advcal.io._npy``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

from advcal._files import open_regular
from advcal.io import _npy
from advcal.io._common import _NPZ_MEMBERS, _NPZ_ROWS, LogError, _array, _from_numpy, _pa
from advcal.io._detect import _first_line, _open_stream
from advcal.io._digest import _Digest, _keys_arrow, _Plan, _text_keys


def _npy_read(fp: IO[bytes], name: str, limit: int, size: int | None) -> np.ndarray:
    """The array of a .npy stream of ``size`` bytes (when known), in native byte order, by
    advcal's one bounded .npy reader (:mod:`advcal.io._npy`): refused past ``limit`` bytes
    (an empty dimension counted as 1) before anything is read."""
    try:
        return _npy.read_npy(fp, name, limit, size=size, native=True)
    except _npy.NpyError as exc:
        raise LogError(str(exc)) from None


def _read_arrays(path: Path, fmt: str, limit: int) -> dict[str, np.ndarray]:
    """The arrays of a .npy file (its fields, if structured) or of an .npz archive (its
    members, at most ``_NPZ_MEMBERS``, ``limit`` bytes in all, checked from the zip
    directory before anything is decompressed), read by :mod:`advcal.io._npy`."""
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
        flagged: list[tuple[np.ndarray, str]] = []
        for c, piece_of in zip(plan.group_cols, group_pieces, strict=True):
            piece = piece_of(lo, hi)
            if piece.dtype.kind == "b":
                codes.append(_keys_arrow(_from_numpy(piece)))
            elif piece.dtype.kind in "iu":
                codes.append(_keys_arrow(_from_numpy(piece.astype(np.int64))))
            elif piece.dtype.kind in "US":
                ids = piece.tolist()
                if piece.dtype.kind == "S":  # bytes: UTF-8 text, as in the text formats
                    ids = [b.decode() for b in ids]
                codes.append(_text_keys(_keys_arrow(_array(ids, pa.string())), plan, c,
                                        flagged))
            else:
                raise LogError(f"{plan.key_name}s must be integers or strings; got "
                               f"{piece.dtype}")
        values = [np.asarray(a[lo:hi], np.float64) for a in flat]
        digest.add(codes, values, [None] * len(values), [a[lo:hi] for a in flat],
                   np.arange(lo + 1, hi + 1), flagged)
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


