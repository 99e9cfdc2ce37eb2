"""SetGRPO analysis quantities (``docs/setgrpo.md``).

* :func:`recovery_path`: the projections M_full(η) and M_reward(η) of every group along
  its recovery path a(η) = a₀ + η(c − a₀), on a grid of η (the curves whose superlevel
  sets define η*);
* :func:`affine_check`: the affine sanity check, SetGRPO on rewards r and on a·r + b
  (a > 0): coefficient and update cosines, decision flips, max |Δη*|;
* :func:`training_summary`: per-batch training statistics of a :class:`~advcal.Recovery`
  (accepted ratio, mean η*, recovered-coefficient norm ratio).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from advcal._blocks import block_offsets, gather_blocks, gather_rows, size_classes
from advcal._ggsr import check_sets, gram_blocks, run_recovery
from advcal._validation import BACKENDS, as_float_array, check_choice, check_real
from advcal.recovery import Recovery, recover
from advcal.sets import CoefficientSets, calibrate_sets, coefficient_sets

__all__ = ["AffineCheck", "RecoveryPath", "TrainingSummary", "affine_check", "recovery_path",
           "training_summary"]


class RecoveryPath(NamedTuple):
    """M_full(η) and M_reward(η) per group on a grid of η (:func:`recovery_path`).

    Attributes
    ----------
    eta : ndarray of float64, shape (E,)
        The grid.
    m_full, m_reward : ndarray of float64, shape (B, E)
        The projections at a(η) (NaN where undefined: fewer than two responses, U(c) = 0,
        U(a(η)) = 0 or a(η) = 0, or an infinite radius).
    anchors : ndarray
        The anchors a₀ (layout of the rewards), as in :func:`advcal.recover`.
    """

    eta: np.ndarray
    m_full: np.ndarray
    m_reward: np.ndarray
    anchors: np.ndarray


def _eta_grid_iv(eta: Any) -> np.ndarray:
    grid = as_float_array(eta, "eta").astype(np.float64)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"`eta` must be a non-empty 1-D array; got shape {grid.shape}.")
    if not (np.isfinite(grid).all() and (grid >= 0).all() and (grid <= 1).all()):
        raise ValueError("`eta` must lie in [0, 1].")
    return grid


def _path_projections(sets: CoefficientSets, gram_flat: np.ndarray, anchors: np.ndarray,
                      grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """M_full and M_reward (B, E) evaluated from the vectors a(η) (flat grouped inputs)."""
    geo = sets.geometry
    offsets = sets.offsets
    sizes = np.diff(offsets)
    boffsets = block_offsets(sizes)
    root = geo.root_blocks()
    rho = float(sets.rho)
    m_full = np.full((sizes.size, grid.size), np.nan)
    m_reward = np.full((sizes.size, grid.size), np.nan)
    if not np.isfinite(rho):
        return m_full, m_reward
    for n, idx in size_classes(sizes):
        if n < 2:
            continue
        c = gather_rows(geo.centers, offsets, idx, n)  # (b, n)
        a0 = gather_rows(anchors, offsets, idx, n)
        k = gather_blocks(gram_flat, boffsets, idx, n)  # (b, n, n)
        r = gather_blocks(root, boffsets, idx, n)
        a = a0[:, None, :] + grid[None, :, None] * (c - a0)[:, None, :]  # (b, E, n)
        ka = np.einsum("bij,bej->bei", k, a)
        kc = np.einsum("bij,bj->bi", k, c)
        rka = np.einsum("bij,bej->bei", r, ka)
        ra = np.einsum("bij,bej->bei", r, a)
        ckc = np.einsum("bi,bi->b", c, kc)
        aka = np.maximum(np.einsum("bei,bei->be", a, ka), 0.0)
        full_num = np.einsum("bei,bi->be", ka, c) - rho * np.linalg.norm(rka, axis=2)
        reward_num = np.einsum("bei,bi->be", a, c) - rho * np.linalg.norm(ra, axis=2)
        with np.errstate(divide="ignore", invalid="ignore"):
            full = full_num / (np.sqrt(aka) * np.sqrt(np.maximum(ckc, 0.0))[:, None])
            reward = reward_num / (np.linalg.norm(a, axis=2)
                                   * np.linalg.norm(c, axis=1)[:, None])
        # U(c) = 0 or U(a(η)) = 0: no direction, the projection is undefined.
        defined = (ckc > 0)[:, None] & (aka > 1e-12 * np.maximum(ckc, 0.0)[:, None])
        m_full[idx] = np.where(defined & np.isfinite(full), full, np.nan)
        m_reward[idx] = np.where((ckc > 0)[:, None] & np.isfinite(reward), reward, np.nan)
    return m_full, m_reward


def recovery_path(
    sets: CoefficientSets,
    gram: ArrayLike,
    *,
    eta: ArrayLike | None = None,
    backend: str = "numba",
) -> RecoveryPath:
    """M_full(η) and M_reward(η) along every group's recovery path.

    With a₀ the group's anchor (:func:`advcal.recover`) and a(η) = a₀ + η(c − a₀):
    M_full(η) = [a(η)ᵀKc − ρ‖R K a(η)‖] / (‖U(a(η))‖·‖U(c)‖) and M_reward(η) the same
    with K = I.  η*(τ) is the largest η where M_full(η) ≥ τ and M_reward(η) > 0.

    Parameters
    ----------
    sets : CoefficientSets
        JRSC sets (:func:`advcal.coefficient_sets`).
    gram : array_like
        Gram matrices, layout as in :func:`advcal.recover`.
    eta : array_like, optional
        Grid of η in [0, 1] (default 0, 0.05, ..., 1).
    backend : {"numba", "numpy"}, default "numba"
        Engine that computes the anchors; the path is evaluated in numpy from the vectors
        a(η) themselves.

    Returns
    -------
    RecoveryPath
        ``eta``, ``m_full`` and ``m_reward`` of shape (B, E), ``anchors``.

    Examples
    --------
    >>> from advcal import calibrate_sets, coefficient_sets
    >>> from advcal.analysis import recovery_path
    >>> from advcal.simulate import gram_matrices, paired_scorings
    >>> cal = calibrate_sets(*paired_scorings(1000, 8, scale=0.05, seed=0).scores,
    ...                      alpha=0.2)
    >>> sets = coefficient_sets(paired_scorings(3, 8, scale=0.05, seed=1).a,
    ...                         calibration=cal)
    >>> path = recovery_path(sets, gram_matrices(3, 8, seed=2).gram, eta=[0.0, 0.5, 1.0])
    >>> path.m_full.shape
    (3, 3)
    """
    sets = check_sets(sets)
    check_choice(backend, "backend", BACKENDS)
    grid = _eta_grid_iv(np.linspace(0.0, 1.0, 21) if eta is None else eta)
    gram_flat = gram_blocks(sets, gram)
    raw = run_recovery(sets, gram_flat, np.array([0.0]), None, backend)
    m_full, m_reward = _path_projections(sets, gram_flat, raw.anchors, grid)
    return RecoveryPath(grid, m_full, m_reward,
                        sets.batch.restore(raw.anchors.astype(sets.dtype)))


class AffineCheck(NamedTuple):
    """Result of :func:`affine_check`.

    Attributes
    ----------
    coefficient_cosine : float
        Cosine between the written-back coefficients of the two reward versions (1 when
        both are all zero).
    update_cosine : float
        Cosine between the two batch updates Σ_q U_q(a_q) with the groups' gradients
        taken as mutually orthogonal (only per-group Gram blocks are known):
        Σ a_qᵀK_q a′_q / √(Σ a_qᵀK_q a_q · Σ a′_qᵀK_q a′_q) (1 when both are zero).
    min_group_update_cosine : float
        The smallest per-group update cosine over groups with an update under both
        versions (1 when there is none).
    decision_flips : int
        Groups accepted under one version and rejected under the other.
    max_eta_change : float
        max_q |η*_q(a·r + b) − η*_q(r)|.
    """

    coefficient_cosine: float
    update_cosine: float
    min_group_update_cosine: float
    decision_flips: int
    max_eta_change: float


def _affine_iv(scale: Any, shift: Any) -> tuple[float, float]:
    scale = check_real(scale, "scale", low=0.0, low_inclusive=False)
    shift = check_real(shift, "shift")
    return scale, shift


def affine_check(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    gram: ArrayLike,
    calibration_scores: tuple[ArrayLike, ArrayLike],
    alpha: float,
    tau: float,
    scale: float,
    shift: float = 0.0,
    calibration_options: Mapping[str, Any] | None = None,
    backend: str = "numba",
) -> AffineCheck:
    """SetGRPO on rewards r and on scale·r + shift: do the updates agree?

    The map is applied to the training rewards and to both calibration scorings, and
    each version is calibrated and recovered on its own.  GRPO's coefficients, and with
    them the JRSC sets and GGSR, are invariant to a positive affine map up to the
    estimator's eps (``calibration_options={"eps_relative": True}`` for rewards on a tiny
    scale); this measures the agreement as the SetGRPO paper's sanity check does.

    Parameters
    ----------
    rewards, offsets, group_ids
        Training rewards, as in :func:`advcal.setgrpo`.
    gram : array_like
        Their Gram matrices.
    calibration_scores : (array_like, array_like)
        The paired calibration scorings (``scores_a``, ``scores_b`` of
        :func:`advcal.calibrate_sets`).
    alpha : float
        Miscoverage level of the calibration.
    tau : float
        Threshold in [0, 1).
    scale : float
        a > 0.
    shift : float, default 0.0
        b.
    calibration_options : mapping, optional
        Further keywords of :func:`advcal.calibrate_sets` (``offsets``, ``estimator``,
        ``eps_relative``, ...); a ``noise_var`` is multiplied by scale² for the mapped
        version.
    backend : {"numba", "numpy"}, default "numba"
        Recovery engine.

    Returns
    -------
    AffineCheck
        ``coefficient_cosine``, ``update_cosine``, ``min_group_update_cosine``,
        ``decision_flips``, ``max_eta_change``.

    Examples
    --------
    >>> from advcal.analysis import affine_check
    >>> from advcal.simulate import gram_matrices, paired_scorings
    >>> pairs = paired_scorings(1000, 8, scale=0.05, seed=0).scores
    >>> r = paired_scorings(50, 8, scale=0.05, seed=1).a
    >>> check = affine_check(r, gram=gram_matrices(50, 8, seed=2).gram,
    ...                      calibration_scores=pairs, alpha=0.2, tau=0.1, scale=3.0,
    ...                      shift=-1.0)
    >>> check.decision_flips, check.max_eta_change < 1e-4
    (0, True)
    """
    scale, shift = _affine_iv(scale, shift)
    if not (isinstance(calibration_scores, (tuple, list)) and len(calibration_scores) == 2):
        raise TypeError("`calibration_scores` must be a pair (scores_a, scores_b).")
    options = dict(calibration_options or {})
    if "alpha" in options:
        raise ValueError("`calibration_options` must not set 'alpha' (pass it directly).")
    moved_options = dict(options)
    if options.get("noise_var") is not None:
        moved_options["noise_var"] = (
            as_float_array(options["noise_var"], "calibration_options['noise_var']")
            .astype(np.float64) * scale * scale)

    def mapped(values: Any, name: str) -> np.ndarray:
        return as_float_array(values, name).astype(np.float64) * scale + shift

    cal_a, cal_b = calibration_scores
    calibration = calibrate_sets(cal_a, cal_b, alpha=alpha, **options)
    moved_calibration = calibrate_sets(mapped(cal_a, "calibration_scores[0]"),
                                       mapped(cal_b, "calibration_scores[1]"), alpha=alpha,
                                       **moved_options)
    base = coefficient_sets(rewards, offsets, group_ids=group_ids, calibration=calibration)
    moved = coefficient_sets(mapped(rewards, "rewards"), offsets, group_ids=group_ids,
                             calibration=moved_calibration)
    one = recover(base, gram, tau=tau, backend=backend)
    two = recover(moved, gram, tau=tau, backend=backend)
    a = base.batch.gather(one.coefficients, "coefficients")
    b = base.batch.gather(two.coefficients, "coefficients")
    gram_flat = gram_blocks(base, gram)
    sizes = base.batch.sizes
    boffsets = block_offsets(sizes)
    ab = np.zeros(sizes.size)
    aa = np.zeros(sizes.size)
    bb = np.zeros(sizes.size)
    for n, idx in size_classes(sizes):
        if n == 0:
            continue
        k = gather_blocks(gram_flat, boffsets, idx, n)
        x = gather_rows(a, base.offsets, idx, n)
        y = gather_rows(b, base.offsets, idx, n)
        ab[idx] = np.einsum("bi,bij,bj->b", x, k, y)
        aa[idx] = np.einsum("bi,bij,bj->b", x, k, x)
        bb[idx] = np.einsum("bi,bij,bj->b", y, k, y)
    both = (aa > 0) & (bb > 0)
    min_group = (float(np.min(ab[both] / np.sqrt(aa[both] * bb[both])))
                 if both.any() else 1.0)
    return AffineCheck(
        _cosine(float(a @ b), float(a @ a), float(b @ b)),
        _cosine(float(ab.sum()), float(aa.sum()), float(bb.sum())),
        float(np.clip(min_group, -1.0, 1.0)),
        int(np.sum(one.accepted != two.accepted)),
        float(np.max(np.abs(one.eta - two.eta))) if one.eta.size else 0.0,
    )


def _cosine(xy: float, xx: float, yy: float) -> float:
    """xy / √(xx·yy), 1 when both vectors are zero and 0 when only one is."""
    if xx == 0.0 and yy == 0.0:
        return 1.0
    if xx == 0.0 or yy == 0.0:
        return 0.0
    return float(np.clip(xy / np.sqrt(xx * yy), -1.0, 1.0))


class TrainingSummary(NamedTuple):
    """Per-batch statistics of a SetGRPO step (:func:`training_summary`).

    Attributes
    ----------
    accepted_ratio : float
        Accepted groups / groups with two or more responses.
    mean_eta : float
        Mean η* over the accepted groups (NaN when none is accepted).
    norm_ratio : float
        Recovered-coefficient norm ratio over the accepted groups:
        √(Σ ‖a_q(η*)‖²) / √(Σ ‖c_q‖²) (NaN when none is accepted).
    n_accepted : int
        Accepted groups.
    """

    accepted_ratio: float
    mean_eta: float
    norm_ratio: float
    n_accepted: int


def training_summary(recovery: Recovery, sets: CoefficientSets) -> TrainingSummary:
    """Accepted ratio, mean η* and recovered-coefficient norm ratio of one step.

    Parameters
    ----------
    recovery : Recovery
        From :func:`advcal.recover` or :func:`advcal.setgrpo`.
    sets : CoefficientSets
        The sets it was computed on (their centers are the GRPO coefficients c).

    Returns
    -------
    TrainingSummary

    Examples
    --------
    >>> from advcal import calibrate_sets, coefficient_sets, recover
    >>> from advcal.analysis import training_summary
    >>> from advcal.simulate import gram_matrices, paired_scorings
    >>> cal = calibrate_sets(*paired_scorings(1000, 8, scale=0.05, seed=0).scores,
    ...                      alpha=0.2)
    >>> sets = coefficient_sets(paired_scorings(200, 8, scale=0.05, seed=1).a,
    ...                         calibration=cal)
    >>> rec = recover(sets, gram_matrices(200, 8, seed=2).gram, tau=0.1)
    >>> s = training_summary(rec, sets)
    >>> 0 < s.accepted_ratio < 1, 0 < s.norm_ratio <= 1
    (True, True)
    """
    if not isinstance(recovery, Recovery):
        raise TypeError("`recovery` must be a Recovery from recover or setgrpo; got "
                        f"{type(recovery).__name__}.")
    sets = check_sets(sets)
    n_groups = sets.n_groups
    if recovery.eta.shape != (n_groups,):
        raise ValueError(f"`recovery` has {recovery.eta.size} groups, `sets` {n_groups}.")
    coefficients = sets.batch.gather(recovery.coefficients, "recovery.coefficients")
    centers = sets.geometry.centers
    codes = np.repeat(np.arange(n_groups), sets.batch.sizes)
    accepted = recovery.accepted
    n_acc = int(accepted.sum())
    scorable = int((sets.batch.sizes >= 2).sum())
    ratio = n_acc / scorable if scorable else 0.0
    if n_acc == 0:
        return TrainingSummary(ratio, float("nan"), float("nan"), 0)
    keep = accepted[codes]
    c2 = float(np.sum(centers[keep] ** 2))
    a2 = float(np.sum(coefficients[keep] ** 2))
    norm_ratio = float(np.sqrt(a2 / c2)) if c2 > 0 else float("nan")
    return TrainingSummary(ratio, float(recovery.eta[accepted].mean()), norm_ratio, n_acc)
