"""Numba kernels for the interval advantages (validated finite float64 ranges); oracle:
``ranges_numpy``.

Dominance in O(n log n) per group: with the sorted h and l, Σ_j (l_i − h_j)₊ = c_i·l_i −
(sum of the c_i smallest h) for c_i = #{h_j < l_i}, and Σ_j (l_j − h_i)₊ = (sum of the l
above h_i) − c'_i·h_i for c'_i = #{l_j > h_i}; the counts come from branch-free binary
searches run for all responses in lockstep, so that their loads overlap.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from advcal._kernels.modes import FASTMATH
from advcal._kernels.pool import compile_serial, run_over_groups


def _sort_groups(offsets, x, out):
    """Copy of ``x`` with each group sorted in place (ragged batches)."""
    for q in range(offsets.size - 1):
        start = offsets[q]
        stop = offsets[q + 1]
        out[start:stop] = x[start:stop]
        out[start:stop].sort()


def _pad(offsets, padded, x):
    """Ragged groups as the rows of ``padded`` (one row per group), +inf past each end."""
    width = padded.shape[1]
    for q in range(offsets.size - 1):
        start = offsets[q]
        n = offsets[q + 1] - start
        for t in range(n):
            padded[q, t] = x[start + t]
        for t in range(n, width):
            padded[q, t] = np.inf


def _unpad(offsets, padded, out):
    for q in range(offsets.size - 1):
        start = offsets[q]
        for t in range(offsets[q + 1] - start):
            out[start + t] = padded[q, t]


def _relation(offsets, lo, hi, sorted_lo, sorted_hi, max_size, relation, out):
    """A_i of every group, by ``relation`` (see ``range_advantages``)."""
    # Dominance's scratch for one group at a time, allocated once per call (per chunk).
    below = np.empty(max_size + 1)  # below[c]: sum of the c smallest h
    above = np.empty(max_size + 1)  # above[c]: sum of the l from the c-th smallest on
    pos = np.empty(max_size, dtype=np.int64)
    for q in range(offsets.size - 1):
        start = offsets[q]
        stop = offsets[q + 1]
        if stop == start:
            continue
        # Views indexed from 0: numba drops its negative-index wraparound, and LLVM
        # vectorizes the loops.
        if relation == 0:
            _dominance(lo[start:stop], hi[start:stop], sorted_lo[start:stop],
                       sorted_hi[start:stop], below, above, pos, out[start:stop])
        elif relation == 1:
            _midpoint(lo[start:stop], hi[start:stop], out[start:stop])
        else:
            _probabilistic(lo[start:stop], hi[start:stop], out[start:stop])


@njit(inline="always")
def _dominance(lo_q, hi_q, sorted_lo_q, sorted_hi_q, below, above, pos, out_q):
    n = lo_q.size
    # Shift by a member of the group: translation leaves the differences unchanged.
    ref = lo_q[0]
    acc = 0.0
    below[0] = 0.0
    for t in range(n):
        acc += sorted_hi_q[t] - ref
        below[t + 1] = acc
    acc = 0.0
    above[n] = 0.0
    for t in range(n - 1, -1, -1):
        acc += sorted_lo_q[t] - ref
        above[t] = acc
    # c_i = #{h_j < l_i}: Σ_j (l_i − h_j)₊ = c_i·l_i − below[c_i].
    _count_below(sorted_hi_q, lo_q, n, pos, True)
    for i in range(n):
        out_q[i] = pos[i] * (lo_q[i] - ref) - below[pos[i]]
    # c'_i = #{l_j <= h_i}: Σ_j (l_j − h_i)₊ = above[c'_i] − (n − c'_i)·h_i.
    _count_below(sorted_lo_q, hi_q, n, pos, False)
    for i in range(n):
        behind = above[pos[i]] - (n - pos[i]) * (hi_q[i] - ref)
        out_q[i] = (out_q[i] - behind) / n


@njit(inline="always")
def _count_below(sorted_values, x, n, pos, strict):
    """pos[i] = #{sorted_values[:n] < x[i]} (``strict``, else <=) for every i < n: a
    binary search whose steps are selects, run for all queries in lockstep."""
    for i in range(n):
        pos[i] = 0
    length = n
    while length > 1:
        half = length >> 1
        for i in range(n):
            v = sorted_values[pos[i] + half]
            pos[i] += half if (v < x[i] if strict else v <= x[i]) else 0
        length -= half
    for i in range(n):
        v = sorted_values[pos[i]]
        pos[i] += 1 if (v < x[i] if strict else v <= x[i]) else 0


@njit(inline="always")
def _midpoint(lo_q, hi_q, out_q):
    n = lo_q.size
    # Deviations from a member's midpoint: equal midpoints give exact zeros.
    ref = 0.5 * (lo_q[0] + hi_q[0])
    total = 0.0
    for t in range(n):
        total += 0.5 * (lo_q[t] + hi_q[t]) - ref
    mean = total / n
    for t in range(n):
        out_q[t] = (0.5 * (lo_q[t] + hi_q[t]) - ref) - mean


@njit(inline="always")
def _sum_cdf(t, w1, w2):
    """P(U1 + U2 <= t), U1 ~ U[0, w1], U2 ~ U[0, w2], max(w1, w2) > 0 (see ranges_numpy)."""
    small = min(w1, w2)
    big = max(w1, w2)
    if t <= 0.0:
        return 0.0
    if t >= small + big:
        return 1.0
    if t < small:
        return (t / small) * (t / big) / 2.0
    if t <= big:
        return (t - 0.5 * small) / big
    rest = small + big - t
    return 1.0 - (rest / small) * (rest / big) / 2.0


@njit(inline="always")
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


@njit(inline="always")
def _probabilistic(lo_q, hi_q, out_q):
    n = lo_q.size
    ref = lo_q[0]
    for i in range(n):
        out_q[i] = 0.0
    # φ is antisymmetric: each pair once, added to i and subtracted from j.
    for i in range(n):
        li = lo_q[i] - ref
        hi_i = hi_q[i] - ref
        mi = 0.5 * (li + hi_i)
        for j in range(i + 1, n):
            lj = lo_q[j] - ref
            hj = hi_q[j] - ref
            gap = mi - 0.5 * (lj + hj)
            if gap != 0.0:
                phi = gap * abs(_sign_expectation(li, hi_i, lj, hj))
                out_q[i] += phi
                out_q[j] -= phi
    for i in range(n):
        out_q[i] /= n


_sort_groups_kernel = compile_serial(_sort_groups, FASTMATH)
_pad_kernel = compile_serial(_pad, FASTMATH)
_unpad_kernel = compile_serial(_unpad, FASTMATH)
_relation_kernel = compile_serial(_relation, FASTMATH)
# The probabilistic relation without "arcp" or "reassoc": the ratios t / w of _sum_cdf must
# stay ratios (x · (1 / w) overflows for a subnormal width, w1 · w2 underflows).
_probabilistic_kernel = compile_serial(_relation, FASTMATH - {"arcp", "reassoc"})


def _sorted_within_groups(x, offsets, max_size, threaded):
    """``x`` with each group sorted (a copy)."""
    sizes = np.diff(offsets)
    if sizes.size and max_size > 1 and (sizes == max_size).all():
        # Equal-size groups: numpy's vectorized (SIMD) sort of the (B, G) view is an
        # order of magnitude faster than numba's per-group quicksort.
        return np.sort(x.reshape(sizes.size, max_size), axis=1).reshape(-1)
    out = np.empty_like(x)
    if max_size > 1 and sizes.size * max_size <= 2 * x.size:
        # Similar sizes: pad to (B, max_size) with +inf (sorts last), sort the rows.
        padded = np.empty((sizes.size, max_size))
        run_over_groups(_pad_kernel, offsets, (padded,), x, threaded=threaded)
        padded.sort(axis=1)
        run_over_groups(_unpad_kernel, offsets, (padded,), out, threaded=threaded)
        return out
    run_over_groups(_sort_groups_kernel, offsets, (), x, out, threaded=threaded)
    return out


def range_advantages(lo, hi, offsets, relation, threaded=None):
    """A_i = (1/n) Σ_j φ(I_i, I_j) per group; ``relation`` 0/1/2 = dominance/midpoint/prob.

    ``threaded`` as in ``pool.run_over_groups`` (None: threads by size).
    """
    out = np.empty(lo.size)
    max_size = 0
    sorted_lo = sorted_hi = lo[:0]  # read by dominance only
    if relation == 0:
        max_size = int(np.diff(offsets).max(initial=0))
        sorted_lo = _sorted_within_groups(lo, offsets, max_size, threaded)
        sorted_hi = _sorted_within_groups(hi, offsets, max_size, threaded)
    kernel = _probabilistic_kernel if relation == 2 else _relation_kernel
    run_over_groups(kernel, offsets, (), lo, hi, sorted_lo, sorted_hi, max_size, relation,
                    out, threaded=threaded)
    return out
