"""SetGRPO ablation switches of recover / select_threshold / setgrpo, and the analysis
helpers (recovery_path, affine_check, training_summary)."""

from __future__ import annotations

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
    recover,
    select_threshold,
    setgrpo,
)
from advcal.analysis import affine_check, recovery_path, training_summary
from advcal.simulate import grade, gram_matrices, paired_scorings

TAUS = (0.0, 0.1, 0.3)


@cache
def calibration() -> SetCalibration:
    pair = paired_scorings(1000, 8, scale=0.05, seed=0)
    return calibrate_sets(pair.a, pair.b, alpha=0.2)


@cache
def batch(n_groups: int = 400, ragged: bool = False):
    """Training-like groups (rank-4 Gram matrices: the reward condition binds at τ = 0)."""
    pair = paired_scorings(n_groups, 8, scale=0.05, n_scorings=1, seed=11)
    gram = gram_matrices(n_groups, 8, rank=4, seed=12).gram
    reference = grpo(grade(pair.true, scale=0.3, seed=13).scores)
    if not ragged:
        return coefficient_sets(pair.a, calibration=calibration()), gram, reference
    # Drop the last two responses of every third group: a ragged batch.
    sizes = np.where(np.arange(n_groups) % 3 == 0, 6, 8)
    keep = np.arange(8)[None, :] < sizes[:, None]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    blocks = np.concatenate([gram[q, :n, :n].ravel() for q, n in enumerate(sizes)])
    sets = coefficient_sets(pair.a[keep], offsets, calibration=calibration())
    return sets, blocks, reference[keep]


@given(seed=st.integers(0, 10_000), rank=st.integers(1, 10), tau=st.floats(0.0, 0.6),
       backend=st.sampled_from(["numba", "numpy"]))
@example(seed=6520, rank=1, tau=0.0, backend="numpy")  # see the next test
def test_switch_properties(seed: int, rank: int, tau: float, backend: str) -> None:
    """On random batches and Gram ranks: dropping the reward condition accepts a superset
    with η* at least as large; dropping recovery gives η* ∈ {0, 1} on a subset, 1 exactly
    where the full method recovers all of c; the random discard keeps the gate's count."""
    pair = paired_scorings(12, 6, scale=0.05, n_scorings=1, seed=seed)
    sets = coefficient_sets(pair.a, calibration=calibration())
    gram = gram_matrices(12, 6, rank=rank, seed=seed + 1).gram
    full = recover(sets, gram, tau=tau, backend=backend)
    loose = recover(sets, gram, tau=tau, reward_condition=False, backend=backend)
    binary = recover(sets, gram, tau=tau, recovery=False, backend=backend)
    rand = recover(sets, gram, tau=tau, discard="matched-random", seed=seed,
                   backend=backend)
    assert not (full.accepted & ~loose.accepted).any()
    assert (loose.eta >= full.eta - 1e-9).all()
    assert set(np.unique(binary.eta)) <= {0.0, 1.0}
    assert not (binary.accepted & ~full.accepted).any()
    np.testing.assert_array_equal(binary.eta == 1.0, full.eta == 1.0)
    assert rand.accepted.sum() == full.accepted.sum()


def test_an_anchor_in_the_null_space_of_k_has_no_safe_direction_on_both_engines() -> None:
    # Found by hypothesis: K of rank 1, and group 0's anchor a0 in its null space up to
    # rounding (a0ᵀKa0 came out 1.4e-16 and -6.5e-17 by two summation orders, against
    # rounding noise of ~1e-15); the numpy engine divided by zero.
    pair = paired_scorings(12, 6, scale=0.05, n_scorings=1, seed=6520)
    sets = coefficient_sets(pair.a, calibration=calibration())
    gram = gram_matrices(12, 6, rank=1, seed=6521).gram
    a0 = recover(sets, gram, tau=0.0).anchors[0]
    k = gram[0]
    assert abs(a0 @ k @ a0) <= 1e-14 * np.diag(k).max() * (a0 @ a0)
    for backend in ("numba", "numpy"):
        out = recover(sets, gram, tau=0.0, backend=backend)
        assert not out.accepted[0] and out.eta[0] == 0.0 and np.isnan(out.m_full[0])


@pytest.mark.parametrize("tau", TAUS)
def test_no_reward_condition_is_a_superset(tau: float) -> None:
    sets, gram, _ = batch()
    full = recover(sets, gram, tau=tau)
    loose = recover(sets, gram, tau=tau, reward_condition=False)
    assert not (full.accepted & ~loose.accepted).any()
    assert (loose.eta >= full.eta - 1e-12).all()
    # Every accepted group still meets the full-space condition at its η*.
    assert (loose.m_full[loose.accepted] >= tau - 1e-9).all()
    if tau == 0.0:  # here the reward condition binds: the ablation accepts more
        assert loose.accepted.sum() > full.accepted.sum()
        extra = loose.accepted & ~full.accepted
        assert (loose.m_reward[extra] <= 1e-12).all()


@pytest.mark.parametrize("tau", TAUS)
def test_no_recovery_is_binary(tau: float) -> None:
    sets, gram, _ = batch()
    full = recover(sets, gram, tau=tau)
    binary = recover(sets, gram, tau=tau, recovery=False)
    assert set(np.unique(binary.eta)) <= {0.0, 1.0}
    assert not (binary.accepted & ~full.accepted).any()  # {0, 1} ⊆ [0, 1]
    # η* = 1 exactly where the full method recovers all of c.
    np.testing.assert_array_equal(binary.eta == 1.0, full.accepted & (full.eta == 1.0))
    # An accepted group at η = 0 writes back its anchor.
    at_zero = binary.accepted & (binary.eta == 0.0)
    assert at_zero.any()
    np.testing.assert_allclose(binary.coefficients[at_zero], binary.anchors[at_zero])
    assert (binary.coefficients[~binary.accepted] == 0).all()


@pytest.mark.parametrize("tau", TAUS)
def test_matched_random_discard_keeps_the_count(tau: float) -> None:
    sets, gram, _ = batch()
    full = recover(sets, gram, tau=tau)
    rand = recover(sets, gram, tau=tau, discard="matched-random", seed=5)
    assert rand.accepted.sum() == full.accepted.sum()
    assert set(np.unique(rand.eta)) <= {0.0, 1.0}
    np.testing.assert_array_equal(rand.eta == 1.0, rand.accepted)
    np.testing.assert_array_equal(rand.coefficients[rand.accepted],
                                  sets.centers[rand.accepted])
    assert (rand.coefficients[~rand.accepted] == 0).all()
    again = recover(sets, gram, tau=tau, discard="matched-random", seed=5)
    np.testing.assert_array_equal(again.accepted, rand.accepted)
    other = recover(sets, gram, tau=tau, discard="matched-random", seed=6)
    assert (other.accepted != rand.accepted).any()


def test_matched_random_draws_uniformly() -> None:
    """Each group is kept with probability count/pool: a binomial check over seeds."""
    sets, gram, _ = batch(60)
    full = recover(sets, gram, tau=0.3)
    count, pool = int(full.accepted.sum()), 60
    reps = 400
    hits = sum(int(recover(sets, gram, tau=0.3, discard="matched-random",
                           seed=s).accepted[0]) for s in range(reps))
    p = count / pool
    sd = np.sqrt(reps * p * (1 - p))
    assert abs(hits - reps * p) <= 4 * sd, (hits, reps * p)


def test_selection_with_ablations() -> None:
    sets, gram, reference = batch()
    grid = [0.4, 0.2, 0.0]
    kw = dict(thresholds=grid, beta=0.3, delta=0.1)
    full = select_threshold(sets, gram, reference, **kw)
    loose = select_threshold(sets, gram, reference, reward_condition=False, **kw)
    binary = select_threshold(sets, gram, reference, recovery=False, **kw)
    rand = select_threshold(sets, gram, reference, discard="matched-random", seed=1, **kw)
    assert (loose.n_acc >= full.n_acc).all() and (binary.n_acc <= full.n_acc).all()
    np.testing.assert_array_equal(rand.n_acc, full.n_acc)
    np.testing.assert_array_equal(rand.recovery, full.n_acc)  # η = 1 for each kept group
    # The table agrees with recover() under the same switches, threshold by threshold.
    for j, tau in enumerate(rand.tau):
        for table, options in ((loose, {"reward_condition": False}),
                               (binary, {"recovery": False})):
            rec = recover(sets, gram, tau=float(tau), **options)
            dots = np.einsum("bi,bij,bj->b", rec.coefficients, gram, reference)
            assert table.n_acc[j] == rec.accepted.sum()
            assert table.k_rev[j] == (rec.accepted & (dots < 0)).sum()
    # Random discard: the kept groups are nested as τ loosens (one random order), and
    # its reversals are those of c itself.
    c = sets.centers
    dots_c = np.einsum("bi,bij,bj->b", c, gram, reference)
    assert (np.diff(rand.k_rev) >= 0).all()
    assert rand.k_rev[-1] <= (dots_c < 0).sum()


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("options", [{"reward_condition": False}, {"recovery": False},
                                     {"discard": "matched-random", "seed": 3}])
def test_engines_agree(options: dict, ragged: bool) -> None:
    sets, gram, reference = batch(120, ragged)
    a = recover(sets, gram, tau=0.05, backend="numba", **options)
    b = recover(sets, gram, tau=0.05, backend="numpy", **options)
    np.testing.assert_array_equal(a.accepted, b.accepted)
    np.testing.assert_allclose(a.eta, b.eta, atol=1e-8)
    np.testing.assert_allclose(a.coefficients, b.coefficients, atol=1e-7)
    kw = dict(thresholds=[0.3, 0.0], beta=0.3, delta=0.1, **options)
    sa = select_threshold(sets, gram, reference, backend="numba", **kw)
    sb = select_threshold(sets, gram, reference, backend="numpy", **kw)
    np.testing.assert_array_equal(sa.n_acc, sb.n_acc)
    np.testing.assert_array_equal(sa.k_rev, sb.k_rev)


def test_setgrpo_forwards_the_switches() -> None:
    pair = paired_scorings(80, 8, scale=0.05, seed=21)
    gram = gram_matrices(80, 8, rank=4, seed=22).gram
    sets = coefficient_sets(pair.a, calibration=calibration())
    for options in ({"reward_condition": False}, {"recovery": False},
                    {"discard": "matched-random", "seed": 0}):
        out = setgrpo(pair.a, gram=gram, calibration=calibration(), tau=0.0, **options)
        ref = recover(sets, gram, tau=0.0, **options)
        np.testing.assert_array_equal(out.accepted, ref.accepted)
        np.testing.assert_array_equal(out.coefficients, ref.coefficients)
    none = setgrpo(pair.a, gram=gram, calibration=calibration(), tau=None, recovery=False)
    assert not none.accepted.any()


@pytest.mark.parametrize("bad, error, match", [
    ({"reward_condition": 1}, TypeError, "reward_condition"),
    ({"recovery": "no"}, TypeError, "recovery"),
    ({"discard": "random"}, ValueError, "discard"),
    ({"discard": "matched-random"}, ValueError, "seed"),
    ({"seed": 1}, ValueError, "seed"),
    ({"discard": "matched-random", "seed": "x"}, TypeError, "seed"),
])
def test_bad_switches(bad: dict, error: type, match: str) -> None:
    sets, gram, reference = batch(20)
    with pytest.raises(error, match=match):
        recover(sets, gram, tau=0.1, **bad)
    with pytest.raises(error, match=match):
        select_threshold(sets, gram, reference, thresholds=[0.1], beta=0.2, delta=0.1, **bad)


# --------------------------------------------------------------------------- analysis


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_recovery_path_matches_recover(backend: str) -> None:
    sets, gram, _ = batch(150)
    rec = recover(sets, gram, tau=0.1, backend=backend)
    acc = np.flatnonzero(rec.accepted)
    # On a grid through each accepted group's η*, the path gives the kernel's projections.
    for q in acc[:20]:
        path = recovery_path(sets, gram, eta=[0.0, rec.eta[q], 1.0], backend=backend)
        assert path.m_full[q, 1] == pytest.approx(rec.m_full[q], abs=1e-7)
        assert path.m_reward[q, 1] == pytest.approx(rec.m_reward[q], abs=1e-7)
    np.testing.assert_allclose(path.anchors, rec.anchors, atol=1e-9)
    path = recovery_path(sets, gram, eta=np.linspace(0, 1, 41), backend=backend)
    # Feasible points on the grid never lie beyond η*; infeasible groups have none.
    feasible = (path.m_full >= 0.1) & (path.m_reward > 0)
    for q in range(sets.n_groups):
        if rec.accepted[q]:
            assert (path.eta[feasible[q]] <= rec.eta[q] + 1e-9).all()
        else:
            assert not feasible[q].any()
    # At η = 1 the path is c itself: M_full(1) = [cᵀKc − ρ‖RKc‖] / cᵀKc ≤ 1.
    assert np.nanmax(path.m_full[:, -1]) <= 1.0


def test_recovery_path_by_hand() -> None:
    """K = I and S = I (isotropic shape, unit scale): M_full = M_reward, and at η = 1
    with c ⟂ 1: (‖c‖² − ρ‖c‖) / ‖c‖² = 1 − ρ/‖c‖."""
    pair = paired_scorings(300, 4, scale=0.05, seed=31)
    cal = calibrate_sets(pair.a, pair.b, alpha=0.2, shape="isotropic")
    rewards = np.array([[0.0, 1.0, 0.0, 1.0], [0.2, 0.4, 0.1, 0.9]])
    sets = coefficient_sets(rewards, calibration=cal)
    gram = np.broadcast_to(np.eye(4), (2, 4, 4)).copy()
    path = recovery_path(sets, gram, eta=[1.0])
    np.testing.assert_allclose(path.m_full, path.m_reward, atol=1e-12)
    c = grpo(rewards)
    shapes = sets.shapes
    # The isotropic shape is t·(I − 11ᵀ/n): R c = √t c for centred c.
    t = shapes[:, 0, 0] - shapes[:, 0, 1]
    expected = 1 - sets.rho * np.sqrt(t) / np.linalg.norm(c, axis=1)
    np.testing.assert_allclose(path.m_full[:, 0], expected, rtol=1e-9)


def test_affine_check() -> None:
    pairs = paired_scorings(600, 8, scale=0.05, seed=41).scores
    rewards = paired_scorings(300, 8, scale=0.05, seed=42).a
    gram = gram_matrices(300, 8, seed=43).gram
    same = affine_check(rewards, gram=gram, calibration_scores=pairs, alpha=0.2, tau=0.1,
                        scale=1.0, shift=0.0)
    assert same == (1.0, 1.0, pytest.approx(1.0), 0, 0.0)
    tiny = dict(gram=gram, calibration_scores=pairs, alpha=0.2, tau=0.1, scale=1e-4,
                shift=0.3)
    absolute = affine_check(rewards, **tiny)
    relative = affine_check(rewards, **tiny, calibration_options={"eps_relative": True})
    assert absolute.max_eta_change > 1e-3  # eps = 1e-6 is no longer negligible
    assert relative.decision_flips == 0 and relative.max_eta_change < 1e-8
    assert relative.update_cosine > 1 - 1e-12
    with pytest.raises(ValueError, match="scale"):
        affine_check(rewards, **{**tiny, "scale": 0.0})
    with pytest.raises(TypeError, match="calibration_scores"):
        affine_check(rewards, **{**tiny, "calibration_scores": pairs[0]})


def test_training_summary_by_hand() -> None:
    sets, gram, _ = batch(200)
    rec = recover(sets, gram, tau=0.1)
    s = training_summary(rec, sets)
    acc = rec.accepted
    assert s.n_accepted == acc.sum()
    assert s.accepted_ratio == pytest.approx(acc.mean())
    assert s.mean_eta == pytest.approx(rec.eta[acc].mean())
    c = sets.centers
    ratio = np.linalg.norm(rec.coefficients[acc]) / np.linalg.norm(c[acc])
    assert s.norm_ratio == pytest.approx(ratio)
    # Matched random discard writes back c itself: ratio 1, mean η* 1.
    rand = training_summary(recover(sets, gram, tau=0.1, discard="matched-random", seed=0),
                            sets)
    assert (rand.mean_eta, rand.norm_ratio) == (1.0, pytest.approx(1.0))
    none = training_summary(recover(sets, gram, tau=0.99), sets)
    assert none.n_accepted == 0 and np.isnan(none.mean_eta)
    with pytest.raises(TypeError, match="recovery"):
        training_summary(rec.eta, sets)  # type: ignore[arg-type]


def test_analysis_on_ragged_groups() -> None:
    sets, blocks, _ = batch(90, ragged=True)
    rec = recover(sets, blocks, tau=0.05, backend="numpy")
    acc = np.flatnonzero(rec.accepted & (rec.eta > 0))
    q = int(acc[0])
    path = recovery_path(sets, blocks, eta=[rec.eta[q]], backend="numpy")
    assert path.m_full.shape == (sets.n_groups, 1)
    assert path.m_full[q, 0] == pytest.approx(rec.m_full[q], abs=1e-7)
    assert path.anchors.shape == rec.anchors.shape
    s = training_summary(rec, sets)
    assert s.n_accepted == rec.accepted.sum()
    with pytest.raises(ValueError, match="eta"):
        recovery_path(sets, blocks, eta=[0.5, 1.5])
    with pytest.raises(ValueError, match="groups"):
        training_summary(recover(*batch(20)[:2], tau=0.1), sets)


def test_affine_check_with_group_ids() -> None:
    pairs = paired_scorings(400, 8, scale=0.05, seed=51).scores
    rewards = paired_scorings(40, 8, scale=0.05, seed=52).a
    gram = gram_matrices(40, 8, seed=53).gram
    dense = affine_check(rewards, gram=gram, calibration_scores=pairs, alpha=0.2, tau=0.1,
                         scale=2.0, shift=0.5)
    flat = rewards.ravel()
    ids = np.repeat(np.arange(40), 8)
    by_ids = affine_check(flat, group_ids=ids, gram=gram.reshape(40, -1).ravel(),
                          calibration_scores=pairs, alpha=0.2, tau=0.1, scale=2.0, shift=0.5)
    assert by_ids.decision_flips == dense.decision_flips
    assert by_ids.max_eta_change == pytest.approx(dense.max_eta_change, abs=1e-9)
