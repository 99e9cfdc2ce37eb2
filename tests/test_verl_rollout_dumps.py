"""The log readers on rollout dumps written by verl's own code (``RayPPOTrainer``'s
``_log_rollout_data``: one JSON Lines file per step in ``trainer.rollout_data_dir``), read as
one log from their folder: the groups are the prompts of each step, the rewards verl's
sequence scores, and ``advcal.grpo`` on them equals verl's own
``compute_grpo_outcome_advantage`` on the batch, to float32 rounding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import advcal

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402

from advcal.io.logs import read_logs  # noqa: E402
from tests.tiny_llm import WORDS, word_tokenizer  # noqa: E402

G, T = 4, 5
PROMPTS = 3


class _Trainer:
    """What ``_log_rollout_data`` uses of a RayPPOTrainer: its tokenizer, step and dump
    methods (verl's own, unbound)."""

    _log_rollout_data = ray_trainer.RayPPOTrainer._log_rollout_data
    _dump_generations = ray_trainer.RayPPOTrainer._dump_generations
    _write_generations = staticmethod(ray_trainer.RayPPOTrainer._write_generations)
    _init_dump_executor = ray_trainer.RayPPOTrainer._init_dump_executor
    _shutdown_dump_executor = ray_trainer.RayPPOTrainer._shutdown_dump_executor

    def __init__(self) -> None:
        self.tokenizer = word_tokenizer()
        self.global_steps = 0
        self._init_dump_executor()


def _batch(step: int) -> tuple[DataProto, np.ndarray, np.ndarray]:
    """A step's batch as verl holds it after scoring, responses of a prompt in a row: the
    sequence score at each response's last token; its scores and uids."""
    rng = np.random.default_rng(step)
    n = PROMPTS * G
    tok = word_tokenizer()
    words = [tok.convert_tokens_to_ids(w) for w in WORDS]
    prompt_of = np.repeat(np.arange(PROMPTS), G)
    prompts = torch.tensor([[words[(p + step) % len(words)], words[(2 * p + 1) % len(words)]]
                            for p in prompt_of])
    responses = torch.tensor(rng.choice(words, (n, T)))
    lengths = rng.integers(1, T + 1, n)
    scores = np.round(rng.uniform(0, 1, n), 3).astype(np.float32)
    scores[G] = scores[G + 1] = 0.5  # ties inside a group
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    token_scores = np.zeros((n, T), np.float32)
    token_scores[np.arange(n), lengths - 1] = scores
    uids = np.repeat(np.array([f"uid-{step}-{p}" for p in range(PROMPTS)], dtype=object), G)
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses,
                 "token_level_scores": torch.as_tensor(token_scores),
                 "token_level_rewards": torch.as_tensor(token_scores),
                 "response_mask": torch.as_tensor(mask)},
        non_tensors={"uid": uids,
                     "reward_model": np.array([{"ground_truth": str(p)} for p in prompt_of],
                                              dtype=object)})
    return data, scores, uids


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    folder = tmp_path_factory.mktemp("rollouts")
    trainer = _Trainer()
    batches = []
    for step in (1, 2):
        trainer.global_steps = step
        data, scores, uids = _batch(step)
        trainer._log_rollout_data(data, {"acc": (scores > 0.5).tolist()}, {}, str(folder))
        batches.append((data, scores, uids))
    trainer._shutdown_dump_executor()  # the dumps are written on verl's writer thread
    return folder, batches


def test_verls_own_dumps_read_as_groups_of_the_steps_prompts(dumped) -> None:
    folder, batches = dumped
    assert sorted(p.name for p in folder.iterdir()) == ["1.jsonl", "2.jsonl"]
    log = read_logs(folder, preset="verl")
    np.testing.assert_array_equal(log.offsets, np.arange(0, 2 * PROMPTS * G + 1, G))
    want = np.concatenate([scores for _, scores, _ in batches]).astype(np.float64)
    # verl writes the float32 sums as Python floats: the same values
    np.testing.assert_array_equal(log.rewards, want)
    assert log.bad_rows.count == 0


def test_grpo_on_the_dumps_is_verls_own_advantage(dumped) -> None:
    folder, batches = dumped
    log = read_logs(folder, preset="verl")
    ours = advcal.grpo(log.rewards, log.offsets, eps=1e-6)
    theirs = []
    for data, _, uids in batches:
        advantages, _ = compute_grpo_outcome_advantage(
            data.batch["token_level_rewards"], data.batch["response_mask"], uids)
        theirs.append(advantages[:, 0].numpy().astype(np.float64))
    # verl computes in float32 (u = 2^-24): a group's mean and std carry a relative error of
    # about G·u each, amplified by max|r| / std
    r = log.rewards.reshape(-1, G)
    kappa = np.abs(r).max(axis=1) / r.std(axis=1, ddof=1)
    tolerance = np.repeat((3 * G + 2) * 2.0**-24 * (1 + kappa), G)
    np.testing.assert_array_less(np.abs(ours - np.concatenate(theirs)), tolerance)
