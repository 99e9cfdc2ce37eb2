"""The TRL integration's logged scale metrics: its own cheap path against
advcal.scale_diagnostics (the oracle), and by hand.  Needs neither torch nor TRL."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import advcal
from advcal.integrations.trl import TRL_EPS, _quantiles, _scale_metrics, _valid_groups

KEYS = ("inverse_scale_p50", "inverse_scale_p95", "inverse_scale_p99", "inverse_scale_max",
        "zero_gap_fraction")


def _oracle(values, offsets, mode, options):
    diag = advcal.scale_diagnostics(values, offsets, methods=(mode,), eps=TRL_EPS,
                                    tau_res=0.05, options={mode: options} if options else None)
    return {key: getattr(diag[mode], key) for key in KEYS}


def test_by_hand() -> None:
    rewards = np.array([[1.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5], [0.2, np.nan, 0.4, np.nan]])
    values, offsets, where = _valid_groups(rewards)
    np.testing.assert_array_equal(offsets, [0, 4, 8, 10])
    np.testing.assert_array_equal(where, [0, 1, 2, 3, 4, 5, 6, 7, 8, 10])
    got = _scale_metrics(values, offsets, "grpo")
    # informative groups: 1 (std sqrt(1/3)) and 3 (std 0.1 * sqrt 2); group 2 is zero-gap
    inverse = np.sort([1 / (np.sqrt(1 / 3) + TRL_EPS), 1 / (0.2 / np.sqrt(2) + TRL_EPS)])
    assert got["inverse_scale_max"] == pytest.approx(inverse[1], rel=1e-12)
    assert got["inverse_scale_p50"] == pytest.approx(inverse.mean(), rel=1e-12)
    assert got["zero_gap_fraction"] == pytest.approx(1 / 3)
    unit = _scale_metrics(values, offsets, "unit")
    assert [unit[key] for key in KEYS] == [1.0, 1.0, 1.0, 1.0, pytest.approx(1 / 3)]


def test_dense_batch_has_identity_positions() -> None:
    rewards = np.array([[1.0, 0.0], [0.3, 0.3]])
    values, offsets, where = _valid_groups(rewards)
    assert where is None
    np.testing.assert_array_equal(offsets, [0, 2, 4])
    np.testing.assert_array_equal(values, rewards.ravel())


def test_no_group_of_two_gives_nan_not_an_error() -> None:
    got = _scale_metrics(np.array([0.3, 0.7]), np.array([0, 1, 2]), "grpo")
    assert all(np.isnan(got[key]) for key in KEYS)


@pytest.mark.parametrize("seed", range(6))
def test_equals_scale_diagnostics(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for trial in range(20):
        b, g = int(rng.integers(1, 30)), int(rng.integers(2, 9))
        rewards = np.round(rng.uniform(0, 1, (b, g)) * rng.choice([1, 4, 100])) / 100
        if trial % 2:
            rewards[rng.uniform(size=rewards.shape) < 0.25] = np.nan  # None rewards
        values, offsets, _ = _valid_groups(rewards)
        if not (np.diff(offsets) >= 2).any():
            continue
        for mode, method in (("grpo", "grpo"), ("rloo", "unit"), ("dr_grpo", "unit")):
            got = _scale_metrics(values, offsets, method)
            want = _oracle(values, offsets, mode, None)
            for key in KEYS:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-12, err_msg=key)
        options: dict[str, Any] = {"tau_res": 0.05, "resolution": 0.01}
        result = advcal.maxnorm(values, offsets, return_scale=True, **options)
        got = _scale_metrics(values, offsets, "maxnorm", result.scale, result.keep)
        want = _oracle(values, offsets, "maxnorm", options)
        for key in KEYS:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-12, err_msg=key)


def test_quantiles_are_numpys() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 64, 1000):
        x = rng.lognormal(size=n)
        q = (0.0, 50.0, 95.0, 99.0, 100.0)
        np.testing.assert_array_equal(_quantiles(x, q), np.percentile(x, q))
