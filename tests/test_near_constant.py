"""Near-constant groups and rewards of extreme magnitude: hand-derived advantages, and the
numba engine against the numpy oracle.

A group ``c * [1, 1 + u, 1, 1]`` (``u`` one ulp of 1, ``c`` a power of two) has mean
``c * (1 + u / 4)`` and deviations ``c * u * [-1, 3, -1, -1] / 4``: everything below
follows from that.  The numba kernels used to fold ``(r - shift) - mean`` into
``r - (shift + mean)``, which rounds the mean of such a group away.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import advcal
from advcal.baselines import grpo_kl_comp, huber_scale, p90_scale

DTYPES = [np.float32, np.float64]
# Powers of two: c * (1 + u) is exact, and so is every value below, times c (float32
# holds no 2**600).
DTYPE_SCALES = [(np.float32, 1.0), (np.float64, 1.0), (np.float64, 2.0 ** -600),
                (np.float64, 2.0 ** 600)]


def _ulp(dtype) -> float:
    return float(np.finfo(dtype).eps)


def _group(dtype, scale=1.0, n=4, at=1):
    """``scale * [1, ..., 1 + u, ..., 1]`` (one ulp at position ``at``) in ``dtype``."""
    r = np.full((1, n), 1.0)
    r[0, at] += _ulp(dtype)
    return (r * scale).astype(dtype)


def _close(got, expected, dtype, ulps=8):
    """Equal up to a few roundings of the output dtype, relative to the largest value
    (the centred values are exact; the mean and the scale carry a few roundings)."""
    expected = np.asarray(expected, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    atol = ulps * _ulp(dtype) * float(np.max(np.abs(expected), initial=0.0))
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


# ---------------------------------------------------------------------------------------
# Near-constant groups, hand-derived

GRPO_LIKE = {  # u / std with std = u / 2 (ddof 1): the same for all of these
    "grpo": lambda r, b: advcal.grpo(r, eps=0.0, backend=b),
    "batch_std": lambda r, b: advcal.batch_std(r, eps=0.0, backend=b),
    "p90_scale": lambda r, b: p90_scale(r, eps=0.0, backend=b),
    "grpo_kl_comp": lambda r, b: grpo_kl_comp(r, eps=0.0, backend=b),
}


@pytest.mark.parametrize(("dtype", "scale"), DTYPE_SCALES)
@pytest.mark.parametrize("name", list(GRPO_LIKE))
def test_near_constant_group_std_normalized(backend, dtype, scale, name):
    got = GRPO_LIKE[name](_group(dtype, scale), backend)
    assert got.dtype == dtype
    _close(got, [[-0.5, 1.5, -0.5, -0.5]], dtype)
    # The group sums to 0 (up to the rounding of its values), as a centred group does.
    assert abs(float(np.sum(got, dtype=np.float64))) <= 8 * _ulp(dtype)


@pytest.mark.parametrize(("dtype", "scale"), DTYPE_SCALES)
def test_near_constant_group_centred(backend, dtype, scale):
    r = _group(dtype, scale)
    step = scale * _ulp(dtype)
    centred = np.array([[-1.0, 3.0, -1.0, -1.0]]) * step / 4
    _close(advcal.dr_grpo(r, backend=backend), centred, dtype)
    _close(advcal.rloo(r, backend=backend), centred * 4 / 3, dtype)
    _close(advcal.opo(r, lengths=np.ones(r.shape), backend=backend), centred, dtype)
    # MaxNorm: u / max |u| with a floor far below the gap.
    w = advcal.maxnorm(r, tau_res=step * 1e-3, bounds=None, backend=backend)
    _close(w, [[-1 / 3, 1.0, -1 / 3, -1 / 3]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_near_constant_group_maxnorm_binned_and_omitted(backend, dtype):
    # The other MaxNorm path (NaN omitted, so the rewards are copied to float64 first).
    r = _group(dtype, n=5)
    r[0, 4] = np.nan
    w = advcal.maxnorm(r, tau_res=1e-30, bounds=None, nan_policy="omit", backend=backend)
    _close(w, [[-1 / 3, 1.0, -1 / 3, -1 / 3, 0.0]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_near_constant_group_far_from_its_shift(backend, dtype):
    # The odd reward first and 15 equal ones: the shift (the first reward) lies far in the
    # group's tail, so the sum of squares is taken again around the mean.  Mean 1 + u/16,
    # deviations u * (15, -1, ..., -1) / 16, std (ddof 1) u / 4.
    r = _group(dtype, n=16, at=0)
    expected = np.full((1, 16), -0.25)
    expected[0, 0] = 3.75
    _close(advcal.grpo(r, eps=0.0, backend=backend), expected, dtype)
    # passk: the gap u over std u / 4.
    gap = np.zeros((1, 16))
    gap[0, 0] = 4.0
    _close(advcal.passk(r, eps=0.0, backend=backend), gap, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_near_constant_groups_reinforce_pp(backend, dtype):
    # Two near-constant groups: u = step * [-1, 3, -1, -1] / 4 and step * [-1, -1, -1, 3]
    # (3 + 2 ulps of 3 = 3 + 4 u); whitened over the 8 responses (mean 0, Bessel 8/7):
    # sum of u^2 = step^2 * (12/16 + 12), so the root is step * sqrt(12.75 / 7).
    step = _ulp(dtype)
    r = np.array([[1.0, 1.0 + step, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0 + 4 * step]]).astype(dtype)
    u = np.array([[-0.25, 0.75, -0.25, -0.25], [-1.0, -1.0, -1.0, 3.0]])
    got = advcal.reinforce_pp_baseline(r, eps=0.0, backend=backend)
    _close(got, u / math.sqrt(12.75 / 7), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_near_constant_kl_weight(backend, dtype):
    out = grpo_kl_comp(_group(dtype), eps=0.0, return_kl_weight=True, backend=backend)
    # 1 / std with std = u / 2.
    np.testing.assert_allclose(out.kl_weight, [2.0 / _ulp(dtype)], rtol=8 * 2.0 ** -53)


@pytest.mark.parametrize("dtype", DTYPES)
def test_near_constant_huber_matches_oracle(dtype):
    # Huber's scale of a near-constant group: the engines centre alike, so they agree.
    r = _group(dtype, n=5, at=2)
    _close(huber_scale(r, eps=0.0, backend="numba"), huber_scale(r, eps=0.0, backend="numpy"),
           dtype)


def test_random_near_constant_batches_match_oracle():
    # Groups one or two ulps wide at many magnitudes, every estimator of the issue.
    rng = np.random.default_rng(3)
    exps = rng.integers(-300, 300, 64)
    base = np.ldexp(1.0 + rng.integers(0, 2 ** 20, 64) * 2.0 ** -20, exps)
    steps = np.spacing(base)[:, None] * rng.integers(0, 3, (64, 6))
    r = base[:, None] + steps
    estimators = {
        "grpo": lambda b: advcal.grpo(r, eps=0.0, backend=b),
        "passk": lambda b: advcal.passk(r, eps=0.0, backend=b),
        "maxnorm": lambda b: advcal.maxnorm(r, tau_res=1e-300, bounds=None, backend=b),
        "dr_grpo": lambda b: advcal.dr_grpo(r, backend=b) / np.spacing(base)[:, None],
    }
    for name, f in estimators.items():
        expected = f("numpy")
        got = f("numba")
        np.testing.assert_allclose(got, expected, rtol=0,
                                   atol=16 * 2.0 ** -52 * float(np.max(np.abs(expected))),
                                   err_msg=name)


# ---------------------------------------------------------------------------------------
# Squares that over- or underflow float64


def test_reinforce_pp_whitening_near_float_limit(backend):
    # u = +-1e154, mean 0; variance (Bessel, W = 2) sum u^2 = 2e308 overflows float64,
    # its root 1.414e154 does not: the advantages are +-1/sqrt(2), as grpo's.
    got = advcal.reinforce_pp_baseline([[1e154, -1e154]], backend=backend)
    np.testing.assert_allclose(got, [[2 ** -0.5, -(2 ** -0.5)]], rtol=4 * 2.0 ** -52)
    np.testing.assert_allclose(got, advcal.grpo([[1e154, -1e154]], backend=backend),
                               rtol=4 * 2.0 ** -52)
    # Beyond: the root itself leaves float64 (1.7e308 * sqrt(2)).
    got = advcal.reinforce_pp_baseline([[1.7e308, -1.7e308]], backend=backend)
    np.testing.assert_allclose(got, [[2 ** -0.5, -(2 ** -0.5)]], rtol=4 * 2.0 ** -52)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reinforce_pp_whitening_of_tiny_rewards(backend, dtype):
    # u = [t, -t, 0, 0] with t * t below float64's range (t = 1e-170; in float32 the
    # smallest normal 2**-126 squares to 2**-252, in range: the same answer either way).
    # Variance (Bessel 4/3) 2 t^2 / 3: advantages t / sqrt(2/3 t^2) = sqrt(3/2).
    t = 1e-170 if dtype == np.float64 else 2.0 ** -126
    r = np.array([[t, -t], [0.0, 0.0]], dtype=dtype)
    got = advcal.reinforce_pp_baseline(r, eps=0.0, backend=backend)
    _close(got, [[1.5 ** 0.5, -(1.5 ** 0.5)], [0.0, 0.0]], dtype)
    # eps = 1e-8 dominates a variance of 1e-340: (u - 0) / 1e-4.
    got = advcal.reinforce_pp_baseline(r, backend=backend)
    _close(got, np.array([[t, -t], [0.0, 0.0]]) / 1e-4, dtype)


@pytest.mark.parametrize("rewards", [[[0.0, 1e-300]], [[1e-200, 2e-200]], [[0.0, 5e-324]],
                                     [[0.0, 1e-309]], [[1.7e308, -1.7e308]],
                                     [[1e154, 1e154 * (1 + 2 ** -52)]]])
def test_batch_std_of_tiny_or_huge_spreads(backend, rewards):
    # Two rewards: batch std (ddof 1) |a - b| / sqrt(2), advantages -+1/sqrt(2).  The
    # squares of the spread under- or overflow float64 (or the std does, or is subnormal).
    got = advcal.batch_std(rewards, eps=0.0, backend=backend)
    sign = 1.0 if rewards[0][1] > rewards[0][0] else -1.0
    np.testing.assert_allclose(got, [[-sign * 2 ** -0.5, sign * 2 ** -0.5]],
                               rtol=8 * 2.0 ** -52)


def test_batch_std_eps_dominates_tiny_rewards(backend):
    # eps = 1e-6 against a std of 7e-301: the advantages are u / 1e-6 (not a "too large").
    got = advcal.batch_std([[0.0, 1e-300]], backend=backend)
    np.testing.assert_allclose(got, [[-0.5e-294, 0.5e-294]], rtol=8 * 2.0 ** -52)


@pytest.mark.parametrize("rewards", [[[0.0, 1e-300]], [[0.0, 1e-310]], [[1e-160, 3e-160]]])
def test_group_stds_of_tiny_spreads(backend, rewards):
    # p90_scale's reference std and grpo_kl_comp's KL weight 1 / std: std (ddof 1) of two
    # rewards |a - b| / sqrt(2), whose square underflows.
    spread = abs(rewards[0][1] - rewards[0][0])
    std = spread / math.sqrt(2)
    # A subnormal std carries fewer digits: the precision of std itself.
    precision = max(2.0 ** -52, 2.0 ** -1074 / std)
    got = p90_scale(rewards, eps=0.0, backend=backend)
    np.testing.assert_allclose(got, [[-(2 ** -0.5), 2 ** -0.5]], rtol=8 * precision)
    kl = grpo_kl_comp(rewards, eps=0.0, return_kl_weight=True, backend=backend).kl_weight
    np.testing.assert_allclose(kl, [1.0 / std], rtol=8 * precision)


def _huber_kappa(c):
    """E[clip(Z, -c, c)^2], Z standard normal (restated from its definition)."""
    from scipy import stats

    return (2 * stats.norm.cdf(c) - 1) - 2 * c * stats.norm.pdf(c) + 2 * c * c * stats.norm.sf(c)


@pytest.mark.parametrize("scale", [1e154, 1e-300, 1.0])
def test_huber_scale_of_two_rewards(backend, scale):
    # Two rewards +-d: s = d / sqrt(kappa) (d / s = sqrt(kappa) < c, nothing clipped), so
    # the advantages are -+sqrt(kappa) whatever d: the squares of d may leave float64.
    got = huber_scale([[scale, -scale]], eps=0.0, backend=backend)
    k = math.sqrt(_huber_kappa(1.345))
    np.testing.assert_allclose(got, [[k, -k]], rtol=1e-12)


def test_huber_scale_next_to_1e154(backend):
    # Huber's scale is scale-free (eps = 0): rewards times 1e154 give the same advantages
    # as at scale 1, though their deviations from the first reward square to inf.
    small = huber_scale([[1.0, 0.0, 1e-154]], eps=0.0, backend="numpy")
    got = huber_scale([[1e154, 0.0, 1.0]], eps=0.0, backend=backend)
    np.testing.assert_allclose(got, small, rtol=1e-12)


@pytest.mark.parametrize("rewards, expected", [
    # GPG: u * (N / #nonzero) / f_norm, with N = 2, one nonzero reward, f_norm = 1: the
    # centred values +-r/2 doubled.  Both results are floats, though r/2 is not (subnormal)
    # and r's square is not (beyond float64).
    ([0.0, 3 * 2.0 ** -1074], [-3 * 2.0 ** -1074, 3 * 2.0 ** -1074]),
    ([0.0, 2.0 ** 1023], [-(2.0 ** 1023), 2.0 ** 1023]),
])
def test_gpg_at_the_float64_limits(backend, rewards, expected):
    got = advcal.gpg(np.array(rewards), offsets=[0, 2], backend=backend)
    # the subnormal case: r/2 = 1.5 ulps rounds to 1 or 2 ulps before it is doubled
    np.testing.assert_allclose(got, expected, rtol=0.34, atol=0)
    assert np.sign(got).tolist() == [-1.0, 1.0]
