"""range_advantages and ucb: compiled kernels against plain numpy implementations written
here.

The peers: the whole dense batch as one (B, G, G) broadcast for the dominance relation;
ragged groups bucketed by size, each bucket one such broadcast; the probabilistic relation
as (chunk, G, G) broadcasts of its closed form.  ``ucb``: one vectorized call against
scipy's closed form (and a Python loop of scalar calls, for information).  Each case checks
first that the peer's result equals advcal's (``check``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import advcal
from advcal._kernels import ranges_numba
from advcal._kernels.pool import run_over_groups
from benchmarks import Case, check_close

EPS = np.finfo(np.float64).eps


def numpy_dominance_dense(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """A_i = (1/n) sum_j [(l_i - h_j)+ - (l_j - h_i)+]: the whole batch as one (B, G, G)
    broadcast, O(n²) memory, no Python loop."""
    ahead = np.maximum(lo[:, :, None] - hi[:, None, :], 0.0)
    return (ahead.sum(axis=2) - ahead.sum(axis=1)) / lo.shape[1]


def numpy_order(li: np.ndarray, hi_: np.ndarray, lj: np.ndarray, hj: np.ndarray
                ) -> np.ndarray:
    """P(R_i > R_j) - P(R_j > R_i) for independent R_i ~ U[li, hi_], R_j ~ U[lj, hj]
    (broadcast).  Unless both are points, P(R_i = R_j) = 0, so this is 2 P(R_i > R_j) - 1,
    and P(R_i > R_j) integrates P(R_i > y) over y in [lj, hj]: 1 for y < li, (hi_ - y) / w_i
    on [li, hi_]; for a point R_j = lj it is P(R_i > lj).  Two points compare by sign."""
    wi, wj = hi_ - li, hj - lj
    with np.errstate(divide="ignore", invalid="ignore"):  # branches np.where discards
        below = np.clip(np.minimum(hj, li) - lj, 0.0, None)  # y < li: P = 1
        a, b = np.maximum(lj, li), np.minimum(hj, hi_)  # y in [a, b]: P = (hi_ - y) / wi
        ramp = np.where(b > a, (b - a) / wi * (0.5 * ((hi_ - a) + (hi_ - b))), 0.0)
        p = np.where(wj > 0.0, (below + ramp) / wj, np.clip((hi_ - lj) / wi, 0.0, 1.0))
    return np.where((wi == 0.0) & (wj == 0.0), np.sign(li - lj), 2.0 * p - 1.0)


def numpy_probabilistic_dense(lo: np.ndarray, hi: np.ndarray, rows: int = 256
                              ) -> np.ndarray:
    """A_i = (1/n) sum_j (m_i - m_j) |P(R_i > R_j) - P(R_j > R_i)|, in chunks of ``rows``
    groups so that the (chunk, G, G) temporaries stay a few MiB each."""
    out = np.empty_like(lo)
    for start in range(0, lo.shape[0], rows):
        chunk = slice(start, start + rows)
        order = numpy_order(lo[chunk, :, None], hi[chunk, :, None], lo[chunk, None, :],
                            hi[chunk, None, :])
        mid = 0.5 * (lo[chunk] + hi[chunk])
        out[chunk] = ((mid[:, :, None] - mid[:, None, :]) * np.abs(order)).mean(axis=2)
    return out


def scipy_clopper_pearson(k: np.ndarray, n: np.ndarray, delta: float) -> np.ndarray:
    """The Clopper-Pearson UCB in closed form: the (1 - delta) quantile of
    Beta(k + 1, n - k), 1 where k = n."""
    from scipy.stats import beta

    with np.errstate(invalid="ignore"):  # k = n: replaced by 1
        return np.where(k == n, 1.0, beta.ppf(1.0 - delta, k + 1, np.maximum(n - k, 1)))


def numpy_by_size(dense: Callable[[np.ndarray, np.ndarray], np.ndarray], lo: np.ndarray,
                  hi: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A dense peer on ragged groups: the groups of each size gathered into one (B_n, n)
    batch (a loop over the distinct sizes, not over the groups)."""
    sizes = np.diff(offsets)
    out = np.zeros_like(lo)
    for n in np.unique(sizes[sizes > 0]):
        rows = offsets[:-1][sizes == n, None] + np.arange(n)
        out[rows] = dense(lo[rows], hi[rows])
    return out


def check(relation: str, peer: np.ndarray, lo: np.ndarray, hi: np.ndarray,
          offsets: np.ndarray | None = None) -> str:
    """Peer against advcal.  Dominance: both sum at most n gaps of size <= the span of the
    rewards, in another order (advcal by sorted prefix sums after a shift by the group's
    first l): a difference of about 4 n eps64 times the largest |reward|.  Probabilistic:
    P(R_i > R_j) reads (l_i - l_j) / w_j, whose rounding is eps64 max|reward| / w_j, so the
    tolerance grows as the smallest positive width shrinks."""
    ours = advcal.range_advantages(lo, hi, offsets, relation=relation)
    n = lo.shape[-1] if offsets is None else int(np.diff(offsets).max())
    scale = float(max(np.abs(lo).max(), np.abs(hi).max()))
    if relation == "dominance":
        return check_close("peer = advcal.range_advantages", peer, ours,
                           atol=4 * n * EPS * scale,
                           why="float64 sums of <= n gaps in another order")
    width = hi - lo
    return check_close("peer = advcal.range_advantages(relation='probabilistic')", peer,
                       ours, atol=64 * EPS * scale * scale / float(width[width > 0].min()),
                       why="closed forms read l_i - l_j over the smallest positive width")


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
                "advcal (numba), public call": lambda: advcal.range_advantages(lo, hi),
                "numba engine (sorts + kernel)": lambda: ranges_numba.range_advantages(
                    flat_lo, flat_hi, offsets, 0),
                "numba kernel only, one thread": lambda: dominance_kernel(threaded=False),
                "numba kernel only, threads by size": lambda: dominance_kernel(threaded=None),
                "numpy (B, G, G) broadcast": lambda: numpy_dominance_dense(lo, hi),
            },
            baseline="numpy (B, G, G) broadcast",
            check=lambda: check("dominance", numpy_dominance_dense(lo, hi), lo, hi),
        ),
        Case(
            f"range_advantages probabilistic, dense {n_groups} x {width}",
            {
                "advcal (numba), public call": lambda: advcal.range_advantages(
                    lo, hi, relation="probabilistic"),
                "numpy (256, G, G) broadcasts": lambda: numpy_probabilistic_dense(lo, hi),
            },
            baseline="numpy (256, G, G) broadcasts",
            check=lambda: check("probabilistic", numpy_probabilistic_dense(lo, hi), lo, hi),
        ),
    ]
    sizes = rng.integers(2, 2 * width - 1, n_groups)  # ragged, mean ~64: the padded sort
    ragged_offsets = advcal.offsets_from_sizes(sizes)
    ragged_lo, ragged_hi = (v.reshape(-1) for v in _ranges(rng, 1, int(sizes.sum())))
    out.append(Case(
        f"range_advantages dominance, ragged {n_groups} groups of 2..{2 * width - 2}",
        {
            "advcal (numba), public call": lambda: advcal.range_advantages(
                ragged_lo, ragged_hi, ragged_offsets),
            "numpy broadcast per group size": lambda: numpy_by_size(
                numpy_dominance_dense, ragged_lo, ragged_hi, ragged_offsets),
        },
        baseline="numpy broadcast per group size",
        check=lambda: check("dominance", numpy_by_size(
            numpy_dominance_dense, ragged_lo, ragged_hi, ragged_offsets), ragged_lo,
            ragged_hi, ragged_offsets),
    ))
    grid = 200
    k = rng.integers(0, 50, grid)
    n = k + rng.integers(0, 500, grid)
    out.append(Case(
        f"ucb Clopper-Pearson over a grid of {grid} thresholds",
        {
            "advcal.ucb vectorized": lambda: advcal.ucb(k, n, 0.05),
            "python loop of scalar advcal.ucb calls": lambda: [
                advcal.ucb(a, b, 0.05) for a, b in zip(k, n, strict=True)],
            "scipy beta.ppf (closed form)": lambda: scipy_clopper_pearson(k, n, 0.05),
        },
        baseline="scipy beta.ppf (closed form)",
        check=lambda: check_close(
            "scipy beta.ppf = advcal.ucb", scipy_clopper_pearson(k, n, 0.05),
            advcal.ucb(k, n, 0.05), atol=0.0, rtol=1e-12,
            why="scipy's inverse incomplete beta is accurate to about 1e-14 relative; "
                "advcal's is the smallest float whose p-value is <= delta"),
    ))
    return out
