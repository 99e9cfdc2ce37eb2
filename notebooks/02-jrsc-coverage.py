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
# # JRSC: coverage and volume of joint vs isotropic coefficient sets
#
# Joint reward-set calibration turns a group's GRPO coefficients $c = T(r)$ into an ellipsoid
# $E_q = \{c + S_q^{1/2} z : \|z\| \le \rho\}$ that holds the coefficients $T(r')$ of an
# independent re-scoring $r'$ with probability at least $1-\alpha$. The radius $\rho$ is the
# split-conformal quantile of the calibration scores $d_q = \sqrt{\delta^\top S_q^+ \delta}$,
# $\delta = T(r') - T(r)$, so for exchangeable groups the coverage lies in the finite-sample band
# $[1-\alpha,\, 1-\alpha+1/(m+1)]$ **whatever the shape** $S_q$. The shape only decides the
# volume:
#
# * `shape="joint"`: $S_q = J \Sigma_r J^\top + \lambda_q \hat u \hat u^\top$, the linearized
#   grader noise pushed through the Jacobian of the GRPO map, plus a radial term;
# * `shape="isotropic"`: $S_q = C$, one Euclidean ball for every group (the ablation baseline).
#
# The joint shape pays off where linearization holds — grader noise small against the
# within-group spread — and loses its edge as the noise grows. The grader here is
# heteroscedastic (`advcal.simulate.paired_scorings(noise="heteroscedastic")`), groups of 8.
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
from advcal.simulate import paired_scorings

SIZE = os.environ.get("ADVCAL_NOTEBOOK_SIZE", "full")
if SIZE not in ("reduced", "full"):
    raise ValueError(f"ADVCAL_NOTEBOOK_SIZE must be 'reduced' or 'full'; got {SIZE!r}.")
FULL = SIZE == "full"
print(f"advcal {advcal.__version__}, size: {SIZE}")

seeds = np.random.SeedSequence(20261130)
GROUP = 8
NOISE = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2] if FULL else [0.01, 0.05]
ALPHAS = [0.1, 0.2] if FULL else [0.1]
M, TEST, REPEATS = (1000, 4000, 20) if FULL else (500, 1000, 4)
SHAPES = ("joint", "isotropic")
Z = 4.0


# %% [markdown]
# ## Coverage and volume
#
# Each repeat calibrates on $m$ fresh groups and tests on fresh groups. Given the calibration,
# the coverage of a test group is Beta$(k, m+1-k)$-distributed around its exact mean $k/(m+1)$
# (continuous scores), so the tolerance of the mean over repeats combines that spread with the
# binomial spread of the test groups.

# %%
def tolerance(m, alpha, repeats, tests):
    k = advcal.conformal_rank(m, alpha)
    p = min(k, m + 1) / (m + 1)
    between = k * (m + 1 - k) / ((m + 1) ** 2 * (m + 2)) if k <= m else 0.0
    within = p * (1 - p) / tests
    return p, Z * np.sqrt((between + within) / repeats)


rows = []
for sigma_g in NOISE:
    for alpha in ALPHAS:
        cover = {shape: [] for shape in SHAPES}
        volume = {shape: [] for shape in SHAPES}
        for _ in range(REPEATS):
            cal_seed, test_seed = seeds.spawn(2)
            cal = paired_scorings(M, GROUP, noise="heteroscedastic", scale=sigma_g, seed=cal_seed)
            test = paired_scorings(TEST, GROUP, noise="heteroscedastic", scale=sigma_g,
                                   seed=test_seed)
            target = advcal.grpo(test.b)
            for shape in SHAPES:
                calibration = advcal.calibrate_sets(cal.a, cal.b, alpha=alpha, shape=shape)
                sets = advcal.coefficient_sets(test.a, calibration=calibration)
                cover[shape].append(sets.contains(target).mean())
                volume[shape].append(sets.log_volumes().mean())
        exact, tol = tolerance(M, alpha, REPEATS, TEST)
        for shape in SHAPES:
            coverage = float(np.mean(cover[shape]))
            rows.append(dict(sigma_g=sigma_g, alpha=alpha, shape=shape, coverage=coverage,
                             exact=exact, tol=tol, log_volume=float(np.mean(volume[shape])),
                             ok=abs(coverage - exact) <= tol))

print(f"{'sigma_g':>8} {'alpha':>6} {'shape':>10} {'coverage':>9} {'exact':>7} {'tol':>6} "
      f"{'mean log-volume':>16}")
for r in rows:
    print(f"{r['sigma_g']:8.3f} {r['alpha']:6.2f} {r['shape']:>10} {r['coverage']:9.4f} "
          f"{r['exact']:7.4f} {r['tol']:6.4f} {r['log_volume']:16.2f}  "
          f"{'ok' if r['ok'] else 'FAIL'}")

# %%
fig, (ax_cov, ax_vol) = plt.subplots(1, 2, figsize=(11, 3.6))
alpha = ALPHAS[0]
for shape, marker in zip(SHAPES, "os", strict=True):
    sel = [r for r in rows if r["shape"] == shape and r["alpha"] == alpha]
    x = [r["sigma_g"] for r in sel]
    ax_cov.errorbar(x, [r["coverage"] for r in sel], yerr=[r["tol"] for r in sel], fmt=marker,
                    capsize=3, label=shape)
    ax_vol.plot(x, [r["log_volume"] for r in sel], marker=marker, label=shape)
ax_cov.axhspan(1 - alpha, 1 - alpha + 1 / (M + 1), alpha=0.25, label="finite-sample band")
ax_cov.set(xscale="log", xlabel="grader noise sd", ylabel="coverage of T(r')",
           title=f"coverage, alpha = {alpha}, m = {M}")
ax_vol.set(xscale="log", xlabel="grader noise sd", ylabel="mean log-volume",
           title="set volume (log, relative to the unit ball)")
ax_cov.legend()
ax_vol.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What the two shapes look like
#
# For groups of three responses the centered subspace is a plane, so the sets are discs and
# ellipses. GRPO coefficients lie on a circle of radius $\sqrt{n-1}$ there (normalization removes
# scale), and grader noise moves them along it by about $\sigma_g / s_q$: a lot for a
# low-spread group, little for a high-spread one. The joint set follows that group by group; the
# isotropic ball has one radius for all groups, calibrated to cover them on average, so it is
# far too large for high-spread groups. Below: two groups (true rewards 0.1/0.5/0.9 and
# 0.40/0.50/0.62), the coefficients of 400 independent re-scorings of each, and both sets.

# %%
calib3 = paired_scorings(M, 3, noise="gaussian", scale=0.02, seed=seeds.spawn(1)[0])
true3 = np.array([[0.1, 0.5, 0.9], [0.40, 0.50, 0.62]])
rng = np.random.default_rng(1)
scored = true3 + 0.02 * rng.standard_normal(true3.shape)  # the training scoring
basis = np.linalg.svd(np.eye(3) - 1 / 3)[0][:, :2]  # orthonormal basis of the centered plane
circle = np.stack([np.cos(np.linspace(0, 2 * np.pi, 200)), np.sin(np.linspace(0, 2 * np.pi, 200))])
built = {shape: advcal.coefficient_sets(
             scored, calibration=advcal.calibrate_sets(calib3.a, calib3.b, alpha=0.1, shape=shape))
         for shape in SHAPES}

fig, axes = plt.subplots(1, 2, figsize=(10, 4.8))
for q, ax in enumerate(axes):
    redraws = true3[q] + 0.02 * rng.standard_normal((400, 3))
    cloud = advcal.grpo(redraws) @ basis
    ax.scatter(cloud[:, 0], cloud[:, 1], s=4, alpha=0.4, color="gray", label="T(r') re-scorings")
    for shape, color in zip(SHAPES, ("C0", "C1"), strict=True):
        sets = built[shape]
        center = sets.centers[q] @ basis
        vals, vecs = np.linalg.eigh(basis.T @ sets.shapes[q] @ basis)
        half_axes = np.sqrt(np.clip(vals, 0, None))[:, None] * circle
        boundary = center[:, None] + sets.rho * vecs @ half_axes
        ax.plot(boundary[0], boundary[1], color=color, label=f"{shape} set")
        ax.plot(*center, "k+")
    ax.set_aspect("equal")
    ax.set(title=f"true rewards {true3[q].round(2).tolist()}")
    ax.legend(loc="lower left", fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The property
#
# Both shapes cover $T(r')$ at the nominal level within the finite-sample tolerance for every
# noise level and $\alpha$, and at the smallest noise level — where linearization holds — the
# joint shape has the smaller mean log-volume at that equal coverage.

# %%
failures = [r for r in rows if not r["ok"]]
assert not failures, f"coverage outside the finite-sample tolerance: {failures}"
quiet = min(NOISE)
for alpha in ALPHAS:
    joint, ball = (next(r for r in rows if r["sigma_g"] == quiet and r["alpha"] == alpha
                        and r["shape"] == shape)["log_volume"] for shape in SHAPES)
    assert joint < ball, (alpha, joint, ball)
    print(f"alpha={alpha}: sigma_g={quiet}: joint log-volume {joint:.2f} < ball {ball:.2f}")
print(f"{len(rows)} coverage checks inside the tolerance")
