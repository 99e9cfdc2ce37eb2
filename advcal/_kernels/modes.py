"""Shared constants of the numba kernels (``pool.compile_serial`` compiles them)."""

from __future__ import annotations

# How center_scale divides the centered rewards u of a group.
DR = 0  # u (Dr.GRPO)
GRPO = 1  # u / (std + eps)
RLOO = 2  # u * n / (n - 1)
FIXED = 3  # u / divisor, one divisor for the whole batch (batch_std, gpg)


# LLVM may reassociate sums (so it vectorizes them) and use reciprocals, but must keep
# NaN and inf semantics: the wrappers detect bad rewards by the NaN/inf they leave.
FASTMATH = frozenset({"reassoc", "nsz", "arcp", "contract"})

# Kernels whose group loops are the masked intrinsics (``masked``) need no flag to
# vectorize and take none: with "reassoc", LLVM reassociated the intrinsics' sums
# differently in two compiled copies of one kernel (numba compiles one per argument types,
# e.g. read-only offsets), and dense and ragged calls differed in the last bit.
EXACT = frozenset[str]()
