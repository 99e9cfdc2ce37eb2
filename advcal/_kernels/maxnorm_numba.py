"""Numba engine for the Reward-Resolution Protocol and MaxNorm-AC; oracle: ``maxnorm_numpy``.

``resolve`` and ``maxnorm`` run one compiled kernel, ``_groups``: a serial loop over
groups that reads each group twice (statistics, then output) and writes only its own
slice, so ``pool.run_over_groups`` may run it on chunks of groups from several threads
with results independent of the thread count.  Arithmetic is float64 whatever the reward
dtype.  See ``maxnorm_numpy`` for the shared arguments; both functions return the
wrapper's checks ``ok`` (no group with a non-finite valid reward or max |u|) and
``in_bounds`` (no valid reward outside ``[lo, hi]``).
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


def _groups(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi, clip,
            inv_delta, kmax, omit_nan, weights, out):
    """Binned rewards (``weights`` False: omitted NaN stay NaN) or MaxNorm weights
    (omitted NaN get 0) into ``out``; ``keep`` and ``scale`` per group unless empty (not
    requested).  Returns (groups with a non-finite reward or max |u|, groups with a valid
    reward outside ``[lo, hi]``)."""
    per_group = keep.size > 0
    n_bad = 0
    n_out = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        # Pass 1 reads only: the sum's order cannot depend on where the output lies.
        n = 0
        shift = 0.0  # the first binned reward: a zero-gap group centers to exact 0
        total = 0.0
        bmin = math.inf
        bmax = -math.inf
        finite = True
        outside = False
        for i in range(g.size):
            v = np.float64(g[i])
            if omit_nan and math.isnan(v):
                continue
            finite &= abs(v) < math.inf
            outside |= (v < lo) | (v > hi)
            b = _bin(v, lo, hi, clip, inv_delta, kmax)
            if n == 0:
                shift = b
            total += b - shift
            bmin = min(bmin, b)
            bmax = max(bmax, b)
            n += 1
        n_out += outside
        if per_group:
            keep[q] = n >= 2 and bmin != bmax
        if not weights:
            for i in range(g.size):
                v = np.float64(g[i])
                o[i] = math.nan if omit_nan and math.isnan(v) else _bin(v, lo, hi, clip,
                                                                        inv_delta, kmax)
            n_bad += not finite
            continue
        if per_group:
            scale[q] = tau
        if not finite or n == 0 or (n == 1 and not raw_singletons):
            for i in range(g.size):
                o[i] = 0.0
            n_bad += not finite
            continue
        if n == 1:  # verl's convention for a lone response: baseline 0
            shift = 0.0
            mean = 0.0
            factor = 1.0
        else:
            mean = total / n
            factor = n / (n - 1.0) if loo else 1.0
        # u is an increasing function of the binned reward: its extremes give max |u|.
        m = max(abs(_dead(((bmin - shift) - mean) * factor, dead_zone)),
                abs(_dead(((bmax - shift) - mean) * factor, dead_zone)))
        n_bad += not math.isfinite(m)
        s = max(m, tau)
        if per_group:
            scale[q] = s
        for i in range(g.size):
            v = np.float64(g[i])
            if omit_nan and math.isnan(v):
                o[i] = 0.0
            else:
                o[i] = _weight(_bin(v, lo, hi, clip, inv_delta, kmax), shift, mean, factor,
                               s, dead_zone)
    return n_bad, n_out


_groups_kernel = compile_serial(_groups, FASTMATH)

# Per-group outputs not requested: never written (size 0), so one pair serves every call.
_NO_SCALE = np.empty(0)
_NO_KEEP = np.empty(0, dtype=np.bool_)


def _run(x, offsets, scale, keep, tau, loo, dead_zone, raw_singletons, lo, hi, clip,
         inv_delta, kmax, omit_nan, weights, threaded):
    out = np.empty_like(x)
    chunks = run_over_groups(_groups_kernel, offsets, (scale, keep), x, tau, loo, dead_zone,
                             raw_singletons, lo, hi, clip, inv_delta, kmax, omit_nan, weights,
                             out, threaded=threaded)
    n_bad = sum(c[0] for c in chunks)
    n_out = sum(c[1] for c in chunks)
    return out, n_bad == 0, n_out == 0


def resolve(x, offsets, lo, hi, clip, delta, inv_delta, kmax, omit_nan, threaded=None):
    keep = np.empty(offsets.size - 1, dtype=np.bool_)
    out, ok, in_bounds = _run(x, offsets, _NO_SCALE, keep, 1.0, False, 0.0, False, lo, hi,
                              clip, inv_delta, kmax, omit_nan, False, threaded)
    return out, keep, ok, in_bounds


def maxnorm(x, offsets, tau, loo, dead_zone, raw_singletons, lo, hi, clip, delta,
            inv_delta, kmax, omit_nan, per_group=True, threaded=None):
    scale, keep = _NO_SCALE, _NO_KEEP
    if per_group:
        scale = np.empty(offsets.size - 1)
        keep = np.empty(offsets.size - 1, dtype=np.bool_)
    out, ok, in_bounds = _run(x, offsets, scale, keep, tau, loo, dead_zone, raw_singletons,
                              lo, hi, clip, inv_delta, kmax, omit_nan, True, threaded)
    return out, scale, keep, ok, in_bounds
