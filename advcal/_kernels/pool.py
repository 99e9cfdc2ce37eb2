"""Threads for the kernels over groups: one compiled serial kernel, run on chunks of groups.

numba's ``prange`` compiles a second copy of a kernel, and LLVM reassociates the sums of
that copy in another order than those of the serial one (measured: last-bit differences in
groups of 32 or more rewards).  Running the *same* machine code on contiguous chunks of
groups from a few threads makes results bitwise identical for any thread count and any
batch size by construction.  The kernels release the GIL (``nogil``), so calls from several
user threads at once are safe too, which numba's default workqueue layer does not allow
for ``prange`` kernels.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from advcal._kernels.first_touch import MIN_BYTES, touch_page_ends

# Below this many rewards per thread, handing work to a thread costs more than it saves.
# A hand-off (wake a pool thread, collect its result) measured 50-100 us on a 2-core VM;
# grpo on 2**18 rewards took 221 us on one thread and 233 us on two, 2**19: 447 vs 352 us.
MIN_VALUES_PER_THREAD = 1 << 18

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid = -1


def compile_serial(loop: Callable[..., Any], fastmath: frozenset[str]) -> Any:
    """Compile a plain loop over groups once: cached on disk, releasing the GIL.

    ``error_model="numpy"`` lets x / 0 give inf/nan instead of raising inside the
    kernel; the wrappers guarantee no such division reaches the output.
    """
    from numba import njit

    return njit(cache=True, nogil=True, error_model="numpy", fastmath=set(fastmath))(loop)


def n_threads() -> int:
    """The thread count the user gave numba (``NUMBA_NUM_THREADS``, ``set_num_threads``)."""
    import numba

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


def _run_chunk(kernel: Any, call: tuple[Any, ...], fresh_output: np.ndarray | None) -> Any:
    if fresh_output is not None and fresh_output.nbytes >= MIN_BYTES:
        offsets = call[0]
        touch_page_ends(fresh_output, int(offsets[0]), int(offsets[-1]))
    return kernel(*call)


def run_over_groups(kernel: Any, offsets: np.ndarray, per_group: Sequence[np.ndarray],
                    *args: Any, threaded: bool | None = None,
                    fresh_output: np.ndarray | None = None) -> list[Any]:
    """Results of ``kernel(offsets, *per_group, *args)``, run on chunks of whole groups.

    ``kernel`` loops over ``range(offsets.size - 1)``; every chunk gets its own view of
    ``offsets`` and of each per-group array (empty arrays are passed unsliced, as "not
    requested"), while ``args`` (the rewards, the output) are shared: a chunk reads and
    writes only the positions its offsets name.  Returns one result per chunk, in order.
    ``threaded``: None chooses by the number of rewards; True uses every thread numba may
    use (any size), False none.  ``fresh_output``: an output just allocated, with one
    element per reward, that the kernel writes in full; each chunk first touches its share
    of it as ``first_touch`` describes (outputs of ``first_touch.MIN_BYTES`` or more).
    """
    if threaded is None:  # by size; small batches skip asking numba (0.7 us)
        n_values = int(offsets[-1])
        n_chunks = (min(n_threads(), n_values // MIN_VALUES_PER_THREAD)
                    if n_values >= 2 * MIN_VALUES_PER_THREAD else 1)
    else:  # forced, whatever the size (tests)
        n_chunks = n_threads() if threaded else 1
    if n_chunks <= 1 or offsets.size <= 2:
        if fresh_output is None or fresh_output.nbytes < MIN_BYTES:
            return [kernel(offsets, *per_group, *args)]  # (small calls: no extra frame)
        return [_run_chunk(kernel, (offsets, *per_group, *args), fresh_output)]
    bounds = chunk_bounds(offsets, n_chunks)
    calls = [
        (offsets[a:b + 1], *(g[a:b] if g.size else g for g in per_group), *args)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    pool = _executor()
    futures = [pool.submit(_run_chunk, kernel, call, fresh_output) for call in calls[1:]]
    first = _run_chunk(kernel, calls[0], fresh_output)
    return [first] + [f.result() for f in futures]
