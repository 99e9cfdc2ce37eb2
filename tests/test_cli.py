"""The ``advcal`` command line end to end: ``demo`` (its sections, their numbers checked
against the guarantees they show, its figures and progress bars) and ``diagnose`` on files
the tests write, good and bad, in-process through ``main`` and once through the installed
script."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from advcal import scale_diagnostics
from advcal.cli import _Bar, _print_setgrpo, _progress_enabled, demo_diagnostics, demo_setgrpo, main

GROUPS = ["p1"] * 4 + ["p2"] * 4 + ["p3"] * 3
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.7, 0.7001, 0.7, 0.6999, 0.5, 0.5, 0.5]
SECOND = [0.9, 0.1, 1.0, 0.0, 0.7, 0.7, 0.7, 0.7, 0.5, 0.6, 0.5]


def write_csv(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def good_csv(tmp_path: Path) -> Path:
    rows = [f"{g},{r},{s}" for g, r, s in zip(GROUPS, REWARDS, SECOND, strict=True)]
    return write_csv(tmp_path / "log.csv", "group,reward,judge", rows)


def expected_table(**kw) -> str:
    return scale_diagnostics(np.array(REWARDS), group_ids=GROUPS, **kw).table()


def run_ok(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""
    return captured.out


def run_bad(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("advcal diagnose: error: ")
    return captured.err


# --------------------------------------------------------------------------- demo

DEMO = ["demo", "--no-progress"]
FIGURES = ["scales.png", "coverage.png", "setgrpo_risk.png"]
Z = 4.0  # standard errors, the demo's documented tolerance


def run_demo(argv: list[str], stderr: io.StringIO | None = None) -> str:
    out, err = io.StringIO(), stderr if stderr is not None else io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    if stderr is None:
        assert err.getvalue() == ""
    return out.getvalue()


@pytest.fixture(scope="module")
def demo_out() -> str:
    """One full `advcal demo --no-progress` (seed 0), shared by the checks of its sections."""
    return run_demo(DEMO)


def section(out: str, first: str, last: str | None = None) -> str:
    start = out.index(first)
    return out[start:] if last is None else out[start:out.index(last, start)]


def numbers(pattern: str, text: str) -> tuple[float, ...]:
    found = re.search(pattern, text)
    assert found is not None, (pattern, text)
    return tuple(float(g) for g in found.groups())


def exact_rank(m: int, alpha: float) -> int:
    # ceil((m + 1)(1 - alpha)) on the percent grid, in integers (alpha has two decimals)
    return -(-(m + 1) * (100 - round(100 * alpha)) // 100)


def coverage_tolerance(m: int, alpha: float, repeats: int, tests: int) -> float:
    """Z standard errors of a mean coverage over `repeats` calibrations of `tests` each:
    the conditional coverage is Beta(k, m + 1 - k) given the calibration (continuous
    scores), each test a Bernoulli of it; one test per calibration is binomial."""
    k = exact_rank(m, alpha)
    if k > m:
        return 0.0
    p = k / (m + 1)
    between = p * (1 - p) / (m + 2)
    return Z * math.sqrt((between + (p * (1 - p) - between) / tests) / repeats)


def test_demo_prints_the_scale_table_and_the_paper_finding(capsys, demo_out):
    out = run_ok(capsys, ["demo"])  # stderr is not a terminal here: no progress bars
    assert out == demo_out  # deterministic for a fixed seed
    assert "maxnorm" in out
    diag = demo_diagnostics(0)
    assert diag.table() in out
    p99 = diag["grpo"].inverse_scale_p99
    assert f"GRPO's inverse-scale P99 is {p99:.0f}" in out
    # orders of magnitude above the cap 1/tau_res = 100, which MaxNorm never exceeds
    assert p99 >= 1000 and diag["maxnorm"].inverse_scale_max <= 100
    assert "With the Reward-Resolution Protocol (resolution 0.01), MaxNorm skips" in out


def test_demo_estimator_table_keeps_its_columns_apart(demo_out):
    # mad_scale's max|A| is 7.5e5 on the demo data: a fixed width ran it into mean|A|.
    table = demo_out[demo_out.index("\nestimator ") + 1:]
    lines = table.split("\n\n")[0].splitlines()
    assert lines[0].split() == ["estimator", "max|A|", "mean|A|", "zero", "groups"]
    values = {}
    for line in lines[1:]:
        name, big, mean, zero = line.split()
        values[name] = (float(big), float(mean), int(zero))
    assert values["mad_scale"][0] == pytest.approx(7.5e5, rel=1e-3)
    assert values["grpo"][0] == pytest.approx(1.959, abs=1e-3)
    from advcal.cli.demo import _number, _table

    assert _number(1.5e6) == "1.500e+06" and _number(-0.0004) == "-0.000"
    assert _table(("a", "b"), [("x", "123456789012")]).splitlines()[1].endswith(
        "  123456789012")


def test_demo_sections_in_order(demo_out):
    heads = ["advantages of group 3, per estimator", "scale diagnostics of a built-in reward log",
             "coverage of split-conformal reward ranges", "SetGRPO on simulated paired scorings",
             "SRGO threshold selection", "SetGRPO step on"]
    positions = [demo_out.index(head) for head in heads]
    assert positions == sorted(positions)
    assert "figures written" not in demo_out


def test_demo_conformal_coverage_table(demo_out):
    text = section(demo_out, "coverage of split-conformal reward ranges", "SetGRPO on")
    splits, tests = numbers(r"(\d+) splits per m", text) + numbers(r"testing (\d+) fresh", text)
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+\[([\d.]+), ([\d.]+)\]\s+([\d.]+)\s+([\d.]+)"
                      r"\s+([\d.]+)$", text, flags=re.M)
    assert {(int(r[0]), float(r[1])) for r in rows} == {
        (m, a) for m in (19, 99) for a in (0.05, 0.1, 0.2)}
    for row in rows:
        m, alpha, lo, hi, absolute, normalized, tol = int(row[0]), *map(float, row[1:])
        assert (lo, hi) == (round(1 - alpha, 3), round(min(1.0, 1 - alpha + 1 / (m + 1)), 3))
        expected_tol = coverage_tolerance(m, alpha, int(splits), int(tests))
        assert tol == pytest.approx(expected_tol, abs=5e-5)
        for coverage in (absolute, normalized):
            assert 0.0 <= coverage <= 1.0
            assert lo - expected_tol - 5e-4 <= coverage <= hi + expected_tol + 5e-4, row


def test_demo_setgrpo_run(demo_out):
    from scipy.stats import beta as beta_law

    text = section(demo_out, "SetGRPO on simulated paired scorings")
    alpha, m, rho = numbers(r"alpha = ([\d.]+), calibrated on (\d+) groups: radius rho = "
                            r"([\d.]+)", text)
    n_fresh, set_coverage = numbers(r"T\(r'\) on (\d+) fresh groups: ([\d.]+)", text)
    lo, hi, tol = numbers(r"\(band \[([\d.]+), ([\d.]+)\], tol ([\d.]+)\)", text)
    assert math.isfinite(rho) and rho > 0
    assert (lo, hi) == (round(1 - alpha, 4), round(1 - alpha + 1 / (m + 1), 4))
    expected_tol = coverage_tolerance(int(m), alpha, 1, int(n_fresh))
    assert tol == pytest.approx(expected_tol, abs=5e-5)
    assert lo - expected_tol <= set_coverage <= hi + expected_tol

    n_risk, beta, delta = numbers(r"selection on (\d+) groups with a reference scoring "
                                  r"\(beta = ([\d.]+), delta = ([\d.]+)", text)
    rows = re.findall(r"^\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(nan|[\d.]+)\s+([\d.]+)\s+([\d.]+)"
                      r"\s+(yes|no)$", text, flags=re.M)
    tau = [float(r[0]) for r in rows]
    assert tau == [round(0.5 - 0.05 * i, 2) for i in range(11)]  # the grid, strict to loose
    n_acc = np.array([int(r[1]) for r in rows])
    k_rev = np.array([int(r[2]) for r in rows])
    ucb = np.array([float(r[4]) for r in rows])
    recovery = np.array([float(r[5]) for r in rows])
    feasible = np.array([r[6] == "yes" for r in rows])
    assert (np.diff(n_acc) >= 0).all() and (k_rev <= n_acc).all()  # looser accepts more
    assert (np.diff(recovery) >= 0).all()
    level = delta / len(tau)  # Bonferroni
    for r, n, k, bound in zip(rows, n_acc, k_rev, ucb, strict=True):
        if n:
            assert float(r[3]) == pytest.approx(k / n, abs=5e-5)
            exact = 1.0 if k == n else float(beta_law.ppf(1 - level, k + 1, n - k))
            assert bound == pytest.approx(exact, abs=5e-5)  # Clopper-Pearson
    np.testing.assert_array_equal(feasible, (n_acc > 0) & (ucb <= beta))

    if "selected tau: none" in text:
        assert not feasible.any()
        assert "acceptance rate 0.0000" in text
        return
    tau_sel, sel_ucb, sel_beta, sel_risk, sel_k, sel_n = numbers(
        r"selected tau = ([\d.]+) .*\nUCB ([\d.]+) <= beta = ([\d.]+), empirical risk "
        r"([\d.]+) \((\d+) reversals of (\d+) accepted\)", text)
    assert tau_sel in tau
    j = tau.index(tau_sel)
    assert feasible[j] and recovery[j] == recovery[feasible].max()
    assert (sel_ucb, sel_k, sel_n) == (ucb[j], k_rev[j], n_acc[j]) and sel_beta == beta
    assert sel_risk == float(rows[j][3])
    n_train, step_tau, acceptance, eta = numbers(
        r"SetGRPO step on (\d+) training groups at tau = ([\d.]+): acceptance rate ([\d.]+),"
        r"\nmean recovery ratio eta\* ([\d.]+) over the accepted groups", text)
    assert step_tau == tau_sel and n_train > 0
    assert 0.0 < acceptance <= 1.0 and 0.0 <= eta <= 1.0
    # the training groups are exchangeable with the risk-calibration groups
    p = n_acc[j] / n_risk
    assert abs(acceptance - p) <= Z * math.sqrt(p * (1 - p) * (1 / n_train + 1 / n_risk))


def test_demo_setgrpo_report_when_no_threshold_is_certified(capsys):
    run = demo_setgrpo(0)
    sel = run.selection._replace(tau_sel=None, feasible=np.zeros_like(run.selection.feasible))
    step = run.step._replace(accepted=np.zeros_like(run.step.accepted),
                             eta=np.zeros_like(run.step.eta))
    _print_setgrpo(run._replace(selection=sel, step=step))
    out = capsys.readouterr().out
    assert "selected tau: none (no threshold is certified; SetGRPO rejects every group)." in out
    assert "at tau = none: acceptance rate 0.0000," in out
    assert "mean recovery ratio eta* n/a over the accepted groups." in out
    assert "yes" not in out


def test_demo_out_writes_the_figures(tmp_path, demo_out):
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "figures" / "new"  # created, parents too
    out = run_demo([*DEMO, "--out", str(out_dir)])
    assert out == demo_out + f"\nfigures written to {out_dir}: {', '.join(FIGURES)}\n"
    for name in FIGURES:
        assert (out_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(FIGURES)


def demo_error(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 2 and out.getvalue() == ""
    assert err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue()
    assert err.getvalue().startswith("advcal demo: error: ")
    return err.getvalue()


def test_demo_out_without_matplotlib_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    err = demo_error([*DEMO, "--out", str(tmp_path / "figs")])
    assert "--out needs matplotlib, which is not installed (pip install 'advcal[plot]')" in err
    assert not (tmp_path / "figs").exists()


def test_demo_out_that_cannot_be_a_directory(tmp_path):
    pytest.importorskip("matplotlib")
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    err = demo_error([*DEMO, "--out", str(blocker / "figs")])
    assert f"cannot create the figure directory {blocker / 'figs'}" in err


def test_demo_rejects_a_negative_seed(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--seed", "-1"])
    assert exc.value.code == 2
    assert "invalid seed -1: must be >= 0" in capsys.readouterr().err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_only_on_a_terminal_and_without_no_progress():
    assert _progress_enabled(False, Terminal())
    assert not _progress_enabled(True, Terminal())
    assert not _progress_enabled(False, io.StringIO())
    assert not _progress_enabled(False, object())  # no isatty at all


def test_progress_bar_draws_and_erases_itself():
    stream = Terminal()
    with _Bar("work", 4, stream, enabled=True) as bar:
        bar.describe("step one")
        for _ in range(4):
            bar.advance()
    text = stream.getvalue()
    frames = text.split("\r")
    assert frames[1].startswith("work [------------------------]   0%")
    assert frames[2].startswith("work [------------------------]   0%") and "step one" in frames[2]
    # advances within 0.1 s of a drawing are throttled; the last one always draws
    assert frames[-3].startswith("work [########################] 100%")
    assert all(f.startswith("work [") and "step one" in f for f in frames[2:-2])
    assert frames[-2].strip() == "" and frames[-1] == ""  # erased: the line is blank again
    silent = io.StringIO()
    with _Bar("work", 4, silent, enabled=False) as bar:
        bar.advance(4)
    assert silent.getvalue() == ""


def test_demo_on_a_terminal_shows_progress_on_stderr_only(demo_out, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # bars are cut to the terminal width
    err = Terminal()
    out = run_demo(["demo", "--seed", "1"], stderr=err)
    for label in ("advantages [", "scale diagnostics [", "conformal coverage [", "SetGRPO [",
                  "SRGO tau"):
        assert label in err.getvalue(), label
    assert "\r" not in out and "[#" not in out
    # another seed: the same sections, other simulated numbers
    assert out != demo_out
    assert [line[:20] for line in out.splitlines() if line.startswith("SetGRPO")] == [
        line[:20] for line in demo_out.splitlines() if line.startswith("SetGRPO")]


# --------------------------------------------------------------------------- good files


def test_diagnose_csv(capsys, tmp_path):
    out = run_ok(capsys, ["diagnose", str(good_csv(tmp_path))])
    assert expected_table() in out
    assert "cosine" not in out


def test_diagnose_csv_with_byte_order_mark(capsys, tmp_path):
    path = good_csv(tmp_path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as spreadsheet programs save
    assert expected_table() in run_ok(capsys, ["diagnose", str(path)])


def test_diagnose_csv_second_scoring_and_options(capsys, tmp_path):
    path = good_csv(tmp_path)
    out = run_ok(capsys, ["diagnose", str(path), "--second-col", "judge", "--tau-res", "0.02",
                          "--beta", "0.1", "--eps", "1e-4", "--methods", "maxnorm,dr_grpo"])
    table = expected_table(reference=np.array(SECOND), tau_res=0.02, beta=0.1, eps=1e-4,
                           methods=("maxnorm", "dr_grpo"))
    assert table in out
    assert "cosine" in out.splitlines()[2]


def test_diagnose_csv_custom_columns_and_resolution(capsys, tmp_path):
    rows = [f"{r};{g}" for g, r in zip(GROUPS, REWARDS, strict=True)]
    path = tmp_path / "log.txt"
    path.write_text("\n".join(["score;uid", *rows]) + "\n", encoding="utf-8")
    # the semicolon file is not a CSV of these columns: a clear error
    err = run_bad(capsys, ["diagnose", str(path), "--format", "csv", "--group-col", "uid",
                           "--reward-col", "score"])
    assert "no column 'uid'" in err
    rows = [f"{r},{g}" for g, r in zip(GROUPS, REWARDS, strict=True)]
    write_csv(path, "score,uid", rows)
    out = run_ok(capsys, ["diagnose", str(path), "--format", "csv", "--group-col", "uid",
                          "--reward-col", "score", "--resolution", "0.01"])
    assert expected_table(resolution=0.01) in out


def test_diagnose_jsonl(capsys, tmp_path):
    path = tmp_path / "log.jsonl"
    lines = [json.dumps({"prompt": i // 4, "reward": r, "meta": {"x": 1}})
             for i, r in enumerate(REWARDS)]
    lines.insert(3, "")  # blank lines are allowed
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = run_ok(capsys, ["diagnose", str(path), "--group-col", "prompt"])
    ids = [i // 4 for i in range(len(REWARDS))]
    assert scale_diagnostics(np.array(REWARDS), group_ids=ids).table() in out


def test_jsonl_group_ids_are_told_apart_by_their_json_text(capsys, tmp_path):
    # Python would merge 1, 1.0 and true into one group; JSON keeps them apart
    path = tmp_path / "ids.jsonl"
    ids = [1, 1, 1.0, 1.0, True, True, "1", "1"]
    rewards = [0.0, 1.0, 0.2, 0.4, 0.5, 0.5, 0.3, 0.9]
    path.write_text("".join(json.dumps({"group": g, "reward": r}) + "\n"
                            for g, r in zip(ids, rewards, strict=True)), encoding="utf-8")
    out = run_ok(capsys, ["diagnose", str(path)])
    offsets = [0, 2, 4, 6, 8]
    assert scale_diagnostics(np.array(rewards), offsets).table() in out
    assert "4 groups with >= 2 responses" in out


@pytest.mark.parametrize("layout", ["dense", "offsets", "group_ids"])
def test_diagnose_npz(capsys, tmp_path, layout):
    dense = np.array(REWARDS[:8]).reshape(2, 4)
    second = np.array(SECOND[:8]).reshape(2, 4)
    path = tmp_path / "log.npz"
    if layout == "dense":
        np.savez(path, rewards=dense, second=second)
    elif layout == "offsets":
        np.savez(path, rewards=dense.ravel(), offsets=[0, 4, 8], second=second.ravel())
    else:
        np.savez(path, rewards=dense.ravel(), group_ids=np.array(GROUPS[:8]),
                 second=second.ravel())
    out = run_ok(capsys, ["diagnose", str(path)])
    assert scale_diagnostics(dense, reference=second).table() in out


# --------------------------------------------------------------------------- presets


def test_diagnose_verl_dump_matches_the_array_api(capsys, tmp_path):
    from tests.test_logs import verl_rows, write_jsonl

    rows = verl_rows(n_prompts=20, group=5, steps=1, seed=5)
    lines = [json.dumps(r) for r in rows]
    lines[2] = json.dumps({**rows[2], "score": float("nan")})  # 'line 3: ... nan'
    lines[9] = lines[9][:25]  # a broken line
    path = tmp_path / "1.jsonl.gz"
    import gzip

    write_jsonl(path, lines, opener=gzip.open)
    out = run_ok(capsys, ["diagnose", str(path), "--preset", "verl"])
    kept = [r for i, r in enumerate(rows) if i not in (2, 9)]
    table = scale_diagnostics(np.array([r["score"] for r in kept]),
                              group_ids=[r["input"] for r in kept]).table()
    assert table in out
    assert "JSON Lines, gzip; group: step + input; reward: score" in out
    assert ("skipped 2 bad lines (line 3: empty or NaN value in column 'score'; "
            "line 10: not valid JSON") in out


def test_diagnose_trl_log_with_weights(capsys, tmp_path):
    from tests.test_logs import trl_frame, trl_sum

    pa = pytest.importorskip("pyarrow")
    import pyarrow.csv as pcsv

    frame = trl_frame(seed=6)
    path = tmp_path / "completions.csv"
    pcsv.write_csv(pa.table(frame), str(path))
    out = run_ok(capsys, ["diagnose", str(path), "--preset", "trl", "--reward-weights",
                          "1,0.25", "--methods", "grpo,maxnorm"])
    expected = scale_diagnostics(trl_sum(frame, (1.0, 0.25)), group_ids=frame["prompt"],
                                 methods=("grpo", "maxnorm"))
    assert expected.table() in out
    assert "reward: accuracy_reward + format_reward (sum, weights 1, 0.25)" in out
    explicit = run_ok(capsys, ["diagnose", str(path), "--group-col", "prompt",
                               "--reward-col", "accuracy_reward", "--reward-col",
                               "format_reward", "--reward-weights", "1,0.25", "--methods",
                               "grpo,maxnorm"])
    assert expected.table() in explicit


def test_diagnose_json_output(capsys, tmp_path):
    out = run_ok(capsys, ["diagnose", str(good_csv(tmp_path)), "--json"])
    result = json.loads(out)
    diag = scale_diagnostics(np.array(REWARDS), group_ids=GROUPS)
    assert result["responses"] == 11 and result["groups_with_2_or_more"] == 3
    assert result["bad_rows"] == {"count": 0, "unit": "line", "first": []}
    for name in ("grpo", "rloo", "maxnorm"):
        got = result["methods"][name]
        assert got["inverse_scale_p99"] == diag[name].inverse_scale_p99
        assert got["zero_gap_fraction"] == diag[name].zero_gap_fraction
        assert got["reward_kl_ratio"] == diag[name].reward_kl_ratio
        assert got["direction_cosine"] is None


def test_legend_explains_every_column(capsys, tmp_path):
    out = run_ok(capsys, ["diagnose", str(good_csv(tmp_path)), "--second-col", "judge"])
    legend = out[out.index("columns:"):]
    for column in ("1/s P50..max", "zero-gap", "beta_eff min/max", "R/KL", "max|w|",
                   "cosine"):
        assert f"\n  {column} " in legend, column
    assert "1/(std_q + eps)" in legend and "beta * s_q" in legend
    assert "mean_i |w_i| / beta" in legend
    explained = run_ok(capsys, ["diagnose", str(good_csv(tmp_path)), "--explain"])
    assert "informative group:" in explained and "informative group:" not in out


# --------------------------------------------------------------------------- bad files


def test_bad_rows_are_skipped_and_reported(capsys, tmp_path):
    path = write_csv(tmp_path / "messy.csv", "group,reward",
                     ["a,1", "a,nan", "a,0", "b,", "b,high", "b,1", "b,0", "c"])
    out = run_ok(capsys, ["diagnose", str(path)])
    assert ("skipped 4 bad lines (line 3: empty or NaN value in column 'reward'; line 5: "
            "empty or NaN value in column 'reward'; line 6: 'reward' value 'high' is not a "
            "number; line 9: 1 fields, expected 2)") in out
    expected = scale_diagnostics(np.array([1.0, 0.0, 1.0, 0.0]),
                                 group_ids=["a", "a", "b", "b"])
    assert expected.table() in out
    err = run_bad(capsys, ["diagnose", str(path), "--strict"])
    assert err.endswith("line 3: empty or NaN value in column 'reward'\n")
    err = run_bad(capsys, ["diagnose", str(path), "--on-bad-row", "error"])
    assert "line 3: empty or NaN" in err


def test_singleton_groups_left_by_skipped_rows(capsys, tmp_path):
    path = write_csv(tmp_path / "s.csv", "group,reward", ["a,1", "a,0", "b,1", "b,nan"])
    out = run_ok(capsys, ["diagnose", str(path)])
    assert "1 group with a single response: no relative information, in no statistic" in out
    assert "1 groups with >= 2 responses, 3 responses" in out
    err = run_bad(capsys, ["diagnose", str(path), "--singleton", "error"])
    assert "1 groups have a single response" in err


def test_bad_files(capsys, tmp_path):
    cases = {
        "missing.csv": (None, "no such file"),
        "log.parquet": ("x", "the extension says Parquet, but the content is text"),
        "empty.csv": ("", "empty file (no header row)"),
        "empty.parquet": ("", "empty file (0 bytes)"),
        "header.csv": ("group,reward\n", "no rows"),
        "nocol.csv": ("group,score\na,1\n", "no column 'reward' (found: group, score); pass "
                      "--reward-col NAME and --group-col NAME"),
        "text.csv": ("group,reward\na,1\na,high\n", "no group with two or more responses"),
        "allbad.csv": ("group,reward\na,x\na,nan\n", "no valid rows: skipped 2 bad lines "
                       "(line 2: 'reward' value 'x' is not a number; line 3: empty or NaN"),
        "bad.jsonl": ('{"group": 1,\n', "no valid rows: skipped 1 bad line (line 1: not "
                      "valid JSON"),
        "list.jsonl": ("[1, 0.5]\n", "line 1: expected a JSON object, got list"),
        "gid.jsonl": ('{"group": [], "reward": 1}\n', "line 1: empty group id"),
        "nokey.jsonl": ('{"group": 1}\n', "no column 'reward' (found: group)"),
        "empty.jsonl": ("\n\n", "empty file (no rows)"),
        "single.csv": ("group,reward\na,1\nb,0\n", "no group with two or more responses"),
        "corrupt.npz": ("not a zip", "the extension says .npz, but the content is text"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(content, encoding="utf-8")
        err = run_bad(capsys, ["diagnose", str(path)])
        assert message in err, (name, err)


def big_number_jsonl(tmp_path: Path, digits: int) -> Path:
    path = tmp_path / f"n{digits}.jsonl"
    path.write_text('{"group": "a", "reward": 1' + "0" * digits + "}\n", encoding="utf-8")
    return path


def malformed_files(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Each of the issue's malformed inputs: argv and a part of the one-line error."""
    from tests.test_logs import npy_bytes, npz_with, zip_bomb

    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"group": "a", "reward": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
                    encoding="utf-8")
    big_endian = tmp_path / "big.npz"
    np.savez(big_endian, rewards=np.array([[1.0, 0.0]]).astype(">f8"),
             offsets=np.array([0, 1]).astype(">i8"))
    header = {"descr": "<f8", "fortran_order": False, "shape": (4,)}
    headerless = npz_with(tmp_path / "headerless.npz", np.arange(8.0).tobytes())
    truncated = npz_with(tmp_path / "truncated.npz", npy_bytes(header, b"\0" * 16))
    huge = npz_with(tmp_path / "huge.npz", npy_bytes({**header, "shape": (2 ** 40,)}))
    npy = tmp_path / "r.npy"
    np.save(npy, np.eye(2))
    bomb = zip_bomb(tmp_path / "bomb.npz", 4_000_000_000)
    pickled = tmp_path / "pickle.npz"
    np.savez(pickled, rewards=np.ones(2), group_ids=np.array([{}, 2], dtype=object))
    broken_gz = tmp_path / "log.csv.gz"
    broken_gz.write_bytes(b"\x1f\x8b\x08\x00" + b"junk" * 10)
    return {
        "400 digits": ([str(big_number_jsonl(tmp_path, 400))], "is not a finite number"),
        "5000 digits": ([str(big_number_jsonl(tmp_path, 5000))], "is not a finite number"),
        "nested 1e5": ([str(deep)], "line 1: JSON nested too deeply"),
        "big-endian 2-D with offsets": ([str(big_endian)], "2-D rewards are grouped by row"),
        "headerless": ([str(headerless)], "member 'rewards' is not a .npy array"),
        "truncated": ([str(truncated)], "member 'rewards' is truncated"),
        "2^40": ([str(huge)], "has shape (1099511627776,)"),
        ".npy as npz": ([str(npy), "--format", "npz"], "the content is a .npy file, not .npz"),
        "zip bomb": ([str(bomb)], "over the limit of"),
        "pickle": ([str(pickled)], "never loaded"),
        "broken gzip": ([str(broken_gz)], "cannot decompress"),
    }


def test_malformed_files_are_one_line_errors(capsys, tmp_path):
    for name, (argv, message) in malformed_files(tmp_path).items():
        err = run_bad(capsys, ["diagnose", *argv])
        assert message in err, (name, err)


def test_big_endian_npz_reads_like_native(capsys, tmp_path):
    dense = np.array(REWARDS[:8]).reshape(2, 4)
    np.savez(tmp_path / "be.npz", rewards=dense.astype(">f8"))
    assert scale_diagnostics(dense).table() in run_ok(capsys, ["diagnose",
                                                               str(tmp_path / "be.npz")])


def test_bad_binary_and_npz_contents(capsys, tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes(b"group,reward\n\xff\xfe,1\n")
    assert "UTF-8 text" in run_bad(capsys, ["diagnose", str(path)])
    path = tmp_path / "nokey.npz"
    np.savez(path, scores=np.ones(3))
    assert "no array 'rewards' (found: scores)" in run_bad(capsys, ["diagnose", str(path)])
    path = tmp_path / "nooffsets.npz"
    np.savez(path, rewards=np.array([1.0, 0.0]))
    assert "1-D rewards need exactly one of `offsets` or `group_ids`" in run_bad(
        capsys, ["diagnose", str(path)])
    path = tmp_path / "second.npz"
    np.savez(path, rewards=np.ones((2, 2)))
    assert "no array 'judge'" in run_bad(capsys, ["diagnose", str(path), "--second-col",
                                                  "judge"])
    # A folder is a log of several files (each named in its error); an empty one is none.
    assert "latin.csv" in run_bad(capsys, ["diagnose", str(tmp_path), "--format", "csv"])
    (tmp_path / "empty").mkdir()
    assert "a folder without log files" in run_bad(capsys, ["diagnose",
                                                            str(tmp_path / "empty")])


def test_without_pyarrow_the_error_says_what_to_install(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import now raises ImportError
    err = run_bad(capsys, ["diagnose", str(good_csv(tmp_path))])
    assert err == ("advcal diagnose: error: reading reward logs needs pyarrow, which is not "
                   "installed (pip install 'advcal[logs]')\n")


def test_bad_options_are_one_line_errors(capsys, tmp_path):
    path = str(good_csv(tmp_path))
    assert "`methods` must be one of" in run_bad(capsys, ["diagnose", path, "--methods",
                                                          "grpo,ppo"])
    assert "`tau_res` must lie in" in run_bad(capsys, ["diagnose", path, "--tau-res", "0"])
    assert "`rewards` must lie in `bounds`" not in run_ok(capsys, ["diagnose", path])
    bad = write_csv(tmp_path / "big.csv", "group,reward", ["a,2", "a,0"])
    assert "`rewards` must lie in `bounds`" in run_bad(
        capsys, ["diagnose", str(bad), "--resolution", "0.1"])
    assert "--reward-weights '1,x': expected comma-separated numbers" in run_bad(
        capsys, ["diagnose", path, "--reward-weights", "1,x"])
    assert "2 reward weights for the 1 reward columns reward" in run_bad(
        capsys, ["diagnose", path, "--reward-weights", "1,2"])
    with pytest.raises(SystemExit) as exc:  # argparse's own usage error, exit code 2
        main(["diagnose", path, "--tau-res", "abc"])
    assert exc.value.code == 2
    capsys.readouterr()


bad_cells = st.one_of(st.sampled_from(["", "nan", "-inf", "1e999", "x", "a,b", '"', "true"]),
                      st.text(max_size=6))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(groups=st.lists(st.sampled_from(["1", "2"]), max_size=10),
       data=st.data(), corrupt=st.booleans(), raw=st.binary(max_size=40),
       kind=st.sampled_from(["csv", "csv", "jsonl", "jsonl", "npz", "bytes"]))
def test_any_file_gives_a_table_or_one_error_line(capsys, tmp_path, groups, data, corrupt,
                                                  raw, kind):
    rows = [[g, repr(data.draw(st.floats(-10, 10)))] for g in groups]
    if corrupt and rows:
        row = data.draw(st.sampled_from(rows))
        row[data.draw(st.integers(0, 1))] = data.draw(bad_cells)
    path = tmp_path / f"fuzz.{'csv' if kind in ('csv', 'bytes') else kind}"
    if kind == "csv":
        path.write_text("\n".join(["group,reward"] + [f"{g},{r}" for g, r in rows]),
                        encoding="utf-8")
    elif kind == "jsonl":
        path.write_text("\n".join(f'{{"group": {g}, "reward": {r}}}' for g, r in rows),
                        encoding="utf-8")
    else:
        path.write_bytes(raw)
    code = main(["diagnose", str(path)])
    captured = capsys.readouterr()
    event(f"exit {code}")
    assert code in (0, 2)
    if code == 2:
        assert captured.out == "" and captured.err.count("\n") == 1
    else:
        assert "method" in captured.out and captured.err == ""


# --------------------------------------------------------------------------- plot


@pytest.mark.parametrize("suffix, magic", [("png", b"\x89PNG\r\n\x1a\n"), ("pdf", b"%PDF"),
                                           ("svg", b"<?xml")])
def test_plot_writes_the_format_its_extension_names(capsys, tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "new" / "folder" / f"scales.{suffix}"  # folders are created
    out = run_ok(capsys, ["diagnose", str(good_csv(tmp_path)), "--plot", str(plot),
                          "--methods", "grpo,dr_grpo,rloo,maxnorm"])
    assert f"inverse-scale plot written to {plot}" in out
    assert plot.read_bytes().startswith(magic)
    err = run_bad(capsys, ["diagnose", str(good_csv(tmp_path)), "--plot",
                           str(tmp_path / "x.txt")])
    assert "name a .png, .pdf or .svg file" in err


def test_plot_draws_every_method_visibly(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from advcal.cli import _plot

    diag = scale_diagnostics(np.array(REWARDS), group_ids=GROUPS,
                             methods=("grpo", "dr_grpo", "rloo", "maxnorm"))
    saved = {}
    original = plt.close

    def keep(fig):  # look at the figure before it is closed
        saved["fig"] = fig
        original(fig)

    plt.close = keep
    try:
        _plot(diag, str(tmp_path / "p.png"))
    finally:
        plt.close = original
    patches = saved["fig"].axes[0].patches
    # Dr.GRPO and RLOO have the same scales: their outlines differ in style and width
    assert len(patches) == 4
    styles = {(p.get_linestyle(), p.get_linewidth()) for p in patches}
    assert len(styles) == 4


def test_plot_without_matplotlib_is_a_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    err = run_bad(capsys, ["diagnose", str(good_csv(tmp_path)), "--plot",
                           str(tmp_path / "x.png")])
    assert "--plot needs matplotlib, which is not installed" in err
    assert not (tmp_path / "x.png").exists()


def test_read_progress_shows_only_after_the_delay(monkeypatch):
    from advcal.cli import _output as cli

    stream = io.StringIO()
    monkeypatch.setattr(cli.sys, "stderr", stream)
    now = [0.0]
    monkeypatch.setattr(cli.time, "perf_counter", lambda: now[0])
    report, bar = cli._read_progress("reading x", enabled=True)
    now[0] = 0.5
    report(10, 100)  # at 0.5 s: nothing
    assert stream.getvalue() == ""
    now[0] = 3.0
    report(50, 100)  # at 3 s: the bar
    assert "reading x [" in stream.getvalue() and "50%" in stream.getvalue()
    silent, _ = cli._read_progress("reading y", enabled=False)
    silent(50, 100)
    assert "reading y" not in stream.getvalue()


# --------------------------------------------------------------------------- installed script


def test_installed_console_script(tmp_path):
    script = Path(sys.executable).with_name("advcal")
    if not script.exists():
        pytest.skip("the advcal console script is not installed next to this interpreter")
    ok = subprocess.run([str(script), "diagnose", str(good_csv(tmp_path))],
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert expected_table() in ok.stdout
    bad = subprocess.run([str(script), "diagnose", str(tmp_path / "missing.jsonl")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.strip().endswith("no such file")
    assert bad.stderr.count("\n") == 1


# --------------------------------------------------------------------------- docs


def _options(parser, command: str):
    """(command, option string) of every option of ``parser`` and of its subcommands."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _options(child, f"{command} {name}")
        else:
            for option in action.option_strings:
                yield command, option


def test_every_option_is_documented():
    # Every flag of every command is on its page, as the start of a code span (`--alpha`,
    # `--bounds LOW HIGH`): `advcal calibrate` on the calibration page, the rest on cli.md.
    from advcal.cli import build_parser

    docs = Path(__file__).resolve().parents[1] / "docs"
    pages = {"cli.md": (docs / "cli.md").read_text(encoding="utf-8"),
             "calibration.md": (docs / "calibration.md").read_text(encoding="utf-8")}
    options = list(_options(build_parser(), "advcal"))
    assert {"--alpha", "--bounds", "--gram-col", "--methods", "-o", "--out"} <= {
        option for _, option in options}
    missing = []
    for command, option in options:
        page = "calibration.md" if command.startswith("advcal calibrate") else "cli.md"
        if not re.search(r"`" + re.escape(option) + r"[` ]", pages[page]):
            missing.append(f"{command} {option} (docs/{page})")
    assert not missing, "options on no page: " + ", ".join(missing)
