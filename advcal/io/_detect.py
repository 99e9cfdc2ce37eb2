"""Opening a log: regular files only, compression and format from the first bytes, and
decompression capped as it streams."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

from advcal._files import open_regular, user_path
from advcal.io._common import FORMATS, LogError, _pa

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
    if compression is None:  # read as it is: the Python file reads without pyarrow's copy
        return f, f
    try:
        raw = pa.PythonFile(f, mode="r")
    except BaseException:
        f.close()
        raise
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
        if head or _extension_format(path) not in (None, "csv"):
            raise LogError("empty file (no rows)" if head else "empty file (0 bytes)")
        raise LogError("empty file (no header row)")
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


