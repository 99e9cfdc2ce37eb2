"""Scale diagnostics and the direction cosine: hand-derived values,
definitions re-derived independently, layouts, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

import advcal
from advcal import (
    MethodDiagnostics,
    ScaleDiagnostics,
    direction_cosine,
    maxnorm,
    offsets_from_sizes,
    rloo,
    scale_diagnostics,
)
from advcal.cli import demo_reward_log
from advcal.diagnostics import DIAGNOSED_METHODS
from advcal.registry import REGISTRY, DiagnosticSettings
from tests.checks import own_error_or_result
from tests.strategies import FLOAT_DTYPES, garbage_arrays, ragged_batches

ALL_METHODS = ("grpo", "dr_grpo", "rloo", "maxnorm")
STAT_FIELDS = ("inverse_scale_p50", "inverse_scale_p95", "inverse_scale_p99",
               "inverse_scale_max", "beta_eff_min", "beta_eff_max", "reward_kl_ratio")




# --------------------------------------------------------------------------- hand-derived

REWARDS = np.array([[1.0, 0.0, 1.0, 0.0], [0.7, 0.7001, 0.7, 0.6999], [0.5, 0.5, 0.5, 0.5]])


def test_hand_example_all_methods():
    diag = scale_diagnostics(REWARDS, methods=ALL_METHODS, beta=0.04, tau_res=0.01, eps=1e-6)
    assert isinstance(diag, ScaleDiagnostics)
    assert list(diag.methods) == list(ALL_METHODS)
    assert diag.n_groups == 3 and diag.n_responses == 12
    # GRPO: group 0 std sqrt(1/3); group 1 deviations (0, 1e-4, 0, -1e-4): std sqrt(2e-8 / 3)
    s = np.array([np.sqrt(1 / 3), np.sqrt(2e-8 / 3)]) + 1e-6
    g = diag["grpo"]
    assert isinstance(g, MethodDiagnostics)
    np.testing.assert_allclose(g.inverse_scale, 1 / s, rtol=1e-9)
    np.testing.assert_allclose(g.inverse_scale_p50, np.mean(1 / s), rtol=1e-9)
    np.testing.assert_allclose(g.inverse_scale_p95, 1 / s[0] + 0.95 * (1 / s[1] - 1 / s[0]),
                               rtol=1e-9)
    np.testing.assert_allclose(g.inverse_scale_max, 1 / s[1], rtol=1e-9)
    np.testing.assert_allclose([g.beta_eff_min, g.beta_eff_max], 0.04 * s[::-1], rtol=1e-9)
    # mean |w| per group: 0.5 / s_q (every |u| is 0.5) and (1e-4 / 2) / s_q
    np.testing.assert_allclose(g.reward_kl_ratio, np.mean([0.5 / s[0], 0.5e-4 / s[1]]) / 0.04,
                               rtol=1e-9)
    np.testing.assert_allclose(g.max_abs_weight, 1e-4 / s[1], rtol=1e-6)
    assert g.zero_gap_fraction == pytest.approx(1 / 3) and g.n_informative == 2
    assert g.direction_cosine is None
    # Dr.GRPO and RLOO: scale 1
    for name, mean_abs in (("dr_grpo", [0.5, 0.5e-4]), ("rloo", [2 / 3, 4 / 3 * 0.5e-4])):
        d = diag[name]
        assert d.inverse_scale.tolist() == [1.0, 1.0]
        assert (d.inverse_scale_p50, d.inverse_scale_p99, d.inverse_scale_max) == (1, 1, 1)
        assert (d.beta_eff_min, d.beta_eff_max) == (0.04, 0.04)
        np.testing.assert_allclose(d.reward_kl_ratio, np.mean(mean_abs) / 0.04, rtol=1e-9)
    # MaxNorm: group 0 rloo u = +-2/3 -> s = 2/3; group 1 max|u| = 4/3 * 1e-4 < tau -> s = tau
    m = diag["maxnorm"]
    np.testing.assert_allclose(m.inverse_scale, [1.5, 100.0], rtol=1e-12)
    np.testing.assert_allclose([m.beta_eff_min, m.beta_eff_max], [0.04 * 0.01, 0.04 * 2 / 3],
                               rtol=1e-12)
    np.testing.assert_allclose(m.reward_kl_ratio,
                               np.mean([1.0, 4 / 3 * 0.5e-4 / 0.01]) / 0.04, rtol=1e-9)
    assert m.max_abs_weight == pytest.approx(1.0)


def test_resolution_lets_maxnorm_skip_jittered_groups():
    diag = scale_diagnostics(REWARDS, methods=("grpo", "maxnorm"), resolution=0.01)
    assert diag["grpo"].zero_gap_fraction == pytest.approx(1 / 3)
    assert diag["maxnorm"].zero_gap_fraction == pytest.approx(2 / 3)
    np.testing.assert_allclose(diag["maxnorm"].inverse_scale, [1.5])
    assert diag.resolution == 0.01


def test_no_informative_group_gives_documented_nan():
    diag = scale_diagnostics([[0.3, 0.3], [1.0, 1.0]], methods=ALL_METHODS)
    for d in diag.methods.values():
        assert d.zero_gap_fraction == 1.0 and d.n_informative == 0
        assert all(math.isnan(getattr(d, f)) for f in STAT_FIELDS)
        assert d.max_abs_weight == 0.0
    assert "n/a" in diag.table()


def test_grpo_tiny_gap_without_eps_is_informative():
    # A gap of 1e-300 has a std whose square underflows; the estimator rescales the group
    # and gives it +-1/sqrt(2), and the diagnostics count it with scale 1e-300/sqrt(2).
    rewards = np.array([[0.0, 1e-300], [0.0, 1.0]])
    np.testing.assert_allclose(advcal.grpo(rewards, eps=0.0)[0], [-(2**-0.5), 2**-0.5])
    diag = scale_diagnostics(rewards, methods=("grpo",), eps=0.0)["grpo"]
    assert diag.zero_gap_fraction == 0.0 and diag.n_informative == 2
    np.testing.assert_allclose(diag.inverse_scale, [np.sqrt(2.0) * 1e300, np.sqrt(2.0)])


def test_reference_scoring_adds_direction_cosine():
    same = scale_diagnostics(REWARDS, methods=ALL_METHODS, reference=REWARDS)
    for d in same.methods.values():
        assert d.direction_cosine == pytest.approx(1.0)
    flipped = scale_diagnostics(REWARDS, methods=("rloo",), reference=1.0 - REWARDS)
    assert flipped["rloo"].direction_cosine == pytest.approx(-1.0)
    # a reference with no gap anywhere has zero weights: no direction, NaN
    flat = scale_diagnostics(REWARDS, methods=("rloo",), reference=np.ones_like(REWARDS))
    assert math.isnan(flat["rloo"].direction_cosine)
    assert "cosine" in flat.table() and "n/a" in flat.table()
    # matches direction_cosine on the estimator outputs
    noisy = REWARDS + np.array([1e-3, -2e-3, 0.0, 5e-4])
    diag = scale_diagnostics(noisy, methods=("rloo", "maxnorm"), reference=REWARDS)
    assert diag["rloo"].direction_cosine == pytest.approx(
        direction_cosine(rloo(noisy), rloo(REWARDS)), abs=1e-12)
    assert diag["maxnorm"].direction_cosine == pytest.approx(
        direction_cosine(maxnorm(noisy, tau_res=0.01), maxnorm(REWARDS, tau_res=0.01)),
        abs=1e-12)


def test_table_lists_every_method_and_the_options():
    table = str(scale_diagnostics(REWARDS, methods=("maxnorm", "grpo"), tau_res=0.02))
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["method", "1/s", "P50"]
    assert lines[1].startswith("maxnorm") and lines[2].startswith("grpo")
    assert "MaxNorm cap 1/tau_res = 50" in lines[-1]
    assert "cosine" not in lines[0]


def test_singletons_and_empty_groups_enter_no_statistic():
    values = np.array([0.9, 0.0, 1.0, 0.2])
    diag = scale_diagnostics(values, offsets=[0, 1, 1, 3, 4], methods=("rloo", "maxnorm"))
    assert diag.n_groups == 1
    # the pair (0, 1): rloo u = 2 * (-0.5, 0.5) -> s = 1
    assert diag["maxnorm"].inverse_scale.tolist() == [1.0]
    assert diag["rloo"].zero_gap_fraction == 0.0


def test_paper_finding_on_the_demo_log():
    # On low-variance groups GRPO's inverse-scale tail is orders of magnitude above
    # MaxNorm's hard cap 1/tau_res, and jitter rotates GRPO's update direction more.
    noisy, clean = demo_reward_log(0)
    diag = scale_diagnostics(noisy, tau_res=0.01, reference=clean)
    assert diag["grpo"].inverse_scale_p99 >= 10 * 100
    assert diag["maxnorm"].inverse_scale_max <= 100.0
    assert diag["maxnorm"].inverse_scale_p99 == pytest.approx(100.0)
    assert diag["grpo"].direction_cosine < diag["maxnorm"].direction_cosine
    assert diag["maxnorm"].beta_eff_min >= 0.04 * 0.01


# --------------------------------------------------------------------------- properties


def independent_grpo_inverse_scales(values, offsets, eps):
    out = []
    for q in range(len(offsets) - 1):
        r = values[offsets[q]:offsets[q + 1]].astype(np.float64)
        if r.size >= 2 and r.min() != r.max():
            out.append(1.0 / (np.std(r, ddof=1) + eps))
    return np.array(out)


@given(batch=ragged_batches(min_size=0), tau=st.floats(1e-3, 10.0),
       beta=st.floats(1e-3, 1.0), eps=st.sampled_from([1e-6, 1e-4, 0.0]))
def test_definitions_hold_on_random_batches(batch, tau, beta, eps):
    sizes = batch.sizes
    if not (sizes >= 2).any():
        with pytest.raises(ValueError, match="no group with two or more responses"):
            scale_diagnostics(batch.values, batch.offsets)
        return
    diag = scale_diagnostics(batch.values, batch.offsets, methods=ALL_METHODS, beta=beta,
                             tau_res=tau, eps=eps)
    groups = [batch.values[batch.offsets[q]:batch.offsets[q + 1]] for q in range(sizes.size)]
    scorable = [g for g in groups if g.size >= 2]
    zero_gap = np.mean([g.min() == g.max() for g in scorable])
    # grpo also skips a group whose std is 0 although it has a gap: with eps = 0, a
    # subnormal gap squares to 0 (the fraction counts what a method skips).
    skipped = {"grpo": np.mean([
        g.min() == g.max() or (eps == 0.0 and np.std(g.astype(np.float64), ddof=1) == 0)
        for g in scorable
    ])}
    for name, d in diag.methods.items():
        assert d.zero_gap_fraction == pytest.approx(skipped.get(name, zero_gap))
        assert d.n_informative == round(len(scorable) * (1 - d.zero_gap_fraction))
        if d.n_informative:
            assert d.inverse_scale_p50 <= d.inverse_scale_p95 <= d.inverse_scale_p99 \
                <= d.inverse_scale_max
            assert d.beta_eff_min <= d.beta_eff_max
            assert d.reward_kl_ratio >= 0
    m = diag["maxnorm"]
    assert np.all(m.inverse_scale <= 1.0 / tau)
    assert m.max_abs_weight <= 1.0
    if m.n_informative:
        assert m.beta_eff_min >= beta * tau
    for name in ("rloo", "dr_grpo"):
        assert np.all(diag[name].inverse_scale == 1.0)
    if eps > 0:
        np.testing.assert_allclose(
            diag["grpo"].inverse_scale,
            independent_grpo_inverse_scales(batch.values, batch.offsets, eps), rtol=1e-6)


@given(batch=ragged_batches(min_size=2, max_groups=6), seed=st.integers(0, 2**32 - 1))
def test_layouts_agree(batch, seed):
    if batch.sizes.size == 0:
        return
    diag = scale_diagnostics(batch.values, batch.offsets, methods=ALL_METHODS)
    labels = np.repeat(np.arange(batch.sizes.size), batch.sizes)
    perm = np.random.default_rng(seed).permutation(batch.values.size)
    by_ids = scale_diagnostics(batch.values[perm], group_ids=labels[perm], methods=ALL_METHODS)
    for name in ALL_METHODS:
        a, b = diag[name], by_ids[name]
        assert a.zero_gap_fraction == b.zero_gap_fraction
        for f in STAT_FIELDS:
            np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=1e-5)
    if np.all(batch.sizes == batch.sizes[0]):
        dense = scale_diagnostics(batch.values.reshape(batch.sizes.size, -1),
                                  methods=ALL_METHODS)
        for name in ALL_METHODS:
            np.testing.assert_array_equal(dense[name].inverse_scale, diag[name].inverse_scale)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_float32_and_float64(dtype):
    diag = scale_diagnostics(REWARDS.astype(dtype), methods=ALL_METHODS)
    ref = scale_diagnostics(REWARDS, methods=ALL_METHODS)
    for name in ALL_METHODS:
        np.testing.assert_allclose(diag[name].inverse_scale, ref[name].inverse_scale,
                                   rtol=1e-2 if name == "grpo" else 1e-6)


def test_numpy_backend_agrees():
    a = scale_diagnostics(REWARDS, methods=ALL_METHODS, reference=REWARDS[::-1])
    b = scale_diagnostics(REWARDS, methods=ALL_METHODS, reference=REWARDS[::-1],
                          backend="numpy")
    for name in ALL_METHODS:
        for f in (*STAT_FIELDS, "direction_cosine", "max_abs_weight"):
            np.testing.assert_allclose(getattr(a[name], f), getattr(b[name], f), rtol=1e-9)


# --------------------------------------------------------------------------- direction cosine


def test_direction_cosine_hand_examples():
    # (1, -1, 0) . (1, 0, -1) = 1; norms sqrt(2) each
    assert direction_cosine([[1.0, -1.0, 0.0]], [[1.0, 0.0, -1.0]]) == pytest.approx(0.5)
    assert direction_cosine([3.0, 4.0], [4.0, -3.0]) == pytest.approx(0.0, abs=1e-15)
    assert direction_cosine([1.0, 2.0], [-2.0, -4.0]) == -1.0
    # no overflow or underflow for extreme magnitudes
    assert direction_cosine([1e300, 1e300], [1e-300, 1e-300]) == pytest.approx(1.0)


@pytest.mark.parametrize(("a", "b", "error", "message"), [
    ([0.0, 0.0], [1.0, 2.0], ValueError, r"`w_a` is a zero \(or empty\) vector"),
    ([1.0, 2.0], [0.0, 0.0], ValueError, r"`w_b` is a zero \(or empty\) vector"),
    ([], [], ValueError, r"`w_a` is a zero \(or empty\) vector"),
    ([1.0, 2.0], [1.0, 2.0, 3.0], ValueError,
     r"`w_a` and `w_b` must have the same shape; got \(2,\) and \(3,\)\."),
    ([1.0, np.nan], [1.0, 2.0], ValueError, r"`w_a` must be finite\."),
    ([1.0, 2.0], [np.inf, 2.0], ValueError, r"`w_b` must be finite\."),
    (["a", "b"], [1.0, 2.0], TypeError, r"`w_a` must be an array of real numbers"),
])
def test_direction_cosine_errors(a, b, error, message):
    with pytest.raises(error, match=message):
        direction_cosine(a, b)


finite_vectors = st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30)


@given(a=finite_vectors, data=st.data(), c=st.floats(1e-3, 1e3))
def test_direction_cosine_properties(a, data, c):
    b = data.draw(st.lists(st.floats(-1e6, 1e6), min_size=len(a), max_size=len(a)))
    a, b = np.array(a), np.array(b)
    if not (np.any(a) and np.any(b)):
        return
    cos = direction_cosine(a, b)
    assert -1.0 <= cos <= 1.0
    assert direction_cosine(b, a) == pytest.approx(cos, abs=1e-12)
    assert direction_cosine(c * a, b) == pytest.approx(cos, abs=1e-12)
    assert direction_cosine(-a, b) == pytest.approx(-cos, abs=1e-12)
    assert direction_cosine(a, a) == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"methods": ("grpo", "ppo")}, ValueError,
     r"`methods` must be one of 'grpo', 'dr_grpo', .*, 'huber_scale'; got 'ppo'\."),
    ({"methods": ()}, ValueError, r"`methods` must name at least one estimator\."),
    ({"methods": ("rloo", "rloo")}, ValueError, r"`methods` must not repeat a name"),
    ({"methods": 3}, TypeError, r"`methods` must be a sequence of estimator names; got int\."),
    ({"beta": 0.0}, ValueError, r"`beta` must lie in \(0\.0, inf\]; got 0\.0\."),
    ({"tau_res": -1.0}, ValueError, r"`tau_res` must lie in \(0\.0, inf\]"),
    ({"eps": -1.0}, ValueError, r"`eps` must lie in \[0\.0, inf\]"),
    ({"resolution": 2.0}, ValueError, r"`resolution` must lie in \(0\.0, 1\.0\]"),
    ({"reference": [[1.0]]}, ValueError, r"`reference` must have shape \(3, 4\); got \(1, 1\)"),
    ({"reference": np.full((3, 4), np.nan)}, ValueError, r"`reference` must be finite"),
    ({"backend": "gpu"}, ValueError, r"`backend` must be one of"),
])
def test_option_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        scale_diagnostics(REWARDS, **kwargs)


def test_rewards_errors():
    with pytest.raises(ValueError, match=r"`rewards` must be finite \(NaN or inf found\)\."):
        scale_diagnostics([[0.0, np.nan]])
    with pytest.raises(ValueError, match="no group with two or more responses"):
        scale_diagnostics([0.1, 0.2], offsets=[0, 1, 2])
    with pytest.raises(ValueError, match=r"`rewards` must lie in `bounds`"):
        scale_diagnostics([[0.0, 2.0]], resolution=0.1)


@given(rewards=garbage_arrays(), offsets=st.one_of(st.none(), garbage_arrays()),
       reference=st.one_of(st.none(), garbage_arrays()),
       tau=st.one_of(st.floats(), st.just(0.01)), beta=st.one_of(st.floats(), st.just(0.04)),
       eps=st.one_of(st.floats(), st.sampled_from([0.0, 1e-6])))
def test_garbage_input_gives_only_advcal_errors(rewards, offsets, reference, tau, beta, eps):
    diag = own_error_or_result(scale_diagnostics, rewards, offsets, methods=ALL_METHODS,
                               tau_res=tau, beta=beta, eps=eps, reference=reference)
    if diag is not None:
        for d in diag.methods.values():
            if d.n_informative:
                assert not any(math.isnan(getattr(d, f)) for f in STAT_FIELDS)
            assert not math.isnan(d.max_abs_weight) and not math.isnan(d.zero_gap_fraction)
    own_error_or_result(direction_cosine, rewards, reference)


def test_sizes_helper_used_in_examples():
    offsets = offsets_from_sizes([2, 3])
    diag = scale_diagnostics([0.0, 1.0, 0.2, 0.2, 0.2], offsets, methods=("maxnorm",))
    assert diag["maxnorm"].zero_gap_fraction == 0.5


# --------------------------------------------------------------------------- every estimator

# Ragged hand example: A = [1, 0, 0, 0] (mean 1/4, u = [3/4, -1/4, -1/4, -1/4], sum u^2 = 3/4,
# std 1/2), B = [1/2, 1/2] (constant), C = [3, 1] (mean 2, u = [1, -1], std sqrt 2).  The
# batch of 8 has mean 3/4 and sum of squared deviations 7, so its std (ddof 1) is 1; 5 of
# the 8 rewards are nonzero.
HAND = np.array([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 3.0, 1.0])
HAND_OFFSETS = np.array([0, 4, 6, 8])
HAND_LENGTHS = np.array([1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 1.0, 3.0])
HAND_OPTIONS = {"reinforce_pp_baseline": {"eps": 0.0}, "opo": {"lengths": HAND_LENGTHS}}
U = np.array([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 1.0, -1.0])  # group-centred rewards
# E[clip(Z, -c, c)^2] for a standard normal Z (Huber's consistency constant), c = 1.345:
# the integral of z^2 phi over [-c, c] (= 2 Phi(c) - 1 - 2 c phi(c), by parts) plus c^2 times
# the two tails.
_C = 1.345
HUBER_KAPPA = float(2 * stats.norm.cdf(_C) - 1 - 2 * _C * stats.norm.pdf(_C)
                    + 2 * _C ** 2 * stats.norm.sf(_C))
# Per estimator: (its u, its scale s_q of groups A, B, C, its informative groups).  B is
# constant, so nobody learns from it; s_B is whatever the estimator's rule gives.
HAND_SCALES = {
    "grpo": (U, [0.5, 0.0, math.sqrt(2.0)], [True, False, True]),
    "dr_grpo": (U, [1.0, 1.0, 1.0], [True, False, True]),
    # u = r - mean of the others: A: 1 - 0, 0 - 1/3; C: 3 - 1, 1 - 3.
    "rloo": (np.array([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 2.0, -2.0]), [1.0, 1.0, 1.0],
             [True, False, True]),
    "batch_std": (U, [1.0, 1.0, 1.0], [True, False, True]),
    # Unit token counts: m = 0 (every group's u sums to 0); v = (3/4 + 2) / 8 * 8/7 = 11/28.
    "reinforce_pp_baseline": (U, [math.sqrt(11 / 28)] * 3, [True, False, True]),
    # C's lengths 1, 3: baseline (3 + 3) / 4 = 3/2, u = [3/2, -1/2].
    "opo": (np.array([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 1.5, -0.5]), [1.0, 1.0, 1.0],
            [True, False, True]),
    "gpg": (U, [5 / 8] * 3, [True, False, True]),
    # The best response gets r_max - r_2nd: A 1 - 0, C 3 - 1.
    "passk": (np.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0]), [0.5, 0.0, math.sqrt(2.0)],
              [True, False, True]),
    # RLOO baseline: A [1, -1/3, ...], max |u| = 1; C [2, -2]; B gets tau_res.
    "maxnorm": (np.array([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 2.0, -2.0]),
                [1.0, 0.01, 2.0], [True, False, True]),
    "range": (U, [1.0, 1.0, 1.0], [True, False, True]),
    # The MaxNorm paper's baselines (eps = 0).  p90: 0.9-quantile of the stds 1/2 and
    # sqrt 2 of A and C (B has none): 1/2 + 0.9 (sqrt 2 - 1/2).
    "p90_scale": (U, [0.5 + 0.9 * (math.sqrt(2.0) - 0.5)] * 3, [True, False, True]),
    "grpo_kl_comp": (U, [0.5, 0.0, math.sqrt(2.0)], [True, False, True]),
    # MAD: A's median is 0 and 3 of 4 deviations are 0, so MAD 0 and A is skipped (no
    # finite weight); C: median 2, MAD 1.
    "mad_scale": (U, [0.0, 0.0, 1.482602218505602], [False, False, True]),
    # Huber (c = 1.345): C's residuals +-1 are not clipped, s = 1/sqrt(kappa); A's 3/4 is,
    # s^2 (kappa - c^2/4) = 3 (1/4)^2 / 4.
    "huber_scale": (U, [math.sqrt(3 / 64 / (HUBER_KAPPA - 1.345 ** 2 / 4)), 0.0,
                        1 / math.sqrt(HUBER_KAPPA)], [True, False, True]),
}
# KL weights of the estimators that set a per-group KL coefficient (beta_q = beta * w_q).
HAND_KL = {"grpo_kl_comp": [2.0, np.inf, 1 / math.sqrt(2.0)]}


def hand_weights(u, scale):
    """u / s_q response by response (0 where s_q = 0: only the constant group B)."""
    s = np.repeat(np.asarray(scale, dtype=np.float64), [4, 2, 2])
    return np.divide(u, s, out=np.zeros_like(u), where=s > 0)


def test_hand_scales_cover_the_registry():
    assert tuple(HAND_SCALES) == tuple(advcal.ESTIMATORS) == DIAGNOSED_METHODS


@pytest.mark.parametrize("method", tuple(HAND_SCALES))
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_every_estimator_has_its_hand_derived_scale(method, backend):
    u, scale, informative = HAND_SCALES[method]
    settings = DiagnosticSettings(eps=0.0, tau_res=0.01, resolution=None, backend=backend)
    got = REGISTRY[method].scale(HAND, HAND_OFFSETS, settings,
                                 dict(HAND_OPTIONS.get(method, {})))
    np.testing.assert_allclose(got.scale, scale, rtol=1e-12)
    np.testing.assert_array_equal(got.informative, informative)
    if method in HAND_KL:
        np.testing.assert_allclose(got.kl_weight, HAND_KL[method], rtol=1e-12)
    else:
        assert got.kl_weight is None
    # The weights are u / s_q, group by group.
    np.testing.assert_allclose(got.weights, hand_weights(u, scale), rtol=1e-12, atol=1e-15)


def test_scale_diagnostics_takes_every_registered_estimator():
    diag = scale_diagnostics(HAND, HAND_OFFSETS, methods=tuple(advcal.ESTIMATORS), eps=0.0,
                             options=HAND_OPTIONS, beta=0.5)
    assert tuple(diag.methods) == tuple(advcal.ESTIMATORS)
    for method, (u, scale, informative) in HAND_SCALES.items():
        d = diag[method]
        kept = np.asarray(scale)[informative]
        kl = np.asarray(HAND_KL.get(method, [1.0] * 3))[informative]
        np.testing.assert_allclose(d.inverse_scale, 1.0 / kept, rtol=1e-12)
        beta_eff = 0.5 * kl * kept
        np.testing.assert_allclose([d.beta_eff_min, d.beta_eff_max],
                                   [beta_eff.min(), beta_eff.max()], rtol=1e-12)
        assert d.zero_gap_fraction == pytest.approx(1 - np.mean(informative))
        # R/KL = mean over informative groups of mean_i |w_i| / beta_q.
        w = np.abs(hand_weights(u, scale))
        per_group = np.array([w[:4].mean(), w[4:6].mean(), w[6:].mean()])[informative]
        assert d.reward_kl_ratio == pytest.approx(np.mean(per_group / (0.5 * kl)), rel=1e-12)
    assert "reinforce_pp_baseline" in diag.table()


def test_defaults_without_options():
    # Without lengths OPO's baseline is the group mean (Dr.GRPO's weights), and range takes
    # the points as ranges [r, r] (Dr.GRPO's weights too).
    diag = scale_diagnostics(HAND, HAND_OFFSETS, methods=("opo", "range", "dr_grpo"),
                             reference=HAND[::-1].copy())
    assert diag["opo"].reward_kl_ratio == diag["dr_grpo"].reward_kl_ratio
    assert diag["range"].direction_cosine == pytest.approx(diag["dr_grpo"].direction_cosine)


def test_range_with_ranges_skips_groups_without_direction():
    lo = np.array([0.0, 0.5, 0.2, 0.9])
    hi = np.array([0.6, 0.7, 0.4, 1.0])
    # Group 1 ranges overlap (no direction); group 2's are disjoint: A = [-0.25, 0.25].
    diag = scale_diagnostics(np.array([0.3, 0.6, 0.3, 0.95]), [0, 2, 4], methods=("range",),
                             options={"range": {"lo": lo, "hi": hi}})
    assert diag["range"].zero_gap_fraction == 0.5
    assert diag["range"].max_abs_weight == pytest.approx(0.25)


def test_passk_skips_a_tie_for_the_best_reward():
    diag = scale_diagnostics([[1.0, 1.0, 0.0], [1.0, 0.5, 0.0]], methods=("passk",), eps=0.0)
    assert diag["passk"].zero_gap_fraction == 0.5
    np.testing.assert_allclose(diag["passk"].inverse_scale, [2.0])  # std of [1, 0.5, 0] = 1/2


def test_per_method_options_are_gathered_into_group_order():
    # The same batch by group_ids in a shuffled order: per-response options follow.
    perm = np.array([6, 0, 4, 1, 7, 2, 5, 3])
    labels = np.repeat([0, 1, 2], [4, 2, 2])
    by_ids = scale_diagnostics(HAND[perm], group_ids=labels[perm], methods=("opo",),
                               options={"opo": {"lengths": HAND_LENGTHS[perm]}})
    by_offsets = scale_diagnostics(HAND, HAND_OFFSETS, methods=("opo",),
                                   options={"opo": {"lengths": HAND_LENGTHS}})
    assert by_ids["opo"].reward_kl_ratio == pytest.approx(by_offsets["opo"].reward_kl_ratio)


@pytest.mark.parametrize(("options", "error", "message"), [
    ([1], TypeError, r"`options` must be a mapping of method name to keyword options"),
    ({"gpg": {}}, ValueError, r"`options` has keywords for 'gpg', which is not one of"),
    ({"opo": 3}, TypeError, r"`options\['opo'\]` must be a mapping of keywords; got int\."),
    ({"opo": {"lengths": [1.0]}}, ValueError,
     r"`options\['opo'\]\['lengths'\]` must have shape \(8,\); got \(1,\)\."),
    ({"opo": {"backend": "numpy"}}, ValueError, r"must not set 'backend'"),
    ({"range": {"lo": HAND}}, TypeError, r"needs both `lo` and `hi`, or neither"),
])
def test_options_errors(options, error, message):
    with pytest.raises(error, match=message):
        scale_diagnostics(HAND, HAND_OFFSETS, methods=("opo", "range"), options=options)


def test_every_estimator_without_options_on_both_engines():
    every = tuple(advcal.ESTIMATORS)
    a = scale_diagnostics(REWARDS, methods=every, reference=REWARDS[::-1])
    b = scale_diagnostics(REWARDS, methods=every, reference=REWARDS[::-1], backend="numpy")
    assert tuple(a.methods) == every
    for name in every:
        for f in (*STAT_FIELDS, "direction_cosine", "max_abs_weight", "zero_gap_fraction"):
            np.testing.assert_allclose(getattr(a[name], f), getattr(b[name], f), rtol=1e-9)
