"""The MaxNorm-AC paper's baselines (advcal.baselines): hand-derived values, layouts and
engines, and the qualitative ordering of the paper's Table 3 on a seeded reward log."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import advcal
from advcal import ESTIMATORS, offsets_from_sizes, scale_diagnostics
from advcal.baselines import grpo_kl_comp, huber_scale, mad_scale, p90_scale
from advcal.cli import demo_reward_log

BASELINES = ("p90_scale", "grpo_kl_comp", "mad_scale", "huber_scale")


def kappa(c: float) -> float:
    """E[clip(Z, -c, c)^2], Z standard normal: 2 Phi(c) - 1 - 2 c phi(c) + 2 c^2 (1 - Phi(c))."""
    return float(2 * stats.norm.cdf(c) - 1 - 2 * c * stats.norm.pdf(c)
                 + 2 * c * c * stats.norm.sf(c))


def test_p90_by_hand() -> None:
    # Group stds (ddof 1): [0, 2] -> sqrt 2, [1, 1] -> 0 (left out), [0, 1, 2] -> 1,
    # [5, 5, 7] -> 2/sqrt 3.  Quantile 0.5 of (1, 2/sqrt 3, sqrt 2) is 2/sqrt 3.
    r = [0.0, 2.0, 1.0, 1.0, 0.0, 1.0, 2.0, 5.0, 5.0, 7.0]
    offsets = [0, 2, 4, 7, 10]
    s = 2 / math.sqrt(3)
    u = np.array([-1.0, 1.0, 0.0, 0.0, -1.0, 0.0, 1.0, -2 / 3, -2 / 3, 4 / 3])
    np.testing.assert_allclose(p90_scale(r, offsets, quantile=0.5, eps=0.0), u / s,
                               rtol=1e-13)
    np.testing.assert_allclose(p90_scale(r, offsets, quantile=0.5, eps=0.1), u / (s + 0.1),
                               rtol=1e-13)
    # Default 0.9 quantile: 2/sqrt 3 + 0.8 (sqrt 2 - 2/sqrt 3).
    s90 = s + 0.8 * (math.sqrt(2) - s)
    np.testing.assert_allclose(p90_scale(r, offsets, eps=0.0), u / s90, rtol=1e-13)
    # No group with a gap: all zero.
    assert (p90_scale([[1.0, 1.0], [2.0, 2.0]]) == 0).all()


def test_grpo_kl_comp_by_hand() -> None:
    r = np.array([[0.0, 1.0, 2.0], [3.0, 3.0, 3.0]])
    out = grpo_kl_comp(r, eps=0.0, return_kl_weight=True)
    np.testing.assert_array_equal(out.advantages, advcal.grpo(r, eps=0.0))
    assert out.kl_weight[0] == 1.0 and out.kl_weight[1] == np.inf  # std 1; constant group
    np.testing.assert_array_equal(grpo_kl_comp(r), advcal.grpo(r))
    np.testing.assert_allclose(grpo_kl_comp(r, return_kl_weight=True).kl_weight,
                               [1 / (1 + 1e-6), 1e6])


def test_mad_by_hand() -> None:
    # [0, 1, 2, 5]: median 1.5, deviations 1.5, 0.5, 0.5, 3.5 -> MAD 1; mean 2.
    # [0, 0, 0, 1]: MAD 0 -> divided by eps alone (skipped with eps = 0).
    r = np.array([[0.0, 1.0, 2.0, 5.0], [0.0, 0.0, 0.0, 1.0]])
    s = 1.482602218505602  # 1 / Phi^-1(3/4)
    assert s == pytest.approx(1 / stats.norm.ppf(0.75), rel=1e-15)
    got = mad_scale(r, eps=0.0)
    np.testing.assert_allclose(got[0], np.array([-2.0, -1.0, 0.0, 3.0]) / s, rtol=1e-13)
    assert (got[1] == 0).all()
    np.testing.assert_allclose(mad_scale(r, eps=1e-3)[1], [-250.0, -250.0, -250.0, 750.0],
                               rtol=1e-12)


def test_huber_by_hand() -> None:
    # [0, 1]: u = +-1/2, nothing clipped: s = sqrt(mean u^2 / kappa), w = +-sqrt(kappa).
    k = kappa(1.345)
    np.testing.assert_allclose(huber_scale([[0.0, 1.0]], eps=0.0), [[-math.sqrt(k),
                                                                      math.sqrt(k)]],
                               rtol=1e-12)
    # [1, 0, 0, 0]: u = [3/4, -1/4 x 3], 3/4 clipped: s^2 (4 kappa - c^2) = 3/16.
    s = math.sqrt(3 / 16 / (4 * k - 1.345 ** 2))
    assert 0.25 < 1.345 * s < 0.75
    np.testing.assert_allclose(huber_scale([[1.0, 0.0, 0.0, 0.0]], eps=0.0),
                               [[0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s]], rtol=1e-12)
    # A large c clips nothing: the scale is the ddof-0 std / sqrt(kappa(c)).
    r = np.array([[0.1, 0.4, 0.2, 0.9, 0.5]])
    u = r - r.mean()
    np.testing.assert_allclose(huber_scale(r, c=10.0, eps=0.0),
                               u / (u.std() / math.sqrt(kappa(10.0))), rtol=1e-12)
    # An outlier: Huber's scale is smaller than the std, so the bulk gets larger weights.
    r = np.array([[0.50, 0.51, 0.49, 0.50, 0.52, 0.48, 0.50, 0.95]])
    assert abs(huber_scale(r, eps=0.0)[0, 0]) > abs(advcal.grpo(r, eps=0.0, ddof=0)[0, 0])


@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layouts_and_engines_agree(name: str, dtype: type) -> None:
    rng = np.random.default_rng(3)
    sizes = np.array([4, 1, 3, 5, 2, 4])
    flat = np.round(rng.random(sizes.sum()), 2).astype(dtype)
    flat[:4] = [0.5, 0.5, 0.5, 0.9]  # MAD 0 group
    offsets = offsets_from_sizes(sizes)
    fn = ESTIMATORS[name]
    ragged = fn(flat, offsets, backend="numba")
    assert ragged.dtype == dtype and ragged.shape == flat.shape
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(fn(flat, offsets, backend="numpy"), ragged, rtol=rtol)
    labels = np.repeat(np.array(["a", "b", "c", "d", "e", "f"]), sizes)
    perm = rng.permutation(flat.size)
    by_ids = fn(flat[perm], group_ids=labels[perm])
    np.testing.assert_allclose(by_ids, ragged[perm], rtol=rtol)  # order within a group
    dense = np.round(rng.random((5, 6)), 2).astype(dtype)
    rows = fn(dense)
    np.testing.assert_allclose(rows.ravel(), fn(dense.ravel(), offsets_from_sizes([6] * 5)),
                               rtol=1e-6 if dtype == np.float32 else 1e-15)
    # Centred, zero for a singleton and for a constant group, translation invariant.
    w = ragged.astype(np.float64)
    sums = np.add.reduceat(w, offsets[:-1])
    peak = np.maximum.reduceat(np.abs(w), offsets[:-1])
    tol = 1e-6 if dtype == np.float32 else 1e-14
    assert (np.abs(sums) <= tol * 8 * np.maximum(peak, 1.0)).all(), (sums, peak)
    assert ragged[4] == 0
    assert (fn([[0.3, 0.3, 0.3]]) == 0).all()
    np.testing.assert_allclose(fn(dense + dtype(0.25)), rows, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", BASELINES)
def test_nan_omit_and_raw_singletons(name: str) -> None:
    fn = ESTIMATORS[name]
    r = np.array([[0.1, np.nan, 0.7, 0.4], [0.2, 0.9, 0.5, 0.3]])
    omitted = fn(r, nan_policy="omit")
    assert omitted[0, 1] == 0
    # The NaN response is left out of its group's statistics.
    ragged = fn(np.array([0.1, 0.7, 0.4, 0.2, 0.9, 0.5, 0.3]), [0, 3, 7])
    np.testing.assert_allclose(omitted[0, [0, 2, 3]], ragged[:3], rtol=1e-12)
    with pytest.raises(ValueError, match="NaN"):
        fn(r)
    lone = fn(np.array([0.4, 0.2, 0.6]), [0, 1, 3], singleton="raw")
    # A raw lone response keeps its score over GRPO's lone scale 1 + eps, or over the
    # batch scale (p90, like batch_std): here the std of [0.2, 0.6].
    scale = (math.sqrt(0.08) if name == "p90_scale" else 1.0) + 1e-6
    assert lone[0] == pytest.approx(0.4 / scale, rel=1e-12)


@pytest.mark.parametrize("name, bad, error", [
    ("p90_scale", {"quantile": 1.5}, ValueError),
    ("p90_scale", {"eps": -1.0}, ValueError),
    ("mad_scale", {"eps": float("nan")}, ValueError),
    ("huber_scale", {"c": 0.0}, ValueError),
    ("grpo_kl_comp", {"return_kl_weight": 1}, TypeError),
    ("huber_scale", {"backend": "gpu"}, ValueError),
])
def test_bad_options(name: str, bad: dict, error: type) -> None:
    key = next(iter(bad))
    with pytest.raises(error, match=key):
        ESTIMATORS[name]([[0.0, 1.0]], **bad)


def test_table3_ordering() -> None:
    """The qualitative ordering of the MaxNorm-AC paper's Table 3 on a seeded reward log
    (sub-resolution jitter on low-variance groups, clean rewards as the reference).

    Paper: GRPO's inverse scale P95/P99 980/3100 vs MaxNorm 100/100 (tau_res = 0.01),
    R/KL 3.10 vs 1.72, direction cosine 0.61 vs 0.88."""
    noisy, clean = demo_reward_log(0)
    methods = ("grpo", "grpo_kl_comp", "p90_scale", "mad_scale", "huber_scale", "dr_grpo",
               "rloo", "maxnorm")
    d = scale_diagnostics(noisy, methods=methods, reference=clean, tau_res=0.01, beta=0.04)
    print(d)
    g, m = d["grpo"], d["maxnorm"]
    # GRPO's 1/s tail is orders of magnitude above MaxNorm's cap 1/tau_res.
    assert g.inverse_scale_p95 > 10 * m.inverse_scale_p95
    assert g.inverse_scale_p99 > 10 * m.inverse_scale_p99
    assert m.inverse_scale_max <= 100 + 1e-9
    # Reward-to-KL: GRPO inflates it; MaxNorm stays below; the beta_q compensation brings
    # GRPO's effective KL back to beta (so R/KL equals the unscaled Dr.GRPO's).
    assert g.reward_kl_ratio > m.reward_kl_ratio
    c = d["grpo_kl_comp"]
    assert c.beta_eff_min == pytest.approx(0.04) and c.beta_eff_max == pytest.approx(0.04)
    assert g.beta_eff_min < 1e-3 * 0.04
    assert c.reward_kl_ratio == pytest.approx(d["dr_grpo"].reward_kl_ratio, rel=1e-9)
    # ... but it keeps GRPO's weights: the same inverse-scale tail and direction.
    assert c.inverse_scale_p99 == g.inverse_scale_p99
    assert c.direction_cosine == pytest.approx(g.direction_cosine)
    # Direction: MaxNorm follows the clean rewards better than GRPO.
    assert m.direction_cosine > g.direction_cosine
    # Robust scales do not fix the amplification: MAD's tail is worse than GRPO's (ties
    # give MAD 0), Huber's is of GRPO's order; the batch-wide p90 scale has no tail.
    assert d["mad_scale"].inverse_scale_p99 >= g.inverse_scale_p99
    assert d["huber_scale"].inverse_scale_p99 > 10 * m.inverse_scale_p99
    assert d["huber_scale"].direction_cosine < m.direction_cosine
    p90 = d["p90_scale"]
    assert p90.inverse_scale_p50 == p90.inverse_scale_max
