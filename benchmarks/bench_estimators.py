"""grpo and rloo: whole calls and kernels against a numpy-vectorized peer and the numpy
reference engine, at trainer batch sizes.

Targets: a whole ``grpo`` call at 512 x 16 within 15 us and within 0.25x the
numpy-vectorized peer.  At 2**16 rewards the ratio to the numpy reference engine is printed
(the memory copy row is information only).
"""

from __future__ import annotations

import numpy as np

import advcal
from advcal._kernels import point_numba
from advcal._kernels.modes import GRPO, RLOO
from benchmarks import Case, startup_notes


def numpy_grpo_dense(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """The usual framework formulation (TRL/OpenRLHF style) on a dense batch."""
    mean = x.mean(axis=1, keepdims=True)
    return (x - mean) / (x.std(axis=1, ddof=1, keepdims=True) + eps)


def numpy_rloo_dense(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    return x - (x.sum(axis=1, keepdims=True) - x) / (n - 1)


def numpy_grpo_ragged(x: np.ndarray, offsets: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Vectorized segment statistics with bincount (groups of size >= 2)."""
    sizes = np.diff(offsets)
    codes = np.repeat(np.arange(sizes.size), sizes)
    mean = np.bincount(codes, x, sizes.size) / sizes
    u = x - mean[codes]
    std = np.sqrt(np.bincount(codes, u * u, sizes.size) / (sizes - 1))
    return u / (std + eps)[codes]


def numpy_rloo_ragged(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    sizes = np.diff(offsets)
    codes = np.repeat(np.arange(sizes.size), sizes)
    mean = np.bincount(codes, x, sizes.size) / sizes
    return (x - mean[codes]) * (sizes / (sizes - 1))[codes]


def _kernel(x: np.ndarray, offsets: np.ndarray, mode: int) -> object:
    return point_numba.center_scale(x, offsets, mode, 1e-6, 1, False, False, 1.0, np.inf)


def cases(quick: bool) -> list[Case]:
    rng = np.random.default_rng(0)
    small = rng.random((512, 16))
    out = [
        Case(
            "grpo, dense 512 x 16, whole public call",
            {
                "advcal.grpo (numba)": lambda: advcal.grpo(small),
                "numpy-vectorized peer": lambda: numpy_grpo_dense(small),
                "advcal.grpo (backend='numpy')": lambda: advcal.grpo(small, backend="numpy"),
                "memory copy": lambda: small.copy(),
            },
            baseline="numpy-vectorized peer",
            target="advcal.grpo <= 15 us and <= 0.25x numpy-vectorized peer",
            notes=[] if quick else startup_notes(
                "grpo", "import numpy as np, advcal; advcal.grpo(np.random.rand(512, 16))"),
        ),
        Case(
            "rloo, dense 512 x 16, whole public call",
            {
                "advcal.rloo (numba)": lambda: advcal.rloo(small),
                "numpy-vectorized peer": lambda: numpy_rloo_dense(small),
                "memory copy": lambda: small.copy(),
            },
            baseline="numpy-vectorized peer",
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
    for name, public, mode, peer_dense, peer_ragged in (
        ("grpo", advcal.grpo, GRPO, numpy_grpo_dense, numpy_grpo_ragged),
        ("rloo", advcal.rloo, RLOO, numpy_rloo_dense, numpy_rloo_ragged),
    ):
        for layout, offsets, args, peer in (
            ("dense groups of 16", dense_offsets, (dense,), lambda f=peer_dense: f(dense)),
            ("ragged groups of 2..30", ragged_offsets, (big, ragged_offsets),
             lambda f=peer_ragged: f(big, ragged_offsets)),
        ):
            out.append(Case(
                f"{name}, 2**{exp} float64 rewards, {layout}",
                {
                    "numpy reference engine": lambda f=public, a=args: f(*a, backend="numpy"),
                    "numba kernel": lambda m=mode, o=offsets: _kernel(big, o, m),
                    f"advcal.{name} public call": lambda f=public, a=args: f(*a),
                    "numpy-vectorized peer": peer,
                    "memory copy": lambda: big.copy(),
                },
                baseline="numpy reference engine",
            ))
    return out
