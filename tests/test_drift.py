"""calibration_drift: coverage of a calibration on fresh paired scorings, seeded statistics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

import advcal
from advcal import (
    CalibrationDrift,
    calibrate_ranges,
    calibrate_sets,
    calibration_drift,
    conformal_rank,
)
from advcal.simulate import paired_scorings

ALPHA = 0.1
Z = 4.0  # tolerance in standard errors: a handful of checks per test


def band(m: int, n: int, alpha: float) -> tuple[float, float]:
    """Mean and standard deviation of the coverage of n fresh units under no drift: a
    calibration covers with probability C ~ Beta(k, m + 1 - k), then Binomial(n, C)."""
    k = conformal_rank(m, alpha)
    p = k / (m + 1)
    between = p * (1 - p) / (m + 2)
    return p, math.sqrt(between + (p * (1 - p) - between) / n)


def judge_log(n: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    reference = rng.beta(2.0, 2.0, n)
    return reference + rng.normal(0.0, noise, n), reference


@pytest.fixture(scope="module")
def set_cal() -> advcal.SetCalibration:
    return calibrate_sets(*paired_scorings(2000, 8, scale=0.02, seed=0).scores, alpha=ALPHA)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sets_no_drift(set_cal: advcal.SetCalibration, seed: int) -> None:
    fresh = paired_scorings(1000, 8, scale=0.02, seed=seed)
    out = calibration_drift(set_cal, fresh.a, fresh.b)
    assert isinstance(out, CalibrationDrift)
    assert out.n == 1000 and out.covered == int(out.inside.sum())
    assert out.coverage == out.covered / out.n and out.target == pytest.approx(0.9)
    mean, sd = band(set_cal.m, out.n, ALPHA)
    assert abs(out.coverage - mean) <= Z * sd
    assert out.p_value > 1e-3 and out.p_value_exchangeable > 1e-3
    lo, hi = out.interval
    assert lo <= out.coverage <= hi


@pytest.mark.parametrize(("scale", "noise"), [(0.03, "gaussian"), (0.05, "heteroscedastic")])
def test_sets_drift_detected(set_cal: advcal.SetCalibration, scale: float, noise: str) -> None:
    # A noisier grader than at calibration: the second scoring leaves the sets.
    fresh = paired_scorings(300, 8, scale=scale, noise=noise, seed=4)
    out = calibration_drift(set_cal, fresh.a, fresh.b)
    assert out.coverage < 0.9
    assert out.p_value < 1e-6 and out.p_value_exchangeable < 1e-6
    assert out.interval[1] < out.target


def test_sets_ragged_layout_matches_dense(set_cal: advcal.SetCalibration) -> None:
    fresh = paired_scorings(50, 8, scale=0.02, seed=5)
    dense = calibration_drift(set_cal, fresh.a, fresh.b)
    offsets = np.arange(0, 401, 8)
    flat = calibration_drift(set_cal, fresh.a.reshape(-1), fresh.b.reshape(-1), offsets)
    assert flat.covered == dense.covered
    np.testing.assert_array_equal(flat.inside, dense.inside)


def test_sets_membership_matches_contains(set_cal: advcal.SetCalibration) -> None:
    # The drift check counts T(r') in the set exactly as coefficient_sets(...).contains does.
    fresh = paired_scorings(400, 8, scale=0.02, seed=6)
    sets = advcal.coefficient_sets(fresh.a, calibration=set_cal)
    expected = sets.contains(advcal.grpo(fresh.b))
    out = calibration_drift(set_cal, fresh.a, fresh.b)
    assert (out.inside != expected).sum() <= 1  # only a rounding tie at d = rho may differ


def test_exchangeable_p_value_is_valid() -> None:
    """Under no drift P(p <= level) <= level: count rejections over seeded repetitions."""
    trials, level = 300, 0.1
    rejections = {"exchangeable": 0, "binomial": 0}
    for t in range(trials):
        cal = calibrate_sets(*paired_scorings(100, 4, scale=0.05, seed=[7, t]).scores,
                             alpha=0.2)
        fresh = paired_scorings(100, 4, scale=0.05, seed=[8, t])
        out = calibration_drift(cal, fresh.a, fresh.b)
        rejections["exchangeable"] += out.p_value_exchangeable <= level
        rejections["binomial"] += out.p_value <= level
    limit = stats.binom.isf(1e-4, trials, level)
    assert rejections["exchangeable"] <= limit
    # With n = m the binomial test also sees the calibration's own luck: it rejects more
    # often than the level (documented; the exchangeable p-value is the valid one).
    assert rejections["binomial"] >= rejections["exchangeable"]


def test_ranges_no_drift_and_drift() -> None:
    judge, ref = judge_log(2000, 0.05, seed=10)
    cal = calibrate_ranges(judge, ref, alpha=ALPHA)
    same = calibration_drift(cal, *judge_log(1500, 0.05, seed=11))
    mean, sd = band(cal.scores.size, same.n, ALPHA)
    assert abs(same.coverage - mean) <= Z * sd
    assert same.p_value > 1e-3 and same.p_value_exchangeable > 1e-3
    worse = calibration_drift(cal, *judge_log(1500, 0.1, seed=12))
    assert worse.p_value < 1e-6 and worse.coverage < 0.85


def test_ranges_mondrian_and_methods() -> None:
    judge, ref = judge_log(600, 0.05, seed=13)
    cats = np.where(np.arange(600) % 3 == 0, "hard", "easy")
    cal = calibrate_ranges(judge, ref, alpha=ALPHA, categories=cats)
    fj, fr = judge_log(300, 0.05, seed=14)
    fc = np.where(np.arange(300) % 3 == 0, "hard", "easy")
    out = calibration_drift(cal, fj, fr, categories=fc)
    assert out.n == 300 and math.isnan(out.p_value_exchangeable)
    lo, hi = cal.ranges(fj, categories=fc)
    assert out.covered == int(((lo <= fr) & (fr <= hi)).sum())
    cqr = calibrate_ranges(None, ref, alpha=ALPHA, method="cqr", lower=judge - 0.05,
                           upper=judge + 0.05)
    res = calibration_drift(cqr, None, fr, lower=fj - 0.05, upper=fj + 0.05)
    assert 0.8 < res.coverage <= 1.0


def test_infinite_radius_always_covers() -> None:
    cal = calibrate_sets(*paired_scorings(5, 4, scale=0.05, seed=0).scores, alpha=0.1)
    assert cal.rho == math.inf
    fresh = paired_scorings(20, 4, scale=0.5, seed=1)
    out = calibration_drift(cal, fresh.a, fresh.b)
    assert out.coverage == 1.0 and out.p_value_exchangeable == 1.0


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"calibration": "cal"}, TypeError, "`calibration` must be"),
    ({"sigma": np.ones(4)}, ValueError, "`sigma` is for a RangeCalibration"),
    ({"confidence": 1.0}, ValueError, "`confidence`"),
    ({"scores_b": np.full((3, 4), np.nan)}, ValueError, "`scores_b` must be finite"),
    ({"scores_b": np.ones((3, 5))}, ValueError, "scores_b"),
    ({"scores_a": np.ones((3, 1)), "scores_b": np.ones((3, 1))}, ValueError, "at least one"),
])
def test_bad_input(set_cal: advcal.SetCalibration, kwargs: dict[str, Any], error: type,
                   match: str) -> None:
    fresh = paired_scorings(3, 4, scale=0.02, seed=0)
    args: dict[str, Any] = {"calibration": set_cal, "scores_a": fresh.a, "scores_b": fresh.b}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        calibration_drift(args.pop("calibration"), args.pop("scores_a"), args.pop("scores_b"),
                          **args)


def test_range_bad_input() -> None:
    judge, ref = judge_log(50, 0.05, seed=0)
    cal = calibrate_ranges(judge, ref, alpha=0.2)
    with pytest.raises(ValueError, match="`offsets` is for a SetCalibration"):
        calibration_drift(cal, judge, ref, np.array([0, 50]))
    with pytest.raises(ValueError, match="`scores_b` .* must have shape"):
        calibration_drift(cal, judge, ref[:10])


def test_references_outside_the_bounds_are_refused() -> None:
    # calibrate_ranges takes references only within its bounds and clips the ranges to
    # them: a reference outside could never be covered, so it is refused, not a miss.
    judge, ref = judge_log(200, 0.05, seed=20)
    cal = calibrate_ranges(judge, ref, alpha=0.2)
    fj = np.array([0.0, 0.5, 1.0, 0.5])
    on_bounds = calibration_drift(cal, fj, np.array([0.0, 0.5, 1.0, 0.5]))
    assert on_bounds.n == 4 and on_bounds.covered == 4
    for bad in (1.5, -1e-12, 1.0 + 2**-52):
        with pytest.raises(ValueError, match=r"`scores_b` must lie within the calibration's "
                                             r"`bounds` \[0\.0, 1\.0\]; got 1 value"):
            calibration_drift(cal, fj, np.array([0.0, 0.5, bad, 0.5]))
    wide = calibrate_ranges(2 * judge, 2 * ref - 0.5, alpha=0.2, bounds=(-1.0, 2.0))
    assert calibration_drift(wide, fj, np.array([-1.0, 1.5, 2.0, 0.5])).n == 4
    with pytest.raises(ValueError, match=r"`scores_b` must lie .*\[-1\.0, 2\.0\]"):
        calibration_drift(wide, fj, np.array([-1.0, 1.5, 2.5, 0.5]))
    cqr = calibrate_ranges(None, ref, alpha=0.2, method="cqr", lower=judge - 0.05,
                           upper=judge + 0.05)
    with pytest.raises(ValueError, match="`scores_b` must lie within"):
        calibration_drift(cqr, None, np.array([0.5, 1.25]), lower=np.array([0.4, 0.9]),
                          upper=np.array([0.6, 1.0]))


def test_scorings_outside_a_set_estimators_bounds_are_named() -> None:
    # maxnorm with reward bounds and no clipping refuses rewards outside them; the error
    # names the drift check's argument, not the estimator's `rewards`.
    pair = paired_scorings(300, 4, scale=0.02, seed=0)
    options = {"bounds": (0.0, 1.0), "tau_res": 0.05}
    cal = calibrate_sets(pair.a, pair.b, alpha=0.2, estimator="maxnorm", options=options)
    fresh = paired_scorings(20, 4, scale=0.02, seed=1)
    assert calibration_drift(cal, fresh.a, fresh.b).n == 20
    high = fresh.b.copy()
    high[3, 1] = 1.5
    with pytest.raises(ValueError, match=r"`scores_b` must lie within the calibration's "
                                         r"`options\['bounds'\]` \[0\.0, 1\.0\]"):
        calibration_drift(cal, fresh.a, high)
    with pytest.raises(ValueError, match=r"`scores_a` must lie within .*; got 1 value"):
        calibration_drift(cal, high, fresh.b)
    clipped = calibrate_sets(pair.a, pair.b, alpha=0.2, estimator="maxnorm",
                             options={**options, "clip": True})
    assert calibration_drift(clipped, high, high).n == 20  # clipping takes them in


# --------------------------------------------------------------------------- cross-fitting


def test_select_groups_takes_groups_in_the_order_given() -> None:
    from advcal._blocks import block_offsets
    from advcal.drift import select_groups

    values = np.arange(10.0)
    offsets = np.array([0, 2, 5, 9, 10])
    got, off = select_groups(values, offsets, np.array([2, 0]))
    np.testing.assert_array_equal(got, [5, 6, 7, 8, 0, 1])
    np.testing.assert_array_equal(off, [0, 4, 6])
    got, off = select_groups(values, offsets, np.array([], dtype=np.int64))
    assert got.size == 0 and off.tolist() == [0]
    # the Gram blocks of groups 3 and 1 (sizes 1 and 3): block offsets select them too
    sizes = np.diff(offsets)
    gram = np.arange(float(np.sum(sizes ** 2)))  # 4 + 9 + 16 + 1 values
    blocks, boff = select_groups(gram, block_offsets(sizes), np.array([3, 1]))
    np.testing.assert_array_equal(blocks, [29.0, *range(4, 13)])
    np.testing.assert_array_equal(boff, [0, 1, 10])


def test_cross_fitted_set_coverage_with_an_infinite_radius_covers_every_group() -> None:
    from advcal.drift import CrossFittedCoverage, cross_fitted_set_coverage

    # 10 groups in 5 folds: each calibration has m = 8 groups, and at alpha = 0.05 the
    # conformal rank ceil(0.95 * 9) = 9 exceeds m, so every radius is infinite.
    pair = paired_scorings(10, 4, scale=0.02, seed=3)
    cov = cross_fitted_set_coverage(pair.a, pair.b, alpha=0.05, folds=5, seed=1)
    assert isinstance(cov, CrossFittedCoverage)
    assert (cov.covered, cov.n, cov.folds, cov.skipped) == (10, 10, 5, 0)
    assert cov.target == pytest.approx(0.95, abs=1e-15) and cov.estimate == 1.0
    # Clopper-Pearson for 10 of 10: [(0.025)^(1/10), 1]
    assert cov.interval[0] == pytest.approx(0.025 ** 0.1, rel=1e-9)
    assert cov.interval[1] == 1.0
    # the same groups as 1-D scores with offsets, and a group of one (not a unit)
    flat_a = np.concatenate([pair.a.reshape(-1), [0.5]])
    flat_b = np.concatenate([pair.b.reshape(-1), [0.4]])
    offsets = np.concatenate([np.arange(0, 41, 4), [41]])
    assert cross_fitted_set_coverage(flat_a, flat_b, offsets, alpha=0.05, seed=1) == cov
    # more folds than groups: leave-one-out, every group tested once
    loo = cross_fitted_set_coverage(pair.a, pair.b, alpha=0.05, folds=1000, seed=1)
    assert (loo.n, loo.folds) == (10, 1000)


def test_cross_fitted_set_coverage_counts_each_held_out_group_once() -> None:
    from advcal.drift import cross_fitted_set_coverage

    pair = paired_scorings(400, 4, scale=0.02, seed=4)
    cov = cross_fitted_set_coverage(pair.a, pair.b, alpha=ALPHA, folds=4, seed=0)
    assert cov.n == 400 and 0 <= cov.covered <= 400
    # each fold's calibration has m' = 300 groups: the pooled coverage of 400 held-out
    # groups lies within Z standard errors of its no-drift mean k / (m' + 1)
    p, sd = band(300, 400, ALPHA)
    assert abs(cov.estimate - p) <= Z * sd
    # a seed is a split: another seed tests the same groups
    assert cross_fitted_set_coverage(pair.a, pair.b, alpha=ALPHA, folds=4, seed=9).n == 400


def test_cross_fitted_set_coverage_bad_input() -> None:
    from advcal.drift import cross_fitted_set_coverage

    pair = paired_scorings(20, 4, scale=0.02, seed=5)
    with pytest.raises(ValueError, match="`folds` must be at least 2; got 1"):
        cross_fitted_set_coverage(pair.a, pair.b, alpha=ALPHA, folds=1)
    with pytest.raises(TypeError, match="`folds` must be an integer"):
        cross_fitted_set_coverage(pair.a, pair.b, alpha=ALPHA, folds=2.5)
    with pytest.raises(ValueError, match="`alpha` must lie in"):
        cross_fitted_set_coverage(pair.a, pair.b, alpha=1.5)
    with pytest.raises(ValueError, match="`scores_b` must have shape"):
        cross_fitted_set_coverage(pair.a, pair.b[:, :3], alpha=ALPHA)
    with pytest.raises(ValueError, match="`estimator`"):
        cross_fitted_set_coverage(pair.a, pair.b, alpha=ALPHA, estimator="nope")


def test_cross_fitted_range_coverage_by_hand() -> None:
    from advcal.drift import cross_fitted_range_coverage

    judge, ref = judge_log(10, 0.05, seed=6)
    # 10 responses in 5 folds, m = 8 per calibration: at alpha = 0.05 every radius is
    # infinite, the ranges are the bounds [0, 1], and every reference is covered.
    cov = cross_fitted_range_coverage(judge, ref, alpha=0.05, folds=5, seed=2)
    assert (cov.covered, cov.n, cov.skipped) == (10, 10, 0)
    # advcal's label rule: 1, True and 1.0 are three categories, and 1.0's only
    # response cannot be tested (Python's equality would merge all three)
    labels = [1] * 5 + [True] * 4 + [1.0]
    cov = cross_fitted_range_coverage(judge, ref, alpha=0.05, folds=5, seed=2,
                                      categories=labels)
    assert (cov.covered, cov.n, cov.skipped) == (9, 9, 1)
    array = cross_fitted_range_coverage(judge, ref, alpha=0.05, folds=5, seed=2,
                                        categories=np.array(["a"] * 9 + ["b"]))
    assert (array.n, array.skipped) == (9, 1)
    nobody = cross_fitted_range_coverage(judge, ref, alpha=0.05,
                                         categories=[str(i) for i in range(10)])
    assert (nobody.n, nobody.skipped) == (0, 10)
    assert math.isnan(nobody.estimate) and all(math.isnan(x) for x in nobody.interval)


def test_cross_fitted_range_coverage_bad_input() -> None:
    from advcal.drift import cross_fitted_range_coverage

    judge, ref = judge_log(50, 0.05, seed=7)
    with pytest.raises(ValueError, match="`judge` must have the shape of `reference`"):
        cross_fitted_range_coverage(judge[:40], ref, alpha=ALPHA)
    with pytest.raises(ValueError, match="`categories` must hold one label per response"):
        cross_fitted_range_coverage(judge, ref, alpha=ALPHA, categories=["a"] * 49)
    with pytest.raises(TypeError, match="`categories` must hold hashable labels"):
        cross_fitted_range_coverage(judge, ref, alpha=ALPHA, categories=[[1]] * 50)
    with pytest.raises(ValueError, match="`folds` must be at least 2"):
        cross_fitted_range_coverage(judge, ref, alpha=ALPHA, folds=0)
