"""Range-GRPO interval advantages: relations, kernels, properties, layouts."""

from __future__ import annotations

from unittest import mock

import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import integrate

import advcal
from advcal import advantages, dr_grpo, offsets_from_sizes, range_advantages
from advcal._kernels import ranges_numpy
from advcal.ranges import RELATIONS
from tests.checks import own_error_or_result
from tests.strategies import FLOAT_DTYPES, garbage_arrays, ragged_batches


@st.composite
def range_batches(draw, *, dtype=None, max_groups=10, bound=1e3, min_size=0):
    """Ragged ranges: lower bounds with ties and zero-gap groups, widths often exactly 0."""
    base = draw(ragged_batches(dtype=dtype, max_groups=max_groups, bound=bound,
                               min_size=min_size))
    widths = draw(st.lists(st.one_of(st.just(0.0), st.sampled_from([0.1, 0.5]),
                                     st.floats(0.0, bound / 10)),
                           min_size=base.values.size, max_size=base.values.size))
    lo = base.values
    hi = (lo.astype(np.float64) + np.array(widths)).astype(lo.dtype)
    return lo, np.maximum(hi, lo), base.offsets


def _tolerance(lo, hi, dtype=np.float64):
    scale = 1.0 + max(np.abs(lo).max(initial=0.0), np.abs(hi).max(initial=0.0))
    return 64 * np.finfo(dtype).eps * scale


# --------------------------------------------------------------------------- by hand


def test_hand_examples_all_relations():
    lo = np.array([[0.0, 0.5, 0.9]])
    hi = np.array([[0.2, 0.7, 1.0]])
    # φ12 = -0.3, φ13 = -0.7, φ23 = -0.2 (no overlaps)
    np.testing.assert_allclose(range_advantages(lo, hi), [[-1.0 / 3, 0.1 / 3, 0.3]])
    np.testing.assert_allclose(range_advantages(lo, hi, relation="midpoint"),
                               [[-0.45, 0.05, 0.4]])
    # Disjoint ranges: P(R_i > R_j) is 0 or 1, so probabilistic = midpoint.
    np.testing.assert_allclose(range_advantages(lo, hi, relation="probabilistic"),
                               [[-0.45, 0.05, 0.4]])


def test_probabilistic_by_hand():
    # [0, 1] vs [0.5, 1.5]: P(R1 > R2) = corner triangle 0.5**2 / 2 = 0.125, so
    # D = 0.125 - 0.875 = -0.75 and φ12 = (0.5 - 1.0) * 0.75 = -0.375.
    out = range_advantages([[0.0, 0.5]], [[1.0, 1.5]], relation="probabilistic")
    np.testing.assert_allclose(out, [[-0.1875, 0.1875]])
    # [0, 1] vs the point 0.25: D = 0.75 - 0.25 = 0.5, φ = (0.5 - 0.25) * 0.5.
    out = range_advantages([[0.0, 0.25]], [[1.0, 0.25]], relation="probabilistic")
    np.testing.assert_allclose(out, [[0.0625, -0.0625]])
    # Identical ranges: no direction.
    out = range_advantages([[0.2, 0.2]], [[0.8, 0.8]], relation="probabilistic")
    np.testing.assert_array_equal(out, [[0.0, 0.0]])


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("power", [-900, -1040, -1060])
def test_probabilistic_tiny_and_subnormal_widths_by_hand(backend, power):
    # The example above scaled by 2**power: widths whose product (or reciprocal) under- or
    # overflows float64.  φ is homogeneous of degree one, so the result scales exactly.
    unit = 2.0 ** power
    out = range_advantages([[0.0, 0.5 * unit]], [[unit, 1.5 * unit]],
                           relation="probabilistic", backend=backend)
    np.testing.assert_array_equal(out, [[-0.1875 * unit, 0.1875 * unit]])
    # A range of width 1e-173 among a point and a range of width 1e-239 (found by
    # hypothesis): D = ±1 for every pair, so A = (m_i - mean m) with m the midpoints.
    lo, hi = np.array([0.0, 6.95937953e-255, 0.0]), np.array([0.0, 1.11887999e-173, 1.2e-239])
    mid = (lo + hi) / 2
    out = range_advantages(lo, hi, [0, 3], relation="probabilistic", backend=backend)
    np.testing.assert_allclose(out, mid - mid.mean(), rtol=1e-12)


def test_dominance_overlap_gives_no_direction():
    out = range_advantages([[0.0, 0.4, 2.0]], [[0.5, 1.0, 3.0]])
    # Pairs 1-2 overlap; pair 1-3: 2.0 - 0.5 = 1.5; pair 2-3: 2.0 - 1.0 = 1.0.
    np.testing.assert_allclose(out, [[-1.5 / 3, -1.0 / 3, 2.5 / 3]])


# --------------------------------------------------------------------------- closed form


_CASES = [
    (0.0, 1.0, 0.5, 1.5),
    (0.0, 1.0, 0.2, 0.3),  # nested
    (0.0, 0.01, 0.0, 5.0),  # very different widths
    (0.3, 0.9, 0.0, 0.6),
    (0.0, 2.0, 1.0, 1.0),  # point inside
    (0.5, 0.5, 0.0, 1.0),  # point vs range
    (0.0, 1.0, 1.0, 2.0),  # touching
    (0.0, 1.0, 3.0, 4.0),  # disjoint
]


@pytest.mark.parametrize(("li", "hi_", "lj", "hj"), _CASES)
def test_sign_expectation_against_numerical_integration(li, hi_, lj, hj):
    closed = float(ranges_numpy.sign_expectation(li, hi_, lj, hj))

    def p_greater(x):  # P(R_i > x) - P(R_i < x)
        if hi_ == li:
            return float(np.sign(li - x))
        return float(np.clip((hi_ + li - 2 * x) / (hi_ - li), -1, 1))

    if hj > lj:
        points = [p for p in (li, hi_) if lj < p < hj]
        value, _ = integrate.quad(p_greater, lj, hj, points=points or None, epsabs=1e-13)
        expected = value / (hj - lj)
    else:
        expected = p_greater(lj)
    assert closed == pytest.approx(expected, abs=1e-10)
    assert float(ranges_numpy.sign_expectation(lj, hj, li, hi_)) == pytest.approx(-closed)


@pytest.mark.parametrize(("li", "hi_", "lj", "hj"), _CASES)
def test_sign_expectation_against_monte_carlo(li, hi_, lj, hj):
    rng = np.random.default_rng(5)
    draws = 200_000
    ri = rng.uniform(li, hi_, draws) if hi_ > li else np.full(draws, li)
    rj = rng.uniform(lj, hj, draws) if hj > lj else np.full(draws, lj)
    sample = np.sign(ri - rj)
    closed = float(ranges_numpy.sign_expectation(li, hi_, lj, hj))
    assert abs(sample.mean() - closed) <= 4.5 * max(sample.std(), 1e-3) / np.sqrt(draws)


def test_numba_and_numpy_closed_forms_agree_on_a_grid():
    from advcal._kernels import ranges_numba

    grid = np.array([0.0, 0.1, 0.25, 0.5, 1.0, 1.5, 3.0])
    for li in grid:
        for wi in (0.0, 0.01, 1.0, 2.0):
            for lj in grid:
                for wj in (0.0, 0.01, 1.0, 2.0):
                    a = ranges_numba._sign_expectation(li, li + wi, lj, lj + wj)
                    b = float(ranges_numpy.sign_expectation(li, li + wi, lj, lj + wj))
                    assert a == pytest.approx(b, abs=1e-14)


# --------------------------------------------------------------------------- properties


@pytest.mark.parametrize("relation", RELATIONS)
@given(batch=range_batches())
def test_kernel_matches_the_quadratic_reference(relation, batch):
    lo, hi, offsets = batch
    fast = range_advantages(lo, hi, offsets, relation=relation)
    slow = range_advantages(lo, hi, offsets, relation=relation, backend="numpy")
    assert fast.dtype == slow.dtype == lo.dtype
    np.testing.assert_allclose(fast, slow, rtol=0, atol=_tolerance(lo, hi, lo.dtype))


def _group_sizes(kind, rng, n_groups):
    """Sizes reaching each sorting path: per-group sort (one long group among short
    ones), +inf-padded rows (similar sizes), numpy's row sort (equal sizes)."""
    return {
        "ragged": np.concatenate([[0, 1, 2, 100], rng.integers(0, 40, n_groups)]),
        "similar": np.concatenate([[0, 1], rng.integers(20, 40, n_groups)]),
        "dense": np.full(n_groups, 24),
    }[kind]


def _tied_ranges(rng, n):
    lo = np.round(rng.random(n), 2)  # ties in lo and hi
    return lo, lo + np.where(rng.random(n) < 0.3, 0.0, np.round(rng.random(n) * 0.3, 2))


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("sizes", ["ragged", "similar", "dense"])
def test_kernel_matches_reference_on_every_sorting_path_in_chunks(relation, sizes):
    from advcal._kernels import pool, ranges_numba

    rng = np.random.default_rng(2)
    offsets = offsets_from_sizes(_group_sizes(sizes, rng, 300))
    lo, hi = _tied_ranges(rng, int(offsets[-1]))
    code = RELATIONS.index(relation)
    one_chunk = ranges_numba.range_advantages(lo, hi, offsets, code, threaded=False)
    slow = range_advantages(lo, hi, offsets, relation=relation, backend="numpy")
    np.testing.assert_allclose(one_chunk, slow, rtol=0, atol=1e-12)
    with mock.patch.object(pool, "n_threads", lambda: 3):  # 3 chunks on any machine
        chunked = ranges_numba.range_advantages(lo, hi, offsets, code, threaded=True)
    assert chunked.tobytes() == one_chunk.tobytes()


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("sizes", ["ragged", "similar"])
def test_bitwise_identical_for_any_thread_count(relation, sizes):
    from advcal._kernels import pool, ranges_numba

    rng = np.random.default_rng(7)
    offsets = offsets_from_sizes(_group_sizes(sizes, rng, 30_000))
    lo, hi = _tied_ranges(rng, int(offsets[-1]))
    assert lo.size >= 2 * pool.MIN_VALUES_PER_THREAD  # chunks run on threads by size
    code = RELATIONS.index(relation)
    previous = numba.get_num_threads()
    try:
        results = []
        for threads in range(1, numba.config.NUMBA_NUM_THREADS + 1):
            numba.set_num_threads(threads)
            results.append(ranges_numba.range_advantages(lo, hi, offsets, code))
    finally:
        numba.set_num_threads(previous)
    one_chunk = ranges_numba.range_advantages(lo, hi, offsets, code, threaded=False)
    for result in results:
        assert result.tobytes() == one_chunk.tobytes()


@given(batch=range_batches(dtype=np.float64), relation=st.sampled_from(RELATIONS))
def test_chunks_on_threads_equal_one_chunk_bitwise(batch, relation):
    # Forced chunking on small batches: chunk edges fall on empty groups, singletons,
    # zero-gap groups and long groups.
    from advcal._kernels import pool, ranges_numba

    lo, hi, offsets = batch
    code = RELATIONS.index(relation)
    with mock.patch.object(pool, "n_threads", lambda: 3):
        chunked = ranges_numba.range_advantages(lo, hi, offsets, code, threaded=True)
        one_chunk = ranges_numba.range_advantages(lo, hi, offsets, code, threaded=False)
    assert chunked.tobytes() == one_chunk.tobytes()


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("relation", RELATIONS)
@given(batch=ragged_batches())
def test_degenerate_ranges_collapse_to_dr_grpo(relation, batch, backend):
    out = range_advantages(batch.values, batch.values, batch.offsets, relation=relation,
                           backend=backend)
    expected = dr_grpo(batch.values, batch.offsets)
    tol = _tolerance(batch.values, batch.values, batch.values.dtype)
    np.testing.assert_allclose(out, expected, rtol=0, atol=tol)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("relation", RELATIONS)
@given(batch=range_batches(dtype=np.float64))
def test_zero_sum_per_group(relation, batch, backend):
    lo, hi, offsets = batch
    out = range_advantages(lo, hi, offsets, relation=relation, backend=backend)
    for q in range(offsets.size - 1):
        group = out[offsets[q]:offsets[q + 1]]
        assert abs(group.sum()) <= _tolerance(lo, hi) * max(group.size, 1)


@pytest.mark.parametrize("relation", RELATIONS)
@given(batch=range_batches(dtype=np.float64, bound=100.0, min_size=2))
def test_phi_is_antisymmetric(relation, batch):
    lo, hi, offsets = batch
    matrix = ranges_numpy._MATRICES[RELATIONS.index(relation)]
    for q in range(offsets.size - 1):
        sl = slice(offsets[q], offsets[q + 1])
        phi = matrix(lo[sl], hi[sl])
        tol = _tolerance(lo[sl], hi[sl])
        if relation == "dominance":  # (l_i - h_j)+ - (l_j - h_i)+ is exactly antisymmetric
            np.testing.assert_array_equal(phi, -phi.T)
        np.testing.assert_allclose(phi, -phi.T, rtol=0, atol=tol)
        assert np.all(np.diag(phi) == 0.0)
        # In a group of two, A_1 = φ12 / 2 = -A_2 from the kernel too.
        pair = range_advantages(lo[sl][:2], hi[sl][:2], [0, 2], relation=relation)
        assert abs(pair[0] + pair[1]) <= tol


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("relation", RELATIONS)
@given(batch=range_batches(dtype=np.float64, bound=100.0),
       shift=st.floats(-1e3, 1e3, allow_nan=False))
def test_translation_invariance(relation, batch, shift, backend):
    lo, hi, offsets = batch
    base = range_advantages(lo, hi, offsets, relation=relation, backend=backend)
    moved = range_advantages(lo + shift, hi + shift, offsets, relation=relation,
                             backend=backend)
    np.testing.assert_allclose(moved, base, rtol=0, atol=_tolerance(lo + shift, hi + shift))


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("relation", RELATIONS)
@given(batch=range_batches(dtype=np.float64, bound=100.0),
       power=st.integers(-20, 20), scale=st.floats(1e-3, 1e3))
def test_positive_scale_equivariance(relation, batch, power, scale, backend):
    lo, hi, offsets = batch
    # Powers of two scale every intermediate exactly unless one is subnormal: flush
    # tiny values to 0 (a monotone map, so lo <= hi survives).
    lo, hi = (np.where(np.abs(v) < 1e-100, 0.0, v) for v in (lo, hi))
    base = range_advantages(lo, hi, offsets, relation=relation, backend=backend)
    exact = range_advantages(lo * 2.0**power, hi * 2.0**power, offsets, relation=relation,
                             backend=backend)
    np.testing.assert_array_equal(exact, base * 2.0**power)
    scaled = range_advantages(lo * scale, hi * scale, offsets, relation=relation,
                              backend=backend)
    np.testing.assert_allclose(scaled, base * scale, rtol=0,
                               atol=_tolerance(lo * scale, hi * scale))


@given(batch=range_batches(dtype=np.float64, bound=100.0, min_size=1), data=st.data())
def test_widening_never_increases_dominance(batch, data):
    lo, hi, offsets = batch
    grow_lo = np.array(data.draw(st.lists(st.floats(0, 20), min_size=lo.size,
                                          max_size=lo.size)))
    grow_hi = np.array(data.draw(st.lists(st.floats(0, 20), min_size=lo.size,
                                          max_size=lo.size)))
    wide_lo, wide_hi = lo - grow_lo, hi + grow_hi
    for q in range(offsets.size - 1):
        sl = slice(offsets[q], offsets[q + 1])
        narrow = np.abs(ranges_numpy.dominance_matrix(lo[sl], hi[sl]))
        wide = np.abs(ranges_numpy.dominance_matrix(wide_lo[sl], wide_hi[sl]))
        assert np.all(wide <= narrow + 1e-12)
        for i in range(sl.stop - sl.start - 1):  # consecutive pairs as groups of two
            pair = slice(sl.start + i, sl.start + i + 2)
            before = range_advantages(lo[pair], hi[pair], [0, 2])
            after = range_advantages(wide_lo[pair], wide_hi[pair], [0, 2])
            assert np.all(np.abs(after) <= np.abs(before) + 1e-12)


@given(batch=range_batches(dtype=np.float64, bound=100.0))
def test_probabilistic_shrinks_the_midpoint_relation(batch):
    lo, hi, offsets = batch
    for q in range(offsets.size - 1):
        sl = slice(offsets[q], offsets[q + 1])
        prob = ranges_numpy.probabilistic_matrix(lo[sl], hi[sl])
        mid = ranges_numpy.midpoint_matrix(lo[sl], hi[sl])
        assert np.all(np.abs(prob) <= np.abs(mid) + 1e-12)
        assert np.all(prob * mid >= 0)  # never against the midpoint order


def test_widening_can_increase_an_advantage_in_larger_groups():
    # The guarantee is pairwise: with three responses |A_i| may grow when a rival
    # widens, because a cancelling term disappears.  Documented in docs/ranges.md.
    before = range_advantages([[1.0, 0.0, 2.0]], [[1.0, 0.0, 2.0]])  # A_1 = (1 - 1) / 3
    after = range_advantages([[1.0, 0.0, 0.5]], [[1.0, 0.0, 2.0]])  # φ13 = 0 now
    assert before[0, 0] == 0.0
    assert after[0, 0] == pytest.approx(1.0 / 3)


# --------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layouts_and_dtypes(dtype, backend):
    lo = np.array([[0.0, 0.5, 0.9], [0.1, 0.1, 0.3]], dtype=dtype)
    hi = np.array([[0.2, 0.7, 1.0], [0.2, 0.4, 0.3]], dtype=dtype)
    dense = range_advantages(lo, hi, backend=backend)
    assert dense.shape == (2, 3) and dense.dtype == dtype
    ragged = range_advantages(lo.ravel(), hi.ravel(), [0, 3, 6], backend=backend)
    np.testing.assert_array_equal(ragged, dense.ravel())
    ids = ["b", "a", "b", "a", "b", "a"]  # interleaved groups
    order = [0, 2, 4, 1, 3, 5]
    perm_lo = np.empty(6, dtype=dtype)
    perm_hi = np.empty(6, dtype=dtype)
    perm_lo[order] = lo.ravel()
    perm_hi[order] = hi.ravel()
    by_ids = range_advantages(perm_lo, perm_hi, group_ids=ids, backend=backend)
    np.testing.assert_array_equal(by_ids[order], dense.ravel())
    mixed = range_advantages(lo, hi.astype(np.float64), backend=backend)
    assert mixed.dtype == np.float64


def test_groups_of_size_zero_one_two_and_large():
    sizes = np.array([0, 1, 2, 0, 50])
    offsets = offsets_from_sizes(sizes)
    rng = np.random.default_rng(0)
    lo = rng.random(53)
    hi = lo + 0.1
    out = range_advantages(lo, hi, offsets)
    assert out[0] == 0.0  # a lone response has nothing to be compared with
    np.testing.assert_allclose(out, range_advantages(lo, hi, offsets, backend="numpy"),
                               atol=1e-14)
    assert range_advantages(np.zeros(0), np.zeros(0), [0, 0]).shape == (0,)
    assert range_advantages(np.zeros((0, 4)), np.zeros((0, 4))).shape == (0, 4)


def test_inputs_are_not_mutated():
    lo = np.array([0.3, 0.1, 0.2])
    hi = np.array([0.4, 0.5, 0.2])
    range_advantages(lo, hi, [0, 3])
    np.testing.assert_array_equal(lo, [0.3, 0.1, 0.2])
    np.testing.assert_array_equal(hi, [0.4, 0.5, 0.2])


def test_registered_in_the_dispatcher():
    lo = np.array([[0.0, 0.5, 0.9]])
    hi = np.array([[0.2, 0.7, 1.0]])
    assert "range" in advcal.ESTIMATORS
    np.testing.assert_array_equal(advantages(None, method="range", lo=lo, hi=hi),
                                  range_advantages(lo, hi))
    np.testing.assert_array_equal(
        advantages(None, [0, 3], method="range", lo=lo.ravel(), hi=hi.ravel(),
                   relation="probabilistic"),
        range_advantages(lo.ravel(), hi.ravel(), [0, 3], relation="probabilistic"))
    with pytest.raises(ValueError, match="method='range' takes reward ranges as `lo` and"):
        advantages(lo, method="range", lo=lo, hi=hi)
    with pytest.raises(TypeError, match="method='range' needs both `lo` and `hi`."):
        advantages(None, method="range", lo=lo)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("lo", "hi", "kwargs", "error", "match"),
    [
        ([[0.5, 0.2]], [[0.4, 0.3]], {}, ValueError,
         r"`lo` must not exceed `hi`; got lo\[0, 0\] = 0\.5 > hi\[0, 0\] = 0\.4\."),
        ([0.1, 0.5], [0.2, 0.4], {"offsets": [0, 2]}, ValueError,
         r"`lo` must not exceed `hi`; got lo\[1\] = 0\.5 > hi\[1\] = 0\.4\."),
        ([0.5, 0.1], [0.4, 0.2], {"group_ids": ["x", "y"]}, ValueError,
         r"`lo` must not exceed `hi`; got lo\[0\] = 0\.5 > hi\[0\] = 0\.4\."),
        ([[0.1, np.nan]], [[0.2, 0.4]], {}, ValueError, "`lo` must be finite."),
        ([[0.1, 0.2]], [[0.2, np.inf]], {}, ValueError, "`hi` must be finite."),
        ([[0.1, 0.2]], [[0.2, 0.3, 0.4]], {}, ValueError,
         r"`hi` must have shape \(1, 2\); got \(1, 3\)\."),
        ([[0.1, 0.2]], [[0.2, 0.3]], {"relation": "overlap"}, ValueError,
         "`relation` must be one of 'dominance', 'midpoint', 'probabilistic'; got 'overlap'."),
        ([[0.1, 0.2]], [[0.2, 0.3]], {"backend": "torch"}, ValueError,
         "`backend` must be one of"),
        ([0.1, 0.2], [0.2, 0.3], {}, ValueError,
         "1-D `lo` need exactly one of `offsets` or `group_ids`."),
        ([0.1, 0.2], [0.2, 0.3], {"offsets": [0, 3]}, ValueError, r"`offsets\[-1\]` must"),
        (None, [0.2], {}, TypeError, "`lo` must be an array of range bounds; got None."),
        ([["a"]], [[0.2]], {}, TypeError, "`lo` must be an array of real numbers"),
        ([[-1e308, 0.0]], [[1e308, 0.0]], {}, ValueError,
         "`lo` and `hi` are too large: the advantages overflow float64"),
        ([[-1e308, 1e308]], [[-1e308, 1e308]], {}, ValueError,
         "`lo` and `hi` are too large: the advantages overflow float64"),
    ],
)
def test_bad_input(lo, hi, kwargs, error, match, backend):
    with pytest.raises(error, match=match):
        range_advantages(lo, hi, **{"backend": backend, **kwargs})


def test_float32_overflow_is_an_error(backend):
    # Fine in float64, but A_3 = 3.3e38 - (-1.1e38) = 4.4e38 exceeds float32's range.
    points = np.array([[-3.3e38, -3.3e38, 3.3e38]], dtype=np.float32)
    with pytest.raises(ValueError, match="the advantages overflow float32"):
        range_advantages(points, points, backend=backend)


@given(lo=garbage_arrays(), hi=garbage_arrays(), offsets=garbage_arrays(),
       relation=st.sampled_from(RELATIONS))
def test_garbage_input(lo, hi, offsets, relation):
    out = own_error_or_result(range_advantages, lo, hi, offsets, relation=relation)
    if out is not None:
        assert out.dtype in (np.float32, np.float64)
        assert np.isfinite(out).all()


@given(lo=garbage_arrays(), hi=garbage_arrays(), group_ids=garbage_arrays(),
       backend=st.sampled_from(["numba", "numpy"]))
def test_garbage_input_with_group_ids(lo, hi, group_ids, backend):
    out = own_error_or_result(range_advantages, lo, hi, group_ids=group_ids, backend=backend)
    if out is not None:
        assert np.isfinite(out).all()
