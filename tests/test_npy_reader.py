"""advcal's one .npy/.npz reader (``advcal.io._npy``), used by the calibration files and the array
logs: equal to ``numpy.load`` on what numpy writes; bounded memory (the array it returns plus
one read chunk, refused past the limit before reading); and every malformed input a one-line
``LogError`` from the log readers."""

from __future__ import annotations

import io
import os
import struct
import threading
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from advcal.io import _common, _npy, _npz
from advcal.io.logs import LogError, read_log
from tests.checks import set_zip_flags

pa = pytest.importorskip("pyarrow")  # read_log's readers


def npy_bytes(header: str, payload: bytes = b"", version: int = 1) -> bytes:
    raw = header.encode("latin-1")
    prefix = 10 if version == 1 else 12
    raw += b" " * (63 - (prefix + len(raw)) % 64) + b"\n"
    length = struct.pack("<H" if version == 1 else "<I", len(raw))
    return b"\x93NUMPY" + bytes([version, 0]) + length + raw + payload


def write_npz(path: Path, contents: dict[str, bytes],
              compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in contents.items():
            zf.writestr(name, data)
    return path


def log_error(path: Path, **kwargs: Any) -> str:
    with pytest.raises(LogError) as info:
        read_log(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- numpy oracle


@pytest.mark.parametrize("array", [
    np.arange(12.0).reshape(3, 4),
    np.asfortranarray(np.arange(24, dtype=np.int16).reshape(2, 3, 4)),
    np.arange(5, dtype=">f8"),
    np.array([1 + 2j, -3.5j], dtype=">c16"),
    np.array([(1, 2.5, b"ab"), (3, -1.0, b"c")], dtype=[("a", "<i4"), ("b", ">f4"),
                                                       ("c", "S2")]),
    np.array([[True, False]]),
    np.array(["x", "yz"]),
    np.zeros((0, 3)),
    np.float64(7.0).reshape(()),
])
def test_equals_numpy_load(array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    data = buf.getvalue()
    expected = np.load(io.BytesIO(data), allow_pickle=False)
    got = _npy.read_npy(io.BytesIO(data), "a", 1 << 20, size=len(data), exact=True)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes(order="A") == expected.tobytes(order="A")
    assert got.flags.f_contiguous == expected.flags.f_contiguous
    assert got.flags.writeable and got.flags.owndata or got.base is not None
    native = _npy.read_npy(io.BytesIO(data), "a", 1 << 20, native=True)
    if array.dtype.names is None:
        assert native.dtype.isnative
        assert np.array_equal(native, expected)


def test_header_versions_and_subarray_dtypes() -> None:
    payload = np.arange(6.0).tobytes()
    for version in (1, 2, 3):
        data = npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
                         payload, version)
        assert _npy.read_npy(io.BytesIO(data), "a", 1 << 20).tolist() == \
            [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    # A sub-array descr: its dimensions join the shape, as numpy.load does.
    data = npy_bytes("{'descr': ('<f8', (3,)), 'fortran_order': False, 'shape': (2,), }",
                     payload)
    got = _npy.read_npy(io.BytesIO(data), "a", 1 << 20)
    assert got.shape == (2, 3) and got.dtype == np.float64
    assert got.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


# --------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(("header", "message"), [
    ("{'descr': '|V0', 'fortran_order': False, 'shape': (1000000000,), }",
     "has dtype |V0 of zero item size"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (4,), ",
     "is not a .npy array (its header is not a Python literal"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': "
     f"({2 ** 70}, {2 ** 70}, 0), }}", "over the limit of"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (-4,), }", "non-negative integers"),
    ("{'descr': '<f8', 'fortran_order': 0, 'shape': (4,), }", "is not a bool"),
    ("{'descr': 'bogus', 'fortran_order': False, 'shape': (4,), }", "is not a dtype"),
    ("{'descr': '|O', 'fortran_order': False, 'shape': (4,), }",
     "holds Python objects, which are never loaded"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (" + "1, " * 40 + "), }",
     "has 40 dimensions, over the limit of 32"),
])
def test_malformed_npy_files_are_log_errors(tmp_path: Path, header: str, message: str) -> None:
    path = tmp_path / "x.npy"
    path.write_bytes(npy_bytes(header, b"\0" * 64))
    assert message in log_error(path)


def test_unterminated_header_and_short_files(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    full = npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }")
    path.write_bytes(full[:40])
    assert "ends inside its header" in log_error(path)
    path.write_bytes(full + b"\0" * 31)  # 4 float64 promised, 31 bytes held
    assert "is truncated: its header promises 32 bytes of data, the file holds 31" in \
        log_error(path)


def test_empty_dimension_of_huge_extent_counts_as_one(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((1 << 20, 0)))  # 128 bytes, (2**20, 0)
    assert path.stat().st_size == 128
    message = log_error(path, max_bytes=1 << 20)
    assert "has shape (1048576, 0) and dtype float64 (8,388,608 bytes (each empty " \
           "dimension counted as 1)), over the limit of 1,048,576 bytes" in message


def test_empty_rows_take_no_memory(tmp_path: Path) -> None:
    # Before: a (2**24, 0) array made a group id per row (2**24 int64, twice).
    path = tmp_path / "e.npz"
    np.savez(path, rewards=np.zeros((1 << 24, 0), np.int8))
    log_error(path)  # warm up: pyarrow's import is not the read's memory
    tracemalloc.start()
    try:
        assert "no rows" in log_error(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_big_endian_array_is_swapped_in_place(tmp_path: Path) -> None:
    path = tmp_path / "b.npy"
    values = np.arange(1 << 22, dtype=">f8")  # 32 MiB
    np.save(path, values)
    tracemalloc.start()
    try:
        arrays = _npz._read_arrays(path, "npy", 1 << 30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    got = arrays["rewards"]
    assert got.dtype == np.float64 and got.dtype.isnative
    assert np.array_equal(got, values)
    # the array, read into its own memory and swapped there (before: the bytes read, then
    # a swapped copy)
    assert peak < values.nbytes + _npy.CHUNK


# --------------------------------------------------------------------------- offsets


def test_unsigned_offsets(tmp_path: Path) -> None:
    path = tmp_path / "u.npz"
    rewards = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    np.savez(path, rewards=rewards, offsets=np.array([0, 2, 2, 5], np.uint64))
    log = read_log(path)
    assert log.rewards.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert log.offsets.tolist() == [0, 2, 5]  # the empty group holds no response
    np.savez(path, rewards=rewards, offsets=np.array([0, 2, 5], np.uint32))
    assert read_log(path).offsets.tolist() == [0, 2, 5]
    np.savez(path, rewards=rewards, offsets=np.array([0, 2 ** 63, 5], np.uint64))
    assert "beyond int64" in log_error(path)
    np.savez(path, rewards=rewards, offsets=np.array([0, 4, 3, 5], np.uint64))
    assert "must be non-decreasing integers from 0 to 5" in log_error(path)


# --------------------------------------------------------------------------- archives


def _corrupt(path: Path, *, flag: int = 0, method: int | None = None,
             flip: bool = False) -> None:
    set_zip_flags(path, flag=flag, method=method)
    if flip:
        raw = bytearray(path.read_bytes())
        raw[raw.find(b"\x93NUMPY") + 140] ^= 1
        path.write_bytes(bytes(raw))


@pytest.mark.parametrize(("damage", "message"), [
    ({"flip": True}, "member 'rewards' is corrupt (Bad CRC-32 for file 'rewards.npy')"),
    ({"flag": 0x01}, "member 'rewards' is encrypted"),
    ({"method": 99}, "member 'rewards' is compressed by zip method 99"),
])
def test_corrupt_npz_members(tmp_path: Path, damage: dict[str, Any], message: str) -> None:
    path = tmp_path / "c.npz"
    np.savez(path, rewards=np.ones((4, 4)))
    _corrupt(path, **damage)
    assert message in log_error(path)


def test_bzip2_and_lzma_members_are_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    np.save(buf, np.ones((4, 4)))
    for method, number in ((zipfile.ZIP_BZIP2, 12), (zipfile.ZIP_LZMA, 14)):
        path = write_npz(tmp_path / "c.npz", {"rewards.npy": buf.getvalue()}, method)
        assert f"compressed by zip method {number}; only stored and deflated" in \
            log_error(path)
    path = write_npz(tmp_path / "c.npz", {"rewards.npy": buf.getvalue()}, zipfile.ZIP_DEFLATED)
    assert read_log(path).rewards.tolist() == [1.0] * 16


def test_member_count_is_capped_before_the_directory_is_read(tmp_path: Path) -> None:
    buf = io.BytesIO()
    np.save(buf, np.ones((2, 2)))
    contents = {"rewards.npy": buf.getvalue()}
    contents.update({f"x{i}.npy": b"" for i in range(_common._NPZ_MEMBERS)})
    path = write_npz(tmp_path / "m.npz", contents)
    assert f"the archive has {_common._NPZ_MEMBERS + 1:,} members, over the limit of " \
           f"{_common._NPZ_MEMBERS:,}" in log_error(path)


def test_npz_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    # What `advcal calibrate threshold DATA.npz` reads: before, a FIFO blocked forever.
    fifo = tmp_path / "data.npz"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def target() -> None:
        try:
            _npz._read_arrays(fifo, "npz", 1 << 20)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail("the .npz reader blocked on a FIFO")
    assert isinstance(outcome[0], OSError) and "a FIFO, not a regular file" in str(outcome[0])
    assert str(fifo) in str(outcome[0])
