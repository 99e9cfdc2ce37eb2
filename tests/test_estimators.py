"""Point estimators: hand-derived values, exact zeros, policies, and properties."""

from __future__ import annotations

import math
import os
import signal
from unittest import mock

import numba
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import advcal
from advcal import (
    advantages,
    batch_std,
    dr_grpo,
    gpg,
    grpo,
    offsets_from_sizes,
    opo,
    passk,
    reinforce_pp_baseline,
    rloo,
)
from advcal._kernels import engine, point_numba, pool
from advcal._kernels.modes import DR, FIXED, GRPO, RLOO
from advcal.registry import REGISTRY
from tests.strategies import FLOAT_DTYPES, dense_batches, ragged_batches

# The registered estimators of advcal.estimators (maxnorm and range have their own tests).
POINT_ESTIMATORS = tuple(name for name, entry in REGISTRY.items()
                         if entry.function.__module__ == "advcal.estimators")
# Estimators whose advantages sum to zero within every group of two or more.
ZERO_SUM = tuple(name for name in POINT_ESTIMATORS if REGISTRY[name].centered)


def call(name, rewards, offsets=None, **kw):
    """Call an estimator by name; only OPO takes ``lengths`` (default: index + 1)."""
    lengths = kw.pop("lengths", None)
    if name == "opo":
        if lengths is None:
            lengths = np.arange(1, np.size(rewards) + 1, dtype=float).reshape(np.shape(rewards))
        kw["lengths"] = lengths
    return advantages(rewards, offsets, method=name, **kw)


def assert_close(actual, desired, dtype):
    """Engines may differ by rounding only: a few ulps of the output dtype."""
    tol = 1e-12 if dtype == np.float64 else 3e-7
    scale = max(1.0, float(np.max(np.abs(desired), initial=0.0)))
    np.testing.assert_allclose(actual, desired, rtol=tol, atol=tol * scale)


# ---------------------------------------------------------------- hand-derived values


def test_grpo_hand_example(backend):
    # u = +-0.5, std (ddof 1) = sqrt(4 * 0.25 / 3) = sqrt(1/3)
    out = grpo([[1.0, 0.0, 0.0, 1.0]], backend=backend)
    np.testing.assert_allclose(out, [[1, -1, -1, 1]] * np.array(0.5 / (np.sqrt(1 / 3) + 1e-6)))
    # ddof 0, eps 0: u = (-1, 0, 1), std = sqrt(2/3)
    out = grpo([[1.0, 2.0, 3.0]], eps=0.0, ddof=0, backend=backend)
    np.testing.assert_allclose(out, [[-np.sqrt(1.5), 0.0, np.sqrt(1.5)]], rtol=1e-15)


def test_dr_grpo_and_rloo_hand_example(backend):
    rewards = [1.0, 0.0, 0.0, 4.0, 2.0]
    offsets = [0, 3, 5]
    np.testing.assert_allclose(dr_grpo(rewards, offsets, backend=backend),
                               [2 / 3, -1 / 3, -1 / 3, 1.0, -1.0], rtol=1e-15)
    # r_i - mean of the others: 1 - 0, 0 - 0.5, 0 - 0.5, 4 - 2, 2 - 4
    np.testing.assert_allclose(rloo(rewards, offsets, backend=backend),
                               [1.0, -0.5, -0.5, 2.0, -2.0], rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rloo_batch_scale_leaves_lone_responses_out(backend, dtype):
    # Group [1, 0, 1]: RLOO advantages 3/2 * (r - 2/3) = (0.5, -1, 0.5); the lone [5]
    # has none (0/0 in TRL): left out of the whitening (mean 0, std sqrt(0.75)), given 0.
    rewards = np.array([1.0, 0.0, 1.0, 5.0], dtype=dtype)
    got = rloo(rewards, [0, 3, 4], scale="batch", eps=0.0, backend=backend)
    assert got.dtype == dtype
    tol = 4 * np.finfo(dtype).eps
    np.testing.assert_allclose(got, np.array([0.5, -1.0, 0.5, 0.0]) / math.sqrt(0.75),
                               rtol=tol)
    assert got[3] == 0.0
    # The same lone response by NaN omission; with singleton="raw" it keeps its reward 5
    # and is whitened with the others: (0.5, -1, 0.5, 5) has mean 1.25, std sqrt(6.75).
    omitted = np.array([1.0, 0.0, 1.0, 5.0, np.nan], dtype=dtype)
    np.testing.assert_allclose(
        rloo(omitted, [0, 3, 5], scale="batch", eps=0.0, nan_policy="omit",
             backend=backend), np.append(got, 0.0), rtol=tol)
    raw = rloo(rewards, [0, 3, 4], scale="batch", eps=0.0, singleton="raw", backend=backend)
    np.testing.assert_allclose(raw, (np.array([0.5, -1.0, 0.5, 5.0]) - 1.25) / math.sqrt(6.75),
                               rtol=tol)


def test_batch_std_hand_example(backend):
    # batch mean 1.5, deviations (-1.5, 0.5, -0.5, 1.5): ss = 5, std = sqrt(5/3)
    out = batch_std([[0.0, 2.0], [1.0, 3.0]], eps=0.0, backend=backend)
    np.testing.assert_allclose(out, np.array([[-1, 1], [-1, 1]]) / np.sqrt(5 / 3), rtol=1e-15)


def test_reinforce_pp_baseline_token_weighted_hand_example(backend):
    # u = (0.5, -0.5, -0.5, 0.5), weights (1, 3, 1, 1): W = 6, weighted mean -1/6,
    # deviations (2/3, -1/3, -1/3, 2/3), weighted ss = 4/3, var = 4/3 / 6 * 6/5 = 4/15.
    out = reinforce_pp_baseline([[1.0, 0.0], [0.0, 1.0]], token_counts=[[1, 3], [1, 1]],
                                eps=0.0, backend=backend)
    expected = np.array([[2 / 3, -1 / 3], [-1 / 3, 2 / 3]]) / np.sqrt(4 / 15)
    np.testing.assert_allclose(out, expected, rtol=1e-14)


def test_opo_hand_example(backend):
    # baseline (1*1 + 3*0) / 4 = 0.25
    np.testing.assert_allclose(opo([[1.0, 0.0]], lengths=[[1, 3]], backend=backend),
                               [[0.75, -0.25]], rtol=1e-15)


def test_gpg_hand_example(backend):
    # N = 4 responses, 1 nonzero: alpha = 4; u = (0.5, -0.5, 0, 0)
    np.testing.assert_allclose(gpg([[1.0, 0.0], [0.0, 0.0]], backend=backend),
                               [[2.0, -2.0], [0.0, 0.0]])
    np.testing.assert_allclose(gpg([[1.0, 0.0], [0.0, 0.0]], f_norm=2.0, backend=backend),
                               [[1.0, -1.0], [0.0, 0.0]])


def test_passk_hand_example(backend):
    # u = (-.25, .75, -.25, -.25): ss = 0.75, std = 0.5; best gets (1 - 0) / 0.5
    np.testing.assert_allclose(passk([[0.0, 1.0, 0.0, 0.0]], eps=0.0, backend=backend),
                               [[0.0, 2.0, 0.0, 0.0]])
    # a tie for the maximum: r_max - r_2nd = 0 for everyone
    np.testing.assert_array_equal(passk([[1.0, 1.0, 0.0]], backend=backend), [[0.0, 0.0, 0.0]])


# ---------------------------------------------------------------- exact zeros


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("value", [0.1, 0.7, 1 / 3, 1e6 + 0.1, -3.3, 1e-30])
@pytest.mark.parametrize("name", POINT_ESTIMATORS)
def test_zero_variance_groups_give_exact_zeros(backend, dtype, value, name):
    # Constant groups of every size from 2 to 40, beside a group with real spread: the
    # constant groups must be exactly 0, never a float residue divided by eps.
    sizes = np.arange(2, 41)
    constant = np.full(int(sizes.sum()), value, dtype=dtype)
    rewards = np.concatenate([constant, np.array([0.0, 1.0], dtype=dtype)])
    offsets = offsets_from_sizes(np.append(sizes, 2))
    for eps in (1e-6, 0.0):
        kw = {} if name in ("dr_grpo", "rloo", "opo", "gpg") else {"eps": eps}
        out = call(name, rewards, offsets, backend=backend, **kw)
        if name == "reinforce_pp_baseline":  # whitening shifts every response by the mean
            continue
        assert (out[: constant.size] == 0.0).all()
        assert not np.isnan(out).any()


@pytest.mark.parametrize("first", ["outlier", "typical"])
def test_std_is_accurate_when_the_first_reward_is_an_outlier(backend, first):
    # The kernels shift each group by its first reward.  A lone outlier in first place
    # puts the shift far in the tail: a one-pass sum of squares would lose log2(n) bits
    # (here 17, ~1e-11 relative), so the kernel must notice and sum around the mean.
    rng = np.random.default_rng(3)
    n = 100_000
    rewards = rng.random(n)
    if first == "outlier":
        rewards[0] = 1e3
    exact_mean = math.fsum(rewards) / n
    exact_std = math.sqrt(math.fsum((r - exact_mean) ** 2 for r in rewards) / (n - 1))
    out = grpo(rewards[None, :], eps=0.0, backend=backend)[0]
    std = (rewards[1] - rewards[2]) / (out[1] - out[2])
    assert abs(std - exact_std) <= 2e-14 * exact_std


@pytest.mark.parametrize("nan_policy", ["raise", "omit"])
def test_a_spread_of_a_few_ulps_is_as_exact_as_the_rewards(backend, nan_policy):
    # Rewards 100 + k·ulp(100): both engines centre exactly (the numba kernels' deviations
    # are subtractions LLVM may not reassociate into r - (shift + mean), which would be
    # off by up to half an ulp of the rewards, a visible part of this spread).
    ulp = np.spacing(100.0)
    k = np.array([0.0, 7.0, 0.0, 14.0, np.nan])
    rewards = (100.0 + k * ulp)[None, :] if nan_policy == "omit" else (100.0 + k[:4] * ulp)[None]
    dev = np.array([-5.25, 1.75, -5.25, 8.75])  # k - mean(k), in ulps
    std = math.sqrt(np.sum(dev ** 2) / 3)
    got = [dr_grpo(rewards, nan_policy=nan_policy, backend=backend)[0, :4] / ulp,
           grpo(rewards, eps=0.0, nan_policy=nan_policy, backend=backend)[0, :4] * std,
           advcal.maxnorm(rewards, tau_res=1e-300, nan_policy=nan_policy,
                          backend=backend)[0, :4] * 8.75]
    for centred in got:  # each in ulps of the rewards
        np.testing.assert_allclose(centred, dev, rtol=1e-13)


def test_float32_point_one_is_exactly_zero_like_the_issue_says(backend):
    rewards = np.full((3, 7), 0.1, dtype=np.float32)
    out = grpo(rewards, backend=backend)
    assert out.dtype == np.float32
    assert (out == 0.0).all()


# ---------------------------------------------------------------- policies and dtypes


def test_singleton_policies(backend):
    rewards = [2.0, 1.0, 0.0]
    offsets = [0, 1, 3]
    np.testing.assert_array_equal(grpo(rewards, offsets, backend=backend)[0], 0.0)
    raw = grpo(rewards, offsets, singleton="raw", eps=1e-6, backend=backend)
    assert raw[0] == 2.0 / (1.0 + 1e-6)  # verl: mean 0, std 1
    assert dr_grpo(rewards, offsets, singleton="raw", backend=backend)[0] == 2.0
    assert rloo(rewards, offsets, singleton="raw", backend=backend)[0] == 2.0
    with pytest.raises(ValueError, match=r"group 0 has a single response and "
                                         r"`singleton='error'`"):
        rloo(rewards, offsets, singleton="error", backend=backend)


def test_nan_policy_omit(backend):
    rewards = np.array([[1.0, np.nan, 0.0], [np.nan, np.nan, np.nan], [np.nan, 3.0, 1.0]])
    out = grpo(rewards, nan_policy="omit", backend=backend)
    first = 0.5 / (np.sqrt(0.5) + 1e-6)  # (1, 0): u = +-0.5, std = sqrt(0.5)
    last = 1.0 / (np.sqrt(2.0) + 1e-6)  # (3, 1): u = +-1, std = sqrt(2)
    np.testing.assert_allclose(out, [[first, 0.0, -first], [0, 0, 0], [0.0, last, -last]],
                               rtol=1e-15)
    with pytest.raises(ValueError, match="`rewards` contain NaN; pass nan_policy='omit'"):
        grpo(rewards, backend=backend)
    # an omitted response turns its group into a singleton under singleton="error"
    with pytest.raises(ValueError, match="group 0 has a single response"):
        grpo([[1.0, np.nan]], nan_policy="omit", singleton="error", backend=backend)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(np.float32, np.float32), (np.float64, np.float64), (np.float16, np.float32),
     (np.int64, np.float64), (np.int8, np.float64), (np.bool_, np.float64)],
)
def test_output_dtype(backend, dtype, expected):
    rewards = np.array([[1, 0, 1, 1]], dtype=dtype)
    for name in POINT_ESTIMATORS:
        assert call(name, rewards, backend=backend).dtype == expected


def test_inputs_are_not_mutated(backend):
    rewards = np.array([0.3, 0.1, 0.9, 0.4, np.nan])
    offsets = np.array([0, 2, 5])
    lengths = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    copies = rewards.copy(), offsets.copy(), lengths.copy()
    for name in POINT_ESTIMATORS:
        call(name, rewards, offsets, nan_policy="omit", backend=backend, lengths=lengths)
    for before, after in zip(copies, (rewards, offsets, lengths), strict=True):
        np.testing.assert_array_equal(before, after)


def test_dispatcher_rejects_unknown_method():
    with pytest.raises(ValueError, match=r"`method` must be one of 'grpo', 'dr_grpo'"):
        advantages([[1.0, 0.0]], method="ppo")


# ---------------------------------------------------------------- properties


def _lengths_for(batch_values):
    return np.linspace(1.0, 5.0, batch_values.size)


@given(batch=ragged_batches(), singleton=st.sampled_from(["zero", "raw"]),
       name=st.sampled_from(POINT_ESTIMATORS), with_nans=st.booleans(), data=st.data())
def test_numba_kernel_matches_numpy_reference(batch, singleton, name, with_nans, data):
    values = batch.values.copy()
    if with_nans and values.size:
        mask = np.array(data.draw(st.lists(st.booleans(), min_size=values.size,
                                           max_size=values.size)))
        values[mask] = np.nan
    kw = {"singleton": singleton, "nan_policy": "omit"}
    if name == "opo":
        kw["lengths"] = _lengths_for(values)
    fast = call(name, values, batch.offsets, backend="numba", **kw)
    slow = call(name, values, batch.offsets, backend="numpy", **kw)
    assert fast.dtype == slow.dtype == values.dtype
    assert_close(fast, slow, values.dtype)
    assert not np.isnan(fast).any()


@given(batch=ragged_batches(min_size=2), name=st.sampled_from(ZERO_SUM))
def test_centered_estimators_sum_to_zero_per_group(batch, name):
    out = call(name, batch.values, batch.offsets).astype(np.float64)
    for q in range(batch.offsets.size - 1):
        group = out[batch.offsets[q]:batch.offsets[q + 1]]
        scale = max(1.0, float(np.abs(group).max(initial=0.0)))
        tol = 1e-12 if batch.values.dtype == np.float64 else 1e-5
        assert abs(group.sum()) <= tol * scale * group.size


@given(batch=ragged_batches(min_size=2))
def test_opo_length_weighted_sum_is_zero(batch):
    lengths = _lengths_for(batch.values)
    out = opo(batch.values, batch.offsets, lengths=lengths).astype(np.float64)
    for q in range(batch.offsets.size - 1):
        sl = slice(batch.offsets[q], batch.offsets[q + 1])
        scale = max(1.0, float(np.abs(out[sl]).max(initial=0.0)))
        tol = 1e-12 if batch.values.dtype == np.float64 else 1e-5
        assert abs(np.sum(lengths[sl] * out[sl])) <= tol * scale * lengths[sl].sum()


# Dyadic rewards (multiples of 1/64 in [-8, 8]) and integer shifts add exactly, so the
# deviations from the group's shift are identical.  The kernels let LLVM reassociate
# (that is what vectorizes the sums), so outputs may still differ by a few ulps of the
# shifted rewards relative to the group spread (>= 1/64): 1e-10 bounds that with room.
dyadic_batches = ragged_batches(dtype=np.float64, bound=8.0).map(
    lambda b: type(b)(np.round(b.values * 64) / 64, b.offsets))


@given(batch=dyadic_batches, shift=st.integers(-100, 100),
       name=st.sampled_from(("grpo", "dr_grpo", "rloo", "batch_std", "opo", "passk",
                             "reinforce_pp_baseline")))
def test_translation_invariance_on_exactly_shifted_rewards(batch, shift, name):
    base = call(name, batch.values, batch.offsets, singleton="zero")
    moved = call(name, batch.values + shift, batch.offsets, singleton="zero")
    np.testing.assert_allclose(moved, base, rtol=0, atol=1e-10)


@given(batch=ragged_batches(dtype=np.float64), shift=st.floats(-1e3, 1e3))
def test_translation_invariance_general_floats(batch, shift):
    base = grpo(batch.values, batch.offsets, eps=0.0)
    moved = grpo(batch.values + shift, batch.offsets, eps=0.0)
    # Adding `shift` rounds every reward at ulp(|r| + |shift|); relative to each group's
    # spread that error is what the advantages may move by.
    for q in range(batch.offsets.size - 1):
        sl = slice(batch.offsets[q], batch.offsets[q + 1])
        spread = np.ptp(batch.values[sl]) if sl.stop > sl.start else 0.0
        assume(spread == 0.0 or spread > 1e-6 * (abs(shift) + np.abs(batch.values).max()))
    np.testing.assert_allclose(moved, base, atol=1e-6)


@given(batch=ragged_batches(dtype=np.float64), power=st.integers(-20, 20),
       eps=st.sampled_from([0.0, 1e-6, 1e-4]))
def test_grpo_positive_scale_invariance(batch, power, eps):
    # Scaling by a power of two is exact: grpo(c r; c eps) == grpo(r; eps) bit for bit,
    # as long as no squared deviation falls into the subnormal range (|u| < 1e-154).
    nonzero = np.abs(batch.values[batch.values != 0])
    assume(nonzero.size == 0 or nonzero.min() > 1e-100)
    c = 2.0**power
    np.testing.assert_array_equal(grpo(batch.values * c, batch.offsets, eps=eps * c),
                                  grpo(batch.values, batch.offsets, eps=eps))


@given(batch=ragged_batches(dtype=np.float64), c=st.floats(1e-3, 1e3))
def test_grpo_scale_invariance_up_to_eps(batch, c):
    eps = 1e-6
    a = grpo(batch.values, batch.offsets, eps=eps)
    b = grpo(batch.values * c, batch.offsets, eps=eps)
    # |u|/(s+eps) - |u|/(s+eps/c) is at most |u|/s * eps |1 - 1/c| / s.
    for q in range(batch.offsets.size - 1):
        sl = slice(batch.offsets[q], batch.offsets[q + 1])
        r = batch.values[sl]
        if r.size < 2:
            continue
        std = np.std(r, ddof=1)
        bound = 1e-9 if std == 0 else (
            np.abs(r - r.mean()).max() / std * eps * abs(1 - 1 / c) / std + 1e-9)
        assert np.abs(a[sl] - b[sl]).max() <= bound


@given(batch=ragged_batches(), name=st.sampled_from(POINT_ESTIMATORS), seed=st.integers(0, 99))
def test_group_ids_path_equals_offsets_path(batch, name, seed):
    rng = np.random.default_rng(seed)
    labels = np.repeat([f"uid-{q}" for q in range(batch.sizes.size)], batch.sizes)
    perm = rng.permutation(batch.values.size)
    lengths = _lengths_for(batch.values)
    by_offsets = call(name, batch.values, batch.offsets, lengths=lengths)
    by_ids = call(name, batch.values[perm], group_ids=labels[perm].tolist(),
                  lengths=lengths[perm])
    assert_close(by_ids, by_offsets[perm], batch.values.dtype)


@given(rewards=dense_batches(), name=st.sampled_from(POINT_ESTIMATORS))
def test_dense_equals_ragged(rewards, name):
    n_groups, width = rewards.shape
    dense = call(name, rewards)
    offsets = np.arange(n_groups + 1) * width
    lengths = np.arange(1, rewards.size + 1, dtype=float)
    ragged = call(name, rewards.reshape(-1), offsets, lengths=lengths)
    assert dense.shape == rewards.shape
    np.testing.assert_array_equal(dense.reshape(-1), ragged)


# ---------------------------------------------------------------- threads and caching


def test_threaded_kernel_is_bitwise_identical_for_any_thread_count():
    rng = np.random.default_rng(7)
    sizes = rng.integers(0, 40, size=30_000)
    offsets = offsets_from_sizes(sizes)
    x = rng.normal(size=int(offsets[-1]))
    assert x.size >= 2 * pool.MIN_VALUES_PER_THREAD  # chunks run on threads by size
    args = (x, offsets, GRPO, 1e-6, 1, False, False, 1.0, np.inf)
    previous = numba.get_num_threads()
    try:
        results = []
        for threads in range(1, numba.config.NUMBA_NUM_THREADS + 1):
            numba.set_num_threads(threads)
            results.append(point_numba.center_scale(*args)[0])
    finally:
        numba.set_num_threads(previous)
    serial = point_numba.center_scale(*args, threaded=False)[0]
    for result in results:
        assert result.tobytes() == serial.tobytes()


_CPU_OUTPUTS = """
import sys
import numpy as np
import advcal
rng = np.random.default_rng(1)
offsets = advcal.offsets_from_sizes(rng.integers(2, 300, 300))
x = rng.normal(size=int(offsets[-1])) * 10 + 3
u = rng.uniform(size=x.size)
out = {name: getattr(advcal, name)(x, offsets) for name in ("grpo", "rloo", "dr_grpo")}
out["grpo_f32"] = advcal.grpo(x.astype(np.float32), offsets)
out["maxnorm"] = advcal.maxnorm(x, offsets, tau_res=0.05)
out["maxnorm_binned"] = advcal.maxnorm(u, offsets, tau_res=0.05, resolution=0.01)
np.savez(sys.argv[1], **out)
"""


def _avx2_and_fma() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return {"avx2", "fma"} <= set(flags)


@pytest.mark.skipif(not _avx2_and_fma(), reason="needs an x86-64 CPU with AVX2 and FMA")
def test_an_avx2_build_equals_the_host_build_bitwise(tmp_path):
    # One code path for every CPU; the vector width LLVM picks for the host (AVX-512 on
    # some machines) must not change the order of the sums against an AVX2 build.
    import subprocess
    import sys

    script = tmp_path / "outputs.py"
    script.write_text(_CPU_OUTPUTS)
    results = {}
    for cpu in ("host", "haswell"):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / cpu))
        env.pop("NUMBA_CPU_FEATURES", None)
        env.pop("NUMBA_CPU_NAME", None)  # the host is the default (older llvmlite takes no "host")
        if cpu != "host":
            env["NUMBA_CPU_NAME"] = cpu
        path = tmp_path / f"{cpu}.npz"
        subprocess.run([sys.executable, str(script), str(path)], env=env, check=True,
                       cwd=os.path.dirname(os.path.dirname(advcal.__file__)), timeout=600)
        results[cpu] = np.load(path)
    for name in results["host"].files:
        assert results["host"][name].tobytes() == results["haswell"][name].tobytes(), name


@given(batch=ragged_batches(min_size=0), mode=st.sampled_from([DR, GRPO, RLOO, FIXED]),
       omit=st.booleans(), raw=st.booleans())
def test_chunks_on_threads_equal_one_chunk_bitwise(batch, mode, omit, raw):
    # Forced chunking on small batches: chunk edges fall on empty groups, singletons and
    # groups of 32+ (where a second compiled copy of a kernel would round differently).
    x, offsets = batch.values.copy(), batch.offsets
    if omit:
        x[::3] = np.nan  # omitted responses in every chunk
    with mock.patch.object(pool, "n_threads", lambda: 3):  # 3 chunks on any machine
        runs = {
            "center_scale": lambda t: point_numba.center_scale(
                x, offsets, mode, 1e-6, 1, raw, omit, 2.0, np.inf, threaded=t)[0],
            "opo": lambda t: point_numba.opo(x, np.ones(x.size), offsets, raw, omit, np.inf,
                                             threaded=t)[0],
            "passk": lambda t: point_numba.passk(x, offsets, 1e-6, 1, raw, omit, np.inf,
                                                 threaded=t)[0],
            "group_statistics": lambda t: np.concatenate(
                [np.asarray(a, dtype=float) for a in point_numba.group_statistics(
                    x, offsets, 1, omit, threaded=t)]),
        }
        for name, run in runs.items():
            assert run(True).tobytes() == run(False).tobytes(), name


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_lone_non_finite_reward_is_flagged_without_raw_singletons(backend, value):
    # The lone response gets no advantage, but its reward is still invalid.
    point = engine("point", backend)
    x, offsets = np.array([value, 0.0, 1.0]), np.array([0, 1, 3])
    assert not point.center_scale(x, offsets, GRPO, 1e-6, 1, False, False, 1.0, np.inf)[1]
    assert not point.opo(x, np.ones(3), offsets, False, False, np.inf)[1]
    assert not point.passk(x, offsets, 1e-6, 1, False, False, np.inf)[1]
    x[0] = 0.5
    assert point.center_scale(x, offsets, GRPO, 1e-6, 1, False, False, 1.0, np.inf)[1]


@pytest.mark.parametrize("where", [0, 45, 99])
def test_a_bad_group_in_any_chunk_is_flagged(where):
    x = np.linspace(0.0, 1.0, 100)
    x[where] = np.nan
    offsets = offsets_from_sizes([10] * 10)
    with mock.patch.object(pool, "n_threads", lambda: 3):
        for threaded in (True, False):
            assert not point_numba.center_scale(x, offsets, GRPO, 1e-6, 1, False, False, 1.0,
                                                np.inf, threaded=threaded)[1]
            assert not point_numba.opo(x, np.ones(100), offsets, False, False, np.inf,
                                       threaded=threaded)[1]
            assert not point_numba.passk(x, offsets, 1e-6, 1, False, False, np.inf,
                                         threaded=threaded)[1]


def test_concurrent_calls_from_user_threads_give_the_serial_result():
    # Kernels release the GIL and the pool is shared: calls from several user threads at
    # once (numba's workqueue layer would abort on concurrent prange kernels).
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(5)
    batches = [rng.random(1 << 20) for _ in range(4)]
    offsets = np.arange(0, (1 << 20) + 1, 16)
    expected = [point_numba.center_scale(x, offsets, GRPO, 1e-6, 1, False, False, 1.0,
                                         np.inf, threaded=False)[0] for x in batches]
    with ThreadPoolExecutor(4) as users:
        results = list(users.map(lambda x: grpo(x, offsets), batches))
    for result, serial in zip(results, expected, strict=True):
        assert result.tobytes() == serial.tobytes()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_threads_work_in_a_forked_child():
    # A forked child inherits the pool object but none of its threads: a pool that were
    # not rebuilt would leave the child's second chunk waiting forever.
    x = np.random.default_rng(0).random(1 << 20)
    offsets = np.arange(0, x.size + 1, 16)
    expected = grpo(x, offsets)  # the parent's pool exists and has run
    pid = os.fork()
    if pid == 0:  # child: exit 0 on a correct result, 1 otherwise, killed if it hangs
        signal.alarm(30)
        ok = False
        try:
            ok = grpo(x, offsets).tobytes() == expected.tobytes()
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_chunks_cut_between_whole_groups_with_equal_rewards():
    offsets = offsets_from_sizes([10, 0, 0, 30, 5, 5, 0, 50])
    assert pool.chunk_bounds(offsets, 2).tolist() == [0, 6, 8]  # 50 rewards and 50
    assert pool.chunk_bounds(offsets, 1).tolist() == [0, 8]
    # no boundary at the half: the nearest one (40 | 60), not the next one (100 | 0)
    assert pool.chunk_bounds(offsets_from_sizes([10, 30, 60]), 2).tolist() == [0, 2, 3]
    assert pool.chunk_bounds(offsets_from_sizes([25] * 4), 4).tolist() == [0, 1, 2, 3, 4]
    # more chunks than groups: a group is never split
    assert pool.chunk_bounds(offsets_from_sizes([7]), 4).tolist() == [0, 1]
    assert pool.chunk_bounds(np.zeros(1, dtype=np.int64), 4).tolist() == [0]


def test_kernels_are_cached_on_disk():
    from numba.core.caching import FunctionCache

    for name in ("_statistics_kernel", "_center_scale_kernel", "_opo_kernel", "_passk_kernel"):
        assert isinstance(getattr(point_numba, name)._cache, FunctionCache)


def test_import_does_not_load_numba():
    import subprocess
    import sys

    code = "import sys, advcal; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
    assert advcal.__version__
