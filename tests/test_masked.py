"""The masked-vector group loops (``advcal._kernels.masked``) against plain numpy.

Each intrinsic runs on one group ``x[lo:lo + n]`` placed anywhere in a larger array
(also flush with its end, where a full vector load would leave the array): its results
must equal numpy's, and no element outside the group may be written.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

from advcal._kernels import masked
from tests.strategies import FLOAT_DTYPES, reward_values

SENTINEL = -7.25


@njit(cache=False)
def _group_sums(x, lo, n):
    return masked.group_sums(x, lo, n)


@njit(cache=False)
def _group_sum_squares(x, lo, n, shift, mean):
    return masked.group_sum_squares(x, lo, n, shift, mean)


@njit(cache=False)
def _write_centered(x, out, lo, n, shift, mean, factor):
    masked.write_centered(x, out, lo, n, shift, mean, factor)


@njit(cache=False)
def _write_weights(x, out, lo, n, shift, mean, factor, scale, dead_zone):
    masked.write_weights(x, out, lo, n, shift, mean, factor, scale, dead_zone)


@njit(cache=False)
def _write_weights_no_dead_zone(x, out, lo, n, shift, mean, factor, scale):
    masked.write_weights(x, out, lo, n, shift, mean, factor, scale, None)


@njit(cache=False)
def _write_binned(x, out, lo, n, low, high, clip, inv_delta, kmax):
    return masked.write_binned(x, out, lo, n, low, high, clip, inv_delta, kmax)


@njit(cache=False)
def _write_binned_weights(x, out, lo, n, low, high, clip, inv_delta, kmax, shift, mean,
                          factor, scale, dead_zone):
    masked.write_binned_weights(x, out, lo, n, low, high, clip, inv_delta, kmax, shift, mean,
                                factor, scale, dead_zone)


@njit(cache=False)
def _write_binned_weights_no_dead_zone(x, out, lo, n, low, high, clip, inv_delta, kmax,
                                       shift, mean, factor, scale):
    masked.write_binned_weights(x, out, lo, n, low, high, clip, inv_delta, kmax, shift, mean,
                                factor, scale, None)


def _bins(g, low, high, clip, inv_delta, kmax):
    """The Reward-Resolution Protocol in numpy, in float64: (bin indices, binned rewards)."""
    v = np.clip(g, low, high) if clip else g
    k = np.clip(np.rint((v - low) * inv_delta), 0.0, kmax)
    return k, np.minimum(low + k / inv_delta, high)


@st.composite
def placed_groups(draw, *, values=None):
    """(array, lo, n): a group of 0..70 rewards (several chunks) inside an array, with
    up to 20 rewards before it and up to 20 after it (often none: flush with the end)."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    elements = values if values is not None else reward_values(dtype)
    n = draw(st.integers(0, 70))
    before = draw(st.integers(0, 20))
    after = draw(st.sampled_from([0, 0, 1, 7, 20]))
    x = np.array(draw(st.lists(elements, min_size=before + n + after,
                               max_size=before + n + after)), dtype=dtype)
    return x, before, n


def _outside_untouched(out, lo, n):
    return np.all(np.delete(out, np.arange(lo, lo + n)) == SENTINEL)


@given(placed=placed_groups())
def test_group_sums_matches_numpy(placed):
    x, lo, n = placed
    g = x[lo:lo + n].astype(np.float64)
    shift, t1, t2, low, high = _group_sums(x, lo, n)
    if n == 0:
        assert (shift, t1, t2) == (0.0, 0.0, 0.0)
        return
    d = g - g[0]
    assert shift == g[0]
    # Summing n <= 70 terms in any order errs by at most n * 2**-53 (< 7.8e-15) of the sum
    # of their magnitudes; the two-pass terms add three roundings each: hence 1e-14, 1e-13.
    scale = float(np.sum(np.abs(d)))
    assert abs(t1 - math.fsum(d)) <= 1e-14 * scale
    assert abs(t2 - math.fsum(d * d)) <= 1e-14 * float(np.sum(d * d))
    assert (low, high) == (g.min(), g.max())
    mean = t1 / n
    expected = math.fsum(((g - shift) - mean) ** 2)
    two_pass = _group_sum_squares(x, lo, n, shift, mean)
    assert abs(two_pass - expected) <= 1e-13 * max(expected, 1e-300)


@given(value=reward_values(np.float32), n=st.integers(1, 70), lo=st.integers(0, 9))
def test_group_sums_of_a_constant_group_are_exactly_zero(value, n, lo):
    for dtype in FLOAT_DTYPES:
        x = np.full(lo + n, value, dtype=dtype)
        x[:lo] = 3.0
        shift, t1, t2, low, high = _group_sums(x, lo, n)
        assert (t1, t2) == (0.0, 0.0)
        assert shift == low == high == np.float64(dtype(value))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_group_sums_see_nan_and_inf(dtype):
    for bad in (np.nan, np.inf, -np.inf):
        for position in (0, 3, 8, 16, 20):
            x = np.linspace(0.0, 1.0, 21).astype(dtype)
            x[position] = bad
            _, t1, t2, _, _ = _group_sums(x, 0, 21)
            assert not (math.isfinite(t1) and math.isfinite(t2))


@given(placed=placed_groups(), shift=st.floats(-10, 10), mean=st.floats(-10, 10),
       factor=st.floats(-10, 10))
def test_write_centered_matches_numpy(placed, shift, mean, factor):
    x, lo, n = placed
    out = np.full_like(x, SENTINEL)
    _write_centered(x, out, lo, n, shift, mean, factor)
    expected = ((x[lo:lo + n].astype(np.float64) - (shift + mean)) * factor).astype(x.dtype)
    np.testing.assert_array_equal(out[lo:lo + n], expected)
    assert _outside_untouched(out, lo, n)


@given(placed=placed_groups(), center=st.floats(-10, 10), factor=st.floats(0.5, 2.0),
       scale=st.floats(1e-3, 1e3), dead_zone=st.one_of(st.none(), st.floats(0.0, 5.0)))
def test_write_weights_matches_numpy(placed, center, factor, scale, dead_zone):
    x, lo, n = placed
    out = np.full_like(x, SENTINEL)
    if dead_zone is None:
        _write_weights_no_dead_zone(x, out, lo, n, center, 0.0, factor, scale)
    else:
        _write_weights(x, out, lo, n, center, 0.0, factor, scale, dead_zone)
    u = (x[lo:lo + n].astype(np.float64) - center) * factor
    if dead_zone is not None:
        u = np.where(np.abs(u) < dead_zone, 0.0, u)
    expected = np.clip(u * (1.0 / scale), -1.0, 1.0).astype(x.dtype)
    np.testing.assert_array_equal(out[lo:lo + n], expected)
    assert _outside_untouched(out, lo, n)


@given(placed=placed_groups(), clip=st.booleans(),
       resolution=st.sampled_from([0.01, 0.1, 1.0, 7.0, 250.0]))
def test_write_binned_matches_numpy(placed, clip, resolution):
    x, lo, n = placed
    low, high = -100.0, 100.0
    inv_delta = 1.0 / resolution
    kmax = float(np.floor((high - low) * inv_delta))
    out = np.full_like(x, SENTINEL)
    n_nan, smallest, largest, shift, total = _write_binned(x, out, lo, n, low, high, clip,
                                                           inv_delta, kmax)
    g = x[lo:lo + n].astype(np.float64)
    k, binned = _bins(g, low, high, clip, inv_delta, kmax)
    np.testing.assert_array_equal(out[lo:lo + n], binned.astype(x.dtype))
    assert _outside_untouched(out, lo, n)
    assert n_nan == 0
    if n:
        assert (smallest, largest) == (g.min(), g.max())
        assert shift == binned[0]
        # float64 sums of the unrounded bins in another order than numpy's: each within
        # (n - 1) eps sum|d| of the exact sum
        d = binned - binned[0]
        bound = 2 * (n - 1) * np.finfo(np.float64).eps * np.abs(d).sum()
        assert total == pytest.approx(d.sum(), rel=0, abs=bound)
        if k.min() == k.max():  # one bin: exactly 0
            assert total == 0.0
    else:
        assert total == 0.0


@given(placed=placed_groups(), clip=st.booleans(),
       resolution=st.sampled_from([0.01, 0.1, 1.0, 7.0, 250.0]), center=st.floats(-10, 10),
       factor=st.floats(0.5, 2.0), scale=st.floats(1e-3, 1e3),
       dead_zone=st.one_of(st.none(), st.floats(0.0, 5.0)))
def test_write_binned_weights_matches_numpy(placed, clip, resolution, center, factor, scale,
                                            dead_zone):
    x, lo, n = placed
    low, high = -100.0, 100.0
    inv_delta = 1.0 / resolution
    kmax = float(np.floor((high - low) * inv_delta))
    out = np.full_like(x, SENTINEL)
    binning = (low, high, clip, inv_delta, kmax)
    if dead_zone is None:
        _write_binned_weights_no_dead_zone(x, out, lo, n, *binning, center, 0.0, factor, scale)
    else:
        _write_binned_weights(x, out, lo, n, *binning, center, 0.0, factor, scale, dead_zone)
    u = (_bins(x[lo:lo + n].astype(np.float64), *binning)[1] - center) * factor
    if dead_zone is not None:
        u = np.where(np.abs(u) < dead_zone, 0.0, u)
    expected = np.clip(u * (1.0 / scale), -1.0, 1.0).astype(x.dtype)
    np.testing.assert_array_equal(out[lo:lo + n], expected)
    assert _outside_untouched(out, lo, n)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_write_binned_counts_nan(dtype):
    x = np.linspace(0.0, 1.0, 19).astype(dtype)
    x[[2, 9, 17]] = np.nan
    out = np.full_like(x, SENTINEL)
    n_nan, *_ = _write_binned(x, out, 1, 16, 0.0, 1.0, False, 10.0, 10.0)
    assert n_nan == 2  # x[17] lies outside the group x[1:17]
    assert out[0] == out[17] == out[18] == SENTINEL


def test_intrinsics_refuse_other_layouts():
    from numba.core.errors import TypingError

    with pytest.raises(TypingError):
        _group_sums(np.zeros((2, 3)), 0, 2)
    with pytest.raises(TypingError):
        _group_sums(np.zeros(6)[::2], 0, 2)
    with pytest.raises(TypingError):
        _group_sums(np.zeros(6, dtype=np.int64), 0, 2)


@pytest.mark.parametrize(("choice", "expected"), [("masked", "True"), ("plain", "False")])
def test_group_loops_follow_the_environment_variable(choice, expected):
    code = "from advcal._kernels import masked; print(masked.ENABLED)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "ADVCAL_GROUP_LOOPS": choice}, check=True)
    assert result.stdout.strip() == expected


def test_a_bad_group_loops_setting_is_refused_by_name():
    code = "import numpy, advcal; advcal.grpo(numpy.ones((2, 3)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "ADVCAL_GROUP_LOOPS": "fast"})
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "ValueError: The environment variable ADVCAL_GROUP_LOOPS must be 'auto', 'masked' "
        "or 'plain'; got 'fast'.")


def test_generic_targets_take_the_plain_loops():
    code = "from advcal._kernels import masked; print(masked.ENABLED)"
    env = {**os.environ, "NUMBA_CPU_NAME": "generic"}
    env.pop("ADVCAL_GROUP_LOOPS", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("ddof", [0, 1, 2])
def test_reciprocal_table_agrees_with_the_divisions(ddof):
    from advcal._kernels import reciprocals

    @njit(cache=False, error_model="numpy")  # as the kernels: x / 0 is inf, not an error
    def both(n, ddof):
        return (reciprocals.lookup(reciprocals.reciprocal_table(ddof), n, ddof),
                reciprocals.group_reciprocals(n, ddof))

    for n in [0, 1, 2, 3, 17, reciprocals.SMALL - 1, reciprocals.SMALL, 1000]:
        from_table, divided = both(n, ddof)
        assert np.array(from_table).tobytes() == np.array(divided).tobytes(), n
        count = np.float64(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            expected = (1.0 / max(count, 1.0), 1.0 / (count - ddof),
                        1.0 / ((count - 1.0) / count))
        np.testing.assert_array_equal(divided, expected)


@pytest.mark.parametrize(("features", "expected"), [
    ("+avx2,+fma", "False"),  # AVX2 alone: LLVM's loops (its masked stores are slow on AMD)
    ("+avx2,+avx512f", "False"),  # no VL: no 256-bit masked float32 blocks
    ("+avx2,+avx512f,+avx512vl", "True"),
])
def test_masked_loops_need_avx512(features, expected):
    code = "from advcal._kernels import masked; print(masked.ENABLED)"
    env = {**os.environ, "NUMBA_CPU_FEATURES": features}
    env.pop("ADVCAL_GROUP_LOOPS", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, check=True)
    assert result.stdout.strip() == expected
