"""JRSC (advcal.sets): Jacobians, calibration, sets, coverage and volume."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from advcal import (
    advantages,
    calibrate_sets,
    coefficient_jacobian,
    coefficient_sets,
    conformal_quantile,
    dr_grpo,
    grpo,
    offsets_from_sizes,
    rloo,
)
from advcal.registry import REGISTRY
from advcal.sets import CENTERED
from advcal.simulate import paired_scorings

seeds = st.integers(0, 2**32 - 1)


def fd_jacobian(fn, r: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of a single-group map (the test's own, not advcal's)."""
    n = r.size
    jac = np.empty((n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = h
        jac[:, j] = (fn(r + e) - fn(r - e)) / (2 * h)
    return jac


def spread_group(rng: np.random.Generator, n: int) -> np.ndarray:
    """A group with spread rewards (GRPO is smooth away from zero variance)."""
    return rng.uniform(0, 1, n) + np.linspace(0, 1, n)


# --------------------------------------------------------------------------- Jacobians


def test_jacobian_hand_example() -> None:
    # r = (0, 1, 2): u = (-1, 0, 1), sigma = 1, s = 1 (eps=0) -> J = C - uu^T/2.
    jac = coefficient_jacobian(np.array([[0.0, 1.0, 2.0]]), eps=0.0)[0]
    center = np.eye(3) - 1 / 3
    u = np.array([-1.0, 0.0, 1.0])
    np.testing.assert_allclose(jac, center - np.outer(u, u) / 2, atol=1e-15)


@given(seed=seeds, n=st.integers(2, 12), ddof=st.sampled_from([0, 1]),
       eps=st.sampled_from([0.0, 1e-6, 1e-2]))
def test_grpo_jacobian_matches_finite_differences(seed: int, n: int, ddof: int, eps: float
                                                  ) -> None:
    r = spread_group(np.random.default_rng(seed), n)
    jac = coefficient_jacobian(r[None], eps=eps, ddof=ddof)[0]
    fd = fd_jacobian(lambda x: grpo(x[None], eps=eps, ddof=ddof)[0], r)
    np.testing.assert_allclose(jac, fd, atol=2e-6)


@given(seed=seeds, n=st.integers(3, 12))
def test_grpo_jacobian_eigenstructure(seed: int, n: int) -> None:
    r = spread_group(np.random.default_rng(seed), n)
    eps = 1e-2
    jac = coefficient_jacobian(r[None], eps=eps)[0]
    u = r - r.mean()
    sigma = np.sqrt(u @ u / (n - 1))
    s = sigma + eps
    u_hat = u / np.linalg.norm(u)
    np.testing.assert_allclose(jac, jac.T, atol=1e-14)
    np.testing.assert_allclose(jac @ np.ones(n), 0.0, atol=1e-12)
    np.testing.assert_allclose(jac @ u_hat, eps / s**2 * u_hat, atol=1e-12)
    w = np.random.default_rng(seed + 1).standard_normal(n)
    w -= w.mean()
    w -= (w @ u_hat) * u_hat  # centered and orthogonal to u_hat
    np.testing.assert_allclose(jac @ w, w / s, atol=1e-10)


@pytest.mark.parametrize("estimator,fn", [("dr_grpo", dr_grpo), ("rloo", rloo)])
def test_linear_estimator_jacobians(estimator: str, fn) -> None:
    rng = np.random.default_rng(3)
    r = spread_group(rng, 6)
    jac = coefficient_jacobian(r[None], estimator=estimator)[0]
    np.testing.assert_allclose(jac, fd_jacobian(lambda x: fn(x[None])[0], r), atol=1e-7)


@given(seed=seeds, n=st.integers(2, 10), tau=st.sampled_from([1e-3, 0.5, 5.0]),
       baseline=st.sampled_from(["rloo", "mean"]))
def test_maxnorm_jacobian_matches_finite_differences(seed: int, n: int, tau: float,
                                                     baseline: str) -> None:
    r = spread_group(np.random.default_rng(seed), n)
    opts = {"tau_res": tau, "baseline": baseline}
    jac = coefficient_jacobian(r[None], estimator="maxnorm", options=opts)[0]
    fd = fd_jacobian(lambda x: advantages(x[None], method="maxnorm", **opts)[0], r)
    np.testing.assert_allclose(jac, fd, atol=1e-5)


def test_finite_difference_path_for_other_estimators() -> None:
    # batch_std on a one-group batch is grpo with the batch std: same Jacobian.
    r = spread_group(np.random.default_rng(5), 7)
    jac = coefficient_jacobian(r[None], estimator="batch_std", eps=1e-4)[0]
    expected = coefficient_jacobian(r[None], estimator="grpo", eps=1e-4)[0]
    np.testing.assert_allclose(jac, expected, atol=1e-6)


def test_jacobian_ragged_layout_and_ids() -> None:
    rng = np.random.default_rng(0)
    sizes = np.array([3, 0, 1, 4])
    r = rng.uniform(size=sizes.sum())
    flat = coefficient_jacobian(r, offsets_from_sizes(sizes))
    assert flat.shape == ((sizes**2).sum(),)
    np.testing.assert_allclose(flat[:9].reshape(3, 3),
                               coefficient_jacobian(r[None, :3])[0], atol=1e-14)
    np.testing.assert_array_equal(flat[9:10], [0.0])  # a singleton has no relative signal
    np.testing.assert_allclose(flat[10:].reshape(4, 4),
                               coefficient_jacobian(r[None, 4:])[0], atol=1e-14)
    ids = ["a", "a", "a", "c", "b", "b", "b", "b"]
    np.testing.assert_allclose(coefficient_jacobian(r, group_ids=ids), flat, atol=0)


# --------------------------------------------------------------------------- calibration


def test_calibration_scores_match_definition() -> None:
    pair = paired_scorings(50, 6, scale=0.05, seed=1)
    cal = calibrate_sets(pair.a, pair.b, alpha=0.2, ridge=1.0)
    sigma2 = np.mean((pair.a - pair.b) ** 2) / 2
    assert cal.noise_var == pytest.approx(sigma2, rel=1e-12)
    jac = coefficient_jacobian(pair.a)
    c = grpo(pair.a)
    delta = grpo(pair.b) - c
    d = []
    for q in range(50):
        u = pair.a[q] - pair.a[q].mean()
        u_hat = u / np.linalg.norm(u)
        s = np.sqrt(u @ u / 5) + 1e-6
        shape = sigma2 * jac[q] @ jac[q].T + (sigma2 / s**2) * np.outer(u_hat, u_hat)
        d.append(np.sqrt(delta[q] @ np.linalg.pinv(shape, rcond=1e-10) @ delta[q]))
    np.testing.assert_allclose(cal.scores, d, rtol=1e-6)
    assert cal.rho == conformal_quantile(np.array(d), 0.2) or math.isclose(
        cal.rho, conformal_quantile(np.array(d), 0.2), rel_tol=1e-6)


def test_closed_form_equals_dense_path() -> None:
    # Diagonal noise with a constant variance goes through the dense path (Jacobian
    # blocks) and must give the closed-form path's shapes and scores.
    pair = paired_scorings(40, 5, scale=0.03, seed=2)
    iso = calibrate_sets(pair.a, pair.b, alpha=0.1)
    var = np.full(pair.a.shape, iso.noise_var)
    diag = calibrate_sets(pair.a, pair.b, alpha=0.1, noise="diagonal", noise_var=var)
    np.testing.assert_allclose(diag.scores, iso.scores, rtol=1e-7)
    sets_iso = coefficient_sets(pair.a, calibration=iso)
    sets_diag = coefficient_sets(pair.a, calibration=diag, noise_var=var)
    np.testing.assert_allclose(sets_diag.shapes, sets_iso.shapes, rtol=1e-8, atol=1e-18)


def test_isotropic_shape_is_the_centering_matrix() -> None:
    pair = paired_scorings(30, 4, scale=0.05, seed=3)
    cal = calibrate_sets(pair.a, pair.b, alpha=0.1, shape="isotropic")
    np.testing.assert_allclose(cal.scores, np.linalg.norm(grpo(pair.b) - grpo(pair.a), axis=1),
                               rtol=1e-10)
    sets = coefficient_sets(pair.a, calibration=cal)
    np.testing.assert_allclose(sets.shapes, np.broadcast_to(np.eye(4) - 0.25, (30, 4, 4)))


def test_affine_invariance_of_centers_shapes_and_radius() -> None:
    pair = paired_scorings(300, 8, scale=0.02, seed=4)
    train = paired_scorings(20, 8, scale=0.02, seed=5).a
    base = calibrate_sets(pair.a, pair.b, alpha=0.1)
    sets = coefficient_sets(train, calibration=base)
    for scale, shift in [(2.0, 0.5), (0.5, -1.0), (10.0, 3.0)]:
        cal = calibrate_sets(scale * pair.a + shift, scale * pair.b + shift, alpha=0.1)
        assert cal.rho == pytest.approx(base.rho, rel=1e-3)
        moved = coefficient_sets(scale * train + shift, calibration=cal)
        np.testing.assert_allclose(moved.centers, sets.centers, atol=1e-3)
        np.testing.assert_allclose(moved.shapes, sets.shapes, rtol=2e-3, atol=1e-9)


def test_ids_path_matches_offsets_path() -> None:
    pair = paired_scorings(12, 5, scale=0.05, seed=6)
    rng = np.random.default_rng(0)
    perm = rng.permutation(60)
    ids = np.repeat(np.arange(12), 5)[perm]
    a, b = pair.a.reshape(-1)[perm], pair.b.reshape(-1)[perm]
    dense = calibrate_sets(pair.a, pair.b, alpha=0.2)
    by_ids = calibrate_sets(a, b, group_ids=ids, alpha=0.2)
    np.testing.assert_allclose(np.sort(by_ids.scores), np.sort(dense.scores), rtol=1e-12)
    sets = coefficient_sets(a, group_ids=ids, calibration=dense)
    np.testing.assert_allclose(sets.centers, grpo(a, group_ids=ids), rtol=1e-12)


def test_float32_keeps_dtype() -> None:
    pair = paired_scorings(20, 4, scale=0.05, seed=7)
    cal = calibrate_sets(pair.a.astype(np.float32), pair.b.astype(np.float32), alpha=0.2)
    sets = coefficient_sets(pair.a.astype(np.float32), calibration=cal)
    assert sets.centers.dtype == np.float32
    assert sets.contains(sets.centers).all()


# --------------------------------------------------------------------------- contains / support


def _members(sets, rng: np.random.Generator, radius_factor: float) -> np.ndarray:
    """c + S^{1/2} z with ‖z‖ = radius_factor·ρ, z in the centered subspace (dense sets)."""
    shapes = sets.shapes
    n_groups, n, _ = shapes.shape
    w, v = np.linalg.eigh(shapes)
    root = (v * np.sqrt(np.clip(w, 0, None))[:, None, :]) @ v.transpose(0, 2, 1)
    z = rng.standard_normal((n_groups, n))
    z -= z.mean(axis=1, keepdims=True)
    z *= (radius_factor * sets.rho / np.linalg.norm(z, axis=1))[:, None]
    return sets.centers + np.einsum("bij,bj->bi", root, z)


@pytest.mark.parametrize("shape", ["joint", "isotropic"])
@given(seed=seeds)
def test_contains_agrees_with_support(shape: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pair = paired_scorings(200, 6, scale=0.03, seed=seed)
    cal = calibrate_sets(pair.a, pair.b, alpha=0.2, shape=shape)
    sets = coefficient_sets(paired_scorings(10, 6, scale=0.03, seed=seed + 1).a,
                            calibration=cal)
    inside = _members(sets, rng, rng.uniform(0, 0.999))
    outside = _members(sets, rng, 1.05)
    assert sets.contains(inside).all()
    assert not sets.contains(outside).any()
    for _ in range(5):
        v = rng.standard_normal(inside.shape)
        value = np.einsum("bi,bi->b", v, inside)
        assert (value >= sets.support(v) - 1e-9 * (1 + np.abs(value))).all()
    # A violated direction exists for every outside point: v = −S⁺(a − c).
    delta = outside - sets.centers
    pinv = np.linalg.pinv(sets.shapes, rcond=1e-12, hermitian=True)
    v = -np.einsum("bij,bj->bi", pinv, delta)
    assert (np.einsum("bi,bi->b", v, outside) < sets.support(v)).all()


def test_support_of_the_ball_by_hand() -> None:
    cal = calibrate_sets([[0.0, 1.0, 0.5]] * 3, [[0.1, 0.9, 0.5]] * 3, alpha=0.5,
                         shape="isotropic")
    sets = dataclasses.replace(coefficient_sets([[0.0, 1.0]], calibration=cal), rho=0.5)
    c = sets.centers
    v = np.array([[1.0, -1.0]])
    # S = C, vᵀCv = 2: min over the ball = vᵀc − ρ·√2.
    assert sets.support(v)[0] == pytest.approx(v[0] @ c[0] - 0.5 * np.sqrt(2), rel=1e-12)
    assert sets.contains(c + 0.49 / np.sqrt(2) * v).all()
    assert not sets.contains(c + 0.51 / np.sqrt(2) * v).any()
    assert not sets.contains(c + 0.1).any()  # not centered: off the set's affine hull


# --------------------------------------------------------------------------- coverage


def _tolerance(p: float, trials: int, z: float = 3.5) -> float:
    return z * math.sqrt(p * (1 - p) / trials)


@pytest.mark.parametrize("noise", ["gaussian", "heteroscedastic", "rubric"])
@pytest.mark.parametrize("shape", ["joint", "isotropic"])
@pytest.mark.parametrize("alpha,m", [(0.1, 19), (0.2, 49), (0.05, 39)])
def test_coverage_within_the_finite_sample_band(noise: str, shape: str, alpha: float,
                                                m: int) -> None:
    # reps independent calibration sets of m groups, each with one test group.  σ_g² is
    # a common scale of every S_q (isotropic noise), so the scores of one call over all
    # groups equal those of per-split calls up to that scale, which cancels in d ≤ ρ.
    reps = 3000
    pair = paired_scorings(reps * (m + 1), 8, noise=noise, scale=0.03, seed=11)
    scores = calibrate_sets(pair.a, pair.b, alpha=alpha, shape=shape).scores
    scores = scores.reshape(reps, m + 1)
    k = math.ceil((m + 1) * (1 - alpha) - 1e-9)
    rho = np.sort(scores[:, :m], axis=1)[:, k - 1]
    covered = scores[:, m] <= rho
    lo, hi = 1 - alpha, 1 - alpha + 1 / (m + 1)
    cover = covered.mean()
    assert lo - _tolerance(lo, reps) <= cover <= hi + _tolerance(hi, reps)


@pytest.mark.parametrize("shape", ["joint", "isotropic"])
def test_end_to_end_coverage_agrees_with_scores(shape: str) -> None:
    # The public path (calibrate on m groups, build the test group's set, contains)
    # decides exactly like the score comparison d_test <= rho.
    m, reps = 30, 40
    for rep in range(reps):
        cal_pair = paired_scorings(m, 8, scale=0.03, seed=100 + rep)
        test = paired_scorings(1, 8, scale=0.03, seed=1000 + rep)
        cal = calibrate_sets(cal_pair.a, cal_pair.b, alpha=0.2, shape=shape)
        sets = coefficient_sets(test.a, calibration=cal)
        d = sets.distances(grpo(test.b))[0]
        assert sets.contains(grpo(test.b))[0] == (d <= cal.rho * (1 + 1e-9))
        assert cal.rho == conformal_quantile(cal.scores, 0.2)


def test_joint_shape_is_smaller_than_the_ball_when_noise_is_small() -> None:
    # The joint set pays off where linearization holds (small grader noise
    # against the within-group spread); both sets are calibrated to the same coverage.
    cal_pair = paired_scorings(2000, 8, noise="heteroscedastic", scale=0.01, seed=21)
    test = paired_scorings(4000, 8, noise="heteroscedastic", scale=0.01, seed=22)
    volumes = {}
    for shape in ("joint", "isotropic"):
        cal = calibrate_sets(cal_pair.a, cal_pair.b, alpha=0.1, shape=shape)
        sets = coefficient_sets(test.a, calibration=cal)
        cover = sets.contains(grpo(test.b)).mean()
        assert abs(cover - 0.9) <= _tolerance(0.9, 4000) + 1 / 2001
        volumes[shape] = sets.log_volumes().mean()
    assert volumes["joint"] < volumes["isotropic"] - 1.0


# --------------------------------------------------------------------------- bad input


def test_bad_input_messages() -> None:
    a = np.zeros((3, 4))
    with pytest.raises(ValueError, match=r"`alpha` must lie in \(0.0, 1.0\); got 1.5"):
        calibrate_sets(a, a, alpha=1.5)
    with pytest.raises(ValueError, match="`shape` must be one of"):
        calibrate_sets(a, a, alpha=0.1, shape="ball")
    with pytest.raises(ValueError, match=r"`scores_b` must have shape \(3, 4\)"):
        calibrate_sets(a, np.zeros((3, 5)), alpha=0.1)
    with pytest.raises(ValueError, match="calibration set is empty"):
        calibrate_sets(np.zeros((3, 1)), np.zeros((3, 1)), alpha=0.1)
    with pytest.raises(ValueError, match="`noise_var` .* is required with noise='diagonal'"):
        calibrate_sets(a, a, alpha=0.1, noise="diagonal")
    with pytest.raises(ValueError, match="`scores_a` must be finite"):
        calibrate_sets(np.full((3, 4), np.nan), a, alpha=0.1)
    with pytest.raises(TypeError, match="`calibration` must be a SetCalibration"):
        coefficient_sets(a, calibration=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`estimator` must be one of"):
        coefficient_jacobian(a, estimator="ppo")
    with pytest.raises(ValueError, match="`options` must give `tau_res`"):
        coefficient_jacobian(a, estimator="maxnorm")
    cal = calibrate_sets(a + np.arange(4), a + np.arange(4), alpha=0.5)
    sets = coefficient_sets(a, calibration=cal)
    with pytest.raises(ValueError, match=r"`directions` must have shape \(3, 4\)"):
        sets.support(np.zeros(3))
    original = a.copy()
    calibrate_sets(a, a + 1e-3, alpha=0.5)
    np.testing.assert_array_equal(a, original)


def _conditional_tolerance(p: float, m: int, n_test: int, z: float = 3.5) -> float:
    """Coverage on n_test groups given one calibration of m groups: Beta spread of the
    calibration plus the binomial spread of the test set."""
    return z * math.sqrt(p * (1 - p) * (1 / m + 1 / n_test))


def test_diagonal_noise_shrinks_sets_for_heteroscedastic_graders() -> None:
    cal_pair = paired_scorings(2000, 8, noise="heteroscedastic", scale=0.01,
                               heteroscedasticity=1.0, seed=1)
    test = paired_scorings(5000, 8, noise="heteroscedastic", scale=0.01,
                           heteroscedasticity=1.0, seed=2)
    iso = coefficient_sets(test.a, calibration=calibrate_sets(cal_pair.a, cal_pair.b,
                                                               alpha=0.1))
    diag_cal = calibrate_sets(cal_pair.a, cal_pair.b, alpha=0.1, noise="diagonal",
                              noise_var=cal_pair.noise_var)
    diag = coefficient_sets(test.a, calibration=diag_cal, noise_var=test.noise_var)
    for sets in (iso, diag):
        cover = sets.contains(grpo(test.b)).mean()
        assert abs(cover - 0.9) <= _conditional_tolerance(0.9, 2000, 5000)
    assert diag.log_volumes().mean() < iso.log_volumes().mean() - 1.0
    with pytest.raises(ValueError, match="`noise_var` .* is required: the calibration"):
        coefficient_sets(test.a, calibration=diag_cal)


@pytest.mark.parametrize("estimator,options", [("rloo", None), ("dr_grpo", None),
                                               ("maxnorm", {"tau_res": 0.05})])
def test_other_estimators_cover(estimator: str, options) -> None:
    cal_pair = paired_scorings(2000, 8, scale=0.02, seed=3)
    test = paired_scorings(5000, 8, scale=0.02, seed=4)
    cal = calibrate_sets(cal_pair.a, cal_pair.b, alpha=0.1, estimator=estimator,
                         options=options)
    sets = coefficient_sets(test.a, calibration=cal)
    cover = sets.contains(advantages(test.b, method=estimator, **(options or {}))).mean()
    assert abs(cover - 0.9) <= _conditional_tolerance(0.9, 2000, 5000)


def test_options_must_be_scalars() -> None:
    a = np.arange(8.0).reshape(2, 4)
    with pytest.raises(ValueError, match="`options` values must be scalars"):
        calibrate_sets(a, a, alpha=0.5, estimator="maxnorm", options={"tau_res": np.ones(4)})


@given(sizes=st.lists(st.integers(0, 9), max_size=8), seed=seeds,
       dtype=st.sampled_from([np.float32, np.float64]))
def test_ragged_jacobian_and_sets_match_per_group_dense(sizes: list[int], seed: int,
                                                        dtype: type) -> None:
    rng = np.random.default_rng(seed)
    sizes_arr = np.array(sizes, dtype=np.int64)
    offsets = offsets_from_sizes(sizes_arr)
    rewards = rng.uniform(size=int(sizes_arr.sum())).astype(dtype)
    jac = coefficient_jacobian(rewards, offsets)
    cal = calibrate_sets(*paired_scorings(200, 3, scale=0.03, seed=seed).scores[:2],
                         alpha=0.2)
    sets = coefficient_sets(rewards, offsets, calibration=cal)
    shapes = sets.shapes
    assert sets.centers.dtype == dtype
    start = 0
    for q, n in enumerate(sizes):
        block = slice(start, start + n * n)
        group = rewards[offsets[q]:offsets[q + 1]][None]
        if n:
            np.testing.assert_allclose(jac[block].reshape(n, n),
                                       coefficient_jacobian(group)[0], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(shapes[block].reshape(n, n),
                                       coefficient_sets(group, calibration=cal).shapes[0],
                                       rtol=1e-12, atol=1e-300)
        start += n * n
    assert sets.contains(sets.centers).all()


def test_raw_singletons_use_finite_differences() -> None:
    # verl keeps a lone response's raw score (divided by 1 + eps for grpo): slope 1/(1+eps).
    r = np.array([0.3, 0.1, 0.7, 0.9])
    offsets = offsets_from_sizes(np.array([1, 3]))
    jac = coefficient_jacobian(r, offsets, eps=1e-2, options={"singleton": "raw"})
    assert jac[0] == pytest.approx(1 / 1.01, rel=1e-6)
    np.testing.assert_allclose(jac[1:].reshape(3, 3),
                               coefficient_jacobian(r[None, 1:], eps=1e-2)[0], atol=1e-6)


def test_sets_need_centered_estimators() -> None:
    a = np.arange(8.0).reshape(2, 4)
    for name, entry in REGISTRY.items():
        if entry.ranges:  # takes ranges, not point scores: not a coefficient map of rewards
            with pytest.raises(ValueError, match="`estimator` must be one of"):
                calibrate_sets(a, a, alpha=0.5, estimator=name)
        elif not entry.centered:
            with pytest.raises(ValueError,
                               match="`estimator` must center coefficients within groups"):
                calibrate_sets(a, a, alpha=0.5, estimator=name)
    # The centred point estimators (test_registry checks each flag against the sums).
    assert CENTERED == ("grpo", "dr_grpo", "rloo", "batch_std", "gpg", "maxnorm", "p90_scale",
                        "grpo_kl_comp", "mad_scale", "huber_scale")


def test_raw_singleton_set_is_its_center() -> None:
    pair = paired_scorings(200, 4, scale=0.03, seed=8)
    cal = calibrate_sets(pair.a, pair.b, alpha=0.2, options={"singleton": "raw"})
    sets = coefficient_sets(np.array([0.4, 0.1, 0.5, 0.9]), offsets_from_sizes([1, 3]),
                            calibration=cal)
    v = np.array([1.0, 0.0, 0.0, 0.0])
    assert sets.support(v)[0] == pytest.approx(sets.centers[0])
    assert sets.shapes[0] == pytest.approx(0.0, abs=1e-12)


def test_scores_whose_differences_overflow_are_refused() -> None:
    a = np.array([[1e308, -1e308], [0.0, 1.0]])
    with pytest.raises(ValueError, match="too large: the noise variance"):
        calibrate_sets(a, -a, alpha=0.2)
