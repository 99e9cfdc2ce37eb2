"""Benchmarks: ``python -m benchmarks [--quick] [--only SUBSTRING]``.

Every ``benchmarks/bench_*.py`` module defines ``cases(quick: bool) -> list[Case]``.  A
case times several candidates in one run and reports each as a ratio to its baseline
(the numpy reference, a numpy-vectorized peer formulation, or a memory copy), since
ratios measured side by side travel between machines better than seconds.
"""

from __future__ import annotations

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


def best_time(fn: Callable[[], object], *, min_total: float = 0.2, repeat: int = 5) -> float:
    """Best per-call time in seconds over ``repeat`` rounds of an auto-sized loop."""
    fn()  # warm-up: compilation, caches, page faults of the first allocation
    timer = timeit.Timer(fn)
    number, elapsed = timer.autorange()
    number = max(1, int(number * min_total / max(elapsed, 1e-9)))
    return min(timer.repeat(repeat=repeat, number=number)) / number
