"""grpo and rloo: whole calls and kernels against a plain numpy implementation written
here, at trainer batch sizes.

Targets: a whole ``grpo`` call at 512 x 16 within 15 us and within 0.25x the
numpy-vectorized peer.  At 2**16 rewards the kernels and calls are printed as ratios to
the numpy-vectorized peer (the memory copy row is information only).  Each case checks
first that the peer's advantages equal advcal's (``check``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

import advcal
from advcal._kernels import point_numba
from advcal._kernels.modes import GRPO, RLOO
from benchmarks import Case, check_close, startup_notes, with_notes_later

EPS = 1e-6  # grpo's eps, the default of advcal.grpo


def numpy_grpo_dense(x: np.ndarray, eps: float = EPS) -> np.ndarray:
    """The usual framework formulation (TRL/OpenRLHF style) on a dense batch."""
    mean = x.mean(axis=1, keepdims=True)
    return (x - mean) / (x.std(axis=1, ddof=1, keepdims=True) + eps)


def numpy_rloo_dense(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    return x - (x.sum(axis=1, keepdims=True) - x) / (n - 1)


def numpy_std_ragged(x: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Deviations from the group mean and the group std (ddof = 1): sums by
    ``np.add.reduceat``, broadcast back by ``np.repeat`` (groups of size >= 2: reduceat
    would return an empty group's next element)."""
    sizes = np.diff(offsets)
    starts = offsets[:-1]
    u = x - np.repeat(np.add.reduceat(x, starts) / sizes, sizes)
    return u, np.sqrt(np.add.reduceat(u * u, starts) / (sizes - 1))


def numpy_grpo_ragged(x: np.ndarray, offsets: np.ndarray, eps: float = EPS) -> np.ndarray:
    u, std = numpy_std_ragged(x, offsets)
    return u / np.repeat(std + eps, np.diff(offsets))


def numpy_rloo_ragged(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    sizes = np.diff(offsets)
    u = x - np.repeat(np.add.reduceat(x, offsets[:-1]) / sizes, sizes)
    return u * np.repeat(sizes / (sizes - 1), sizes)


def _kernel(x: np.ndarray, offsets: np.ndarray, mode: int) -> object:
    return point_numba.center_scale(x, offsets, mode, EPS, 1, False, False, 1.0, np.inf)


def check(name: str, peer: np.ndarray, ours: np.ndarray, x: np.ndarray,
          offsets: np.ndarray) -> str:
    """Peer against advcal.  Both sum at most n rewards in float64, in different orders
    (advcal shifts by the group's first reward): the deviations u and the std differ by
    about n * eps64 * max|x|; grpo divides by std + eps, so its difference can grow by
    (1 + |advantage| <= n) / (std + eps) of the group with the smallest std."""
    n = int(np.diff(offsets).max())
    error = 4 * n * np.finfo(np.float64).eps * float(np.abs(x).max())
    if name == "grpo":
        _, std = numpy_std_ragged(x.ravel(), offsets)
        return check_close("numpy-vectorized peer = advcal.grpo", peer, ours,
                           atol=error * (n + 1) / (float(std.min()) + EPS),
                           why="float64 sums of <= n rewards in another order, over the "
                               "smallest std + eps")
    return check_close("numpy-vectorized peer = advcal.rloo", peer, ours,
                       atol=2 * error, why="float64 sums of <= n rewards in another order")


def check_calls(name: str, peer: Callable[[], np.ndarray], ours: Callable[[], np.ndarray],
                x: np.ndarray, offsets: np.ndarray) -> str:
    return check(name, np.ravel(peer()), np.ravel(ours()), x, offsets)


def cases(quick: bool) -> list[Case]:
    rng = np.random.default_rng(0)
    small = rng.random((512, 16))
    small_offsets = np.arange(0, small.size + 1, 16, dtype=np.int64)
    first = Case(
        "grpo, dense 512 x 16, whole public call",
        {
            "advcal.grpo (numba)": lambda: advcal.grpo(small),
            "numpy-vectorized peer": lambda: numpy_grpo_dense(small),
            "memory copy": lambda: small.copy(),
        },
        baseline="numpy-vectorized peer",
        target="advcal.grpo <= 15 us and <= 0.25x numpy-vectorized peer",
        check=lambda: check("grpo", numpy_grpo_dense(small), advcal.grpo(small), small,
                            small_offsets),
    )
    if not quick:  # fresh processes, only when the case is selected
        with_notes_later(first, lambda: startup_notes(
            "grpo", "import numpy as np, advcal; advcal.grpo(np.random.rand(512, 16))"))
    out = [
        first,
        Case(
            "rloo, dense 512 x 16, whole public call",
            {
                "advcal.rloo (numba)": lambda: advcal.rloo(small),
                "numpy-vectorized peer": lambda: numpy_rloo_dense(small),
                "memory copy": lambda: small.copy(),
            },
            baseline="numpy-vectorized peer",
            check=lambda: check("rloo", numpy_rloo_dense(small), advcal.rloo(small), small,
                                small_offsets),
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
            ("dense groups of 16", dense_offsets, (dense,), functools.partial(peer_dense, dense)),
            ("ragged groups of 2..30", ragged_offsets, (big, ragged_offsets),
             functools.partial(peer_ragged, big, ragged_offsets)),
        ):
            ours = functools.partial(public, *args)
            out.append(Case(
                f"{name}, 2**{exp} float64 rewards, {layout}",
                {
                    "numba kernel": functools.partial(_kernel, big, offsets, mode),
                    f"advcal.{name} public call": ours,
                    "numpy-vectorized peer": peer,
                    "memory copy": big.copy,
                },
                baseline="numpy-vectorized peer",
                check=functools.partial(check_calls, name, peer, ours, big, offsets),
            ))
    return out
