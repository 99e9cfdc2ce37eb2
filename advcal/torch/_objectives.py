"""Each response's policy objective J_i, normalised as the trainer's loss normalises it."""

from __future__ import annotations

from typing import Any

import numpy as np

from advcal.torch._layers import _torch

LOSS_TYPES = ("grpo", "dr_grpo", "bnpo", "dapo")


def response_objectives(
    per_token_logps: Any,
    completion_mask: Any,
    *,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    num_items_in_batch: Any = None,
    num_processes: int = 1,
    gradient_accumulation_steps: int = 1,
) -> Any:
    """Per-response policy objectives J_i with the normalisation of a trainer's loss.

    With these J_i, the GRPO-family loss at the current policy (importance ratio 1, no
    clipping active, no KL term) is −Σ_i A_i J_i, so its gradient is −Σ_i A_i ∇J_i: the
    coefficients that SetGRPO returns in place of the advantages A multiply exactly the
    gradients whose Gram matrix :class:`GradientCapture` computes from these objectives.

    Parameters
    ----------
    per_token_logps : torch.Tensor, shape (N, T)
        Log-probabilities of the completion tokens under the policy (with gradients).
    completion_mask : torch.Tensor, shape (N, T)
        1 for completion tokens that enter the loss, 0 for padding (bool, int or float).
    loss_type : {"grpo", "dr_grpo", "bnpo", "dapo"}, default "grpo"
        The normalisation, as TRL's ``GRPOTrainer`` applies it: ``"grpo"`` a per-sequence
        mean (J_i = Σ_t m_it·logp_it / (|o_i|·N)); ``"dr_grpo"`` a token sum over the
        constant N·``max_completion_length``; ``"bnpo"`` per token over the batch (over the
        mask's sum); ``"dapo"`` per token over ``num_items_in_batch`` / ``num_processes``.
    max_completion_length : int, optional
        For ``"dr_grpo"``; defaults to T.
    num_items_in_batch : int or tensor, optional
        For ``"dapo"``: completion tokens of the whole generation batch over all processes;
        defaults to this batch's mask sum times ``num_processes``.
    num_processes : int, default 1
        For ``"dapo"``: the number of data-parallel processes.
    gradient_accumulation_steps : int, default 1
        The divisor TRL applies to ``"grpo"``, ``"dr_grpo"`` and ``"bnpo"`` losses.

    Returns
    -------
    torch.Tensor, shape (N,)
        J_i, differentiable; float32 for half-precision log-probabilities.

    Examples
    --------
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> from advcal.torch import response_objectives
    >>> logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    >>> mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    >>> response_objectives(logps, mask)                      # mean per sequence, / N
    tensor([-1.0000, -0.2500])
    >>> response_objectives(logps, mask, loss_type="dr_grpo")  # sum / (N * T)
    tensor([-1.0000, -0.1667])
    >>> response_objectives(logps, mask, loss_type="bnpo")     # sum / 5 tokens
    tensor([-1.2000, -0.2000])
    """
    torch = _torch()
    if not torch.is_tensor(per_token_logps) or not per_token_logps.is_floating_point():
        raise TypeError("`per_token_logps` must be a floating torch.Tensor.")
    if per_token_logps.ndim != 2:
        raise ValueError("`per_token_logps` must be 2-D (responses, tokens); got shape "
                         f"{tuple(per_token_logps.shape)}.")
    if not torch.is_tensor(completion_mask):
        raise TypeError("`completion_mask` must be a torch.Tensor.")
    if completion_mask.shape != per_token_logps.shape:
        raise ValueError(f"`completion_mask` must have shape {tuple(per_token_logps.shape)}; "
                         f"got {tuple(completion_mask.shape)}.")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"`loss_type` must be one of {LOSS_TYPES}; got {loss_type!r}.")
    for value, name in ((num_processes, "num_processes"),
                        (gradient_accumulation_steps, "gradient_accumulation_steps")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer; got {value!r}.")
    logps = per_token_logps
    if logps.dtype in (torch.float16, torch.bfloat16):
        logps = logps.float()
    mask = completion_mask.to(device=logps.device, dtype=logps.dtype)
    sums = (logps * mask).sum(dim=1)
    n, t = logps.shape
    if loss_type == "grpo":
        return sums / (mask.sum(dim=1).clamp(min=1.0) * (n * gradient_accumulation_steps))
    if loss_type == "dr_grpo":
        length = t if max_completion_length is None else max_completion_length
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError("`max_completion_length` must be a positive integer; got "
                             f"{max_completion_length!r}.")
        return sums / (n * int(length) * gradient_accumulation_steps)
    if loss_type == "bnpo":
        return sums / (mask.sum().clamp(min=1.0) * gradient_accumulation_steps)
    if num_items_in_batch is None:
        items = mask.sum() * num_processes
    else:
        items = torch.as_tensor(num_items_in_batch, dtype=logps.dtype, device=logps.device)
        if items.ndim != 0 or not bool(torch.isfinite(items)) or bool(items < 0):
            raise ValueError("`num_items_in_batch` must be a non-negative scalar; got "
                             f"{num_items_in_batch!r}.")
    return sums / (items.clamp(min=1.0) / num_processes)
