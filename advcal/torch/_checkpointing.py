"""Reentrant activation checkpointing, as transformers sets it on a model, run as
non-reentrant checkpointing while a :class:`~advcal.torch.GradientCapture` records.

A reentrant checkpoint runs its forward without gradients and recomputes it inside its own
backward, which ``torch.autograd.grad`` cannot enter, so no covered layer inside it would
ever see its output gradient.  Both variants run the same function again in the backward
and give the same gradients; the non-reentrant one can be differentiated by
``torch.autograd.grad``.  So while a capture records, every module whose checkpointing
function (``_gradient_checkpointing_func``, set by ``gradient_checkpointing_enable``) is
reentrant ``torch.utils.checkpoint.checkpoint`` gets the non-reentrant one, and its own is
put back when the capture's ``with`` block ends.  A reentrant checkpoint the capture could
not swap (one the model's own code calls) is found in the graph and refused.
"""

from __future__ import annotations

import functools
from typing import Any

from advcal.torch._layers import _torch

ATTRIBUTE = "_gradient_checkpointing_func"

# Why a reentrant checkpoint that is still there (one the capture could not swap) is refused.
REENTRANT = (
    "reentrant checkpointing (torch.utils.checkpoint.checkpoint(..., use_reentrant=True)) "
    "runs the checkpointed forward without gradients and cannot be differentiated by "
    "torch.autograd.grad; a capture runs the checkpointing that transformers' "
    "gradient_checkpointing_enable sets non-reentrant while it records, but not a call in "
    "the model's own code (give it use_reentrant=False) nor one made after the capture "
    "that swapped it exited.")


def reentrant_below(fn: Any) -> bool:
    """Whether the autograd graph below the node ``fn`` holds a reentrant checkpoint
    (torch.utils.checkpoint's CheckpointFunction)."""
    seen = {id(fn)}
    stack = [fn]
    while stack:
        node = stack.pop()
        if type(node).__name__ == "CheckpointFunctionBackward":
            return True
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None and id(nxt) not in seen:
                seen.add(id(nxt))
                stack.append(nxt)
    return False


def _reentrant(fn: Any) -> bool:
    """Whether ``fn`` is ``functools.partial(torch.utils.checkpoint.checkpoint, ...)``
    whose checkpoints are reentrant: ``use_reentrant`` true, or not given or None (torch's
    choice then, with a warning)."""
    checkpoint = _torch().utils.checkpoint.checkpoint
    if not (isinstance(fn, functools.partial) and fn.func is checkpoint and not fn.args):
        return False
    flag = fn.keywords.get("use_reentrant")
    return flag is None or bool(flag)


class NonReentrant:
    """A module's checkpointing function, non-reentrant.  Calls that reentrant checkpointing
    would treat differently go to the original: under ``no_grad`` or with no input that needs
    a gradient (reentrant checkpointing gives the parameters inside no gradient then), and
    with keyword arguments (which it refuses)."""

    def __init__(self, original: functools.partial[Any]) -> None:
        self.original = original

    def __call__(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        torch = _torch()
        if kwargs or not torch.is_grad_enabled() or not any(
                torch.is_tensor(a) and a.requires_grad for a in args):
            return self.original(function, *args, **kwargs)
        options = dict(self.original.keywords, use_reentrant=False)
        return self.original.func(function, *args, **options)


def run_non_reentrant(model: Any, swapped: list[tuple[Any, Any]]) -> None:
    """Give every submodule of ``model`` with a reentrant checkpointing function the
    non-reentrant one, appending to ``swapped`` what :func:`restore` needs to put each
    back (as it goes, so that an error part-way leaves nothing it cannot restore)."""
    for module in model.modules():
        fn = module.__dict__.get(ATTRIBUTE)
        if fn is not None and _reentrant(fn):
            swapped.append((module, fn))
            setattr(module, ATTRIBUTE, NonReentrant(fn))


def restore(swapped: list[tuple[Any, Any]]) -> None:
    """Put back the checkpointing functions :func:`run_non_reentrant` replaced (those that
    were not replaced again since)."""
    for module, fn in swapped:
        current = module.__dict__.get(ATTRIBUTE)
        if isinstance(current, NonReentrant) and current.original is fn:
            setattr(module, ATTRIBUTE, fn)
