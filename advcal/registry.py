"""The estimator registry: every advantage estimator advcal knows, in one table.

Each :class:`Estimator` entry says what the rest of the package needs to know about one
estimator: the function, whether its advantages sum to zero within every group (the JRSC
sets live on that centred subspace), the kind of Jacobian the sets use, the keywords the
caller must supply, and how the scale diagnostics take its per-group scale.  The
:func:`advantages` dispatcher, :data:`ESTIMATORS`, :func:`advcal.scale_diagnostics`,
:func:`advcal.calibrate_sets` and the command line all read this table, and nothing
changes it after import.  ``docs/internals.md`` says how to add an estimator.

Per-group scale s_q.  Every registered estimator gives the responses of group q weights
``w_i = u_i / s_q``: ``u`` is the estimator's own baseline-corrected reward, in reward
units, and s_q one positive number per group.  The diagnostics report 1/s_q (the
prompt's weight in the batch) and beta_eff,q = beta * s_q (the table is also on the
MaxNorm-AC docs page):

    estimator              u_i                                       s_q
    ---------------------  ----------------------------------------  ---------------------
    grpo                   r_i - mean                                std_q + eps
    dr_grpo                r_i - mean                                1
    rloo                   r_i - mean of the others                  1
    batch_std              r_i - mean                                std_batch + eps
    reinforce_pp_baseline  r_i - mean - m (m: weighted batch mean    sqrt(v + eps), v the
                           of the centred rewards; 0 up to rounding  weighted batch variance
                           without token counts)                     of the centred rewards
    opo                    r_i - length-weighted mean                1
    gpg                    r_i - mean                                f_norm * k / N (k
                                                                     nonzero of N rewards)
    passk                  r_max - r_2nd for the best, 0 otherwise   std_q + eps
    maxnorm                baseline-centred (rloo by default)        max(max_i |u_i|, tau_res)
    range                  on points (ranges [r, r]): r_i - mean     1
    p90_scale              r_i - mean                                P90 of the batch's group
                                                                     stds (> 0) + eps
    grpo_kl_comp           r_i - mean                                std_q + eps, and KL
                                                                     weight 1/s_q (beta_eff = beta)
    mad_scale              r_i - mean                                1.4826 MAD_q + eps
    huber_scale            r_i - mean                                Huber scale_q + eps
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from advcal._blocks import expand, segment_sum
from advcal._kernels import engine
from advcal._point import batch_std_of, gpg_divisor, point_iv, whitening
from advcal._validation import check_choice, check_keywords
from advcal.baselines import group_scales, grpo_kl_comp, huber_scale, mad_scale, p90_scale
from advcal.estimators import (
    batch_std,
    dr_grpo,
    gpg,
    grpo,
    opo,
    passk,
    reinforce_pp_baseline,
    rloo,
)
from advcal.ranges import range_advantages
from advcal.resolution import maxnorm

__all__ = [
    "ANALYTIC",
    "CLOSED_FORM",
    "ESTIMATORS",
    "FINITE_DIFFERENCE",
    "REGISTRY",
    "DiagnosticSettings",
    "Estimator",
    "Scaled",
    "advantages",
]

#: Jacobian kinds.  Closed form: J = t·(C − ûûᵀ) + r·ûûᵀ, two eigenvalues per group and no
#: blocks; analytic: dense blocks from a formula; finite difference: central differences
#: of the estimator (any estimator, nothing to write).
CLOSED_FORM = "closed form"
ANALYTIC = "analytic"
FINITE_DIFFERENCE = "finite difference"


class DiagnosticSettings(NamedTuple):
    """The options :func:`advcal.scale_diagnostics` shares between estimators.

    Attributes
    ----------
    eps : float
        Offset of the estimators that divide by ``std + eps`` (grpo, batch_std, passk).
    tau_res : float
        MaxNorm's scale floor.
    resolution : float or None
        MaxNorm's binning resolution.
    backend : str
        Engine of every estimator.
    """

    eps: float
    tau_res: float
    resolution: float | None
    backend: str


class Scaled(NamedTuple):
    """An estimator's weights on a batch and its per-group scale (see the module notes).

    Attributes
    ----------
    weights : ndarray
        Advantages, flat in grouped order.
    scale : ndarray of float64, shape (B,)
        s_q per group.
    informative : ndarray of bool, shape (B,)
        Groups whose weights come from a gap in their own rewards (False: the estimator
        skips the group, e.g. all rewards equal).
    kl_weight : ndarray of float64, shape (B,), or None
        Per-group multiplier of the KL coefficient (beta_q = beta * kl_weight), for
        estimators that adjust it (grpo_kl_comp); None: beta for every group.
    scorable : ndarray of bool, shape (B,), or None
        Groups with two or more valid responses, from a rule that left NaN rewards out
        (``nan_policy="omit"`` in its options); None: read it off the group sizes.
    """

    weights: np.ndarray
    scale: np.ndarray
    informative: np.ndarray
    kl_weight: np.ndarray | None = None
    scorable: np.ndarray | None = None


#: ``scale(values, offsets, settings, options)``: values are flat finite rewards in
#: grouped order, options the caller's keywords for this estimator (per-response ones
#: already in grouped order).
ScaleRule = Callable[[np.ndarray, np.ndarray, DiagnosticSettings, dict[str, Any]], Scaled]


@dataclass(frozen=True)
class Estimator:
    """One registered estimator.

    Attributes
    ----------
    name : str
        Its key in :data:`REGISTRY` and :data:`ESTIMATORS`.
    function : callable
        ``function(rewards, offsets=None, *, group_ids=None, **options)``.
    centered : bool
        The advantages sum to zero within every group (required by the JRSC sets).
    jacobian : str
        :data:`CLOSED_FORM`, :data:`ANALYTIC` or :data:`FINITE_DIFFERENCE`.
    scale : callable
        How the scale diagnostics compute its weights and per-group scale
        (``ScaleRule``: returns a :class:`Scaled`).
    needs : tuple of str
        Keywords the caller must pass (no default).
    per_response : tuple of str
        Keywords that hold one value per response, in the layout of the rewards.
    ranges : bool
        Takes reward ranges ``lo``, ``hi`` instead of point rewards (``rewards=None``).
    """

    name: str
    function: Callable[..., np.ndarray]
    centered: bool
    jacobian: str
    scale: ScaleRule
    needs: tuple[str, ...] = ()
    per_response: tuple[str, ...] = ()
    ranges: bool = False


# --------------------------------------------------------------------------- scale rules



def _range_entry(
    rewards: ArrayLike | None,
    offsets: ArrayLike | None = None,
    *,
    lo: ArrayLike | None = None,
    hi: ArrayLike | None = None,
    **kwargs: Any,
) -> np.ndarray:
    """``advantages(None, offsets, method="range", lo=..., hi=...)``."""
    if rewards is not None:
        raise ValueError(
            "method='range' takes reward ranges as `lo` and `hi`; pass None for `rewards` "
            "(points are the degenerate ranges lo = hi = rewards)."
        )
    if lo is None or hi is None:
        raise TypeError("method='range' needs both `lo` and `hi`.")
    return range_advantages(lo, hi, offsets, **kwargs)


def _extremes(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-group minimum and maximum (0 for empty groups)."""
    sizes = np.diff(offsets)
    starts = offsets[:-1][sizes > 0]
    low = np.zeros(sizes.size)
    high = np.zeros(sizes.size)
    if starts.size:
        low[sizes > 0] = np.minimum.reduceat(values, starts)
        high[sizes > 0] = np.maximum.reduceat(values, starts)
    return low, high


def _sizes_and_gap(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group sizes, and whether each group's values are not all equal."""
    low, high = _extremes(values, offsets)
    return np.diff(offsets), high != low


def _count(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-group number of True entries of a flat grouped mask."""
    return segment_sum(mask.astype(np.float64), offsets)


class _Spread(NamedTuple):
    """Per-group count of valid rewards, their std (float64) and whether they differ."""

    n_valid: np.ndarray
    std: np.ndarray
    gap: np.ndarray


def _group_spread(values: np.ndarray, offsets: np.ndarray, ddof: int, omit: bool,
                  backend: str) -> _Spread:
    """Count, std (``ddof``; 0 for a constant group) and gap of every group's rewards,
    NaN rewards left out with ``omit``: the per-group facts of the std and unit scale
    rules, from the point engine of ``backend``."""
    count, _, _, std, gap = engine("point", backend).group_statistics(values, offsets, ddof, omit)
    return _Spread(count, std, gap)


@functools.cache
def _default(function: Callable[..., Any], keyword: str) -> Any:
    """The default of ``function``'s ``keyword`` (one source for the estimator's default)."""
    return inspect.signature(function).parameters[keyword].default


def _omits(options: dict[str, Any]) -> bool:
    """The caller asked for NaN rewards to be left out (only the TRL trainer does: the
    scale diagnostics take finite rewards)."""
    return options.get("nan_policy") == "omit"


def _scorable(spread: _Spread, omit: bool) -> np.ndarray | None:
    return spread.n_valid >= 2 if omit else None


def _unit_scale(function: Callable[..., np.ndarray]) -> ScaleRule:
    """Scale 1: the weights are the baseline-corrected rewards themselves."""

    def rule(values: np.ndarray, offsets: np.ndarray, settings: DiagnosticSettings,
             options: dict[str, Any]) -> Scaled:
        weights = function(values, offsets, backend=settings.backend, **options)
        omit = _omits(options)
        spread = _group_spread(values, offsets, 1, omit, settings.backend)
        return Scaled(weights, np.ones(offsets.size - 1), spread.gap,
                      scorable=_scorable(spread, omit))

    return rule


def _std_scale(function: Callable[..., np.ndarray], *, unique_top: bool = False) -> ScaleRule:
    """Scale std_q + eps (``unique_top``: a tie for the best reward is a skipped group)."""

    def rule(values: np.ndarray, offsets: np.ndarray, settings: DiagnosticSettings,
             options: dict[str, Any]) -> Scaled:
        options = {"eps": settings.eps, **options}
        weights = function(values, offsets, backend=settings.backend, **options)
        ddof = options.get("ddof", _default(function, "ddof"))
        omit = _omits(options)
        spread = _group_spread(values, offsets, ddof, omit, settings.backend)
        scale = spread.std + options["eps"]
        gap = spread.gap
        if unique_top:
            top = expand(_extremes(values, offsets)[1], offsets)
            gap = _count(values == top, offsets) == 1
        # A zero scale (eps = 0 and all rewards equal) is a skipped group.
        return Scaled(weights, scale, gap & (scale > 0.0), scorable=_scorable(spread, omit))

    return rule


def _batch_std_scale(values: np.ndarray, offsets: np.ndarray, settings: DiagnosticSettings,
                     options: dict[str, Any]) -> Scaled:
    options = {"eps": settings.eps, **options}
    weights = batch_std(values, offsets, backend=settings.backend, **options)
    ddof = options.get("ddof", _default(batch_std, "ddof"))
    omit = _omits(options)
    call = point_iv(values, offsets, None, "zero", "omit" if omit else "raise",
                     settings.backend)
    spread = _group_spread(values, offsets, ddof, omit, settings.backend)
    scale = np.full(offsets.size - 1, batch_std_of(call, ddof) + options["eps"])
    return Scaled(weights, scale, spread.gap & (scale > 0.0), scorable=_scorable(spread, omit))


def _reinforce_pp_scale(values: np.ndarray, offsets: np.ndarray,
                        settings: DiagnosticSettings, options: dict[str, Any]) -> Scaled:
    weights = reinforce_pp_baseline(values, offsets, backend=settings.backend, **options)
    u = dr_grpo(values, offsets, backend=settings.backend,
                singleton=options.get("singleton", "zero")).astype(np.float64)
    tokens = options.get("token_counts")
    counts = np.ones(values.shape) if tokens is None else np.asarray(tokens, np.float64)
    eps = options.get("eps", _default(reinforce_pp_baseline, "eps"))
    sizes, gap = _sizes_and_gap(values, offsets)
    whitened = whitening(u, counts, eps, options.get("ddof", 1), options.get("var_floor", 0.0))
    scale = np.full(sizes.size, whitened[1] if options.get("std_norm", True) else 1.0)
    return Scaled(weights, scale, gap & (scale > 0.0))


def _opo_scale(values: np.ndarray, offsets: np.ndarray, settings: DiagnosticSettings,
               options: dict[str, Any]) -> Scaled:
    # Without lengths every response counts once: the baseline is the plain group mean.
    options = {"lengths": np.ones(values.shape), **options}
    return _unit_scale(opo)(values, offsets, settings, options)


def _gpg_scale(values: np.ndarray, offsets: np.ndarray, settings: DiagnosticSettings,
               options: dict[str, Any]) -> Scaled:
    weights = gpg(values, offsets, backend=settings.backend, **options)
    divisor = gpg_divisor(values, float(options.get("f_norm", _default(gpg, "f_norm"))))
    sizes, gap = _sizes_and_gap(values, offsets)
    return Scaled(weights, np.full(sizes.size, divisor), gap)


def _maxnorm_scale(values: np.ndarray, offsets: np.ndarray, settings: DiagnosticSettings,
                   options: dict[str, Any]) -> Scaled:
    options = {"tau_res": settings.tau_res, "resolution": settings.resolution, **options}
    result = maxnorm(values, offsets, backend=settings.backend, return_scale=True, **options)
    scorable = None
    if _omits(options):
        unscorable = np.diff(np.searchsorted(np.flatnonzero(np.isnan(values)), offsets))
        scorable = np.diff(offsets) - unscorable >= 2
    return Scaled(result.advantages, result.scale, result.keep, scorable=scorable)


def _baseline_scale(function: Callable[..., Any], *, kl_compensated: bool = False
                    ) -> ScaleRule:
    """Scale rule of the MaxNorm paper's baselines (``advcal.baselines``); with
    ``kl_compensated`` the KL weight is 1/s_q, so beta_eff,q = beta."""

    def rule(values: np.ndarray, offsets: np.ndarray, settings: DiagnosticSettings,
             options: dict[str, Any]) -> Scaled:
        options = {"eps": settings.eps, **options}
        options.pop("return_kl_weight", None)
        weights = function(values, offsets, backend=settings.backend, **options)
        scale = group_scales(function, values, offsets, settings.backend, options)
        sizes, gap = _sizes_and_gap(values, offsets)
        informative = gap & (scale > 0.0)
        if not kl_compensated:
            return Scaled(weights, scale, informative)
        with np.errstate(divide="ignore"):
            return Scaled(weights, scale, informative, 1.0 / scale)

    return rule


def _range_scale(values: np.ndarray, offsets: np.ndarray, settings: DiagnosticSettings,
                 options: dict[str, Any]) -> Scaled:
    # Points are the degenerate ranges [r, r] (then the weights are Dr.GRPO's); with
    # ranges, a group whose ranges give no direction (all weights 0) is skipped.
    lo = options.pop("lo", None)
    hi = options.pop("hi", None)
    if (lo is None) != (hi is None):
        raise TypeError("method 'range' needs both `lo` and `hi`, or neither (points).")
    if lo is None:
        return _unit_scale(_points_as_ranges)(values, offsets, settings, options)
    weights = range_advantages(lo, hi, offsets, backend=settings.backend, **options)
    moved = _count(weights != 0.0, offsets) > 0
    return Scaled(weights, np.ones(moved.size), moved)


def _points_as_ranges(values: ArrayLike, offsets: ArrayLike | None = None,
                      **options: Any) -> np.ndarray:
    """Range-GRPO on points: the degenerate ranges [r, r]."""
    return range_advantages(values, values, offsets, **options)


# --------------------------------------------------------------------------- the table


def _table(*entries: Estimator) -> Mapping[str, Estimator]:
    return MappingProxyType({entry.name: entry for entry in entries})


#: Every registered estimator by name, in documentation order (read-only).
REGISTRY: Mapping[str, Estimator] = _table(
    Estimator("grpo", grpo, True, CLOSED_FORM, _std_scale(grpo)),
    Estimator("dr_grpo", dr_grpo, True, CLOSED_FORM, _unit_scale(dr_grpo)),
    Estimator("rloo", rloo, True, CLOSED_FORM, _unit_scale(rloo)),
    Estimator("batch_std", batch_std, True, FINITE_DIFFERENCE, _batch_std_scale),
    Estimator("reinforce_pp_baseline", reinforce_pp_baseline, False, FINITE_DIFFERENCE,
              _reinforce_pp_scale, per_response=("token_counts",)),
    Estimator("opo", opo, False, FINITE_DIFFERENCE, _opo_scale, needs=("lengths",),
              per_response=("lengths",)),
    Estimator("gpg", gpg, True, FINITE_DIFFERENCE, _gpg_scale),
    Estimator("passk", passk, False, FINITE_DIFFERENCE, _std_scale(passk, unique_top=True)),
    Estimator("maxnorm", maxnorm, True, ANALYTIC, _maxnorm_scale, needs=("tau_res",)),
    Estimator("range", _range_entry, True, FINITE_DIFFERENCE, _range_scale,
              needs=("lo", "hi"), per_response=("lo", "hi"), ranges=True),
    # The MaxNorm-AC paper's comparison baselines (advcal.baselines).
    Estimator("p90_scale", p90_scale, True, FINITE_DIFFERENCE, _baseline_scale(p90_scale)),
    Estimator("grpo_kl_comp", grpo_kl_comp, True, FINITE_DIFFERENCE,
              _baseline_scale(grpo_kl_comp, kl_compensated=True)),
    Estimator("mad_scale", mad_scale, True, FINITE_DIFFERENCE, _baseline_scale(mad_scale)),
    Estimator("huber_scale", huber_scale, True, FINITE_DIFFERENCE,
              _baseline_scale(huber_scale)),
)

#: Estimator functions by name (a read-only view of :data:`REGISTRY`):
#: ``ESTIMATORS["rloo"](rewards)`` is ``rloo(rewards)``.
ESTIMATORS: Mapping[str, Callable[..., np.ndarray]] = MappingProxyType(
    {name: entry.function for name, entry in REGISTRY.items()})


def advantages(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    method: str = "grpo",
    **kwargs: Any,
) -> np.ndarray:
    """Advantages by estimator name: ``advantages(r, method="rloo")`` is ``rloo(r)``.

    Parameters
    ----------
    rewards, offsets
        As in :func:`advcal.grpo` (``None`` rewards for ``method="range"``, which takes
        ``lo`` and ``hi``).
    method : str, default "grpo"
        A key of :data:`advcal.ESTIMATORS`.
    **kwargs
        Keyword options of the chosen estimator (``group_ids``, ``eps``, ...).

    Returns
    -------
    ndarray
        The chosen estimator's advantages.

    Examples
    --------
    >>> from advcal import advantages
    >>> advantages([[1.0, 0.0, 0.0]], method="rloo")
    array([[ 1. , -0.5, -0.5]])
    """
    check_choice(method, "method", tuple(REGISTRY))
    check_keywords(REGISTRY[method].function, method, kwargs)
    return REGISTRY[method].function(rewards, offsets, **kwargs)
