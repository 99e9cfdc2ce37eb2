"""The standing fuzz suite: every public estimator and input-handling function over
adversarial input (byte orders, float16, longdouble, integers and booleans; magnitudes at
the float limits and subnormals; NaN and inf; label types; option values at and past
their limits).

Every call must either raise advcal's own ValueError/TypeError or return finite numbers
of the documented dtype; both engines must agree (same error, or results equal to
rounding); no input may be mutated.  Where the exact result is representable, a call must
return it: for estimators linear in the rewards, f(x) = 2^k f(2^-k x) (a power-of-two
rescaling is exact), which is evaluated on rewards near 1 and checked against the call
on the raw rewards.  Runs under the ``ci`` hypothesis profile in CI.
"""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import advcal
from advcal.registry import REGISTRY
from tests.checks import assert_raised_by_advcal
from tests.strategies import (
    FUZZ_DTYPES,
    LABEL_KINDS,
    OPTION_VALUES,
    as_dtype,
    fuzz_batches,
    fuzz_groups,
    labels_for,
    per_response,
)

BACKENDS = ("numba", "numpy")

# Every registered estimator of point rewards ("range" takes ranges: its own test below).
POINT = tuple(name for name, entry in REGISTRY.items() if not entry.ranges)
RANGES = tuple(name for name, entry in REGISTRY.items() if entry.ranges)

# Estimators whose advantages are linear in the rewards (for the exact-rescaling oracle),
# with the options under which they are.
LINEAR = {"dr_grpo": {}, "rloo": {"scale": "none"}, "gpg": {}, "opo": {},
          "passk": {"std_norm": False}}


def _snapshot(value: Any) -> Any:
    return copy.deepcopy(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return bool(a == b) and type(a) is type(b)


def _expected_dtype(rewards: Any) -> np.dtype:
    native = np.asarray(rewards).dtype.newbyteorder("=")
    return np.dtype(np.float32) if native in (np.float16, np.float32) else np.dtype(np.float64)


def _finite_result(out: Any) -> np.ndarray:
    arr = getattr(out, "advantages", out)
    assert isinstance(arr, np.ndarray), type(arr)
    assert arr.dtype.isnative
    assert np.isfinite(arr).all(), f"non-finite output {arr!r}"
    return arr


def _outcomes(fn: Any, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
    """Run ``fn`` on both engines: each outcome is a result or ``(type, message)``."""
    before = _snapshot((args, kwargs))
    outcomes: list[Any] = []
    for backend in BACKENDS:
        try:
            outcomes.append(fn(*args, **kwargs, backend=backend))
        except Exception as exc:  # noqa: BLE001 - assert_raised_by_advcal inspects it
            assert_raised_by_advcal(exc)
            outcomes.append((type(exc), str(exc)))
    assert _same((args, kwargs), before), "an input was mutated"
    return outcomes


def _engines_agree(outcomes: list[Any]) -> np.ndarray | None:
    """Both engines raised the same error (None) or returned equal finite results."""
    first, second = outcomes
    if isinstance(first, tuple) or isinstance(second, tuple):
        assert first == second, f"engines disagree: {first!r} vs {second!r}"
        return None
    a, b = _finite_result(first), _finite_result(second)
    assert a.dtype == b.dtype and a.shape == b.shape
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    rtol = 1e-5 if a.dtype == np.float32 else 1e-9
    scale = float(np.max(np.abs(wide_a), initial=0.0))
    np.testing.assert_allclose(wide_a, wide_b, rtol=rtol, atol=rtol * scale)
    return a


def _draw_options(draw: st.DrawFn, name: str, function: Any, shape: tuple[int, ...]
                  ) -> dict[str, Any]:
    entry = REGISTRY.get(name)
    needs = entry.needs if entry else ()
    options: dict[str, Any] = {}
    for key in inspect.signature(function).parameters:
        if key in ("lengths", "token_counts"):
            if key in needs or draw(st.booleans()):
                options[key] = draw(per_response(shape))
        elif key in OPTION_VALUES and (key in needs or draw(st.booleans())):
            options[key] = draw(st.sampled_from(OPTION_VALUES[key]))
    return options


def _codes(labels: list[Any]) -> list[int]:
    """Group codes by Python equality and hashing: the grouping a label list means."""
    seen: dict[Any, int] = {}
    return [seen.setdefault(label, len(seen)) for label in labels]


@given(data=st.data(), name=st.sampled_from(POINT))
def test_point_estimators(data: st.DataObject, name: str) -> None:
    rewards, layout, kind, _ = data.draw(fuzz_batches())
    function = REGISTRY[name].function
    options = _draw_options(data.draw, name, function, np.shape(rewards))
    outcomes = _outcomes(function, (rewards,), {**layout, **options})
    out = _engines_agree(outcomes)

    if kind == "nan" and any(label != label for label in layout["group_ids"]):
        # a NaN label cannot name a group, in any mix of label types
        assert out is None, "a NaN group label was accepted"
        return
    if out is None:
        return
    assert out.dtype == _expected_dtype(rewards) and out.shape == np.shape(rewards)
    if "group_ids" in layout:  # labels mean what Python equality says they mean
        recoded = function(rewards, group_ids=_codes(layout["group_ids"]), **options)
        np.testing.assert_array_equal(out, recoded)
    # Only the ratios of the weights matter (for reinforce_pp_baseline without Bessel's
    # correction): weights near the float64 limit must give the same advantages.
    key = {"opo": "lengths", "reinforce_pp_baseline": "token_counts"}.get(name)
    if key and (name == "opo" or options.get("ddof", 1) == 0):
        weights = options.get(key)
        if weights is not None and np.isfinite(weights).all() and np.max(weights, initial=0) > 0:
            top = math.frexp(float(np.max(weights)))[1]
            scaled = {**options, key: np.ldexp(weights, 1023 - top)}
            np.testing.assert_allclose(function(rewards, **layout, **scaled), out,
                                       rtol=1e-5 if out.dtype == np.float32 else 1e-9,
                                       atol=1e-9 * float(np.max(np.abs(out), initial=0)))


@given(data=st.data(), name=st.sampled_from(sorted(LINEAR)))
def test_linear_estimators_return_every_representable_result(data: st.DataObject, name: str
                                                             ) -> None:
    # f(x) = 2^k f(2^-k x): evaluated on rewards near 1, where nothing overflows on the way.
    rewards, layout, kind, _ = data.draw(fuzz_batches(nan=False))
    assume(kind != "nan")
    values = np.asarray(rewards)
    wide = values.astype(np.longdouble if values.dtype.kind == "f" else np.float64)
    assume(values.size and np.isfinite(wide).all() and np.abs(wide).max() > 0)
    out_dtype = _expected_dtype(rewards)
    options = dict(LINEAR[name])
    if name == "opo":
        options["lengths"] = data.draw(per_response(values.shape)
                                       .filter(lambda w: np.isfinite(w).all() and (w > 0).all()))
    exponent = math.frexp(float(np.abs(wide).max()))[1]
    small = np.ldexp(wide.astype(np.float64), -exponent)
    # The oracle is exact only where the rescaling is: no reward may turn subnormal.
    nonzero = np.abs(small[wide != 0])
    assume(not (nonzero < np.finfo(np.float64).smallest_normal * 2**60).any())
    with np.errstate(over="ignore"):
        reference = np.ldexp(REGISTRY[name].function(small, **layout, **options,
                                                     backend="numpy"), exponent)
    limit = float(np.finfo(out_dtype).max)
    assume(np.all(np.abs(reference) <= limit * (1 - 1e-6)))
    for backend in BACKENDS:
        out = REGISTRY[name].function(rewards, **layout, **options, backend=backend)
        tol = 1e-5 if out_dtype == np.float32 else 1e-9
        # a result below the output dtype's subnormals rounds to 0 or its smallest subnormal
        tiny = float(np.finfo(out_dtype).smallest_subnormal)
        np.testing.assert_allclose(out.astype(np.float64), reference, rtol=tol,
                                   atol=max(tol * float(np.abs(reference).max()), tiny))


@given(data=st.data())
def test_range_estimators(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from(FUZZ_DTYPES))
    groups = data.draw(fuzz_groups(dtype=dtype))
    sizes = [len(g) for g in groups]
    lo = as_dtype([v for g in groups for v in g], dtype)
    width = data.draw(st.sampled_from([0.0, 0.5, 1e300, -1.0]))
    with np.errstate(all="ignore"):
        hi = (lo.astype(np.float64) + width).astype(lo.dtype)
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    options = {"relation": data.draw(st.sampled_from(OPTION_VALUES["relation"]))}
    for name in RANGES:
        _engines_agree(_outcomes(REGISTRY[name].function, (None, offsets),
                                 {"lo": lo, "hi": hi, **options}))


@given(data=st.data())
def test_gdpo(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from(FUZZ_DTYPES))
    n_groups, width, n_funcs = (data.draw(st.integers(0, 3)), data.draw(st.integers(0, 4)),
                                data.draw(st.integers(0, 3)))
    values = [data.draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, 1e300, 5e-324, -3.0,
                                                   float("nan")]),
                                 min_size=n_funcs, max_size=n_funcs))
              for _ in range(n_groups * width)]
    rewards = as_dtype(values, dtype).reshape(n_groups, width, n_funcs)
    weights = data.draw(st.one_of(st.none(), st.lists(
        st.sampled_from([1.0, 0.5, 1e308, -2.0, float("nan")]), min_size=n_funcs,
        max_size=n_funcs)))
    options = {"weights": weights,
               "eps": data.draw(st.sampled_from(OPTION_VALUES["eps"])),
               "nan_policy": data.draw(st.sampled_from(OPTION_VALUES["nan_policy"]))}
    out = _engines_agree(_outcomes(advcal.gdpo, (rewards,), options))
    if out is not None:
        assert out.shape == (n_groups, width) and out.dtype == _expected_dtype(rewards)


@given(name=st.sampled_from(POINT),
       key=st.sampled_from(["eps", "ddof", "tau_res", "lengths", "f_norm", "bogus",
                            "return_scale", "std_floor", "scale"]))
def test_dispatch_names_the_estimator_and_option(name: str, key: str) -> None:
    function = REGISTRY[name].function
    if key in inspect.signature(function).parameters:
        return
    with pytest.raises(TypeError, match=f"estimator '{name}' takes no option '{key}'"):
        advcal.advantages([[1.0, 0.0]], method=name, **{key: 1.0})


@given(sizes=st.lists(st.one_of(st.integers(0, 5), st.integers(2**60, 2**64 - 1)),
                      max_size=5),
       dtype=st.sampled_from(["int64", "uint64", "int8", "object", "float64"]))
def test_offsets_from_sizes(sizes: list[int], dtype: str) -> None:
    try:
        arr = np.array(sizes, dtype=dtype)
    except OverflowError:
        return
    try:
        offsets = advcal.offsets_from_sizes(arr)
    except (ValueError, TypeError) as exc:
        assert_raised_by_advcal(exc)
        assert (sum(int(s) for s in arr) > 2**63 - 1 or arr.dtype.kind not in "iu"
                or (arr < 0).any())
        return
    assert offsets.dtype == np.int64 and offsets[0] == 0
    assert [int(o) for o in offsets[1:]] == list(np.cumsum([int(s) for s in arr], dtype=object))


@given(kind=st.sampled_from(LABEL_KINDS),
       n_groups=st.integers(1, 5), shape2d=st.booleans())
def test_calibrate_ranges_categories(kind: str, n_groups: int, shape2d: bool) -> None:
    assume(not (kind == "tuple" and shape2d))  # nested tuples read as a 3-D array
    labels = labels_for(kind, n_groups)
    categories = [labels[i % n_groups] for i in range(4 * n_groups)]
    rng = np.random.default_rng(n_groups)
    judge = rng.uniform(size=4 * n_groups)
    reference = rng.uniform(size=4 * n_groups)
    if shape2d:
        judge, reference = judge.reshape(4, n_groups), reference.reshape(4, n_groups)
        cats: Any = [categories[r * n_groups:(r + 1) * n_groups] for r in range(4)]
    else:
        cats = categories
    try:
        cal = advcal.calibrate_ranges(judge, reference, alpha=0.5, categories=cats)
    except (ValueError, TypeError) as exc:
        assert_raised_by_advcal(exc)
        assert kind == "nan", exc
        return
    assert kind != "nan"
    assert len(cal.radius) == len(set(_codes(categories))) == n_groups


@given(k=st.one_of(st.integers(0, 50), st.integers(10**15, 10**19)),
       n=st.one_of(st.integers(0, 50), st.integers(10**15, 10**20)),
       delta=st.sampled_from([0.1, 5e-324, 1e-300, 1.0 - 1e-16, 0.5, 0.0, 1.0, -0.1]))
def test_ucb(k: int, n: int, delta: float) -> None:
    try:
        value = advcal.ucb(k, n, delta)
    except (ValueError, TypeError) as exc:
        assert_raised_by_advcal(exc)
        return
    value = float(value)
    assert math.isfinite(value) and 0.0 <= value <= 1.0
    assert n == 0 or delta > 0.5 or value >= k / n - 1e-12


@given(data=st.data(),
       estimator=st.sampled_from((*POINT, "range", "bogus")),
       eps=st.sampled_from([1e-6, 0.0, 1e-320]),
       option=st.sampled_from([{}, {"return_scale": True}, {"offsets": 3}, {"bogus": 1},
                               {"singleton": "raw"}, {"ddof": 0}]))
def test_sets(data: st.DataObject, estimator: str, eps: float, option: dict[str, Any]) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a = rng.uniform(size=(24, 4))
    if data.draw(st.booleans()):
        a[data.draw(st.integers(0, 23))] = 0.5  # a constant group
    if data.draw(st.booleans()):
        a = a * data.draw(st.sampled_from([1e-300, 1e150, 1e300]))
    b = a + 0.01 * rng.standard_normal(a.shape) * np.abs(a).max()
    options = {**option}
    if estimator == "maxnorm":
        options.setdefault("tau_res", 0.1)
    a_before, b_before = a.copy(), b.copy()
    try:
        cal = advcal.calibrate_sets(a, b, alpha=0.2, estimator=estimator, eps=eps,
                                    options=options)
        jac = advcal.coefficient_jacobian(a, estimator=estimator, eps=eps, options=options)
    except (ValueError, TypeError) as exc:
        assert_raised_by_advcal(exc)
        return
    finally:
        assert np.array_equal(a, a_before) and np.array_equal(b, b_before)
    assert np.isfinite(jac).all()
    train = rng.uniform(size=12)
    offsets = np.array([0, 4, 8, 12])
    try:
        sets = advcal.coefficient_sets(train, offsets, calibration=cal)
    except (ValueError, TypeError) as exc:
        assert_raised_by_advcal(exc)
        return
    directions = rng.standard_normal(12)
    support = sets.support(directions)
    offsets[1] = 2  # the caller reuses its arrays: the sets must not change
    train[:] = 0.0
    np.testing.assert_array_equal(sets.support(directions), support)


TORCH_DTYPES = ("float16", "bfloat16", "float32", "float64", "int64", "bool")


@given(data=st.data(), name=st.sampled_from(POINT),
       dtype=st.sampled_from(TORCH_DTYPES), meta=st.booleans())
def test_torch_estimators(data: st.DataObject, name: str, dtype: str, meta: bool) -> None:
    torch = pytest.importorskip("torch")
    import advcal.torch as act

    values = data.draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, 3.0, 1e4]), min_size=6,
                                max_size=6))
    rewards = torch.tensor(values).reshape(2, 3).to(getattr(torch, dtype))
    options = _draw_options(data.draw, name, REGISTRY[name].function, (2, 3))
    if meta:
        rewards = rewards.to("meta")
    try:
        out = getattr(act, name)(rewards, **options)
    except (ValueError, TypeError) as exc:
        assert_raised_by_advcal(exc)
        return
    assert not meta
    assert out.shape == rewards.shape and out.device == rewards.device
    host = rewards.float() if dtype in ("float16", "bfloat16") else rewards
    expected = REGISTRY[name].function(host.numpy(), **options)
    expected = getattr(expected, "advantages", expected)
    got = getattr(out, "advantages", out)
    np.testing.assert_array_equal(got.to(torch.float64).numpy(),
                                  torch.from_numpy(np.asarray(expected)).to(got.dtype)
                                  .to(torch.float64).numpy())
