"""Risk bounds: closed forms, scipy agreement, coverage, p-value validity and duality."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from advcal import risk_p_value, ucb
from advcal.bounds import BOUNDS
from tests.checks import own_error_or_result
from tests.strategies import garbage_arrays

# --------------------------------------------------------------------------- pinned values


def test_clopper_pearson_solves_the_binomial_tail_equation():
    k, n = np.meshgrid(np.arange(0, 60), np.arange(1, 60), indexing="ij")
    keep = k < n
    k, n = k[keep], n[keep]
    for delta in (0.5, 0.1, 0.05, 1e-3, 1e-8):
        bound = ucb(k, n, delta)
        np.testing.assert_allclose(stats.binom.cdf(k, n, bound), delta, rtol=0, atol=1e-9)


@given(n=st.integers(1, 5000), data=st.data(), delta=st.floats(1e-10, 0.999))
def test_clopper_pearson_tail_equation_property(n, data, delta):
    k = data.draw(st.integers(0, n - 1))
    bound = ucb(k, n, delta)
    assert bound < 1.0
    if delta <= 0.5:  # k is a median of Bin(n, k/n), so the bound is at least k/n
        assert bound >= k / n
    assert abs(stats.binom.cdf(k, n, bound) - delta) <= 1e-9


def test_closed_forms_at_the_edges():
    # k = 0: P(Bin(n, R) = 0) = (1 - R)**n = delta.
    assert ucb(0, 10, 0.05) == pytest.approx(1 - 0.05 ** (1 / 10), abs=1e-14)
    assert ucb(0, 10, 0.05, bound="bentkus") == pytest.approx(
        1 - (0.05 / math.e) ** (1 / 10), abs=1e-14)
    for bound in BOUNDS:
        assert ucb(7, 7, 0.1, bound=bound) == 1.0  # k = n
        assert ucb(0, 0, 0.1, bound=bound) == 1.0  # vacuous
        assert risk_p_value(0, 0, 0.1, bound=bound) == 1.0


def _kl(r: float, b: float) -> float:
    first = r * math.log(r / b) if r > 0 else 0.0
    return first + (1 - r) * math.log((1 - r) / (1 - b))


def test_hoeffding_by_hand():
    # The KL form: the b > 3/20 with 20 h(0.15, b) = log(1 / 0.1).
    u = ucb(3, 20, 0.1, bound="hoeffding")
    assert 20 * _kl(0.15, u) == pytest.approx(math.log(10), rel=1e-12)
    assert u == pytest.approx(0.3656987, abs=1e-7)
    # ... tighter than the sub-Gaussian 3/20 + sqrt(log(1/0.1) / 40) = 0.3899263 (Pinsker).
    assert u < 0.15 + math.sqrt(math.log(10) / 40)
    # k = 0: h(0, b) = -log(1 - b), so the bound is Clopper-Pearson's 1 - delta**(1/n).
    assert ucb(0, 11, 0.1, bound="hoeffding") == pytest.approx(1 - 0.1 ** (1 / 11), rel=1e-14)
    assert ucb(20, 20, 0.1, bound="hoeffding") == 1.0  # k = n
    assert ucb(0, 0, 0.1, bound="hoeffding") == 1.0


def test_the_issue_example_certifies_under_both_columns():
    # k = 0, n = 11, beta = 0.2: p = 0.8**11 = 0.086 <= 0.1, and the bound agrees
    # (the sub-Gaussian form gave 0.324 and refused).
    assert risk_p_value(0, 11, 0.2, bound="hoeffding") == pytest.approx(0.8**11, rel=1e-12)
    assert ucb(0, 11, 0.1, bound="hoeffding") == pytest.approx(0.1888692, abs=1e-7)


@pytest.mark.parametrize("bound", BOUNDS)
def test_extreme_counts_and_levels_are_finite(bound):
    # Huge n (no quantile routine converges there) and a subnormal delta.
    big = ucb(10**17, 10**18, 0.1, bound=bound)
    # The bound sits a few standard errors sqrt(0.09 / 1e18) = 3e-10 above 0.1.
    assert 0.1 + 3e-10 < big < 0.1 + 7e-10
    assert risk_p_value(10**17, 10**18, big, bound=bound) <= 0.1
    # P(Bin(10, b) <= 1) > 5e-324 for every float b < 1: only the vacuous bound.
    assert ucb(1, 10, 5e-324, bound=bound) == 1.0
    tiny = ucb(0, 10**18, 1e-300, bound=bound)  # about log(1 / delta) / n
    assert 6.9e-16 < tiny < 7e-16


def _edgeworth_tail(k: int, n: int, beta: float) -> tuple[float, float]:
    """P(Bin(n, beta) <= k) by the one-term Edgeworth expansion at the continuity-corrected
    point, and a bound on what it leaves out, for huge variances V = n beta (1 - beta).

    z = (k + 1/2 - n beta) / sqrt(V) (exact rational arithmetic: k and n beyond 2**53);
    P = Phi(z) - phi(z) gamma / 6 (z**2 - 1) with skewness gamma = (1 - 2 beta) / sqrt(V).
    The next terms are phi(z) / V times kurtosis (z**3 - 3z) / 24, skewness**2
    (z**5 - 10 z**3 + 15 z) / 72 and the lattice's z / 24, each coefficient at most 1.
    """
    from fractions import Fraction

    variance = float(n * Fraction(beta) * (1 - Fraction(beta)))
    z = float(k + Fraction(1, 2) - n * Fraction(beta)) / math.sqrt(variance)
    gamma = (1.0 - 2.0 * beta) / math.sqrt(variance)
    phi = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    value = stats.norm.cdf(z) - phi * gamma / 6.0 * (z * z - 1.0)
    left_out = phi / variance * (abs(z**3 - 3 * z) / 24 + abs(z**5 - 10 * z**3 + 15 * z) / 72
                                 + abs(z) / 24)
    return value, left_out


@pytest.mark.parametrize("n", [10**16, 3 * 10**16, 10**17, 2**60, 9 * 10**18])
@pytest.mark.parametrize("beta", [0.2, 0.38402386, 0.5, 0.75458121, 1e-3])
def test_binomial_tail_for_huge_n_near_the_mean(n, beta):
    # scipy's incomplete beta returned NaN near the mean from n = 1e16 on (and lost
    # digits before).  Within a few standard deviations the Edgeworth expansion is exact
    # to its left-out terms, O(1 / V) with V >= 1e13 here, plus float64 rounding.
    sd = math.sqrt(n * beta * (1 - beta))
    for z in (-4.0, -1.0, -1e-9, 0.0, 0.3, 2.5):
        k = int(n * beta + z * sd)
        expected, left_out = _edgeworth_tail(k, n, beta)
        for bound, factor in (("clopper-pearson", 1.0), ("bentkus", math.e)):
            got = risk_p_value(k, n, beta, bound=bound)
            assert math.isfinite(got)
            want = min(1.0, factor * expected)
            assert abs(got - want) <= factor * (left_out + 8 * 2.0**-53), (bound, z)


@pytest.mark.parametrize("bound", BOUNDS)
def test_huge_n_bound_and_p_value_are_duals(bound):
    # Where the p-value was NaN the search had nothing to invert: the bound is now the
    # smallest float certified by the p-value, a few standard errors above k / n.
    n = 3 * 10**16
    for rate in (0.75458121, 0.38402386, 1e-6):
        k = int(round(n * rate))
        u = ucb(k, n, 0.05, bound=bound)
        assert risk_p_value(k, n, u, bound=bound) <= 0.05
        assert risk_p_value(k, n, np.nextafter(u, 0.0), bound=bound) > 0.05
        se = math.sqrt(rate * (1 - rate) / n)
        assert k / n < u < k / n + 4 * se


def test_saddlepoint_tail_against_exact_sums():
    # The saddlepoint formula against scipy's binomial tail where that is exact to ~1e-13
    # (n <= 1e6), out to 30 standard deviations: its relative error is O(1 / V) (Daniels
    # 1987; V = n beta (1 - beta), 900 and up here), 0.1 / V at these depths.
    from advcal.bounds import _saddlepoint_tail

    rng = np.random.default_rng(8)
    for n in (10**4, 10**5, 10**6):
        beta = rng.uniform(0.1, 0.9, 400)
        sd = np.sqrt(n * beta * (1 - beta))
        k = np.clip(np.round(n * beta + rng.uniform(-30, 30, beta.size) * sd), 0, n - 1)
        k = k.astype(np.int64)
        got = _saddlepoint_tail(k, np.full(k.shape, n), beta)
        exact = stats.binom.cdf(k, n, beta)
        # Relative in the lower tail (the p-values that get compared with small levels),
        # absolute above the mean.
        scale = np.where(exact < 0.5, exact, 1.0)
        keep = exact > 1e-300
        err = (np.abs(got - exact) / scale)[keep] * (n * beta * (1 - beta))[keep]
        assert err.max() <= 0.1, n


def test_bentkus_is_clopper_pearson_at_delta_over_e_and_hb_is_the_min():
    k = np.array([0, 1, 5, 20, 99])
    n = np.array([10, 10, 50, 100, 100])
    np.testing.assert_allclose(ucb(k, n, 0.1, bound="bentkus"), ucb(k, n, 0.1 / math.e))
    np.testing.assert_array_equal(
        ucb(k, n, 0.1, bound="hoeffding-bentkus"),
        np.minimum(ucb(k, n, 0.1, bound="bentkus"), ucb(k, n, 0.1, bound="hoeffding")),
    )
    # At k = 0 the KL bound is Clopper-Pearson's, tighter than Bentkus's delta / e; in
    # the bulk the binomial tail wins.
    assert ucb(0, 100, 0.1, bound="hoeffding") == pytest.approx(ucb(0, 100, 0.1), rel=1e-13)
    assert ucb(0, 100, 0.1, bound="hoeffding") < ucb(0, 100, 0.1, bound="bentkus")
    assert ucb(20, 100, 0.1, bound="bentkus") < ucb(20, 100, 0.1, bound="hoeffding")


def test_broadcasting_and_scalar_results():
    out = ucb(np.array([[0], [1], [2]]), np.array([2, 4, 8, 16]), 0.1)
    assert out.shape == (3, 4)
    assert out[2, 0] == 1.0
    assert isinstance(ucb(1, 4, 0.1), float)
    assert isinstance(risk_p_value(1, 4, 0.1), float)
    per_delta = ucb(3, 30, np.array([0.2, 0.1, 0.05]))
    assert np.all(np.diff(per_delta) > 0)  # smaller delta, larger bound
    assert ucb(3.0, 30.0, 0.1) == ucb(3, 30, 0.1)  # whole-number floats are counts


@pytest.mark.parametrize("bound", BOUNDS)
def test_monotone_in_k(bound):
    values = ucb(np.arange(0, 41), 40, 0.05, bound=bound)
    assert np.all(np.diff(values) >= 0)
    assert np.all(values >= np.arange(0, 41) / 40)


# --------------------------------------------------------------------------- coverage


def _coverage(bound: str, n: int, risk: float, delta: float, draws: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    k = rng.binomial(n, risk, size=draws)
    return float(np.mean(risk <= ucb(k, n, delta, bound=bound)))


def _lower_tolerance(p: float, draws: int) -> float:
    # One-sided z = 3.29 (1 in 2000): the empirical rate of a Bernoulli(p) over `draws`.
    return p - 3.29 * math.sqrt(p * (1 - p) / draws)


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize(("n", "risk"), [(20, 0.05), (50, 0.2), (200, 0.08), (400, 0.5)])
def test_ucb_coverage_over_simulated_draws(bound, n, risk):
    delta, draws = 0.1, 4000
    covered = _coverage(bound, n, risk, delta, draws, seed=n)
    assert covered >= _lower_tolerance(1 - delta, draws)


def test_the_coverage_check_rejects_an_invalid_bound():
    # The plug-in estimate k/n is no bound: the same check must fail for it.
    rng = np.random.default_rng(0)
    draws, n, risk = 4000, 50, 0.2
    k = rng.binomial(n, risk, size=draws)
    assert np.mean(risk <= k / n) < _lower_tolerance(0.9, draws)


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("n", [1, 7, 30, 120])
def test_exact_coverage_by_enumeration(bound, n):
    # P(R <= ucb(K)) = sum of Bin(n, R) masses of the k whose bound covers R.
    ks = np.arange(n + 1)
    for risk in np.linspace(0.01, 0.99, 25):
        for delta in (0.2, 0.05):
            covered = ucb(ks, n, delta, bound=bound) >= risk
            assert stats.binom.pmf(ks, n, risk)[covered].sum() >= 1 - delta - 1e-12


# --------------------------------------------------------------------------- p-values


def test_p_values_by_hand():
    assert risk_p_value(0, 10, 0.2) == pytest.approx(0.8**10, rel=1e-12)
    assert risk_p_value(0, 10, 0.2, bound="bentkus") == pytest.approx(math.e * 0.8**10)
    # h(0, b) = log(1 / (1 - b)): p = (1 - b)**n.
    assert risk_p_value(0, 30, 0.2, bound="hoeffding") == pytest.approx(0.8**30, rel=1e-12)
    # k/n = 0.1, b = 0.2: h = 0.1 log(0.5) + 0.9 log(0.9 / 0.8).
    h = 0.1 * math.log(0.5) + 0.9 * math.log(0.9 / 0.8)
    assert risk_p_value(5, 50, 0.2, bound="hoeffding") == pytest.approx(math.exp(-50 * h))
    assert risk_p_value(30, 50, 0.2, bound="hoeffding") == 1.0  # rate above beta
    assert risk_p_value(50, 50, 0.2, bound="bentkus") == 1.0  # capped
    assert risk_p_value(5, 50, 0.2, bound="hoeffding-bentkus") == min(
        risk_p_value(5, 50, 0.2, bound="hoeffding"), risk_p_value(5, 50, 0.2, bound="bentkus"))


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("n", [5, 40, 300])
def test_p_values_are_super_uniform_at_the_null_boundary(bound, n):
    ks = np.arange(n + 1)
    for beta in (0.05, 0.2, 0.5):
        p = risk_p_value(ks, n, beta, bound=bound)
        assert np.all((p >= 0) & (p <= 1))
        for delta in (0.01, 0.1, 0.3):
            assert stats.binom.pmf(ks, n, beta)[p <= delta].sum() <= delta + 1e-12


@given(n=st.integers(1, 2000), data=st.data(), beta=st.floats(0.001, 0.999),
       delta=st.floats(1e-12, 0.999), bound=st.sampled_from(BOUNDS))
def test_p_value_and_ucb_agree(n, data, beta, delta, bound):
    k = data.draw(st.integers(0, n))
    p = risk_p_value(k, n, beta, bound=bound)
    u = ucb(k, n, delta, bound=bound)
    if abs(u - beta) > 1e-12:  # rounding noise in the p-value decides exact ties
        assert (p <= delta) == (u <= beta)
    # The bound itself is certified, and the next float down is not.
    if u < 1.0:
        assert risk_p_value(k, n, u, bound=bound) <= delta
        assert risk_p_value(k, n, np.nextafter(u, 0.0), bound=bound) > delta


def _all_counts(n_max: int) -> tuple[np.ndarray, np.ndarray]:
    k, n = np.meshgrid(np.arange(n_max + 1), np.arange(n_max + 1), indexing="ij")
    keep = k <= n
    return k[keep], n[keep]


@pytest.mark.parametrize("bound", BOUNDS)
def test_bound_and_p_value_are_duals_on_every_count(bound):
    # Every (k, n) with k <= n <= 400, against levels from coarse to tiny: ucb <= beta
    # exactly when p <= delta.  A tie within 1e-12 of the boundary may go either way
    # (scipy's binomial tail is accurate to a few ulps); none occurs on this grid.
    k, n = _all_counts(400)
    p = {beta: risk_p_value(k, n, beta, bound=bound) for beta in (0.01, 0.05, 0.2, 0.5, 0.9)}
    mismatches = 0
    for delta in (0.5, 0.05, 1e-9):
        u = ucb(k, n, delta, bound=bound)
        assert u.min() >= 0 and u.max() <= 1
        for beta, p_beta in p.items():
            disagree = (u <= beta) != (p_beta <= delta)
            assert not (disagree & (np.abs(u - beta) > 1e-12)).any()
            mismatches += int(disagree.sum())
    assert mismatches == 0


def test_hoeffding_is_never_looser_than_the_sub_gaussian_form():
    k, n = _all_counts(400)
    k, n = k[n > 0], n[n > 0]
    for delta in (0.5, 0.1, 1e-3):
        kl = ucb(k, n, delta, bound="hoeffding")
        sub_gaussian = np.minimum(1.0, k / n + np.sqrt(np.log(1 / delta) / (2 * n)))
        assert (kl <= sub_gaussian + 1e-15).all()
        # The gain reaches 0.135 near k = 0 at small n (up to 0.135 looser before).
        assert (sub_gaussian - kl).max() > 0.13


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((1, 10, 0.1), {"bound": "wilson"}, ValueError, "`bound` must be one of"),
        ((11, 10, 0.1), {}, ValueError, r"`k` must satisfy 0 <= k <= n\."),
        ((-1, 10, 0.1), {}, ValueError, r"`k` must satisfy 0 <= k <= n\."),
        ((0, -1, 0.1), {}, ValueError, r"`n` must be non-negative\."),
        ((1.5, 10, 0.1), {}, ValueError, "`k` must hold whole numbers"),
        ((1, np.nan, 0.1), {}, ValueError, "`n` must be finite"),
        ((True, 10, 0.1), {}, TypeError, "`k` must be an array of integers; got dtype bool"),
        (("3", 10, 0.1), {}, TypeError, "`k` must be an array of integers"),
        ((1, 10, 0.0), {}, ValueError, r"`delta` must lie in \(0, 1\); got 0\.0\."),
        ((1, 10, 1.0), {}, ValueError, r"`delta` must lie in \(0, 1\); got 1\.0\."),
        ((1, 10, np.nan), {}, ValueError, r"`delta` must lie in \(0, 1\)"),
        (([1, 2], [3, 4, 5], 0.1), {}, ValueError, "`k`, `n` and `delta` must broadcast"),
    ],
)
def test_ucb_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        ucb(*args, **kwargs)


def test_risk_p_value_bad_input():
    with pytest.raises(ValueError, match=r"`beta` must lie in \(0, 1\); got 1\.5\."):
        risk_p_value(1, 10, 1.5)
    with pytest.raises(ValueError, match="`bound` must be one of"):
        risk_p_value(1, 10, 0.1, bound="bonferroni")
    with pytest.raises(ValueError, match=r"`k` must satisfy 0 <= k <= n\."):
        risk_p_value(3, 2, 0.1)


@given(k=garbage_arrays(), n=garbage_arrays(), level=garbage_arrays(),
       bound=st.sampled_from(BOUNDS))
def test_garbage_input_gives_advcal_errors_or_clean_results(k, n, level, bound):
    for fn in (ucb, risk_p_value):
        out = own_error_or_result(fn, k, n, level, bound=bound)
        if out is not None:
            values = np.asarray(out)
            assert values.dtype == np.float64
            assert not np.isnan(values).any()
            assert ((values >= 0) & (values <= 1)).all()
