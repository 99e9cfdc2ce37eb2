"""Numba kernels for the point estimators (DESIGN §2); oracle: ``point_numpy``.

Kernels trust their inputs (the public wrappers validated them).  Each is one serial loop
over groups that writes only its own groups' slices; ``pool.run_over_groups`` runs it on
chunks of groups from several threads, so results do not depend on the thread count.
Statistics accumulate in float64 whatever the reward dtype.

Every engine function returns ``(out, ok)``: the advantages and ``ok``, false when some
group held a non-finite reward or the magnitude of its advantages (``center_scale``: their
L2 norm; ``opo``/``passk``: their largest |value|) exceeds ``limit``, the output dtype's
maximum.  A NaN or infinite reward makes its group's sum of squares non-finite, so
finiteness is checked once per group, without a pass over the rewards.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from advcal._kernels.modes import FASTMATH, FIXED, GRPO, RLOO
from advcal._kernels.pool import compile_serial, run_over_groups


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _moments(g, omit_nan):
    """(count, shift, mean of g - shift, sum of squared deviations) of one group ``g``.

    Deviations are taken from a member of the group (the shift): a constant group has
    deviations, mean and sum of squares exactly 0 (t1 = t2 = 0 below), whatever the dtype
    or value, and in whatever order the sums are reassociated.  Loops index a view ``g`` with
    non-negative indices: indexing ``x[lo + i]`` blocks vectorization (6x slower).
    """
    n = g.size
    if omit_nan:
        start = 0
        while start < n and math.isnan(g[start]):
            start += 1
        if start == n:
            return 0, 0.0, 0.0, 0.0
        shift = np.float64(g[start])
        total = 0.0
        count = 0
        for i in range(start, n):
            if not math.isnan(g[i]):
                total += g[i] - shift
                count += 1
        mean = total / count
        ss = 0.0
        for i in range(start, n):
            if not math.isnan(g[i]):
                d = (g[i] - shift) - mean
                ss += d * d
        return count, shift, mean, ss
    if n == 0:
        return 0, 0.0, 0.0, 0.0
    shift = np.float64(g[0])
    # One pass for both sums: on small ragged groups every loop costs its mispredicted
    # exits, and this saves one of the three per group (ragged 2**24: 1.62x -> 1.45x a
    # copy).  t2 - t1 * mean cancels; its rounding error is a few ulps of t2, so where
    # t2 > 8 ss (more than 3 bits lost, e.g. the shift is far out in the group's tail)
    # the sum of squares is taken again around the mean, as two-pass does throughout.
    t1 = 0.0
    t2 = 0.0
    for i in range(n):
        d = g[i] - shift
        t1 += d
        t2 += d * d
    mean = t1 / n
    ss = t2 - t1 * mean
    if not t2 <= 8.0 * ss:
        ss = 0.0
        for i in range(n):
            d = (g[i] - shift) - mean
            ss += d * d
    return n, shift, mean, ss


def _statistics(offsets, count, shift, mean, ss, x, omit_nan):
    for q in range(offsets.size - 1):
        count[q], shift[q], mean[q], ss[q] = _moments(x[offsets[q]:offsets[q + 1]], omit_nan)


@njit(cache=True, inline="always")
def _divisor(mode, n, ss, eps, ddof, divisor):
    if mode == GRPO:
        return math.sqrt(ss / (n - ddof)) + eps
    if mode == RLOO:
        return (n - 1.0) / n
    if mode == FIXED:
        return divisor
    return 1.0


# One pass over groups that reads each group once from memory (its second and third
# reads hit L1) and keeps every per-group quantity in registers.  Measured at 2**24
# rewards on 2 threads: 1.2-1.5x a memory copy, where three passes over the batch
# (statistics, divisors, writes) with per-group arrays in between took 2.0-2.5x.


def _center_scale(offsets, x, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit, out):
    """Returns the number of flagged groups: a non-finite reward (the group's sum of
    squares is NaN/inf) or advantages whose L2 norm exceeds ``limit``, the output dtype's
    maximum (compared squared: no square root per group)."""
    n_bad = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n, shift, mean, ss = _moments(g, omit_nan)
        # factor 0 where the group gets zeros: every deviation (g - shift) - mean is then
        # exactly +0, so the write loop needs no branch.
        factor = 0.0
        norm = 0.0
        if ss - ss != 0.0:  # NaN or inf
            norm = math.nan
        elif n >= 2:
            if ss > 0.0:
                factor = 1.0 / _divisor(mode, n, ss, eps, ddof, divisor)
                norm = ss * factor * factor
        elif n == 1 and raw_singletons:
            # verl's convention for a lone response: mean 0 and std 1.
            factor = 1.0 / (1.0 + eps if mode == GRPO else (divisor if mode == FIXED else 1.0))
            norm = (shift * factor) ** 2
            shift = 0.0
            mean = 0.0
        if not norm <= limit * limit:
            n_bad += 1
        if omit_nan:
            for i in range(g.size):
                o[i] = 0.0 if math.isnan(g[i]) else ((g[i] - shift) - mean) * factor
        else:
            for i in range(g.size):
                o[i] = ((g[i] - shift) - mean) * factor
    return n_bad


def _opo(offsets, x, weights, raw_singletons, omit_nan, limit, out):
    """Returns the number of groups with a non-finite reward or an |advantage| > limit."""
    n_bad = 0
    for q in range(offsets.size - 1):
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
        if not (finite and group_max <= limit):
            n_bad += 1
    return n_bad


def _passk(offsets, x, eps, ddof, raw_singletons, omit_nan, limit, out):
    """Returns the number of groups with a non-finite reward or an |advantage| > limit."""
    n_bad = 0
    for q in range(offsets.size - 1):
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
            s = math.sqrt(ss / (n - ddof)) + eps
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
        if ss - ss != 0.0:  # a NaN/inf anywhere in the group (or overflow), even off the best
            group_max = math.nan
        if not group_max <= limit:
            n_bad += 1
    return n_bad


_statistics_kernel = compile_serial(_statistics, FASTMATH)
_center_scale_kernel = compile_serial(_center_scale, FASTMATH)
_opo_kernel = compile_serial(_opo, FASTMATH)
_passk_kernel = compile_serial(_passk, FASTMATH)


def center_scale(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit,
                 threaded=None):
    out = np.empty_like(x)
    n_bad = run_over_groups(_center_scale_kernel, offsets, (), x, mode, eps, ddof,
                            raw_singletons, omit_nan, divisor, limit, out, threaded=threaded)
    return out, sum(n_bad) == 0


def opo(x, weights, offsets, raw_singletons, omit_nan, limit, threaded=None):
    out = np.empty_like(x)
    n_bad = run_over_groups(_opo_kernel, offsets, (), x, weights, raw_singletons, omit_nan,
                            limit, out, threaded=threaded)
    return out, sum(n_bad) == 0


def passk(x, offsets, eps, ddof, raw_singletons, omit_nan, limit, threaded=None):
    out = np.empty_like(x)
    n_bad = run_over_groups(_passk_kernel, offsets, (), x, eps, ddof, raw_singletons,
                            omit_nan, limit, out, threaded=threaded)
    return out, sum(n_bad) == 0


def group_moments(x, offsets, omit_nan, threaded=None):
    """Per-group (count, mean, sum of squared deviations), as center_scale computes them,
    for the batch-wide std of batch_std."""
    count, shift, mean, ss = np.empty((4, offsets.size - 1))
    run_over_groups(_statistics_kernel, offsets, (count, shift, mean, ss), x, omit_nan,
                    threaded=threaded)
    return count.astype(np.int64), shift + mean, ss
