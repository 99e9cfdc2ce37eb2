"""Drift check: does a calibration still cover on fresh paired scorings?

A calibration is computed once and used for a whole training run.  If the grader drifts
(noisier scores, a new judge version, a shifted prompt mix), its sets or ranges stop
holding the second scoring as often as promised.  :func:`calibration_drift` measures the
empirical coverage on fresh paired scorings and tests it against the promised 1 − α with
a one-sided exact binomial test; a trainer can call it every N steps and log the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import numpy as np
from numpy.typing import ArrayLike

from advcal._validation import check_real

__all__ = ["CalibrationDrift", "calibration_drift"]


class CalibrationDrift(NamedTuple):
    """Result of :func:`calibration_drift`.

    Attributes
    ----------
    coverage : float
        Fraction of the fresh units whose second scoring lies in the set or range built
        from the first: ``covered / n``.
    covered, n : int
        Covered units and units tested (groups with two or more responses for a
        :class:`~advcal.SetCalibration`, responses for a :class:`~advcal.RangeCalibration`).
    target : float
        The promised coverage 1 − α.
    p_value : float
        One-sided exact binomial p-value of "coverage ≥ target": P(Bin(n, target) ≤
        covered).  Small means the calibration no longer covers (drift).
    p_value_exchangeable : float
        The same test accounting for the calibration's own size m: a calibration covers
        a fresh unit with a probability that is itself random, Beta(k, m + 1 − k) with k
        the conformal rank, so under no drift ``covered`` follows BetaBinomial(n, k,
        m + 1 − k) and this p-value is P(that ≤ covered).  Exact for exchangeable units
        with untied scores; prefer it when n is not much smaller than m.  NaN for a
        Mondrian (per-category) range calibration.
    interval : tuple of float
        Two-sided Clopper-Pearson interval of the coverage at ``confidence``.
    inside : ndarray of bool
        Per unit: whether it was covered (groups in grouped order, or responses in the
        caller's shape).
    """

    coverage: float
    covered: int
    n: int
    target: float
    p_value: float
    p_value_exchangeable: float
    interval: tuple[float, float]
    inside: np.ndarray


def _binomial(covered: int, n: int, target: float, confidence: float
              ) -> tuple[float, tuple[float, float]]:
    from scipy.stats import binomtest

    result = binomtest(covered, n, target, alternative="less")
    ci = binomtest(covered, n, target).proportion_ci(confidence_level=confidence,
                                                     method="exact")
    return float(result.pvalue), (float(ci.low), float(ci.high))


def calibration_drift(
    calibration: Any,
    scores_a: ArrayLike | None,
    scores_b: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    noise_var: ArrayLike | None = None,
    sigma: ArrayLike | None = None,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    categories: ArrayLike | None = None,
    confidence: float = 0.95,
) -> CalibrationDrift:
    """Empirical coverage of a calibration on fresh paired scorings, with a binomial test.

    For a :class:`~advcal.SetCalibration`: build the JRSC set of each fresh group from its
    first scoring ``scores_a`` and count the groups (of two or more responses) whose
    second scoring's coefficients T(``scores_b``) lie in it.  For a
    :class:`~advcal.RangeCalibration`: ``scores_a`` are judge scores (None for
    ``"cqr"``, which reads ``lower``/``upper``), ``scores_b`` reference rewards, and the
    unit is a response whose reference lies in its range.

    Without drift the coverage is at least 1 − α (the conformal guarantee, marginally
    over calibrations) and the p-value is not small.

    Parameters
    ----------
    calibration : SetCalibration or RangeCalibration
        The calibration in use (e.g. from :func:`advcal.load_calibration`).
    scores_a : array_like or None
        Sets: the first scoring of the fresh responses, shape (B, G) or (N,).  Ranges:
        judge scores (any shape).
    scores_b : array_like
        Sets: an independent second scoring of the same responses.  Ranges: reference
        rewards, the shape of the judge scores, within the calibration's ``bounds`` (as
        :func:`advcal.calibrate_ranges` takes them).  Where the set estimator has reward
        bounds and no ``clip`` in its ``options`` (maxnorm), both scorings must lie
        within them.
    offsets, group_ids : array_like, optional
        Group layout of 1-D scores (sets only).
    noise_var : array_like, optional
        Per-response grader variances for a ``noise="diagonal"`` set calibration.
    sigma, lower, upper, categories : array_like, optional
        Per-response inputs of the range method, as in :meth:`RangeCalibration.ranges`.
    confidence : float, default 0.95
        Confidence level of ``interval``.

    Returns
    -------
    CalibrationDrift
        ``coverage``, ``covered``, ``n``, ``target``, ``p_value``,
        ``p_value_exchangeable``, ``interval``, ``inside``.

    Examples
    --------
    >>> from advcal import calibrate_sets, calibration_drift
    >>> from advcal.simulate import paired_scorings
    >>> cal = calibrate_sets(*paired_scorings(2000, 8, scale=0.02, seed=0).scores,
    ...                      alpha=0.1)
    >>> same = paired_scorings(1000, 8, scale=0.02, seed=1)
    >>> calibration_drift(cal, same.a, same.b).p_value > 0.01
    True
    >>> noisier = paired_scorings(1000, 8, scale=0.04, seed=2)
    >>> drift = calibration_drift(cal, noisier.a, noisier.b)
    >>> drift.coverage < 0.9, drift.p_value < 1e-6
    (True, True)
    """
    from advcal.conformal import RangeCalibration
    from advcal.sets import SetCalibration

    confidence = check_real(confidence, "confidence", low=0.0, high=1.0, low_inclusive=False,
                            high_inclusive=False)
    if isinstance(calibration, SetCalibration):
        for name, value in (("sigma", sigma), ("lower", lower), ("upper", upper),
                            ("categories", categories)):
            if value is not None:
                raise ValueError(f"`{name}` is for a RangeCalibration; pass None with a "
                                 "SetCalibration.")
        inside = _set_coverage(calibration, scores_a, scores_b, offsets, group_ids, noise_var)
    elif isinstance(calibration, RangeCalibration):
        for name, value in (("offsets", offsets), ("group_ids", group_ids),
                            ("noise_var", noise_var)):
            if value is not None:
                raise ValueError(f"`{name}` is for a SetCalibration; pass None with a "
                                 "RangeCalibration.")
        inside = _range_coverage(calibration, scores_a, scores_b, sigma, lower, upper,
                                 categories)
    else:
        raise TypeError("`calibration` must be a SetCalibration or RangeCalibration; got "
                        f"{type(calibration).__name__}.")
    n = int(inside.size)
    if n == 0:
        raise ValueError("`scores_a` must hold at least one unit to test (for sets: a group "
                         "with two or more responses).")
    covered = int(np.count_nonzero(inside))
    target = 1.0 - float(calibration.alpha)
    p_value, interval = _binomial(covered, n, target, confidence)
    exchangeable = _beta_binomial_p(calibration, covered, n)
    return CalibrationDrift(covered / n, covered, n, target, p_value, exchangeable, interval,
                            inside)


def _beta_binomial_p(cal: Any, covered: int, n: int) -> float:
    from scipy.stats import betabinom

    from advcal.conformal import conformal_rank

    categories = getattr(cal, "categories", None)
    if categories is not None:
        return float("nan")
    m = int(cal.scores.size)
    k = conformal_rank(m, float(cal.alpha))
    if k > m:  # infinite radius: every unit is covered
        return 1.0
    return float(min(1.0, betabinom.cdf(covered, n, k, m + 1 - k)))


def _set_coverage(cal: Any, scores_a: Any, scores_b: Any, offsets: Any, group_ids: Any,
                  noise_var: Any) -> np.ndarray:
    from advcal._blocks import centered
    from advcal._validation import as_float_array
    from advcal.sets import coefficient_sets, transform_checked

    if scores_a is None:
        raise TypeError("`scores_a` must be the first scoring of the fresh groups; got None.")
    # An estimator with reward bounds (maxnorm) and no clipping refuses rewards outside
    # them: say which scoring holds them, before the estimator names its own `rewards`.
    bounds = cal.options.get("bounds")
    checked = bounds is not None and not cal.options.get("clip", False)
    if checked:
        scores_a = as_float_array(scores_a, "scores_a")
        _check_within(scores_a, bounds, "scores_a", "the calibration's `options['bounds']`")
    sets = coefficient_sets(scores_a, offsets, group_ids=group_ids, calibration=cal,
                            noise_var=noise_var)
    values_b = sets.batch.gather(scores_b, "scores_b")
    if not np.isfinite(values_b).all():
        raise ValueError("`scores_b` must be finite.")
    if checked:
        _check_within(values_b, bounds, "scores_b", "the calibration's `options['bounds']`")
    other = transform_checked(values_b, sets.offsets, cal.estimator, cal.eps, cal.ddof,
                              cal.options)
    d = sets.geometry.quad_pinv(centered(other - sets.geometry.centers, sets.offsets))
    # Membership exactly as calibration scored it: d_q = sqrt(δᵀ S⁺ δ) ≤ ρ.
    distances = np.sqrt(np.clip(d, 0.0, None))
    informative = sets.batch.sizes >= 2
    return np.asarray(distances[informative] <= cal.rho)


def _range_coverage(cal: Any, judge: Any, reference: Any, sigma: Any, lower: Any, upper: Any,
                    categories: Any) -> np.ndarray:
    from advcal._validation import as_float_array

    lo, hi = cal.ranges(judge, sigma=sigma, lower=lower, upper=upper, categories=categories)
    ref = as_float_array(reference, "scores_b")
    if ref.shape != lo.shape:
        raise ValueError(f"`scores_b` (reference rewards) must have shape {lo.shape}; got "
                         f"{ref.shape}.")
    if not np.isfinite(ref).all():
        raise ValueError("`scores_b` must be finite.")
    # calibrate_ranges takes references only within the bounds, and the ranges are clipped
    # to them: a reference outside could never be covered, so it is an error, not a miss.
    _check_within(ref, cal.bounds, "scores_b", "the calibration's `bounds`")
    return np.asarray((lo <= ref) & (ref <= hi))


def _check_within(values: np.ndarray, bounds: Any, name: str, what: str) -> None:
    """Raise a ValueError naming ``name`` where a (non-NaN) value lies outside ``bounds``."""
    low, high = (float(b) for b in bounds)
    outside = (values < low) | (values > high)
    if outside.any():
        bad = values[outside]
        raise ValueError(f"`{name}` must lie within {what} [{low!r}, {high!r}]; got "
                         f"{bad.size} value(s) outside, in [{float(bad.min())!r}, "
                         f"{float(bad.max())!r}].")


# --------------------------------------------------------------------------- cross-fitting
# The coverage estimates that ``advcal calibrate`` prints beside a calibration it writes:
# every unit is tested by a calibration that did not see it.


class CrossFittedCoverage(NamedTuple):
    """A K-fold cross-fitted coverage estimate: ``covered`` of ``n`` held-out units.

    Attributes
    ----------
    covered, n : int
        Held-out units covered, and tested (groups with two or more responses for
        sets, responses for ranges).
    folds : int
        K, the folds asked for (a fold with no unit is not run).
    target : float
        The promised coverage 1 − α.
    interval : tuple of float
        Two-sided Clopper-Pearson interval of the coverage at ``confidence``; NaN when
        ``n`` is 0.
    skipped : int
        Units that could not be tested (for ranges: a category's only response).
    confidence : float
        Confidence level of ``interval``.
    """

    covered: int
    n: int
    folds: int
    target: float
    interval: tuple[float, float]
    skipped: int = 0
    confidence: float = 0.95

    @property
    def estimate(self) -> float:
        """``covered / n`` (NaN when no unit was tested)."""
        return self.covered / self.n if self.n else float("nan")


def _cross_fitted(covered: int, n: int, folds: int, target: float, skipped: int,
                  confidence: float) -> CrossFittedCoverage:
    if n == 0:
        return CrossFittedCoverage(0, 0, folds, target, (float("nan"), float("nan")),
                                   skipped, confidence)
    _, interval = _binomial(covered, n, target, confidence)
    return CrossFittedCoverage(covered, n, folds, target, interval, skipped, confidence)


def _fold_options(alpha: Any, folds: Any, confidence: Any) -> tuple[float, int, float]:
    from advcal._validation import check_int

    alpha = check_real(alpha, "alpha", low=0.0, high=1.0, low_inclusive=False,
                       high_inclusive=False)
    folds = check_int(folds, "folds")
    if folds < 2:
        raise ValueError(f"`folds` must be at least 2; got {folds}.")
    confidence = check_real(confidence, "confidence", low=0.0, high=1.0,
                            low_inclusive=False, high_inclusive=False)
    return alpha, folds, confidence


def select_groups(values: np.ndarray, offsets: np.ndarray, groups: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The groups ``groups`` (indices, in the order given) of a grouped flat array, as a
    grouped flat array: ``(values, offsets)``.

    ``offsets`` may be any CSR offsets of ``values``: those of the responses, or of
    per-group n_q × n_q blocks (:func:`advcal._blocks.block_offsets`) to select Gram
    blocks.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    groups = np.asarray(groups, dtype=np.int64).reshape(-1)
    sizes = offsets[groups + 1] - offsets[groups]
    out = np.zeros(groups.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    # Position j of the output reads offsets[g] + (j - out[k]) for the group k it lies in.
    take = np.repeat(offsets[groups] - out[:-1], sizes) + np.arange(out[-1], dtype=np.int64)
    return values[take], out


def cross_fitted_set_coverage(
    scores_a: ArrayLike,
    scores_b: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    alpha: float,
    folds: int = 5,
    seed: Any = 0,
    confidence: float = 0.95,
    **options: Any,
) -> CrossFittedCoverage:
    """K-fold cross-fitted coverage of JRSC sets on paired scorings.

    The groups with two or more responses are split at random into ``folds`` folds.
    Each fold is tested by :func:`advcal.calibrate_sets` fitted on the other folds: a
    group is covered when the coefficients of its second scoring lie in the set built
    from its first (:func:`calibration_drift`).  The held-out counts are pooled.  With
    more folds than groups, the extra folds are empty: leave-one-out.

    Since each calibration sees (K − 1)/K of the groups, the estimate is of a
    calibration slightly smaller than one fitted on all of them: without drift it lies
    in [1 − α, 1 − α + 1/(m′ + 1)] in expectation, m′ a fold's calibration size.

    Parameters
    ----------
    scores_a, scores_b : array_like
        Two scorings of the same responses, shape (B, G), or (N,) with ``offsets`` or
        ``group_ids``.
    offsets, group_ids : array_like, optional
        Group layout of 1-D scores.
    alpha : float
        Miscoverage level of the sets, in (0, 1).
    folds : int, default 5
        K, at least 2.
    seed : int or numpy seed, default 0
        Seed of the random split (``numpy.random.default_rng``).
    confidence : float, default 0.95
        Confidence level of the interval.
    **options
        Further keywords of :func:`advcal.calibrate_sets` (``estimator``, ``shape``,
        ``ridge``, ``eps``, ``ddof``, ``options``, ...).

    Returns
    -------
    CrossFittedCoverage
        ``covered`` of ``n`` held-out groups, with its Clopper-Pearson interval.

    Examples
    --------
    >>> from advcal.drift import cross_fitted_set_coverage
    >>> from advcal.simulate import paired_scorings
    >>> pair = paired_scorings(500, 8, scale=0.02, seed=0)
    >>> cov = cross_fitted_set_coverage(pair.a, pair.b, alpha=0.1)
    >>> cov.n, cov.folds, cov.interval[0] < 0.9 < cov.interval[1]
    (500, 5, True)
    """
    from advcal._validation import as_batch
    from advcal.sets import calibrate_sets

    alpha, folds, confidence = _fold_options(alpha, folds, confidence)
    batch = as_batch(scores_a, offsets, group_ids, name="scores_a")
    a, b, offs = batch.values, batch.gather(scores_b, "scores_b"), batch.offsets
    informative = np.flatnonzero(np.diff(offs) >= 2)
    rng = np.random.default_rng(seed)
    fold = np.empty(informative.size, np.int64)
    fold[rng.permutation(informative.size)] = np.arange(informative.size) % folds
    covered = n = 0
    for k in range(min(folds, informative.size)):  # the other folds are empty
        test, train = np.sort(informative[fold == k]), np.sort(informative[fold != k])
        if not test.size or not train.size:
            continue
        ta, toff = select_groups(a, offs, train)
        cal = calibrate_sets(ta, select_groups(b, offs, train)[0], toff, alpha=alpha,
                             **options)
        va, voff = select_groups(a, offs, test)
        drift = calibration_drift(cal, va, select_groups(b, offs, test)[0], voff)
        covered += drift.covered
        n += drift.n
    return _cross_fitted(covered, n, folds, 1.0 - alpha, 0, confidence)


def cross_fitted_range_coverage(
    judge: ArrayLike | None,
    reference: ArrayLike,
    *,
    alpha: float,
    folds: int = 5,
    seed: Any = 0,
    sigma: ArrayLike | None = None,
    lower: ArrayLike | None = None,
    upper: ArrayLike | None = None,
    categories: ArrayLike | None = None,
    confidence: float = 0.95,
    **options: Any,
) -> CrossFittedCoverage:
    """K-fold cross-fitted coverage of conformal reward ranges on labeled responses.

    The responses are split at random into ``folds`` folds, stratified by category
    (each category's responses are dealt round the folds from a random fold on).  Each
    fold is tested by :func:`advcal.calibrate_ranges` fitted on the other folds: a
    response is covered when its reference lies in its range.  A response whose
    category has no other response cannot be tested: it is counted in ``skipped``.

    Parameters
    ----------
    judge : array_like or None
        Judge scores, one per response (None for ``method="cqr"``).
    reference : array_like
        Reference rewards, the shape of the judge scores.
    alpha : float
        Miscoverage level of the ranges, in (0, 1).
    folds : int, default 5
        K, at least 2; more folds than responses of a category leave some empty.
    seed : int or numpy seed, default 0
        Seed of the random split.
    sigma, lower, upper, categories : array_like, optional
        Per-response inputs of the range method, as in :func:`advcal.calibrate_ranges`.
    confidence : float, default 0.95
        Confidence level of the interval.
    **options
        Further keywords of :func:`advcal.calibrate_ranges` (``method``, ``bounds``).

    Returns
    -------
    CrossFittedCoverage
        ``covered`` of ``n`` held-out responses, ``skipped`` untestable ones.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal.drift import cross_fitted_range_coverage
    >>> rng = np.random.default_rng(0)
    >>> reference = rng.uniform(0.2, 0.8, 1000)
    >>> judge = reference + rng.normal(0.0, 0.05, 1000)
    >>> cov = cross_fitted_range_coverage(judge, reference, alpha=0.1)
    >>> cov.n, cov.interval[0] < 0.9 < cov.interval[1]
    (1000, True)
    """
    from advcal._validation import as_float_array
    from advcal.conformal import calibrate_ranges
    from advcal.layouts import label_key

    alpha, folds, confidence = _fold_options(alpha, folds, confidence)
    ref = as_float_array(reference, "reference")
    shape = ref.shape
    per_response: dict[str, np.ndarray] = {}
    for name, value in (("judge", judge), ("sigma", sigma), ("lower", lower),
                        ("upper", upper)):
        if value is not None:
            arr = as_float_array(value, name)
            if arr.shape != ref.shape:
                raise ValueError(f"`{name}` must have the shape of `reference` {ref.shape}; "
                                 f"got {arr.shape}.")
            per_response[name] = arr.reshape(-1)
    ref = ref.reshape(-1)
    m = ref.size
    labels: list[Any] = [None] * m
    if isinstance(categories, np.ndarray):
        if categories.shape != shape:
            raise ValueError(f"`categories` must have the shape of `reference` {shape}; got "
                             f"{categories.shape}.")
        labels = categories.reshape(-1).tolist()
    elif categories is not None:
        if isinstance(categories, (str, bytes)):
            raise TypeError("`categories` must be a sequence of labels, not a single string.")
        labels = list(cast(Sequence[Any], categories))
        if len(labels) != m:
            raise ValueError(f"`categories` must hold one label per response ({m}); got "
                             f"{len(labels)}.")
    rng = np.random.default_rng(seed)
    fold = np.full(m, -1, np.int64)
    by_label: dict[Any, list[int]] = {}
    for i, lab in enumerate(labels):  # advcal's label rule: 1, 1.0 and True differ
        try:
            by_label.setdefault(label_key(lab), []).append(i)
        except TypeError:
            raise TypeError(f"`categories` must hold hashable labels; got "
                            f"{type(lab).__name__}.") from None
    skipped = 0
    for members in by_label.values():
        if len(members) < 2:
            skipped += len(members)
            continue
        idx = np.array(members)[rng.permutation(len(members))]
        fold[idx] = (np.arange(idx.size) + int(rng.integers(folds))) % folds

    def part(mask: np.ndarray) -> tuple[np.ndarray | None, dict[str, Any]]:
        out: dict[str, Any] = {name: per_response[name][mask]
                               for name in ("sigma", "lower", "upper") if name in per_response}
        if categories is not None:
            out["categories"] = [labels[i] for i in np.flatnonzero(mask)]
        scores = per_response.get("judge")
        return (None if scores is None else scores[mask]), out

    covered = n = 0
    for k in np.unique(fold[fold >= 0]):  # the folds that hold a response
        test, train = fold == k, (fold != k) & (fold >= 0)
        judge_train, train_inputs = part(train)
        cal = calibrate_ranges(judge_train, ref[train], alpha=alpha, **options,
                               **train_inputs)
        judge_test, test_inputs = part(test)
        lo, hi = cal.ranges(judge_test, **test_inputs)
        covered += int(np.count_nonzero((lo <= ref[test]) & (ref[test] <= hi)))
        n += int(test.sum())
    return _cross_fitted(covered, n, folds, 1.0 - alpha, skipped, confidence)
