"""Numpy reference engine for the Reward-Resolution Protocol and MaxNorm-AC: the oracle of
``maxnorm_numba``, one plain loop over groups checked by eye against ``docs/maxnorm.md``.

Arguments (validated by ``advcal.resolution``): bounds ``lo, hi`` (infinite when none),
``clip`` into them; resolution ``delta`` (0: no binning), ``inv_delta = 1 / delta`` and the
top bin ``kmax``: bin ``k = rint((r - lo) * inv_delta)`` in ``[0, kmax]``, binned reward
``min(lo + k / inv_delta, hi)`` (dividing by ``inv_delta = 100`` puts bin 70 exactly on the
double nearest 0.7); ``omit_nan`` leaves NaN rewards out (weight 0, or NaN when resolved).
Both functions also return ``ok`` (no non-finite valid reward) and ``in_bounds`` (no valid
reward outside ``[lo, hi]``).
"""

from __future__ import annotations

import numpy as np

from advcal._kernels.oracle_groups import groups


def _bin(r, lo, hi, clip, delta, inv_delta, kmax):
    """Clip (optionally) and bin float64 rewards; the bin index stays a float."""
    if clip:
        r = np.clip(r, lo, hi)
    if delta == 0.0:
        return r
    with np.errstate(invalid="ignore"):
        k = np.clip(np.rint((r - lo) * inv_delta), 0.0, kmax)
        return np.minimum(lo + k / inv_delta, hi)


def _extremes(r):
    if r.size == 0:
        return np.inf, -np.inf
    return float(np.min(r)), float(np.max(r))


def _checks(flag, rmin, rmax, lo, hi):
    """(ok, in_bounds) from per-group flags (NaN: non-finite) and extremes."""
    return (bool(np.isfinite(flag).all()),
            bool(rmin.min(initial=np.inf) >= lo and rmax.max(initial=-np.inf) <= hi))


def _flag(r):
    return 0.0 if np.isfinite(r).all() else np.nan


def resolve(x, offsets, lo, hi, clip, delta, inv_delta, kmax, omit_nan):
    """Binned rewards (NaN kept where omitted), ``keep``, ``ok``, ``in_bounds``."""
    n_groups = offsets.size - 1
    out = np.empty_like(x)
    keep = np.zeros(n_groups, dtype=np.bool_)
    rmin = np.full(n_groups, np.inf)
    rmax = np.full(n_groups, -np.inf)
    flag = np.zeros(n_groups)
    for q, sl, valid, r in groups(x, offsets, omit_nan):
        rmin[q], rmax[q] = _extremes(r)
        flag[q] = _flag(r)
        b = _bin(r, lo, hi, clip, delta, inv_delta, kmax)
        group = np.full(valid.size, np.nan)
        group[valid] = b
        out[sl] = group
        keep[q] = b.size >= 2 and np.min(b) != np.max(b)
    return (out, keep, *_checks(flag, rmin, rmax, lo, hi))


def maxnorm(x, offsets, tau, loo, dead_zone, raw_singletons, lo, hi, clip, delta,
            inv_delta, kmax, omit_nan, per_group=True):
    """MaxNorm-AC weights, ``scale`` s_q, ``keep``, ``ok``, ``in_bounds`` (``per_group``
    is the numba engine's option to skip scale and keep; computed here all the same)."""
    n_groups = offsets.size - 1
    out = np.zeros_like(x)
    scale = np.full(n_groups, tau)
    flag = np.zeros(n_groups)  # NaN: a non-finite reward or max |u|
    keep = np.zeros(n_groups, dtype=np.bool_)
    rmin = np.full(n_groups, np.inf)
    rmax = np.full(n_groups, -np.inf)
    for q, sl, valid, r in groups(x, offsets, omit_nan):
        n = r.size
        rmin[q], rmax[q] = _extremes(r)
        if not np.isfinite(r).all():
            flag[q] = np.nan
            continue
        b = _bin(r, lo, hi, clip, delta, inv_delta, kmax)
        keep[q] = n >= 2 and np.min(b) != np.max(b)
        if n == 0 or (n == 1 and not raw_singletons):
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            if n == 1:  # verl's convention for a lone response: baseline 0
                u = b
            else:
                # Deviations from a member first: a zero-gap group centers to exact 0.
                d = b - b[0]
                mean = d.mean()
                if not np.isfinite(mean):  # the sum overflowed; the mean need not
                    mean = (d / n).sum()
                u = (d - mean) * (n / (n - 1.0) if loo else 1.0)
            u = np.where(np.abs(u) < dead_zone, 0.0, u)
            s = max(float(np.max(np.abs(u))), tau)
            w = np.clip(u / s, -1.0, 1.0)
        scale[q] = s
        out[sl][valid] = w
        flag[q] = _flag(np.max(np.abs(u)))
    return (out, scale, keep, *_checks(flag, rmin, rmax, lo, hi))
