"""Numpy/scipy reference of GGSR recovery, the oracle of ``recovery_numba``, independent of
its numerics: the Gram check by ``eigvalsh``, the anchor by ``eigh`` of R K R and ``brentq``
on the secular equation, η* from the vectors a(η) by ``minimize_scalar`` and ``brentq``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq, minimize_scalar

from advcal._kernels import ggsr


def _gram_status(k: np.ndarray) -> tuple[int, float]:
    if not np.isfinite(k).all():
        return ggsr.NOT_FINITE, 0.0
    scale = max(float(np.max(np.diag(k))), 0.0)
    tol = ggsr.GRAM_RTOL * scale
    if np.max(np.abs(k - k.T)) > tol:
        return ggsr.NOT_SYMMETRIC, scale
    if np.linalg.eigvalsh(0.5 * (k + k.T))[0] < -tol:
        return ggsr.NOT_PSD, scale
    return ggsr.OK, scale


def _anchor(c: np.ndarray, r: np.ndarray, k: np.ndarray, rho: float) -> np.ndarray:
    if rho == 0.0:
        return c.copy()  # E = {c}
    h, v = np.linalg.eigh(r @ k @ r)
    g = r @ k @ c
    gamma = v.T @ g
    keep = h > 1e-12 * max(h[-1], 0.0)
    if not keep.any():
        return c.copy()
    hk, gk = h[keep], gamma[keep]
    inside = -(gk / hk)
    if np.linalg.norm(inside) <= rho:
        return c + r @ (v[:, keep] @ inside)

    def excess(mu: float) -> float:
        return float(np.linalg.norm(gk / (hk + mu)) - rho)

    mu = brentq(excess, 0.0, np.linalg.norm(gk) / rho, xtol=1e-300, rtol=1e-15, maxiter=500)
    return c + r @ (v[:, keep] @ (-(gk / (hk + mu))))


def _projections(a: np.ndarray, c: np.ndarray, r: np.ndarray, k: np.ndarray, rho: float
                 ) -> tuple[float, float, float, float]:
    """(full numerator, full denominator, reward numerator, reward denominator) at a."""
    ka = k @ a
    full_num = float(ka @ c - rho * np.linalg.norm(r @ ka))
    full_den = float(np.sqrt(max(a @ ka, 0.0)) * np.sqrt(c @ k @ c))
    reward_num = float(a @ c - rho * np.linalg.norm(r @ a))
    reward_den = float(np.linalg.norm(a) * np.linalg.norm(c))
    return full_num, full_den, reward_num, reward_den


def _eta_star(a0: np.ndarray, c: np.ndarray, r: np.ndarray, k: np.ndarray, rho: float,
              tau: float, reward_condition: bool = True, binary: bool = False) -> float:
    ckc = float(c @ k @ c)
    cc = float(c @ c)

    def margin(eta: float) -> tuple[float, float]:
        a = a0 + eta * (c - a0)
        full_num, _, reward_num, _ = _projections(a, c, r, k, rho)
        q = np.sqrt(max(float(a @ k @ a), 0.0))
        # Without the reward-space condition (ablation) only M_full constrains η.
        return (full_num - tau * np.sqrt(ckc) * q) / ckc, (
            reward_num / cc if reward_condition else np.inf)

    def feasible(eta: float) -> bool:
        f, g = margin(eta)
        return f >= 0 and g > 0

    if feasible(1.0):
        return 1.0
    if binary:  # no recovery (ablation): η ∈ {0, 1} only
        return 0.0 if feasible(0.0) else -1.0
    if feasible(0.0):
        start = 0.0
    else:
        best = minimize_scalar(lambda e: -min(margin(e)), bounds=(0.0, 1.0), method="bounded",
                               options={"xatol": 1e-12})
        if not feasible(float(best.x)):
            return -1.0
        start = float(best.x)

    def h(eta: float) -> float:
        f, g = margin(eta)
        return min(f, g)

    if h(1.0) == 0.0:
        return 1.0
    root = brentq(h, start, 1.0, xtol=1e-15, rtol=1e-15, maxiter=500)
    # brentq may land just past the boundary; step back onto the feasible side.
    while not feasible(root) and root > start:
        root = max(start, root - 1e-14)
    return float(root)


def recover_groups(centers, offsets, root, gram, boffsets, rho, taus, reference,
                   reward_condition=True, binary=False):
    """Reference of ``recovery_numba.recover_groups`` (same outputs)."""
    n_groups = offsets.size - 1
    n_taus = taus.size
    status, anchors, eta, accepted, m_full, m_reward, ref0, ref1 = ggsr.recovery_outputs(
        centers, n_groups, n_taus)
    for q in range(n_groups):
        lo, hi = int(offsets[q]), int(offsets[q + 1])
        n = hi - lo
        if n == 0:
            continue
        base = int(boffsets[q])
        k = gram[base:base + n * n].reshape(n, n)
        st, scale = _gram_status(k)
        status[q] = st
        if st != ggsr.OK or n < 2:
            continue
        r = root[base:base + n * n].reshape(n, n)
        c = centers[lo:hi]
        kref = k @ reference[lo:hi]
        ckc = float(c @ k @ c)
        cc = float(c @ c)
        if cc == 0.0 or not ckc > ggsr.ZERO_CENTER_RTOL * scale * cc:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            h = r @ k @ r
        if not np.isfinite(h).all():
            status[q] = ggsr.OVERFLOW
            continue
        a0 = _anchor(c, r, k, rho)
        anchors[lo:hi] = a0
        ref0[q] = a0 @ kref
        ref1[q] = (c - a0) @ kref
        aka = float(a0 @ k @ a0)
        if not (aka > ggsr.ZERO_UPDATE_RTOL * ckc
                and aka > ggsr.ZERO_CENTER_RTOL * scale * float(a0 @ a0)):
            continue
        for t in range(n_taus):
            e = _eta_star(a0, c, r, k, rho, float(taus[t]), reward_condition, binary)
            ok = e >= 0.0
            e = e if ok else 0.0
            accepted[q, t] = ok
            eta[q, t] = e
            full_num, full_den, reward_num, reward_den = map(np.float64, _projections(
                a0 + e * (c - a0), c, r, k, rho))
            # x / 0 is inf or NaN, as in the numba engine
            with np.errstate(divide="ignore", invalid="ignore"):
                m_full[q, t] = full_num / full_den
                m_reward[q, t] = reward_num / reward_den
    return status, anchors, eta, accepted, m_full, m_reward, ref0, ref1
