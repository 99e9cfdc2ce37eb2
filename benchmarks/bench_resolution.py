"""maxnorm and resolve_rewards: whole calls and kernels against a plain numpy
implementation written here, at trainer batch sizes.

Targets: a whole ``maxnorm`` call at 512 x 16 within 15 us and within 0.25x the
numpy-vectorized peer; a whole ``resolve_rewards`` call at 512 x 16 within 15 us.  At
2**16 rewards the kernels and calls are printed as ratios to the numpy-vectorized peer
(the memory copy row is information only).  Each case checks first that the peers'
results equal advcal's (``check``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

import advcal
from advcal._kernels import maxnorm_numba
from benchmarks import Case, check_close, startup_notes, with_notes_later

TAU = 0.01
DELTA = 0.01


def numpy_maxnorm_dense(x: np.ndarray, tau: float = TAU) -> np.ndarray:
    """The direct numpy formulation on a dense batch (RLOO baseline)."""
    n = x.shape[1]
    u = (x - x.mean(axis=1, keepdims=True)) * (n / (n - 1))
    return u / np.maximum(np.abs(u).max(axis=1, keepdims=True), tau)


def numpy_maxnorm_ragged(x: np.ndarray, offsets: np.ndarray, tau: float = TAU) -> np.ndarray:
    """Segment statistics by ``reduceat``, broadcast back by ``np.repeat`` (groups of size
    >= 2: reduceat would return an empty group's next element)."""
    sizes = np.diff(offsets)
    starts = offsets[:-1]
    u = (x - np.repeat(np.add.reduceat(x, starts) / sizes, sizes)) * np.repeat(
        sizes / (sizes - 1), sizes)
    s = np.maximum(np.maximum.reduceat(np.abs(u), starts), tau)
    return u / np.repeat(s, sizes)


def numpy_bin(x: np.ndarray, lo: float = 0.0, hi: float = 1.0, delta: float = DELTA
              ) -> np.ndarray:
    if x.min() < lo or x.max() > hi:
        raise ValueError("out of bounds")
    inv = 1.0 / delta
    return np.minimum(lo + np.clip(np.rint((x - lo) * inv), 0.0, round((hi - lo) * inv)) / inv,
                      hi)


def numpy_resolve_dense(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = numpy_bin(x)
    return b, b.min(axis=1) != b.max(axis=1)


def numpy_resolve_ragged(x: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = numpy_bin(x)
    starts = offsets[:-1]
    return b, np.minimum.reduceat(b, starts) != np.maximum.reduceat(b, starts)


def binned(maxnorm: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """A MaxNorm peer on the binned rewards, as ``maxnorm(..., resolution=DELTA)``."""
    return maxnorm(numpy_bin(x))


def check(args: tuple[np.ndarray, ...], maxnorm: Callable[[np.ndarray], np.ndarray],
          resolve: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) -> str:
    """The peers ``maxnorm`` and ``resolve`` (of the rewards ``args[0]``) against advcal
    called on ``args``.

    Binned rewards use advcal's grid formula (the bin index divided by 1/delta): they and
    ``keep`` must be equal exactly.  MaxNorm sums at most n rewards in float64 in another
    order (advcal shifts by the group's first reward): u = (x - mean) n / (n - 1) differs by
    at most about 4 n eps64 max|x|, and u / s by twice that over s = max(max |u|, tau) >= tau.
    """
    x = args[0]
    ours = advcal.resolve_rewards(*args, resolution=DELTA)
    binned, keep = resolve(x)
    np.testing.assert_array_equal(binned, ours.rewards,
                                  err_msg="numpy_bin does not bin as advcal does")
    np.testing.assert_array_equal(keep, ours.keep, err_msg="keep differs from advcal's")
    n = x.shape[1] if x.ndim == 2 else int(np.diff(args[1]).max())
    atol = 16 * n * np.finfo(np.float64).eps * float(np.abs(x).max()) / TAU
    why = "float64 sums of <= n rewards in another order, over tau_res"
    check_close("numpy-vectorized peer = advcal.maxnorm", maxnorm(x),
                advcal.maxnorm(*args, tau_res=TAU), atol=atol, why=why)
    check_close("numpy-vectorized peer, resolution 0.01 = advcal.maxnorm(resolution=0.01)",
                maxnorm(numpy_bin(x)), advcal.maxnorm(*args, tau_res=TAU, resolution=DELTA),
                atol=atol, why=why)
    return (f"checked before timing: the peers' binned rewards and keep = advcal's exactly; "
            f"their maxnorm = advcal.maxnorm, with and without resolution, within atol "
            f"{atol:.0e} ({why})")


def _maxnorm_kernel(x: np.ndarray, offsets: np.ndarray, resolution: float = 0.0) -> object:
    inv = 1.0 / resolution if resolution else 0.0
    lo, hi = (0.0, 1.0) if resolution else (-math.inf, math.inf)
    # per_group=False: no per-group scale/keep, as the public call without return_scale
    return maxnorm_numba.maxnorm(x, offsets, TAU, True, 0.0, False, lo, hi, False, resolution,
                                 inv, round(inv), False, False)


def _resolve_kernel(x: np.ndarray, offsets: np.ndarray) -> object:
    return maxnorm_numba.resolve(x, offsets, 0.0, 1.0, False, DELTA, 1.0 / DELTA,
                                 round(1.0 / DELTA), False)


FIRST_MAXNORM = ("import numpy as np, advcal; "
                 "advcal.maxnorm(np.random.rand(512, 16), tau_res=0.01, resolution=0.01)")


def cases(quick: bool) -> list[Case]:
    rng = np.random.default_rng(0)
    small = rng.random((512, 16))
    first = Case(
        "maxnorm, dense 512 x 16, whole public call",
        {
            "advcal.maxnorm (numba)": lambda: advcal.maxnorm(small, tau_res=TAU),
            "numpy-vectorized peer": lambda: numpy_maxnorm_dense(small),
            "advcal.maxnorm, resolution 0.01": lambda: advcal.maxnorm(
                small, tau_res=TAU, resolution=DELTA),
            "numpy-vectorized peer, resolution 0.01": functools.partial(
                binned, numpy_maxnorm_dense, small),
            "memory copy": lambda: small.copy(),
        },
        baseline="numpy-vectorized peer",
        target="advcal.maxnorm <= 15 us and <= 0.25x numpy-vectorized peer",
        check=lambda: check((small,), numpy_maxnorm_dense, numpy_resolve_dense),
    )
    if not quick:  # fresh processes, only when the case is selected
        with_notes_later(first, lambda: startup_notes("maxnorm", FIRST_MAXNORM))
    out = [
        first,
        Case(
            "resolve_rewards, dense 512 x 16, whole public call",
            {
                "advcal.resolve_rewards (numba)": lambda: advcal.resolve_rewards(
                    small, resolution=DELTA),
                "numpy-vectorized peer": lambda: numpy_resolve_dense(small),
                "memory copy": lambda: small.copy(),
            },
            baseline="numpy-vectorized peer",
            target="advcal.resolve_rewards <= 15 us",
            check=lambda: check((small,), numpy_maxnorm_dense, numpy_resolve_dense),
        ),
    ]
    n = 1 << (12 if quick else 16)
    big = rng.random(n)
    dense = big.reshape(-1, 16)
    dense_offsets = np.arange(0, n + 1, 16, dtype=np.int64)
    sizes = rng.integers(2, 31, size=n // 16)
    sizes = sizes[np.cumsum(sizes) <= n]
    sizes[-1] += n - int(sizes.sum())
    ragged_offsets = advcal.offsets_from_sizes(sizes)
    exp = n.bit_length() - 1
    for layout, offsets, args in (("dense groups of 16", dense_offsets, (dense,)),
                                  ("ragged groups of 2..30", ragged_offsets,
                                   (big, ragged_offsets))):
        if len(args) == 1:
            peer_maxnorm, peer_resolve = numpy_maxnorm_dense, numpy_resolve_dense
        else:
            peer_maxnorm = functools.partial(numpy_maxnorm_ragged, offsets=ragged_offsets)
            peer_resolve = functools.partial(numpy_resolve_ragged, offsets=ragged_offsets)
        x = args[0]
        checked = functools.partial(check, args, peer_maxnorm, peer_resolve)
        out.append(Case(
            f"maxnorm, 2**{exp} float64 rewards, {layout}",
            {
                "numba kernel": functools.partial(_maxnorm_kernel, big, offsets),
                "numba kernel, resolution 0.01": functools.partial(
                    _maxnorm_kernel, big, offsets, DELTA),
                "advcal.maxnorm public call": functools.partial(advcal.maxnorm, *args,
                                                                tau_res=TAU),
                "numpy-vectorized peer": functools.partial(peer_maxnorm, x),
                "numpy-vectorized peer, resolution 0.01": functools.partial(
                    binned, peer_maxnorm, x),
                "memory copy": big.copy,
            },
            baseline="numpy-vectorized peer",
            check=checked,
        ))
        out.append(Case(
            f"resolve_rewards, 2**{exp} float64 rewards, {layout}",
            {
                "numba kernel": functools.partial(_resolve_kernel, big, offsets),
                "advcal.resolve_rewards public call": functools.partial(
                    advcal.resolve_rewards, *args, resolution=DELTA),
                "numpy-vectorized peer": functools.partial(peer_resolve, x),
                "memory copy": big.copy,
            },
            baseline="numpy-vectorized peer",
            check=checked,
        ))
    return out
