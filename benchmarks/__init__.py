"""Benchmarks: ``python -m benchmarks [--quick] [--only SUBSTRING]``.

Every ``benchmarks/bench_*.py`` module defines ``cases(quick: bool) -> list[Case]``.  A
case times several candidates in one run and reports each as a ratio to its baseline
(the numpy reference, a numpy-vectorized peer formulation, or a memory copy), since
ratios measured side by side travel between machines better than seconds.
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Case:
    """One benchmark: candidates timed side by side, reported against ``baseline``."""

    name: str
    candidates: dict[str, Callable[[], object]]
    baseline: str
    target: str = ""
    notes: list[str] = field(default_factory=list)


def best_times(candidates: dict[str, Callable[[], object]], *, min_total: float = 0.2,
               rounds: int = 15) -> dict[str, float]:
    """Best per-call time in seconds of each candidate over ``rounds`` rounds.

    The rounds interleave the candidates (A, B, C, A, B, C, ...), so that a burst of load
    from elsewhere on the machine (a shared VM) slows every candidate of a round rather
    than one of them: ratios measured side by side stay comparable.
    """
    timers = {}
    for label, fn in candidates.items():
        fn()  # warm-up: compilation, caches, page faults of the first allocation
        timer = timeit.Timer(fn)
        number, elapsed = timer.autorange()
        number = max(1, int(number * min_total / rounds / max(elapsed, 1e-9)))
        timers[label] = (timer, number)
    best = {label: float("inf") for label in candidates}
    for _ in range(rounds):
        for label, (timer, number) in timers.items():
            best[label] = min(best[label], timer.timeit(number) / number)
    return best


def fresh_process_time(code: str, env: dict[str, str] | None = None, runs: int = 3) -> float:
    """Best wall time of a fresh ``python -c code`` process, in seconds."""
    import os
    import subprocess
    import sys

    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True,
                       env={**os.environ, **(env or {})})
        best = min(best, time.perf_counter() - start)
    return best


def startup_notes(label: str, first_call: str) -> list[str]:
    """What a user pays per process (DESIGN §7): the import, then a first call with the
    compiled kernels cached on disk and with an empty cache (compiling)."""
    import tempfile

    with tempfile.TemporaryDirectory() as empty:
        cold = fresh_process_time(first_call, env={"NUMBA_CACHE_DIR": empty}, runs=1)
    times = {
        "python -c pass": fresh_process_time("pass"),
        "import advcal": fresh_process_time("import advcal"),
        f"import + first {label}, kernels cached": fresh_process_time(first_call),
        f"import + first {label}, compiling (cold)": cold,
    }
    return [f"{name + ':':<44}{t * 1e3:8.0f} ms" for name, t in times.items()]
