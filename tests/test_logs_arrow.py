"""The log readers' conversions between Arrow and numpy, which build arrays from their
buffers (pyarrow's own conversions import pandas): the same values as pyarrow's, and no
pandas imported by reading a log of any format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from advcal.io._common import _array, _from_numpy, _numpy, _scalar  # noqa: E402

_TYPES = ["int8", "int32", "int64", "uint16", "float32", "float64", "bool"]


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(_TYPES), n=st.integers(0, 40), start=st.integers(0, 20),
       nulls=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_numpy_of_an_arrow_slice_is_pyarrows_own(kind: str, n: int, start: int,
                                                nulls: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = (rng.random(n + start) < 0.5 if kind == "bool"
              else (rng.normal(size=n + start) * 100).astype(kind))
    nullable = nulls and kind.startswith("float")  # integers with nulls are not taken
    mask = rng.random(n + start) < 0.3 if nullable else None
    whole = pa.array(values, mask=mask)
    part = whole.slice(start, n)
    got = _numpy(part)
    want = part.to_numpy(zero_copy_only=False)
    assert got.dtype == want.dtype and got.shape == (n,)
    np.testing.assert_array_equal(got, want)  # NaN where null, in both
    # and back: the same Arrow array (no nulls)
    if not nullable:
        assert _from_numpy(got).equals(part)


def test_arrays_of_either_byte_order_are_their_values() -> None:
    for kind in (">i8", "<i8", ">f4", "<u2"):
        values = np.array([1, 2, 300], kind)
        assert _from_numpy(values).to_pylist() == [1, 2, 300]
    assert _scalar(2**63, pa.uint64()).as_py() == 2**63


def test_numpy_refuses_integers_with_nulls_and_dictionaries() -> None:
    with pytest.raises(ValueError, match="nulls"):
        _numpy(pa.array([1, None], pa.int32()))
    with pytest.raises(TypeError, match="dictionary"):
        _numpy(pa.array(["a", "b"]).dictionary_encode())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=6)), max_size=20))
def test_text_arrays_and_scalars_are_pyarrows_own(values: list[str | None]) -> None:
    assert _array(values, pa.string()).equals(pa.array(values, pa.string()))
    raw = [None if v is None else v.encode() for v in values]
    assert _array(raw, pa.binary()).equals(pa.array(raw, pa.binary()))
    for v in values[:3]:
        assert _scalar(v, pa.string()).equals(pa.scalar(v, pa.string()))


def test_integer_scalars_are_pyarrows_own() -> None:
    for value, kind in ((0, pa.int32()), (-1, pa.int64()), (7, pa.uint8()), (None, pa.int32())):
        got = _scalar(value, kind)
        assert got.type == kind and got.equals(pa.scalar(value, kind))


def test_reading_a_log_of_any_format_does_not_import_pandas(tmp_path: Path) -> None:
    pytest.importorskip("pandas")  # where it is absent, nothing could import it
    import pyarrow.parquet as pq

    rows = [{"prompt": p, "completion": "x", "accuracy_reward": r, "step": 1}
            for p, r in (("a", 1.0), ("a", None), ("", 0.5), ("b", "bad"), ("b", 0.25),
                         (7, 1.0), (7, 0.0), (2.5, 1.0), ([{"role": "user"}], 0.0))]
    jsonl = tmp_path / "log.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    csv = tmp_path / "log.csv"
    csv.write_text("step,prompt,accuracy_reward,format_reward\n1,a,1,\n1,a,0,0.5\n1,,1,1\n"
                   "1,b,x,1\n1,b,0.25,\n2,b,1,1\n")
    parquet = tmp_path / "completions_00001.parquet"
    pq.write_table(pa.table({"step": [1, 1, 1, 1], "prompt": ["p", "p", "", "q"],
                             "accuracy_reward": [1.0, None, 0.5, 0.0],
                             "format_reward": [None, 1.0, 1.0, float("nan")]}), parquet)
    npz = tmp_path / "log.npz"
    np.savez(npz, rewards=np.array([1.0, 0.0, 0.5, 0.5]), group=np.array(["u", "u", "v", "v"]))
    code = f"""
import sys
from advcal.io.logs import read_log
for path, kw in (({str(jsonl)!r}, dict(group_cols="prompt", reward_cols="accuracy_reward")),
                 ({str(csv)!r}, dict(group_cols=["step", "prompt"],
                                     reward_cols=["accuracy_reward", "format_reward"])),
                 ({str(parquet)!r}, dict(preset="trl",
                                         reward_cols=["accuracy_reward", "format_reward"])),
                 ({str(npz)!r}, dict(group_cols="group", reward_cols="rewards"))):
    log = read_log(path, **kw)
    assert log.rewards.size >= 2, (path, log.rewards)
print("pandas" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(["a", "b", "é", "", "ab", "🙂", "c"]),
                                   max_size=5, unique=True),
                          st.lists(st.integers(0, 4), max_size=12)), max_size=6))
def test_codes_over_batches_are_unify_dictionaries_own(
        batches: list[tuple[list[str], list[int]]]) -> None:
    from advcal.io.logs import _unified

    arrays = [pa.DictionaryArray.from_arrays(
        pa.array([i % len(d) for i in rows] if d else [], pa.int32()), pa.array(d, pa.string()))
        for d, rows in batches]
    want_codes: np.ndarray = np.zeros(0, np.int32)
    want_ids: list[str] = []
    if arrays:
        unified = pa.chunked_array(arrays, type=arrays[0].type).unify_dictionaries()
        if unified.num_chunks:
            want_ids = unified.chunk(0).dictionary.to_pylist()
            want_codes = np.concatenate([c.indices.to_numpy() for c in unified.chunks])
    codes, ids = _unified(list(arrays))
    assert ids.to_pylist() == want_ids
    assert codes.dtype == np.int32
    np.testing.assert_array_equal(codes, want_codes)


def test_bool_ids_and_labels_of_arrays(tmp_path: Path) -> None:
    """numpy bool group ids and labels are keys of their own, as in JSON (true/false)."""
    from advcal.io.logs import read_columns, read_log

    path = tmp_path / "log.npz"
    np.savez(path, rewards=np.array([1.0, 0.0, 0.5, 0.5, 2.0]),
             group_ids=np.array([True, True, False, False, True]))
    log = read_log(path)
    np.testing.assert_array_equal(log.offsets, [0, 3, 5])
    np.testing.assert_array_equal(log.rewards, [1.0, 0.0, 2.0, 0.5, 0.5])
    columns = read_columns(path, ["rewards"], label_col="group_ids")
    assert list(columns.labels) == [True, True, False, False, True]


def test_ids_that_are_not_unicode_text_are_bad_rows(tmp_path: Path) -> None:
    """A JSON id with a lone surrogate escape, or such a numpy string, cannot be UTF-8
    text: its row is bad, as a CSV id with a stray byte is."""
    from advcal.io.logs import read_log

    jsonl = tmp_path / "log.jsonl"
    jsonl.write_text('{"uid": "a", "score": 1}\n{"uid": "\\ud800", "score": 0}\n'
                     '{"uid": "a", "score": 0.5}\n{"uid": "\\udfff", "score": 3}\n')
    log = read_log(jsonl, group_cols="uid", reward_cols="score")
    np.testing.assert_array_equal(log.rewards, [1.0, 0.5])
    assert log.bad_rows.count == 2
    assert log.bad_rows.examples[0] == (2, "group id in column 'uid' is not UTF-8 text")
    npz = tmp_path / "log.npz"
    np.savez(npz, rewards=np.array([1.0, 0.0, 0.5]), group_ids=np.array(["b", "\ud800", "b"]))
    log = read_log(npz)
    np.testing.assert_array_equal(log.rewards, [1.0, 0.5])
    assert log.bad_rows.count == 1


def test_a_date_in_a_reward_column_is_named_in_the_message(tmp_path: Path) -> None:
    import datetime

    import pyarrow.parquet as pq

    from advcal.io.logs import LogError, read_log

    path = tmp_path / "log.parquet"
    pq.write_table(pa.table({"prompt": ["p", "p"],
                             "reward": [datetime.date(2026, 1, 2), datetime.date(2026, 1, 3)]}),
                   path)
    with pytest.raises(LogError, match=r"'reward' value \"2026-01-02\" is not a number"):
        read_log(path, group_cols="prompt", reward_cols="reward")
