"""Where SetGRPO's Gram backward may start in TRL: at the input of TRL's fused LM head.

TRL computes the policy's log-probabilities with ``ChunkedLogProbFunction``, which projects
the final hidden states through the LM head in tiles without materialising the logits.  Its
backward recomputes every tile and also forms the head's weight gradient, which the Gram
matrix does not use (the head module is never called, so no hook records it).  The Gram's
backward needs only ∂ΣJ/∂hidden; :func:`head_start` computes it here from the tensors the
function saved, so that the backward runs through the backbone alone.

It does so only where the result is the same: ΣJ reaches the model through the function's
log-probabilities alone, the function saved what this module reads, and the log-normalisers
and ΣJ recomputed here match the function's.  Otherwise it returns None, and the Gram's
backward runs through TRL's function as through any other op.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

NODE = "ChunkedLogProbFunctionBackward"
# A clean ΣJ reaches the head in a few dozen ops; more means another path into the model.
MAX_NODES = 256
# Logits recomputed at once stay within this many elements.
WORKSPACE = 1 << 22


def _head_node(objectives: Any) -> Any:
    """The fused head's autograd node, if ΣJ depends on the model only through its first
    output (the log-probabilities); else None."""
    found = None
    stack = [objectives.grad_fn]
    seen: set[int] = set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        name = type(fn).__name__
        if len(seen) > MAX_NODES or name == "AccumulateGrad":
            return None  # a parameter reached other than through the head
        if name == NODE:
            if found is not None:
                return None
            found = fn
            continue
        for nxt, output in fn.next_functions:
            if nxt is not None and type(nxt).__name__ == NODE and output != 0:
                return None  # J uses another output of the head (entropy)
            stack.append(nxt)
    return found


class _Saved(NamedTuple):
    """What TRL's fused head function saved for its backward, and its kernel arguments."""

    hidden: Any
    weight: Any
    bias: Any
    targets: Any
    log_z: Any
    scale: float
    inv_t: float
    softcap: float | None
    compute: Any


def _saved(node: Any) -> _Saved | None:
    """The head node's saved tensors and arguments, or None in another layout than the one
    this module reads."""
    import torch

    try:
        hidden, weight, bias, targets, log_z = node.saved_tensors[:5]
        args = node.kernel_args
        scale, inv_t = float(args["logit_scale"]), float(args["inv_t"])
        softcap = float(args["softcap"]) if args["HAS_SOFTCAP"] else None
        compute = node.compute_dtype
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError):
        return None
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    if compute not in floats or hidden.dtype not in floats or weight.dtype not in floats \
            or hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1] \
            or targets.shape != (hidden.shape[0],) or log_z.shape != targets.shape:
        return None
    return _Saved(hidden, weight, bias, targets, log_z, scale, inv_t, softcap, compute)


def _tiles(saved: _Saved, grad: Any) -> Iterator[tuple[slice, Any, Any, Any]]:
    """Per tile of rows: (rows, z, lse, dz), as TRL's backward computes them: logits z in
    the compute dtype, their statistics and the gradient dz at the logits of g·log p in
    float32 (``grad`` = g, the gradient at the log-probabilities)."""
    import torch

    acc = torch.float32
    w = saved.weight.detach().to(saved.compute)
    b = None if saved.bias is None else saved.bias.detach().to(saved.compute)
    h = saved.hidden.detach()
    step = max(1, WORKSPACE // max(1, int(w.shape[0])))
    for first in range(0, int(h.shape[0]), step):
        rows = slice(first, first + step)
        tile = h[rows].to(saved.compute) @ w.T
        if b is not None:
            tile = tile + b
        y = tile.to(acc) * saved.scale
        t = None
        if saved.softcap is not None:  # TRL's soft cap: softcap · tanh(y / softcap)
            t = torch.tanh(y / saved.softcap)
            y = saved.softcap * t
        z = y * saved.inv_t
        lse = torch.logsumexp(z, dim=1)
        g = grad[rows].to(acc).unsqueeze(1)
        dz = torch.exp(z - lse.unsqueeze(1)).mul_(-g)
        dz.scatter_add_(1, saved.targets[rows].unsqueeze(1), g)  # d log p / dz = onehot − p
        dz.mul_(saved.inv_t * saved.scale)
        if t is not None:
            dz.mul_(1 - t * t)
        yield rows, z, lse, dz


def head_start(objectives: Any) -> tuple[Any, Any] | None:
    """(hidden, ∂ΣJ/∂hidden) at the input of TRL's fused LM head, or None (see the module
    docstring)."""
    import torch

    node = _head_node(objectives)
    saved = None if node is None else _saved(node)
    if saved is None or not saved.hidden.requires_grad:
        return None  # TRL's own backward runs
    try:  # the gradient at the head's output alone (an older torch takes no GradientEdge)
        from torch.autograd.graph import GradientEdge

        (grad,) = torch.autograd.grad(objectives.sum(), [GradientEdge(node, 0)],
                                      retain_graph=True)
    except (ImportError, TypeError):
        return None
    # As TRL's backward: that gradient rounded to the compute dtype, its product with the
    # weight accumulated in float32.
    acc = torch.float32
    tol = max(1e-4, 4 * torch.finfo(saved.compute).eps)
    w_acc = saved.weight.detach().to(saved.compute).to(acc)
    h, log_z = saved.hidden, saved.log_z
    out = torch.empty(h.shape, dtype=acc, device=h.device)
    terms = torch.empty(h.shape[0], dtype=acc, device=h.device)  # g · log p per token
    error = torch.empty(h.shape[0], dtype=acc, device=h.device)  # |log Z − TRL's log Z|
    with torch.autocast(h.device.type, enabled=False):
        for rows, z, lse, dz in _tiles(saved, grad):
            error[rows] = (lse - log_z[rows]).abs_()
            terms[rows] = (z.gather(1, saved.targets[rows].unsqueeze(1)).squeeze(1) - lse) \
                * grad[rows].to(acc)
            out[rows] = dz.to(saved.compute).to(acc) @ w_acc
    total = objectives.detach().sum().to(acc)
    if not (bool((error <= tol * (1 + log_z.abs())).all())
            and abs(float(terms.sum() - total)) <= tol * float(terms.abs().sum() + total.abs())):
        return None
    return h, out.to(h.dtype)

