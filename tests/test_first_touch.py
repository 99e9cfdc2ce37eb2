"""The first touch of fresh outputs (``advcal._kernels.first_touch``): which elements it
writes, and that the kernels' results do not depend on it."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

from advcal import offsets_from_sizes
from advcal._kernels import first_touch, maxnorm_numba, point_numba, pool
from advcal._kernels.modes import GRPO, RLOO

HUGE = first_touch.HUGE_PAGE
page_ends = njit(cache=False)(first_touch._page_ends)


@st.composite
def touched_ranges(draw):
    """(dtype, n, lo, hi, address): a range of an array spanning up to three huge pages,
    placed at an address anywhere in a huge page (a multiple of the item size)."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    size = np.dtype(dtype).itemsize
    per_page = HUGE // size
    n = draw(st.integers(1, 3 * per_page))
    lo = draw(st.integers(0, n))
    hi = draw(st.integers(lo, n))
    address = draw(st.integers(0, 4 * per_page)) * size + (1 << 40)
    return dtype, n, lo, hi, address


@given(touched_ranges())
def test_page_ends_are_the_last_element_of_each_huge_page_in_range(case):
    dtype, n, lo, hi, address = case
    size = np.dtype(dtype).itemsize
    out = np.full(n, 7.0, dtype=dtype)
    page_ends(out, lo, hi, address)
    index = np.arange(lo, hi)
    ends_a_page = (address + (index + 1) * size) % HUGE == 0
    expected = set(index[ends_a_page].tolist()) | ({hi - 1} if hi > lo else set())
    assert set(np.flatnonzero(out == 0.0).tolist()) == expected
    assert np.all(out[out != 0.0] == 7.0)


def test_a_range_within_one_page_gets_its_last_element():
    out = np.full(10, 7.0)
    page_ends(out, 3, 8, 1 << 40)
    assert out.tolist() == [7.0] * 7 + [0.0] + [7.0] * 2
    page_ends(out, 4, 4, 1 << 40)  # empty: nothing written
    assert np.count_nonzero(out == 0.0) == 1


def _kernel_calls(x, offsets):
    """Every kernel wrapper that passes its fresh output to ``run_over_groups``: name and
    a function of ``threaded`` returning the output."""
    no = dict(per_group=False)
    yield "grpo", lambda t: point_numba.center_scale(x, offsets, GRPO, 1e-6, 1, False, False,
                                                     1.0, np.inf, threaded=t)[0]
    yield "rloo, NaN omitted", lambda t: point_numba.center_scale(
        x, offsets, RLOO, 1e-6, 1, False, True, 1.0, np.inf, threaded=t)[0]
    yield "opo", lambda t: point_numba.opo(x, np.ones_like(x), offsets, False, False, np.inf,
                                           threaded=t)[0]
    yield "passk", lambda t: point_numba.passk(x, offsets, 1e-6, 1, False, False, np.inf,
                                               threaded=t)[0]
    yield "maxnorm", lambda t: maxnorm_numba.maxnorm(
        x, offsets, 0.01, True, 0.0, False, -math.inf, math.inf, False, 0.0, 0.0, 0.0,
        False, threaded=t, **no)[0]
    yield "maxnorm, binned", lambda t: maxnorm_numba.maxnorm(
        x, offsets, 0.01, True, 0.0, False, 0.0, 1.0, False, 0.01, 100.0, 100.0, False,
        threaded=t, **no)[0]
    yield "maxnorm, clipped", lambda t: maxnorm_numba.maxnorm(
        x, offsets, 0.01, True, 0.0, False, 0.0, 1.0, True, 0.0, 0.0, 0.0, False,
        threaded=t, **no)[0]
    yield "resolve_rewards", lambda t: maxnorm_numba.resolve(
        x, offsets, 0.0, 1.0, False, 0.01, 100.0, 100.0, False, threaded=t)[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_touch_their_fresh_output_and_overwrite_it(dtype):
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 40, size=(first_touch.MIN_BYTES // np.dtype(dtype).itemsize) // 16)
    offsets = offsets_from_sizes(sizes)
    x = rng.random(int(offsets[-1])).astype(dtype)
    assert x.nbytes >= first_touch.MIN_BYTES
    touched = []

    def spy(out, lo, hi):
        touched.append((lo, hi))
        first_touch.touch_page_ends(out, lo, hi)

    for name, call in _kernel_calls(x, offsets):
        with mock.patch.object(pool, "MIN_BYTES", np.inf):  # never touched first
            expected = call(False)
        for threaded in (False, True):
            touched.clear()
            with mock.patch.object(pool, "touch_page_ends", spy), \
                    mock.patch.object(pool, "n_threads", lambda: 3):
                result = call(threaded)
            # each chunk touched its own share, and the shares cover the output
            assert sorted(touched)[0][0] == 0 and sorted(touched)[-1][1] == x.size, name
            assert len(touched) == (3 if threaded else 1), name
            np.testing.assert_array_equal(result, expected, err_msg=name)


def test_small_outputs_are_not_touched():
    x = np.random.default_rng(0).random(1000)
    offsets = offsets_from_sizes([10] * 100)
    with mock.patch.object(pool, "touch_page_ends") as spy:
        point_numba.center_scale(x, offsets, GRPO, 1e-6, 1, False, False, 1.0, np.inf,
                                 threaded=True)
    spy.assert_not_called()
