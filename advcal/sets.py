"""JRSC: joint reward-set calibration of GRPO coefficients.

A grader's noise moves every coefficient of a group at once, because the group's
coefficients share its mean and standard deviation.  JRSC models that joint shift with
the Jacobian J of the coefficient map T and calibrates one radius ρ on paired scorings,
so that for an exchangeable training group the second scoring's coefficients T(r′) lie in

    E_q = {c + S_q^{1/2} z : ‖z‖ ≤ ρ},   c = T(r),   S_q = J Σ_r Jᵀ + λ_q ûûᵀ (+ floor·C)

with probability at least 1 − α.

* :func:`coefficient_jacobian`: per-group Jacobians of T, of the kind the estimator's
  entry in :mod:`advcal.registry` names: closed form (``grpo``, ``dr_grpo``, ``rloo``),
  analytic (``maxnorm``), or central finite differences of the estimator for every
  other one.
* :func:`calibrate_sets`: scores d_q = ‖S_q^{+1/2} (T(r′) − T(r))‖ of calibration groups
  and their split-conformal quantile ρ.
* :func:`coefficient_sets`: the sets of a training batch, with ``contains`` and
  ``support`` (the minimum of a linear functional over each set).

Shapes that are a multiple of the centering matrix plus a multiple of ûûᵀ (GRPO, Dr.GRPO
and RLOO under isotropic grader noise, and the isotropic ball) are kept in that closed form
— two eigenvalues per group, no eigendecomposition; every other case stores dense blocks.
See ``docs/setgrpo.md`` for the modelling choices.  ``CENTERED``, ``SHAPES`` and ``NOISES``
list the accepted ``estimator``, ``shape`` and ``noise`` values (the first from
:mod:`advcal.registry`).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from advcal import _fields
from advcal._blocks import (
    block_offsets,
    centered,
    expand,
    gather_blocks,
    gather_rows,
    restore_blocks,
    scatter_blocks,
    segment_sum,
    size_classes,
)
from advcal._validation import Batch, as_batch, check_choice, check_int, check_real
from advcal.conformal import conformal_quantile
from advcal.jacobian import (
    check_estimator,
    check_options,
    closed_form,
    coefficient_jacobian,
    jacobian_flat,
    radial,
    structured_blocks,
    transform_checked,
)
from advcal.registry import CLOSED_FORM, ESTIMATORS, REGISTRY

__all__ = [
    "CoefficientSets",
    "SetCalibration",
    "calibrate_sets",
    "coefficient_jacobian",
    "coefficient_sets",
]

# The registered estimators of point rewards whose coefficients sum to zero within a
# group: the sets live on the centered subspace.
CENTERED = tuple(name for name, entry in REGISTRY.items() if entry.centered and not entry.ranges)
SHAPES = ("joint", "isotropic")
NOISES = ("isotropic", "diagonal")

# Relative floor added to S on the centered subspace (times the tangential eigenvalue),
# plus an absolute one for groups without noise: keeps S⁺ and S^{1/2} finite.
FLOOR_RELATIVE = 1e-12
FLOOR_ABSOLUTE = 1e-30
# Relative tolerance of the membership test d² ≤ ρ² and of "centered" coefficients.
MEMBERSHIP_RTOL = 1e-9


# --------------------------------------------------------------------------- estimator maps


@dataclass(frozen=True)
class _Geometry:
    """Centers and shapes of a batch of sets (flat, grouped order, float64).

    Closed form (``blocks is None``): S = t_tan (C − ûûᵀ) + t_rad ûûᵀ.  Dense: ``blocks``.
    """

    centers: np.ndarray
    offsets: np.ndarray
    u_hat: np.ndarray | None = None
    t_tan: np.ndarray | None = None
    t_rad: np.ndarray | None = None
    blocks: np.ndarray | None = None

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def shape_blocks(self) -> np.ndarray:
        if self.blocks is not None:
            return self.blocks
        return self._closed_form_blocks(np.asarray(self.t_tan), np.asarray(self.t_rad))

    def root_blocks(self) -> np.ndarray:
        """S^{1/2} per group (symmetric square root)."""
        if self.blocks is None:
            return self._closed_form_blocks(np.sqrt(np.asarray(self.t_tan)),
                                            np.sqrt(np.asarray(self.t_rad)))
        sizes = self.sizes
        boffsets = block_offsets(sizes)
        out = np.zeros_like(self.blocks)
        for n, idx in size_classes(sizes):
            if n == 0:
                continue
            blocks = gather_blocks(self.blocks, boffsets, idx, n)
            w, v = np.linalg.eigh(blocks)
            w = np.sqrt(np.clip(w, 0.0, None))
            scatter_blocks(out, boffsets, idx, n, (v * w[:, None, :]) @ v.transpose(0, 2, 1))
        return out

    def _closed_form_blocks(self, tan: np.ndarray, rad: np.ndarray) -> np.ndarray:
        return structured_blocks(np.asarray(self.u_hat), self.offsets, tan, rad)

    def quad_pinv(self, delta: np.ndarray) -> np.ndarray:
        """δᵀ S⁺ δ per group for centered δ (flat)."""
        if self.blocks is None:
            u_hat = np.asarray(self.u_hat)
            radial = segment_sum(u_hat * delta, self.offsets)
            total = segment_sum(delta * delta, self.offsets)
            tangential = np.clip(total - radial * radial, 0.0, None)
            return tangential / np.asarray(self.t_tan) + radial * radial / np.asarray(self.t_rad)
        return self._dense_quad(delta, inverse=True)

    def quad(self, v: np.ndarray) -> np.ndarray:
        """vᵀ S v per group (flat v)."""
        if self.blocks is None:
            u_hat = np.asarray(self.u_hat)
            vc = centered(v, self.offsets)
            radial = segment_sum(u_hat * vc, self.offsets)
            total = segment_sum(vc * vc, self.offsets)
            tangential = np.clip(total - radial * radial, 0.0, None)
            return np.asarray(self.t_tan) * tangential + np.asarray(self.t_rad) * radial * radial
        return self._dense_quad(v, inverse=False)

    def log_pdet(self) -> np.ndarray:
        """log pseudo-determinant of S per group on the centered subspace."""
        sizes = self.sizes
        if self.blocks is None:
            dims = np.maximum(sizes - 2, 0)
            return (dims * np.log(np.asarray(self.t_tan))
                    + np.where(sizes >= 2, np.log(np.asarray(self.t_rad)), 0.0))
        boffsets = block_offsets(sizes)
        out = np.zeros(sizes.size)
        for n, idx in size_classes(sizes):
            if n < 2:
                continue
            blocks = gather_blocks(np.asarray(self.blocks), boffsets, idx, n)
            out[idx] = np.linalg.slogdet(blocks + 1.0 / n)[1]
        return out

    def _dense_quad(self, v: np.ndarray, *, inverse: bool) -> np.ndarray:
        sizes = self.sizes
        boffsets = block_offsets(sizes)
        out = np.zeros(sizes.size)
        blocks_all = np.asarray(self.blocks)
        for n, idx in size_classes(sizes):
            if n == 0:
                continue
            blocks = gather_blocks(blocks_all, boffsets, idx, n)
            vq = gather_rows(v, self.offsets, idx, n)
            if inverse:
                # S + 11ᵀ/n is invertible and equals S⁺ on the centered subspace, unless
                # S underflowed (scores so small that their squared noise is below float64).
                try:
                    solved = np.linalg.solve(blocks + 1.0 / n, vq[:, :, None])[:, :, 0]
                except np.linalg.LinAlgError:
                    raise ValueError(
                        "the set shapes are singular: the scores' noise is too small for "
                        "float64 (its square underflows); rescale the scores.") from None
                out[idx] = np.einsum("bi,bi->b", vq, solved)
            else:
                out[idx] = np.einsum("bi,bij,bj->b", vq, blocks, vq)
        return out


def _noise_per_response(noise_var: np.ndarray | float, n_values: int) -> np.ndarray:
    if np.ndim(noise_var) == 0:
        return np.full(n_values, float(noise_var))
    return np.asarray(noise_var, dtype=np.float64)


def _geometry(values: np.ndarray, offsets: np.ndarray, *, estimator: str, eps: float,
              ddof: int, shape: str, noise: str, noise_var: np.ndarray | float, ridge: float,
              options: Mapping[str, Any], centers: np.ndarray | None = None) -> _Geometry:
    if centers is None:
        centers = transform_checked(values, offsets, estimator, eps, ddof, options)
    sizes = np.diff(offsets)
    n_groups = sizes.size
    if shape == "isotropic":
        ones = np.ones(n_groups)
        return _Geometry(centers, offsets, np.zeros(values.size), ones, ones)
    if noise == "isotropic" and closed_form(estimator, options):
        geo = radial(values, offsets, estimator, eps, ddof)
        var = float(noise_var)
        tan = var * geo.j_tan ** 2
        floor = FLOOR_RELATIVE * tan + FLOOR_ABSOLUTE
        rad = var * geo.j_rad ** 2 + ridge * tan
        return _Geometry(centers, offsets, geo.u_hat, tan + floor, rad + floor)
    # Dense path: S = J diag(v) Jᵀ + λ ûûᵀ + floor·C, group by group size.
    jac = jacobian_flat(values, offsets, estimator, eps, ddof, options)
    var_flat = _noise_per_response(noise_var, values.size)
    u = centered(values, offsets)
    norm = np.sqrt(segment_sum(u * u, offsets))
    u_hat = u * expand(np.divide(1.0, norm, out=np.zeros_like(norm), where=norm > 0), offsets)
    closed = REGISTRY[estimator].jacobian == CLOSED_FORM
    j_tan = radial(values, offsets, estimator, eps, ddof).j_tan if closed else None
    boffsets = block_offsets(sizes)
    blocks = np.zeros(int(boffsets[-1]))
    for n, idx in size_classes(sizes):
        if n == 0:
            continue
        jq = gather_blocks(jac, boffsets, idx, n)
        vq = gather_rows(var_flat, offsets, idx, n)
        scaled = jq * np.sqrt(vq)[:, None, :]
        s = np.matmul(scaled, scaled.transpose(0, 2, 1))
        s += s.transpose(0, 2, 1).copy()  # exact symmetry (the matmul may round unevenly)
        s *= 0.5
        if j_tan is not None:
            tangential = vq.mean(axis=1) * j_tan[idx] ** 2
        else:
            tangential = np.trace(s, axis1=1, axis2=2) / max(n - 1, 1)
        uh = gather_rows(u_hat, offsets, idx, n)
        floor = FLOOR_RELATIVE * tangential + FLOOR_ABSOLUTE
        np.multiply(uh[:, :, None], uh[:, None, :], out=scaled)
        scaled *= (ridge * tangential)[:, None, None]
        s += scaled
        # Project on the centered subspace (C S C; exact for raw singletons, whose J is not
        # centered), then + floor·C = floor·(I − 11ᵀ/n).
        row = s.mean(axis=2)
        s -= row[:, :, None] + row[:, None, :] - row.mean(axis=1)[:, None, None]
        s -= (floor / n)[:, None, None]
        s.reshape(-1, n * n)[:, :: n + 1] += floor[:, None]
        scatter_blocks(blocks, boffsets, idx, n, s)
    return _Geometry(centers, offsets, blocks=blocks)


# --------------------------------------------------------------------------- calibration


def _check_set_options(options: Any, estimator: str) -> None:
    if not isinstance(options, Mapping):
        raise TypeError(f"`options` must be a mapping of estimator keywords; "
                        f"got {type(options).__name__}.")
    params = inspect.signature(ESTIMATORS[estimator]).parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for key, value in options.items():
        if not isinstance(key, str):
            raise TypeError(f"`options` keys must be strings; got {key!r}.")
        if key not in params and not takes_kwargs:
            raise ValueError(f"`options[{key!r}]`: estimator {estimator!r} has no keyword "
                             f"{key!r}.")
        if np.ndim(value) > 0 and not (key == "bounds" and np.shape(value) == (2,)):
            raise ValueError(f"`options[{key!r}]` must be a scalar (per-response estimator "
                             "inputs cannot live in a calibration).")
    if estimator == "maxnorm":
        if "tau_res" not in options:
            raise ValueError("`options` must give `tau_res` for estimator='maxnorm'.")
        _fields.real(options["tau_res"], "options['tau_res']", low=0.0, low_open=True)


def validate_set_calibration(cal: Any) -> None:
    """Check every field of a :class:`~advcal.SetCalibration` (run on construction).

    Raises ``ValueError`` or ``TypeError`` naming the first bad field: a negative or NaN
    radius ``rho``, ``alpha`` outside (0, 1), a negative ``noise_var`` or ``ridge``,
    ``scores`` that are not a non-empty 1-D float array of non-negative values, an
    unknown or non-centering ``estimator``, an unknown ``shape`` or ``noise``, or
    ``options`` the estimator does not take.
    """

    _fields.real(cal.rho, "rho", low=0.0, allow_inf=True)
    _fields.alpha(cal.alpha)
    _fields.real(cal.noise_var, "noise_var", low=0.0)
    _fields.real(cal.ridge, "ridge", low=0.0)
    scores = _fields.float_vector(cal.scores, "scores")
    if np.isnan(scores).any():
        raise ValueError("`scores` must not contain NaN.")
    if (scores < 0).any():
        raise ValueError("`scores` must be non-negative (they are distances).")

    if not isinstance(cal.estimator, str) or cal.estimator not in ESTIMATORS:
        raise ValueError(f"`estimator` must be a key of advcal.ESTIMATORS; got "
                         f"{cal.estimator!r}.")
    if cal.estimator not in CENTERED:
        raise ValueError(f"`estimator` must center coefficients within groups for sets "
                         f"(one of {', '.join(repr(e) for e in CENTERED)}); got "
                         f"{cal.estimator!r}.")
    check_choice(cal.shape, "shape", tuple(SHAPES))
    check_choice(cal.noise, "noise", tuple(NOISES))
    _fields.real(cal.eps, "eps", low=0.0)
    if isinstance(cal.ddof, (bool, np.bool_)) or not isinstance(cal.ddof, numbers.Integral) \
            or int(cal.ddof) not in (0, 1):
        raise ValueError(f"`ddof` must be 0 or 1; got {cal.ddof!r}.")
    _check_set_options(cal.options, cal.estimator)


@dataclass(frozen=True)
class SetCalibration:
    """The result of :func:`calibrate_sets`: everything needed to build training sets.

    Attributes
    ----------
    rho : float
        The radius ρ: split-conformal quantile of ``scores`` at level ``alpha`` (+inf when
        the calibration set is too small for the level).
    alpha : float
        Miscoverage level.
    noise_var : float
        Grader noise variance σ_g² (isotropic estimate mean (r − r′)²/2, or the mean of the
        supplied per-response variances).
    ridge : float
        λ_q / tangential eigenvalue.
    scores : ndarray, shape (m,)
        Calibration scores d_q of the groups with at least two responses.
    estimator, shape, noise : str
        The options the sets are built with.
    eps : float
        GRPO's std offset.
    ddof : int
        Delta degrees of freedom.
    options : dict
        Further estimator keywords.
    """

    rho: float
    alpha: float
    noise_var: float
    ridge: float
    scores: np.ndarray
    estimator: str
    shape: str
    noise: str
    eps: float
    ddof: int
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A calibration built or edited by hand (dataclasses.replace) gets the same checks
        # as a loaded file: a negative rho would otherwise give NaN coefficients later.
        validate_set_calibration(self)

    @property
    def m(self) -> int:
        """Number of calibration groups."""
        return int(self.scores.size)


def check_set_consistency(cal: SetCalibration) -> None:
    """Cross-field check that :func:`calibrate_sets` guarantees (a tampered file fails):
    ``rho`` is the conformal quantile of ``scores`` at ``alpha``."""
    expected = conformal_quantile(cal.scores, cal.alpha)
    if float(cal.rho) != expected:
        raise ValueError(f"`rho` = {float(cal.rho)!r} is not the conformal quantile of "
                         f"`scores` at `alpha` ({expected!r}).")


def _calibrate_iv(scores_a: Any, scores_b: Any, offsets: Any, group_ids: Any, alpha: Any,
                  estimator: Any, shape: Any, noise: Any, noise_var: Any, ridge: Any, eps: Any,
                  ddof: Any, options: Any) -> tuple[Any, ...]:
    estimator = check_estimator(estimator)
    if estimator not in CENTERED:
        raise ValueError(f"`estimator` must center coefficients within groups for sets "
                         f"(one of {', '.join(repr(e) for e in CENTERED)}); got {estimator!r}.")
    check_choice(shape, "shape", SHAPES)
    check_choice(noise, "noise", NOISES)
    alpha = check_real(alpha, "alpha", low=0.0, high=1.0, low_inclusive=False,
                       high_inclusive=False)
    eps = check_real(eps, "eps", low=0.0)
    ddof = check_int(ddof, "ddof", choices=(0, 1))
    ridge = 1.0 if ridge is None else check_real(ridge, "ridge", low=0.0)
    options = check_options(options, estimator)
    batch = as_batch(scores_a, offsets, group_ids, name="scores_a")
    values_a = np.asarray(batch.values, dtype=np.float64)
    values_b = batch.gather(scores_b, "scores_b")
    if not np.isfinite(values_a).all():
        raise ValueError("`scores_a` must be finite.")
    if not np.isfinite(values_b).all():
        raise ValueError("`scores_b` must be finite.")
    informative = batch.sizes >= 2
    if not informative.any():
        raise ValueError("`scores_a` must hold at least one group with two or more responses "
                         "(the calibration set is empty).")
    var = _noise_var_iv(batch, noise, noise_var)
    if var is None:
        keep = expand(informative.astype(np.int64), batch.offsets).astype(bool)
        with np.errstate(over="ignore"):
            diff = values_a[keep] - values_b[keep]
            var = float(np.mean(diff * diff) / 2.0)
        if not np.isfinite(var):
            raise ValueError("`scores_a` and `scores_b` are too large: the noise variance of "
                             "their differences overflows float64 (rescale the scores).")
    return (batch, values_a, values_b, alpha, estimator, eps, ddof, ridge, options, var)


def _noise_var_iv(batch: Batch, noise: str, noise_var: Any) -> np.ndarray | float | None:
    if noise == "isotropic":
        if noise_var is None:
            return None
        return check_real(noise_var, "noise_var", low=0.0)
    if noise_var is None:
        raise ValueError("`noise_var` (per-response variances) is required with "
                         "noise='diagonal'.")
    return batch.gather_weights(noise_var, "noise_var")


def calibrate_sets(
    scores_a: ArrayLike,
    scores_b: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    alpha: float,
    estimator: str = "grpo",
    shape: str = "joint",
    noise: str = "isotropic",
    noise_var: ArrayLike | float | None = None,
    ridge: float | None = None,
    eps: float = 1e-6,
    eps_relative: bool = False,
    ddof: int = 1,
    options: Mapping[str, Any] | None = None,
) -> SetCalibration:
    """Calibrate the radius of JRSC coefficient sets on paired scorings.

    For each calibration group with n ≥ 2 responses: c = T(r_a), δ = T(r_b) − c,
    d_q = sqrt(δᵀ S_q⁺ δ) with S_q built from r_a.  ρ is the split-conformal quantile of
    {d_q} at level α (:func:`advcal.conformal_quantile`).  Under exchangeability of the
    calibration groups with a training group, P(T(r′) ∈ E) ≥ 1 − α.

    Parameters
    ----------
    scores_a, scores_b : array_like, shape (B, G) or (N,)
        Two scorings of the same calibration responses (``scores_a`` plays the training
        scoring).  Their groups must be independent of the training groups.
    offsets : array_like of int, optional
        CSR group boundaries for 1-D scores.
    group_ids : sequence of hashable, optional
        Per-response group labels for 1-D scores.
    alpha : float
        Miscoverage level in (0, 1).
    estimator : str, default "grpo"
        Coefficient map T (a key of :data:`advcal.ESTIMATORS`).
    shape : {"joint", "isotropic"}, default "joint"
        ``"joint"``: S_q = J Σ_r Jᵀ + λ_q ûûᵀ; ``"isotropic"``: S_q = C (a Euclidean
        ball, the ablation baseline).
    noise : {"isotropic", "diagonal"}, default "isotropic"
        Σ_r = σ_g² I with σ_g² = mean (r_a − r_b)²/2 over the calibration responses (or
        ``noise_var`` if given as a scalar); ``"diagonal"``: per-response variances
        ``noise_var`` (same layout as the scores), required.
    noise_var : float or array_like, optional
        See ``noise``.
    ridge : float, optional
        λ_q = ridge × the tangential eigenvalue of J Σ Jᵀ (GRPO: σ_g²/s_q²); default 1.0.
    eps : float, default 1e-6
        GRPO's std offset.
    eps_relative : bool, default False
        Read ``eps`` relative to the calibration's reward scale: the offset used is
        ``eps`` times the root-mean-square deviation of ``scores_a`` from their group
        means (over groups of two or more responses).  Rewards ``A r + b`` then give the
        same sets as ``r`` for every A > 0, where an absolute ``eps`` stops being
        negligible once A times the reward spread nears it.  The calibration stores the
        absolute offset in its ``eps`` field, and training batches use it as is.
    ddof : {0, 1}, default 1
        Delta degrees of freedom of the std.
    options : mapping, optional
        Further estimator keywords (``{"tau_res": ...}`` for ``maxnorm``).

    Returns
    -------
    SetCalibration
        ``rho``, ``noise_var``, ``ridge``, calibration ``scores`` and the options.

    Examples
    --------
    >>> from advcal import calibrate_sets
    >>> from advcal.simulate import paired_scorings
    >>> pair = paired_scorings(2000, 8, scale=0.02, seed=0)
    >>> cal = calibrate_sets(pair.a, pair.b, alpha=0.1)
    >>> cal.m, round(cal.noise_var, 5), bool(cal.rho > 0)
    (2000, 0.0004, True)
    """
    (batch, values_a, values_b, alpha, estimator, eps, ddof, ridge, options,
     var) = _calibrate_iv(scores_a, scores_b, offsets, group_ids, alpha, estimator, shape,
                          noise, noise_var, ridge, eps, ddof, options)
    offs = batch.offsets
    if not isinstance(eps_relative, (bool, np.bool_)):
        raise TypeError(f"`eps_relative` must be a bool; got {type(eps_relative).__name__}.")
    if eps_relative:
        keep = expand((batch.sizes >= 2).astype(np.int64), offs).astype(bool)
        scale = float(np.sqrt(np.mean(centered(values_a, offs)[keep] ** 2)))
        if not scale > 0:
            raise ValueError("`eps_relative=True` needs `scores_a` that vary within some "
                             "group (their within-group scale is 0).")
        eps = eps * scale
    geo = _geometry(values_a, offs, estimator=estimator, eps=eps, ddof=ddof, shape=shape,
                    noise=noise, noise_var=var, ridge=ridge, options=options)
    other = transform_checked(values_b, offs, estimator, eps, ddof, options)
    delta = centered(other - geo.centers, offs)
    d2 = geo.quad_pinv(delta)
    scores = np.sqrt(np.clip(d2[batch.sizes >= 2], 0.0, None))
    rho = float(conformal_quantile(scores, alpha))
    mean_var = float(var) if np.ndim(var) == 0 else float(np.mean(var))
    return SetCalibration(rho, alpha, mean_var, ridge, scores, estimator, shape, noise, eps,
                          ddof, dict(options))


# --------------------------------------------------------------------------- training sets


@dataclass(frozen=True)
class CoefficientSets:
    """JRSC sets E_q = {c_q + S_q^{1/2} z : ‖z‖ ≤ ρ} of a training batch.

    Attributes
    ----------
    rho : float
        The calibrated radius.
    calibration : SetCalibration
        The calibration the sets were built with.

    Notes
    -----
    ``centers`` and ``shapes`` come back in the caller's layout; the private
    fields keep the grouped flat float64 geometry that :func:`advcal.recover` consumes.
    """

    rho: float
    calibration: SetCalibration
    batch: Batch = field(repr=False)
    geometry: _Geometry = field(repr=False)
    dtype: np.dtype = field(repr=False)

    @property
    def n_groups(self) -> int:
        return self.batch.n_groups

    @property
    def offsets(self) -> np.ndarray:
        """CSR offsets of the grouped order."""
        return self.batch.offsets

    @property
    def centers(self) -> np.ndarray:
        """c = T(r) in the caller's layout and dtype."""
        return self.batch.restore(self.geometry.centers.astype(self.dtype))

    @property
    def shapes(self) -> np.ndarray:
        """S_q blocks: (B, G, G) for dense input, flat row-major blocks otherwise."""
        return restore_blocks(self.batch, self.geometry.shape_blocks())

    def _flat(self, values: Any, name: str) -> np.ndarray:
        flat = self.batch.gather(values, name)
        if not np.isfinite(flat).all():
            raise ValueError(f"`{name}` must be finite.")
        return flat

    def support(self, directions: ArrayLike) -> np.ndarray:
        """min over E_q of vᵀa, per group: vᵀc − ρ·sqrt(vᵀ S_q v).

        Parameters
        ----------
        directions : array_like
            One direction v per group, in the layout of the rewards.

        Returns
        -------
        ndarray, shape (B,)
            The support values (−inf when ρ is infinite and vᵀSv > 0).
        """
        v = self._flat(directions, "directions")
        linear = segment_sum(v * self.geometry.centers, self.offsets)
        spread = np.sqrt(np.clip(self.geometry.quad(v), 0.0, None))
        with np.errstate(invalid="ignore"):
            term = np.where(spread > 0, self.rho * spread, 0.0)
        return linear - term

    def distances(self, coefficients: ArrayLike) -> np.ndarray:
        """sqrt((a − c)ᵀ S⁺ (a − c)) per group; +inf if a − c is not centered."""
        a = self._flat(coefficients, "coefficients")
        dtype = np.asarray(coefficients).dtype
        # Rounding to the caller's dtype moves a member off the centered hyperplane by
        # ~eps·‖a‖: tolerate that, in float32 too.
        rtol = MEMBERSHIP_RTOL
        if dtype.kind == "f":
            rtol = max(rtol, 16 * float(np.finfo(dtype).eps))
        delta = a - self.geometry.centers
        mean = segment_sum(delta, self.offsets) / np.maximum(self.batch.sizes, 1)
        scale = np.sqrt(segment_sum(a * a + self.geometry.centers ** 2, self.offsets)) + 1e-300
        centered_ok = np.abs(mean) * np.sqrt(self.batch.sizes) <= rtol * scale + 1e-12
        d2 = self.geometry.quad_pinv(centered(delta, self.offsets))
        return np.where(centered_ok, np.sqrt(np.clip(d2, 0.0, None)), np.inf)

    def log_volumes(self) -> np.ndarray:
        """log of each set's (n_q − 1)-dimensional volume over that of the unit ball.

        (n_q − 1)·log ρ + ½·log pdet(S_q): the quantity compared between the joint and the
        isotropic shape.  Groups with fewer than two responses get 0.
        """
        sizes = self.batch.sizes
        dims = np.maximum(sizes - 1, 0)
        with np.errstate(divide="ignore"):
            log_rho = np.log(self.rho) if self.rho > 0 else -np.inf
        out = dims * log_rho + 0.5 * self.geometry.log_pdet()
        return np.where(sizes >= 2, out, 0.0)

    def at_radius(self, rho: float) -> CoefficientSets:
        """The same centers and shapes with radius ``rho`` in place of the calibration's.

        Selection-conditional radii (:func:`advcal.calibrate_selective`) give each
        threshold its own radius; ``rho`` is a float ≥ 0 (+inf: every set is its whole
        centered affine subspace).
        """
        rho = _fields.real(rho, "rho", low=0.0, allow_inf=True)
        return CoefficientSets(float(rho), self.calibration, self.batch, self.geometry,
                               self.dtype)

    def contains(self, coefficients: ArrayLike) -> np.ndarray:
        """Whether each group's coefficient vector lies in its set.

        Parameters
        ----------
        coefficients : array_like
            Candidate coefficients, in the layout of the rewards.

        Returns
        -------
        ndarray of bool, shape (B,)
            d_q ≤ ρ (relative tolerance 1e-9) and a − c centered.
        """
        d = self.distances(coefficients)
        return d <= self.rho * (1.0 + MEMBERSHIP_RTOL) + 1e-12


def coefficient_sets(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    calibration: SetCalibration,
    noise_var: ArrayLike | None = None,
) -> CoefficientSets:
    """Build the JRSC sets of a training batch from a calibration.

    Parameters
    ----------
    rewards : array_like, shape (B, G) or (N,)
        Training scores r (one scoring).
    offsets : array_like of int, optional
        CSR group boundaries for 1-D rewards.
    group_ids : sequence of hashable, optional
        Per-response group labels for 1-D rewards.
    calibration : SetCalibration
        From :func:`calibrate_sets`.
    noise_var : array_like, optional
        Per-response grader variances of the training responses; required when the
        calibration used ``noise="diagonal"``, ignored otherwise.

    Returns
    -------
    CoefficientSets
        Centers, shapes, ρ, and ``contains`` / ``support``.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import calibrate_sets, coefficient_sets
    >>> from advcal.simulate import paired_scorings
    >>> cal = calibrate_sets(*paired_scorings(500, 4, scale=0.02, seed=0).scores[:2],
    ...                      alpha=0.1)
    >>> train = paired_scorings(3, 4, scale=0.02, seed=1)
    >>> sets = coefficient_sets(train.a, calibration=cal)
    >>> sets.shapes.shape, sets.contains(sets.centers).tolist()
    ((3, 4, 4), [True, True, True])
    """
    if not isinstance(calibration, SetCalibration):
        raise TypeError("`calibration` must be a SetCalibration from calibrate_sets; "
                        f"got {type(calibration).__name__}.")
    batch = as_batch(rewards, offsets, group_ids)
    # The sets outlive the call: own copies, so later edits of the caller's arrays
    # (offsets, a float64 batch) cannot change support() or recover().
    batch = Batch(np.array(batch.values), np.array(batch.offsets), batch.shape, batch.order)
    values = np.asarray(batch.values, dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError("`rewards` must be finite.")
    cal = calibration
    var: np.ndarray | float = cal.noise_var
    if needs_noise_var(cal):
        if noise_var is None:
            raise ValueError("`noise_var` (per-response variances of the training responses) "
                             "is required: the calibration used noise='diagonal'.")
        var = batch.gather_weights(noise_var, "noise_var")
    return sets_checked(batch, values, cal, var)


def needs_noise_var(calibration: SetCalibration) -> bool:
    """Whether training sets need the responses' own grader variances."""
    return calibration.noise == "diagonal" and calibration.shape == "joint"


def sets_checked(batch: Batch, values: np.ndarray, calibration: SetCalibration,
                 noise_var: np.ndarray | float) -> CoefficientSets:
    """:func:`coefficient_sets` of a validated batch: ``values`` are its rewards as finite
    float64, ``noise_var`` the calibration's or the checked per-response variances."""
    cal = calibration
    geo = _geometry(values, batch.offsets, estimator=cal.estimator, eps=cal.eps, ddof=cal.ddof,
                    shape=cal.shape, noise=cal.noise, noise_var=noise_var, ridge=cal.ridge,
                    options=cal.options)
    return CoefficientSets(cal.rho, cal, batch, geo, batch.values.dtype)
