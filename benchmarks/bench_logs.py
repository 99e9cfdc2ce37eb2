"""``advcal diagnose`` end to end on 10-million-row logs, against pyarrow's raw read and a
polars read plus group_by.

Three files are generated in a temporary folder: a verl rollout dump (JSON Lines:
``input``, ``output``, ``gts``, ``score``, ``step``; groups of 8 responses per prompt) and
a TRL completion log (``step``, ``prompt``, ``completion``, two reward-function columns,
``advantage``) as CSV and as Parquet.  Each command runs in a fresh process, which reports
its wall time and peak resident memory; the ratios are to pyarrow reading the same file
whole (every column, its threads), and to polars reading it and summing the rewards per
group (where polars is installed: ``make bench`` installs it).

Target (issue 15): each diagnose at most 10 s and 1.5 GB peak RSS on the 2-core machine.
``--quick`` uses 10**6 rows.  Run alone: ``python -m benchmarks --only diagnose``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import Case, process_env

_GROUP = 8
_CHUNK = 1 << 20


def write_verl_jsonl(path: Path, rows: int, seed: int = 0) -> None:
    """A verl rollout dump of ``rows`` responses, groups of 8 consecutive ones."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for lo in range(0, rows, _CHUNK):
            hi = min(rows, lo + _CHUNK)
            prompt = np.arange(lo, hi) // _GROUP
            score = np.round(rng.random(hi - lo), 3)
            answer = rng.integers(0, 100, hi - lo)
            f.write("".join(
                f'{{"input": "Q{p} {p % 97}+{p % 89}", "output": "{a}", "gts": '
                f'"{p % 97 + p % 89}", "score": {s}, "step": 1}}\n'
                for p, a, s in zip(prompt.tolist(), answer.tolist(), score.tolist(),
                                   strict=True)))


def write_trl_csv(path: Path, rows: int, seed: int = 0) -> None:
    """A TRL completion log of ``rows`` completions, groups of 8 consecutive ones."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    with pa.OSFile(str(path), "wb") as sink:
        writer = None
        for lo in range(0, rows, _CHUNK):
            hi = min(rows, lo + _CHUNK)
            prompt = np.arange(lo, hi) // _GROUP
            fmt = np.round(rng.random(hi - lo), 2)
            fmt[rng.random(hi - lo) < 0.05] = np.nan  # a reward function returned None
            table = pa.table({
                "step": np.full(hi - lo, 3),
                "prompt": pa.array([f"Solve {p}" for p in prompt.tolist()]),
                "completion": pa.array([f"a{a}" for a in
                                        rng.integers(0, 100, hi - lo).tolist()]),
                "accuracy_reward": rng.integers(0, 2, hi - lo).astype(np.float64),
                "format_reward": fmt,
                "advantage": np.round(rng.normal(size=hi - lo), 3),
            })
            if writer is None:
                writer = pcsv.CSVWriter(sink, table.schema)
            writer.write_table(table)
        if writer is not None:
            writer.close()


_MEASURE = """
import resource, sys, time
start = time.perf_counter()
{code}
wall = time.perf_counter() - start
use = resource.getrusage(resource.RUSAGE_SELF)
# VmHWM, not ru_maxrss: the latter keeps the high-water mark of the parent at the fork
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
            if line.startswith("VmHWM:"))
print(wall, use.ru_utime + use.ru_stime, peak, file=sys.stderr)
"""


def measure(code: str) -> tuple[float, float, int]:
    """Wall time and CPU time (s, after the interpreter started) and peak RSS (bytes) of
    ``code`` in a fresh process (CPU time is less sensitive to a busy shared machine)."""
    done = subprocess.run([sys.executable, "-c", _MEASURE.format(code=code)],
                          capture_output=True, text=True, check=True, env=process_env())
    wall, cpu, rss = done.stderr.strip().splitlines()[-1].split()
    return float(wall), float(cpu), int(rss)


def _diagnose(path: Path, preset: str) -> str:
    # TRL's log cannot tell reward functions from log_extra columns: they are named
    named = (["--reward-col", "accuracy_reward", "--reward-col", "format_reward"]
             if preset == "trl" else [])
    return ("import io, contextlib\nfrom advcal.cli import main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            f"    code = main(['diagnose', {str(path)!r}, '--preset', {preset!r}, "
            f"'--no-progress', *{named!r}])\n"
            "assert code == 0, code")


def _polars(path: Path, reader: str, keys: list[str], values: list[str]) -> str:
    """The polars peer: read the file, then sum each value column and count per group."""
    sums = ", ".join(f"pl.col({v!r}).sum()" for v in values)
    # CSV: the reward columns are floats (polars would infer text from a "nan" cell)
    typed = (f", schema_overrides={{v: pl.Float64 for v in {values!r}}}"
             if reader == "read_csv" else "")
    return (f"import polars as pl\ndf = pl.{reader}({str(path)!r}{typed})\n"
            f"g = df.group_by({keys!r}, maintain_order=True).agg({sums}, pl.len())")


def _report(quick: bool) -> list[str]:
    import importlib.util

    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    rows = 10**6 if quick else 10**7
    has_polars = importlib.util.find_spec("polars") is not None
    lines = []
    with tempfile.TemporaryDirectory(prefix="advcal-bench-") as folder:
        verl = Path(folder) / "1.jsonl"
        trl = Path(folder) / "completions.csv"
        parquet = Path(folder) / "completions_00003.parquet"
        start = time.perf_counter()
        write_verl_jsonl(verl, rows)
        write_trl_csv(trl, rows)
        pq.write_table(pcsv.read_csv(trl), parquet)  # TRL writes its log as Parquet
        lines.append(f"generated {rows:,} rows each in {time.perf_counter() - start:.0f} s: "
                     f"{verl.name} {os.path.getsize(verl) / 1e6:.0f} MB, "
                     f"{trl.name} {os.path.getsize(trl) / 1e6:.0f} MB, "
                     f"{parquet.name} {os.path.getsize(parquet) / 1e6:.0f} MB")
        # the first diagnose compiles nothing new, but warm the page cache and the kernels
        measure(_diagnose(trl, "trl") if quick else "import advcal.cli")
        trl_values = ["accuracy_reward", "format_reward"]
        for label, path, preset, raw, peer in (
            ("verl JSONL", verl, "verl",
             f"import pyarrow.json as pj\nt = pj.read_json({str(verl)!r})",
             _polars(verl, "read_ndjson", ["step", "input"], ["score"])),
            ("TRL CSV", trl, "trl",
             f"import pyarrow.csv as pc\nt = pc.read_csv({str(trl)!r})",
             _polars(trl, "read_csv", ["step", "prompt"], trl_values)),
            ("TRL Parquet", parquet, "trl",
             f"import pyarrow.parquet as pq\nt = pq.read_table({str(parquet)!r})",
             _polars(parquet, "read_parquet", ["step", "prompt"], trl_values)),
        ):
            raw_time, raw_cpu, raw_rss = measure(raw)
            time_, cpu, rss = measure(_diagnose(path, preset))
            lines.append(
                f"{label + ':':<13} diagnose --preset {preset:<5}{time_:7.2f} s "
                f"(cpu {cpu:6.2f} s) {rss / 2**30:5.2f} GiB peak RSS;  pyarrow raw read "
                f"{raw_time:6.2f} s {raw_rss / 2**30:5.2f} GiB: ratio "
                f"{time_ / raw_time:5.2f}x time, {rss / raw_rss:5.2f}x RSS")
            if has_polars:
                try:
                    pl_time, pl_cpu, pl_rss = measure(peer)
                except subprocess.CalledProcessError as exc:  # report it, time the others
                    why = (exc.stderr or "").strip().splitlines()[-1:] or ["no message"]
                    lines.append(f"{'':<13} polars failed: {why[0]}")
                    continue
                lines.append(
                    f"{'':<13} polars read + group_by {pl_time:6.2f} s (cpu {pl_cpu:6.2f} s) "
                    f"{pl_rss / 2**30:5.2f} GiB: ratio {time_ / pl_time:5.2f}x time, "
                    f"{rss / pl_rss:5.2f}x RSS")
        if not has_polars:
            lines.append("polars is not installed: its peer was skipped (make bench installs "
                         "it)")
        lines.append(f"load average during the runs: {os.getloadavg()[0]:.1f} "
                     f"on {os.cpu_count()} cores")
    return lines


def cases(quick: bool) -> list[Case]:
    size = "10**6" if quick else "10**7"
    return [Case(f"diagnose on {size}-row verl JSONL, TRL CSV and Parquet logs (fresh "
                 "processes)",
                 {}, "", target="<= 10 s and <= 1.5 GB peak RSS each, at 10**7 rows",
                 report=lambda: _report(quick))]
