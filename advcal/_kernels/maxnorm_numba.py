"""Numba engine for the Reward-Resolution Protocol and MaxNorm-AC; oracle: ``maxnorm_numpy``.

Two compiled kernels, serial loops over groups that write only their own slices, so
``pool.run_over_groups`` may run them on chunks of groups from several threads with
results independent of the thread count: ``_plain`` for the common call (``maxnorm``
without binning, clipping or omitted NaN) and ``_groups`` for everything else, ``resolve``
included.  Both go through ``_group_scale`` and ``_weight``; the dead-zone rule is
``_dead``.  Arithmetic is float64 whatever the reward dtype.  See ``maxnorm_numpy`` for
the shared arguments; both functions also return the wrapper's checks ``ok`` (no group
with a non-finite valid reward or max |u|) and ``in_bounds`` (no valid reward outside
``[lo, hi]``).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from advcal._kernels.pool import compile_serial, run_over_groups

# "reassoc" lets the sums vectorize (one compiled copy runs on every thread, so the order
# is the same everywhere).  No "arcp"/"contract": binning divides by ``inv_delta`` (so bin
# 70 of resolution 0.01 is the double nearest 0.7, as in numpy) and ``u / s`` must stay a
# division (a reciprocal of a subnormal ``s`` overflows).  No "nnan"/"ninf": the NaN and
# inf tests must survive.
FASTMATH = frozenset({"nsz", "reassoc"})

_MAGNITUDE = 0x7FFFFFFFFFFFFFFF


@njit(inline="always")
def _key(v):
    """An int64 in the order of the float64 v, a NaN beyond +-inf: running extremes of
    keys vectorize (integer min/max), those of floats do not."""
    b = np.float64(v).view(np.int64)
    return b ^ ((b >> 63) & _MAGNITUDE)


@njit(inline="always")
def _unkey(k):
    """The float64 of a ``_key``; a NaN's key gives a NaN, so the callers' finiteness
    test of the extremes also finds NaN rewards."""
    return np.int64(k ^ ((k >> 63) & _MAGNITUDE)).view(np.float64)


@njit(inline="always")
def _bin(v, lo, hi, clip, inv_delta, kmax):
    """Clip (optionally) and bin (unless ``inv_delta == 0``) one reward.  The bin index
    stays a float: exact for any finite ``(hi - lo) * inv_delta``."""
    if clip:
        v = min(max(v, lo), hi)
    if inv_delta == 0.0:
        return v
    k = min(max(np.rint((v - lo) * inv_delta), 0.0), kmax)
    return min(lo + k / inv_delta, hi)


@njit(inline="always")
def _dead(u, dead_zone):
    """The dead zone: a centered value with ``|u| < dead_zone`` counts as 0."""
    return 0.0 if abs(u) < dead_zone else u


@njit(inline="always")
def _weight(b, shift, mean, factor, s, dead_zone):
    """The weight of one binned reward b: ``u / s`` with ``u = ((b - shift) - mean) *
    factor``.  ``|u| <= s`` bounds the exact quotient by 1; the clamp keeps the bound
    should the compiler round an extreme u differently from the one that set s."""
    u = _dead(((b - shift) - mean) * factor, dead_zone)
    return min(max(u / s, -1.0), 1.0)


@njit(inline="always")
def _group_scale(n, shift, total, bmin, bmax, tau, loo, dead_zone, raw_singletons):
    """(shift, mean, factor, s) of one group of n valid rewards, from the sum of its
    binned rewards minus ``shift`` and its extreme binned rewards: its weights are
    ``_weight(b, shift, mean, factor, s, dead_zone)``.  u is an increasing function of the
    binned reward, so its extremes give max |u|.  A group without advantages (none or one
    response, unless ``raw_singletons``) gets factor 0 (exact zeros) and s = tau; a lone
    response keeps its reward (verl's convention: baseline 0).  The callers flag a group
    whose rewards, sum or s are not finite."""
    if n == 0:
        return 0.0, 0.0, 0.0, tau
    if n == 1 and raw_singletons:
        shift, mean, factor = 0.0, 0.0, 1.0
    else:
        mean = total / n
        factor = (n / (n - 1.0) if loo else 1.0) if n >= 2 else 0.0
    m = max(abs(_dead(((bmin - shift) - mean) * factor, dead_zone)),
            abs(_dead(((bmax - shift) - mean) * factor, dead_zone)))
    return shift, mean, factor, max(m, tau)


@njit(inline="always")
def _valid(g, omit_nan):
    """(number of valid rewards, index of the first) of one group."""
    if not omit_nan:
        return g.size, 0
    n = 0
    for i in range(g.size):
        n += not math.isnan(g[i])
    start = 0
    while start < g.size and math.isnan(g[start]):
        start += 1
    return n, start


@njit(inline="always")
def _scan(g, lo, hi, clip, inv_delta, kmax, omit_nan, with_sum):
    """Statistics of the valid rewards of one group: count, shift (the first binned
    reward: a zero-gap group then centers to exact 0), sum of binned rewards minus the
    shift (if ``with_sum``), smallest and largest binned reward, whether a reward is not
    finite, and whether one lies outside ``[lo, hi]``.  Reads only, so the sum's order
    cannot depend on where the output lies.  An omitted NaN is replaced by the first
    valid reward, which adds 0 and moves no extreme."""
    n, start = _valid(g, omit_nan)
    if n == 0:
        return 0, 0.0, 0.0, math.inf, -math.inf, False, False
    first = np.float64(g[start])
    shift = _bin(first, lo, hi, clip, inv_delta, kmax)
    total = 0.0
    if with_sum:  # (a loop of its own: a branch in the loop below keeps it scalar)
        for i in range(g.size):
            v = np.float64(g[i])
            v = first if omit_nan and math.isnan(v) else v
            total += _bin(v, lo, hi, clip, inv_delta, kmax) - shift
    low = high = _key(first)
    for i in range(g.size):
        v = np.float64(g[i])
        v = first if omit_nan and math.isnan(v) else v
        low = min(low, _key(v))
        high = max(high, _key(v))
    vmin = _unkey(low)
    vmax = _unkey(high)
    bad = not (math.isfinite(vmin) and math.isfinite(vmax))
    # binning is monotone: the extreme rewards give the extreme bins
    return (n, shift, total, _bin(vmin, lo, hi, clip, inv_delta, kmax),
            _bin(vmax, lo, hi, clip, inv_delta, kmax), bad, (vmin < lo) | (vmax > hi))


def _groups(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi, clip,
            inv_delta, kmax, omit_nan, weights, out):
    """MaxNorm weights (omitted NaN get 0) or, ``weights`` False, binned rewards (omitted
    NaN stay NaN) into ``out``; ``keep`` and ``scale`` per group unless empty (not
    requested).  Returns (groups with a non-finite reward or max |u|, groups with a valid
    reward outside ``[lo, hi]``)."""
    if not weights:  # one pass over the chunk: a long loop vectorizes, short groups not
        chunk = x[offsets[0]:offsets[offsets.size - 1]]
        binned = out[offsets[0]:offsets[offsets.size - 1]]
        for i in range(chunk.size):
            binned[i] = _bin(np.float64(chunk[i]), lo, hi, clip, inv_delta, kmax)
    per_group = keep.size > 0
    n_bad = 0
    n_out = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n, shift, total, bmin, bmax, bad, outside = _scan(g, lo, hi, clip, inv_delta, kmax,
                                                          omit_nan, weights)
        n_out += outside
        if per_group:
            keep[q] = n >= 2 and bmin != bmax
        if not weights:
            n_bad += bad
            continue
        shift, mean, factor, s = _group_scale(n, shift, total, bmin, bmax, tau, loo,
                                              dead_zone, raw_singletons)
        n_bad += bad | (not math.isfinite(total)) | (not math.isfinite(s))
        if per_group:
            scale[q] = s
        for i in range(g.size):
            v = np.float64(g[i])
            w = _weight(_bin(v, lo, hi, clip, inv_delta, kmax), shift, mean, factor, s,
                        dead_zone)
            o[i] = 0.0 if omit_nan and math.isnan(v) else w
    return n_bad, n_out


def _plain(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi, out):
    """``_groups`` for the common call: MaxNorm weights without binning, clipping or
    omitted NaN, in loops short enough for LLVM to vectorize.  A NaN or inf reward makes
    the group's sum (or an extreme) non-finite: that is the finiteness check."""
    per_group = keep.size > 0
    n_bad = 0
    n_out = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        if g.size == 0:
            if per_group:
                keep[q] = False
                scale[q] = tau
            continue
        shift = np.float64(g[0])
        total = 0.0
        klo = khi = _key(shift)
        for i in range(g.size):
            v = np.float64(g[i])
            total += v - shift
            klo = min(klo, _key(v))
            khi = max(khi, _key(v))
        low = _unkey(klo)
        high = _unkey(khi)
        n_out += (low < lo) | (high > hi)
        shift, mean, factor, s = _group_scale(g.size, shift, total, low, high, tau, loo,
                                              dead_zone, raw_singletons)
        n_bad += (not math.isfinite(total)) | (not math.isfinite(low)) | (
            not math.isfinite(high)) | (not math.isfinite(s))
        if per_group:
            keep[q] = (g.size >= 2) & (low != high)
            scale[q] = s
        for i in range(g.size):
            o[i] = _weight(np.float64(g[i]), shift, mean, factor, s, dead_zone)
    return n_bad, n_out


_groups_kernel = compile_serial(_groups, FASTMATH)
_plain_kernel = compile_serial(_plain, FASTMATH)

# Per-group outputs not requested: never written (size 0), so one pair serves every call.
_NO_SCALE = np.empty(0)
_NO_KEEP = np.empty(0, dtype=np.bool_)


def _sums(chunks):
    n_bad, n_out = chunks[0] if len(chunks) == 1 else np.sum(chunks, axis=0)
    return n_bad == 0, n_out == 0


def resolve(x, offsets, lo, hi, clip, delta, inv_delta, kmax, omit_nan, threaded=None):
    keep = np.empty(offsets.size - 1, dtype=np.bool_)
    out = np.empty_like(x)
    chunks = run_over_groups(_groups_kernel, offsets, (_NO_SCALE, keep), x, 1.0, False, 0.0,
                             False, lo, hi, clip, inv_delta, kmax, omit_nan, False, out,
                             threaded=threaded)
    return (out, keep, *_sums(chunks))


def maxnorm(x, offsets, tau, loo, dead_zone, raw_singletons, lo, hi, clip, delta,
            inv_delta, kmax, omit_nan, per_group=True, threaded=None):
    scale, keep = _NO_SCALE, _NO_KEEP
    if per_group:
        scale = np.empty(offsets.size - 1)
        keep = np.empty(offsets.size - 1, dtype=np.bool_)
    out = np.empty_like(x)
    if not (clip or inv_delta != 0.0 or omit_nan):
        chunks = run_over_groups(_plain_kernel, offsets, (scale, keep), x, tau, loo,
                                 dead_zone, raw_singletons, lo, hi, out, threaded=threaded)
    else:
        chunks = run_over_groups(_groups_kernel, offsets, (scale, keep), x, tau, loo,
                                 dead_zone, raw_singletons, lo, hi, clip, inv_delta, kmax,
                                 omit_nan, True, out, threaded=threaded)
    return (out, scale, keep, *_sums(chunks))
