"""Range-GRPO: advantages from pairwise relations among reward ranges (``docs/ranges.md``).

Each response i has a reward range I_i = [l_i, h_i] (conformal ranges from
:func:`advcal.calibrate_ranges`, or a degenerate [y, y] for a labeled response).  With an
antisymmetric relation φ that equals r_i − r_j on points, the advantage
A_i = (1/n) Σ_j φ(I_i, I_j) sums to zero in each group and equals the Dr.GRPO advantage
r_i − r̄ when every range is a point.  :mod:`advcal.registry` lists it as ``"range"``
(see ``docs/ranges.md``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from advcal._kernels import engine
from advcal._validation import BACKENDS, Batch, as_batch, as_float_array, check_choice

__all__ = ["RELATIONS", "range_advantages"]

RELATIONS = ("dominance", "midpoint", "probabilistic")




def _position(batch: Batch, i: int) -> str:
    """The caller's index of grouped position ``i``, for error messages."""
    if batch.shape is not None:
        return ", ".join(str(int(v)) for v in np.unravel_index(i, batch.shape))
    if batch.order is not None:
        return str(int(batch.order[i]))
    return str(i)


def _too_large(dtype: np.dtype) -> ValueError:
    return ValueError(
        f"`lo` and `hi` are too large: the advantages overflow {dtype} (rescale the rewards)."
    )


def _range_iv(
    lo: ArrayLike, hi: ArrayLike, offsets: ArrayLike | None, group_ids: ArrayLike | None,
    relation: Any, backend: Any,
) -> tuple[Batch, np.ndarray, np.ndarray, int, np.dtype, ModuleType]:
    code = RELATIONS.index(check_choice(relation, "relation", RELATIONS))
    check_choice(backend, "backend", BACKENDS)
    for value, name in ((lo, "lo"), (hi, "hi")):
        if value is None:
            raise TypeError(f"`{name}` must be an array of range bounds; got None.")
    hi_arr = as_float_array(hi, "hi")
    batch = as_batch(lo, offsets, group_ids, name="lo")
    upper = batch.gather(hi_arr, "hi")
    lower = np.asarray(batch.values, dtype=np.float64)
    if not (np.isfinite(lower).all() and np.isfinite(upper).all()):
        name = "lo" if not np.isfinite(lower).all() else "hi"
        raise ValueError(f"`{name}` must be finite.")
    crossed = lower > upper
    if crossed.any():
        i = int(np.flatnonzero(crossed)[0])
        where = _position(batch, i)
        raise ValueError(
            f"`lo` must not exceed `hi`; got lo[{where}] = {float(lower[i])!r} > "
            f"hi[{where}] = {float(upper[i])!r}."
        )
    # Every difference the kernels form is at most the batch's spread: if that is
    # finite, no intermediate overflows (a sum of n of them is checked at the end).
    with np.errstate(over="ignore"):
        spread = upper.max() - lower.min() if lower.size else 0.0
    if not np.isfinite(spread):
        raise _too_large(np.dtype(np.float64))
    both32 = batch.values.dtype == np.float32 and hi_arr.dtype == np.float32
    dtype = np.dtype(np.float32 if both32 else np.float64)
    return batch, lower, upper, code, dtype, engine("ranges", backend)


def range_advantages(
    lo: ArrayLike,
    hi: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    relation: str = "dominance",
    backend: str = "numba",
) -> np.ndarray:
    """Range-GRPO advantages ``A_i = (1/n) Σ_j φ(I_i, I_j)`` from reward ranges.

    Relations, for ranges I = [l, h] with midpoints m = (l + h) / 2:

    * ``"dominance"``: φ = (l_i − h_j)₊ − (l_j − h_i)₊, the gap that holds for every
      reward in the two ranges; overlapping ranges give no direction.  Widening a
      range never increases any |φ|.  O(n log n) per group.
    * ``"midpoint"``: φ = m_i − m_j (the point baseline on midpoints).
    * ``"probabilistic"``: φ = (m_i − m_j)·|P(R_i > R_j) − P(R_j > R_i)|, R_i and R_j
      independent and uniform on their ranges (a degenerate range is a point mass),
      in closed form (``docs/ranges.md``).  O(n²) per group.

    Every relation is antisymmetric and equals r_i − r_j on points, so each group's
    advantages sum to zero and degenerate ranges give the Dr.GRPO advantages.

    Parameters
    ----------
    lo, hi : array_like, shape (B, G) or (N,)
        Lower and upper range bounds, finite, ``lo <= hi`` elementwise, same shape.
        2-D rows are groups; 1-D needs ``offsets`` or ``group_ids``.
    offsets : array_like of int, shape (B + 1,), optional
        CSR group boundaries for 1-D ranges.
    group_ids : sequence of hashable, length N, optional
        Per-response group labels for 1-D ranges, any order.
    relation : {"dominance", "midpoint", "probabilistic"}, default "dominance"
        The pairwise relation φ.
    backend : {"numba", "numpy"}, default "numba"
        Compiled kernels or the O(n²) numpy reference.

    Returns
    -------
    ndarray
        Advantages in the layout and order of ``lo``; float32 if ``lo`` and ``hi`` are
        both float32, else float64.  A group of one response gets 0.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import range_advantages
    >>> lo = np.array([[0.0, 0.5, 0.9]])
    >>> hi = np.array([[0.2, 0.7, 1.0]])
    >>> range_advantages(lo, hi)
    array([[-0.333333,  0.033333,  0.3     ]])
    >>> range_advantages(lo, hi, relation="midpoint")
    array([[-0.45,  0.05,  0.4 ]])

    Points collapse to Dr.GRPO; overlapping ranges give no direction:

    >>> range_advantages([0.0, 1.0, 0.2, 0.5], [0.0, 1.0, 0.6, 0.9], offsets=[0, 2, 4])
    array([-0.5,  0.5,  0. ,  0. ])
    """
    batch, lower, upper, code, dtype, engine = _range_iv(lo, hi, offsets, group_ids,
                                                          relation, backend)
    out = engine.range_advantages(lower, upper, batch.offsets, code)
    with np.errstate(over="ignore"):
        out = out.astype(dtype, copy=False)
    if not np.isfinite(out).all():
        raise _too_large(dtype)
    return batch.restore(out)
