"""The Reward-Resolution Protocol and MaxNorm-AC (``docs/maxnorm.md``).

* :func:`resolve_rewards` checks rewards against their bounds (or clips them), bins them
  to a resolution so that sub-resolution jitter disappears, and marks the groups whose
  binned rewards are all equal (zero-gap groups) for skipping.
* :func:`maxnorm` turns rewards into bounded MaxNorm-AC loss weights
  ``w = u / max(max|u|, tau_res)``; :mod:`advcal.registry` lists it as ``"maxnorm"``.

Both take ``(rewards, offsets=None, *, group_ids=None, ...)`` like every estimator and
return results in the caller's layout; per-group outputs (``keep``, ``scale``) list the
groups in batch order (rows of a dense batch, CSR order, or for ``group_ids`` the order
of first appearance of each label, as :func:`advcal.groups_from_ids`).
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple, overload

import numpy as np
from numpy.typing import ArrayLike

from advcal._kernels import engine
from advcal._validation import (
    BACKENDS,
    NAN_POLICIES,
    Batch,
    as_batch,
    as_policy_batch,
    check_bounds,
    check_choice,
    check_real,
    raise_bad_values,
)

__all__ = ["MaxNormResult", "ResolvedRewards", "maxnorm", "resolve_rewards"]

BASELINES = ("rloo", "mean")

# (hi - lo) / resolution within this relative distance of an integer counts as that
# integer, so bounds (0, 1) with resolution 0.1 have 11 bins, not 10.
_SNAP = 1e-9


class ResolvedRewards(NamedTuple):
    """Result of :func:`resolve_rewards`.

    Attributes
    ----------
    rewards : ndarray
        Binned rewards in the caller's layout, order and float dtype.
    keep : ndarray of bool, shape (B,)
        Per group: True when its binned rewards are not all equal; False for zero-gap
        groups and groups with fewer than two (valid) responses.
    """

    rewards: np.ndarray
    keep: np.ndarray


class MaxNormResult(NamedTuple):
    """Result of ``maxnorm(..., return_scale=True)``.

    Attributes
    ----------
    advantages : ndarray
        The weights ``w = u / s_q`` in the caller's layout, order and float dtype.
    scale : ndarray of float64, shape (B,)
        Per group ``s_q = max(max_i |u_i|, tau_res)`` (``tau_res`` for groups that get
        no advantage: zero-gap, empty, one-response groups).
    keep : ndarray of bool, shape (B,)
        Per group: False for zero-gap groups (all binned rewards equal) and groups with
        fewer than two (valid) responses, as :func:`resolve_rewards` marks them.
    """

    advantages: np.ndarray
    scale: np.ndarray
    keep: np.ndarray


class _Protocol(NamedTuple):
    """Validated bounds and resolution, in the form the kernels take."""

    lo: float
    hi: float
    clip: bool
    delta: float
    inv_delta: float
    kmax: float
    bounded: bool


# The common call: no bounds, no binning.
_UNBOUNDED = _Protocol(-math.inf, math.inf, False, 0.0, 0.0, 0.0, False)


def _check_bool(value: Any, name: str) -> bool:
    if type(value) is bool:  # the common case skips the isinstance test
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool; got {type(value).__name__}.")
    return bool(value)


def _protocol_iv(resolution: Any, bounds: Any, clip: Any) -> _Protocol:
    """Validate the Reward-Resolution Protocol options (``bounds=None``: unbounded)."""
    clip = _check_bool(clip, "clip")
    if bounds is None:
        if clip:
            raise ValueError("`clip=True` needs `bounds` to clip into.")
        if resolution is None:
            return _UNBOUNDED
        lo, hi = -math.inf, math.inf
    else:
        lo, hi = check_bounds(bounds)
    if resolution is None:
        return _Protocol(lo, hi, clip, 0.0, 0.0, 0.0, bounds is not None)
    width = hi - lo
    delta = check_real(resolution, "resolution", low=0.0, high=width, low_inclusive=False)
    inv_delta = 1.0 / delta
    ratio = width * inv_delta
    if not (math.isfinite(inv_delta) and math.isfinite(ratio)):
        raise ValueError(f"`resolution` is too small for `bounds` ({lo!r}, {hi!r}); "
                         f"got {delta!r}.")
    nearest = round(ratio)
    kmax = float(nearest if abs(ratio - nearest) <= _SNAP * ratio else math.floor(ratio))
    return _Protocol(lo, hi, clip, delta, inv_delta, kmax, True)


def _check_finite_and_bounds(batch: Batch, protocol: _Protocol, omit: bool, ok: bool,
                             in_bounds: bool) -> None:
    # The kernels report whether a group held a non-finite valid reward (not ok) and
    # whether a valid reward left the bounds; the values for the message are found here.
    if ok and in_bounds:
        return
    if not ok:
        raise_bad_values(batch.values, omit)
    if protocol.bounded and not protocol.clip and not in_bounds:
        low = float(np.nanmin(batch.values))
        high = float(np.nanmax(batch.values))
        raise ValueError(
            f"`rewards` must lie in `bounds` [{protocol.lo!r}, {protocol.hi!r}]; "
            f"got values in [{low!r}, {high!r}] (pass clip=True to clip them)."
        )


def resolve_rewards(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    resolution: float | None,
    bounds: tuple[float, float] = (0.0, 1.0),
    clip: bool = False,
    nan_policy: str = "raise",
    backend: str = "numba",
) -> ResolvedRewards:
    """Apply the Reward-Resolution Protocol: bounds check, binning, zero-gap mask.

    Each reward ``r`` must lie in ``[lo, hi] = bounds`` (or is clipped into it with
    ``clip=True``) and is replaced by its bin ``b = lo + delta * k`` with
    ``k = rint((r - lo) / delta)`` (ties to even), ``delta = resolution``.  When
    ``(hi - lo) / delta`` is not an integer the top bin is the last grid point below
    ``hi``: bins never leave the bounds.  A group whose binned rewards are all equal
    (a zero-gap group) has nothing to learn from and gets ``keep = False``.

    Parameters
    ----------
    rewards : array_like, shape (B, G) or (N,)
        Scalar rewards; 2-D rows are groups, 1-D needs ``offsets`` or ``group_ids``.
    offsets : array_like of int, shape (B + 1,), optional
        CSR group boundaries for 1-D ``rewards``.
    group_ids : sequence of hashable, length N, optional
        Per-response group labels for 1-D ``rewards``, any order.
    resolution : float or None
        The bin width ``delta``, in ``(0, hi - lo]``; required.  ``None`` keeps the
        rewards as they are (bounds check and zero-gap mask only).
    bounds : (float, float), default (0.0, 1.0)
        Finite reward bounds ``lo < hi``; the bin grid starts at ``lo``.
    clip : bool, default False
        Clip out-of-bounds rewards into ``bounds`` instead of raising.
    nan_policy : {"raise", "omit"}, default "raise"
        ``"omit"`` keeps NaN rewards as NaN and leaves them out of the zero-gap test.
    backend : {"numba", "numpy"}, default "numba"
        Compiled kernel or numpy reference.

    Returns
    -------
    ResolvedRewards
        ``rewards``: the binned rewards in the caller's layout and float dtype (binning
        is computed in float64); ``keep``: per-group bool, False for zero-gap groups and
        groups with fewer than two valid responses.

    Raises
    ------
    ValueError
        Out-of-bounds rewards without ``clip=True``; NaN (unless omitted) or infinite
        rewards; invalid options.

    Examples
    --------
    >>> from advcal import resolve_rewards
    >>> res = resolve_rewards([[0.7, 0.7001, 0.6999], [0.2, 0.5, 0.5]], resolution=0.01)
    >>> res.rewards
    array([[0.7, 0.7, 0.7],
           [0.2, 0.5, 0.5]])
    >>> res.keep
    array([False,  True])
    >>> resolve_rewards([1.2, -0.1, 0.5], offsets=[0, 3], resolution=0.25, clip=True)
    ResolvedRewards(rewards=array([1. , 0. , 0.5]), keep=array([ True]))
    """
    if bounds is None:
        raise TypeError("`bounds` must be a pair (lo, hi) of finite numbers with lo < hi; "
                        "got None.")
    protocol = _protocol_iv(resolution, bounds, clip)
    check_choice(nan_policy, "nan_policy", NAN_POLICIES)
    check_choice(backend, "backend", BACKENDS)
    batch = as_batch(rewards, offsets, group_ids)
    omit = nan_policy == "omit"
    out, keep, ok, in_bounds = engine("maxnorm", backend).resolve(
        batch.values, batch.offsets, protocol.lo, protocol.hi, protocol.clip,
        protocol.delta, protocol.inv_delta, protocol.kmax, omit,
    )
    _check_finite_and_bounds(batch, protocol, omit, ok, in_bounds)
    return ResolvedRewards(batch.restore(out), keep)


def _maxnorm_run(
    rewards: ArrayLike,
    offsets: ArrayLike | None,
    group_ids: ArrayLike | None,
    tau_res: Any,
    baseline: Any,
    resolution: Any,
    dead_zone: Any,
    bounds: Any,
    clip: Any,
    singleton: Any,
    nan_policy: Any,
    backend: Any,
    per_group: bool,
) -> tuple[Batch, np.ndarray, np.ndarray, np.ndarray]:
    """Validate a :func:`maxnorm` call and run it: ``(batch, flat weights, scale, keep)``;
    ``per_group=False`` skips ``scale`` and ``keep`` (empty then)."""
    tau = check_real(tau_res, "tau_res", low=0.0, low_inclusive=False)
    check_choice(baseline, "baseline", BASELINES)
    dead = 0.0 if dead_zone is None else check_real(dead_zone, "dead_zone", low=0.0)
    if bounds is None and resolution is not None:
        bounds = (0.0, 1.0)
    protocol = _protocol_iv(resolution, bounds, clip)
    batch, raw, omit = as_policy_batch(rewards, offsets, group_ids, singleton=singleton,
                                       nan_policy=nan_policy, backend=backend)
    out, scale, keep, ok, in_bounds = engine("maxnorm", backend).maxnorm(
        batch.values, batch.offsets, tau, baseline == "rloo", dead, raw, protocol.lo,
        protocol.hi, protocol.clip, protocol.delta, protocol.inv_delta, protocol.kmax, omit,
        per_group,
    )
    _check_finite_and_bounds(batch, protocol, omit, ok, in_bounds)
    return batch, out, scale, keep


@overload
def maxnorm(
    rewards: ArrayLike, offsets: ArrayLike | None = ..., *, group_ids: ArrayLike | None = ...,
    tau_res: float, baseline: str = ..., resolution: float | None = ...,
    dead_zone: float | None = ..., return_scale: Literal[False] = ...,
    bounds: tuple[float, float] | None = ..., clip: bool = ..., singleton: str = ...,
    nan_policy: str = ..., backend: str = ...,
) -> np.ndarray: ...


@overload
def maxnorm(
    rewards: ArrayLike, offsets: ArrayLike | None = ..., *, group_ids: ArrayLike | None = ...,
    tau_res: float, baseline: str = ..., resolution: float | None = ...,
    dead_zone: float | None = ..., return_scale: Literal[True],
    bounds: tuple[float, float] | None = ..., clip: bool = ..., singleton: str = ...,
    nan_policy: str = ..., backend: str = ...,
) -> MaxNormResult: ...


def maxnorm(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    tau_res: float,
    baseline: str = "rloo",
    resolution: float | None = None,
    dead_zone: float | None = None,
    return_scale: bool = False,
    bounds: tuple[float, float] | None = None,
    clip: bool = False,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray | MaxNormResult:
    """MaxNorm-AC weights: ``w = u / max(max_i |u_i|, tau_res)`` within each group.

    ``u`` are the centered rewards of the group from the ``baseline``: ``"rloo"``
    (each reward minus the mean of the others, ``n / (n - 1) * (r - mean)``) or
    ``"mean"`` (``r - mean``).  With ``resolution`` the rewards are first binned by
    the Reward-Resolution Protocol (:func:`resolve_rewards`); with ``dead_zone``,
    centered values with ``|u_i| < dead_zone`` become 0.  The per-group scale is
    ``s_q = max(max_i |u_i|, tau_res)`` and the weight ``w = u / s_q``, meant as a
    constant (stop-gradient) loss weight of the reward branch.

    Guarantees: ``|w| <= 1``; ``1 / s_q <= 1 / tau_res`` (so ``beta * s_q >= beta *
    tau_res``); ``w`` has the sign and the within-group order of ``u``; it does not
    change when a constant is added to the rewards, nor when rewards and ``tau_res``
    are multiplied by the same ``c > 0`` (without binning; with binning scale
    ``resolution`` and ``bounds`` too); a group whose (binned) rewards are all equal
    gets exactly 0.

    Parameters
    ----------
    rewards : array_like, shape (B, G) or (N,)
        Scalar rewards; 2-D rows are groups, 1-D needs ``offsets`` or ``group_ids``.
    offsets : array_like of int, shape (B + 1,), optional
        CSR group boundaries for 1-D ``rewards``.
    group_ids : sequence of hashable, length N, optional
        Per-response group labels for 1-D ``rewards``, any order.
    tau_res : float
        The scale floor ``tau_res > 0``, in reward units (the smallest credible gap).
    baseline : {"rloo", "mean"}, default "rloo"
        How ``u`` is centered.
    resolution : float, optional
        Bin the rewards to this resolution first (see :func:`resolve_rewards`).
    dead_zone : float, optional
        Centered values with ``|u_i| < dead_zone`` are set to 0 (reward units, the
        same units as ``u``).
    return_scale : bool, default False
        Also return the per-group scale ``s_q`` and zero-gap mask ``keep`` (a
        :class:`MaxNormResult`; the kernel computes both in the same pass).
    bounds : (float, float), optional
        Reward bounds ``lo < hi``; rewards outside are an error unless ``clip=True``.
        Default: ``(0.0, 1.0)`` when ``resolution`` is given, otherwise no bounds (the
        MaxNorm operator alone takes any finite rewards).
    clip : bool, default False
        Clip rewards into ``bounds`` instead of raising.
    singleton : {"zero", "raw", "error"}, default "zero"
        One-response groups: weight 0, or ``"raw"`` (baseline 0 as verl: ``u = r``,
        so ``w = r / max(|r|, tau_res)``), or an error.  This policy, not zero-gap
        skipping, decides a lone response's weight.
    nan_policy : {"raise", "omit"}, default "raise"
        ``"omit"`` leaves NaN rewards out of the group and gives them weight 0.
    backend : {"numba", "numpy"}, default "numba"
        Compiled kernel or numpy reference.

    Returns
    -------
    ndarray or MaxNormResult
        The weights in the caller's layout, order and float dtype (computed in
        float64); with ``return_scale=True`` a named tuple ``(advantages, scale, keep)``.

    Raises
    ------
    ValueError
        Out-of-bounds rewards without ``clip=True``; NaN (unless omitted) or infinite
        rewards; invalid options.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import maxnorm
    >>> maxnorm(np.array([[1.0, 0.0, 0.0, 0.0]]), tau_res=0.01)
    array([[ 1.      , -0.333333, -0.333333, -0.333333]])

    A low-variance group: the floor ``tau_res`` keeps the jitter small, and binning to
    the resolution removes it (a zero-gap group):

    >>> jitter = np.array([[0.7, 0.7001, 0.7, 0.7]])
    >>> maxnorm(jitter, tau_res=0.01)
    array([[-0.003333,  0.01    , -0.003333, -0.003333]])
    >>> maxnorm(jitter, tau_res=0.01, resolution=0.01)
    array([[0., 0., 0., 0.]])
    >>> maxnorm([0.0, 0.5, 1.0], offsets=[0, 3], tau_res=0.01, baseline="mean",
    ...         return_scale=True)
    MaxNormResult(advantages=array([-1.,  0.,  1.]), scale=array([0.5]), keep=array([ True]))
    """
    return_scale = _check_bool(return_scale, "return_scale")
    batch, flat, scale, keep = _maxnorm_run(
        rewards, offsets, group_ids, tau_res, baseline, resolution, dead_zone, bounds, clip,
        singleton, nan_policy, backend, return_scale,
    )
    if return_scale:
        return MaxNormResult(batch.restore(flat), scale, keep)
    return batch.restore(flat)
