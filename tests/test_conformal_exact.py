"""Conformal ranges hold exactly the rewards their score admits; smoothing is exact on grids.

The ranges must be the same floating-point predicate as the calibration scores: a reward y
is in ``[lo, hi]`` iff its score, computed in float64 as at calibration, is at most q̂
(closed), or below q̂ (opened by smoothing).  Coverage is then checked against its claim on
decimal grids, references on the bounds included, with z = 4 binomial bands.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from advcal import calibrate_ranges, conformal_rank

# --------------------------------------------------------------------------- exact endpoints


def _score(method: str, y: np.ndarray, data: dict[str, np.ndarray]) -> np.ndarray:
    """The nonconformity score of reward y, as calibration computes it (float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if method == "absolute":
            return np.abs(y - data["judge"])
        if method == "normalized":
            return np.abs(y - data["judge"]) / data["sigma"]
        return np.maximum(data["lower"] - y, y - data["upper"])


def _is_the_exact_interval(method: str, lo: np.ndarray, hi: np.ndarray, q: float,
                           data: dict[str, np.ndarray], bounds: tuple[float, float],
                           strict: bool) -> np.ndarray:
    """Per range: its endpoints pass the test, the floats just outside them fail it.

    Scores are monotone in y on each side, so the rewards passing the test form one
    interval of floats: these four checks say ``[lo, hi]`` is exactly that interval.
    """
    passes = (lambda y: _score(method, y, data) < q) if strict else (
        lambda y: _score(method, y, data) <= q)
    below = np.nextafter(lo, -np.inf)
    above = np.nextafter(hi, np.inf)
    return (passes(lo) & passes(hi) & (lo <= hi)
            & ((below < bounds[0]) | ~passes(below))
            & ((above > bounds[1]) | ~passes(above)))


def _responses(rng: np.random.Generator, method: str, n: int, grid: float | None,
               bounds: tuple[float, float]) -> dict[str, np.ndarray]:
    low, high = bounds
    if grid is None:
        centre = rng.uniform(low - 0.1, high + 0.1, n)
    else:  # decimals of the grid, each the float nearest to it
        steps = round((high - low) / grid)
        centre = low + rng.integers(-1, steps + 2, n) / round(1 / grid)
    data = {"judge": centre}
    if method == "normalized":
        data["sigma"] = rng.choice([0.1, 0.3, 1.0, 2.5], n)
    if method == "cqr":
        data = {"lower": centre - rng.choice([0.0, 0.05, 0.1], n),
                "upper": centre + rng.choice([0.0, 0.05, 0.2], n)}
    return data


def _references(rng: np.random.Generator, data: dict[str, np.ndarray], grid: float | None,
                bounds: tuple[float, float]) -> np.ndarray:
    n = next(iter(data.values())).size
    low, high = bounds
    if grid is None:
        return rng.uniform(low, high, n)
    steps = round((high - low) / grid)
    return low + rng.integers(0, steps + 1, n) / round(1 / grid)


@pytest.mark.parametrize("method", ["absolute", "normalized", "cqr"])
@pytest.mark.parametrize("grid", [0.05, 0.1, 0.01, None])
@pytest.mark.parametrize("bounds", [(0.0, 1.0), (-1.0, 2.0)])
def test_ranges_hold_exactly_the_rewards_within_the_radius(method, grid, bounds):
    # On a decimal grid, s + q̂ in float is often one float off the last reward whose
    # score |y - s| (also rounded) is <= q̂: the range and the score then disagree there.
    rng = np.random.default_rng(zlib.crc32(repr((method, grid, bounds)).encode()))
    cal_data = _responses(rng, method, 200, grid, bounds)
    reference = _references(rng, cal_data, grid, bounds)
    judge = cal_data.pop("judge", None)
    cal = calibrate_ranges(judge, reference, alpha=0.3, method=method, bounds=bounds,
                           **cal_data)
    q = cal.radius[None]
    data = _responses(rng, method, 4000, grid, bounds)
    inputs = {"judge": data.get("judge"), "sigma": data.get("sigma"),
              "lower": data.get("lower"), "upper": data.get("upper")}
    lo, hi = cal.ranges(**inputs)
    exact = _is_the_exact_interval(method, lo, hi, q, data, bounds, strict=False)
    # Where no reward within the bounds passes (a judge far outside them), the range is
    # the clipped degenerate one; everything else is the exact interval.  The centre,
    # clipped to the bounds, has the smallest score of all rewards within them.
    centre = data["judge"] if method != "cqr" else 0.5 * (data["lower"] + data["upper"])
    some = _score(method, np.clip(centre, *bounds), data) <= q
    assert some.mean() > 0.8
    assert exact[some].all()
    # Smoothed: each range is exactly the closed or exactly the open interval.
    lo_s, hi_s = cal.ranges(**inputs, smoothing=True, seed=1)
    closed = _is_the_exact_interval(method, lo_s, hi_s, q, data, bounds, strict=False)
    opened = _is_the_exact_interval(method, lo_s, hi_s, q, data, bounds, strict=True)
    assert (closed | opened)[some].all()


def test_the_endpoint_check_rejects_the_float_sums():
    # The check above is not vacuous: with s = 0.05 and q̂ = 0.15 (the score of 0.15 vs
    # 0), s + q̂ is the float 0.2, but the reward 0.2 scores |0.2 - 0.05| = 0.15000000000000002.
    s, q = 0.05, abs(0.15 - 0.0)
    assert abs(0.2 - s) > q and s + q == 0.2
    data = {"judge": np.array([s])}
    naive = _is_the_exact_interval("absolute", np.array([s - q]), np.array([s + q]), q,
                                   data, (0.0, 1.0), strict=False)
    assert not naive.any()
    cal = calibrate_ranges([0.0, 0.5], [0.15, 0.5], alpha=0.5)  # k = 2: q̂ = 0.15
    assert cal.radius[None] == 0.15
    lo, hi = cal.ranges([0.05])
    assert hi[0] == np.nextafter(0.2, 0.0) and not lo[0] <= 0.2 <= hi[0]


# --------------------------------------------------------------------------- coverage on grids


def _grid_study(grid: float, on_bounds: bool, m: int, splits: int,
                seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Cover flags of one test response per split (closed, smoothed), ``splits`` splits.

    Each split is one category of a Mondrian calibration: its radius comes from its own m
    scores only, so one call calibrates every split independently.
    """
    rng = np.random.default_rng(seed)
    steps = round(1 / grid)
    n = splits * (m + 1)
    if on_bounds:  # most references at 0 or 1, the rest on the grid
        cell = np.where(rng.random(n) < 0.8, rng.integers(0, 2, n) * steps,
                        rng.integers(0, steps + 1, n))
    else:
        cell = rng.integers(0, steps + 1, n)
    # The judge is off by a few grid steps, clipped to the scale; both are decimals.
    off = rng.choice([-1, 0, 1, 2], n, p=[0.1, 0.4, 0.35, 0.15])
    judge = np.clip(cell + off, 0, steps) / steps
    reference = cell / steps
    split = np.repeat(np.arange(splits), m + 1)
    test = np.zeros(n, dtype=bool)
    test[m::m + 1] = True
    cal = calibrate_ranges(judge[~test], reference[~test], alpha=0.2,
                           categories=split[~test])
    lo, hi = cal.ranges(judge[test], categories=split[test])
    closed = (lo <= reference[test]) & (reference[test] <= hi)
    lo, hi = cal.ranges(judge[test], categories=split[test], smoothing=True, seed=seed)
    smoothed = (lo <= reference[test]) & (reference[test] <= hi)
    return closed, smoothed


def _z4(p: float, trials: int) -> float:
    # z = 4: a false alarm about once in 16 000 runs per side for an exact Bernoulli rate.
    return 4.0 * math.sqrt(p * (1.0 - p) / trials)


@pytest.mark.parametrize("grid", [0.05, 0.1, 0.01])
@pytest.mark.parametrize("on_bounds", [False, True])
def test_smoothed_coverage_is_exact_on_decimal_grids(grid, on_bounds):
    # m = 49, alpha = 0.2: k / (m + 1) = 0.8, and the z = 4 band is +-0.008.  While the
    # ranges were the float sums s +- q̂, not the score predicate, these seeds measured
    # 0.767 (0.1 grid), 0.763 and 0.828-0.831 (references on the bounds); on the interior
    # 0.05 and 0.01 grids the error was below the band (0.804, 0.803).
    m, splits = 49, 40_000
    closed, smoothed = _grid_study(grid, on_bounds, m, splits,
                                   seed=round(1 / grid) + 1000 * on_bounds)
    exact = conformal_rank(m, 0.2) / (m + 1)
    assert exact == 0.8
    assert abs(smoothed.mean() - exact) <= _z4(exact, splits)
    # Closed ranges: at least 1 - alpha (they over-cover by the mass of the tie).
    assert closed.mean() >= 0.8 - _z4(0.8, splits)
    assert closed.mean() > smoothed.mean()
