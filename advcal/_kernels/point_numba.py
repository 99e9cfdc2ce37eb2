"""Numba kernels for the point estimators (DESIGN §2); oracle: ``point_numpy``.

Kernels trust their inputs (the public wrappers validated them).  Each loops over groups
and writes only its own group's slice, so results do not depend on the thread count.
Statistics accumulate in float64 whatever the reward dtype.

Each kernel also writes, per group, the divisor it used (``scale``) and the largest
``|advantage|`` before the cast to the output dtype (``amax``).  ``amax`` turns NaN if any
value of the group was non-finite, so finiteness is checked in O(B) instead of an extra
pass over the rewards: every engine function returns ``(out, scale, amax, ok)`` with
``ok`` false when some ``amax`` is NaN or above ``limit`` (the output dtype's maximum).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from advcal._kernels.modes import FASTMATH, FIXED, GRPO, RLOO, compile_pair

# Below this many rewards a thread launch costs more than it saves.
PARALLEL_MIN_SIZE = 1 << 16


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _moments(g, omit_nan):
    """(count, shift, mean of g - shift, sum of squared deviations) of one group ``g``.

    Shifting by a member of the group makes a constant group's deviations exactly 0,
    whatever rounding the mean would otherwise leave (the ~4000x residue blow-up).
    Loops run over a view ``g`` with ``range(g.size)``: numba then knows the index is
    non-negative and LLVM vectorizes them (indexing ``x[lo + i]`` is 6x slower).
    """
    if not omit_nan:
        n = g.size
        if n == 0:
            return 0, 0.0, 0.0, 0.0
        shift = np.float64(g[0])
        total = 0.0
        for i in range(n):
            total += g[i] - shift
        mean = total / n
        ss = 0.0
        for i in range(n):
            d = (g[i] - shift) - mean
            ss += d * d
        return n, shift, mean, ss
    start = 0
    while start < g.size and math.isnan(g[start]):
        start += 1
    if start == g.size:
        return 0, 0.0, 0.0, 0.0
    shift = np.float64(g[start])
    total = 0.0
    n = 0
    for i in range(start, g.size):
        v = g[i]
        if not math.isnan(v):
            total += v - shift
            n += 1
    mean = total / n
    ss = 0.0
    for i in range(start, g.size):
        v = g[i]
        if not math.isnan(v):
            d = (v - shift) - mean
            ss += d * d
    return n, shift, mean, ss


@njit(cache=True, inline="always")
def _divisor(mode, n, ss, eps, ddof, raw_singletons, divisor):
    """What a group's centered rewards are divided by; NaN means "advantages 0"."""
    if n == 0 or (n == 1 and not raw_singletons):
        return math.nan  # no relative information
    if mode == FIXED:
        return divisor
    if mode == GRPO:
        if n == 1:
            return 1.0 + eps  # verl's lone response: std taken as 1
        return math.sqrt(ss / (n - ddof)) + eps if n > ddof else eps
    if mode == RLOO and n > 1:
        return (n - 1.0) / n
    return 1.0


# Groups are processed in chunks: statistics of the whole chunk first, then the
# divisions and square roots in one loop over groups (whose latency then overlaps
# instead of stalling each group), then the writes while the chunk is still in cache.
CHUNK = 256


def _center_scale(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit,
                  out, scale, amax):
    n_groups = offsets.size - 1
    count = np.empty(n_groups, dtype=np.int64)
    shift = np.empty(n_groups)
    mean = np.empty(n_groups)
    n_bad = 0
    for c in prange((n_groups + CHUNK - 1) // CHUNK):
        first = c * CHUNK
        last = min(first + CHUNK, n_groups)
        for q in range(first, last):
            count[q], shift[q], mean[q], scale[q] = _moments(
                x[offsets[q]:offsets[q + 1]], omit_nan)
        for q in range(first, last):
            n = count[q]
            ss = scale[q]
            # A NaN/inf reward leaves ss non-finite: amax carries the flag to the wrapper.
            amax[q] = 0.0 if ss - ss == 0.0 else math.nan
            if n == 1 and raw_singletons:
                shift[q] = 0.0
                mean[q] = 0.0
            scale[q] = _divisor(mode, n, ss, eps, ddof, raw_singletons, divisor)
        for q in range(first, last):
            g = x[offsets[q]:offsets[q + 1]]
            o = out[offsets[q]:offsets[q + 1]]
            s = scale[q]
            if s != s or s == 0.0:
                for i in range(g.size):
                    o[i] = 0.0
                if amax[q] != 0.0:
                    n_bad += 1
                continue  # (an else-branch here instead measured 20% slower)
            group_max = 0.0
            if omit_nan:
                inv = 1.0 / s
                for i in range(g.size):
                    v = g[i]
                    a = 0.0 if math.isnan(v) else ((v - shift[q]) - mean[q]) * inv
                    o[i] = a
                    group_max = max(group_max, abs(a))
            else:
                inv = 1.0 / s
                sh = shift[q]
                m = mean[q]
                for i in range(g.size):
                    a = ((g[i] - sh) - m) * inv
                    o[i] = a
                    group_max = max(group_max, abs(a))
            if amax[q] == 0.0:
                amax[q] = group_max
            if not amax[q] <= limit:
                n_bad += 1
    return n_bad


def _opo(x, weights, offsets, raw_singletons, omit_nan, out, scale, amax):
    for q in prange(offsets.size - 1):
        lo = offsets[q]
        hi = offsets[q + 1]
        n = 0
        shift = 0.0
        found = False
        finite = True
        for i in range(lo, hi):
            v = x[i]
            if not (omit_nan and math.isnan(v)):
                n += 1
                finite = finite and math.isfinite(v)
                if not found:
                    shift = np.float64(v)
                    found = True
        baseline = 0.0
        if n >= 2:
            num = 0.0
            den = 0.0
            for i in range(lo, hi):
                v = x[i]
                if omit_nan and math.isnan(v):
                    continue
                num += weights[i] * (v - shift)
                den += weights[i]
            baseline = num / den
        else:
            shift = 0.0
        group_max = 0.0
        for i in range(lo, hi):
            v = x[i]
            if (omit_nan and math.isnan(v)) or (n == 1 and not raw_singletons):
                out[i] = 0.0
                continue
            a = (v - shift) - baseline
            out[i] = a
            a = abs(a)
            if a > group_max or a != a:
                group_max = a
        scale[q] = 1.0 if n >= 2 or (n == 1 and raw_singletons) else math.nan
        amax[q] = group_max if finite else math.nan


def _passk(x, offsets, eps, ddof, raw_singletons, omit_nan, out, scale, amax):
    for q in prange(offsets.size - 1):
        lo = offsets[q]
        hi = offsets[q + 1]
        n, shift, mean, ss = _moments(x[lo:hi], omit_nan)
        best = -1
        top = -math.inf
        second = -math.inf
        for i in range(lo, hi):
            v = x[i]
            if omit_nan and math.isnan(v):
                out[i] = 0.0
                continue
            out[i] = 0.0
            if best < 0 or v > top:
                if best >= 0:
                    second = top
                best = i
                top = v
            elif v > second:
                second = v
        group_max = 0.0
        if n >= 2:
            s = _divisor(GRPO, n, ss, eps, ddof, False, 1.0)
            a = (np.float64(top) - np.float64(second)) / s
        elif n == 1 and raw_singletons:
            s = 1.0 + eps
            a = np.float64(top) / s
        else:
            s = math.nan
            a = 0.0
        if best >= 0 and s == s and s != 0.0:
            out[best] = a
            group_max = abs(a) if a == a else a
        if ss != ss:  # a NaN/inf anywhere in the group, even off the best response
            group_max = math.nan
        scale[q] = s
        amax[q] = group_max


_center_scale_serial, _center_scale_parallel = compile_pair(_center_scale)
_opo_serial, _opo_parallel = compile_pair(_opo)
_passk_serial, _passk_parallel = compile_pair(_passk)


def _outputs(x, offsets):
    n_groups = offsets.size - 1
    return np.empty_like(x), np.empty(n_groups), np.empty(n_groups)


def center_scale(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit):
    out, scale, amax = _outputs(x, offsets)
    kernel = _center_scale_parallel if x.size >= PARALLEL_MIN_SIZE else _center_scale_serial
    n_bad = kernel(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit,
                   out, scale, amax)
    return out, scale, amax, n_bad == 0


def opo(x, weights, offsets, raw_singletons, omit_nan, limit):
    out, scale, amax = _outputs(x, offsets)
    kernel = _opo_parallel if x.size >= PARALLEL_MIN_SIZE else _opo_serial
    kernel(x, weights, offsets, raw_singletons, omit_nan, out, scale, amax)
    return out, scale, amax, bool((amax <= limit).all())


def passk(x, offsets, eps, ddof, raw_singletons, omit_nan, limit):
    out, scale, amax = _outputs(x, offsets)
    kernel = _passk_parallel if x.size >= PARALLEL_MIN_SIZE else _passk_serial
    kernel(x, offsets, eps, ddof, raw_singletons, omit_nan, out, scale, amax)
    return out, scale, amax, bool((amax <= limit).all())


@njit(cache=True)
def _group_moments(x, offsets, omit_nan, count, mean, ss):
    for q in range(offsets.size - 1):
        n, shift, m, s = _moments(x[offsets[q]:offsets[q + 1]], omit_nan)
        count[q] = n
        mean[q] = shift + m
        ss[q] = s


def group_moments(x, offsets, omit_nan):
    n_groups = offsets.size - 1
    count = np.empty(n_groups, dtype=np.int64)
    mean = np.empty(n_groups)
    ss = np.empty(n_groups)
    _group_moments(x, offsets, omit_nan, count, mean, ss)
    return count, mean, ss
