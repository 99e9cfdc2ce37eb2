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

from advcal import (
    batch_std,
    dr_grpo,
    gdpo,
    gpg,
    grpo,
    opo,
    passk,
    reinforce_pp_baseline,
    rloo,
)


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


# --------------------------------------------------------------------------- issue 16 options
# Each reference below restates one framework option from its semantics (per-group sums,
# token masks, nan-aware reductions), independently of advcal's code.


def verl_grpo_vectorized(scores, index, epsilon=1e-6):
    """Per-group sums s1, s2; variance (s2 - s1^2/n) / max(n - 1, 1) floored at epsilon;
    lone responses mean 0, std 1; (s - mean) / (std + epsilon)."""
    labels, g = np.unique(index, return_inverse=True)
    count = np.bincount(g, minlength=labels.size).astype(float)
    s1 = np.bincount(g, scores, labels.size)
    s2 = np.bincount(g, scores * scores, labels.size)
    mean = s1 / np.maximum(count, 1.0)
    var = (s2 - s1 * s1 / np.maximum(count, 1.0)) / np.maximum(count - 1.0, 1.0)
    std = np.sqrt(np.maximum(var, epsilon))
    mean[count <= 1] = 0.0
    std[count <= 1] = 1.0
    return (scores - mean[g]) / (std[g] + epsilon)


def test_grpo_std_floor_equals_verl_grpo_vectorized(backend):
    rng = np.random.default_rng(16)
    groups = [rng.uniform(size=6), np.array([0.0, 1e-4, 2e-4, 0.0]),  # std below the floor
              rng.integers(0, 2, 5).astype(float), np.array([0.3]), np.full(3, 0.5)]
    scores = np.concatenate(groups)
    uids = np.repeat([f"u{q}" for q in range(len(groups))], [g.size for g in groups])
    perm = rng.permutation(scores.size)
    scores, uids = scores[perm], uids[perm]
    ours = grpo(scores, group_ids=uids, eps=1e-6, std_floor=1e-3, singleton="raw",
                backend=backend)
    np.testing.assert_allclose(ours, verl_grpo_vectorized(scores, uids), rtol=1e-9,
                               atol=1e-9)
    # Without the floor the tiny-spread group (std 1e-4) is scaled up 10x more.
    plain = grpo(scores, group_ids=uids, eps=1e-6, singleton="raw", backend=backend)
    tiny = uids == "u1"
    assert np.abs(plain[tiny]).max() > 9 * np.abs(ours[tiny]).max()


def verl_passk_raw_gap(scores, index):
    out = np.zeros(len(scores))
    for label in set(index):
        pos = [i for i, idx in enumerate(index) if idx == label]
        values = [scores[i] for i in pos]
        best = max(range(len(values)), key=lambda j: (values[j], -j))  # first of ties
        rest = values[:best] + values[best + 1:]
        out[pos[best]] = values[best] - max(rest)
    return out


def test_passk_without_std_equals_verl_passk_norm_false(verl_batch, backend):
    scores, uids, _ = verl_batch
    keep = np.isin(uids, [u for u in np.unique(uids) if (uids == u).sum() >= 2])
    scores, uids = scores[keep], uids[keep]
    ours = passk(scores, group_ids=uids, std_norm=False, backend=backend)
    np.testing.assert_allclose(ours, verl_passk_raw_gap(list(scores), list(uids)),
                               rtol=1e-15, atol=0)


def openrlhf_reinforce_baseline(rewards, lengths, *, std_norm=True, dtype=np.float64):
    """Contiguous groups (B, n): rewards minus the group mean, the return at every token
    (gamma = 1, outcome reward), then the token-masked mean and biased variance over the
    whole batch, rstd = clamp(var, 1e-8) ** -0.5, all in ``dtype``."""
    centered = (rewards - rewards.mean(-1, keepdims=True)).reshape(-1).astype(dtype)
    width = int(lengths.max())
    mask = (np.arange(width)[None, :] < lengths.reshape(-1)[:, None]).astype(dtype)
    tokens = centered[:, None] * mask
    n_tokens = mask.sum()
    mean = (tokens * mask).sum() / n_tokens
    if std_norm:
        var = (((tokens - mean) ** 2) * mask).sum() / n_tokens
        rstd = dtype(1.0) / np.sqrt(np.maximum(var, dtype(1e-8)))
    else:
        rstd = dtype(1.0)
    return ((tokens - mean) * rstd)[:, 0].reshape(rewards.shape)


@pytest.fixture
def openrlhf_batch():
    rng = np.random.default_rng(9)
    rewards = rng.uniform(size=(12, 4))
    rewards[2] = rng.integers(0, 2, 4)
    lengths = rng.integers(5, 300, size=(12, 4)).astype(float)
    return rewards, lengths


def test_reinforce_pp_baseline_equals_openrlhf_reinforce_baseline(openrlhf_batch, backend):
    rewards, lengths = openrlhf_batch
    ours = reinforce_pp_baseline(rewards, token_counts=lengths, ddof=0, eps=0.0,
                                 var_floor=1e-8, backend=backend)
    np.testing.assert_allclose(ours, openrlhf_reinforce_baseline(rewards, lengths),
                               rtol=1e-10, atol=1e-12)
    # OpenRLHF's statistics are float32 (.float()); advcal computes them in float64.
    f32 = openrlhf_reinforce_baseline(rewards, lengths, dtype=np.float32)
    np.testing.assert_allclose(ours, f32, rtol=0, atol=1e-5)
    # verl's mapping (Bessel, eps inside the root) is not OpenRLHF's: it differs.
    verl_style = reinforce_pp_baseline(rewards, token_counts=lengths, backend=backend)
    assert not np.allclose(verl_style, ours, rtol=1e-6)


def test_reinforce_pp_baseline_no_std_norm_equals_openrlhf(openrlhf_batch, backend):
    rewards, lengths = openrlhf_batch
    ours = reinforce_pp_baseline(rewards, token_counts=lengths, std_norm=False,
                                 backend=backend)
    expected = openrlhf_reinforce_baseline(rewards, lengths, std_norm=False)
    np.testing.assert_allclose(ours, expected, rtol=1e-10, atol=1e-13)


def nanstd(x):
    """TRL's nanstd: the unbiased std of the non-NaN entries."""
    x = x[~np.isnan(x)]
    return np.sqrt(np.sum((x - x.mean()) ** 2) / (x.size - 1))


def trl_rloo_normalized(rewards, num_generations):
    grouped = rewards.reshape(-1, num_generations)
    baseline = (grouped.sum(1, keepdims=True) - grouped) / (num_generations - 1)
    advantages = (grouped - baseline).reshape(-1)
    return (advantages - advantages.mean()) / (nanstd(advantages) + 1e-4)


def test_rloo_batch_scale_equals_trl_rloo_normalize_advantages(dense_batch, backend):
    ours = rloo(dense_batch, scale="batch", eps=1e-4, backend=backend)
    expected = trl_rloo_normalized(dense_batch.reshape(-1), 8).reshape(dense_batch.shape)
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-12)


def _trl_rloo_own_advantages(rewards_per_func, num_generations):
    """TRL's RLOO advantages with ``normalize_advantages=True`` by the lines of the
    installed ``RLOOTrainer`` itself, from its unscorable mask to its ``nan_to_num`` (not a
    copy of its formulas), in float64, one reward function, no KL or clipping."""
    import inspect
    import textwrap
    from types import SimpleNamespace

    torch = pytest.importorskip("torch")
    trl = pytest.importorskip("trl")
    from trl.trainer.utils import nanstd as trl_nanstd

    lines = inspect.getsource(trl.RLOOTrainer._generate_and_score_completions).splitlines()
    first = next(i for i, line in enumerate(lines)
                 if "unscorable_mask = torch.isnan(rewards_per_func)" in line)
    last = next(i for i, line in enumerate(lines)
                if "advantages = torch.nan_to_num(advantages" in line)
    trainer = SimpleNamespace(reward_weights=torch.ones(1, dtype=torch.float64),
                              reward_clip_range=None, beta=0.0, normalize_advantages=True)
    namespace = {"self": trainer, "torch": torch, "nanstd": trl_nanstd, "device": "cpu",
                 "rewards_per_func": torch.tensor(rewards_per_func[:, None],
                                                  dtype=torch.float64),
                 "num_generations": num_generations}
    exec(textwrap.dedent("\n".join(lines[first:last + 1])), namespace)
    return namespace["advantages"].numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rloo_batch_scale_equals_trls_own_code_with_unscorable(backend, dtype):
    # Groups left with exactly one scorable completion: TRL's leave-one-out advantage is
    # 0/0 = NaN there, so its whitening leaves that completion out and gives it 0.
    rng = np.random.default_rng(5)
    for trial in range(12):
        n_groups, g = int(rng.integers(2, 9)), int(rng.integers(2, 7))
        rewards = np.round(rng.uniform(0, 1, n_groups * g), 2)
        rewards[rng.uniform(size=rewards.size) < 0.3] = np.nan
        rewards.reshape(n_groups, g)[trial % n_groups, 1:] = np.nan  # one lone response
        rewards = rewards.astype(dtype)
        expected = _trl_rloo_own_advantages(rewards.astype(np.float64), g)
        ours = rloo(rewards.reshape(n_groups, g), scale="batch", eps=1e-4,
                    nan_policy="omit", backend=backend)
        # TRL's nanstd takes Bessel's count / (count - 1) in torch's default float32 (a
        # relative 2**-24 in the variance, half that in the std); a float32 result adds
        # its own rounding, 2**-24.  The zeros are exact on both sides.
        rtol = 2.0 ** -24 if dtype == np.float64 else 2.0 ** -23
        np.testing.assert_allclose(ours.reshape(-1), expected, rtol=rtol, atol=0)
        assert ours.dtype == dtype


def trl_normalize_then_sum(rewards_per_func, num_generations, weights):
    """(N, K) rewards with NaN for None: per function and group, (r - nanmean) /
    (nanstd + 1e-4); nansum with weights; rows NaN in every function are NaN; then
    (R - nanmean(R)) / (nanstd(R) + 1e-4); NaN advantages become 0."""
    n, k = rewards_per_func.shape
    grouped = rewards_per_func.reshape(-1, num_generations, k)
    normalized = np.empty_like(grouped)
    for q in range(grouped.shape[0]):
        for f in range(k):
            column = grouped[q, :, f]
            normalized[q, :, f] = (column - np.nanmean(column)) / (nanstd(column) + 1e-4)
    total = np.nansum(normalized.reshape(n, k) * weights, axis=1)
    total[np.isnan(rewards_per_func).all(1)] = np.nan
    advantages = (total - np.nanmean(total)) / (nanstd(total) + 1e-4)
    return np.nan_to_num(advantages, nan=0.0)


def test_gdpo_equals_trl_normalize_then_sum(backend):
    rng = np.random.default_rng(11)
    rewards = np.stack([rng.uniform(size=48), rng.integers(0, 2, 48).astype(float),
                        rng.normal(3.0, 2.0, 48)], axis=1)
    weights = np.array([1.0, 0.5, 2.0])
    expected = trl_normalize_then_sum(rewards, 8, weights)
    ours = gdpo(rewards.reshape(6, 8, 3), weights=weights, eps=1e-4, backend=backend)
    np.testing.assert_allclose(ours.reshape(-1), expected, rtol=1e-10, atol=1e-12)
    # Unscorable entries (reward functions returning None).
    rewards[3, 1] = np.nan
    rewards[10, :] = np.nan
    expected = trl_normalize_then_sum(rewards, 8, weights)
    ours = gdpo(rewards, np.arange(0, 49, 8), weights=weights, eps=1e-4, nan_policy="omit",
                backend=backend)
    np.testing.assert_allclose(ours, expected, rtol=1e-10, atol=1e-12)
    assert ours[10] == 0.0


def verl_rloo_vectorized(scores, index):
    _, g = np.unique(index, return_inverse=True)
    c = np.bincount(g)[g].astype(float)
    total = np.bincount(g, scores)[g]
    return (c * scores - total) / np.maximum(c - 1, 1) * (c > 1)


def test_rloo_singleton_zero_equals_verl_rloo_vectorized(verl_batch, backend):
    scores, uids, _ = verl_batch
    ours = rloo(scores, group_ids=uids, singleton="zero", backend=backend)
    np.testing.assert_allclose(ours, verl_rloo_vectorized(scores, uids), rtol=1e-12,
                               atol=1e-14)


def verl_reinforce_plus_plus(scores, response_length, gamma=1.0):
    """Outcome reward on the last token, discounted returns by a reverse scan that
    resets after the response's end, then masked_whiten (unbiased variance, +1e-8 under
    the root, and masked_mean's +1e-8 in the token count)."""
    width = int(max(response_length))
    mask = (np.arange(width)[None, :] < np.asarray(response_length)[:, None]).astype(float)
    token_rewards = np.zeros_like(mask)
    token_rewards[np.arange(len(scores)), np.asarray(response_length, int) - 1] = scores
    returns = np.zeros_like(mask)
    running = np.zeros(len(scores))
    for t in reversed(range(width)):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    mean = (returns * mask).sum() / (mask.sum() + 1e-8)
    var = (((returns - mean) ** 2) * mask).sum() / (mask.sum() + 1e-8)
    var = var * mask.sum() / (mask.sum() - 1)
    return ((returns - mean) / np.sqrt(var + 1e-8) * mask)[:, 0]


def test_reinforce_pp_baseline_one_group_equals_verl_reinforce_plus_plus(verl_batch, backend):
    scores, _, lengths = verl_batch
    ours = reinforce_pp_baseline(scores, [0, scores.size], token_counts=lengths, eps=1e-8,
                                 backend=backend)
    # masked_mean's 1e-8 in the token count moves the result by ~1e-8 / W relatively.
    np.testing.assert_allclose(ours, verl_reinforce_plus_plus(scores, lengths), rtol=1e-9,
                               atol=1e-12)


def test_verl_masked_mean_count_offset_is_below_float32_resolution(verl_batch):
    scores, uids, lengths = verl_batch
    with_offset = verl_reinforce_plus_plus(scores, lengths)
    ours = reinforce_pp_baseline(scores, [0, scores.size], token_counts=lengths, eps=1e-8)
    gap = np.max(np.abs(with_offset - ours) / np.maximum(np.abs(ours), 1e-3))
    assert gap < 1e-8 / lengths.sum() * 10 + 1e-13
    assert gap < np.finfo(np.float32).eps


def test_reinforce_pp_baseline_constant_group_is_not_zero_after_whitening(backend):
    # Whitening over the batch subtracts the token-weighted mean m of the centered rewards:
    # with unequal token counts m != 0 and a constant group gets -m / sqrt(v + eps), as in
    # verl.  (The other estimators give exact zeros there.)
    rewards = np.array([[1.0, 0.0], [0.5, 0.5]])
    counts = np.array([[10.0, 1.0], [1.0, 1.0]])
    out = reinforce_pp_baseline(rewards, token_counts=counts, backend=backend)
    u = np.array([0.5, -0.5, 0.0, 0.0])
    w = counts.reshape(-1)
    m = np.sum(w * u) / w.sum()
    v = np.sum(w * (u - m) ** 2) / w.sum() * w.sum() / (w.sum() - 1)
    np.testing.assert_allclose(out.reshape(-1), (u - m) / np.sqrt(v + 1e-8), rtol=1e-12)
    assert abs(out[1, 0]) > 0.4


def test_float32_input_is_computed_in_float64(backend):
    # An ill-conditioned float32 group (1e6 + U): a float32 mean and std lose most digits,
    # advcal's float64 statistics do not.  Truth: the same float32 values in float64.
    rng = np.random.default_rng(3)
    rewards = (1e6 + rng.uniform(size=(4, 8))).astype(np.float32)
    wide = rewards.astype(np.float64)
    truth = (wide - wide.mean(1, keepdims=True)) / (wide.std(1, ddof=1, keepdims=True) + 1e-4)
    mean32 = rewards.mean(1, keepdims=True, dtype=np.float32)
    std32 = np.sqrt(((rewards - mean32) ** 2).sum(1, keepdims=True, dtype=np.float32)
                    / np.float32(7))
    framework = (rewards - mean32) / (std32 + np.float32(1e-4))
    ours = grpo(rewards, eps=1e-4, backend=backend)
    assert ours.dtype == np.float32
    assert np.abs(ours - truth).max() < 1e-6
    assert np.abs(framework - truth).max() > 1e-3
