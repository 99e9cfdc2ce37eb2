"""advcal: exact, fast advantage calibration for group-relative RL of language models.

Points, intervals or paired scores in; advantages, coefficient sets, recovery ratios and
conformal / UCB thresholds out.  See DESIGN.md for the math and ``docs/`` for the guide.
"""

from advcal.bounds import risk_p_value, ucb
from advcal.conformal import conformal_quantile, conformal_rank
from advcal.estimators import (
    ESTIMATORS,
    advantages,
    batch_std,
    dr_grpo,
    gpg,
    grpo,
    opo,
    passk,
    reinforce_pp_baseline,
    rloo,
)
from advcal.layouts import GroupIndex, groups_from_ids, offsets_from_sizes

__version__ = "0.1.0"

__all__ = [
    "ESTIMATORS",
    "GroupIndex",
    "__version__",
    "advantages",
    "batch_std",
    "conformal_quantile",
    "conformal_rank",
    "dr_grpo",
    "gpg",
    "groups_from_ids",
    "grpo",
    "offsets_from_sizes",
    "opo",
    "passk",
    "reinforce_pp_baseline",
    "risk_p_value",
    "rloo",
    "ucb",
]
