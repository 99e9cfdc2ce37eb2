"""Scale diagnostics of group-relative advantages (``docs/maxnorm.md``).

The within-group denominator s_q of an estimator sets three things at once: the strength
of the reward branch, the weight 1/s_q of prompt q in the batch, and the effective KL
coefficient beta_eff,q = beta * s_q on the cardinal reward scale.  :func:`scale_diagnostics`
measures all three on a batch of rewards for several estimators side by side;
:func:`direction_cosine` compares the batch weight vectors of two scorings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from advcal._validation import BACKENDS, Batch, as_batch, as_float_array, check_choice, check_real
from advcal.registry import REGISTRY, DiagnosticSettings, Scaled

__all__ = ["DIAGNOSED_METHODS", "MethodDiagnostics", "ScaleDiagnostics", "direction_cosine",
           "scale_diagnostics"]

#: Estimators whose per-group scale s_q the diagnostics know: every registered one.
DIAGNOSED_METHODS = tuple(REGISTRY)


def direction_cosine(w_a: ArrayLike, w_b: ArrayLike) -> float:
    """Cosine of the angle between two batch weight vectors.

    ``<w_a, w_b> / (||w_a|| * ||w_b||)`` over all responses of the batch (both arrays
    flattened), e.g. the advantages of one estimator under two scorings of the same
    responses, or under noisy and clean rewards.  1 means the two scorings push the
    policy in the same direction; values near 0 mean the update direction is mostly
    noise.

    Parameters
    ----------
    w_a, w_b : array_like
        Finite weight vectors of the same shape (any layout, as long as both share it).

    Returns
    -------
    float
        The cosine, in ``[-1, 1]``; computed in float64 after scaling each vector by its
        largest magnitude, so it neither overflows nor underflows.

    Raises
    ------
    ValueError
        Different shapes, non-finite entries, or a zero (or empty) vector: a zero
        vector has no direction, so the cosine is undefined (there is no NaN-free value
        that would not be misread as "orthogonal" or "aligned").

    Examples
    --------
    >>> from advcal import direction_cosine
    >>> direction_cosine([[1.0, -1.0, 0.0]], [[1.0, 0.0, -1.0]])
    0.5
    >>> direction_cosine([1.0, 2.0], [-2.0, -4.0])
    -1.0
    """
    a = as_float_array(w_a, "w_a")
    b = as_float_array(w_b, "w_b")
    if a.shape != b.shape:
        raise ValueError(f"`w_a` and `w_b` must have the same shape; got {a.shape} and "
                         f"{b.shape}.")
    units = []
    for arr, name in ((a, "w_a"), (b, "w_b")):
        flat = arr.astype(np.float64).ravel()
        if not np.isfinite(flat).all():
            raise ValueError(f"`{name}` must be finite.")
        peak = float(np.max(np.abs(flat))) if flat.size else 0.0
        if peak == 0.0:
            raise ValueError(f"`{name}` is a zero (or empty) vector: it has no direction, "
                             "so the cosine is undefined.")
        units.append(flat / peak)
    ua, ub = units
    cosine = np.dot(ua, ub) / np.sqrt(np.dot(ua, ua)) / np.sqrt(np.dot(ub, ub))
    return float(np.clip(cosine, -1.0, 1.0))


@dataclass(frozen=True, eq=False)  # identity equality: fields hold arrays
class MethodDiagnostics:
    """Scale diagnostics of one estimator on one batch (definitions: :func:`scale_diagnostics`).

    Attributes
    ----------
    method : str
        The estimator.
    inverse_scale : ndarray of float64
        1/s_q of every informative group, in batch order (for plots).
    inverse_scale_p50, inverse_scale_p95, inverse_scale_p99, inverse_scale_max : float
        Percentiles (linear interpolation) and maximum of ``inverse_scale``.
    zero_gap_fraction : float
        Fraction of the groups with two or more responses that the method skips.
    beta_eff_min, beta_eff_max : float
        Range of beta_eff,q = beta * s_q over the informative groups (beta_q * s_q for
        an estimator with a per-group KL coefficient beta_q, e.g. grpo_kl_comp).
    reward_kl_ratio : float
        Mean over informative groups of R/KL_q = mean_i |u_i| / beta_eff,q.
    max_abs_weight : float
        Largest |w| over the whole batch.
    direction_cosine : float or None
        Cosine between the weight vectors of the rewards and of the ``reference``
        scoring (None without a reference; NaN when either vector is zero).
    n_informative : int
        Number of informative groups.
    """

    method: str
    inverse_scale: np.ndarray = field(repr=False)
    inverse_scale_p50: float
    inverse_scale_p95: float
    inverse_scale_p99: float
    inverse_scale_max: float
    zero_gap_fraction: float
    beta_eff_min: float
    beta_eff_max: float
    reward_kl_ratio: float
    max_abs_weight: float
    direction_cosine: float | None
    n_informative: int


def _fmt(value: float | None, width: int) -> str:
    # One leading space: a value as wide as its column (1.969e+06) must not touch the last.
    if value is None:
        return f" {'-':>{width - 1}}"
    if not np.isfinite(value):
        return f" {'n/a':>{width - 1}}"
    return f" {value:>{width - 1}.4g}"


@dataclass(frozen=True, eq=False)
class ScaleDiagnostics:
    """Result of :func:`scale_diagnostics`: one :class:`MethodDiagnostics` per method.

    Index it by method name (``diag["grpo"].inverse_scale_p99``); ``table()`` (also
    ``str(diag)``) formats a readable table.

    Attributes
    ----------
    methods : dict of str to MethodDiagnostics
        Per-method diagnostics, in the order requested.
    beta, tau_res, eps : float
        The options used.
    resolution : float or None
        The resolution MaxNorm binned to (None: no binning).
    n_groups : int
        Groups with two or more responses (the denominator of the zero-gap fraction).
    n_responses : int
        Responses in the batch.
    """

    methods: dict[str, MethodDiagnostics]
    beta: float
    tau_res: float
    eps: float
    resolution: float | None
    n_groups: int
    n_responses: int

    def __getitem__(self, method: str) -> MethodDiagnostics:
        return self.methods[method]

    def table(self) -> str:
        """The diagnostics as a fixed-width text table, one row per method."""
        with_cosine = any(d.direction_cosine is not None for d in self.methods.values())
        width = max(9, *(len(name) + 1 for name in self.methods))
        header = (f"{'method':<{width}}{'1/s P50':>10}{'1/s P95':>10}{'1/s P99':>10}{'1/s max':>10}"
                  f"{'zero-gap':>10}{'beta_eff min':>14}{'beta_eff max':>14}{'R/KL':>9}"
                  f"{'max|w|':>9}" + (f"{'cosine':>9}" if with_cosine else ""))
        lines = [header]
        for d in self.methods.values():
            lines.append(
                f"{d.method:<{width}}{_fmt(d.inverse_scale_p50, 10)}{_fmt(d.inverse_scale_p95, 10)}"
                f"{_fmt(d.inverse_scale_p99, 10)}{_fmt(d.inverse_scale_max, 10)}"
                f"{_fmt(d.zero_gap_fraction, 10)}{_fmt(d.beta_eff_min, 14)}"
                f"{_fmt(d.beta_eff_max, 14)}{_fmt(d.reward_kl_ratio, 9)}"
                f"{_fmt(d.max_abs_weight, 9)}"
                + (_fmt(d.direction_cosine, 9) if with_cosine else "")
            )
        resolution = "none" if self.resolution is None else f"{self.resolution:g}"
        lines.append(
            f"{self.n_groups} groups with >= 2 responses, {self.n_responses} responses; "
            f"beta = {self.beta:g}, tau_res = {self.tau_res:g} (MaxNorm cap 1/tau_res = "
            f"{1.0 / self.tau_res:g}), eps = {self.eps:g}, resolution = {resolution}"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


class _Groups:
    """Per-group facts of a grouped batch that every method's diagnostics share."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.sizes = batch.sizes
        self.codes = np.repeat(np.arange(self.sizes.size), self.sizes)
        self.scorable = self.sizes >= 2

    def mean_abs(self, weights: np.ndarray) -> np.ndarray:
        """Per group mean_i |w_i| (0 for empty groups)."""
        total = np.bincount(self.codes, np.abs(weights.astype(np.float64)), self.sizes.size)
        return total / np.maximum(self.sizes, 1)


def _method_weights(method: str, groups: _Groups, values: np.ndarray,
                    settings: DiagnosticSettings, options: dict[str, Any]) -> Scaled:
    """Weights (grouped order), per-group scale s_q and informative groups of one method."""
    return REGISTRY[method].scale(values, groups.batch.offsets, settings, dict(options))


def _percentiles(values: np.ndarray, q: tuple[float, ...]) -> tuple[list[float], float]:
    """``numpy.percentile(values, q)`` (linear) and the maximum of a non-empty 1-D array,
    from a partition around the order statistics they need (not a full sort)."""
    last = values.size - 1
    positions = []
    for p in q:
        h = last * (p / 100.0)
        lo = math.floor(h)
        positions.append((lo, min(lo + 1, last), h - lo))
    kth = sorted({k for lo, hi, _ in positions for k in (lo, hi)} | {last})
    x = np.partition(values, kth)
    out = []
    for lo, hi, t in positions:
        a, b = float(x[lo]), float(x[hi])
        # numpy's _lerp: from the nearer end, so that t = 1 gives b exactly
        out.append(b - (b - a) * (1.0 - t) if t >= 0.5 else a + (b - a) * t)
    return out, float(x[last])


class ScaleSummary(NamedTuple):
    """The inverse-scale statistics and zero-gap fraction of one method on one batch."""

    informative: np.ndarray
    inverse: np.ndarray
    p50: float
    p95: float
    p99: float
    top: float
    zero_gap_fraction: float


def scale_summary(scaled: Scaled, scorable: np.ndarray) -> ScaleSummary:
    """1/s_q of the informative groups, its P50/P95/P99 and max, and the fraction of the
    scorable groups (two or more valid responses; the rule's own if it omitted NaN)
    that the method skips: what :func:`scale_diagnostics` reports and what the TRL
    trainer logs every step (from the registry's scale rule, NaN for an empty set)."""
    if scaled.scorable is not None:
        scorable = scaled.scorable
    informative = scorable & scaled.informative
    inverse = 1.0 / scaled.scale[informative]
    n_scorable = int(np.count_nonzero(scorable))
    zero_gap = (n_scorable - inverse.size) / n_scorable if n_scorable else math.nan
    if not inverse.size:
        return ScaleSummary(informative, inverse, math.nan, math.nan, math.nan, math.nan,
                             zero_gap)
    (p50, p95, p99), top = _percentiles(inverse, (50.0, 95.0, 99.0))
    return ScaleSummary(informative, inverse, p50, p95, p99, top, zero_gap)


def _method_options(batch: Batch, options: Any, methods: tuple[str, ...]
                    ) -> dict[str, dict[str, Any]]:
    """Per-method keywords, per-response ones brought into grouped order."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TypeError("`options` must be a mapping of method name to keyword options; "
                        f"got {type(options).__name__}.")
    out: dict[str, dict[str, Any]] = {method: {} for method in methods}
    for method, keywords in options.items():
        if method not in out:
            raise ValueError(f"`options` has keywords for {method!r}, which is not one of "
                             f"`methods` {methods!r}.")
        if not isinstance(keywords, Mapping):
            raise TypeError(f"`options[{method!r}]` must be a mapping of keywords; "
                            f"got {type(keywords).__name__}.")
        entry = REGISTRY[method]
        for key, value in keywords.items():
            if key in ("group_ids", "backend"):
                raise ValueError(f"`options[{method!r}]` must not set {key!r} (pass it to "
                                 "scale_diagnostics itself).")
            out[method][key] = (batch.gather(value, f"options[{method!r}][{key!r}]")
                                if key in entry.per_response else value)
    return out


def _scale_diagnostics_iv(
    rewards: ArrayLike, offsets: ArrayLike | None, group_ids: ArrayLike | None,
    methods: Any, beta: Any, tau_res: Any, eps: Any, resolution: Any, reference: Any,
    options: Any, backend: Any,
) -> tuple[Batch, tuple[str, ...], float, DiagnosticSettings, dict[str, dict[str, Any]],
           np.ndarray | None]:
    if isinstance(methods, str):
        methods = (methods,)
    try:
        methods = tuple(methods)
    except TypeError:
        raise TypeError("`methods` must be a sequence of estimator names; "
                        f"got {type(methods).__name__}.") from None
    if not methods:
        raise ValueError("`methods` must name at least one estimator.")
    for method in methods:
        check_choice(method, "methods", DIAGNOSED_METHODS)
    if len(set(methods)) != len(methods):
        raise ValueError(f"`methods` must not repeat a name; got {methods!r}.")
    beta = check_real(beta, "beta", low=0.0, low_inclusive=False)
    tau = check_real(tau_res, "tau_res", low=0.0, low_inclusive=False)
    eps = check_real(eps, "eps", low=0.0)
    if resolution is not None:
        check_real(resolution, "resolution", low=0.0, high=1.0, low_inclusive=False)
    check_choice(backend, "backend", BACKENDS)
    batch = as_batch(rewards, offsets, group_ids)
    if not np.isfinite(batch.values).all():
        raise ValueError("`rewards` must be finite (NaN or inf found).")
    second = None
    if reference is not None:
        second = batch.gather(reference, "reference")
        if not np.isfinite(second).all():
            raise ValueError("`reference` must be finite (NaN or inf found).")
        second = second.astype(batch.values.dtype)
    if not (batch.sizes >= 2).any():
        raise ValueError("`rewards` hold no group with two or more responses; the scale "
                         "diagnostics need at least one.")
    settings = DiagnosticSettings(eps, tau, resolution, backend)
    return batch, methods, beta, settings, _method_options(batch, options, methods), second


def scale_diagnostics(
    rewards: ArrayLike,
    offsets: ArrayLike | None = None,
    *,
    group_ids: ArrayLike | None = None,
    methods: Sequence[str] = ("grpo", "rloo", "maxnorm"),
    beta: float = 0.04,
    tau_res: float = 0.01,
    eps: float = 1e-6,
    resolution: float | None = None,
    reference: ArrayLike | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    backend: str = "numba",
) -> ScaleDiagnostics:
    """Per-estimator scale diagnostics of a batch of rewards.

    Every registered estimator (:data:`advcal.ESTIMATORS`) gives group q the weights
    w_i = u_i / s_q, with u its baseline-corrected rewards in reward units and s_q its
    per-group scale, as :mod:`advcal.registry` defines them.  For instance GRPO
    ``s_q = sigma_q + eps`` (sample std, ddof 1); Dr.GRPO, RLOO (u: each reward minus the
    mean of the others), OPO and Range-GRPO 1; batch_std ``std_batch + eps``; GPG
    ``f_norm * k / N``; MaxNorm ``max(max_i |u_i|, tau_res)`` (RLOO baseline).  For each
    method:

    * **inverse scale** 1/s_q per group, the prompt's weight in the batch (MaxNorm's is
      at most 1/tau_res).  Reported: P50, P95, P99 (``numpy.percentile``, linear
      interpolation) and max.
    * **zero-gap fraction**: among groups with two or more responses, the fraction the
      method skips (all rewards equal; for MaxNorm with ``resolution``, all binned
      rewards equal; for pass@k a tie for the best reward).
    * **beta_eff range**: min and max of beta_eff,q = beta * s_q (``grpo_kl_comp``, GRPO
      with beta_q = beta / s_q: beta for every group).
    * **R/KL**: the reward-to-KL ratio on the cardinal reward scale,
      R/KL_q = mean_i |u_i| / beta_eff,q (= mean_i |w_i| / beta with one beta), averaged
      over groups.
    * **max |w|** over the whole batch.
    * **direction cosine** (with ``reference``): :func:`direction_cosine` between the
      method's weight vectors of ``rewards`` and of ``reference``.

    The per-group statistics (inverse scale, beta_eff, R/KL) run over the method's
    *informative* groups: two or more responses and not skipped.  Groups with fewer than
    two responses carry no relative information and enter no statistic.

    Parameters
    ----------
    rewards : array_like, shape (B, G) or (N,)
        Finite scalar rewards; 2-D rows are groups, 1-D needs ``offsets`` or
        ``group_ids``.
    offsets : array_like of int, shape (B + 1,), optional
        CSR group boundaries for 1-D ``rewards``.
    group_ids : sequence of hashable, length N, optional
        Per-response group labels for 1-D ``rewards``, any order.
    methods : sequence of str
        Keys of :data:`advcal.ESTIMATORS` to diagnose, in table order.
    beta : float, default 0.04
        The KL coefficient ``beta > 0``.
    tau_res : float, default 0.01
        MaxNorm's scale floor.
    eps : float, default 1e-6
        The ``eps`` of the estimators that divide by ``std + eps``: grpo, batch_std,
        passk (verl's default).
    resolution : float, optional
        Let MaxNorm bin the rewards first (bounds (0, 1)), as the Reward-Resolution
        Protocol does; the other methods see the raw rewards.
    reference : array_like, optional
        A second scoring of the same responses (same shape and order as ``rewards``),
        e.g. clean rewards or another grader; adds the direction cosine.
    options : mapping of str to mapping, optional
        Further keywords per method, e.g. ``{"opo": {"lengths": lengths}}`` or
        ``{"gpg": {"f_norm": 2.0}}``; per-response ones in the layout of ``rewards``.
        Without them each estimator takes its defaults; OPO without ``lengths`` counts
        every response once (baseline: the group mean), Range-GRPO takes each reward as
        the point range [r, r] unless given ``lo`` and ``hi``.
    backend : {"numba", "numpy"}, default "numba"
        Engine of the estimators.

    Returns
    -------
    ScaleDiagnostics
        Per-method :class:`MethodDiagnostics`; ``str()`` gives the table.  Statistics
        over an empty set of groups (no informative group) are NaN, as is a cosine with
        a zero weight vector; the table prints them as ``n/a``.

    Raises
    ------
    ValueError
        Non-finite rewards, no group with two or more responses, invalid options.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal import scale_diagnostics
    >>> rewards = np.array([[1.0, 0.0, 1.0, 0.0], [0.7, 0.7001, 0.7, 0.6999],
    ...                     [0.5, 0.5, 0.5, 0.5]])
    >>> diag = scale_diagnostics(rewards, tau_res=0.01)
    >>> round(diag["grpo"].inverse_scale_max)
    12099
    >>> diag["maxnorm"].inverse_scale_max
    100.0
    >>> diag["rloo"].zero_gap_fraction
    0.3333333333333333
    """
    batch, methods, beta, settings, method_options, second = _scale_diagnostics_iv(
        rewards, offsets, group_ids, methods, beta, tau_res, eps, resolution, reference,
        options, backend,
    )
    groups = _Groups(batch)
    out = {}
    for method in methods:
        scaled = _method_weights(method, groups, batch.values, settings,
                                 method_options[method])
        weights, scale, kl_weight = scaled.weights, scaled.scale, scaled.kl_weight
        summary = scale_summary(scaled, groups.scorable)
        informative, inverse = summary.informative, summary.inverse
        # An estimator that adjusts the KL coefficient per group (beta_q = beta * kl_weight)
        # has beta_eff,q = beta_q * s_q.
        kl = np.ones(inverse.size) if kl_weight is None else kl_weight[informative]
        beta_eff = beta * kl * scale[informative]
        if inverse.size:
            stats = (float(beta_eff.min()), float(beta_eff.max()),
                     float(np.mean(groups.mean_abs(weights)[informative] / (beta * kl))))
        else:
            stats = (np.nan,) * 3
        cosine = None
        if second is not None:
            other = _method_weights(method, groups, second, settings,
                                    method_options[method]).weights
            try:
                cosine = direction_cosine(weights, other)
            except ValueError:  # a zero weight vector: no direction to compare
                cosine = np.nan
        out[method] = MethodDiagnostics(
            method=method,
            inverse_scale=inverse,
            inverse_scale_p50=summary.p50,
            inverse_scale_p95=summary.p95,
            inverse_scale_p99=summary.p99,
            inverse_scale_max=summary.top,
            zero_gap_fraction=summary.zero_gap_fraction,
            beta_eff_min=stats[0],
            beta_eff_max=stats[1],
            reward_kl_ratio=stats[2],
            max_abs_weight=float(np.max(np.abs(weights))) if weights.size else 0.0,
            direction_cosine=cosine,
            n_informative=int(inverse.size),
        )
    return ScaleDiagnostics(out, beta, settings.tau_res, settings.eps, resolution,
                            int(np.sum(groups.scorable)), int(batch.values.size))
