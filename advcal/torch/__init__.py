"""Torch tensors in, torch tensors out: advcal's estimators for trainers that live in torch.

``import advcal`` never imports torch; this module imports it when one of its functions is
called, so it is usable only where torch is installed (an optional dependency).

Every function here moves its tensor arguments to host numpy arrays, calls the numpy
function of the same name, and returns tensors on the device of the main input
(``rewards`` or ``lo``) with its floating dtype.  bfloat16 and float16 input is computed in
float32 (numpy has no bfloat16) and cast back; integer and boolean rewards give float64,
as in the numpy API.  The results are constants for the loss (advantages carry no gradient),
so they never require grad.  Any other tensor argument (``offsets``, ``group_ids``,
``lengths``, ``token_counts``, ...) is converted to numpy as well.

The copy to the host is the price of reusing one set of kernels for every framework: for the
batch sizes of RL fine-tuning (thousands of rewards) it is microseconds next to a
generation step.
"""

from __future__ import annotations

from advcal.torch import _tensors
from advcal.torch._capture import GradientCapture
from advcal.torch._layers import LayerSelection, last_blocks
from advcal.torch._objectives import response_objectives
from advcal.torch._packing import tokens_from_cu_seqlens, tokens_from_position_ids
from advcal.torch._split import gather_rows, gram_from_rows
from advcal.torch._tensors import (
    advantages,
    batch_std,
    dr_grpo,
    from_numpy,
    gdpo,
    gpg,
    grpo,
    maxnorm,
    opo,
    passk,
    range_advantages,
    reinforce_pp_baseline,
    rloo,
    setgrpo,
    to_numpy,
)

__all__ = ["GradientCapture", "LayerSelection", "advantages", "batch_std", "dr_grpo",
           "from_numpy", "gather_rows", "gdpo", "gpg", "gram_from_rows", "grpo",
           "last_blocks", "maxnorm", "opo", "passk", "range_advantages",
           "reinforce_pp_baseline", "response_objectives", "rloo", "setgrpo", "to_numpy",
           "tokens_from_cu_seqlens", "tokens_from_position_ids"]

# The registry's other point estimators, each under its own name (advcal.torch.<name>).
_extra = _tensors.registry_estimators(set(__all__))
globals().update(_extra)
__all__ += sorted(_extra)
del _extra

# The public objects are documented, printed and pickled as advcal.torch's own.
for _name in __all__:
    if getattr(globals()[_name], "__module__", "").startswith("advcal.torch."):
        globals()[_name].__module__ = __name__
del _name
