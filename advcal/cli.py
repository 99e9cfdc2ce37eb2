"""The ``advcal`` command line: ``advcal demo`` (a tour on built-in data) and
``advcal diagnose FILE`` (scale diagnostics of a reward log).

Each subcommand is a ``(name, help, add_arguments, run)`` entry in ``_COMMANDS``;
``run`` returns the process exit code: 0 on success, 2 for a bad file or option (one
line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from advcal.diagnostics import DIAGNOSED_METHODS, ScaleDiagnostics, scale_diagnostics
from advcal.estimators import ESTIMATORS

# The demo's estimators: those of ESTIMATORS that take point rewards (others, such as
# interval estimators, need inputs the built-in batch does not have).
_DEMO_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "batch_std", "reinforce_pp_baseline", "opo",
                    "gpg", "passk", "maxnorm")
# MaxNorm's scale floor in the demo.
_DEMO_TAU_RES = 0.01


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
    if name == "opo":
        return {"lengths": lengths}
    if name == "maxnorm":
        return {"tau_res": _DEMO_TAU_RES}
    return {}


def demo_diagnostics(seed: int = 0) -> ScaleDiagnostics:
    """The scale diagnostics of :func:`demo_reward_log`: noisy rewards, clean reference."""
    noisy, clean = demo_reward_log(seed)
    return scale_diagnostics(noisy, methods=("grpo", "rloo", "maxnorm"),
                             tau_res=_DEMO_TAU_RES, reference=clean)


def _run_demo(args: argparse.Namespace) -> int:
    rewards, lengths = demo_batch(args.seed)
    print("advcal demo: 6 groups x 8 responses of verifier-style rewards in [0, 1]\n")
    print("rewards of group 3 (0.70 plus sub-resolution jitter of 1e-4):")
    print("  reward                  " + "".join(f"{v:>9.5f}" for v in rewards[3]))
    print()
    print("advantages of group 3, per estimator (GRPO amplifies the jitter to O(1);")
    print(f"maxnorm with tau_res = {_DEMO_TAU_RES:g} keeps it small):")
    results = {}
    for name in _DEMO_ESTIMATORS:
        results[name] = ESTIMATORS[name](rewards, **_demo_extra(name, lengths))
        print(_format_row(f"  {name}", results[name][3], 9))
    print()
    print(f"{'estimator':<24}{'max|A|':>10}{'mean|A|':>10}{'zero groups':>13}")
    for name, adv in results.items():
        zero = int(np.sum(np.all(adv == 0.0, axis=1)))
        print(f"{name:<24}{np.max(np.abs(adv)):>10.3f}{np.mean(np.abs(adv)):>10.3f}"
              f"{zero:>13d}")
    print()
    diag = demo_diagnostics(args.seed)
    print(f"scale diagnostics of a built-in reward log ({diag.n_groups} groups x 8):")
    print("verifier-style rewards with grader jitter of 1e-4..3e-3 in the non-binary groups;")
    print("cosine = direction cosine between the weights of the noisy and the clean rewards")
    print(diag.table())
    grpo_tail = diag["grpo"].inverse_scale_p99
    print(f"\nGRPO's inverse-scale P99 is {grpo_tail:.0f}: {grpo_tail * _DEMO_TAU_RES:.0f}x "
          f"MaxNorm's hard cap 1/tau_res = {1.0 / _DEMO_TAU_RES:g}.")
    noisy, clean = demo_reward_log(args.seed)
    protocol = scale_diagnostics(noisy, methods=("maxnorm",), tau_res=_DEMO_TAU_RES,
                                 resolution=_DEMO_TAU_RES, reference=clean)["maxnorm"]
    print(f"With the Reward-Resolution Protocol (resolution {_DEMO_TAU_RES:g}), MaxNorm skips "
          f"{protocol.zero_gap_fraction:.0%} of the groups as zero-gap (constant up to "
          f"jitter) and its direction cosine to the clean weights is "
          f"{protocol.direction_cosine:.4f}.")
    return 0


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="seed of the built-in batch")


class _BadInput(Exception):
    """A problem with the user's file or options, reported as one line and exit code 2."""


class _RewardLog(NamedTuple):
    rewards: np.ndarray
    offsets: np.ndarray | None
    group_ids: Any
    second: np.ndarray | None


_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".npz": "npz"}


def _number(value: Any, what: str, where: str) -> float:
    """A finite float from a CSV cell or a JSON value, else a one-line error."""
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise _BadInput(f"{where}: {what} {json.dumps(value)} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise _BadInput(f"{where}: {what} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise _BadInput(f"{where}: {what} {value!r} is not a finite number")
    return number


def _columns(rows: list[tuple[str, dict[str, Any]]], group_col: str, reward_col: str,
             second_col: str | None, *, csv_ids: bool) -> _RewardLog:
    """Turn ``(where, row)`` records into a reward log, checking every cell."""
    if not rows:
        raise _BadInput("no rows (the file holds no responses)")
    groups: list[Any] = []
    rewards: list[float] = []
    second: list[float] = []
    for where, row in rows:
        for column in (group_col, reward_col, second_col):
            if column is not None and row.get(column) in (None, ""):
                found = ", ".join(str(k) for k in row) or "none"
                if column not in row:
                    raise _BadInput(f"{where}: no column {column!r} (columns: {found})")
                raise _BadInput(f"{where}: empty value in column {column!r}")
        label = row[group_col]
        if isinstance(label, (list, dict)):
            raise _BadInput(f"{where}: group id {json.dumps(label)} is not a scalar")
        # JSON ids are told apart by their JSON text: Python would merge 1, 1.0 and true.
        groups.append(label if isinstance(label, str) and csv_ids else json.dumps(label))
        rewards.append(_number(row[reward_col], f"{reward_col!r} value", where))
        if second_col is not None:
            second.append(_number(row[second_col], f"{second_col!r} value", where))
    return _RewardLog(np.array(rewards), None, groups,
                      np.array(second) if second_col is not None else None)


def _read_csv(path: Path, args: argparse.Namespace) -> _RewardLog:
    with path.open(newline="", encoding="utf-8-sig") as f:  # tolerate a BOM (Excel)
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise _BadInput("empty file (no header row)")
        rows = [(f"line {reader.line_num}", dict(row)) for row in reader]
    if not rows:
        missing = [c for c in (args.group_col, args.reward_col, args.second_col)
                   if c is not None and c not in reader.fieldnames]
        if missing:
            raise _BadInput(f"no column {missing[0]!r} (columns: "
                            f"{', '.join(reader.fieldnames)})")
    return _columns(rows, args.group_col, args.reward_col, args.second_col, csv_ids=True)


def _read_jsonl(path: Path, args: argparse.Namespace) -> _RewardLog:
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _BadInput(f"line {lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise _BadInput(f"line {lineno}: expected a JSON object, got "
                                f"{type(row).__name__}")
            rows.append((f"line {lineno}", row))
    return _columns(rows, args.group_col, args.reward_col, args.second_col, csv_ids=False)


def _read_npz(path: Path, args: argparse.Namespace) -> _RewardLog:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError) as exc:
        raise _BadInput(f"cannot read as .npz ({exc})") from None
    if "rewards" not in arrays:
        raise _BadInput(f"no array 'rewards' (arrays: {', '.join(arrays) or 'none'})")
    second_key = args.second_col or "second"
    if args.second_col is not None and second_key not in arrays:
        raise _BadInput(f"no array {second_key!r} (arrays: {', '.join(arrays)})")
    rewards = arrays["rewards"]
    if rewards.size == 0:
        raise _BadInput("no rows (the array 'rewards' is empty)")
    return _RewardLog(rewards, arrays.get("offsets"), arrays.get("group_ids"),
                      arrays.get(second_key))


def _read_log(args: argparse.Namespace) -> _RewardLog:
    path = Path(args.file)
    fmt = args.format
    if fmt == "auto":
        if path.suffix.lower() not in _FORMATS:
            raise _BadInput(f"unknown file extension {path.suffix!r}: expected .csv, .jsonl, "
                            ".ndjson or .npz (or pass --format)")
        fmt = _FORMATS[path.suffix.lower()]
    if not path.is_file():
        raise _BadInput("no such file" if not path.exists() else "not a regular file")
    reader = {"csv": _read_csv, "jsonl": _read_jsonl, "npz": _read_npz}[fmt]
    try:
        return reader(path, args)
    except UnicodeDecodeError:
        raise _BadInput("not a UTF-8 text file") from None
    except csv.Error as exc:
        raise _BadInput(f"malformed CSV ({exc})") from None


def _plot(diag: ScaleDiagnostics, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [d.inverse_scale for d in diag.methods.values() if d.inverse_scale.size]
    fig, ax = plt.subplots(figsize=(7, 4))
    if values:
        low = min(float(v.min()) for v in values)
        high = max(float(v.max()) for v in values)
        bins = np.geomspace(low / 1.5, high * 1.5, 50)
        for d in diag.methods.values():
            if d.inverse_scale.size:
                ax.hist(d.inverse_scale, bins=bins.tolist(), histtype="step", linewidth=1.5,
                        label=f"{d.method} (P99 {d.inverse_scale_p99:.3g})")
        ax.set_xscale("log")
    ax.axvline(1.0 / diag.tau_res, color="black", linestyle="--", linewidth=1,
               label=f"1/tau_res = {1.0 / diag.tau_res:g}")
    ax.set_xlabel("inverse scale 1/s_q (prompt weight in the batch)")
    ax.set_ylabel("groups")
    ax.set_title("inverse-scale distribution per method")
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def _run_diagnose(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        print(f"advcal diagnose: error: {message}", file=sys.stderr)
        return 2

    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return fail("--plot needs matplotlib, which is not installed "
                        "(pip install 'advcal[plot]')")
        if not Path(args.plot).parent.is_dir():
            return fail(f"cannot write the plot {args.plot}: no such directory")
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    try:
        log = _read_log(args)
    except _BadInput as exc:
        return fail(f"{args.file}: {exc}")
    except OSError as exc:
        return fail(f"{args.file}: cannot read ({exc.strerror or exc})")
    try:
        diag = scale_diagnostics(
            log.rewards, log.offsets, group_ids=log.group_ids, methods=methods,
            beta=args.beta, tau_res=args.tau_res, eps=args.eps, resolution=args.resolution,
            reference=log.second,
        )
    except (ValueError, TypeError) as exc:
        return fail(f"{args.file}: {exc}")
    print(f"advcal diagnose: {args.file}")
    if log.second is not None:
        print("cosine = direction cosine between the weights of the two scorings")
    print(diag.table())
    if args.plot is not None:
        try:
            _plot(diag, args.plot)
        except (OSError, ValueError) as exc:
            return fail(f"cannot write the plot {args.plot}: {exc}")
        print(f"inverse-scale plot written to {args.plot}")
    return 0


def _diagnose_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        help="reward log: .csv or .jsonl/.ndjson with one row per response, or .npz with "
             "arrays 'rewards' (2-D: groups by row; 1-D: with 'offsets' or 'group_ids'), "
             "optionally 'second' (a second scoring, same shape)",
    )
    parser.add_argument("--format", choices=("auto", "csv", "jsonl", "npz"), default="auto",
                        help="file format (default: from the extension)")
    parser.add_argument("--group-col", default="group",
                        help="column of the group (prompt) id (CSV/JSONL; default: group)")
    parser.add_argument("--reward-col", default="reward",
                        help="column of the reward (CSV/JSONL; default: reward)")
    parser.add_argument("--second-col", default=None,
                        help="column of a second scoring of the same responses: adds the "
                             "direction cosine (for .npz: the array name, default 'second' "
                             "when present)")
    parser.add_argument("--methods", default="grpo,rloo,maxnorm",
                        help="comma-separated estimators, of "
                             + ", ".join(DIAGNOSED_METHODS) + " (default: grpo,rloo,maxnorm)")
    parser.add_argument("--tau-res", type=float, default=0.01,
                        help="MaxNorm scale floor tau_res (default: 0.01)")
    parser.add_argument("--beta", type=float, default=0.04,
                        help="KL coefficient beta (default: 0.04)")
    parser.add_argument("--eps", type=float, default=1e-6, help="GRPO eps (default: 1e-6)")
    parser.add_argument("--resolution", type=float, default=None,
                        help="let MaxNorm bin rewards in [0, 1] to this resolution first")
    parser.add_argument("--plot", metavar="PATH", default=None,
                        help="write a PNG of the inverse-scale distributions per method "
                             "(needs matplotlib: pip install 'advcal[plot]')")


_COMMANDS = [
    _Command("demo", "a tour of advcal on built-in synthetic data", _demo_arguments, _run_demo),
    _Command("diagnose", "scale diagnostics (GRPO vs RLOO vs MaxNorm) of a reward log",
             _diagnose_arguments, _run_diagnose),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="advcal", description="Advantage calibration for group-relative RL."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(child)
        child.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``advcal`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
