"""Numba engine for the point estimators; oracle: ``point_numpy``.  Statistics are float64
whatever the reward dtype.  The estimators return ``(out, ok)``: ``ok`` is false when a
group held a non-finite reward, overflowed float64 (the caller retries on rescaled rewards)
or has an |advantage| above ``limit``, the output dtype's maximum.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from advcal._kernels.modes import FASTMATH, FIXED, GRPO, HUGE, RLOO, TINY
from advcal._kernels.pool import compile_serial, run_over_groups


def _exact_minus(typingctx: Any, a: Any, b: Any) -> Any:
    """``a - b`` in float64 that LLVM may not reassociate with a neighbouring sum or
    difference (see ``modes``): numba adds the kernel's fast-math flags only to float
    operations that have none, so this one carries ``nsz`` alone."""
    sig = types.float64(a, b)

    def codegen(context, builder, signature, args):
        x, y = (context.cast(builder, v, t, types.float64)
                for v, t in zip(args, signature.args, strict=True))
        return builder.fsub(x, y, flags=("nsz",))

    return sig, codegen


_minus: Any = intrinsic(_exact_minus)  # (Any: mypy would see the typing signature)


@njit(inline="always")
def _moments(g, omit_nan):
    """(count, shift, mean of g - shift, sum of squared deviations) of the valid rewards
    of one group.  Deviations are taken from a member of the group (the shift), so a
    constant group has mean and sum of squares exactly 0 in any summation order.  A NaN
    or inf reward makes the sum of squares non-finite: that is the finiteness check.
    Omitting NaN takes loops of its own: a test per reward keeps the others scalar."""
    if omit_nan:
        n = 0
        for i in range(g.size):
            n += not math.isnan(g[i])
        if n == 0:
            return 0, 0.0, 0.0, 0.0
        start = 0
        while math.isnan(g[start]):
            start += 1
        shift = np.float64(g[start])
        total = 0.0
        for i in range(g.size):
            total += 0.0 if math.isnan(g[i]) else _minus(g[i], shift)
        mean = total / n
        ss = 0.0
        for i in range(g.size):
            d = 0.0 if math.isnan(g[i]) else _minus(_minus(g[i], shift), mean)
            ss += d * d
        return n, shift, mean, ss
    n = g.size
    if n == 0:
        return 0, 0.0, 0.0, 0.0
    shift = np.float64(g[0])
    # One pass for both sums (a pass over a small group costs its loop exit).  t2 - t1 *
    # mean cancels with an error of a few ulps of t2: where t2 > 8 ss (more than 3 bits
    # lost; the shift lies far out in the group's tail) ss is taken again around the mean.
    t1 = 0.0
    t2 = 0.0
    for i in range(n):
        d = _minus(g[i], shift)
        t1 += d
        t2 += d * d
    mean = t1 / n
    ss = t2 - t1 * mean
    if not t2 <= 8.0 * ss:
        ss = 0.0
        for i in range(n):
            d = _minus(_minus(g[i], shift), mean)
            ss += d * d
    return n, shift, mean, ss


@njit(inline="always")
def _scale_factor(n, ss, shift, mean, ddof, mode, eps, raw_singletons, divisor, floor):
    """(factor, norm², shift, mean) of one group: its advantages are
    ``((v - shift) - mean) * factor`` and norm² their squared L2 norm (NaN for a group
    with a non-finite reward).  A factor of 0 gives the group exact zeros.  A lone
    response that keeps its raw reward (verl: mean 0, std 1) gets shift and mean 0."""
    if n == 1 and raw_singletons:
        lone = 1.0 + eps if mode == GRPO else divisor if mode == FIXED else 1.0
        norm = (shift / lone) ** 2 if math.isfinite(ss) else math.nan
        return 1.0 / lone, norm, 0.0, 0.0
    if n < 2 or not ss > 0.0:
        factor = 0.0
    elif mode == GRPO:  # floor: the std's lower bound (verl's grpo_vectorized)
        factor = 1.0 / (max(math.sqrt(ss / (n - ddof)), floor) + eps)
    elif mode == RLOO:
        factor = 1.0 / ((n - 1.0) / n)
    elif mode == FIXED:
        factor = 1.0 / divisor
    else:
        factor = 1.0
    norm = ss * factor * factor if math.isfinite(ss) else math.nan
    return factor, norm, shift, mean


def _center_scale(offsets, x, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit,
                  floor, out):
    """Returns the number of groups with a non-finite reward or sum of squares, or an
    |advantage| > ``limit``.  Omitted NaN rewards get 0."""
    n_bad = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n, shift, mean, ss = _moments(g, omit_nan)
        factor, norm, shift, mean = _scale_factor(n, ss, shift, mean, ddof, mode, eps,
                                                  raw_singletons, divisor, floor)
        ok = norm == norm  # NaN when ss is not finite
        if ss == 0.0 and n >= 2:
            # Not a constant group: its squares underflow (flagged, retried rescaled).
            for i in range(g.size):
                ok &= g[i] == shift or math.isnan(g[i])
        # No |advantage| exceeds the norm, so only a norm near the limit needs each value
        # checked (values that fit are returned even where their squares overflow).
        if ok and not norm < 0.25 * limit * limit:
            for i in range(g.size):
                a = (0.0 if omit_nan and math.isnan(g[i])
                     else _minus(_minus(g[i], shift), mean) * factor)
                ok &= abs(a) <= limit
        n_bad += not ok
        if omit_nan:
            for i in range(g.size):
                o[i] = (0.0 if math.isnan(g[i])
                        else _minus(_minus(g[i], shift), mean) * factor)
        else:
            for i in range(g.size):
                o[i] = _minus(_minus(g[i], shift), mean) * factor
    return n_bad


def _opo(offsets, x, weights, raw_singletons, omit_nan, limit, out):
    """Returns the number of groups with a non-finite reward or an |advantage| > limit."""
    n_bad = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        w = weights[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n, shift, _, ss = _moments(g, omit_nan)
        baseline = 0.0
        if n >= 2:
            # Weights relative to the group's largest: lengths near the float64 limit
            # would overflow the sums, and only their ratios matter.
            wmax = 0.0
            for i in range(g.size):
                if not (omit_nan and math.isnan(g[i])):
                    wmax = max(wmax, w[i])
            num = 0.0
            den = 0.0
            for i in range(g.size):
                if not (omit_nan and math.isnan(g[i])):
                    num += (w[i] / wmax) * _minus(g[i], shift)
                    den += w[i] / wmax
            baseline = num / den
        else:
            shift = 0.0
        ok = math.isfinite(ss)
        for i in range(g.size):
            if (omit_nan and math.isnan(g[i])) or (n == 1 and not raw_singletons):
                o[i] = 0.0
            else:
                a = _minus(_minus(g[i], shift), baseline)
                o[i] = a
                ok &= abs(a) <= limit
        n_bad += not ok
    return n_bad


def _passk(offsets, x, eps, ddof, normalize, raw_singletons, omit_nan, limit, out):
    """Returns the number of groups with a non-finite reward or an |advantage| > limit."""
    n_bad = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n, _, _, ss = _moments(g, omit_nan)
        best = -1  # the first of tied maxima, and the runner-up value
        top = -math.inf
        second = -math.inf
        for i in range(g.size):
            o[i] = 0.0
            v = np.float64(g[i])
            if omit_nan and math.isnan(v):
                continue
            if best < 0 or v > top:
                if best >= 0:
                    second = top
                best = i
                top = v
            elif v > second:
                second = v
        a = 0.0
        if n >= 2:
            s = math.sqrt(ss / (n - ddof)) + eps if normalize else 1.0
            if s != 0.0:
                a = (top - second) / s
        elif n == 1 and raw_singletons:
            a = top / (1.0 + eps) if normalize else top
        if best >= 0:
            o[best] = a
        # ss == 0 with a gap: the squares underflowed (rescaled by the caller).
        n_bad += not (math.isfinite(ss) and abs(a) <= limit
                      and not (ss == 0.0 and n >= 2 and top != second))
    return n_bad


def _statistics(offsets, count, mean, ss, std, gap, x, ddof, omit_nan, spread):
    """Per group: valid rewards, their mean and sum of squared deviations (as center_scale
    takes them), and with ``spread`` std with ``ddof`` (0 for a constant group) and
    whether they differ (else 0 and False)."""
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        n, shift, m, s2 = _moments(g, omit_nan)
        count[q], mean[q], ss[q], std[q], gap[q] = n, shift + m, s2, 0.0, False
        if not spread:
            continue
        low = high = shift
        for i in range(g.size):
            if not (omit_nan and math.isnan(g[i])):
                low = min(low, g[i])
                high = max(high, g[i])
        if high == low:
            continue
        gap[q] = True
        unit = 1.0
        if not TINY < max(high - shift, shift - low) < HUGE:
            # Squares of this spread under- or overflow: rewards in units of a power of two
            # near the largest |reward| (exact, and so is its reciprocal).
            power = math.frexp(max(abs(low), abs(high)))[1] - 1
            unit = math.ldexp(1.0, min(max(power, -1022), 1022))
            n, _, _, s2 = _moments(g / unit, omit_nan)
        std[q] = unit * math.sqrt(s2 / max(n - ddof, 1))


_center_scale_kernel = compile_serial(_center_scale, FASTMATH)
_opo_kernel = compile_serial(_opo, FASTMATH)
_passk_kernel = compile_serial(_passk, FASTMATH)
_statistics_kernel = compile_serial(_statistics, FASTMATH)


def center_scale(x, offsets, mode, eps, ddof, raw_singletons, omit_nan, divisor, limit,
                 threaded=None, *, std_floor=0.0):
    out = np.empty_like(x)
    n_bad = run_over_groups(_center_scale_kernel, offsets, (), x, mode, eps, ddof,
                            raw_singletons, omit_nan, divisor, limit, std_floor, out,
                            threaded=threaded)
    return out, sum(n_bad) == 0


def opo(x, weights, offsets, raw_singletons, omit_nan, limit, threaded=None):
    out = np.empty_like(x)
    n_bad = run_over_groups(_opo_kernel, offsets, (), x, weights, raw_singletons, omit_nan,
                            limit, out, threaded=threaded)
    return out, sum(n_bad) == 0


def passk(x, offsets, eps, ddof, raw_singletons, omit_nan, limit, threaded=None, *,
          normalize=True):
    out = np.empty_like(x)
    n_bad = run_over_groups(_passk_kernel, offsets, (), x, eps, ddof, normalize,
                            raw_singletons, omit_nan, limit, out, threaded=threaded)
    return out, sum(n_bad) == 0


def group_statistics(x, offsets, ddof, omit_nan, threaded=None, *, spread=True):
    """Per group: (count of valid rewards, mean, sum of squared deviations, std with
    ``ddof``, whether they differ), for batch_std, the baselines and the scale rules;
    ``spread=False`` skips the last two (0 and False), which batch_std and the baselines
    do not use."""
    n_groups = offsets.size - 1
    count = np.empty(n_groups, dtype=np.int64)
    mean, ss, std = np.empty((3, n_groups))
    gap = np.empty(n_groups, dtype=np.bool_)
    run_over_groups(_statistics_kernel, offsets, (count, mean, ss, std, gap), x, ddof,
                    omit_nan, spread, threaded=threaded)
    return count, mean, ss, std, gap
