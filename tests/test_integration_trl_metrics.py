"""The TRL integration's logged scale metrics against advcal.scale_diagnostics (the
oracle) and by hand.  Needs neither torch nor TRL."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import advcal
from advcal.diagnostics import _percentiles
from advcal.integrations.trl import TRL_EPS, AdvcalGRPOMixin, _grouped, _metrics, _settings_iv

KEYS = ("inverse_scale_p50", "inverse_scale_p95", "inverse_scale_p99", "inverse_scale_max",
        "zero_gap_fraction")


def _trainer_metrics(rewards: np.ndarray, estimator: str, options: dict[str, Any]
                     ) -> tuple[np.ndarray, dict[str, float]]:
    scaled, scorable = _grouped(rewards, estimator, options)
    return scaled.weights.reshape(rewards.shape), _metrics(scaled, scorable)


def _scorable_batch(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The scorable rewards as a ragged batch (what scale_diagnostics takes)."""
    valid = ~np.isnan(rewards)
    offsets = np.concatenate(([0], np.cumsum(valid.sum(axis=1))))
    return rewards[valid], offsets


def _oracle(rewards: np.ndarray, method: str, options: dict[str, Any]) -> dict[str, float]:
    values, offsets = _scorable_batch(rewards)
    diag = advcal.scale_diagnostics(values, offsets, methods=(method,), eps=TRL_EPS,
                                    tau_res=0.05, options={method: options} if options else None)
    return {key: getattr(diag[method], key) for key in KEYS}


def test_by_hand() -> None:
    rewards = np.array([[1.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5], [0.2, np.nan, 0.4, np.nan]])
    advantages, got = _trainer_metrics(rewards, "grpo", {})
    # informative groups: 1 (std sqrt(1/3)) and 3 (std 0.1 * sqrt 2); group 2 is zero-gap
    inverse = np.sort([1 / (np.sqrt(1 / 3) + TRL_EPS), 1 / (0.2 / np.sqrt(2) + TRL_EPS)])
    assert got["inverse_scale_max"] == pytest.approx(inverse[1], rel=1e-12)
    assert got["inverse_scale_p50"] == pytest.approx(inverse.mean(), rel=1e-12)
    assert got["zero_gap_fraction"] == pytest.approx(1 / 3)
    # None rewards leave their group and get 0; the others are GRPO's of what is left
    third = 0.1 / (0.2 / np.sqrt(2) + TRL_EPS)
    np.testing.assert_allclose(advantages[2], [-third, 0.0, third, 0.0], rtol=1e-12)
    np.testing.assert_array_equal(advantages[1], 0.0)
    _, unit = _trainer_metrics(rewards, "rloo", {})
    assert [unit[key] for key in KEYS] == [1.0, 1.0, 1.0, 1.0, pytest.approx(1 / 3)]


def test_a_group_left_with_one_reward_is_not_scorable() -> None:
    rewards = np.array([[0.2, np.nan, np.nan], [0.1, 0.3, 0.3], [0.4, 0.4, np.nan]])
    for estimator, options in (("grpo", {}), ("rloo", {}), ("maxnorm", {"tau_res": 0.05})):
        _, got = _trainer_metrics(rewards, estimator, options)
        assert got["zero_gap_fraction"] == 0.5, estimator  # group 3 of groups 2 and 3


def test_no_group_of_two_gives_nan_not_an_error() -> None:
    advantages, got = _trainer_metrics(np.array([[0.3, np.nan], [np.nan, 0.7]]), "grpo", {})
    assert all(np.isnan(got[key]) for key in KEYS)
    np.testing.assert_array_equal(advantages, 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_equals_scale_diagnostics(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("grpo", {}), ("rloo", {}), ("dr_grpo", {}), ("batch_std", {}),
        ("maxnorm", {"tau_res": 0.05, "resolution": 0.01}), ("maxnorm", {"tau_res": 0.05})]
    for trial in range(20):
        b, g = int(rng.integers(1, 30)), int(rng.integers(2, 9))
        rewards = np.round(rng.uniform(0, 1, (b, g)) * rng.choice([1, 4, 100])) / 100
        if trial % 2:
            rewards[rng.uniform(size=rewards.shape) < 0.25] = np.nan  # None rewards
        if not (np.sum(~np.isnan(rewards), axis=1) >= 2).any():
            continue
        for estimator, options in cases:
            _, got = _trainer_metrics(rewards, estimator, options)
            want = _oracle(rewards, estimator, options)
            for key in KEYS:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-12,
                                           err_msg=f"{estimator} {key}")


@pytest.mark.parametrize(("mode", "options"), [
    ("dr_grpo", {}), ("rloo", {}), ("maxnorm", {"tau_res": 0.05}),
    ("maxnorm", {"tau_res": 0.05, "resolution": 0.01}), ("range", {}),
    ("range", {"relation": "midpoint"})])
def test_none_rewards_leave_their_group_in_every_mode(mode: str, options: dict[str, Any]
                                                      ) -> None:
    rng = np.random.default_rng(0)
    calibration = None
    if mode == "range":
        reference = rng.uniform(0, 1, 200)
        judge = np.clip(reference + rng.normal(0, 0.05, 200), 0, 1)
        calibration = advcal.calibrate_ranges(judge, reference, alpha=0.2, bounds=(0.0, 1.0))
    mixin: Any = object.__new__(AdvcalGRPOMixin)
    mixin._advcal = _settings_iv(mode, options, calibration, None, None, None, 0)
    rewards = np.round(rng.uniform(0, 1, (40, 6)), 2)
    rewards[rng.uniform(size=rewards.shape) < 0.3] = np.nan
    rewards[0, 1:] = np.nan  # one scorable reward left
    rewards[1] = np.nan  # none left
    got, _ = mixin._advcal_advantages(rewards)
    for row, advantages in zip(rewards, got, strict=True):
        valid = ~np.isnan(row)
        # the group's own estimator on what is left of it
        expected = np.zeros(row.size)
        if mode == "range":
            ranges = calibration.ranges(row[valid])
            expected[valid] = advcal.range_advantages(ranges.lo, ranges.hi,
                                                      [0, valid.sum()], **options)
        else:
            expected[valid] = advcal.advantages(row[valid], [0, valid.sum()], method=mode,
                                                **options)
        np.testing.assert_allclose(advantages, expected, rtol=1e-12, atol=1e-15)


def test_percentiles_are_numpys() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 64, 1000, 1001):
        for x in (rng.lognormal(size=n), np.round(rng.uniform(size=n), 1)):
            q = (0.0, 50.0, 95.0, 99.0, 100.0)
            got, top = _percentiles(x, q)
            np.testing.assert_array_equal(got, np.percentile(x, q))
            assert top == x.max()
