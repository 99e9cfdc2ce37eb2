"""``advcal calibrate``: calibration artefacts from logs, on the command line.

Three forms, each writing a file that :func:`advcal.load_calibration` reads:

* ``advcal calibrate sets PAIRED_LOG``: two scorings of the same responses (a reward
  column and ``--second-col``) → a :class:`~advcal.SetCalibration`;
* ``advcal calibrate ranges JUDGE_LOG``: judge scores, reference rewards and optional
  categories → a :class:`~advcal.RangeCalibration`;
* ``advcal calibrate threshold DATA.npz``: paired scorings plus Gram blocks → a
  :class:`~advcal.ThresholdSelection` (and the set calibration it used).

Each prints a summary: m, the radius, σ_g², the mean log-volume of the sets (log-width of
the ranges), and a cross-fitted coverage estimate with its Clopper-Pearson interval; the
threshold form prints the SRGO table.  Exit codes as the other subcommands: 0, or 2 with
one line on stderr.  Targets (``-o``, ``--sets-out``, ``--plot``) are checked before the
work: one that is not a regular file (a symlink, FIFO or device node) is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from advcal._blocks import block_offsets
from advcal._validation import check_offsets
from advcal.cli._args import (
    Command,
    LogPaths,
    finite_arg,
    int_arg,
    max_bytes_arg,
    numbers,
    path_arg,
    seed_arg,
)
from advcal.cli._errors import (
    CommandError,
    bad_input_types,
    describe,
    file_error,
    is_bad_input,
    one_line,
    printable,
)
from advcal.cli._output import (
    Column,
    _figure,
    _finite,
    _save_figure,
    check_out,
    check_plot,
    files_json,
    print_reads,
    srgo_table,
    write_plot,
)
from advcal.conformal import calibrate_ranges, conformal_rank
from advcal.drift import (
    CrossFittedCoverage,
    calibration_drift,
    cross_fitted_range_coverage,
    cross_fitted_set_coverage,
    select_groups,
)
from advcal.io import logs
from advcal.io.artefacts import load_calibration, save_calibration
from advcal.risk import PROCEDURES, select_threshold
from advcal.sets import (
    CENTERED,
    SetCalibration,
    calibrate_sets,
    coefficient_sets,
    transform_checked,
)

NAME = "calibrate"
HELP = ("calibration files from logs: JRSC set radius (sets), judge ranges (ranges), SRGO "
        "threshold (threshold)")

# Folds of the cross-fitted coverage estimate (default and most).  Folds beyond the number
# of units are empty: leave-one-out.
FOLDS = 5
MAX_FOLDS = 1_000_000
# Largest .npz `calibrate threshold` accepts, its members decompressed (checked first).
MAX_MEMBER_BYTES = 1 << 30


# --------------------------------------------------------------------------- reading


def _read_paired(args: argparse.Namespace, second: str
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """First and second scoring, grouped (CSR), with the readers of ``advcal diagnose``."""

    weights = None
    if args.reward_weights is not None:
        try:
            weights = numbers(args.reward_weights, "--reward-weights")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    with _log_errors(args.file):
        paths = getattr(args, "paths", [args.file])
        log = logs.read_logs(paths if len(paths) > 1 else paths[0], preset=args.preset,
                             group_cols=args.group_col, reward_cols=args.reward_col,
                             reward_weights=weights, reward_agg=args.reward_agg,
                             extra_cols=(second,), format=args.format,
                             max_bytes=args.max_bytes,
                             on_bad_row="error" if args.strict else args.on_bad_row)
    return log.rewards, log.extra[second], log.offsets, log


@contextlib.contextmanager
def _log_errors(path: str) -> Iterator[None]:
    """The errors of reading ``path`` (:mod:`advcal.io.logs`, :func:`load_calibration`) as
    one-line :class:`CommandError` naming it."""
    try:
        yield
    except logs.MissingDependencyError as exc:
        raise CommandError(str(exc)) from None
    except bad_input_types() as exc:
        if not is_bad_input(exc):  # a RuntimeError not from zipfile: a bug, propagated
            raise
        raise CommandError(file_error(path, exc)) from None


# --------------------------------------------------------------------------- output


def _coverage_line(cov: CrossFittedCoverage) -> str:
    if cov.n == 0:
        return "cross-fitted coverage: not estimated (too few groups for the folds)"
    lo, hi = cov.interval
    extra = f"; {cov.skipped} untestable (a category's only response)" if cov.skipped else ""
    return (f"cross-fitted coverage ({cov.folds} folds): {cov.estimate:.4f} "
            f"({cov.covered}/{cov.n}), {cov.confidence:.0%} interval [{lo:.4f}, {hi:.4f}]; "
            f"target 1 - alpha = {cov.target:.4f}{extra}")


def _coverage_json(cov: CrossFittedCoverage) -> dict[str, Any]:
    return {"estimate": None if cov.n == 0 else cov.estimate, "covered": cov.covered,
            "n": cov.n, "folds": cov.folds, "target": cov.target,
            "interval": None if cov.n == 0 else list(cov.interval),
            "confidence": cov.confidence, "skipped": cov.skipped}


# --------------------------------------------------------------------------- sets


def _set_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.estimator == "maxnorm":
        options["tau_res"] = args.tau_res
    return {"alpha": args.alpha, "estimator": args.estimator, "shape": args.shape,
            "ridge": args.ridge, "eps": args.eps, "ddof": args.ddof, "options": options}


def _set_summary(cal: Any, a: np.ndarray, offsets: np.ndarray) -> dict[str, Any]:

    sets = coefficient_sets(a, offsets, calibration=cal)
    informative = np.diff(offsets) >= 2
    logvol = sets.log_volumes()[informative]
    return {"m": cal.m, "alpha": cal.alpha, "rho": _finite(cal.rho),
            "noise_var": cal.noise_var, "estimator": cal.estimator, "shape": cal.shape,
            "mean_log_volume": _finite(float(np.mean(logvol))) if logvol.size else None}


def _print_set_summary(s: dict[str, Any], cov: CrossFittedCoverage | None, label: str = "") -> None:
    rho = "inf (too few groups for alpha)" if s["rho"] is None else f"{s['rho']:.6g}"
    print(f"{label}m = {s['m']} calibration groups; alpha = {s['alpha']:g}; estimator "
          f"{s['estimator']}, shape {s['shape']}")
    print(f"{label}radius rho = {rho}; sigma_g^2 = {s['noise_var']:.6g}; mean log-volume "
          f"= {'n/a' if s['mean_log_volume'] is None else format(s['mean_log_volume'], '.4f')}")
    if cov is not None:
        print(label + _coverage_line(cov))


def _plot_sets(cal: Any, path: str) -> None:
    fig, ax = _figure()
    scores = cal.scores[np.isfinite(cal.scores)]
    ax.hist(scores, bins=50, histtype="stepfilled", alpha=0.6, label="calibration scores d_q")
    if math.isfinite(cal.rho):
        ax.axvline(cal.rho, color="black", linestyle="--",
                   label=f"rho = {cal.rho:.4g} (level {1 - cal.alpha:g})")
    ax.set_xlabel("d_q = ||S_q^(+1/2) (T(r') - T(r))||")
    ax.set_ylabel("groups")
    ax.set_title(f"JRSC calibration scores (m = {cal.m})")
    ax.legend()
    _save_figure(fig, path)


def run_sets(args: argparse.Namespace) -> int:

    check_plot(args.plot)
    check_out(args.out, "-o")
    a, b, offsets, log = _read_paired(args, args.second_col)
    kwargs = _set_kwargs(args)
    try:
        cal = calibrate_sets(a, b, offsets, **kwargs)
        cov = cross_fitted_set_coverage(a, b, offsets, folds=args.folds, seed=args.seed,
                                        **kwargs)
        summary = _set_summary(cal, a, offsets)
    except (ValueError, TypeError) as exc:
        raise CommandError(file_error(args.file, exc)) from None
    if not math.isfinite(cal.rho):
        _refuse_vacuous(args, "set calibration", cal.m, cal.alpha)
    _write(args.out, cal)
    write_plot(lambda path: _plot_sets(cal, path), args.plot)
    if args.json:
        print(json.dumps({"kind": "SetCalibration", "file": args.file, "out": args.out,
                          **summary, "bad_rows": log.bad_rows.count,
                          "files": files_json(log),
                          "coverage": _coverage_json(cov)}, indent=2))
        return 0
    print(f"advcal calibrate sets: {printable(args.file)}")
    print_reads(log)
    _print_set_summary(summary, cov)
    print(f"SetCalibration written to {printable(args.out)}")
    return 0


def _needed(alpha: float) -> int:
    """The fewest calibration units whose split-conformal quantile at ``alpha`` is finite."""
    m = max(1, math.ceil((1 - alpha) / alpha) - 1)
    while conformal_rank(m, alpha) > m:
        m += 1
    return m


def _refuse_vacuous(args: argparse.Namespace, what: str, have: int, alpha: float) -> None:
    """A calibration with an infinite radius accepts everything (sets) or nothing (SRGO's
    gate): written only on request."""
    if not args.allow_vacuous:
        raise CommandError(
            f"{args.file}: the {what} is vacuous at alpha = {alpha:g} (infinite radius): "
            f"{have} calibration units, split conformal needs at least {_needed(alpha)}; "
            "use more data or a larger --alpha, or pass --allow-vacuous to write it anyway")


def _write(path: str, obj: Any) -> None:
    try:
        save_calibration(path, obj)
    except OSError as exc:  # save_calibration refuses a non-regular target itself too
        shown = one_line(path)
        if exc.strerror and exc.filename is not None:  # the system's word, on a temp file
            raise CommandError(f"cannot write {shown} ({one_line(exc.strerror)})") from None
        text = describe(exc)
        raise CommandError(text if shown in text else f"cannot write {shown} ({text})") from None


# --------------------------------------------------------------------------- ranges


def run_ranges(args: argparse.Namespace) -> int:

    check_plot(args.plot)
    check_out(args.out, "-o")
    method = args.method
    cols = {"reference": args.reference_col}
    if method == "cqr":
        cols.update(lower=args.lower_col, upper=args.upper_col)
    else:
        cols["judge"] = args.judge_col
    if method == "normalized":
        cols["sigma"] = args.sigma_col
    with _log_errors(args.file):
        table = logs.read_columns(args.file, list(cols.values()), label_col=args.category_col,
                                  format=args.format, max_bytes=args.max_bytes,
                                  on_bad_row="error" if args.strict else args.on_bad_row)
    inputs: dict[str, Any] = {key: table.columns[col] for key, col in cols.items()}
    if table.labels is not None:
        inputs["categories"] = table.labels
    kwargs = {"alpha": args.alpha, "method": method, "bounds": tuple(args.bounds)}
    try:
        extra = {k: inputs[k] for k in ("sigma", "lower", "upper", "categories") if k in inputs}
        cal = calibrate_ranges(inputs.get("judge"), inputs["reference"], **kwargs, **extra)
        cov = cross_fitted_range_coverage(inputs.get("judge"), inputs["reference"],
                                          folds=args.folds, seed=args.seed, **kwargs, **extra)
        lo, hi = cal.ranges(inputs.get("judge"), **extra)
    except (ValueError, TypeError) as exc:
        raise CommandError(file_error(args.file, exc)) from None
    vacuous = [key for key, value in cal.radius.items() if not math.isfinite(value)]
    if vacuous:
        cats = [] if cal.categories is None else cal.categories.tolist()
        fewest = min(sum(1 for c in cats if c == key and type(c) is type(key))
                     if key is not None else int(cal.scores.size) for key in vacuous)
        what = ("range calibration" if cal.categories is None else
                f"range calibration of category {vacuous[0]!r}"
                + (f" (and {len(vacuous) - 1} more)" if len(vacuous) > 1 else ""))
        _refuse_vacuous(args, what, fewest, cal.alpha)
    _write(args.out, cal)
    center = inputs["judge"] if "judge" in inputs else 0.5 * (inputs["lower"] + inputs["upper"])
    err = center - inputs["reference"]
    with np.errstate(divide="ignore"):
        logw = np.log(hi - lo)
    summary = {"m": int(cal.scores.size), "alpha": cal.alpha, "method": method,
               # a list, not an object: JSON keys are strings, and 1 and "1" must differ
               "radius": [{"category": k, "radius": _finite(v)}
                          for k, v in cal.radius.items()],
               "noise_var": float(np.mean(err * err)),
               "mean_log_width": _finite(float(np.mean(logw)))}
    write_plot(lambda path: _plot_ranges(cal, path), args.plot)
    if args.json:
        print(json.dumps({"kind": "RangeCalibration", "file": args.file, "out": args.out,
                          **summary, "bad_rows": table.bad_rows.count,
                          "coverage": _coverage_json(cov)},
                         indent=2))
        return 0
    print(f"advcal calibrate ranges: {printable(args.file)}")
    if table.bad_rows.count:
        print(table.bad_rows.summary())
    print(f"m = {summary['m']} labeled responses; alpha = {cal.alpha:g}; method {method}; "
          f"bounds [{cal.bounds[0]:g}, {cal.bounds[1]:g}]")
    if cal.categories is None:
        print(f"radius = {cal.radius[None]:.6g}")
    else:
        counts: dict[Any, int] = {}
        for lab in cal.categories.tolist():
            counts[lab] = counts.get(lab, 0) + 1
        print(f"{'category':<24}{'m':>8}{'radius':>14}")
        for key, value in cal.radius.items():
            print(f"{repr(key)[:23]:<24}{counts[key]:>8d}{value:>14.6g}")
    mlw = summary["mean_log_width"]
    print(f"sigma_g^2 (mean (judge - reference)^2) = {summary['noise_var']:.6g}; mean log-width "
          f"of the ranges = {'-inf' if mlw is None else format(mlw, '.4f')}")
    print(_coverage_line(cov))
    print(f"RangeCalibration written to {printable(args.out)}")
    return 0


def _plot_ranges(cal: Any, path: str) -> None:
    fig, ax = _figure()
    if cal.categories is None:
        ax.hist(cal.scores, bins=50, histtype="step", label="all responses")
    else:
        cats = cal.categories.tolist()
        for key in cal.radius:
            ax.hist(cal.scores[[c == key and type(c) is type(key) for c in cats]], bins=30,
                    histtype="step", label=f"{key!r}")
    for value in cal.radius.values():
        if math.isfinite(value):
            ax.axvline(value, linestyle="--", color="black", linewidth=1)
    ax.set_xlabel(f"nonconformity score ({cal.method}); dashed: radius per category")
    ax.set_ylabel("responses")
    ax.set_title(f"conformal range calibration (level {1 - cal.alpha:g})")
    ax.legend()
    _save_figure(fig, path)


# --------------------------------------------------------------------------- threshold


def run_threshold(args: argparse.Namespace) -> int:

    check_plot(args.plot)
    check_out(args.out, "-o")
    check_out(args.sets_out, "--sets-out")
    cal: Any = None
    if args.sets is not None:  # read first: a bad --sets fails before the work
        with _log_errors(args.sets):
            cal = load_calibration(args.sets, kind=SetCalibration, max_bytes=args.max_bytes)
    names = [args.reward_col, args.second_col, args.gram_col]
    with _log_errors(args.file):
        # the readers' .npz loader: sizes checked before decompressing, never a pickle
        arrays = logs.read_arrays(args.file, max_bytes=args.max_bytes)
    for name in names:
        if name not in arrays:
            raise CommandError(f"{args.file}: no array {name!r} (arrays: "
                               f"{', '.join(arrays) or 'none'})")
    try:
        a, b, gram = (_float_array(arrays[n], n) for n in names)
        offsets = _layout(a, b, gram, arrays.get("offsets"), names)
        a, b = a.reshape(-1), b.reshape(-1)
        thresholds = _thresholds(args.thresholds)
        kwargs = _set_kwargs(args)
        rng = np.random.default_rng(args.seed)
        sizes = np.diff(offsets)
        if cal is not None:
            select = np.arange(sizes.size)
            source = f"loaded from {printable(args.sets)}"
        else:
            informative = np.flatnonzero(sizes >= 2)
            n_cal = int(round(args.calibration_fraction * informative.size))
            if not 0 < n_cal < informative.size:
                raise ValueError("--calibration-fraction leaves no groups to calibrate the "
                                 "sets or none to select the threshold")
            chosen = np.sort(rng.choice(informative, n_cal, replace=False))
            select = np.setdiff1d(np.arange(sizes.size), chosen)
            cal = calibrate_sets(*_pair(a, b, offsets, chosen), **kwargs)
            source = f"calibrated on {n_cal} of the {informative.size} groups"
            if not math.isfinite(cal.rho):
                _refuse_vacuous(args, "set calibration (of --calibration-fraction's groups)",
                                cal.m, cal.alpha)
        sa, sb, soff = _pair(a, b, offsets, select)
        sgram, _ = select_groups(gram.reshape(-1), block_offsets(sizes), select)
        sets = coefficient_sets(sa, soff, calibration=cal)
        reference = transform_checked(sb, soff, cal.estimator, cal.eps, cal.ddof, cal.options)
        sel = select_threshold(sets, sgram, reference, thresholds=thresholds, beta=args.beta,
                               delta=args.delta, bound=args.bound, procedure=args.procedure)
        drift = calibration_drift(cal, sa, sb, soff)
        cov = CrossFittedCoverage(drift.covered, drift.n, 1, drift.target, drift.interval)
        summary = _set_summary(cal, sa, soff)
    except (ValueError, TypeError) as exc:
        raise CommandError(file_error(args.file, exc)) from None
    _write(args.out, sel)
    if args.sets_out is not None:
        _write(args.sets_out, cal)
    write_plot(lambda path: _plot_threshold(sel, args.beta, path), args.plot)
    if args.json:
        table = [{"tau": float(sel.tau[j]), "n_acc": int(sel.n_acc[j]),
                  "k_rev": int(sel.k_rev[j]), "risk": _finite(float(sel.risk[j])),
                  "ucb": float(sel.ucb[j]), "p_value": float(sel.p_value[j]),
                  "recovery": float(sel.recovery[j]), "feasible": bool(sel.feasible[j])}
                 for j in range(sel.tau.size)]
        print(json.dumps({"kind": "ThresholdSelection", "file": args.file, "out": args.out,
                          "sets": {**summary, "source": source,
                                   "held_out_coverage": _coverage_json(cov)},
                          "selection_groups": int(select.size), "tau_sel": sel.tau_sel,
                          "level": sel.level, "beta": args.beta, "delta": args.delta,
                          "table": table}, indent=2))
        return 0
    print(f"advcal calibrate threshold: {printable(args.file)}")
    print(f"sets: {source}")
    _print_set_summary(summary, None, "  ")
    lo, hi = cov.interval
    print(f"  held-out coverage on the {cov.n} selection groups: {cov.estimate:.4f}, "
          f"{cov.confidence:.0%} interval [{lo:.4f}, {hi:.4f}]; target {cov.target:.4f}")
    print(f"SRGO on {select.size} groups: beta = {args.beta:g}, delta = {args.delta:g}, "
          f"{args.bound}, {args.procedure} (per-threshold level {sel.level:.4g})")
    print(srgo_table(sel, _SRGO_COLUMNS, mark_selected=True))
    chosen_text = "none (no threshold is risk-feasible: reject every group)" \
        if sel.tau_sel is None else f"{sel.tau_sel:g}"
    print(f"tau_sel = {chosen_text}")
    print(f"ThresholdSelection written to {printable(args.out)}")
    if args.sets_out is not None:
        print(f"SetCalibration written to {printable(args.sets_out)}")
    return 0


# The SRGO table of `calibrate threshold`: the field names, p-values, "-" for no risk.
_SRGO_COLUMNS = (
    Column("tau", 6, "tau", lambda v: f"{v:.3f}"),
    Column("n_acc", 8, "n_acc", lambda v: f"{v:d}"),
    Column("k_rev", 7, "k_rev", lambda v: f"{v:d}"),
    Column("risk", 9, "risk", lambda v: "-" if np.isnan(v) else f"{v:.4f}"),
    Column("ucb", 9, "ucb", lambda v: f"{v:.4f}"),
    Column("p_value", 10, "p_value", lambda v: f"{v:.3g}"),
    Column("recovery", 11, "recovery", lambda v: f"{v:.2f}"),
)


def _plot_threshold(sel: Any, beta: float, path: str) -> None:
    fig, ax = _figure()
    ax.plot(sel.tau, sel.risk, marker="o", label="empirical risk k_rev / n_acc")
    ax.plot(sel.tau, sel.ucb, marker="s", label="upper confidence bound")
    ax.axhline(beta, color="black", linestyle="--", label=f"beta = {beta:g}")
    if sel.tau_sel is not None:
        ax.axvline(sel.tau_sel, color="tab:green", linestyle=":",
                   label=f"tau_sel = {sel.tau_sel:g}")
    ax.set_xlabel("threshold tau")
    ax.set_ylabel("conditional reversal risk")
    ax.set_title("SRGO threshold selection")
    ax.legend()
    _save_figure(fig, path)


def _float_array(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"array {name!r} must hold numbers; got dtype {arr.dtype}")
    return np.asarray(arr, dtype=np.float64)


def _layout(a: np.ndarray, b: np.ndarray, gram: np.ndarray, offsets: np.ndarray | None,
            names: list[str]) -> np.ndarray:
    """CSR offsets of the groups: rows of 2-D scorings, or the file's ``offsets``."""
    if a.shape != b.shape:
        raise ValueError(f"arrays {names[0]!r} and {names[1]!r} must have the same shape; "
                         f"got {a.shape} and {b.shape}")
    if a.ndim == 2:
        n_groups, width = a.shape
        if gram.shape != (n_groups, width, width):
            raise ValueError(f"array {names[2]!r} must have shape {(n_groups, width, width)} "
                             f"(a Gram block per group); got {gram.shape}")
        return np.arange(0, a.size + 1, max(width, 1), dtype=np.int64)[:n_groups + 1]
    if a.ndim != 1 or offsets is None:
        raise ValueError(f"array {names[0]!r} must be 2-D (a group per row), or 1-D with an "
                         "array 'offsets'")

    offs = check_offsets(offsets, a.size)
    expected = int(np.sum(np.diff(offs).astype(np.int64) ** 2))
    if gram.shape != (expected,):
        raise ValueError(f"array {names[2]!r} must be the flat row-major n_q x n_q blocks "
                         f"({expected} values); got shape {gram.shape}")
    return offs


def _pair(a: np.ndarray, b: np.ndarray, offsets: np.ndarray, groups: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both scorings of the groups ``groups``, and their offsets."""
    va, off = select_groups(a, offsets, groups)
    return va, select_groups(b, offsets, groups)[0], off


def _thresholds(text: str) -> np.ndarray:
    try:
        values = numbers(text, "--thresholds")
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    return np.array(values)


# --------------------------------------------------------------------------- arguments


def _folds(text: str) -> int:
    return int_arg(text, low=2, high=MAX_FOLDS, what="number of folds")




def _common(parser: argparse.ArgumentParser, *, coverage: bool = True) -> None:
    parser.add_argument("-o", "--out", required=True, metavar="FILE", type=path_arg,
                        help="the calibration file to write (.npz; read it with "
                             "advcal.load_calibration)")
    parser.add_argument("--alpha", type=finite_arg, default=0.1,
                        help="miscoverage level alpha (default: 0.1)")
    if coverage:
        parser.add_argument("--folds", type=_folds, default=FOLDS,
                            help=f"folds of the cross-fitted coverage, 2 to {MAX_FOLDS} "
                                 f"(default: {FOLDS}; more folds than units: leave-one-out)")
    parser.add_argument("--seed", type=seed_arg, default=0,
                        help="seed of the random folds / split (default: 0)")
    parser.add_argument("--plot", metavar="PATH", default=None, type=path_arg,
                        help="also write a figure (.png, .pdf or .svg; needs matplotlib)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON")
    parser.add_argument("--allow-vacuous", action="store_true",
                        help="write a calibration even when too few units make its radius "
                             "infinite at --alpha (refused with exit 2 otherwise)")


def _set_options(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("--estimator", choices=CENTERED, default="grpo",
                        help="coefficient map T (default: grpo)")
    parser.add_argument("--shape", choices=("joint", "isotropic"), default="joint",
                        help="set shape (default: joint)")
    parser.add_argument("--ridge", type=finite_arg, default=None,
                        help="radial ridge, relative to the tangential eigenvalue "
                             "(default: 1)")
    parser.add_argument("--eps", type=finite_arg, default=1e-6,
                        help="GRPO eps (default: 1e-6)")
    parser.add_argument("--ddof", type=int, choices=(0, 1), default=1,
                        help="delta degrees of freedom of the std (default: 1)")
    parser.add_argument("--tau-res", type=finite_arg, default=0.01,
                        help="MaxNorm scale floor, with --estimator maxnorm (default: 0.01)")


def _log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=("verl", "trl"), default=None,
                        help="columns of a trainer's logs (as advcal diagnose)")
    parser.add_argument("--group-col", action="append", default=None, metavar="NAME",
                        help="column of the group (prompt) id; repeatable (default: group)")
    parser.add_argument("--reward-col", action="append", default=None, metavar="NAME",
                        help="column of the first scoring; repeat to combine several "
                             "(default: reward; .npz: rewards)")
    parser.add_argument("--reward-weights", default=None, metavar="W1,W2,...",
                        help="weight per reward column (default: all 1)")
    parser.add_argument("--reward-agg", choices=("sum", "normalize_then_sum"), default="sum",
                        help="how reward columns combine (default: sum)")
    parser.add_argument("--second-col", default="second",
                        help="column of the second scoring of the same responses "
                             "(default: second)")
    _reader_options(parser)


def _reader_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("auto", *logs.FORMATS), default="auto",
                        help="file format (default: from the content)")
    parser.add_argument("--on-bad-row", choices=("skip", "error"), default="skip",
                        help="rows with an empty, NaN or unparsable value: skip and report "
                             "them (default), or stop")
    parser.add_argument("--strict", action="store_true", help="= --on-bad-row error")
    _max_bytes_option(parser)


def _max_bytes_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-bytes", type=max_bytes_arg, default=MAX_MEMBER_BYTES,
                        metavar="N", help="the most bytes a reader may decompress and keep "
                                          "(default: 2**30); past it the read stops with an "
                                          "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``calibrate`` subcommand's three forms."""
    forms = parser.add_subparsers(dest="form", required=True, metavar="{sets,ranges,threshold}")
    sets = forms.add_parser(
        "sets", help="JRSC set radius from two scorings of the same responses",
        description="Calibrate the radius of SetGRPO's coefficient sets (JRSC) on a log with "
                    "two scorings of the same responses; write a SetCalibration.")
    sets.add_argument("file", type=path_arg, nargs="+", action=LogPaths, metavar="file",
                      help="paired log: one row per response with its group, a first and a "
                           "second scoring (CSV, JSON Lines, Parquet, NPZ); several files, "
                           "folders or glob patterns are one log, each file's groups its own")
    _log_options(sets)
    _set_options(sets)
    _common(sets)
    sets.set_defaults(form_run=run_sets, prog=sets.prog)

    ranges = forms.add_parser(
        "ranges", help="conformal reward ranges of an LLM judge from labeled responses",
        description="Calibrate an LLM judge against reference rewards; write a "
                    "RangeCalibration (per category with --category-col).")
    ranges.add_argument("file", type=path_arg,
                        help="judge log: one row per labeled response (CSV, JSON Lines, "
                             "Parquet, NPZ 1-D arrays; as advcal diagnose)")
    ranges.add_argument("--method", choices=("absolute", "normalized", "cqr"),
                        default="absolute", help="nonconformity score (default: absolute)")
    ranges.add_argument("--judge-col", default="judge", help="judge score (default: judge)")
    ranges.add_argument("--reference-col", default="reference",
                        help="reference reward (default: reference)")
    ranges.add_argument("--sigma-col", default="sigma",
                        help="per-response spread, --method normalized (default: sigma)")
    ranges.add_argument("--lower-col", default="lower", help="--method cqr (default: lower)")
    ranges.add_argument("--upper-col", default="upper", help="--method cqr (default: upper)")
    ranges.add_argument("--category-col", default=None,
                        help="category per response: one radius per category (Mondrian); "
                             "labels keep their JSON/array type, CSV labels are strings")
    ranges.add_argument("--bounds", type=finite_arg, nargs=2, default=(0.0, 1.0),
                        metavar=("LOW", "HIGH"), help="reward bounds (default: 0 1)")
    _reader_options(ranges)
    _common(ranges)
    ranges.set_defaults(form_run=run_ranges, prog=ranges.prog)

    thr = forms.add_parser(
        "threshold", help="SRGO threshold from paired scorings and Gram blocks (NPZ)",
        description="Select SetGRPO's recovery threshold tau by SRGO on groups with two "
                    "scorings and their Gram matrices; write a ThresholdSelection.")
    thr.add_argument("file", type=path_arg,
                     help=".npz with 'rewards' and 'second' (2-D: a group per row, or 1-D with "
                          "'offsets') and 'gram' ((B, G, G), or flat row-major blocks)")
    thr.add_argument("--reward-col", default="rewards", help="array of the first scoring")
    thr.add_argument("--second-col", default="second", help="array of the second scoring")
    thr.add_argument("--gram-col", default="gram", help="array of the Gram blocks")
    thr.add_argument("--sets", default=None, metavar="FILE", type=path_arg,
                     help="a SetCalibration file (from calibrate sets, on other groups); "
                          "without it the sets are calibrated on --calibration-fraction of "
                          "the groups and the threshold selected on the rest")
    thr.add_argument("--calibration-fraction", type=finite_arg, default=0.5,
                     help="share of the groups that calibrate the sets without --sets "
                          "(default: 0.5)")
    thr.add_argument("--sets-out", default=None, metavar="FILE", type=path_arg,
                     help="also write the SetCalibration used")
    thr.add_argument("--thresholds", default=",".join(f"{0.05 * i:.2f}" for i in range(10, -1,
                                                                                       -1)),
                     help="comma-separated candidate tau in [0, 1) (default: 0.50,0.45,...,0)")
    thr.add_argument("--beta", type=finite_arg, default=0.1,
                     help="target conditional reversal risk (default: 0.1)")
    thr.add_argument("--delta", type=finite_arg, default=0.1,
                     help="error level of the guarantee (default: 0.1)")
    thr.add_argument("--bound", default="clopper-pearson",
                     choices=("clopper-pearson", "hoeffding", "bentkus", "hoeffding-bentkus"),
                     help="binomial upper confidence bound (default: clopper-pearson)")
    thr.add_argument("--procedure", choices=PROCEDURES, default="learn-then-test",
                     help="multiple testing (default: learn-then-test)")
    _max_bytes_option(thr)
    _set_options(thr)
    _common(thr, coverage=False)
    thr.set_defaults(form_run=run_threshold, prog=thr.prog)


def run(args: argparse.Namespace) -> int:
    """Run one form; 0 on success (a bad file or option is a :class:`CommandError`)."""
    return int(args.form_run(args))


COMMAND = Command(NAME, HELP, add_arguments, run)
