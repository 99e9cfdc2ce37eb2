"""Run every benchmark case and print times and ratios (see ``benchmarks/__init__.py``)."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil

# Before numpy is first imported (``benchmarks/__init__.py`` imports it lazily): one BLAS
# thread, so that a numpy peer's batched linear algebra is not timed against BLAS's pool
# contending for a shared machine's cores.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import benchmarks  # noqa: E402
from benchmarks import Rounds, round_times  # noqa: E402


def _format_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:8.2f} {unit}"
    return f"{seconds / 1e-9:8.1f} ns"


def _format_ratio(ratio: float) -> str:
    # small ratios (a memory copy against a numpy peer) keep two significant digits
    return f"{ratio:7.2f}" if ratio >= 0.1 else f"{ratio:7.4f}"


def table(rounds: Rounds, labels: list[str], baseline: str) -> list[str]:
    """One row per candidate: best time, ratio to the baseline's best, paired median."""
    base = rounds.best(baseline)
    lines = []
    for label in labels:
        best = rounds.best(label)
        row = f"{label:<38}{_format_time(best)}   {_format_ratio(best / base)}x {baseline}"
        paired = rounds.paired_ratio(label, baseline)
        if paired is not None and label != baseline:
            row += f"   (paired rounds: median {_format_ratio(paired).strip()}x)"
        lines.append(row)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    args = parser.parse_args()
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda m: m.name):
        if not info.name.startswith("bench_"):
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        for case in module.cases(args.quick):
            if args.only not in case.name:
                continue
            if case.build is not None:
                case = case.build()
            # before any timing: a peer that computes something else fails the run
            checked = [case.check()] if case.check is not None else []
            if case.report is not None:
                print(f"\n{case.name}" + (f"   [target: {case.target}]" if case.target else ""))
                for line in case.report() + checked:
                    print(f"  {line}")
                continue
            rounds = round_times(case.candidates)
            print(f"\n{case.name}" + (f"   [target: {case.target}]" if case.target else ""))
            for line in (table(rounds, list(case.candidates), case.baseline) + list(case.notes)
                         + checked):
                print(f"  {line}")


if __name__ == "__main__":
    main()
