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
    for _, *rows in cases:
        parsed = [ROW.fullmatch(line) for line in rows]
        assert all(parsed), rows
        labels = [m.group(1) for m in parsed]
        assert len(set(labels)) == len(labels) >= 2
        baseline = parsed[0].group(5)  # every row names the case's baseline, once a row
        assert {m.group(5) for m in parsed} == {baseline}
        assert baseline in labels
        assert [m.group(4) for m in parsed if m.group(1) == baseline] == ["1.00"]
        assert [m.group(6) for m in parsed if m.group(1) == baseline] == [None]
    assert {m.group(1) for m in map(ROW.fullmatch, cases[2][1:])} == {
        "numpy reference engine", "numba kernel", "advcal.rloo public call",
        "numpy-vectorized peer", "memory copy"}


def test_paired_ratio_is_the_median_of_same_round_ratios():
    from benchmarks import Rounds

    rounds = Rounds({"copy": [1.0, 2.0, 4.0], "kernel": [1.5, 2.0, 6.0], "peer": [9.0]},
                    [["copy", "kernel"], ["peer"]])
    assert rounds.best("kernel") == 1.5
    assert rounds.paired_ratio("kernel", "copy") == 1.5  # median of 1.5, 1.0, 1.5
    assert rounds.paired_ratio("copy", "kernel") == pytest.approx(2 / 3)  # 2/3, 1, 2/3
    assert rounds.paired_ratio("peer", "copy") is None
