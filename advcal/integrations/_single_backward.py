"""When SetGRPO's Gram backward can stand in for the trainer's backward pass.

The Gram matrix needs δ = ∂ΣJ/∂y at the output y of every covered layer.  Suppose that the
loss L reaches the model only through the log-probabilities, with
∂L/∂log p = λ_i · ∂ΣJ/∂log p on the tokens of each response i (one λ_i per response).
Responses are independent rows of the batch, so then ∂L/∂v = λ_i ∂ΣJ/∂v on the rows of
response i of any tensor v the model computes, and L's gradient follows from the Gram's
backward pass of ΣJ:

- a covered layer's weight, used by that layer's recorded calls alone, gets Σ over its calls
  of (λδ)ᵀ h, from the recorded inputs h and the Gram's δ;
- any other trainable parameter (embeddings, norms, a fused LM head's weight) gets, from
  each autograd node that uses it, that node's backward at λ times the gradient of ΣJ
  reaching it, which the Gram's pass also returns when :func:`prepare` asked for it (a node
  above the pass's start gets L's own gradient instead).

Then the trainer's own backward pass has nothing left to compute.  This is so in TRL's GRPO
loss at the current policy (importance ratio 1, no KL term, no entropy bonus).
:func:`single_backward` checks every condition on the graph and the numbers, and returns a
loss of the same value whose backward writes those gradients, or None: then the trainer's
backward runs as usual.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any, NamedTuple

# A loss built from the log-probabilities alone reaches them in a few dozen ops.
MAX_LOSS_NODES = 256
# Relative agreement of ∂L/∂log p with λ_i ∂ΣJ/∂log p, row by row (at most this, and at
# most 64 rounding errors of the log-probabilities' dtype).
RTOL = 1e-5


class Plan(NamedTuple):
    """What the Gram's pass must also return for :func:`single_backward`."""

    trainable: dict[int, Any]  # id -> trainable parameter
    covered: set[int]  # the trainable parameters of the recorded layers
    uses: dict[int, int]  # id -> edges of the graph into it (one per use)
    # the nodes using the other trainable parameters: (node, [(slot, parameter)], whether
    # the node is above the Gram pass's start, and gets L's own gradient)
    nodes: list[tuple[Any, list[tuple[int, Any]], bool]]
    below: list[Any]  # a GradientEdge per output of each node below the start, in order
    above: list[Any]  # the same for the nodes above it


def _reaches_parameters(root: Any, stop: Any) -> bool:
    """Whether the graph of ``root`` reaches a leaf that needs a gradient other than
    through the node ``stop`` (or is too large to tell)."""
    return _above(root, stop, leaves=False) is None


def _above(root: Any, stop: Any, *, leaves: bool) -> set[int] | None:
    """The nodes of ``root``'s graph reached other than through ``stop``, or None if they
    are more than a loss takes, or (``leaves`` False) include a leaf needing a gradient."""
    stack, seen = [root], {id(stop)}
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if len(seen) > MAX_LOSS_NODES:
            return None
        if type(fn).__name__ == "AccumulateGrad":
            if not leaves:
                return None
            continue
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return seen - {id(stop)}


def prepare(logps: Any, parameters: Iterable[Any], capture: Any, start: Any = None
            ) -> Plan | None:
    """Walk the graph below the log-probabilities, before the Gram's backward pass (which
    starts at the tensor ``start``, or at ΣJ when None): the uses of every trainable
    parameter, and the nodes through which the parameters outside the capture's recorded
    layers are used.  None where no plan can hold: the capture's batch axis is not the
    first, or a node below the start, using such a parameter, has an output whose first axis
    is not the responses (λ could not be placed on its gradient)."""
    try:  # (an older torch has no GradientEdge)
        from torch.autograd.graph import GradientEdge
    except ImportError:
        return None
    if logps.grad_fn is None or capture._batch_dim != 0 or capture._records is None:
        return None
    n = int(logps.shape[0])
    above: set[int] = set()
    if start is not None and start.grad_fn is not None:
        found = _above(logps.grad_fn, start.grad_fn, leaves=True)
        if found is None:
            return None
        above = found
    trainable = {id(p): p for p in parameters if p.requires_grad}
    covered = {id(p) for layer, records in zip(capture._layers, capture._records, strict=True)
               if records for p in layer.parameters()} & trainable.keys()
    uses = dict.fromkeys(trainable, 0)
    users: dict[int, tuple[Any, list[tuple[int, Any]], bool]] = {}
    # node -> what an edge into it is: a use of the parameter with this id, -1 (a leaf
    # that is no trainable parameter) or 0 (an op, walked once)
    kinds: dict[int, int] = {id(logps.grad_fn): 0}
    stack = [logps.grad_fn]
    while stack:
        fn = stack.pop()
        for slot, (nxt, _) in enumerate(fn.next_functions):
            if nxt is None:
                continue
            kind = kinds.get(id(nxt))
            if kind is None:
                leaf = nxt  # a parameter's autocast copy counts as the parameter
                if type(nxt).__name__.startswith("ToCopyBackward"):
                    leaf = nxt.next_functions[0][0]
                kind = 0
                if leaf is not None and type(leaf).__name__ == "AccumulateGrad":
                    kind = id(leaf.variable) if id(leaf.variable) in trainable else -1
                kinds[id(nxt)] = kind
                if kind == 0:
                    stack.append(nxt)
            if kind <= 0:
                continue
            uses[kind] += 1
            if kind in covered:
                continue
            exact = id(fn) in above
            outputs = getattr(fn, "_input_metadata", None)  # (the shapes of fn's outputs)
            if outputs is None or not exact and not all(
                    len(meta.shape) >= 3 and meta.shape[0] == n for meta in outputs):
                return None
            users.setdefault(id(fn), (fn, [], exact))[1].append((slot, trainable[kind]))
    nodes = list(users.values())
    edges = [[GradientEdge(fn, j) for j in range(len(fn._input_metadata))]
             for fn, _, _ in nodes]
    return Plan(trainable, covered, uses, nodes,
                [e for (_, _, exact), es in zip(nodes, edges, strict=True) if not exact
                 for e in es],
                [e for (_, _, exact), es in zip(nodes, edges, strict=True) if exact
                 for e in es])


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


def _scales(loss: Any, logps: Any, objectives: Any, above: list[Any]
            ) -> tuple[Any, list[Any]] | None:
    """(λ, L's gradient at the ``above`` edges), or None where ∂L/∂log p is not
    λ_i ∂ΣJ/∂log p on every response's tokens."""
    import torch

    grads = torch.autograd.grad(loss, [logps, *above], retain_graph=True, allow_unused=True)
    (grad_j,) = torch.autograd.grad(objectives.sum(), logps, retain_graph=True)
    if grads[0] is None:
        return None
    g_l, g_j = grads[0].double(), grad_j.double()
    norm2 = (g_j * g_j).sum(dim=1)
    scales = torch.where(norm2 > 0, (g_l * g_j).sum(dim=1) / norm2.clamp(min=1e-300), 0.0)
    residual = (g_l - scales[:, None] * g_j).abs().amax(dim=1)
    rtol = min(RTOL, 64 * torch.finfo(grads[0].dtype).eps)
    if not bool((residual <= rtol * g_l.abs().amax(dim=1)).all()):
        return None
    return scales, list(grads[1:])


def _node_gradients(plan: Plan, below: list[Any], above: list[Any], scales: Any
                    ) -> list[tuple[Any, Any]]:
    """Each uncovered parameter's gradient, from the backward of each node using it at the
    gradient of L reaching the node: λ times what the Gram's pass found ``below`` its start
    (rows of responses first), L's own gradient ``above`` it."""
    import torch

    from advcal.integrations._fused_head import NODE, head_parameter_gradients

    n = int(scales.shape[0])
    found = {False: iter(below), True: iter(above)}
    out: list[tuple[Any, Any]] = []
    for fn, slots, exact in plan.nodes:
        grads = []
        for meta in fn._input_metadata:
            grad = next(found[exact])
            if grad is None:
                grad = torch.zeros(tuple(meta.shape), dtype=meta.dtype, device=meta.device)
            elif not exact:
                grad = grad * scales.to(grad.dtype).reshape(n, *[1] * (grad.ndim - 1))
            grads.append(grad)
        result: tuple[Any, ...] | None = None
        if type(fn).__name__ == NODE:  # TRL's fused head: its weight's part, without its
            head = head_parameter_gradients(fn, grads[0])  # backward's other work
            result = None if head is None else (None, *head)
        if result is None:
            with torch.no_grad():  # (a Python node's apply may not run under grad mode)
                result = fn.apply(*grads) if hasattr(fn, "apply") else fn(*grads)
            result = result if isinstance(result, tuple) else (result,)
        out.extend((param, result[slot].to(param.dtype)) for slot, param in slots)
    return out


def single_backward(loss: Any, logps: Any, objectives: Any, capture: Any, plan: Plan
                    ) -> Any:
    """A loss with the value of ``loss`` whose backward writes ∇L from the Gram's backward
    pass (see the module docstring), or None where that would not give the trainer's
    gradient.

    ``logps`` are the log-probabilities ``objectives`` (the J_i) were computed from, and
    ``capture`` a :class:`advcal.torch.GradientCapture` whose ``_gram`` ran with ``keep``
    and the ``plan``'s edges below its start."""
    import torch

    kept, below, capture._extra = capture._kept, capture._extra, None
    if kept is None or below is None or loss.grad_fn is None:
        return None
    calls = dict.fromkeys(plan.trainable, 0)  # recorded calls that use each parameter
    for layer, pairs in zip(capture._layers, kept, strict=True):
        for param in layer.parameters():
            if id(param) in calls:
                calls[id(param)] += len(pairs)
    # A covered parameter must be used by its layers' recorded calls alone.
    if any(calls[key] != plan.uses[key] for key in plan.covered) \
            or _reaches_parameters(loss.grad_fn, logps.grad_fn):
        return None
    with torch.autocast(logps.device.type, enabled=False):
        checked = _scales(loss, logps, objectives, plan.above)
        if checked is None:
            return None
        scales, above = checked
        grads: dict[int, tuple[Any, Any]] = {}
        for param, grad in capture._weight_gradients(scales) + _node_gradients(
                plan, below, above, scales):
            if id(param) in grads:
                grad = grads[id(param)][1] + grad
            grads[id(param)] = (param, grad)
    params = [param for param, _ in grads.values()]
    return _deposit().apply(loss.detach(), [grad for _, grad in grads.values()], *params)
