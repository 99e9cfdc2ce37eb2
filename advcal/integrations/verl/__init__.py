"""advcal's estimators in verl: ``maxnorm``, ``range_grpo`` and ``setgrpo``.

Importing this module registers the three names with verl's ``register_adv_est``, so that
``algorithm.adv_estimator=maxnorm`` (etc.) resolves in verl's ``compute_advantage``.
verl runs its trainer inside Ray workers, so the import has to happen *there*, not in the
script that starts the run.  Two ways reach every worker:

* installed advcal declares this module as a ``verl.plugins`` entry point, which verl loads
  on import (unless ``VERL_USE_EXTERNAL_PLUGINS=none``);
* ``VERL_USE_EXTERNAL_MODULES=advcal.integrations.verl`` in the workers' environment (for
  example Ray's ``runtime_env={"env_vars": {...}}``) names it explicitly.

Options (``tau_res`` for MaxNorm, the calibration files for Range-GRPO and SetGRPO, ...)
reach the workers the same way, as JSON in ``ADVCAL_VERL_OPTIONS``, keyed by estimator::

    ADVCAL_VERL_OPTIONS='{"maxnorm": {"tau_res": 0.05},
                          "range_grpo": {"calibration": "/data/judge-ranges.npz"},
                          "setgrpo": {"calibration": "/data/sets.npz", "tau": 0.2}}'

or in-process with :func:`configure`.

SetGRPO also needs each group's policy-gradient Gram matrix, which verl's
``compute_advantage`` does not forward to registered estimators.  Store it per response
with :func:`attach_gram` (rows padded to the largest group, a layout ``DataProto``
accepts) and compute advantages with this module's :func:`compute_advantage`, a drop-in
for verl's that forwards the rows; :func:`patch_compute_advantage` installs it in verl's
``ray_trainer``.

advcal also computes those rows on verl's actor workers: :func:`compute_gram_rows` is the
worker-side Gram pass (a grad-enabled forward of the actor under
:class:`advcal.torch.GradientCapture`, whole groups per forward), :class:`GramWorkerMixin`
adds it to verl's actor worker as the registered method ``compute_advcal_gram``, and
:func:`install` hooks verl's ``RayPPOTrainer`` so that every step runs it between the
old-log-prob pass and ``compute_advantage``.  With ``ADVCAL_VERL_OPTIONS`` holding a
``"setgrpo"`` entry, importing this module (as verl's plugin loading does in every
process) installs the hooks.
"""

from __future__ import annotations

import os

from advcal.integrations.verl._actor import (
    GramWorkerMixin,
    compute_gram_rows,
    gram_forwards,
    gram_from_workers,
    gram_worker_class,
    install,
    policy_objectives,
    response_log_probs,
)
from advcal.integrations.verl._config import GRAM_OPTIONS, LOSS_AGG_MODES, OPTIONS_ENV, configure
from advcal.integrations.verl._estimators import (
    ESTIMATORS,
    attach_gram,
    compute_advantage,
    gram_blocks,
    gram_rows,
    patch_compute_advantage,
)

__all__ = ["ESTIMATORS", "GRAM_OPTIONS", "LOSS_AGG_MODES", "OPTIONS_ENV", "GramWorkerMixin",
           "attach_gram", "compute_advantage", "compute_gram_rows", "configure", "gram_blocks",
           "gram_forwards", "gram_from_workers", "gram_rows", "gram_worker_class", "install",
           "patch_compute_advantage", "policy_objectives", "response_log_probs"]


def _register() -> None:
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    for name, fn in ESTIMATORS.items():
        if ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            register_adv_est(name)(fn)


_register()
if "setgrpo" in os.environ.get(OPTIONS_ENV, ""):
    install()  # the trainer process sees the options too: hook its RayPPOTrainer
