"""GGSR's core on checked arguments: the one door through which :func:`advcal.recover`,
SRGO (``advcal.risk``), the analyses and the trainer integrations run the recovery engines.

Callers validate once (``check_sets``, ``gram_blocks``, ``ablation_iv``) and then call
``run_recovery`` for a grid of thresholds (``advcal.recovery.recover_checked`` for one).
The math is described in ``advcal.recovery`` and ``docs/setgrpo.md``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from advcal._blocks import (
    block_offsets,
    consecutive,
    gather_blocks,
    gather_rows,
    scatter_blocks,
    segment_sum,
    size_classes,
)
from advcal._kernels import engine
from advcal._kernels.ggsr import (
    GRAM_RTOL,
    NOT_FINITE,
    NOT_PSD,
    NOT_SYMMETRIC,
    OVERFLOW,
    ZERO_CENTER_RTOL,
)
from advcal._validation import as_float_array, check_choice
from advcal.sets import CoefficientSets

#: Which groups an update keeps: ``"gate"`` (GGSR's recovery sets) or ``"matched-random"``
#: (the ablation: as many groups as the gate accepts, drawn at random, with η = 1).
DISCARDS = ("gate", "matched-random")


class RawRecovery(NamedTuple):
    """Kernel outputs for several thresholds (flat, grouped order)."""

    anchors: np.ndarray
    eta: np.ndarray  # (B, T)
    accepted: np.ndarray  # (B, T)
    m_full: np.ndarray
    m_reward: np.ndarray
    ref0: np.ndarray  # a0ᵀ K a_ref
    ref1: np.ndarray  # (c − a0)ᵀ K a_ref


def check_sets(sets: Any) -> CoefficientSets:
    if not isinstance(sets, CoefficientSets):
        raise TypeError("`sets` must be CoefficientSets from coefficient_sets; "
                        f"got {type(sets).__name__}.")
    return sets


def gram_blocks(sets: CoefficientSets, gram: Any) -> np.ndarray:
    """Validate the layout of ``gram`` against ``sets``; return flat float64 blocks, each
    divided by its largest diagonal entry (recovery is invariant to a positive scale of K,
    and unit scale keeps 1e±300 inputs from overflowing or underflowing)."""
    arr = as_float_array(gram, "gram")
    sizes = sets.batch.sizes
    if sets.batch.shape is not None:
        n_groups, width = sets.batch.shape
        expected: tuple[int, ...] = (n_groups, width, width)
    else:
        expected = (int(block_offsets(sizes)[-1]),)
    if arr.shape != expected:
        layout = "(B, G, G)" if len(expected) == 3 else "flat row-major n_q x n_q blocks"
        raise ValueError(f"`gram` must have shape {expected} ({layout}); got {arr.shape}.")
    flat = np.array(arr, dtype=np.float64).reshape(-1)
    if sets.batch.shape is not None:
        n = sets.batch.shape[1]
        if n:
            _normalize_blocks(flat.reshape(-1, n * n), n)  # a view: one pass, no gather
        return flat
    boffsets = block_offsets(sizes)
    for n, idx in size_classes(sizes):
        if n == 0:
            continue
        blocks = gather_blocks(flat, boffsets, idx, n).reshape(-1, n * n)
        _normalize_blocks(blocks, n)
        if not consecutive(idx):  # a copy, not a view of ``flat``
            scatter_blocks(flat, boffsets, idx, n, blocks)
    return flat


def _normalize_blocks(blocks: np.ndarray, n: int) -> None:
    """Divide each row (a flattened n x n block) by its largest diagonal entry, in place."""
    if blocks.size == 0:
        return
    with np.errstate(invalid="ignore"):
        top = blocks[:, :: n + 1].max(axis=1)
    blocks /= np.where(np.isfinite(top) & (top > 0), top, 1.0)[:, None]


class Ablation(NamedTuple):
    """Validated SetGRPO ablation switches (defaults: the full method)."""

    reward_condition: bool = True
    recovery: bool = True
    discard: str = "gate"
    seed: Any = None


FULL_METHOD = Ablation()


def _check_flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be True or False; got {value!r}.")
    return bool(value)


def ablation_iv(reward_condition: Any, recovery: Any, discard: Any, seed: Any) -> Ablation:
    reward_condition = _check_flag(reward_condition, "reward_condition")
    recovery = _check_flag(recovery, "recovery")
    check_choice(discard, "discard", DISCARDS)
    if discard == "matched-random":
        if seed is None:
            raise ValueError('`seed` is required with discard="matched-random" (the random '
                             "choice must be reproducible).")
        try:
            np.random.default_rng(seed)
        except (TypeError, ValueError) as err:
            raise TypeError("`seed` must be an int, SeedSequence or Generator; got "
                            f"{type(seed).__name__}.") from err
    elif seed is not None:
        raise ValueError('`seed` is only used with discard="matched-random".')
    return Ablation(reward_condition, recovery, discard, seed)


def _eligible(sets: CoefficientSets, gram_flat: np.ndarray) -> np.ndarray:
    """Groups with an update of their own, U(c) ≠ 0 (the engines' test; blocks have unit
    largest diagonal): the pool the matched random discard draws from."""
    centers = sets.geometry.centers
    offsets = sets.offsets
    ckc = segment_dot_gram(centers, centers, gram_flat, offsets, block_offsets(sets.batch.sizes))
    cc = segment_sum(centers * centers, offsets)
    return (np.diff(offsets) >= 2) & (cc > 0) & (ckc > ZERO_CENTER_RTOL * cc)


def _matched_random(sets: CoefficientSets, gram_flat: np.ndarray, raw: RawRecovery,
                    seed: Any) -> RawRecovery:
    """Per threshold, keep as many eligible groups as the gate accepted, drawn uniformly
    at random (one permutation for the whole grid, so the kept sets are nested), at η = 1
    (their GRPO coefficients c); projections are not evaluated (NaN)."""
    pool = np.flatnonzero(_eligible(sets, gram_flat))
    order = np.random.default_rng(seed).permutation(pool)
    counts = raw.accepted.sum(axis=0)
    accepted = np.zeros_like(raw.accepted)
    for t, count in enumerate(counts.tolist()):
        accepted[order[:count], t] = True
    nan = np.full(raw.m_full.shape, np.nan)
    return raw._replace(accepted=accepted, eta=accepted.astype(np.float64), m_full=nan,
                        m_reward=nan.copy())


def run_recovery(sets: CoefficientSets, gram_flat: np.ndarray, taus: np.ndarray,
                reference: np.ndarray | None, backend: str,
                 ablation: Ablation = FULL_METHOD) -> RawRecovery:
    """Run the engine for every threshold, raise on a bad Gram block, apply ``ablation``."""
    geo = sets.geometry
    offsets = sets.offsets
    boffsets = block_offsets(sets.batch.sizes)
    ref = np.zeros_like(geo.centers) if reference is None else reference
    infinite = not np.isfinite(sets.rho)
    rho = 1.0 if infinite else float(sets.rho)
    root = geo.root_blocks()
    # The numba engine picks one thread or several by the number of groups.
    status, anchors, eta, accepted, m_full, m_reward, ref0, ref1 = engine(
        "recovery", backend).recover_groups(geo.centers, offsets, root, gram_flat, boffsets,
                                            rho, taus, ref,
                                            reward_condition=ablation.reward_condition,
                                            binary=not ablation.recovery)
    bad = np.flatnonzero(status)
    if bad.size:
        q = int(bad[0])
        what = {NOT_SYMMETRIC: f"is not symmetric (tolerance {GRAM_RTOL:g} x max diagonal)",
                NOT_PSD: f"is not positive semidefinite (tolerance {GRAM_RTOL:g} x max "
                         "diagonal)",
                NOT_FINITE: "contains NaN or inf",
                OVERFLOW: "with the group's coefficient set overflows float64 (are the rewards "
                          "of this group constant with eps=0?)"}[int(status[q])]
        raise ValueError(f"`gram` block of group {q} {what}.")
    if infinite:
        # E is all of c + (centered subspace) ∋ 0, so the anchor's update is 0: reject all.
        anchors = np.zeros_like(anchors)
        eta = np.zeros_like(eta)
        accepted = np.zeros_like(accepted)
        m_full = np.full_like(m_full, np.nan)
        m_reward = np.full_like(m_reward, np.nan)
        ref0 = np.zeros_like(ref0)
        ref1 = segment_dot_gram(geo.centers, ref, gram_flat, offsets, boffsets)
    raw = RawRecovery(anchors, eta, accepted, m_full, m_reward, ref0, ref1)
    if ablation.discard == "matched-random":
        raw = _matched_random(sets, gram_flat, raw, ablation.seed)
    return raw


def segment_dot_gram(x: np.ndarray, y: np.ndarray, gram_flat: np.ndarray, offsets: np.ndarray,
                    boffsets: np.ndarray) -> np.ndarray:
    """xᵀ K y per group (flat blocks)."""
    sizes = np.diff(offsets)
    out = np.zeros(sizes.size)
    for n, idx in size_classes(sizes):
        if n == 0:
            continue
        k = gather_blocks(gram_flat, boffsets, idx, n)
        out[idx] = np.einsum("bi,bij,bj->b", gather_rows(x, offsets, idx, n), k,
                             gather_rows(y, offsets, idx, n))
    return out


def coefficients_at(sets: CoefficientSets, raw: RawRecovery, column: int) -> np.ndarray:
    """a(η*) for accepted groups and 0 for rejected ones (flat, grouped order)."""
    accepted = raw.accepted[:, column]
    eta = np.where(accepted, raw.eta[:, column], 0.0)
    sizes = sets.batch.sizes
    eta_flat = np.repeat(eta, sizes)
    keep = np.repeat(accepted, sizes)
    centers = sets.geometry.centers
    out = raw.anchors + eta_flat * (centers - raw.anchors)
    # η* = 1 writes back c exactly (the rounding of a₀ + (c − a₀) would not).
    return np.where(keep, np.where(eta_flat == 1.0, centers, out), 0.0)


def thresholds_checked(thresholds: Any) -> np.ndarray:
    """A threshold grid in [0, 1), distinct, as float64 sorted strict → loose."""
    taus = as_float_array(thresholds, "thresholds")
    if taus.ndim != 1 or taus.size == 0:
        raise ValueError(f"`thresholds` must be a non-empty 1-D array; got shape {taus.shape}.")
    taus = taus.astype(np.float64)
    if not (np.isfinite(taus).all() and (taus >= 0).all() and (taus < 1).all()):
        raise ValueError("`thresholds` must lie in [0, 1).")
    ordered = np.sort(taus)[::-1].copy()
    if (np.diff(ordered) == 0).any():
        raise ValueError("`thresholds` must not contain duplicates.")
    return ordered
