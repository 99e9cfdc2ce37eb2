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

import numpy as np
from numpy.typing import ArrayLike

from advcal._kernels.modes import DR, FIXED, GRPO, RLOO
from advcal._point import (
    PointCall,
    batch_std_parts,
    center_scale,
    check_eps_ddof,
    finish,
    gpg_divisor,
    output_limit,
    point_iv,
    pow2,
    whitening_parts,
)
from advcal._validation import (
    Batch,
    as_float_array,
    check_choice,
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
    eps, ddof = check_eps_ddof(eps, ddof)
    std_floor = check_real(std_floor, "std_floor", low=0.0)
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    return center_scale(call, GRPO, eps=eps, ddof=ddof, std_floor=std_floor)


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
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    return center_scale(call, DR)


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
    eps, ddof = check_eps_ddof(eps, ddof)
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    if scale == "none":
        return center_scale(call, RLOO)
    # The advantages stay float64 until whitened (statistics in float64, one rounding).
    wide = PointCall(Batch(call.batch.values.astype(np.float64, copy=False), call.batch.offsets,
                       call.batch.shape, call.batch.order), call.raw, call.omit, call.engine)
    out = _whiten_batch(center_scale(wide, RLOO), _whitened_responses(call), eps, ddof)
    return out.astype(call.batch.values.dtype, copy=False)


def _whitened_responses(call: PointCall) -> np.ndarray | None:
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
    eps, ddof = check_eps_ddof(eps, ddof)
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    std, k = batch_std_parts(call, ddof)
    # With rewards of extreme magnitude, divide in units of 2**k (the std may not fit in
    # float64, or be subnormal), unless eps does not fit in them (it then dominates).
    unit = k if math.isfinite(pow2(eps, k)) else 0
    divisor = std + pow2(eps, unit) if unit else pow2(std, -k) + eps
    if not np.isfinite(divisor):
        raise_bad_values(call.batch.values, call.omit)
    return center_scale(call, FIXED, divisor=divisor, unit=unit)


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
    eps, ddof = check_eps_ddof(eps, ddof)
    var_floor = check_real(var_floor, "var_floor", low=0.0)
    if not isinstance(std_norm, (bool, np.bool_)):
        raise TypeError(f"`std_norm` must be a bool; got {type(std_norm).__name__}.")
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    centered = center_scale(call, DR)
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
    mean, scale, k = whitening_parts(u, weights, eps, ddof, var_floor)
    if not std_norm:
        scale = pow2(1.0, k) if weights.sum() > 0 else 0.0
    out = np.zeros(values.shape)
    if scale > 0:
        z = u if k == 0 else np.ldexp(u, -k)
        if std_norm:  # whitened: |out| is at most about sqrt(W / w), no overflow
            out = np.where(weights > 0, (z - mean) / scale, 0.0)
        else:
            with np.errstate(over="ignore"):
                out = np.where(weights > 0, (z - mean) / scale, 0.0)
            if not (np.abs(out) <= output_limit(call)).all():
                raise ValueError("`rewards`: an advantage overflows the output dtype (the "
                                 "rewards' spread is too large for `std_norm=False`).")
    return out.astype(centered.dtype, copy=False)


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
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    weights = call.batch.gather_weights(lengths, "lengths", positive=True)

    def run(values: np.ndarray, k: int, offsets: np.ndarray, part: slice
            ) -> tuple[np.ndarray, bool]:
        return call.engine.opo(values, weights[part], offsets, call.raw, call.omit,
                               output_limit(call))

    return finish(call, run(call.batch.values, 0, call.batch.offsets, slice(None)), run)


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
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    values = call.batch.values
    if call.omit:
        values = values[~np.isnan(values)]
    divisor = gpg_divisor(values, f_norm)
    try:
        return center_scale(call, FIXED, divisor=divisor)
    except ValueError as exc:
        if f_norm < 1.0 and "too large" in str(exc):
            raise ValueError(f"`f_norm` = {f_norm!r} is too small: the advantages overflow "
                             f"{call.batch.values.dtype}.") from None
        raise


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
    eps, ddof = check_eps_ddof(eps, ddof)
    if not isinstance(std_norm, (bool, np.bool_)):
        raise TypeError(f"`std_norm` must be a bool; got {type(std_norm).__name__}.")
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)

    def run(values: np.ndarray, k: int, offsets: np.ndarray, _: slice
            ) -> tuple[np.ndarray, bool]:
        return call.engine.passk(values, offsets, pow2(eps, k), ddof, call.raw, call.omit,
                                 output_limit(call), normalize=bool(std_norm))

    first = run(call.batch.values, 0, call.batch.offsets, slice(None))
    return finish(call, first, run, homogeneous=not std_norm,
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
    eps, ddof = check_eps_ddof(eps, ddof)
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
