"""SRGO: selective risk-gated thresholds, and the one-call SetGRPO step (``docs/setgrpo.md``).

On calibration groups with a reference coefficient a_ref (from an independent scoring)
and a grid of thresholds τ, a group is *accepted* at τ when its GGSR recovery set is
non-empty, and a *reversal* when accepted and a(η*)ᵀ K a_ref < 0.  Acceptance never looks
at the reference scoring, so given which groups are accepted the reversals are
Bernoulli(R(τ)) draws and a binomial upper confidence bound on the conditional risk
R(τ) is valid.  :func:`select_threshold` makes the tests simultaneously valid over the
grid (by default Holm's step-down united with a fixed sequence whose start a twentieth of
the groups plan; or Bonferroni, Holm, the fixed sequence or the hybrid alone) and picks
the risk-feasible threshold with the largest cumulative recovery Σ_q η*_q(τ).
:func:`setgrpo` then runs JRSC + GGSR on a training batch at that threshold.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from advcal import _fields
from advcal._ggsr import (
    FULL_METHOD,
    ablation_iv,
    check_sets,
    gram_blocks,
    run_recovery,
    thresholds_checked,
)
from advcal._validation import BACKENDS, check_choice, check_real
from advcal.bounds import BOUNDS, holm_certified, p_values_checked, risk_p_value, ucb
from advcal.recovery import Recovery, recover, recover_checked
from advcal.selective import SelectiveCalibration
from advcal.sets import CoefficientSets, SetCalibration, coefficient_sets

__all__ = ["ThresholdSelection", "select_threshold", "setgrpo"]

PROCEDURES = ("learn-then-test", "bonferroni", "holm", "fixed-sequence", "hybrid")

# learn-then-test: every LEARN_EVERY-th calibration group (in the given order) learns where
# the fixed sequence starts, and the others test it at (1 − HOLM_SHARE)·δ; Holm runs at
# HOLM_SHARE·δ on every group.  Chosen on the power study of docs/setgrpo.md: the fixed
# sequence carries monotone curves, and a small Holm share keeps non-monotone ones.
LEARN_EVERY = 20
HOLM_SHARE = 0.1


class ThresholdSelection(NamedTuple):
    """Result of :func:`select_threshold`; the table is ordered strict → loose.

    Attributes
    ----------
    tau_sel : float or None
        The selected threshold; None when no threshold is risk-feasible (reject all).
    tau : ndarray, shape (T,)
        The grid, descending.
    n_acc, k_rev : ndarray of int64, shape (T,)
        Accepted calibration groups and reversals among them.
    risk : ndarray, shape (T,)
        R̂ = k_rev / n_acc (NaN for vacuous thresholds, n_acc = 0).
    ucb : ndarray, shape (T,)
        Upper confidence bound on the conditional risk at the per-test level ``level``
        (1 for vacuous thresholds): the dual of ``p_value``, so ``ucb <= beta`` exactly
        when ``p_value <= level``.
    p_value : ndarray, shape (T,)
        Learn-then-Test p-value of "R(τ) > β" (1 for vacuous thresholds).
    recovery : ndarray, shape (T,)
        Cumulative recovery Σ_q η*_q(τ) over the calibration groups.
    feasible : ndarray of bool, shape (T,)
        Certified risk-feasible by the procedure: p-value ≤ ``level`` (equivalently
        UCB ≤ β) for Bonferroni; for Holm, the j-th smallest p-value ≤ δ/(T − j + 1) for
        it and every smaller one; for fixed-sequence, p-value ≤ ``level`` for every
        threshold between the start of the sequence and this one; for the hybrid and
        learn-then-test, certified by either half.
    level : float
        Per-threshold error level of the ``ucb`` column: δ/T (Bonferroni, and Holm's
        first step), δ (fixed sequence), δ/(2T) (hybrid: its Holm half's first step) or
        δ/(10T) (learn-then-test: its Holm part's first step).  A threshold certified by a
        later Holm step or by a fixed sequence can have ``ucb`` above β.
    """

    tau_sel: float | None
    tau: np.ndarray
    n_acc: np.ndarray
    k_rev: np.ndarray
    risk: np.ndarray
    ucb: np.ndarray
    p_value: np.ndarray
    recovery: np.ndarray
    feasible: np.ndarray
    level: float


# Recovery sums η* ∈ [0, 1] over the accepted groups: allow rounding of that sum.
RECOVERY_RTOL = 1e-9


def validate_threshold_selection(sel: Any) -> None:
    """Check every field of a :class:`~advcal.ThresholdSelection`.

    Run by :func:`advcal.setgrpo` on a selection passed as ``tau`` and by the artefact
    functions.  Raises ``ValueError`` or ``TypeError`` naming the first bad field: a grid
    ``tau`` that is not strictly descending in [0, 1), columns of another length than
    ``tau`` or of the wrong dtype, counts with ``k_rev > n_acc``, probabilities outside
    [0, 1], a ``risk`` that is not ``k_rev / n_acc``, a ``feasible`` vacuous threshold,
    or a ``tau_sel`` that is not a feasible threshold of the grid (None iff none is).
    """
    tau = _fields.float_vector(sel.tau, "tau")
    t = tau.size
    if not (np.isfinite(tau).all() and (tau >= 0).all() and (tau < 1).all()):
        raise ValueError("`tau` must lie in [0, 1).")
    if (np.diff(tau) >= 0).any():
        raise ValueError("`tau` must be strictly descending (strict -> loose).")
    n_acc = _fields.int_vector(sel.n_acc, "n_acc", t)
    k_rev = _fields.int_vector(sel.k_rev, "k_rev", t)
    if (n_acc < 0).any():
        raise ValueError("`n_acc` must be non-negative.")
    if (k_rev < 0).any() or (k_rev > n_acc).any():
        raise ValueError("`k_rev` must satisfy 0 <= k_rev <= n_acc.")
    risk = _fields.float_vector(sel.risk, "risk", size=t)
    vacuous = n_acc == 0
    if not np.array_equal(np.isnan(risk), vacuous):
        raise ValueError("`risk` must be NaN exactly where n_acc = 0.")
    expected = k_rev[~vacuous] / n_acc[~vacuous].astype(np.float64)
    if not np.allclose(risk[~vacuous], expected, rtol=1e-12, atol=0.0):
        raise ValueError("`risk` must equal k_rev / n_acc.")
    for name in ("ucb", "p_value"):
        col = _fields.float_vector(getattr(sel, name), name, size=t)
        if not ((col >= 0) & (col <= 1)).all():  # also refuses NaN
            raise ValueError(f"`{name}` must lie in [0, 1].")
    recovery = _fields.float_vector(sel.recovery, "recovery", size=t)
    limit = n_acc * (1.0 + RECOVERY_RTOL) + RECOVERY_RTOL
    if not (np.isfinite(recovery).all() and (recovery >= 0).all() and (recovery <= limit).all()):
        raise ValueError("`recovery` must lie in [0, n_acc] (a sum of eta* in [0, 1]).")
    feasible = sel.feasible
    if not isinstance(feasible, np.ndarray) or feasible.dtype != np.bool_:
        raise ValueError("`feasible` must be a numpy array of bool.")
    if feasible.shape != (t,):
        raise ValueError(f"`feasible` must have shape ({t},); got {feasible.shape}.")
    if (feasible & vacuous).any():
        raise ValueError("`feasible` must be False where n_acc = 0 (nothing certified).")
    _fields.real(sel.level, "level", low=0.0, high=1.0, low_open=True, high_open=True)
    if sel.tau_sel is None:
        if feasible.any():
            raise ValueError("`tau_sel` is None but `feasible` certifies a threshold.")
        return
    tau_sel = _fields.real(sel.tau_sel, "tau_sel")
    hit = np.flatnonzero(tau == tau_sel)
    if hit.size != 1 or not feasible[hit[0]]:
        raise ValueError(f"`tau_sel` must be a feasible threshold of `tau`; got {tau_sel!r}.")


def _select_iv(sets: Any, gram: Any, reference: Any, thresholds: Any, beta: Any, delta: Any,
               bound: Any, procedure: Any, backend: Any) -> tuple[Any, ...]:
    # The ablation switches are validated by _ggsr.ablation_iv in select_threshold.
    sets = check_sets(sets)
    beta = check_real(beta, "beta", low=0.0, high=1.0, low_inclusive=False,
                      high_inclusive=False)
    delta = check_real(delta, "delta", low=0.0, high=1.0, low_inclusive=False,
                       high_inclusive=False)
    check_choice(bound, "bound", BOUNDS)
    check_choice(procedure, "procedure", PROCEDURES)
    check_choice(backend, "backend", BACKENDS)
    taus = thresholds_checked(thresholds)
    gram_flat = gram_blocks(sets, gram)
    ref = sets.batch.gather(reference, "reference")
    if not np.isfinite(ref).all():
        raise ValueError("`reference` must be finite.")
    return sets, gram_flat, ref, taus, beta, delta


def _certifiable_reversals(n_acc: np.ndarray, beta: float, level: float,
                           bound: str) -> np.ndarray:
    """Per threshold, the largest reversal count that p ≤ level certifies (-1: none).

    The p-value increases in k, so a bisection over 0..n_acc finds it.
    """
    lo = np.full(n_acc.shape, -1, dtype=np.int64)  # certified (or -1)
    hi = n_acc.astype(np.int64)  # k = n_acc: p = 1, never certified
    while (active := hi - lo > 1).any():
        mid = np.where(active, (lo + hi) // 2, hi)  # >= 0 where active
        ok = active & (p_values_checked(bound, mid, n_acc, np.full(mid.shape, beta)) <= level)
        lo = np.where(ok, mid, lo)
        hi = np.where(active & ~ok, mid, hi)
    return lo


def _sequence_start(n_acc: np.ndarray, beta: float, level: float, bound: str) -> int:
    """Index where the fixed sequence starts; ``len(n_acc)`` if nowhere.

    The strictest threshold whose acceptance count would certify a conditional risk of
    β/2 with probability at least 1 − level.  Where a handful of groups are accepted
    (just enough that zero reversals would certify) one unlucky reversal ends the whole
    walk; the planning risk β/2 asks for enough groups to make that unlikely while the
    start stays at the strict end, where the risk is lowest.  The rule reads only the
    acceptance counts, never the reference scoring, so the guarantee is kept.
    """
    from scipy import stats

    k_max = _certifiable_reversals(n_acc, beta, level, bound)
    power = np.where(k_max >= 0, stats.binom.cdf(k_max, n_acc, beta / 2), 0.0)
    possible = np.flatnonzero(power >= 1 - level)
    return int(possible[0]) if possible.size else n_acc.size


class Split(NamedTuple):
    """learn-then-test's two parts of the calibration groups: the numbers of groups that
    learn the start and that test, the learning groups' acceptance counts, and the testing
    groups' acceptance and reversal counts (per threshold)."""

    m_learn: int
    m_test: int
    n_learn: np.ndarray
    n_test: np.ndarray
    k_test: np.ndarray


def split_counts(accepted: np.ndarray, reversal: np.ndarray) -> Split:
    """The counts of :class:`Split` from per-group (m, T) acceptance and reversals."""
    learn = np.arange(accepted.shape[0]) % LEARN_EVERY == 0

    def count(x: np.ndarray) -> np.ndarray:
        return x.sum(axis=0).astype(np.int64)

    return Split(int(learn.sum()), int((~learn).sum()), count(accepted[learn]),
                 count(accepted[~learn]), count(reversal[~learn]))


def _walk(certified: np.ndarray, start: int) -> np.ndarray:
    """The fixed sequence from ``start`` toward looser thresholds, to the first failure."""
    walk = certified[start:]
    stop = start + (int(np.argmin(walk)) if not walk.all() else walk.size)
    feasible = np.zeros(certified.size, dtype=bool)
    feasible[start:stop] = True
    return feasible


def _learnt_sequence(split: Split, beta: float, level: float, bound: str) -> np.ndarray:
    """The fixed sequence at ``level`` on the testing groups, from the start the learning
    groups' counts plan (scaled to the testing groups' number)."""
    n_plan = np.rint(split.n_learn * (split.m_test / max(split.m_learn, 1))).astype(np.int64)
    start = _sequence_start(n_plan, beta, level, bound)
    p_test = p_values_checked(bound, split.k_test, split.n_test,
                              np.full(split.n_test.shape, beta))
    return _walk(p_test <= level, start)


def _feasible(n_acc: np.ndarray, p_values: np.ndarray, beta: float, level: float,
              bound: str, procedure: str, split: Split | None = None) -> np.ndarray:
    """Certified thresholds (table strict → loose) under ``procedure``."""
    certified = p_values <= level
    if procedure == "bonferroni":
        return certified
    if procedure == "learn-then-test":
        # level is HOLM_SHARE·δ/T here: Holm on every group, and the fixed sequence on the
        # testing groups at the rest of δ, from the start the learning groups plan.
        if split is None:
            raise ValueError("learn-then-test needs the split counts.")
        sequence_level = level * p_values.size * (1 - HOLM_SHARE) / HOLM_SHARE
        return (holm_certified(p_values, level)
                | _learnt_sequence(split, beta, sequence_level, bound))
    if procedure == "hybrid":
        # Half of δ to each (level is δ/(2T) here): the fixed sequence at δ/2, Holm at δ/2;
        # a threshold either certifies is certified (the union bound adds their errors).
        t = p_values.size
        return (_feasible(n_acc, p_values, beta, level * t, bound, "fixed-sequence")
                | _feasible(n_acc, p_values, beta, level, bound, "holm"))
    if procedure == "holm":
        return holm_certified(p_values, level)
    # Fixed sequence: walk looser from the start, stopping at the first not certified.
    return _walk(certified, _sequence_start(n_acc, beta, level, bound))


def _selection(taus: np.ndarray, n_acc: np.ndarray, k_rev: np.ndarray, recovery: np.ndarray,
               beta: float, delta: float, bound: str, procedure: str,
               split: Split | None = None) -> ThresholdSelection:
    """The SRGO table and decision from the counts (taus strict → loose)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        risk = np.where(n_acc > 0, k_rev / np.maximum(n_acc, 1), np.nan)
    level = {"fixed-sequence": delta, "hybrid": delta / (2 * taus.size),
             "learn-then-test": HOLM_SHARE * delta / taus.size}.get(procedure,
                                                                     delta / taus.size)
    bounds = np.asarray(ucb(k_rev, n_acc, level, bound=bound), dtype=np.float64).reshape(-1)
    p_values = np.asarray(risk_p_value(k_rev, n_acc, beta, bound=bound),
                          dtype=np.float64).reshape(-1)
    # The p-value decides; the UCB beside it is its exact dual, so the columns agree.
    feasible = _feasible(n_acc, p_values, beta, level, bound, procedure, split)
    tau_sel: float | None = None
    if feasible.any():
        candidates = np.flatnonzero(feasible)
        best = candidates[np.argmax(recovery[candidates])]  # first max: the strictest
        tau_sel = float(taus[best])
    return ThresholdSelection(tau_sel, taus, n_acc, k_rev, risk, bounds, p_values, recovery,
                              feasible, float(level))


def select_threshold(
    sets: CoefficientSets,
    gram: ArrayLike,
    reference: ArrayLike,
    *,
    thresholds: ArrayLike,
    beta: float,
    delta: float,
    bound: str = "clopper-pearson",
    procedure: str = "learn-then-test",
    reward_condition: bool = True,
    recovery: bool = True,
    discard: str = "gate",
    seed: Any = None,
    selective: SelectiveCalibration | None = None,
    backend: str = "numba",
) -> ThresholdSelection:
    """Risk-calibrate the GGSR threshold on calibration groups (SRGO).

    Parameters
    ----------
    sets : CoefficientSets
        JRSC sets of the calibration groups (built from their training-like scoring).
    gram : array_like
        Their Gram matrices (layout as in :func:`advcal.recover`).
    reference : array_like
        Reference coefficients a_ref (e.g. GRPO coefficients of an independent scoring),
        in the layout of the rewards the sets were built from.
    thresholds : array_like
        Candidate τ values in [0, 1), distinct; any order (the table is strict → loose).
    beta : float
        Target conditional reversal risk, in (0, 1).
    delta : float
        Error level of the simultaneous guarantee, in (0, 1).
    bound : {"clopper-pearson", "hoeffding", "bentkus", "hoeffding-bentkus"}
        Binomial upper confidence bound (:func:`advcal.ucb`).
    procedure : {"learn-then-test", "bonferroni", "holm", "fixed-sequence", "hybrid"}
        Default ``"learn-then-test"``: the thresholds certified by Holm at δ/10 (all
        groups) or by a fixed sequence at 9δ/10 on 19 of every 20 groups, whose start is
        planned from the acceptance counts of the 20th (every 20th group in the given
        order, which must not depend on the groups' scores). Valid for any shape of the
        risk curve without further assumption, and near the best of the others on monotone
        and non-monotone curves alike. ``"bonferroni"``: each threshold certified at δ/T
        (valid whatever the shape of the risk curve). ``"holm"``: Holm's step-down over the
        same p-values, the j-th smallest at δ/(T − j + 1); it certifies every threshold
        Bonferroni certifies and possibly more, under the same guarantee (family-wise error
        ≤ δ whatever the dependence and the shape of the curve). ``"fixed-sequence"``:
        fixed-sequence testing at full δ, starting at the strictest threshold whose acceptance
        count would certify a risk of β/2 with probability at least 1 − δ, walking toward
        looser ones and stopping at the first not certified. The start depends only on the
        acceptance counts, which never look at the reference scoring, so the guarantee is
        that of a sequence fixed in advance (see the SetGRPO docs page for the proof and
        what it assumes). ``"hybrid"``: the thresholds certified by the fixed sequence at
        δ/2 or by Holm at δ/2; near the better of the two on monotone and non-monotone risk
        curves alike, with the fixed sequence's assumption for its half.
    reward_condition, recovery, discard, seed
        The SetGRPO ablations, as in :func:`advcal.recover`, applied at every threshold
        (``"matched-random"`` draws one random order of the groups, so the kept sets are
        nested as τ loosens; a kept group is a reversal when cᵀ K a_ref < 0).  Acceptance
        still never looks at the reference, so the guarantee holds for each ablation.
    selective : SelectiveCalibration, optional
        A :func:`advcal.calibrate_selective` result with ``gate="selective"``, from other
        groups: the gate at each τ uses its radius ρ_τ (every τ must be on its grid, and
        ``sets`` built from its marginal calibration).  Acceptance still never looks at
        the reference, so the guarantee is unchanged.
    backend : {"numba", "numpy"}, default "numba"
        Recovery engine.

    Returns
    -------
    ThresholdSelection
        ``tau_sel`` (None if no threshold is feasible) and the whole table.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import calibrate_sets, coefficient_sets, grpo, select_threshold
    >>> from advcal.simulate import gram_matrices, paired_scorings
    >>> cal = calibrate_sets(*paired_scorings(2000, 8, scale=0.02, seed=0).scores,
    ...                      alpha=0.1)
    >>> data = paired_scorings(400, 8, scale=0.02, seed=1)
    >>> sets = coefficient_sets(data.a, calibration=cal)
    >>> sel = select_threshold(sets, gram_matrices(400, 8, seed=2).gram, grpo(data.b),
    ...                        thresholds=[0.0, 0.2, 0.4], beta=0.1, delta=0.1)
    >>> sel.tau.tolist(), bool(sel.tau_sel is None or sel.tau_sel in sel.tau)
    ([0.4, 0.2, 0.0], True)
    """
    sets, gram_flat, ref, taus, beta, delta = _select_iv(
        sets, gram, reference, thresholds, beta, delta, bound, procedure, backend)
    ablation = ablation_iv(reward_condition, recovery, discard, seed)
    radii = np.full(taus.shape, sets.rho)
    if selective is not None:
        check_selective(selective, sets.calibration, recovery, discard)
        radii = np.array([selective.gate_radius(float(t)) for t in taus])
    accepted = np.zeros((sets.n_groups, taus.size), dtype=bool)
    eta = np.zeros(accepted.shape)
    dot = np.zeros(accepted.shape)
    for rho in np.unique(radii):  # one run per radius: the anchors depend on it
        cols = np.flatnonzero(radii == rho)
        at = sets if rho == sets.rho else sets.at_radius(float(rho))
        raw = run_recovery(at, gram_flat, taus[cols], ref, backend, ablation)
        accepted[:, cols] = raw.accepted
        eta[:, cols] = np.where(raw.accepted, raw.eta, 0.0)
        dot[:, cols] = raw.ref0[:, None] + eta[:, cols] * raw.ref1[:, None]
    reversal = accepted & (dot < 0)
    n_acc = accepted.sum(axis=0).astype(np.int64)
    k_rev = reversal.sum(axis=0).astype(np.int64)
    split = split_counts(accepted, reversal) if procedure == "learn-then-test" else None
    return _selection(taus, n_acc, k_rev, eta.sum(axis=0), beta, delta, bound, procedure,
                      split)


def setgrpo(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    gram: ArrayLike,
    calibration: SetCalibration,
    tau: float | ThresholdSelection | None,
    noise_var: ArrayLike | None = None,
    reward_condition: bool = True,
    recovery: bool = True,
    discard: str = "gate",
    seed: Any = None,
    selective: SelectiveCalibration | None = None,
    backend: str = "numba",
) -> Recovery:
    """One SetGRPO step on a training batch: JRSC sets, then GGSR at the threshold.

    Parameters
    ----------
    rewards : array_like, shape (B, G) or (N,)
        Training scores.
    offsets : array_like of int, optional
        CSR group boundaries for 1-D rewards.
    group_ids : sequence of hashable, optional
        Per-response group labels for 1-D rewards.
    gram : array_like
        Gram matrices of the training groups under the current policy.
    calibration : SetCalibration
        From :func:`advcal.calibrate_sets` (on groups independent of this batch).
    tau : float, ThresholdSelection or None
        The threshold (typically ``select_threshold(...).tau_sel``, or the selection
        itself).  None — no risk-feasible threshold — rejects every group.  A float
        chosen by hand instead of calibrated is the paper's "fixed threshold" ablation.
    noise_var : array_like, optional
        Per-response grader variances, for a calibration with ``noise="diagonal"``.
    reward_condition, recovery, discard, seed
        The SetGRPO ablations, as in :func:`advcal.recover` (the threshold should come
        from a ``select_threshold`` run with the same switches).
    selective : SelectiveCalibration, optional
        A ``gate="selective"`` result of :func:`advcal.calibrate_selective` for
        ``calibration``: the sets take its radius at ``tau`` (which must be on its grid).
    backend : {"numba", "numpy"}, default "numba"
        Recovery engine.

    Returns
    -------
    Recovery
        ``coefficients``: the values to write into the GRPO loss in place of the
        advantages (a(η*) for accepted groups, 0 for rejected ones), plus ``eta``,
        ``accepted``, ``anchors``, ``m_full``, ``m_reward``.

    Examples
    --------
    >>> from advcal import calibrate_sets, setgrpo
    >>> from advcal.simulate import gram_matrices, paired_scorings
    >>> cal = calibrate_sets(*paired_scorings(2000, 8, scale=0.02, seed=0).scores,
    ...                      alpha=0.1)
    >>> batch = paired_scorings(16, 8, scale=0.02, seed=3).a
    >>> out = setgrpo(batch, gram=gram_matrices(16, 8, seed=4).gram, calibration=cal,
    ...               tau=0.25)
    >>> out.coefficients.shape, out.accepted.dtype
    ((16, 8), dtype('bool'))
    """
    if isinstance(tau, ThresholdSelection):
        validate_threshold_selection(tau)  # it may have been built or loaded by hand
        tau = tau.tau_sel
    sets = coefficient_sets(rewards, offsets, group_ids=group_ids, calibration=calibration,
                            noise_var=noise_var)
    if selective is not None:
        check_selective(selective, calibration, recovery, discard)
        if tau is not None:
            sets = sets.at_radius(selective.gate_radius(tau))
    if tau is not None:
        return recover(sets, gram, tau=tau, reward_condition=reward_condition,
                       recovery=recovery, discard=discard, seed=seed, backend=backend)
    check_choice(backend, "backend", BACKENDS)
    ablation_iv(reward_condition, recovery, discard, seed)  # rejecting all: checked only
    # Recovery at τ = 0 gives the anchors and projections; no group is accepted.
    rec = recover_checked(sets, gram_blocks(sets, gram), 0.0, backend, FULL_METHOD)
    n_groups = sets.n_groups
    return rec._replace(coefficients=np.zeros_like(rec.coefficients), eta=np.zeros(n_groups),
                        accepted=np.zeros(n_groups, dtype=bool))


def check_selective(selective: Any, calibration: SetCalibration, recovery: bool,
                    discard: str) -> None:
    """A selective gate built on ``calibration`` (the sets' own), for the gate it was
    calibrated on: with recovery, discarding by the gate."""
    if not isinstance(selective, SelectiveCalibration):
        raise TypeError("`selective` must be a SelectiveCalibration from calibrate_selective; "
                        f"got {type(selective).__name__}.")
    if not recovery or discard != "gate":
        # its radii cover among the groups SetGRPO's own gate accepts, not an ablation's
        raise ValueError("`selective` was calibrated for SetGRPO's gate (recovery=True, "
                         "discard='gate'); the ablations accept other groups, among which "
                         "its radii are not calibrated: leave `selective` out for them.")
    if selective.gate != "selective":
        raise ValueError("`selective` has gate='marginal', which leaves the gate as it is: "
                         "build the covering sets with CoefficientSets.at_radius instead.")
    a, b = selective.calibration, calibration
    same = a is b or (
        (a.rho, a.alpha, a.noise_var, a.ridge, a.estimator, a.shape, a.noise, a.eps, a.ddof,
         a.options) == (b.rho, b.alpha, b.noise_var, b.ridge, b.estimator, b.shape, b.noise,
                        b.eps, b.ddof, b.options) and np.array_equal(a.scores, b.scores))
    if not same:
        raise ValueError("`selective` was calibrated on another SetCalibration than the "
                         "sets': build both from the same calibrate_sets result.")
