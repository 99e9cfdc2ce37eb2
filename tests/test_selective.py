"""Selection-conditional radii (advcal.calibrate_selective): the counts against a direct
computation, coverage among accepted groups on a model where the gate prefers groups whose
marginal sets under-cover, the selective gate's (α, δ) guarantee and what it implies for
reversals, and bad input."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
import pytest
from scipy import stats

from advcal import (
    SelectiveCalibration,
    SetCalibration,
    calibrate_selective,
    calibrate_sets,
    coefficient_sets,
    conformal_quantile,
    grpo,
    recover,
    risk_p_value,
    select_threshold,
    setgrpo,
)
from advcal.simulate import gram_matrices, paired_scorings
from tests.checks import assert_raised_by_advcal

GRID = np.array([0.6, 0.4, 0.2, 0.0])
# Winner's curse: per-response grader noise that the isotropic sets do not see, so a strict
# gate keeps the groups whose training scoring was noisiest (their sets are the smallest).
CURSED = {"noise": "heteroscedastic", "scale": 0.03, "heteroscedasticity": 1.0}
# Gaussian grading: the marginal sets nearly cover among accepted groups.
PLAIN = {"noise": "gaussian", "scale": 0.05}
ALPHA = 0.1


def groups(n: int, seed: int, model: dict[str, Any], n_scorings: int = 2) -> tuple[Any, Any]:
    pair = paired_scorings(n, 8, seed=seed, n_scorings=n_scorings, **model)
    return pair, gram_matrices(n, 8, seed=seed + 1).gram


@cache
def marginal(model_name: str) -> SetCalibration:
    model = CURSED if model_name == "cursed" else PLAIN
    pair = paired_scorings(3000, 8, seed=0, **model)
    return calibrate_sets(pair.a, pair.b, alpha=ALPHA)


@cache
def population(model_name: str) -> tuple[Any, ...]:
    """A large test population: its accepted groups at each (τ, radius) and whether their
    second scoring's coefficients, and a third scoring's, are covered."""
    model = CURSED if model_name == "cursed" else PLAIN
    pair, gram = groups(40000, 100, model, n_scorings=3)
    sets = coefficient_sets(pair.a, calibration=marginal(model_name))
    distance = sets.distances(grpo(pair.b))
    return pair, gram, sets, distance


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("gate", ["marginal", "selective"])
def test_counts_and_radii_by_hand(gate: str, backend: str) -> None:
    cal = marginal("plain")
    pair, gram = groups(400, 7, PLAIN)
    kw = {"delta": 0.2} if gate == "selective" else {}
    sel = calibrate_selective(pair.a, pair.b, gram=gram, calibration=cal,
                              thresholds=[0.0, 0.4, 0.2], gate=gate, backend=backend, **kw)
    np.testing.assert_array_equal(sel.tau, [0.4, 0.2, 0.0])
    multipliers = [1.0] if gate == "marginal" else [0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0]
    np.testing.assert_array_equal(sel.candidates, np.array(multipliers) * cal.rho)
    sets = coefficient_sets(pair.a, calibration=cal)
    for j, radius in enumerate(sel.candidates):
        at = sets.at_radius(radius)
        covered = at.contains(grpo(pair.b))
        for i, tau in enumerate(sel.tau):
            accepted = recover(at, gram, tau=tau, backend=backend).accepted
            assert sel.n_acc[i, j] == accepted.sum()
            assert sel.n_miss[i, j] == (accepted & ~covered).sum()
            assert sel.p_value[i, j] == risk_p_value(sel.n_miss[i, j], sel.n_acc[i, j], ALPHA)
    if gate == "marginal":
        accepted = [recover(sets, gram, tau=t).accepted for t in sel.tau]
        scores = sets.distances(grpo(pair.b))
        expected = [conformal_quantile(scores[a], ALPHA) for a in accepted]
        np.testing.assert_array_equal(sel.rho, expected)
        assert sel.delta is None
        return
    for i in range(sel.tau.size):  # Holm at δ over the 8 candidates, written out
        p = sel.p_value[i]
        order = np.argsort(p, kind="stable")
        certified = np.zeros(p.size, dtype=bool)
        for rank, j in enumerate(order):
            if p[j] > 0.2 / (p.size - rank):
                break
            certified[j] = True
        np.testing.assert_array_equal(sel.certified[i], certified)
        smallest = sel.candidates[certified].min() if certified.any() else np.inf
        assert sel.rho[i] == smallest
        assert sel.radius(float(sel.tau[i])) == smallest


def _beta_moments(n_acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the coverage of a split-conformal radius over n exchangeable
    continuous scores: Beta(k, n + 1 − k) with k = ⌈(n + 1)(1 − α)⌉ (1 when k > n)."""
    n = n_acc.astype(float)
    k = np.ceil((n + 1) * (1 - ALPHA))
    finite = k <= n
    mean = np.where(finite, k / (n + 1), 1.0)
    var = np.where(finite, k * (n + 1 - k) / ((n + 1) ** 2 * (n + 2)), 0.0)
    return mean, var


def test_marginal_gate_covers_among_accepted_groups_at_every_threshold() -> None:
    """The cursed model: among the groups the gate accepts, the marginal sets cover 0.85 at
    τ = 0 and far less as τ tightens; radii calibrated on the accepted calibration groups
    cover at least 1 − α on average over 200 calibrations, at every τ."""
    cal = marginal("cursed")
    pair, gram, sets, distance = population("cursed")
    accepted = np.stack([recover(sets, gram, tau=t).accepted for t in GRID], axis=1)
    n_test = accepted.sum(axis=0)
    reps, size = 200, 2000
    coverage = np.zeros((reps, GRID.size))
    n_cal = np.zeros((reps, GRID.size), dtype=np.int64)
    for r in range(reps):
        c1, g1 = groups(size, 1000 + 2 * r, CURSED)
        sel = calibrate_selective(c1.a, c1.b, gram=g1, calibration=cal, thresholds=GRID)
        n_cal[r] = sel.n_acc[:, 0]
        for i in range(GRID.size):
            coverage[r, i] = np.mean(distance[accepted[:, i]] <= sel.rho[i])
    mean_beta, var_beta = _beta_moments(n_cal)
    marginal_cov = np.array([np.mean(distance[accepted[:, i]] <= cal.rho)
                             for i in range(GRID.size)])
    for i in range(GRID.size):
        # The test population is shared by the calibrations: its own binomial error adds.
        c = coverage[:, i].mean()
        se = math.sqrt(var_beta[:, i].sum() / reps ** 2 + c * (1 - c) / n_test[i])
        assert c >= 1 - ALPHA - 4 * se, (GRID[i], c, se)
        # ... and not vacuously: within 4 SE of the Beta mean (the radius is no larger
        # than needed), where the calibrations accept enough groups to have a radius.
        if (mean_beta[:, i] < 1).all():
            assert abs(c - mean_beta[:, i].mean()) <= 4 * se, (GRID[i], c)
        se_marg = math.sqrt(marginal_cov[i] * (1 - marginal_cov[i]) / n_test[i])
        if GRID[i] >= 0.2:  # the effect: the marginal sets under-cover there
            assert marginal_cov[i] < 1 - ALPHA - 4 * se_marg, (GRID[i], marginal_cov[i])


@cache
def candidate_truth(model_name: str, multipliers: tuple[float, ...]) -> tuple[Any, ...]:
    """On the test population, per (τ, candidate radius): the gate's acceptance rate, the
    coverage of the second scoring among accepted groups, and the reversal rate against a
    third scoring's GRPO coefficients."""
    cal = marginal(model_name)
    pair, gram, sets, distance = population(model_name)
    reference = grpo(pair.scores[2])
    t, r = GRID.size, len(multipliers)
    accept, cover, reverse = np.zeros((t, r)), np.full((t, r), np.nan), np.zeros((t, r))
    implied = True
    for j, mult in enumerate(multipliers):
        at = sets.at_radius(mult * cal.rho)
        covered_ref = at.contains(reference)
        for i, tau in enumerate(GRID):
            rec = recover(at, gram, tau=tau)
            a = rec.accepted
            dots = np.einsum("bi,bij,bj->b", rec.coefficients, gram, reference)
            reversal = a & (dots < 0)
            implied &= not (reversal & covered_ref).any()
            accept[i, j] = a.mean()
            if a.any():
                cover[i, j] = np.mean(distance[a] <= mult * cal.rho)
                reverse[i, j] = reversal.sum() / a.sum()
    return accept, cover, reverse, implied


def test_selective_gate_certifies_radii_that_cover_among_what_they_accept() -> None:
    """(α, δ): over 100 calibrations, at each τ the radius the selective gate chooses
    covers at least 1 − α among the groups it accepts (true coverage from 40000 groups),
    except in at most a δ share of calibrations within binomial error; the gate keeps power
    (it certifies a radius at τ = 0 and 0.2 in most calibrations); and a reversal against
    an exchangeable reference never happens where the reference's coefficients are in the
    set, so the reversal risk of the chosen radius is at most its miss rate."""
    cal = marginal("plain")
    multipliers = (0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0)
    accept, cover, reverse, implied = candidate_truth("plain", multipliers)
    assert implied
    reps, delta = 100, 0.1
    failures = np.zeros(GRID.size, dtype=np.int64)
    certified = np.zeros(GRID.size, dtype=np.int64)
    for r in range(reps):
        c1, g1 = groups(2000, 5000 + 2 * r, PLAIN)
        sel = calibrate_selective(c1.a, c1.b, gram=g1, calibration=cal, thresholds=GRID,
                                  gate="selective", delta=delta)
        for i in range(GRID.size):
            if np.isfinite(sel.rho[i]):
                j = int(np.flatnonzero(sel.candidates == sel.rho[i])[0])
                certified[i] += 1
                # The radius's true coverage and risk among what it accepts.
                failures[i] += bool(cover[i, j] < 1 - ALPHA)
                assert reverse[i, j] <= 1 - cover[i, j] + 4 * math.sqrt(
                    ALPHA / max(accept[i, j] * 40000, 1))
    allowed = stats.binom.ppf(1 - 1e-4, reps, delta)
    assert (failures <= allowed).all(), failures
    assert certified[GRID == 0.0][0] >= 80 and certified[GRID == 0.2][0] >= 80, certified


def test_select_threshold_and_setgrpo_use_the_selective_radius() -> None:
    cal = marginal("plain")
    c1, g1 = groups(3000, 11, PLAIN)
    sel = calibrate_selective(c1.a, c1.b, gram=g1, calibration=cal, thresholds=GRID,
                              gate="selective", delta=0.1)
    assert np.isfinite(sel.rho).any() and (sel.rho != cal.rho).any()
    risk, gram = groups(1500, 21, PLAIN)
    sets = coefficient_sets(risk.a, calibration=cal)
    table = select_threshold(sets, gram, grpo(risk.b), thresholds=GRID, beta=0.2, delta=0.1,
                             selective=sel)
    for i, tau in enumerate(table.tau):
        one = select_threshold(sets.at_radius(sel.radius(tau)), gram, grpo(risk.b),
                               thresholds=[tau], beta=0.2, delta=0.1)
        assert (table.n_acc[i], table.k_rev[i]) == (one.n_acc[0], one.k_rev[0])
        # The engine solves each τ from the last one's state: equal to rounding.
        assert table.recovery[i] == pytest.approx(one.recovery[0], rel=1e-12)
    batch, batch_gram = groups(64, 31, PLAIN)
    for tau in GRID:
        out = setgrpo(batch.a, gram=batch_gram, calibration=cal, tau=float(tau), selective=sel)
        ref = recover(coefficient_sets(batch.a, calibration=cal).at_radius(sel.radius(tau)),
                      batch_gram, tau=tau)
        np.testing.assert_array_equal(out.coefficients, ref.coefficients)
        np.testing.assert_array_equal(out.accepted, ref.accepted)
    # Without it, nothing changes: the marginal radius.
    plain = setgrpo(batch.a, gram=batch_gram, calibration=cal, tau=0.2)
    np.testing.assert_array_equal(
        plain.coefficients,
        recover(coefficient_sets(batch.a, calibration=cal), batch_gram, tau=0.2).coefficients)


def test_marginal_gate_leaves_the_gate_alone() -> None:
    cal = marginal("plain")
    c1, g1 = groups(500, 41, PLAIN)
    sel = calibrate_selective(c1.a, c1.b, gram=g1, calibration=cal, thresholds=GRID)
    batch, gram = groups(8, 43, PLAIN)
    with pytest.raises(ValueError, match="gate='marginal'"):
        setgrpo(batch.a, gram=gram, calibration=cal, tau=0.2, selective=sel)
    assert sel.gate_radius(0.2) == cal.rho


def _bad_calls() -> list[tuple[dict[str, Any], type[Exception], str]]:
    return [
        ({"gate": "strict"}, ValueError, "gate"),
        ({"delta": 0.1}, ValueError, "delta"),
        ({"multipliers": [1.0, 2.0]}, ValueError, "multipliers"),
        ({"gate": "selective"}, ValueError, "delta"),
        ({"gate": "selective", "delta": 1.5}, ValueError, "delta"),
        ({"gate": "selective", "delta": 0.1, "multipliers": [1.0, 1.0]}, ValueError,
         "multipliers"),
        ({"gate": "selective", "delta": 0.1, "multipliers": [0.0, 1.0]}, ValueError,
         "multipliers"),
        ({"gate": "selective", "delta": 0.1, "multipliers": [[1.0]]}, ValueError,
         "multipliers"),
        ({"alpha": 0.0}, ValueError, "alpha"),
        ({"thresholds": [1.0]}, ValueError, "thresholds"),
        ({"thresholds": [0.1, 0.1]}, ValueError, "thresholds"),
        ({"bound": "normal"}, ValueError, "bound"),
        ({"backend": "gpu"}, ValueError, "backend"),
        ({"reward_condition": 1}, TypeError, "reward_condition"),
        ({"calibration": "cal"}, TypeError, "calibration"),
        ({"gram": np.zeros((3, 8, 8))}, ValueError, "gram"),
        ({"scores_b": np.full((20, 8), np.nan)}, ValueError, "scores_b"),
        ({"scores_b": np.zeros((20, 7))}, ValueError, "scores_b"),
    ]


@pytest.mark.parametrize(("change", "error", "name"), _bad_calls())
def test_bad_input_names_the_argument(change: dict[str, Any], error: type[Exception],
                                      name: str) -> None:
    pair, gram = groups(20, 51, PLAIN)
    kw: dict[str, Any] = {"scores_a": pair.a, "scores_b": pair.b, "gram": gram,
                          "calibration": marginal("plain"), "thresholds": GRID}
    kw.update(change)
    with pytest.raises(error, match=name) as info:
        calibrate_selective(**kw)
    assert_raised_by_advcal(info.value)


def test_an_infinite_marginal_radius_is_refused() -> None:
    pair = paired_scorings(5, 8, seed=61, **PLAIN)
    cal = calibrate_sets(pair.a, pair.b, alpha=0.1)  # 5 groups: no radius at α = 0.1
    assert cal.rho == np.inf
    with pytest.raises(ValueError, match="infinite radius"):
        calibrate_selective(pair.a, pair.b, gram=gram_matrices(5, 8, seed=1).gram,
                            calibration=cal, thresholds=GRID)


def test_selective_radii_must_match_the_sets_and_the_grid() -> None:
    cal = marginal("plain")
    c1, g1 = groups(500, 71, PLAIN)
    sel = calibrate_selective(c1.a, c1.b, gram=g1, calibration=cal, thresholds=GRID,
                              gate="selective", delta=0.1)
    other = marginal("cursed")
    batch, gram = groups(8, 73, PLAIN)
    with pytest.raises(ValueError, match="another SetCalibration"):
        setgrpo(batch.a, gram=gram, calibration=other, tau=0.2, selective=sel)
    with pytest.raises(ValueError, match="not on the selective calibration's grid"):
        setgrpo(batch.a, gram=gram, calibration=cal, tau=0.3, selective=sel)
    with pytest.raises(TypeError, match="SelectiveCalibration"):
        setgrpo(batch.a, gram=gram, calibration=cal, tau=0.2, selective=cal)
    sets = coefficient_sets(batch.a, calibration=cal)
    with pytest.raises(ValueError, match="not on the selective calibration's grid"):
        select_threshold(sets, gram, grpo(batch.b), thresholds=[0.3], beta=0.2, delta=0.1,
                         selective=sel)


def test_the_result_checks_its_invariants() -> None:
    cal = marginal("plain")
    c1, g1 = groups(300, 81, PLAIN)
    sel = calibrate_selective(c1.a, c1.b, gram=g1, calibration=cal, thresholds=GRID,
                              gate="selective", delta=0.1)
    fields = dict(sel.__dict__)
    for change, match in [({"n_miss": sel.n_acc + 1}, "n_miss"),
                          ({"rho": sel.rho[:2]}, "rho"),
                          ({"rho": -np.ones(GRID.size)}, "rho"),
                          ({"certified": sel.certified[:, :2]}, "certified"),
                          ({"delta": None}, "delta"),
                          ({"gate": "other"}, "gate"),
                          ({"calibration": None}, "calibration")]:
        with pytest.raises((ValueError, TypeError), match=match):
            SelectiveCalibration(**{**fields, **change})
    with pytest.raises(ValueError, match="on the selective calibration's grid"):
        sel.radius(0.5)


@pytest.mark.parametrize("ablation", [{"recovery": False}, {"discard": "matched-random",
                                                            "seed": 0}])
def test_the_selective_gate_is_refused_with_an_ablation(ablation: dict) -> None:
    # Its radii cover among the groups SetGRPO's own gate accepts; an ablation accepts
    # others.
    cal = calibrate_sets(*paired_scorings(400, 4, scale=0.02, seed=0).scores, alpha=0.2)
    data = paired_scorings(60, 4, scale=0.02, seed=1)
    gram = gram_matrices(60, 4, seed=2).gram
    sel = calibrate_selective(data.a, data.b, gram=gram, calibration=cal,
                              thresholds=[0.0, 0.2], gate="selective", delta=0.1)
    batch = paired_scorings(8, 4, scale=0.02, seed=3)
    with pytest.raises(ValueError, match="`selective` was calibrated for SetGRPO's gate"):
        setgrpo(batch.a, gram=gram[:8], calibration=cal, tau=0.2, selective=sel, **ablation)
    with pytest.raises(ValueError, match="`selective` was calibrated for SetGRPO's gate"):
        select_threshold(coefficient_sets(batch.a, calibration=cal), gram[:8],
                         grpo(batch.b), thresholds=[0.0, 0.2], beta=0.2, delta=0.1,
                         selective=sel, **ablation)
    # without the ablation the same call runs
    setgrpo(batch.a, gram=gram[:8], calibration=cal, tau=0.2, selective=sel)
