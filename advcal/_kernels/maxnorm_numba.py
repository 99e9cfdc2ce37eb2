"""Numba kernels for the Reward-Resolution Protocol and MaxNorm-AC; oracle: ``maxnorm_numpy``.

Kernels trust their inputs (``advcal.resolution`` validated them), loop over groups and
write only their own group's slice, so results do not depend on the thread count (and the
serial and prange copies agree bit for bit: see FASTMATH).  All arithmetic is float64
whatever the reward dtype.  Groups are read through views (``x[lo:hi]`` with
``range(g.size)``), so numba knows the indices are in bounds.  See ``maxnorm_numpy`` for
the meaning of the shared arguments and outputs.

``maxnorm`` reads each group twice and writes it once: the first pass finds the group
mean and the extreme binned rewards, which give ``max |u|`` directly (u is an increasing
affine map of the binned reward), so the second pass can write ``w = u / s`` at once.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from advcal._kernels.modes import compile_pair

# Below this many rewards a thread launch costs more than it saves.
PARALLEL_MIN_SIZE = 1 << 16

# Only "nsz" (min/max may ignore the sign of zero).  No "reassoc": the serial and the
# prange copies would vectorize the group sums differently and differ in the last bit
# (reassociation measured no faster on groups of 16).  No "arcp" or "contract": binning
# divides by ``inv_delta`` and must not become a multiplication by ``delta`` fused into
# an FMA, or bins would land off the decimal grid the numpy reference hits
# (lo + k / 100 is the double nearest the decimal; lo + 0.01 * k is not).
FASTMATH = frozenset({"nsz"})


@njit(cache=True)
def _is_finite(v):
    # Outside fast-math, where no rewrite may assume the value finite.
    return math.isfinite(v)


@njit(cache=True, inline="always")
def _all_finite(nan_free, low, high):
    """Finiteness of a group from a per-reward ``v == v`` flag (cheap, and kept by LLVM
    without the "nnan" flag) and its extreme raw rewards (which carry any inf)."""
    return nan_free and _is_finite(low) and _is_finite(high)


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _bin(v, lo, hi, clip, inv_delta, kmax):
    """Clip (optionally) and bin (unless ``inv_delta == 0``) one reward.

    Branch-free min/max so that the loops vectorize; they may turn a NaN into a bound,
    which is harmless: callers test the raw reward for finiteness.
    """
    if clip:
        v = min(max(v, lo), hi)
    if inv_delta == 0.0:
        return v
    k = min(max(np.rint((v - lo) * inv_delta), 0.0), kmax)
    return min(lo + k / inv_delta, hi)


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _scan(g, o, stash, transform, lo, hi, clip, inv_delta, kmax, omit_nan):
    """Statistics of the valid rewards of one group ``g`` (a view, so that LLVM knows the
    indices are in bounds and vectorizes): count, shift (the first binned reward: a
    zero-gap group then centers to exact 0), sum of binned rewards minus the shift,
    smallest and largest binned reward, smallest and largest raw reward, finiteness.
    With ``stash`` (float64 output) the binned rewards are kept in ``o`` for ``_write``."""
    total = 0.0
    bmin = math.inf
    bmax = -math.inf
    low = math.inf
    high = -math.inf
    nan_free = True
    if not omit_nan:
        n = g.size
        if n == 0:
            return n, 0.0, total, bmin, bmax, low, high, True
        if not transform:  # the common case gets a branch-free loop
            shift = np.float64(g[0])
            for i in range(n):
                v = np.float64(g[i])
                nan_free &= v == v
                total += v - shift
                low = min(low, v)
                high = max(high, v)
            return n, shift, total, low, high, low, high, _all_finite(nan_free, low, high)
        shift = _bin(np.float64(g[0]), lo, hi, clip, inv_delta, kmax)
        for i in range(n):
            v = np.float64(g[i])
            nan_free &= v == v
            b = _bin(v, lo, hi, clip, inv_delta, kmax)
            if stash:
                o[i] = b
            total += b - shift
            low = min(low, v)
            high = max(high, v)
            bmin = min(bmin, b)
            bmax = max(bmax, b)
        return n, shift, total, bmin, bmax, low, high, _all_finite(nan_free, low, high)
    n = 0
    shift = 0.0
    for i in range(g.size):
        v = np.float64(g[i])
        if math.isnan(v):
            continue
        nan_free &= v == v
        b = _bin(v, lo, hi, clip, inv_delta, kmax) if transform else v
        if n == 0:
            shift = b
        total += b - shift
        low = min(low, v)
        high = max(high, v)
        bmin = min(bmin, b)
        bmax = max(bmax, b)
        n += 1
    return n, shift, total, bmin, bmax, low, high, n == 0 or _all_finite(nan_free, low, high)


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _write(g, o, stash, shift, mean, factor, s, dead_zone, transform, lo, hi, clip,
           inv_delta, kmax, omit_nan):
    """Weights of one group: ``w = u / s`` with ``u = ((b - shift) - mean) * factor``.

    ``|u| <= s`` makes the exact quotient at most 1; the clamp keeps the bound should
    LLVM ever round the extreme u differently from the m that set s.
    """
    if not (omit_nan or transform or dead_zone > 0.0):
        for i in range(g.size):
            u = ((np.float64(g[i]) - shift) - mean) * factor
            o[i] = min(max(u / s, -1.0), 1.0)
        return
    if stash and transform and not omit_nan:  # the binned rewards wait in o
        for i in range(g.size):
            u = ((o[i] - shift) - mean) * factor
            u = 0.0 if abs(u) < dead_zone else u
            o[i] = min(max(u / s, -1.0), 1.0)
        return
    for i in range(g.size):
        v = np.float64(g[i])
        if omit_nan and math.isnan(v):
            o[i] = 0.0
            continue
        b = _bin(v, lo, hi, clip, inv_delta, kmax) if transform else v
        u = ((b - shift) - mean) * factor
        u = 0.0 if abs(u) < dead_zone else u
        o[i] = min(max(u / s, -1.0), 1.0)


def _resolve(x, offsets, lo, hi, clip, delta, inv_delta, kmax, omit_nan,
             out, keep, rmin, rmax, flag):
    for q in prange(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n = 0
        nan_free = True
        low = math.inf
        high = -math.inf
        bmin = math.inf
        bmax = -math.inf
        if not omit_nan:
            n = g.size
            for i in range(n):
                v = np.float64(g[i])
                nan_free &= v == v
                b = _bin(v, lo, hi, clip, inv_delta, kmax)
                o[i] = b
                low = min(low, v)
                high = max(high, v)
                bmin = min(bmin, b)
                bmax = max(bmax, b)
        else:
            for i in range(g.size):
                v = np.float64(g[i])
                if math.isnan(v):
                    o[i] = v
                    continue
                nan_free &= v == v
                b = _bin(v, lo, hi, clip, inv_delta, kmax)
                o[i] = b
                low = min(low, v)
                high = max(high, v)
                bmin = min(bmin, b)
                bmax = max(bmax, b)
                n += 1
        keep[q] = n >= 2 and bmin != bmax
        rmin[q] = low
        rmax[q] = high
        flag[q] = 0.0 if n == 0 or _all_finite(nan_free, low, high) else math.nan


def _maxnorm(x, offsets, tau, loo, dead_zone, raw_singletons, lo, hi, clip, delta,
             inv_delta, kmax, omit_nan, out, scale, amax, keep, rmin, rmax):
    transform = clip or delta != 0.0
    stash = out.itemsize == 8  # float64 output holds binned rewards exactly
    for q in prange(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n, shift, total, bmin, bmax, low, high, finite = _scan(
            g, o, stash, transform, lo, hi, clip, inv_delta, kmax, omit_nan)
        rmin[q] = low
        rmax[q] = high
        keep[q] = n >= 2 and bmin != bmax
        scale[q] = tau
        if not finite or n == 0 or (n == 1 and not raw_singletons):
            for i in range(g.size):
                o[i] = 0.0
            amax[q] = 0.0 if finite else math.nan
            continue
        if n == 1:  # verl's convention for a lone response: baseline 0
            shift = 0.0
            mean = 0.0
            factor = 1.0
        else:
            mean = total / n
            factor = n / (n - 1.0) if loo else 1.0
        # u is an increasing affine map of the binned reward: its extremes give max |u|.
        m = max(abs(((bmin - shift) - mean) * factor), abs(((bmax - shift) - mean) * factor))
        if m < dead_zone:
            m = 0.0
        s = max(m, tau)
        scale[q] = s
        amax[q] = m / s if _is_finite(m) else math.nan
        _write(g, o, stash, shift, mean, factor, s, dead_zone, transform, lo, hi, clip,
               inv_delta, kmax, omit_nan)


_resolve_serial, _resolve_parallel = compile_pair(_resolve, FASTMATH)
_maxnorm_serial, _maxnorm_parallel = compile_pair(_maxnorm, FASTMATH)


def resolve(x, offsets, lo, hi, clip, delta, inv_delta, kmax, omit_nan):
    n_groups = offsets.size - 1
    out = np.empty_like(x)
    keep = np.empty(n_groups, dtype=np.bool_)
    rmin = np.empty(n_groups)
    rmax = np.empty(n_groups)
    flag = np.empty(n_groups)
    kernel = _resolve_parallel if x.size >= PARALLEL_MIN_SIZE else _resolve_serial
    kernel(x, offsets, lo, hi, clip, delta, inv_delta, kmax, omit_nan,
           out, keep, rmin, rmax, flag)
    return out, keep, rmin, rmax, flag


def maxnorm(x, offsets, tau, loo, dead_zone, raw_singletons, lo, hi, clip, delta,
            inv_delta, kmax, omit_nan):
    n_groups = offsets.size - 1
    out = np.empty_like(x)
    scale = np.empty(n_groups)
    amax = np.empty(n_groups)
    keep = np.empty(n_groups, dtype=np.bool_)
    rmin = np.empty(n_groups)
    rmax = np.empty(n_groups)
    kernel = _maxnorm_parallel if x.size >= PARALLEL_MIN_SIZE else _maxnorm_serial
    kernel(x, offsets, tau, loo, dead_zone, raw_singletons, lo, hi, clip, delta,
           inv_delta, kmax, omit_nan, out, scale, amax, keep, rmin, rmax)
    return out, scale, amax, keep, rmin, rmax
