"""Write advcal's coverage notebooks (without outputs) from the cell sources in this file.

The notebooks are generated rather than edited by hand so that their code is reviewable as
plain Python and so that they are committed without outputs.  After editing a cell here, run

    .venv/bin/python notebooks/make_notebooks.py

``tests/test_notebooks.py`` checks that the committed ``.ipynb`` files equal what this script
writes, that they carry no outputs, and executes each of them at reduced size.

Every notebook reads ``ADVCAL_NOTEBOOK_SIZE`` (``reduced`` for CI, ``full`` by default, for a
run by hand), plots with matplotlib, and ends with an ``assert`` of the property it shows, so a
broken guarantee fails CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}

def setup(*imports: str) -> str:
    """The first code cell of every notebook: imports and the size switch."""
    extra = "".join(f"\n{line}" for line in imports)
    return f'''\
import os

import matplotlib.pyplot as plt
import numpy as np

import advcal{extra}

SIZE = os.environ.get("ADVCAL_NOTEBOOK_SIZE", "full")
if SIZE not in ("reduced", "full"):
    raise ValueError(f"ADVCAL_NOTEBOOK_SIZE must be 'reduced' or 'full'; got {{SIZE!r}}.")
FULL = SIZE == "full"
print(f"advcal {{advcal.__version__}}, size: {{SIZE}}")'''


SIZE_NOTE = (
    "Set the environment variable `ADVCAL_NOTEBOOK_SIZE=reduced` for the quick run that CI "
    "executes (the documentation site shows that run); the default, `full`, is the size the "
    "figures were designed for."
)

# --------------------------------------------------------------------------------------------
# 1. Split-conformal and conformal-range coverage
# --------------------------------------------------------------------------------------------

CONFORMAL = [
    ("md", f"""\
# Split-conformal coverage vs α and m

A split-conformal quantile of $m$ calibration scores at level $\\alpha$ is the $k$-th smallest
score with $k = \\lceil (m+1)(1-\\alpha) \\rceil$, and $+\\infty$ when $k > m$. For exchangeable
scores without ties a fresh score falls at or below it with probability exactly
$\\min(k, m+1)/(m+1)$, so

$$1 - \\alpha \\;\\le\\; P(\\text{{cover}}) \\;\\le\\; 1 - \\alpha + \\frac{{1}}{{m+1}}.$$

This notebook checks that band by simulation for `advcal.conformal_quantile` and for the
conformal reward ranges of `advcal.calibrate_ranges` (Range-GRPO), over several $\\alpha$ and
$m$, with binomial tolerances computed from the number of trials.

{SIZE_NOTE}"""),
    ("code", setup() + '''
rng = np.random.default_rng(20261130)
ALPHAS = [0.05, 0.1, 0.2, 0.3] if FULL else [0.1, 0.3]
SIZES = [9, 19, 49, 99] if FULL else [9, 49]
TRIALS = 4000 if FULL else 1500
Z = 4.0  # tolerance in binomial standard errors, for a family of a few dozen checks'''),
    ("md", """\
## The rank, without float overshoot

$(m+1)(1-\\alpha)$ in floating point can land just above an integer, and the ceiling then
jumps one rank too far. advcal snaps values within $10^{-9}$ of an integer, so $\\alpha$ means
the decimal you wrote:"""),
    ("code", '''\
import math

for m, alpha in [(9, 0.7), (74, 1 - 0.68)]:
    naive = math.ceil((m + 1) * (1 - alpha))
    print(f"m={m:3d} alpha={alpha:.2f}: advcal k={advcal.conformal_rank(m, alpha)}, "
          f"naive float k={naive}")'''),
    ("md", """\
## Coverage of the conformal quantile

Each trial draws $m+1$ exchangeable scores (exponential, so no ties), calibrates on the first
$m$ and tests the last. The exact coverage is $\\min(k, m+1)/(m+1)$; with $k > m$ the quantile is
$+\\infty$ and every trial is covered."""),
    ("code", '''\
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
          f"{'ok' if r['ok'] else 'FAIL'}")'''),
    ("code", '''\
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
plt.show()'''),
    ("md", """\
## Conformal reward ranges from an LLM judge

Range-GRPO calibrates a judge against reference rewards on a labeled set, then turns judge
scores of unlabeled responses into ranges $[l, h]$ clipped to the reward bounds. The simulated
judge draws $k = 5$ noisy samples around the reference reward with a per-response noise level
(some responses are hard to judge): its score is their mean, its difficulty $\\hat\\sigma$ their
spread, and its quantiles their 10% / 90% quantiles.

* `absolute`: score $|y - s|$, range $s \\pm \\hat q$;
* `normalized`: score $|y - s| / \\hat\\sigma$, range $s \\pm \\hat q\\,\\hat\\sigma$ (adapts to
  difficulty);
* `cqr`: score $\\max(\\hat s_{lo} - y,\\, y - \\hat s_{hi})$, range
  $[\\hat s_{lo} - \\hat q,\\, \\hat s_{hi} + \\hat q]$.

Each method's coverage of a fresh response has the same exact value $\\min(k, m+1)/(m+1)$
(the scores are continuous, and clipping to the bounds never uncovers a reward that lies in
them)."""),
    ("code", '''\
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
          f"{'ok' if r['ok'] else 'FAIL'}")'''),
    ("code", '''\
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
plt.show()'''),
    ("md", """\
## The property

Every empirical coverage — of the quantile and of each range method, for every $\\alpha$ and
$m$ — lies within the binomial tolerance of the exact finite-sample coverage, and so within
the band $[1-\\alpha, 1-\\alpha+1/(m+1)]$ up to that tolerance."""),
    ("code", '''\
failures = [r for r in quantile_rows + range_rows if not r["ok"]]
assert not failures, f"coverage outside the finite-sample band: {failures}"
for r in quantile_rows + range_rows:
    lo, hi = band(r["m"], r["alpha"])
    assert lo - r["tol"] - 1e-12 <= r["empirical"] <= hi + r["tol"] + 1e-12
print(f"{len(quantile_rows) + len(range_rows)} coverage checks inside the finite-sample band")'''),
]
# --------------------------------------------------------------------------------------------
# 2. JRSC ellipsoid coverage, joint vs isotropic shape
# --------------------------------------------------------------------------------------------

JRSC = [
    ("md", f"""\
# JRSC: coverage and volume of joint vs isotropic coefficient sets

Joint reward-set calibration turns a group's GRPO coefficients $c = T(r)$ into an ellipsoid
$E_q = \\{{c + S_q^{{1/2}} z : \\|z\\| \\le \\rho\\}}$ that holds the coefficients $T(r')$ of an
independent re-scoring $r'$ with probability at least $1-\\alpha$. The radius $\\rho$ is the
split-conformal quantile of the calibration scores $d_q = \\sqrt{{\\delta^\\top S_q^+ \\delta}}$,
$\\delta = T(r') - T(r)$, so for exchangeable groups the coverage lies in the finite-sample band
$[1-\\alpha,\\, 1-\\alpha+1/(m+1)]$ **whatever the shape** $S_q$. The shape only decides the
volume:

* `shape="joint"`: $S_q = J \\Sigma_r J^\\top + \\lambda_q \\hat u \\hat u^\\top$, the linearized
  grader noise pushed through the Jacobian of the GRPO map, plus a radial term;
* `shape="isotropic"`: $S_q = C$, one Euclidean ball for every group (the ablation baseline).

The joint shape pays off where linearization holds — grader noise small against the
within-group spread — and loses its edge as the noise grows. The grader here is
heteroscedastic (`advcal.simulate.paired_scorings(noise="heteroscedastic")`), groups of 8.

{SIZE_NOTE}"""),
    ("code", setup("from advcal.simulate import paired_scorings") + """

seeds = np.random.SeedSequence(20261130)
GROUP = 8
NOISE = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2] if FULL else [0.01, 0.05]
ALPHAS = [0.1, 0.2] if FULL else [0.1]
M, TEST, REPEATS = (1000, 4000, 20) if FULL else (500, 1000, 4)
SHAPES = ("joint", "isotropic")
Z = 4.0"""),
    ("md", """\
## Coverage and volume

Each repeat calibrates on $m$ fresh groups and tests on fresh groups. Given the calibration,
the coverage of a test group is Beta$(k, m+1-k)$-distributed around its exact mean $k/(m+1)$
(continuous scores), so the tolerance of the mean over repeats combines that spread with the
binomial spread of the test groups."""),
    ("code", """\
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
          f"{'ok' if r['ok'] else 'FAIL'}")"""),
    ("code", """\
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
plt.show()"""),
    ("md", """\
## What the two shapes look like

For groups of three responses the centered subspace is a plane, so the sets are discs and
ellipses. GRPO coefficients lie on a circle of radius $\\sqrt{n-1}$ there (normalization removes
scale), and grader noise moves them along it by about $\\sigma_g / s_q$: a lot for a
low-spread group, little for a high-spread one. The joint set follows that group by group; the
isotropic ball has one radius for all groups, calibrated to cover them on average, so it is
far too large for high-spread groups. Below: two groups (true rewards 0.1/0.5/0.9 and
0.40/0.50/0.62), the coefficients of 400 independent re-scorings of each, and both sets."""),
    ("code", """\
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
plt.show()"""),
    ("md", """\
## The property

Both shapes cover $T(r')$ at the nominal level within the finite-sample tolerance for every
noise level and $\\alpha$, and at the smallest noise level — where linearization holds — the
joint shape has the smaller mean log-volume at that equal coverage."""),
    ("code", """\
failures = [r for r in rows if not r["ok"]]
assert not failures, f"coverage outside the finite-sample tolerance: {failures}"
quiet = min(NOISE)
for alpha in ALPHAS:
    joint, ball = (next(r for r in rows if r["sigma_g"] == quiet and r["alpha"] == alpha
                        and r["shape"] == shape)["log_volume"] for shape in SHAPES)
    assert joint < ball, (alpha, joint, ball)
    print(f"alpha={alpha}: sigma_g={quiet}: joint log-volume {joint:.2f} < ball {ball:.2f}")
print(f"{len(rows)} coverage checks inside the tolerance")"""),
]

# --------------------------------------------------------------------------------------------
# 3. GGSR recovery ratios and SRGO risk control
# --------------------------------------------------------------------------------------------

RECOVERY = [
    ("md", f"""\
# GGSR recovery ratios and SRGO risk control

SetGRPO's last two steps work on the JRSC set $E_q$ of each training group and the Gram matrix
$K_q$ of its responses' policy gradients:

* **GGSR** finds the anchor $a_0 = \\arg\\min_{{a \\in E}} a^\\top K a$ and the largest recovery
  ratio $\\eta^* \\in [0, 1]$ along $a(\\eta) = a_0 + \\eta (c - a_0)$ such that the worst-case
  projection $M_{{full}}(\\eta)$ of the update onto every member of the set stays $\\ge \\tau$
  (and the reward-space projection stays positive). Groups with an empty feasible set are
  rejected. A stricter $\\tau$ never raises $\\eta^*$.
* **SRGO** picks the threshold $\\tau$ on independent calibration groups with a reference
  scoring: among the thresholds whose upper confidence bound (UCB) on the conditional
  *direction-reversal* risk — accepted and $a(\\eta^*)^\\top K a_{{ref}} < 0$ — is at most
  $\\beta$, simultaneously over the grid at confidence $1-\\delta$, it takes the one with the
  most recovery.

The guarantee checked at the end: over repeated calibrations, the true conditional reversal risk
at the selected threshold exceeds $\\beta$ in at most a fraction $\\delta$ of them.

{SIZE_NOTE}"""),
    ("code", setup("from advcal.simulate import gram_matrices, paired_scorings") + """

seeds = np.random.SeedSequence(20261130)
GROUP, NOISE = 8, dict(noise="heteroscedastic", scale=0.07)
ALPHA, BETA, DELTA = 0.2, 0.08, 0.1
GRID = np.round(np.arange(0.0, 0.51, 0.05), 2)
M_SETS, N_TRAIN, N_TEST = (4000, 4000, 50000) if FULL else (2000, 2000, 10000)
N_RISK, REPEATS = (8000, 200) if FULL else (4000, 30)  # risk calibration; repeats use half
Z = 4.0


def groups(n):
    # Paired scorings of n fresh groups and their Gram matrices under the current policy.
    score_seed, gram_seed = seeds.spawn(2)
    data = paired_scorings(n, GROUP, seed=score_seed, **NOISE)
    return data, gram_matrices(n, GROUP, seed=gram_seed).gram


calib_data, _ = groups(M_SETS)
calibration = advcal.calibrate_sets(calib_data.a, calib_data.b, alpha=ALPHA)
print(f"JRSC radius rho = {calibration.rho:.3f} from {calibration.m} groups")"""),
    ("md", """\
## GGSR on a training batch

Recovery at every threshold of the grid: the acceptance rate and the mean recovery ratio fall
as $\\tau$ grows, and every accepted group meets its threshold."""),
    ("code", """\
train, train_gram = groups(N_TRAIN)
train_sets = advcal.coefficient_sets(train.a, calibration=calibration)
recoveries = {float(tau): advcal.recover(train_sets, train_gram, tau=float(tau)) for tau in GRID}
eta = np.stack([recoveries[float(tau)].eta for tau in GRID])        # (T, B), GRID ascending
accepted = np.stack([recoveries[float(tau)].accepted for tau in GRID])
for tau in GRID:
    rec = recoveries[float(tau)]
    assert (rec.m_full[rec.accepted] >= tau - 1e-9).all()
print(f"{'tau':>5} {'accepted':>9} {'mean eta*':>10}")
for tau, acc, e in zip(GRID, accepted.mean(axis=1), eta.mean(axis=1), strict=True):
    print(f"{tau:5.2f} {acc:9.3f} {e:10.3f}")

fig, (ax_acc, ax_hist) = plt.subplots(1, 2, figsize=(10, 3.5))
ax_acc.plot(GRID, accepted.mean(axis=1), marker="o", label="accepted fraction")
ax_acc.plot(GRID, eta.mean(axis=1), marker="s", label="mean eta* (0 if rejected)")
ax_acc.set(xlabel="threshold tau", title="GGSR vs threshold")
ax_acc.legend()
for tau in GRID[::2]:
    rec = recoveries[float(tau)]
    ax_hist.hist(rec.eta[rec.accepted], bins=np.linspace(0, 1, 21), histtype="step",
                 label=f"tau = {tau:.1f}")
ax_hist.set(xlabel="eta* of accepted groups", ylabel="groups", title="recovery ratios")
ax_hist.legend(fontsize=8)
fig.tight_layout()
plt.show()"""),
    ("md", """\
## SRGO: the risk/threshold curve

On independent calibration groups with a reference scoring (the GRPO coefficients of a second,
independent grading), `select_threshold` tabulates per threshold the accepted groups, the
reversals among them, the empirical conditional risk and its Clopper–Pearson UCB. With
Bonferroni the UCBs are valid simultaneously over the grid whatever the shape of the risk curve;
the fixed-sequence procedure tests from the strictest non-vacuous threshold towards looser ones
and stops at the first failure — here the strict thresholds accept few groups *and* have the
higher risk, so it certifies nothing. The UCB at the loose thresholds sits close to $\\beta$
for this many calibration groups: with fewer, some calibrations certify no threshold at all
(the repeats below use half as many), which rejects every group — the price of the
guarantee."""),
    ("code", """\
risk_data, risk_gram = groups(N_RISK)
risk_sets = advcal.coefficient_sets(risk_data.a, calibration=calibration)
reference = advcal.grpo(risk_data.b)
selection = advcal.select_threshold(risk_sets, risk_gram, reference, thresholds=GRID, beta=BETA,
                                    delta=DELTA)
sequential = advcal.select_threshold(risk_sets, risk_gram, reference, thresholds=GRID,
                                     beta=BETA, delta=DELTA, procedure="fixed-sequence")
print(f"{'tau':>5} {'n_acc':>6} {'k_rev':>6} {'risk':>7} {'UCB':>7} {'recovery':>9} feasible")
for row in zip(selection.tau, selection.n_acc, selection.k_rev, selection.risk, selection.ucb,
               selection.recovery, selection.feasible, strict=True):
    print("{:5.2f} {:6d} {:6d} {:7.4f} {:7.4f} {:9.1f} {}".format(*row))
print(f"Bonferroni: tau_sel = {selection.tau_sel}; "
      f"fixed sequence: tau_sel = {sequential.tau_sel}")"""),
    ("code", """\
test_data, test_gram = groups(N_TEST)
test_sets = advcal.coefficient_sets(test_data.a, calibration=calibration)
truth = advcal.select_threshold(test_sets, test_gram, advcal.grpo(test_data.b), thresholds=GRID,
                                beta=BETA, delta=DELTA)
true_risk = dict(zip(truth.tau.tolist(), truth.risk.tolist(), strict=True))

fig, ax = plt.subplots(figsize=(6, 3.8))
ax.plot(selection.tau, selection.risk, marker="o", label="empirical risk (calibration)")
ax.plot(selection.tau, selection.ucb, marker="^", label=f"UCB (Bonferroni, delta={DELTA})")
ax.plot(truth.tau, truth.risk, color="k", lw=1, ls="--", label=f"risk on {N_TEST} fresh groups")
ax.axhline(BETA, color="C3", lw=1, label="beta")
if selection.tau_sel is not None:
    ax.axvline(selection.tau_sel, color="C2", lw=1, ls=":", label="selected tau")
ax.set(xlabel="threshold tau", ylabel="conditional reversal risk", ylim=(0, 0.4))
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()"""),
    ("md", """\
## One SetGRPO step

`setgrpo` runs sets, recovery and the selected threshold on a training batch and returns the
coefficients to write into the GRPO loss in place of the advantages (0 for rejected groups)."""),
    ("code", """\
step = advcal.setgrpo(train.a, gram=train_gram, calibration=calibration, tau=selection)
kept = step.accepted
print(f"tau = {selection.tau_sel}: accepted {kept.mean():.3f} of the groups")
if kept.any():
    cosine = advcal.direction_cosine(step.coefficients[kept], advcal.grpo(train.a)[kept])
    print(f"mean eta* {step.eta[kept].mean():.3f}, cosine with the GRPO coefficients on "
          f"accepted groups {cosine:.3f}")
assert (step.coefficients[~kept] == 0).all()"""),
    ("md", """\
## The property: risk control over repeated calibrations

Each repeat draws fresh calibration groups, selects $\\tau$, and looks up the true conditional
risk at that $\\tau$ (estimated on the large fresh test set above). The fraction of repeats whose
selected threshold has risk above $\\beta$ must not exceed $\\delta$ (binomial tolerance over the
repeats); a repeat that certifies nothing rejects every group and cannot fail."""),
    ("code", """\
failures, selected = 0, []
for _ in range(REPEATS):
    data, gram = groups(N_RISK // 2)
    sets = advcal.coefficient_sets(data.a, calibration=calibration)
    choice = advcal.select_threshold(sets, gram, advcal.grpo(data.b), thresholds=GRID,
                                     beta=BETA, delta=DELTA)
    selected.append(choice.tau_sel)
    if choice.tau_sel is not None and true_risk[choice.tau_sel] > BETA:
        failures += 1
rate = failures / REPEATS
tolerance = Z * np.sqrt(DELTA * (1 - DELTA) / REPEATS)
print(f"selected thresholds: { {t: selected.count(t) for t in sorted(set(selected), key=str)} }")
print(f"risk above beta in {failures}/{REPEATS} repeats ({rate:.3f}); "
      f"allowed delta = {DELTA} (+ {tolerance:.3f})")
assert rate <= DELTA + tolerance
assert (np.diff(eta, axis=0) <= 1e-9).all(), "a stricter tau raised some eta*"
assert (np.diff(accepted.astype(int), axis=0) <= 0).all()"""),
]


# --------------------------------------------------------------------------------------------
# 4. GRPO vs RLOO vs MaxNorm: scale pathologies on low-variance groups
# --------------------------------------------------------------------------------------------

SCALE = [
    ("md", f"""\
# Scale pathologies: GRPO vs RLOO vs MaxNorm-AC on low-variance groups

The within-group denominator $s_q$ of a group-relative estimator sets three things at once: the
strength of the reward branch, the weight $1/s_q$ of prompt $q$ in the batch, and the effective
KL coefficient $\\beta_{{\\mathrm{{eff}},q}} = \\beta\\, s_q$ on the cardinal reward scale.

* **GRPO** divides by $\\sigma_q + \\varepsilon$: on a group whose rewards differ only by
  sub-resolution jitter, $1/s_q$ explodes and the jitter becomes an $O(1)$ advantage.
* **RLOO / Dr.GRPO** do not divide: a credible but small gap gives an $O(\\text{{gap}})$ signal
  that the KL term dominates.
* **MaxNorm-AC** divides by $s_q = \\max(\\max_i |u_i|, \\tau_{{res}})$ after the Reward-Resolution
  Protocol (binning to the resolution, zero-gap skipping): $|w| \\le 1$,
  $1/s_q \\le 1/\\tau_{{res}}$ and $\\beta_{{\\mathrm{{eff}},q}} \\ge \\beta\\,\\tau_{{res}}$ by
  construction.

The simulated verifier-style batch mixes three kinds of groups: binary pass/fail groups, groups
with a credible small gap (some responses 0.05 above the rest), and groups whose true rewards
are all equal. A grader adds Gaussian jitter of standard deviation `jitter` to the graded
(non-binary) groups. `advcal.scale_diagnostics` measures the inverse-scale tails,
$\\beta_{{\\mathrm{{eff}}}}$, the reward-to-KL ratio and the direction cosine between the weights
of the jittered and the clean rewards.

{SIZE_NOTE}"""),
    ("code", setup() + """
rng = np.random.default_rng(4)
B, G = (16384, 8) if FULL else (2048, 8)
TAU_RES, RESOLUTION, BETA = 0.01, 0.01, 0.04
METHODS = ("grpo", "rloo", "maxnorm")

kind = rng.choice(["binary", "small gap", "constant"], size=B, p=[0.4, 0.3, 0.3])
level = np.round(rng.choice(np.arange(0.2, 0.85, 0.05), size=B), 2)
p_pass = rng.uniform(0.1, 0.9, size=B)
clean = np.where(
    (kind == "binary")[:, None],
    (rng.random((B, G)) < p_pass[:, None]).astype(float),
    level[:, None] + np.where((kind == "small gap")[:, None], 0.05 * (rng.random((B, G)) < 0.3),
                              0.0),
)


def jittered(sd):
    noise = sd * rng.standard_normal((B, G))
    noise[kind == "binary"] = 0.0  # a verifier's pass/fail is exact
    return np.clip(clean + noise, 0.0, 1.0)


print({k: int((kind == k).sum()) for k in ("binary", "small gap", "constant")})"""),
    ("md", """\
## The diagnostics table at the grader's jitter

With jitter of standard deviation $10^{-4}$ (far below the resolution $\\delta = 0.01$):"""),
    ("code", """\
JITTER = 1e-4
noisy = jittered(JITTER)
diag = advcal.scale_diagnostics(noisy, methods=METHODS, beta=BETA, tau_res=TAU_RES,
                                resolution=RESOLUTION, reference=clean)
print(diag)"""),
    ("code", """\
fig, (ax_inv, ax_beta) = plt.subplots(1, 2, figsize=(11, 3.6))
bins = np.logspace(-1, 6, 71)
for method in METHODS:
    inverse = diag[method].inverse_scale
    ax_inv.hist(inverse, bins=bins, histtype="step", lw=1.5, label=method)
    ax_beta.hist(BETA / inverse, bins=np.logspace(-8, -0.5, 61), histtype="step", lw=1.5,
                 label=method)
ax_inv.axvline(1 / TAU_RES, color="k", ls="--", lw=1, label="1/tau_res")
ax_inv.set(xscale="log", yscale="log", xlabel="inverse scale 1/s_q", ylabel="groups",
           title="prompt weight in the batch")
ax_beta.axvline(BETA * TAU_RES, color="k", ls="--", lw=1, label="beta * tau_res")
ax_beta.set(xscale="log", yscale="log", xlabel="beta_eff = beta * s_q", ylabel="groups",
            title="effective KL coefficient")
ax_inv.legend()
ax_beta.legend()
fig.tight_layout()
plt.show()"""),
    ("md", """\
## Where the weight goes

GRPO gives the groups whose true rewards are all equal — pure jitter — as much weight as the
informative ones; MaxNorm's binning makes them zero-gap and skips them; RLOO gives them
weights of the jitter's size, but also gives the credible small gaps a weight of the gap's
size."""),
    ("code", """\
weights = {
    "grpo": advcal.grpo(noisy),
    "rloo": advcal.rloo(noisy),
    "maxnorm": advcal.maxnorm(noisy, tau_res=TAU_RES, resolution=RESOLUTION),
}
print(f"{'method':<9}" + "".join(f"{k:>14}" for k in ("binary", "small gap", "constant")))
for method, w in weights.items():
    means = [np.abs(w[kind == k]).mean() for k in ("binary", "small gap", "constant")]
    print(f"{method:<9}" + "".join(f"{m:>14.3g}" for m in means))"""),
    ("md", """\
## Direction cosine under grader jitter

The cosine between the batch weights of the jittered and of the clean rewards, as the jitter
grows towards the resolution: GRPO loses direction first, because it amplifies whatever spread
a constant group has; MaxNorm holds until the jitter crosses bin boundaries. RLOO keeps the
direction too — its failure is the other one: the table above shows that it gives a credible
0.05 gap a weight of the gap's size, which the KL term dominates."""),
    ("code", """\
jitters = np.logspace(-5, np.log10(3e-3), 9 if FULL else 5)
cosines = {method: [] for method in METHODS}
for sd in jitters:
    d = advcal.scale_diagnostics(jittered(sd), methods=METHODS, beta=BETA, tau_res=TAU_RES,
                                 resolution=RESOLUTION, reference=clean)
    for method in METHODS:
        cosines[method].append(d[method].direction_cosine)

fig, ax = plt.subplots(figsize=(5.5, 3.6))
for method in METHODS:
    ax.plot(jitters, cosines[method], marker="o", label=method)
ax.axvline(RESOLUTION / 2, color="k", ls=":", lw=1, label="half the resolution")
ax.set(xscale="log", xlabel="grader jitter sd", ylabel="direction cosine (jittered vs clean)",
       ylim=(0, 1.02))
ax.legend()
fig.tight_layout()
plt.show()
for method in METHODS:
    print(f"{method:<8}" + " ".join(f"{c:6.3f}" for c in cosines[method]))"""),
    ("md", """\
## The property

MaxNorm-AC's guarantees hold on every group ($|w| \\le 1$, $1/s_q \\le 1/\\tau_{res}$,
$\\beta_{\\mathrm{eff},q} \\ge \\beta\\tau_{res}$), while GRPO's inverse-scale tail on this batch
is orders of magnitude above MaxNorm's hard cap and its direction under jitter is worse."""),
    ("code", """\
mx, gr = diag["maxnorm"], diag["grpo"]
assert mx.max_abs_weight <= 1.0
assert np.abs(weights["maxnorm"]).max() <= 1.0
assert mx.inverse_scale_max <= 1 / TAU_RES
assert mx.beta_eff_min >= BETA * TAU_RES * (1 - 1e-12)
assert gr.inverse_scale_p99 >= 10 / TAU_RES, "GRPO's tail should dwarf MaxNorm's cap"
assert mx.direction_cosine > gr.direction_cosine
print(f"GRPO 1/s P99 = {gr.inverse_scale_p99:.3g} vs MaxNorm cap {1 / TAU_RES:g}; "
      f"cosine GRPO {gr.direction_cosine:.3f} vs MaxNorm {mx.direction_cosine:.3f}")"""),
]


NOTEBOOKS: dict[str, list[tuple[str, str]]] = {
    "01-conformal-coverage.ipynb": CONFORMAL,
    "02-jrsc-coverage.ipynb": JRSC,
    "03-recovery-and-risk.ipynb": RECOVERY,
    "04-scale-pathologies.ipynb": SCALE,
}


def build(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook without outputs, with deterministic cell ids (stable diffs)."""
    nb = new_notebook(metadata={"kernelspec": KERNELSPEC, "language_info": {"name": "python"}})
    for index, (kind, source) in enumerate(cells):
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        cell["id"] = f"cell-{index:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(cells: list[tuple[str, str]]) -> str:
    return nbformat.writes(build(cells)) + "\n"


def main(out_dir: Path = HERE) -> list[Path]:
    written = []
    for name, cells in NOTEBOOKS.items():
        path = out_dir / name
        path.write_text(render(cells), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(f"wrote {path}")
