"""One bounded, pickle-free reader of NumPy's ``.npy`` data: ``.npy`` files and the members of
``.npz`` (zip) archives, for the calibration files of :mod:`advcal.io.artefacts` and the array
logs of :mod:`advcal.io.logs`.

Bounds, all checked before the data is read:

* a ``.npy`` header is at most :data:`MAX_HEADER_BYTES` long and is parsed as a Python
  literal (never unpickled, never evaluated);
* an array is refused when its *footprint*, the product of its dimensions with each empty
  dimension counted as 1, times its item size, exceeds the caller's ``max_bytes``: a
  ``(2**28, 0)`` array holds nothing but a consumer walking its first axis would not;
* an array must fit in the bytes its file or zip member holds, so a short file never
  reserves the memory its header promises;
* the data is read in chunks of :data:`CHUNK` bytes straight into the returned array, so the
  peak memory is the array plus one chunk;
* a zip archive's member count and central directory are checked from its end record before
  :mod:`zipfile` parses the directory, and only stored or deflated members that are not
  encrypted are read (deflate decompresses into bounded chunks; bzip2 and LZMA do not).

Every problem is an :class:`NpyError` (a ``ValueError``) that names what was read; the caller
adds the file.
"""

from __future__ import annotations

import ast
import contextlib
import lzma
import math
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

# numpy's own reader refuses headers over 10,000 characters unless told otherwise; the
# writer pads to 64 bytes.  This leaves room for wide structured dtypes.
MAX_HEADER_BYTES = 1 << 16
CHUNK = 1 << 20
# numpy >= 2 allows 64 dimensions, numpy 1.x 32: refuse what either may not build.
MAX_NDIM = 32
_MAGIC = b"\x93NUMPY"
_KEYS = {"descr", "fortran_order", "shape"}
# Central directory bytes allowed per member (46 fixed bytes, a name, the zip64 extra).
_DIRECTORY_BYTES_PER_MEMBER = 2048
_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
_EOCD = struct.Struct("<4s4H2LH")
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")


class NpyError(ValueError):
    """A ``.npy`` array or ``.npz`` archive that is malformed or over a limit (one line)."""


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header declares: ``shape``, ``fortran`` order and ``dtype`` (its
    byte order as written), and ``size``, the header's own bytes (magic included)."""

    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype[Any]
    size: int

    @property
    def count(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes of data that follow the header."""
        return self.count * self.dtype.itemsize


def footprint(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes the array of ``shape`` would take with every empty dimension counted as 1."""
    return math.prod(max(d, 1) for d in shape) * itemsize


def _exact(fp: IO[bytes], n: int, what: str, part: str) -> bytes:
    data = fp.read(n)
    if len(data) != n:
        raise NpyError(f"{what} is not a .npy array (it ends inside its {part}: {len(data)} of "
                       f"{n} bytes)")
    return data


def read_header(fp: IO[bytes], what: str, max_bytes: int) -> NpyHeader:
    """Read and check a ``.npy`` header from ``fp``; the array it declares must have a
    footprint (:func:`footprint`) of at most ``max_bytes``."""
    magic = fp.read(len(_MAGIC) + 2)
    if len(magic) < len(_MAGIC) + 2 or magic[:len(_MAGIC)] != _MAGIC:
        raise NpyError(f"{what} is not a .npy array (no .npy magic string)")
    version = (magic[-2], magic[-1])
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise NpyError(f"{what} is not a .npy array (unsupported .npy version "
                       f"{version[0]}.{version[1]})")
    length_format = "<H" if version == (1, 0) else "<I"
    length = struct.unpack(length_format, _exact(fp, struct.calcsize(length_format), what,
                                                 "header length"))[0]
    if length > MAX_HEADER_BYTES:
        raise NpyError(f"{what} is not a .npy array (its header is {length:,} bytes, over the "
                       f"limit of {MAX_HEADER_BYTES:,})")
    raw = _exact(fp, length, what, "header")
    size = len(magic) + struct.calcsize(length_format) + length
    try:
        text = raw.decode("utf-8" if version == (3, 0) else "latin-1")
        # A literal only: the header is at most MAX_HEADER_BYTES, and literal_eval
        # evaluates nothing, so any failure (syntax, nesting, unhashable keys) is a bad header.
        fields = ast.literal_eval(text)
    except Exception as exc:  # noqa: BLE001 - see above
        raise NpyError(f"{what} is not a .npy array (its header is not a Python literal: "
                       f"{type(exc).__name__})") from None
    if not isinstance(fields, dict) or set(fields) != _KEYS:
        raise NpyError(f"{what} is not a .npy array (its header must be a dict of "
                       "'descr', 'fortran_order' and 'shape')")
    shape, fortran = fields["shape"], fields["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        raise NpyError(f"{what} is not a .npy array (shape {shape!r} is not a tuple of "
                       "non-negative integers)")
    if type(fortran) is not bool:
        raise NpyError(f"{what} is not a .npy array (fortran_order {fortran!r} is not a bool)")
    try:
        dtype = np.lib.format.descr_to_dtype(fields["descr"])
    except Exception as exc:  # noqa: BLE001 - a bounded literal: any failure is a bad descr
        raise NpyError(f"{what} is not a .npy array (descr {_short(fields['descr'])} is not a "
                       f"dtype: {type(exc).__name__})") from None
    if dtype.hasobject:
        raise NpyError(f"{what} holds Python objects, which are never loaded (pickles); "
                       "save numbers or strings")
    if dtype.subdtype is not None:  # a sub-array dtype: its dimensions join the shape
        dtype, inner = dtype.subdtype
        shape = shape + inner
    if dtype.itemsize == 0:
        raise NpyError(f"{what} has dtype {dtype} of zero item size, which holds no data")
    if len(shape) > MAX_NDIM:
        raise NpyError(f"{what} has {len(shape)} dimensions, over the limit of {MAX_NDIM}")
    need = footprint(shape, dtype.itemsize)
    if need > max_bytes:
        empty = " (each empty dimension counted as 1)" if 0 in shape else ""
        raise NpyError(f"{what} has shape {shape} and dtype {dtype} ({need:,} bytes{empty}), "
                       f"over the limit of {max_bytes:,} bytes")
    return NpyHeader(shape, fortran, dtype, size)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_data(fp: IO[bytes], header: NpyHeader, what: str, *, available: int | None = None,
              exact: bool = False, native: bool = False) -> np.ndarray:
    """The array ``header`` declares, read from ``fp`` (positioned after the header).

    ``available`` is the number of bytes after the header when known (a file's or a zip
    member's size): a shorter file is refused before any memory is taken.  With ``exact``
    the data must end the stream; otherwise the rest is read and dropped (a zip member's
    CRC is checked only at its end).  With ``native`` a byte-swapped array is swapped in
    place to the native byte order; otherwise the dtype is kept as written."""
    nbytes = header.nbytes
    if available is not None and available < nbytes:
        raise NpyError(f"{what} is truncated: its header promises {nbytes:,} bytes of data, "
                       f"the file holds {available:,}")
    if exact and available is not None and available > nbytes:
        raise NpyError(f"{what} has {available - nbytes:,} bytes after its data")
    try:
        flat = np.empty(header.count, dtype=header.dtype)
    except (MemoryError, ValueError) as exc:
        raise NpyError(f"{what}: cannot allocate {nbytes:,} bytes ({exc})") from None
    buffer = flat.view(np.uint8).data  # the array's own memory: read straight into it
    readinto = getattr(fp, "readinto", None)
    got = 0
    while got < nbytes:
        want = min(CHUNK, nbytes - got)
        if readinto is not None:
            n = readinto(buffer[got:got + want]) or 0
        else:
            chunk = fp.read(want)
            n = len(chunk)
            buffer[got:got + n] = chunk
        if not n:
            raise NpyError(f"{what} is truncated: its header promises {nbytes:,} bytes of "
                           f"data, the file holds {got:,}")
        got += n
    if exact:
        if fp.read(1):
            raise NpyError(f"{what} has bytes after its data")
    elif fp.read(1):  # trailing bytes: read to the end, where a zip member's CRC is checked
        while fp.read(CHUNK):
            pass
    if header.fortran and len(header.shape) > 1:
        array = flat.reshape(header.shape[::-1]).T
    else:
        array = flat.reshape(header.shape)
    if native and not array.dtype.isnative and array.dtype.names is None:
        array = array.byteswap(inplace=True).view(array.dtype.newbyteorder("="))
    return array


def read_npy(fp: IO[bytes], what: str, max_bytes: int, *, size: int | None = None,
             exact: bool = False, native: bool = False) -> np.ndarray:
    """A whole ``.npy`` array from ``fp``: :func:`read_header` then :func:`read_data`.
    ``size`` is the number of bytes of the stream when known."""
    header = read_header(fp, what, max_bytes)
    available = None if size is None else size - header.size
    return read_data(fp, header, what, available=available, exact=exact, native=native)


# --------------------------------------------------------------------------- zip


def _directory(fp: IO[bytes], size: int) -> tuple[int, int]:
    """(member count, central directory bytes) from a zip file's end records."""
    tail_size = min(size, _EOCD.size + 0xFFFF)
    fp.seek(size - tail_size)
    tail = fp.read(tail_size)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _EOCD.size:
        raise NpyError("not an .npz/zip archive (no end-of-directory record)")
    _, _, _, _, count, directory, _, _ = _EOCD.unpack_from(tail, at)
    if at >= _EOCD64_LOCATOR.size:
        locator = _EOCD64_LOCATOR.unpack_from(tail, at - _EOCD64_LOCATOR.size)
        start = size - tail_size + at - _EOCD64_LOCATOR.size - _EOCD64.size
        if locator[0] == b"PK\x06\x07" and start >= 0:
            fp.seek(start)
            record = fp.read(_EOCD64.size)
            if len(record) == _EOCD64.size and record[:4] == b"PK\x06\x06":
                fields = _EOCD64.unpack(record)
                count, directory = fields[7], fields[8]
    return count, directory


def open_zip(fp: IO[bytes], size: int, max_members: int) -> zipfile.ZipFile:
    """A :class:`zipfile.ZipFile` over the seekable ``fp`` of ``size`` bytes, once its end
    record shows at most ``max_members`` members and a central directory of a size to
    match (checked before :mod:`zipfile` reads the directory)."""
    count, directory = _directory(fp, size)
    if count > max_members:
        raise NpyError(f"the archive has {count:,} members, over the limit of {max_members:,}")
    if directory > max_members * _DIRECTORY_BYTES_PER_MEMBER:
        raise NpyError(f"the archive's directory is {directory:,} bytes, over the limit of "
                       f"{max_members * _DIRECTORY_BYTES_PER_MEMBER:,} for {max_members:,} "
                       "members")
    fp.seek(0)
    with zip_errors("the archive"):
        archive = zipfile.ZipFile(fp)
    if len(archive.infolist()) > max_members:  # the end record understated the count
        archive.close()
        raise NpyError(f"the archive has over {max_members:,} members, the limit")
    return archive


def check_member(info: zipfile.ZipInfo, what: str) -> None:
    """Refuse an encrypted member and one compressed by a method other than stored or
    deflated (numpy writes only those; bzip2 and LZMA inflate without a bound per read)."""
    if info.flag_bits & 0x41:  # traditional or strong encryption
        raise NpyError(f"{what} is encrypted; only unencrypted archives are read")
    if info.compress_type not in _ZIP_METHODS:
        raise NpyError(f"{what} is compressed by zip method {info.compress_type}; only stored "
                       "and deflated members are read")


@contextlib.contextmanager
def zip_errors(what: str) -> Iterator[None]:
    """The errors :mod:`zipfile` and its decompressors raise on a corrupt archive (a CRC
    mismatch, a broken deflate stream, a bad local header, an offset past the end) as one
    :class:`NpyError` naming ``what``."""
    try:
        yield
    except NpyError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, lzma.LZMAError, EOFError,
            OSError, ValueError, OverflowError, RuntimeError, NotImplementedError,
            struct.error) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise NpyError(f"{what} is corrupt ({reason})") from None


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, what: str, max_bytes: int,
                *, exact: bool = False, native: bool = False,
                header_check: Any = None) -> np.ndarray:
    """The ``.npy`` array of a zip member, bounded as :func:`read_npy` (the member's size
    from the directory is the bytes available).  ``header_check(header)`` may refuse the
    header before the data is read."""
    check_member(info, what)
    with zip_errors(what), archive.open(info) as member:
        header = read_header(member, what, max_bytes)
        if header_check is not None:
            header_check(header)
        return read_data(member, header, what, available=info.file_size - header.size,
                         exact=exact, native=native)
