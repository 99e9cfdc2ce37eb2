"""``advcal demo``: a tour of advcal on built-in data.

The estimators on a synthetic batch, the scale-diagnostics table of a built-in reward log,
the coverage of split-conformal reward ranges over repeated simulated splits, and a SetGRPO
run (JRSC sets, SRGO threshold selection, one step); ``--out DIR`` also draws the figures.
The data functions (:func:`demo_batch`, :func:`demo_reward_log`, ...) are importable from
:mod:`advcal.cli` for tests and docs.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from advcal.cli._args import Command, path_arg, seed_arg
from advcal.cli._errors import CommandError
from advcal.cli._output import (
    Column,
    _Bar,
    _figure,
    _no_bar,
    _progress_enabled,
    _save_figure,
    check_plot_target,
    need_matplotlib,
    srgo_table,
)
from advcal.cli.diagnose import _plot
from advcal.conformal import calibrate_ranges, conformal_rank
from advcal.diagnostics import ScaleDiagnostics, scale_diagnostics
from advcal.estimators import grpo
from advcal.recovery import Recovery
from advcal.registry import ESTIMATORS, REGISTRY
from advcal.risk import ThresholdSelection, select_threshold, setgrpo
from advcal.sets import SetCalibration, calibrate_sets, coefficient_sets
from advcal.simulate import PairedScorings, grade, gram_matrices, paired_scorings

NAME = "demo"
HELP = "a tour of advcal on built-in synthetic data"

# MaxNorm's scale floor in the demo.
_DEMO_TAU_RES = 0.01
# The required estimator keywords the demo batch can supply (the lengths come with it).
_DEMO_NEEDS = frozenset({"lengths", "tau_res"})
# The demo's estimators: the registered ones of point rewards whose required keywords the
# demo can supply (others, such as interval estimators, need inputs it does not have).
_DEMO_ESTIMATORS = tuple(name for name, entry in REGISTRY.items()
                         if not entry.ranges and _DEMO_NEEDS.issuperset(entry.needs))


class _DemoSizes(NamedTuple):
    """How much the demo simulates (the tour's runtime is set here and nowhere else)."""

    coverage_splits: int  # calibration/test splits per calibration size m
    coverage_tests: int  # fresh test responses per split
    set_calibration: int  # groups that calibrate the JRSC radius
    set_coverage: int  # fresh groups the set coverage is measured on
    risk_calibration: int  # groups with a reference scoring that select tau
    train: int  # training groups of the SetGRPO step


# These sizes keep the whole `advcal demo` to seconds on two cores once the Numba kernels are
# cached; the very first run also compiles them.
_DEMO_SIZES = _DemoSizes(coverage_splits=2000, coverage_tests=100, set_calibration=2000,
                         set_coverage=4000, risk_calibration=8000, train=2000)

# Conformal coverage table: levels, calibration sizes m and range methods.
_COVERAGE_ALPHAS = (0.05, 0.1, 0.2)
_COVERAGE_M = (19, 99)
_COVERAGE_METHODS = ("absolute", "normalized")
_JUDGE_SAMPLES = 5
# Tolerances are this many standard errors: the tables hold a few dozen checks.
_Z = 4.0

# SetGRPO run: groups of 8, a Gaussian grader (noise sd 0.05), JRSC level alpha, SRGO
# target risk beta at confidence 1 - delta over the threshold grid.  The reference scoring
# is a noisier independent grading, so reversals are common and their risk falls as tau
# tightens: at this beta the gate binds (tau_sel inside the grid, as notebook 5).
_SET_GROUP = 8
_SET_NOISE = 0.05
_SET_REF_NOISE = 0.3
_SET_ALPHA = 0.2
_SET_BETA = 0.22
_SET_DELTA = 0.1
_SET_THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(10, -1, -1))

# Independent random streams of the demo's simulations, keyed with the user's seed.
_STREAM_COVERAGE = 1
_STREAM_SETGRPO = 2


def demo_batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The built-in synthetic batch: verifier-style rewards in [0, 1], groups of 8.

    Returns ``(rewards, lengths)`` of shape (6, 8): a binary group, a mixed group, an
    all-correct (zero-gap) group, two low-variance groups with sub-resolution jitter, and
    a graded group.
    """
    rng = np.random.default_rng(seed)
    rewards = np.array([
        [1, 0, 0, 1, 0, 0, 0, 1],
        [1, 1, 0, 1, 1, 0, 1, 1],
        [1, 1, 1, 1, 1, 1, 1, 1],
        0.70 + rng.normal(0.0, 1e-4, 8),
        0.30 + rng.normal(0.0, 1e-3, 8),
        rng.uniform(0.0, 1.0, 8),
    ], dtype=np.float64)
    lengths = rng.integers(50, 500, size=rewards.shape).astype(np.float64)
    return rewards, lengths


def demo_reward_log(seed: int = 0, n_groups: int = 512, group_size: int = 8
                    ) -> tuple[np.ndarray, np.ndarray]:
    """A built-in reward log for the scale diagnostics: ``(noisy, clean)``, shape (B, G).

    ``clean`` are verifier-style rewards in [0, 1] on a 0.01 grid: 35% binary pass/fail
    groups, 40% low-variance groups (one shared score, in half of them a few responses
    with a credible gap of 0.02 to 0.10), 25% graded groups.  ``noisy`` is what a grader
    reports: in the non-binary groups, ``clean`` plus sub-resolution jitter with a
    per-group standard deviation log-uniform in [1e-4, 3e-3], clipped to [0, 1] (a
    binary verifier's verdicts carry no jitter).
    """
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, size=n_groups, p=[0.35, 0.40, 0.25])
    clean = np.empty((n_groups, group_size))
    for q in range(n_groups):
        if kind[q] == 0:
            clean[q] = rng.random(group_size) < rng.random()
        elif kind[q] == 1:
            clean[q] = np.round(rng.uniform(0.2, 0.8), 2)
            if rng.random() < 0.5:
                lucky = rng.random(group_size) < 0.25
                clean[q, lucky] += np.round(rng.uniform(0.02, 0.10), 2)
        else:
            clean[q] = np.round(rng.random(group_size), 2)
    jitter = 10.0 ** rng.uniform(-4.0, np.log10(3e-3), size=(n_groups, 1))
    jitter[kind == 0] = 0.0
    noisy = np.clip(clean + rng.normal(0.0, 1.0, clean.shape) * jitter, 0.0, 1.0)
    return noisy, clean


def _number(value: float) -> str:
    """Three decimals, or scientific notation once the number outgrows a column."""
    return f"{value:.3e}" if abs(value) >= 1e5 else f"{value:.3f}"


def _format_row(label: str, values: Sequence[float], width: int = 8) -> str:
    # A column widens for a long number: one space always separates two numbers.
    return f"{label:<24}" + "".join(f"{_number(v):>{max(width, len(_number(v)) + 1)}}"
                                    for v in values)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], first: int = 24) -> str:
    """Left-aligned first column, the others right-aligned and as wide as their widest
    cell plus two spaces, so that no two cells run together."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(header)]
    widths[0] = max(first, widths[0])
    lines = [header, *rows]
    return "\n".join(f"{line[0]:<{widths[0]}}" + "".join(f"{cell:>{w}}" for cell, w in zip(
        line[1:], widths[1:], strict=True)) for line in lines)


def _demo_extra(name: str, lengths: np.ndarray) -> dict[str, Any]:
    supplied = {"lengths": lengths, "tau_res": _DEMO_TAU_RES}
    return {key: supplied[key] for key in REGISTRY[name].needs}


def demo_diagnostics(seed: int = 0) -> ScaleDiagnostics:
    """The scale diagnostics of :func:`demo_reward_log`: noisy rewards, clean reference."""
    noisy, clean = demo_reward_log(seed)
    return scale_diagnostics(noisy, methods=("grpo", "rloo", "maxnorm"),
                             tau_res=_DEMO_TAU_RES, reference=clean)


# --------------------------------------------------------------------------- demo: coverage


def _tolerance(m: int, alpha: float, tests: int, splits: int = 1) -> float:
    """``_Z`` standard errors of a coverage averaged over ``tests`` fresh units and
    ``splits`` calibrations of ``m`` units each (0 when the radius is infinite).

    Given its calibration, a split covers each unit independently with probability
    C ~ Beta(k, m + 1 - k) (continuous scores; k the conformal rank), so the mean over
    ``tests`` units has variance v_b + (p(1 - p) - v_b) / tests with p = k / (m + 1) and
    v_b the Beta variance; a single unit is a Bernoulli(p).
    """
    k = conformal_rank(m, alpha)
    if k > m:  # the quantile is +inf: every unit is covered
        return 0.0
    p = k / (m + 1)
    between = p * (1.0 - p) / (m + 2)
    per_split = between + (p * (1.0 - p) - between) / tests
    return _Z * math.sqrt(per_split / splits)


@dataclass(frozen=True)
class DemoCoverage:
    """Empirical coverage of split-conformal reward ranges (:func:`demo_coverage`).

    ``coverage[i, j, k]`` is the fraction of test responses whose reference reward lies in
    its range, over ``splits`` splits of ``sizes[i]`` calibration and ``tests`` test
    responses each, at level ``alphas[j]`` with range method ``methods[k]``.
    """

    sizes: tuple[int, ...]
    alphas: tuple[float, ...]
    methods: tuple[str, ...]
    splits: int
    tests: int
    coverage: np.ndarray

    @staticmethod
    def band(m: int, alpha: float) -> tuple[float, float]:
        """The finite-sample band ``[1 - alpha, min(1, 1 - alpha + 1/(m + 1))]``."""
        return 1.0 - alpha, min(1.0, 1.0 - alpha + 1.0 / (m + 1))

    def tolerance(self, m: int, alpha: float) -> float:
        """``_Z`` standard errors of the mean coverage over the splits (:func:`_tolerance`)."""
        return _tolerance(m, alpha, self.tests, self.splits)


def _judge(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A simulated LLM judge: reference rewards, judge scores and their spread."""
    reference = rng.beta(2.0, 2.0, n)
    noise_sd = 0.02 + 0.2 * rng.random(n) ** 2  # some responses are hard to judge
    draws = reference[:, None] + noise_sd[:, None] * rng.standard_normal((n, _JUDGE_SAMPLES))
    return reference, draws.mean(axis=1), draws.std(axis=1, ddof=1)


def demo_coverage(seed: int = 0, *, sizes: _DemoSizes = _DEMO_SIZES, bar: _Bar | None = None
                  ) -> DemoCoverage:
    """Coverage of ``calibrate_ranges`` ranges over repeated simulated splits (the demo's)."""
    bar = bar or _no_bar()
    rng = np.random.default_rng([seed, _STREAM_COVERAGE])
    splits, tests = sizes.coverage_splits, sizes.coverage_tests
    hits = np.zeros((len(_COVERAGE_M), len(_COVERAGE_ALPHAS), len(_COVERAGE_METHODS)))
    for i, m in enumerate(_COVERAGE_M):
        for _ in range(splits):
            y, s, sigma = _judge(rng, m + tests)
            cal, test = slice(0, m), slice(m, None)
            for j, alpha in enumerate(_COVERAGE_ALPHAS):
                for k, method in enumerate(_COVERAGE_METHODS):
                    if method == "absolute":
                        lo, hi = calibrate_ranges(s[cal], y[cal], alpha=alpha).ranges(s[test])
                    else:
                        fit = calibrate_ranges(s[cal], y[cal], alpha=alpha, method=method,
                                               sigma=sigma[cal])
                        lo, hi = fit.ranges(s[test], sigma=sigma[test])
                    hits[i, j, k] += np.count_nonzero((lo <= y[test]) & (y[test] <= hi))
            bar.advance()
    return DemoCoverage(_COVERAGE_M, _COVERAGE_ALPHAS, _COVERAGE_METHODS, splits, tests,
                        hits / (splits * tests))


def _coverage_table(cov: DemoCoverage) -> str:
    lines = [f"{'m':>5}{'alpha':>7}  {'band':<16}"
             + "".join(f"{method:>12}" for method in cov.methods) + f"{'tol':>9}"]
    for i, m in enumerate(cov.sizes):
        for j, alpha in enumerate(cov.alphas):
            lo, hi = cov.band(m, alpha)
            lines.append(f"{m:>5d}{alpha:>7.2f}  [{lo:.3f}, {hi:.3f}]  "
                         + "".join(f"{c:>12.4f}" for c in cov.coverage[i, j])
                         + f"{cov.tolerance(m, alpha):>9.4f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- demo: SetGRPO


class DemoSetGRPO(NamedTuple):
    """The demo's SetGRPO run (:func:`demo_setgrpo`).

    Attributes
    ----------
    calibration : SetCalibration
        JRSC calibration (radius ``rho``) on ``sizes.set_calibration`` groups.
    set_coverage : float
        Fraction of ``sizes.set_coverage`` fresh groups whose re-scored GRPO coefficients
        T(r') lie in the set built from their first scoring.
    selection : ThresholdSelection
        SRGO table on ``sizes.risk_calibration`` groups with a reference scoring.
    step : Recovery
        The SetGRPO step on ``sizes.train`` training groups at the selected threshold.
    sizes : _DemoSizes
        The sizes used.
    """

    calibration: SetCalibration
    set_coverage: float
    selection: ThresholdSelection
    step: Recovery
    sizes: _DemoSizes

    def tolerance(self) -> float:
        """``_Z`` standard errors of ``set_coverage`` (Beta spread of the calibration plus
        the binomial spread of the fresh groups; 0 when the radius is infinite)."""
        return _tolerance(self.calibration.m, self.calibration.alpha,
                          self.sizes.set_coverage)


def demo_setgrpo(seed: int = 0, *, sizes: _DemoSizes = _DEMO_SIZES, bar: _Bar | None = None
                 ) -> DemoSetGRPO:
    """JRSC sets, SRGO threshold selection and one SetGRPO step on simulated groups."""
    bar = bar or _no_bar()
    streams = iter(np.random.SeedSequence([seed, _STREAM_SETGRPO]).spawn(9))

    def groups(n: int) -> tuple[PairedScorings, np.ndarray]:
        data = paired_scorings(n, _SET_GROUP, scale=_SET_NOISE, seed=next(streams))
        return data, gram_matrices(n, _SET_GROUP, rank=_SET_GROUP, seed=next(streams)).gram

    bar.describe("JRSC radius")
    cal_data, _ = groups(sizes.set_calibration)
    calibration = calibrate_sets(cal_data.a, cal_data.b, alpha=_SET_ALPHA)
    bar.advance()
    bar.describe("set coverage")
    fresh, _ = groups(sizes.set_coverage)
    sets = coefficient_sets(fresh.a, calibration=calibration)
    set_coverage = float(np.mean(sets.contains(grpo(fresh.b))))
    bar.advance()
    bar.describe("SRGO tau (compiles once)")
    risk_data, risk_gram = groups(sizes.risk_calibration)
    reference = grpo(grade(risk_data.true, scale=_SET_REF_NOISE, seed=next(streams)).scores)
    selection = select_threshold(coefficient_sets(risk_data.a, calibration=calibration),
                                 risk_gram, reference, thresholds=_SET_THRESHOLDS,
                                 beta=_SET_BETA, delta=_SET_DELTA,
                                 procedure="bonferroni")  # the table's UCBs decide
    bar.advance()
    bar.describe("SetGRPO step")
    train, train_gram = groups(sizes.train)
    step = setgrpo(train.a, gram=train_gram, calibration=calibration, tau=selection)
    bar.advance()
    return DemoSetGRPO(calibration, set_coverage, selection, step, sizes)


# The demo's SRGO table: the counts spelled out, recovery to one decimal.
_SELECTION_COLUMNS = (
    Column("tau", 7, "tau", lambda v: f"{v:.2f}"),
    Column("accepted", 10, "n_acc", lambda v: f"{v:d}"),
    Column("reversals", 11, "k_rev", lambda v: f"{v:d}"),
    Column("risk", 9, "risk", lambda v: f"{v:.4f}"),
    Column("UCB", 9, "ucb", lambda v: f"{v:.4f}"),
    Column("recovery", 10, "recovery", lambda v: f"{v:.1f}"),
)


def _print_setgrpo(run: DemoSetGRPO) -> None:
    cal, sel, step, sizes = run.calibration, run.selection, run.step, run.sizes
    lo, hi = DemoCoverage.band(cal.m, cal.alpha)
    print(f"SetGRPO on simulated paired scorings: groups of {_SET_GROUP}, a Gaussian grader "
          f"(noise sd {_SET_NOISE:g}),")
    print("and random Gram matrices of the responses' policy gradients.")
    print(f"JRSC sets at alpha = {cal.alpha:g}, calibrated on {cal.m} groups: radius "
          f"rho = {cal.rho:.4f};")
    print(f"their coverage of the re-scored coefficients T(r') on {sizes.set_coverage} fresh "
          f"groups: {run.set_coverage:.4f}")
    print(f"(band [{lo:.4f}, {hi:.4f}], tol {run.tolerance():.4f}).")
    print(f"SRGO threshold selection on {sizes.risk_calibration} groups with a reference "
          f"scoring (beta = {_SET_BETA:g}, delta = {_SET_DELTA:g},")
    print(f"an independent grading with noise sd {_SET_REF_NOISE:g}; Clopper-Pearson UCB, "
          "Bonferroni over the grid;")
    print("risk = reversals / accepted):")
    print(srgo_table(sel, _SELECTION_COLUMNS))
    if sel.tau_sel is None:
        print("selected tau: none (no threshold is certified; SetGRPO rejects every group).")
    else:
        j = int(np.flatnonzero(sel.tau == sel.tau_sel)[0])
        print(f"selected tau = {sel.tau_sel:.2f} (the most recovery among the feasible "
              "thresholds):")
        print(f"UCB {sel.ucb[j]:.4f} <= beta = {_SET_BETA:g}, empirical risk {sel.risk[j]:.4f} "
              f"({sel.k_rev[j]} reversals of {sel.n_acc[j]} accepted).")
        if not sel.feasible[-1]:
            print(f"The gate binds: the looser thresholds down to {sel.tau[-1]:.2f} are not "
                  "certified (their risk is too high).")
    accepted = step.accepted
    eta = f"{float(np.mean(step.eta[accepted])):.4f}" if accepted.any() else "n/a"
    tau = "none" if sel.tau_sel is None else f"{sel.tau_sel:.2f}"
    print(f"SetGRPO step on {sizes.train} training groups at tau = {tau}: acceptance rate "
          f"{float(np.mean(accepted)):.4f},")
    print(f"mean recovery ratio eta* {eta} over the accepted groups.")


# --------------------------------------------------------------------------- demo: figures


def _plot_coverage(cov: DemoCoverage, path: Path) -> None:
    fig, axes = _figure(1, len(cov.sizes), figsize=(4.5 * len(cov.sizes), 3.6), sharey=True,
                        squeeze=False)
    grid = np.linspace(min(cov.alphas) - 0.02, max(cov.alphas) + 0.02, 100)
    alphas = np.array(cov.alphas)
    for i, (ax, m) in enumerate(zip(axes[0], cov.sizes, strict=True)):
        ax.fill_between(grid, 1 - grid, np.minimum(1, 1 - grid + 1 / (m + 1)), alpha=0.3,
                        color="gray", label="band [1-alpha, 1-alpha+1/(m+1)]")
        tol = [cov.tolerance(m, a) for a in cov.alphas]
        for k, (method, marker) in enumerate(zip(cov.methods, "os", strict=True)):
            shift = (k - 0.5) * 0.004  # side by side
            ax.errorbar(alphas + shift, cov.coverage[i, :, k], yerr=tol, fmt=marker,
                        capsize=3, label=method)
        ax.set_title(f"m = {m}")
        ax.set_xlabel("alpha")
    axes[0][0].set_ylabel("empirical coverage")
    axes[0][0].legend(loc="lower left", fontsize=8)
    fig.suptitle(f"conformal reward ranges: coverage over {cov.splits} splits "
                 f"(error bars: {_Z:g} s.e.)")
    _save_figure(fig, path)


def _plot_risk(run: DemoSetGRPO, path: Path) -> None:
    sel = run.selection
    fig, ax = _figure()
    ax.plot(sel.tau, sel.risk, marker="o", label="empirical risk (reversals / accepted)")
    ax.plot(sel.tau, sel.ucb, marker="^", label=f"UCB (Clopper-Pearson, level {sel.level:.3g})")
    ax.axhline(_SET_BETA, color="C3", linewidth=1, label=f"beta = {_SET_BETA:g}")
    if sel.tau_sel is not None:
        j = int(np.flatnonzero(sel.tau == sel.tau_sel)[0])
        ax.axvline(sel.tau_sel, color="C2", linestyle=":", label=f"selected tau = "
                   f"{sel.tau_sel:.2f} (UCB {sel.ucb[j]:.3f})")
    ax.set_xlabel("threshold tau")
    ax.set_ylabel("conditional reversal risk")
    ax.set_ylim(0, min(1.0, max(0.3, 3 * _SET_BETA)))
    ax.set_title(f"SRGO: risk/threshold curve on {run.sizes.risk_calibration} groups")
    ax.legend(fontsize=8)
    _save_figure(fig, path)


_FIGURES = ("scales.png", "coverage.png", "setgrpo_risk.png")


# --------------------------------------------------------------------------- demo: the tour


def run(args: argparse.Namespace) -> int:
    """The tour; ``--out`` is checked (matplotlib, a writable folder, regular targets)
    before any simulation runs."""
    out = None if args.out is None else Path(args.out)
    if out is not None:
        need_matplotlib("--out")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"cannot create the figure directory {out}: "
                               f"{exc.strerror or exc}") from None
        # Fail before the simulations, not after them: try writing a file there now.
        try:
            with tempfile.TemporaryFile(dir=out):
                pass
        except OSError as exc:
            raise CommandError(f"cannot write the figures to {out}: {exc.strerror or exc}"
                               ) from None
        try:
            for name in _FIGURES:
                check_plot_target(str(out / name))
        except OSError as exc:
            raise CommandError(f"cannot write the figures to {out}: {exc}") from None
    show = _progress_enabled(args.no_progress, sys.stderr)

    def bar(label: str, total: int) -> _Bar:
        return _Bar(label, total, sys.stderr, show)

    rewards, lengths = demo_batch(args.seed)
    print("advcal demo: 6 groups x 8 responses of verifier-style rewards in [0, 1]\n")
    print("rewards of group 3 (0.70 plus sub-resolution jitter of 1e-4):")
    print("  reward                  " + "".join(f"{v:>9.5f}" for v in rewards[3]))
    print()
    results = {}
    with bar("advantages", len(_DEMO_ESTIMATORS)) as progress:
        for name in _DEMO_ESTIMATORS:
            results[name] = ESTIMATORS[name](rewards, **_demo_extra(name, lengths))
            progress.advance()
    print("advantages of group 3, per estimator (GRPO amplifies the jitter to O(1);")
    print(f"maxnorm with tau_res = {_DEMO_TAU_RES:g} keeps it small):")
    for name in _DEMO_ESTIMATORS:
        print(_format_row(f"  {name}", results[name][3], 9))
    print()
    rows = [(name, _number(float(np.max(np.abs(adv)))), _number(float(np.mean(np.abs(adv)))),
             str(int(np.sum(np.all(adv == 0.0, axis=1))))) for name, adv in results.items()]
    print(_table(("estimator", "max|A|", "mean|A|", "zero groups"), rows))
    print()
    with bar("scale diagnostics", 2) as progress:
        diag = demo_diagnostics(args.seed)
        progress.advance()
        noisy, clean = demo_reward_log(args.seed)
        protocol = scale_diagnostics(noisy, methods=("maxnorm",), tau_res=_DEMO_TAU_RES,
                                     resolution=_DEMO_TAU_RES, reference=clean)["maxnorm"]
        progress.advance()
    print(f"scale diagnostics of a built-in reward log ({diag.n_groups} groups x 8):")
    print("verifier-style rewards with grader jitter of 1e-4..3e-3 in the non-binary groups;")
    print("cosine = direction cosine between the weights of the noisy and the clean rewards")
    print(diag.table())
    grpo_tail = diag["grpo"].inverse_scale_p99
    print(f"\nGRPO's inverse-scale P99 is {grpo_tail:.0f}: {grpo_tail * _DEMO_TAU_RES:.0f}x "
          f"MaxNorm's hard cap 1/tau_res = {1.0 / _DEMO_TAU_RES:g}.")
    print(f"With the Reward-Resolution Protocol (resolution {_DEMO_TAU_RES:g}), MaxNorm skips "
          f"{protocol.zero_gap_fraction:.0%} of the groups as zero-gap (constant up to "
          f"jitter) and its direction cosine to the clean weights is "
          f"{protocol.direction_cosine:.4f}.")
    print()

    with bar("conformal coverage", len(_COVERAGE_M) * _DEMO_SIZES.coverage_splits) as progress:
        cov = demo_coverage(args.seed, bar=progress)
    print("coverage of split-conformal reward ranges (calibrate_ranges) for a simulated LLM "
          "judge")
    print(f"(mean and spread of {_JUDGE_SAMPLES} noisy samples around a Beta(2, 2) reference "
          f"reward): {cov.splits} splits per m,")
    print(f"each calibrating on m responses and testing {cov.tests} fresh ones; tol = {_Z:g} "
          "standard errors of the mean.")
    print(_coverage_table(cov))
    print()

    with bar("SetGRPO", 4) as progress:
        setgrpo_run = demo_setgrpo(args.seed, bar=progress)
    _print_setgrpo(setgrpo_run)

    if out is not None:
        paths = [out / name for name in _FIGURES]
        with bar("figures", len(paths)) as progress:
            try:
                _plot(diag, str(paths[0]))
                progress.advance()
                _plot_coverage(cov, paths[1])
                progress.advance()
                _plot_risk(setgrpo_run, paths[2])
                progress.advance()
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot write the figures to {out}: {exc}") from None
        print(f"\nfigures written to {out}: {', '.join(_FIGURES)}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``advcal demo``."""
    parser.add_argument("--seed", type=seed_arg, default=0,
                        help="seed of the built-in data and simulations (default: 0)")
    parser.add_argument("--out", metavar="DIR", default=None, type=path_arg,
                        help="write the figures (" + ", ".join(_FIGURES) + ") into DIR "
                             "(created if missing; needs matplotlib: pip install "
                             "'advcal[plot]')")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr (they show only on a terminal)")


COMMAND = Command(NAME, HELP, add_arguments, run)
