"""Benchmarks: ``python -m benchmarks [--quick] [--only SUBSTRING]``.

Every ``benchmarks/bench_*.py`` module defines ``cases(quick: bool) -> list[Case]``.  A
case times several candidates in one run and reports each as a ratio to its baseline,
since ratios measured side by side travel between machines better than seconds.

Baselines are fixed peers: a plain numpy (or numpy + scipy) implementation of the same
computation written in the benchmark module itself, the frameworks' own code (TRL),
pyarrow for reading, a memory copy or a trainer's backward pass.  Never advcal's numpy
engine (``backend="numpy"``, ``advcal/_kernels/*_numpy.py``): that engine is the tests'
oracle and is free to be as clear, or as slow, as it likes; no ratio or target may bind
it.  A case's ``check`` runs once before the timing and asserts that the peer computes
what advcal computes, to a stated tolerance, so that a ratio compares equal work.

The runner gives BLAS one thread (``OPENBLAS_NUM_THREADS=1`` unless set, for the processes
it starts too; numpy is first imported after it): on a shared machine BLAS's own pool
mostly measured its threads' contention for the cores.  Candidates that use threads use
advcal's pool (or torch's, one thread) and say so.
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field


def check_close(what: str, peer: object, ours: object, *, atol: float, why: str,
                rtol: float = 0.0) -> str:
    """Assert ``peer`` equals ``ours`` within ``atol + rtol * |ours|`` elementwise (NaN
    only where NaN); return the note line saying so, ``why`` being the tolerance's reason."""
    import numpy as np

    np.testing.assert_allclose(np.asarray(peer, dtype=np.float64),
                               np.asarray(ours, dtype=np.float64), rtol=rtol, atol=atol,
                               err_msg=f"{what}: the peer does not compute advcal's result")
    bound = " + ".join([f"atol {atol:.0e}"] * bool(atol) + [f"rtol {rtol:.0e}"] * bool(rtol))
    return f"checked before timing: {what} within {bound} ({why})"


@dataclass
class Case:
    """One benchmark: candidates timed side by side, reported against ``baseline``."""

    name: str
    candidates: dict[str, Callable[[], object]]
    baseline: str
    target: str = ""
    notes: list[str] = field(default_factory=list)
    # A one-shot measurement that returns its own report lines (an end-to-end run too
    # costly to repeat in rounds); ``candidates`` is then empty.
    report: Callable[[], list[str]] | None = None
    # Run once before the timing: raises AssertionError if a peer's result differs from
    # advcal's beyond the tolerance it states; returns that statement, printed as a note.
    check: Callable[[], str] | None = None
    # Builds the case to run (candidates, notes, check) only once the runner selects it:
    # a case whose set-up is costly (a model, fresh processes) must not make a run of
    # other benchmarks (``--only``) pay for it, nor fail with it.
    build: Callable[[], Case] | None = None


@dataclass
class Rounds:
    """Per-call times in seconds of each candidate, one per round, and which candidates
    shared their rounds (see ``round_times``)."""

    times: dict[str, list[float]]
    together: list[list[str]]

    def best(self, label: str) -> float:
        return min(self.times[label])

    def paired_ratio(self, label: str, baseline: str) -> float | None:
        """Median over rounds of label's time over the baseline's in the same round, or
        None if the two were not timed in the same rounds.

        A round's two times share that round's conditions, so a slow stretch of a shared
        machine cancels out of the ratio; the ratio of best times divides two minima that
        may come from different stretches.
        """
        import numpy as np

        if not any(label in group and baseline in group for group in self.together):
            return None
        ratios = np.asarray(self.times[label]) / np.asarray(self.times[baseline])
        return float(np.median(ratios))


def with_notes_later(case: Case, make: Callable[[], list[str]]) -> Case:
    """``case`` whose notes ``make`` (fresh processes, say) computes only once the runner
    selects the case."""
    import dataclasses

    case.build = lambda: dataclasses.replace(case, notes=list(case.notes) + make(),
                                             build=None)
    return case


def round_times(candidates: dict[str, Callable[[], object]], *, min_total: float = 0.2,
                rounds: int = 15, apart: float = 5.0) -> Rounds:
    """Time every candidate in ``rounds`` rounds.

    The rounds interleave the candidates (A, B, C, A, B, C, ...), so that a burst of load
    from elsewhere on the machine (a shared VM) slows every candidate of a round rather
    than one of them: ratios measured side by side stay comparable.  A candidate
    ``apart`` times slower than the fastest (a numpy peer with large temporaries)
    gets rounds of its own afterwards: interleaved, the memory it had just freed would slow
    the first touch of the next candidate's output.
    """
    timers = {}
    for label, fn in candidates.items():
        fn()  # warm-up: compilation, caches, page faults of the first allocation
        timer = timeit.Timer(fn)
        number, elapsed = timer.autorange()
        timers[label] = (timer, number, elapsed / number)
    fastest = min(per_call for _, _, per_call in timers.values())
    for label, (timer, number, per_call) in timers.items():
        if per_call > apart * fastest:  # timed once: a slow stretch may have set it apart
            best = min(timer.repeat(repeat=3, number=number)) / number
            timers[label] = (timer, number, min(per_call, best))
    together = [[label for label, (_, _, t) in timers.items() if (t > apart * fastest) == slow]
                for slow in (False, True)]
    times: dict[str, list[float]] = {label: [] for label in candidates}
    for group in together:
        for _ in range(rounds):
            for label in group:
                timer, number, per_call = timers[label]
                calls = max(1, int(min_total / rounds / per_call))
                times[label].append(timer.timeit(calls) / calls)
    return Rounds(times, [group for group in together if group])


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh process that a benchmark times, with ``extra`` set.

    An installed package has its modules' bytecode written, so PYTHONDONTWRITEBYTECODE is
    left out: with it, each process would compile advcal's modules from source again."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, **extra}


def fresh_process_time(code: str, env: dict[str, str] | None = None, runs: int = 3) -> float:
    """Best wall time of a fresh ``python -c code`` process, in seconds."""
    import subprocess
    import sys

    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=process_env(**(env or {})))
        best = min(best, time.perf_counter() - start)
    return best


def startup_notes(label: str, first_call: str) -> list[str]:
    """What a user pays per process: the import, then a first call with the
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
