"""Numba kernels for the point estimators (DESIGN §2); oracle: ``point_numpy``.

Kernels trust their inputs (the public wrappers validated them).  Each loops over groups
and writes only its own group's slice, so results do not depend on the thread count.
Statistics accumulate in float64 whatever the reward dtype.

Each kernel also writes, per group, the divisor it used (``scale``) and the largest
``|advantage|`` before the cast to the output dtype (``amax``).  ``amax`` turns NaN/inf if
any value of the group was non-finite, so the wrapper checks finiteness in O(B) instead of
an extra pass over the rewards.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from advcal._kernels.modes import FASTMATH, FIXED, GRPO, RLOO, compile_pair

# Below this many rewards a thread launch costs more than it saves.
PARALLEL_MIN_SIZE = 1 << 16


@njit(cache=True, inline="always", fastmath=FASTMATH)
def _moments(x, lo, hi, omit_nan):
    """(count, shift, mean of x - shift, sum of squared deviations) of one group.

    Shifting by a member of the group makes a constant group's deviations exactly 0,
    whatever rounding the mean would otherwise leave (the ~4000x residue blow-up).
    """
    if not omit_nan:
        # Separate NaN-free loops: without branches LLVM vectorizes the sums.
        if hi == lo:
            return 0, 0.0, 0.0, 0.0
        shift = np.float64(x[lo])
        total = 0.0
        for i in range(lo, hi):
            total += x[i] - shift
        n = hi - lo
        mean = total / n
        ss = 0.0
        for i in range(lo, hi):
            d = (x[i] - shift) - mean
            ss += d * d
        return n, shift, mean, ss
    start = lo
    while start < hi and math.isnan(x[start]):
        start += 1
    if start == hi:
        return 0, 0.0, 0.0, 0.0
    shift = np.float64(x[start])
    total = 0.0
    n = 0
    for i in range(start, hi):
        v = x[i]
        if not math.isnan(v):
            total += v - shift
            n += 1
    mean = total / n
    ss = 0.0
    for i in range(start, hi):
        v = x[i]
        if not math.isnan(v):
            d = (v - shift) - mean
            ss += d * d
    return n, shift, mean, ss


@njit(cache=True, inline="always")
def _divisor(mode, n, ss, eps, ddof, divisor):
    if mode == GRPO:
        return math.sqrt(ss / (n - ddof)) + eps if n > ddof else eps
    if mode == RLOO:
        return (n - 1.0) / n
    if mode == FIXED:
        return divisor
    return 1.0


def _center_scale(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor,
                  out, scale, amax):
    for q in prange(offsets.size - 1):
        lo = offsets[q]
        hi = offsets[q + 1]
        n, shift, mean, ss = _moments(x, lo, hi, omit_nan)
        if n == 0 or (n == 1 and not raw_singletons):
            s = math.nan  # no relative information: advantages 0
        elif n == 1:
            # verl's convention for a lone response: mean 0 and std 1.
            shift = 0.0
            mean = 0.0
            s = 1.0 + eps if mode == GRPO else (divisor if mode == FIXED else 1.0)
        else:
            s = _divisor(mode, n, ss, eps, ddof, divisor)
        group_max = 0.0
        if s != s or s == 0.0:
            for i in range(lo, hi):
                out[i] = 0.0
            if ss != ss:  # non-finite rewards in a group that gives no advantage
                group_max = math.nan
        elif not omit_nan:
            inv = 1.0 / s
            lowest = math.inf
            highest = -math.inf
            for i in range(lo, hi):
                a = ((x[i] - shift) - mean) * inv
                out[i] = a
                lowest = min(lowest, a)
                highest = max(highest, a)
            # min/max drop NaN; a non-finite reward leaves ss non-finite instead.
            group_max = max(-lowest, highest) if ss - ss == 0.0 else math.nan
        else:
            inv = 1.0 / s
            for i in range(lo, hi):
                v = x[i]
                a = 0.0 if math.isnan(v) else ((v - shift) - mean) * inv
                out[i] = a
                group_max = max(group_max, abs(a))
            if ss - ss != 0.0:
                group_max = math.nan
        scale[q] = s
        amax[q] = group_max


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
        n, shift, mean, ss = _moments(x, lo, hi, omit_nan)
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
            s = _divisor(GRPO, n, ss, eps, ddof, 1.0)
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


def center_scale(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor):
    out, scale, amax = _outputs(x, offsets)
    kernel = _center_scale_parallel if x.size >= PARALLEL_MIN_SIZE else _center_scale_serial
    kernel(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor, out, scale, amax)
    return out, scale, amax


def opo(x, weights, offsets, raw_singletons, omit_nan):
    out, scale, amax = _outputs(x, offsets)
    kernel = _opo_parallel if x.size >= PARALLEL_MIN_SIZE else _opo_serial
    kernel(x, weights, offsets, raw_singletons, omit_nan, out, scale, amax)
    return out, scale, amax


def passk(x, offsets, eps, ddof, raw_singletons, omit_nan):
    out, scale, amax = _outputs(x, offsets)
    kernel = _passk_parallel if x.size >= PARALLEL_MIN_SIZE else _passk_serial
    kernel(x, offsets, eps, ddof, raw_singletons, omit_nan, out, scale, amax)
    return out, scale, amax


@njit(cache=True)
def _group_moments(x, offsets, omit_nan, count, mean, ss):
    for q in range(offsets.size - 1):
        n, shift, m, s = _moments(x, offsets[q], offsets[q + 1], omit_nan)
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
