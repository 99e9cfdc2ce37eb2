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

from typing import Any

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


def head_start(objectives: Any) -> tuple[Any, Any] | None:
    """(hidden, ∂ΣJ/∂hidden) at the input of TRL's fused LM head, or None (see the module
    docstring)."""
    import torch

    node = _head_node(objectives)
    if node is None:
        return None
    try:
        hidden, weight, bias, targets, log_z = node.saved_tensors[:5]
        args = node.kernel_args
        scale, inv_t = float(args["logit_scale"]), float(args["inv_t"])
        softcap = float(args["softcap"]) if args["HAS_SOFTCAP"] else None
        compute = node.compute_dtype
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError):
        return None  # another layout than the one this reads: TRL's own backward runs
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    if compute not in floats or hidden.dtype not in floats or weight.dtype not in floats \
            or hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1] \
            or targets.shape != (hidden.shape[0],) or log_z.shape != targets.shape \
            or not hidden.requires_grad:
        return None
    try:  # the gradient at the head's output alone (an older torch takes no GradientEdge)
        from torch.autograd.graph import GradientEdge

        (grad,) = torch.autograd.grad(objectives.sum(), [GradientEdge(node, 0)],
                                      retain_graph=True)
    except (ImportError, TypeError):
        return None
    # As TRL's backward: logits in the compute dtype, their statistics and gradient in
    # float32, that gradient rounded to the compute dtype, its product accumulated in float32.
    acc = torch.float32
    tol = max(1e-4, 4 * torch.finfo(compute).eps)
    w = weight.detach().to(compute)
    b = None if bias is None else bias.detach().to(compute)
    w_acc = w.to(acc)
    h = hidden.detach()
    out = torch.empty(h.shape, dtype=acc, device=h.device)
    terms = torch.empty(h.shape[0], dtype=acc, device=h.device)  # g · log p per token
    error = torch.empty(h.shape[0], dtype=acc, device=h.device)  # |log Z − TRL's log Z|
    step = max(1, WORKSPACE // max(1, int(w.shape[0])))
    with torch.autocast(h.device.type, enabled=False):
        for first in range(0, int(h.shape[0]), step):
            rows = slice(first, first + step)
            tile = h[rows].to(compute) @ w.T
            if b is not None:
                tile = tile + b
            y = tile.to(acc) * scale
            t = None
            if softcap is not None:  # TRL's soft cap: softcap · tanh(y / softcap)
                t = torch.tanh(y / softcap)
                y = softcap * t
            z = y * inv_t
            lse = torch.logsumexp(z, dim=1)
            error[rows] = (lse - log_z[rows]).abs_()
            g = grad[rows].to(acc).unsqueeze(1)
            target = targets[rows].unsqueeze(1)
            terms[rows] = (z.gather(1, target) - lse.unsqueeze(1)).mul_(g).squeeze(1)
            dz = torch.exp(z - lse.unsqueeze(1)).mul_(-g)
            dz.scatter_add_(1, target, g)  # d log p_target / dz = onehot − p
            dz.mul_(inv_t * scale)
            if t is not None:
                dz.mul_(1 - t * t)
            out[rows] = dz.to(compute).to(acc) @ w_acc
    total = objectives.detach().sum().to(acc)
    if not (bool((error <= tol * (1 + log_z.abs())).all())
            and abs(float(terms.sum() - total)) <= tol * float(terms.abs().sum() + total.abs())):
        return None
    return hidden, out.to(hidden.dtype)
