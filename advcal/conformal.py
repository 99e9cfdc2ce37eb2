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

from advcal._validation import as_float_array, check_bounds, check_choice, check_int, check_real

__all__ = [
    "conformal_rank",
    "conformal_quantile",
    "calibrate_ranges",
    "RangeCalibration",
    "RewardRanges",
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
        whole ``bounds``.
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
        from advcal.artefacts import validate_range_calibration

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
            keeps the endpoints of its range (the rewards whose score equals q̂) with
            probability ``(k - a) / (t + 1)``, where k is the conformal rank, a the
            number of calibration scores below q̂ and t the number equal to it, and
            otherwise gets the open range (each endpoint moved one float inward).  That
            is the tie-break of every score by an independent uniform, so coverage is
            ``k / (m + 1)``: within ``1 / (m + 1)`` of ``1 - alpha`` whatever the ties.
            Endpoints clipped to ``bounds`` and zero-width ranges are kept as they are.
        seed : int, SeedSequence or Generator, optional
            Seed of the tie-breaking draws (one uniform per response); only with
            ``smoothing=True``.

        Returns
        -------
        RewardRanges
            ``(lo, hi)`` in the shape of the inputs, clipped to ``bounds``; float32 if
            the inputs are float32 (rounded outward, so coverage survives the cast),
            else float64.

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
        radius = self._radius_per_response(categories, inputs.shape)
        if self.method == "cqr":
            lo = inputs.lower - radius
            hi = inputs.upper + radius
            # A negative radius can cross the bounds; the empty set it stands for holds
            # no reward, so any degenerate range around the midpoint keeps coverage.
            crossed = lo > hi
            if crossed.any():
                mid = 0.5 * (inputs.lower + inputs.upper)
                lo = np.where(crossed, mid, lo)
                hi = np.where(crossed, mid, hi)
        else:
            width = radius if self.method == "absolute" else radius * inputs.sigma
            lo = inputs.judge - width
            hi = inputs.judge + width
        with np.errstate(invalid="ignore"):  # inf radius times sigma is fine: clipped
            # Endpoints that clipping moved are not at score q̂: never opened.
            open_lo = lo >= self.bounds[0]
            open_hi = hi <= self.bounds[1]
            lo = np.clip(lo, *self.bounds)
            hi = np.clip(hi, *self.bounds)
        lo, hi = _outward_cast(lo, hi, inputs.dtype)
        if smoothing:
            keep = self._tie_probability(categories, inputs.shape)
            draw = np.random.default_rng(seed).random(inputs.shape)
            # Open the range one float inward (in the output dtype, after the cast).
            opened = (draw >= keep) & np.isfinite(np.asarray(radius)) & (lo < hi)
            inner_lo = np.where(opened & open_lo, np.nextafter(lo, hi), lo)
            inner_hi = np.where(opened & open_hi, np.nextafter(hi, lo), hi)
            apart = inner_lo <= inner_hi  # a range two floats wide stays closed
            lo = np.where(apart, inner_lo, lo)
            hi = np.where(apart, inner_hi, hi)
        return RewardRanges(lo, hi)

    def _tie_probability(self, categories: ArrayLike | None,
                         shape: tuple[int, ...]) -> np.ndarray:
        """Per response, the probability (k - a) / (t + 1) of keeping the tie at q̂."""
        if self.categories is None:
            groups = {None: self.scores}
        else:
            index = {key: i for i, key in enumerate(self.radius)}
            owner = np.array([index[lab] for lab in self.categories.tolist()], dtype=np.int64)
            groups = {key: self.scores[owner == i] for key, i in index.items()}
        per_key: dict[Any, float] = {}
        for key, scores in groups.items():
            q = self.radius[key]
            below = int((scores < q).sum())
            ties = int((scores == q).sum())
            k = _rank(scores.size, self.alpha)
            per_key[key] = (k - below) / (ties + 1) if ties else 1.0
        if self.categories is None:
            return np.full(shape, per_key[None])
        labels_new, codes = _category_codes(categories, shape)
        return np.array([per_key[lab] for lab in labels_new])[codes].reshape(shape)

    def _radius_per_response(self, categories: ArrayLike | None,
                             shape: tuple[int, ...]) -> np.ndarray | float:
        if self.categories is None:
            if categories is not None:
                raise ValueError(
                    "`categories` were not used at calibration; pass categories=None "
                    "(or calibrate per category)."
                )
            return self.radius[None]
        if categories is None:
            raise ValueError(
                "`categories` are required: the calibration is per category (Mondrian)."
            )
        labels, codes = _category_codes(categories, shape)
        per_label = np.empty(len(labels))
        for i, label in enumerate(labels):
            if label not in self.radius:
                known = ", ".join(repr(c) for c in list(self.radius)[:10])
                raise ValueError(
                    f"`categories` holds {label!r}, which was not seen at calibration "
                    f"(known: {known})."
                )
            per_label[i] = self.radius[label]
        return per_label[codes].reshape(shape)


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


def _category_codes(categories: Any, shape: tuple[int, ...]) -> tuple[list[Any], np.ndarray]:
    """Distinct labels and a code per response (flattened), for any hashable labels."""
    if isinstance(categories, (str, bytes)):
        raise TypeError("`categories` must be a sequence of labels, not a single string.")
    try:
        arr: np.ndarray | None = np.asarray(categories)
    except (TypeError, ValueError):  # ragged sequences of tuples and the like
        arr = None
    if (arr is not None and arr.dtype.kind in "US"
            and not isinstance(categories, np.ndarray)):
        # numpy would turn [1, "1"] (at any nesting) into ["1", "1"]: keep the labels'
        # own types, hashing them flat when they have the rewards' shape.
        labelled = np.asarray(categories, dtype=object)
        if labelled.shape == shape and not all(isinstance(c, (str, bytes))
                                               for c in labelled.reshape(-1)):
            return _hashed_codes(list(labelled.reshape(-1)))
        if arr.ndim == 1 and not all(isinstance(c, (str, bytes)) for c in categories):
            arr = None
    if arr is not None and arr.dtype.kind in "biufUS":
        if arr.shape == shape:
            if arr.dtype.kind == "f" and np.isnan(arr).any():
                raise ValueError("`categories` must not contain NaN.")
            labels, inverse = np.unique(arr.reshape(-1), return_inverse=True)
            return labels.tolist(), inverse.reshape(-1)
        if isinstance(categories, np.ndarray) or arr.ndim != 2 or len(shape) != 1:
            raise ValueError(f"`categories` must have shape {shape}; got {arr.shape}.")
    # Labels numpy cannot hold as one array (tuples, mixed types): one dict pass.
    try:
        items = list(categories)
    except TypeError:
        raise TypeError("`categories` must be a sequence of hashable labels.") from None
    if len(shape) != 1 or len(items) != shape[0]:
        raise ValueError(f"`categories` must have shape {shape}; got {len(items)} labels.")
    return _hashed_codes(items)


def _hashed_codes(items: list[Any]) -> tuple[list[Any], np.ndarray]:
    """Labels in order of first appearance and a code per label, by hashing."""
    seen: dict[Any, int] = {}
    codes = np.empty(len(items), dtype=np.int64)
    for i, label in enumerate(items):
        if isinstance(label, (float, np.floating)) and math.isnan(label):
            raise ValueError("`categories` must not contain NaN.")
        try:
            codes[i] = seen.setdefault(label, len(seen))
        except TypeError:
            raise TypeError(
                f"`categories` must hold hashable labels; got {type(label).__name__}."
            ) from None
    return list(seen), codes


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
        coverage holds within each category).
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
    if categories is None:
        radius: dict[Any, float] = {None: conformal_quantile(scores, alpha)}
        labels_per_score = None
    else:
        labels, codes = _category_codes(categories, inputs.shape)
        radius = {label: conformal_quantile(scores[codes == c], alpha)
                  for c, label in enumerate(labels)}
        per_score = np.empty(codes.size, dtype=object)
        per_score[:] = [labels[c] for c in codes]
        labels_per_score = _frozen(per_score)
    return RangeCalibration(method, alpha, (low, high), MappingProxyType(radius),
                            _frozen(scores), labels_per_score)
