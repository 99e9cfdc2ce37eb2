"""Numba kernels for the interval advantages (DESIGN §5); oracle: ``ranges_numpy``.

Kernels trust their inputs: float64 ranges with ``lo <= hi``, finite, CSR ``offsets``.
Each loops over groups (``prange`` above a size threshold) and writes only its own
group's slice of the outputs and scratch arrays, so results do not depend on the
thread count.

Dominance in O(n log n) per group: with h sorted and its prefix sums,
Σ_j (l_i − h_j)₊ = c·l_i − (sum of the c smallest h), c = #{h_j < l_i} by binary search;
with l sorted and its suffix sums, Σ_j (l_j − h_i)₊ = (sum of the l above h_i) − c'·h_i.
Prefix and suffix sums are accumulated directly (never as a difference of two partial
sums, which would cancel).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from advcal._kernels.modes import compile_pair

# Below this many responses a thread launch costs more than it saves.
PARALLEL_MIN_SIZE = 1 << 13


@njit(cache=True, inline="always")
def _count_below(sorted_values, start, stop, x):
    """Number of entries of the sorted slice [start, stop) strictly below ``x``."""
    a = start
    b = stop
    while a < b:
        mid = (a + b) >> 1
        if sorted_values[mid] < x:
            a = mid + 1
        else:
            b = mid
    return a - start


@njit(cache=True, inline="always")
def _count_at_most(sorted_values, start, stop, x):
    """Number of entries of the sorted slice [start, stop) at most ``x``."""
    a = start
    b = stop
    while a < b:
        mid = (a + b) >> 1
        if sorted_values[mid] <= x:
            a = mid + 1
        else:
            b = mid
    return a - start


def _dominance(lo, hi, offsets, sorted_hi, sorted_lo, prefix_hi, suffix_lo, out):
    for q in prange(offsets.size - 1):
        start = offsets[q]
        stop = offsets[q + 1]
        n = stop - start
        if n == 0:
            continue
        # Shift by a member of the group: translation leaves the differences unchanged.
        ref = lo[start]
        for t in range(start, stop):
            sorted_hi[t] = hi[t] - ref
            sorted_lo[t] = lo[t] - ref
        sorted_hi[start:stop].sort()
        sorted_lo[start:stop].sort()
        acc = 0.0
        for t in range(start, stop):
            acc += sorted_hi[t]
            prefix_hi[t] = acc
        acc = 0.0
        for t in range(stop - 1, start - 1, -1):
            acc += sorted_lo[t]
            suffix_lo[t] = acc
        for i in range(start, stop):
            li = lo[i] - ref
            hi_i = hi[i] - ref
            below = _count_below(sorted_hi, start, stop, li)
            ahead = below * li - prefix_hi[start + below - 1] if below > 0 else 0.0
            at_most = _count_at_most(sorted_lo, start, stop, hi_i)
            above = n - at_most
            behind = suffix_lo[start + at_most] - above * hi_i if above > 0 else 0.0
            out[i] = (ahead - behind) / n


def _midpoint(lo, hi, offsets, out):
    for q in prange(offsets.size - 1):
        start = offsets[q]
        stop = offsets[q + 1]
        n = stop - start
        if n == 0:
            continue
        # Deviations from a member's midpoint: equal midpoints give exact zeros.
        ref = 0.5 * (lo[start] + hi[start])
        total = 0.0
        for t in range(start, stop):
            total += 0.5 * (lo[t] + hi[t]) - ref
        mean = total / n
        for t in range(start, stop):
            out[t] = (0.5 * (lo[t] + hi[t]) - ref) - mean


@njit(cache=True, inline="always")
def _sum_cdf(t, w1, w2):
    """P(U1 + U2 <= t), U1 ~ U[0, w1], U2 ~ U[0, w2], max(w1, w2) > 0 (see ranges_numpy)."""
    small = min(w1, w2)
    big = max(w1, w2)
    if t <= 0.0:
        return 0.0
    if t >= small + big:
        return 1.0
    if t < small:
        return t * t / (2.0 * small * big)
    if t <= big:
        return (t - 0.5 * small) / big
    rest = small + big - t
    return 1.0 - rest * rest / (2.0 * small * big)


@njit(cache=True, inline="always")
def _sign_expectation(li, hi_, lj, hj):
    """E[sign(R_i - R_j)] for independent uniforms on the ranges (points: point masses)."""
    wi = hi_ - li
    wj = hj - lj
    if wi == 0.0 and wj == 0.0:
        if li > lj:
            return 1.0
        if li < lj:
            return -1.0
        return 0.0
    return 1.0 - 2.0 * _sum_cdf(hj - li, wi, wj)


def _probabilistic(lo, hi, offsets, out):
    for q in prange(offsets.size - 1):
        start = offsets[q]
        stop = offsets[q + 1]
        n = stop - start
        if n == 0:
            continue
        ref = lo[start]
        for i in range(start, stop):
            out[i] = 0.0
        for i in range(start, stop):
            li = lo[i] - ref
            hi_i = hi[i] - ref
            mi = 0.5 * (li + hi_i)
            for j in range(i + 1, stop):
                lj = lo[j] - ref
                hj = hi[j] - ref
                gap = mi - 0.5 * (lj + hj)
                if gap != 0.0:
                    phi = gap * abs(_sign_expectation(li, hi_i, lj, hj))
                    out[i] += phi
                    out[j] -= phi
        for i in range(start, stop):
            out[i] /= n


_dominance_serial, _dominance_parallel = compile_pair(_dominance)
_midpoint_serial, _midpoint_parallel = compile_pair(_midpoint)
_probabilistic_serial, _probabilistic_parallel = compile_pair(_probabilistic)

# Probabilistic work grows with n² per group: threads pay off sooner.
_PROBABILISTIC_MIN_SIZE = 1 << 10


def range_advantages(lo, hi, offsets, relation):
    """A_i = (1/n) Σ_j φ(I_i, I_j) per group; ``relation`` 0/1/2 = dominance/midpoint/prob."""
    out = np.empty(lo.size)
    if relation == 0:
        parallel = lo.size >= PARALLEL_MIN_SIZE
        kernel = _dominance_parallel if parallel else _dominance_serial
        scratch = np.empty((4, lo.size))
        kernel(lo, hi, offsets, scratch[0], scratch[1], scratch[2], scratch[3], out)
    elif relation == 1:
        kernel = _midpoint_parallel if lo.size >= PARALLEL_MIN_SIZE else _midpoint_serial
        kernel(lo, hi, offsets, out)
    else:
        parallel = lo.size >= _PROBABILISTIC_MIN_SIZE
        kernel = _probabilistic_parallel if parallel else _probabilistic_serial
        kernel(lo, hi, offsets, out)
    return out
