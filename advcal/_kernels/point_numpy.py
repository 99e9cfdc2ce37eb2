"""Numpy reference engine for the point estimators: the test oracle of ``point_numba``.

One plain loop over groups with whole-group numpy operations, written to be checked by
eye against ``docs/estimators.md``.  Same functions, signatures and outputs as the numba engine.
"""

from __future__ import annotations

import numpy as np

from advcal._kernels.modes import FIXED, GRPO, HUGE, RLOO, TINY
from advcal._kernels.oracle_groups import groups

# Non-finite rewards propagate to NaN on purpose (the wrapper raises a clear error from
# the flag), so numpy's floating-point warnings would only be noise.
_quiet = np.errstate(all="ignore")


def _flag(r):
    """0 for finite rewards, NaN otherwise: the value amax takes when no advantage is written."""
    return 0.0 if np.isfinite(r).all() else np.nan


def _centered(r):
    # Deviations from a member of the group first: a constant group centers to exact 0.
    d = r - r[0]
    return d - d.mean()


@_quiet
def center_scale(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit,
                 std_floor=0.0):
    out, amax = np.zeros_like(x), np.zeros(offsets.size - 1)  # 0 unless written
    for q, sl, valid, r in groups(x, offsets, omit_nan):
        n = r.size
        if n == 0 or (n == 1 and not raw_singletons):
            amax[q] = _flag(r)
            continue
        if n == 1:  # verl's convention for a lone response: mean 0, std 1
            u = r
            s = {GRPO: 1.0 + eps, FIXED: divisor}.get(mode, 1.0)
        else:
            u = _centered(r)
            ss = np.sum(u * u)
            # Statistics overflowed, or squares underflowed in a group with a spread: the
            # caller rescales.
            if not np.isfinite(ss) or (ss == 0.0 and (r != r[0]).any()):
                amax[q] = np.nan
                continue
            if mode == GRPO:  # std_floor: verl's grpo_vectorized
                s = max(np.sqrt(ss / (n - ddof)), std_floor) + eps
            elif mode == RLOO:
                s = (n - 1) / n
            elif mode == FIXED:
                s = divisor
            else:
                s = 1.0
        if s == 0.0 or np.isnan(s):
            amax[q] = _flag(r)
            continue
        a = u / s
        out[sl][valid] = a
        amax[q] = np.max(np.abs(a))
    return out, bool((amax <= limit).all())


@_quiet
def opo(x, weights, offsets, raw_singletons, omit_nan, limit):
    out, amax = np.zeros_like(x), np.zeros(offsets.size - 1)  # 0 unless written
    for q, sl, valid, r in groups(x, offsets, omit_nan):
        n = r.size
        if n == 0 or (n == 1 and not raw_singletons):
            amax[q] = _flag(r)
            continue
        if n == 1:
            a = r
        else:
            w = weights[sl][valid]
            w = w / w.max()  # only ratios matter; lengths near the limit would overflow
            d = r - r[0]
            a = d - np.sum(w * d) / np.sum(w)
        out[sl][valid] = a
        amax[q] = np.max(np.abs(a))
    return out, bool((amax <= limit).all())


@_quiet
def passk(x, offsets, eps, ddof, raw_singletons, omit_nan, limit, normalize=True):
    out, amax = np.zeros_like(x), np.zeros(offsets.size - 1)  # 0 unless written
    for q, sl, valid, r in groups(x, offsets, omit_nan):
        n = r.size
        if not np.isfinite(r).all():
            amax[q] = np.nan
            continue
        if n == 0 or (n == 1 and not raw_singletons):
            continue
        best = int(np.argmax(r))  # first of tied maxima
        if n == 1:
            s = 1.0 + eps if normalize else 1.0
            a = r[0] / s
        else:
            ss = np.sum(_centered(r) ** 2)
            gap = r[best] - np.sort(r)[-2]
            # Statistics overflowed, or squares underflowed in a group with a spread: the
            # caller rescales.
            if not np.isfinite(ss) or (ss == 0.0 and gap != 0.0):
                amax[q] = np.nan
                continue
            s = np.sqrt(ss / (n - ddof)) + eps if normalize else 1.0
            if s == 0.0:
                continue
            a = gap / s
        out[sl][np.flatnonzero(valid)[best]] = a
        amax[q] = abs(a)
    return out, bool((amax <= limit).all())


@_quiet
def group_moments(x, offsets, omit_nan):
    n_groups = offsets.size - 1
    count = np.zeros(n_groups, dtype=np.int64)
    mean = np.zeros(n_groups)
    ss = np.zeros(n_groups)
    for q, _, _, r in groups(x, offsets, omit_nan):
        if r.size:
            count[q] = r.size
            mean[q] = r[0] + (r - r[0]).mean()
            ss[q] = np.sum(_centered(r) ** 2)
    return count, mean, ss


@_quiet
def group_spread(x, offsets, ddof, omit_nan):
    """Per-group (count of valid rewards, std with ``ddof``, whether they differ).  Whole
    batch at once: ``bincount`` sums each group in reward order, as the kernel does, so the
    two engines agree bitwise."""
    if omit_nan:
        valid = ~np.isnan(x)
        offsets = np.concatenate(([0], np.cumsum(valid)))[offsets]
        x = x[valid]
    sizes = np.diff(offsets)
    codes = np.repeat(np.arange(sizes.size), sizes)
    x = x.astype(np.float64)
    starts = offsets[:-1][sizes > 0]
    shift = np.zeros(sizes.size)
    shift[sizes > 0] = x[starts]
    # Deviations from a member of the group: a constant group has exactly 0 spread.
    d = x - shift[codes]
    gap = np.zeros(sizes.size, dtype=np.bool_)
    top = np.zeros(sizes.size)
    if starts.size:
        gap[sizes > 0] = np.maximum.reduceat(x, starts) != np.minimum.reduceat(x, starts)
        top[sizes > 0] = np.maximum.reduceat(np.abs(d), starts)
    # A tiny (or huge) spread in units of the group's largest deviation: its squares
    # neither underflow nor overflow.
    unit = np.where(((top > TINY) & (top < HUGE)) | (top == 0.0), 1.0, top)
    z = d / unit[codes]
    t1 = np.bincount(codes, z, sizes.size)
    t2 = np.bincount(codes, z * z, sizes.size)
    mean = t1 / np.maximum(sizes, 1)
    # One pass (t2 - t1 * mean), unless it cancels (loses more than 3 bits) or the
    # deviations were rescaled: then the sum of squares around the mean.
    ss = t2 - t1 * mean
    again = (unit != 1.0) | ~(t2 <= 8.0 * ss)
    if again.any():
        ss = np.where(again, np.bincount(codes, (z - mean[codes]) ** 2, sizes.size), ss)
    std = np.where(gap, unit * np.sqrt(ss / np.maximum(sizes - ddof, 1)), 0.0)
    return sizes.astype(np.int64), std, gap
