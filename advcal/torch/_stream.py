"""The streamed backward of :class:`~advcal.torch.GradientCapture`: a record per call of a
covered layer, the matching of checkpointed calls to their recomputation, and the stream
that turns each output gradient δ into its layer's contribution as the backward reaches
it, then lets it go."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from advcal.torch._accumulate import (
    _Blocks,
    _OneHot,
    _Rows,
)
from advcal.torch._layers import _torch


class _Call:
    """One recorded call of a covered layer (or lookup of a tied embedding): its input
    (kept only when a product reads it), and its output's autograd node rather than the
    output itself, so that the capture holds no activation the graph does not hold."""

    __slots__ = ("owner", "order", "pos", "x", "x_ref", "recompute", "edge", "x_version",
                 "x_shape", "node", "output_nr", "shape", "view", "rebased", "lookup",
                 "frame", "slot")

    def __init__(self, owner: int, order: int, x: Any, keep: bool, y: Any,
                 lookup: bool, frame: Any = None, slot: int = 0) -> None:
        self.owner = owner  # the layer's index (the embedding's, for a lookup)
        self.order = order  # forward order among all calls
        self.pos = -1  # index among gram()'s calls
        # Inside non-reentrant activation checkpointing the graph does not keep the input:
        # gram() takes it from the recomputation instead (held only weakly until then).
        # ``frame`` is the checkpoint's, and ``slot`` the number of earlier calls of the
        # layer in it: its recomputation runs the calls again in the same order.
        self.recompute = recompute = keep and frame is not None
        self.frame = weakref.ref(frame) if recompute else None
        self.slot = slot
        self.x = x if keep and not recompute else None
        self.x_ref = weakref.ref(x) if recompute else None
        self.edge = None if lookup or not x.requires_grad else _gradient_edge(x)
        self.x_version = x._version
        self.x_shape = tuple(x.shape)
        self.node = y.grad_fn
        self.output_nr = y.output_nr
        self.shape = tuple(y.shape)
        self.view = bool(y._is_view())
        self.rebased = False  # δ comes at the view's base (an in-place edit bypassed it)
        self.lookup = lookup


def _gradient_edge(tensor: Any) -> Any:
    """The autograd edge of ``tensor`` (its node and output number), which gram()'s
    backward may differentiate to without the capture holding the tensor."""
    from torch.autograd.graph import get_gradient_edge

    return get_gradient_edge(tensor)


def _checkpoint_frame(torch: Any) -> tuple[Any, bool]:
    """The non-reentrant activation checkpoint the code runs in (torch.utils.checkpoint's
    frame of the innermost saved-tensor hooks), and whether it runs as the checkpoint's
    recomputation in the backward rather than as the forward; (None, False) outside one,
    or where torch's checkpoint is not built as this function knows it (then the capture
    keeps the inputs itself)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    hooks: Any = top(False) if top is not None else None
    if not hooks:
        return None, False
    pack = hooks[0]
    recomputing = "_recomputation_hook" in getattr(pack, "__qualname__", "") or \
        "_recomputation_hook" in getattr(getattr(pack, "__wrapped__", None), "__qualname__", "")
    # the forward's pack hook closes over the frame; the recomputation's over a weak
    # reference to it (inside the wrapper torch._dynamo.disable puts around it)
    stack, seen = [(pack, 0)], set()
    while stack:
        fn, depth = stack.pop()
        if id(fn) in seen or depth > 3:
            continue
        seen.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(value, weakref.ref):
                value = value()
            if type(value).__name__ == "_CheckpointFrame":
                return value, recomputing
            if callable(value):
                stack.append((value, depth + 1))
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            stack.append((wrapped, depth + 1))
    return None, False


class _Unit:
    """One piece of the Gram's work: a layer's trainable weight and bias over its calls, or,
    for a parameter that several covered layers share, that parameter over the calls of
    every layer using it (its gradient is the sum over its uses, so K needs the cross terms
    between the uses).  ``index`` is the first layer's, for the sketch's per-layer seeds."""

    __slots__ = ("index", "name", "weight", "bias")

    def __init__(self, index: int, name: str, weight: bool, bias: bool) -> None:
        self.index = index
        self.name = name
        self.weight = weight
        self.bias = bias


def _shorten(names: list[str], most: int = 8) -> str:
    """A list of layer names for a message, the first ``most`` of them."""
    if len(names) <= most:
        return str(names)
    return f"{names[:most]} and {len(names) - most} more"


def _modified_output(name: str) -> ValueError:
    return ValueError(f"layer {name!r}: its output was modified in place after the layer "
                      "ran, and its output is not the whole product of its weight, so the "
                      "gradient at the layer cannot be read.")


def _reaches(root: Any, targets: set[int], leaves: set[int]) -> tuple[dict[int, bool],
                                                                        list[Any]]:
    """For every autograd node below ``root`` (by id), whether a path leads from it to a
    node in ``targets`` or to the gradient accumulator of a leaf in ``leaves``: the nodes
    ``torch.autograd.grad`` runs for those inputs.  Also the visited nodes, whose Python
    wrappers must stay alive while their ids are used."""
    reach: dict[int, bool] = {}
    keep: list[Any] = []
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        key = id(node)
        if expanded:
            hit = key in targets or (bool(leaves) and id(getattr(node, "variable", None))
                                     in leaves)
            reach[key] = hit or any(child is not None and reach[id(child)]
                                    for child, _ in node.next_functions)
            continue
        if key in reach:
            continue
        reach[key] = False  # visited; final once its children are (a DAG has no cycle)
        keep.append(node)
        stack.append((node, True))
        stack.extend((child, False) for child, _ in node.next_functions
                     if child is not None and id(child) not in reach)
    return reach, keep


class _Stream:
    """gram()'s work, done while the backward runs: each covered output's δ is handed to
    its units as the backward reaches the layer; a unit is done as soon as the δ of all
    its calls arrived, and its δ and inputs are then released.  Only units of several
    calls (a layer called several times, a shared parameter, a tied embedding) hold δ
    while their other calls' arrive."""

    def __init__(self, capture: Any, calls: list[_Call], units: list[_Unit],
                 unit_calls: list[list[tuple[int, bool]]], n: int, blocks: _Blocks,
                 rows: _Rows, acc: Any) -> None:
        self.torch = _torch()
        self.capture = capture
        self.units = units
        self.n, self.blocks, self.rows, self.acc = n, blocks, rows, acc
        # (min, max) of each unit's δ and input, reductions on the device that propagate
        # NaN, read only when K is not finite: one tensor, so that the layers leave no small
        # allocations behind between the backward's large ones (which would fragment the
        # heap the backward allocates from)
        self.extremes = self.torch.zeros(len(units), 2, 2, dtype=blocks.dtype,
                                         device=blocks.device)
        self.device_type = blocks.device.type
        self.call_units: list[list[tuple[int, bool]]] = [[] for _ in calls]
        for unit, uses in enumerate(unit_calls):
            for pos, swap in uses:
                self.call_units[pos].append((unit, swap))
        self.pending: list[dict[int, tuple[Any, Any]]] = [{} for _ in units]
        self.remaining = [len(uses) for uses in unit_calls]
        self.done = [not uses for uses in unit_calls]
        self.sketching = capture._sketch_dim is not None
        # sketched: per unit, its calls' rows summed so far (weight, bias)
        self.sums: list[Any] = [None] * len(units)
        self.seen: set[int] = set()
        self.arrived = 0
        # (checkpoint, layer, slot) -> the call whose input comes from that recomputation
        self.recomputed: dict[tuple[int, int, int], _Call] = {}
        self.layers_recomputed: set[int] = set()
        self.frames: list[Any] = []  # holds them: their ids key ``recomputed``
        for call in calls:
            frame = call.frame() if call.frame is not None else None
            if frame is not None:
                self.frames.append(frame)
                self.recomputed[(id(frame), call.owner, call.slot)] = call
                self.layers_recomputed.add(call.owner)
        self.runs: dict[tuple[int, int], int] = {}  # calls of a layer seen per recomputation
        self.waiting: dict[int, Any] = {}  # δ that arrived before their input

    def prehook(self, group: list[_Call]) -> Callable[[tuple[Any, ...]], None]:
        def hook(grads: tuple[Any, ...]) -> None:
            for call in group:
                delta = grads[call.output_nr] if call.output_nr < len(grads) else None
                if delta is not None and call.pos not in self.seen:
                    self.arrive(call, delta)

        return hook

    def recompute_hook(self, index: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            # the checkpoint's recomputation runs the recorded calls with gradients enabled
            # (calls under no_grad were not recorded and take no slot)
            if not self.torch.is_grad_enabled():
                return
            frame, recomputing = _checkpoint_frame(self.torch)
            if frame is None or not recomputing:
                return
            key = (id(frame), index)
            slot = self.runs.get(key, 0)
            self.runs[key] = slot + 1
            call = self.recomputed.get((id(frame), index, slot))
            if call is not None and call.x is None:
                x = args[0] if args else next(iter(kwargs.values()))
                call.x, call.x_ref = x.detach(), None
                delta = self.waiting.pop(call.pos, None)
                if delta is not None:
                    self.deliver(call, delta)

        return hook

    def check_recomputed(self) -> None:
        if self.waiting:
            names = [self.capture._call_name(call) for call in self.recomputed.values()
                     if call.pos in self.waiting]
            self.waiting.clear()
            raise ValueError(f"layers {_shorten(names)}: the recomputation of their "
                             "activation checkpoint did not run them, so their inputs "
                             "are unknown and K cannot cover them.")

    def arrive(self, call: _Call, delta: Any) -> None:
        if call.rebased and tuple(delta.shape) != call.shape:
            # the base of the output's view: the same numbers, unless the view took only part
            # of it (a layer returning a slice of its product)
            if delta.numel() != int(np.prod(call.shape)):
                raise _modified_output(self.capture._call_name(call))
            delta = delta.reshape(call.shape)
        self.seen.add(call.pos)
        self.arrived += 1
        if call.recompute and call.x is None:  # its recomputation has not run yet
            self.waiting[call.pos] = delta
            return
        self.deliver(call, delta)

    def deliver(self, call: _Call, delta: Any) -> None:
        torch = self.torch
        with torch.autocast(self.device_type, enabled=False), torch.no_grad():
            if call.lookup:
                # the lookups as a linear layer's calls: input the δ at the lookup, output
                # gradient the one-hot rows of the ids
                module = self.capture._embeddings[call.owner][1]
                ids = call.x
                assert ids is not None
                x, d = delta, _OneHot(ids.to(delta.device), int(module.weight.shape[0]),
                                      module.padding_idx)
            else:
                x, d = (None if call.x is None else call.x.detach()), delta
            call.x = None  # from here on only the units' pending pairs hold it
            for unit, swap in self.call_units[call.pos]:
                pair = (d, x) if swap else (x, d)
                self.remaining[unit] -= 1
                if self.sketching:
                    # each call's sketch now; a unit of several calls sums them
                    rows = self.capture._sketch_call(self.units[unit], pair[0], pair[1],
                                                     self.n, self.acc, self.rows.capacity,
                                                     self.extremes[unit])
                    sums = self.sums[unit]
                    self.sums[unit] = rows if sums is None else [
                        a if b is None else b if a is None else a.add_(b)
                        for a, b in zip(sums, rows, strict=True)]
                else:
                    self.pending[unit][call.pos] = pair
                if self.remaining[unit] == 0:
                    self.run(unit)

    def run(self, unit: int) -> None:
        """Add ``unit`` to the blocks, its calls in forward order, and release them."""
        self.done[unit] = True
        self.rows.key = unit
        sums, self.sums[unit] = self.sums[unit], None
        if sums is not None:
            for part in reversed(sums):  # the bias's rows first
                if part is not None:
                    self.rows.add(part)
        pending, self.pending[unit] = self.pending[unit], {}
        if pending:
            pairs = [pending[pos] for pos in sorted(pending)]
            del pending
            self.capture._accumulate(self.units[unit], pairs, self.n, self.blocks, self.rows,
                                     self.acc, self.extremes[unit])

    def finish(self, dense: bool) -> Any:
        """The blocks, once the units some of whose δ never came are added too."""
        torch = self.torch
        with torch.autocast(self.device_type, enabled=False), torch.no_grad():
            for unit, done in enumerate(self.done):
                if not done:
                    self.run(unit)
            self.rows.flush()
            return self.blocks.result(dense).to(self.acc)
