"""The benchmark runner (``python -m benchmarks``) still runs: a smoke test of the table's
structure.  Nothing here depends on a timing: which candidate is faster, or which share
rounds with which, varies with the machine's load."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ROW = re.compile(r"  (.+?)\s+(\d+\.\d+) (s|ms|us|ns)\s+(\d+\.\d+)x (.+?)"
                 r"(?:   \(paired rounds: median (\d+\.\d+)x\))?")


def test_runner_prints_every_candidate_against_its_baseline():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "rloo"],
                            capture_output=True, text=True, cwd=ROOT, check=True, timeout=600)
    cases = [block.strip().splitlines() for block in result.stdout.split("\n\n")
             if block.strip()]
    assert [lines[0].split("   [")[0] for lines in cases] == [
        "rloo, dense 512 x 16, whole public call",
        "rloo, 2**12 float64 rewards, dense groups of 16",
        "rloo, 2**12 float64 rewards, ragged groups of 2..30",
    ]
    for _, *lines in cases:
        # the last line states the check of the peer against advcal, run before timing
        *rows, checked = lines
        assert checked.startswith("  checked before timing: numpy-vectorized peer = "
                                  "advcal.rloo within atol "), checked
        parsed = [ROW.fullmatch(line) for line in rows]
        assert all(parsed), rows
        labels = [m.group(1) for m in parsed]
        assert len(set(labels)) == len(labels) >= 2
        baseline = parsed[0].group(5)  # every row names the case's baseline, once a row
        assert {m.group(5) for m in parsed} == {baseline}
        assert baseline in labels
        assert [m.group(4) for m in parsed if m.group(1) == baseline] == ["1.00"]
        assert [m.group(6) for m in parsed if m.group(1) == baseline] == [None]
    assert {m.group(1) for m in map(ROW.fullmatch, cases[2][1:-1])} == {
        "numba kernel", "advcal.rloo public call", "numpy-vectorized peer", "memory copy"}
    # the baseline is the peer written in the benchmark, never advcal's numpy engine
    assert {m.group(5) for m in map(ROW.fullmatch, cases[2][1:-1])} == {
        "numpy-vectorized peer"}


def test_paired_ratio_is_the_median_of_same_round_ratios():
    from benchmarks import Rounds

    rounds = Rounds({"copy": [1.0, 2.0, 4.0], "kernel": [1.5, 2.0, 6.0], "peer": [9.0]},
                    [["copy", "kernel"], ["peer"]])
    assert rounds.best("kernel") == 1.5
    assert rounds.paired_ratio("kernel", "copy") == 1.5  # median of 1.5, 1.0, 1.5
    assert rounds.paired_ratio("copy", "kernel") == pytest.approx(2 / 3)  # 2/3, 1, 2/3
    assert rounds.paired_ratio("peer", "copy") is None


def test_no_benchmark_runs_advcals_numpy_engine():
    """The numpy engine is the tests' oracle: no benchmark times it, as a baseline or as a
    peer, so no ratio or target binds it (issue 27)."""
    import ast
    import glob

    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        name = os.path.basename(path)
        for node in ast.walk(tree):
            if (isinstance(node, ast.keyword) and node.arg == "backend"
                    and isinstance(node.value, ast.Constant) and node.value.value == "numpy"):
                found.append(f"{name}:{node.value.lineno}: backend='numpy'")
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            found += [f"{name}:{node.lineno}: imports {m}" for m in modules
                      if m.startswith("advcal._kernels.")
                      and (m.endswith("_numpy") or m.endswith("oracle_groups"))]
    assert found == []


def test_check_close_states_its_tolerance_and_refuses_other_work():
    from benchmarks import check_close

    line = check_close("peer = advcal.x", [1.0, 2.0 + 1e-13, float("nan")],
                       [1.0, 2.0, float("nan")], atol=1e-12, why="sums in another order")
    assert line == ("checked before timing: peer = advcal.x within atol 1e-12 "
                    "(sums in another order)")
    with pytest.raises(AssertionError, match="peer = advcal.x: the peer does not compute"):
        check_close("peer = advcal.x", [1.0, 2.1], [1.0, 2.0], atol=1e-12, why="")
    with pytest.raises(AssertionError):  # NaN only where advcal's is NaN
        check_close("peer = advcal.x", [1.0, float("nan")], [1.0, 2.0], atol=1.0, why="")


@pytest.mark.parametrize("quick", [True, False])
def test_listing_the_cases_runs_nothing_costly(monkeypatch, quick):
    """``--only`` lists every module's cases: no case may start processes (the memory and
    start-up notes) or train a model to be listed, so that a run of other benchmarks
    neither pays for it nor fails with it; that work waits for ``Case.build``."""
    import importlib
    import pkgutil

    import benchmarks

    def refuse(*args, **kwargs):
        raise AssertionError(f"a fresh process while listing the cases: {args[:1]}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)
                   if m.name.startswith("bench_"))
    if not quick:  # the full sizes of the others only allocate their inputs
        names = [name for name in names if name in ("bench_estimators", "bench_resolution",
                                                    "bench_gram")]
    for name in names:
        for case in importlib.import_module(f"benchmarks.{name}").cases(quick):
            assert case.name and (case.candidates or case.build or case.report), case.name
