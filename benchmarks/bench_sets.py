"""SetGRPO: GGSR ``recover`` against a plain numpy implementation written here, and
``calibrate_sets`` on a million groups.

Targets (issue 5): ``recover`` at n = 16 within 10 us per group on one core;
``calibrate_sets`` on 10**6 groups of 16 under 2 s.  Every recover candidate processes
the same B groups, so the printed ratios are per-group ratios; divide the printed time by
B for the per-group time.  The recover case checks first that the numpy peer's η*,
decisions, anchors, coefficients and projections equal ``advcal.recover``'s (``check``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advcal import calibrate_sets, coefficient_sets, recover
from advcal._blocks import block_offsets
from advcal._ggsr import gram_blocks as _gram_blocks
from advcal._kernels import recovery_numba
from advcal.simulate import gram_matrices, paired_scorings
from benchmarks import Case, check_close

# GGSR's tolerances as docs/setgrpo.md states them (advcal/_kernels/ggsr.py holds them).
GRAM_RTOL = 1e-8  # symmetry and PSD of K, relative to its largest diagonal entry
ZERO_UPDATE_RTOL = 1e-12  # ‖U(a0)‖² at most this x ‖U(c)‖²: no safe direction
ZERO_CENTER_RTOL = 1e-14  # xᵀKx at most this x max diag(K) x ‖x‖²: U(x) is rounding noise
TERNARY, BISECTION = 100, 64  # iterations; (2/3)**100 and 2**-64 are below float64's ulp of 1


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("bi,bi->b", a, b)


def _mv(m: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.einsum("bij,bj->bi", m, v)


def numpy_recover(c: np.ndarray, r: np.ndarray, k: np.ndarray, rho: float, tau: float
                  ) -> tuple[np.ndarray, ...]:
    """GGSR (docs/setgrpo.md) on B dense groups of n, vectorized over the groups.

    ``c`` (B, n) the sets' centres, ``r`` (B, n, n) their S^{1/2}, ``k`` (B, n, n) the Gram
    matrices, ``rho`` the radius, ``tau`` the threshold.  Returns ``(eta, accepted,
    anchors, coefficients, m_full, m_reward)``, as :func:`advcal.recover`.
    """
    n_groups, n = c.shape
    kt = k.transpose(0, 2, 1)
    scale = np.maximum(np.diagonal(k, axis1=1, axis2=2).max(axis=1), 0.0)
    tol = GRAM_RTOL * scale
    if not (np.isfinite(k).all() and (np.abs(k - kt).max(axis=(1, 2)) <= tol).all()
            and (np.linalg.eigvalsh(0.5 * (k + kt))[:, 0] >= -tol).all()):
        raise ValueError("gram: a block is not symmetric PSD")  # advcal names the group
    kc = _mv(k, c)
    ckc, cc = _dot(c, kc), _dot(c, c)
    # A group whose own update U(c) vanishes keeps a0 = c and is rejected.
    live = (cc > 0) & (ckc > ZERO_CENTER_RTOL * scale * cc) & (n >= 2)

    # Anchor a0 = c + R z: min zᵀHz + 2gᵀz over ‖z‖ <= rho, H = RKR, g = RKc, solved in
    # H's eigenbasis (g lies in range(H): components outside it have gamma = 0).
    h, v = np.linalg.eigh(r @ k @ r)
    gamma = np.einsum("bji,bj->bi", v, _mv(r, kc))
    kept = h > 1e-12 * np.maximum(h[:, -1:], 0.0)
    gamma, h = np.where(kept, gamma, 0.0), np.where(kept, h, 1.0)
    mu = np.zeros(n_groups)  # inside the ball: the minimum-norm solution, mu = 0
    if rho > 0:
        # Outside, ‖z(mu)‖ = rho for z(mu) = -gamma / (h + mu): Newton on
        # 1/‖z(mu)‖ - 1/rho from mu = 0, concave and increasing, so the iterates rise
        # monotonically to the root.
        out = np.linalg.norm(gamma / h, axis=1) > rho
        g_out, h_out, m = gamma[out], h[out], mu[out]
        for _ in range(100):
            w = g_out / (h_out + m[:, None])
            norm = np.linalg.norm(w, axis=1)
            new = m - (1.0 / norm - 1.0 / rho) * norm ** 3 / _dot(w * w, 1.0 / (
                h_out + m[:, None]))
            if np.array_equal(new, m):
                break
            m = new
        mu[out] = m
        z = -gamma / (h + mu[:, None])
    else:
        z = np.zeros_like(c)  # E = {c}
    a0 = np.where(live[:, None], c + _mv(r, _mv(v, z)), c)
    ka0 = _mv(k, a0)
    aka = _dot(a0, ka0)
    viable = (live & (aka > ZERO_UPDATE_RTOL * ckc)
              & (aka > ZERO_CENTER_RTOL * scale * _dot(a0, a0)))

    # The path a(eta) = a0 + eta d, d = c - a0, and what its projections read.
    d, kd = c - a0, kc - ka0
    rka0, rkd, ra0, rd = _mv(r, ka0), _mv(r, kd), _mv(r, a0), _mv(r, d)
    sqrt_ckc = np.sqrt(np.maximum(ckc, 0.0))
    cc1, ckc1 = np.where(cc > 0, cc, 1.0), np.where(ckc > 0, ckc, 1.0)

    def projections(eta: np.ndarray) -> tuple[np.ndarray, ...]:
        """a(eta)ᵀKc - rho ‖RKa(eta)‖, ‖U(a(eta))‖, a(eta)ᵀc - rho ‖R a(eta)‖, a(eta)."""
        e = eta[:, None]
        a = a0 + e * d
        full = _dot(a, kc) - rho * np.linalg.norm(rka0 + e * rkd, axis=1)
        reward = _dot(a, c) - rho * np.linalg.norm(ra0 + e * rd, axis=1)
        return full, np.sqrt(np.maximum(_dot(a, ka0 + e * kd), 0.0)), reward, a

    def margins(eta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        full, norm, reward, _ = projections(eta)
        return (full - tau * sqrt_ckc * norm) / ckc1, reward / cc1

    def feasible(eta: np.ndarray) -> np.ndarray:
        f, g = margins(eta)
        return (f >= 0) & (g > 0)

    # eta* = sup{eta in [0, 1] : M_full >= tau, M_reward > 0}, an interval (concave
    # margins): 1 if feasible; else from a feasible start (0, else a point of the ternary
    # search for the maximum of the smaller margin), bisection keeps the feasible end.
    ones, start = np.ones(n_groups), np.zeros(n_groups)
    at_one, found = feasible(ones), feasible(start)
    lo, hi = start.copy(), ones.copy()
    for _ in range(TERNARY):
        if (found | at_one | ~viable).all():
            break
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        rising = np.minimum(*margins(m1)) < np.minimum(*margins(m2))
        for m in (m1, m2):
            new = ~found & feasible(m)
            start, found = np.where(new, m, start), found | new
        lo, hi = np.where(rising, m1, lo), np.where(rising, hi, m2)
    accepted = viable & (at_one | found)
    lo, hi = start, ones.copy()
    for _ in range(BISECTION if (accepted & ~at_one).any() else 0):
        mid = 0.5 * (lo + hi)
        ok = feasible(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    eta = np.where(accepted, np.where(at_one, 1.0, lo), 0.0)
    full, norm, reward, a = projections(eta)
    with np.errstate(divide="ignore", invalid="ignore"):  # undefined where not viable: NaN
        m_full = np.where(viable, full / (norm * sqrt_ckc), np.nan)
        m_reward = np.where(viable, reward / (np.linalg.norm(a, axis=1) * np.sqrt(cc)),
                            np.nan)
    return eta, accepted, a0, np.where(accepted[:, None], a, 0.0), m_full, m_reward


def check_recover(peer: tuple[np.ndarray, ...], ours: Any) -> str:
    """The peer against ``advcal.recover``: the same decisions exactly, and every value
    within 1e-9 of quantities of order 1.  Both locate η* to about 1e-13 and solve the
    anchor's secular equation by other factorizations (eigh against advcal's Cholesky
    iterates), so they differ by rounding, far below a difference in what is computed."""
    eta, accepted, anchors, coefficients, m_full, m_reward = peer
    np.testing.assert_array_equal(accepted, ours.accepted,
                                  err_msg="the peer accepts other groups than advcal")
    why = "rounding of two factorizations; decisions equal exactly"
    for what, a, b in (("eta", eta, ours.eta), ("anchors", anchors, ours.anchors),
                       ("coefficients", coefficients, ours.coefficients),
                       ("m_full", m_full, ours.m_full), ("m_reward", m_reward, ours.m_reward)):
        check_close(f"numpy peer {what} = advcal.recover's", a, b, atol=1e-9, why=why)
    return (f"checked before timing: the numpy peer's accepted = advcal.recover's exactly "
            f"({int(accepted.sum())} of {accepted.size} accepted, "
            f"{int((eta == 1).sum())} at eta* = 1); its eta*, anchors, coefficients, "
            f"m_full and m_reward within atol 1e-09 ({why})")


def _recover_case(n: int, n_groups: int) -> Case:
    cal_pair = paired_scorings(2000, n, scale=0.02, seed=0)
    cal = calibrate_sets(cal_pair.a, cal_pair.b, alpha=0.1)
    sets = coefficient_sets(paired_scorings(n_groups, n, scale=0.02, seed=1).a,
                            calibration=cal)
    gram = gram_matrices(n_groups, n, seed=2).gram
    flat = _gram_blocks(sets, gram)
    geo = sets.geometry
    root = geo.root_blocks()
    boffsets = block_offsets(sets.batch.sizes)
    taus = np.array([0.25])
    ref = np.zeros_like(geo.centers)
    args = (geo.centers, sets.offsets, root, flat, boffsets, float(sets.rho), taus, ref)
    # The peer gets the same precomputed S^{1/2} blocks as the kernel.
    dense = (geo.centers.reshape(n_groups, n), root.reshape(n_groups, n, n), gram,
             float(sets.rho), 0.25)
    return Case(
        f"recover, {n_groups} groups of {n} (tau = 0.25)",
        {
            "numpy peer (vectorized over groups)": lambda: numpy_recover(*dense),
            "numba kernel, one core": lambda: recovery_numba.recover_groups(
                *args, threaded=False),
            "numba kernel, all cores": lambda: recovery_numba.recover_groups(
                *args, threaded=True),
            "advcal.recover public call": lambda: recover(sets, gram, tau=0.25),
        },
        baseline="numpy peer (vectorized over groups)",
        target="one core <= 10 us/group at n = 16",
        notes=[f"per group = printed time / {n_groups}"],
        check=lambda: check_recover(numpy_recover(*dense), recover(sets, gram, tau=0.25)),
    )


def _calibrate_case(n_groups: int) -> Case:
    pair = paired_scorings(n_groups, 16, scale=0.02, seed=3)
    a, b = pair.a, pair.b
    return Case(
        f"calibrate_sets, {n_groups} groups of 16",
        {
            "memory copy of both scorings": lambda: (a.copy(), b.copy()),
            "calibrate_sets (joint)": lambda: calibrate_sets(a, b, alpha=0.1),
            "calibrate_sets (isotropic)": lambda: calibrate_sets(a, b, alpha=0.1,
                                                                 shape="isotropic"),
        },
        baseline="memory copy of both scorings",
        target="joint < 2 s at 10**6 groups",
    )


def cases(quick: bool) -> list[Case]:
    n_groups = 32 if quick else 256
    out = [_recover_case(n, n_groups) for n in (8, 16, 32)]
    out.append(_calibrate_case(10_000 if quick else 1_000_000))
    return out
