# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Split-conformal coverage vs α and m
#
# A split-conformal quantile of $m$ calibration scores at level $\alpha$ is the $k$-th smallest
# score with $k = \lceil (m+1)(1-\alpha) \rceil$, and $+\infty$ when $k > m$. For exchangeable
# scores without ties a fresh score falls at or below it with probability exactly
# $\min(k, m+1)/(m+1)$, so
#
# $$1 - \alpha \;\le\; P(\text{cover}) \;\le\; 1 - \alpha + \frac{1}{m+1}.$$
#
# This notebook checks that band by simulation for `advcal.conformal_quantile` and for the
# conformal reward ranges of `advcal.calibrate_ranges` (Range-GRPO), over several $\alpha$ and
# $m$, with binomial tolerances computed from the number of trials.
#
# Set the environment variable `ADVCAL_NOTEBOOK_SIZE=reduced` for the quick run that CI
# executes (the documentation site shows that run); the default, `full`, is the size the
# figures were designed for. This file is a jupytext percent-format notebook: run it as a
# script, or open it in Jupyter with jupytext installed.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import advcal

SIZE = os.environ.get("ADVCAL_NOTEBOOK_SIZE", "full")
if SIZE not in ("reduced", "full"):
    raise ValueError(f"ADVCAL_NOTEBOOK_SIZE must be 'reduced' or 'full'; got {SIZE!r}.")
FULL = SIZE == "full"
print(f"advcal {advcal.__version__}, size: {SIZE}")
rng = np.random.default_rng(20261130)
ALPHAS = [0.05, 0.1, 0.2, 0.3] if FULL else [0.1, 0.3]
SIZES = [9, 19, 49, 99] if FULL else [9, 49]
TRIALS = 4000 if FULL else 1500
Z = 4.0  # tolerance in binomial standard errors, for a family of a few dozen checks

# %% [markdown]
# ## The rank, without float overshoot
#
# $(m+1)(1-\alpha)$ in floating point can land just above an integer, and the ceiling then
# jumps one rank too far. advcal snaps values within $10^{-9}$ of an integer, so $\alpha$ means
# the decimal you wrote:

# %%
import math

for m, alpha in [(9, 0.7), (74, 1 - 0.68)]:
    naive = math.ceil((m + 1) * (1 - alpha))
    print(f"m={m:3d} alpha={alpha:.2f}: advcal k={advcal.conformal_rank(m, alpha)}, "
          f"naive float k={naive}")


# %% [markdown]
# ## Coverage of the conformal quantile
#
# Each trial draws $m+1$ exchangeable scores (exponential, so no ties), calibrates on the first
# $m$ and tests the last. The exact coverage is $\min(k, m+1)/(m+1)$; with $k > m$ the quantile is
# $+\infty$ and every trial is covered.

# %%
def band(m, alpha):
    return 1 - alpha, min(1.0, 1 - alpha + 1 / (m + 1))


def check(empirical, exact, trials):
    """Binomial tolerance around the exact coverage (0 when the exact coverage is 1)."""
    tol = Z * math.sqrt(exact * (1 - exact) / trials)
    return abs(empirical - exact) <= tol + 1e-12, tol


quantile_rows = []
for m in SIZES:
    for alpha in ALPHAS:
        scores = rng.exponential(size=(TRIALS, m + 1))
        covered = [scores[t, m] <= advcal.conformal_quantile(scores[t, :m], alpha)
                   for t in range(TRIALS)]
        k = advcal.conformal_rank(m, alpha)
        exact = min(k, m + 1) / (m + 1)
        empirical = float(np.mean(covered))
        ok, tol = check(empirical, exact, TRIALS)
        lo, hi = band(m, alpha)
        quantile_rows.append(dict(m=m, alpha=alpha, k=k, exact=exact, empirical=empirical,
                                  tol=tol, band=(lo, hi), ok=ok))

print(f"{'m':>4} {'alpha':>6} {'k':>4} {'exact':>7} {'empirical':>10} {'tol':>6}  band")
for r in quantile_rows:
    print(f"{r['m']:4d} {r['alpha']:6.2f} {r['k']:4d} {r['exact']:7.3f} {r['empirical']:10.3f} "
          f"{r['tol']:6.3f}  [{r['band'][0]:.3f}, {r['band'][1]:.3f}]  "
          f"{'ok' if r['ok'] else 'FAIL'}")

# %%
fig, axes = plt.subplots(1, len(SIZES), figsize=(4 * len(SIZES), 3.2), sharey=True)
grid = np.linspace(min(ALPHAS) - 0.02, max(ALPHAS) + 0.02, 100)
for ax, m in zip(np.atleast_1d(axes), SIZES, strict=True):
    rows = [r for r in quantile_rows if r["m"] == m]
    ax.fill_between(grid, 1 - grid, np.minimum(1, 1 - grid + 1 / (m + 1)), alpha=0.25,
                    label="finite-sample band")
    ax.errorbar([r["alpha"] for r in rows], [r["empirical"] for r in rows],
                yerr=[r["tol"] for r in rows], fmt="o", capsize=3, label="empirical")
    ax.set_title(f"m = {m}")
    ax.set_xlabel("alpha")
axes_list = np.atleast_1d(axes)
axes_list[0].set_ylabel("coverage")
axes_list[0].legend(loc="lower left")
fig.suptitle("conformal_quantile: coverage vs alpha and m")
fig.tight_layout()
plt.show()


# %% [markdown]
# ## Conformal reward ranges from an LLM judge
#
# Range-GRPO calibrates a judge against reference rewards on a labeled set, then turns judge
# scores of unlabeled responses into ranges $[l, h]$ clipped to the reward bounds. The simulated
# judge draws $k = 5$ noisy samples around the reference reward with a per-response noise level
# (some responses are hard to judge): its score is their mean, its difficulty $\hat\sigma$ their
# spread, and its quantiles their 10% / 90% quantiles.
#
# * `absolute`: score $|y - s|$, range $s \pm \hat q$;
# * `normalized`: score $|y - s| / \hat\sigma$, range $s \pm \hat q\,\hat\sigma$ (adapts to
#   difficulty);
# * `cqr`: score $\max(\hat s_{lo} - y,\, y - \hat s_{hi})$, range
#   $[\hat s_{lo} - \hat q,\, \hat s_{hi} + \hat q]$.
#
# Each method's coverage of a fresh response has the same exact value $\min(k, m+1)/(m+1)$
# (the scores are continuous, and clipping to the bounds never uncovers a reward that lies in
# them).

# %%
def judge(n, samples=5):
    reference = rng.beta(2.0, 2.0, n)
    noise_sd = 0.02 + 0.2 * rng.random(n) ** 2
    draws = reference[:, None] + noise_sd[:, None] * rng.standard_normal((n, samples))
    lower, upper = np.quantile(draws, [0.1, 0.9], axis=1)
    return reference, draws.mean(axis=1), draws.std(axis=1, ddof=1), lower, upper


METHODS = ("absolute", "normalized", "cqr")
range_rows = []
for m in SIZES:
    for alpha in ALPHAS:
        hits = {method: 0 for method in METHODS}
        widths = {method: 0.0 for method in METHODS}
        for _ in range(TRIALS):
            y, s, sigma, lower, upper = judge(m + 1)
            cal, test = slice(0, m), slice(m, m + 1)
            for method in METHODS:
                if method == "absolute":
                    fit = advcal.calibrate_ranges(s[cal], y[cal], alpha=alpha)
                    lo, hi = fit.ranges(s[test])
                elif method == "normalized":
                    fit = advcal.calibrate_ranges(s[cal], y[cal], alpha=alpha, method=method,
                                                  sigma=sigma[cal])
                    lo, hi = fit.ranges(s[test], sigma=sigma[test])
                else:
                    fit = advcal.calibrate_ranges(None, y[cal], alpha=alpha, method=method,
                                                  lower=lower[cal], upper=upper[cal])
                    lo, hi = fit.ranges(None, lower=lower[test], upper=upper[test])
                hits[method] += int(lo[0] <= y[m] <= hi[0])
                widths[method] += float(hi[0] - lo[0])
        k = advcal.conformal_rank(m, alpha)
        exact = min(k, m + 1) / (m + 1)
        for method in METHODS:
            empirical = hits[method] / TRIALS
            ok, tol = check(empirical, exact, TRIALS)
            range_rows.append(dict(method=method, m=m, alpha=alpha, exact=exact,
                                   empirical=empirical, tol=tol, width=widths[method] / TRIALS,
                                   ok=ok))

print(f"{'method':>10} {'m':>4} {'alpha':>6} {'exact':>7} {'empirical':>10} {'tol':>6} "
      f"{'mean width':>11}")
for r in range_rows:
    print(f"{r['method']:>10} {r['m']:4d} {r['alpha']:6.2f} {r['exact']:7.3f} "
          f"{r['empirical']:10.3f} {r['tol']:6.3f} {r['width']:11.3f}  "
          f"{'ok' if r['ok'] else 'FAIL'}")

# %%
fig, (ax_cov, ax_width) = plt.subplots(1, 2, figsize=(10, 3.5))
m_show = SIZES[-1]
for method, marker in zip(METHODS, "osD", strict=True):
    rows = [r for r in range_rows if r["method"] == method and r["m"] == m_show]
    alphas = [r["alpha"] for r in rows]
    ax_cov.errorbar(alphas, [r["empirical"] for r in rows], yerr=[r["tol"] for r in rows],
                    fmt=marker, capsize=3, label=method)
    ax_width.plot(alphas, [r["width"] for r in rows], marker=marker, label=method)
ax_cov.fill_between(grid, 1 - grid, np.minimum(1, 1 - grid + 1 / (m_show + 1)), alpha=0.25,
                    label="finite-sample band")
ax_cov.set(title=f"range coverage, m = {m_show}", xlabel="alpha", ylabel="coverage")
ax_width.set(title="mean range width", xlabel="alpha", ylabel="h - l")
ax_cov.legend(loc="lower left")
ax_width.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The property
#
# Every empirical coverage — of the quantile and of each range method, for every $\alpha$ and
# $m$ — lies within the binomial tolerance of the exact finite-sample coverage, and so within
# the band $[1-\alpha, 1-\alpha+1/(m+1)]$ up to that tolerance.

# %%
failures = [r for r in quantile_rows + range_rows if not r["ok"]]
assert not failures, f"coverage outside the finite-sample band: {failures}"
for r in quantile_rows + range_rows:
    lo, hi = band(r["m"], r["alpha"])
    assert lo - r["tol"] - 1e-12 <= r["empirical"] <= hi + r["tol"] + 1e-12
print(f"{len(quantile_rows) + len(range_rows)} coverage checks inside the finite-sample band")
