"""Numba kernel of GGSR recovery; oracle: ``recovery_numpy``.

Per group: check the Gram block, solve the anchor's trust-region subproblem on H = R K R
by Newton's method on the secular equation with a Cholesky factor of H + μI per step, then
find η* for every threshold from quadratics in η precomputed in O(n²) (each feasibility
test O(1)).  ``root`` and ``gram`` hold one row-major n_q × n_q block per group at
``boffsets`` (validated upstream).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from advcal._kernels import ggsr
from advcal._kernels.modes import FASTMATH
from advcal._kernels.pool import compile_serial, run_over_groups
from advcal._numba_cache import cached_njit

_FASTMATH = set(FASTMATH)
ETA_TOL = 1e-13  # absolute accuracy of η*
# Groups from which ``recover_groups`` runs chunks on threads: the pool's own rule counts
# rewards costing nanoseconds each, but a group costs microseconds.
PARALLEL_MIN_GROUPS = 2048


@cached_njit(fastmath=_FASTMATH)
def _cholesky(a, n, shift, low):
    """The lower Cholesky factor L of a + shift·I (from a's lower triangle) into ``low``,
    with 1 / L_jj on the diagonal; False if that matrix is not positive definite.  Column
    by column: a column's entries are independent of one another, so they overlap."""
    for j in range(n):
        s = a[j, j] + shift
        for p in range(j):
            s -= low[j, p] * low[j, p]
        if not s > 0.0:
            return False
        inv = 1.0 / math.sqrt(s)
        low[j, j] = inv
        for i in range(j + 1, n):
            t = a[i, j]
            for p in range(j):
                t -= low[i, p] * low[j, p]
            low[i, j] = t * inv
    return True


@cached_njit(fastmath=_FASTMATH)
def _check_gram(kmat, n, work):
    """Status of one Gram block: finite, symmetric and PSD within GRAM_RTOL·max diag."""
    scale = 0.0
    for i in range(n):
        for j in range(n):
            if not math.isfinite(kmat[i, j]):
                return ggsr.NOT_FINITE, 0.0
        scale = max(scale, kmat[i, i])
    tol = ggsr.GRAM_RTOL * scale
    for i in range(n):
        for j in range(i + 1, n):
            if abs(kmat[i, j] - kmat[j, i]) > tol:
                return ggsr.NOT_SYMMETRIC, scale
    # PSD within tolerance: K + tol·I must have a Cholesky factor.
    if not _cholesky(kmat, n, tol + 1e-300, work):
        return ggsr.NOT_PSD, scale
    return ggsr.OK, scale


@cached_njit(fastmath=_FASTMATH)
def _matvec(m, n, x, out):
    for i in range(n):
        s = 0.0
        for j in range(n):
            s += m[i, j] * x[j]
        out[i] = s


@cached_njit(fastmath=_FASTMATH)
def _dot(x, y, n):
    s = 0.0
    for i in range(n):
        s += x[i] * y[i]
    return s


@cached_njit(fastmath=_FASTMATH)
def _forward(low, n, b, out):
    """out = L⁻¹b for the factor of ``_cholesky``."""
    for i in range(n):
        s = b[i]
        for p in range(i):
            s -= low[i, p] * out[p]
        out[i] = s * low[i, i]


@cached_njit(fastmath=_FASTMATH)
def _shifted_solve(h, n, mu, rhs, y, w, low):
    """y = (H + μI)⁻¹rhs and w = L⁻¹y for its Cholesky factor L (so that
    ‖w‖² = yᵀ(H + μI)⁻¹y); False if H + μI is not positive definite."""
    if not _cholesky(h, n, mu, low):
        return False
    _forward(low, n, rhs, w)
    for i in range(n - 1, -1, -1):  # y = L⁻ᵀw
        s = w[i]
        for p in range(i + 1, n):
            s -= low[p, i] * y[p]
        y[i] = s * low[i, i]
    _forward(low, n, y, w)
    return True


@cached_njit(fastmath=_FASTMATH)
def _secular(h, n, g, rho, trace, y, w, low):
    """y = (H + μI)⁻¹g with ‖y‖ = ρ, by Newton on 1/‖y(μ)‖ − 1/ρ (concave:
    iterates from the left stay left of the root) safeguarded by bisection.  True instead
    when ‖y‖ ≤ ρ at a rounding-level μ: the caller takes the minimum-norm y itself."""
    gnorm = math.sqrt(_dot(g, g, n))
    if gnorm == 0.0 or rho == 0.0:  # E = {c} when ρ = 0
        for i in range(n):
            y[i] = 0.0
        return False
    mu_lo = 1e-13 * trace / n + 1e-300
    while not _shifted_solve(h, n, mu_lo, g, y, w, low) and mu_lo < 1e300:
        mu_lo *= 10.0  # rounding made H slightly indefinite: shift more
    ynorm = math.sqrt(_dot(y, y, n))
    if ynorm <= rho:
        return True
    mu_hi = gnorm / rho
    mu = mu_lo
    for _ in range(100):
        wnorm2 = _dot(w, w, n)
        step = (ynorm * ynorm / wnorm2) * (ynorm - rho) / rho
        mu_new = mu + step
        if not (mu_new > mu_lo and mu_new < mu_hi):
            mu_new = 0.5 * (mu_lo + mu_hi)
        mu = mu_new
        _shifted_solve(h, n, mu, g, y, w, low)
        ynorm = math.sqrt(_dot(y, y, n))
        if ynorm > rho:
            mu_lo = mu
        else:
            mu_hi = mu
        if abs(ynorm - rho) <= 1e-12 * rho or mu_hi - mu_lo <= 1e-15 * mu_hi:
            break
    if ynorm > rho * (1.0 + 1e-12):
        # The bracket closed with y outside the set (‖y(μ)‖ too steep for μ's floats): take
        # the solution at its other end, inside.  Scaling y back instead would break
        # (H + μI)y = g, on which the anchor's direction safety rests.
        _shifted_solve(h, n, mu_hi, g, y, w, low)
    return False


@cached_njit(fastmath=_FASTMATH)
def _rkr(kmat, rmat, kr, hmat):
    """hmat = R K R (BLAS on contiguous views; only its lower triangle is read); returns
    its trace."""
    np.dot(kmat, rmat, kr)
    np.dot(rmat, kr, hmat)
    return np.trace(hmat)


@cached_njit(fastmath=_FASTMATH)
def _min_norm_solution(hmat, g, n, z):
    """z = H⁺g (eigenvalues below 1e-12·max are null): the anchor's minimum-norm step when
    the unconstrained minimum lies inside the ball."""
    evals, evecs = np.linalg.eigh(hmat)
    cut = 1e-12 * max(evals[n - 1], 0.0)
    # Loops and np.dot into an output (what @ runs) instead of np.where, @ and z[:n] = ...:
    # the same arithmetic, without the broadcasting code that doubled recover's compile.
    inverse = np.empty(n)
    for i in range(n):
        inverse[i] = 1.0 / evals[i] if evals[i] > cut else 0.0
    proj = np.empty(n)
    np.dot(evecs.T, g[:n], proj)
    for i in range(n):
        proj[i] = inverse[i] * proj[i]
    out = np.empty(n)
    np.dot(evecs, proj, out)
    for i in range(n):
        z[i] = out[i]


@njit(inline="always")
def _sqrt0(x):
    return math.sqrt(x) if x > 0.0 else 0.0


@njit(inline="always")
def _quad(coef, i, eta):
    """The quadratic ``coef[i] + 2 coef[i+1] η + coef[i+2] η²`` of the recovery path."""
    return coef[i] + eta * (2.0 * coef[i + 1] + eta * coef[i + 2])


@cached_njit(fastmath=_FASTMATH)
def _margin(eta, coef, rho, tau, kappa, cnorm2, use_reward):
    """(min of the scaled full and reward margins, feasible) at η from the precomputed
    polynomials; the reward margin is +inf when its condition is dropped (ablation)."""
    a = coef[0] + eta * coef[1]
    full = (a - rho * _sqrt0(_quad(coef, 5, eta)) - tau * kappa * _sqrt0(_quad(coef, 2, eta))
            ) / (kappa * kappa)
    ar = coef[8] + eta * coef[9]
    reward = (ar - rho * _sqrt0(_quad(coef, 10, eta))) / cnorm2 if use_reward else math.inf
    return min(full, reward), full >= 0.0 and reward > 0.0


@cached_njit(fastmath=_FASTMATH)
def _eta_star(coef, rho, tau, kappa, cnorm2, use_reward, binary):
    """sup{η ∈ [0, 1]: full(η) ≥ 0, reward(η) > 0}, or −1 if empty (both margins concave).

    ``binary`` (the no-recovery ablation) takes the sup over η ∈ {0, 1} only."""
    if _margin(1.0, coef, rho, tau, kappa, cnorm2, use_reward)[1]:
        return 1.0
    lo = 0.0 if _margin(0.0, coef, rho, tau, kappa, cnorm2, use_reward)[1] else -1.0
    if binary:
        return lo
    if lo < 0.0:
        # Ternary search for the maximum of the concave min(full, reward), stopped at the
        # first feasible point.
        a, b = 0.0, 1.0
        while lo < 0.0 and b - a > ETA_TOL:
            x1, x2 = a + (b - a) / 3.0, b - (b - a) / 3.0
            h1, ok1 = _margin(x1, coef, rho, tau, kappa, cnorm2, use_reward)
            h2, ok2 = _margin(x2, coef, rho, tau, kappa, cnorm2, use_reward)
            lo = x2 if ok2 else x1 if ok1 else -1.0
            if h1 < h2:
                a = x1
            else:
                b = x2
        if lo < 0.0:
            return -1.0
    hi = 1.0
    while hi - lo > ETA_TOL:
        mid = 0.5 * (lo + hi)
        if _margin(mid, coef, rho, tau, kappa, cnorm2, use_reward)[1]:
            lo = mid
        else:
            hi = mid
    return lo


def _recover(offsets, boffsets, status, eta, accepted, m_full, m_reward, ref0, ref1,
             centers, root, gram, rho, taus, reference, anchors, use_reward, binary):
    """GGSR for the groups of ``offsets``: fills row q of the per-group outputs and the
    anchor's positions of ``anchors``; nothing read or written depends on other groups."""
    width = 0
    for q in range(offsets.size - 1):
        width = max(width, offsets[q + 1] - offsets[q])
    # Scratch sized for the widest group of this chunk; every group writes the entries it
    # reads before reading them, so no value carries over from one group to the next.
    scratch_a = np.empty(width * width)
    scratch_b = np.empty(width * width)
    low = np.empty((width, width))
    vecs = np.empty((11, width))
    coef = np.empty(16)
    n_taus = taus.size
    for q in range(offsets.size - 1):
        lo_idx = offsets[q]
        n = offsets[q + 1] - lo_idx
        base = boffsets[q]
        if n == 0:
            continue
        kmat = gram[base:base + n * n].reshape(n, n)
        rmat = root[base:base + n * n].reshape(n, n)
        st, scale = _check_gram(kmat, n, low)
        status[q] = st
        if st != ggsr.OK or n < 2:
            continue
        c = centers[lo_idx:lo_idx + n]
        # (indexed, not unpacked: unpacked rows lose their contiguity, and the sums' order)
        kc, g, a0, d = vecs[0], vecs[1], vecs[2], vecs[3]
        ka0, kd, v0, vd = vecs[4], vecs[5], vecs[6], vecs[7]
        ref, y, w = vecs[8], vecs[9], vecs[10]
        _matvec(kmat, n, c, kc)
        ckc = _dot(c, kc, n)
        cnorm2 = _dot(c, c, n)
        _matvec(kmat, n, reference[lo_idx:lo_idx + n], ref)
        if cnorm2 == 0.0 or not ckc > ggsr.ZERO_CENTER_RTOL * scale * cnorm2:
            continue
        kappa = math.sqrt(ckc)
        kr = scratch_a[:n * n].reshape(n, n)
        hmat = scratch_b[:n * n].reshape(n, n)
        trace = _rkr(kmat, rmat, kr, hmat)
        _matvec(rmat, n, kc, g)
        if not (math.isfinite(trace) and math.isfinite(_dot(g, g, n))):
            status[q] = ggsr.OVERFLOW
            continue
        # The anchor a0 = c − R y for the step y = (H + μI)⁻¹g of the trust region.
        if _secular(hmat, n, g, rho, trace, y, w, low):
            _min_norm_solution(hmat, g, n, y)
        _matvec(rmat, n, y, a0)
        for i in range(n):
            a0[i] = c[i] - a0[i]
            d[i] = c[i] - a0[i]
            anchors[lo_idx + i] = a0[i]
        _matvec(kmat, n, a0, ka0)
        for i in range(n):
            kd[i] = kc[i] - ka0[i]
        ref0[q] = _dot(a0, ref, n)
        ref1[q] = _dot(d, ref, n)
        coef[2] = _dot(a0, ka0, n)
        coef[13] = _dot(a0, a0, n)
        if not (coef[2] > ggsr.ZERO_UPDATE_RTOL * ckc
                and coef[2] > ggsr.ZERO_CENTER_RTOL * scale * coef[13]):
            continue  # ‖U(a0)‖ = 0: no safe direction
        coef[0] = _dot(a0, kc, n)
        coef[1] = _dot(d, kc, n)
        coef[3] = _dot(a0, kd, n)
        coef[4] = _dot(d, kd, n)
        _matvec(rmat, n, ka0, v0)
        _matvec(rmat, n, kd, vd)
        coef[5] = _dot(v0, v0, n)
        coef[6] = _dot(v0, vd, n)
        coef[7] = _dot(vd, vd, n)
        coef[8] = _dot(a0, c, n)
        coef[9] = _dot(d, c, n)
        _matvec(rmat, n, a0, v0)
        _matvec(rmat, n, d, vd)
        coef[10] = _dot(v0, v0, n)
        coef[11] = _dot(v0, vd, n)
        coef[12] = _dot(vd, vd, n)
        coef[14] = _dot(a0, d, n)
        coef[15] = _dot(d, d, n)
        cnorm = math.sqrt(cnorm2)
        for t in range(n_taus):
            e = _eta_star(coef, rho, taus[t], kappa, cnorm2, use_reward, binary)
            ok = e >= 0.0
            e = e if ok else 0.0
            accepted[q, t] = ok
            eta[q, t] = e
            a = coef[0] + e * coef[1]
            m_full[q, t] = (a - rho * _sqrt0(_quad(coef, 5, e))) / (
                _sqrt0(_quad(coef, 2, e)) * kappa)
            ar = coef[8] + e * coef[9]
            m_reward[q, t] = (ar - rho * _sqrt0(_quad(coef, 10, e))) / (
                _sqrt0(_quad(coef, 13, e)) * cnorm)


_recover_kernel = compile_serial(_recover, FASTMATH)


def recover_groups(centers, offsets, root, gram, boffsets, rho, taus, reference,
                   threaded=None, reward_condition=True, binary=False):
    """GGSR for every group and threshold: ``(status, anchors, eta, accepted, m_full,
    m_reward, ref0, ref1)``, with η* = 0 when rejected and aᵀK·reference = ref0 + η ref1.
    ``threaded`` None threads from PARALLEL_MIN_GROUPS groups; ``reward_condition=False``
    and ``binary=True`` are the SetGRPO ablations."""
    n_groups = offsets.size - 1
    status, anchors, eta, accepted, m_full, m_reward, ref0, ref1 = ggsr.recovery_outputs(
        centers, n_groups, taus.size)
    if threaded is None:
        threaded = n_groups >= PARALLEL_MIN_GROUPS
    run_over_groups(_recover_kernel, offsets,
                    (boffsets, status, eta, accepted, m_full, m_reward, ref0, ref1),
                    centers, root, gram, rho, taus, reference, anchors, bool(reward_condition),
                    bool(binary), threaded=threaded)
    return status, anchors, eta, accepted, m_full, m_reward, ref0, ref1
