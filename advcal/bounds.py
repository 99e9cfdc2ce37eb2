"""Upper confidence bounds and p-values for a risk estimated from k losses in n trials.

DESIGN §6.4.  Every function broadcasts over arrays of ``k`` and ``n`` (and of the level),
so one call bounds a whole threshold grid.  ``n = 0`` is the *vacuous* case: no
evidence, UCB 1 and p-value 1.  scipy is imported inside the functions (a 1.2 s import).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from advcal._validation import check_choice

__all__ = ["BOUNDS", "ucb", "risk_p_value"]

BOUNDS = ("clopper-pearson", "hoeffding", "bentkus", "hoeffding-bentkus")


def _as_counts(values: Any, name: str) -> np.ndarray:
    """Integer-valued counts as int64: integer dtypes, or floats holding whole numbers."""
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"`{name}` must be an array of integers ({exc}).") from None
    if arr.dtype.kind in "iu" and arr.dtype != np.bool_:
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise ValueError(f"`{name}` must fit in int64.")
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError(f"`{name}` must be finite.")
        if (arr != np.floor(arr)).any():
            raise ValueError(f"`{name}` must hold whole numbers; got a fractional count.")
        if arr.size and float(np.abs(arr).max()) >= 2.0**53:  # float16: no cast of 2**53
            raise ValueError(f"`{name}` must be below 2**53.")
        return arr.astype(np.int64)
    raise TypeError(f"`{name}` must be an array of integers; got dtype {arr.dtype}.")


def _as_level(values: Any, name: str) -> np.ndarray:
    """A probability level (scalar or array) strictly inside (0, 1), as float64."""
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"`{name}` must be a real number or array ({exc}).") from None
    if arr.dtype.kind not in "iuf" or arr.dtype == np.bool_:
        raise TypeError(f"`{name}` must be a real number or array; got dtype {arr.dtype}.")
    arr = arr.astype(np.float64)
    if not ((arr > 0.0) & (arr < 1.0)).all():
        bad = float(arr[~((arr > 0.0) & (arr < 1.0))].flat[0])
        raise ValueError(f"`{name}` must lie in (0, 1); got {bad!r}.")
    return arr


def _counts_iv(
    k: ArrayLike, n: ArrayLike, level: ArrayLike, level_name: str, bound: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    check_choice(bound, "bound", BOUNDS)
    k_arr = _as_counts(k, "k")
    n_arr = _as_counts(n, "n")
    lev = _as_level(level, level_name)
    try:
        k_arr, n_arr, lev = np.broadcast_arrays(k_arr, n_arr, lev)
    except ValueError:
        raise ValueError(
            f"`k`, `n` and `{level_name}` must broadcast together; got shapes "
            f"{np.shape(k_arr)}, {np.shape(n_arr)} and {np.shape(lev)}."
        ) from None
    if (n_arr < 0).any():
        raise ValueError("`n` must be non-negative.")
    if (k_arr < 0).any() or (k_arr > n_arr).any():
        raise ValueError("`k` must satisfy 0 <= k <= n.")
    return k_arr, n_arr, lev


def _scalar_or_array(out: np.ndarray) -> Any:
    return float(out) if out.ndim == 0 else out


def _beta_ucb(k: np.ndarray, n: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """R with P(Bin(n, R) <= k) = delta: the (1 - delta) quantile of Beta(k+1, n-k)."""
    from scipy import stats

    out = np.ones(k.shape)
    some = k < n  # k = n (n = 0 included): every risk up to 1 is consistent
    # isf(delta) rather than ppf(1 - delta): no cancellation for tiny delta.
    out[some] = stats.beta.isf(delta[some], k[some] + 1, n[some] - k[some])
    return out


def _hoeffding_ucb(k: np.ndarray, n: np.ndarray, delta: np.ndarray) -> np.ndarray:
    out = np.ones(k.shape)
    some = n > 0
    ns = n[some].astype(np.float64)
    out[some] = np.minimum(1.0, k[some] / ns + np.sqrt(np.log(1.0 / delta[some]) / (2.0 * ns)))
    return out


def ucb(
    k: ArrayLike,
    n: ArrayLike,
    delta: ArrayLike,
    *,
    bound: str = "clopper-pearson",
) -> Any:
    """Upper confidence bound at level ``1 - delta`` on a risk with ``k`` losses in ``n``.

    If ``k ~ Binomial(n, R)``, then ``R <= ucb(k, n, delta)`` with probability at least
    ``1 - delta``.

    Parameters
    ----------
    k : array_like of int
        Number of losses (reversals), ``0 <= k <= n``.  Floats holding whole numbers
        are accepted.
    n : array_like of int
        Number of trials (accepted groups), ``n >= 0``.  ``n = 0`` gives the vacuous
        bound 1.
    delta : float or array_like
        Error level in (0, 1); broadcasts with ``k`` and ``n``.
    bound : {"clopper-pearson", "hoeffding", "bentkus", "hoeffding-bentkus"}
        ``"clopper-pearson"``: the exact binomial bound ``beta.ppf(1 - delta, k + 1,
        n - k)`` (1 when k = n).  ``"hoeffding"``: ``k / n + sqrt(log(1 / delta) /
        (2 n))``, capped at 1.  ``"bentkus"``: the Clopper-Pearson bound at level
        ``delta / e``.  ``"hoeffding-bentkus"``: the smaller of the two.

    Returns
    -------
    float or ndarray
        Bounds in [0, 1] (at least k/n when ``delta <= 0.5``), float64, of the
        broadcast shape of the inputs (a Python float for scalar inputs).

    Examples
    --------
    >>> from advcal import ucb
    >>> ucb(0, 10, 0.05)  # 1 - 0.05 ** (1 / 10)
    0.2588656
    >>> ucb([0, 5, 10], 10, 0.05, bound="hoeffding")
    array([0.3870228, 0.8870228, 1.       ])
    >>> ucb(0, 0, 0.1)  # no trials: vacuous
    1.0
    """
    k_arr, n_arr, delta_arr = _counts_iv(k, n, delta, "delta", bound)
    if bound == "clopper-pearson":
        out = _beta_ucb(k_arr, n_arr, delta_arr)
    elif bound == "hoeffding":
        out = _hoeffding_ucb(k_arr, n_arr, delta_arr)
    else:
        out = _beta_ucb(k_arr, n_arr, delta_arr / math.e)
        if bound == "hoeffding-bentkus":
            out = np.minimum(out, _hoeffding_ucb(k_arr, n_arr, delta_arr))
    return _scalar_or_array(out)


def _binomial_tail(k: np.ndarray, n: np.ndarray, beta: np.ndarray) -> np.ndarray:
    from scipy import stats

    out = stats.binom.cdf(k, n, beta)
    return np.where(n == 0, 1.0, out)


def _hoeffding_p(k: np.ndarray, n: np.ndarray, beta: np.ndarray) -> np.ndarray:
    from scipy.special import xlogy

    out = np.ones(k.shape)
    some = n > 0
    rate = np.minimum(k[some] / n[some].astype(np.float64), beta[some])
    b = beta[some]
    # Bernoulli KL divergence h(rate, beta); xlogy makes 0 * log 0 = 0.
    kl = xlogy(rate, rate / b) + xlogy(1.0 - rate, (1.0 - rate) / (1.0 - b))
    out[some] = np.exp(-n[some] * np.maximum(kl, 0.0))
    return out


def risk_p_value(
    k: ArrayLike,
    n: ArrayLike,
    beta: ArrayLike,
    *,
    bound: str = "clopper-pearson",
) -> Any:
    """P-value of the null hypothesis "risk > beta" from ``k`` losses in ``n`` trials.

    The Learn-then-Test p-values of DESIGN §6.4: rejecting when ``p <= delta`` controls
    the probability of certifying a risk above ``beta`` at ``delta``.

    Parameters
    ----------
    k, n : array_like of int
        Losses and trials as in :func:`ucb`; ``n = 0`` gives p-value 1.
    beta : float or array_like
        Risk level in (0, 1) under test; broadcasts with ``k`` and ``n``.
    bound : {"clopper-pearson", "hoeffding", "bentkus", "hoeffding-bentkus"}
        ``"clopper-pearson"``: the binomial tail ``P(Bin(n, beta) <= k)``.
        ``"bentkus"``: ``e * P(Bin(n, beta) <= k)``, capped at 1.  ``"hoeffding"``:
        ``exp(-n * h(min(k / n, beta), beta))`` with ``h`` the Bernoulli KL divergence.
        ``"hoeffding-bentkus"``: the smaller of the two.

    Returns
    -------
    float or ndarray
        P-values in [0, 1], float64, of the broadcast shape (a float for scalars).

    Examples
    --------
    >>> from advcal import risk_p_value
    >>> risk_p_value(0, 10, 0.2)  # 0.8 ** 10
    0.1073742
    >>> risk_p_value(0, [30, 0], 0.2, bound="hoeffding")
    array([0.0012379, 1.       ])
    """
    k_arr, n_arr, beta_arr = _counts_iv(k, n, beta, "beta", bound)
    if bound == "clopper-pearson":
        out = _binomial_tail(k_arr, n_arr, beta_arr)
    elif bound == "hoeffding":
        out = _hoeffding_p(k_arr, n_arr, beta_arr)
    else:
        out = np.minimum(1.0, math.e * _binomial_tail(k_arr, n_arr, beta_arr))
        if bound == "hoeffding-bentkus":
            out = np.minimum(out, _hoeffding_p(k_arr, n_arr, beta_arr))
    return _scalar_or_array(np.asarray(out, dtype=np.float64))
