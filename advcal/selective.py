"""Selection-conditional JRSC radii: sets that cover among the groups the gate accepts.

JRSC's radius ρ covers T(r′) for a fresh group with probability 1 − α on average over
groups.  SRGO's gate then keeps only the groups whose recovery set is non-empty at τ, and
a strict gate can prefer the groups whose sets under-cover (a training scoring whose noise
widened the group's spread gives a small set, far from the second scoring's coefficients),
so the coverage among accepted groups can fall far below 1 − α as τ tightens.

:func:`calibrate_selective` gives each threshold τ its own radius ρ_τ, from calibration
groups with paired scorings and Gram matrices, in one of two ways:

* ``gate="marginal"``: the gate keeps the marginal sets (SetGRPO's decisions do not
  change); ρ_τ is the split-conformal quantile of the scores of the calibration groups
  that gate accepts at τ.  The gate is then a fixed function of a group's own data, so
  the accepted calibration groups and an accepted training group are exchangeable: the
  sets of radius ρ_τ cover among accepted groups with probability at least 1 − α.
* ``gate="selective"``: the gate itself uses radius ρ_τ.  For each candidate ρ the gate
  "accepted at (τ, ρ)" is a fixed function, so the misses among the calibration groups it
  accepts are Bernoulli draws of the conditional miss rate; a binomial p-value tests
  "miss rate > α", Holm's step-down over the candidates certifies radii at δ, and ρ_τ is
  the smallest certified one (+inf, rejecting every group, where none is).

See ``docs/setgrpo.md`` for both guarantees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from advcal import _fields
from advcal._blocks import centered
from advcal._ggsr import ablation_iv, gram_blocks, run_recovery, thresholds_checked
from advcal._validation import BACKENDS, as_float_array, check_choice, check_real
from advcal.bounds import BOUNDS, holm_certified, risk_p_value
from advcal.conformal import conformal_quantile
from advcal.jacobian import transform_checked
from advcal.sets import MEMBERSHIP_RTOL, CoefficientSets, SetCalibration, coefficient_sets

__all__ = ["GATES", "SelectiveCalibration", "calibrate_selective"]

GATES = ("marginal", "selective")

# Candidate radii of the selective gate, as multiples of the marginal radius: a few below it
# (accepted groups that over-cover) and a widening range above it.
MULTIPLIERS = (0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0)


@dataclass(frozen=True)
class SelectiveCalibration:
    """The result of :func:`calibrate_selective`; tables are ordered strict → loose.

    Attributes
    ----------
    tau : ndarray, shape (T,)
        The threshold grid, descending.
    rho : ndarray, shape (T,)
        ρ_τ: the radius of the sets that cover among the groups accepted at τ (+inf where
        too few calibration groups are accepted, or, for the selective gate, where no
        candidate is certified).
    gate : {"marginal", "selective"}
        Whether the gate keeps the marginal radius or uses ρ_τ.
    candidates : ndarray, shape (R,)
        The radii the gate was run with, ascending (the marginal radius alone, R = 1, for
        the marginal gate).
    n_acc, n_miss : ndarray of int64, shape (T, R)
        Calibration groups accepted at (τ, candidate) and, among them, those whose second
        scoring's coefficients lie outside the set of that radius.
    p_value : ndarray, shape (T, R)
        Binomial p-value of "miss rate among accepted > α" (1 where nothing is accepted).
    certified : ndarray of bool, shape (T, R)
        Selective gate: Holm's step-down at δ over each row.  Marginal gate: whether the
        marginal radius already covers, ρ_τ ≤ ρ.
    alpha : float
        Miscoverage level among accepted groups.
    delta : float or None
        The selective gate's error level (None for the marginal gate, whose guarantee is
        in expectation over the calibration groups).
    calibration : SetCalibration
        The marginal calibration whose shapes and noise variance the sets keep.
    """

    tau: np.ndarray
    rho: np.ndarray
    gate: str
    candidates: np.ndarray
    n_acc: np.ndarray
    n_miss: np.ndarray
    p_value: np.ndarray
    certified: np.ndarray
    alpha: float
    delta: float | None
    calibration: SetCalibration

    def __post_init__(self) -> None:
        check_choice(self.gate, "gate", GATES)
        t = _fields.float_vector(self.tau, "tau").size
        r = _fields.float_vector(self.candidates, "candidates").size
        _fields.float_vector(self.rho, "rho", size=t)
        if np.isnan(self.rho).any() or (np.asarray(self.rho) < 0).any():
            raise ValueError("`rho` must be radii >= 0 (or +inf).")
        for name in ("n_acc", "n_miss", "p_value", "certified"):
            if np.shape(getattr(self, name)) != (t, r):
                raise ValueError(f"`{name}` must have shape (T, R) = ({t}, {r}).")
        if (np.asarray(self.n_miss) > np.asarray(self.n_acc)).any():
            raise ValueError("`n_miss` must not exceed `n_acc`.")
        _fields.alpha(self.alpha)
        if (self.delta is None) != (self.gate == "marginal"):
            raise ValueError("`delta` is the selective gate's level: a float there, None for "
                             "the marginal gate.")
        if self.delta is not None:
            _fields.alpha(self.delta, "delta")
        if not isinstance(self.calibration, SetCalibration):
            raise TypeError("`calibration` must be a SetCalibration.")

    def radius(self, tau: float) -> float:
        """ρ_τ of a threshold on the grid (ValueError for any other τ)."""
        tau = _fields.real(tau, "tau", low=0.0, high=1.0, high_open=True)
        hit = np.flatnonzero(self.tau == tau)
        if not hit.size:
            raise ValueError(f"`tau` = {tau!r} is not on the selective calibration's grid "
                             f"{self.tau.tolist()}.")
        return float(self.rho[hit[0]])

    def gate_radius(self, tau: float) -> float:
        """The radius the gate uses at τ: ρ_τ for the selective gate, else the marginal ρ."""
        rho = self.radius(tau)
        return rho if self.gate == "selective" else float(self.calibration.rho)


def _selective_iv(calibration: Any, gate: Any, alpha: Any, delta: Any, multipliers: Any,
                  bound: Any, backend: Any) -> tuple[float, float | None, np.ndarray]:
    if not isinstance(calibration, SetCalibration):
        raise TypeError("`calibration` must be a SetCalibration from calibrate_sets; got "
                        f"{type(calibration).__name__}.")
    check_choice(gate, "gate", GATES)
    if not np.isfinite(calibration.rho):
        raise ValueError("`calibration` has an infinite radius (too few calibration groups "
                         "for its alpha): its sets accept no group.")
    alpha = calibration.alpha if alpha is None else alpha
    alpha = check_real(alpha, "alpha", low=0.0, high=1.0, low_inclusive=False,
                       high_inclusive=False)
    check_choice(bound, "bound", BOUNDS)
    check_choice(backend, "backend", BACKENDS)
    rho = float(calibration.rho)
    if gate == "marginal":
        if delta is not None:
            raise ValueError("`delta` is used only with gate='selective' (the marginal "
                             "gate's guarantee holds in expectation).")
        if multipliers is not None:
            raise ValueError("`multipliers` are used only with gate='selective'.")
        return alpha, None, np.array([rho])
    if delta is None:
        raise ValueError("`delta` is required with gate='selective'.")
    delta = check_real(delta, "delta", low=0.0, high=1.0, low_inclusive=False,
                       high_inclusive=False)
    mult = as_float_array(MULTIPLIERS if multipliers is None else multipliers, "multipliers")
    if mult.ndim != 1 or mult.size == 0:
        raise ValueError(f"`multipliers` must be a non-empty 1-D array; got shape "
                         f"{mult.shape}.")
    if not (np.isfinite(mult).all() and (mult > 0).all()):
        raise ValueError("`multipliers` must be positive and finite.")
    if np.unique(mult).size != mult.size:
        raise ValueError("`multipliers` must not contain duplicates.")
    return alpha, delta, np.sort(mult.astype(np.float64)) * rho


def calibrate_selective(
    scores_a: ArrayLike,
    scores_b: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    gram: ArrayLike,
    calibration: SetCalibration,
    thresholds: ArrayLike,
    gate: str = "marginal",
    alpha: float | None = None,
    delta: float | None = None,
    multipliers: ArrayLike | None = None,
    noise_var: ArrayLike | None = None,
    bound: str = "clopper-pearson",
    reward_condition: bool = True,
    backend: str = "numba",
) -> SelectiveCalibration:
    """Calibrate one JRSC radius per threshold that covers among the groups the gate accepts.

    ``gate="marginal"``: the calibration groups GGSR accepts at τ with the marginal sets
    are found, and ρ_τ is the split-conformal quantile (:func:`advcal.conformal_quantile`)
    of their scores d_q at level α.  ``gate="selective"``: for each candidate radius ρ
    (``multipliers`` times the marginal ``calibration.rho``), the groups accepted at τ with
    sets of radius ρ are counted, with the misses among them (T(r_b) outside the set);
    the p-value of "P(miss | accepted at (τ, ρ)) > α" is :func:`advcal.risk_p_value`'s,
    Holm's step-down at δ over the candidates certifies radii, and ρ_τ is the smallest
    certified one (+inf where none is).

    Parameters
    ----------
    scores_a, scores_b : array_like, shape (B, G) or (N,)
        Two scorings of calibration responses (``scores_a`` plays the training scoring),
        from groups independent of the marginal calibration's, of the training groups and
        of the groups that select the threshold.
    offsets : array_like of int, optional
        CSR group boundaries for 1-D scores.
    group_ids : sequence of hashable, optional
        Per-response group labels for 1-D scores.
    gram : array_like
        The groups' Gram matrices (layout as in :func:`advcal.recover`).
    calibration : SetCalibration
        The marginal calibration (:func:`advcal.calibrate_sets`): its shapes, noise
        variance and estimator build the sets, its radius is the marginal gate's.
    thresholds : array_like
        The τ grid in [0, 1), distinct (typically SRGO's).
    gate : {"marginal", "selective"}, default "marginal"
        ``"marginal"`` keeps SetGRPO's gate and decisions, and gives the sets that cover
        among the groups it accepts.  ``"selective"`` makes the gate use those sets: pass
        the result as ``selective=`` to :func:`advcal.select_threshold` and
        :func:`advcal.setgrpo`.
    alpha : float, optional
        Miscoverage level among accepted groups; default ``calibration.alpha``.
    delta : float, optional
        The selective gate's error level in (0, 1) (required there, refused otherwise).
    multipliers : array_like, optional
        The selective gate's candidate radii over the marginal one, positive and distinct,
        fixed before seeing the calibration groups; default (0.8, 0.9, 1, 1.1, 1.25, 1.5,
        2, 3).
    noise_var : array_like, optional
        Per-response grader variances, for a calibration with ``noise="diagonal"``.
    bound : {"clopper-pearson", "hoeffding", "bentkus", "hoeffding-bentkus"}
        The binomial p-value.
    reward_condition : bool, default True
        The gate's reward condition, as in :func:`advcal.recover` (use the training run's).
    backend : {"numba", "numpy"}, default "numba"
        Recovery engine.

    Returns
    -------
    SelectiveCalibration
        ``rho`` per threshold and the counts behind it.

    Examples
    --------
    >>> from advcal import calibrate_selective, calibrate_sets, coefficient_sets
    >>> from advcal.simulate import gram_matrices, paired_scorings
    >>> cal = calibrate_sets(*paired_scorings(2000, 8, scale=0.02, seed=0).scores,
    ...                      alpha=0.1)
    >>> pair = paired_scorings(2000, 8, scale=0.02, seed=1)
    >>> sel = calibrate_selective(pair.a, pair.b, gram=gram_matrices(2000, 8, seed=2).gram,
    ...                           calibration=cal, thresholds=[0.0, 0.2])
    >>> sel.tau.tolist(), sel.n_acc.shape
    ([0.2, 0.0], (2, 1))
    >>> batch = paired_scorings(4, 8, scale=0.02, seed=3).a
    >>> sets = coefficient_sets(batch, calibration=cal).at_radius(sel.radius(0.2))
    """
    alpha, delta, candidates = _selective_iv(calibration, gate, alpha, delta, multipliers,
                                             bound, backend)
    taus = thresholds_checked(thresholds)
    ablation = ablation_iv(reward_condition, True, "gate", None)
    sets = coefficient_sets(scores_a, offsets, group_ids=group_ids, calibration=calibration,
                            noise_var=noise_var)
    values_b = sets.batch.gather(scores_b, "scores_b")
    if not np.isfinite(values_b).all():
        raise ValueError("`scores_b` must be finite.")
    gram_flat = gram_blocks(sets, gram)
    distance = _distances(sets, values_b)
    informative = sets.batch.sizes >= 2
    n_acc = np.zeros((taus.size, candidates.size), dtype=np.int64)
    n_miss = np.zeros_like(n_acc)
    accepted_at = []
    for j, rho in enumerate(candidates):
        accepted = run_recovery(sets.at_radius(float(rho)), gram_flat, taus, None, backend,
                                ablation).accepted & informative[:, None]
        # The same membership test as CoefficientSets.contains.
        miss = distance > rho * (1.0 + MEMBERSHIP_RTOL) + 1e-12
        n_acc[:, j] = accepted.sum(axis=0)
        n_miss[:, j] = (accepted & miss[:, None]).sum(axis=0)
        accepted_at.append(accepted)
    p_values = np.asarray(risk_p_value(n_miss, n_acc, alpha, bound=bound),
                          dtype=np.float64).reshape(n_acc.shape)
    if delta is None:
        accepted = accepted_at[0]
        rho_tau = np.array([conformal_quantile(distance[accepted[:, i]], alpha)
                            if accepted[:, i].any() else np.inf for i in range(taus.size)])
        certified = (rho_tau <= candidates[0])[:, None]
    else:
        certified = np.stack([holm_certified(row, delta / candidates.size)
                              for row in p_values])
        rho_tau = np.array([candidates[row].min() if row.any() else np.inf
                            for row in certified])
    return SelectiveCalibration(taus, rho_tau.astype(np.float64), gate, candidates, n_acc,
                                n_miss, p_values, certified, alpha, delta, calibration)


def _distances(sets: CoefficientSets, values_b: np.ndarray) -> np.ndarray:
    """d_q = sqrt(δᵀ S_q⁺ δ), δ = T(r_b) − c, per group: calibrate_sets's score."""
    cal, offsets = sets.calibration, sets.offsets
    other = transform_checked(values_b, offsets, cal.estimator, cal.eps, cal.ddof,
                              cal.options)
    d2 = sets.geometry.quad_pinv(centered(other - sets.geometry.centers, offsets))
    return np.sqrt(np.clip(d2, 0.0, None))
