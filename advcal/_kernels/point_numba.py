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

``center_scale`` without omitted NaN (grpo, dr_grpo, rloo, batch_std, gpg in the common
call) runs in the masked loops of ``masked``, compiled without fast-math flags
(``modes.EXACT``), where ``masked.ENABLED``; elsewhere, and for every other kernel, plain
loops that LLVM vectorizes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from advcal._kernels import masked
from advcal._kernels.masked import group_sum_squares, group_sums, write_centered
from advcal._kernels.modes import EXACT, FASTMATH, FIXED, GRPO, RLOO
from advcal._kernels.pool import compile_serial, run_over_groups
from advcal._kernels.reciprocals import group_reciprocals, lookup, reciprocal_table


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


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _scale_factor(n, ss, shift, mean, inv_dof, loo, mode, eps, raw_singletons, divisor):
    """(factor, norm², shift, mean) of one group with n valid rewards, sum of squared
    deviations ``ss`` and mean ``shift + mean``: its advantages are
    (v - (shift + mean)) * factor, and ``norm²`` their squared L2 norm (NaN for a group
    with a non-finite reward).  ``inv_dof`` = 1 / (n - ddof) and ``loo`` = n / (n - 1)
    come from the caller (a table, for small groups).  A lone response that keeps its
    raw reward gets shift and mean 0.  A factor of 0 gives the group exact zeros: every
    deviation is then +0 * 0.  Selects below ``mode`` (loop-invariant), not branches."""
    if mode == GRPO:
        factor = 1.0 / (math.sqrt(ss * inv_dof) + eps)
        lone = 1.0 + eps
    elif mode == RLOO:
        factor = loo
        lone = 1.0
    elif mode == FIXED:
        factor = 1.0 / divisor
        lone = divisor
    else:
        factor = 1.0
        lone = 1.0
    factor = factor if (n >= 2) & (ss > 0.0) else 0.0
    norm = ss * factor * factor
    # verl's convention for a lone response: mean 0 and std 1.
    raw = (n == 1) & raw_singletons
    lone_factor = 1.0 / lone
    factor = lone_factor if raw else factor
    norm = (shift * lone_factor) ** 2 if raw else norm
    norm = math.nan if ss - ss != 0.0 else norm  # a NaN or inf reward
    return factor, norm, 0.0 if raw else shift, 0.0 if raw else mean


def _center_scale_masked(offsets, x, mode, eps, ddof, raw_singletons, divisor, limit, out):
    """Returns the number of flagged groups: a non-finite reward (the group's sum of
    squares is NaN/inf) or advantages whose L2 norm exceeds ``limit``, the output dtype's
    maximum (compared squared: no square root per group).  No NaN is omitted here.

    Each group is read from memory once (its second read hits L1) by the masked loops of
    ``masked``; the write loop repeats the trip count of the sums loop just before it, so
    the branch predictor gets its exit right even where group sizes vary.
    """
    n_bad = 0
    table = reciprocal_table(ddof)
    for q in range(offsets.size - 1):
        lo = offsets[q]
        n = offsets[q + 1] - lo
        shift, t1, t2, _, _ = group_sums(x, lo, n)
        inv_n, inv_dof, loo = lookup(table, n, ddof)
        mean = t1 * inv_n
        # t1 and t2 come from one pass; t2 - t1 * mean cancels, with a rounding error of a
        # few ulps of t2.  Where t2 > 8 ss (more than 3 bits lost: the shift lies far out
        # in the group's tail) the sum of squares is taken again around the mean.
        ss = t2 - t1 * mean
        if not t2 <= 8.0 * ss:
            ss = group_sum_squares(x, lo, n, shift, mean)
        factor, norm, shift, mean = _scale_factor(n, ss, shift, mean, inv_dof, loo, mode,
                                                  eps, raw_singletons, divisor)
        n_bad += not norm <= limit * limit
        write_centered(x, out, lo, n, shift, mean, factor)
    return n_bad


def _center_scale(offsets, x, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit,
                  out):
    """``_center_scale_masked`` in loops that LLVM vectorizes (CPUs without masked vector
    loads), and with NaN rewards omitted (they get 0) where asked."""
    n_bad = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n, shift, mean, ss = _moments(g, omit_nan)
        _, inv_dof, loo = group_reciprocals(n, ddof)
        factor, norm, shift, mean = _scale_factor(n, ss, shift, mean, inv_dof, loo, mode, eps,
                                                  raw_singletons, divisor)
        n_bad += not norm <= limit * limit
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
_center_scale_masked_kernel = compile_serial(_center_scale_masked, EXACT)
_opo_kernel = compile_serial(_opo, FASTMATH)
_passk_kernel = compile_serial(_passk, FASTMATH)


def center_scale(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit,
                 threaded=None):
    out = np.empty_like(x)
    if masked.ENABLED and not omit_nan:
        n_bad = run_over_groups(_center_scale_masked_kernel, offsets, (), x, mode, eps, ddof,
                                raw_singletons, divisor, limit, out, threaded=threaded,
                                fresh_output=out)
    else:
        n_bad = run_over_groups(_center_scale_kernel, offsets, (), x, mode, eps, ddof,
                                raw_singletons, omit_nan, divisor, limit, out,
                                threaded=threaded, fresh_output=out)
    return out, sum(n_bad) == 0


def opo(x, weights, offsets, raw_singletons, omit_nan, limit, threaded=None):
    out = np.empty_like(x)
    n_bad = run_over_groups(_opo_kernel, offsets, (), x, weights, raw_singletons, omit_nan,
                            limit, out, threaded=threaded, fresh_output=out)
    return out, sum(n_bad) == 0


def passk(x, offsets, eps, ddof, raw_singletons, omit_nan, limit, threaded=None):
    out = np.empty_like(x)
    n_bad = run_over_groups(_passk_kernel, offsets, (), x, eps, ddof, raw_singletons,
                            omit_nan, limit, out, threaded=threaded, fresh_output=out)
    return out, sum(n_bad) == 0


def group_moments(x, offsets, omit_nan, threaded=None):
    """Per-group (count, mean, sum of squared deviations), as center_scale computes them,
    for the batch-wide std of batch_std."""
    count, shift, mean, ss = np.empty((4, offsets.size - 1))
    run_over_groups(_statistics_kernel, offsets, (count, shift, mean, ss), x, omit_nan,
                    threaded=threaded)
    return count.astype(np.int64), shift + mean, ss
