"""The estimator registry: its flags tell the truth about each estimator."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import advcal
from advcal import advantages
from advcal._kernels import engine
from advcal.jacobian import _ANALYTIC_JACOBIANS, _finite_difference_jacobian, jacobian_flat
from advcal.registry import (
    ANALYTIC,
    CLOSED_FORM,
    ESTIMATORS,
    FINITE_DIFFERENCE,
    REGISTRY,
    Estimator,
    _group_spread,
)

# Group sizes of `ragged_example`.
SIZES = [3, 5, 2, 4]


def ragged_example(seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict[str, object]]:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate(([0], np.cumsum(SIZES)))
    values = rng.uniform(0.0, 1.0, offsets[-1])
    needed = {"lengths": rng.integers(1, 50, values.size).astype(np.float64),
              "token_counts": rng.integers(1, 50, values.size).astype(np.float64),
              "tau_res": 0.05}
    return values, offsets, needed


def call(name: str, values: np.ndarray, offsets: np.ndarray, needed: dict[str, object]
         ) -> np.ndarray:
    entry = REGISTRY[name]
    kwargs = {key: needed[key] for key in (*entry.needs, *entry.per_response)}
    return np.asarray(entry.function(values, offsets, **kwargs))


POINT = tuple(name for name, entry in REGISTRY.items() if not entry.ranges)


def test_the_public_mapping_is_a_read_only_view_of_the_registry():
    assert advcal.ESTIMATORS is ESTIMATORS
    assert list(ESTIMATORS) == list(REGISTRY)
    assert all(ESTIMATORS[name] is entry.function for name, entry in REGISTRY.items())
    with pytest.raises(TypeError):
        ESTIMATORS["mine"] = advcal.grpo  # type: ignore[index]
    with pytest.raises(TypeError):
        REGISTRY["mine"] = REGISTRY["grpo"]  # type: ignore[index]


def test_entries_are_consistent():
    for name, entry in REGISTRY.items():
        assert isinstance(entry, Estimator) and entry.name == name
        assert entry.jacobian in (CLOSED_FORM, ANALYTIC, FINITE_DIFFERENCE)
        params = inspect.signature(entry.function).parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for key in (*entry.needs, *entry.per_response):
            assert key in params or takes_kwargs, (name, key)
        for key in entry.needs:
            if key in params:
                assert params[key].default in (inspect.Parameter.empty, None), (name, key)


def test_analytic_entries_have_their_jacobian():
    analytic = {name for name, entry in REGISTRY.items() if entry.jacobian == ANALYTIC}
    assert analytic == set(_ANALYTIC_JACOBIANS)


@pytest.mark.parametrize("name", POINT)
def test_centered_flag(name):
    values, offsets, needed = ragged_example(1)
    out = call(name, values, offsets, needed)
    sums = np.add.reduceat(out, offsets[:-1])
    assert np.allclose(sums, 0.0, atol=1e-12) == REGISTRY[name].centered


@pytest.mark.parametrize("name", [n for n in POINT if REGISTRY[n].jacobian != FINITE_DIFFERENCE])
def test_closed_form_and_analytic_jacobians_equal_finite_differences(name):
    values, offsets, needed = ragged_example(2)
    options = {key: needed[key] for key in REGISTRY[name].needs}
    exact = jacobian_flat(values, offsets, name, 1e-6, 1, options)
    numeric = _finite_difference_jacobian(values, offsets, name, 1e-6, 1, options)
    np.testing.assert_allclose(exact, numeric, atol=1e-6)


@pytest.mark.parametrize("name", POINT)
def test_advantages_dispatches_by_name(name):
    values, offsets, needed = ragged_example(3)
    kwargs = {key: needed[key] for key in (*REGISTRY[name].needs, *REGISTRY[name].per_response)}
    np.testing.assert_array_equal(advantages(values, offsets, method=name, **kwargs),
                                  call(name, values, offsets, needed))


def test_advantages_dispatches_ranges():
    lo = np.array([0.0, 0.5, 0.2, 0.9])
    hi = np.array([0.6, 0.7, 0.4, 1.0])
    np.testing.assert_array_equal(advantages(None, [0, 2, 4], method="range", lo=lo, hi=hi),
                                  advcal.range_advantages(lo, hi, [0, 2, 4]))


@pytest.mark.parametrize("name", [n for n in REGISTRY if REGISTRY[n].needs])
def test_needed_keywords_are_required(name):
    values, offsets, needed = ragged_example(4)
    with pytest.raises((TypeError, ValueError)):
        REGISTRY[name].function(values, offsets)


def test_engine_map_loads_every_family_and_backend():
    for family in ("point", "maxnorm", "ranges", "recovery"):
        for backend in ("numba", "numpy"):
            module = engine(family, backend)
            assert module.__name__ == f"advcal._kernels.{family}_{backend}"
    with pytest.raises(KeyError):
        engine("nope", "numba")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("omit", [False, True])
def test_statistics_kernel_matches_the_oracle(dtype: type, omit: bool) -> None:
    rng = np.random.default_rng(int(omit))
    sizes = rng.integers(0, 9, 300)
    values = np.round(rng.uniform(-1, 1, sizes.sum()) * rng.choice([1, 3, 100], sizes.sum()))
    # magnitudes whose squares underflow or overflow (subnormals included)
    tiny, huge, sub = (1e-30, 1e30, 1e-44) if dtype == np.float32 else (1e-300, 1e300, 1e-320)
    plain = values
    values = (values * rng.choice([1.0, tiny, huge, sub], sizes.sum())).astype(dtype)
    if omit:
        values[rng.uniform(size=values.size) < 0.3] = np.nan
    offsets = advcal.offsets_from_sizes(sizes)
    for ddof in (0, 1):
        fast = _group_spread(values, offsets, ddof, omit, "numba")
        slow = _group_spread(values, offsets, ddof, omit, "numpy")
        np.testing.assert_array_equal(fast.n_valid, slow.n_valid)
        np.testing.assert_array_equal(fast.gap, slow.gap)
        # the kernel may round its rescaled sums in another order: a few ulps
        np.testing.assert_allclose(fast.std, slow.std, rtol=1e-14, atol=0)
    # mean and sum of squares, on the rewards before the extreme scales (whose means cancel)
    plain = np.where(np.isnan(values), np.nan, plain).astype(dtype)
    fast_stats = engine("point", "numba").group_statistics(plain, offsets, 0, omit)
    slow_stats = engine("point", "numpy").group_statistics(plain, offsets, 0, omit)
    for got, want in zip(fast_stats, slow_stats, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # without the spread: the same first three, std 0 and no gap
    for point, full in (("numba", fast_stats), ("numpy", slow_stats)):
        count, mean, ss, std, gap = engine("point", point).group_statistics(
            plain, offsets, 0, omit, spread=False)
        for got, want in zip((count, mean, ss), full[:3], strict=True):
            np.testing.assert_array_equal(got, want)
        assert not std.any() and not gap.any() and full[4].any()


def test_spread_by_hand(backend: str) -> None:
    values = np.array([0.0, 1e-300, 2.0, 2.0, np.nan, 3.0, 1.0, np.nan, 5.0, 1e300, -1e300,
                       1e308, -1e308, 100.0, 100.0 + 7 * np.spacing(100.0)])
    offsets = np.array([0, 2, 5, 6, 9, 11, 13, 15])
    got = _group_spread(values, offsets, 1, True, backend)
    np.testing.assert_array_equal(got.n_valid, [2, 2, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(got.gap, [True, False, False, True, True, True, True])
    # tiny, huge and overflowing spreads neither underflow nor overflow
    root2 = np.sqrt(2.0)
    np.testing.assert_allclose(got.std[:6], [1e-300 / root2, 0.0, 0.0, 2 * root2,
                                             root2 * 1e300, root2 * 1e308], rtol=1e-15)
    # a spread of 7 ulps: exact in the reference, within half an ulp in the kernel (whose
    # fast-math centring may round r0 + mean; see docs/estimators.md)
    ulp = np.spacing(100.0)
    np.testing.assert_allclose(got.std[6], 7 * ulp / root2, rtol=1e-15 if backend == "numpy"
                               else 0, atol=0 if backend == "numpy" else ulp / 2)
