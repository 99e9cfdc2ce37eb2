"""Shared constants of the kernels and the helper that compiles them (numba imported lazily)."""

from __future__ import annotations

import types
from typing import Any

# How center_scale divides the centered rewards u of a group.
DR = 0  # u (Dr.GRPO)
GRPO = 1  # u / (std + eps)
RLOO = 2  # u * n / (n - 1)
FIXED = 3  # u / divisor, one divisor for the whole batch (batch_std, gpg)


# LLVM may reassociate sums (so it vectorizes them) and use reciprocals, but must keep
# NaN and inf semantics: the wrappers detect bad rewards by the NaN/inf they leave.
FASTMATH = frozenset({"reassoc", "nsz", "arcp", "contract"})
# Evaluation exactly in the order written (fused multiply-adds aside): for kernels whose
# guarantees rest on the order, e.g. exact zeros from exact deviations.
STRICT_FASTMATH = frozenset({"nsz", "contract"})


def compile_pair(loop: Any, fastmath: frozenset[str] = FASTMATH) -> tuple[Any, Any]:
    """Compile one plain loop function twice: serially and with ``prange`` threads.

    The copies get distinct qualified names because numba's on-disk cache is keyed by
    them.  ``error_model="numpy"`` lets x / 0 give inf/nan instead of raising inside the
    kernel; the wrappers guarantee no such division reaches the output.
    """
    from numba import njit

    def renamed(suffix: str) -> types.FunctionType:
        fn = types.FunctionType(
            loop.__code__, loop.__globals__, loop.__name__ + suffix, loop.__defaults__,
            loop.__closure__,
        )
        fn.__qualname__ = loop.__qualname__ + suffix
        return fn

    flags = set(fastmath)
    serial = njit(cache=True, error_model="numpy", fastmath=flags)(renamed("_serial"))
    parallel = njit(cache=True, error_model="numpy", fastmath=flags, parallel=True)(
        renamed("_parallel"))
    return serial, parallel
