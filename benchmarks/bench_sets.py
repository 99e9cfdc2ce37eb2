"""SetGRPO: GGSR ``recover`` per group against the numpy/scipy reference, and
``calibrate_sets`` on a million groups.

Targets (issue 5): ``recover`` at n = 16 within 10 us per group on one core and at least
10x faster than the reference; ``calibrate_sets`` on 10**6 groups of 16 under 2 s.
Every recover candidate processes the same B groups, so the printed ratios are per-group
ratios; divide the printed time by B for the per-group time.
"""

from __future__ import annotations

import numpy as np

from advcal import calibrate_sets, coefficient_sets, recover
from advcal._blocks import block_offsets
from advcal._ggsr import gram_blocks as _gram_blocks
from advcal._kernels import recovery_numba, recovery_numpy
from advcal.simulate import gram_matrices, paired_scorings
from benchmarks import Case


def _recover_case(n: int, n_groups: int) -> Case:
    cal_pair = paired_scorings(2000, n, scale=0.02, seed=0)
    cal = calibrate_sets(cal_pair.a, cal_pair.b, alpha=0.1)
    sets = coefficient_sets(paired_scorings(n_groups, n, scale=0.02, seed=1).a,
                            calibration=cal)
    gram = gram_matrices(n_groups, n, seed=2).gram
    flat = _gram_blocks(sets, gram)
    geo = sets.geometry
    root = geo.root_blocks()
    boffsets = block_offsets(sets.batch.sizes)
    taus = np.array([0.25])
    ref = np.zeros_like(geo.centers)
    args = (geo.centers, sets.offsets, root, flat, boffsets, float(sets.rho), taus, ref)
    return Case(
        f"recover, {n_groups} groups of {n} (tau = 0.25)",
        {
            "numpy/scipy reference": lambda: recovery_numpy.recover_groups(*args),
            "numba kernel, one core": lambda: recovery_numba.recover_groups(
                *args, threaded=False),
            "numba kernel, all cores": lambda: recovery_numba.recover_groups(
                *args, threaded=True),
            "advcal.recover public call": lambda: recover(sets, gram, tau=0.25),
        },
        baseline="numpy/scipy reference",
        target="one core <= 10 us/group at n = 16 and >= 10x the reference",
        notes=[f"per group = printed time / {n_groups}"],
    )


def _calibrate_case(n_groups: int) -> Case:
    pair = paired_scorings(n_groups, 16, scale=0.02, seed=3)
    a, b = pair.a, pair.b
    return Case(
        f"calibrate_sets, {n_groups} groups of 16",
        {
            "memory copy of both scorings": lambda: (a.copy(), b.copy()),
            "calibrate_sets (joint)": lambda: calibrate_sets(a, b, alpha=0.1),
            "calibrate_sets (isotropic)": lambda: calibrate_sets(a, b, alpha=0.1,
                                                                 shape="isotropic"),
        },
        baseline="memory copy of both scorings",
        target="joint < 2 s at 10**6 groups",
    )


def cases(quick: bool) -> list[Case]:
    n_groups = 32 if quick else 256
    out = [_recover_case(n, n_groups) for n in (8, 16, 32)]
    out.append(_calibrate_case(10_000 if quick else 1_000_000))
    return out
