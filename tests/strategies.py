"""Hypothesis strategies shared by the test modules (one place, as in flox)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from advcal import offsets_from_sizes

FLOAT_DTYPES = (np.float32, np.float64)

# Group sizes that exercise every code path: empty, singleton, pair, and larger groups.
group_sizes = st.one_of(st.sampled_from([0, 1, 2]), st.integers(3, 40))


@dataclass
class RaggedBatch:
    values: np.ndarray
    offsets: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)


def reward_values(dtype: type, *, bound: float = 1e3) -> st.SearchStrategy[float]:
    """Finite rewards representable in ``dtype``, with frequent exact ties."""
    width = 32 if dtype == np.float32 else 64
    return st.one_of(
        st.sampled_from([0.0, 0.1, 0.5, 1.0]),
        st.floats(-bound, bound, allow_nan=False, allow_infinity=False, width=width),
    )


@st.composite
def ragged_batches(
    draw: st.DrawFn,
    *,
    dtype: type | None = None,
    max_groups: int = 12,
    bound: float = 1e3,
    min_size: int = 0,
) -> RaggedBatch:
    """A ragged batch: float32 or float64 rewards with groups of size 0, 1, 2 and larger."""
    dtype = dtype or draw(st.sampled_from(FLOAT_DTYPES))
    sizes = draw(st.lists(group_sizes.filter(lambda s: s >= min_size), max_size=max_groups))
    values = []
    for size in sizes:
        if size and draw(st.booleans()) and draw(st.booleans()):
            values += [draw(reward_values(dtype, bound=bound))] * size  # a zero-gap group
        else:
            values += draw(st.lists(reward_values(dtype, bound=bound), min_size=size,
                                    max_size=size))
    return RaggedBatch(np.array(values, dtype=dtype), offsets_from_sizes(np.array(sizes, int)))


@st.composite
def dense_batches(draw: st.DrawFn, *, dtype: type | None = None, bound: float = 1e3
                  ) -> np.ndarray:
    """A dense (B, G) reward matrix."""
    dtype = dtype or draw(st.sampled_from(FLOAT_DTYPES))
    n_groups = draw(st.integers(0, 8))
    width = draw(st.integers(0, 20))
    flat = draw(st.lists(reward_values(dtype, bound=bound), min_size=n_groups * width,
                         max_size=n_groups * width))
    return np.array(flat, dtype=dtype).reshape(n_groups, width)


# --- garbage input for the bad-input fuzz tests (issue 4) ---------------------------------

GARBAGE_DTYPES = (np.bool_, np.int8, np.int64, np.uint64, np.float16, np.float32,
                  np.float64, np.complex128, np.str_, object)


@st.composite
def garbage_arrays(draw: st.DrawFn, *, max_dims: int = 3, max_side: int = 5) -> object:
    """Anything a careless caller might pass: odd shapes, dtypes, NaN/inf, lists, None."""
    kind = draw(st.sampled_from(["array", "array", "array", "scalar", "list", "none"]))
    if kind == "none":
        return None
    if kind == "scalar":
        return draw(st.one_of(st.floats(), st.integers(-(2**70), 2**70), st.booleans(),
                              st.text(max_size=3), st.complex_numbers()))
    if kind == "list":  # possibly ragged nested lists
        return draw(st.lists(st.one_of(st.floats(), st.lists(st.floats(), max_size=3)),
                             max_size=4))
    shape = tuple(draw(st.lists(st.integers(0, max_side), max_size=max_dims)))
    dtype = draw(st.sampled_from(GARBAGE_DTYPES))
    size = int(np.prod(shape)) if shape else 1
    raw = draw(st.lists(st.one_of(st.floats(), st.integers(-1000, 1000),
                                  st.sampled_from([0.0, 0.5, 1.0, -1.0])),
                        min_size=size, max_size=size))
    values = np.array(raw, dtype=object).reshape(shape)
    try:
        with np.errstate(all="ignore"):
            return values.astype(dtype)
    except (ValueError, TypeError, OverflowError):
        return values
