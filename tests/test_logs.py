"""advcal.io.logs: reading verl- and TRL-shaped reward logs (clean and messy, compressed),
checked against the array API; malformed files are one-line LogErrors."""

from __future__ import annotations

import gzip
import json
import math
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from advcal import scale_diagnostics
from advcal.io.logs import PRESETS, LogError, detect_format, read_columns, read_log

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


# --------------------------------------------------------------------------- writers


def verl_rows(n_prompts: int = 12, group: int = 4, steps: int = 2, seed: int = 0,
              uid: bool = False) -> list[dict]:
    """Rows as verl's _dump_generations writes them (input, output, gts, score, step)."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, steps + 1):
        for p in range(n_prompts):
            for _ in range(group):
                row = {"input": f"Question {p}: what is {p} + {p}?\nAnswer:",
                       "output": f"It is {rng.integers(0, 20)}.", "gts": str(2 * p),
                       "score": float(np.round(rng.random(), 3)), "step": step,
                       "acc": bool(rng.random() < 0.5)}
                if uid:
                    row["uid"] = f"uid-{step}-{p}"
                rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list, opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def expected_groups(rows: list[dict], key) -> tuple[np.ndarray, list]:
    return np.array([r["score"] for r in rows]), [key(r) for r in rows]


def grouped(values, ids) -> list[list[float]]:
    """Values per group, groups in order of first appearance (the reader's order)."""
    out: dict = {}
    for v, g in zip(values, ids, strict=True):
        out.setdefault(g, []).append(float(v))
    return list(out.values())


def assert_groups(log, expected: list[list[float]]) -> None:
    got = flat(log)
    assert [len(g) for g in got] == [len(g) for g in expected]
    assert np.allclose(np.concatenate(got), np.concatenate(expected), rtol=1e-12, atol=1e-12)


def flat(log) -> list[list[float]]:
    return [log.rewards[a:b].tolist() for a, b in zip(log.offsets[:-1], log.offsets[1:],
                                                       strict=True)]


# --------------------------------------------------------------------------- verl


def test_verl_preset_groups_by_prompt_within_step(tmp_path):
    rows = verl_rows()
    log = read_log(write_jsonl(tmp_path / "1.jsonl", rows), preset="verl")
    assert log.group_cols == ("step", "input") and log.reward_cols == ("score",)
    assert log.format == "jsonl" and log.compression is None and log.bad_rows.count == 0
    assert flat(log) == grouped([r["score"] for r in rows],
                                [(r["step"], r["input"]) for r in rows])
    assert log.n_groups == 24


def test_verl_preset_prefers_uid(tmp_path):
    rows = verl_rows(uid=True)
    for r in rows[::2]:  # a uid that does not match the prompt text: the uid wins
        r["uid"] = r["uid"] + "-odd"
    log = read_log(write_jsonl(tmp_path / "1.jsonl", rows), preset="verl")
    assert log.group_cols == ("step", "uid")
    assert flat(log) == grouped([r["score"] for r in rows],
                                [(r["step"], r["uid"]) for r in rows])


def test_verl_without_step(tmp_path):
    rows = verl_rows(steps=1)
    for r in rows:
        del r["step"]
    log = read_log(write_jsonl(tmp_path / "x.jsonl", rows), preset="verl")
    assert log.group_cols == ("input",)
    assert flat(log) == grouped([r["score"] for r in rows], [r["input"] for r in rows])


@pytest.mark.parametrize("compression", ["gzip", "zstd", "bz2", None])
def test_messy_verl_log_matches_the_array_api(tmp_path, compression):
    rows = verl_rows(n_prompts=30, group=5, steps=1, seed=3)
    lines: list = [json.dumps(r) for r in rows]
    bad = {3: '{"input": "Question 0", "score": NaN, "step": 1}',
           7: json.dumps({**rows[7], "score": None}),
           11: json.dumps({**rows[11], "score": "high"}),
           20: json.dumps({**rows[20], "score": True}),
           25: json.dumps({**rows[25], "input": ""}),
           40: '{"input": "Question 1", "sco',
           41: "",  # a blank line is no row
           }
    for i, text in bad.items():
        lines[i] = text
    kept = [r for i, r in enumerate(rows) if i not in bad]
    lines.append('{"input": "Question 2", "score": 0.5, "step"')  # truncated last line
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    if compression is not None:
        data = path.read_bytes()
        path = tmp_path / "log.jsonl.gz"  # the name says gzip, the content decides
        with pa.output_stream(str(path), compression=compression) as out:
            out.write(data)
    log = read_log(path, preset="verl")
    assert log.compression == compression
    assert log.bad_rows.count == 7  # 6 bad rows + the truncated line; the blank is none
    numbers = [n for n, _ in log.bad_rows.examples]
    assert numbers == [4, 8, 12, 21, 26]  # 1-based line numbers, first five
    reasons = dict(log.bad_rows.examples)
    assert "empty or NaN" in reasons[4] and "empty or NaN" in reasons[8]
    assert reasons[12] == "'score' value 'high' is not a number"
    assert reasons[21] == "'score' value true is not a number"
    assert "empty group id" in reasons[26]
    scores, ids = expected_groups(kept, lambda r: r["input"])
    assert flat(log) == grouped(scores, ids)
    assert (scale_diagnostics(log.rewards, log.offsets).table()
            == scale_diagnostics(scores, group_ids=ids).table())


def test_bad_rows_all_the_way_with_on_bad_row_error(tmp_path):
    rows = verl_rows(steps=1)
    lines = [json.dumps(r) for r in rows]
    lines[5] = json.dumps({**rows[5], "score": float("nan")}).replace("NaN", "NaN")
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(LogError, match=r"^line 6: empty or NaN value in column 'score'$"):
        read_log(path, preset="verl", on_bad_row="error")
    assert read_log(path, preset="verl").bad_rows.count == 1


def test_many_rows_across_blocks_and_one_broken_line(tmp_path, monkeypatch):
    # small blocks: the broken line sits in one block, found by halving it
    from advcal.io import _common

    monkeypatch.setattr(_common, "_BLOCK", 4096)
    rng = np.random.default_rng(1)
    n = 5000
    groups = rng.integers(0, 700, n)
    scores = np.round(rng.random(n), 4)
    lines = [json.dumps({"uid": int(g), "score": float(s)}) for g, s in
             zip(groups, scores, strict=True)]
    lines[2345] = lines[2345][:-3]
    path = write_jsonl(tmp_path / "big.jsonl", lines)
    log = read_log(path, preset="verl")
    assert log.group_cols == ("uid",)
    assert log.bad_rows.count == 1 and log.bad_rows.examples[0][0] == 2346
    keep = np.arange(n) != 2345
    assert flat(log) == grouped(scores[keep], groups[keep].tolist())


def test_jsonl_ids_keep_their_json_type(tmp_path):
    rows: list = [{"group": g, "reward": r} for g, r in
                  zip([1, 1, 1.0, 1.0, True, True, "1", "1"], range(8), strict=True)]
    rows.insert(3, '{"group": NaN, "reward": 9}')  # NaN names no group
    log = read_log(write_jsonl(tmp_path / "ids.jsonl", rows))
    assert flat(log) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert log.bad_rows.examples == ((4, "empty group id in column 'group'"),)


def chat(text: str, system: bool = False) -> list[dict]:
    """A conversational prompt as TRL logs it: its list of messages."""
    return ([{"role": "system", "content": "be brief"}] if system else []) + [
        {"role": "user", "content": text}]


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_chat_prompts_are_group_ids(tmp_path, kind):
    # TRL logs a conversational prompt as its list of messages: equal lists are one group
    # (anywhere in the step, as equal strings are), other lists are other groups, an empty
    # list names no group.
    prompts = [chat("q"), chat("q"), chat("r"), chat("q", system=True), chat("r"),
               chat("q"), [], chat("q", system=True)]
    frame = {"step": [3] * len(prompts), "prompt": prompts,
             "reward": [0.5 * i for i in range(len(prompts))]}
    if kind == "parquet":
        path = tmp_path / "completions_00003.parquet"
        pq.write_table(pa.table(frame), path)
    else:
        path = write_jsonl(tmp_path / "log.jsonl",
                           [dict(zip(frame, row, strict=True)) for row in
                            zip(*frame.values(), strict=True)])
    log = read_log(path, group_cols=("step", "prompt"), reward_cols=("reward",))
    assert flat(log) == [[0.0, 0.5, 2.5], [1.0, 2.0], [1.5, 3.5]]
    assert log.bad_rows.examples == ((7, "empty group id in column 'prompt'"),)


def test_chat_prompt_ids_ignore_key_order_and_never_equal_a_string(tmp_path):
    same = [{"role": "user", "content": "q"}]
    reordered = [{"content": "q", "role": "user"}]
    rows = [{"g": same, "reward": 0.0}, {"g": reordered, "reward": 1.0},
            {"g": json.dumps(same), "reward": 2.0}, {"g": {"role": "user"}, "reward": 3.0},
            {"g": {"role": "user"}, "reward": 4.0}]
    log = read_log(write_jsonl(tmp_path / "log.jsonl", rows), group_cols=("g",),
                   reward_cols=("reward",))
    assert flat(log) == [[0.0, 1.0], [2.0], [3.0, 4.0]]


# --------------------------------------------------------------------------- TRL


def trl_frame(seed: int = 0, n_prompts: int = 10, group: int = 6) -> dict[str, list]:
    """Columns of TRL's completions_NNNNN.parquet: step, prompt, completion, one column
    per reward function, advantage."""
    rng = np.random.default_rng(seed)
    n = n_prompts * group
    acc = rng.integers(0, 2, n).astype(float)
    fmt = np.round(rng.random(n), 2)
    fmt[rng.random(n) < 0.15] = np.nan  # the function returned None
    return {"step": [7] * n, "prompt": [f"<|user|>Solve {i // group}" for i in range(n)],
            "completion": [f"answer {i}" for i in range(n)], "accuracy_reward": acc.tolist(),
            "format_reward": fmt.tolist(), "advantage": rng.normal(size=n).tolist()}


def trl_sum(frame, weights=(1.0, 1.0)) -> np.ndarray:
    r = np.stack([frame["accuracy_reward"], frame["format_reward"]], axis=1)
    return np.nansum(r * np.asarray(weights), axis=1)


def trl_normalize_then_sum(frame, weights=(1.0, 1.0)) -> list[list[float]]:
    """TRL's normalize_then_sum, written out per group with the standard library."""
    by_group: dict[str, list[int]] = {}
    for i, p in enumerate(frame["prompt"]):
        by_group.setdefault(p, []).append(i)
    out = []
    for rows in by_group.values():
        total = [0.0] * len(rows)
        for col, w in zip(("accuracy_reward", "format_reward"), weights, strict=True):
            vals = [frame[col][i] for i in rows]
            ok = [v for v in vals if not math.isnan(v)]
            mean = sum(ok) / len(ok)
            std = (math.sqrt(sum((v - mean) ** 2 for v in ok) / (len(ok) - 1))
                   if len(ok) > 1 else math.nan)
            for k, v in enumerate(vals):
                z = (v - mean) / (std + 1e-4) * w
                if not math.isnan(z):
                    total[k] += z
        out.append(total)
    return out


@pytest.mark.parametrize("kind", ["parquet", "csv", "csv.gz", "jsonl.zst"])
def test_trl_preset_sums_the_reward_functions(tmp_path, kind):
    frame = trl_frame()
    table = pa.table(frame)
    path = tmp_path / f"completions_00007.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    elif kind.startswith("csv"):
        import pyarrow.csv as pcsv

        with pa.output_stream(str(path), compression="gzip" if kind.endswith("gz")
                              else None) as out:
            pcsv.write_csv(table, out)
    else:
        with pa.output_stream(str(path), compression="zstd") as out:
            for row in table.to_pylist():
                out.write((json.dumps(row) + "\n").encode())
    log = read_log(path, preset="trl", reward_weights=[1.0, 0.5])
    assert log.reward_cols == ("accuracy_reward", "format_reward")
    assert log.group_cols == ("step", "prompt")
    expected = trl_sum(frame, (1.0, 0.5))
    assert_groups(log, grouped(expected, frame["prompt"]))
    assert log.bad_rows.count == 0


def test_trl_normalize_then_sum(tmp_path):
    frame = trl_frame(seed=4)
    pq.write_table(pa.table(frame), tmp_path / "c.parquet")
    log = read_log(tmp_path / "c.parquet", preset="trl", reward_agg="normalize_then_sum",
                   reward_weights=[2.0, 1.0])
    expected = trl_normalize_then_sum(frame, (2.0, 1.0))
    assert_groups(log, expected)


def test_trl_row_without_any_reward_is_skipped(tmp_path):
    frame = trl_frame(seed=2)
    frame["accuracy_reward"][3] = math.nan
    frame["format_reward"][3] = math.nan
    pq.write_table(pa.table(frame), tmp_path / "c.parquet")
    log = read_log(tmp_path / "c.parquet", preset="trl", reward_weights=[1.0, 1.0])
    assert log.bad_rows.count == 1 and log.bad_rows.unit == "row"
    assert log.bad_rows.examples == ((4, "no reward (every reward column empty or NaN)"),)
    keep = [i for i in range(len(frame["prompt"])) if i != 3]
    expected = trl_sum(frame)[keep]
    assert_groups(log, grouped(expected, [frame["prompt"][i] for i in keep]))


def test_messy_trl_csv(tmp_path):
    text = ("step,prompt,completion,accuracy_reward,format_reward,advantage\n"
            '1,"Solve\n 1",a,1,0.5,0\n'  # a prompt with a line break (quoted)
            '1,"Solve\n 1",b,0,,0\n'  # format empty: nansum
            "1,p2,c,1,0.2,0\n"
            "1,p2,d,high,0.2,0\n"  # unparsable: bad
            "1,p2,e,0,0.1\n"  # a field short: bad
            "1,p2,f,,,0\n"  # nothing: bad
            "1,p2,g,1,0.0,0\n")
    path = tmp_path / "c.csv"
    path.write_text(text, encoding="utf-8")
    log = read_log(path, preset="trl", reward_cols=["accuracy_reward", "format_reward"])
    assert flat(log) == [[1.5, 0.0], [1.2, 1.0]]
    assert log.bad_rows.count == 3
    reasons = [why for _, why in log.bad_rows.examples]
    assert "'accuracy_reward' value 'high' is not a number" in reasons
    assert "5 fields, expected 6" in reasons
    assert "no reward (every reward column empty or NaN)" in reasons


# --------------------------------------------------------------------------- columns


def test_explicit_columns_and_missing_column_message(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("q,r1,r2\na,1,2\na,0,1\n", encoding="utf-8")
    log = read_log(path, group_cols=["q"], reward_cols=["r1", "r2"], reward_weights=[1, -1])
    assert flat(log) == [[-1.0, -1.0]]
    with pytest.raises(LogError) as err:
        read_log(path)
    assert str(err.value) == ("no column 'group' (found: q, r1, r2); pass --reward-col NAME "
                              "and --group-col NAME")
    verl = tmp_path / "v.jsonl"
    write_jsonl(verl, verl_rows(steps=1))
    with pytest.raises(LogError, match=r"found: input, output, gts, score, step, acc\); "
                                       r"pass --reward-col NAME and --group-col NAME, or "
                                       r"--preset verl$"):
        read_log(verl)
    with pytest.raises(LogError, match="2 reward weights for the 1 reward columns score"):
        read_log(verl, preset="verl", reward_weights=[1, 2])


def test_extra_columns_for_paired_scores(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("group,reward,judge\na,1,0.9\na,0,0.1\nb,1,nan\nb,0.5,0.4\nb,0.2,0.3\n",
                    encoding="utf-8")
    log = read_log(path, extra_cols=["judge"])
    assert flat(log) == [[1.0, 0.0], [0.5, 0.2]]
    assert log.extra["judge"].tolist() == [0.9, 0.1, 0.4, 0.3]
    assert log.n_singletons == 0


# --------------------------------------------------------------------------- arrays


def test_npz_layouts_and_columns(tmp_path):
    dense = np.arange(8.0).reshape(2, 4)
    np.savez(tmp_path / "d.npz", rewards=dense.astype(">f8"))  # big-endian: read natively
    assert flat(read_log(tmp_path / "d.npz")) == dense.tolist()
    np.savez(tmp_path / "o.npz", rewards=dense.ravel(), offsets=[0, 3, 8])
    assert flat(read_log(tmp_path / "o.npz")) == [[0, 1, 2], [3, 4, 5, 6, 7]]
    np.savez(tmp_path / "c.npz", score=dense.ravel(), uid=np.array(list("abababab")),
             judge=dense.ravel() * 2)
    log = read_log(tmp_path / "c.npz", group_cols=["uid"], reward_cols=["score"],
                   extra_cols=["judge"])
    assert flat(log) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert log.extra["judge"].tolist() == [0, 4, 8, 12, 2, 6, 10, 14]


def test_structured_npy_and_compressed_npz(tmp_path):
    arr = np.zeros(6, dtype=[("uid", "i8"), ("score", "f8")])
    arr["uid"] = [5, 5, 9, 9, 9, 5]
    arr["score"] = [0.1, 0.2, np.nan, 0.4, 0.5, 0.6]
    np.save(tmp_path / "s.npy", arr)
    log = read_log(tmp_path / "s.npy", group_cols=["uid"], reward_cols=["score"])
    assert flat(log) == [[0.1, 0.2, 0.6], [0.4, 0.5]]
    assert log.bad_rows.examples == ((3, "empty or NaN value in column 'score'"),)
    np.savez(tmp_path / "d.npz", rewards=np.eye(3))
    gz = tmp_path / "d.npz.gz"
    gz.write_bytes(gzip.compress((tmp_path / "d.npz").read_bytes()))
    assert flat(read_log(gz)) == np.eye(3).tolist()


def zip_bomb(path: Path, declared: int, name: str = "rewards.npy") -> Path:
    """A small zip whose member claims (and would inflate to) ``declared`` bytes."""
    chunk = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = chunk.compress(b"\0" * (1 << 20)) + chunk.flush(zlib.Z_FULL_FLUSH)
    data = body * 1024 + chunk.flush()  # about 1 MB inflating to 1 GiB per MB of chunk
    crc, size = 0, declared
    name_b = name.encode()
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, len(data), size,
                        len(name_b), 0) + name_b
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc,
                          len(data), size, len(name_b), 0, 0, 0, 0, 0, 0) + name_b
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central),
                      len(local) + len(data), 0)
    path.write_bytes(local + data + central + end)
    return path


def npy_bytes(header: dict, payload: bytes = b"") -> bytes:
    text = repr(header).encode()
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + payload


def npz_with(path: Path, member: bytes, name: str = "rewards.npy") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(name, member)
    return path


@pytest.mark.parametrize("case, message", [
    ("bomb", "decompress to 4,000,000,000 bytes, over the limit"),
    ("headerless", "member 'rewards' is not a .npy array"),
    ("truncated", "member 'rewards' is truncated"),
    ("huge", "member 'rewards' has shape (1099511627776,)"),
    ("object", "holds Python objects, which are never loaded"),
    ("corrupt", "cannot read as .npz"),
])
def test_malformed_arrays_are_refused_before_reading(tmp_path, case, message):
    path = tmp_path / "x.npz"
    if case == "bomb":
        zip_bomb(path, 4_000_000_000)
    elif case == "headerless":
        npz_with(path, np.arange(8.0).tobytes())
    elif case == "truncated":
        npz_with(path, npy_bytes({"descr": "<f8", "fortran_order": False, "shape": (100,)},
                                 b"\0" * 80))
    elif case == "huge":
        npz_with(path, npy_bytes({"descr": "<f8", "fortran_order": False,
                                  "shape": (2 ** 40,)}, b"\0" * 80))
    elif case == "object":
        np.savez(path, rewards=np.array([1.0, 0.0]), group_ids=np.array([{}, 2], object))
    else:
        path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(LogError) as err:
        read_log(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_npy_read_as_npz_names_the_right_format(tmp_path):
    np.save(tmp_path / "r.npy", np.eye(2))
    with pytest.raises(LogError, match=r"the content is a \.npy file, not \.npz \(drop "
                                       r"--format, or pass --format npy\)"):
        read_log(tmp_path / "r.npy", format="npz")
    assert flat(read_log(tmp_path / "r.npy", format="npy")) == np.eye(2).tolist()


# --------------------------------------------------------------------------- JSON hazards


@pytest.mark.parametrize("value", ["1" + "0" * 400, "1" + "0" * 5000, "[" * 100_000 + "]" * 100_000,
                                   "[" * 100_000])
def test_json_hazards_are_bad_rows(tmp_path, value):
    path = tmp_path / "h.jsonl"
    good = "".join(json.dumps({"group": "a", "reward": r}) + "\n" for r in (0.0, 1.0))
    path.write_text(good + '{"group": "a", "reward": ' + value + "}\n" + good,
                    encoding="utf-8")
    log = read_log(path)
    assert flat(log) == [[0.0, 1.0, 0.0, 1.0]]
    assert log.bad_rows.count == 1 and log.bad_rows.examples[0][0] == 3


def test_deep_nesting_in_another_field_is_fine(tmp_path):
    path = tmp_path / "h.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text('{"group": "a", "reward": 1, "x": ' + deep + '}\n'
                    '{"group": "a", "reward": 0, "x": 1}\n', encoding="utf-8")
    assert flat(read_log(path)) == [[1.0, 0.0]]


# --------------------------------------------------------------------------- read_columns

LABELS = [1, "1", "hard", True, 2.5, 1, "hard"]  # JSON's 1, "1", true and 2.5 all differ


def judge_table(n: int = 7) -> dict[str, list]:
    return {"judge": [0.1 * i for i in range(n)], "reference": [0.05 * i for i in range(n)]}


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "npz", "csv"])
def test_read_columns_labels_keep_their_type(tmp_path, kind):
    cols = judge_table()
    if kind.startswith("jsonl"):
        rows = [{"prompt": "p", **{k: v[i] for k, v in cols.items()}, "cat": LABELS[i]}
                for i in range(7)]
        path = tmp_path / f"j.{kind}"
        if kind == "jsonl.zst":
            write_jsonl(tmp_path / "j.jsonl", rows)
            with pa.CompressedOutputStream(str(path), "zstd") as out:
                out.write((tmp_path / "j.jsonl").read_bytes())
        else:
            write_jsonl(path, rows, gzip.open if kind.endswith("gz") else open)
        expected = LABELS
    elif kind == "parquet":  # a typed column: integers stay integers, floats floats
        path = tmp_path / "j.parquet"
        pq.write_table(pa.table({**cols, "cat": [3, 1, 3, 2, 1, 1, 2],
                                 "f": [0.5, 1.0, 0.5, 2.0, 1.0, 1.0, 2.0]}), path)
        expected = [3, 1, 3, 2, 1, 1, 2]
    elif kind == "npz":
        path = tmp_path / "j.npz"
        np.savez(path, judge=cols["judge"], reference=cols["reference"],
                 cat=np.array(["b", "a", "b", "é", "a", "a", "é"]),
                 raw=np.array([b"b", b"a", b"b", b"c", b"a", b"a", b"c"]),
                 ints=np.array([5, -1, 5, 0, -1, -1, 0], np.int16))
        expected = ["b", "a", "b", "é", "a", "a", "é"]
    else:  # CSV has no types: every label is the text of its cell
        path = tmp_path / "j.csv"
        path.write_text("judge,reference,cat\n" + "".join(
            f"{cols['judge'][i]!r},{cols['reference'][i]!r},{LABELS[i]}\n" for i in range(7)),
            encoding="utf-8")
        expected = [str(c) for c in LABELS]
    log = read_columns(path, ["judge", "reference"], label_col="cat")
    assert log.labels == expected
    assert [type(c) for c in log.labels] == [type(c) for c in expected]
    assert log.columns["judge"].tolist() == cols["judge"]  # file order: no grouping
    assert log.columns["reference"].tolist() == cols["reference"]
    assert log.bad_rows.count == 0 and log.label_col == "cat"
    if kind == "parquet":
        floats = read_columns(path, "judge", label_col="f").labels
        assert floats == [0.5, 1.0, 0.5, 2.0, 1.0, 1.0, 2.0]
        assert all(type(c) is float for c in floats)
    if kind == "npz":
        assert read_columns(path, "judge", label_col="raw").labels == list("babcaac")
        assert read_columns(path, "judge", label_col="ints").labels == [5, -1, 5, 0, -1, -1, 0]
    assert read_columns(path, ["reference"]).labels is None


def test_read_columns_across_blocks_keeps_types_and_order(tmp_path, monkeypatch):
    # small blocks: pyarrow parses the integer blocks, the mixed ones go line by line
    from advcal.io import _common

    monkeypatch.setattr(_common, "_BLOCK", 4096)
    rng = np.random.default_rng(3)
    n = 4000
    labels: list = [int(c) for c in rng.integers(0, 5, n)]
    labels[3000:3010] = ["2"] * 10  # a string "2" among the integers 2
    judge = np.round(rng.random(n), 4)
    lines = [json.dumps({"judge": float(j), "cat": c}) for j, c in zip(judge, labels,
                                                                       strict=True)]
    lines[1234] = '{"judge": 0.5, "cat": 1'  # broken
    log = read_columns(write_jsonl(tmp_path / "big.jsonl", lines), "judge", label_col="cat")
    keep = np.arange(n) != 1234
    assert log.labels == [c for c, k in zip(labels, keep, strict=True) if k]
    assert log.columns["judge"].tolist() == judge[keep].tolist()
    assert log.bad_rows.count == 1 and log.bad_rows.examples[0][0] == 1235


def test_read_columns_bad_rows(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text(
        '{"judge": 0.5, "reference": 0.4, "cat": "a"}\n'
        '{"judge": "", "reference": 0.4, "cat": "a"}\n'        # 2: empty value
        '{"judge": "high", "reference": 0.4, "cat": "a"}\n'    # 3: not a number
        '{"judge": true, "reference": 0.4, "cat": "a"}\n'      # 4: not a number
        '{"judge": 0.5, "reference": Infinity, "cat": "a"}\n'  # 5: infinite
        '{"judge": 0.5, "reference": 0.4, "cat": ""}\n'        # 6: empty label
        '{"judge": 0.5, "reference": 0.4, "cat": null}\n'      # 7: no label
        '{"judge": 0.5, "reference": 0.4, "cat": [1]}\n'       # 8: not a scalar
        '{"judge": 0.5, "reference": 0.4, "cat": NaN}\n'       # 9: NaN label
        '{"judge": 0.5, "reference": 0.4}\n'                   # 10: no label at all
        '[1, 2]\n'                                             # 11: not an object
        '{"judge": 0.25, "reference": "0.5", "cat": 7}\n', encoding="utf-8")
    log = read_columns(path, ["judge", "reference"], label_col="cat")
    assert log.labels == ["a", 7] and log.columns["reference"].tolist() == [0.4, 0.5]
    assert log.bad_rows.count == 10 and log.bad_rows.unit == "line"
    assert log.bad_rows.examples == (
        (2, "empty or NaN value in column 'judge'"), (3, "'judge' value 'high' is not a number"),
        (4, "'judge' value true is not a number"),
        (5, "'reference' value inf is not a finite number"), (6, "empty label in column 'cat'"))
    with pytest.raises(LogError, match=r"^line 2: empty or NaN value in column 'judge'$"):
        read_columns(path, ["judge", "reference"], label_col="cat", on_bad_row="error")
    only_bad = tmp_path / "bad.csv"
    only_bad.write_text("judge,reference,cat\n0.5,,a\n0.5,0.1,\n0.5,0.1,a,extra\n",
                        encoding="utf-8")
    with pytest.raises(LogError, match=r"^no valid rows: skipped 3 bad lines \(line 2: empty "
                                       r"or NaN value in column 'reference'; line 3: empty "
                                       r"label in column 'cat'; line 4: 4 fields, expected 3\)$"):
        read_columns(only_bad, ["judge", "reference"], label_col="cat")
    table = pa.table({"judge": [0.5, None, 0.5], "cat": ["a", "b", None]})
    pq.write_table(table, tmp_path / "j.parquet")
    log = read_columns(tmp_path / "j.parquet", "judge", label_col="cat")
    assert log.labels == ["a"] and log.bad_rows.unit == "row"
    assert log.bad_rows.summary() == ("skipped 2 bad rows (row 2: empty or NaN value in "
                                      "column 'judge'; row 3: empty label in column 'cat')")


def test_read_columns_missing_columns_and_arrays(tmp_path):
    (tmp_path / "j.csv").write_text("judge,reference\n0.5,0.4\n", encoding="utf-8")
    with pytest.raises(LogError, match=r"^no column 'cat' \(found: judge, reference\)$"):
        read_columns(tmp_path / "j.csv", ["judge", "reference"], label_col="cat")
    with pytest.raises(LogError, match=r"^no column 'sigma'"):
        read_columns(tmp_path / "j.csv", ["judge", "sigma"])
    np.savez(tmp_path / "a.npz", judge=np.ones(3), wide=np.ones((3, 2)), cat=np.arange(4),
             f=np.ones(3))
    with pytest.raises(LogError, match=r"^no array 'reference' \(found: judge, wide, cat, f\)$"):
        read_columns(tmp_path / "a.npz", ["judge", "reference"])
    with pytest.raises(LogError, match=r"^array 'wide' must hold numbers in 1 dimension; "
                                       r"got 2-D float64$"):
        read_columns(tmp_path / "a.npz", ["judge", "wide"])
    with pytest.raises(LogError, match=r"^array 'cat' must be 1-D with one label per row \(3\)"):
        read_columns(tmp_path / "a.npz", "judge", label_col="cat")
    with pytest.raises(LogError, match=r"^labels must be integers or strings; got float64$"):
        read_columns(tmp_path / "a.npz", "judge", label_col="f")
    with pytest.raises(LogError, match="on_bad_row must be 'skip' or 'error'"):
        read_columns(tmp_path / "j.csv", "judge", on_bad_row="ignore")
    with pytest.raises(LogError, match="no numeric column named"):
        read_columns(tmp_path / "j.csv", [])


# --------------------------------------------------------------------------- detection


def test_detection_from_content(tmp_path):
    (tmp_path / "log.txt").write_text('{"group": 1, "reward": 0}\n', encoding="utf-8")
    assert detect_format(tmp_path / "log.txt") == ("jsonl", None)
    (tmp_path / "a.data").write_bytes(gzip.compress(b"group,reward\na,1\n"))
    assert detect_format(tmp_path / "a.data") == ("csv", "gzip")
    (tmp_path / "p.csv").write_bytes(b"PAR1\0\0")
    with pytest.raises(LogError, match="the extension says CSV, but the content is a "
                                       "Parquet file"):
        detect_format(tmp_path / "p.csv")
    (tmp_path / "b.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(LogError, match="cannot decompress"):
        read_log(tmp_path / "b.gz")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 then nothing PAR1")
    with pytest.raises(LogError, match="cannot read as Parquet"):
        read_log(tmp_path / "bad.parquet")


def test_presets_are_documented_choices():
    assert set(PRESETS) == {"verl", "trl"}
    assert PRESETS["verl"].reward_cols == ("score",)
    assert PRESETS["trl"].fits(["step", "prompt", "completion", "r1", "advantage"])
    assert not PRESETS["verl"].fits(["prompt", "r1"])


@pytest.mark.parametrize("kind", ["int64", "int32", "int8", "uint64", "bool"])
def test_integer_group_ids_are_encoded_as_their_text_would_be(kind):
    # Only the distinct values are written as text; the keys and their order are those
    # of encoding every value's text.
    import pyarrow.compute as pc

    from advcal.io._digest import _key_type, _keys_arrow

    rng = np.random.default_rng(7)
    typ = getattr(pa, kind if kind != "bool" else "bool_")()
    for _ in range(30):
        n = int(rng.integers(0, 60))
        values = rng.integers(-4, 4, n)
        if kind == "bool":
            values = values > 0
        elif kind == "uint64":
            values = np.iinfo(np.uint64).max - np.abs(values).astype(np.uint64)
        elif kind == "int64":
            values = np.where(values == 3, np.iinfo(np.int64).min, values)
        array = pa.array(values, typ, mask=rng.random(n) < 0.2)
        tag = "bool" if kind == "bool" else "int"
        text = pc.binary_join_element_wise(f"\x00{tag}:", array.cast(pa.string()), "")
        expected = pc.dictionary_encode(text).cast(_key_type())
        got = _keys_arrow(pa.chunked_array([array[: n // 2], array[n // 2:]], typ))
        assert got.type == expected.type
        assert got.indices.equals(expected.indices)
        assert got.dictionary.equals(expected.dictionary)
