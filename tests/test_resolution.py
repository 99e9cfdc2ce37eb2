"""Reward-Resolution Protocol and MaxNorm-AC: hand-derived values, every
guarantee as a property, kernel == numpy reference, layouts, bad input."""

from __future__ import annotations

from fractions import Fraction
from unittest import mock

import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from advcal import (
    ESTIMATORS,
    MaxNormResult,
    ResolvedRewards,
    advantages,
    maxnorm,
    offsets_from_sizes,
    resolve_rewards,
)
from advcal._kernels import maxnorm_numba, maxnorm_numpy, point_numba, pool
from advcal._kernels.modes import GRPO
from tests.checks import own_error_or_result
from tests.strategies import (
    FLOAT_DTYPES,
    RaggedBatch,
    dense_batches,
    garbage_arrays,
    ragged_batches,
)

taus = st.one_of(st.sampled_from([1e-3, 0.01, 0.1, 1.0]), st.floats(1e-3, 100.0))




def groups_of(values, offsets):
    return [values[offsets[q]:offsets[q + 1]] for q in range(len(offsets) - 1)]


def weight_tolerance(values, tau, dtype, factor=256.0):
    """Rounding bound on w = u / s: the error of u (a few ulps of the largest reward per
    operation) over the floor s >= tau, plus the rounding of the output dtype."""
    big = float(np.max(np.abs(values), initial=0.0)) + 1.0
    return factor * np.finfo(np.float64).eps * big / tau + 4 * np.finfo(dtype).eps


# --------------------------------------------------------------------------- hand-derived


def test_rloo_baseline_hand_example(backend):
    # mean 0.25, rloo u = 4/3 * (0.75, -0.25, -0.25, -0.25) = (1, -1/3, -1/3, -1/3); s = 1
    res = maxnorm([[1.0, 0.0, 0.0, 0.0]], tau_res=0.01, return_scale=True, backend=backend)
    assert isinstance(res, MaxNormResult)
    np.testing.assert_allclose(res.advantages, [[1.0, -1 / 3, -1 / 3, -1 / 3]], rtol=1e-15)
    np.testing.assert_allclose(res.scale, [1.0], rtol=1e-15)


def test_mean_baseline_hand_example(backend):
    # u = (-0.5, 0, 0.5), s = 0.5
    res = maxnorm([0.0, 0.5, 1.0, 2.0, 6.0], offsets=[0, 3, 5], tau_res=0.01,
                  baseline="mean", return_scale=True, backend=backend)
    np.testing.assert_allclose(res.advantages, [-1.0, 0.0, 1.0, -1.0, 1.0], rtol=1e-15)
    np.testing.assert_allclose(res.scale, [0.5, 2.0], rtol=1e-15)


def test_floor_caps_low_variance_groups(backend):
    # mean 0.700025; rloo u = 4/3 * (-2.5e-5, 7.5e-5, -2.5e-5, -2.5e-5); max|u| = 1e-4 < tau
    r = np.array([[0.7, 0.7001, 0.7, 0.7]])
    res = maxnorm(r, tau_res=0.01, return_scale=True, backend=backend)
    u = 4 / 3 * (r - r.mean())
    np.testing.assert_allclose(res.advantages, u / 0.01, rtol=1e-9)
    assert res.scale[0] == 0.01


def test_resolution_removes_jitter_and_skips_zero_gap(backend):
    r = np.array([[0.7, 0.7001, 0.6999, 0.7002], [0.7, 0.7001, 0.72, 0.7]])
    res = maxnorm(r, tau_res=0.01, resolution=0.01, return_scale=True, backend=backend)
    assert (res.advantages[0] == 0.0).all()
    assert res.scale[0] == 0.01
    # group 1 bins to (0.70, 0.70, 0.72, 0.70): mean 0.705, rloo u = 4/3 * (-0.005, ..., 0.015)
    np.testing.assert_allclose(res.advantages[1], [-1 / 3, -1 / 3, 1.0, -1 / 3], rtol=1e-9)
    np.testing.assert_allclose(res.scale[1], 0.02, rtol=1e-9)
    keep = resolve_rewards(r, resolution=0.01, backend=backend).keep
    np.testing.assert_array_equal(keep, [False, True])


def test_dead_zone_hand_example(backend):
    # mean baseline: mean 0.2525, u = (-0.2525, -0.2425, 0.2475, 0.2475); |u_1| < 0.245 -> 0
    r = [[0.0, 0.01, 0.5, 0.5]]
    res = maxnorm(r, tau_res=0.01, baseline="mean", dead_zone=0.245, return_scale=True,
                  backend=backend)
    np.testing.assert_allclose(res.advantages, [[-1.0, 0.0, 0.2475 / 0.2525, 0.2475 / 0.2525]],
                               rtol=1e-12)
    np.testing.assert_allclose(res.scale, [0.2525], rtol=1e-12)
    # every |u| inside the dead zone: weights 0 and the scale falls back to tau
    res = maxnorm([[0.5, 0.51]], tau_res=0.01, baseline="mean", dead_zone=0.1,
                  return_scale=True, backend=backend)
    assert (res.advantages == 0.0).all() and res.scale[0] == 0.01


def test_singleton_policies(backend):
    r = np.array([0.005, 0.3, 0.2, 0.4])
    offsets = [0, 1, 2, 4]
    zero = maxnorm(r, offsets, tau_res=0.01, backend=backend)
    np.testing.assert_allclose(zero, [0.0, 0.0, -1.0, 1.0], rtol=1e-12)
    # raw: baseline 0, u = r, w = r / max(|r|, tau)
    raw = maxnorm(r, offsets, tau_res=0.01, singleton="raw", return_scale=True,
                  backend=backend)
    np.testing.assert_allclose(raw.advantages, [0.5, 1.0, -1.0, 1.0], rtol=1e-12)
    np.testing.assert_allclose(raw.scale, [0.01, 0.3, 0.2], rtol=1e-12)
    with pytest.raises(ValueError, match="group 0 has a single response and `singleton='error'`"):
        maxnorm(r, offsets, tau_res=0.01, singleton="error", backend=backend)


def test_empty_groups_and_empty_batch(backend):
    res = maxnorm(np.array([1.0, 0.0]), offsets=[0, 0, 2, 2], tau_res=0.5,
                  return_scale=True, backend=backend)
    np.testing.assert_allclose(res.advantages, [1.0, -1.0])
    np.testing.assert_allclose(res.scale, [0.5, 1.0, 0.5])  # rloo u = 2 * (0.5, -0.5)
    empty = maxnorm(np.zeros((0, 4)), tau_res=0.1, return_scale=True, backend=backend)
    assert empty.advantages.shape == (0, 4) and empty.scale.shape == (0,)
    out = resolve_rewards(np.zeros(0), offsets=[0], resolution=0.1, backend=backend)
    assert out.rewards.shape == (0,) and out.keep.shape == (0,)


def test_nan_policy(backend):
    r = np.array([[0.0, np.nan, 1.0, 1.0]])
    with pytest.raises(ValueError, match="`rewards` contain NaN; pass nan_policy='omit'"):
        maxnorm(r, tau_res=0.01, backend=backend)
    # omit: group (0, 1, 1) -> rloo u = 3/2 * (-2/3, 1/3, 1/3) = (-1, 0.5, 0.5)
    w = maxnorm(r, tau_res=0.01, nan_policy="omit", backend=backend)
    np.testing.assert_allclose(w, [[-1.0, 0.0, 0.5, 0.5]], rtol=1e-12)
    res = resolve_rewards(r, resolution=0.5, nan_policy="omit", backend=backend)
    np.testing.assert_array_equal(res.rewards, [[0.0, np.nan, 1.0, 1.0]])
    assert res.keep.tolist() == [True]
    with pytest.raises(ValueError, match="`rewards` contain NaN"):
        resolve_rewards(r, resolution=0.5, backend=backend)


def test_infinite_rewards_are_an_error_even_when_clipping(backend):
    r = [[0.0, np.inf, 1.0]]
    for kw in ({}, {"resolution": 0.1, "clip": True}, {"bounds": (0.0, 1.0), "clip": True}):
        with pytest.raises(ValueError, match=r"`rewards` must be finite; got inf\."):
            maxnorm(r, tau_res=0.01, backend=backend, **kw)
    with pytest.raises(ValueError, match=r"`rewards` must be finite; got inf\."):
        resolve_rewards(r, resolution=0.1, clip=True, backend=backend)


def test_overflowing_rewards_are_an_error(backend):
    with pytest.raises(ValueError, match="`rewards` are too large"):
        maxnorm([[-1.5e308, 1.5e308]], tau_res=0.01, backend=backend)


@pytest.mark.parametrize("rewards", [[1e308, 0.0, 1.7976931348623157e308, 0.0],
                                     [1.7e308, 1.7e308, 1.6e308, 1.75e308],
                                     [-1e308, -1e308, 0.0, -1.5e308, 0.5e308]])
def test_rewards_whose_sum_overflows_but_not_their_advantages(backend, rewards):
    # Near the largest doubles the group's sum overflows in some orders (the numba engine's
    # vectorized one, here) while every deviation, their mean and the advantages are finite:
    # both engines give the exact advantages (exact rationals, rounded once).
    from fractions import Fraction

    r = [Fraction(v) for v in rewards]
    n = len(r)
    u = [(v - (sum(r) - v) / (n - 1)) for v in r]  # RLOO: each minus the mean of the others
    scale = max(abs(x) for x in u)
    expected = [float(x / scale) for x in u]
    got = maxnorm([rewards], tau_res=0.01, backend=backend)[0]
    # a handful of roundings of deviations of size up to the scale, over the scale
    np.testing.assert_allclose(got, expected, rtol=0, atol=8 * n * 2.0 ** -52)


def test_resolve_rewards_hand_example(backend):
    # delta 0.25: 0.1 -> 0, 0.13 -> 0.25, 0.9 -> 1; ties go to the even bin:
    # 0.125 / 0.25 = 0.5 -> 0, 0.375 / 0.25 = 1.5 -> 2
    res = resolve_rewards([[0.1, 0.13, 0.9], [0.125, 0.375, 0.375]], resolution=0.25,
                          backend=backend)
    assert isinstance(res, ResolvedRewards)
    np.testing.assert_array_equal(res.rewards, [[0.0, 0.25, 1.0], [0.0, 0.5, 0.5]])
    np.testing.assert_array_equal(res.keep, [True, True])


def test_resolve_bins_never_leave_the_bounds(backend):
    # (hi - lo) / delta = 3.33: the top bin is 0.9 (k = 3), not 1.2
    res = resolve_rewards([1.0, 0.95, 0.5], offsets=[0, 3], resolution=0.3, backend=backend)
    np.testing.assert_allclose(res.rewards, [0.9, 0.9, 0.6], rtol=1e-15)
    # 1 / 0.1 snaps to 10 bins above lo: 1.0 stays 1.0; bounds (-1, 2) shift the grid
    res = resolve_rewards([1.0, 0.96, -0.97], offsets=[0, 3], resolution=0.1,
                          bounds=(-1.0, 1.0), backend=backend)
    np.testing.assert_allclose(res.rewards, [1.0, 1.0, -1.0], rtol=1e-15)
    res = resolve_rewards([[1.0, -1.0, 2.0]], resolution=0.4, bounds=(-1.0, 2.0),
                          backend=backend)
    # grid -1, -0.6, ..., 1.8 (3 / 0.4 = 7.5: top bin k = 7); 1.0 is bin 5 exactly
    np.testing.assert_allclose(res.rewards, [[1.0, -1.0, 1.8]], rtol=1e-15)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_binning_beyond_int64_bin_indices(backend, dtype):
    # (hi - lo) / resolution = 1e20 > 2**63: bin indices beyond int64 stay exact floats.
    # 0.3 * 1e20 is an integer-valued double, so each reward is its own bin (to the ulp).
    r = np.array([[0.3, 0.7, 0.3], [0.5, 0.5, 0.5]], dtype=dtype)
    res = resolve_rewards(r, resolution=1e-20, backend=backend)
    expected = [np.float64(v) * 1e20 / 1e20 for v in r.ravel().astype(np.float64)]
    np.testing.assert_allclose(res.rewards.ravel(), expected, rtol=4 * np.finfo(dtype).eps)
    np.testing.assert_array_equal(res.keep, [True, False])
    out = maxnorm(r, tau_res=0.01, resolution=1e-20, baseline="mean", return_scale=True,
                  backend=backend)
    np.testing.assert_allclose(out.advantages, [[-0.5, 1.0, -0.5], [0.0, 0.0, 0.0]],
                               atol=1e-6 if dtype == np.float32 else 1e-14)
    np.testing.assert_array_equal(out.keep, [True, False])


@pytest.mark.parametrize("resolution", [None, 0.01])
def test_subnormal_floor_gives_zeros_to_a_zero_gap_group(backend, resolution):
    for dtype in FLOAT_DTYPES:
        out = maxnorm(np.full((1, 4), 0.7, dtype=dtype), tau_res=1e-310, resolution=resolution,
                      return_scale=True, backend=backend)
        np.testing.assert_array_equal(out.advantages, np.zeros((1, 4)))
        np.testing.assert_array_equal(out.scale, [1e-310])
        np.testing.assert_array_equal(out.keep, [False])
    # a tiny but nonzero gap over a subnormal floor: weights +-1, not inf/NaN
    w = maxnorm([[0.0, 1e-300]], tau_res=1e-310, baseline="mean", backend=backend)
    np.testing.assert_array_equal(w, [[-1.0, 1.0]])


def test_maxnorm_keep_is_the_zero_gap_mask_of_resolve_rewards(backend):
    r = [0.3, 0.3, 0.31, 0.7, 0.7004, 0.5, 0.2, 0.2, 0.9]
    offsets = [0, 3, 5, 6, 6, 9]
    res = maxnorm(r, offsets, tau_res=0.01, resolution=0.01, return_scale=True,
                  backend=backend)
    np.testing.assert_array_equal(res.keep, [True, False, False, False, True])
    np.testing.assert_array_equal(
        res.keep, resolve_rewards(r, offsets, resolution=0.01, backend=backend).keep)


def test_resolution_none_checks_bounds_and_marks_zero_gap(backend):
    res = resolve_rewards([[0.3, 0.3], [0.3, 0.30001], [0.5, 0.5]], resolution=None,
                          backend=backend)
    np.testing.assert_array_equal(res.rewards, [[0.3, 0.3], [0.3, 0.30001], [0.5, 0.5]])
    np.testing.assert_array_equal(res.keep, [False, True, False])


def test_bounds_are_checked_or_clipped(backend):
    message = (r"`rewards` must lie in `bounds` \[0\.0, 1\.0\]; got values in "
               r"\[-0\.5, 1\.0\] \(pass clip=True to clip them\)\.")
    with pytest.raises(ValueError, match=message):
        resolve_rewards([[-0.5, 1.0]], resolution=0.1, backend=backend)
    with pytest.raises(ValueError, match=message):
        maxnorm([[-0.5, 1.0]], tau_res=0.01, resolution=0.1, backend=backend)
    with pytest.raises(ValueError, match=message):
        maxnorm([[-0.5, 1.0]], tau_res=0.01, bounds=(0.0, 1.0), backend=backend)
    clipped = resolve_rewards([1.2, -0.1, 0.5], offsets=[0, 3], resolution=0.25, clip=True,
                              backend=backend)
    np.testing.assert_array_equal(clipped.rewards, [1.0, 0.0, 0.5])
    # clip without binning: [1, 0, 0.5] -> rloo u = 1.5 * (0.5, -0.5, 0)
    w = maxnorm([1.2, -0.1, 0.5], offsets=[0, 3], tau_res=0.01, bounds=(0.0, 1.0), clip=True,
                backend=backend)
    np.testing.assert_allclose(w, [1.0, -1.0, 0.0], atol=1e-15)


def test_maxnorm_without_resolution_takes_any_finite_rewards(backend):
    w = maxnorm([[-5.0, 7.0, 1.0]], tau_res=0.01, baseline="mean", backend=backend)
    np.testing.assert_allclose(w, [[-1.0, 1.0, 0.0]], atol=1e-15)


def test_dispatcher_and_registry():
    assert ESTIMATORS["maxnorm"] is maxnorm
    r = np.array([[0.1, 0.4, 0.35, 0.9]])
    np.testing.assert_array_equal(advantages(r, method="maxnorm", tau_res=0.05),
                                  maxnorm(r, tau_res=0.05))


def test_dtypes_and_no_mutation(backend):
    r32 = np.array([[0.1, 0.1, 0.1], [0.1, 0.2, 0.3]], dtype=np.float32)
    before = r32.copy()
    w = maxnorm(r32, tau_res=0.01, backend=backend)
    assert w.dtype == np.float32
    assert (w[0] == 0.0).all()  # non-dyadic zero-gap float32 group: exact zeros
    np.testing.assert_array_equal(r32, before)
    res = resolve_rewards(r32, resolution=0.1, backend=backend)
    assert res.rewards.dtype == np.float32
    np.testing.assert_array_equal(r32, before)
    assert maxnorm(np.array([[0, 1]], dtype=np.int64), tau_res=1.0, backend=backend).dtype \
        == np.float64
    assert maxnorm(np.array([[0, 1]], dtype=np.float16), tau_res=1.0, backend=backend).dtype \
        == np.float32


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"tau_res": 0.0}, ValueError, r"`tau_res` must lie in \(0\.0, inf\]; got 0\.0\."),
    ({"tau_res": np.nan}, ValueError, r"`tau_res` must be finite; got nan\."),
    ({"tau_res": "1"}, TypeError, r"`tau_res` must be a real number; got str\."),
    ({"tau_res": 0.1, "baseline": "max"}, ValueError,
     r"`baseline` must be one of 'rloo', 'mean'; got 'max'\."),
    ({"tau_res": 0.1, "dead_zone": -1.0}, ValueError,
     r"`dead_zone` must lie in \[0\.0, inf\]; got -1\.0\."),
    ({"tau_res": 0.1, "return_scale": 1}, TypeError, r"`return_scale` must be a bool; got int\."),
    ({"tau_res": 0.1, "clip": True}, ValueError, r"`clip=True` needs `bounds` to clip into\."),
    ({"tau_res": 0.1, "resolution": 2.0}, ValueError,
     r"`resolution` must lie in \(0\.0, 1\.0\]; got 2\.0\."),
    ({"tau_res": 0.1, "resolution": 0.0}, ValueError,
     r"`resolution` must lie in \(0\.0, 1\.0\]; got 0\.0\."),
    ({"tau_res": 0.1, "resolution": 1e-320}, ValueError, r"`resolution` is too small"),
    ({"tau_res": 0.1, "bounds": (1.0, 0.0)}, ValueError,
     r"`bounds` must be a pair \(lo, hi\) of finite numbers with lo < hi; got \(1\.0, 0\.0\)\."),
    ({"tau_res": 0.1, "bounds": 1.0}, TypeError, r"`bounds` must be a pair \(lo, hi\)"),
    ({"tau_res": 0.1, "bounds": (0.0, np.inf)}, ValueError, r"`bounds\[1\]` must be finite"),
    ({"tau_res": 0.1, "singleton": "drop"}, ValueError, r"`singleton` must be one of"),
    ({"tau_res": 0.1, "nan_policy": "ignore"}, ValueError, r"`nan_policy` must be one of"),
    ({"tau_res": 0.1, "backend": "cuda"}, ValueError, r"`backend` must be one of"),
])
def test_maxnorm_option_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        maxnorm([[0.0, 1.0]], **kwargs)


def test_maxnorm_needs_tau_res():
    with pytest.raises(TypeError, match="tau_res"):
        maxnorm([[0.0, 1.0]])  # type: ignore[call-overload]


def test_resolve_option_errors():
    with pytest.raises(TypeError, match=r"`bounds` must be a pair .*; got None\."):
        resolve_rewards([[0.0, 1.0]], resolution=0.1, bounds=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`clip` must be a bool; got str\."):
        resolve_rewards([[0.0, 1.0]], resolution=0.1, clip="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"1-D `rewards` need exactly one of `offsets`"):
        resolve_rewards([0.0, 1.0], resolution=0.1)


# --------------------------------------------------------------------------- properties


@st.composite
def maxnorm_options(draw):
    return {
        "tau_res": draw(taus),
        "baseline": draw(st.sampled_from(["rloo", "mean"])),
        "dead_zone": draw(st.one_of(st.none(), st.floats(0.0, 10.0))),
        "singleton": draw(st.sampled_from(["zero", "raw"])),
    }


@st.composite
def binning_options(draw, bound=1e3):
    """Bounds that contain every reward of a batch drawn with ``bound``, and a resolution."""
    lo = -bound - draw(st.floats(0.0, 10.0))
    hi = bound + draw(st.floats(0.0, 10.0))
    resolution = draw(st.one_of(st.sampled_from([0.01, 0.1, 1.0, 7.0]),
                                st.floats(1e-3, hi - lo)))
    return {"resolution": resolution, "bounds": (lo, hi)}


@given(batch=ragged_batches(), options=maxnorm_options(),
       binning=st.one_of(st.none(), binning_options()),
       omit=st.booleans(), data=st.data())
def test_kernel_matches_numpy_reference(batch, options, binning, omit, data):
    values = batch.values.copy()
    if omit and values.size:
        holes = data.draw(st.lists(st.integers(0, values.size - 1), max_size=4))
        values[holes] = np.nan
    kw = dict(options, **(binning or {}), nan_policy="omit" if omit else "raise")
    fast = maxnorm(values, batch.offsets, return_scale=True, **kw)
    ref = maxnorm(values, batch.offsets, return_scale=True, backend="numpy", **kw)
    tol = weight_tolerance(np.nan_to_num(values), options["tau_res"], values.dtype)
    assert fast.advantages.dtype == ref.advantages.dtype == values.dtype
    np.testing.assert_allclose(fast.advantages, ref.advantages, rtol=0, atol=tol)
    np.testing.assert_allclose(fast.scale, ref.scale, rtol=1e-12)
    resolve_kw = {"resolution": None, "bounds": (-1e3 - 1, 1e3 + 1)} if binning is None \
        else binning
    fast_res = resolve_rewards(values, batch.offsets, nan_policy=kw["nan_policy"],
                               **resolve_kw)
    ref_res = resolve_rewards(values, batch.offsets, nan_policy=kw["nan_policy"],
                              backend="numpy", **resolve_kw)
    np.testing.assert_array_equal(fast_res.keep, ref_res.keep)
    np.testing.assert_array_equal(fast_res.rewards, ref_res.rewards)  # same IEEE operations


@given(batch=ragged_batches(), options=maxnorm_options(),
       binning=st.one_of(st.none(), binning_options()),
       beta=st.floats(1e-4, 1.0))
def test_bounded_weights_scales_and_kl(batch, options, binning, beta):
    res = maxnorm(batch.values, batch.offsets, return_scale=True, **options,
                  **(binning or {}))
    tau = options["tau_res"]
    assert np.all(np.abs(res.advantages) <= 1.0)
    assert np.all(1.0 / res.scale <= 1.0 / tau)
    assert np.all(beta * res.scale >= beta * tau)
    assert res.scale.shape == (batch.offsets.size - 1,)


def exact_centered(group, baseline):
    """u of one group in exact rational arithmetic."""
    exact = [Fraction(float(v)) for v in group]
    mean = sum(exact) / len(exact)
    factor = Fraction(len(exact), len(exact) - 1) if baseline == "rloo" else 1
    return [(v - mean) * factor for v in exact]


@given(batch=ragged_batches(max_groups=6), tau=taus,
       baseline=st.sampled_from(["rloo", "mean"]))
def test_sign_and_within_group_order_preserved(batch, tau, baseline):
    w = maxnorm(batch.values, batch.offsets, tau_res=tau, baseline=baseline)
    for r, wq in zip(groups_of(batch.values, batch.offsets),
                     groups_of(w, batch.offsets), strict=True):
        if r.size < 2:
            continue
        order = np.argsort(r, kind="stable")
        assert np.all(np.diff(wq[order]) >= 0), "order of u not preserved"
        for value in np.unique(r):
            assert np.unique(wq[r == value]).size == 1, "ties not kept"
        u = exact_centered(r, baseline)
        # float64 centering is exact up to a few ulps of the largest reward, or of the
        # smallest subnormal (a mean of subnormal rewards rounds by half of one)
        slack = 16 * r.size * (np.finfo(np.float64).eps * float(np.max(np.abs(r)))
                               + np.finfo(np.float64).smallest_subnormal)
        for ui, wi in zip(u, wq, strict=True):
            if abs(ui) > slack:
                assert np.sign(wi) == np.sign(float(ui)), "sign of u not preserved"


@given(batch=ragged_batches(), options=maxnorm_options(),
       shift=st.floats(-1e3, 1e3, allow_nan=False))
def test_translation_invariance(batch, options, shift):
    # A raw singleton keeps its (shifted) reward by design, and a |u| right at the
    # dead-zone edge may fall either way after rounding: both are outside the guarantee.
    options.update(singleton="zero", dead_zone=None)
    values = batch.values.astype(np.float64)
    w = maxnorm(values, batch.offsets, **options)
    w_moved = maxnorm(values + shift, batch.offsets, **options)
    tol = weight_tolerance(np.abs(values) + abs(shift), options["tau_res"], np.float64)
    np.testing.assert_allclose(w_moved, w, rtol=0, atol=tol)


@given(batch=ragged_batches(dtype=np.float64), tau=taus, c=st.floats(1e-3, 1e3),
       baseline=st.sampled_from(["rloo", "mean"]))
def test_positive_scale_equivariance(batch, tau, c, baseline):
    w = maxnorm(batch.values, batch.offsets, tau_res=tau, baseline=baseline)
    w_scaled = maxnorm(batch.values * c, batch.offsets, tau_res=tau * c, baseline=baseline)
    tol = weight_tolerance(batch.values, tau, np.float64)
    np.testing.assert_allclose(w_scaled, w, rtol=0, atol=tol)


@given(batch=ragged_batches(dtype=np.float64, bound=1.0), tau=taus,
       k=st.sampled_from([1.0, 2.0, 4.0, 8.0]))
def test_scale_equivariance_with_binning_is_exact_for_powers_of_two(batch, tau, k):
    # Multiplying rewards, bounds, resolution and tau by a power of two is exact in binary
    # floating point, so binning decisions and weights are identical.
    values = np.abs(batch.values)
    kw = {"resolution": 0.05, "bounds": (0.0, 1.0)}
    w = maxnorm(values, batch.offsets, tau_res=tau, **kw)
    w_scaled = maxnorm(values * k, batch.offsets, tau_res=tau * k, resolution=0.05 * k,
                       bounds=(0.0, k))
    np.testing.assert_array_equal(w_scaled, w)


@given(dtype=st.sampled_from(FLOAT_DTYPES), value=st.sampled_from([0.1, 0.7, 1e-3, 0.0, 1.0]),
       sizes=st.lists(st.integers(2, 20), min_size=1, max_size=6), tau=taus,
       baseline=st.sampled_from(["rloo", "mean"]))
def test_zero_gap_groups_give_exact_zeros(dtype, value, sizes, tau, baseline):
    values = np.full(sum(sizes), value, dtype=dtype)
    offsets = offsets_from_sizes(np.array(sizes))
    for backend in ("numba", "numpy"):
        res = maxnorm(values, offsets, tau_res=tau, baseline=baseline, return_scale=True,
                      backend=backend)
        assert (res.advantages == 0.0).all()
        assert (res.scale == tau).all()
        assert not resolve_rewards(values, offsets, resolution=0.01, backend=backend).keep.any()


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), tau=taus,
       delta=st.sampled_from([0.01, 0.05, 0.1, 0.25]))
def test_sub_resolution_jitter_disappears(data, dtype, tau, delta):
    sizes = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=6))
    n = sum(sizes)
    kmax = round(1.0 / delta)
    bins = np.array(data.draw(st.lists(st.integers(0, kmax), min_size=n, max_size=n)), float)
    jitter = np.array(data.draw(st.lists(st.floats(-0.4, 0.4), min_size=n, max_size=n)))
    grid = (bins * delta).astype(dtype)
    jittered = np.clip(bins * delta + jitter * delta, 0.0, 1.0).astype(dtype)
    offsets = offsets_from_sizes(np.array(sizes))
    clean = resolve_rewards(grid, offsets, resolution=delta)
    noisy = resolve_rewards(jittered, offsets, resolution=delta)
    np.testing.assert_array_equal(noisy.rewards, clean.rewards)
    np.testing.assert_array_equal(noisy.keep, clean.keep)
    np.testing.assert_array_equal(
        maxnorm(jittered, offsets, tau_res=tau, resolution=delta),
        maxnorm(grid, offsets, tau_res=tau, resolution=delta))
    expected_keep = [np.unique(b).size > 1 for b in groups_of(bins, offsets)]
    np.testing.assert_array_equal(clean.keep, expected_keep)


@given(batch=ragged_batches(bound=1.0), delta=st.sampled_from([0.01, 0.1, 0.2, 0.5]),
       backend=st.sampled_from(["numba", "numpy"]))
def test_binned_rewards_lie_on_the_grid_within_half_a_bin(batch, delta, backend):
    res = resolve_rewards(batch.values, batch.offsets, resolution=delta, bounds=(-1.0, 1.0),
                          backend=backend)
    b = res.rewards.astype(np.float64)
    assert np.all((b >= -1.0) & (b <= 1.0))
    k = (b + 1.0) / delta
    np.testing.assert_allclose(k, np.round(k), rtol=0,
                               atol=4 * np.finfo(batch.values.dtype).eps / delta)
    np.testing.assert_array_less(np.abs(b - batch.values), delta / 2 + 1e-6)


@given(batch=ragged_batches(dtype=np.float64, bound=1.0), tau=taus,
       delta=st.sampled_from([0.01, 0.1, 0.3]))
def test_maxnorm_with_resolution_equals_resolve_then_maxnorm(batch, tau, delta):
    kw = {"bounds": (-1.0, 1.0)}
    resolved = resolve_rewards(batch.values, batch.offsets, resolution=delta, **kw)
    # the same binned values, summed by differently vectorized loops: equal up to rounding
    np.testing.assert_allclose(
        maxnorm(batch.values, batch.offsets, tau_res=tau, resolution=delta, **kw),
        maxnorm(resolved.rewards, batch.offsets, tau_res=tau, **kw),
        rtol=0, atol=weight_tolerance(resolved.rewards, tau, np.float64))


@given(rewards=dense_batches(), options=maxnorm_options())
def test_dense_equals_ragged(rewards, options):
    offsets = np.arange(rewards.shape[0] + 1) * rewards.shape[1]
    dense = maxnorm(rewards, return_scale=True, **options)
    ragged = maxnorm(rewards.reshape(-1), offsets, return_scale=True, **options)
    assert dense.advantages.shape == rewards.shape
    np.testing.assert_array_equal(dense.advantages.reshape(-1), ragged.advantages)
    np.testing.assert_array_equal(dense.scale, ragged.scale)
    res_dense = resolve_rewards(rewards, resolution=1.0, bounds=(-1e3, 1e3))
    res_ragged = resolve_rewards(rewards.reshape(-1), offsets, resolution=1.0,
                                 bounds=(-1e3, 1e3))
    np.testing.assert_array_equal(res_dense.rewards.reshape(-1), res_ragged.rewards)
    np.testing.assert_array_equal(res_dense.keep, res_ragged.keep)


@given(batch=ragged_batches(), options=maxnorm_options(), seed=st.integers(0, 2**32 - 1))
def test_ids_path_equals_offsets_path(batch: RaggedBatch, options, seed):
    sizes = batch.sizes
    labels = np.repeat([f"prompt-{q}" for q in range(sizes.size)], sizes)
    perm = np.random.default_rng(seed).permutation(batch.values.size)
    by_offsets = maxnorm(batch.values, batch.offsets, return_scale=True, **options)
    by_ids = maxnorm(batch.values[perm], group_ids=labels[perm], return_scale=True, **options)
    # the permutation reorders responses within groups too: equal up to rounding
    tol = weight_tolerance(batch.values, options["tau_res"], batch.values.dtype)
    np.testing.assert_allclose(by_ids.advantages, by_offsets.advantages[perm], rtol=0, atol=tol)
    # per-group outputs list groups in order of first appearance of their label
    nonempty = np.flatnonzero(sizes > 0)
    first = [int(np.flatnonzero(labels[perm] == f"prompt-{q}")[0]) for q in nonempty]
    np.testing.assert_allclose(by_ids.scale, by_offsets.scale[nonempty[np.argsort(first)]],
                               rtol=1e-12)
    res_ids = resolve_rewards(batch.values[perm], group_ids=labels[perm], resolution=None,
                              bounds=(-1e3, 1e3))
    res_off = resolve_rewards(batch.values, batch.offsets, resolution=None, bounds=(-1e3, 1e3))
    np.testing.assert_array_equal(res_ids.rewards, res_off.rewards[perm])
    np.testing.assert_array_equal(res_ids.keep, res_off.keep[nonempty[np.argsort(first)]])


def test_kernels_agree_bitwise_for_any_thread_count():
    rng = np.random.default_rng(7)
    sizes = rng.integers(0, 40, size=30_000)
    values = rng.random(int(sizes.sum()))
    values[rng.random(values.size) < 0.2] = 0.5
    offsets = offsets_from_sizes(sizes)
    assert values.size >= 2 * pool.MIN_VALUES_PER_THREAD  # chunks run on threads by size
    # dead zone 0.00237 lies off the grid of binned differences, so no |u| sits on its edge
    args = (values, offsets, 0.01, True, 0.00237, False, 0.0, 1.0, False, 0.01, 100.0, 100.0,
            False)
    resolve_args = (values, offsets, 0.0, 1.0, False, 0.01, 100.0, 100.0, False)
    previous = numba.get_num_threads()
    try:
        runs = []
        for threads in range(1, numba.config.NUMBA_NUM_THREADS + 1):
            numba.set_num_threads(threads)
            runs.append((maxnorm_numba.maxnorm(*args), maxnorm_numba.resolve(*resolve_args)))
    finally:
        numba.set_num_threads(previous)
    one_chunk = maxnorm_numba.maxnorm(*args, threaded=False)
    one_chunk_resolved = maxnorm_numba.resolve(*resolve_args, threaded=False)
    for threaded, threaded_resolved in runs:
        for a, b in zip(one_chunk, threaded, strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        for a, b in zip(one_chunk_resolved, threaded_resolved, strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    reference = maxnorm_numpy.maxnorm(*args)
    np.testing.assert_allclose(one_chunk[0], reference[0], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(one_chunk[2], reference[2])
    np.testing.assert_array_equal(one_chunk_resolved[0], maxnorm_numpy.resolve(*resolve_args)[0])


@given(batch=ragged_batches(min_size=0), resolution=st.sampled_from([0.0, 0.01]),
       omit=st.booleans(), raw=st.booleans(), per_group=st.booleans())
def test_chunks_on_threads_equal_one_chunk_bitwise(batch, resolution, omit, raw, per_group):
    x, offsets = batch.values, batch.offsets
    inv = 1.0 / resolution if resolution else 0.0
    lo, hi = (-1e3, 1e3) if resolution else (-np.inf, np.inf)
    args = (x, offsets, 0.01, True, 0.0, raw, lo, hi, False, resolution, inv,
            2e3 * inv, omit, per_group)
    resolve_args = (x, offsets, -1e3, 1e3, False, resolution, inv, 2e3 * inv, omit)
    with mock.patch.object(pool, "n_threads", lambda: 3):  # 3 chunks on any machine
        for run in (lambda t: maxnorm_numba.maxnorm(*args, threaded=t),
                    lambda t: maxnorm_numba.resolve(*resolve_args, threaded=t)):
            for a, b in zip(run(True), run(False), strict=True):
                assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.parametrize("where", [0, 45, 99])
@pytest.mark.parametrize("resolution", [0.0, 0.01])
def test_a_bad_or_out_of_bounds_group_in_any_chunk_is_found(where, resolution):
    x = np.linspace(0.0, 1.0, 100)
    offsets = offsets_from_sizes([10] * 10)
    inv = 1.0 / resolution if resolution else 0.0
    args = (offsets, 0.01, True, 0.0, False, 0.0, 1.0, False, resolution, inv, inv, False)
    resolve_args = (offsets, 0.0, 1.0, False, resolution, inv, inv, False)
    with mock.patch.object(pool, "n_threads", lambda: 3):
        for threaded in (True, False):
            assert maxnorm_numba.maxnorm(x, *args, threaded=threaded)[3:] == (True, True)
            assert maxnorm_numba.resolve(x, *resolve_args, threaded=threaded)[2:] == (True, True)
            for value, expected in ((-5.0, (True, False)), (1.5, (True, False)),
                                    (np.inf, (False, False)), (np.nan, (False, True))):
                spoiled = x.copy()
                spoiled[where] = value
                assert maxnorm_numba.maxnorm(spoiled, *args, threaded=threaded)[3:] == expected
                assert maxnorm_numba.resolve(spoiled, *resolve_args,
                                             threaded=threaded)[2:] == expected


def test_kernels_are_cached_on_disk():
    from numba.core.caching import FunctionCache

    for kernel in (maxnorm_numba._groups_kernel, maxnorm_numba._plain_kernel):
        assert isinstance(kernel._cache, FunctionCache)


# --------------------------------------------------------------------------- garbage


@given(rewards=garbage_arrays(), offsets=st.one_of(st.none(), garbage_arrays()),
       tau=st.one_of(taus, st.floats(), st.just(0.0), st.text(max_size=2)),
       resolution=st.one_of(st.none(), st.floats(), st.sampled_from([0.1, 1.0])),
       clip=st.booleans(), dead_zone=st.one_of(st.none(), st.floats()),
       backend=st.sampled_from(["numba", "numpy"]))
def test_garbage_input_gives_only_advcal_errors(rewards, offsets, tau, resolution, clip,
                                                dead_zone, backend):
    bounds = (0.0, 1.0) if clip else None
    for return_scale in (False, True):
        out = own_error_or_result(
            maxnorm, rewards, offsets, tau_res=tau, resolution=resolution, clip=clip,
            bounds=bounds, dead_zone=dead_zone, return_scale=return_scale, backend=backend)
        if out is not None:
            w = out.advantages if return_scale else out
            assert not np.isnan(w).any()
            assert np.all(np.abs(w) <= 1.0)
    out = own_error_or_result(resolve_rewards, rewards, offsets, resolution=resolution,
                              clip=clip, backend=backend)
    if out is not None:
        assert not np.isnan(out.rewards).any()


def _kernel_runs(x, offsets, out):
    """The kernels of maxnorm_numba (weights and binned rewards, with and without binning)
    and center_scale's, writing into ``out``."""
    scale = np.empty(offsets.size - 1)
    keep = np.empty(offsets.size - 1, dtype=np.bool_)
    for dead_zone in (0.0, 0.05):
        yield lambda d=dead_zone: maxnorm_numba._plain_kernel(
            offsets, scale, keep, x, 0.01, True, d, False, -np.inf, np.inf, out)
    for weights in (True, False):
        for protocol in ((-np.inf, np.inf, False, 0.0, 0.0), (0.0, 1.0, False, 20.0, 20.0),
                         (0.0, 1.0, True, 20.0, 20.0)):
            yield lambda p=protocol, w=weights: maxnorm_numba._groups_kernel(
                offsets, scale, keep, x, 0.01, True, 0.0, False, *p, False, w, out)
    yield lambda: maxnorm_numba._groups_kernel(offsets, scale, keep, x, 0.01, True, 0.05,
                                               False, 0.0, 1.0, True, 20.0, 20.0, True, True,
                                               out)
    yield lambda: point_numba._center_scale_kernel(offsets, x, GRPO, 1e-6, 1, False, False,
                                                   1.0, np.inf, 0.0, out)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("seed", [None, 3, 4])
def test_results_do_not_depend_on_where_the_output_lies(seed, dtype):
    # LLVM checks at run time whether a loop's output may overlap its input (for a batch
    # smaller than a few vector widths, placed just before its output) and then takes a
    # scalar copy of the loop; a float sum in such a loop came out in another order.
    # seed=None: the batch hypothesis found (w changed in the last bit).
    if seed is None:
        rewards = np.array([0.736377999, 0.1, 5.14147667e-65, 0.544995974, 0.5,
                            1.73312414e-209, 0.0294831671, 1.68541591e-212, 1.68541591e-212,
                            1.0, 1.0])
        offsets = np.array([0, 7, 9, 9, 11])
    else:
        rng = np.random.default_rng(seed)
        offsets = offsets_from_sizes(rng.integers(2, 9, 3))
        rewards = rng.random(int(offsets[-1]))
    n = rewards.size
    results = {}
    for gap in (0, 1, 4, 16, 31, 64, 1000):
        buffer = np.zeros(2 * n + gap, dtype=dtype)
        x = buffer[:n]
        x[:] = rewards
        out = buffer[n + gap:]
        results[gap] = []
        for run in _kernel_runs(x, offsets, out):
            run()
            results[gap].append(out.tobytes())
    for gap, runs in results.items():
        assert runs == results[1000], gap
