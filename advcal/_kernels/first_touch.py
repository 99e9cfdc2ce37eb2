"""The first write to a fresh output array: the end of each huge page before anything else.

numpy maps a large new array lazily (and asks Linux for 2 MB transparent huge pages), so
the first write to each huge page of a kernel's output stops the thread while Linux zeroes
that page.  How long that takes depended on where in the page the first write landed: on
this machine (Linux 6.18, a 2-core VM), a first write at the end of each page cost about
half the system time of one at its start.  glibc's ``memcpy`` happens to copy large
arrays from their end, which is much of why ``ndarray.copy`` wrote a fresh array faster
than the kernels did.  Measured on 2**24 rewards (a 128 MB output):

* a plain copy loop, one thread: 12.0 ms of system time a call walking forward, 4.4-5.6
  ms walking backward; ``memcpy`` 4.8-7.4 ms;
* writing the last element of every huge page first, then running forward as before:
  with two threads, ``maxnorm`` 1.36-1.44x a memory copy against 1.52-1.57x (median of
  paired rounds, ragged groups of 2..30; system time 9.5, 11.0 and 19.2 ms a call
  against 17.0, 25.9 and 14.4 in three runs), grpo 1.35x against 1.48-1.52x; on one
  thread, ``maxnorm`` 2.29x against 2.80x.
  Touching the start of each page instead gave no gain, nor did touching each page just
  before the kernel reached it; binned ``maxnorm`` (compute-bound) did not change.

``touch_page_ends`` does that first write.  It writes 0 into elements the kernel then
overwrites, so it changes no result; where pages are not huge (or the memory was already
mapped) it costs a few dozen writes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

HUGE_PAGE = 1 << 21
# Smaller outputs often reuse memory the process already mapped (glibc's heap).
MIN_BYTES = 4 * HUGE_PAGE


def _page_ends(out, lo, hi, address):
    """Write 0 to the last element of ``out[lo:hi]`` on every huge page it overlaps,
    highest page first (``address``: that of ``out[0]``)."""
    if hi <= lo:
        return
    size = out.itemsize
    first = (address + lo * size) // HUGE_PAGE
    last = (address + (hi - 1) * size) // HUGE_PAGE
    for page in range(last, first - 1, -1):
        end = ((page + 1) * HUGE_PAGE - address) // size - 1
        out[min(max(end, lo), hi - 1)] = 0


_compiled: Any = None


def touch_page_ends(out: np.ndarray, lo: int, hi: int) -> None:
    """``_page_ends`` compiled (on first use: importing numba costs 0.6 s), without the GIL,
    so that the threads of ``pool.run_over_groups`` take their page faults in parallel."""
    global _compiled
    if _compiled is None:
        from numba import njit

        _compiled = njit(cache=True, nogil=True)(_page_ends)
    _compiled(out, lo, hi, out.ctypes.data)
