"""Threads for the kernels over groups: one compiled serial kernel, run on chunks of groups.

``prange`` would compile a second copy of a kernel whose sums LLVM orders differently;
the *same* machine code on contiguous chunks of groups gives bitwise identical results for
any thread count by construction.  The kernels release the GIL, so concurrent calls from
user threads are safe too (numba's default workqueue layer forbids that for ``prange``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba
import numpy as np

from advcal._numba_cache import cached_njit

# Below this many rewards per thread, handing work to a thread (waking it, collecting its
# result) costs more than it saves.
MIN_VALUES_PER_THREAD = 1 << 18

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid = -1


def compile_serial(loop: Callable[..., Any], fastmath: frozenset[str]) -> Any:
    """A loop over groups compiled once, cached, releasing the GIL; x / 0 gives inf or NaN
    (which the wrappers keep out of the output) instead of raising."""
    return cached_njit(loop, nogil=True, error_model="numpy", fastmath=set(fastmath))


def n_threads() -> int:
    """The thread count the user gave numba (``NUMBA_NUM_THREADS``, ``set_num_threads``)."""
    return int(numba.get_num_threads())


def _executor() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _lock:
        # A forked child inherits the pool object but not its threads: make a new one.
        if _pool is None or _pool_pid != os.getpid():
            # Threads start on demand: at most n_threads() - 1 are ever busy at once.
            _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1,
                                       thread_name_prefix="advcal")
            _pool_pid = os.getpid()
        return _pool


def chunk_bounds(offsets: np.ndarray, n_chunks: int) -> np.ndarray:
    """Group indices ``0 = b_0 < b_1 < ... = B`` cutting the batch into at most
    ``n_chunks`` runs of whole groups with about equal numbers of rewards."""
    n_groups = offsets.size - 1
    if n_groups < 2:
        return np.arange(n_groups + 1)
    targets = np.linspace(0, offsets[-1], n_chunks + 1)[1:-1]
    above = np.clip(np.searchsorted(offsets, targets), 1, n_groups)
    below = above - 1
    # the group boundary nearest each target
    inner = np.where(targets - offsets[below] < offsets[above] - targets, below, above)
    return np.unique(np.concatenate(([0], inner, [n_groups])))


def run_over_groups(kernel: Any, offsets: np.ndarray, per_group: Sequence[np.ndarray],
                    *args: Any, threaded: bool | None = None) -> list[Any]:
    """Results of ``kernel(offsets, *per_group, *args)``, one per chunk of whole groups:
    each chunk gets its views of ``offsets`` and of the per-group arrays (an empty one is
    "not requested"), and touches only its own positions of the shared ``args``.
    ``threaded``: None chooses by the number of rewards, True uses every numba thread."""
    if threaded is None:  # by size; small batches skip asking numba
        n_values = offsets.item(-1)
        n_chunks = (min(n_threads(), n_values // MIN_VALUES_PER_THREAD)
                    if n_values >= 2 * MIN_VALUES_PER_THREAD else 1)
    else:  # forced, whatever the size (tests)
        n_chunks = n_threads() if threaded else 1
    if n_chunks <= 1 or offsets.size <= 2:
        return [kernel(offsets, *per_group, *args)]
    bounds = chunk_bounds(offsets, n_chunks)
    calls = [
        (offsets[a:b + 1], *(g[a:b] if g.size else g for g in per_group), *args)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    pool = _executor()
    futures = [pool.submit(kernel, *call) for call in calls[1:]]
    first = kernel(*calls[0])
    return [first] + [f.result() for f in futures]
