"""``advcal warmup``: compile advcal's numba kernels into the on-disk kernel cache.

A kernel compiles at its first call in every process that finds it in no cache: seconds
per entry point (GGSR's recovery the longest).  ``advcal warmup`` calls the main entry
points on tiny batches in every layout and float dtype that compile a kernel signature of
their own, so that later processes load the kernels instead (run it once after installing
or upgrading advcal, e.g. in a container's build step).  Where no cache folder can be
used it stops with one line that says why, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from advcal.cli._args import Command
from advcal.cli._errors import CommandError

NAME = "warmup"
HELP = ("compile advcal's numba kernels into the kernel cache, so that later processes "
        "load them instead of compiling")

# The float dtypes rewards come in; each compiles kernels of its own.
DTYPES = (np.float64, np.float32)


def _layouts(dtype: Any) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """Rewards in [0, 1) in the layouts that reach distinct kernels or signatures: dense
    (read-only offsets), ragged groups of similar sizes, and of very different sizes (the
    range kernels sort those group by group)."""
    rng = np.random.default_rng(0)
    yield rng.random((3, 4)).astype(dtype), None
    for sizes in ((3, 4, 2), (1, 1, 1, 1, 8)):
        offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        yield rng.random(int(offsets[-1])).astype(dtype), offsets


# Values for the required options of the registered estimators.
_NEEDS: dict[str, Callable[[np.ndarray], Any]] = {
    "lengths": lambda x: np.full(x.shape, 3, dtype=np.int64),
    "tau_res": lambda x: 0.01,
}


def _point_estimators() -> list[str]:
    from advcal.registry import REGISTRY

    return [name for name, entry in REGISTRY.items()
            if not entry.ranges and set(entry.needs) <= set(_NEEDS)]


def _estimators(dtype: Any) -> None:
    from advcal.registry import REGISTRY

    for name in _point_estimators():
        entry = REGISTRY[name]
        for x, offsets in _layouts(dtype):
            entry.function(x, offsets, **{k: _NEEDS[k](x) for k in entry.needs})


def _maxnorm(dtype: Any) -> None:
    import advcal

    for x, offsets in _layouts(dtype):
        advcal.maxnorm(x, offsets, tau_res=0.01, return_scale=True)
        advcal.maxnorm(x, offsets, tau_res=0.01, resolution=0.01)  # the protocol's kernel
        advcal.resolve_rewards(x, offsets, resolution=0.01)


def _ranges(dtype: Any) -> None:
    import advcal

    for x, offsets in _layouts(dtype):
        for relation in ("dominance", "midpoint", "probabilistic"):
            advcal.range_advantages(x * 0.5, x * 0.5 + 0.25, offsets, relation=relation)


def _paired(dtype: Any, groups: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    a = rng.random((groups, 4))
    return a.astype(dtype), (a + 0.01 * rng.standard_normal(a.shape)).astype(dtype)


def _calibrate_sets(dtype: Any) -> None:
    import advcal

    a, b = _paired(dtype, 40)
    cal = advcal.calibrate_sets(a, b, alpha=0.2)
    advcal.calibrate_sets(a.ravel(), b.ravel(), np.arange(0, a.size + 1, 4), alpha=0.2)
    for x, offsets in _layouts(dtype):
        advcal.coefficient_sets(x, offsets, calibration=cal)


def _recover(dtype: Any) -> None:
    import advcal

    a, b = _paired(dtype, 40)
    cal = advcal.calibrate_sets(a, b, alpha=0.2)
    sets = advcal.coefficient_sets(a[:3], calibration=cal)
    advcal.recover(sets, np.broadcast_to(np.eye(4), (3, 4, 4)), tau=0.2)


# name: (what it compiles, how)
TARGETS: dict[str, tuple[str, Callable[[Any], None]]] = {
    "estimators": ("the registered point estimators (grpo, rloo, ...)", _estimators),
    "maxnorm": ("maxnorm and resolve_rewards", _maxnorm),
    "ranges": ("range_advantages, every relation", _ranges),
    "calibrate_sets": ("calibrate_sets and coefficient_sets", _calibrate_sets),
    "recover": ("recover (GGSR; also setgrpo and select_threshold)", _recover),
}


def _dispatchers() -> list[Any]:
    """advcal's compiled functions loaded so far (kernels and their cached helpers)."""
    from numba.core.dispatcher import Dispatcher

    found = {id(v): v for name, module in list(sys.modules.items())
             if name.startswith("advcal.") and module is not None
             for v in vars(module).values() if isinstance(v, Dispatcher)}
    return list(found.values())


def _counts() -> tuple[int, int]:
    """(signatures compiled, signatures loaded from the cache) so far in this process."""
    compiled = loaded = 0
    for dispatcher in _dispatchers():
        compiled += sum(dispatcher.stats.cache_misses.values())
        loaded += sum(dispatcher.stats.cache_hits.values())
    return compiled, loaded


def run(args: argparse.Namespace) -> int:
    """Compile the chosen targets in both dtypes; print each one's counts and time."""
    from advcal._numba_cache import (
        KernelCacheDisabledWarning,
        KernelCacheWarning,
        cache_dir,
        cache_problem,
    )

    with warnings.catch_warnings():  # said once, below, as the command's error line
        warnings.simplefilter("ignore", KernelCacheDisabledWarning)
        folder = cache_dir()
    if folder is None:
        raise CommandError(f"nothing can be cached: {cache_problem()}")
    names = list(dict.fromkeys(args.only)) if args.only else list(TARGETS)
    dtypes = ", ".join(np.dtype(d).name for d in DTYPES)
    print(f"kernel cache: {folder}")
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", KernelCacheWarning)
        for name in names:
            what, compile_target = TARGETS[name]
            before, t0 = _counts(), time.perf_counter()
            for dtype in DTYPES:
                compile_target(dtype)
            after = _counts()
            print(f"{name:<15} {what} ({dtypes}): {after[0] - before[0]} compiled, "
                  f"{after[1] - before[1]} already cached, {time.perf_counter() - t0:.1f} s")
    failed = [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)
              and str(w.message).startswith("could not save")]
    for w in caught:  # the others (an unreadable entry, compiled again) are only warnings
        if str(w.message) not in failed:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if failed:  # compiled, but (some of it) not saved: later processes compile again
        raise CommandError(f"the kernel cache {folder} could not be written: {failed[0]}")
    compiled, loaded = _counts()
    print(f"done in {time.perf_counter() - start:.1f} s: {compiled} kernel signatures "
          f"compiled, {loaded} already cached; later processes load them from {folder}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``advcal warmup``."""
    parser.add_argument("--only", action="append", choices=tuple(TARGETS), metavar="NAME",
                        help="compile only this entry point's kernels (repeat for several): "
                             + ", ".join(TARGETS) + " (default: all)")


COMMAND = Command(NAME, HELP, add_arguments, run)
