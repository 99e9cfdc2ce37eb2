"""Numba engine for the Reward-Resolution Protocol and MaxNorm-AC; oracle: ``maxnorm_numpy``.

Two compiled serial loops over groups (run on chunks of groups by ``pool.run_over_groups``):
``_plain`` weights the rewards as they are; ``_groups`` first bins, clips or copies the
chunk into a float64 output, then weights it in place (``maxnorm``) or only takes each
group's zero-gap mask (``resolve``).  Groups are unsigned index ranges, not slices: a slice
costs a reference count per group, and a signed index a negative-index test that keeps the
loops scalar.  Arguments and outputs as in ``maxnorm_numpy``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from advcal._kernels.point_numba import _minus  # (v - shift) - mean, never reassociated
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
    """The float64 of a ``_key`` (a NaN's key gives a NaN: a non-finite extreme)."""
    return np.int64(k ^ ((k >> 63) & _MAGNITUDE)).view(np.float64)


@njit(inline="always")
def _bin(v, lo, hi, clip, inv_delta, kmax):
    """Clip (optionally) and bin (unless ``inv_delta == 0``) one reward; the bin index stays
    a float, exact for any finite ``(hi - lo) * inv_delta``."""
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
    """``u / s`` for u = ((b - shift) - mean) * factor, clamped to [-1, 1] should the
    compiler round an extreme u differently from the one that set s."""
    u = _dead(_minus(_minus(b, shift), mean) * factor, dead_zone)
    return min(max(u / s, -1.0), 1.0)


@njit(inline="always")
def _group_scale(n, shift, mean, bmin, bmax, tau, loo, dead_zone, raw_singletons):
    """(shift, mean, factor, s) of a group of n valid rewards from their mean minus
    ``shift`` and their extremes (u increases with b, so they give max |u|).  No advantages
    (factor 0, s = tau) below two responses, unless a lone one keeps its reward (verl)."""
    if n == 0:
        return 0.0, 0.0, 0.0, tau
    if n == 1 and raw_singletons:
        shift, mean, factor = 0.0, 0.0, 1.0
    else:
        factor = (n / (n - 1.0) if loo else 1.0) if n >= 2 else 0.0
    m = max(abs(_dead(_minus(_minus(bmin, shift), mean) * factor, dead_zone)),
            abs(_dead(_minus(_minus(bmax, shift), mean) * factor, dead_zone)))
    return shift, mean, factor, max(m, tau)


@njit(inline="always")
def _stats(x, a, b, omit_nan):
    """(count, shift, mean minus the shift, smallest, largest) of the valid ``x[a:b]``.  The
    shift is the first valid value (a zero-gap group centers to exact 0); an omitted NaN
    stands in as the shift, adding 0 and moving no extreme."""
    start = a
    while omit_nan and start < b and math.isnan(x[start]):
        start += np.uint64(1)
    shift = np.float64(x[start]) if start < b else np.float64(0.0)
    total = nans = 0.0
    klo = khi = _key(shift)
    for i in range(a, b):
        v = np.float64(x[i])
        nan = omit_nan and math.isnan(v)
        nans += nan
        v = shift if nan else v
        total += _minus(v, shift)
        klo = min(klo, _key(v))
        khi = max(khi, _key(v))
    n = b - a - nans
    mean = total / max(n, 1.0)
    if not math.isfinite(total):
        # The sum overflowed (in the vectorizer's order, near the largest doubles), or a
        # value is not finite.  The deviations over n add up to at most the largest one:
        # their sum overflows only where a deviation does.
        mean = 0.0
        for i in range(a, b):
            v = np.float64(x[i])
            mean += 0.0 if omit_nan and math.isnan(v) else _minus(v, shift) / n
    return n, shift, mean, _unkey(klo), _unkey(khi)


@njit(inline="always")
def _weights(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi,
             omit_nan, out):
    """MaxNorm weights of x into ``out``, ``keep`` and ``scale`` unless empty.  Returns the
    counts of groups with a non-finite valid reward or s, and with one outside [lo, hi]."""
    per_group = keep.size > 0
    n_bad = n_out = 0
    for q in range(offsets.size - 1):
        a, b = np.uint64(offsets[q]), np.uint64(offsets[q + 1])
        n, shift, mean, low, high = _stats(x, a, b, omit_nan)
        shift, mean, factor, s = _group_scale(n, shift, mean, low, high, tau, loo,
                                              dead_zone, raw_singletons)
        # a NaN or inf among the valid rewards makes their mean NaN or inf
        n_bad += (not math.isfinite(mean)) | (not math.isfinite(s))
        n_out += (n > 0) & ((low < lo) | (high > hi))
        if per_group:
            keep[q] = (n >= 2) & (low != high)
            scale[q] = s
        for i in range(a, b):
            v = np.float64(x[i])
            w = _weight(v, shift, mean, factor, s, dead_zone)
            out[i] = 0.0 if omit_nan and math.isnan(v) else w
    return n_bad, n_out


def _plain(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi, out):
    """MaxNorm weights of the rewards as they are (no binning, clipping or omitted NaN)."""
    return _weights(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi,
                    False, out)


def _groups(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi, clip,
            inv_delta, kmax, omit_nan, weights, out):
    """Bins the chunk into the float64 ``out`` in one long (vectorized) loop, then weights
    it in place or, ``weights`` False, sets ``keep`` only.  Returns as ``_weights``."""
    neutral = min(max(0.0, lo), hi)  # stands in for a NaN in the extremes: finite, in bounds
    nans = 0.0
    klo = khi = _key(neutral)
    for i in range(np.uint64(offsets[0]), np.uint64(offsets[offsets.size - 1])):
        v = np.float64(x[i])
        nan = math.isnan(v)
        nans += nan
        klo = min(klo, _key(neutral if nan else v))
        khi = max(khi, _key(neutral if nan else v))
        out[i] = _bin(v, lo, hi, clip, inv_delta, kmax)
    low, high = _unkey(klo), _unkey(khi)
    n_bad = ((nans > 0) & (not omit_nan)) | (not math.isfinite(low)) | (
        not math.isfinite(high))
    n_out = np.int64((low < lo) | (high > hi))
    if weights:  # (out is also the input: LLVM sees no overlap to test for)
        n_bad += _weights(offsets, scale, keep, out, tau, loo, dead_zone, raw_singletons,
                          -math.inf, math.inf, omit_nan, out)[0]
        return n_bad, n_out
    for q in range(offsets.size - 1):
        n, _, _, low, high = _stats(out, np.uint64(offsets[q]), np.uint64(offsets[q + 1]),
                                    omit_nan)
        keep[q] = (n >= 2) & (low != high)
    return n_bad, n_out


_groups_kernel = compile_serial(_groups, FASTMATH)
_plain_kernel = compile_serial(_plain, FASTMATH)

# Per-group outputs not requested: never written (size 0), so one pair serves every call.
_NO_SCALE = np.empty(0)
_NO_KEEP = np.empty(0, dtype=np.bool_)


def _sums(chunks):
    n_bad, n_out = chunks[0] if len(chunks) == 1 else np.sum(chunks, axis=0)
    return n_bad == 0, n_out == 0


def _in_dtype(x, out):
    """The float64 ``out`` in the dtype of ``x``."""
    return out if x.dtype == out.dtype else out.astype(x.dtype)


def resolve(x, offsets, lo, hi, clip, delta, inv_delta, kmax, omit_nan, threaded=None):
    keep = np.empty(offsets.size - 1, dtype=np.bool_)
    out = np.empty(x.size)
    chunks = run_over_groups(_groups_kernel, offsets, (_NO_SCALE, keep), x, 1.0, False, 0.0,
                             False, lo, hi, clip, inv_delta, kmax, omit_nan, False, out,
                             threaded=threaded)
    return (_in_dtype(x, out), keep, *_sums(chunks))


def maxnorm(x, offsets, tau, loo, dead_zone, raw_singletons, lo, hi, clip, delta,
            inv_delta, kmax, omit_nan, per_group=True, threaded=None):
    scale, keep = _NO_SCALE, _NO_KEEP
    if per_group:
        scale = np.empty(offsets.size - 1)
        keep = np.empty(offsets.size - 1, dtype=np.bool_)
    if not (clip or inv_delta != 0.0 or omit_nan):
        out = np.empty_like(x)
        chunks = run_over_groups(_plain_kernel, offsets, (scale, keep), x, tau, loo,
                                 dead_zone, raw_singletons, lo, hi, out,
                                 threaded=threaded)
    else:
        out = np.empty(x.size)  # binned rewards, then weights, in float64
        chunks = run_over_groups(_groups_kernel, offsets, (scale, keep), x, tau, loo,
                                 dead_zone, raw_singletons, lo, hi, clip, inv_delta, kmax,
                                 omit_nan, True, out, threaded=threaded)
        out = _in_dtype(x, out)
    return (out, scale, keep, *_sums(chunks))
