"""advcal.io.logs on hostile and awkward files: only regular files are opened, every reader has
a documented bound (``max_bytes``) checked as it streams, valid logs with long rows, wide
headers or a stray byte are read (the bad row skipped and counted), and only ASCII
numbers count as numbers."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

from advcal.io.logs import LogError, read_columns, read_log

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

MiB = 1 << 20
# What the docs promise a read holds beyond the rows it keeps: pyarrow's read-ahead of
# 8 MiB text blocks (its IO threads) and the longest row, at most 256 MiB all together.
READ_BUFFERS = 256 * MiB


def gz_bytes(pieces, repeat: int = 1) -> bytes:
    """gzip of ``pieces`` (the last repeated ``repeat`` times), built in memory quickly."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [c.compress(p) for p in pieces[:-1]]
    out += [c.compress(pieces[-1]) for _ in range(repeat)]
    out.append(c.flush())
    return b"".join(out)


def peak_rss(code: str, *args: str) -> tuple[int, int, str]:
    """Run ``code`` in a fresh interpreter: (its peak RSS before, after it, its last line).
    The peak is the kernel's high-water mark of the interpreter's own memory (VmHWM):
    ``ru_maxrss`` would start at the forking test process's size, which exec carries over."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc/self/status (VmHWM)")
    hwm = ("int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))"
           ".split()[1]) * 1024")
    script = "\n".join([
        "import sys",
        "import advcal.io.logs, pyarrow.csv, pyarrow.json, pyarrow.parquet",
        f"before = {hwm}",
        "try:",
        textwrap.indent(textwrap.dedent(code).strip(), "    "),
        "except advcal.io.logs.LogError as exc:",
        "    print('LogError:', exc)",
        f"after = {hwm}",
        "print(before, after)"])
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, timeout=300, check=True)
    lines = done.stdout.strip().splitlines()
    before, after = map(int, lines[-1].split())
    return before, after, "\n".join(lines[:-1])


# --------------------------------------------------------------------------- not regular


def test_only_regular_files_are_opened(tmp_path):
    fifo = tmp_path / "log.csv"
    os.mkfifo(fifo)
    link = tmp_path / "zero.csv"
    link.symlink_to("/dev/zero")
    cases = {fifo: "a FIFO, not a regular file", link: "a device, not a regular file",
             tmp_path: "a directory, not a regular file"}
    for path, message in cases.items():
        for read in (lambda p: read_log(p), lambda p: read_columns(p, ["x"])):
            out: list[BaseException | None] = []
            worker = threading.Thread(target=lambda p=path, r=read, o=out: o.append(_raised(r, p)),
                                      daemon=True)
            worker.start()
            worker.join(30)
            assert not worker.is_alive(), f"{path} blocked"
            assert isinstance(out[0], LogError) and str(out[0]) == message, (path, out)
    with pytest.raises(TypeError, match="`path` must be a str or path-like"):
        read_log(b"log.csv")


def _raised(read, path) -> BaseException | None:
    try:
        read(path)
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread
        return exc
    return None


# --------------------------------------------------------------------------- bounds


def test_compressed_text_stops_at_max_bytes_as_it_streams(tmp_path):
    # 4 MiB of rows in a few KB of gzip: refused once the decompressed text passes 1 MiB
    path = tmp_path / "bomb.csv.gz"
    path.write_bytes(gz_bytes([b"group,reward\n", b"a,1\n" * (1 << 18)], repeat=4))
    for read in (lambda: read_log(path, max_bytes=MiB),
                 lambda: read_columns(path, ["reward"], max_bytes=MiB)):
        with pytest.raises(LogError, match=r"decompresses to over 1,048,576 bytes \(max_bytes\)"):
            read()
    jsonl = tmp_path / "bomb.jsonl.gz"
    jsonl.write_bytes(gz_bytes([b'{"group": "a", "reward": 1}\n' * (1 << 16)], repeat=4))
    with pytest.raises(LogError, match="decompresses to over 1,048,576 bytes"):
        read_log(jsonl, max_bytes=MiB)
    # within the bound, the same file is read whole
    assert read_log(path, max_bytes=64 * MiB).rewards.size == 1 << 20


def test_kept_rows_stop_at_max_bytes(tmp_path):
    # 200,000 kept rows take 200,000 * (8 + 4) bytes, over 1 MiB; not compressed
    path = tmp_path / "many.csv"
    path.write_bytes(b"group,reward\n" + b"a,1\n" * 200_000)
    with pytest.raises(LogError, match=r"rows kept so far take over 1,048,576 bytes"):
        read_log(path, max_bytes=MiB)
    jsonl = tmp_path / "many.jsonl"
    jsonl.write_bytes(b'{"group": "a", "reward": 1}\n' * 200_000)
    with pytest.raises(LogError, match=r"rows kept so far take over 1,048,576 bytes"):
        read_log(jsonl, max_bytes=MiB)
    assert read_log(path).rewards.size == 200_000


def test_parquet_sizes_are_checked_from_the_metadata(tmp_path):
    n = 200_000
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"group": np.zeros(n, np.int64), "reward": np.ones(n)}), path)
    with pytest.raises(LogError, match=r"its 200,000 rows would take 2,400,000 bytes once "
                                       r"read, over 1,048,576 \(max_bytes\)"):
        read_log(path, max_bytes=MiB)
    # distinct 10 kB ids: 10 MB uncompressed in a small zstd file
    ids = [f"{i:06d}" + "x" * 10_000 for i in range(1000)]
    wide = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"group": ids, "reward": np.ones(1000)}), wide,
                   compression="zstd", use_dictionary=False)
    assert wide.stat().st_size < MiB
    with pytest.raises(LogError, match=r"the columns read \(group, reward\) take "
                                       r"[0-9,]+ bytes uncompressed, over 1,048,576"):
        read_log(wide, max_bytes=MiB)
    assert read_log(wide).n_groups == 1000


def test_a_line_longer_than_the_longest_is_a_bad_line(tmp_path):
    # max_bytes = 160 MiB: the longest line read is 10 MiB; a 12 MiB line is skipped and
    # counted, wherever it starts in the 8 MiB chunks the file is read in
    rows = [json.dumps({"group": "a", "reward": float(i)}) for i in range(4)]
    long_line = json.dumps({"group": "a", "reward": 9.0, "pad": "y" * (12 * MiB)})
    for lead, compress in [(0, False), (7 * MiB, False), (7 * MiB, True), (9 * MiB, False)]:
        pad = json.dumps({"group": "a", "reward": 0.0, "pad": "p" * lead})
        data = "\n".join([pad, long_line, *rows[1:]]).encode() + b"\n"
        path = tmp_path / f"long{lead}{compress}.jsonl"
        path.write_bytes(gzip.compress(data, 1) if compress else data)
        log = read_log(path, max_bytes=160 * MiB)
        assert log.rewards.tolist() == [0.0, 1.0, 2.0, 3.0], lead
        assert log.bad_rows.examples == (
            (2, "longer than 10,485,760 bytes, the longest line read (max_bytes / 16)"),)
        assert read_log(path).rewards.tolist() == [0.0, 9.0, 1.0, 2.0, 3.0]
    # a CSV row cannot be cut out of the file: far past the longest (pyarrow's blocks take
    # a row across one block boundary), one clear error
    csv = tmp_path / "long.csv"
    csv.write_text(f'group,reward,completion\na,1,"{"z" * (25 * MiB)}"\na,2,x\n',
                   encoding="utf-8")
    with pytest.raises(LogError, match=r"a row \(or the header\) is longer than 10,485,760 "
                                       r"bytes, the longest row read \(max_bytes / 16\), or a "
                                       "quote is never closed; raise max_bytes"):
        read_log(csv, max_bytes=160 * MiB)
    assert read_log(csv).rewards.tolist() == [1.0, 2.0]
    # a quote never closed makes the rest of the file one value: the same one line
    csv.write_text('group,reward,completion\na,1,"open\n' + "a,2,x\n" * (3 * MiB),
                   encoding="utf-8")
    with pytest.raises(LogError, match="or a quote is never closed"):
        read_log(csv, max_bytes=16 * MiB)


def test_peak_memory_of_hostile_files(tmp_path):
    """Each file cost the reader before its bounds several times the documented bound
    (it read every row, held the whole line, decoded the id once per row); the bound is
    what docs/cli.md promises: the rows kept or the longest line, twice, plus the read
    buffers."""
    # 50M tiny rows in 200 KB of gzip; read with max_bytes = 32 MiB
    bomb = tmp_path / "bomb.csv.gz"
    bomb.write_bytes(gz_bytes([b"group,reward\n", b"a,1\n" * (1 << 20)], repeat=50))
    before, after, out = peak_rss(
        "advcal.io.logs.read_log(sys.argv[1], max_bytes=32 << 20)", str(bomb))
    assert after - before < 2 * 32 * MiB + READ_BUFFERS, (before, after)
    assert out.startswith("LogError:"), out
    # one 200 MB line in 200 KB of gzip: dropped as it streams (longest line 64 MiB)
    line = tmp_path / "line.jsonl.gz"
    line.write_bytes(gz_bytes([b'{"group": "a", "reward": 1, "pad": "', b"x" * MiB, ],
                              repeat=200) + gzip.compress(b'"}\n{"group": "a", "reward": 2}\n'))
    before, after, out = peak_rss("print(advcal.io.logs.read_log(sys.argv[1]).rewards)", str(line))
    assert after - before < 2 * 64 * MiB + READ_BUFFERS, (before, after)
    assert out == "[2.]", out
    # a 1 MB id on each of 500 rows, dictionary-encoded in the file: held once, not 500 times
    ids = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"group": ["g" * MiB] * 500, "reward": np.arange(500.0)}), ids,
                   compression="zstd")
    before, after, out = peak_rss(
        "print(advcal.io.logs.read_log(sys.argv[1]).offsets.tolist())", str(ids))
    assert after - before < READ_BUFFERS, (before, after)
    assert out == "[0, 500]", out


# --------------------------------------------------------------------------- valid logs


def test_long_first_row_and_wide_header_are_read(tmp_path):
    big = tmp_path / "big.csv"
    big.write_text('group,reward,completion\na,1,"' + "y\n" * 150_000 + '"\n'
                   + "".join(f"a,{i},short\n" for i in range(5)), encoding="utf-8")
    log = read_log(big)
    assert log.rewards.tolist() == [1.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    assert log.bad_rows.count == 0
    wide = tmp_path / "wide.csv"
    names = [f"column_{i}" for i in range(20_000)]  # a 250 kB header
    wide.write_text("group,reward," + ",".join(names) + "\n"
                    + "".join(f"a,{i}," + ",".join("0" * len(names)) + "\n" for i in range(3)),
                    encoding="utf-8")
    assert read_log(wide).rewards.tolist() == [0.0, 1.0, 2.0]
    assert read_columns(wide, ["reward", names[-1]]).columns[names[-1]].tolist() == [0.0] * 3
    # the TRL preset sees the reward columns of a first row that fills no small block
    trl = tmp_path / "trl.csv"
    trl.write_text('step,prompt,completion,accuracy\n1,p,"' + "c" * 300_000 + '",1\n'
                   + "1,p,short,0\n", encoding="utf-8")
    log = read_log(trl, preset="trl")
    assert log.reward_cols == ("accuracy",) and log.rewards.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("suffix", [".jsonl", ".log", ".jsonl.gz"])
@pytest.mark.parametrize("bad", [b"\x00", b"\xff\xfe\x00garbage", b"\x00\x00\x00\x00"])
def test_jsonl_with_a_bad_byte_near_its_start(tmp_path, suffix, bad):
    rows = b"".join(json.dumps({"group": "a", "reward": i}).encode() + b"\n" for i in range(5))
    cut = rows.index(b"\n") + 1
    data = rows[:cut] + bad + b"\n" + rows[cut:]  # a broken second line
    path = tmp_path / f"log{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    log = read_log(path)
    assert log.rewards.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert log.bad_rows.count == 1 and log.bad_rows.examples[0][0] == 2
    first = tmp_path / f"first{suffix}"
    data = bad + b"\n" + rows
    first.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    log = read_log(first)
    assert log.rewards.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert log.bad_rows.examples[0][0] == 1


def test_binary_files_are_still_no_log_format(tmp_path):
    rng = np.random.default_rng(0)
    for k in range(20):
        path = tmp_path / f"random{k}.bin"
        path.write_bytes(b"\x01" + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
        with pytest.raises(LogError, match="not a log format"):
            read_log(path)


def test_a_stray_byte_in_a_csv_row_costs_that_row(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes(b"group,reward,completion\n"
                     b"a,1,fine\n"
                     b"\xff\xfe,1,x\n"          # group id
                     b"a,\xff1,x\n"             # reward
                     b"b,0,caf\xe9\n"           # a column not read
                     b"a,0,x\nb,1,x\n")
    log = read_log(path)
    assert [log.rewards[a:b].tolist() for a, b in zip(log.offsets[:-1], log.offsets[1:],
                                                       strict=True)] == [[1.0, 0.0], [0.0, 1.0]]
    assert log.bad_rows.summary() == (
        "skipped 2 bad lines (line 3: group id in column 'group' is not UTF-8 text; "
        "line 4: 'reward' value '\\\\xff1' is not a number)")
    with pytest.raises(LogError, match="^line 3: group id in column 'group' is not UTF-8"):
        read_log(path, on_bad_row="error")
    judged = read_columns(path, ["reward"], label_col="group")
    assert judged.labels == ["a", "b", "a", "b"]
    assert judged.bad_rows.examples[0] == (3, "label in column 'group' is not UTF-8 text")
    jsonl = tmp_path / "latin.jsonl"
    jsonl.write_bytes(b'{"group": "\xff", "reward": 1}\n{"group": "a", "reward": 2}\n'
                      b'{"group": "a", "reward": 3}\n')
    assert read_columns(jsonl, ["reward"], label_col="group").labels == ["a", "a"]
    assert read_log(jsonl).bad_rows.count == 1


# --------------------------------------------------------------------------- numbers


def test_only_ascii_numbers_are_numbers(tmp_path):
    cells = {"1_0": None, "\uff11": None, "\u0661": None, "1e3": 1000.0, " 2.5 ": 2.5,
             "+.5": 0.5, "-3.": -3.0, "0x10": None, "1e": None, "١٠": None}
    csv = tmp_path / "numbers.csv"
    csv.write_text("group,reward\n" + "".join(f"a,{c}\n" for c in cells), encoding="utf-8")
    jsonl = tmp_path / "numbers.jsonl"
    jsonl.write_text("".join(json.dumps({"group": "a", "reward": c}) + "\n" for c in cells),
                     encoding="utf-8")
    kept = [v for v in cells.values() if v is not None]
    for path in (csv, jsonl):
        log = read_log(path)
        assert log.rewards.tolist() == kept, path
        assert log.bad_rows.count == len(cells) - len(kept)
        assert "'reward' value '1_0' is not a number" in log.bad_rows.summary()
    # a column of such strings is no reward column for the TRL preset
    trl = tmp_path / "trl.csv"
    trl.write_text("prompt,accuracy,code\n" + "".join(f"p,{i % 2},{i}_0\n" for i in range(8)),
                   encoding="utf-8")
    assert read_log(trl, preset="trl").reward_cols == ("accuracy",)
    trl.write_text("prompt,accuracy,code\n" + "".join(f"p,{i % 2},\uff11\n" for i in range(8)),
                   encoding="utf-8")
    assert read_log(trl, preset="trl").reward_cols == ("accuracy",)


def test_string_numbers_in_parquet_follow_the_same_rule(tmp_path):
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"group": ["a"] * 4, "reward": ["1", "1_0", "\uff12", "3e0"]}),
                   path)
    log = read_log(path)
    assert log.rewards.tolist() == [1.0, 3.0]
    assert log.bad_rows.count == 2


def test_parquet_ids_read_encoded_keep_the_bad_row_rules(tmp_path):
    # text columns are read dictionary-encoded: "" is still no id, None no label
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"group": ["a", "", "b", "a", None, "b"],
                             "reward": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}), path)
    log = read_log(path)
    assert log.rewards.tolist() == [1.0, 4.0, 3.0, 6.0]
    assert log.bad_rows.examples == ((2, "empty group id in column 'group'"),
                                     (5, "empty group id in column 'group'"))
    judged = read_columns(path, ["reward"], label_col="group")
    assert judged.labels == ["a", "b", "a", "b"]


def test_parquet_batches_hold_only_their_own_ids(tmp_path, monkeypatch):
    # pyarrow hands each batch of a row group the dictionary read so far; kept as read,
    # 220 batches would hold 160 MB of ids for 1.5 MB of distinct ones
    from advcal.io import _common

    n = 200_000
    prompts = [f"prompt {i // 8:06d} " + "x" * 50 for i in range(n)]
    rewards = np.arange(n) % 7 / 7.0
    path = tmp_path / "trl.parquet"
    pq.write_table(pa.table({"step": np.ones(n, np.int64), "prompt": prompts,
                             "accuracy": rewards}), path, row_group_size=n)
    monkeypatch.setattr(_common, "_BLOCK", 64 << 10)
    log = read_log(path, preset="trl", max_bytes=64 * MiB)
    assert log.n_groups == n // 8
    assert np.array_equal(log.offsets, np.arange(0, n + 1, 8))
    assert np.array_equal(log.rewards, rewards)
