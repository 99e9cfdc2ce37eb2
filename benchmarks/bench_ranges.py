"""range_advantages and ucb: compiled kernels against the O(n²) numpy reference.

Target (issue 4): ``range_advantages`` (dominance) at n = 64, B = 4096 at least 10x
faster than the O(n²) numpy reference (``backend="numpy"``).
"""

from __future__ import annotations

import numpy as np

import advcal
from advcal._kernels import ranges_numba
from advcal._kernels.pool import run_over_groups
from benchmarks import Case


def numpy_dominance_dense(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The whole batch as one (B, G, G) broadcast: O(n²) memory, no Python loop."""
    ahead = np.maximum(lo[:, :, None] - hi[:, None, :], 0.0)
    return (ahead.sum(axis=2) - ahead.sum(axis=1)) / lo.shape[1]


def _ranges(rng: np.random.Generator, n_groups: int, width: int) -> tuple[np.ndarray, ...]:
    centre = rng.random((n_groups, width))
    half = np.where(rng.random((n_groups, width)) < 0.25, 0.0, 0.1 * rng.random((n_groups,
                                                                                  width)))
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


def cases(quick: bool) -> list[Case]:
    rng = np.random.default_rng(0)
    n_groups, width = (256 if quick else 4096), 64
    lo, hi = _ranges(rng, n_groups, width)
    flat_lo, flat_hi = lo.ravel(), hi.ravel()
    offsets = np.arange(n_groups + 1, dtype=np.int64) * width
    sorted_lo = np.sort(lo, axis=1).reshape(-1)
    sorted_hi = np.sort(hi, axis=1).reshape(-1)
    scratch = np.empty(flat_lo.size)

    def dominance_kernel(threaded: bool | None) -> object:
        return run_over_groups(ranges_numba._relation_kernel, offsets, (), flat_lo, flat_hi,
                               sorted_lo, sorted_hi, width, 0, scratch, threaded=threaded)

    out = [
        Case(
            f"range_advantages dominance, dense {n_groups} x {width}",
            {
                "numpy O(n^2) reference": lambda: advcal.range_advantages(
                    lo, hi, backend="numpy"),
                "advcal (numba), public call": lambda: advcal.range_advantages(lo, hi),
                "numba engine (sorts + kernel)": lambda: ranges_numba.range_advantages(
                    flat_lo, flat_hi, offsets, 0),
                "numba kernel only, one thread": lambda: dominance_kernel(threaded=False),
                "numba kernel only, threads by size": lambda: dominance_kernel(threaded=None),
                "numpy (B, G, G) broadcast": lambda: numpy_dominance_dense(lo, hi),
            },
            baseline="numpy O(n^2) reference",
            target="advcal (numba) >= 10x faster than the numpy reference",
        ),
        Case(
            f"range_advantages probabilistic, dense {n_groups} x {width}",
            {
                "numpy O(n^2) reference": lambda: advcal.range_advantages(
                    lo, hi, relation="probabilistic", backend="numpy"),
                "advcal (numba), public call": lambda: advcal.range_advantages(
                    lo, hi, relation="probabilistic"),
            },
            baseline="numpy O(n^2) reference",
        ),
    ]
    sizes = rng.integers(2, 2 * width - 1, n_groups)  # ragged, mean ~64: the padded sort
    ragged_offsets = advcal.offsets_from_sizes(sizes)
    ragged_lo, ragged_hi = (v.reshape(-1) for v in _ranges(rng, 1, int(sizes.sum())))
    out.append(Case(
        f"range_advantages dominance, ragged {n_groups} groups of 2..{2 * width - 2}",
        {
            "numpy O(n^2) reference": lambda: advcal.range_advantages(
                ragged_lo, ragged_hi, ragged_offsets, backend="numpy"),
            "advcal (numba), public call": lambda: advcal.range_advantages(
                ragged_lo, ragged_hi, ragged_offsets),
        },
        baseline="numpy O(n^2) reference",
    ))
    grid = 200
    k = rng.integers(0, 50, grid)
    n = k + rng.integers(0, 500, grid)
    out.append(Case(
        f"ucb Clopper-Pearson over a grid of {grid} thresholds",
        {
            "python loop of scalar calls": lambda: [advcal.ucb(a, b, 0.05)
                                                    for a, b in zip(k, n, strict=True)],
            "advcal.ucb vectorized": lambda: advcal.ucb(k, n, 0.05),
        },
        baseline="python loop of scalar calls",
    ))
    return out
