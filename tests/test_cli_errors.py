"""Never a traceback from the command line: every bad file or option ends in exit code 2 and
one line on stderr naming the file and the problem; a closed stdout ends quietly; a bug
still shows its traceback."""

from __future__ import annotations

import csv
import io
import json
import lzma
import os
import resource
import shutil
import stat
import subprocess
import sys
import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from advcal.cli import EXIT_CLOSED_PIPE, EXIT_INTERRUPTED, main
from advcal.io import _npz, logs
from advcal.simulate import gram_matrices, paired_scorings

pytest.importorskip("pyarrow")  # the log readers

ROOT = Path(__file__).resolve().parent.parent


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``advcal ARGV``, run in this process; argparse's
    ``SystemExit`` is read as its code."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def bad(capsys: pytest.CaptureFixture[str], *argv: str, prog: str | None = None) -> str:
    """Run; assert exit code 2, one line on stderr of the subcommand, no traceback."""
    code, out, err = run(capsys, *argv)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    if prog is None:
        prog = "advcal " + " ".join(argv[:2] if argv[0] == "calibrate" else argv[:1])
    assert err.startswith(f"{prog}: error: "), err
    return err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A good paired/judge CSV, a good threshold .npz and a SetCalibration file."""
    rng = np.random.default_rng(3)
    log = tmp_path / "log.csv"
    with log.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["group", "reward", "second", "judge", "reference"])
        for g in range(30):
            for _ in range(4):
                r = rng.random()
                w.writerow([g, r, r + 0.01 * rng.standard_normal(), r,
                            min(max(r + 0.05 * rng.standard_normal(), 0.0), 1.0)])
    pair = paired_scorings(40, 4, scale=0.05, seed=0)
    thr = tmp_path / "thr.npz"
    np.savez(thr, rewards=pair.a, second=pair.b, gram=gram_matrices(40, 4, seed=1).gram)
    sets = tmp_path / "sets.npz"
    assert main(["calibrate", "sets", str(log), "-o", str(sets)]) == 0
    return {"log": log, "thr": thr, "sets": sets, "tmp": tmp_path}


# --------------------------------------------------------------------------- files


def _npy(dtype: str, shape: str = "(4,)") -> bytes:
    header = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape}, }}"
    header = header.ljust(118) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


def _zip_with(path: Path, members: dict[str, bytes], patch: Any = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    if patch is not None:
        raw = bytearray(path.read_bytes())
        patch(raw)
        path.write_bytes(bytes(raw))
    return path


def _arr(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _set_flag(raw: bytearray) -> None:
    """Mark every member encrypted (bit 0 of the flags, local and central headers)."""
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = raw.find(sig)
        while at >= 0:
            raw[at + off] |= 1
            at = raw.find(sig, at + 4)


def _set_method(raw: bytearray) -> None:
    """Mark every member compressed by method 99 (AES), which zipfile does not read."""
    for sig, off in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = raw.find(sig)
        while at >= 0:
            raw[at + off:at + off + 2] = (99).to_bytes(2, "little")
            at = raw.find(sig, at + 4)


def _flip_data_byte(raw: bytearray) -> None:
    """Corrupt a byte of the first member's array data (the CRC no longer matches)."""
    at = raw.find(b"\x93NUMPY")
    raw[at + 140] ^= 0xFF


REWARDS = np.arange(16.0) / 16


@pytest.mark.parametrize(("name", "make", "message"), [
    ("zero_itemsize.npy", lambda p: p.write_bytes(_npy("|S0", "(4, 2)")), "zero item size"),
    ("zero_void.npy", lambda p: p.write_bytes(_npy("|V0")), "zero item size"),
    ("truncated.npy", lambda p: p.write_bytes(_npy("<f8")[:60]), "not a .npy array"),
    ("unterminated.npy", lambda p: p.write_bytes(
        b"\x93NUMPY\x01\x00" + (118).to_bytes(2, "little")
        + b"{'descr': '<f8', 'fortran_order': False, 'shape': (4," + b" " * 63 + b"\n"
        + bytes(32)), "not a .npy array"),
    ("crc.npz", lambda p: _zip_with(p, {"rewards.npy": _arr(REWARDS),
                                         "offsets.npy": _arr(np.array([0, 8, 16]))},
                                     _flip_data_byte), "rewards"),
    ("encrypted.npz", lambda p: _zip_with(p, {"rewards.npy": _arr(REWARDS)}, _set_flag),
     "encrypted"),
    ("method99.npz", lambda p: _zip_with(p, {"rewards.npy": _arr(REWARDS)}, _set_method),
     "rewards"),
    ("directory", lambda p: p.mkdir(), "directory"),
    ("missing.csv", lambda p: None, "missing.csv"),
])
def test_bad_files_are_one_line_naming_the_file(tmp_path: Path, capsys: Any, name: str,
                                                make: Any, message: str) -> None:
    path = tmp_path / name
    make(path)
    for argv in (["diagnose", str(path)],
                 ["calibrate", "sets", str(path), "-o", str(tmp_path / "o.npz")],
                 ["calibrate", "ranges", str(path), "-o", str(tmp_path / "o.npz")],
                 ["calibrate", "threshold", str(path), "-o", str(tmp_path / "o.npz")]):
        err = bad(capsys, *argv)
        assert str(path) in err, err
        assert message in err or argv[0] != "diagnose", err
        assert not (tmp_path / "o.npz").exists()


def test_uint64_offsets_read_as_int64_offsets(tmp_path: Path, capsys: Any) -> None:
    """An .npz whose offsets are uint64 (numpy's default for np.cumsum of unsigned sizes)
    reads as the same offsets in int64, in diagnose and calibrate threshold."""
    rewards = np.random.default_rng(0).random(24)
    for dtype in (np.int64, np.uint64):
        np.savez(tmp_path / f"{np.dtype(dtype).name}.npz", rewards=rewards,
                 offsets=np.array([0, 8, 16, 24], dtype))
    code, signed, err = run(capsys, "diagnose", str(tmp_path / "int64.npz"), "--json")
    assert code == 0, err
    code, unsigned, err = run(capsys, "diagnose", str(tmp_path / "uint64.npz"), "--json")
    assert code == 0, err
    signed_json, unsigned_json = json.loads(signed), json.loads(unsigned)
    assert signed_json["methods"] == unsigned_json["methods"]
    pair = paired_scorings(40, 4, scale=0.05, seed=0)
    gram = gram_matrices(40, 4, seed=1).gram.reshape(-1)
    for dtype in (np.int64, np.uint64):
        np.savez(tmp_path / f"thr_{np.dtype(dtype).name}.npz", rewards=pair.a.reshape(-1),
                 second=pair.b.reshape(-1), gram=gram,
                 offsets=np.arange(0, 161, 4).astype(dtype))
    tables = []
    for dtype in ("int64", "uint64"):
        code, out, err = run(capsys, "calibrate", "threshold", str(tmp_path / f"thr_{dtype}.npz"),
                             "-o", str(tmp_path / f"t_{dtype}.npz"), "--json")
        assert code == 0, err
        tables.append(json.loads(out)["table"])
    assert tables[0] == tables[1]


def test_uint64_offsets_beyond_int64_are_one_line(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "u.npz"
    np.savez(path, rewards=REWARDS, offsets=np.array([0, 2**63 + 5, 16], np.uint64))
    err = bad(capsys, "diagnose", str(path))
    assert str(path) in err and "offsets" in err


def _limited() -> None:
    # a reader that regressed to reading /dev/zero stops at 4 GiB, not at the machine's end
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import sys; from advcal.cli import main; "
                           "sys.exit(main())", *argv], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_limited, cwd=ROOT)


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"),
                    reason="POSIX FIFOs and /dev/zero")
def test_fifo_and_dev_zero_as_input_are_one_line(files: dict[str, Path]) -> None:
    """In a child process with a timeout and a memory limit: a FIFO would block the
    reader forever, /dev/zero reads without end."""
    fifo = files["tmp"] / "fifo"
    os.mkfifo(fifo)
    out = str(files["tmp"] / "o.npz")
    for path in (str(fifo), "/dev/zero"):
        for argv in (["diagnose", path],
                     ["calibrate", "threshold", str(files["thr"]), "--sets", path, "-o", out]):
            done = _cli(*argv)
            assert done.returncode == 2, (argv, done.stderr)
            assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
            assert path in done.stderr and "not a regular file" in done.stderr, done.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_non_utf8_file_names(files: dict[str, Path], capsys: Any) -> None:
    """A file name that is not UTF-8 (argv holds it surrogate-escaped) is shown with its
    bytes as \\xNN, on stdout as on stderr, and writing never fails on it."""
    folder = os.fsencode(files["tmp"])
    missing = os.fsdecode(folder + b"/\xff-missing.csv")
    err = bad(capsys, "diagnose", missing)
    assert "\\xff-missing.csv" in err
    target = os.fsdecode(folder + b"/\xfe.npz")
    code, out, err = run(capsys, "calibrate", "sets", str(files["log"]), "-o", target)
    assert code == 0, err
    assert out.endswith("SetCalibration written to " + str(files["tmp"]) + "/\\xfe.npz\n")
    assert os.path.exists(os.fsencode(target))
    err = bad(capsys, "calibrate", "threshold", str(files["thr"]), "-o", target, "--sets",
              os.fsdecode(folder + b"/\xfd.npz"))
    assert "\\xfd.npz" in err


# --------------------------------------------------------------------------- any reader error


def _zipfile_runtime_error(tmp: Path) -> RuntimeError:
    """The RuntimeError zipfile raises for an encrypted member, raised by zipfile."""
    path = _zip_with(tmp / "enc.zip", {"a": b"x"}, _set_flag)
    try:
        with zipfile.ZipFile(path) as zf:
            zf.read("a")
    except RuntimeError as exc:
        return exc
    raise AssertionError("zipfile read an encrypted member")


ERRORS = [
    ValueError("a bad value"), TypeError("a bad type"), logs.LogError("line 3: a bad row"),
    OSError(5, "Input/output error"), FileNotFoundError(2, "No such file or directory"),
    OverflowError("int too large to convert to float"),
    EOFError("Compressed file ended before the end-of-stream marker was reached"),
    zipfile.BadZipFile("Bad magic number for file header"),
    zlib.error("Error -3 while decompressing data: invalid stored block lengths"),
    lzma.LZMAError("Corrupt input data"), csv.Error("field larger than field limit"),
    tokenize.TokenError("EOF in multi-line statement", (2, 0)),
    SyntaxError("invalid syntax"), MemoryError("Unable to allocate 2.00 GiB"),
    UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
    ValueError("two\nlines"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_whatever_a_reader_raises_for_a_bad_file_is_one_line(
        files: dict[str, Path], capsys: Any, monkeypatch: pytest.MonkeyPatch,
        error: BaseException) -> None:
    """The readers are meant to raise LogError/OSError; whatever a decoder under them lets
    through still ends in one line naming the file (the net in main)."""
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    from advcal.cli import calibrate as _calibrate

    for target in ("read_log", "read_columns"):
        monkeypatch.setattr(logs, target, fail)
    monkeypatch.setattr(_npz, "_read_arrays", fail)
    monkeypatch.setattr(_calibrate, "load_calibration", fail)
    log, out = str(files["log"]), str(files["tmp"] / "o.npz")
    for argv in (["diagnose", log], ["calibrate", "sets", log, "-o", out],
                 ["calibrate", "ranges", log, "-o", out],
                 ["calibrate", "threshold", log, "-o", out],
                 ["calibrate", "threshold", str(files["thr"]), "--sets", log, "-o", out]):
        err = bad(capsys, *argv)
        assert log in err and str(files["thr"]) not in err, err


def _json_recursion_error() -> RecursionError:
    """The RecursionError json raises for a document nested too deep, raised by json."""
    try:
        json.loads("[" * 200_000)
    except RecursionError as exc:
        return exc
    raise AssertionError("json decoded 200000 nested arrays")


def test_runtime_errors_from_decoders_are_bad_input_and_others_are_bugs(
        files: dict[str, Path], capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """zipfile's RuntimeError (an encrypted member) and json's RecursionError (nesting too
    deep) are about the file; a RuntimeError, KeyError, IndexError or AttributeError from
    anywhere else is a bug and keeps its traceback."""
    for decoded, message in ((_zipfile_runtime_error(files["tmp"]), "encrypted"),
                             (_json_recursion_error(), "maximum recursion depth")):
        def decoder_fail(*args: Any, _exc: BaseException = decoded, **kwargs: Any) -> Any:
            raise _exc

        monkeypatch.setattr(logs, "read_log", decoder_fail)
        err = bad(capsys, "diagnose", str(files["log"]))
        assert message in err and str(files["log"]) in err

    for bug in (RuntimeError("an internal state went wrong"), KeyError("offsets"),
                IndexError("index 9 is out of bounds"), AttributeError("no attribute 'x'")):
        def fail(*args: Any, _bug: BaseException = bug, **kwargs: Any) -> Any:
            raise _bug

        monkeypatch.setattr(logs, "read_log", fail)
        with pytest.raises(type(bug)):
            main(["diagnose", str(files["log"])])
        capsys.readouterr()


def test_control_characters_of_a_file_are_escaped(tmp_path: Path, capsys: Any) -> None:
    """A hostile column name cannot send terminal escape sequences through the error."""
    path = tmp_path / "log.jsonl"
    path.write_text('{"group": 1, "\\u001b[2J\\u001b[31mscore\\u0007": 0.5}\n' * 2)
    err = bad(capsys, "diagnose", str(path))
    assert "\x1b" not in err and "\x07" not in err
    assert "\\x1b[2J\\x1b[31mscore\\x07" in err


# --------------------------------------------------------------------------- options


HUGE = "9" * 400


@pytest.mark.parametrize(("argv", "message"), [
    (["diagnose", "{log}", "--tau-res", "nan"], "argument --tau-res: 'nan' is not a finite"),
    (["diagnose", "{log}", "--beta", "1e999"], "argument --beta: '1e999' is not a finite"),
    (["diagnose", "{log}", "--eps", HUGE], "argument --eps"),
    (["diagnose", "{log}", "--resolution", "inf"], "argument --resolution"),
    (["diagnose", "{log}", "--tau-res", "1_0"], "argument --tau-res: invalid number '1_0'"),
    (["diagnose", "{log}", "--beta", "\uff11"], "argument --beta: invalid number"),
    (["diagnose", ""], "an empty path names no file"),
    (["diagnose", "{log}", "--plot", ""], "argument --plot: an empty path"),
    (["diagnose"], "the following arguments are required: file"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--alpha", "nan"], "argument --alpha"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--alpha", HUGE], "argument --alpha"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--ridge", "-inf"], "argument --ridge"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--eps", "nan"], "argument --eps"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--estimator", "maxnorm", "--tau-res",
      "nan"], "argument --tau-res"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--folds", "1" + "0" * 40],
     "argument --folds: invalid number of folds '1" + "0" * 39 + "': must lie in [2, "),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--folds", "1" + "0" * 5000],
     "argument --folds: invalid number of folds"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--folds", "1"], "must lie in [2, "),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--seed", "-1"], "invalid seed -1"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--seed", "1" + "0" * 5000],
     "invalid seed"),
    (["calibrate", "sets", "{log}", "-o", ""], "argument -o/--out: an empty path"),
    (["calibrate", "ranges", "{log}", "-o", "{out}", "--bounds", "nan", "1"],
     "argument --bounds: 'nan' is not a finite number"),
    (["calibrate", "ranges", "{log}", "-o", "{out}", "--bounds", "0", "1e999"],
     "argument --bounds"),
    (["calibrate", "ranges", "{log}", "-o", "{out}", "--alpha", ""], "argument --alpha"),
    (["calibrate", "threshold", "{thr}", "-o", "{out}", "--calibration-fraction", "1e999"],
     "argument --calibration-fraction"),
    (["calibrate", "threshold", "{thr}", "-o", "{out}", "--calibration-fraction", "nan"],
     "argument --calibration-fraction"),
    (["calibrate", "threshold", "{thr}", "-o", "{out}", "--beta", "nan"], "argument --beta"),
    (["calibrate", "threshold", "{thr}", "-o", "{out}", "--delta", HUGE], "argument --delta"),
    (["calibrate", "threshold", "{thr}", "-o", "{out}", "--seed", "-5"], "invalid seed -5"),
    (["calibrate", "threshold", "{thr}", "-o", "{out}", "--sets", ""],
     "argument --sets: an empty path"),
    (["calibrate", "threshold", "{thr}", "-o", "{out}", "--sets-out", ""],
     "argument --sets-out: an empty path"),
    (["demo", "--seed", HUGE + "x"], "invalid seed"),
    (["demo", "--out", ""], "argument --out: an empty path"),
])
def test_bad_options_are_one_argparse_line(files: dict[str, Path], capsys: Any,
                                           argv: list[str], message: str) -> None:
    names = {"log": files["log"], "thr": files["thr"], "out": files["tmp"] / "o.npz"}
    argv = [a.format(**names) for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and "Traceback" not in err and "usage:" not in err, err
    assert message in err, err
    assert err.endswith("--help)\n") and len(err) < 400, err
    assert not (files["tmp"] / "o.npz").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["diagnose", "{log}", "--reward-weights", "1_0"],
     "--reward-weights '1_0': expected comma-separated numbers (invalid number '1_0')"),
    (["diagnose", "{log}", "--reward-weights", "\uff11"], "--reward-weights"),
    (["diagnose", "{log}", "--reward-weights", "1,,2"], "invalid number ''"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--reward-weights", "nan"],
     "'nan' is not a finite number"),
    (["calibrate", "sets", "{log}", "-o", "{out}", "--reward-weights", HUGE],
     "is not a finite number"),
    (["calibrate", "threshold", "{thr}", "-o", "{out}", "--thresholds", "0.5,1_0"],
     "--thresholds '0.5,1_0': expected comma-separated numbers (invalid number '1_0')"),
])
def test_number_lists_are_finite_plain_numbers(files: dict[str, Path], capsys: Any,
                                               argv: list[str], message: str) -> None:
    """Python's float() reads '1_0' as 10 and '\uff11' as 1; an option does not."""
    names = {"log": files["log"], "thr": files["thr"], "out": files["tmp"] / "o.npz"}
    err = bad(capsys, *[a.format(**names) for a in argv])
    assert message in err and len(err) < 400, err
    assert not (files["tmp"] / "o.npz").exists()


def test_negative_bounds_in_exponent_notation(files: dict[str, Path], capsys: Any) -> None:
    """argparse read ``-1e-3`` as an unknown option; it is a number."""
    code, out, err = run(capsys, "calibrate", "ranges", str(files["log"]), "-o",
                         str(files["tmp"] / "r.npz"), "--bounds", "-1e-3", "1", "--json")
    assert code == 0, err
    from advcal import load_calibration

    assert load_calibration(files["tmp"] / "r.npz").bounds == (-1e-3, 1.0)


def test_more_folds_than_groups_is_leave_one_out(files: dict[str, Path], capsys: Any) -> None:
    """Folds beyond the number of units are empty: 10**6 folds on 30 groups (120
    responses) give the leave-one-out estimate, without a million empty passes."""
    out = str(files["tmp"] / "o.npz")
    for form, units in (("sets", 30), ("ranges", 120)):
        reports = []
        for folds in (str(units), "1000000"):
            code, text, err = run(capsys, "calibrate", form, str(files["log"]), "-o", out,
                                  "--folds", folds, "--json")
            assert code == 0, err
            reports.append(json.loads(text)["coverage"])
        assert reports[0]["n"] == units
        assert {k: v for k, v in reports[0].items() if k != "folds"} == \
            {k: v for k, v in reports[1].items() if k != "folds"}


# --------------------------------------------------------------------------- targets


def _targets(tmp: Path) -> dict[str, Path]:
    """A symlink (to a file not yet there), a FIFO, a directory and, where this user may
    make one, a device node: none of them may be replaced by a regular file."""
    link = tmp / "link.npz"
    link.symlink_to(tmp / "elsewhere.npz")
    fifo = tmp / "fifo.npz"
    os.mkfifo(fifo)
    folder = tmp / "folder.npz"
    folder.mkdir()
    out = {"symbolic link": link, "FIFO": fifo, "directory": folder}
    try:
        node = tmp / "null.npz"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        out["device"] = node
    except (OSError, AttributeError):  # not root: no device node in the test
        pass
    return out


def _kind(path: Path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_outputs_that_are_not_regular_files_are_refused(
        files: dict[str, Path], capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    targets = _targets(files["tmp"])
    kinds = {name: _kind(path) for name, path in targets.items()}
    log, thr = str(files["log"]), str(files["thr"])
    for name, target in targets.items():
        for argv in (["calibrate", "sets", log, "-o", str(target)],
                     ["calibrate", "ranges", log, "-o", str(target)],
                     ["calibrate", "threshold", thr, "-o", str(target)],
                     ["calibrate", "threshold", thr, "-o", str(files["tmp"] / "t.npz"),
                      "--sets-out", str(target)]):
            err = bad(capsys, *argv)
            option = "--sets-out" if "--sets-out" in argv else "-o"
            assert f"{option} {target}: a {name}" in err and "refusing" in err, err
            assert _kind(target) == kinds[name]
        assert not (files["tmp"] / "t.npz").exists()  # refused before the work
    assert not (files["tmp"] / "elsewhere.npz").exists()
    assert not [p for p in files["tmp"].iterdir() if p.name.endswith(".tmp")]
    # a target made non-regular after the check: save_calibration refuses it, in one line
    from advcal.cli import calibrate as _calibrate

    monkeypatch.setattr(_calibrate, "check_out", lambda path, option: None)
    for name, target in targets.items():
        err = bad(capsys, "calibrate", "sets", log, "-o", str(target))
        assert str(target) in err and f"a {name}" in err and "refusing" in err, err
        assert _kind(target) == kinds[name]
    assert not [p for p in files["tmp"].iterdir() if p.name.endswith(".tmp")]


def test_output_in_a_missing_folder_is_refused_before_the_work(
        files: dict[str, Path], capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from advcal.cli import calibrate as _calibrate

    def no_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the work started before -o was checked")

    monkeypatch.setattr(_calibrate, "calibrate_sets", no_work)
    target = files["tmp"] / "no" / "such" / "o.npz"
    err = bad(capsys, "calibrate", "sets", str(files["log"]), "-o", str(target))
    assert f"-o {target}: cannot write it, {target.parent} is not a folder" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_plot_to_a_fifo_is_refused(files: dict[str, Path], capsys: Any) -> None:
    pytest.importorskip("matplotlib")
    fifo = files["tmp"] / "fig.png"
    os.mkfifo(fifo)
    err = bad(capsys, "diagnose", str(files["log"]), "--plot", str(fifo))
    assert f"cannot write the plot {fifo}" in err and "a FIFO" in err
    err = bad(capsys, "calibrate", "sets", str(files["log"]), "-o",
              str(files["tmp"] / "o.npz"), "--plot", str(fifo))
    assert "a FIFO" in err and not (files["tmp"] / "o.npz").exists()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_bad_sets_file_names_itself_and_fails_before_the_work(
        files: dict[str, Path], capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the .npz was read before --sets")

    monkeypatch.setattr(_npz, "_read_arrays", no_work)
    out = str(files["tmp"] / "o.npz")
    good = files["sets"].read_bytes()
    corrupt = {}
    for name, patch in (("crc", _flip_data_byte), ("encrypted", _set_flag),
                        ("method99", _set_method)):
        raw = bytearray(good)
        patch(raw)
        corrupt[name] = files["tmp"] / f"sets_{name}.npz"
        corrupt[name].write_bytes(bytes(raw))
    for sets, message in ((files["tmp"] / "none.npz", "No such file or directory"),
                          (files["tmp"], "a directory"),
                          (files["log"], "not an advcal calibration file"),
                          (corrupt["crc"], "CRC"), (corrupt["encrypted"], "encrypted"),
                          (corrupt["method99"], "method 99")):
        err = bad(capsys, "calibrate", "threshold", str(files["thr"]), "--sets", str(sets),
                  "-o", out)
        assert str(sets) in err and message in err, err
        assert str(files["thr"]) not in err  # the error is about --sets, not the .npz


# --------------------------------------------------------------------------- stdout closed


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_closed_stdout_in_process(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                  capsys: Any) -> None:
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["diagnose", str(files["log"])]) == EXIT_CLOSED_PIPE
    assert capsys.readouterr().err == ""


def test_ctrl_c_exits_130_quietly(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                  capsys: Any) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(logs, "read_log", interrupted)
    assert main(["diagnose", str(files["log"])]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == ""


def _advcal() -> list[str]:
    script = Path(sys.executable).parent / "advcal"
    return [str(script)] if script.exists() else [sys.executable, "-m", "advcal.cli"]


def test_closed_stdout_in_a_real_pipe(files: dict[str, Path]) -> None:
    """The reader of stdout is gone before the first write: exit 141 (as a tool that
    SIGPIPE ends), nothing on stderr (no BrokenPipeError, no 'Exception ignored')."""
    for argv in (["diagnose", str(files["log"]), "--json"],
                 ["calibrate", "sets", str(files["log"]), "-o", str(files["tmp"] / "s.npz")]):
        proc = subprocess.Popen([*_advcal(), *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=ROOT)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == EXIT_CLOSED_PIPE, err
        assert err == ""


@pytest.mark.skipif(shutil.which("sh") is None or shutil.which("head") is None,
                    reason="a POSIX shell and head")
def test_diagnose_piped_into_head(files: dict[str, Path]) -> None:
    """``advcal diagnose FILE | head -1``: the first line, and no traceback."""
    command = " ".join(f"'{a}'" for a in _advcal())
    done = subprocess.run(["sh", "-c", f"{command} diagnose '{files['log']}' --explain | head -1"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout == f"advcal diagnose: {files['log']}\n"
    assert done.stderr == ""


def test_max_bytes_bounds_every_read_and_is_checked(tmp_path: Path, capsys: Any) -> None:
    # The readers' documented limit, overridable from the command line: a small bound stops
    # the read with one line (exit 2), the default reads the same log.
    log = tmp_path / "log.csv"
    log.write_text("group,reward,second\n" + "".join(
        f"g{i // 4},{i % 3 / 2},{(i + 1) % 3 / 2}\n" for i in range(400)))
    assert main(["diagnose", str(log), "--no-progress"]) == 0
    capsys.readouterr()
    for argv in (["diagnose", str(log), "--no-progress"],
                 ["calibrate", "sets", str(log), "-o", str(tmp_path / "s.npz")]):
        assert main([*argv, "--max-bytes", "100"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "max_bytes" in err and str(log) in err
    rng = np.random.default_rng(0)
    data = tmp_path / "srgo.npz"
    np.savez(data, rewards=rng.uniform(size=(8, 4)), second=rng.uniform(size=(8, 4)),
             gram=np.broadcast_to(np.eye(4), (8, 4, 4)))
    assert main(["calibrate", "threshold", str(data), "-o", str(tmp_path / "t.npz"),
                 "--max-bytes", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(data) in err
    for bad in ("0", "1_0", "-5", "1e3"):
        with pytest.raises(SystemExit) as exit_info:
            main(["diagnose", str(log), "--max-bytes", bad])
        assert exit_info.value.code == 2
        assert "--max-bytes" in capsys.readouterr().err
