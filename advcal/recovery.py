"""GGSR: geometry-guided safe recovery of GRPO coefficients.

Given a group's JRSC set E = {c + R z : ‖z‖ ≤ ρ} (R = S^{1/2}) and the Gram matrix K of
its responses' policy gradients (the update of coefficients a is U(a) = Σ a_i g_i, so
⟨U(a), U(b)⟩ = aᵀKb):

* the **anchor** a₀ = argmin_{a∈E} aᵀKa, a trust-region problem in z solved by the
  secular equation (minimum-norm z when K is singular).  By the projection theorem
  ⟨U(a₀), U(a′)⟩ ≥ ‖U(a₀)‖² for every a′ ∈ E; ‖U(a₀)‖ = 0 rejects the group;
* the **path** a(η) = a₀ + η(c − a₀), and the projections
  M_full(η) = [a(η)ᵀKc − ρ·‖R K a(η)‖] / (‖U(a(η))‖·‖U(c)‖) and M_reward (K = I);
* **η*(τ)** = sup{η ∈ [0, 1] : M_full(η) ≥ τ, M_reward(η) > 0}; both conditions are
  concave in η once the positive denominators are cleared, so the feasible set is an
  interval, found with a ternary search + bisection on O(1)-cost evaluations.  An empty
  set rejects the group (no update); otherwise a(η*) is written back.

The SetGRPO paper's ablations are keyword switches of :func:`recover` (and of
``select_threshold`` / ``setgrpo``): ``reward_condition=False`` drops M_reward(η) > 0,
``recovery=False`` restricts η to {0, 1}, ``discard="matched-random"`` keeps as many
groups as the gate accepts, chosen at random, with their GRPO coefficients c.  A fixed
threshold in place of the calibrated one is a plain float ``tau``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from advcal._ggsr import (
    DISCARDS,
    FULL_METHOD,
    Ablation,
    ablation_iv,
    check_sets,
    coefficients_at,
    gram_blocks,
    run_recovery,
)
from advcal._validation import BACKENDS, check_choice, check_real
from advcal.sets import CoefficientSets

__all__ = ["DISCARDS", "Recovery", "recover"]


class Recovery(NamedTuple):
    """Per-group GGSR result (:func:`recover`).

    Attributes
    ----------
    coefficients : ndarray
        a(η*) for accepted groups, 0 for rejected ones: the coefficients to write back into
        the GRPO loss (layout and dtype of the rewards).
    eta : ndarray of float64, shape (B,)
        Recovery ratio η* (0 for rejected groups).
    accepted : ndarray of bool, shape (B,)
        Whether the recovery set is non-empty.
    anchors : ndarray
        Anchors a₀ (layout of the rewards); c for groups without an update of their own
        (fewer than two responses, or U(c) = 0), 0 when ρ is infinite.
    m_full, m_reward : ndarray of float64, shape (B,)
        The projections at η* (NaN where undefined: fewer than two responses, U(c) = 0,
        U(a₀) = 0, or infinite ρ).
    """

    coefficients: np.ndarray
    eta: np.ndarray
    accepted: np.ndarray
    anchors: np.ndarray
    m_full: np.ndarray
    m_reward: np.ndarray



def _recover_iv(sets: Any, gram: Any, tau: Any, backend: Any, reward_condition: Any = True,
                recovery: Any = True, discard: Any = "gate", seed: Any = None
                ) -> tuple[CoefficientSets, np.ndarray, float, Ablation]:
    sets = check_sets(sets)
    tau = check_real(tau, "tau", low=0.0, high=1.0, high_inclusive=False)
    check_choice(backend, "backend", BACKENDS)
    ablation = ablation_iv(reward_condition, recovery, discard, seed)
    return sets, gram_blocks(sets, gram), tau, ablation


def recover(
    sets: CoefficientSets,
    gram: ArrayLike,
    *,
    tau: float,
    reward_condition: bool = True,
    recovery: bool = True,
    discard: str = "gate",
    seed: Any = None,
    backend: str = "numba",
) -> Recovery:
    """Geometry-guided safe recovery (GGSR) of every group of a batch.

    Parameters
    ----------
    sets : CoefficientSets
        JRSC sets of the training batch (:func:`advcal.coefficient_sets`).
    gram : array_like
        Gram matrices K_q (K_ij = ⟨g_i, g_j⟩ of the responses' policy gradients, e.g. on a
        random projection): (B, G, G) for dense sets, flat row-major
        n_q × n_q blocks otherwise.  Must be finite, symmetric and PSD (tolerance 1e-8 ×
        the block's largest diagonal entry).
    tau : float
        Threshold τ ∈ [0, 1) on M_full.  A threshold chosen by hand rather than by
        :func:`advcal.select_threshold` is the paper's "fixed threshold" ablation.
    reward_condition : bool, default True
        False drops the reward-space condition M_reward(η) > 0 (ablation): η* =
        sup{η : M_full(η) ≥ τ}, so every group the full method accepts is accepted.
    recovery : bool, default True
        False drops recovery (ablation): η* is the largest feasible η in {0, 1} only
        (1 when c itself is feasible, else 0 when the anchor is, else rejected).
    discard : {"gate", "matched-random"}, default "gate"
        ``"matched-random"`` (ablation) keeps exactly as many groups as the gate accepts,
        drawn uniformly at random among the groups with an update of their own, with
        their GRPO coefficients c (η* = 1; ``m_full``, ``m_reward`` NaN).
    seed : int, SeedSequence or Generator, optional
        Randomness of ``discard="matched-random"`` (required there, refused otherwise).
    backend : {"numba", "numpy"}, default "numba"
        Compiled kernel or the numpy/scipy reference.

    Returns
    -------
    Recovery
        ``coefficients`` a(η*) to write back (0 for rejected groups), ``eta``,
        ``accepted``, ``anchors``, ``m_full``, ``m_reward``.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import calibrate_sets, coefficient_sets, recover
    >>> from advcal.simulate import gram_matrices, paired_scorings
    >>> cal = calibrate_sets(*paired_scorings(1000, 8, scale=0.01, seed=0).scores,
    ...                      alpha=0.1)
    >>> sets = coefficient_sets(paired_scorings(4, 8, scale=0.01, seed=1).a,
    ...                         calibration=cal)
    >>> rec = recover(sets, gram_matrices(4, 8, seed=2).gram, tau=0.2)
    >>> rec.coefficients.shape, rec.eta.shape
    ((4, 8), (4,))
    >>> bool(((rec.eta >= 0) & (rec.eta <= 1)).all())
    True
    """
    sets, gram_flat, tau, ablation = _recover_iv(sets, gram, tau, backend, reward_condition,
                                                 recovery, discard, seed)
    return recover_checked(sets, gram_flat, tau, backend, ablation)


def recover_checked(sets: CoefficientSets, gram_flat: np.ndarray, tau: float,
                    backend: str = "numba", ablation: Ablation = FULL_METHOD) -> Recovery:
    """:func:`advcal.recover` on validated arguments (``gram_flat`` from :func:`gram_blocks`)."""
    raw = run_recovery(sets, gram_flat, np.array([tau]), None, backend, ablation)
    coefficients = coefficients_at(sets, raw, 0)
    restore = sets.batch.restore
    return Recovery(
        restore(coefficients.astype(sets.dtype)),
        raw.eta[:, 0].copy(),
        raw.accepted[:, 0].copy(),
        restore(raw.anchors.astype(sets.dtype)),
        raw.m_full[:, 0].copy(),
        raw.m_reward[:, 0].copy(),
    )
