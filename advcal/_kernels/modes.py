"""Constants shared by the engines and their wrappers (mode codes, fast-math flags)."""

from __future__ import annotations

# How center_scale divides the centered rewards u of a group.
DR = 0  # u (Dr.GRPO)
GRPO = 1  # u / (std + eps)
RLOO = 2  # u * n / (n - 1)
FIXED = 3  # u / divisor, one divisor for the whole batch (batch_std, gpg)


# LLVM may reassociate sums (so it vectorizes them) and use reciprocals, but must keep
# NaN and inf semantics: the wrappers detect bad rewards by the NaN/inf they leave.
FASTMATH = frozenset({"reassoc", "nsz", "arcp", "contract"})

# Deviations ``(v - shift) - mean`` are taken by ``point_numba._minus``, a subtraction
# without "reassoc": with it LLVM rewrites them as ``v - (shift + mean)``, which rounds the
# mean of a near-constant group away (1 and 1 + 2**-52 would no longer center to sum 0).

# Deviations are rescaled to units of the group's largest one only outside these bounds,
# where their squares could under- or overflow float64 (``group_statistics``).
TINY, HUGE = 2.0 ** -400, 2.0 ** 400
