"""GGSR (advcal.recover): anchor, recovery ratio, kernel == reference."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from advcal import (
    SetCalibration,
    calibrate_sets,
    coefficient_sets,
    grpo,
    offsets_from_sizes,
    recover,
)
from advcal.simulate import gram_matrices, paired_scorings
from tests.checks import own_error_or_result

seeds = st.integers(0, 2**32 - 1)


@cache
def calibration(n: int, scale: float = 0.03, shape: str = "joint") -> SetCalibration:
    pair = paired_scorings(1000, n, scale=scale, seed=n)
    return calibrate_sets(pair.a, pair.b, alpha=0.1, shape=shape)


def problem(seed: int, n: int, n_groups: int = 30, rank: int | None = None,
            shape: str = "joint"):
    sets = coefficient_sets(paired_scorings(n_groups, n, scale=0.03, seed=seed).a,
                            calibration=calibration(n, shape=shape))
    gram = gram_matrices(n_groups, n, rank=rank, seed=seed + 1).gram
    return sets, gram


def roots(sets) -> np.ndarray:
    w, v = np.linalg.eigh(sets.shapes)
    return (v * np.sqrt(np.clip(w, 0, None))[:, None, :]) @ v.transpose(0, 2, 1)


def projections(a: np.ndarray, c: np.ndarray, shape: np.ndarray, k: np.ndarray, rho: float
                ) -> tuple[float, float]:
    """M_full and M_reward straight from their definitions (projections along the recovery path)."""
    ka = k @ a
    full = (ka @ c - rho * np.sqrt(max(ka @ shape @ ka, 0))) / (
        np.sqrt(a @ ka) * np.sqrt(c @ k @ c))
    reward = (a @ c - rho * np.sqrt(max(a @ shape @ a, 0))) / (
        np.linalg.norm(a) * np.linalg.norm(c))
    return float(full), float(reward)


# --------------------------------------------------------------------------- hand example


def test_hand_example_with_identity_gram_and_ball() -> None:
    # K = I and S = C: a0 = c(1 − ρ/‖c‖), every a(η) is a multiple of c, and
    # M_full(η) = M_reward(η) = 1 − ρ/‖c‖ for every η.
    sets = coefficient_sets([[0.0, 1.0, 3.0, 2.0]], calibration=calibration(4, shape="isotropic"))
    c = sets.centers[0]
    rho = 0.4 * np.linalg.norm(c)
    sets = dataclasses.replace(sets, rho=rho)
    gram = np.eye(4)[None]
    rec = recover(sets, gram, tau=0.5)
    np.testing.assert_allclose(rec.anchors[0], 0.6 * c, atol=1e-12)
    assert rec.accepted[0] and rec.eta[0] == 1.0
    np.testing.assert_allclose(rec.coefficients[0], c, atol=1e-12)
    assert rec.m_full[0] == pytest.approx(0.6, abs=1e-12)
    assert rec.m_reward[0] == pytest.approx(0.6, abs=1e-12)
    rejected = recover(sets, gram, tau=0.7)
    assert not rejected.accepted[0] and rejected.eta[0] == 0.0
    np.testing.assert_array_equal(rejected.coefficients[0], 0.0)
    # ρ ≥ ‖c‖: 0 is in the set, the anchor's update vanishes, the group is rejected.
    empty = recover(dataclasses.replace(sets, rho=1.01 * np.linalg.norm(c)), gram, tau=0.0)
    assert not empty.accepted[0]


# --------------------------------------------------------------------------- kernel == reference


@pytest.mark.parametrize("rank", [None, 3])
@given(seed=seeds, n=st.sampled_from([2, 3, 5, 8]), tau=st.sampled_from([0.0, 0.2, 0.45]))
def test_kernel_matches_reference(rank: int | None, seed: int, n: int, tau: float) -> None:
    sets, gram = problem(seed, n, n_groups=12, rank=rank)
    fast = recover(sets, gram, tau=tau)
    ref = recover(sets, gram, tau=tau, backend="numpy")
    np.testing.assert_array_equal(fast.accepted, ref.accepted)
    np.testing.assert_allclose(fast.eta, ref.eta, atol=1e-8)
    np.testing.assert_allclose(fast.coefficients, ref.coefficients, atol=1e-7)
    np.testing.assert_allclose(fast.m_full, ref.m_full, atol=1e-7)
    np.testing.assert_allclose(fast.m_reward, ref.m_reward, atol=1e-7)
    # Both take the minimum-norm z, also when U(a0) = 0 (the rejected interior case).
    np.testing.assert_allclose(fast.anchors, ref.anchors, atol=1e-7)


def test_kernel_matches_reference_ragged() -> None:
    rng = np.random.default_rng(0)
    sizes = np.array([5, 0, 1, 2, 5, 3, 5])
    cal = calibration(5)
    rewards = rng.uniform(size=sizes.sum())
    sets = coefficient_sets(rewards, offsets_from_sizes(sizes), calibration=cal)
    blocks = [gram_matrices(1, int(s), seed=i).gram[0].reshape(-1) if s else np.zeros(0)
              for i, s in enumerate(sizes)]
    gram = np.concatenate(blocks)
    fast = recover(sets, gram, tau=0.1)
    ref = recover(sets, gram, tau=0.1, backend="numpy")
    np.testing.assert_array_equal(fast.accepted, ref.accepted)
    np.testing.assert_allclose(fast.eta, ref.eta, atol=1e-8)
    np.testing.assert_allclose(fast.coefficients, ref.coefficients, atol=1e-7)
    assert not fast.accepted[1] and not fast.accepted[2]  # empty and singleton groups
    assert fast.coefficients.shape == rewards.shape


# --------------------------------------------------------------------------- anchor


@pytest.mark.parametrize("rank", [None, 2])
@given(seed=seeds, n=st.sampled_from([3, 6, 8]))
# rank 2: a secular equation too steep for μ's floats, whose bracket closed with the
# anchor 3e-8 outside its set on numba's generic target
@example(seed=341795, n=3)
def test_anchor_is_direction_safe_and_minimal(rank: int | None, seed: int, n: int) -> None:
    sets, gram = problem(seed, n, n_groups=10, rank=rank)
    rec = recover(sets, gram, tau=0.0)
    rng = np.random.default_rng(seed)
    root = roots(sets)
    a0 = rec.anchors
    assert sets.contains(a0).all()
    for q in range(10):
        if np.isnan(rec.m_full[q]):
            continue  # U(a0) = 0 or U(c) = 0: nothing to check
        k = gram[q]
        u0 = a0[q] @ k @ a0[q]
        z = rng.standard_normal((200, n))
        z -= z.mean(axis=1, keepdims=True)
        radius = sets.rho * rng.uniform(0, 1, (200, 1)) ** (1 / n)
        radius[:50] = sets.rho  # boundary points too
        z *= radius / np.linalg.norm(z, axis=1, keepdims=True)
        members = sets.centers[q] + z @ root[q]
        tol = 1e-9 * (1 + abs(u0))
        assert (members @ k @ a0[q] >= u0 - tol).all()  # ⟨U(a0), U(a')⟩ ≥ ‖U(a0)‖²
        assert (np.einsum("mi,ij,mj->m", members, k, members) >= u0 - tol).all()


# --------------------------------------------------------------------------- eta*


@given(seed=seeds, n=st.sampled_from([3, 5, 8]), tau=st.sampled_from([0.0, 0.15, 0.3, 0.5]),
       rank=st.sampled_from([None, 2]))
def test_eta_star_is_the_supremum_of_the_feasible_set(seed: int, n: int, tau: float,
                                                      rank: int | None) -> None:
    sets, gram = problem(seed, n, n_groups=10, rank=rank)
    rec = recover(sets, gram, tau=tau)
    shapes = sets.shapes
    assert ((rec.eta >= 0) & (rec.eta <= 1)).all()
    for q in np.flatnonzero(rec.accepted):
        a0, c = rec.anchors[q], sets.centers[q]
        full, reward = projections(a0 + rec.eta[q] * (c - a0), c, shapes[q], gram[q], sets.rho)
        assert full >= tau - 1e-9 and reward > -1e-12
        assert full == pytest.approx(rec.m_full[q], abs=1e-9)
        assert reward == pytest.approx(rec.m_reward[q], abs=1e-9)
        if rec.eta[q] < 1 - 1e-6:
            full, reward = projections(a0 + (rec.eta[q] + 1e-6) * (c - a0), c, shapes[q],
                                       gram[q], sets.rho)
            assert full < tau or reward <= 0
    for q in np.flatnonzero(~rec.accepted & ~np.isnan(rec.m_full)):
        a0, c = rec.anchors[q], sets.centers[q]
        for eta in np.linspace(0, 1, 41):
            full, reward = projections(a0 + eta * (c - a0), c, shapes[q], gram[q], sets.rho)
            assert full < tau + 1e-9 or reward <= 1e-9
    np.testing.assert_array_equal(rec.coefficients[~rec.accepted], 0.0)


@given(seed=seeds, n=st.sampled_from([4, 8]))
def test_increasing_tau_never_increases_eta(seed: int, n: int) -> None:
    sets, gram = problem(seed, n, n_groups=15)
    previous = None
    for tau in np.linspace(0, 0.9, 10):
        rec = recover(sets, gram, tau=tau)
        if previous is not None:
            assert (rec.eta <= previous.eta + 1e-10).all()
            assert not (rec.accepted & ~previous.accepted).any()
        previous = rec


@pytest.mark.parametrize("scale,shift", [(2.0, 0.5), (0.5, -1.0), (10.0, 3.0), (1.0, 100.0)])
def test_positive_affine_rewards_keep_decisions(scale: float, shift: float) -> None:
    # The paper's sanity check (§6.5): no decision flips, η* moves by < 1e-3.
    pair = paired_scorings(1000, 8, scale=0.03, seed=40)
    train = paired_scorings(200, 8, scale=0.03, seed=41).a
    gram = gram_matrices(200, 8, seed=42).gram
    base = recover(coefficient_sets(train, calibration=calibrate_sets(pair.a, pair.b,
                                                                      alpha=0.1)),
                   gram, tau=0.2)
    cal = calibrate_sets(scale * pair.a + shift, scale * pair.b + shift, alpha=0.1)
    moved = recover(coefficient_sets(scale * train + shift, calibration=cal), gram, tau=0.2)
    np.testing.assert_array_equal(moved.accepted, base.accepted)
    assert np.abs(moved.eta - base.eta).max() < 1e-3
    assert 0.2 < base.accepted.mean() < 1.0  # both decisions occur


# --------------------------------------------------------------------------- layouts, dtypes


def test_float32_sets_give_float32_coefficients() -> None:
    cal = calibration(6)
    train = paired_scorings(8, 6, scale=0.03, seed=3).a
    sets32 = coefficient_sets(train.astype(np.float32), calibration=cal)
    sets64 = coefficient_sets(train.astype(np.float32).astype(np.float64), calibration=cal)
    gram = gram_matrices(8, 6, seed=4).gram
    rec32 = recover(sets32, gram.astype(np.float32), tau=0.1)
    rec64 = recover(sets64, gram.astype(np.float32), tau=0.1)
    assert rec32.coefficients.dtype == np.float32
    np.testing.assert_array_equal(rec32.accepted, rec64.accepted)
    np.testing.assert_allclose(rec32.coefficients, rec64.coefficients, atol=1e-6)


def test_infinite_radius_rejects_everything() -> None:
    pair = paired_scorings(5, 4, scale=0.03, seed=0)
    cal = calibrate_sets(pair.a, pair.b, alpha=0.05)  # k = 6 > m = 5
    assert cal.rho == np.inf
    sets = coefficient_sets(pair.a, calibration=cal)
    rec = recover(sets, gram_matrices(5, 4, seed=1).gram, tau=0.0)
    assert not rec.accepted.any()
    np.testing.assert_array_equal(rec.coefficients, 0.0)


# --------------------------------------------------------------------------- bad input


def test_gram_validation_messages() -> None:
    sets, gram = problem(0, 4, n_groups=3)
    with pytest.raises(ValueError, match=r"`gram` must have shape \(3, 4, 4\)"):
        recover(sets, gram[:2], tau=0.1)
    asym = gram.copy()
    asym[1, 0, 1] += 0.1
    with pytest.raises(ValueError, match="`gram` block of group 1 is not symmetric"):
        recover(sets, asym, tau=0.1)
    indefinite = gram.copy()
    indefinite[2] -= 2 * np.eye(4) * np.linalg.eigvalsh(gram[2]).max()
    with pytest.raises(ValueError, match="`gram` block of group 2 is not positive semidefinite"):
        recover(sets, indefinite, tau=0.1)
    with pytest.raises(ValueError, match="`gram` block of group 2 is not positive semidefinite"):
        recover(sets, indefinite, tau=0.1, backend="numpy")
    bad = gram.copy()
    bad[0, 1, 1] = np.nan
    with pytest.raises(ValueError, match="`gram` block of group 0 contains NaN or inf"):
        recover(sets, bad, tau=0.1)
    with pytest.raises(ValueError, match=r"`tau` must lie in \[0.0, 1.0\); got 1.0"):
        recover(sets, gram, tau=1.0)
    with pytest.raises(TypeError, match="`sets` must be CoefficientSets"):
        recover(gram, gram, tau=0.1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`gram` must be an array of real numbers"):
        recover(sets, np.full((3, 4, 4), "x"), tau=0.1)
    original = gram.copy()
    recover(sets, gram, tau=0.1)
    np.testing.assert_array_equal(gram, original)


def test_psd_within_tolerance_is_accepted() -> None:
    sets, gram = problem(1, 4, n_groups=2, rank=2)  # singular K
    tiny = gram.copy()
    tiny[0] -= 1e-12 * np.eye(4)  # rounding-level negative eigenvalues
    rec = recover(sets, tiny, tau=0.0)
    assert rec.eta.shape == (2,)


def test_reference_coefficients_are_grpo() -> None:
    sets, gram = problem(2, 5, n_groups=4)
    np.testing.assert_allclose(sets.centers, grpo(sets.batch.values.reshape(4, 5)))


@pytest.mark.parametrize("factor", [1e-300, 1e-8, 1e8, 1e300])
def test_gram_scale_does_not_matter(factor: float) -> None:
    # M_full and the reversal sign are invariant to K -> cK (c > 0); extreme scales must
    # neither overflow nor underflow (each block is normalized by its largest diagonal).
    sets, gram = problem(3, 6, n_groups=12)
    base = recover(sets, gram, tau=0.2)
    scaled = recover(sets, gram * factor, tau=0.2)
    np.testing.assert_array_equal(scaled.accepted, base.accepted)
    np.testing.assert_allclose(scaled.eta, base.eta, atol=1e-9)


def test_degenerate_batches() -> None:
    cal = calibration(4)
    empty = recover(coefficient_sets(np.zeros((0, 4)), calibration=cal), np.zeros((0, 4, 4)),
                    tau=0.1)
    assert empty.coefficients.shape == (0, 4) and empty.eta.shape == (0,)
    lone = recover(coefficient_sets(np.ones((3, 1)), calibration=cal), np.ones((3, 1, 1)),
                   tau=0.1)
    assert not lone.accepted.any()
    flat = recover(coefficient_sets(np.full((2, 4), 0.3), calibration=cal),
                   gram_matrices(2, 4, seed=0).gram, tau=0.0)
    assert not flat.accepted.any()  # zero-variance groups: GRPO's own update is 0
    np.testing.assert_array_equal(flat.coefficients, 0.0)


def ragged_kernel_args(seed: int, sizes: list[int], rank: int | None) -> tuple:
    """Arguments of the engine's ``recover_groups`` on groups of the given sizes (0..8).

    Every third group has constant rewards (a zero center, skipped early), and ``rank``
    makes the Gram blocks singular (rejected anchors inside the ball, the eigh branch).
    """
    from advcal._blocks import block_offsets
    from advcal._ggsr import gram_blocks as _gram_blocks

    rng = np.random.default_rng(seed)
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    offsets = offsets_from_sizes(sizes_arr)
    rewards = rng.uniform(size=int(offsets[-1]))
    for q in range(0, sizes_arr.size, 3):
        rewards[offsets[q]:offsets[q + 1]] = 0.5
    sets = coefficient_sets(rewards, offsets, calibration=calibration(8))
    blocks = [np.zeros(0)] * sizes_arr.size
    for n in np.unique(sizes_arr[sizes_arr > 0]):
        idx = np.flatnonzero(sizes_arr == n)
        grams = gram_matrices(idx.size, int(n), rank=rank if rank and rank < n else None,
                              seed=seed + int(n)).gram
        for q, k in zip(idx, grams, strict=True):
            blocks[q] = k.reshape(-1)
    gram = np.concatenate(blocks) if blocks else np.zeros(0)
    geo = sets.geometry
    return (geo.centers, sets.offsets, geo.root_blocks(), _gram_blocks(sets, gram),
            block_offsets(sets.batch.sizes), float(sets.rho), np.array([0.0, 0.2, 0.45]),
            rng.normal(size=geo.centers.size))


def assert_bitwise_equal(results: tuple, expected: tuple) -> None:
    for name, a, b in zip(["status", "anchors", "eta", "accepted", "m_full", "m_reward",
                           "ref0", "ref1"], results, expected, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name


def test_threaded_kernel_is_bitwise_identical_for_any_thread_count() -> None:
    import numba

    from advcal._kernels import recovery_numba

    sizes = np.random.default_rng(3).integers(0, 9, size=recovery_numba.PARALLEL_MIN_GROUPS)
    args = ragged_kernel_args(3, list(sizes), rank=3)
    assert {0, 1} <= set(sizes)  # chunk edges may fall on empty and singleton groups
    one_chunk = recovery_numba.recover_groups(*args, threaded=False)
    assert one_chunk[3].any() and not one_chunk[3].all()  # both branches are exercised
    previous = numba.get_num_threads()
    try:
        for threads in range(1, numba.config.NUMBA_NUM_THREADS + 1):
            numba.set_num_threads(threads)
            # by the number of groups (threads from PARALLEL_MIN_GROUPS), then forced
            assert_bitwise_equal(recovery_numba.recover_groups(*args), one_chunk)
            assert_bitwise_equal(recovery_numba.recover_groups(*args, threaded=True),
                                 one_chunk)
    finally:
        numba.set_num_threads(previous)


@given(seed=seeds, sizes=st.lists(st.integers(0, 8), max_size=12),
       rank=st.sampled_from([None, 2]))
def test_chunks_on_threads_equal_one_chunk_bitwise(seed: int, sizes: list[int],
                                                   rank: int | None) -> None:
    # Forced chunking on small batches: chunk edges fall on empty groups, singletons,
    # zero centers and rejected groups; scratch reused across groups must not leak.
    from unittest import mock

    from advcal._kernels import pool, recovery_numba

    args = ragged_kernel_args(seed % 2**16, sizes, rank)
    with mock.patch.object(pool, "n_threads", lambda: 3):  # 3 chunks on any machine
        chunked = recovery_numba.recover_groups(*args, threaded=True)
    assert_bitwise_equal(chunked, recovery_numba.recover_groups(*args, threaded=False))


def _solved_in_one_buffer(h0: np.ndarray, gap: int, order: str) -> bytes:
    """``_shifted_solve`` on h0 with its matrices h, low and vectors rhs, y, w cut from one
    buffer in ``order``, ``gap`` elements apart: the bytes of everything it computes."""
    from advcal._kernels import recovery_numba

    n = h0.shape[0]
    sizes = {"h": n * n, "low": n * n, "rhs": n, "y": n, "w": n}
    buffer = np.zeros(sum(sizes.values()) + 4 * gap)
    parts = {}
    start = 0
    for name in order.split():
        parts[name] = buffer[start:start + sizes[name]]
        start += sizes[name] + gap
    h, low = parts["h"].reshape(n, n), parts["low"].reshape(n, n)
    h[:] = h0
    parts["rhs"][:] = np.arange(1.0, n + 1.0)
    assert recovery_numba._shifted_solve(h, n, 1e-3, parts["rhs"], parts["y"], parts["w"],
                                         low)
    return buffer.tobytes()


@pytest.mark.parametrize("n", [5, 9, 16, 24, 40])
def test_shifted_solve_does_not_depend_on_where_its_arrays_lie(n: int) -> None:
    # LLVM may guard a loop that reads one array and writes another by a run-time overlap
    # check whose scalar and vector copies sum in different orders, so that results depend
    # on where the arrays lie (it happened in maxnorm_numba).  The kernel's scratch comes
    # from the allocator: here the arrays lie next to each other at gaps of up to a few
    # vector widths, and far apart.
    m = np.random.default_rng(n).standard_normal((n, n))
    h0 = m @ m.T
    for order in ("h low rhs y w", "w y rhs low h", "rhs h w low y"):
        far = np.frombuffer(_solved_in_one_buffer(h0, 1000, order), dtype=np.float64)
        for gap in (0, 1, 2, 3, 5, 8, 16, 31):
            near = np.frombuffer(_solved_in_one_buffer(h0, gap, order), dtype=np.float64)
            assert near[near != 0].tobytes() == far[far != 0].tobytes(), (order, gap)


garbage_arrays = st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=20).map(np.array),
    st.integers(0, 4).flatmap(lambda n: st.lists(
        st.floats(-1e3, 1e3), min_size=3 * n, max_size=3 * n).map(
            lambda v, n=n: np.array(v).reshape(3, n) if n else np.zeros((3, 0)))),
    st.sampled_from([np.array("x"), np.zeros((2, 2, 2)), np.array([[1, 2], [3, 4]]),
                     [[0.1, 0.2], [0.3]], None, 1.5]),
)


@given(rewards=garbage_arrays, other=garbage_arrays, gram=garbage_arrays,
       tau=st.floats(allow_nan=True, allow_infinity=True))
def test_garbage_input_raises_only_advcal_errors(rewards, other, gram, tau) -> None:
    cal = calibration(3)
    for call in (
        lambda: calibrate_sets(rewards, other, alpha=0.2),
        lambda: coefficient_sets(rewards, calibration=cal),
        lambda: recover(coefficient_sets(rewards, calibration=cal), gram, tau=tau),
        lambda: coefficient_sets(paired_scorings(3, 3, seed=0).a, calibration=cal).contains(
            rewards),
    ):
        out = own_error_or_result(call)
        if out is None:
            continue
        values = out.coefficients if hasattr(out, "coefficients") else out
        if isinstance(values, np.ndarray) and values.dtype.kind == "f":
            assert not np.isnan(values).any()


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_identical_scorings_give_full_recovery(backend: str) -> None:
    # A noiseless grader calibrates ρ = 0: E = {c}, a0 = c, M_full ≡ 1, so η* = 1 for τ < 1.
    pair = paired_scorings(100, 6, seed=0)
    cal = calibrate_sets(pair.a, pair.a, alpha=0.1)
    assert cal.rho == 0.0
    sets = coefficient_sets(pair.a[:5], calibration=cal)
    rec = recover(sets, gram_matrices(5, 6, seed=1).gram, tau=0.9, backend=backend)
    assert rec.accepted.all() and (rec.eta == 1.0).all()
    np.testing.assert_allclose(rec.coefficients, sets.centers, atol=1e-12)
    np.testing.assert_allclose(rec.m_full, 1.0, atol=1e-12)


def test_group_ids_layout_matches_dense() -> None:
    # Per-response labels in any order: coefficients come back in the caller's order, and
    # `gram` holds the groups' blocks in order of first appearance, rows in caller order.
    sets, gram = problem(7, 4, n_groups=5)
    dense = recover(sets, gram, tau=0.1)
    rng = np.random.default_rng(0)
    perm = rng.permutation(20)
    labels = np.repeat(np.array(list("abcde")), 4)[perm]
    rewards = sets.batch.values[perm]
    by_ids = coefficient_sets(rewards, group_ids=labels, calibration=sets.calibration)
    first = [labels.tolist().index(x) for x in dict.fromkeys(labels.tolist())]
    group_of = [ord(labels[i]) - ord("a") for i in first]
    blocks = []
    for g in group_of:
        members = np.flatnonzero(labels == "abcde"[g])  # caller order within the group
        within = perm[members] - 4 * g  # each member's row in the dense group
        blocks.append(gram[g][np.ix_(within, within)].reshape(-1))
    rec = recover(by_ids, np.concatenate(blocks), tau=0.1)
    np.testing.assert_allclose(rec.coefficients, dense.coefficients.reshape(-1)[perm],
                               atol=1e-12)
    np.testing.assert_array_equal(rec.accepted, dense.accepted[group_of])
