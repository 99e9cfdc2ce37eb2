"""``advcal diagnose FILE``: the scale diagnostics of a reward log.

The log is read by :func:`advcal.io.logs.read_log` (CSV, JSON Lines, Parquet, .npz/.npy,
optionally compressed; presets for verl and TRL); the table is
:meth:`advcal.ScaleDiagnostics.table`, followed by a legend of its columns.  ``--json``
prints the same numbers as JSON, ``--plot`` draws the inverse scales per method.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from advcal.cli._args import (
    Command,
    LogPaths,
    finite_arg,
    max_bytes_arg,
    numbers,
    path_arg,
)
from advcal.cli._errors import CommandError, file_error, printable
from advcal.cli._output import (
    _figure,
    _finite,
    _progress_enabled,
    _read_progress,
    _save_figure,
    check_plot,
    files_json,
    print_reads,
    write_plot,
)
from advcal.diagnostics import DIAGNOSED_METHODS, ScaleDiagnostics, scale_diagnostics

NAME = "diagnose"
HELP = "scale diagnostics (GRPO vs RLOO vs MaxNorm) of a reward log"

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


def _plot(diag: ScaleDiagnostics, path: str) -> None:
    """The inverse-scale histogram per method, in the format the extension names."""
    values = [d.inverse_scale for d in diag.methods.values() if d.inverse_scale.size]
    fig, ax = _figure()
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
    _save_figure(fig, path)


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
        "files": files_json(log),
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


def run(args: argparse.Namespace) -> int:
    """Read the log, print the table (or JSON), draw ``--plot``."""
    from advcal.io import logs

    check_plot(args.plot)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    weights = None
    if args.reward_weights is not None:
        try:
            weights = numbers(args.reward_weights, "--reward-weights")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    on_bad_row = "error" if args.strict else args.on_bad_row
    shown = Path(args.file).name if len(args.paths) == 1 else f"{len(args.paths)} paths"
    report, bar = _read_progress(f"reading {shown}",
                                 _progress_enabled(args.no_progress, sys.stderr))
    try:
        with bar:
            log = logs.read_logs(
                args.paths if len(args.paths) > 1 else args.paths[0], preset=args.preset,
                group_cols=args.group_col,
                reward_cols=args.reward_col, reward_weights=weights,
                reward_agg=args.reward_agg,
                extra_cols=() if args.second_col is None else (args.second_col,),
                optional_cols=(_NPZ_SECOND,) if args.second_col is None else (),
                format=args.format, on_bad_row=on_bad_row, max_bytes=args.max_bytes,
                progress=report)
    except logs.MissingDependencyError as exc:
        raise CommandError(str(exc)) from None
    except (logs.LogError, OSError) as exc:
        raise CommandError(file_error(args.file, exc)) from None
    second = args.second_col or (_NPZ_SECOND if log.format in ("npz", "npy") else None)
    second = second if second in log.extra else None
    if args.singleton == "error" and log.n_singletons:
        raise CommandError(f"{args.file}: {log.n_singletons} groups have a single response "
                           "(--singleton error)")
    try:
        diag = scale_diagnostics(
            log.rewards, log.offsets, methods=methods,
            beta=args.beta, tau_res=args.tau_res, eps=args.eps, resolution=args.resolution,
            reference=log.extra[second] if second else None,
        )
    except (ValueError, TypeError) as exc:
        raise CommandError(file_error(args.file, exc)) from None
    write_plot(lambda path: _plot(diag, path), args.plot)
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
    print_reads(log)
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``advcal diagnose``."""
    parser.add_argument(
        "file", type=path_arg, nargs="+", action=LogPaths, metavar="file",
        help="reward log, one row per response: CSV, JSON Lines, Parquet, or arrays in .npz "
             "('rewards': 2-D groups by row, 1-D with 'offsets' or 'group_ids') or .npy; "
             "each optionally gzip/zstd-compressed (detected from the content). Several "
             "files, folders or glob patterns are read as one log, each file's groups its "
             "own (TRL and verl write a file per step)",
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
    parser.add_argument("--max-bytes", type=max_bytes_arg, default=1 << 30, metavar="N",
                        help="the most bytes the reader may decompress and keep (default: "
                             "2**30); past it the read stops with an error")
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


COMMAND = Command(NAME, HELP, add_arguments, run)
