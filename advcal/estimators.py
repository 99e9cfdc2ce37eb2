"""Point estimators: groups of scalar rewards in, advantages out.

Every estimator takes ``(rewards, offsets=None, *, group_ids=None, ...)``: 2-D rewards
are groups by row; 1-D rewards need exactly one of ``offsets`` (CSR) or ``group_ids``
(per-response labels).  The result has the caller's layout and order.

Shared keywords:

* ``singleton``: a group with one (valid) response has no relative information.
  ``"zero"`` (default) gives it advantage 0; ``"raw"`` follows verl, which treats a lone
  response as having group mean 0 and std 1 (so it keeps its raw score, divided by
  ``1 + eps`` where the estimator divides by ``std + eps``); ``"error"`` raises.
* ``nan_policy``: ``"raise"`` (default) rejects NaN rewards; ``"omit"`` leaves them out
  of the group statistics and gives them advantage 0 (TRL's treatment of unscorable
  responses).  Infinite rewards are always an error.
* ``backend``: ``"numba"`` (default, compiled kernels) or ``"numpy"`` (the reference).
"""

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
    as_float_array,
    as_policy_batch,
    check_choice,
    check_int,
    check_real,
    raise_bad_values,
    valid_counts,
)

__all__ = [
    "grpo",
    "dr_grpo",
    "rloo",
    "batch_std",
    "reinforce_pp_baseline",
    "opo",
    "gpg",
    "passk",
    "gdpo",
]


class _Call:
    """A validated estimator call: the grouped batch and the options every estimator shares."""

    __slots__ = ("batch", "raw", "omit", "engine")

    def __init__(self, batch: Batch, raw: bool, omit: bool, engine: ModuleType) -> None:
        self.batch = batch
        self.raw = raw
        self.omit = omit
        self.engine = engine




def _point_iv(
    rewards: ArrayLike,
    offsets: ArrayLike | None,
    group_ids: ArrayLike | None,
    singleton: str,
    nan_policy: str,
    backend: str,
) -> _Call:
    batch, raw, omit = as_policy_batch(rewards, offsets, group_ids, singleton=singleton,
                                       nan_policy=nan_policy, backend=backend)
    return _Call(batch, raw, omit, engine("point", backend))


_DTYPE_MAX = {np.dtype(np.float32): float(np.finfo(np.float32).max),
              np.dtype(np.float64): float(np.finfo(np.float64).max)}


def _limit(call: _Call) -> float:
    """Largest |advantage| the output dtype holds: the kernels flag anything beyond it."""
    return _DTYPE_MAX[call.batch.values.dtype]


Rerun = Callable[[np.ndarray, int, np.ndarray, slice], tuple[np.ndarray, bool]]


def _pow2(x: float, k: int) -> float:
    """``x * 2**-k`` without overflowing on the way (inf where the product does)."""
    if k == 0:  # every call but the rescaled retries: no float work at all
        return x
    try:
        return math.ldexp(x, -k)
    except OverflowError:
        return math.copysign(math.inf, x)


def _finish(call: _Call, result: tuple[np.ndarray, bool], rerun: Rerun | None = None,
            *, homogeneous: bool = True, lone_eps: float | None = None) -> np.ndarray:
    out, ok = result
    # Not ok: a group had a non-finite reward, its statistics overflowed float64, or an
    # advantage overflowed the output dtype.  Rewards near the float64 limit are retried
    # rescaled; otherwise find out which, on this error path only.
    if not ok and rerun is not None:
        out, ok = _rescaled(call, rerun, homogeneous, lone_eps)
    if not ok:
        raise_bad_values(call.batch.values, call.omit)
    return call.batch.restore(out)


def _rescaled(call: _Call, rerun: Rerun, homogeneous: bool, lone_eps: float | None
              ) -> tuple[np.ndarray, bool]:
    """Run the engine again group by group, each on its rewards times the power of two
    that brings its largest near 1 (exact, up to subnormals far below the group's scale),
    so sums of squares of rewards near the float64 limit do not overflow and those of
    subnormal rewards do not underflow; both engines take this same path.  Only on the
    error path: a Python loop over the groups.

    ``rerun(values, k, offsets, part)`` runs the engine on one group's rewards times 2**-k
    (an eps or floor it adds to a std scaled alike, by :func:`_pow2`; per-response weights
    sliced by ``part``; a fixed divisor scaled alike).  Homogeneous estimators (advantages
    linear in the rewards) are scaled back; the others are scale-free, except a raw lone
    response of the std-normalized ones, which gets ``r / (1 + lone_eps)`` again (with
    ``lone_eps`` given)."""
    values = call.batch.values
    offsets = call.batch.offsets
    limit = _limit(call)
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


def _center_scale(call: _Call, mode: int, *, eps: float = 0.0, ddof: int = 1,
                  divisor: float = 1.0, std_floor: float = 0.0, unit: int = 0) -> np.ndarray:
    """The engine's center_scale with the rescaled retry.  FIXED's ``divisor`` is in units
    of ``2**unit``, and the engine sees the rewards in those units too (a batch std beyond
    the float64 range still divides); a divisor whose reciprocal overflows (subnormal)
    is brought into range the same way."""
    if mode == FIXED and unit == 0 and 0.0 < divisor < _SMALLEST_DIVISOR:
        unit = math.frexp(divisor)[1] - math.frexp(_SMALLEST_DIVISOR)[1]
        divisor = math.ldexp(divisor, -unit)

    def run(values: np.ndarray, k: int, offsets: np.ndarray, _: slice
            ) -> tuple[np.ndarray, bool]:
        if unit:
            with np.errstate(over="ignore", under="ignore"):
                values = np.ldexp(values, -unit).astype(values.dtype, copy=False)
        # GRPO's eps and floor, and a fixed divisor, are in reward units: scaled alike.
        k = k if mode in (GRPO, FIXED) else 0
        scaled = _pow2(divisor, k)
        if mode == FIXED and not _SMALLEST_DIVISOR <= scaled < math.inf:
            # Rewards near the float64 limits over a divisor near 1: the divisor in those
            # units (or its reciprocal) would overflow.  Divide by the divisor as it is and
            # scale the (linear) result back here.
            out, ok = call.engine.center_scale(values, offsets, mode, 0.0, ddof, call.raw,
                                               call.omit, divisor, _limit(call))
            with np.errstate(over="ignore", under="ignore"):
                back = np.ldexp(out.astype(np.float64), k)
            return back.astype(out.dtype), ok and bool(np.isfinite(back).all())
        return call.engine.center_scale(
            values, offsets, mode, _pow2(eps, k), ddof, call.raw, call.omit,
            scaled, _limit(call), std_floor=_pow2(std_floor, k))

    first = run(call.batch.values, 0, call.batch.offsets, slice(None))
    return _finish(call, first, run, homogeneous=mode in (DR, RLOO),
                   lone_eps=eps if mode == GRPO else None)


# Below this a divisor is rescaled: the numba engine multiplies by its reciprocal, which
# must not overflow (2**-1000 leaves the rewards room to be scaled up by that much).
_SMALLEST_DIVISOR = 2.0 ** -1000


def _check_eps_ddof(eps: Any, ddof: Any) -> tuple[float, int]:
    return check_real(eps, "eps", low=0.0), check_int(ddof, "ddof", choices=(0, 1))


def grpo(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    eps: float = 1e-6,
    ddof: int = 1,
    std_floor: float = 0.0,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """GRPO advantages: ``(r - mean) / (max(std, std_floor) + eps)`` within each group.

    Parameters
    ----------
    rewards : array_like, shape (B, G) or (N,)
        Scalar rewards; 2-D rows are groups, 1-D needs ``offsets`` or ``group_ids``.
    offsets : array_like of int, shape (B + 1,), optional
        CSR group boundaries for 1-D ``rewards``.
    group_ids : sequence of hashable, length N, optional
        Per-response group labels for 1-D ``rewards`` (verl's ``uid``), any order.
    eps : float, default 1e-6
        Added to the group standard deviation (verl 1e-6, TRL 1e-4, OpenRLHF 1e-9).
    ddof : {0, 1}, default 1
        Delta degrees of freedom of the standard deviation (the frameworks use 1).
    std_floor : float, default 0.0
        Lower bound of the group standard deviation (verl's ``grpo_vectorized`` floors
        the variance at its epsilon 1e-6: ``std_floor=1e-3``).  A group whose rewards
        are all equal still gets exactly 0.
    singleton : {"zero", "raw", "error"}, default "zero"
        Treatment of one-response groups; ``"raw"`` gives ``r / (1 + eps)`` like verl.
    nan_policy : {"raise", "omit"}, default "raise"
        ``"omit"`` leaves NaN rewards out of the statistics and gives them 0.
    backend : {"numba", "numpy"}, default "numba"
        Compiled kernel or numpy reference.

    Returns
    -------
    ndarray
        Advantages in the layout, order and float dtype of ``rewards`` (integers give
        float64).  A group whose rewards are all equal gets exactly 0.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import grpo
    >>> grpo(np.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]))
    array([[ 0.8660239, -0.8660239, -0.8660239,  0.8660239],
           [ 0.       ,  0.       ,  0.       ,  0.       ]])
    >>> grpo([1.0, 0.0, 3.0], group_ids=["a", "a", "b"], singleton="raw")
    array([ 0.70710578, -0.70710578,  2.999997  ])
    """
    eps, ddof = _check_eps_ddof(eps, ddof)
    std_floor = check_real(std_floor, "std_floor", low=0.0)
    call = _point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    return _center_scale(call, GRPO, eps=eps, ddof=ddof, std_floor=std_floor)


def dr_grpo(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """Dr.GRPO advantages: the centered rewards ``r - mean`` of each group.

    Parameters
    ----------
    rewards, offsets, group_ids, singleton, nan_policy, backend
        As in :func:`grpo`; a ``"raw"`` singleton keeps its reward.

    Returns
    -------
    ndarray
        Advantages in the caller's layout and dtype.

    Examples
    --------
    >>> from advcal import dr_grpo
    >>> dr_grpo([0.0, 1.0, 2.0, 5.0, 5.0], offsets=[0, 3, 5])
    array([-1.,  0.,  1.,  0.,  0.])
    """
    call = _point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    return _center_scale(call, DR)


def rloo(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    scale: str = "none",
    eps: float = 1e-6,
    ddof: int = 1,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """RLOO advantages: each reward minus the mean of the others, ``n / (n - 1) * u``.

    Parameters
    ----------
    rewards, offsets, group_ids, singleton, nan_policy, backend
        As in :func:`grpo`; a ``"raw"`` singleton keeps its reward (verl).
    scale : {"none", "batch"}, default "none"
        ``"batch"`` whitens the advantages over the batch: ``(a - mean) / (std + eps)``
        with the mean and std of the valid advantages (TRL's
        ``RLOOTrainer(normalize_advantages=True)``, with ``eps=1e-4`` and, where a
        reward may be None, ``nan_policy="omit"``).  A lone valid response of its group
        is left out and gets 0, as in TRL, unless ``singleton="raw"`` keeps its reward.
    eps, ddof
        Offset and delta degrees of freedom of the batch std (``scale="batch"`` only).

    Returns
    -------
    ndarray
        Advantages in the caller's layout and dtype.

    Examples
    --------
    >>> from advcal import rloo
    >>> rloo([[1.0, 0.0, 0.0]])
    array([[ 1. , -0.5, -0.5]])
    >>> rloo([[1.0, 0.0, 0.0], [0.0, 0.5, 1.0]], scale="batch", eps=0.0)
    array([[ 1.38013112, -0.69006556, -0.69006556],
           [-1.03509834,  0.        ,  1.03509834]])
    """
    check_choice(scale, "scale", ("none", "batch"))
    eps, ddof = _check_eps_ddof(eps, ddof)
    call = _point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    if scale == "none":
        return _center_scale(call, RLOO)
    # The advantages stay float64 until whitened (statistics in float64, one rounding).
    wide = _Call(Batch(call.batch.values.astype(np.float64, copy=False), call.batch.offsets,
                       call.batch.shape, call.batch.order), call.raw, call.omit, call.engine)
    out = _whiten_batch(_center_scale(wide, RLOO), _whitened_responses(call), eps, ddof)
    return out.astype(call.batch.values.dtype, copy=False)


def _whitened_responses(call: _Call) -> np.ndarray | None:
    """Which responses ``rloo(scale="batch")`` whitens (None: all): the valid ones, less a
    group's lone valid response unless ``singleton="raw"`` keeps its reward.  TRL's
    leave-one-out advantage of a lone scorable completion is 0/0 = NaN, which its
    nan-aware whitening leaves out and then sets to 0."""
    dense = call.batch.shape
    if not call.omit and (call.raw or (dense is not None and dense[-1] != 1)):
        return None  # every response whitened (the common call: no group count taken)
    counts = valid_counts(call.batch, call.omit)
    lone = (counts == 1).any() and not call.raw
    if not (call.omit or lone):
        return None
    valid = np.ones(call.batch.values.size, dtype=bool)
    if call.omit:
        valid &= ~np.isnan(call.batch.values)
    if lone:
        valid &= np.repeat(counts != 1, call.batch.sizes)
    return call.batch.restore(valid)


def _spread(a: np.ndarray, ddof: int) -> tuple[float, float]:
    """Mean and standard deviation of float64 values, scaled by their largest magnitude
    first so values near the float64 limit do not overflow the sum of squares."""
    top = float(np.max(np.abs(a))) if a.size else 0.0
    if not top > 0:
        return 0.0, 0.0
    z = a / top
    zm = float(z.mean())
    std = math.sqrt(float(np.sum((z - zm) ** 2)) / (a.size - ddof)) if a.size > ddof else 0.0
    return zm * top, std * top


def _whiten_batch(adv: np.ndarray, valid: np.ndarray | None, eps: float, ddof: int
                  ) -> np.ndarray:
    """``(a - mean) / (std + eps)`` over the valid advantages of the batch; others get 0."""
    a = adv.astype(np.float64)
    used = a if valid is None else a[valid]
    mean, std = _spread(used, ddof)
    out = np.zeros(a.shape)
    if std + eps > 0:
        out = (a - mean) / (std + eps)
        if valid is not None:
            out[~valid] = 0.0
    return out.astype(adv.dtype, copy=False)


def _batch_std(call: _Call, ddof: int) -> float:
    """Standard deviation of every valid reward of the batch around the batch mean (inf
    beyond the float64 range)."""
    std, k = _batch_std_parts(call, ddof)
    return _pow2(std, -k)


def _batch_std_parts(call: _Call, ddof: int) -> tuple[float, int]:
    """:func:`_batch_std` as ``(std / 2**k, k)``: ``k = 0`` unless the rewards' magnitudes
    lie outside ``[TINY, HUGE]``, where their squares can under- or overflow; then the
    statistics are taken again on the rewards in units of ``2**k`` near the largest."""
    values = call.batch.values
    std = _pooled_std(call, values, ddof)
    if _SAFE_STD[0] <= std <= _SAFE_STD[1]:
        return std, 0
    # Outside: a constant batch (0), an overflow (inf), or squares that lost digits.
    with np.errstate(invalid="ignore"):
        big = float(np.max(np.abs(values), initial=0.0,
                           where=~np.isnan(values) if call.omit else True))
    if TINY <= big <= HUGE or not 0.0 < big < math.inf:
        return std, 0  # no square can have under- or overflowed: the value is right
    k = math.frexp(big)[1]
    with np.errstate(under="ignore"):
        return _pooled_std(call, np.ldexp(values, -k).astype(values.dtype, copy=False),
                           ddof), k


# A batch std in this range came from squares that neither overflowed nor lost digits.
_SAFE_STD = (2.0 ** -400, 2.0 ** 400)


def _pooled_std(call: _Call, values: np.ndarray, ddof: int) -> float:
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


def batch_std(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    eps: float = 1e-6,
    ddof: int = 1,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """Group-centered rewards divided by one batch-wide std: ``u / (std_batch + eps)``.

    ``std_batch`` is the standard deviation of all valid rewards of the batch (singleton
    groups included) around the batch mean, as TRL's ``scale_rewards="batch"``.

    Parameters
    ----------
    rewards, offsets, group_ids, singleton, nan_policy, backend
        As in :func:`grpo`.
    eps : float, default 1e-6
        Added to the batch std (TRL uses 1e-4).
    ddof : {0, 1}, default 1
        Delta degrees of freedom of the batch std.

    Returns
    -------
    ndarray
        Advantages in the caller's layout and dtype.

    Examples
    --------
    >>> from advcal import batch_std
    >>> batch_std([[0.0, 2.0], [1.0, 1.0]], eps=0.0, ddof=0)
    array([[-1.41421356,  1.41421356],
           [ 0.        ,  0.        ]])
    """
    eps, ddof = _check_eps_ddof(eps, ddof)
    call = _point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    std, k = _batch_std_parts(call, ddof)
    # With rewards of extreme magnitude, divide in units of 2**k (the std may not fit in
    # float64, or be subnormal), unless eps does not fit in them (it then dominates).
    unit = k if math.isfinite(_pow2(eps, k)) else 0
    divisor = std + _pow2(eps, unit) if unit else _pow2(std, -k) + eps
    if not np.isfinite(divisor):
        raise_bad_values(call.batch.values, call.omit)
    return _center_scale(call, FIXED, divisor=divisor, unit=unit)


def reinforce_pp_baseline(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    token_counts: ArrayLike | None = None,
    eps: float = 1e-8,
    ddof: int = 1,
    var_floor: float = 0.0,
    std_norm: bool = True,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """REINFORCE++-baseline: group-centered rewards, then whitened over the whole batch.

    With ``u`` the group-centered rewards and weights ``w`` (``token_counts``, default 1
    per response), the result is ``(u - m) / sqrt(max(v, var_floor) + eps)`` with ``m``
    the w-weighted mean of ``u`` and ``v`` its w-weighted variance with Bessel's
    correction ``W / (W - ddof)``, ``W = sum(w)``: verl's ``masked_whiten`` over response
    tokens when ``token_counts`` are the response lengths; OpenRLHF's
    ``reinforce_baseline`` with ``ddof=0, eps=0, var_floor=1e-8``.  Not centered within
    groups: a group whose rewards are all equal gets ``-m / sqrt(...)``, not 0.

    Parameters
    ----------
    rewards, offsets, group_ids, singleton, nan_policy, backend
        As in :func:`grpo`; a ``"raw"`` singleton keeps its reward before whitening.
    token_counts : array_like, optional
        Non-negative per-response weights (tokens per response), same shape as
        ``rewards``.
    eps : float, default 1e-8
        Added to the variance inside the square root (verl's placement).
    ddof : {0, 1}, default 1
        Bessel's correction of the variance: 1 (verl) or 0 (OpenRLHF).
    var_floor : float, default 0.0
        Lower bound of the variance (OpenRLHF clamps it at 1e-8).
    std_norm : bool, default True
        False subtracts ``m`` only (OpenRLHF's ``no_std_norm``).

    Returns
    -------
    ndarray
        Whitened advantages in the caller's layout and dtype; omitted (NaN) responses
        get 0.

    Examples
    --------
    >>> from advcal import reinforce_pp_baseline
    >>> reinforce_pp_baseline([[1.0, 0.0], [0.0, 1.0]], eps=0.0)
    array([[ 0.866025, -0.866025],
           [-0.866025,  0.866025]])
    """
    eps, ddof = _check_eps_ddof(eps, ddof)
    var_floor = check_real(var_floor, "var_floor", low=0.0)
    if not isinstance(std_norm, (bool, np.bool_)):
        raise TypeError(f"`std_norm` must be a bool; got {type(std_norm).__name__}.")
    call = _point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    centered = _center_scale(call, DR)
    values = call.batch.restore(call.batch.values)
    if token_counts is None:
        weights = np.ones(values.shape)
    else:
        weights = call.batch.restore(call.batch.gather_weights(token_counts, "token_counts"))
    u = centered.astype(np.float64)
    if call.omit:
        weights = np.where(np.isnan(values), 0.0, weights)
    # In units of 2**k (k = 0 unless the squares of u leave the float64 range), so the
    # root may exceed float64 where the whitened values do not.
    mean, scale, k = _whitening_parts(u, weights, eps, ddof, var_floor)
    if not std_norm:
        scale = _pow2(1.0, k) if weights.sum() > 0 else 0.0
    out = np.zeros(values.shape)
    if scale > 0:
        z = u if k == 0 else np.ldexp(u, -k)
        if std_norm:  # whitened: |out| is at most about sqrt(W / w), no overflow
            out = np.where(weights > 0, (z - mean) / scale, 0.0)
        else:
            with np.errstate(over="ignore"):
                out = np.where(weights > 0, (z - mean) / scale, 0.0)
            if not (np.abs(out) <= _limit(call)).all():
                raise ValueError("`rewards`: an advantage overflows the output dtype (the "
                                 "rewards' spread is too large for `std_norm=False`).")
    return out.astype(centered.dtype, copy=False)


def _whitening(u: np.ndarray, weights: np.ndarray, eps: float, ddof: int = 1,
               var_floor: float = 0.0) -> tuple[float, float]:
    """``(m, sqrt(max(v, var_floor) + eps))`` of :func:`reinforce_pp_baseline`: the
    weighted mean of ``u`` and the root of its weighted variance (Bessel-corrected with
    ``ddof=1``); ``(0, 0)`` when there is nothing to whiten (no weight, or zero spread
    with ``eps=0`` and no floor); a root beyond the float64 range is inf."""
    mean, root, k = _whitening_parts(u, weights, eps, ddof, var_floor)
    return _pow2(mean, -k), _pow2(root, -k)  # 2**k times each


# A variance in this range has squares that neither overflowed nor lost digits to
# underflow (deviations between 2**-400 and 2**400, as ``modes.TINY, HUGE``).
_SAFE_SQUARES = (2.0 ** -800, 2.0 ** 800)


def _whitening_parts(u: np.ndarray, weights: np.ndarray, eps: float, ddof: int,
                     var_floor: float) -> tuple[float, float, int]:
    """:func:`_whitening` as ``(m / 2**k, root / 2**k, k)``: ``k = 0`` unless the squares
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
    if not _SAFE_SQUARES[0] <= var <= _SAFE_SQUARES[1]:
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


def opo(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    lengths: ArrayLike,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """OPO advantages: ``r - sum(l * r) / sum(l)``, a length-weighted group baseline.

    Parameters
    ----------
    rewards, offsets, group_ids, singleton, nan_policy, backend
        As in :func:`grpo`; a ``"raw"`` singleton keeps its reward (verl).
    lengths : array_like
        Positive response lengths, same shape as ``rewards``.

    Returns
    -------
    ndarray
        Advantages in the caller's layout and dtype.

    Examples
    --------
    >>> from advcal import opo
    >>> opo([[1.0, 0.0]], lengths=[[1, 3]])
    array([[ 0.75, -0.25]])
    """
    call = _point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    weights = call.batch.gather_weights(lengths, "lengths", positive=True)

    def run(values: np.ndarray, k: int, offsets: np.ndarray, part: slice
            ) -> tuple[np.ndarray, bool]:
        return call.engine.opo(values, weights[part], offsets, call.raw, call.omit,
                               _limit(call))

    return _finish(call, run(call.batch.values, 0, call.batch.offsets, slice(None)), run)


def gpg(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    f_norm: float = 1.0,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """GPG advantages: ``(N / k) * u / f_norm``, N responses of which k have nonzero reward.

    ``k`` is clamped to at least 1 (an all-zero batch has ``u = 0`` anyway).  With
    ``nan_policy="omit"`` N and k count valid responses only.

    Parameters
    ----------
    rewards, offsets, group_ids, singleton, nan_policy, backend
        As in :func:`grpo`.
    f_norm : float, default 1.0
        Positive normalization factor.

    Returns
    -------
    ndarray
        Advantages in the caller's layout and dtype.

    Examples
    --------
    >>> from advcal import gpg
    >>> gpg([[1.0, 0.0], [0.0, 0.0]])
    array([[ 2., -2.],
           [ 0.,  0.]])
    """
    f_norm = check_real(f_norm, "f_norm", low=0.0, low_inclusive=False)
    call = _point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    values = call.batch.values
    if call.omit:
        values = values[~np.isnan(values)]
    divisor = _gpg_divisor(values, f_norm)
    try:
        return _center_scale(call, FIXED, divisor=divisor)
    except ValueError as exc:
        if f_norm < 1.0 and "too large" in str(exc):
            raise ValueError(f"`f_norm` = {f_norm!r} is too small: the advantages overflow "
                             f"{call.batch.values.dtype}.") from None
        raise


def _gpg_divisor(values: np.ndarray, f_norm: float) -> float:
    """GPG's divisor f_norm / alpha, alpha = N / max(k, 1) for the N valid ``values`` of
    which k are nonzero; an empty batch keeps divisor f_norm."""
    return f_norm * max(int(np.count_nonzero(values)), 1) / max(values.size, 1)


def passk(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    eps: float = 1e-6,
    ddof: int = 1,
    std_norm: bool = True,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """Pass@k advantages: the best response gets ``(r_max - r_2nd) / (std + eps)``, others 0.

    Ties for the maximum give 0 (the first of the tied responses is "best").  A
    ``"raw"`` singleton gets ``r / (1 + eps)``.

    Parameters
    ----------
    rewards, offsets, group_ids, eps, ddof, singleton, nan_policy, backend
        As in :func:`grpo`.
    std_norm : bool, default True
        False gives the raw gap ``r_max - r_2nd`` (verl's ``grpo_passk`` with
        ``norm_adv_by_std_in_grpo=False``); eps and ddof are then unused.

    Returns
    -------
    ndarray
        Advantages in the caller's layout and dtype.

    Examples
    --------
    >>> from advcal import passk
    >>> passk([[0.0, 1.0, 0.0, 0.0]], eps=0.0)
    array([[0.,  2.,  0.,  0.]])
    """
    eps, ddof = _check_eps_ddof(eps, ddof)
    if not isinstance(std_norm, (bool, np.bool_)):
        raise TypeError(f"`std_norm` must be a bool; got {type(std_norm).__name__}.")
    call = _point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)

    def run(values: np.ndarray, k: int, offsets: np.ndarray, _: slice
            ) -> tuple[np.ndarray, bool]:
        return call.engine.passk(values, offsets, _pow2(eps, k), ddof, call.raw, call.omit,
                                 _limit(call), normalize=bool(std_norm))

    first = run(call.batch.values, 0, call.batch.offsets, slice(None))
    return _finish(call, first, run, homogeneous=not std_norm,
                   lone_eps=eps)


def gdpo(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    eps: float = 1e-4,
    ddof: int = 1,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """GDPO advantages for several reward functions: normalize each within its group,
    sum with weights, whiten over the batch.

    For reward functions k = 1..K with group-normalized rewards
    ``g_k = (r_k - mean) / (std + eps)`` (:func:`grpo` per function), the result is
    ``(R - mean(R)) / (std(R) + eps)`` with ``R = sum_k weights[k] * g_k`` and the mean
    and std taken over the whole batch: TRL's
    ``GRPOConfig(multi_objective_aggregation="normalize_then_sum")`` with ``eps=1e-4``.

    Parameters
    ----------
    rewards : array_like, shape (B, G, K) or (N, K)
        One column of rewards per reward function; ``(N, K)`` needs ``offsets`` or
        ``group_ids``.
    offsets, group_ids, singleton, backend
        As in :func:`grpo`, for the groups of the first axes.
    weights : array_like, shape (K,), optional
        Finite weight of each reward function (default 1 each).
    eps : float, default 1e-4
        Added to the group std of each function and to the batch std of R.
    ddof : {0, 1}, default 1
        Delta degrees of freedom of both standard deviations.
    nan_policy : {"raise", "omit"}, default "raise"
        ``"omit"``: a NaN reward leaves its function's group statistics and adds 0 to R
        (TRL's ``nansum``); a response whose rewards are all NaN gets 0 and leaves the
        batch statistics.

    Returns
    -------
    ndarray, shape (B, G) or (N,)
        Advantages in the layout of the rewards' first axes and their float dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import gdpo
    >>> r = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 1.0]]])
    >>> gdpo(r, eps=0.0)  # group 0: the two functions cancel
    array([[ 0.        ,  0.        ],
           [ 1.22474487, -1.22474487]])
    """
    eps, ddof = _check_eps_ddof(eps, ddof)
    arr = np.asarray(rewards) if not isinstance(rewards, np.ndarray) else rewards
    if arr.ndim not in (2, 3):
        raise ValueError(f"`rewards` must be (B, G, K) or (N, K) (one column per reward "
                         f"function); got {arr.ndim}-D.")
    n_funcs = arr.shape[-1]
    if n_funcs == 0:
        raise ValueError("`rewards` must hold at least one reward function (K >= 1).")
    w = np.ones(n_funcs) if weights is None else as_float_array(weights, "weights")
    if weights is not None:
        if w.shape != (n_funcs,) or not np.isfinite(w).all():
            raise ValueError(f"`weights` must be {n_funcs} finite numbers (one per reward "
                             "function).")
    total: np.ndarray | None = None
    scored: np.ndarray | None = None
    dtype = None
    for k in range(n_funcs):
        column = arr[..., k]
        g = grpo(column, offsets, group_ids=group_ids, eps=eps, ddof=ddof,
                 singleton=singleton, nan_policy=nan_policy, backend=backend)
        dtype = g.dtype
        term = w[k] * g.astype(np.float64)
        total = term if total is None else total + term
        valid = ~np.isnan(np.asarray(column, dtype=np.float64))
        scored = valid if scored is None else scored | valid
    assert total is not None and scored is not None
    if not np.isfinite(total).all():
        raise ValueError("`weights` are too large: the weighted sum overflows float64.")
    return _whiten_batch(total, None if scored.all() else scored, eps, ddof).astype(
        dtype, copy=False)
