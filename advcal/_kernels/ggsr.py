"""GGSR status codes and tolerances, shared by both recovery engines and ``advcal.recovery``
(kept here so that the kernel cache, keyed on the engines' sources, sees them change)."""

from __future__ import annotations

import numpy as np

# Status codes per group.
OK = 0
NOT_SYMMETRIC = 1
NOT_PSD = 2
NOT_FINITE = 3
OVERFLOW = 4  # R K R overflows float64 (huge sets)

GRAM_RTOL = 1e-8  # symmetry and PSD tolerance, relative to max diag(K)
ZERO_UPDATE_RTOL = 1e-12  # ‖U(a0)‖² ≤ this × ‖U(c)‖²: no safe direction
# xᵀKx ≤ this × max diag(K) × ‖x‖², for x = c: GRPO's own update vanishes; for x = a0: no
# safe direction either (below it, xᵀKx is rounding noise, and may even come out negative).
ZERO_CENTER_RTOL = 1e-14


def recovery_outputs(centers, n_groups, n_taus):
    """The outputs of ``recover_groups`` before any group is processed (both engines):
    status OK, anchors = centers, η* = 0 and rejected, projections NaN, ref0 = ref1 = 0."""
    return (np.zeros(n_groups, dtype=np.int8), centers.copy(), np.zeros((n_groups, n_taus)),
            np.zeros((n_groups, n_taus), dtype=np.bool_),
            np.full((n_groups, n_taus), np.nan), np.full((n_groups, n_taus), np.nan),
            np.zeros(n_groups), np.zeros(n_groups))
