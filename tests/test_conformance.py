"""Conformance with verl, TRL and OpenRLHF.

Each ``verl_*`` / ``trl_*`` / ``openrlhf_*`` function below restates a framework's
documented semantics in plain numpy, in the frameworks' own style (dicts of per-uid
lists, dense views, token masks), written independently of advcal's kernels.  torch's
``std`` is unbiased, hence ``ddof=1`` throughout.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from advcal import batch_std, dr_grpo, gpg, grpo, opo, passk, reinforce_pp_baseline, rloo


def _group_stats(scores, index):
    """verl's per-uid statistics: a lone response gets mean 0, std 1."""
    id2score = defaultdict(list)
    for s, idx in zip(scores, index, strict=True):
        id2score[idx].append(s)
    id2mean, id2std = {}, {}
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        else:
            id2mean[idx], id2std[idx] = np.mean(group), np.std(group, ddof=1)
    return id2score, id2mean, id2std


def verl_grpo(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    _, id2mean, id2std = _group_stats(scores, index)
    out = np.empty(len(scores))
    for i, idx in enumerate(index):
        centered = scores[i] - id2mean[idx]
        out[i] = centered / (id2std[idx] + epsilon) if norm_adv_by_std_in_grpo else centered
    return out


def verl_rloo(scores, index):
    id2score, id2mean, _ = _group_stats(scores, index)
    out = np.array(scores, dtype=float)
    for i, idx in enumerate(index):
        n = len(id2score[idx])
        if n > 1:
            out[i] = scores[i] * n / (n - 1) - id2mean[idx] * n / (n - 1)
    return out


def verl_opo(scores, index, response_length):
    id2score, id2len = defaultdict(list), defaultdict(list)
    for s, ell, idx in zip(scores, response_length, index, strict=True):
        id2score[idx].append(s)
        id2len[idx].append(ell)
    baseline = {}
    for idx in id2score:
        if len(id2score[idx]) == 1:
            baseline[idx] = 0.0
        else:
            s, ell = np.array(id2score[idx]), np.array(id2len[idx])
            baseline[idx] = (ell * s).sum() / ell.sum()
    return np.array([s - baseline[idx] for s, idx in zip(scores, index, strict=True)])


def verl_gpg(scores, index, f_norm=1.0):
    _, id2mean, _ = _group_stats(scores, index)
    alpha = len(scores) / max(np.count_nonzero(scores), 1)
    return np.array([alpha * (s - id2mean[idx]) / f_norm
                     for s, idx in zip(scores, index, strict=True)])


def verl_passk(scores, index, epsilon=1e-6):
    id2pos = defaultdict(list)
    for i, idx in enumerate(index):
        id2pos[idx].append(i)
    out = np.zeros(len(scores))
    for positions in id2pos.values():
        rewards = np.array([scores[i] for i in positions])
        order = np.argsort(-rewards, kind="stable")  # topk(2); first of tied maxima
        advantage = rewards[order[0]] - rewards[order[1]]
        out[positions[order[0]]] = advantage / (np.std(rewards, ddof=1) + epsilon)
    return out


def verl_reinforce_pp_baseline(scores, index, response_length, epsilon=1e-8):
    """Group-centered scores broadcast over tokens, then masked_whiten over all tokens."""
    _, id2mean, _ = _group_stats(scores, index)
    centered = np.array([s - id2mean[idx] for s, idx in zip(scores, index, strict=True)])
    width = int(max(response_length))
    mask = np.arange(width)[None, :] < np.asarray(response_length)[:, None]
    values = centered[:, None] * mask
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum()
    var = var * mask.sum() / (mask.sum() - 1)  # unbiased, as masked_var does
    whitened = (values - mean) / np.sqrt(var + epsilon) * mask
    return whitened[:, 0]  # every token of a response carries the same advantage


def trl_grpo(rewards, num_generations, scale_rewards):
    grouped = rewards.reshape(-1, num_generations)
    mean = np.repeat(grouped.mean(axis=1), num_generations)
    advantages = rewards - mean
    if scale_rewards == "group":
        std = np.repeat(grouped.std(axis=1, ddof=1), num_generations)
    elif scale_rewards == "batch":
        std = np.full(rewards.shape, rewards.std(ddof=1))
    else:
        return advantages
    return advantages / (std + 1e-4)


def openrlhf(rewards, estimator):
    if estimator == "rloo":
        baseline = (rewards.sum(-1, keepdims=True) - rewards) / (rewards.shape[-1] - 1)
        return rewards - baseline
    if estimator == "dr_grpo":
        return rewards - rewards.mean(-1, keepdims=True)
    if estimator == "group_norm":
        return (rewards - rewards.mean(-1, keepdims=True)) / (
            rewards.std(-1, ddof=1, keepdims=True) + 1e-9)
    raise ValueError(estimator)


@pytest.fixture
def verl_batch():
    """A shuffled verl-style batch: string uids, groups of 1 to 8, binary and graded scores."""
    rng = np.random.default_rng(2024)
    sizes = [1, 2, 3, 8, 5, 1, 4, 8]
    uids = np.repeat([f"prompt-{q}" for q in range(len(sizes))], sizes)
    scores = np.concatenate([
        rng.integers(0, 2, size=s).astype(float) if q % 2 else rng.uniform(size=s)
        for q, s in enumerate(sizes)
    ])
    perm = rng.permutation(scores.size)
    lengths = rng.integers(20, 400, size=scores.size).astype(float)
    return scores[perm], uids[perm], lengths[perm]


@pytest.fixture
def dense_batch():
    rng = np.random.default_rng(7)
    rewards = rng.uniform(size=(16, 8))
    rewards[3] = rng.integers(0, 2, size=8)
    rewards[5, :4] = rewards[5, 4:] = 0.25  # a zero-variance group with an exact mean
    return rewards


def test_grpo_equals_verl_grpo_outcome_advantage(verl_batch, backend):
    scores, uids, _ = verl_batch
    ours = grpo(scores, group_ids=uids, eps=1e-6, ddof=1, singleton="raw", backend=backend)
    np.testing.assert_allclose(ours, verl_grpo(scores, uids), rtol=1e-12, atol=1e-12)


def test_dr_grpo_equals_verl_without_std_normalization(verl_batch, backend):
    scores, uids, _ = verl_batch
    ours = dr_grpo(scores, group_ids=uids, singleton="raw", backend=backend)
    np.testing.assert_allclose(ours, verl_grpo(scores, uids, norm_adv_by_std_in_grpo=False),
                               rtol=1e-12, atol=1e-12)


def test_rloo_equals_verl_rloo(verl_batch, backend):
    scores, uids, _ = verl_batch
    ours = rloo(scores, group_ids=uids, singleton="raw", backend=backend)
    np.testing.assert_allclose(ours, verl_rloo(scores, uids), rtol=1e-12, atol=1e-12)


def test_opo_equals_verl_opo(verl_batch, backend):
    scores, uids, lengths = verl_batch
    ours = opo(scores, group_ids=uids, lengths=lengths, singleton="raw", backend=backend)
    np.testing.assert_allclose(ours, verl_opo(scores, uids, lengths), rtol=1e-12, atol=1e-12)


def test_gpg_equals_verl_gpg(verl_batch, backend):
    scores, uids, _ = verl_batch
    ours = gpg(scores, group_ids=uids, f_norm=2.0, singleton="raw", backend=backend)
    np.testing.assert_allclose(ours, verl_gpg(scores, uids, f_norm=2.0), rtol=1e-12,
                               atol=1e-12)


def test_passk_equals_verl_grpo_passk(verl_batch, backend):
    scores, uids, _ = verl_batch
    keep = np.isin(uids, [u for u in np.unique(uids) if (uids == u).sum() >= 2])
    scores, uids = scores[keep], uids[keep]  # verl raises on groups of one
    ours = passk(scores, group_ids=uids, eps=1e-6, backend=backend)
    np.testing.assert_allclose(ours, verl_passk(scores, uids), rtol=1e-12, atol=1e-12)


def test_reinforce_pp_baseline_equals_verl_masked_whiten(verl_batch, backend):
    scores, uids, lengths = verl_batch
    ours = reinforce_pp_baseline(scores, group_ids=uids, token_counts=lengths, eps=1e-8,
                                 singleton="raw", backend=backend)
    np.testing.assert_allclose(ours, verl_reinforce_pp_baseline(scores, uids, lengths),
                               rtol=1e-10, atol=1e-12)


def test_grpo_eps_1e4_equals_trl_group_scaling(dense_batch, backend):
    expected = trl_grpo(dense_batch.reshape(-1), 8, "group").reshape(dense_batch.shape)
    np.testing.assert_allclose(grpo(dense_batch, eps=1e-4, backend=backend), expected,
                               rtol=1e-12, atol=1e-12)


def test_batch_std_eps_1e4_equals_trl_batch_scaling(dense_batch, backend):
    expected = trl_grpo(dense_batch.reshape(-1), 8, "batch").reshape(dense_batch.shape)
    np.testing.assert_allclose(batch_std(dense_batch, eps=1e-4, backend=backend), expected,
                               rtol=1e-12, atol=1e-12)


def test_dr_grpo_equals_trl_none_and_openrlhf_dr_grpo(dense_batch, backend):
    ours = dr_grpo(dense_batch, backend=backend)
    expected = trl_grpo(dense_batch.reshape(-1), 8, "none").reshape(dense_batch.shape)
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ours, openrlhf(dense_batch, "dr_grpo"), rtol=1e-12, atol=1e-15)


def test_rloo_and_group_norm_equal_openrlhf(dense_batch, backend):
    np.testing.assert_allclose(rloo(dense_batch, backend=backend),
                               openrlhf(dense_batch, "rloo"), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(grpo(dense_batch, eps=1e-9, backend=backend),
                               openrlhf(dense_batch, "group_norm"), rtol=1e-12, atol=1e-12)


def test_known_divergence_zero_variance_residue(backend):
    # Seven float32 rewards of 0.7: a float32 mean leaves a residue of 6e-8, which the
    # frameworks' formula divides by (std + eps) into advantages of 0.056 for responses
    # that are identical.  advcal returns exact zeros (documented in docs/estimators.md).
    rewards = np.full((1, 7), 0.7, dtype=np.float32)
    mean = rewards.mean(axis=1, keepdims=True, dtype=np.float32)
    std = rewards.std(axis=1, ddof=1, keepdims=True, dtype=np.float32)
    framework_style = (rewards - mean) / (std + np.float32(1e-6))
    assert np.abs(framework_style).min() > 0.05
    assert (grpo(rewards, backend=backend) == 0.0).all()
