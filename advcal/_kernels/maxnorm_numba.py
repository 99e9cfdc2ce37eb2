"""Numba kernels for the Reward-Resolution Protocol and MaxNorm-AC; oracle: ``maxnorm_numpy``.

Kernels trust their inputs (``advcal.resolution`` validated them).  Each is one serial loop
over groups that writes only its own groups' slices; ``pool.run_over_groups`` runs it on
chunks of groups from several threads, so results do not depend on the thread count.  All
arithmetic is float64 whatever the reward dtype.  Groups are read through views
(``x[lo:hi]`` with ``range(g.size)``), so numba knows the indices are in bounds.  See
``maxnorm_numpy`` for the meaning of the shared arguments and outputs.

``maxnorm`` reads each group twice and writes it once: the first pass finds the group
mean and the extreme binned rewards, which give ``max |u|`` directly (u is an increasing
affine map of the binned reward), so the second pass can write ``w = u / s`` at once.

The common calls (``maxnorm`` without binning, clipping or omitted NaN; ``maxnorm`` with
binning, without omitted NaN; ``resolve_rewards`` without omitted NaN) run in the masked
loops of ``masked``, compiled without fast-math flags
(``modes.EXACT``), where ``masked.ENABLED``; elsewhere, and for the other calls, plain
loops that LLVM vectorizes.

Every kernel returns ``(n_bad, n_out)`` for the wrapper's O(1) checks: the number of
groups with a non-finite valid reward (or an overflowing max |u|), and of groups with a
valid reward outside ``[lo, hi]``.  Where rewards are binned, the loops keep no float
min/max: the extremes come from integer bin indices and finiteness from a count of
``|v| < inf``, so every reduction vectorizes (measured 3x faster than float min/max
reductions, which LLVM leaves scalar).  Finiteness is never read off a float sum such as
``sum(v - v)``: with "reassoc" LLVM may rewrite it to 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic, overload

from advcal._kernels import masked
from advcal._kernels.masked import (
    group_sums,
    write_binned,
    write_binned_weights,
    write_weights,
)
from advcal._kernels.modes import EXACT
from advcal._kernels.pool import compile_serial, run_over_groups
from advcal._kernels.reciprocals import group_reciprocals, lookup, reciprocal_table

# "nsz" (min/max may ignore the sign of zero) and "reassoc" (group sums vectorize; one
# compiled copy runs on every thread, so the order LLVM picks is the same everywhere).
# No "arcp" or "contract": binning divides by ``inv_delta`` and must not become a
# multiplication by ``delta`` fused into an FMA, or bins would land off the decimal grid
# the numpy reference hits (lo + k / 100 is the double nearest the decimal; lo + 0.01 * k
# is not).  No "nnan"/"ninf": ``v == v`` and ``|v| < inf`` must stay NaN/inf detectors.
FASTMATH = frozenset({"nsz", "reassoc"})

_NO_BIN = np.int64(1) << 62  # above every bin index: the start of a running minimum

# _ADDRESS_FREE_SUMS: no loop here both writes the output and sums floats.  LLVM guards a
# vectorized loop that reads ``g`` and writes ``o`` with a runtime check that the two do
# not overlap, and runs a scalar copy where it cannot tell; under "reassoc" the two copies
# sum in different orders.  A sum taken in such a loop then depended on where numpy put
# the output (measured: the last bit of MaxNorm weights changed when the output array
# lay within 31 elements of the rewards).  Integer counts and min/max are exact in any
# order and may stay there.


def _no_nan(name: str) -> Any:
    """``name`` (llvm.minnum or llvm.maxnum) of two float64 values, flagged "nnan"."""

    def typing(typingctx, a, b):
        def codegen(context, builder, signature, args):
            double = ir.DoubleType()
            fn = builder.module.declare_intrinsic(name, [double],
                                                  ir.FunctionType(double, [double, double]))
            return builder.call(fn, args, fastmath=("nnan", "nsz"))

        return types.float64(types.float64, types.float64), codegen

    typing.__name__ = typing.__qualname__ = name.replace(".", "_") + "_no_nan"
    return intrinsic(typing)


# LLVM vectorizes a running min/max only as minnum/maxnum flagged "nnan"; numba's min and
# max stay scalar (measured: a group loop with a sum, min and max took 7.1 us on 8192
# rewards, 2.1 us with these).  A NaN operand gives an unspecified value, so callers test
# finiteness separately and never branch on a result that a NaN may have reached.
_min_no_nan = _no_nan("llvm.minnum")
_max_no_nan = _no_nan("llvm.maxnum")


@njit(cache=True, inline="always")
def _is_finite(v):
    # The kernels' fast-math flags carry no "nnan"/"ninf": no rewrite may assume the value
    # finite.  (Inlined: a call per group made the caller save its vector registers.)
    return math.isfinite(v)


@njit(cache=True, inline="always")
def _all_finite(nan_free, low, high):
    """Finiteness of a group from a per-reward ``v == v`` flag (cheap, and kept by LLVM
    without the "nnan" flag) and its extreme raw rewards (which carry any inf)."""
    return nan_free and _is_finite(low) and _is_finite(high)


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _bin_index(v, lo, hi, clip, inv_delta, kmax):
    """Bin index k (a float) of one reward, clipped first if asked.

    Branch-free min/max so that the loops vectorize; they may turn a NaN into a bound,
    which is harmless: callers test the raw reward for finiteness.
    """
    if clip:
        v = min(max(v, lo), hi)
    return min(max(np.rint((v - lo) * inv_delta), 0.0), kmax)


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _bin(v, lo, hi, clip, inv_delta, kmax):
    """Clip (optionally) and bin (unless ``inv_delta == 0``) one reward."""
    if inv_delta == 0.0:
        return min(max(v, lo), hi) if clip else v
    return min(lo + _bin_index(v, lo, hi, clip, inv_delta, kmax) / inv_delta, hi)


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _scan(g, o, stash, transform, lo, hi, clip, inv_delta, kmax, omit_nan):
    """Statistics of the valid rewards of one group ``g``: count, shift (the first binned
    reward: a zero-gap group then centers to exact 0), sum of binned rewards minus the
    shift, smallest and largest binned reward, finiteness, and whether a valid reward
    lies outside ``[lo, hi]``.  With ``stash`` (float64 output) the binned rewards are
    kept in ``o`` for ``_write``."""
    bmin = math.inf
    bmax = -math.inf
    low = math.inf
    high = -math.inf
    nan_free = True
    n = 0
    shift = 0.0
    for i in range(g.size):
        v = np.float64(g[i])
        if omit_nan and math.isnan(v):
            continue
        nan_free &= v == v
        b = _bin(v, lo, hi, clip, inv_delta, kmax) if transform else v
        if stash and transform:
            o[i] = b
        if n == 0:
            shift = b
        low = min(low, v)
        high = max(high, v)
        bmin = min(bmin, b)
        bmax = max(bmax, b)
        n += 1
    # The float sum in a loop of its own that writes nothing (see _ADDRESS_FREE_SUMS).
    total = 0.0
    for i in range(g.size):
        v = np.float64(g[i])
        if not (omit_nan and math.isnan(v)):
            total += (_bin(v, lo, hi, clip, inv_delta, kmax) if transform else v) - shift
    finite = n == 0 or _all_finite(nan_free, low, high)
    return n, shift, total, bmin, bmax, finite, low < lo or high > hi


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _write(g, o, stash, shift, mean, factor, s, dead_zone, transform, lo, hi, clip,
           inv_delta, kmax, omit_nan):
    """Weights of one group: ``w = u / s`` with ``u = ((b - shift) - mean) * factor``.

    ``|u| <= s`` makes the exact quotient at most 1; the clamp keeps the bound should
    LLVM ever round the extreme u differently from the m that set s.
    """
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


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _centering(n, total, shift, loo, raw_singletons):
    """(shift, mean, factor) of u = ((b - shift) - mean) * factor for a group of n >= 1
    with ``total`` = sum(b - shift).  A lone response (shift = itself, mean 0) centers to
    exact 0 with no branch in the loops; ``raw_singletons`` sets its baseline to 0 instead
    (verl's convention)."""
    factor = n / (n - 1.0) if loo and n >= 2 else 1.0
    return (0.0 if n == 1 and raw_singletons else shift), total / n, factor


@njit(cache=True, inline="always", fastmath=set(FASTMATH))
def _max_abs_u(bmin, bmax, shift, mean, factor):
    # u is an increasing affine map of the binned reward: its extremes give max |u|.
    return max(abs(((bmin - shift) - mean) * factor), abs(((bmax - shift) - mean) * factor))


@njit(cache=True, inline="always")
def _plain_group(n, total, shift, low, high, inv_n, loo_factor, tau, loo, dead_zone,
                 raw_singletons, lo, hi):
    """The scalars of one group of ``maxnorm`` without binning, from its size n >= 1, the
    sum of v - shift, its extreme rewards and ``reciprocals.group_reciprocals``: (shift,
    mean, factor) of u = ((v - shift) - mean) * factor, the scale s, and whether the group
    is bad (a non-finite reward or u), lies outside ``[lo, hi]``, and is kept.  A lone
    response (shift = itself, mean 0) centers to exact 0; ``raw_singletons`` sets its
    baseline to 0 instead (verl's convention).  No branch depends on low or high
    (unspecified after a NaN; the total is then NaN and the group flagged): & and |
    instead of "and" and "or"."""
    outside = (low < lo) | (high > hi)
    shift = 0.0 if (n == 1) & raw_singletons else shift
    mean = total * inv_n
    factor = loo_factor if loo & (n >= 2) else 1.0
    m = _max_abs_u(low, high, shift, mean, factor)
    bad = not (_is_finite(total) & _is_finite(m))
    s = max(0.0 if m < dead_zone else m, tau)
    return shift, mean, factor, s, bad, outside, (n >= 2) & (low != high)


def _resolve_masked(offsets, keep, x, lo, hi, clip, inv_delta, kmax, out):
    """``_resolve`` with binning and without omitted NaN (the common call), in the masked
    loops of ``masked.write_binned``."""
    n_bad = 0
    n_out = 0
    for q in range(offsets.size - 1):
        start = offsets[q]
        n = offsets[q + 1] - start
        n_nan, low, high, _, _ = write_binned(x, out, start, n, lo, hi, clip, inv_delta,
                                              kmax)
        # (no branch on low/high, which a NaN leaves unspecified)
        n_bad += (n_nan != 0) | (not _is_finite(low)) | (not _is_finite(high))
        n_out += (n > 0) & ((low < lo) | (high > hi))
        kmin = _bin_index(low, lo, hi, clip, inv_delta, kmax)
        kbig = _bin_index(high, lo, hi, clip, inv_delta, kmax)
        keep[q] = (n >= 2) & (kmin != kbig)
    return n_bad, n_out


def _resolve(offsets, keep, x, lo, hi, clip, delta, inv_delta, kmax, omit_nan, out):
    n_bad = 0
    n_out = 0
    if not omit_nan and inv_delta != 0.0:
        # The common call in one loop of its own: 2x faster than through _scan.
        for q in range(offsets.size - 1):
            g = x[offsets[q]:offsets[q + 1]]
            o = out[offsets[q]:offsets[q + 1]]
            n_finite = 0
            kmin = _NO_BIN
            kbig = -_NO_BIN
            for i in range(g.size):
                v = np.float64(g[i])
                n_finite += abs(v) < math.inf
                n_out += (v < lo) | (v > hi)
                k = _bin_index(v, lo, hi, clip, inv_delta, kmax)
                o[i] = min(lo + k / inv_delta, hi)
                kmin = min(kmin, np.int64(k))
                kbig = max(kbig, np.int64(k))
            keep[q] = g.size >= 2 and kmin != kbig
            n_bad += n_finite != g.size
        return n_bad, n_out
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        if omit_nan:
            for i in range(g.size):  # omitted rewards stay NaN
                o[i] = math.nan
        # stash: the binned rewards are the output (rounded once, if float32)
        n, _, _, bmin, bmax, finite, outside = _scan(g, o, True, True, lo, hi, clip,
                                                     inv_delta, kmax, omit_nan)
        keep[q] = n >= 2 and bmin != bmax
        n_bad += not finite
        n_out += outside
    return n_bad, n_out


def _maxnorm(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi, clip,
             delta, inv_delta, kmax, omit_nan, out):
    """Writes the weights, and ``scale``/``keep`` unless they are empty (not requested)."""
    transform = clip or delta != 0.0
    stash = out.itemsize == 8  # float64 output holds binned rewards exactly
    per_group = scale.size > 0
    n_bad = 0
    n_out = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n, shift, total, bmin, bmax, finite, outside = _scan(
            g, o, stash, transform, lo, hi, clip, inv_delta, kmax, omit_nan)
        n_out += outside
        if per_group:
            keep[q] = n >= 2 and bmin != bmax
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
        m = _max_abs_u(bmin, bmax, shift, mean, factor)
        if m < dead_zone:
            m = 0.0
        s = max(m, tau)
        if per_group:
            scale[q] = s
        n_bad += not _is_finite(m)
        _write(g, o, stash, shift, mean, factor, s, dead_zone, transform, lo, hi, clip,
               inv_delta, kmax, omit_nan)
    return n_bad, n_out


def _maxnorm_binned(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi,
                    clip, inv_delta, kmax, out):
    """``_maxnorm`` with binning and without omitted NaN, in loops of its own (every
    reduction a sum or an integer min/max: see the module docstring)."""
    stash = out.itemsize == 8  # float64 output holds binned rewards exactly
    per_group = scale.size > 0
    n_bad = 0
    n_out = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n = g.size
        if per_group:
            keep[q] = False
            scale[q] = tau
        if n == 0:
            continue
        shift = _bin(np.float64(g[0]), lo, hi, clip, inv_delta, kmax)
        n_finite = 0
        kmin = _NO_BIN
        kbig = -_NO_BIN
        for i in range(n):
            v = np.float64(g[i])
            n_finite += abs(v) < math.inf
            n_out += (v < lo) | (v > hi)
            k = _bin_index(v, lo, hi, clip, inv_delta, kmax)
            # (a NaN reward gives some index here, on x86 INT64_MIN; its group is flagged)
            kmin = min(kmin, np.int64(k))
            kbig = max(kbig, np.int64(k))
            o[i] = min(lo + k / inv_delta, hi)  # float32 output: rounded, binned again below
        # The float sum in a loop of its own that writes nothing (see _ADDRESS_FREE_SUMS).
        total = 0.0
        if stash:
            for i in range(n):
                total += o[i] - shift
        else:
            for i in range(n):
                total += _bin(np.float64(g[i]), lo, hi, clip, inv_delta, kmax) - shift
        shift, mean, factor = _centering(n, total, shift, loo, raw_singletons)
        m = _max_abs_u(min(lo + kmin / inv_delta, hi), min(lo + kbig / inv_delta, hi), shift,
                       mean, factor)
        if m < dead_zone:
            m = 0.0
        s = max(m, tau)
        if per_group:
            keep[q] = n >= 2 and kmin != kbig
            scale[q] = s
        n_bad += not (n_finite == n and _is_finite(m))
        if stash:
            for i in range(n):
                u = ((o[i] - shift) - mean) * factor
                u = 0.0 if abs(u) < dead_zone else u
                o[i] = min(max(u / s, -1.0), 1.0)
        else:
            for i in range(n):
                b = _bin(np.float64(g[i]), lo, hi, clip, inv_delta, kmax)
                u = ((b - shift) - mean) * factor
                u = 0.0 if abs(u) < dead_zone else u
                o[i] = min(max(u / s, -1.0), 1.0)
    return n_bad, n_out


def _maxnorm_plain(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo, hi, out):
    """``_maxnorm`` without binning, clipping or omitted NaN: the common call,
    in two branch-free loops per group (8192 rewards: 7.5 us, the general kernel 24 us).

    A NaN or infinite reward makes the group's sum NaN or infinite (reassociation adds
    the same terms in another order, and no term is subtracted again), so that sum is
    the finiteness check.  A flagged group's weights are left as computed: the wrapper
    raises.
    """
    per_group = scale.size > 0
    n_bad = 0
    n_out = 0
    for q in range(offsets.size - 1):
        g = x[offsets[q]:offsets[q + 1]]
        o = out[offsets[q]:offsets[q + 1]]
        n = g.size
        if per_group:
            keep[q] = False
            scale[q] = tau
        if n == 0:
            continue
        shift = np.float64(g[0])
        total = 0.0
        low = math.inf
        high = -math.inf
        for i in range(n):
            v = np.float64(g[i])
            total += v - shift
            low = _min_no_nan(low, v)
            high = _max_no_nan(high, v)
        inv_n, _, loo_factor = group_reciprocals(n, 0)
        shift, mean, factor, s, bad, outside, group_keep = _plain_group(
            n, total, shift, low, high, inv_n, loo_factor, tau, loo, dead_zone,
            raw_singletons, lo, hi)
        n_bad += bad
        n_out += outside
        if per_group:
            keep[q] = group_keep
            scale[q] = s
        if dead_zone > 0.0:  # (the select measured 10% on the common call without)
            for i in range(n):
                u = ((np.float64(g[i]) - shift) - mean) * factor
                u = 0.0 if abs(u) < dead_zone else u
                o[i] = min(max(u / s, -1.0), 1.0)
        else:
            for i in range(n):
                u = ((np.float64(g[i]) - shift) - mean) * factor
                o[i] = min(max(u / s, -1.0), 1.0)
    return n_bad, n_out


@njit(cache=True, inline="always")
def _write_group_weights(source, out, start, n, shift, mean, factor, s, dead_zone):
    """``masked.write_weights`` of one group, without the dead zone's select where there is
    none (the common call)."""
    if dead_zone > 0.0:
        write_weights(source, out, start, n, shift, mean, factor, s, dead_zone)
    else:
        write_weights(source, out, start, n, shift, mean, factor, s, None)


def _write_binned_group_weights(x, out, start, n, lo, hi, clip, inv_delta, kmax, shift,
                                mean, factor, s, dead_zone):
    """The weights of one binned group whose bins ``masked.write_binned`` left in ``out``:
    read back in place from a float64 ``out``, binned again from ``x`` for a float32 one
    (which rounded them).  Chosen by the dtype when numba compiles the caller: a run-time
    branch between the two loops measured 2.25 ns a reward on float64, 1.69 without."""
    raise NotImplementedError("compiled only (see the overload below)")


@overload(_write_binned_group_weights, inline="always")
def _write_binned_group_weights_by_dtype(x, out, start, n, lo, hi, clip, inv_delta, kmax,
                                         shift, mean, factor, s, dead_zone):
    if out.dtype == types.float64:
        def in_place(x, out, start, n, lo, hi, clip, inv_delta, kmax, shift, mean, factor,
                     s, dead_zone):
            _write_group_weights(out, out, start, n, shift, mean, factor, s, dead_zone)

        return in_place

    def binned_again(x, out, start, n, lo, hi, clip, inv_delta, kmax, shift, mean, factor,
                     s, dead_zone):
        if dead_zone > 0.0:
            write_binned_weights(x, out, start, n, lo, hi, clip, inv_delta, kmax, shift,
                                 mean, factor, s, dead_zone)
        else:
            write_binned_weights(x, out, start, n, lo, hi, clip, inv_delta, kmax, shift,
                                 mean, factor, s, None)

    return binned_again


def _maxnorm_plain_masked(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo,
                          hi, out):
    """``_maxnorm_plain`` in the masked loops of ``masked`` (one read of each group from
    memory, one write).

    A NaN or infinite reward makes the group's sum NaN or infinite (no term is
    subtracted again), so that sum is the finiteness check.  A flagged group's weights
    are left as computed: the wrapper raises.
    """
    per_group = scale.size > 0
    n_bad = 0
    n_out = 0
    table = reciprocal_table(0)
    for q in range(offsets.size - 1):
        start = offsets[q]
        n = offsets[q + 1] - start
        if per_group:
            keep[q] = False
            scale[q] = tau
        if n == 0:
            continue
        shift, total, _, low, high = group_sums(x, start, n)
        inv_n, _, loo_factor = lookup(table, n, 0)
        shift, mean, factor, s, bad, outside, group_keep = _plain_group(
            n, total, shift, low, high, inv_n, loo_factor, tau, loo, dead_zone,
            raw_singletons, lo, hi)
        n_bad += bad
        n_out += outside
        if per_group:
            keep[q] = group_keep
            scale[q] = s
        _write_group_weights(x, out, start, n, shift, mean, factor, s, dead_zone)
    return n_bad, n_out


def _maxnorm_binned_masked(offsets, scale, keep, x, tau, loo, dead_zone, raw_singletons, lo,
                           hi, clip, inv_delta, kmax, out):
    """``_maxnorm_binned`` in the masked loops of ``masked``.  ``write_binned`` bins the
    group into ``out`` and sums the bins (in float64); a float64 ``out`` holds them exactly,
    and ``write_weights`` turns them into weights in place (reading them back from L1); a
    float32 ``out`` has rounded them, so ``write_binned_weights`` bins the rewards again.
    Binning is monotone: the extreme bins are those of the extreme rewards.
    """
    per_group = scale.size > 0
    n_bad = 0
    n_out = 0
    table = reciprocal_table(0)
    for q in range(offsets.size - 1):
        start = offsets[q]
        n = offsets[q + 1] - start
        if per_group:
            keep[q] = False
            scale[q] = tau
        if n == 0:
            continue
        n_nan, low, high, shift, total = write_binned(x, out, start, n, lo, hi, clip,
                                                      inv_delta, kmax)
        kmin = _bin_index(low, lo, hi, clip, inv_delta, kmax)
        kbig = _bin_index(high, lo, hi, clip, inv_delta, kmax)
        inv_n, _, loo_factor = lookup(table, n, 0)
        # (its last two results, from the binned extremes, are not this group's: below)
        shift, mean, factor, s, bad, _, _ = _plain_group(
            n, total, shift, _bin(low, lo, hi, clip, inv_delta, kmax),
            _bin(high, lo, hi, clip, inv_delta, kmax), inv_n, loo_factor, tau, loo,
            dead_zone, raw_singletons, lo, hi)
        # (no branch on low/high, which a NaN leaves unspecified)
        n_bad += bad | (n_nan != 0) | (not _is_finite(low)) | (not _is_finite(high))
        n_out += (low < lo) | (high > hi)
        if per_group:
            keep[q] = (n >= 2) & (kmin != kbig)
            scale[q] = s
        _write_binned_group_weights(x, out, start, n, lo, hi, clip, inv_delta, kmax, shift,
                                    mean, factor, s, dead_zone)
    return n_bad, n_out


_resolve_kernel = compile_serial(_resolve, FASTMATH)
_resolve_masked_kernel = compile_serial(_resolve_masked, EXACT)
_maxnorm_kernel = compile_serial(_maxnorm, FASTMATH)
_maxnorm_plain_kernel = compile_serial(_maxnorm_plain, FASTMATH)
_maxnorm_plain_masked_kernel = compile_serial(_maxnorm_plain_masked, EXACT)
_maxnorm_binned_kernel = compile_serial(_maxnorm_binned, FASTMATH)
_maxnorm_binned_masked_kernel = compile_serial(_maxnorm_binned_masked, EXACT)

# Per-group outputs not requested: never written (size 0), so one pair serves every call.
_NO_SCALE = np.empty(0)
_NO_KEEP = np.empty(0, dtype=np.bool_)


def _checks(chunks):
    """(no bad group, every valid reward in bounds) from the chunks' (n_bad, n_out)."""
    if len(chunks) == 1:
        n_bad, n_out = chunks[0]
        return n_bad == 0, n_out == 0
    return sum(c[0] for c in chunks) == 0, sum(c[1] for c in chunks) == 0


def resolve(x, offsets, lo, hi, clip, delta, inv_delta, kmax, omit_nan, threaded=None):
    out = np.empty_like(x)
    keep = np.empty(offsets.size - 1, dtype=np.bool_)
    if masked.ENABLED and not omit_nan and inv_delta != 0.0:
        chunks = run_over_groups(_resolve_masked_kernel, offsets, (keep,), x, lo, hi, clip,
                                 inv_delta, kmax, out, threaded=threaded, fresh_output=out)
    else:
        chunks = run_over_groups(_resolve_kernel, offsets, (keep,), x, lo, hi, clip, delta,
                                 inv_delta, kmax, omit_nan, out, threaded=threaded,
                                 fresh_output=out)
    return (out, keep, *_checks(chunks))


def maxnorm(x, offsets, tau, loo, dead_zone, raw_singletons, lo, hi, clip, delta,
            inv_delta, kmax, omit_nan, per_group=True, threaded=None):
    out = np.empty_like(x)
    if per_group:
        scale = np.empty(offsets.size - 1)
        keep = np.empty(offsets.size - 1, dtype=np.bool_)
    else:
        scale, keep = _NO_SCALE, _NO_KEEP
    if not (clip or delta != 0.0 or omit_nan):
        plain = _maxnorm_plain_masked_kernel if masked.ENABLED else _maxnorm_plain_kernel
        chunks = run_over_groups(plain, offsets, (scale, keep), x, tau, loo, dead_zone,
                                 raw_singletons, lo, hi, out, threaded=threaded,
                                 fresh_output=out)
    elif delta != 0.0 and not omit_nan:
        binned = _maxnorm_binned_masked_kernel if masked.ENABLED else _maxnorm_binned_kernel
        chunks = run_over_groups(binned, offsets, (scale, keep), x, tau, loo, dead_zone,
                                 raw_singletons, lo, hi, clip, inv_delta, kmax, out,
                                 threaded=threaded, fresh_output=out)
    else:
        chunks = run_over_groups(_maxnorm_kernel, offsets, (scale, keep), x, tau, loo,
                                 dead_zone, raw_singletons, lo, hi, clip, delta, inv_delta,
                                 kmax, omit_nan, out, threaded=threaded, fresh_output=out)
    return (out, scale, keep, *_checks(chunks))
