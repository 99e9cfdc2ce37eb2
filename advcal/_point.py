"""The point estimators' checked core, shared by ``advcal.estimators``, the baselines and the
registry's scale rules: the validated call, the engine's centring with the rescaled retry
(rewards near the float64 limits are run again in units of a power of two), and the batch
statistics (pooled std, REINFORCE++ whitening, GPG's divisor) several of them use."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from advcal._kernels import engine
from advcal._kernels.modes import DR, FIXED, GRPO, HUGE, RLOO, TINY
from advcal._validation import (
    Batch,
    as_policy_batch,
    check_int,
    check_real,
    raise_bad_values,
)


class PointCall:
    """A validated estimator call: the grouped batch and the options every estimator shares."""

    __slots__ = ("batch", "raw", "omit", "engine")

    def __init__(self, batch: Batch, raw: bool, omit: bool, engine: ModuleType) -> None:
        self.batch = batch
        self.raw = raw
        self.omit = omit
        self.engine = engine




def point_iv(
    rewards: ArrayLike,
    offsets: ArrayLike | None,
    group_ids: ArrayLike | None,
    singleton: str,
    nan_policy: str,
    backend: str,
) -> PointCall:
    batch, raw, omit = as_policy_batch(rewards, offsets, group_ids, singleton=singleton,
                                       nan_policy=nan_policy, backend=backend)
    return PointCall(batch, raw, omit, engine("point", backend))


DTYPE_MAX = {np.dtype(np.float32): float(np.finfo(np.float32).max),
              np.dtype(np.float64): float(np.finfo(np.float64).max)}


def output_limit(call: PointCall) -> float:
    """Largest |advantage| the output dtype holds: the kernels flag anything beyond it."""
    return DTYPE_MAX[call.batch.values.dtype]


Rerun = Callable[[np.ndarray, int, np.ndarray, slice], tuple[np.ndarray, bool]]


def pow2(x: float, k: int) -> float:
    """``x * 2**-k`` without overflowing on the way (inf where the product does)."""
    if k == 0:  # every call but the rescaled retries: no float work at all
        return x
    try:
        return math.ldexp(x, -k)
    except OverflowError:
        return math.copysign(math.inf, x)


def finish(call: PointCall, result: tuple[np.ndarray, bool], rerun: Rerun | None = None,
            *, homogeneous: bool = True, lone_eps: float | None = None) -> np.ndarray:
    out, ok = result
    # Not ok: a group had a non-finite reward, its statistics overflowed float64, or an
    # advantage overflowed the output dtype.  Rewards near the float64 limit are retried
    # rescaled; otherwise find out which, on this error path only.
    if not ok and rerun is not None:
        out, ok = rescaled(call, rerun, homogeneous, lone_eps)
    if not ok:
        raise_bad_values(call.batch.values, call.omit)
    return call.batch.restore(out)


def rescaled(call: PointCall, rerun: Rerun, homogeneous: bool, lone_eps: float | None
              ) -> tuple[np.ndarray, bool]:
    """Run the engine again group by group, each on its rewards times the power of two
    that brings its largest near 1 (exact, up to subnormals far below the group's scale),
    so sums of squares of rewards near the float64 limit do not overflow and those of
    subnormal rewards do not underflow; both engines take this same path.  Only on the
    error path: a Python loop over the groups.

    ``rerun(values, k, offsets, part)`` runs the engine on one group's rewards times 2**-k
    (an eps or floor it adds to a std scaled alike, by :func:`pow2`; per-response weights
    sliced by ``part``; a fixed divisor scaled alike).  Homogeneous estimators (advantages
    linear in the rewards) are scaled back; the others are scale-free, except a raw lone
    response of the std-normalized ones, which gets ``r / (1 + lone_eps)`` again (with
    ``lone_eps`` given)."""
    values = call.batch.values
    offsets = call.batch.offsets
    limit = output_limit(call)
    one = np.array([0, 0], dtype=np.int64)
    full = np.zeros(values.size)
    for q in range(offsets.size - 1):
        part = slice(int(offsets[q]), int(offsets[q + 1]))
        group = values[part]
        one[1] = group.size
        valid = group[~np.isnan(group)] if call.omit else group
        if not np.isfinite(valid).all():
            return values, False
        out, ok = rerun(group, 0, one, part)
        if ok:
            full[part] = out
            continue
        big = float(np.max(np.abs(valid), initial=0.0))
        k = math.frexp(big)[1]
        if k in (0, 1):  # already near 1: the advantages themselves overflow
            return values, False
        with np.errstate(over="ignore", under="ignore"):
            out, ok = rerun(np.ldexp(group, -k).astype(group.dtype, copy=False), k, one, part)
        if not ok:
            return values, False
        with np.errstate(over="ignore", invalid="ignore"):
            wide = out.astype(np.float64)
            if homogeneous:
                wide = np.ldexp(wide, k)
            elif lone_eps is not None and call.raw and valid.size == 1:
                wide = np.where(np.isnan(group), 0.0, group / (1.0 + lone_eps))
        if not (np.abs(wide) <= limit).all():
            return values, False
        full[part] = wide
    return full.astype(values.dtype), True


def center_scale(call: PointCall, mode: int, *, eps: float = 0.0, ddof: int = 1,
                  divisor: float = 1.0, std_floor: float = 0.0, unit: int = 0) -> np.ndarray:
    """The engine's center_scale with the rescaled retry.  FIXED's ``divisor`` is in units
    of ``2**unit``, and the engine sees the rewards in those units too (a batch std beyond
    the float64 range still divides); a divisor whose reciprocal overflows (subnormal)
    is brought into range the same way."""
    if mode == FIXED and unit == 0 and 0.0 < divisor < SMALLEST_DIVISOR:
        unit = math.frexp(divisor)[1] - math.frexp(SMALLEST_DIVISOR)[1]
        divisor = math.ldexp(divisor, -unit)

    def run(values: np.ndarray, k: int, offsets: np.ndarray, _: slice
            ) -> tuple[np.ndarray, bool]:
        if unit:
            with np.errstate(over="ignore", under="ignore"):
                values = np.ldexp(values, -unit).astype(values.dtype, copy=False)
        # GRPO's eps and floor, and a fixed divisor, are in reward units: scaled alike.
        k = k if mode in (GRPO, FIXED) else 0
        scaled = pow2(divisor, k)
        if mode == FIXED and not SMALLEST_DIVISOR <= scaled < math.inf:
            # Rewards near the float64 limits over a divisor near 1: the divisor in those
            # units (or its reciprocal) would overflow.  Divide by the divisor as it is and
            # scale the (linear) result back here.
            out, ok = call.engine.center_scale(values, offsets, mode, 0.0, ddof, call.raw,
                                               call.omit, divisor, output_limit(call))
            with np.errstate(over="ignore", under="ignore"):
                back = np.ldexp(out.astype(np.float64), k)
            return back.astype(out.dtype), ok and bool(np.isfinite(back).all())
        return call.engine.center_scale(
            values, offsets, mode, pow2(eps, k), ddof, call.raw, call.omit,
            scaled, output_limit(call), std_floor=pow2(std_floor, k))

    first = run(call.batch.values, 0, call.batch.offsets, slice(None))
    return finish(call, first, run, homogeneous=mode in (DR, RLOO),
                   lone_eps=eps if mode == GRPO else None)


# Below this a divisor is rescaled: the numba engine multiplies by its reciprocal, which
# must not overflow (2**-1000 leaves the rewards room to be scaled up by that much).
SMALLEST_DIVISOR = 2.0 ** -1000


def check_eps_ddof(eps: Any, ddof: Any) -> tuple[float, int]:
    return check_real(eps, "eps", low=0.0), check_int(ddof, "ddof", choices=(0, 1))


def batch_std_of(call: PointCall, ddof: int) -> float:
    """Standard deviation of every valid reward of the batch around the batch mean (inf
    beyond the float64 range)."""
    std, k = batch_std_parts(call, ddof)
    return pow2(std, -k)


def batch_std_parts(call: PointCall, ddof: int) -> tuple[float, int]:
    """:func:`batch_std_of` as ``(std / 2**k, k)``: ``k = 0`` unless the rewards' magnitudes
    lie outside ``[TINY, HUGE]``, where their squares can under- or overflow; then the
    statistics are taken again on the rewards in units of ``2**k`` near the largest."""
    values = call.batch.values
    std = pooled_std(call, values, ddof)
    if SAFE_STD[0] <= std <= SAFE_STD[1]:
        return std, 0
    # Outside: a constant batch (0), an overflow (inf), or squares that lost digits.
    with np.errstate(invalid="ignore"):
        big = float(np.max(np.abs(values), initial=0.0,
                           where=~np.isnan(values) if call.omit else True))
    if TINY <= big <= HUGE or not 0.0 < big < math.inf:
        return std, 0  # no square can have under- or overflowed: the value is right
    k = math.frexp(big)[1]
    with np.errstate(under="ignore"):
        return pooled_std(call, np.ldexp(values, -k).astype(values.dtype, copy=False),
                           ddof), k


# A batch std in this range came from squares that neither overflowed nor lost digits.
SAFE_STD = (2.0 ** -400, 2.0 ** 400)


def pooled_std(call: PointCall, values: np.ndarray, ddof: int) -> float:
    count, mean, ss, _, _ = call.engine.group_statistics(values, call.batch.offsets, 0,
                                                         call.omit, spread=False)
    total = int(count.sum())
    if total <= ddof:
        return 0.0
    used = count > 0
    # Exact decomposition of the total sum of squares into within + between groups.  An
    # overflow gives inf, which the caller reports as rewards too large.
    with np.errstate(over="ignore", invalid="ignore"):
        grand = float(np.sum(count[used] * mean[used]) / total)
        m2 = float(np.sum(ss[used]) + np.sum(count[used] * (mean[used] - grand) ** 2))
        return float(np.sqrt(m2 / (total - ddof)))


def whitening(u: np.ndarray, weights: np.ndarray, eps: float, ddof: int = 1,
               var_floor: float = 0.0) -> tuple[float, float]:
    """``(m, sqrt(max(v, var_floor) + eps))`` of :func:`reinforce_pp_baseline`: the
    weighted mean of ``u`` and the root of its weighted variance (Bessel-corrected with
    ``ddof=1``); ``(0, 0)`` when there is nothing to whiten (no weight, or zero spread
    with ``eps=0`` and no floor); a root beyond the float64 range is inf."""
    mean, root, k = whitening_parts(u, weights, eps, ddof, var_floor)
    return pow2(mean, -k), pow2(root, -k)  # 2**k times each


# A variance in this range has squares that neither overflowed nor lost digits to
# underflow (deviations between 2**-400 and 2**400, as ``modes.TINY, HUGE``).
SAFE_SQUARES = (2.0 ** -800, 2.0 ** 800)


def whitening_parts(u: np.ndarray, weights: np.ndarray, eps: float, ddof: int,
                     var_floor: float) -> tuple[float, float, int]:
    """:func:`whitening` as ``(m / 2**k, root / 2**k, k)``: ``k = 0`` unless the squares
    of ``u`` over- or underflow float64, where ``2**k`` is near max |u| (exact)."""
    top = float(weights.max()) if weights.size else 0.0
    if not top > 0:
        return 0.0, 0.0, 0
    # Weights relative to the largest (token counts near the float64 limit would overflow
    # the sums); Bessel's W / (W - 1) from the absolute total W, which may be inf.
    rel = weights / top
    total = rel.sum()
    with np.errstate(over="ignore", invalid="ignore"):
        absolute = total * top
        bessel = 1.0 - 1.0 / absolute if ddof and absolute > 1 else 1.0
        mean = np.sum(rel * u) / total
        var = np.sum(rel * (u - mean) ** 2) / total / bessel
    k = 0
    if not SAFE_SQUARES[0] <= var <= SAFE_SQUARES[1]:
        # The squares over- or underflowed (or the variance is 0): again in units of a
        # power of two near max |u|, the floor and eps in the same units where they fit
        # (where they do not, they dominate the variance: the root is taken directly).
        big = float(np.max(np.abs(u), where=rel > 0, initial=0.0))
        k = math.frexp(big)[1] if 0 < big < math.inf else 0
        z = np.ldexp(u, -k)
        mean = np.sum(rel * z) / total
        var = np.sum(rel * (z - mean) ** 2) / total / bessel
        with np.errstate(over="ignore"):
            floor_k, eps_k = (float(v) for v in np.ldexp([var_floor, eps], -2 * k))
        if not (math.isfinite(floor_k) and math.isfinite(eps_k)):
            root = math.sqrt(max(math.ldexp(float(var), 2 * k), var_floor) + eps)
            return math.ldexp(float(mean), k), root, 0
        var_floor, eps = floor_k, eps_k
    var = max(var, var_floor)
    if not var + eps > 0:
        return 0.0, 0.0, 0
    return float(mean), float(np.sqrt(var + eps)), k


def gpg_divisor(values: np.ndarray, f_norm: float) -> float:
    """GPG's divisor f_norm / alpha, alpha = N / max(k, 1) for the N valid ``values`` of
    which k are nonzero; an empty batch keeps divisor f_norm."""
    return f_norm * max(int(np.count_nonzero(values)), 1) / max(values.size, 1)


