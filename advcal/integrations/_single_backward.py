"""When SetGRPO's Gram backward can stand in for the trainer's backward pass.

The Gram matrix needs δ = ∂ΣJ/∂y at the output y of every covered layer.  Suppose that

- every trainable parameter is the weight or bias of a covered layer, and is used in the
  forward pass by that layer's recorded calls alone;
- the loss L reaches the model only through the log-probabilities, with
  ∂L/∂log p = λ_i · ∂ΣJ/∂log p on the tokens of each response i (one λ_i per response).

Responses are independent rows of the batch, so then ∂L/∂y = λ_i δ on the tokens of response
i, and ∇_W L = Σ over the layer's calls of (λδ)ᵀ h: the recorded inputs h and the Gram's δ
hold the whole gradient, and the trainer's own backward pass has nothing left to compute.
This is so in TRL's GRPO loss at the current policy (importance ratio 1, no KL term, no
entropy bonus) when the trainable parameters are LoRA adapters, or the linear layers alone.

:func:`single_backward` checks every condition on the graph and the numbers, and returns a
loss of the same value whose backward writes those gradients, or None: then the trainer's
backward runs as usual.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

# A loss built from the log-probabilities alone reaches them in a few dozen ops.
MAX_LOSS_NODES = 256
# Relative agreement of ∂L/∂log p with λ_i ∂ΣJ/∂log p, row by row (at most this, and at
# most 64 rounding errors of the log-probabilities' dtype).
RTOL = 1e-5


def _reaches_parameters(root: Any, stop: Any) -> bool:
    """Whether the graph of ``root`` reaches a leaf that needs a gradient other than
    through the node ``stop`` (or is too large to tell)."""
    stack, seen = [root], {id(stop)}
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if len(seen) > MAX_LOSS_NODES or type(fn).__name__ == "AccumulateGrad":
            return True
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return False


def _uses(root: Any, trainable: dict[int, Any]) -> dict[int, int]:
    """How many edges of the graph below ``root`` lead into each trainable parameter,
    directly or through its (autocast) copy: one per use in the forward pass."""
    uses = dict.fromkeys(trainable, 0)
    # node -> what an edge into it is: a use of the parameter with this id, -1 (a leaf
    # that is no trainable parameter) or 0 (an op, walked once)
    kinds: dict[int, int] = {id(root): 0}
    stack = [root]
    while stack:
        for nxt, _ in stack.pop().next_functions:
            if nxt is None:
                continue
            kind = kinds.get(id(nxt))
            if kind is None:
                leaf = nxt
                if type(nxt).__name__.startswith("ToCopyBackward"):
                    leaf = nxt.next_functions[0][0]
                kind = 0
                if leaf is not None and type(leaf).__name__ == "AccumulateGrad":
                    kind = id(leaf.variable) if id(leaf.variable) in trainable else -1
                kinds[id(nxt)] = kind
                if kind == 0:
                    stack.append(nxt)
            if kind > 0:
                uses[kind] += 1
    return uses


@cache
def _deposit() -> Any:
    import torch

    class Deposit(torch.autograd.Function):
        """The value of the loss; its backward adds grad · G_p to each parameter p."""

        @staticmethod
        def forward(ctx: Any, value: Any, grads: list[Any], *params: Any) -> Any:
            ctx.grads = grads
            return value.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return (None, None, *(g * grad.to(g.dtype) for g in ctx.grads))

    return Deposit


def single_backward(loss: Any, logps: Any, objectives: Any, capture: Any,
                    parameters: Iterable[Any]) -> Any:
    """A loss with the value of ``loss`` whose backward writes ∇L from the Gram's δ (see
    the module docstring), or None where that would not give the trainer's gradient.

    ``logps`` are the log-probabilities ``objectives`` (the J_i) were computed from,
    ``capture`` a :class:`advcal.torch.GradientCapture` whose ``_gram`` ran with ``keep``,
    and ``parameters`` the model's (a shared one may come more than once)."""
    import torch

    kept = capture._kept
    if kept is None or loss.grad_fn is None or logps.grad_fn is None:
        return None
    trainable = {id(p): p for p in parameters if p.requires_grad}
    calls = dict.fromkeys(trainable, 0)  # recorded calls that use each parameter
    for layer, pairs in zip(capture._layers, kept, strict=True):
        for param in layer.parameters():
            if id(param) in calls:
                calls[id(param)] += len(pairs)
    if not trainable or 0 in calls.values() or _reaches_parameters(loss.grad_fn, logps.grad_fn):
        return None
    with torch.autocast(logps.device.type, enabled=False):
        (grad_loss,) = torch.autograd.grad(loss, logps, retain_graph=True, allow_unused=True)
        (grad_j,) = torch.autograd.grad(objectives.sum(), logps, retain_graph=True)
        if grad_loss is None:
            return None
        g_l, g_j = grad_loss.double(), grad_j.double()
        norm2 = (g_j * g_j).sum(dim=1)
        scales = torch.where(norm2 > 0, (g_l * g_j).sum(dim=1) / norm2.clamp(min=1e-300), 0.0)
        residual = (g_l - scales[:, None] * g_j).abs().amax(dim=1)
        rtol = min(RTOL, 64 * torch.finfo(grad_loss.dtype).eps)
        if not bool((residual <= rtol * g_l.abs().amax(dim=1)).all()):
            return None
    if _uses(logps.grad_fn, trainable) != calls:
        return None  # a parameter used outside its layer's recorded calls
    grads = capture._weight_gradients(scales)
    params = [param for param, _ in grads]
    return _deposit().apply(loss.detach(), [grad for _, grad in grads], *params)
