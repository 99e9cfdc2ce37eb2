"""Numpy reference engine for the interval advantages, the oracle of ``ranges_numba``: per
group, the n×n matrix of pairwise relations φ(I_i, I_j), its rows averaged (O(n²), checked
by eye, not fast).  Inputs are validated float64 ranges in CSR layout.
"""

from __future__ import annotations

import numpy as np

from advcal._kernels.oracle_groups import groups


def dominance_matrix(lo, hi):
    """φ_ij = (l_i - h_j)+ - (l_j - h_i)+ for one group."""
    ahead = np.maximum(lo[:, None] - hi[None, :], 0.0)
    return ahead - ahead.T


def midpoint_matrix(lo, hi):
    mid = 0.5 * (lo + hi)
    return mid[:, None] - mid[None, :]


def sum_cdf(t, w1, w2):
    """P(U1 + U2 <= t) for independent U1 ~ U[0, w1], U2 ~ U[0, w2], max(w1, w2) > 0.

    Piecewise in the order small/big width, so no branch divides by a zero width and
    nothing cancels (the four-ramp formula loses digits when one width is tiny).
    """
    t, w1, w2 = np.broadcast_arrays(t, w1, w2)
    small = np.minimum(w1, w2)
    big = np.maximum(w1, w2)
    with np.errstate(all="ignore"):  # branches np.where discards
        # (t/small)(t/big): the ratios are at most 1, where small·big could underflow to 0
        rising = (t / small) * (t / big) / 2.0
        flat = (t - 0.5 * small) / big
        rest = small + big - t
        falling = 1.0 - (rest / small) * (rest / big) / 2.0
    out = np.where(t < small, rising, np.where(t <= big, flat, falling))
    out = np.where(t <= 0.0, 0.0, out)
    return np.where(t >= small + big, 1.0, out)


def sign_expectation(li, hi_, lj, hj):
    """E[sign(R_i - R_j)] = P(R_i > R_j) - P(R_j > R_i), R uniform on its range.

    A degenerate range is a point mass; two points compare by sign.
    """
    wi = hi_ - li
    wj = hj - lj
    both_points = (wi == 0.0) & (wj == 0.0)
    # R_i - R_j = (l_i - h_j) + U_i + U_j: negative iff U_i + U_j < h_j - l_i.
    cdf = sum_cdf(hj - li, wi, np.where(both_points, 1.0, wj))
    return np.where(both_points, np.sign(li - lj), 1.0 - 2.0 * cdf)


def probabilistic_matrix(lo, hi):
    mid = 0.5 * (lo + hi)
    d = sign_expectation(lo[:, None], hi[:, None], lo[None, :], hi[None, :])
    return (mid[:, None] - mid[None, :]) * np.abs(d)


_MATRICES = {0: dominance_matrix, 1: midpoint_matrix, 2: probabilistic_matrix}


@np.errstate(over="ignore", invalid="ignore")  # an overflow gives inf: the wrapper raises
def range_advantages(lo, hi, offsets, relation):
    """A_i = (1/n) Σ_j φ(I_i, I_j) per group; ``relation`` 0/1/2 = dominance/midpoint/prob."""
    out = np.zeros(lo.size)
    matrix = _MATRICES[relation]
    for _, sl, _, lo_g in groups(lo, offsets):
        if lo_g.size == 0:
            continue
        # Shift by a member of the group: constant groups give exact zeros and a
        # translation of the rewards leaves the differences unchanged.
        ref = lo_g[0]
        out[sl] = matrix(lo_g - ref, hi[sl] - ref).sum(axis=1) / lo_g.size
    return out
