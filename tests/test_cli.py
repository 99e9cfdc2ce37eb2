"""The ``advcal`` command line end to end: ``demo`` and ``diagnose`` on files the tests
write, good and bad, in-process through ``main`` and once through the installed script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from advcal import scale_diagnostics
from advcal.cli import demo_diagnostics, main

GROUPS = ["p1"] * 4 + ["p2"] * 4 + ["p3"] * 3
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.7, 0.7001, 0.7, 0.6999, 0.5, 0.5, 0.5]
SECOND = [0.9, 0.1, 1.0, 0.0, 0.7, 0.7, 0.7, 0.7, 0.5, 0.6, 0.5]


def write_csv(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def good_csv(tmp_path: Path) -> Path:
    rows = [f"{g},{r},{s}" for g, r, s in zip(GROUPS, REWARDS, SECOND, strict=True)]
    return write_csv(tmp_path / "log.csv", "group,reward,judge", rows)


def expected_table(**kw) -> str:
    return scale_diagnostics(np.array(REWARDS), group_ids=GROUPS, **kw).table()


def run_ok(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""
    return captured.out


def run_bad(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("advcal diagnose: error: ")
    return captured.err


# --------------------------------------------------------------------------- demo


def test_demo_prints_the_scale_table_and_the_paper_finding(capsys):
    out = run_ok(capsys, ["demo"])
    assert "maxnorm" in out
    diag = demo_diagnostics(0)
    assert diag.table() in out
    p99 = diag["grpo"].inverse_scale_p99
    assert f"GRPO's inverse-scale P99 is {p99:.0f}" in out
    # orders of magnitude above the cap 1/tau_res = 100, which MaxNorm never exceeds
    assert p99 >= 1000 and diag["maxnorm"].inverse_scale_max <= 100
    assert "With the Reward-Resolution Protocol (resolution 0.01), MaxNorm skips" in out


# --------------------------------------------------------------------------- good files


def test_diagnose_csv(capsys, tmp_path):
    out = run_ok(capsys, ["diagnose", str(good_csv(tmp_path))])
    assert expected_table() in out
    assert "cosine" not in out


def test_diagnose_csv_with_byte_order_mark(capsys, tmp_path):
    path = good_csv(tmp_path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as spreadsheet programs save
    assert expected_table() in run_ok(capsys, ["diagnose", str(path)])


def test_diagnose_csv_second_scoring_and_options(capsys, tmp_path):
    path = good_csv(tmp_path)
    out = run_ok(capsys, ["diagnose", str(path), "--second-col", "judge", "--tau-res", "0.02",
                          "--beta", "0.1", "--eps", "1e-4", "--methods", "maxnorm,dr_grpo"])
    table = expected_table(reference=np.array(SECOND), tau_res=0.02, beta=0.1, eps=1e-4,
                           methods=("maxnorm", "dr_grpo"))
    assert table in out
    assert "cosine" in out.splitlines()[2]


def test_diagnose_csv_custom_columns_and_resolution(capsys, tmp_path):
    rows = [f"{r};{g}" for g, r in zip(GROUPS, REWARDS, strict=True)]
    path = tmp_path / "log.txt"
    path.write_text("\n".join(["score;uid", *rows]) + "\n", encoding="utf-8")
    # the semicolon file is not a CSV of these columns: a clear error
    err = run_bad(capsys, ["diagnose", str(path), "--format", "csv", "--group-col", "uid",
                           "--reward-col", "score"])
    assert "no column 'uid'" in err
    rows = [f"{r},{g}" for g, r in zip(GROUPS, REWARDS, strict=True)]
    write_csv(path, "score,uid", rows)
    out = run_ok(capsys, ["diagnose", str(path), "--format", "csv", "--group-col", "uid",
                          "--reward-col", "score", "--resolution", "0.01"])
    assert expected_table(resolution=0.01) in out


def test_diagnose_jsonl(capsys, tmp_path):
    path = tmp_path / "log.jsonl"
    lines = [json.dumps({"prompt": i // 4, "reward": r, "meta": {"x": 1}})
             for i, r in enumerate(REWARDS)]
    lines.insert(3, "")  # blank lines are allowed
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = run_ok(capsys, ["diagnose", str(path), "--group-col", "prompt"])
    ids = [i // 4 for i in range(len(REWARDS))]
    assert scale_diagnostics(np.array(REWARDS), group_ids=ids).table() in out


def test_jsonl_group_ids_are_told_apart_by_their_json_text(capsys, tmp_path):
    # Python would merge 1, 1.0 and true into one group; JSON keeps them apart
    path = tmp_path / "ids.jsonl"
    ids = [1, 1, 1.0, 1.0, True, True, "1", "1"]
    rewards = [0.0, 1.0, 0.2, 0.4, 0.5, 0.5, 0.3, 0.9]
    path.write_text("".join(json.dumps({"group": g, "reward": r}) + "\n"
                            for g, r in zip(ids, rewards, strict=True)), encoding="utf-8")
    out = run_ok(capsys, ["diagnose", str(path)])
    offsets = [0, 2, 4, 6, 8]
    assert scale_diagnostics(np.array(rewards), offsets).table() in out
    assert "4 groups with >= 2 responses" in out


@pytest.mark.parametrize("layout", ["dense", "offsets", "group_ids"])
def test_diagnose_npz(capsys, tmp_path, layout):
    dense = np.array(REWARDS[:8]).reshape(2, 4)
    second = np.array(SECOND[:8]).reshape(2, 4)
    path = tmp_path / "log.npz"
    if layout == "dense":
        np.savez(path, rewards=dense, second=second)
    elif layout == "offsets":
        np.savez(path, rewards=dense.ravel(), offsets=[0, 4, 8], second=second.ravel())
    else:
        np.savez(path, rewards=dense.ravel(), group_ids=np.array(GROUPS[:8]),
                 second=second.ravel())
    out = run_ok(capsys, ["diagnose", str(path)])
    assert scale_diagnostics(dense, reference=second).table() in out


# --------------------------------------------------------------------------- bad files


def test_bad_files(capsys, tmp_path):
    cases = {
        "missing.csv": (None, "no such file"),
        "log.parquet": ("x", "unknown file extension '.parquet'"),
        "empty.csv": ("", "empty file (no header row)"),
        "header.csv": ("group,reward\n", "no rows"),
        "nocol.csv": ("group,score\na,1\n", "no column 'reward' (columns: group, score)"),
        "text.csv": ("group,reward\na,1\na,high\n", "line 3: 'reward' value 'high' is not a "
                     "number"),
        "nan.csv": ("group,reward\na,1\na,nan\n", "line 3: 'reward' value 'nan' is not a "
                    "finite number"),
        "blank.csv": ("group,reward\na,1\na,\n", "line 3: empty value in column 'reward'"),
        "short.csv": ("group,reward\na,1\nb\n", "line 3: empty value in column 'reward'"),
        "bad.jsonl": ('{"group": 1, "reward": 0.5}\n{"group": 1,\n', "line 2: not valid JSON"),
        "list.jsonl": ("[1, 0.5]\n", "line 1: expected a JSON object, got list"),
        "str.jsonl": ('{"group": 1, "reward": "0.5x"}\n',
                      "line 1: 'reward' value '0.5x' is not a number"),
        "null.jsonl": ('{"group": 1, "reward": null}\n', "line 1: empty value in column"),
        "bool.jsonl": ('{"group": 1, "reward": true}\n', "line 1: 'reward' value true is not"),
        "gid.jsonl": ('{"group": [1], "reward": 1}\n', "line 1: group id [1] is not a scalar"),
        "nokey.jsonl": ('{"group": 1}\n', "line 1: no column 'reward' (columns: group)"),
        "empty.jsonl": ("\n\n", "no rows"),
        "single.csv": ("group,reward\na,1\nb,0\n", "no group with two or more responses"),
        "corrupt.npz": ("not a zip", "cannot read as .npz"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(content, encoding="utf-8")
        err = run_bad(capsys, ["diagnose", str(path)])
        assert message in err, (name, err)


def test_bad_binary_and_npz_contents(capsys, tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes(b"group,reward\n\xff\xfe,1\n")
    assert "not a UTF-8 text file" in run_bad(capsys, ["diagnose", str(path)])
    path = tmp_path / "nokey.npz"
    np.savez(path, scores=np.ones(3))
    assert "no array 'rewards' (arrays: scores)" in run_bad(capsys, ["diagnose", str(path)])
    path = tmp_path / "object.npz"
    np.savez(path, rewards=np.array([1.0, 0.0]), group_ids=np.array([{"a": 1}, 2],
                                                                    dtype=object))
    assert "cannot read as .npz" in run_bad(capsys, ["diagnose", str(path)])
    path = tmp_path / "nooffsets.npz"
    np.savez(path, rewards=np.array([1.0, 0.0]))
    assert "need exactly one of `offsets` or `group_ids`" in run_bad(
        capsys, ["diagnose", str(path)])
    path = tmp_path / "second.npz"
    np.savez(path, rewards=np.ones((2, 2)))
    assert "no array 'judge'" in run_bad(capsys, ["diagnose", str(path), "--second-col",
                                                  "judge"])
    assert "not a regular file" in run_bad(capsys, ["diagnose", str(tmp_path), "--format",
                                                    "csv"])


def test_bad_options_are_one_line_errors(capsys, tmp_path):
    path = str(good_csv(tmp_path))
    assert "`methods` must be one of" in run_bad(capsys, ["diagnose", path, "--methods",
                                                          "grpo,ppo"])
    assert "`tau_res` must lie in" in run_bad(capsys, ["diagnose", path, "--tau-res", "0"])
    assert "`rewards` must lie in `bounds`" not in run_ok(capsys, ["diagnose", path])
    bad = write_csv(tmp_path / "big.csv", "group,reward", ["a,2", "a,0"])
    assert "`rewards` must lie in `bounds`" in run_bad(
        capsys, ["diagnose", str(bad), "--resolution", "0.1"])
    with pytest.raises(SystemExit) as exc:  # argparse's own usage error, exit code 2
        main(["diagnose", path, "--tau-res", "abc"])
    assert exc.value.code == 2
    capsys.readouterr()


bad_cells = st.one_of(st.sampled_from(["", "nan", "-inf", "1e999", "x", "a,b", '"', "true"]),
                      st.text(max_size=6))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(groups=st.lists(st.sampled_from(["1", "2"]), max_size=10),
       data=st.data(), corrupt=st.booleans(), raw=st.binary(max_size=40),
       kind=st.sampled_from(["csv", "csv", "jsonl", "jsonl", "npz", "bytes"]))
def test_any_file_gives_a_table_or_one_error_line(capsys, tmp_path, groups, data, corrupt,
                                                  raw, kind):
    rows = [[g, repr(data.draw(st.floats(-10, 10)))] for g in groups]
    if corrupt and rows:
        row = data.draw(st.sampled_from(rows))
        row[data.draw(st.integers(0, 1))] = data.draw(bad_cells)
    path = tmp_path / f"fuzz.{'csv' if kind in ('csv', 'bytes') else kind}"
    if kind == "csv":
        path.write_text("\n".join(["group,reward"] + [f"{g},{r}" for g, r in rows]),
                        encoding="utf-8")
    elif kind == "jsonl":
        path.write_text("\n".join(f'{{"group": {g}, "reward": {r}}}' for g, r in rows),
                        encoding="utf-8")
    else:
        path.write_bytes(raw)
    code = main(["diagnose", str(path)])
    captured = capsys.readouterr()
    event(f"exit {code}")
    assert code in (0, 2)
    if code == 2:
        assert captured.out == "" and captured.err.count("\n") == 1
    else:
        assert "method" in captured.out and captured.err == ""


# --------------------------------------------------------------------------- plot


def test_plot_writes_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "scales.png"
    out = run_ok(capsys, ["diagnose", str(good_csv(tmp_path)), "--plot", str(png)])
    assert f"inverse-scale plot written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = run_bad(capsys, ["diagnose", str(good_csv(tmp_path)), "--plot",
                           str(tmp_path / "no" / "such" / "dir.png")])
    assert "cannot write the plot" in err and "no such directory" in err


def test_plot_without_matplotlib_is_a_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    err = run_bad(capsys, ["diagnose", str(good_csv(tmp_path)), "--plot",
                           str(tmp_path / "x.png")])
    assert "--plot needs matplotlib, which is not installed" in err
    assert not (tmp_path / "x.png").exists()


# --------------------------------------------------------------------------- installed script


def test_installed_console_script(tmp_path):
    script = Path(sys.executable).with_name("advcal")
    if not script.exists():
        pytest.skip("the advcal console script is not installed next to this interpreter")
    ok = subprocess.run([str(script), "diagnose", str(good_csv(tmp_path))],
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert expected_table() in ok.stdout
    bad = subprocess.run([str(script), "diagnose", str(tmp_path / "missing.jsonl")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.strip().endswith("no such file")
    assert bad.stderr.count("\n") == 1
