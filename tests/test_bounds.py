"""Risk bounds (DESIGN §6.4): closed forms, scipy agreement, coverage, p-value validity."""

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


def test_hoeffding_by_hand():
    # 3/20 + sqrt(log(1/0.1) / 40) = 0.15 + 0.2399263...
    assert ucb(3, 20, 0.1, bound="hoeffding") == pytest.approx(0.3899263, abs=1e-7)
    assert ucb(19, 20, 0.1, bound="hoeffding") == 1.0  # capped
    assert ucb(0, 0, 0.1, bound="hoeffding") == 1.0


def test_bentkus_is_clopper_pearson_at_delta_over_e_and_hb_is_the_min():
    k = np.array([0, 1, 5, 20, 99])
    n = np.array([10, 10, 50, 100, 100])
    np.testing.assert_allclose(ucb(k, n, 0.1, bound="bentkus"), ucb(k, n, 0.1 / math.e))
    np.testing.assert_array_equal(
        ucb(k, n, 0.1, bound="hoeffding-bentkus"),
        np.minimum(ucb(k, n, 0.1, bound="bentkus"), ucb(k, n, 0.1, bound="hoeffding")),
    )
    # At k = 0 the binomial tail is far tighter than Hoeffding's sub-Gaussian bound.
    assert ucb(0, 100, 0.1, bound="bentkus") < ucb(0, 100, 0.1, bound="hoeffding")


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
       delta=st.floats(0.001, 0.999))
def test_p_value_and_ucb_agree(n, data, beta, delta):
    k = data.draw(st.integers(0, n))
    for bound in ("clopper-pearson", "bentkus"):
        p = risk_p_value(k, n, beta, bound=bound)
        u = ucb(k, n, delta, bound=bound)
        # Exact duality, away from the boundary where rounding decides.
        if abs(p - delta) > 1e-9 and abs(u - beta) > 1e-9:
            assert (p <= delta) == (u <= beta)
    # The KL tail dominates the sqrt form (Pinsker): a Hoeffding UCB below beta
    # implies a Hoeffding p-value below delta.
    if ucb(k, n, delta, bound="hoeffding") < beta - 1e-12:
        assert risk_p_value(k, n, beta, bound="hoeffding") <= delta + 1e-12


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
