"""The estimator registry: its flags tell the truth about each estimator."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import advcal
from advcal import advantages
from advcal._kernels import engine
from advcal.registry import (
    ANALYTIC,
    CLOSED_FORM,
    ESTIMATORS,
    FINITE_DIFFERENCE,
    REGISTRY,
    Estimator,
)
from advcal.sets import _ANALYTIC_JACOBIANS, _finite_difference_jacobian, _jacobian_flat

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
    exact = _jacobian_flat(values, offsets, name, 1e-6, 1, options)
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
