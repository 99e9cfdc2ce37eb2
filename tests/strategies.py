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
