"""Conformal toolkit (DESIGN §4): the exact quantile rank and conformal reward ranges."""

from __future__ import annotations

import math
import traceback
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from advcal import conformal_quantile, conformal_rank
from tests.strategies import garbage_arrays


def own_error_or_result(fn, *args, **kwargs):
    """Call ``fn``; a failure must be advcal's own ValueError/TypeError."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError) as exc:
        origin = traceback.extract_tb(exc.__traceback__)[-1].filename
        assert "/advcal/" in origin, f"error raised outside advcal: {origin}: {exc}"
        return None


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
