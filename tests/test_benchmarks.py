"""The benchmark runner (``python -m benchmarks``) still runs: a smoke test, not a timing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_runner_prints_every_candidate_against_its_baseline():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "rloo"],
                            capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
    cases = [block.strip().splitlines() for block in result.stdout.split("\n\n")
             if block.strip()]
    assert [lines[0].split("   [")[0] for lines in cases] == [
        "rloo, dense 512 x 16, whole public call",
        "rloo, 2**16 float64 rewards, dense groups of 16",
        "rloo, 2**16 float64 rewards, ragged groups of 2..30",
    ]
    row = re.compile(r"  (.+?)\s+(\d+\.\d+) (s|ms|us|ns)\s+(\d+\.\d+)x (.+)")
    for _, *rows in cases:
        parsed = [row.fullmatch(line) for line in rows]
        assert all(parsed), rows
        baseline = parsed[0].group(5)  # every row names the case's baseline
        assert {match.group(5) for match in parsed} == {baseline}
        assert [m.group(4) for m in parsed if m.group(1) == baseline] == ["1.00"]
