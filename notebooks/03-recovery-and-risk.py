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
# # GGSR recovery ratios and SRGO risk control
#
# SetGRPO's last two steps work on the JRSC set $E_q$ of each training group and the Gram matrix
# $K_q$ of its responses' policy gradients:
#
# * **GGSR** finds the anchor $a_0 = \arg\min_{a \in E} a^\top K a$ and the largest recovery
#   ratio $\eta^* \in [0, 1]$ along $a(\eta) = a_0 + \eta (c - a_0)$ such that the worst-case
#   projection $M_{full}(\eta)$ of the update onto every member of the set stays $\ge \tau$
#   (and the reward-space projection stays positive). Groups with an empty feasible set are
#   rejected. A stricter $\tau$ never raises $\eta^*$.
# * **SRGO** picks the threshold $\tau$ on independent calibration groups with a reference
#   scoring: among the thresholds whose upper confidence bound (UCB) on the conditional
#   *direction-reversal* risk — accepted and $a(\eta^*)^\top K a_{ref} < 0$ — is at most
#   $\beta$, simultaneously over the grid at confidence $1-\delta$, it takes the one with the
#   most recovery.
#
# The guarantee checked at the end: over repeated calibrations, the true conditional reversal risk
# at the selected threshold exceeds $\beta$ in at most a fraction $\delta$ of them.
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
from advcal.simulate import gram_matrices, paired_scorings

SIZE = os.environ.get("ADVCAL_NOTEBOOK_SIZE", "full")
if SIZE not in ("reduced", "full"):
    raise ValueError(f"ADVCAL_NOTEBOOK_SIZE must be 'reduced' or 'full'; got {SIZE!r}.")
FULL = SIZE == "full"
print(f"advcal {advcal.__version__}, size: {SIZE}")

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
print(f"JRSC radius rho = {calibration.rho:.3f} from {calibration.m} groups")

# %% [markdown]
# ## GGSR on a training batch
#
# Recovery at every threshold of the grid: the acceptance rate and the mean recovery ratio fall
# as $\tau$ grows, and every accepted group meets its threshold.

# %%
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
plt.show()

# %% [markdown]
# ## SRGO: the risk/threshold curve
#
# On independent calibration groups with a reference scoring (the GRPO coefficients of a second,
# independent grading), `select_threshold` tabulates per threshold the accepted groups, the
# reversals among them, the empirical conditional risk and its Clopper–Pearson UCB. With
# Bonferroni the UCBs are valid simultaneously over the grid whatever the shape of the risk curve;
# the fixed-sequence procedure tests from the strictest non-vacuous threshold towards looser ones
# and stops at the first failure — here the strict thresholds accept few groups *and* have the
# higher risk, so it certifies nothing. The UCB at the loose thresholds sits close to $\beta$
# for this many calibration groups: with fewer, some calibrations certify no threshold at all
# (the repeats below use half as many), which rejects every group — the price of the
# guarantee.

# %%
risk_data, risk_gram = groups(N_RISK)
risk_sets = advcal.coefficient_sets(risk_data.a, calibration=calibration)
reference = advcal.grpo(risk_data.b)
selection = advcal.select_threshold(risk_sets, risk_gram, reference, thresholds=GRID, beta=BETA,
                                    delta=DELTA, procedure="bonferroni")
sequential = advcal.select_threshold(risk_sets, risk_gram, reference, thresholds=GRID,
                                     beta=BETA, delta=DELTA, procedure="fixed-sequence")
print(f"{'tau':>5} {'n_acc':>6} {'k_rev':>6} {'risk':>7} {'UCB':>7} {'recovery':>9} feasible")
for row in zip(selection.tau, selection.n_acc, selection.k_rev, selection.risk, selection.ucb,
               selection.recovery, selection.feasible, strict=True):
    print("{:5.2f} {:6d} {:6d} {:7.4f} {:7.4f} {:9.1f} {}".format(*row))
print(f"Bonferroni: tau_sel = {selection.tau_sel}; "
      f"fixed sequence: tau_sel = {sequential.tau_sel}")

# %%
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
plt.show()

# %% [markdown]
# ## One SetGRPO step
#
# `setgrpo` runs sets, recovery and the selected threshold on a training batch and returns the
# coefficients to write into the GRPO loss in place of the advantages (0 for rejected groups).

# %%
step = advcal.setgrpo(train.a, gram=train_gram, calibration=calibration, tau=selection)
kept = step.accepted
print(f"tau = {selection.tau_sel}: accepted {kept.mean():.3f} of the groups")
if kept.any():
    cosine = advcal.direction_cosine(step.coefficients[kept], advcal.grpo(train.a)[kept])
    print(f"mean eta* {step.eta[kept].mean():.3f}, cosine with the GRPO coefficients on "
          f"accepted groups {cosine:.3f}")
assert (step.coefficients[~kept] == 0).all()

# %% [markdown]
# ## The property: risk control over repeated calibrations
#
# Each repeat draws fresh calibration groups, selects $\tau$, and looks up the true conditional
# risk at that $\tau$ (estimated on the large fresh test set above). The fraction of repeats whose
# selected threshold has risk above $\beta$ must not exceed $\delta$ (binomial tolerance over the
# repeats); a repeat that certifies nothing rejects every group and cannot fail.

# %%
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
assert (np.diff(accepted.astype(int), axis=0) <= 0).all()
