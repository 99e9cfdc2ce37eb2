"""The ``advcal`` command line: ``advcal demo`` (a tour on built-in data: estimators, the
scale-diagnostics table, conformal coverage and a SetGRPO run) and ``advcal diagnose FILE``
(scale diagnostics of a reward log).

Each subcommand is a ``(name, help, add_arguments, run)`` entry in ``_COMMANDS``;
``run`` returns the process exit code: 0 on success, 2 for a bad file or option (one
line on stderr, never a traceback).  :func:`main` is the one place that turns what a bad
file or option raises (:data:`_BAD_INPUT`) into that line, so a reader error no
subcommand anticipated still ends in it; anything else is a bug and keeps its traceback.
A closed stdout (``advcal diagnose LOG | head -1``) ends quietly with exit code 141, as a
tool killed by SIGPIPE; Ctrl-C ends quietly with 130.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import lzma
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import textwrap
import time
import tokenize
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np

from advcal import _files
from advcal.conformal import calibrate_ranges, conformal_rank
from advcal.diagnostics import DIAGNOSED_METHODS, ScaleDiagnostics, scale_diagnostics
from advcal.estimators import grpo
from advcal.recovery import Recovery
from advcal.registry import ESTIMATORS, REGISTRY
from advcal.risk import ThresholdSelection, select_threshold, setgrpo
from advcal.sets import SetCalibration, calibrate_sets, coefficient_sets
from advcal.simulate import PairedScorings, grade, gram_matrices, paired_scorings

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


class _Command(NamedTuple):
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


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


def _format_row(label: str, values: Sequence[float], width: int = 8) -> str:
    return f"{label:<24}" + "".join(f"{v:>{width}.3f}" for v in values)


def _demo_extra(name: str, lengths: np.ndarray) -> dict[str, Any]:
    supplied = {"lengths": lengths, "tau_res": _DEMO_TAU_RES}
    return {key: supplied[key] for key in REGISTRY[name].needs}


def demo_diagnostics(seed: int = 0) -> ScaleDiagnostics:
    """The scale diagnostics of :func:`demo_reward_log`: noisy rewards, clean reference."""
    noisy, clean = demo_reward_log(seed)
    return scale_diagnostics(noisy, methods=("grpo", "rloo", "maxnorm"),
                             tau_res=_DEMO_TAU_RES, reference=clean)


# --------------------------------------------------------------------------- demo: progress


class _Bar:
    """A one-line text progress bar on a stream: ``label [#####-----]  50%  1.2 s  note``.

    Redrawn at most ten times a second and erased when the step ends, so it never mixes
    with the report on stdout.  A disabled bar does nothing.
    """

    WIDTH = 24

    def __init__(self, label: str, total: int, stream: Any, enabled: bool) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.stream = stream
        self.enabled = enabled
        self.done = 0
        self.note = ""
        self._start = time.perf_counter()
        self._drawn_at = -math.inf
        self._length = 0

    def __enter__(self) -> _Bar:
        self._draw(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self._length:
            self.stream.write("\r" + " " * self._length + "\r")
            self.stream.flush()

    def advance(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        self._draw(force=self.done == self.total)

    def describe(self, note: str) -> None:
        """Name the sub-step that runs next (a long single call shows what it is doing)."""
        self.note = note
        self._draw(force=True)

    def _draw(self, *, force: bool) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._drawn_at < 0.1:
            return
        self._drawn_at = now
        filled = self.WIDTH * self.done // self.total
        line = (f"{self.label} [{'#' * filled}{'-' * (self.WIDTH - filled)}] "
                f"{100 * self.done // self.total:3d}% {now - self._start:5.1f} s  {self.note}")
        line = line[:shutil.get_terminal_size().columns - 1]
        self.stream.write("\r" + line.ljust(self._length))
        self.stream.flush()
        self._length = len(line)


def _progress_enabled(no_progress: bool, stream: Any) -> bool:
    """Bars only on a terminal: a log file or a pipe gets no carriage-return clutter."""
    if no_progress:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def _no_bar() -> _Bar:
    return _Bar("", 1, None, enabled=False)


# --------------------------------------------------------------------------- demo: coverage


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
        """``_Z`` standard errors of the mean coverage over the splits.

        Given its calibration, a split covers each test response independently with
        probability C ~ Beta(k, m + 1 - k) (continuous scores; k the conformal rank), so the
        mean over ``tests`` responses has variance v_b + (p(1 - p) - v_b) / tests with
        p = k / (m + 1) and v_b the Beta variance; a single test response is a Bernoulli(p).
        """
        k = conformal_rank(m, alpha)
        if k > m:  # the quantile is +inf: every response is covered
            return 0.0
        p = k / (m + 1)
        between = p * (1.0 - p) / (m + 2)
        per_split = between + (p * (1.0 - p) - between) / self.tests
        return _Z * math.sqrt(per_split / self.splits)


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
        m, n = self.calibration.m, self.sizes.set_coverage
        k = conformal_rank(m, self.calibration.alpha)
        if k > m:
            return 0.0
        p = k / (m + 1)
        between = p * (1.0 - p) / (m + 2)
        return _Z * math.sqrt(between + (p * (1.0 - p) - between) / n)


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
                                 beta=_SET_BETA, delta=_SET_DELTA)
    bar.advance()
    bar.describe("SetGRPO step")
    train, train_gram = groups(sizes.train)
    step = setgrpo(train.a, gram=train_gram, calibration=calibration, tau=selection)
    bar.advance()
    return DemoSetGRPO(calibration, set_coverage, selection, step, sizes)


def _selection_table(sel: ThresholdSelection) -> str:
    lines = [f"{'tau':>7}{'accepted':>10}{'reversals':>11}{'risk':>9}{'UCB':>9}"
             f"{'recovery':>10}  feasible"]
    for row in zip(sel.tau, sel.n_acc, sel.k_rev, sel.risk, sel.ucb, sel.recovery,
                   sel.feasible, strict=True):
        tau, n_acc, k_rev, risk, bound, recovery, feasible = row
        lines.append(f"{tau:>7.2f}{n_acc:>10d}{k_rev:>11d}{risk:>9.4f}{bound:>9.4f}"
                     f"{recovery:>10.1f}  {'yes' if feasible else 'no'}")
    return "\n".join(lines)


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
    print(_selection_table(sel))
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


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_coverage(cov: DemoCoverage, path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(cov.sizes), figsize=(4.5 * len(cov.sizes), 3.6),
                             sharey=True, squeeze=False)
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
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def _plot_risk(run: DemoSetGRPO, path: Path) -> None:
    plt = _pyplot()
    sel = run.selection
    fig, ax = plt.subplots(figsize=(7, 4))
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
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


_FIGURES = ("scales.png", "coverage.png", "setgrpo_risk.png")


# --------------------------------------------------------------------------- demo: the tour


def _run_demo(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        print(f"advcal demo: error: {one_line(message)}", file=sys.stderr)
        return EXIT_BAD_INPUT

    out = None if args.out is None else Path(args.out)
    if out is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return fail("--out needs matplotlib, which is not installed "
                        "(pip install 'advcal[plot]')")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return fail(f"cannot create the figure directory {out}: {exc.strerror or exc}")
        # Fail before the simulations, not after them: try writing a file there now.
        try:
            with tempfile.TemporaryFile(dir=out):
                pass
        except OSError as exc:
            return fail(f"cannot write the figures to {out}: {exc.strerror or exc}")
        try:
            for name in _FIGURES:
                check_plot_target(str(out / name))
        except OSError as exc:
            return fail(f"cannot write the figures to {out}: {exc}")
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
    print(f"{'estimator':<24}{'max|A|':>10}{'mean|A|':>10}{'zero groups':>13}")
    for name, adv in results.items():
        zero = int(np.sum(np.all(adv == 0.0, axis=1)))
        print(f"{name:<24}{np.max(np.abs(adv)):>10.3f}{np.mean(np.abs(adv)):>10.3f}"
              f"{zero:>13d}")
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
        run = demo_setgrpo(args.seed, bar=progress)
    _print_setgrpo(run)

    if out is not None:
        paths = [out / name for name in _FIGURES]
        with bar("figures", len(paths)) as progress:
            try:
                _plot(diag, str(paths[0]))
                progress.advance()
                _plot_coverage(cov, paths[1])
                progress.advance()
                _plot_risk(run, paths[2])
                progress.advance()
            except (OSError, ValueError) as exc:
                return fail(f"cannot write the figures to {out}: {exc}")
        print(f"\nfigures written to {out}: {', '.join(_FIGURES)}")
    return 0


def _seed(text: str) -> int:
    """An argparse type for a seed: an integer >= 0 (numpy's generators take any size)."""
    try:
        seed = int(_plain_number(text, "seed"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seed {text[:40]!r}: not an integer"
                                         ) from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"invalid seed {seed}: must be >= 0")
    return seed


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=_seed, default=0,
                        help="seed of the built-in data and simulations (default: 0)")
    parser.add_argument("--out", metavar="DIR", default=None, type=path_arg,
                        help="write the figures (" + ", ".join(_FIGURES) + ") into DIR "
                             "(created if missing; needs matplotlib: pip install "
                             "'advcal[plot]')")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr (they show only on a terminal)")


# --------------------------------------------------------------------------- diagnose

# What each column of the diagnose table means, with its formula (w: the method's
# advantages, s_q: its within-group scale, u_i = r_i - mean of the other rewards).
_LEGEND = (
    ("1/s P50..max", "inverse scale 1/s_q, the prompt's weight in the batch, over the "
                     "informative groups (percentiles, linear interpolation): GRPO "
                     "1/(std_q + eps) (ddof 1); Dr.GRPO, RLOO, OPO 1; batch_std "
                     "1/(std_batch + eps); MaxNorm 1/max(max_i |u_i|, tau_res), at most "
                     "1/tau_res; the other methods' scales: help(advcal.scale_diagnostics)"),
    ("zero-gap", "fraction of the groups with >= 2 responses the method skips (all rewards "
                 "equal; for MaxNorm with --resolution, all binned rewards equal): weight 0"),
    ("beta_eff min/max", "beta_eff,q = beta * s_q, the KL coefficient on the reward's own "
                         "scale, over the informative groups (grpo_kl_comp: beta_q * s_q = "
                         "beta)"),
    ("R/KL", "reward-to-KL ratio, mean over informative groups of mean_i |w_i| / beta "
             "(= mean_i |u_i| / beta_eff,q for MaxNorm; grpo_kl_comp divides by beta_q)"),
    ("max|w|", "largest |advantage| in the batch"),
    ("cosine", "with --second-col: <w, w'> / (|w| |w'|), w' the weights of the second "
               "scoring (1: same update direction)"),
)
_EXPLAIN = (
    "informative group: >= 2 responses and not skipped as zero-gap. A large 1/s P99 means a "
    "few near-constant groups (a gap at grader-noise level) get most of the batch's weight; "
    "a small beta_eff on those groups means the KL term barely holds them; R/KL far above 1 "
    "means the reward branch dominates the KL branch. Groups with one response (or left "
    "with one after bad rows were skipped) carry no relative information and enter no "
    "statistic (the estimators' singleton='zero')."
)


def _legend(explain: bool, with_cosine: bool) -> str:
    lines = ["columns:"]
    for name, text in _LEGEND:
        if name != "cosine" or with_cosine:
            lines += textwrap.wrap(text, 100, initial_indent=f"  {name:<18}",
                                   subsequent_indent=" " * 20)
    if explain:
        lines += textwrap.wrap(_EXPLAIN, 100)
    return "\n".join(lines)


_PLOT_FORMATS = ("png", "pdf", "svg")


def _plot(diag: ScaleDiagnostics, path: str) -> None:
    """The inverse-scale histogram per method, in the format the extension names."""
    plt = _pyplot()
    values = [d.inverse_scale for d in diag.methods.values() if d.inverse_scale.size]
    fig, ax = plt.subplots(figsize=(7, 4))
    # methods with the same scales (Dr.GRPO and RLOO: 1 everywhere) overlap exactly:
    # distinct line styles and decreasing widths keep every one of them visible
    styles = ("-", "--", ":", "-.")
    if values:
        low = min(float(v.min()) for v in values)
        high = max(float(v.max()) for v in values)
        bins = np.geomspace(low / 1.5, high * 1.5, 50)
        shown = [d for d in diag.methods.values() if d.inverse_scale.size]
        for k, d in enumerate(shown):
            ax.hist(d.inverse_scale, bins=bins.tolist(), histtype="step",
                    linewidth=1.2 + 1.2 * (len(shown) - 1 - k), linestyle=styles[k % 4],
                    label=f"{d.method} (P99 {d.inverse_scale_p99:.3g})", zorder=2 + k)
        ax.set_xscale("log")
    ax.axvline(1.0 / diag.tau_res, color="black", linestyle="--", linewidth=1,
               label=f"1/tau_res = {1.0 / diag.tau_res:g}")
    ax.set_xlabel("inverse scale 1/s_q (prompt weight in the batch)")
    ax.set_ylabel("groups")
    ax.set_title("inverse-scale distribution per method")
    ax.legend()
    fig.tight_layout()
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        check_plot_target(path)
        fig.savefig(path, format=Path(path).suffix.lower().lstrip("."), dpi=100)
    finally:
        plt.close(fig)


def check_plot_target(path: str) -> None:
    """An ``OSError`` where ``path`` (a symlink followed) exists and is not a regular file:
    a figure written to a FIFO would block until a reader comes, one on a device goes
    nowhere."""
    try:
        info = os.stat(path)
    except OSError:  # missing (written anew), or a folder that is not one: savefig says
        return
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path}: {_files._kind(info.st_mode)}, not a regular file; a figure "
                      "is written only to a regular file's path")


def file_error(path: str, exc: BaseException) -> str:
    """The one-line message of ``exc`` about the file ``path``, naming it once."""
    text, name = describe(exc), one_line(path)
    return text if name in text else f"{name}: {text}"


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _diagnose_json(log: Any, diag: ScaleDiagnostics) -> dict[str, Any]:
    return {
        "file": log.path, "format": log.format, "compression": log.compression,
        "group_cols": list(log.group_cols), "reward_cols": list(log.reward_cols),
        "reward_weights": list(log.reward_weights), "reward_agg": log.reward_agg,
        "responses": diag.n_responses, "groups": log.n_groups,
        "groups_with_2_or_more": diag.n_groups, "singleton_groups": log.n_singletons,
        "bad_rows": {"count": log.bad_rows.count, "unit": log.bad_rows.unit,
                     "first": [{"number": n, "reason": why}
                               for n, why in log.bad_rows.examples]},
        "options": {"beta": diag.beta, "tau_res": diag.tau_res, "eps": diag.eps,
                    "resolution": diag.resolution},
        "methods": {
            name: {
                "inverse_scale_p50": _finite(d.inverse_scale_p50),
                "inverse_scale_p95": _finite(d.inverse_scale_p95),
                "inverse_scale_p99": _finite(d.inverse_scale_p99),
                "inverse_scale_max": _finite(d.inverse_scale_max),
                "zero_gap_fraction": _finite(d.zero_gap_fraction),
                "beta_eff_min": _finite(d.beta_eff_min),
                "beta_eff_max": _finite(d.beta_eff_max),
                "reward_kl_ratio": _finite(d.reward_kl_ratio),
                "max_abs_weight": _finite(d.max_abs_weight),
                "direction_cosine": _finite(d.direction_cosine),
                "informative_groups": d.n_informative,
            }
            for name, d in diag.methods.items()
        },
    }


# Reads that take longer than this many seconds show a progress bar on a terminal.
_PROGRESS_AFTER = 2.0


def _read_progress(label: str, enabled: bool) -> tuple[Callable[[int, int], None], _Bar]:
    """A ``read_log`` progress callback that shows a bar once the read passes
    ``_PROGRESS_AFTER`` seconds (a fast read shows nothing)."""
    start = time.perf_counter()
    bar = _Bar(label, 1, sys.stderr, enabled=False)

    def report(done: int, total: int) -> None:
        if not enabled or time.perf_counter() - start < _PROGRESS_AFTER:
            return
        if not bar.enabled:
            bar.enabled = True
            bar.total = max(total, 1)
            bar._start = start
        bar.done = min(done, bar.total)
        bar._draw(force=False)

    return report, bar


def _run_diagnose(args: argparse.Namespace) -> int:
    from advcal import logs

    def fail(message: str) -> int:
        print(f"advcal diagnose: error: {one_line(message)}", file=sys.stderr)
        return EXIT_BAD_INPUT

    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return fail("--plot needs matplotlib, which is not installed "
                        "(pip install 'advcal[plot]')")
        suffix = Path(args.plot).suffix.lower().lstrip(".")
        if suffix not in _PLOT_FORMATS:
            return fail(f"cannot write the plot {args.plot}: name a .png, .pdf or .svg file")
        try:
            check_plot_target(args.plot)
        except OSError as exc:
            return fail(f"cannot write the plot {args.plot}: {exc}")
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    weights = None
    if args.reward_weights is not None:
        try:
            weights = numbers(args.reward_weights, "--reward-weights")
        except ValueError as exc:
            return fail(str(exc))
    on_bad_row = "error" if args.strict else args.on_bad_row
    report, bar = _read_progress(f"reading {Path(args.file).name}",
                                 _progress_enabled(args.no_progress, sys.stderr))
    try:
        with bar:
            log = logs.read_log(
                args.file, preset=args.preset, group_cols=args.group_col,
                reward_cols=args.reward_col, reward_weights=weights,
                reward_agg=args.reward_agg,
                extra_cols=() if args.second_col is None else (args.second_col,),
                optional_cols=(_NPZ_SECOND,) if args.second_col is None else (),
                format=args.format, on_bad_row=on_bad_row, progress=report)
    except logs.MissingDependencyError as exc:
        return fail(str(exc))
    except (logs.LogError, OSError) as exc:
        return fail(file_error(args.file, exc))
    second = args.second_col or (_NPZ_SECOND if log.format in ("npz", "npy") else None)
    second = second if second in log.extra else None
    if args.singleton == "error" and log.n_singletons:
        return fail(f"{args.file}: {log.n_singletons} groups have a single response "
                    "(--singleton error)")
    try:
        diag = scale_diagnostics(
            log.rewards, log.offsets, methods=methods,
            beta=args.beta, tau_res=args.tau_res, eps=args.eps, resolution=args.resolution,
            reference=log.extra[second] if second else None,
        )
    except (ValueError, TypeError) as exc:
        return fail(file_error(args.file, exc))
    if args.plot is not None:
        try:
            _plot(diag, args.plot)
        except (OSError, ValueError) as exc:
            return fail(f"cannot write the plot {args.plot}: {exc}")
    if args.json:
        result = _diagnose_json(log, diag)
        if args.plot is not None:
            result["plot"] = args.plot
        print(json.dumps(result, indent=2))
        return 0
    agg = ("" if len(log.reward_cols) == 1 else
           f" ({log.reward_agg}, weights {', '.join(f'{w:g}' for w in log.reward_weights)})")
    print(f"advcal diagnose: {printable(args.file)}")
    print(f"{_NAMES.get(log.format, log.format)}"
          f"{', ' + log.compression if log.compression else ''}; group: "
          f"{' + '.join(log.group_cols)}; reward: {' + '.join(log.reward_cols)}{agg}")
    if log.bad_rows.count:
        print(log.bad_rows.summary())
    if log.n_singletons:
        print(f"{log.n_singletons} group{'s' if log.n_singletons != 1 else ''} with a single "
              "response: no relative information, in no statistic")
    if second is not None:
        print("cosine = direction cosine between the weights of the two scorings")
    print(diag.table())
    print(_legend(args.explain, second is not None))
    if args.plot is not None:
        print(f"inverse-scale plot written to {printable(args.plot)}")
    return 0


# The array of a second scoring an .npz may hold (used without --second-col).
_NPZ_SECOND = "second"
_NAMES = {"csv": "CSV", "jsonl": "JSON Lines", "parquet": "Parquet", "npz": ".npz",
          "npy": ".npy"}


def _diagnose_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", type=path_arg,
        help="reward log, one row per response: CSV, JSON Lines, Parquet, or arrays in .npz "
             "('rewards': 2-D groups by row, 1-D with 'offsets' or 'group_ids') or .npy; "
             "each optionally gzip/zstd-compressed (detected from the content)",
    )
    parser.add_argument("--format", choices=("auto", "csv", "jsonl", "parquet", "npz", "npy"),
                        default="auto", help="file format (default: from the content)")
    parser.add_argument("--preset", choices=("verl", "trl"), default=None,
                        help="columns of a trainer's logs: verl rollout dumps (score; group "
                             "uid, else the prompt 'input', per step) or TRL completion logs "
                             "(group 'prompt' per step; every reward-function column)")
    parser.add_argument("--group-col", action="append", default=None, metavar="NAME",
                        help="column of the group (prompt) id; repeat for a group per "
                             "combination (default: group; .npz: offsets or group_ids)")
    parser.add_argument("--reward-col", action="append", default=None, metavar="NAME",
                        help="reward column; repeat to combine several (default: reward; "
                             ".npz: rewards)")
    parser.add_argument("--reward-weights", default=None, metavar="W1,W2,...",
                        help="weight per reward column (default: all 1), as TRL's "
                             "reward_weights")
    parser.add_argument("--reward-agg", choices=("sum", "normalize_then_sum"), default="sum",
                        help="combine reward columns as TRL's multi_objective_aggregation: "
                             "weighted nansum, or standardise each column within its group "
                             "first (default: sum)")
    parser.add_argument("--second-col", default=None,
                        help="column of a second scoring of the same responses: adds the "
                             "direction cosine")
    parser.add_argument("--on-bad-row", choices=("skip", "error"), default="skip",
                        help="rows with an empty, NaN or unparsable reward or a broken line: "
                             "skip and report them (default), or stop")
    parser.add_argument("--strict", action="store_true",
                        help="all or nothing: the first bad row is an error "
                             "(= --on-bad-row error)")
    parser.add_argument("--singleton", choices=("zero", "error"), default="zero",
                        help="groups with one response: weight 0, in no statistic (default), "
                             "or an error")
    parser.add_argument("--methods", default="grpo,rloo,maxnorm",
                        help="comma-separated estimators, of "
                             + ", ".join(DIAGNOSED_METHODS) + " (default: grpo,rloo,maxnorm)")
    parser.add_argument("--tau-res", type=finite_arg, default=0.01,
                        help="MaxNorm scale floor tau_res (default: 0.01)")
    parser.add_argument("--beta", type=finite_arg, default=0.04,
                        help="KL coefficient beta (default: 0.04)")
    parser.add_argument("--eps", type=finite_arg, default=1e-6,
                        help="GRPO eps (default: 1e-6)")
    parser.add_argument("--resolution", type=finite_arg, default=None,
                        help="let MaxNorm bin rewards in [0, 1] to this resolution first")
    parser.add_argument("--plot", metavar="PATH", default=None, type=path_arg,
                        help="write the inverse-scale histograms per method to PATH (.png, "
                             ".pdf or .svg; folders created; needs matplotlib: pip install "
                             "'advcal[plot]')")
    parser.add_argument("--json", action="store_true",
                        help="print the results as JSON instead of the table")
    parser.add_argument("--explain", action="store_true",
                        help="explain how to read the table under its column legend")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar on stderr (shown on a terminal for reads over "
                             "about 2 s)")


def _calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    from advcal import _calibrate

    _calibrate.arguments(parser)


def _run_calibrate(args: argparse.Namespace) -> int:
    from advcal import _calibrate

    return _calibrate.run(args)


_COMMANDS = [
    _Command("demo", "a tour of advcal on built-in synthetic data", _demo_arguments, _run_demo),
    _Command("diagnose", "scale diagnostics (GRPO vs RLOO vs MaxNorm) of a reward log",
             _diagnose_arguments, _run_diagnose),
    _Command("calibrate", "calibration files from logs: JRSC set radius (sets), judge ranges "
             "(ranges), SRGO threshold (threshold)", _calibrate_arguments, _run_calibrate),
]


# --------------------------------------------------------------------------- errors

# Exit codes (docs/cli.md): a bad file or option; Ctrl-C; stdout closed by its reader
# (128 + SIGPIPE, what a shell reports for a tool that SIGPIPE ended).
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141

# What a bad file or option raises: advcal's own ValueError (the readers' LogError is
# one), TypeError and OSError; and from the decoders under the readers, a number too big
# for a float, a truncated stream, a corrupt zip, deflate, xz or CSV stream, an .npy header
# that does not parse, a file too big for memory.  Anything else is a bug: it keeps its
# traceback.
_BAD_INPUT: tuple[type[BaseException], ...] = (
    ValueError, TypeError, OSError, OverflowError, EOFError, MemoryError,
    zipfile.BadZipFile, zlib.error, lzma.LZMAError, csv.Error, tokenize.TokenError,
    SyntaxError,
)
# Control characters (a hostile file or column name) are shown escaped, not sent to the
# terminal; tabs are kept.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127) if c != 9}


# Stdlib decoders whose RuntimeErrors are about the bytes they decode: zipfile's for an
# encrypted member or an unknown compression method (NotImplementedError), json's
# RecursionError for nesting too deep.  A RuntimeError from anywhere else is a bug.
_DECODERS = ("zipfile", "json")


def bad_input_types() -> tuple[type[BaseException], ...]:
    """:data:`_BAD_INPUT`, every pyarrow error (pyarrow only reads logs) and
    ``RuntimeError``, of which :func:`is_bad_input` keeps only the decoders'."""
    arrow = sys.modules.get("pyarrow.lib")
    extra = (arrow.ArrowException,) if arrow is not None else ()
    return (*_BAD_INPUT, *extra, RuntimeError)


def is_bad_input(exc: BaseException) -> bool:
    """Whether ``exc`` says the user's file or option is bad (one line, exit code 2)
    rather than that advcal has a bug (a traceback)."""
    if isinstance(exc, bad_input_types()[:-1]):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return module.split(".")[0] in _DECODERS


def printable(text: str) -> str:
    """``text`` with a file name's undecodable bytes (surrogate escapes) shown as ``\\xNN``
    and any other unencodable character backslash-escaped: printing it cannot fail."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that escapes no byte (from a JSON string)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def one_line(text: str) -> str:
    """``text`` as one printable line: its lines joined by ``; ``, control characters
    escaped."""
    lines = (line.strip() for line in text.splitlines())
    return printable("; ".join(line for line in lines if line)).translate(_CONTROL)


def describe(exc: BaseException) -> str:
    """The one-line message of a bad-input exception (:func:`is_bad_input`)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
        name = exc.filename
        if isinstance(name, (str, bytes)):
            name = os.fsdecode(name)
            if name not in text:
                text = f"{name}: {text}"
    elif isinstance(exc, MemoryError):
        text = f"out of memory ({exc})" if str(exc) else "out of memory"
    else:
        text = str(exc) or type(exc).__name__
    return one_line(text)


def _report(prog: str, exc: BaseException, args: argparse.Namespace | None) -> int:
    """Print ``exc`` as the one error line of ``prog``; it names the input file unless
    it names the file (or the ``--sets`` file) already."""
    text = describe(exc)
    named = [one_line(getattr(args, key)) for key in ("file", "sets")
             if isinstance(getattr(args, key, None), str)]
    if named and not any(name in text for name in named):
        text = f"{named[0]}: {text}"
    print(f"{prog}: error: {text}", file=sys.stderr)
    return EXIT_BAD_INPUT


@contextlib.contextmanager
def _escaped_output() -> Iterator[None]:
    """stdout and stderr write what they cannot encode backslash-escaped (a file name's
    undecodable bytes, a lone surrogate in a column name) instead of raising; restored
    after."""
    saved = []
    for stream in (sys.stdout, sys.stderr):
        errors = getattr(stream, "errors", None)
        if errors in (None, "backslashreplace") or not hasattr(stream, "reconfigure"):
            continue
        try:
            stream.reconfigure(errors="backslashreplace")
        except (OSError, ValueError):  # reconfigure flushes: a closed pipe or stream
            continue
        saved.append((stream, errors))
    try:
        yield
    finally:
        for stream, errors in saved:
            with contextlib.suppress(OSError, ValueError):
                stream.reconfigure(errors=errors)


def _drop_stdout() -> None:
    """Point a closed stdout at the null device: the interpreter's last flush at exit
    then succeeds instead of printing an ignored BrokenPipeError (Python's own recipe)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no file descriptor (captured output)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


# --------------------------------------------------------------------------- arguments


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line like every other error (exit code 2), and
    that reads ``-1e-3`` as a number (argparse's own rule knows no exponents, so
    ``--bounds -1e-3 1`` was an unknown option)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{one_line(self.prog)}: error: {one_line(message)} "
                                  f"(see {one_line(self.prog)} --help)\n")


def path_arg(text: str) -> str:
    """An argparse type for a file path: not empty (``""`` would name the current
    folder) and without a NUL character."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a path cannot hold a NUL character")
    return text


def _plain_number(text: str, kind: str) -> str:
    # Python's float() and int() also read '1_0' and non-ASCII digits; an option does not.
    if not text.isascii() or "_" in text:
        raise argparse.ArgumentTypeError(f"invalid {kind} {text[:40]!r}")
    return text


def finite_arg(text: str) -> float:
    """An argparse type for a finite float (``nan``, ``inf`` and ``1e999`` refused)."""
    try:
        value = float(_plain_number(text, "number"))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"invalid number {text[:40]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number")
    return value


def numbers(text: str, option: str) -> list[float]:
    """A comma-separated option value (``--reward-weights``, ``--thresholds``) as finite
    numbers, by the rule of :func:`finite_arg`; a ``ValueError`` naming ``option``
    otherwise."""
    try:
        return [finite_arg(part.strip()) for part in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{option} {text[:80]!r}: expected comma-separated numbers "
                         f"({exc})") from None


def int_arg(text: str, *, low: int, high: int, what: str = "integer") -> int:
    """``text`` as an integer in ``[low, high]``, else an argparse error."""
    try:
        value = int(_plain_number(text, what))
    except ValueError:  # also a number of more digits than int() reads
        raise argparse.ArgumentTypeError(f"invalid {what} {text[:40]!r}: not an "
                                         "integer") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"invalid {what} {text[:40]!r}: must lie in "
                                         f"[{low}, {high}]")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="advcal", description="Advantage calibration for group-relative RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(child)
        child.set_defaults(run=command.run, prog=child.prog)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``advcal`` console script; returns the exit code.

    0 on success; 2 with one line on stderr for a bad file or option (argparse's usage
    errors too, by ``SystemExit(2)``); 141, silently, when stdout is closed by its
    reader (``| head``); 130 on Ctrl-C.  Only what :func:`is_bad_input` accepts is
    reported as one line: any other exception is a bug and propagates.
    """
    parser = build_parser()
    args: argparse.Namespace | None = None
    with _escaped_output():
        try:
            args = parser.parse_args(argv)
            code = int(args.run(args))
            sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
            return code
        except BrokenPipeError:
            _drop_stdout()
            return EXIT_CLOSED_PIPE
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        except bad_input_types() as exc:
            if not is_bad_input(exc):
                raise
            return _report(getattr(args, "prog", parser.prog), exc, args)


if __name__ == "__main__":
    sys.exit(main())
