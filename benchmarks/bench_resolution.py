"""maxnorm and resolve_rewards: whole calls and kernels against a numpy-vectorized peer and
the numpy reference engine, at trainer batch sizes.

Targets: a whole ``maxnorm`` call at 512 x 16 within 15 us and within 0.25x the
numpy-vectorized peer.  At 2**16 rewards the ratio to the numpy reference engine is printed
(the memory copy row is information only).
"""

from __future__ import annotations

import math

import numpy as np

import advcal
from advcal._kernels import maxnorm_numba
from benchmarks import Case, startup_notes

TAU = 0.01
DELTA = 0.01


def numpy_maxnorm_dense(x: np.ndarray, tau: float = TAU) -> np.ndarray:
    """The direct numpy formulation on a dense batch (RLOO baseline)."""
    n = x.shape[1]
    u = (x - x.mean(axis=1, keepdims=True)) * (n / (n - 1))
    return u / np.maximum(np.abs(u).max(axis=1, keepdims=True), tau)


def numpy_maxnorm_ragged(x: np.ndarray, offsets: np.ndarray, tau: float = TAU) -> np.ndarray:
    """Vectorized segment statistics with bincount and reduceat (groups of size >= 2)."""
    sizes = np.diff(offsets)
    codes = np.repeat(np.arange(sizes.size), sizes)
    mean = np.bincount(codes, x, sizes.size) / sizes
    u = (x - mean[codes]) * (sizes / (sizes - 1))[codes]
    s = np.maximum(np.maximum.reduceat(np.abs(u), offsets[:-1]), tau)
    return u / s[codes]


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
    out = [
        Case(
            "maxnorm, dense 512 x 16, whole public call",
            {
                "advcal.maxnorm (numba)": lambda: advcal.maxnorm(small, tau_res=TAU),
                "numpy-vectorized peer": lambda: numpy_maxnorm_dense(small),
                "advcal.maxnorm (backend='numpy')": lambda: advcal.maxnorm(
                    small, tau_res=TAU, backend="numpy"),
                "advcal.maxnorm, resolution 0.01": lambda: advcal.maxnorm(
                    small, tau_res=TAU, resolution=DELTA),
                "memory copy": lambda: small.copy(),
            },
            baseline="numpy-vectorized peer",
            target="advcal.maxnorm <= 15 us and <= 0.25x numpy-vectorized peer",
            notes=[] if quick else startup_notes("maxnorm", FIRST_MAXNORM),
        ),
        Case(
            "resolve_rewards, dense 512 x 16, whole public call",
            {
                "advcal.resolve_rewards (numba)": lambda: advcal.resolve_rewards(
                    small, resolution=DELTA),
                "numpy-vectorized peer": lambda: numpy_resolve_dense(small),
                "advcal.resolve_rewards (backend='numpy')": lambda: advcal.resolve_rewards(
                    small, resolution=DELTA, backend="numpy"),
                "memory copy": lambda: small.copy(),
            },
            baseline="numpy-vectorized peer",
            target="advcal.resolve_rewards <= 15 us",
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
    for layout, offsets, peer_maxnorm, peer_resolve, args in (
        ("dense groups of 16", dense_offsets, lambda: numpy_maxnorm_dense(dense),
         lambda: numpy_resolve_dense(dense), (dense,)),
        ("ragged groups of 2..30", ragged_offsets,
         lambda: numpy_maxnorm_ragged(big, ragged_offsets),
         lambda: numpy_resolve_ragged(big, ragged_offsets), (big, ragged_offsets)),
    ):
        out.append(Case(
            f"maxnorm, 2**{exp} float64 rewards, {layout}",
            {
                "numpy reference engine": lambda a=args: advcal.maxnorm(
                    *a, tau_res=TAU, backend="numpy"),
                "numba kernel": lambda o=offsets: _maxnorm_kernel(big, o),
                "numba kernel, resolution 0.01": lambda o=offsets: _maxnorm_kernel(
                    big, o, DELTA),
                "advcal.maxnorm public call": lambda a=args: advcal.maxnorm(*a, tau_res=TAU),
                "numpy-vectorized peer": peer_maxnorm,
                "memory copy": lambda: big.copy(),
            },
            baseline="numpy reference engine",
        ))
        out.append(Case(
            f"resolve_rewards, 2**{exp} float64 rewards, {layout}",
            {
                "numpy reference engine": lambda a=args: advcal.resolve_rewards(
                    *a, resolution=DELTA, backend="numpy"),
                "numba kernel": lambda o=offsets: _resolve_kernel(big, o),
                "advcal.resolve_rewards public call": lambda a=args: (
                    advcal.resolve_rewards(*a, resolution=DELTA)),
                "numpy-vectorized peer": peer_resolve,
                "memory copy": lambda: big.copy(),
            },
            baseline="numpy reference engine",
        ))
    return out
