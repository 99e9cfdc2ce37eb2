"""Numba kernel of GGSR recovery; oracle: ``recovery_numpy``.

Per group: check the Gram block, solve the anchor's trust-region subproblem on H = R K R
reduced once to tridiagonal form (each secular step O(n)), then find η* for every threshold
from quadratics in η precomputed in O(n²) (each feasibility test O(1)).  ``root`` and
``gram`` hold one row-major n_q × n_q block per group at ``boffsets`` (validated upstream).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from advcal._kernels.ggsr import (
    GRAM_RTOL,
    NOT_FINITE,
    NOT_PSD,
    NOT_SYMMETRIC,
    OK,
    OVERFLOW,
    ZERO_CENTER_RTOL,
    ZERO_UPDATE_RTOL,
    recovery_outputs,
)
from advcal._kernels.modes import FASTMATH
from advcal._kernels.pool import compile_serial, run_over_groups
from advcal._numba_cache import cached_njit

_FASTMATH = set(FASTMATH)
ETA_TOL = 1e-13  # absolute accuracy of η*
GOLDEN = 0.6180339887498949
# Groups from which ``recover_groups`` runs chunks on threads: the pool's own rule counts
# rewards costing nanoseconds each, but a group costs microseconds.
PARALLEL_MIN_GROUPS = 2048


@cached_njit(fastmath=_FASTMATH)
def _check_gram(k, base, n, work):
    """Status of one Gram block: finite, symmetric and PSD within GRAM_RTOL·max diag."""
    scale = 0.0
    for i in range(n):
        for j in range(n):
            if not math.isfinite(k[base + i * n + j]):
                return NOT_FINITE, 0.0
        scale = max(scale, k[base + i * n + i])
    tol = GRAM_RTOL * scale
    for i in range(n):
        for j in range(i + 1, n):
            if abs(k[base + i * n + j] - k[base + j * n + i]) > tol:
                return NOT_SYMMETRIC, scale
    # PSD within tolerance: K + tol·I must have a Cholesky factor.
    for i in range(n):
        for j in range(i + 1):
            s = k[base + i * n + j] + (tol + 1e-300 if i == j else 0.0)
            for p in range(j):
                s -= work[i, p] * work[j, p]
            if i == j and s <= 0.0:
                return NOT_PSD, scale
            work[i, j] = math.sqrt(s) if i == j else s / work[j, j]
    return OK, scale


@cached_njit(fastmath=_FASTMATH)
def _matvec(m, base, n, x, out):
    for i in range(n):
        s = 0.0
        row = base + i * n
        for j in range(n):
            s += m[row + j] * x[j]
        out[i] = s


@cached_njit(fastmath=_FASTMATH)
def _dot(x, y, n):
    s = 0.0
    for i in range(n):
        s += x[i] * y[i]
    return s


@cached_njit(fastmath=_FASTMATH)
def _tridiagonalize(h, n, vs, diag, off, p):
    """Householder reduction of the symmetric h (lower triangle, overwritten) to the
    tridiagonal (diag, off); row k of ``vs`` holds step k's unit vector (entries k+1..).
    Each step is the rank-2 update A <- A − v qᵀ − q vᵀ, q = 2p − 2(vᵀp)v, p = A v."""
    for k in range(n - 2):
        m0 = k + 1
        norm2 = 0.0
        for i in range(m0, n):
            norm2 += h[i, k] * h[i, k]
        if norm2 == 0.0:
            for i in range(m0, n):
                vs[k, i] = 0.0
            off[k] = 0.0
            continue
        x0 = h[m0, k]
        norm = math.sqrt(norm2)
        alpha = -norm if x0 >= 0 else norm
        # ‖x − αe₁‖² = 2‖x‖² + 2|x₀|‖x‖ > 0 (α has the opposite sign of x₀).
        inv = 1.0 / math.sqrt(2.0 * norm2 + 2.0 * abs(x0) * norm)
        vs[k, m0] = (x0 - alpha) * inv
        for i in range(m0 + 1, n):
            vs[k, i] = h[i, k] * inv
        off[k] = alpha
        # p = A v from the lower triangle: row i contributes A[i, :i]·v[:i] + A[i, i]v[i]
        # to p[i] and A[i, j]·v[i] to p[j] for j < i.
        for i in range(m0, n):
            p[i] = 0.0
        for i in range(m0, n):
            vi = vs[k, i]
            s = h[i, i] * vi
            for j in range(m0, i):
                s += h[i, j] * vs[k, j]
                p[j] += h[i, j] * vi
            p[i] += s
        vtp = 0.0
        for i in range(m0, n):
            vtp += vs[k, i] * p[i]
        for i in range(m0, n):
            p[i] = 2.0 * p[i] - 2.0 * vtp * vs[k, i]
        for i in range(m0, n):
            vi = vs[k, i]
            pi = p[i]
            for j in range(m0, i + 1):
                h[i, j] -= vi * p[j] + pi * vs[k, j]
    for i in range(n):
        diag[i] = h[i, i]
    if n >= 2:
        off[n - 2] = h[n - 1, n - 2]


@cached_njit(fastmath=_FASTMATH)
def _apply_reflectors(vs, n, x, transpose):
    """x <- Qᵀx (``transpose``) or Qx with Q = H_0 H_1 ... H_{n-3}."""
    steps = n - 2
    for t in range(steps):
        k = t if transpose else steps - 1 - t
        s = 0.0
        for i in range(k + 1, n):
            s += vs[k, i] * x[i]
        if s != 0.0:
            for i in range(k + 1, n):
                x[i] -= 2.0 * s * vs[k, i]


@cached_njit(fastmath=_FASTMATH)
def _tri_solve(diag, off, n, mu, rhs, y, w, lo, ld):
    """Solve (T + μI) y = rhs by a tridiagonal LDLᵀ (``lo``: L's subdiagonal, ``ld``: 1/D),
    with w = L_c⁻¹ y for the Cholesky factor L_c = L D^{1/2}.  False if not PD."""
    for i in range(n):
        d = diag[i] + mu
        if i > 0:
            d -= lo[i - 1] * off[i - 1]
        if not d > 0.0:
            return False
        ld[i] = 1.0 / d
        if i < n - 1:
            lo[i] = off[i] * ld[i]
    # L D Lᵀ y = rhs: forward (unit L), scale by D⁻¹, backward.
    prev = 0.0
    for i in range(n):
        prev = rhs[i] - (lo[i - 1] * prev if i > 0 else 0.0)
        w[i] = prev * ld[i]
    prev = 0.0
    for i in range(n - 1, -1, -1):
        prev = w[i] - (lo[i] * prev if i < n - 1 else 0.0)
        y[i] = prev
    # yᵀ(T + μI)⁻¹y = ‖D^{-1/2} L⁻¹ y‖²: w_i = (L⁻¹y)_i · sqrt(D⁻¹_i).
    prev = 0.0
    for i in range(n):
        prev = y[i] - (lo[i - 1] * prev if i > 0 else 0.0)
        w[i] = prev * math.sqrt(ld[i])
    return True


@cached_njit(fastmath=_FASTMATH)
def _secular(diag, off, n, rhs, rho, y, w, lo, ld, trace):
    """y = −(T + μI)⁻¹ g̃ (``rhs`` = −g̃) with ‖y‖ = ρ, by Newton on 1/‖y(μ)‖ − 1/ρ (concave:
    iterates from the left stay left of the root) safeguarded by bisection.  True instead
    when ‖y‖ ≤ ρ at a rounding-level μ: the caller takes the minimum-norm z itself."""
    gnorm = math.sqrt(_dot(rhs, rhs, n))
    if gnorm == 0.0 or rho == 0.0:  # E = {c} when ρ = 0
        for i in range(n):
            y[i] = 0.0
        return False
    mu_lo = 1e-13 * trace / n + 1e-300
    ok = _tri_solve(diag, off, n, mu_lo, rhs, y, w, lo, ld)
    while not ok and mu_lo < 1e300:  # rounding made T slightly indefinite: shift more
        mu_lo *= 10.0
        ok = _tri_solve(diag, off, n, mu_lo, rhs, y, w, lo, ld)
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
        _tri_solve(diag, off, n, mu, rhs, y, w, lo, ld)
        ynorm = math.sqrt(_dot(y, y, n))
        if ynorm > rho:
            mu_lo = mu
        else:
            mu_hi = mu
        if abs(ynorm - rho) <= 1e-12 * rho or mu_hi - mu_lo <= 1e-15 * mu_hi:
            break
    return False


@cached_njit(fastmath=_FASTMATH)
def _rkr(kmat, rmat, kr, hmat, n):
    """hmat = R K R, symmetrized (BLAS on contiguous views); returns its trace."""
    np.dot(kmat, rmat, kr)
    np.dot(rmat, kr, hmat)
    trace = 0.0
    for i in range(n):
        for j in range(i + 1, n):
            sym = 0.5 * (hmat[i, j] + hmat[j, i])
            hmat[i, j] = sym
            hmat[j, i] = sym
        trace += hmat[i, i]
    return trace


@cached_njit(fastmath=_FASTMATH)
def _min_norm_solution(kmat, rmat, kr, hmat, g, n, z):
    """z = −H⁺g (H rebuilt; eigenvalues below 1e-12·max are null): the anchor's
    minimum-norm z when the unconstrained minimum lies inside the ball."""
    _rkr(kmat, rmat, kr, hmat, n)
    evals, evecs = np.linalg.eigh(hmat)
    cutoff = 1e-12 * max(evals[n - 1], 0.0)
    for i in range(n):
        z[i] = 0.0
    for j in range(n):
        if evals[j] > cutoff:
            proj = 0.0
            for i in range(n):
                proj += evecs[i, j] * g[i]
            coef = -proj / evals[j]
            for i in range(n):
                z[i] += coef * evecs[i, j]


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
        # Golden-section ascent of the concave min(full, reward) until a feasible point.
        a, b, x1, x2 = 0.0, 1.0, 1.0 - GOLDEN, GOLDEN
        h1, ok1 = _margin(x1, coef, rho, tau, kappa, cnorm2, use_reward)
        h2, ok2 = _margin(x2, coef, rho, tau, kappa, cnorm2, use_reward)
        lo = x1 if ok1 else x2 if ok2 else -1.0
        while lo < 0.0 and b - a > ETA_TOL:
            if h1 < h2:
                a, x1, h1 = x1, x2, h2
                x = x2 = a + GOLDEN * (b - a)
                h2, ok = _margin(x, coef, rho, tau, kappa, cnorm2, use_reward)
            else:
                b, x2, h2 = x2, x1, h1
                x = x1 = b - GOLDEN * (b - a)
                h1, ok = _margin(x, coef, rho, tau, kappa, cnorm2, use_reward)
            if ok:
                lo = x
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
    tmp = np.empty((width, width))
    vs = np.zeros((max(width, 1), max(width, 1)))
    vecs = np.empty((16, width))
    coef = np.empty(16)
    n_taus = taus.size
    for q in range(offsets.size - 1):
        lo_idx = offsets[q]
        n = offsets[q + 1] - lo_idx
        base = boffsets[q]
        if n == 0:
            continue
        st, scale = _check_gram(gram, base, n, tmp)
        status[q] = st
        if st != OK or n < 2:
            continue
        c = centers[lo_idx:lo_idx + n]
        # (indexed, not unpacked: unpacked rows lose their contiguity, and the sums' order)
        kc, g, a0, d = vecs[0], vecs[1], vecs[2], vecs[3]
        ka0, kd, v0, vd = vecs[4], vecs[5], vecs[6], vecs[7]
        ref, y, w, lo = vecs[8], vecs[9], vecs[10], vecs[11]
        ld, diag, off, rhs = vecs[12], vecs[13], vecs[14], vecs[15]
        _matvec(gram, base, n, c, kc)
        ckc = _dot(c, kc, n)
        cnorm2 = _dot(c, c, n)
        _matvec(gram, base, n, reference[lo_idx:lo_idx + n], ref)
        if cnorm2 == 0.0 or not ckc > ZERO_CENTER_RTOL * scale * cnorm2:
            continue
        kappa = math.sqrt(ckc)
        kmat = gram[base:base + n * n].reshape(n, n)
        rmat = root[base:base + n * n].reshape(n, n)
        kr = scratch_a[:n * n].reshape(n, n)
        hmat = scratch_b[:n * n].reshape(n, n)
        trace = _rkr(kmat, rmat, kr, hmat, n)
        _matvec(root, base, n, kc, g)
        if not (math.isfinite(trace) and math.isfinite(_dot(g, g, n))):
            status[q] = OVERFLOW
            continue
        for i in range(n):
            rhs[i] = -g[i]
        _tridiagonalize(hmat, n, vs, diag, off, ka0)
        _apply_reflectors(vs, n, rhs, True)
        if _secular(diag, off, n, rhs, rho, y, w, lo, ld, trace):
            _min_norm_solution(kmat, rmat, kr, hmat, g, n, y)
        else:
            _apply_reflectors(vs, n, y, False)
        _matvec(root, base, n, y, a0)
        for i in range(n):
            a0[i] += c[i]
            d[i] = c[i] - a0[i]
            anchors[lo_idx + i] = a0[i]
        _matvec(gram, base, n, a0, ka0)
        for i in range(n):
            kd[i] = kc[i] - ka0[i]
        ref0[q] = _dot(a0, ref, n)
        ref1[q] = _dot(d, ref, n)
        coef[2] = _dot(a0, ka0, n)
        coef[13] = _dot(a0, a0, n)
        if not (coef[2] > ZERO_UPDATE_RTOL * ckc
                and coef[2] > ZERO_CENTER_RTOL * scale * coef[13]):
            continue  # ‖U(a0)‖ = 0: no safe direction
        coef[0] = _dot(a0, kc, n)
        coef[1] = _dot(d, kc, n)
        coef[3] = _dot(a0, kd, n)
        coef[4] = _dot(d, kd, n)
        _matvec(root, base, n, ka0, v0)
        _matvec(root, base, n, kd, vd)
        coef[5] = _dot(v0, v0, n)
        coef[6] = _dot(v0, vd, n)
        coef[7] = _dot(vd, vd, n)
        coef[8] = _dot(a0, c, n)
        coef[9] = _dot(d, c, n)
        _matvec(root, base, n, a0, v0)
        _matvec(root, base, n, d, vd)
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
    status, anchors, eta, accepted, m_full, m_reward, ref0, ref1 = recovery_outputs(
        centers, n_groups, taus.size)
    if threaded is None:
        threaded = n_groups >= PARALLEL_MIN_GROUPS
    run_over_groups(_recover_kernel, offsets,
                    (boffsets, status, eta, accepted, m_full, m_reward, ref0, ref1),
                    centers, root, gram, rho, taus, reference, anchors, bool(reward_condition),
                    bool(binary), threaded=threaded)
    return status, anchors, eta, accepted, m_full, m_reward, ref0, ref1
