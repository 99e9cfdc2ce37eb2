"""Bad input to the point estimators and layout helpers.

Every error names the argument; the fuzz test accepts only advcal's own ValueError or
TypeError, never an exception from inside numpy/numba, a crash, or a NaN output.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import advcal
from advcal import ESTIMATORS, advantages, grpo, offsets_from_sizes, opo, rloo
from advcal.registry import REGISTRY
from tests.checks import assert_raised_by_advcal
from tests.strategies import garbage_arrays

# The registered estimators of advcal.estimators (maxnorm and range have their own tests).
POINT_ESTIMATORS = tuple(name for name, entry in REGISTRY.items()
                         if entry.function.__module__ == "advcal.estimators")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rewards": np.zeros((2, 2, 2))}, ValueError,
         "`rewards` must be 1-D (with offsets or group_ids) or 2-D; got 3-D."),
        ({"rewards": 1.0}, ValueError,
         "`rewards` must be 1-D (with offsets or group_ids) or 2-D; got 0-D."),
        ({"rewards": [1.0, 2.0]}, ValueError,
         "1-D `rewards` need exactly one of `offsets` or `group_ids`."),
        ({"rewards": [1.0, 2.0], "offsets": [0, 2], "group_ids": [1, 1]}, ValueError,
         "1-D `rewards` need exactly one of `offsets` or `group_ids`."),
        ({"rewards": [[1.0, 2.0]], "offsets": [0, 2]}, ValueError,
         "`offsets` and `group_ids` apply to 1-D `rewards` only; 2-D `rewards` are grouped "
         "by row."),
        ({"rewards": ["a", "b"], "offsets": [0, 2]}, TypeError,
         "`rewards` must be an array of real numbers; got dtype <U1."),
        ({"rewards": [1j, 2.0], "offsets": [0, 2]}, TypeError,
         "`rewards` must be an array of real numbers; got dtype complex128."),
        ({"rewards": [1.0, None], "offsets": [0, 2]}, TypeError,
         "`rewards` must be an array of real numbers; got dtype object."),
        ({"rewards": [1.0, 2.0], "offsets": [0.0, 2.0]}, TypeError,
         "`offsets` must be an integer array; got dtype float64."),
        ({"rewards": [1.0, 2.0], "offsets": [[0, 2]]}, ValueError,
         "`offsets` must be 1-D with at least one entry; got shape (1, 2)."),
        ({"rewards": [1.0, 2.0], "offsets": []}, ValueError,
         "`offsets` must be 1-D with at least one entry; got shape (0,)."),
        ({"rewards": [1.0, 2.0], "offsets": [1, 2]}, ValueError, "`offsets[0]` must be 0; got 1."),
        ({"rewards": [1.0, 2.0], "offsets": [0, 3]}, ValueError,
         "`offsets[-1]` must equal the number of rewards (2); got 3."),
        ({"rewards": [1.0, 2.0], "offsets": [0, 3, 1, 2]}, ValueError,
         "`offsets` must be non-decreasing."),
        ({"rewards": [1.0, 2.0], "group_ids": [1]}, ValueError,
         "`group_ids` must have one label per reward (2); got 1."),
        ({"rewards": [[1.0, np.nan]]}, ValueError,
         "`rewards` contain NaN; pass nan_policy='omit' to leave unscorable responses out of "
         "their groups."),
        ({"rewards": [[1.0, np.inf]], "nan_policy": "omit"}, ValueError,
         "`rewards` must be finite; got inf."),
        ({"rewards": [[1.0, 0.0]], "eps": -1.0}, ValueError,
         "`eps` must lie in [0.0, inf]; got -1.0."),
        ({"rewards": [[1.0, 0.0]], "eps": float("nan")}, ValueError,
         "`eps` must be finite; got nan."),
        ({"rewards": [[1.0, 0.0]], "eps": "small"}, TypeError,
         "`eps` must be a real number; got str."),
        ({"rewards": [[1.0, 0.0]], "ddof": 2}, ValueError, "`ddof` must be one of (0, 1); got 2."),
        ({"rewards": [[1.0, 0.0]], "ddof": 1.0}, TypeError,
         "`ddof` must be an integer; got float."),
        ({"rewards": [[1.0, 0.0]], "singleton": "drop"}, ValueError,
         "`singleton` must be one of 'zero', 'raw', 'error'; got 'drop'."),
        ({"rewards": [[1.0, 0.0]], "nan_policy": "propagate"}, ValueError,
         "`nan_policy` must be one of 'raise', 'omit'; got 'propagate'."),
        ({"rewards": [[1.0, 0.0]], "backend": "cuda"}, ValueError,
         "`backend` must be one of 'numba', 'numpy'; got 'cuda'."),
    ],
)
def test_grpo_rejects_with_a_message_naming_the_argument(kwargs, error, message, backend):
    kwargs = dict(kwargs)
    kwargs.setdefault("backend", backend)
    with pytest.raises(error, match=re.escape(message)):
        grpo(**kwargs)


def test_overflowing_advantages_are_reported_not_returned_as_inf(backend):
    rewards = np.array([[-3e38, 3e38]], dtype=np.float32)  # rloo: 2 * 3e38 > float32 max
    with pytest.raises(ValueError, match=re.escape(
            "`rewards` are too large: the advantages overflow float32 (rescale the rewards).")):
        rloo(rewards, backend=backend)


@pytest.mark.parametrize(
    ("name", "kwargs", "error", "message"),
    [
        ("opo", {"lengths": [[1.0]]}, ValueError, "`lengths` must have shape (1, 2); got (1, 1)."),
        ("opo", {"lengths": [[1.0, 0.0]]}, ValueError, "`lengths` must be finite and positive."),
        ("reinforce_pp_baseline", {"token_counts": [[1.0, -1.0]]}, ValueError,
         "`token_counts` must be finite and non-negative."),
        ("gpg", {"f_norm": 0.0}, ValueError, "`f_norm` must lie in (0.0, inf]; got 0.0."),
        ("passk", {"eps": -1e-3}, ValueError, "`eps` must lie in [0.0, inf]; got -0.001."),
    ],
)
def test_estimator_specific_options_are_checked(name, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        advantages([[1.0, 0.0]], method=name, **kwargs)


def test_opo_requires_lengths():
    with pytest.raises(TypeError, match="lengths"):
        opo([[1.0, 0.0]])  # type: ignore[call-arg]


# ---------------------------------------------------------------- fuzzing


garbage_offsets = st.one_of(
    st.none(),
    st.lists(st.integers(-3, 30), max_size=8),
    st.lists(st.floats(-3, 30), max_size=4),
    st.just([0]),
    st.builds(lambda sizes: offsets_from_sizes(np.array(sizes, dtype=np.int64)),
              st.lists(st.integers(0, 6), max_size=6)),
)
garbage_options = st.fixed_dictionaries({}, optional={
    "eps": st.one_of(st.floats(allow_nan=True), st.integers(-2, 2), st.text(max_size=2)),
    "ddof": st.one_of(st.integers(-1, 3), st.floats(0, 2)),
    "singleton": st.sampled_from(["zero", "raw", "error", "nope", 3]),
    "nan_policy": st.sampled_from(["raise", "omit", None]),
    "backend": st.sampled_from(["numba", "numpy", "torch"]),
    "group_ids": st.one_of(st.lists(st.sampled_from(["a", "b", 1, (2, 3)]), max_size=30),
                           st.text(max_size=3)),
})


@given(name=st.sampled_from(POINT_ESTIMATORS), rewards=garbage_arrays(),
       offsets=garbage_offsets, options=garbage_options, extra=garbage_arrays())
def test_fuzz_point_estimators_raise_only_their_own_errors(name, rewards, offsets, options,
                                                           extra):
    kwargs = dict(options)
    if name == "opo":
        kwargs["lengths"] = extra
    if name == "reinforce_pp_baseline":
        kwargs.pop("ddof", None)
        kwargs["token_counts"] = extra
    if name in ("dr_grpo", "rloo", "opo", "gpg"):
        kwargs.pop("eps", None)
        kwargs.pop("ddof", None)
    try:
        out = ESTIMATORS[name](rewards, offsets, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the assertion inspects it
        assert_raised_by_advcal(exc)
        assert "`" in str(exc) or "group" in str(exc), f"message names no argument: {exc}"
    else:
        assert not np.isnan(out).any()
        assert np.isfinite(out).all()


@given(sizes=st.one_of(garbage_arrays(), st.lists(st.integers(-2, 5))),
       ids=st.one_of(garbage_arrays(), st.lists(st.one_of(st.integers(), st.text(max_size=2),
                                                          st.lists(st.integers()))), st.none()))
def test_fuzz_layout_helpers_raise_only_their_own_errors(sizes, ids):
    for fn, arg in ((advcal.offsets_from_sizes, sizes), (advcal.groups_from_ids, ids)):
        try:
            fn(arg)
        except Exception as exc:  # noqa: BLE001
            assert_raised_by_advcal(exc)
