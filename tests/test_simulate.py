"""advcal.simulate: seeded generators (shapes, reproducibility, the noise they claim)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from advcal.simulate import grade, gram_matrices, paired_scorings, response_groups


def test_response_groups_shape_range_and_seed() -> None:
    a = response_groups(500, 16, seed=1)
    b = response_groups(500, 16, seed=1)
    c = response_groups(500, 16, seed=2)
    assert a.rewards.shape == (500, 16) and a.difficulty.shape == (500,)
    assert ((a.rewards > 0) & (a.rewards < 1)).all()
    np.testing.assert_array_equal(a.rewards, b.rewards)
    assert not np.array_equal(a.rewards, c.rewards)
    # The group mean tracks its difficulty (logit-normal around logit p_q).
    assert np.corrcoef(a.rewards.mean(axis=1), a.difficulty)[0, 1] > 0.9


def test_concentration_controls_within_group_spread() -> None:
    wide = response_groups(2000, 8, concentration=1.0, seed=0).rewards.std(axis=1).mean()
    narrow = response_groups(2000, 8, concentration=100.0, seed=0).rewards.std(axis=1).mean()
    assert narrow < wide / 5


@pytest.mark.parametrize("noise", ["gaussian", "heteroscedastic"])
def test_gaussian_noise_has_the_stated_variance(noise: str) -> None:
    true = np.full((2000, 10), 0.5)
    graded = grade(true, noise=noise, scale=0.1, seed=3)
    resid = graded.scores - true
    z = resid / np.sqrt(graded.noise_var)
    n = z.size
    # Standardized residuals: mean 0 and variance 1 within 4 standard errors.
    assert abs(z.mean()) < 4 / math.sqrt(n)
    assert abs(z.var() - 1) < 4 * math.sqrt(2 / n)
    if noise == "heteroscedastic":
        assert graded.noise_var.std() > 0
        sd = np.sqrt(graded.noise_var)
        assert abs(sd.mean() - 0.1) < 4 * sd.std() / math.sqrt(n)


def test_rubric_scores_are_binomial_with_jitter() -> None:
    from scipy import stats

    p = 0.3
    levels = 10
    graded = grade(np.full(200_000, p), noise="rubric", levels=levels, jitter=0.0, seed=5)
    counts = graded.scores * levels
    np.testing.assert_allclose(counts, np.round(counts), atol=1e-9)
    observed = np.bincount(np.round(counts).astype(int), minlength=levels + 1)
    expected = stats.binom.pmf(np.arange(levels + 1), levels, p) * counts.size
    keep = expected > 20
    chi2 = (((observed[keep] - expected[keep]) ** 2) / expected[keep]).sum()
    assert chi2 < stats.chi2.ppf(0.999, keep.sum() - 1)
    np.testing.assert_allclose(graded.noise_var, p * (1 - p) / levels)
    jittered = grade(np.full(1000, p), noise="rubric", jitter=0.01, seed=5).scores
    assert not np.allclose(jittered * levels, np.round(jittered * levels))


def test_paired_scorings_are_independent_given_the_truth() -> None:
    pair = paired_scorings(20_000, 8, scale=0.05, n_scorings=3, seed=7)
    assert len(pair.scores) == 3
    ea, eb = pair.a - pair.true, pair.b - pair.true
    n = ea.size
    assert abs(np.corrcoef(ea.ravel(), eb.ravel())[0, 1]) < 4 / math.sqrt(n)
    # The isotropic noise estimate of JRSC recovers scale².
    assert np.mean((pair.a - pair.b) ** 2) / 2 == pytest.approx(0.05**2, rel=4 * math.sqrt(2 / n))


def test_gram_matrices_are_psd_with_the_requested_rank() -> None:
    full = gram_matrices(50, 6, seed=0).gram
    low = gram_matrices(50, 6, rank=3, seed=0).gram
    for k in (full, low):
        np.testing.assert_array_equal(k, k.transpose(0, 2, 1))
        assert (np.linalg.eigvalsh(k)[:, 0] > -1e-12).all()
    assert (np.linalg.matrix_rank(full) == 6).all()
    assert (np.linalg.matrix_rank(low) == 3).all()
    # Unit diagonal on average; the shared component correlates responses.
    assert abs(full[:, range(6), range(6)].mean() - 1) < 0.1
    assert full[:, 0, 1].mean() > 0.3
    assert gram_matrices(2, 3, seed=0, dtype=np.float32).gram.dtype == np.float32


def test_large_batches_are_vectorized() -> None:
    # Not a timing test (benchmarks/bench_sets.py times a million groups): a large batch
    # must simply work in one vectorized call.
    pair = paired_scorings(100_000, 16, noise="rubric", seed=0)
    assert pair.a.shape == (100_000, 16)


def test_bad_input_messages() -> None:
    with pytest.raises(ValueError, match="`noise` must be one of"):
        grade([0.5], noise="uniform")
    with pytest.raises(ValueError, match="`n_groups` must be >= 0; got -1"):
        response_groups(-1, 4)
    with pytest.raises(ValueError, match="`group_size` must be >= 1; got 0"):
        paired_scorings(3, 0)
    with pytest.raises(ValueError, match="`rank` must be >= 1; got 0"):
        gram_matrices(3, 4, rank=0)
    with pytest.raises(ValueError, match=r"`shared` must lie in \[0.0, 1.0\]; got 2.0"):
        gram_matrices(3, 4, shared=2.0)
    with pytest.raises(TypeError, match="`n_groups` must be an integer"):
        response_groups(2.5, 4)  # type: ignore[arg-type]
