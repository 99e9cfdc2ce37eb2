"""Conformal toolkit: the exact quantile rank, conformal reward ranges, smoothed ties."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from advcal import (
    RewardRanges,
    calibrate_ranges,
    conformal_quantile,
    conformal_rank,
)
from tests.checks import own_error_or_result
from tests.strategies import garbage_arrays

# --------------------------------------------------------------------------- the rank


def test_float_traps():
    # Plain float evaluation overshoots: ceil(10 * (1 - 0.7)) = 4, ceil(75 * 0.68...) = 52.
    assert math.ceil(10 * (1 - 0.7)) == 4
    assert math.ceil(75 * (1 - (1 - 0.68))) == 52
    assert conformal_rank(9, 0.7) == 3
    assert conformal_rank(74, 1 - 0.68) == 51
    scores = np.arange(9.0, 0.0, -1.0)  # 9, 8, ..., 1: the 3rd smallest is 3
    assert conformal_quantile(scores, 0.7) == 3.0
    rng = np.random.default_rng(1)
    scores = rng.permutation(np.arange(1.0, 75.0))
    assert conformal_quantile(scores, 1 - 0.68) == 51.0


def test_float32_alpha_is_the_decimal_it_prints_as():
    # np.float32(0.7) is 0.699999988: read as a binary value the rank would be 4.
    assert math.ceil(10 * (1 - float(np.float32(0.7)))) == 4
    assert conformal_rank(9, np.float32(0.7)) == 3
    assert conformal_rank(9, np.float16(0.7)) == 3
    assert conformal_rank(74, np.float32(0.32)) == 51
    assert conformal_quantile(np.arange(1.0, 10.0), np.float32(0.7)) == 3.0
    cal = calibrate_ranges(np.zeros(9), np.arange(1.0, 10.0) / 10, alpha=np.float32(0.7))
    assert cal.alpha == 0.7 and cal.radius[None] == 0.3
    with pytest.raises(ValueError, match=r"`alpha` must lie in \(0.0, 1.0\)"):
        conformal_rank(9, np.float32(1.0))
    with pytest.raises(ValueError, match="`alpha` must be finite"):
        conformal_rank(9, np.float32("nan"))


def test_rank_is_at_least_one():
    # (m + 1)(1 - alpha) = 2e-10 snaps to 0; the rank is still the smallest score.
    assert conformal_rank(1, 1 - 1e-10) == 1
    assert conformal_quantile([0.4, 0.2], 1 - 1e-11) == 0.2


def test_infinite_quantile_when_the_rank_exceeds_m():
    assert conformal_rank(9, 0.05) == 10
    assert conformal_quantile(np.arange(9.0), 0.05) == math.inf
    assert conformal_quantile([0.3], 0.4) == math.inf  # ceil(2 * 0.6) = 2 > 1
    assert conformal_quantile([0.3], 0.5) == 0.3  # 2 * 0.5 = 1 exactly
    assert conformal_quantile(np.arange(19.0), 0.05) == 18.0  # k = 19 = m: the max


def test_ties_infinite_scores_and_dtypes():
    assert conformal_quantile([1.0, 1.0, 1.0, 2.0], 0.5) == 1.0  # k = ceil(2.5) = 3
    assert conformal_quantile([np.inf, 0.0, 1.0], 0.5) == 1.0  # k = 2
    assert conformal_quantile([np.inf, 0.0, 1.0], 0.2) == math.inf  # k = 4 > 3
    value = conformal_quantile(np.array([0.1, 0.2, 0.3], dtype=np.float32), 0.5)
    assert value == float(np.float32(0.2))
    assert conformal_quantile([3, 1, 2], 0.5) == 2.0  # integers accepted


def _decimal_alpha(numerator: int, digits: int) -> tuple[float, Fraction]:
    return numerator / 10**digits, Fraction(numerator, 10**digits)


@given(m=st.integers(1, 10**6), digits=st.integers(1, 8), data=st.data(),
       complement=st.booleans())
def test_rank_matches_exact_rational_arithmetic(m, digits, data, complement):
    numerator = data.draw(st.integers(1, 10**digits - 1))
    alpha, exact = _decimal_alpha(numerator, digits)
    if complement:  # the user writes alpha = 1 - 0.68: one more float rounding
        alpha, exact = 1 - alpha, 1 - exact
    expected = math.ceil((m + 1) * (1 - exact))
    assert conformal_rank(m, alpha) == expected


@given(m=st.integers(1, 200), digits=st.integers(1, 4), data=st.data())
def test_quantile_is_the_kth_smallest(m, digits, data):
    numerator = data.draw(st.integers(1, 10**digits - 1))
    alpha, exact = _decimal_alpha(numerator, digits)
    scores = np.random.default_rng(m).permutation(m).astype(float)
    k = math.ceil((m + 1) * (1 - exact))
    assert conformal_quantile(scores, alpha) == (k - 1 if k <= m else math.inf)


def test_quantile_does_not_mutate_the_scores():
    scores = np.array([3.0, 1.0, 2.0])
    conformal_quantile(scores, 0.5)
    np.testing.assert_array_equal(scores, [3.0, 1.0, 2.0])


def test_exchangeable_coverage_of_the_quantile():
    # Continuous scores: P(test score <= q) = k / (m + 1) exactly.
    rng = np.random.default_rng(7)
    m, alpha, trials = 19, 0.1, 20000
    scores = rng.standard_normal((trials, m + 1))
    covered = np.array([s[-1] <= conformal_quantile(s[:-1], alpha) for s in scores])
    k = conformal_rank(m, alpha)
    expected = k / (m + 1)
    assert abs(covered.mean() - expected) <= 3.29 * math.sqrt(expected * (1 - expected)
                                                              / trials)


@pytest.mark.parametrize(
    ("scores", "alpha", "error", "match"),
    [
        ([], 0.1, ValueError, "`scores` must hold at least one calibration score; got none."),
        ([1.0, np.nan], 0.1, ValueError, "`scores` contain NaN"),
        ([[1.0, 2.0]], 0.1, ValueError, r"`scores` must be 1-D; got shape \(1, 2\)\."),
        (3.0, 0.1, ValueError, r"`scores` must be 1-D; got shape \(\)\."),
        (["a", "b"], 0.1, TypeError, "`scores` must be an array of real numbers"),
        ([1.0, 2.0], 0.0, ValueError, r"`alpha` must lie in \(0\.0, 1\.0\); got 0\.0\."),
        ([1.0, 2.0], 1.0, ValueError, r"`alpha` must lie in \(0\.0, 1\.0\); got 1\.0\."),
        ([1.0, 2.0], np.nan, ValueError, "`alpha` must be finite"),
        ([1.0, 2.0], "0.1", TypeError, "`alpha` must be a real number; got str."),
    ],
)
def test_quantile_bad_input(scores, alpha, error, match):
    with pytest.raises(error, match=match):
        conformal_quantile(scores, alpha)


def test_rank_bad_input():
    with pytest.raises(ValueError, match="`m` must be at least 1; got 0."):
        conformal_rank(0, 0.1)
    with pytest.raises(TypeError, match="`m` must be an integer; got float."):
        conformal_rank(3.0, 0.1)


@given(scores=garbage_arrays(), alpha=st.one_of(st.floats(), garbage_arrays()))
def test_quantile_garbage_input(scores, alpha):
    out = own_error_or_result(conformal_quantile, scores, alpha)
    if out is not None:
        assert isinstance(out, float) and not math.isnan(out)


# --------------------------------------------------------------------------- reward ranges


def test_absolute_ranges_by_hand():
    judge = np.array([0.2, 0.4, 0.6, 0.8, 0.5, 0.3, 0.9, 0.1, 0.7])
    reference = np.array([0.25, 0.3, 0.6, 1.0, 0.45, 0.4, 0.8, 0.0, 0.75])
    cal = calibrate_ranges(judge, reference, alpha=0.2)
    # scores .05 .1 0 .2 .05 .1 .1 .1 .05; k = ceil(10 * 0.8) = 8 -> sorted[7] = 0.1
    np.testing.assert_allclose(np.sort(cal.scores), [0, .05, .05, .05, .1, .1, .1, .1, .2])
    assert cal.radius[None] == pytest.approx(0.1)
    assert (cal.method, cal.alpha, cal.bounds) == ("absolute", 0.2, (0.0, 1.0))
    lo, hi = cal.ranges([0.5, 0.95, 0.02])
    np.testing.assert_allclose(lo, [0.4, 0.85, 0.0])
    np.testing.assert_allclose(hi, [0.6, 1.0, 0.12])
    assert isinstance(cal.ranges([0.5]), RewardRanges)


def test_normalized_and_cqr_by_hand():
    judge = np.array([0.5, 0.5, 0.5])
    reference = np.array([0.6, 0.3, 0.5])
    sigma = np.array([0.1, 0.4, 1.0])
    # scores |y - s| / sigma = 1.0, 0.5, 0.0; alpha = 0.5: k = ceil(2) = 2 -> 0.5
    cal = calibrate_ranges(judge, reference, alpha=0.5, method="normalized", sigma=sigma)
    assert cal.radius[None] == pytest.approx(0.5)
    lo, hi = cal.ranges([0.5, 0.5], sigma=[0.2, 2.0])
    np.testing.assert_allclose(lo, [0.4, 0.0])
    np.testing.assert_allclose(hi, [0.6, 1.0])
    lower = np.array([0.4, 0.4, 0.0])
    upper = np.array([0.5, 0.6, 0.2])
    # scores max(lower - y, y - upper) = 0.1, 0.1, 0.3; k = 2 -> 0.1
    cal = calibrate_ranges(None, reference, alpha=0.5, method="cqr", lower=lower, upper=upper)
    assert cal.radius[None] == pytest.approx(0.1)
    lo, hi = cal.ranges(None, lower=[0.3, 0.95], upper=[0.35, 0.99])
    np.testing.assert_allclose(lo, [0.2, 0.85])
    np.testing.assert_allclose(hi, [0.45, 1.0])


def test_cqr_negative_radius_never_crosses():
    # Every reference inside its quantile band: negative scores, negative radius.
    reference = np.array([0.5, 0.5, 0.5, 0.5])
    cal = calibrate_ranges(None, reference, alpha=0.5, method="cqr",
                           lower=[0.3, 0.2, 0.1, 0.45], upper=[0.7, 0.8, 0.9, 0.55])
    q = cal.radius[None]
    assert q == pytest.approx(-0.2)  # scores -0.2, -0.3, -0.4, -0.05; k = ceil(2.5) = 3
    lo, hi = cal.ranges(None, lower=[0.3, 0.45], upper=[0.7, 0.55])
    np.testing.assert_allclose(lo, [0.5, 0.5])  # [0.5, 0.5] and the crossed [0.65, 0.35]
    np.testing.assert_allclose(hi, [0.5, 0.5])
    assert (lo <= hi).all()


def test_infinite_radius_gives_the_whole_bounds():
    cal = calibrate_ranges([0.5, 0.5], [0.4, 0.6], alpha=0.1, bounds=(-1.0, 2.0))
    assert cal.radius[None] == math.inf
    for method, kwargs in (("absolute", {}), ("normalized", {"sigma": [1.0]})):
        c = calibrate_ranges([0.5], [0.4], alpha=0.1, method=method,
                             **({"sigma": [2.0]} if method == "normalized" else {}))
        lo, hi = c.ranges([0.3], **kwargs)
        assert (lo[0], hi[0]) == (0.0, 1.0)
    lo, hi = cal.ranges([0.3])
    assert (lo[0], hi[0]) == (-1.0, 2.0)


def test_mondrian_radius_per_category():
    judge = np.array([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    reference = np.array([0.4, 0.45, 0.5, 0.0, 1.0, 0.2])
    cats = ["easy", "easy", "easy", "hard", "hard", "hard"]
    cal = calibrate_ranges(judge, reference, alpha=0.5, categories=cats)
    # k = ceil(4 * 0.5) = 2 in each category: easy .1 .05 0 -> .05; hard .5 .5 .3 -> .5
    assert dict(cal.radius) == pytest.approx({"easy": 0.05, "hard": 0.5})
    lo, hi = cal.ranges([0.5, 0.5], categories=["hard", "easy"])
    np.testing.assert_allclose(lo, [0.0, 0.45])
    np.testing.assert_allclose(hi, [1.0, 0.55])
    assert list(cal.categories) == cats
    with pytest.raises(ValueError, match="`categories` holds 'medium', which was not seen"):
        cal.ranges([0.5], categories=["medium"])
    with pytest.raises(ValueError, match="`categories` are required"):
        cal.ranges([0.5])
    plain = calibrate_ranges(judge, reference, alpha=0.5)
    with pytest.raises(ValueError, match="`categories` were not used at calibration"):
        plain.ranges([0.5], categories=["easy"])
    # Tuples and mixed labels are hashable labels too.
    mixed = calibrate_ranges(judge, reference, alpha=0.5,
                             categories=[(1, "a"), (1, "a"), (1, "a"), 2, 2, 2])
    assert dict(mixed.radius) == pytest.approx({(1, "a"): 0.05, 2: 0.5})
    numeric = calibrate_ranges(judge, reference, alpha=0.5, categories=np.array([7] * 3 + [9] * 3))
    assert dict(numeric.radius) == pytest.approx({7: 0.05, 9: 0.5})


def test_calibration_is_immutable_and_inputs_untouched():
    judge = np.array([0.2, 0.4, 0.6])
    reference = np.array([0.25, 0.3, 0.6])
    cal = calibrate_ranges(judge, reference, alpha=0.5)
    with pytest.raises(ValueError):
        cal.scores[0] = 1.0
    with pytest.raises(TypeError):
        cal.radius[None] = 1.0  # type: ignore[index]
    np.testing.assert_array_equal(judge, [0.2, 0.4, 0.6])


def test_float32_ranges_are_rounded_outward():
    cal = calibrate_ranges(np.array([0.5, 0.1, 0.3]), np.array([0.6, 0.2, 0.3]), alpha=0.5)
    judge = np.array([0.33, 0.71, 0.123], dtype=np.float32)
    lo, hi = cal.ranges(judge)
    assert lo.dtype == hi.dtype == np.float32
    exact_lo = np.clip(judge.astype(np.float64) - cal.radius[None], 0, 1)
    exact_hi = np.clip(judge.astype(np.float64) + cal.radius[None], 0, 1)
    assert (lo.astype(np.float64) <= exact_lo).all() and (hi.astype(np.float64) >= exact_hi).all()
    assert cal.ranges(judge.astype(np.float64)).lo.dtype == np.float64
    dense = cal.ranges(np.full((2, 3), 0.5))
    assert dense.lo.shape == dense.hi.shape == (2, 3)


def _simulate(method: str, rng: np.random.Generator, size: int, categories: bool = False,
              category: int | None = None):
    """Labeled responses: reference in [0, 1], a noisy judge with per-response difficulty."""
    y = rng.beta(2.0, 2.0, size)
    cat = rng.integers(0, 2, size) if categories else None
    if category is not None:
        cat = np.full(size, category)
    sigma = rng.uniform(0.02, 0.2, size) * (1.0 + 2.0 * (cat if categories else 0))
    s = y + sigma * rng.standard_normal(size)
    data = {"reference": y, "categories": cat}
    if method == "cqr":
        # Deliberately misspecified quantiles: too narrow and shifted.
        data.update(judge=None, lower=s - 0.8 * sigma + 0.01, upper=s + 0.8 * sigma + 0.01)
    else:
        data.update(judge=s, sigma=sigma if method == "normalized" else None)
    return data


def _coverage(method: str, m: int, alpha: float, splits: int, seed: int,
              categories: bool = False, pooled: bool = False) -> np.ndarray:
    """Cover flags of one fresh test response per split, each split recalibrated."""
    rng = np.random.default_rng(seed)
    hits = np.empty(splits, dtype=bool)
    for t in range(splits):
        cal_data = _simulate(method, rng, m, categories)
        test = _simulate(method, rng, 1, categories, category=1 if categories else None)
        ref = cal_data.pop("reference")
        cats = None if pooled else cal_data.pop("categories")
        cal_data.pop("categories", None)
        if pooled:
            test["categories"] = None
        cal = calibrate_ranges(cal_data.pop("judge"), ref, alpha=alpha, method=method,
                               categories=cats, **cal_data)
        lo, hi = cal.ranges(test["judge"], sigma=test.get("sigma"), lower=test.get("lower"),
                            upper=test.get("upper"), categories=test["categories"])
        y = test["reference"][0]
        hits[t] = lo[0] <= y <= hi[0]
    return hits


def _within_band(hits: np.ndarray, low: float, high: float) -> bool:
    # z = 3.29: a 1-in-2000 false alarm per side for the Bernoulli rate of `hits`.
    slack = 3.29 * math.sqrt(max(low * (1 - low), high * (1 - high)) / hits.size)
    return low - slack <= hits.mean() <= high + slack


@pytest.mark.parametrize("method", ["absolute", "normalized", "cqr"])
@pytest.mark.parametrize(("m", "alpha"), [(19, 0.1), (30, 0.2)])
def test_split_conformal_coverage(method, m, alpha):
    splits = 2000
    hits = _coverage(method, m, alpha, splits, seed=m)
    # Continuous scores: coverage is k/(m+1) exactly, inside [1-a, 1-a+1/(m+1)].
    exact = conformal_rank(m, alpha) / (m + 1)
    assert 1 - alpha <= exact <= 1 - alpha + 1 / (m + 1)
    assert _within_band(hits, 1 - alpha, 1 - alpha + 1 / (m + 1))
    assert _within_band(hits, exact, exact)


def test_mondrian_coverage_within_a_category():
    # About 20 scores per category; the test response is always of the noisy category 1,
    # whose radius must cover it on its own (a pooled radius would undercover it).
    m, alpha, splits = 40, 0.1, 2000
    hits = _coverage("absolute", m, alpha, splits, seed=3, categories=True)
    # The category's own size varies per split, so the upper end is that of the
    # smallest likely category (m_c >= 10): 1 - alpha + 1/11.
    assert _within_band(hits, 1 - alpha, 1 - alpha + 1 / 11)
    pooled = _coverage("absolute", m, alpha, splits, seed=3, categories=True, pooled=True)
    assert pooled.mean() < 1 - alpha - 0.05


# --------------------------------------------------------------------------- smoothing


def _quarter_point_judge(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A judge and reference rewards on a 5-point scale: scores |y - s| tie massively."""
    y = rng.choice(np.linspace(0.0, 1.0, 5), size=size, p=[0.1, 0.2, 0.4, 0.2, 0.1])
    step = rng.choice([-0.5, -0.25, 0.0, 0.25, 0.5], size=size, p=[0.05, 0.2, 0.5, 0.2, 0.05])
    return np.clip(y + step, 0.0, 1.0), y


def test_smoothed_ranges_cover_exactly_with_a_discrete_judge():
    # m = 49, alpha = 0.2: k / (m + 1) = 0.8 exactly.  Half the scores are 0 and most of
    # the rest 0.25, so the closed ranges cover far more often (0.919 measured).
    rng = np.random.default_rng(17)
    m, alpha, splits = 49, 0.2, 2000
    closed = np.empty(splits, dtype=bool)
    smoothed = np.empty(splits, dtype=bool)
    for t in range(splits):
        judge, y = _quarter_point_judge(rng, m + 1)
        cal = calibrate_ranges(judge[:m], y[:m], alpha=alpha)
        lo, hi = cal.ranges(judge[m:])
        closed[t] = lo[0] <= y[m] <= hi[0]
        lo, hi = cal.ranges(judge[m:], smoothing=True, seed=t)
        smoothed[t] = lo[0] <= y[m] <= hi[0]
    assert _within_band(smoothed, 0.8, 0.8)
    assert not _within_band(closed, 0.8, 0.8 + 1 / (m + 1))
    assert closed.mean() > 0.9


def test_smoothing_opens_ties_by_hand():
    judge = np.full(20, 0.5)
    reference = np.r_[np.full(8, 0.5), np.full(6, 0.75), np.full(6, 0.25)]
    cal = calibrate_ranges(judge, reference, alpha=0.5)  # k = 11, q = 0.25, a = 8, t = 12
    np.testing.assert_allclose(cal._tie_probability(None, (2,)), 3 / 13)
    lo, hi = cal.ranges(np.full(20000, 0.5), smoothing=True, seed=1)
    kept = hi == 0.75
    assert abs(kept.mean() - 3 / 13) < 3.29 * math.sqrt(3 / 13 * 10 / 13 / kept.size)
    # Opened ranges lose exactly the two tied rewards, nothing inside.
    np.testing.assert_array_equal(lo[~kept], np.nextafter(0.25, 1.0))
    np.testing.assert_array_equal(hi[~kept], np.nextafter(0.75, 0.0))
    # Kept ranges are closed: they start at the smallest reward scoring |y - 0.5| <= 0.25,
    # one float below 0.25 (0.5 - that float rounds to 0.25).
    assert (np.abs(lo[kept] - 0.5) <= 0.25).all()
    assert (np.abs(np.nextafter(lo[kept], 0.0) - 0.5) > 0.25).all()
    assert (lo[kept] < 0.25).all()
    # Seeded; float32 opens in float32; clipped endpoints and other radii untouched.
    again = cal.ranges(np.full(20000, 0.5), smoothing=True, seed=1)
    np.testing.assert_array_equal(again.hi, hi)
    lo32, hi32 = cal.ranges(np.full(50, 0.5, dtype=np.float32), smoothing=True, seed=2)
    assert hi32.dtype == np.float32
    assert set(hi32.tolist()) == {0.75, float(np.nextafter(np.float32(0.75), np.float32(0)))}
    lo, hi = cal.ranges(np.full(200, 0.9), smoothing=True, seed=3)
    np.testing.assert_array_equal(hi, 1.0)  # 0.9 + 0.25 was clipped: not a tie
    assert len(set(lo.tolist())) == 2  # the low end still ties: kept or opened


def test_smoothing_per_category_and_bad_input():
    judge = np.full(12, 0.5)
    reference = np.r_[0.5, 0.5, 0.75, 0.75, 0.75, 0.25, 0.5, 0.5, 0.5, 0.5, 0.5, 0.75]
    cats = ["a"] * 6 + ["b"] * 6
    cal = calibrate_ranges(judge, reference, alpha=0.5, categories=cats)
    # a: scores 0, 0, .25 x4, k = 4: q = .25, (4 - 2) / 5.  b: 0 x5, .25, k = 4: q = 0,
    # (4 - 0) / 6.
    assert cal.radius == {"a": 0.25, "b": 0.0}
    np.testing.assert_allclose(cal._tie_probability(["b", "a"], (2,)), [4 / 6, 2 / 5])
    lo, hi = cal.ranges(np.full(2, 0.5), categories=["b", "b"], smoothing=True, seed=0)
    np.testing.assert_array_equal(lo, hi)  # a zero radius is never opened
    with pytest.raises(TypeError, match="`smoothing` must be a bool"):
        cal.ranges(np.full(2, 0.5), categories=["a", "a"], smoothing="yes")
    with pytest.raises(ValueError, match="`seed` is only used with smoothing=True"):
        cal.ranges(np.full(2, 0.5), categories=["a", "a"], seed=0)


def test_the_coverage_check_rejects_a_naive_quantile():
    # np.quantile's interpolated (1 - alpha) quantile undercovers: the band check fails.
    rng = np.random.default_rng(11)
    m, alpha, splits = 19, 0.1, 2000
    hits = np.empty(splits, dtype=bool)
    for t in range(splits):
        scores = np.abs(rng.standard_normal(m + 1))
        hits[t] = scores[-1] <= np.quantile(scores[:-1], 1 - alpha)
    assert not _within_band(hits, 1 - alpha, 1 - alpha + 1 / (m + 1))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"alpha": 1.2}, ValueError, r"`alpha` must lie in \(0\.0, 1\.0\); got 1\.2\."),
        ({"alpha": 0.1, "method": "quantile"}, ValueError, "`method` must be one of"),
        ({"alpha": 0.1, "method": "normalized"}, ValueError,
         "method='normalized' needs `sigma`."),
        ({"alpha": 0.1, "sigma": [1.0, 1.0]}, ValueError,
         "method='absolute' does not use `sigma`; pass None."),
        ({"alpha": 0.1, "method": "cqr"}, ValueError,
         "method='cqr' does not use `judge`; pass None."),
        ({"alpha": 0.1, "method": "normalized", "sigma": [1.0, 0.0]}, ValueError,
         "`sigma` must be positive"),
        ({"alpha": 0.1, "method": "normalized", "sigma": [1.0]}, ValueError,
         r"`sigma` must have shape \(2,\); got \(1,\)\."),
        ({"alpha": 0.1, "bounds": (1.0, 0.0)}, ValueError,
         r"`bounds` must be a pair \(lo, hi\) of finite numbers with lo < hi; "
         r"got \(1\.0, 0\.0\)\."),
        ({"alpha": 0.1, "bounds": 1.0}, TypeError, r"`bounds` must be a pair \(lo, hi\)"),
        ({"alpha": 0.1, "bounds": (0.0, 0.5)}, ValueError,
         r"`reference` must lie within `bounds` \[0\.0, 0\.5\]\."),
        ({"alpha": 0.1, "categories": ["a"]}, ValueError,
         r"`categories` must have shape \(2,\); got \(1,\)\."),
        ({"alpha": 0.1, "categories": [1.0, np.nan]}, ValueError,
         "`categories` must not contain NaN."),
        ({"alpha": 0.1, "categories": [[1], [2]]}, TypeError,
         "`categories` must hold hashable labels; got list."),
    ],
)
def test_calibrate_ranges_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        calibrate_ranges([0.5, 0.5], [0.4, 0.9], **kwargs)


def test_calibrate_ranges_bad_arrays():
    with pytest.raises(ValueError, match="`reference` must hold at least one labeled"):
        calibrate_ranges([], [], alpha=0.1)
    with pytest.raises(ValueError, match="`judge` must be finite."):
        calibrate_ranges([np.nan], [0.5], alpha=0.1)
    with pytest.raises(ValueError, match="`reference` must be finite."):
        calibrate_ranges([0.5], [np.nan], alpha=0.1)
    with pytest.raises(ValueError, match=r"`reference` must have shape \(1,\); got \(2,\)\."):
        calibrate_ranges([0.5], [0.5, 0.5], alpha=0.1)
    with pytest.raises(ValueError, match="`lower` must not exceed `upper`."):
        calibrate_ranges(None, [0.5], alpha=0.1, method="cqr", lower=[0.6], upper=[0.4])
    with pytest.raises(TypeError, match="`reference` must be an array of reference rewards"):
        calibrate_ranges([0.5], None, alpha=0.1)
    cal = calibrate_ranges([0.5], [0.5], alpha=0.5)
    with pytest.raises(ValueError, match="method='absolute' needs `judge`."):
        cal.ranges(None)
    with pytest.raises(ValueError, match="`judge` must be finite."):
        cal.ranges([np.inf])


_METHOD_ARGS = {"absolute": (), "normalized": ("sigma",), "cqr": ("lower", "upper")}


@given(method=st.sampled_from(sorted(_METHOD_ARGS)), judge=garbage_arrays(),
       reference=garbage_arrays(), extra=garbage_arrays(), categories=garbage_arrays(),
       alpha=st.one_of(st.floats(), garbage_arrays()), bounds=garbage_arrays())
def test_calibrate_ranges_garbage_input(method, judge, reference, extra, categories, alpha,
                                        bounds):
    kwargs = {name: extra for name in _METHOD_ARGS[method]}
    cal = own_error_or_result(calibrate_ranges, None if method == "cqr" else judge, reference,
                              alpha=alpha, method=method, categories=categories,
                              bounds=bounds, **kwargs)
    if cal is None:
        cal = calibrate_ranges(np.full(4, 0.5), np.linspace(0, 1, 4), alpha=0.3)
        kwargs, categories = {}, None
    out = own_error_or_result(cal.ranges, judge, categories=categories, **kwargs)
    if out is not None:
        lo, hi = out
        assert not (np.isnan(lo).any() or np.isnan(hi).any())
        assert (lo <= hi).all()


@given(m=st.one_of(st.integers(-5, 10**12), garbage_arrays()),
       alpha=st.one_of(st.floats(), garbage_arrays()))
def test_rank_garbage_input(m, alpha):
    out = own_error_or_result(conformal_rank, m, alpha)
    if out is not None:
        assert isinstance(out, int) and 1 <= out <= m + 1


# --------------------------------------------------------------------------- category labels


def test_category_labels_are_equal_only_with_the_same_type():
    # 1, True and 1.0 are one dict key in Python; they are three categories here, as in
    # groups_from_ids, the log readers and the calibration file.
    judge = np.full(9, 0.5)
    reference = np.array([0.5, 0.6, 0.7, 0.5, 0.5, 0.55, 0.1, 0.2, 0.9])
    cal = calibrate_ranges(judge, reference, alpha=0.5, categories=[1, 1, 1, True, True, True,
                                                                     1.0, 1.0, 1.0])
    # k = ceil(4 * 0.5) = 2 per category: 1: 0, .1, .2 -> .1; True: 0, 0, .05 -> 0;
    # 1.0: .4, .3, .4 -> .4.
    assert [type(k) for k in cal.radius] == [int, bool, float]
    assert cal.radius[1] == abs(0.6 - 0.5)
    assert cal.radius[True] == 0.0
    assert cal.radius[1.0] == abs(0.9 - 0.5)
    assert cal.radius[np.int64(1)] == cal.radius[1]  # numpy scalars: the Python type
    lo, hi = cal.ranges(np.full(3, 0.5), categories=[True, 1.0, np.int64(1)])
    np.testing.assert_array_equal(hi - lo > 0, [False, True, True])
    assert hi[1] > hi[2]
    assert list(cal.categories[:4]) == [1, 1, 1, True]
    assert type(cal.categories[3]) is bool
    with pytest.raises(ValueError, match="`categories` holds '1', which was not seen"):
        cal.ranges([0.5], categories=["1"])
    only_int = calibrate_ranges(judge, reference, alpha=0.5, categories=[1] * 9)
    with pytest.raises(ValueError, match="`categories` holds True, which was not seen"):
        only_int.ranges([0.5], categories=[True])
    # Per-category smoothing follows the same rule: (k - a) / (t + 1) is (2 - 0) / 3 for
    # True (two scores tie at 0) and (2 - 1) / 2 for 1.
    np.testing.assert_allclose(cal._tie_probability([True, 1], (2,)), [2 / 3, 1 / 2],
                               rtol=1e-15)


def test_none_is_a_category_label(tmp_path):
    from advcal import load_calibration, save_calibration

    judge = np.full(6, 0.5)
    reference = np.array([0.5, 0.6, 0.7, 0.5, 0.9, 0.1])
    cal = calibrate_ranges(judge, reference, alpha=0.5,
                           categories=[None, None, None, "a", "a", "a"])
    assert cal.radius[None] == abs(0.6 - 0.5) and cal.radius["a"] == 0.4
    lo, hi = cal.ranges([0.5, 0.5], categories=["a", None])
    assert hi[0] - lo[0] > hi[1] - lo[1]
    save_calibration(tmp_path / "none.npz", cal)
    back = load_calibration(tmp_path / "none.npz")
    assert list(back.radius) == [None, "a"] and list(back.categories) == list(cal.categories)
