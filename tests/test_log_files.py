"""Logs in several files (advcal.io.logs.read_logs, and the CLI's FILE...): TRL's Parquet
file per step and verl's JSON Lines file per step read as one log, groups per file, bad
rows per file; and TRL's preset, which cannot tell reward functions from log_extra
columns by itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from advcal.cli import main
from advcal.io.logs import LogError, read_log, read_logs

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

PROMPTS = ["What is 2 + 2?", "Name a prime.", "Spell 'cat'.", "Sort [3, 1]."]


def trl_step(folder: Path, step: int, seed: int, *, bad: int | None = None) -> dict[str, Any]:
    """One step's completions table as TRL writes it (completions_{step:05d}.parquet):
    4 prompts x 4 completions, two reward functions, a log_extra column, advantages."""
    rng = np.random.default_rng(seed)
    n = len(PROMPTS) * 4
    table = {
        "step": [step] * n,
        "prompt": [p for p in PROMPTS for _ in range(4)],
        "completion": [f"answer {i}" for i in range(n)],
        "accuracy": rng.integers(0, 2, n).astype(float),
        "format": rng.random(n),
        "judge_tokens": rng.integers(10, 500, n).astype(float),  # log_extra
        "advantage": rng.normal(size=n),
    }
    if bad is not None:
        table["accuracy"][bad] = np.nan
        table["format"][bad] = np.nan
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(table), folder / f"completions_{step:05d}.parquet")
    return table


def trl_reward(table: dict[str, Any], weights: tuple[float, float]) -> np.ndarray:
    terms = np.stack([table["accuracy"] * weights[0], table["format"] * weights[1]])
    return np.nansum(terms, axis=0)


OPTIONS: dict[str, Any] = {"preset": "trl", "reward_cols": ["accuracy", "format"],
                           "reward_weights": [1.0, 0.5]}


def test_a_folder_of_trl_steps_is_one_log_with_groups_per_file(tmp_path: Path) -> None:
    folder = tmp_path / "completions"
    tables = [trl_step(folder, step, seed=step, bad=5 if step == 2 else None)
              for step in (1, 2, 10)]
    log = read_logs(folder, **OPTIONS)
    # The same four prompts at every step: 12 groups, not 4; step 10 read last.
    assert log.n_groups == 12
    assert [Path(f.path).name for f in log.files] == [
        "completions_00001.parquet", "completions_00002.parquet", "completions_00010.parquet"]
    expected = []
    for table in tables:
        reward = trl_reward(table, (1.0, 0.5))
        keep = ~(np.isnan(table["accuracy"]) & np.isnan(table["format"]))
        for p in PROMPTS:
            expected.append(reward[keep & (np.array(table["prompt"]) == p)])
    np.testing.assert_array_equal(log.rewards, np.concatenate(expected))
    np.testing.assert_array_equal(np.diff(log.offsets), [g.size for g in expected])
    assert [f.bad_rows.count for f in log.files] == [0, 1, 0]
    assert [(f.responses, f.groups) for f in log.files] == [(16, 4), (15, 4), (16, 4)]
    assert log.bad_rows.count == 1
    (number, why), = log.bad_rows.examples
    assert number == 6 and why.startswith(str(folder / "completions_00002.parquet"))
    assert log.path == str(folder) and log.format == "parquet"
    # A pattern and a list of files give the same log.
    for paths in (str(folder / "*.parquet"),
                  [folder / "completions_00001.parquet", folder / "completions_00002.parquet",
                   folder / "completions_00010.parquet"]):
        again = read_logs(paths, **OPTIONS)
        np.testing.assert_array_equal(again.rewards, log.rewards)
        np.testing.assert_array_equal(again.offsets, log.offsets)


def test_one_file_is_read_log(tmp_path: Path) -> None:
    trl_step(tmp_path, 1, seed=1)
    path = tmp_path / "completions_00001.parquet"
    one, single = read_logs(path, **OPTIONS), read_log(path, **OPTIONS)
    np.testing.assert_array_equal(one.rewards, single.rewards)
    assert one.files == () and one.path == single.path


def test_two_runs_with_the_same_steps_keep_their_groups_apart(tmp_path: Path) -> None:
    trl_step(tmp_path / "run_a", 1, seed=1)
    trl_step(tmp_path / "run_b", 1, seed=2)  # same step, same prompts
    log = read_logs([tmp_path / "run_a", tmp_path / "run_b"], **OPTIONS)
    assert log.n_groups == 8 and log.path == "2 files"


def test_folders_and_patterns_that_name_no_log(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(LogError, match="a folder without log files"):
        read_logs(tmp_path / "empty", **OPTIONS)
    with pytest.raises(LogError, match="no file matches the pattern"):
        read_logs(str(tmp_path / "*.parquet"), **OPTIONS)
    trl_step(tmp_path / "logs", 1, seed=1)
    (tmp_path / "logs" / ".hidden").write_text("not a log")
    assert read_logs(tmp_path / "logs", **OPTIONS).n_groups == 4  # dot files are skipped
    one = tmp_path / "logs" / "completions_00001.parquet"
    with pytest.raises(LogError, match="named twice"):
        read_logs([one, tmp_path / "logs"], **OPTIONS)
    with pytest.raises(LogError, match="no log file given"):
        read_logs([], **OPTIONS)
    with pytest.raises(TypeError, match="`paths`"):
        read_logs(3, **OPTIONS)  # type: ignore[arg-type]


def test_files_must_agree_on_their_columns(tmp_path: Path) -> None:
    (tmp_path / "1.jsonl").write_text(json.dumps({"uid": "a", "score": 1.0}) + "\n")
    (tmp_path / "2.jsonl").write_text(json.dumps({"uid": "a", "reward": 1.0}) + "\n")
    with pytest.raises(LogError, match="2.jsonl"):
        read_logs(tmp_path, preset="verl")


def test_the_files_together_are_bounded(tmp_path: Path) -> None:
    for k in range(3):
        lines = "".join(json.dumps({"uid": f"{k}-{i // 4}", "score": float(i % 2)}) + "\n"
                        for i in range(1000))
        (tmp_path / f"{k}.jsonl").write_text(lines)
    assert read_logs(tmp_path, preset="verl", max_bytes=1 << 20).rewards.size == 3000
    with pytest.raises(LogError, match="max_bytes"):
        read_logs(tmp_path, preset="verl", max_bytes=20000)  # each file fits, not all


def test_trl_preset_asks_which_columns_are_reward_functions(tmp_path: Path) -> None:
    table = trl_step(tmp_path, 1, seed=3)
    path = tmp_path / "completions_00001.parquet"
    with pytest.raises(LogError, match="log_extra") as info:
        read_log(path, preset="trl")
    assert "accuracy, format, judge_tokens" in str(info.value)
    with pytest.raises(LogError, match="2 reward weights for the 3 reward columns"):
        read_log(path, preset="trl", reward_weights=[1.0, 0.5])
    # One weight per numeric column, 0 where TRL does not sum: TRL's reward.
    log = read_log(path, preset="trl", reward_weights=[1.0, 0.5, 0.0])
    named = read_log(path, **OPTIONS)
    np.testing.assert_array_equal(log.rewards, named.rewards)
    np.testing.assert_allclose(np.sort(named.rewards), np.sort(trl_reward(table, (1.0, 0.5))),
                               rtol=0, atol=1e-15)
    # A single numeric column needs no naming.
    one = {k: table[k] for k in ("step", "prompt", "completion", "accuracy", "advantage")}
    pq.write_table(pa.table(one), tmp_path / "one.parquet")
    assert read_log(tmp_path / "one.parquet", preset="trl").reward_cols == ("accuracy",)


def test_cli_reads_a_folder_and_counts_bad_rows_per_file(tmp_path: Path,
                                                          capsys: Any) -> None:
    folder = tmp_path / "completions"
    for step in (1, 2, 3):
        trl_step(folder, step, seed=step, bad=0 if step == 3 else None)
    options = ["--preset", "trl", "--reward-col", "accuracy", "--reward-col", "format",
               "--reward-weights", "1,0.5", "--no-progress"]
    assert main(["diagnose", str(folder), *options]) == 0
    out = capsys.readouterr().out
    assert "3 files: 47 responses in 12 groups" in out
    assert "skipped 1 bad row" in out
    assert f"  {folder / 'completions_00003.parquet'}: 1 bad row" in out
    assert main(["diagnose", str(folder / "completions_00001.parquet"),
                 str(folder / "completions_00002.parquet"), *options, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [f["responses"] for f in report["files"]] == [16, 16]
    assert report["groups"] == 8
    # one file: the same entry, for scripts that read every log alike; a folder of one file
    # says so in the singular
    one = folder / "completions_00001.parquet"
    assert main(["diagnose", str(one), *options, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == [
        {"file": str(one), "responses": 16, "groups": 4, "bad_rows": 0}]
    lone = tmp_path / "lone"
    lone.mkdir()
    one.rename(lone / one.name)
    assert main(["diagnose", str(lone), *options]) == 0
    assert "1 file: 16 responses in 4 groups" in capsys.readouterr().out
    # Without naming the reward functions: one line, exit 2.
    assert main(["diagnose", str(folder), "--preset", "trl", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "log_extra" in err


def test_cli_calibrates_sets_on_verl_step_files(tmp_path: Path, capsys: Any) -> None:
    from advcal import calibrate_sets, load_calibration
    from advcal.simulate import paired_scorings

    pair = paired_scorings(40, 4, scale=0.03, seed=5)
    for step in range(2):
        with (tmp_path / f"{step}.jsonl").open("w") as f:
            for q in range(20 * step, 20 * step + 20):
                for i in range(4):
                    # verl's dump: the prompt text repeats across steps
                    f.write(json.dumps({"input": f"prompt {q % 20}", "step": step,
                                        "score": float(pair.a[q, i]),
                                        "rescored": float(pair.b[q, i])}) + "\n")
    out = tmp_path / "sets.npz"
    assert main(["calibrate", "sets", str(tmp_path / "*.jsonl"), "--preset", "verl",
                 "--second-col", "rescored", "-o", str(out)]) == 0
    expected = calibrate_sets(pair.a, pair.b, alpha=0.1)
    assert load_calibration(out).rho == expected.rho


def test_progress_counts_the_bytes_of_all_files(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        trl_step(tmp_path, step, seed=step)
    seen: list[tuple[int, int]] = []
    read_logs(tmp_path, **OPTIONS, progress=lambda done, total: seen.append((done, total)))
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert {t for _, t in seen} == {total}
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == total
