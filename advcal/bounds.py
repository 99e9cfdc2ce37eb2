"""Upper confidence bounds and p-values for a risk estimated from k losses in n trials.

Every function broadcasts over arrays of ``k`` and ``n`` (and of the level), so one call
bounds a whole threshold grid.  ``n = 0`` is the *vacuous* case: no evidence, UCB 1 and
p-value 1.  Each UCB is the exact dual of its p-value, ``ucb(k, n, delta) = inf{beta :
risk_p_value(k, n, beta) <= delta}``, so ``ucb <= beta`` exactly when ``p <= delta``.
scipy is imported inside the functions (a slow import that ``import advcal`` avoids).
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


#: From this binomial variance V = n beta (1 - beta) on, the tail is the saddlepoint
#: approximation (:func:`_saddlepoint_tail`), whose relative error falls like 1 / V (against
#: exact sums: under 1e-3 / V out to 37 standard deviations, so below 1e-10 here), while
#: scipy's incomplete beta loses digits as V grows (about 1e-10 at 1e8, 2e-8 at 1e12) and
#: gives NaN near the mean beyond about 1e16.
SADDLEPOINT_VARIANCE = 2.0**26


def _binomial_tail(k: np.ndarray, n: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``P(Bin(n, beta) <= k)``: scipy's exact tail, or the saddlepoint one where the
    variance is huge."""
    from scipy import stats

    big = n * beta * (1.0 - beta) >= SADDLEPOINT_VARIANCE
    if not big.any():
        out = stats.binom.cdf(k, n, beta)
        return np.where(n == 0, 1.0, out)
    k, n, beta = np.broadcast_arrays(k, n, beta)
    out = np.ones(k.shape)
    small = ~big & (n > 0)
    out[small] = stats.binom.cdf(k[small], n[small], beta[small])
    below = big & (k < n)  # k = n: probability 1
    out[below] = _saddlepoint_tail(k[below], n[below], beta[below])
    return out


# (1 + t) log(1 + t) - t = t**2 * sum_m (-t)**m / ((m + 1)(m + 2)): terms to 0.5**46 / 2256.
_EXCESS_SERIES = np.array([(-1.0) ** m / ((m + 1) * (m + 2)) for m in range(47)])


def _log1p_excess(t: np.ndarray) -> np.ndarray:
    """``(1 + t) log(1 + t) - t`` for t > -1, without the cancellation near 0: its series
    for |t| < 1/2, the closed form (which then loses under a digit) beyond."""
    small = np.abs(t) < 0.5
    ts = np.where(small, t, 0.0)
    series = np.zeros(t.shape)
    for c in _EXCESS_SERIES[::-1]:
        series = series * ts + c
    with np.errstate(divide="ignore", invalid="ignore"):
        direct = (1.0 + t) * np.log1p(t) - t
    return np.where(small, ts * ts * series, direct)


def _deviation(k: np.ndarray, n: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``k + 1/2 - n beta`` to within about 1e-12 absolute for int64 k, n: each count
    split into a float64-exact high part and a low part below 2**11, the product
    ``n_high * beta`` taken exactly as a sum of two floats (Dekker's product)."""
    def parts(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        low = c & 0x7FF
        return (c - low).astype(np.float64), low.astype(np.float64)

    def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = 134217729.0 * x  # 2**27 + 1
        high = c - (c - x)
        return high, x - high

    k_high, k_low = parts(k)
    n_high, n_low = parts(n)
    product = n_high * beta
    (a1, a2), (b1, b2) = split(n_high), split(beta)
    error = ((a1 * b1 - product) + a1 * b2 + a2 * b1) + a2 * b2
    return (k_high - product) + ((k_low + 0.5) - error - n_low * beta)


def _saddlepoint_tail(k: np.ndarray, n: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``P(Bin(n, beta) <= k)`` for ``0 <= k < n`` by the Lugannani-Rice formula with
    Daniels' second continuity correction: with ``x = (k + 1/2) / n``,
    ``w = sign(x - beta) sqrt(2 n h(x, beta))`` (h the Bernoulli KL divergence), the
    tilt ``s = logit(x) - logit(beta)`` and ``v = 2 sinh(s / 2) sqrt(n x (1 - x))``, the
    tail is ``Phi(w) + phi(w) (1/w - 1/v)``, with a relative error of order 1/n in both
    tails.  ``1/w - 1/v`` (0/0 at the mean) is interpolated linearly in w for |w| < 1,
    where it is smooth and of order n**-1/2."""
    from scipy import special

    nf = n.astype(np.float64)

    def terms(delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(w, 1/w - 1/v) at ``x = beta + delta``."""
        up, down = delta / beta, -delta / (1.0 - beta)
        h = beta * _log1p_excess(up) + (1.0 - beta) * _log1p_excess(down)
        w = np.sign(delta) * np.sqrt(2.0 * nf * h)
        s = np.log1p(up) - np.log1p(down)
        v = 2.0 * np.sinh(s / 2.0) * np.sqrt(nf * (beta + delta) * ((1.0 - beta) - delta))
        with np.errstate(divide="ignore", invalid="ignore"):
            return w, 1.0 / w - 1.0 / v

    w, r = terms(_deviation(k, n, beta) / nf)
    half = np.sqrt(beta * (1.0 - beta) / nf)  # delta of w near -1 and +1
    w_lo, r_lo = terms(-half)
    w_hi, r_hi = terms(half)
    central = (w > w_lo) & (w < w_hi)
    r = np.where(central, r_lo + (w - w_lo) / (w_hi - w_lo) * (r_hi - r_lo), r)
    density = np.exp(-0.5 * w * w) / math.sqrt(2.0 * math.pi)
    # Each side from its own small tail: below the mean Phi(w) + ..., above it
    # 1 - (Phi(-w) - ...), so neither loses the digits of a tail near 0.
    lower = special.ndtr(w) + density * r
    upper = 1.0 - (special.ndtr(-w) - density * r)
    return np.clip(np.where(w < 0.0, lower, upper), 0.0, 1.0)


def _bernoulli_kl(rate: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """h(rate, beta) for 0 <= rate <= beta < 1, with 0 log 0 = 0.

    The log1p forms keep it accurate when rate is near beta (huge n), where the plain
    logs of two nearly equal ratios cancel.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where(rate > 0, rate * np.log1p((rate - beta) / beta), 0.0)
        second = (1.0 - rate) * np.log1p((beta - rate) / (1.0 - beta))
    return np.maximum(first + second, 0.0)


def _hoeffding_p(k: np.ndarray, n: np.ndarray, beta: np.ndarray) -> np.ndarray:
    out = np.ones(np.shape(k))
    some = n > 0
    ns = n[some].astype(np.float64)
    b = beta[some]
    rate = np.minimum(k[some] / ns, b)
    out[some] = np.exp(-ns * _bernoulli_kl(rate, b))
    return out


def p_values_checked(bound: str, k: np.ndarray, n: np.ndarray, beta: np.ndarray
                     ) -> np.ndarray:
    """The p-value of "risk > beta" for one bound family (elementwise, no validation).

    :func:`ucb` inverts exactly these numbers, so the two never disagree.
    """
    if bound == "clopper-pearson":
        return np.asarray(_binomial_tail(k, n, beta), dtype=np.float64)
    if bound == "hoeffding":
        return _hoeffding_p(k, n, beta)
    out = np.minimum(1.0, math.e * _binomial_tail(k, n, beta))
    if bound == "hoeffding-bentkus":
        out = np.minimum(out, _hoeffding_p(k, n, beta))
    return np.asarray(out, dtype=np.float64)


def _smallest_certified(bound: str, k: np.ndarray, n: np.ndarray, delta: np.ndarray,
                        low: np.ndarray, guess: np.ndarray | None) -> np.ndarray:
    """Per cell, the smallest float64 beta in (low, 1] with p(k, n, beta) <= delta.

    The p-value is 1 > delta at ``low`` and beta = 1 counts as certified (the vacuous
    bound).  Positive float64 values are ordered like their bit patterns, so the search
    runs on integers: it gallops out from ``guess`` (a close closed-form or quantile
    value, NaN where unavailable) until the p-value crosses delta, then bisects to
    adjacent floats.  The answer is therefore the dual of :func:`risk_p_value` to the
    last bit wherever the computed p-value is monotone in beta.
    """

    def certified(idx: np.ndarray, bits: np.ndarray) -> np.ndarray:
        beta = bits.view(np.float64)
        return p_values_checked(bound, k[idx], n[idx], beta) <= delta[idx]

    lo = np.ascontiguousarray(low, dtype=np.float64).view(np.int64).copy()
    hi = np.full(lo.shape, np.float64(1.0)).view(np.int64).copy()
    if guess is not None:
        start = np.asarray(guess, dtype=np.float64)
        usable = np.isfinite(start) & (start > low) & (start < 1.0)
        idx = np.flatnonzero(usable)
        g = start[idx].view(np.int64)
        ok = certified(idx, g)
        hi[idx[ok]] = g[ok]
        lo[idx[~ok]] = g[~ok]
        down = ok  # certified at the guess: look below it, else above
        step = 1
        while idx.size:
            probe = np.where(down, hi[idx] - step, lo[idx] + step)
            inside = (probe > lo[idx]) & (probe < hi[idx])
            idx, probe, down = idx[inside], probe[inside], down[inside]
            ok = certified(idx, probe)
            hi[idx[ok]] = probe[ok]
            lo[idx[~ok]] = probe[~ok]
            # Keep galloping while the probe stays on the guess's side of the boundary.
            keep = ok == down
            idx, down = idx[keep], down[keep]
            step *= 2
    idx = np.flatnonzero(hi - lo > 1)
    while idx.size:
        mid = lo[idx] + (hi[idx] - lo[idx]) // 2
        ok = certified(idx, mid)
        hi[idx[ok]] = mid[ok]
        lo[idx[~ok]] = mid[~ok]
        idx = idx[hi[idx] - lo[idx] > 1]
    return hi.view(np.float64)


def _kl_root(rate: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Approximately the beta > rate with h(rate, beta) = level: a start for the search.

    In x = -log(1 - beta), h is convex and increasing above rate (dh/dx = (beta - rate) /
    beta), and h grows only like x near beta = 1, so Newton's method on x started to the
    right of the root (Pinsker: rate + sqrt(level / 2) is) decreases to it quickly.
    """
    beta = np.minimum(rate + np.sqrt(level / 2.0), np.nextafter(1.0, 0.0))
    x = -np.log1p(-beta)
    with np.errstate(all="ignore"):
        for _ in range(8):
            slope = (beta - rate) / beta
            x = x - (_bernoulli_kl(rate, beta) - level) / slope
            beta = np.clip(-np.expm1(-x), rate, 1.0)
    return beta


def _dual_ucb(bound: str, k: np.ndarray, n: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """inf{beta : p(k, n, beta) <= delta} for a single family (not hoeffding-bentkus)."""
    from scipy import special

    out = np.ones(k.shape)
    some = np.flatnonzero((k < n).reshape(-1))  # k = n (n = 0 included): p = 1, bound 1
    if not some.size:
        return out
    ks, ns, ds = (a.reshape(-1)[some] for a in (k, n, delta))
    if bound == "hoeffding":
        low = ks / ns.astype(np.float64)  # p = 1 up to the empirical rate
        guess = _kl_root(low, -np.log(ds) / ns)
    else:
        low = np.zeros(ks.shape)
        level = ds if bound == "clopper-pearson" else ds / math.e
        # The (1 - level) quantile of Beta(k+1, n-k) solves P(Bin(n, beta) <= k) = level;
        # betainccinv (no 1 - level cancellation) is a starting point accurate to a few
        # ulps where it converges, and NaN where it does not (huge n, subnormal levels).
        with np.errstate(all="ignore"):
            guess = special.betainccinv(ks + 1.0, (ns - ks).astype(np.float64), level)
    out.reshape(-1)[some] = _smallest_certified(bound, ks, ns, ds, low, guess)
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
        n - k)`` (1 when k = n).  ``"hoeffding"``: the ``b >= k / n`` solving
        ``n * h(k / n, b) = log(1 / delta)``, with ``h`` the Bernoulli KL divergence
        (tighter than the sub-Gaussian ``k / n + sqrt(log(1 / delta) / (2 n))``, which
        Pinsker's inequality shows to be an upper bound on it).  ``"bentkus"``: the
        Clopper-Pearson bound at level ``delta / e``.  ``"hoeffding-bentkus"``: the
        smaller of the two.

        Each is the dual of :func:`risk_p_value` with the same ``bound``: the smallest
        float64 ``b`` with ``risk_p_value(k, n, b) <= delta``, found by searching the
        p-value itself from a closed-form start, so ``ucb(k, n, delta) <= beta`` if and
        only if ``risk_p_value(k, n, beta) <= delta`` (up to rounding noise in the
        p-value at the boundary).

    Returns
    -------
    float or ndarray
        Bounds in [0, 1] (at least k/n when ``delta <= 0.5``), float64, of the
        broadcast shape of the inputs (a Python float for scalar inputs).

    Examples
    --------
    >>> from advcal import risk_p_value, ucb
    >>> ucb(0, 10, 0.05)  # 1 - 0.05 ** (1 / 10)
    0.2588656
    >>> ucb([0, 5, 10], 10, 0.05, bound="hoeffding")  # k = 0 is 1 - 0.05 ** (1 / 10) too
    array([0.2588656, 0.8356783, 1.       ])
    >>> ucb(0, 11, 0.1, bound="hoeffding") <= 0.2  # the dual of the p-value below
    True
    >>> risk_p_value(0, 11, 0.2, bound="hoeffding") <= 0.1
    True
    >>> ucb(0, 0, 0.1)  # no trials: vacuous
    1.0
    """
    k_arr, n_arr, delta_arr = _counts_iv(k, n, delta, "delta", bound)
    if bound == "hoeffding-bentkus":
        # {beta : min(pH, pB) <= delta} is the union of the two certified half-lines.
        out = np.minimum(_dual_ucb("bentkus", k_arr, n_arr, delta_arr),
                         _dual_ucb("hoeffding", k_arr, n_arr, delta_arr))
    else:
        out = _dual_ucb(bound, k_arr, n_arr, delta_arr)
    return _scalar_or_array(out)


def risk_p_value(
    k: ArrayLike,
    n: ArrayLike,
    beta: ArrayLike,
    *,
    bound: str = "clopper-pearson",
) -> Any:
    """P-value of the null hypothesis "risk > beta" from ``k`` losses in ``n`` trials.

    The Learn-then-Test p-values: rejecting when ``p <= delta`` controls the probability
    of certifying a risk above ``beta`` at ``delta``.  :func:`ucb` with the same
    ``bound`` is their exact dual.

    Parameters
    ----------
    k, n : array_like of int
        Losses and trials as in :func:`ucb`; ``n = 0`` gives p-value 1.
    beta : float or array_like
        Risk level in (0, 1) under test; broadcasts with ``k`` and ``n``.
    bound : {"clopper-pearson", "hoeffding", "bentkus", "hoeffding-bentkus"}
        ``"clopper-pearson"``: the binomial tail ``P(Bin(n, beta) <= k)`` (scipy's;
        where ``n * beta * (1 - beta) >= 2**26``, the Lugannani-Rice saddlepoint
        approximation with continuity correction, relative error below 1e-10, as
        scipy's loses digits and gives NaN for n of 1e16 and more).
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
    out = p_values_checked(bound, k_arr, n_arr, beta_arr)
    return _scalar_or_array(np.asarray(out, dtype=np.float64))


def holm_certified(p_values: np.ndarray, level: float) -> np.ndarray:
    """Holm's step-down over a family of T p-values (a 1-D array): which nulls it rejects.

    ``level`` is Bonferroni's per-test level δ/T.  The j-th smallest p-value (j = 1..T) is
    tested at level·T/(T − j + 1), from the smallest, stopping at the first not rejected;
    the family-wise error is at most δ whatever the dependence between the tests.
    """
    t = p_values.size
    order = np.argsort(p_values, kind="stable")
    passed = p_values[order] <= level * t / (t - np.arange(t))
    count = t if passed.all() else int(np.argmin(passed))
    certified = np.zeros(t, dtype=bool)
    certified[order[:count]] = True
    return certified
