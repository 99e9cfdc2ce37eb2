"""Jacobians of the coefficient maps T (rewards → GRPO-family coefficients), per group: the
kind each estimator's entry in :mod:`advcal.registry` names, closed form (``grpo``,
``dr_grpo``, ``rloo``: two eigenvalues per group), analytic (``maxnorm``), or central finite
differences of the estimator for every other one.  JRSC's set shapes (``advcal.sets``) are
built from them; ``docs/setgrpo.md`` gives the formulas."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from advcal._blocks import (
    block_offsets,
    centered,
    consecutive,
    expand,
    gather_blocks,
    gather_rows,
    restore_blocks,
    scatter_blocks,
    segment_sum,
    size_classes,
)
from advcal._validation import as_batch, check_choice, check_int, check_real
from advcal.registry import ANALYTIC, CLOSED_FORM, REGISTRY
from advcal.resolution import maxnorm

__all__ = ["coefficient_jacobian"]


@cache
def _keywords(fn: Callable[..., Any]) -> frozenset[str]:
    """The parameter names of an estimator (read once per function: signatures are slow)."""
    return frozenset(inspect.signature(fn).parameters)


def transform_checked(values: np.ndarray, offsets: np.ndarray, estimator: str, eps: float,
                      ddof: int, options: Mapping[str, Any]) -> np.ndarray:
    """T(r), the coefficient map, on a checked flat float64 batch (drift uses it too)."""
    fn = REGISTRY[estimator].function
    kwargs = dict(options)
    params = _keywords(fn)
    if "eps" in params:
        kwargs.setdefault("eps", eps)
    if "ddof" in params:
        kwargs.setdefault("ddof", ddof)
    return np.asarray(fn(values, offsets, **kwargs), dtype=np.float64)


@dataclass(frozen=True)
class Radial:
    """Per-group radial geometry of the closed-form estimators.

    ``u_hat`` is û (0 for constant groups); ``j_tan`` and ``j_rad`` are J's eigenvalues on
    the centered subspace orthogonal to û and on û.
    """

    u_hat: np.ndarray
    j_tan: np.ndarray
    j_rad: np.ndarray


def radial(values: np.ndarray, offsets: np.ndarray, estimator: str, eps: float, ddof: int
            ) -> Radial:
    sizes = np.diff(offsets)
    u = centered(values, offsets)
    norm2 = segment_sum(u * u, offsets)
    norm = np.sqrt(norm2)
    inv = np.divide(1.0, norm, out=np.zeros_like(norm), where=norm > 0)
    u_hat = u * expand(inv, offsets)
    if estimator == "grpo":
        dof = sizes - ddof
        sigma = np.sqrt(np.divide(norm2, dof, out=np.zeros_like(norm2), where=dof > 0))
        s = sigma + eps
        # 1/s overflows for s = 0 (eps = 0 and a constant group) and for subnormal s.
        bad = ~(s > 1.0 / np.finfo(np.float64).max)
        if bad.any():
            q = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"`eps` = {eps!r} leaves GRPO's Jacobian undefined at group {q}, whose "
                "rewards are all equal (u / std has no derivative at std = 0, and 1 / eps "
                "overflows); pass a larger eps.")
        j_tan = 1.0 / s
        j_rad = eps / (s * s)
    elif estimator == "rloo":
        j_tan = np.where(sizes > 1, sizes / np.maximum(sizes - 1.0, 1.0), 0.0)
        j_rad = j_tan
    else:  # dr_grpo
        j_tan = np.ones(sizes.size)
        j_rad = j_tan
    return Radial(u_hat, j_tan, j_rad)


def _maxnorm_jacobian(values: np.ndarray, offsets: np.ndarray, options: Mapping[str, Any]
                      ) -> np.ndarray:
    """Analytic Jacobian of MaxNorm-AC, w = u / s with s = max(max|u|, τ_res).

    J = D/s where max|u| < τ_res, else D/s − u (∂s/∂r)ᵀ/s² with ∂s/∂r = sign(u_k)·D[k] at
    the arg-max k; D = κ·C is the baseline's centering (κ = n/(n−1) for ``"rloo"``).  With
    binning or a dead zone the map is piecewise constant, so finite differences are used.
    """
    if "tau_res" not in options:
        raise ValueError("`options` must give `tau_res` for estimator='maxnorm'.")
    if options.get("resolution") is not None or options.get("dead_zone") is not None:
        return _finite_difference_jacobian(values, offsets, "maxnorm", 0.0, 1, options)
    tau = float(options["tau_res"])
    baseline = options.get("baseline", "rloo")
    result = maxnorm(values, offsets, return_scale=True, **options)
    w = np.asarray(result.advantages, dtype=np.float64)
    scale = np.asarray(result.scale, dtype=np.float64)
    sizes = np.diff(offsets)
    boffsets = block_offsets(sizes)
    out = np.zeros(int(boffsets[-1]))
    for n, idx in size_classes(sizes):
        if n < 2:
            continue
        rows = np.arange(idx.size)
        kappa = n / (n - 1.0) if baseline == "rloo" else 1.0
        center = kappa * (np.eye(n) - 1.0 / n)
        s = scale[idx]
        u = gather_rows(w, offsets, idx, n) * s[:, None]
        jac = np.broadcast_to(center, (idx.size, n, n)) / s[:, None, None]
        k = np.argmax(np.abs(u), axis=1)
        at_max = np.abs(u[rows, k]) >= tau
        ds = np.sign(u[rows, k])[:, None] * center[k]
        radial = u[:, :, None] * ds[:, None, :] / (s * s)[:, None, None]
        jac = jac - np.where(at_max[:, None, None], radial, 0.0)
        scatter_blocks(out, boffsets, idx, n, jac)
    return out


def _finite_difference_jacobian(values: np.ndarray, offsets: np.ndarray, estimator: str,
                                eps: float, ddof: int, options: Mapping[str, Any]
                                ) -> np.ndarray:
    """Central differences, perturbing response j of every group at once (2·max n calls).

    For estimators with batch-level statistics (batch_std, reinforce_pp_baseline, gpg) the
    simultaneous perturbation adds cross-group terms of order 1/N each; the result is the
    within-group block of the Jacobian up to those terms.
    """
    sizes = np.diff(offsets)
    boffsets = block_offsets(sizes)
    out = np.zeros(int(boffsets[-1]))
    if values.size == 0:
        return out
    step = 1e-6 * np.maximum(1.0, np.abs(values))
    position = np.arange(values.size) - expand(offsets[:-1], offsets)
    row_start = expand(boffsets[:-1], offsets) + position * expand(sizes, offsets)
    for j in range(int(sizes.max())):
        hit = position == j
        h = np.where(hit, step, 0.0)
        plus = transform_checked(values + h, offsets, estimator, eps, ddof, options)
        minus = transform_checked(values - h, offsets, estimator, eps, ddof, options)
        h_group = np.zeros(sizes.size)
        h_group[sizes > j] = step[hit]
        h_resp = expand(h_group, offsets)
        valid = h_resp > 0
        out[row_start[valid] + j] = (plus[valid] - minus[valid]) / (2.0 * h_resp[valid])
    return out


# The estimators whose registry entry says ANALYTIC, and their Jacobian (a test checks
# that the two agree).
_ANALYTIC_JACOBIANS: dict[str, Callable[[np.ndarray, np.ndarray, Mapping[str, Any]],
                                        np.ndarray]] = {"maxnorm": _maxnorm_jacobian}


def closed_form(estimator: str, options: Mapping[str, Any]) -> bool:
    """Closed-form estimators (GRPO, Dr.GRPO, RLOO) have the two-eigenvalue Jacobian —
    except for singletons kept raw (``singleton="raw"``), whose coefficient is not
    centered; those use differences."""
    return (REGISTRY[estimator].jacobian == CLOSED_FORM
            and options.get("singleton") != "raw")


def structured_blocks(u_hat: np.ndarray, offsets: np.ndarray, tan: np.ndarray,
                      rad: np.ndarray) -> np.ndarray:
    """Flat blocks tan_q·(C − ûûᵀ) + rad_q·ûûᵀ (shapes, their roots, GRPO Jacobians)."""
    sizes = np.diff(offsets)
    boffsets = block_offsets(sizes)
    out = np.zeros(int(boffsets[-1]))
    for n, idx in size_classes(sizes):
        if n == 0:
            continue
        run = consecutive(idx)
        uh = gather_rows(u_hat, offsets, idx, n)
        # tan·(C − ûûᵀ) + rad·ûûᵀ = tan·C + (rad − tan)·ûûᵀ, built in place.
        blocks = gather_blocks(out, boffsets, idx, n) if run else np.empty((idx.size, n, n))
        np.multiply(uh[:, :, None], uh[:, None, :], out=blocks)
        t = tan[idx]
        blocks *= (rad[idx] - t)[:, None, None]
        blocks -= (t / n)[:, None, None]
        blocks.reshape(-1, n * n)[:, :: n + 1] += t[:, None]
        if not run:
            scatter_blocks(out, boffsets, idx, n, blocks)
    return out


def jacobian_flat(values: np.ndarray, offsets: np.ndarray, estimator: str, eps: float,
                   ddof: int, options: Mapping[str, Any]) -> np.ndarray:
    if REGISTRY[estimator].jacobian == ANALYTIC:
        return _ANALYTIC_JACOBIANS[estimator](values, offsets, options)
    if not closed_form(estimator, options):
        return _finite_difference_jacobian(values, offsets, estimator, eps, ddof, options)
    geo = radial(values, offsets, estimator, eps, ddof)
    return structured_blocks(geo.u_hat, offsets, geo.j_tan, geo.j_rad)


def check_estimator(estimator: Any) -> str:
    """A registered estimator of point rewards (Range-GRPO takes ranges: no sets)."""
    points = tuple(name for name, entry in REGISTRY.items() if not entry.ranges)
    return check_choice(estimator, "estimator", points)


# Keywords the sets pass themselves or that change what the estimator returns.
_NOT_OPTIONS = frozenset({"rewards", "offsets", "group_ids", "return_scale"})


def check_options(options: Any, estimator: str) -> dict[str, Any]:
    """Scalar estimator keywords only: a calibration's options are reused on every training
    batch, so per-response inputs (opo's lengths, token counts) cannot live in them, and
    keywords that change the layout or the return type are not options."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"`options` must be a mapping of estimator keywords; "
                        f"got {type(options).__name__}.")
    entry = REGISTRY[estimator]
    allowed = [k for k in inspect.signature(entry.function).parameters
               if k not in _NOT_OPTIONS and k not in entry.per_response]
    for key in options:
        if key not in allowed:
            raise ValueError(
                f"`options` key {key!r} is not an option of estimator {estimator!r} here; "
                f"allowed: {', '.join(allowed)}.")
    for key, value in options.items():
        if np.ndim(value) > 0 and not (key == "bounds" and np.shape(value) == (2,)):
            raise ValueError(f"`options` values must be scalars (per-response estimator "
                             f"inputs are not supported); got an array for {key!r}.")
    return dict(options)


def coefficient_jacobian(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    estimator: str = "grpo",
    eps: float = 1e-6,
    ddof: int = 1,
    options: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """Per-group Jacobians J_q = ∂T(r_q)/∂r_q of a coefficient map T.

    For GRPO (T(r) = u/s, s = σ + eps): J = (1/s)(C − (σ/s)ûûᵀ) — symmetric, J1 = 0,
    eigenvalue eps/s² on û and 1/s on the rest of the centered subspace.  Dr.GRPO: C;
    RLOO: n/(n−1)·C; MaxNorm-AC: C/s − u (∂s/∂r)ᵀ/s² with s = max(max|u|, τ_res).  Any
    other estimator: central finite differences through :func:`advcal.advantages`.

    Parameters
    ----------
    rewards : array_like, shape (B, G) or (N,)
        Rewards; 1-D needs ``offsets`` or ``group_ids``.
    offsets : array_like of int, shape (B + 1,), optional
        CSR group boundaries for 1-D ``rewards``.
    group_ids : sequence of hashable, length N, optional
        Per-response group labels for 1-D ``rewards``.
    estimator : str, default "grpo"
        A key of :data:`advcal.ESTIMATORS`.
    eps : float, default 1e-6
        GRPO's std offset (passed to estimators that take it).
    ddof : {0, 1}, default 1
        Delta degrees of freedom of the std (for estimators that take it).
    options : mapping, optional
        Further keywords of the estimator (e.g. ``{"tau_res": 0.01}`` for ``maxnorm``).

    Returns
    -------
    ndarray
        float64 blocks: (B, G, G) for dense ``rewards``; for 1-D
        ``rewards`` the row-major n_q × n_q blocks concatenated in group order (groups
        in order of first appearance for ``group_ids``, rows in the caller's order within
        a group).

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import coefficient_jacobian
    >>> J = coefficient_jacobian(np.array([[0.0, 1.0, 2.0]]), eps=0.0)
    >>> np.round(J[0], 6)
    array([[ 0.166667, -0.333333,  0.166667],
           [-0.333333,  0.666667, -0.333333],
           [ 0.166667, -0.333333,  0.166667]])
    >>> np.round(J[0] @ np.ones(3), 12)
    array([0., 0., 0.])
    """
    estimator = check_estimator(estimator)
    eps = check_real(eps, "eps", low=0.0)
    ddof = check_int(ddof, "ddof", choices=(0, 1))
    options = check_options(options, estimator)
    batch = as_batch(rewards, offsets, group_ids)
    values = np.asarray(batch.values, dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError("`rewards` must be finite.")
    return restore_blocks(batch, jacobian_flat(values, batch.offsets, estimator, eps, ddof,
                                                options))


# --------------------------------------------------------------------------- geometry
