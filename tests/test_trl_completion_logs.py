"""The log readers on the completion logs a real TRL GRPOTrainer writes (``log_completions``:
one Parquet file per step, written by pandas), read as one log from their folder: the
rewards and groups equal a plain pyarrow + numpy reading of the same files, and
``advcal.grpo`` on them equals the advantages TRL logged, to float32 rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import advcal

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")

from advcal.io.logs import read_logs  # noqa: E402
from tests.tiny_llm import llama_config, word_tokenizer  # noqa: E402

G = 4
TRL_EPS = 1e-4  # TRL's epsilon in (r - mean) / (std + eps)


def length_reward(completions, **kwargs):
    # None with sometimes_none's for completion 0 of a batch: a row TRL cannot score
    return [None if i % 5 == 0 else len(c) / 10 for i, c in enumerate(completions)]


def sometimes_none(completions, **kwargs):
    return [None if i % 3 == 0 else float(len(c) % 4) for i, c in enumerate(completions)]


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trl-run")
    tok = word_tokenizer()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config(tok))
    prompts = ["a b c", "d e f", "g h", "i j k l", "b c d", "e f g", "h i", "j k l a"]
    config = trl.GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=8, num_generations=G,
        max_completion_length=6, max_steps=3, report_to=[], use_cpu=True,
        save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True,
        log_completions=True, num_completions_to_print=0)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[length_reward, sometimes_none],
                              args=config, processing_class=tok,
                              train_dataset=datasets.Dataset.from_dict({"prompt": prompts}))
    trainer.train()
    return out / "completions"


def _plain_reading(files: list[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rewards (TRL's nansum of the two functions, rows with neither left out), group
    offsets (per file, prompts in order of first appearance, rows in file order) and the
    logged advantages, by pyarrow and numpy alone."""
    import pyarrow.parquet as pq

    rewards, advantages, sizes = [], [], []
    for path in files:
        table = pq.read_table(path).to_pydict()
        funcs = np.array([table["length_reward"], table["sometimes_none"]], dtype=float).T
        scored = ~np.isnan(funcs).all(axis=1)
        total = np.where(np.isnan(funcs), 0.0, funcs).sum(axis=1)
        prompts = np.asarray(table["prompt"], dtype=object)
        for prompt in dict.fromkeys(prompts[scored]):
            rows = np.flatnonzero((prompts == prompt) & scored)
            rewards.append(total[rows])
            advantages.append(np.asarray(table["advantage"], dtype=float)[rows])
            sizes.append(rows.size)
    return (np.concatenate(rewards), advcal.offsets_from_sizes(sizes),
            np.concatenate(advantages))


def test_a_folder_of_trls_own_logs_reads_as_pyarrow_and_numpy_read_it(logged: Path) -> None:
    import pyarrow.parquet as pq

    files = sorted(logged.glob("completions_*.parquet"))
    assert len(files) == 3  # one per step
    log = read_logs(logged, preset="trl", reward_cols=["length_reward", "sometimes_none"],
                    extra_cols=["advantage"])
    rewards, offsets, advantages = _plain_reading(files)
    np.testing.assert_array_equal(log.offsets, offsets)
    np.testing.assert_array_equal(log.rewards, rewards)
    np.testing.assert_array_equal(log.extra["advantage"], advantages)
    # every completion whose functions all returned None is a bad row, none other is
    assert log.bad_rows.count == sum(
        int(np.isnan(np.array(
            [pq.read_table(f).column(c).to_numpy(zero_copy_only=False)
             for c in ("length_reward", "sometimes_none")], dtype=float)).all(axis=0).sum())
        for f in files)


def test_grpo_on_the_log_is_the_advantage_trl_logged(logged: Path) -> None:
    log = read_logs(logged, preset="trl", reward_cols=["length_reward", "sometimes_none"],
                    extra_cols=["advantage"])
    ours = advcal.grpo(log.rewards, log.offsets, eps=TRL_EPS)
    # TRL computes in float32 (u = 2^-24): the mean and the std of a group of G carry a
    # relative error of about G·u each, amplified by max|r| / std; a constant group is 0
    sizes = np.diff(log.offsets)
    tolerance = np.empty_like(ours)
    for q, (lo, hi) in enumerate(zip(log.offsets[:-1], log.offsets[1:], strict=True)):
        r = log.rewards[lo:hi]
        sd = r.std(ddof=1) if sizes[q] > 1 else 0.0
        kappa = np.abs(r).max() / sd if sd > 0 else 0.0
        tolerance[lo:hi] = (3 * G + 2) * 2.0**-24 * (1 + kappa)
    np.testing.assert_array_less(np.abs(ours - log.extra["advantage"]), tolerance)
