"""Split-conformal toolkit: the exact finite-sample quantile and conformal reward ranges.

The quantile of m calibration scores at level α is the k-th smallest score
with k = ⌈(m+1)(1−α)⌉, and +∞ when k > m.  The rank is computed in exact rational
arithmetic and snapped to an integer within 1e-9, so that α means the decimal the user
wrote (see ``docs/conformal.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from advcal import _fields
from advcal._float_search import first_float, last_float
from advcal._validation import as_float_array, check_bounds, check_choice, check_int, check_real
from advcal.labels import LabelMapping, category_codes
from advcal.layouts import label_key

__all__ = [
    "conformal_rank",
    "conformal_quantile",
    "calibrate_ranges",
    "RangeCalibration",
    "RewardRanges",
    "LabelMapping",
]

# (m+1)(1-α) closer than this to an integer is that integer: float α = 0.7 is a hair
# above 7/10, and (m+1)(1-α) would otherwise overshoot an integer and add one rank.
_SNAP = Fraction(1, 10**9)


def _check_alpha(alpha: Any) -> float:
    if isinstance(alpha, np.floating) and not isinstance(alpha, np.float64):
        # np.float32(0.7) is 0.699999988...: its shortest repr "0.7" is what the user
        # wrote, so snap that decimal rather than the binary value.
        alpha = float(str(alpha))
    return check_real(alpha, "alpha", low=0.0, high=1.0, low_inclusive=False,
                      high_inclusive=False)


def _rank(m: int, alpha: float) -> int:
    # Fraction(alpha) is the exact binary value of the float: the product has no
    # rounding error, only the representation error of α itself (< 2**-53 relative).
    target = (m + 1) * (1 - Fraction(alpha))
    nearest = round(target)
    if abs(target - nearest) <= _SNAP:
        # max: a target within 1e-9 of 0 (alpha within 1e-9 / (m+1) of 1) is rank 1.
        return max(1, int(nearest))
    return math.ceil(target)


def conformal_rank(m: int, alpha: float) -> int:
    """The split-conformal rank ``k = ceil((m + 1) * (1 - alpha))`` without float overshoot.

    Parameters
    ----------
    m : int
        Number of calibration scores, ``m >= 1``.
    alpha : float
        Miscoverage level in (0, 1).  A float32 (or float16) ``alpha`` is read as the
        shortest decimal that prints as it (``np.float32(0.7)`` is 0.7).

    Returns
    -------
    int
        The rank k (1-based) of the conformal quantile among the sorted scores; ``k > m``
        means the quantile is +inf.  ``(m + 1) * (1 - alpha)`` is evaluated exactly and
        taken as an integer when it lies within 1e-9 of one.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import conformal_rank
    >>> conformal_rank(9, 0.7)  # float arithmetic: ceil(3.0000000000000004) = 4
    3
    >>> conformal_rank(74, 1 - 0.68)
    51
    >>> conformal_rank(9, np.float32(0.7))  # float32 too: the decimal 0.7
    3
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


# --------------------------------------------------------------------------- reward ranges

RANGE_METHODS = ("absolute", "normalized", "cqr")


class RewardRanges(NamedTuple):
    """Conformal reward ranges ``[lo, hi]``, elementwise ``lo <= hi``."""

    lo: np.ndarray
    hi: np.ndarray


# --------------------------------------------------------------------------- exact ranges
#
# A range must hold exactly the references y whose score, computed in float64 as at
# calibration, is <= q (closed) or < q (opened for smoothing).  s +- q in float can be a
# float too wide or too narrow for that, so each endpoint is searched among the floats:
# the scores are monotone in y on each side, so the set is an interval of floats.

def _largest_quotient(q: np.ndarray, sigma: np.ndarray, strict: bool) -> np.ndarray:
    """The largest float d with ``fl(d / sigma) <= q`` (``< q`` if ``strict``)."""
    compare = np.less if strict else np.less_equal
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        guess = np.where(np.isfinite(q), q * sigma, np.inf)
        return last_float(lambda d, i: compare(d / sigma[i], q[i]), guess, -np.inf, np.inf)


def _sum_guess(centre: np.ndarray, r: np.ndarray, sign: float) -> np.ndarray:
    """About ``centre + sign * (r + half the gap above r)``: where ``fl(±(y - centre))``
    stops rounding to at most r.  TwoSum keeps the low bits ``fl(centre + r)`` drops."""
    with np.errstate(over="ignore", invalid="ignore"):
        head = centre + sign * r
        back = head - centre
        tail = (centre - (head - back)) + (sign * r - back)
        half = 0.5 * (np.nextafter(r, np.inf) - r)
        guess = head + (tail + sign * half)
    return np.where(np.isfinite(guess), guess, head)


def _exact_interval(method: str, inputs: _ScoreInputs, radius: np.ndarray,
                    bounds: tuple[float, float],
                    strict: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat ``(lo, hi, empty)``: the float interval of references y within ``bounds``
    whose score is <= radius (``strict``: < radius), or ``empty`` where there is none.

    Every score is a rounded difference, ``fl(±(y - c))`` (for ``"normalized"`` then
    divided by sigma, which is monotone), so both ends reduce to ``fl(y - c) <= r`` and
    ``fl(c - y) <= r`` for a float threshold r.
    """
    q = radius
    if method == "cqr":
        up, down = inputs.upper.reshape(-1), inputs.lower.reshape(-1)
    else:
        up = down = inputs.judge.reshape(-1)
    if method == "normalized":
        r = _largest_quotient(q, inputs.sigma.reshape(-1), strict)
    else:
        r = np.nextafter(q, -np.inf) if strict else q  # fl(x) < q iff fl(x) <= prev(q)
    low, high = bounds
    with np.errstate(over="ignore", invalid="ignore"):
        hi = last_float(lambda y, i: y - up[i] <= r[i], _sum_guess(up, r, 1.0), low, high)
        lo = first_float(lambda y, i: down[i] - y <= r[i], _sum_guess(down, r, -1.0), low,
                          high)
    empty = np.isnan(lo) | np.isnan(hi) | (lo > hi)
    lo = np.where(empty, low, lo)
    hi = np.where(empty, low, hi)
    return lo, hi, empty


def validate_range_calibration(cal: Any) -> None:
    """Check every field of a :class:`~advcal.RangeCalibration` (run on construction).

    Raises ``ValueError`` or ``TypeError`` naming the first bad field: an unknown
    ``method``, ``alpha`` outside (0, 1), ``bounds`` that are not finite with low < high,
    ``scores`` that are not a non-empty finite 1-D float array (non-negative except for
    ``"cqr"``), a NaN or negative ``radius`` (negative only allowed for ``"cqr"``), or
    ``radius`` keys and ``categories`` that do not match one another.
    """

    method = check_choice(cal.method, "method", tuple(RANGE_METHODS))
    _fields.alpha(cal.alpha)
    bounds = cal.bounds
    if not isinstance(bounds, tuple) or len(bounds) != 2:
        raise TypeError(f"`bounds` must be a tuple (low, high); got {bounds!r}.")
    low = _fields.real(bounds[0], "bounds[0]")
    high = _fields.real(bounds[1], "bounds[1]")
    if not low < high:
        raise ValueError(f"`bounds` must satisfy low < high; got {bounds!r}.")
    scores = _fields.float_vector(cal.scores, "scores")
    if not np.isfinite(scores).all():
        raise ValueError("`scores` must be finite.")
    signed = method == "cqr"
    if not signed and (scores < 0).any():
        raise ValueError(f"`scores` must be non-negative for method={method!r}.")
    radius = cal.radius
    if not isinstance(radius, Mapping) or len(radius) == 0:
        raise TypeError("`radius` must be a non-empty mapping of category to radius.")
    for key, value in radius.items():
        _fields.real(value, f"radius[{key!r}]", low=None if signed else 0.0, allow_inf=True)
    categories = cal.categories
    if categories is None:
        if list(radius) != [None]:
            raise ValueError("`radius` must have the single key None when `categories` is "
                             f"None; got keys {list(radius)[:5]!r}.")
        return
    if not isinstance(categories, np.ndarray) or categories.dtype != object:
        raise TypeError("`categories` must be a numpy array of dtype object (or None).")
    if categories.shape != scores.shape:
        raise ValueError(f"`categories` must have the shape of `scores` {scores.shape}; "
                         f"got {categories.shape}.")
    # Labels are equal only with the same type and value (1, True and 1.0 are three).
    seen: dict[Any, Any] = {}
    for label in categories.tolist():
        try:
            seen.setdefault(label_key(label), label)
        except TypeError:
            raise TypeError(f"`categories` must hold hashable labels; got "
                            f"{type(label).__name__}.") from None
    keys = {label_key(key): key for key in radius}
    missing = [label for key, label in seen.items() if key not in keys]
    if missing:
        raise ValueError(f"`radius` has no entry for category {missing[0]!r} of "
                         "`categories`.")
    unused = [label for key, label in keys.items() if key not in seen]
    if unused:
        raise ValueError(f"`radius` has category {unused[0]!r}, which no calibration "
                         "score has in `categories`.")


def check_range_consistency(cal: RangeCalibration) -> None:
    """Cross-field check that :func:`calibrate_ranges` guarantees (a tampered file fails):
    each radius is the conformal quantile of its category's scores at ``alpha``."""
    if cal.categories is None:
        groups = [(None, cal.scores)]
    else:
        keys = list(cal.radius)
        index = {label_key(key): i for i, key in enumerate(keys)}
        codes = np.array([index[label_key(lab)] for lab in cal.categories.tolist()],
                         dtype=np.int64)
        groups = [(key, cal.scores[codes == i]) for i, key in enumerate(keys)]
    for key, scores in groups:
        expected = conformal_quantile(scores, cal.alpha)
        if float(cal.radius[key]) != expected:
            raise ValueError(f"`radius[{key!r}]` = {float(cal.radius[key])!r} is not the "
                             f"conformal quantile of its scores at `alpha` ({expected!r}).")


@dataclass(frozen=True)
class RangeCalibration:
    """A calibrated LLM judge: turns judge scores into conformal reward ranges.

    Built by :func:`calibrate_ranges`; call :meth:`ranges` on new judge scores.

    Attributes
    ----------
    method : {"absolute", "normalized", "cqr"}
        The nonconformity score (see :func:`calibrate_ranges`).
    alpha : float
        Miscoverage level: each range holds its reference reward with probability at
        least ``1 - alpha`` (within its category, for Mondrian calibration).
    bounds : tuple of float
        ``(low, high)`` reward bounds the ranges are clipped to.
    radius : mapping
        Conformal radius q̂ per category (key ``None`` without categories).  ``inf``
        where a category has too few scores for level ``alpha``: its ranges are the
        whole ``bounds``.  Labels are the same category only with the same type and
        value (``1``, ``True`` and ``1.0`` are three); where a ``dict`` would merge
        some, this is a :class:`LabelMapping`.
    scores : ndarray of float64, shape (m,)
        The calibration nonconformity scores, in the caller's order (read-only).
    categories : ndarray of object, shape (m,) or None
        The category of each calibration score (read-only), ``None`` without Mondrian.
    """

    method: str
    alpha: float
    bounds: tuple[float, float]
    radius: Mapping[Any, float]
    scores: np.ndarray
    categories: np.ndarray | None = None

    def __post_init__(self) -> None:
        # Objects built or edited by hand get the checks a loaded file gets.
        validate_range_calibration(self)

    def ranges(
        self,
        judge: ArrayLike | None,
        *,
        sigma: ArrayLike | None = None,
        lower: ArrayLike | None = None,
        upper: ArrayLike | None = None,
        categories: ArrayLike | None = None,
        smoothing: bool = False,
        seed: Any = None,
    ) -> RewardRanges:
        """Conformal ranges ``(lo, hi)`` for judge scores of unlabeled responses.

        A range holds exactly the rewards y within ``bounds`` whose nonconformity score,
        computed in float64 as at calibration, is at most the radius q̂: its endpoints
        are the floats where that comparison changes, not the float sums ``s ± q̂``.

        Parameters
        ----------
        judge, sigma, lower, upper, categories
            Per-response inputs of the new responses, as in :func:`calibrate_ranges`
            (any shape, all the same shape).  Every category must have been seen at
            calibration.
        smoothing : bool, default False
            Randomised tie-breaking (smoothed conformal).  With a discrete judge many
            calibration scores equal the radius q̂ and the closed ranges over-cover (up
            to ``1 - alpha`` plus the mass of the tie).  With smoothing, a response
            keeps its closed range (the rewards whose score is at most q̂) with
            probability ``(k - a) / (t + 1)``, where k is the conformal rank, a the
            number of calibration scores below q̂ and t the number equal to it, and
            otherwise gets the open range (the rewards whose score is below q̂).  That
            is the tie-break of every score by an independent uniform, so coverage is
            exactly ``k / (m + 1)``, within ``1 / (m + 1)`` of ``1 - alpha`` whatever
            the ties.  Where no reward within ``bounds`` scores below q̂ (a zero radius)
            the open range would be empty and the closed one is kept: coverage there
            stays above ``k / (m + 1)`` (see ``docs/conformal.md``).
        seed : int, SeedSequence or Generator, optional
            Seed of the tie-breaking draws (one uniform per response); only with
            ``smoothing=True``.

        Returns
        -------
        RewardRanges
            ``(lo, hi)`` in the shape of the inputs, within ``bounds``; float32 if the
            inputs are float32, else float64.  float32 closed ranges are rounded
            outward (no reward loses coverage); float32 open ranges inward (they keep
            exactly the float32 values of the open range).

        Examples
        --------
        >>> import numpy as np
        >>> from advcal import calibrate_ranges
        >>> judge = np.full(20, 0.5)  # a judge and rewards on a quarter-point scale
        >>> reference = np.r_[np.full(8, 0.5), np.full(6, 0.75), np.full(6, 0.25)]
        >>> cal = calibrate_ranges(judge, reference, alpha=0.5)  # k = ceil(10.5) = 11
        >>> cal.radius[None]  # 8 scores are 0 and 12 are 0.25: q̂ = 0.25 is a tie
        0.25
        >>> lo, hi = cal.ranges(np.full(6, 0.5), smoothing=True, seed=0)
        >>> hi < 0.75  # [0.25, 0.75] kept with probability (11 - 8) / (12 + 1), else opened
        array([ True,  True, False, False,  True,  True])
        """
        if not isinstance(smoothing, (bool, np.bool_)):
            raise TypeError(f"`smoothing` must be a bool; got {type(smoothing).__name__}.")
        if seed is not None and not smoothing:
            raise ValueError("`seed` is only used with smoothing=True.")
        inputs = _score_inputs(self.method, judge, sigma, lower, upper, None)
        codes = self._codes_per_response(categories, inputs.shape)
        radius = self._radius_array()[codes]
        lo, hi, empty = _exact_interval(self.method, inputs, radius, self.bounds, strict=False)
        if empty.any():
            # No reward within the bounds scores <= q̂ (a judge far outside the bounds, a
            # crossed CQR band): no range is empty, so give the clipped float formula, a
            # degenerate range that covers no more than it must.
            f_lo, f_hi = self._formula(inputs, radius)
            lo = np.where(empty, f_lo, lo)
            hi = np.where(empty, f_hi, hi)
        lo, hi = _outward_cast(lo, hi, inputs.dtype)
        if smoothing:
            keep = self._keep_array()[codes]
            draw = np.random.default_rng(seed).random(inputs.shape).reshape(-1)
            opened = np.flatnonzero(draw >= keep)
            if opened.size:
                pick = {f: getattr(inputs, f).reshape(-1)[opened]
                        for f in ("judge", "sigma", "lower", "upper", "reference")}
                sub = _ScoreInputs(**pick, shape=(opened.size,), dtype=inputs.dtype)
                o_lo, o_hi, o_empty = _exact_interval(self.method, sub, radius[opened],
                                                      self.bounds, strict=True)
                o_lo, o_hi = _inward_cast(o_lo, o_hi, inputs.dtype)
                usable = ~o_empty & (o_lo <= o_hi)  # else keep the closed range
                lo[opened[usable]] = o_lo[usable]
                hi[opened[usable]] = o_hi[usable]
        return RewardRanges(lo.reshape(inputs.shape), hi.reshape(inputs.shape))

    def _formula(self, inputs: _ScoreInputs,
                 radius: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The float ranges ``s ± q̂`` (or the CQR band), uncrossed and clipped; flat."""
        if self.method == "cqr":
            lower, upper = inputs.lower.reshape(-1), inputs.upper.reshape(-1)
            lo, hi = lower - radius, upper + radius
            # A crossed band stands for the empty set: any point covers as much.
            crossed = lo > hi
            mid = 0.5 * (lower + upper)
            lo, hi = np.where(crossed, mid, lo), np.where(crossed, mid, hi)
        else:
            judge = inputs.judge.reshape(-1)
            with np.errstate(invalid="ignore"):
                width = radius if self.method == "absolute" else radius * inputs.sigma.reshape(
                    -1)
            lo, hi = judge - width, judge + width
        return np.clip(lo, *self.bounds), np.clip(hi, *self.bounds)

    def _groups(self) -> tuple[list[Any], np.ndarray]:
        """The radius labels and, per calibration score, the index of its label."""
        labels = list(self.radius)
        codes = self.__dict__.get("_score_codes")  # set by calibrate_ranges
        if codes is not None:
            return labels, codes
        if self.categories is None:
            return labels, np.zeros(self.scores.size, dtype=np.int64)
        index = {label_key(lab): i for i, lab in enumerate(labels)}
        codes = np.array([index[label_key(lab)] for lab in self.categories.tolist()],
                         dtype=np.int64)
        return labels, codes

    def _keep_per_category(self) -> np.ndarray:
        """Per radius label, the probability (k - a) / (t + 1) of keeping the tie at q̂."""
        labels, codes = self._groups()
        q = np.array([float(self.radius[lab]) for lab in labels], dtype=np.float64)
        size = np.bincount(codes, minlength=len(labels))
        below = np.bincount(codes, weights=self.scores < q[codes], minlength=len(labels))
        ties = np.bincount(codes, weights=self.scores == q[codes], minlength=len(labels))
        ranks = {n: _rank(n, self.alpha) for n in set(size.tolist())}
        k = np.array([ranks[n] for n in size.tolist()], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            keep = np.where(ties > 0, (k - below) / (ties + 1), 1.0)
        keep.flags.writeable = False
        return keep

    def _keep_array(self) -> np.ndarray:
        # Computed once per calibration (ranges runs once per batch); not a field.
        keep = self.__dict__.get("_keep")
        if keep is None:
            keep = self._keep_per_category()
            object.__setattr__(self, "_keep", keep)
        return keep

    def _radius_array(self) -> np.ndarray:
        return np.array([float(v) for v in self.radius.values()], dtype=np.float64)

    def _tie_probability(self, categories: ArrayLike | None,
                         shape: tuple[int, ...]) -> np.ndarray:
        """Per response, the probability (k - a) / (t + 1) of keeping the tie at q̂."""
        return self._keep_array()[self._codes_per_response(categories, shape)].reshape(shape)

    def _codes_per_response(self, categories: ArrayLike | None,
                            shape: tuple[int, ...]) -> np.ndarray:
        """Per response (flat), the index of its category among the radius labels."""
        size = math.prod(shape)
        if self.categories is None:
            if categories is not None:
                raise ValueError(
                    "`categories` were not used at calibration; pass categories=None "
                    "(or calibrate per category)."
                )
            return np.zeros(size, dtype=np.int64)
        if categories is None:
            raise ValueError(
                "`categories` are required: the calibration is per category (Mondrian)."
            )
        labels, codes = category_codes(categories, shape)
        index = {label_key(lab): i for i, lab in enumerate(self.radius)}
        per_label = np.empty(len(labels), dtype=np.int64)
        for i, label in enumerate(labels):
            found = index.get(label_key(label))
            if found is None:
                known = ", ".join(repr(c) for c in list(self.radius)[:10])
                raise ValueError(
                    f"`categories` holds {label!r}, which was not seen at calibration "
                    f"(known: {known})."
                )
            per_label[i] = found
        return per_label[codes]


class _ScoreInputs(NamedTuple):
    judge: np.ndarray
    sigma: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    reference: np.ndarray
    shape: tuple[int, ...]
    dtype: np.dtype


def _per_response(values: ArrayLike, name: str, shape: tuple[int, ...] | None) -> np.ndarray:
    arr = as_float_array(values, name)
    if shape is not None and arr.shape != shape:
        raise ValueError(f"`{name}` must have shape {shape}; got {arr.shape}.")
    if not np.isfinite(arr).all():
        raise ValueError(f"`{name}` must be finite.")
    return arr


def _score_inputs(method: str, judge: Any, sigma: Any, lower: Any, upper: Any,
                  reference: Any) -> _ScoreInputs:
    """Validate the per-response arrays ``method`` needs and reject those it ignores."""
    used = {"judge": method != "cqr", "sigma": method == "normalized",
            "lower": method == "cqr", "upper": method == "cqr"}
    given = {"judge": judge, "sigma": sigma, "lower": lower, "upper": upper}
    for name, needed in used.items():
        if needed and given[name] is None:
            raise ValueError(f"method={method!r} needs `{name}`.")
        if not needed and given[name] is not None:
            raise ValueError(f"method={method!r} does not use `{name}`; pass None.")
    first = "judge" if method != "cqr" else "lower"
    head = as_float_array(given[first], first)
    shape = head.shape
    arrays = {name: _per_response(given[name], name, shape) for name in used if used[name]}
    dtypes = [a.dtype for a in arrays.values()]
    dtype = np.dtype(np.float32) if all(d == np.float32 for d in dtypes) else np.dtype(
        np.float64)
    as64 = {name: a.astype(np.float64) for name, a in arrays.items()}
    empty = np.empty(shape)
    if "sigma" in as64 and not (as64["sigma"] > 0).all():
        raise ValueError("`sigma` must be positive (a per-response difficulty scale).")
    if "lower" in as64 and (as64["lower"] > as64["upper"]).any():
        raise ValueError("`lower` must not exceed `upper`.")
    ref = empty if reference is None else _per_response(reference, "reference", shape).astype(
        np.float64)
    return _ScoreInputs(as64.get("judge", empty), as64.get("sigma", empty),
                        as64.get("lower", empty), as64.get("upper", empty), ref, shape, dtype)


def _outward_cast(lo: np.ndarray, hi: np.ndarray,
                  dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Cast to ``dtype`` rounding ``lo`` down and ``hi`` up (at most one ulp outward)."""
    if dtype == np.float64:
        return lo, hi
    lo32 = lo.astype(dtype)
    hi32 = hi.astype(dtype)
    lo32 = np.where(lo32 > lo, np.nextafter(lo32, dtype.type(-np.inf)), lo32)
    hi32 = np.where(hi32 < hi, np.nextafter(hi32, dtype.type(np.inf)), hi32)
    return lo32.astype(dtype, copy=False), hi32.astype(dtype, copy=False)


def _inward_cast(lo: np.ndarray, hi: np.ndarray,
                 dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Cast to ``dtype`` rounding ``lo`` up and ``hi`` down: the floats of ``dtype`` in
    ``[lo, hi]`` stay, no other (``lo > hi`` after the cast: none is left)."""
    if dtype == np.float64:
        return lo, hi
    lo32 = lo.astype(dtype)
    hi32 = hi.astype(dtype)
    lo32 = np.where(lo32 < lo, np.nextafter(lo32, dtype.type(np.inf)), lo32)
    hi32 = np.where(hi32 > hi, np.nextafter(hi32, dtype.type(-np.inf)), hi32)
    return lo32.astype(dtype, copy=False), hi32.astype(dtype, copy=False)


def _nonconformity(method: str, inputs: _ScoreInputs) -> np.ndarray:
    y = inputs.reference
    if method == "absolute":
        return np.abs(y - inputs.judge)
    if method == "normalized":
        return np.abs(y - inputs.judge) / inputs.sigma
    return np.maximum(inputs.lower - y, y - inputs.upper)


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, copy=True)
    arr.flags.writeable = False
    return arr


def calibrate_ranges(
    judge: ArrayLike | None,
    reference: ArrayLike,
    *,
    alpha: float,
    method: str = "absolute",
    sigma: ArrayLike | None = None,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    categories: ArrayLike | None = None,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> RangeCalibration:
    """Calibrate an LLM judge against reference rewards into conformal reward ranges.

    Split conformal prediction: on m labeled responses, compute a
    nonconformity score per response, take the conformal quantile q̂ at level ``alpha``
    (per category with ``categories``: Mondrian), and turn judge scores of new,
    exchangeable responses into ranges that hold the reference reward with probability
    at least ``1 - alpha``.

    ===============  ==============================  ==================================
    method           score                           range
    ===============  ==============================  ==================================
    ``absolute``     ``|y - s|``                     ``[s - q̂, s + q̂]``
    ``normalized``   ``|y - s| / sigma``             ``[s - q̂ sigma, s + q̂ sigma]``
    ``cqr``          ``max(lower - y, y - upper)``   ``[lower - q̂, upper + q̂]``
    ===============  ==============================  ==================================

    Parameters
    ----------
    judge : array_like or None
        Judge scores ``s`` of the calibration responses (any shape); ``None`` for
        ``"cqr"``, which uses ``lower``/``upper`` instead.
    reference : array_like
        Reference rewards ``y`` of the same responses, within ``bounds``.
    alpha : float
        Miscoverage level in (0, 1).
    method : {"absolute", "normalized", "cqr"}, default "absolute"
        Nonconformity score (table above).
    sigma : array_like, optional
        Positive per-response difficulty (e.g. the spread of k judge samples); required
        by ``"normalized"`` and rejected by the others.
    lower, upper : array_like, optional
        Lower/upper judge quantiles with ``lower <= upper``; required by ``"cqr"``.
    categories : sequence of hashable, optional
        Per-response category labels: one radius per category (Mondrian calibration,
        coverage holds within each category).  Two labels are one category only when
        they have the same type and value: ``1``, ``True``, ``1.0`` and ``"1"`` are four
        (a numpy scalar counts as its Python type).
    bounds : (float, float), default (0.0, 1.0)
        Reward bounds ``low < high``; ranges are clipped to them.

    Returns
    -------
    RangeCalibration
        The radius per category, the calibration scores, ``alpha``, ``method`` and
        ``bounds``; its :meth:`~RangeCalibration.ranges` builds ranges for new scores.
        Labeled responses enter :func:`advcal.range_advantages` as degenerate ranges
        ``[y, y]``.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import calibrate_ranges
    >>> judge = np.array([0.2, 0.4, 0.6, 0.8, 0.5, 0.3, 0.9, 0.1, 0.7])
    >>> reference = np.array([0.25, 0.3, 0.6, 1.0, 0.45, 0.4, 0.8, 0.0, 0.75])
    >>> cal = calibrate_ranges(judge, reference, alpha=0.2)  # k = ceil(10 * 0.8) = 8
    >>> cal.radius[None]
    0.1
    >>> lo, hi = cal.ranges(np.array([0.5, 0.95]))
    >>> lo, hi
    (array([0.4 , 0.85]), array([0.6, 1. ]))
    """
    method = check_choice(method, "method", RANGE_METHODS)
    alpha = _check_alpha(alpha)
    low, high = check_bounds(bounds)
    if reference is None:
        raise TypeError("`reference` must be an array of reference rewards; got None.")
    inputs = _score_inputs(method, judge, sigma, lower, upper, reference)
    y = inputs.reference
    if y.size == 0:
        raise ValueError("`reference` must hold at least one labeled response; got none.")
    if (y < low).any() or (y > high).any():
        raise ValueError(f"`reference` must lie within `bounds` [{low!r}, {high!r}].")
    scores = _nonconformity(method, inputs).reshape(-1)
    radius: Mapping[Any, float]
    if categories is None:
        radius = MappingProxyType({None: conformal_quantile(scores, alpha)})
        labels_per_score = None
    else:
        labels, codes = category_codes(categories, inputs.shape)
        q = _quantiles_per_code(scores, codes, len(labels), alpha)
        pairs = list(zip(labels, q.tolist(), strict=True))
        plain = dict(pairs)
        # A dict would merge 1, True and 1.0: only then is a LabelMapping needed.
        radius = MappingProxyType(plain) if len(plain) == len(pairs) else LabelMapping(pairs)
        per_score = np.empty(codes.size, dtype=object)
        per_score[:] = [labels[c] for c in codes.tolist()]
        labels_per_score = _frozen(per_score)
    cal = RangeCalibration(method, alpha, (low, high), radius, _frozen(scores),
                           labels_per_score)
    if categories is not None:
        # The codes of the scores' labels, already known: smoothing needs them per category.
        object.__setattr__(cal, "_score_codes", _frozen(codes))
    return cal


def _quantiles_per_code(scores: np.ndarray, codes: np.ndarray, n: int,
                        alpha: float) -> np.ndarray:
    """:func:`conformal_quantile` of each category's scores, all categories in one sort."""
    order = np.lexsort((scores, codes))
    ordered = scores[order]
    size = np.bincount(codes, minlength=n)
    start = np.cumsum(size) - size
    ranks = {m: _rank(m, alpha) for m in set(size.tolist())}
    k = np.array([ranks[m] for m in size.tolist()], dtype=np.int64)
    q = np.full(n, math.inf)
    finite = k <= size
    q[finite] = ordered[start[finite] + k[finite] - 1]
    return q
