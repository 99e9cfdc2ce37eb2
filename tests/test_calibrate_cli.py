"""``advcal calibrate``: logs written the way trainers write them, files equal to the array
API's, cross-fitted coverage checked against the conformal band in seeded simulations."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from advcal import (
    RangeCalibration,
    SetCalibration,
    ThresholdSelection,
    calibrate_ranges,
    calibrate_sets,
    coefficient_sets,
    grpo,
    load_calibration,
    save_calibration,
    select_threshold,
)
from advcal.cli import main
from advcal.simulate import gram_matrices, paired_scorings
from tests.test_artefacts import assert_identical

pytest.importorskip("pyarrow")  # the log readers of advcal diagnose / calibrate

ALPHA = 0.1


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["calibrate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def write_verl_jsonl(path: Path, a: np.ndarray, b: np.ndarray) -> None:
    """verl's rollout dump: input/output/score/step, plus a reward info (the re-scoring)."""
    with path.open("w") as f:
        for q in range(a.shape[0]):
            for i in range(a.shape[1]):
                f.write(json.dumps({"input": f"prompt {q}", "output": f"answer {q}.{i}",
                                    "gts": "42", "score": float(a[q, i]),
                                    "step": 3, "score_rescored": float(b[q, i])}) + "\n")


def write_trl_csv(path: Path, a: np.ndarray, b: np.ndarray) -> None:
    """TRL's completion log: step, prompt, completion, a column per reward function."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "prompt", "completion", "accuracy", "accuracy_judge_2",
                    "advantage"])
        for q in range(a.shape[0]):
            for i in range(a.shape[1]):
                w.writerow([7, f"What is {q}?", f"answer {i}", repr(float(a[q, i])),
                            repr(float(b[q, i])), 0.0])


def band_overlaps(interval: list[float], m: int, folds: int) -> bool:
    """The cross-fitted interval meets the conformal band [1 − α, 1 − α + 1/(m' + 1)] of a
    calibration on m' = m (K − 1) / K units."""
    m_train = m * (folds - 1) // folds
    lo, hi = 1 - ALPHA, 1 - ALPHA + 1 / (m_train + 1)
    return interval[0] <= hi and interval[1] >= lo


# --------------------------------------------------------------------------- sets


def test_sets_verl_log_matches_array_api(tmp_path: Path, capsys: Any) -> None:
    pair = paired_scorings(120, 6, scale=0.03, seed=0)
    log = tmp_path / "rollouts.jsonl"
    write_verl_jsonl(log, pair.a, pair.b)
    out = tmp_path / "sets.npz"
    code, text, err = run(capsys, "sets", str(log), "--preset", "verl", "--second-col",
                          "score_rescored", "--alpha", str(ALPHA), "-o", str(out))
    assert code == 0, err
    expected = calibrate_sets(pair.a.reshape(-1), pair.b.reshape(-1),
                              np.arange(0, 721, 6), alpha=ALPHA)
    assert_identical(expected, load_calibration(out, kind=SetCalibration))
    assert "m = 120 calibration groups" in text
    assert f"radius rho = {expected.rho:.6g}" in text
    assert f"sigma_g^2 = {expected.noise_var:.6g}" in text
    assert "cross-fitted coverage (5 folds)" in text and "written to" in text


def test_sets_trl_csv_and_options(tmp_path: Path, capsys: Any) -> None:
    pair = paired_scorings(60, 4, scale=0.05, seed=1)
    log = tmp_path / "completions.csv"
    write_trl_csv(log, pair.a, pair.b)
    out = tmp_path / "sets.npz"
    report = run_json(capsys, "sets", str(log), "--preset", "trl", "--reward-col", "accuracy",
                      "--second-col", "accuracy_judge_2", "--estimator", "maxnorm",
                      "--tau-res", "0.02", "--shape", "isotropic", "--alpha", "0.2",
                      "-o", str(out))
    expected = calibrate_sets(pair.a.reshape(-1), pair.b.reshape(-1), np.arange(0, 241, 4),
                              alpha=0.2, estimator="maxnorm", shape="isotropic",
                              options={"tau_res": 0.02})
    assert_identical(expected, load_calibration(out))
    assert report["m"] == 60 and report["rho"] == expected.rho
    assert report["estimator"] == "maxnorm"


@pytest.mark.parametrize(("seed", "noise"), [(2, "gaussian"), (3, "heteroscedastic")])
def test_sets_cross_fitted_coverage(tmp_path: Path, capsys: Any, seed: int,
                                    noise: str) -> None:
    pair = paired_scorings(1500, 8, scale=0.05, noise=noise, seed=seed)
    log = tmp_path / "paired.npz"
    np.savez(log, rewards=pair.a, second=pair.b)
    report = run_json(capsys, "sets", str(log), "--alpha", str(ALPHA), "--seed", str(seed),
                      "-o", str(tmp_path / "s.npz"))
    cov = report["coverage"]
    assert cov["n"] == 1500 and cov["folds"] == 5
    assert cov["interval"][0] <= cov["estimate"] <= cov["interval"][1]
    assert band_overlaps(cov["interval"], 1500, 5)


# --------------------------------------------------------------------------- ranges


def judge_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    rng = np.random.default_rng(seed)
    reference = rng.beta(2.0, 2.0, n)
    cats: list[Any] = [[1, "1", "hard"][i % 3] for i in range(n)]
    noise = np.where(np.array([c == "hard" for c in cats]), 0.1, 0.03)
    return reference + rng.normal(0, 1, n) * noise, reference, cats


def test_ranges_jsonl_categories_keep_types(tmp_path: Path, capsys: Any) -> None:
    judge, ref, cats = judge_rows(300, seed=4)
    log = tmp_path / "judge.jsonl"
    with log.open("w") as f:
        for j, r, c in zip(judge, ref, cats, strict=True):
            f.write(json.dumps({"prompt": "p", "judge": j, "reference": r,
                                "difficulty": c}) + "\n")
    out = tmp_path / "ranges.npz"
    code, text, err = run(capsys, "ranges", str(log), "--category-col", "difficulty",
                          "--alpha", str(ALPHA), "-o", str(out))
    assert code == 0, err
    expected = calibrate_ranges(judge, ref, alpha=ALPHA, categories=cats)
    loaded = load_calibration(out, kind=RangeCalibration)
    assert_identical(expected, loaded)
    assert list(loaded.radius) == [1, "1", "hard"]  # 1 and "1": two categories
    assert "'hard'" in text and "cross-fitted coverage" in text
    report = run_json(capsys, "ranges", str(log), "--category-col", "difficulty",
                      "-o", str(out))
    assert [r["category"] for r in report["radius"]] == [1, "1", "hard"]


def test_ranges_csv_methods(tmp_path: Path, capsys: Any) -> None:
    judge, ref, _ = judge_rows(200, seed=5)
    sigma = np.full(200, 0.05)
    log = tmp_path / "judge.csv"
    with log.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["judge", "reference", "sigma", "lo", "hi"])
        for row in zip(judge, ref, sigma, judge - 0.05, judge + 0.05, strict=True):
            w.writerow([repr(float(v)) for v in row])
    out = tmp_path / "r.npz"
    run_json(capsys, "ranges", str(log), "--method", "normalized", "-o", str(out))
    assert_identical(calibrate_ranges(judge, ref, alpha=ALPHA, method="normalized",
                                      sigma=sigma), load_calibration(out))
    run_json(capsys, "ranges", str(log), "--method", "cqr", "--lower-col", "lo",
             "--upper-col", "hi", "--bounds", "-1", "2", "-o", str(out))
    assert_identical(calibrate_ranges(None, ref, alpha=ALPHA, method="cqr", lower=judge - 0.05,
                                      upper=judge + 0.05, bounds=(-1.0, 2.0)),
                     load_calibration(out))


@pytest.mark.parametrize("mondrian", [False, True])
def test_ranges_cross_fitted_coverage(tmp_path: Path, capsys: Any, mondrian: bool) -> None:
    judge, ref, cats = judge_rows(3000, seed=6)
    log = tmp_path / "judge.npz"
    np.savez(log, judge=judge, reference=ref, cat=np.array([str(c) for c in cats]))
    extra = ["--category-col", "cat"] if mondrian else []
    report = run_json(capsys, "ranges", str(log), "-o", str(tmp_path / "r.npz"), *extra)
    cal = load_calibration(tmp_path / "r.npz")
    assert report["radius"] == [{"category": k, "radius": v} for k, v in cal.radius.items()]
    cov = report["coverage"]
    assert cov["n"] == 3000
    assert cov["interval"][0] <= cov["estimate"] <= cov["interval"][1]
    # Mondrian: each category holds 1000, calibrated on 800 per fold.
    assert band_overlaps(cov["interval"], 1000 if mondrian else 3000, 5)


@pytest.mark.parametrize("kind", ["parquet", "jsonl.gz"])
def test_ranges_parquet_and_gzip_jsonl(tmp_path: Path, capsys: Any, kind: str) -> None:
    judge, ref, _ = judge_rows(240, seed=14)
    level = [i % 4 for i in range(240)]  # integer categories stay integers
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        log = tmp_path / "judge.parquet"
        pq.write_table(pa.table({"judge": judge, "reference": ref, "level": level}), log)
    else:
        log = tmp_path / "judge.jsonl.gz"
        with gzip.open(log, "wt") as f:
            for j, r, c in zip(judge, ref, level, strict=True):
                f.write(json.dumps({"judge": j, "reference": r, "level": c}) + "\n")
    out = tmp_path / "r.npz"
    report = run_json(capsys, "ranges", str(log), "--category-col", "level", "-o", str(out))
    assert_identical(calibrate_ranges(judge, ref, alpha=ALPHA, categories=level),
                     load_calibration(out))
    assert [r["category"] for r in report["radius"]] == [0, 1, 2, 3]
    assert report["bad_rows"] == 0


def test_ranges_bad_rows_skipped_reported_or_strict(tmp_path: Path, capsys: Any) -> None:
    judge, ref, _ = judge_rows(120, seed=15)
    cats = [["easy", "hard"][i % 2] for i in range(120)]
    lines = ["judge,reference,difficulty"] + [f"{j!r},{r!r},{c}" for j, r, c in
                                              zip(judge.tolist(), ref.tolist(), cats,
                                                  strict=True)]
    lines[5] = f"nan,{float(ref[4])!r},easy"                 # file line 6: judge NaN
    lines[9] = f"{float(judge[8])!r},{float(ref[8])!r},"    # file line 10: no category
    lines[20] = "0.5,oops,hard"            # file line 21: unparsable reference
    log = tmp_path / "judge.csv"
    log.write_text("\n".join(lines) + "\n")
    keep = np.ones(120, bool)
    keep[[4, 8, 19]] = False
    out = tmp_path / "r.npz"
    code, text, err = run(capsys, "ranges", str(log), "--category-col", "difficulty",
                          "-o", str(out))
    assert code == 0, err
    assert ("skipped 3 bad lines (line 6: empty or NaN value in column 'judge'; line 10: "
            "empty label in column 'difficulty'; line 21: 'reference' value 'oops' is not a "
            "number)") in text
    assert "m = 117 labeled responses" in text
    assert_identical(calibrate_ranges(judge[keep], ref[keep], alpha=ALPHA,
                                      categories=[c for c, k in zip(cats, keep, strict=True)
                                                  if k]), load_calibration(out))
    out.unlink()
    for strict in (["--strict"], ["--on-bad-row", "error"]):
        code, _, err = run(capsys, "ranges", str(log), "--category-col", "difficulty",
                           "-o", str(out), *strict)
        assert code == 2 and not out.exists()
        assert err == (f"advcal calibrate ranges: error: {log}: line 6: empty or NaN value "
                       "in column 'judge'\n")


# --------------------------------------------------------------------------- threshold


def test_threshold_with_a_sets_file_matches_array_api(tmp_path: Path, capsys: Any) -> None:
    cal = calibrate_sets(*paired_scorings(800, 6, scale=0.05, seed=7).scores, alpha=0.2)
    save_calibration(tmp_path / "sets.npz", cal)
    data = paired_scorings(300, 6, scale=0.05, seed=8)
    gram = gram_matrices(300, 6, seed=9).gram
    np.savez(tmp_path / "srgo.npz", rewards=data.a, second=data.b, gram=gram)
    out = tmp_path / "thr.npz"
    code, text, err = run(capsys, "threshold", str(tmp_path / "srgo.npz"), "--sets",
                          str(tmp_path / "sets.npz"), "--beta", "0.2",
                          "--thresholds", "0.6,0.4,0.2,0", "-o", str(out))
    assert code == 0, err
    sets = coefficient_sets(data.a.reshape(-1), np.arange(0, 1801, 6), calibration=cal)
    expected = select_threshold(sets, gram.reshape(-1), grpo(data.b.reshape(-1),
                                                             np.arange(0, 1801, 6)),
                                thresholds=[0.6, 0.4, 0.2, 0.0], beta=0.2, delta=0.1)
    assert_identical(expected, load_calibration(out, kind=ThresholdSelection))
    assert "n_acc" in text and "k_rev" in text and "tau_sel =" in text


def test_threshold_split_flat_layout(tmp_path: Path, capsys: Any) -> None:
    data = paired_scorings(400, 5, scale=0.05, seed=10)
    gram = gram_matrices(400, 5, seed=11).gram
    np.savez(tmp_path / "flat.npz", rewards=data.a.reshape(-1), second=data.b.reshape(-1),
             offsets=np.arange(0, 2001, 5), gram=gram.reshape(-1))
    report = run_json(capsys, "threshold", str(tmp_path / "flat.npz"), "-o",
                      str(tmp_path / "t.npz"), "--sets-out", str(tmp_path / "s.npz"),
                      "--beta", "0.3", "--seed", "1")
    assert report["selection_groups"] == 200 and report["sets"]["m"] == 200
    sel = load_calibration(tmp_path / "t.npz")
    assert sel.tau_sel == report["tau_sel"]
    assert [row["n_acc"] for row in report["table"]] == sel.n_acc.tolist()
    assert isinstance(load_calibration(tmp_path / "s.npz"), SetCalibration)
    held = report["sets"]["held_out_coverage"]
    assert held["interval"][0] <= held["estimate"] <= held["interval"][1]


def test_plots(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("matplotlib")
    pair = paired_scorings(50, 4, scale=0.05, seed=12)
    np.savez(tmp_path / "p.npz", rewards=pair.a, second=pair.b,
             gram=gram_matrices(50, 4, seed=13).gram)
    assert run(capsys, "sets", str(tmp_path / "p.npz"), "-o", str(tmp_path / "s.npz"),
               "--plot", str(tmp_path / "fig" / "sets.svg"))[0] == 0
    assert (tmp_path / "fig" / "sets.svg").read_text().startswith("<?xml")
    assert run(capsys, "threshold", str(tmp_path / "p.npz"), "-o", str(tmp_path / "t.npz"),
               "--beta", "0.4", "--plot", str(tmp_path / "t.png"))[0] == 0
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("argv", "message"), [
    (["sets", "{missing}", "-o", "{out}"], "no such file"),
    (["sets", "{paired}", "--second-col", "nope", "-o", "{out}"], "nope"),
    (["sets", "{paired}", "-o", "{tmp}/no/such/dir/x.npz"], "cannot write"),
    (["sets", "{paired}", "--plot", "{tmp}/x.txt", "-o", "{out}"], ".png, .pdf or .svg"),
    (["sets", "{paired}", "--alpha", "1.5", "-o", "{out}"], "alpha"),
    (["ranges", "{paired}", "-o", "{out}"], "no array 'reference'"),
    (["ranges", "{judge}", "--category-col", "level", "-o", "{out}"],
     "no column 'level' (found: judge, reference)"),
    (["ranges", "{judge}", "--method", "normalized", "-o", "{out}"], "no column 'sigma'"),
    (["ranges", "{judge}", "--format", "parquet", "-o", "{out}"],
     "the content is a CSV file, not Parquet"),
    (["ranges", "{srgo}", "--judge-col", "gram", "--reference-col", "rewards", "-o",
      "{out}"], "array 'rewards' must hold numbers in 1 dimension"),
    (["ranges", "{paired}", "--plot", "{tmp}/x.txt", "-o", "{out}"], ".png, .pdf or .svg"),
    (["threshold", "{judge}", "-o", "{out}"], "cannot read as .npz"),
    (["threshold", "{paired}", "-o", "{out}"], "no array 'gram'"),
    (["threshold", "{badgram}", "-o", "{out}"], "'gram' must have shape"),
    (["threshold", "{srgo}", "--thresholds", "0.5,x", "-o", "{out}"], "--thresholds"),
    (["threshold", "{srgo}", "--thresholds", "1.5", "-o", "{out}"], "thresholds"),
    (["threshold", "{srgo}", "--sets", "{paired}", "-o", "{out}"], "not an advcal calibration"),
    (["threshold", "{srgo}", "--calibration-fraction", "1", "-o", "{out}"],
     "calibration-fraction"),
])
def test_bad_input_is_one_line(tmp_path: Path, capsys: Any, argv: list[str],
                               message: str) -> None:
    pair = paired_scorings(20, 4, scale=0.05, seed=0)
    np.savez(tmp_path / "paired.npz", rewards=pair.a, second=pair.b)
    np.savez(tmp_path / "srgo.npz", rewards=pair.a, second=pair.b,
             gram=gram_matrices(20, 4, seed=1).gram)
    np.savez(tmp_path / "badgram.npz", rewards=pair.a, second=pair.b, gram=np.ones((20, 4)))
    (tmp_path / "judge.csv").write_text("judge,reference\n0.5,0.4\n0.2,0.3\n")
    names = {"judge": tmp_path / "judge.csv",
             "missing": tmp_path / "none.csv", "out": tmp_path / "o.npz", "tmp": tmp_path,
             "paired": tmp_path / "paired.npz", "srgo": tmp_path / "srgo.npz",
             "badgram": tmp_path / "badgram.npz"}
    code, out, err = run(capsys, *[a.format(**names) for a in argv])
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize(("alpha", "units", "needed"), [(0.1, 8, 9), (0.05, 18, 19)])
def test_a_vacuous_set_calibration_is_refused_unless_asked(
        tmp_path: Path, capsys: Any, alpha: float, units: int, needed: int) -> None:
    # One group fewer than split conformal needs at alpha: the radius is infinite.
    pair = paired_scorings(units, 4, scale=0.05, seed=9)
    log = tmp_path / "rollouts.jsonl"
    write_verl_jsonl(log, pair.a, pair.b)
    out = tmp_path / "sets.npz"
    argv = ["sets", str(log), "--preset", "verl", "--second-col", "score_rescored",
            "--alpha", str(alpha), "-o", str(out)]
    code, text, err = run(capsys, *argv)
    assert code == 2 and not out.exists() and text == ""
    assert len(err.strip().splitlines()) == 1
    assert f"vacuous at alpha = {alpha:g}" in err
    assert f"{units} calibration units, split conformal needs at least {needed}" in err
    assert "--allow-vacuous" in err
    code, text, err = run(capsys, *argv, "--allow-vacuous")
    assert code == 0, err
    assert load_calibration(out, kind=SetCalibration).rho == np.inf
    assert "inf (too few groups for alpha)" in text
    # One more group: a finite radius, written without the flag.
    pair = paired_scorings(needed, 4, scale=0.05, seed=9)
    write_verl_jsonl(log, pair.a, pair.b)
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    assert np.isfinite(load_calibration(out, kind=SetCalibration).rho)


def test_a_vacuous_range_category_is_refused_unless_asked(tmp_path: Path,
                                                           capsys: Any) -> None:
    judge, ref, _ = judge_rows(60, seed=6)
    cats = ["easy"] * 55 + ["rare"] * 5  # 5 < 9 responses for alpha = 0.1
    log = tmp_path / "judge.jsonl"
    with log.open("w") as f:
        for j, r, c in zip(judge, ref, cats, strict=True):
            f.write(json.dumps({"judge": j, "reference": r, "difficulty": c}) + "\n")
    out = tmp_path / "ranges.npz"
    argv = ["ranges", str(log), "--category-col", "difficulty", "-o", str(out)]
    code, _, err = run(capsys, *argv)
    assert code == 2 and not out.exists()
    assert "category 'rare'" in err and "5 calibration units" in err and "least 9" in err
    code, _, err = run(capsys, *argv, "--allow-vacuous")
    assert code == 0, err
    assert load_calibration(out, kind=RangeCalibration).radius["rare"] == np.inf


def test_threshold_refuses_vacuous_sets_it_calibrates(tmp_path: Path, capsys: Any) -> None:
    pair = paired_scorings(12, 4, scale=0.05, seed=11)
    data = tmp_path / "srgo.npz"
    np.savez(data, rewards=pair.a, second=pair.b, gram=gram_matrices(12, 4, seed=12).gram)
    argv = ["threshold", str(data), "-o", str(tmp_path / "sel.npz")]
    code, _, err = run(capsys, *argv)  # 6 groups calibrate the sets at alpha = 0.1
    assert code == 2 and "6 calibration units" in err and "least 9" in err
    code, _, err = run(capsys, *argv, "--allow-vacuous")
    assert code == 0, err


def test_help(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--help"])
    assert exc.value.code == 0
    assert "sets" in capsys.readouterr().out
