"""advcal: exact, fast advantage calibration for group-relative RL of language models.

Points, intervals or paired scores in; advantages, coefficient sets, recovery ratios and
conformal / UCB thresholds out.  The documentation site (``docs/``) has the math and the guide.
"""

from advcal._version import __version__
from advcal.analysis import (
    AffineCheck,
    RecoveryPath,
    TrainingSummary,
    affine_check,
    recovery_path,
    training_summary,
)
from advcal.baselines import KLCompensated, grpo_kl_comp, huber_scale, mad_scale, p90_scale
from advcal.bounds import risk_p_value, ucb
from advcal.conformal import (
    RangeCalibration,
    RewardRanges,
    calibrate_ranges,
    conformal_quantile,
    conformal_rank,
)
from advcal.diagnostics import (
    MethodDiagnostics,
    ScaleDiagnostics,
    direction_cosine,
    scale_diagnostics,
)
from advcal.drift import CalibrationDrift, calibration_drift
from advcal.estimators import (
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
from advcal.io.artefacts import load_calibration, save_calibration
from advcal.layouts import GroupIndex, groups_from_ids, offsets_from_sizes
from advcal.ranges import range_advantages
from advcal.recovery import Recovery, recover
from advcal.registry import ESTIMATORS, advantages
from advcal.resolution import MaxNormResult, ResolvedRewards, maxnorm, resolve_rewards
from advcal.risk import ThresholdSelection, select_threshold, setgrpo
from advcal.selective import SelectiveCalibration, calibrate_selective
from advcal.sets import (
    CoefficientSets,
    SetCalibration,
    calibrate_sets,
    coefficient_jacobian,
    coefficient_sets,
)

__all__ = [
    "AffineCheck",
    "CalibrationDrift",
    "CoefficientSets",
    "ESTIMATORS",
    "GroupIndex",
    "KLCompensated",
    "RangeCalibration",
    "Recovery",
    "RecoveryPath",
    "RewardRanges",
    "MaxNormResult",
    "MethodDiagnostics",
    "ResolvedRewards",
    "ScaleDiagnostics",
    "SelectiveCalibration",
    "SetCalibration",
    "ThresholdSelection",
    "TrainingSummary",
    "affine_check",
    "__version__",
    "advantages",
    "batch_std",
    "calibrate_ranges",
    "calibrate_selective",
    "calibrate_sets",
    "calibration_drift",
    "coefficient_jacobian",
    "coefficient_sets",
    "conformal_quantile",
    "conformal_rank",
    "direction_cosine",
    "dr_grpo",
    "gdpo",
    "gpg",
    "groups_from_ids",
    "grpo",
    "grpo_kl_comp",
    "huber_scale",
    "load_calibration",
    "mad_scale",
    "maxnorm",
    "offsets_from_sizes",
    "opo",
    "p90_scale",
    "passk",
    "range_advantages",
    "recover",
    "recovery_path",
    "reinforce_pp_baseline",
    "resolve_rewards",
    "risk_p_value",
    "rloo",
    "save_calibration",
    "scale_diagnostics",
    "select_threshold",
    "setgrpo",
    "training_summary",
    "ucb",
]
