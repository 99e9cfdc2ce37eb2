"""Numpy reference engine for the point estimators: the test oracle of ``point_numba``.

One plain loop over groups with whole-group numpy operations, written to be checked by
eye against ``docs/estimators.md``.  Same functions, signatures and outputs as the numba engine.
"""

from __future__ import annotations

import numpy as np

from advcal._kernels.modes import FIXED, GRPO, RLOO
from advcal._kernels.oracle_groups import groups

# Non-finite rewards propagate to NaN on purpose (the wrapper raises a clear error from
# the flag), so numpy's floating-point warnings would only be noise.
_quiet = np.errstate(all="ignore")


def _centered(r):
    # Deviations from a member of the group first: a constant group centers to exact 0.
    d = r - r[0]
    return d - d.mean()


@_quiet
def center_scale(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit,
                 std_floor=0.0):
    out, ok = np.zeros_like(x), True  # ok: every valid reward finite, every |a| <= limit
    for _, sl, valid, r in groups(x, offsets, omit_nan):
        n = r.size
        ok &= bool(np.isfinite(r).all())
        if n == 0 or (n == 1 and not raw_singletons):
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
                ok = False
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
            continue
        a = u / s
        out[sl][valid] = a
        ok &= bool(np.max(np.abs(a)) <= limit)
    return out, ok


@_quiet
def opo(x, weights, offsets, raw_singletons, omit_nan, limit):
    out, ok = np.zeros_like(x), True
    for _, sl, valid, r in groups(x, offsets, omit_nan):
        n = r.size
        ok &= bool(np.isfinite(r).all())
        if n == 0 or (n == 1 and not raw_singletons):
            continue
        if n == 1:
            a = r
        else:
            w = weights[sl][valid]
            w = w / w.max()  # only ratios matter; lengths near the limit would overflow
            d = r - r[0]
            a = d - np.sum(w * d) / np.sum(w)
        out[sl][valid] = a
        ok &= bool(np.max(np.abs(a)) <= limit)
    return out, ok


@_quiet
def passk(x, offsets, eps, ddof, raw_singletons, omit_nan, limit, normalize=True):
    out, ok = np.zeros_like(x), True
    for _, sl, valid, r in groups(x, offsets, omit_nan):
        n = r.size
        if not np.isfinite(r).all():
            ok = False
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
                ok = False
                continue
            s = np.sqrt(ss / (n - ddof)) + eps if normalize else 1.0
            if s == 0.0:
                continue
            a = gap / s
        out[sl][np.flatnonzero(valid)[best]] = a
        ok &= bool(abs(a) <= limit)
    return out, ok


@_quiet
def group_statistics(x, offsets, ddof, omit_nan, *, spread=True):
    """Per group: valid rewards, mean, sum of squared deviations, and with ``spread`` std
    with ``ddof`` (0 for a constant group) and whether they differ (else 0 and False)."""
    n_groups = offsets.size - 1
    count = np.zeros(n_groups, dtype=np.int64)
    mean, ss, std = np.zeros((3, n_groups))
    gap = np.zeros(n_groups, dtype=np.bool_)
    for q, _, _, r in groups(x, offsets, omit_nan):
        count[q] = r.size
        if r.size:
            mean[q] = r[0] + (r - r[0]).mean()
            ss[q] = np.sum(_centered(r) ** 2)
        if spread and r.size and r.min() != r.max():
            gap[q] = True
            # In units of a power of two (exact) within a factor 2 of max |r|: neither the
            # deviations nor their squares under- or overflow.
            unit = np.ldexp(1.0, np.frexp(np.max(np.abs(r)))[1] - 1)
            d = r / unit - r[0] / unit
            std[q] = unit * np.sqrt(np.sum((d - d.mean()) ** 2) / max(r.size - ddof, 1))
    return count, mean, ss, std, gap
