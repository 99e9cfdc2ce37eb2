"""advcal's estimators for verl's ``compute_advantage`` (``maxnorm``, ``range_grpo``,
``setgrpo``), and the per-response Gram rows that carry SetGRPO's Gram matrices in a
``DataProto``."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import advcal
from advcal.integrations.verl._config import (
    ESTIMATOR_NAMES,
    GRAM_KEY,
    GRAM_OPTIONS,
    _need,
    _options,
)


def _scores(token_level_rewards: Any, index: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    if index is None:
        raise ValueError(f"verl estimator {name!r} needs the group of each response: verl "
                         "passes it as `index` from data.non_tensor_batch['uid'].")
    scores = token_level_rewards.sum(dim=-1).detach().cpu().double().numpy()
    return scores, np.asarray(index, dtype=object)


def _per_token(advantages: np.ndarray, token_level_rewards: Any, response_mask: Any
               ) -> tuple[Any, Any]:
    import torch

    values = torch.as_tensor(advantages, dtype=token_level_rewards.dtype,
                             device=token_level_rewards.device)
    out = values.unsqueeze(-1) * response_mask
    return out, out


def _calibration(value: Any, kind: type, name: str) -> Any:
    if isinstance(value, (str, os.PathLike)):
        value = advcal.load_calibration(value)
    if not isinstance(value, kind):
        raise ValueError(f"verl estimator {name!r} needs `calibration`: a {kind.__name__} or "
                         f"the path of one saved with advcal.save_calibration; got "
                         f"{type(value).__name__}.")
    return value


def maxnorm_advantage(token_level_rewards: Any, response_mask: Any, index: Any = None,
                      config: Any = None, **kwargs: Any) -> tuple[Any, Any]:
    """verl ``maxnorm``: :func:`advcal.maxnorm` on each uid group's sequence rewards."""
    options = _options("maxnorm")
    tau_res = _need(options, "tau_res", "maxnorm", "the reward resolution")
    scores, ids = _scores(token_level_rewards, index, "maxnorm")
    weights = advcal.maxnorm(scores, group_ids=ids, tau_res=tau_res, **options)
    return _per_token(weights, token_level_rewards, response_mask)


def range_grpo_advantage(token_level_rewards: Any, response_mask: Any, index: Any = None,
                         config: Any = None, **kwargs: Any) -> tuple[Any, Any]:
    """verl ``range_grpo``: judge scores → conformal ranges → Range-GRPO advantages."""
    options = _options("range_grpo")
    calibration = _calibration(_need(options, "calibration", "range_grpo",
                                     "a RangeCalibration or its file"),
                               advcal.RangeCalibration, "range_grpo")
    scores, ids = _scores(token_level_rewards, index, "range_grpo")
    ranges = calibration.ranges(scores)
    advantages = advcal.range_advantages(ranges.lo, ranges.hi, group_ids=ids, **options)
    return _per_token(advantages, token_level_rewards, response_mask)


def setgrpo_advantage(token_level_rewards: Any, response_mask: Any, index: Any = None,
                      config: Any = None, gram: Any = None, **kwargs: Any) -> tuple[Any, Any]:
    """verl ``setgrpo``: SetGRPO's recovered coefficients (needs the Gram rows)."""
    if gram is None:
        raise ValueError(
            "verl estimator 'setgrpo' is missing the Gram matrices of the responses' policy "
            "gradients: compute them with advcal.torch.GradientCapture, store them with "
            f"advcal.integrations.verl.attach_gram(data, gram) (data.batch[{GRAM_KEY!r}]), and "
            "compute advantages with advcal.integrations.verl.compute_advantage, or call "
            "advcal.integrations.verl.patch_compute_advantage() in the trainer process: "
            "verl's own compute_advantage forwards only rewards, masks and uids. "
            "advcal.integrations.verl.install() computes and forwards them in verl's "
            "RayPPOTrainer (trainer.use_v1=False; the v1 trainer is not hooked).")
    options = _options("setgrpo")
    for key in GRAM_OPTIONS:  # the worker-side Gram pass's, not the estimator's
        options.pop(key, None)
    calibration = _calibration(_need(options, "calibration", "setgrpo",
                                     "a SetCalibration or its file"),
                               advcal.SetCalibration, "setgrpo")
    tau = _need(options, "tau", "setgrpo", "a threshold or a ThresholdSelection file")
    if isinstance(tau, (str, os.PathLike)):
        tau = advcal.load_calibration(tau)
    scores, ids = _scores(token_level_rewards, index, "setgrpo")
    rows = gram.detach().cpu().double().numpy() if hasattr(gram, "detach") else np.asarray(gram)
    result = advcal.setgrpo(scores, group_ids=ids, gram=gram_blocks(rows, ids),
                            calibration=calibration, tau=tau, **options)
    return _per_token(result.coefficients, token_level_rewards, response_mask)


ESTIMATORS = dict(zip(ESTIMATOR_NAMES,
                      (maxnorm_advantage, range_grpo_advantage, setgrpo_advantage), strict=True))


def gram_rows(gram: Any, group_ids: Any) -> np.ndarray:
    """Gram blocks in advcal's ``group_ids`` layout → one row per response, ``(N, G_max)``.

    Parameters
    ----------
    gram : array_like
        Flat row-major n_q × n_q blocks, groups in order of first appearance in
        ``group_ids`` and members in batch order (what :func:`advcal.setgrpo` takes with
        ``group_ids``, and what ``GradientCapture.gram(..., group_ids=...)`` returns).
    group_ids : array_like, shape (N,)
        The group of each response (verl's uids).

    Returns
    -------
    ndarray of float64, shape (N, G_max)
        Row i holds ⟨g_i, g_j⟩ for the members j of i's group in batch order, NaN-padded
        to the largest group: a per-response tensor that ``DataProto`` carries and splits.

    Examples
    --------
    >>> import numpy as np
    >>> from advcal.integrations.verl import gram_blocks, gram_rows
    >>> ids = np.array(["a", "b", "a"], dtype=object)
    >>> rows = gram_rows([1.0, 0.5, 0.5, 2.0, 3.0], ids)   # a: 2 x 2 block, b: 1 x 1
    >>> rows
    array([[1. , 0.5],
           [3. , nan],
           [0.5, 2. ]])
    >>> gram_blocks(rows, ids)
    array([1. , 0.5, 0.5, 2. , 3. ])
    """
    index = advcal.groups_from_ids(group_ids)
    flat = np.asarray(gram, dtype=np.float64).ravel()
    sizes = np.diff(index.offsets)
    if flat.size != int(np.sum(sizes ** 2)):
        raise ValueError(f"`gram` must hold one n_q x n_q block per group ({int(np.sum(sizes**2))} "
                         f"values for these group_ids); got {flat.size}.")
    rows = np.full((index.order.size, int(sizes.max(initial=0))), np.nan)
    start = 0
    for q, size in enumerate(sizes):
        members = index.order[index.offsets[q]:index.offsets[q + 1]]
        rows[members, :size] = flat[start:start + size * size].reshape(size, size)
        start += size * size
    return rows


def gram_blocks(rows: np.ndarray, group_ids: Any) -> np.ndarray:
    """The inverse of :func:`gram_rows`: per-response rows → flat blocks by group.

    Parameters
    ----------
    rows : array_like, shape (N, >= G_max)
        Per-response rows as :func:`gram_rows` writes them.
    group_ids : array_like, shape (N,)
        The group of each response.

    Returns
    -------
    ndarray of float64
        The flat blocks in advcal's ``group_ids`` layout.
    """
    index = advcal.groups_from_ids(group_ids)
    rows = np.asarray(rows, dtype=np.float64)
    sizes = np.diff(index.offsets)
    if rows.ndim != 2 or rows.shape[0] != index.order.size or rows.shape[1] < sizes.max(initial=0):
        raise ValueError(f"the Gram rows must have shape (N, >= largest group) = "
                         f"({index.order.size}, {int(sizes.max(initial=0))}); got {rows.shape}.")
    blocks = [rows[index.order[index.offsets[q]:index.offsets[q + 1]], :size].ravel()
              for q, size in enumerate(sizes)]
    return np.concatenate(blocks) if blocks else np.zeros(0)


def attach_gram(data: Any, gram: Any) -> Any:
    """Store Gram blocks in a verl ``DataProto`` as per-response rows.

    Parameters
    ----------
    data : verl.DataProto
        The batch; ``data.non_tensor_batch["uid"]`` names each response's group.
    gram : array_like
        Flat blocks in advcal's ``group_ids`` layout over those uids (see
        :func:`gram_rows`).

    Returns
    -------
    verl.DataProto
        ``data``, with ``data.batch["advcal_gram"]`` set to the rows.
    """
    import torch

    if "uid" not in data.non_tensor_batch:
        raise ValueError("`data` has no non_tensor_batch['uid']: the groups of the Gram blocks.")
    rows = gram_rows(gram, data.non_tensor_batch["uid"])
    data.batch[GRAM_KEY] = torch.as_tensor(rows)
    return data


def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
    """verl's ``compute_advantage``, also handing the Gram rows to ``setgrpo``.

    Parameters
    ----------
    data : verl.DataProto
        The batch, as verl's ``compute_advantage`` takes it.
    adv_estimator : str or verl.trainer.ppo.core_algos.AdvantageEstimator
        The estimator.  ``"setgrpo"`` reads ``data.batch["advcal_gram"]`` (set by
        :func:`attach_gram`); every other name goes to verl's own function unchanged.
    *args, **kwargs
        verl's further arguments (``gamma``, ``lam``, ``config``, ...).

    Returns
    -------
    verl.DataProto
        ``data`` with ``advantages`` and ``returns``.
    """
    from verl.trainer.ppo import ray_trainer

    name = getattr(adv_estimator, "value", adv_estimator)
    if name != "setgrpo":
        return _verl_compute_advantage(ray_trainer)(data, adv_estimator, *args, **kwargs)
    if "response_mask" not in data.batch.keys():
        data.batch["response_mask"] = ray_trainer.compute_response_mask(data)
    gram = data.batch[GRAM_KEY] if GRAM_KEY in data.batch.keys() else None
    advantages, returns = setgrpo_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"],
        index=data.non_tensor_batch.get("uid"), gram=gram)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


def _verl_compute_advantage(ray_trainer: Any) -> Any:
    return getattr(ray_trainer, "_advcal_original_compute_advantage",
                   ray_trainer.compute_advantage)


def patch_compute_advantage() -> None:
    """Make verl's ``ray_trainer.compute_advantage`` this module's :func:`compute_advantage`.

    Call it in the process that runs verl's trainer (for example at the top of your
    task runner), so that its ``fit`` loop hands the Gram rows to ``setgrpo``.  Calling it
    again changes nothing.
    """
    from verl.trainer.ppo import ray_trainer

    if not hasattr(ray_trainer, "_advcal_original_compute_advantage"):
        setattr(ray_trainer, "_advcal_original_compute_advantage",  # noqa: B010
                ray_trainer.compute_advantage)
        ray_trainer.compute_advantage = compute_advantage


