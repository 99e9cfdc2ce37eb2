"""Calibration files under hostile input: paths that are not regular files, archives built to
cost memory (zip bombs, many members, JSON bombs, empty dimensions of huge extent), corrupt
archives, values out of range, and a seeded fuzz of byte flips and truncations.  Every failure
is advcal's own ValueError/TypeError/OSError naming the file; memory stays within the
documented budget.  Also: ``save_calibration`` never replaces what is not a regular file, and
its files follow the umask."""

from __future__ import annotations

import io
import json
import os
import stat
import struct
import subprocess
import sys
import threading
import tracemalloc
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from advcal import (
    calibrate_ranges,
    calibrate_sets,
    coefficient_sets,
    grpo,
    load_calibration,
    save_calibration,
    select_threshold,
)
from advcal.io.artefacts import JSON_COST, MAX_BYTES, MAX_MEMBERS
from advcal.simulate import gram_matrices, paired_scorings
from tests.checks import ADVCAL_DIR, set_zip_flags

# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def set_cal() -> Any:
    pair = paired_scorings(60, 5, scale=0.03, seed=0)
    return calibrate_sets(pair.a, pair.b, alpha=0.1)


@pytest.fixture(scope="module")
def calibrations(set_cal: Any) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    reference = rng.random(40)
    judge = np.clip(reference + rng.normal(0, 0.1, 40), 0, 1)
    ranges = calibrate_ranges(judge, reference, alpha=0.2,
                              categories=["a", "b", "c", "d"] * 10)
    data = paired_scorings(80, 5, scale=0.03, seed=2)
    sets = coefficient_sets(data.a, calibration=set_cal)
    selection = select_threshold(sets, gram_matrices(80, 5, seed=3).gram, grpo(data.b),
                                 thresholds=[0.0, 0.2, 0.4], beta=0.3, delta=0.1)
    return {"sets": set_cal, "ranges": ranges, "selection": selection}


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def write_zip(path: Path, contents: dict[str, bytes],
              compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in contents.items():
            zf.writestr(name, data)
    return path


def with_header(path: Path, edit: Any) -> dict[str, bytes]:
    contents = members(path)
    header = json.loads(contents["header.json"])
    edit(header)
    contents["header.json"] = json.dumps(header).encode()
    return contents


def npy_bytes(descr: str, shape: tuple[int, ...], payload: bytes = b"",
              header: str | None = None) -> bytes:
    text = header if header is not None else \
        f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    raw = text.encode("latin-1") + b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw + payload


def assert_own_error(exc: BaseException, path: Path) -> None:
    """A ValueError/TypeError/OSError raised by advcal's own code, naming the file."""
    assert isinstance(exc, (ValueError, TypeError, OSError)), repr(exc)
    tb = exc.__traceback__
    assert tb is not None
    while tb.tb_next is not None:
        tb = tb.tb_next
    raiser = tb.tb_frame.f_code.co_filename
    assert raiser.startswith(ADVCAL_DIR), f"{exc!r} raised in {raiser}"
    assert str(path) in str(exc), f"{exc!r} does not name {path}"
    assert "\n" not in str(exc), repr(exc)


def load_error(path: Path, **kwargs: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        load_calibration(path, **kwargs)
    assert_own_error(info.value, path)
    return info.value


def bomb_zip(path: Path, header: bytes, name: str, prefix: bytes, mib: int) -> Path:
    """A calibration-shaped zip: header.json stored, then member ``name`` whose data is the
    .npy ``prefix`` followed by ``mib`` MiB of zeros, deflated to about 1 KiB per MiB (a
    zip bomb), with its true CRC and size."""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = comp.compress(prefix) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(b"\0" * (1 << 20)) + comp.flush(zlib.Z_FULL_FLUSH)
    data = head + block * mib + comp.flush()  # flushed blocks concatenate
    crc = zlib.crc32(prefix)
    zeros = b"\0" * (1 << 20)
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    size = len(prefix) + (mib << 20)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("header.json", header)
    entries = out.getvalue()
    # Reuse zipfile's header.json entry, then append the bomb by hand.
    with zipfile.ZipFile(io.BytesIO(entries)) as zf:
        info = zf.getinfo("header.json")
    local_end = info.header_offset + 30 + len(info.filename) + info.compress_size
    blob = bytearray(entries[:local_end])
    name_b = name.encode()
    bomb_offset = len(blob)
    blob += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, len(data),
                        size, len(name_b), 0) + name_b + data
    cd_start = len(blob)
    blob += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0, info.CRC,
                        info.compress_size, info.file_size, len(info.filename), 0, 0, 0, 0,
                        0, info.header_offset) + info.filename.encode()
    blob += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc, len(data),
                        size, len(name_b), 0, 0, 0, 0, 0, bomb_offset) + name_b
    blob += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 2, 2, len(blob) - cd_start, cd_start,
                        0)
    path.write_bytes(bytes(blob))
    return path


def isolated(code: str, memory: int = 768 << 20, timeout: float = 120) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter with its address space capped at the start-up
    size plus ``memory`` (so a regression fails with MemoryError rather than exhausting the
    machine); ``code`` sets ``result`` to a JSON-able dict."""
    script = (
        "import json, resource, sys, traceback, tracemalloc\n"
        "import advcal, advcal.io.artefacts, advcal.io.logs\n"
        "vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize'))"
        ".split()[1]) * 1024\n"
        f"resource.setrlimit(resource.RLIMIT_AS, (vm + {memory}, resource.RLIM_INFINITY))\n"
        "tracemalloc.start()\n"
        "result = {}\n"
        "try:\n"
        + "".join(f"    {line}\n" for line in code.splitlines()) +
        "except BaseException as exc:\n"
        "    tb = exc.__traceback__\n"
        "    while tb.tb_next is not None:\n"
        "        tb = tb.tb_next\n"
        "    result.update(error=type(exc).__name__, message=str(exc),\n"
        "                  raiser=tb.tb_frame.f_code.co_filename)\n"
        "result['peak'] = tracemalloc.get_traced_memory()[1]\n"
        "print(json.dumps(result))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


# --------------------------------------------------------------------------- paths


def test_bytes_and_other_path_types_are_type_errors(tmp_path: Path, set_cal: Any) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    for bad in (os.fsencode(path), 3, None):
        with pytest.raises(TypeError, match="`path` must be a str or path-like"):
            load_calibration(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="`path` must be a str or path-like"):
            save_calibration(bad, set_cal)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`max_bytes` must be an integer"):
        load_calibration(path, max_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`max_bytes` must be positive"):
        load_calibration(path, max_bytes=0)


def test_device_is_refused_without_reading() -> None:
    # Before: /dev/zero was read until memory ran out.  Isolated: a regression fails with
    # MemoryError instead of taking the machine's memory.
    result = isolated("advcal.load_calibration('/dev/zero')")
    assert result["error"] == "OSError", result
    assert "/dev/zero: a device, not a regular file" in result["message"]
    assert result["raiser"].startswith(ADVCAL_DIR)
    assert result["peak"] < 1 << 20


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "cal.npz"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def target() -> None:
        try:
            load_calibration(fifo)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # blocked in open(): release it by opening the other end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail("load_calibration blocked on a FIFO")
    assert len(outcome) == 1 and isinstance(outcome[0], OSError), outcome
    assert_own_error(outcome[0], fifo)
    assert "a FIFO, not a regular file" in str(outcome[0])


def test_directory_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="not a regular file|Is a directory"):
        load_calibration(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        load_calibration(tmp_path / "missing.npz")


# --------------------------------------------------------------------------- memory


def test_declared_size_over_max_bytes_is_refused_before_reading(tmp_path: Path,
                                                               set_cal: Any) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    # 2**28 float64 scores (2 GiB) declared: over the default budget of 1 GiB.
    contents = with_header(path, lambda h: h["arrays"]["scores"].update(shape=[2 ** 28]))
    contents["scores.npy"] = npy_bytes("<f8", (2 ** 28,))
    write_zip(path, contents)
    exc = load_error(path)
    assert "over max_bytes = 1,073,741,824; refused before reading" in str(exc)
    assert MAX_BYTES == 1 << 30


@pytest.mark.parametrize("shape", [[2 ** 28, 0], [2 ** 70, 2 ** 70, 0], [0] * 40])
def test_empty_dimensions_of_huge_extent(tmp_path: Path, set_cal: Any,
                                         shape: list[int]) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    contents = with_header(path, lambda h: h["arrays"]["scores"].update(shape=shape))
    contents["scores.npy"] = npy_bytes("<f8", tuple(shape))
    write_zip(path, contents)
    exc = load_error(path)
    assert "max_bytes" in str(exc) or "malformed declaration" in str(exc)


def test_zip_bomb_is_refused_without_inflating(tmp_path: Path, set_cal: Any) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    header = with_header(path, lambda h: h["arrays"]["scores"].update(shape=[2 ** 23]))
    prefix = npy_bytes("<f8", (2 ** 23,))
    bomb_zip(path, header["header.json"], "scores.npy", prefix, 64)  # 64 MiB of zeros
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        exc = load_error(path, max_bytes=32 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "over max_bytes = 33,554,432; refused before reading" in str(exc)
    assert peak < 4 << 20
    # Within the budget it is read into the array it declares, and then refused by the
    # validation (which sorts a copy): the scores are not those of the header's rho.
    tracemalloc.start()
    try:
        exc = load_error(path, max_bytes=128 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "`rho`" in str(exc)
    assert peak < 2 * (64 << 20) + (8 << 20)  # the array, and the sorted copy validation takes


def test_many_members_refused_from_the_end_record(tmp_path: Path, set_cal: Any) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    contents = members(path)
    contents.update({f"pad{i}.npy": b"" for i in range(MAX_MEMBERS)})
    write_zip(path, contents)
    exc = load_error(path)
    assert f"members, over the limit of {MAX_MEMBERS}" in str(exc)


def test_json_header_bomb_refused_before_parsing(tmp_path: Path, set_cal: Any) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    contents = members(path)
    # Nested empty lists: ~30 bytes of Python objects per byte of JSON.
    contents["header.json"] = b"[" + b"[[]]," * (1 << 18) + b"0]"
    write_zip(path, contents, zipfile.ZIP_DEFLATED)
    tracemalloc.start()
    try:
        exc = load_error(path, max_bytes=JSON_COST << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "header.json is 1,310,723 bytes; parsing it may take 64 bytes" in str(exc)
    assert peak < 1 << 20


# --------------------------------------------------------------------------- corrupt files


def _flip_in(path: Path, member: str) -> None:
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    at = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: _flip_in(p, "header.json"), "header.json is corrupt (Bad CRC-32"),
    (lambda p: _flip_in(p, "scores.npy"), "`scores` is corrupt (Bad CRC-32"),
    (lambda p: set_zip_flags(p, flag=0x01), "is encrypted"),
    (lambda p: set_zip_flags(p, method=99), "zip method 99; only stored and deflated"),
    (lambda p: set_zip_flags(p, method=12), "zip method 12; only stored and deflated"),
    (lambda p: p.write_bytes(p.read_bytes()[:-30]), "not an .npz/zip archive"),
])
def test_corrupt_archives(tmp_path: Path, set_cal: Any, damage: Any, message: str) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    damage(path)
    exc = load_error(path)
    assert isinstance(exc, ValueError) and message in str(exc), exc


def test_bzip2_members_are_refused(tmp_path: Path, set_cal: Any) -> None:
    # bzip2 and LZMA inflate a whole input block per read: not read at all.
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    write_zip(path, members(path), zipfile.ZIP_BZIP2)
    assert "only stored and deflated members" in str(load_error(path))
    write_zip(path, members(tmp_path / "c.npz"), zipfile.ZIP_DEFLATED)
    save_calibration(path, set_cal)
    deflated = tmp_path / "d.npz"
    write_zip(deflated, members(path), zipfile.ZIP_DEFLATED)
    assert load_calibration(deflated).rho == set_cal.rho


@pytest.mark.parametrize(("member", "message"), [
    (npy_bytes("", (), header="{'descr': '<f8', 'fortran_order': False, 'shape': (60,"),
     "not a Python literal"),
    (npy_bytes("<f8", (60,))[:40], "ends inside its header"),
    (npy_bytes("", (), header="{'descr': '<f8', 'fortran_order': False, 'shape': (-1,), }"),
     "non-negative integers"),
    (npy_bytes("", (), header="{[1]: 2}"), "not a Python literal"),
    (npy_bytes("", (), header="(" * 500 + ")" * 500), "not a Python literal"),
    (b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 30), "over the limit"),
    (b"\x93NUMPY\x09\x00", "unsupported .npy version 9.0"),
])
def test_bad_npy_member_headers(tmp_path: Path, set_cal: Any, member: bytes,
                                message: str) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    write_zip(path, {**members(path), "scores.npy": member})
    exc = load_error(path)
    assert isinstance(exc, ValueError) and message in str(exc), exc


@pytest.mark.parametrize(("edit", "message"), [
    (lambda h: h["fields"].update(rho={"type": "int", "value": 10 ** 400}),
     "`rho` must be finite"),
    (lambda h: h["fields"].update(alpha={"type": "float", "value": 10 ** 400}),
     "`alpha` is an integer too large for a float"),
    (lambda h: h["fields"].update(eps={"type": "numpy", "dtype": "|i1",
                                       "value": {"type": "int", "value": 300}}),
     "`eps` holds a value out of range for dtype int8"),
    (lambda h: h["fields"]["options"].update(x={"type": "ndarray", "dtype": "<u2",
                                                "value": [{"type": "int", "value": -1}]}),
     "out of range for dtype uint16"),
])
def test_values_out_of_range(tmp_path: Path, set_cal: Any, edit: Any, message: str) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    write_zip(path, with_header(path, edit))
    exc = load_error(path)
    assert isinstance(exc, ValueError) and message in str(exc), exc


def test_integer_of_too_many_digits(tmp_path: Path, set_cal: Any) -> None:
    path = tmp_path / "c.npz"
    save_calibration(path, set_cal)
    contents = members(path)
    contents["header.json"] = contents["header.json"].replace(
        b'"version": 1', b'"version": ' + b"9" * 5000)
    write_zip(path, contents)
    assert "header.json is not valid JSON" in str(load_error(path))


# --------------------------------------------------------------------------- fuzz


# Values a damaged header may hold in place of any of its values.
_HOSTILE = [None, True, 0, -1, 2 ** 63, 10 ** 400, -(10 ** 400), 1e308, -0.0, "", "nan",
            "inf", "x" * 300, [], [[[]]], {}, {"type": "int"}, {"type": "int", "value": 2 ** 70},
            {"type": "numpy", "dtype": "|u1", "value": {"type": "int", "value": -5}},
            {"type": "ndarray", "dtype": "<f8", "value": [{"type": "str", "value": "a"}]},
            {"type": "tuple", "value": [{"type": "float", "value": "inf"}] * 3},
            {"dtype": "<f8", "shape": [2 ** 40]}, {"dtype": "|V0", "shape": [3]},
            {"dtype": "<f8", "shape": [0, 2 ** 62]}, {"dtype": "<M8[s]", "shape": [3]}]


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _leaves(item, (*path, i))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    value[path[0]] = _replace(value[path[0]], path[1:], new)
    return value


def _zipped(contents: dict[str, bytes], rng: np.random.Generator) -> bytes:
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if rng.random() < 0.5 else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, data in contents.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _mutations(raw: bytes, contents: dict[str, bytes], rng: np.random.Generator,
               n: int) -> list[tuple[str, bytes]]:
    """``n`` damaged copies of a calibration file: byte flips and truncations of the whole
    file; the same of one member, re-zipped with valid CRCs (stored or deflated) so the
    damage reaches the JSON and .npy parsers; and a header value replaced by a hostile one
    (so it reaches the decoding and the validation)."""
    out = []
    names = sorted(contents)
    header = json.loads(contents["header.json"])
    paths = _leaves(header)[1:]
    for i in range(n):
        how = i % 5
        if how == 4:
            path = paths[int(rng.integers(len(paths)))]
            new = _HOSTILE[int(rng.integers(len(_HOSTILE)))]
            edited = _replace(json.loads(contents["header.json"]), path, new)
            text = json.dumps(edited).encode()
            out.append((f"header{list(path)}={new!r:.40}",
                        _zipped({**contents, "header.json": text}, rng)))
            continue
        if how in (0, 1):
            data = bytearray(raw)
        else:
            name = names[int(rng.integers(len(names)))]
            data = bytearray(contents[name])
        if how in (0, 2):
            for _ in range(int(rng.integers(1, 9))):
                if data:
                    at = int(rng.integers(len(data)))
                    data[at] = int(rng.integers(256)) if rng.random() < 0.5 \
                        else data[at] ^ (1 << int(rng.integers(8)))
        else:
            data = data[:int(rng.integers(len(data) + 1))]
        if how < 2:
            out.append((f"file-{'flip' if how == 0 else 'cut'}", bytes(data)))
        else:
            out.append((f"{name}-{'flip' if how == 2 else 'cut'}",
                        _zipped({**contents, name: bytes(data)}, rng)))
    return out


@pytest.mark.parametrize("kind", ["sets", "ranges", "selection"])
def test_fuzz_damaged_files_raise_only_documented_errors(tmp_path: Path,
                                                         calibrations: dict[str, Any],
                                                         kind: str) -> None:
    source = tmp_path / "good.npz"
    save_calibration(source, calibrations[kind])
    raw, contents = source.read_bytes(), members(source)
    rng = np.random.default_rng({"sets": 11, "ranges": 12, "selection": 13}[kind])
    path = tmp_path / "damaged.npz"
    loaded = 0
    for label, data in _mutations(raw, contents, rng, 200):
        path.write_bytes(data)
        try:
            back = load_calibration(path)
        except Exception as exc:  # noqa: BLE001 - assert_own_error inspects it
            try:
                assert_own_error(exc, path)
            except AssertionError as failure:
                raise AssertionError(f"{label}: {failure}") from exc
        else:
            loaded += 1  # damage that keeps a valid file (e.g. inside "writer")
            assert type(back) is type(calibrations[kind])
    assert loaded < 200 // 4


# --------------------------------------------------------------------------- writing


def test_save_refuses_a_symlink_and_keeps_it(tmp_path: Path, set_cal: Any) -> None:
    real = tmp_path / "real.npz"
    real.write_bytes(b"keep me")
    link = tmp_path / "link.npz"
    link.symlink_to(real)
    with pytest.raises(OSError, match="a symbolic link; refusing to replace it"):
        save_calibration(link, set_cal)
    assert link.is_symlink() and real.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.npz", "real.npz"]


def test_save_refuses_a_fifo_and_keeps_it(tmp_path: Path, set_cal: Any) -> None:
    fifo = tmp_path / "out.npz"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="a FIFO; refusing to replace it"):
        save_calibration(fifo, set_cal)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]  # no temporary file left


def test_save_refuses_a_device_node(tmp_path: Path, set_cal: Any) -> None:
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        pytest.skip("cannot create a device node here (needs root)")
    with pytest.raises(OSError, match="a device; refusing to replace it"):
        save_calibration(node, set_cal)
    assert stat.S_ISCHR(os.lstat(node).st_mode)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_saved_file_mode_follows_the_umask(tmp_path: Path, set_cal: Any, umask: int,
                                           mode: int) -> None:
    old = os.umask(umask)
    try:
        save_calibration(tmp_path / "c.npz", set_cal)
        save_calibration(tmp_path / "c.npz", set_cal)  # replacing a file: same mode
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "c.npz").st_mode) == mode
    assert load_calibration(tmp_path / "c.npz").rho == set_cal.rho


def test_calibrate_cli_refuses_a_symlink_output(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("pyarrow")
    from advcal.cli import main

    pair = paired_scorings(40, 4, scale=0.03, seed=5)
    np.savez(tmp_path / "paired.npz", rewards=pair.a, second=pair.b)
    real = tmp_path / "real.npz"
    real.write_bytes(b"keep me")
    link = tmp_path / "out.npz"
    link.symlink_to(real)
    code = main(["calibrate", "sets", str(tmp_path / "paired.npz"), "-o", str(link)])
    err = capsys.readouterr().err
    assert code == 2 and "symbolic link" in err and len(err.strip().splitlines()) == 1, err
    assert link.is_symlink() and real.read_bytes() == b"keep me"
