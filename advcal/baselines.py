"""The MaxNorm-AC paper's comparison baselines (``docs/maxnorm.md``).

Each divides the group-centred rewards u = r − mean by a scale other than GRPO's σ_q:

* :func:`p90_scale`: one batch-wide scale, the ``quantile`` (default 0.9) of the per-group
  standard deviations of the groups with a gap (the paper's prespecified "p90" reference);
* :func:`grpo_kl_comp`: GRPO's advantages u/(σ_q + eps) with a per-group KL coefficient
  β_q = β/(σ_q + eps) ("β_q compensation"), so that the effective KL coefficient on the
  cardinal reward scale is β for every prompt;
* :func:`mad_scale`: the robust scale 1.4826·MAD_q (median absolute deviation from the
  median, consistent for the normal sd);
* :func:`huber_scale`: Huber's proposal-2 M-estimate of scale around the group mean
  (tuning constant ``c``, consistent for the normal sd).

All take the keywords of :func:`advcal.grpo` (layouts, ``singleton``, ``nan_policy``,
``backend``).  The centring runs in the selected engine's kernel; the robust scales are
order statistics and fixed-point iterations over each group in numpy, the same for both
engines.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from advcal._blocks import expand, gather_rows, size_classes
from advcal._kernels.modes import DR, FIXED
from advcal._point import PointCall, center_scale, check_eps_ddof, output_limit, point_iv
from advcal._validation import check_real, raise_bad_values, valid_counts
from advcal.estimators import grpo

__all__ = ["KLCompensated", "grpo_kl_comp", "huber_scale", "mad_scale", "p90_scale"]

#: 1 / Φ⁻¹(3/4): makes the MAD a consistent estimate of the normal standard deviation.
MAD_NORMAL = 1.482602218505602


def _valid_matrix(call: PointCall, idx: np.ndarray, n: int) -> np.ndarray:
    """The groups ``idx`` (all of size n) as rows, NaN rewards kept as NaN (float64)."""
    return gather_rows(call.batch.values, call.batch.offsets, idx, n).astype(np.float64)


def _group_std(call: PointCall, ddof: int) -> np.ndarray:
    """σ_q per group over its valid rewards (0 with at most ``ddof`` of them, or equal
    ones), taken in units that keep the squares of tiny or huge rewards in range."""
    return call.engine.group_statistics(call.batch.values, call.batch.offsets, ddof,
                                        call.omit)[3]


def _divide(call: PointCall, scale: np.ndarray) -> np.ndarray:
    """u / s_q in the caller's layout: u from the engine (Dr.GRPO's centring, exact zeros for
    constant groups and the singleton policy), s_q per group; a group with s_q = 0 (a
    robust scale of 0 with eps = 0) is skipped: advantages 0."""
    values = call.batch.values
    # Dr.GRPO's centring with its rescaled retry (deviations near 1e154 square to inf, and
    # those of subnormal rewards to 0), in the caller's layout: back to the grouped one.
    u = center_scale(call, DR).reshape(-1)
    if call.batch.order is not None:
        u = u[call.batch.order]
    s = expand(scale, call.batch.offsets)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = np.divide(u.astype(np.float64), s, out=np.zeros(u.shape), where=s > 0)
    if not (np.abs(out) <= output_limit(call)).all():
        raise ValueError("`rewards`: an advantage overflows the output dtype (eps is too "
                         "small for the rewards' gaps).")
    return call.batch.restore(out.astype(values.dtype))


def _lone_scale(call: PointCall, scale: np.ndarray, eps: float) -> np.ndarray:
    """A group with one valid response (kept raw by ``singleton="raw"``) gets 1 + eps, as
    GRPO's lone response (mean 0, std 1)."""
    counts = valid_counts(call.batch, call.omit)
    return np.where(counts == 1, 1.0 + eps, scale)


def p90_scale(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    quantile: float = 0.9,
    eps: float = 1e-6,
    ddof: int = 1,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """Group-centred rewards divided by one batch-wide scale: a quantile of the group stds.

    ``u / (s + eps)`` with ``s`` the ``quantile`` (``numpy.quantile``, linear
    interpolation) of σ_q over the groups with two or more valid responses and a gap
    (σ_q > 0); ``s = 1`` when no group has one (all advantages are then 0).

    Parameters
    ----------
    rewards, offsets, group_ids, singleton, nan_policy, backend
        As in :func:`advcal.grpo`.
    quantile : float, default 0.9
        Which quantile of the per-group stds, in [0, 1].
    eps : float, default 1e-6
        Added to the batch scale.
    ddof : {0, 1}, default 1
        Delta degrees of freedom of the group stds.

    Returns
    -------
    ndarray
        Advantages in the caller's layout and dtype.

    Examples
    --------
    >>> from advcal.baselines import p90_scale
    >>> p90_scale([[0.0, 2.0], [1.0, 1.0], [0.0, 1.0]], quantile=1.0, eps=0.0, ddof=0)
    array([[-1. ,  1. ],
           [ 0. ,  0. ],
           [-0.5,  0.5]])
    """
    eps, ddof = check_eps_ddof(eps, ddof)
    quantile = check_real(quantile, "quantile", low=0.0, high=1.0)
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    return center_scale(call, FIXED, divisor=_batch_quantile(call, quantile, ddof) + eps)


def _batch_quantile(call: PointCall, quantile: float, ddof: int) -> float:
    std = _group_std(call, ddof)
    spread = std[(valid_counts(call.batch, call.omit) >= 2) & (std > 0)]
    if not np.isfinite(std).all():
        raise_bad_values(call.batch.values, call.omit)
    return float(np.quantile(spread, quantile)) if spread.size else 1.0


class KLCompensated(NamedTuple):
    """:func:`grpo_kl_comp` with ``return_kl_weight=True``.

    Attributes
    ----------
    advantages : ndarray
        GRPO's advantages (caller's layout).
    kl_weight : ndarray of float64, shape (B,)
        Per-group multiplier of the KL coefficient, 1/(σ_q + eps): use β_q = β·kl_weight
        (inf where σ_q + eps = 0, or where its reciprocal exceeds float64).
    """

    advantages: np.ndarray
    kl_weight: np.ndarray


def grpo_kl_comp(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    eps: float = 1e-6,
    ddof: int = 1,
    return_kl_weight: bool = False,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> Any:
    """GRPO with β_q compensation: GRPO's advantages and a per-group KL coefficient.

    GRPO weights prompt q by 1/s_q (s_q = σ_q + eps), which on the cardinal reward scale
    turns the KL coefficient β into β·s_q.  The compensated baseline keeps GRPO's
    advantages and uses β_q = β/s_q for the prompt's KL term, so the effective coefficient
    is β for every prompt.  The advantages are :func:`advcal.grpo`'s; the trainer applies
    ``kl_weight``.

    Parameters
    ----------
    rewards, offsets, group_ids, eps, ddof, singleton, nan_policy, backend
        As in :func:`advcal.grpo`.
    return_kl_weight : bool, default False
        Also return the per-group KL multipliers 1/s_q (groups in the order of the rows,
        of ``offsets``, or of first appearance of ``group_ids``).

    Returns
    -------
    ndarray or KLCompensated
        The advantages; with ``return_kl_weight=True``, ``(advantages, kl_weight)``.

    Examples
    --------
    >>> from advcal.baselines import grpo_kl_comp
    >>> out = grpo_kl_comp([[0.0, 2.0], [0.0, 0.5]], eps=0.0, ddof=0,
    ...                    return_kl_weight=True)
    >>> out.advantages
    array([[-1.,  1.],
           [-1.,  1.]])
    >>> out.kl_weight
    array([1., 4.])
    """
    if not isinstance(return_kl_weight, (bool, np.bool_)):
        raise TypeError(f"`return_kl_weight` must be True or False; got {return_kl_weight!r}.")
    advantages = grpo(rewards, offsets, group_ids=group_ids, eps=eps, ddof=ddof,
                      singleton=singleton, nan_policy=nan_policy, backend=backend)
    if not return_kl_weight:
        return advantages
    eps, ddof = check_eps_ddof(eps, ddof)
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    scale = _lone_scale(call, _group_std(call, ddof) + eps, eps)
    with np.errstate(divide="ignore", over="ignore"):  # inf: beyond float64
        weight = 1.0 / scale
    return KLCompensated(advantages, weight)


def _mad(call: PointCall) -> np.ndarray:
    """Median absolute deviation from the median per group, over its valid rewards."""
    sizes = call.batch.sizes
    out = np.zeros(sizes.size)
    for n, idx in size_classes(sizes):
        if n == 0:
            continue
        rows = _valid_matrix(call, idx, n)
        with np.errstate(invalid="ignore"), _quiet_nan_slices():
            med = np.nanmedian(rows, axis=1)
            mad = np.nanmedian(np.abs(rows - med[:, None]), axis=1)
        out[idx] = np.where(np.isfinite(mad), mad, 0.0)
    return out


class _quiet_nan_slices:
    """Silence numpy's "All-NaN slice" warning (an all-NaN group has no scale: 0)."""

    def __enter__(self) -> None:
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)


def mad_scale(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    eps: float = 1e-6,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """Group-centred rewards divided by a robust scale: ``u / (1.4826·MAD_q + eps)``.

    MAD_q = median_i |r_i − median(r)| over the group's valid rewards (``numpy.median``:
    the mean of the two middle values for an even count).  More than half of a group
    tied at one value gives MAD 0, so its gaps are divided by eps alone (with ``eps=0``
    the group is skipped: advantages 0): the robust scale ignores the minority.

    Parameters
    ----------
    rewards, offsets, group_ids, singleton, nan_policy, backend
        As in :func:`advcal.grpo`.
    eps : float, default 1e-6
        Added to the scale.

    Returns
    -------
    ndarray
        Advantages in the caller's layout and dtype.

    Examples
    --------
    >>> from advcal.baselines import mad_scale
    >>> mad_scale([[0.0, 1.0, 2.0, 5.0]], eps=0.0).round(4)
    array([[-1.349 , -0.6745,  0.    ,  2.0235]])
    """
    eps = check_real(eps, "eps", low=0.0)
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    return _divide(call, _lone_scale(call, MAD_NORMAL * _mad(call) + eps, eps))


def _huber_kappa(c: float) -> float:
    """E[ψ_c(Z)²] for standard normal Z, ψ_c(x) = clip(x, −c, c)."""
    phi = math.exp(-0.5 * c * c) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + math.erf(c / math.sqrt(2.0)))
    return (2.0 * cdf - 1.0) - 2.0 * c * phi + 2.0 * c * c * (1.0 - cdf)


#: Iterations of Huber's scale fixed point (it converges linearly from above).
HUBER_MAX_ITER = 200
HUBER_RTOL = 1e-12


@np.errstate(over="ignore", invalid="ignore")  # a non-finite scale is reported by the caller
def _huber(call: PointCall, c: float) -> np.ndarray:
    """Huber's proposal-2 scale per group: s² = Σ ψ_c(u_i/s)² s² / (n κ(c)), u around the
    group mean, started at the ddof-0 std / √κ (exact when no residual is clipped)."""
    sizes = call.batch.sizes
    kappa = _huber_kappa(c)
    out = np.zeros(sizes.size)
    for n, idx in size_classes(sizes):
        if n == 0:
            continue
        rows = _valid_matrix(call, idx, n)
        valid = ~np.isnan(rows)
        count = valid.sum(axis=1)
        safe = np.where(valid, rows, 0.0)
        first = safe[np.arange(idx.size), np.argmax(valid, axis=1)]
        d = np.where(valid, safe - first[:, None], 0.0)  # exact 0 for a constant group
        mean = d.sum(axis=1) / np.maximum(count, 1)
        u = np.where(valid, d - mean[:, None], 0.0)
        peak = np.abs(u).max(axis=1)
        unit = np.where(peak[:, None] > 0, u / np.where(peak > 0, peak, 1.0)[:, None], 0.0)
        s = np.sqrt((unit ** 2).sum(axis=1) / np.maximum(count, 1) / kappa)
        for _ in range(HUBER_MAX_ITER):
            z = np.clip(unit / np.where(s > 0, s, 1.0)[:, None], -c, c)
            new = s * np.sqrt((z ** 2).sum(axis=1) / np.maximum(count, 1) / kappa)
            done = np.abs(new - s) <= HUBER_RTOL * s
            s = new
            if done.all():
                break
        # Polish: given which residuals are clipped at the solution, the equation is
        # linear in s²: s² = Σ_unclipped u² / (n κ − c² · #clipped).
        clipped = np.abs(unit) > c * s[:, None]
        den = count * kappa - c * c * clipped.sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            exact = np.sqrt(np.where(clipped, 0.0, unit ** 2).sum(axis=1) / den)
        same = (np.abs(unit) > c * exact[:, None]) == clipped
        s = np.where((den > 0) & same.all(axis=1) & np.isfinite(exact), exact, s)
        out[idx] = s * peak  # computed on u / max|u| so no square overflows
    return out


def huber_scale(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    c: float = 1.345,
    eps: float = 1e-6,
    singleton: str = "zero",
    nan_policy: str = "raise",
    backend: str = "numba",
) -> np.ndarray:
    """Group-centred rewards divided by Huber's M-estimate of scale: ``u / (s_q + eps)``.

    s_q solves (1/n) Σ_i ψ_c(u_i / s)² = κ(c) with ψ_c(x) = clip(x, −c, c), u the rewards
    minus the group mean and κ(c) = E[ψ_c(Z)²] for a standard normal Z (Huber's proposal
    2 with the location held at the mean, so the advantages still sum to 0; consistent for
    the normal sd).  When no |u_i| exceeds c·s the solution is closed-form:
    s = √(Σ u_i² / (n κ(c))).  Solved by the fixed-point iteration
    s ← s·√(mean ψ_c(u/s)² / κ), then solved exactly given which residuals it clips.

    Parameters
    ----------
    rewards, offsets, group_ids, singleton, nan_policy, backend
        As in :func:`advcal.grpo`.
    c : float, default 1.345
        Huber's tuning constant, > 0 (1.345: 95% efficiency at the normal).
    eps : float, default 1e-6
        Added to the scale.

    Returns
    -------
    ndarray
        Advantages in the caller's layout and dtype.

    Examples
    --------
    >>> from advcal.baselines import huber_scale
    >>> huber_scale([[0.0, 1.0]], eps=0.0, c=3.0).round(6)  # ±√κ(3): nothing clipped
    array([[-0.997501,  0.997501]])
    """
    eps = check_real(eps, "eps", low=0.0)
    c = check_real(c, "c", low=0.0, low_inclusive=False)
    call = point_iv(rewards, offsets, group_ids, singleton, nan_policy, backend)
    return _divide(call, _lone_scale(call, _huber(call, c) + eps, eps))


def group_scales(function: Any, values: np.ndarray, offsets: np.ndarray, backend: str,
                 options: dict[str, Any]) -> np.ndarray:
    """s_q per group of one of this module's estimators (the scale diagnostics' rule):
    ``options`` are the estimator's keywords with ``eps`` set; values finite, grouped."""
    call = point_iv(values, offsets, None, options.get("singleton", "zero"),
                     options.get("nan_policy", "raise"), backend)
    eps = float(options["eps"])
    if function is p90_scale:
        s = _batch_quantile(call, float(options.get("quantile", 0.9)),
                            int(options.get("ddof", 1)))
        return np.full(call.batch.n_groups, s + eps)
    if function is grpo_kl_comp:
        return _group_std(call, int(options.get("ddof", 1))) + eps
    if function is mad_scale:
        return MAD_NORMAL * _mad(call) + eps
    if function is huber_scale:
        return _huber(call, float(options.get("c", 1.345))) + eps
    raise ValueError(f"no scale rule for {getattr(function, '__name__', function)!r}")
