"""Split-conformal toolkit: the exact finite-sample quantile and conformal reward ranges.

DESIGN §4.  The quantile of m calibration scores at level α is the k-th smallest score
with k = ⌈(m+1)(1−α)⌉, and +∞ when k > m.  The rank is computed in exact rational
arithmetic and snapped to an integer within 1e-9, so that α means the decimal the user
wrote (see ``docs/conformal.md``).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from advcal._validation import as_float_array, check_int, check_real

__all__ = ["conformal_rank", "conformal_quantile"]

# (m+1)(1-α) closer than this to an integer is that integer: float α = 0.7 is a hair
# above 7/10, and (m+1)(1-α) would otherwise overshoot an integer and add one rank.
_SNAP = Fraction(1, 10**9)


def _check_alpha(alpha: Any) -> float:
    return check_real(alpha, "alpha", low=0.0, high=1.0, low_inclusive=False,
                      high_inclusive=False)


def _rank(m: int, alpha: float) -> int:
    # Fraction(alpha) is the exact binary value of the float: the product has no
    # rounding error, only the representation error of α itself (< 2**-53 relative).
    target = (m + 1) * (1 - Fraction(alpha))
    nearest = round(target)
    if abs(target - nearest) <= _SNAP:
        return int(nearest)
    return math.ceil(target)


def conformal_rank(m: int, alpha: float) -> int:
    """The split-conformal rank ``k = ceil((m + 1) * (1 - alpha))`` without float overshoot.

    Parameters
    ----------
    m : int
        Number of calibration scores, ``m >= 1``.
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    int
        The rank k (1-based) of the conformal quantile among the sorted scores; ``k > m``
        means the quantile is +inf.  ``(m + 1) * (1 - alpha)`` is evaluated exactly and
        taken as an integer when it lies within 1e-9 of one.

    Examples
    --------
    >>> from advcal import conformal_rank
    >>> conformal_rank(9, 0.7)  # float arithmetic: ceil(3.0000000000000004) = 4
    3
    >>> conformal_rank(74, 1 - 0.68)
    51
    >>> conformal_rank(5, 0.1)  # > m: the quantile is +inf
    6
    """
    m = check_int(m, "m")
    if m < 1:
        raise ValueError(f"`m` must be at least 1; got {m}.")
    return _rank(m, _check_alpha(alpha))


def _quantile_iv(scores: ArrayLike, alpha: Any) -> tuple[np.ndarray, float]:
    arr = as_float_array(scores, "scores")
    if arr.ndim != 1:
        raise ValueError(f"`scores` must be 1-D; got shape {arr.shape}.")
    if arr.size == 0:
        raise ValueError("`scores` must hold at least one calibration score; got none.")
    if np.isnan(arr).any():
        raise ValueError("`scores` contain NaN; a conformal score must be comparable.")
    return arr, _check_alpha(alpha)


def _kth_smallest(scores: np.ndarray, k: int) -> float:
    if k > scores.size:
        return math.inf
    return float(np.partition(scores, k - 1)[k - 1])


def conformal_quantile(scores: ArrayLike, alpha: float) -> float:
    """Split-conformal quantile of calibration scores: the ⌈(m+1)(1−α)⌉-th smallest.

    If the test score is exchangeable with the m calibration scores, it is at most
    the returned value with probability at least ``1 - alpha`` (and at most
    ``1 - alpha + 1 / (m + 1)`` when scores have no ties).

    Parameters
    ----------
    scores : array_like, shape (m,)
        Nonconformity scores of the calibration set; ``m >= 1``, no NaN.  Infinite
        scores are allowed (a +inf score is never covered by a finite quantile).
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    float
        The k-th smallest score with k = :func:`conformal_rank` ``(m, alpha)``, or
        ``inf`` when k > m (too few scores for level ``alpha``).

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import conformal_quantile
    >>> scores = np.arange(1.0, 10.0)  # m = 9
    >>> conformal_quantile(scores, 0.7)  # k = ceil(10 * 0.3) = 3
    3.0
    >>> conformal_quantile(scores, 0.05)  # k = 10 > m
    inf
    """
    arr, alpha = _quantile_iv(scores, alpha)
    return _kth_smallest(arr, _rank(arr.size, alpha))
