"""Per-response policy-gradient Gram matrices of a torch policy (SetGRPO's K).

GGSR needs, per group, K_ij = ⟨g_i, g_j⟩ with g_i the gradient of response i's policy
objective J_i.  For a linear layer y = W h + b, ∇_W J_i = Σ_{t∈i} δ_t h_tᵀ with δ_t = ∂J/∂y_t,
so one forward pass (hooks record every selected layer's input h and its output's autograd
node) and one backward pass of ΣJ give every δ: responses are independent rows of the batch,
so ∂(Σ_j J_j)/∂y_t = ∂J_i/∂y_t for a token t of response i.  The δ are streamed: a hook on
each output's node turns δ into the layer's contribution when the backward reaches it, so
they are never held all at once; inside non-reentrant activation checkpoints the layer's
input comes from the checkpoint's recomputation.

Exact mode sums, layer by layer and group by group, the cheaper of two exact routes:
materialising G_i = Δ_iᵀ H_i (about T·d_in·d_out per response), or token pairs
Σ_{t,s} ⟨δ_t, δ_s⟩⟨h_t, h_s⟩ (about (n·T)²·(d_in + d_out) per group).  Sketched mode keeps
(P_out Δ_iᵀ)(H_i P_inᵀ) with seeded Gaussian or Rademacher P scaled so that E[K̂] = K.

Nothing here writes ``.grad`` or frees the graph: the trainer's own backward pass still runs
afterwards and gives the same gradients.  This module imports torch only when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from advcal.torch._accumulate import (
    _Blocks,
    _check_finite,
    _Collect,
    _extend,
    _group_layout,
    _OneHot,
    _projection,
    _Rows,
    _sketch_sides,
)
from advcal.torch._checkpointing import (
    REENTRANT,
    reentrant_below,
    restore,
    run_non_reentrant,
)
from advcal.torch._layers import LayerSelection, _by_rule, _resolve_layers, _torch
from advcal.torch._packing import _Packing
from advcal.torch._stream import (
    _Call,
    _checkpoint_frame,
    _reaches,
    _shorten,
    _Stream,
    _Unit,
)

__all__ = ["GradientCapture"]


SKETCHES = ("gaussian", "rademacher")


OUTPUTS = ("numpy", "tensor")


class GradientCapture:
    """Capture a forward pass; return per-response policy-gradient Gram matrices.

    Used as a context manager around the forward pass that produces the per-response
    objectives J_i (one scalar per response, e.g. from :func:`response_objectives`); then
    :meth:`gram` returns K_ij = ⟨∇J_i, ∇J_j⟩ over the selected layers' trainable parameters,
    group by group, in the layouts :func:`advcal.setgrpo` and :func:`advcal.select_threshold`
    take.  Nothing is written into ``.grad`` and the graph is kept, so the trainer's own
    ``backward`` runs afterwards unchanged.

    Parameters
    ----------
    model : torch.nn.Module
        The policy.  Its rows along ``batch_dim`` must be independent responses (no
        batch normalisation across them).
    layers : None, "all", "lora", module, list of modules or names, or callable
        Which layers the Gram matrix covers.  ``None``/``"all"``: every ``nn.Linear`` and
        transformers ``Conv1D`` with a trainable parameter.  ``"lora"``: the LoRA adapters
        (linear layers under ``lora_A``/``lora_B`` names, as peft builds them).  A list of
        modules or names: those linear layers, and every linear layer inside a named
        container.  A callable ``(name, module) -> bool`` is asked about every linear layer
        (see :func:`last_blocks`).  Only parameters with ``requires_grad`` are covered; the
        weights of ``nn.MultiheadAttention`` are not (it does not call its projections).
    sketch_dim : int, optional
        Exact Gram matrices when None.  Otherwise each layer's gradient is projected to at
        most ``sketch_dim`` numbers by a Kronecker-structured random projection
        (P_out Δᵀ)(H P_inᵀ); the estimate is unbiased, E[K̂] = K.  Layers with at most
        ``sketch_dim`` weights and every bias are kept exactly.
    seed : int, default 0
        Seed of the projections (the same seed gives the same projections on any device).
    sketch : {"gaussian", "rademacher"}, default "gaussian"
        Distribution of the projection entries.
    batch_dim : int, default 0
        The axis of the layers' inputs and outputs that indexes responses (1 for
        sequence-first models).

    Attributes
    ----------
    layers : list of str
        Names of the layers the Gram matrix covers; after :meth:`gram`, only those that ran
        with gradients in the forward pass (as :meth:`parameters`).

    Examples
    --------
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> from advcal.torch import GradientCapture
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
    ...                             torch.nn.Linear(4, 1)).double()
    >>> x = torch.randn(4, 3, dtype=torch.float64)
    >>> with GradientCapture(model) as capture:
    ...     objectives = model(x)[:, 0]
    >>> gram = capture.gram(objectives, group_size=2)
    >>> gram.shape, gram.dtype
    ((2, 2, 2), dtype('float64'))
    >>> grads = [torch.cat([g.reshape(-1) for g in torch.autograd.grad(
    ...     j, list(model.parameters()), retain_graph=True)]) for j in model(x)[:, 0]]
    >>> bool(abs(gram[1, 0, 1] - grads[2] @ grads[3]) < 1e-12)
    True
    """

    def __init__(self, model: Any, layers: Any = None, *, sketch_dim: int | None = None,
                 seed: int = 0, sketch: str = "gaussian", batch_dim: int = 0) -> None:
        torch = _torch()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module; got {type(model).__name__}.")
        if sketch_dim is not None and (isinstance(sketch_dim, bool)
                                       or not isinstance(sketch_dim, (int, np.integer))
                                       or sketch_dim < 1):
            raise ValueError(f"`sketch_dim` must be None or a positive integer; got "
                             f"{sketch_dim!r}.")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"`seed` must be a non-negative integer; got {seed!r}.")
        if sketch not in SKETCHES:
            raise ValueError(f"`sketch` must be one of {SKETCHES}; got {sketch!r}.")
        if isinstance(batch_dim, bool) or not isinstance(batch_dim, (int, np.integer)):
            raise TypeError(f"`batch_dim` must be an integer; got {batch_dim!r}.")
        self._model = model
        if isinstance(layers, LayerSelection):  # resolved by the caller for an earlier batch
            if layers.model is not model:
                raise ValueError("`layers`: this selection was resolved for another model.")
            self._layers, self._named = layers.layers, layers.named
        else:
            self._layers, self._named = _resolve_layers(model, layers), not _by_rule(layers)
        self._sketch_dim = None if sketch_dim is None else int(sketch_dim)
        self._seed = int(seed)
        self._sketch = sketch
        self._batch_dim = int(batch_dim)
        self._handles: list[Any] = []
        self._swapped: list[tuple[Any, Any]] = []
        self._records: list[list[_Call]] | None = None
        self._count = 0  # calls recorded so far: their forward order
        self._silent: set[int] = set()
        self._nograd: set[int] = set()  # layers that ran with gradients disabled
        uses: dict[int, int] = {}
        for layer in self._layers:
            for p in layer.parameters():
                uses[id(p)] = uses.get(id(p), 0) + 1
        self._shared = {key for key, count in uses.items() if count > 1}
        # Embeddings that look up a covered weight (a tied LM head): the weight's gradient
        # includes their use, recorded by hooks of their own.
        weights = {id(layer.module.weight) for layer in self._layers if layer.weight}
        self._embeddings = [(name, m) for name, m in model.named_modules()
                            if isinstance(m, torch.nn.Embedding) and id(m.weight) in weights]
        for name, m in self._embeddings:
            if m.scale_grad_by_freq:
                raise ValueError(f"`layers`: the Embedding {name!r} shares a covered weight "
                                 "and has scale_grad_by_freq=True, whose gradient depends on "
                                 "the whole batch, not on one response; leave the layer "
                                 "that shares its weight out.")
            self._shared.add(id(m.weight))
        self._looked_up: list[list[_Call]] = [[] for _ in self._embeddings]
        self._packing: _Packing | None = None  # a packed batch's token map, during gram()
        self._state = "new"

    @property
    def layers(self) -> list[str]:
        # after gram(), as parameters(): a layer chosen by a rule that did not run with
        # gradients is not covered
        return [layer.name for i, layer in enumerate(self._layers) if i not in self._silent]

    def parameters(self) -> list[Any]:
        """The parameters whose gradients the Gram matrix covers, layer by layer, each once
        (a parameter shared by several layers comes with the first); after :meth:`gram`,
        only those of the selected layers that ran in the forward pass."""
        params = [p for i, layer in enumerate(self._layers) if i not in self._silent
                  for p in layer.parameters()]
        return list({id(p): p for p in params}.values()) if self._shared else params

    # ------------------------------------------------------------------ hooks

    def __enter__(self) -> GradientCapture:
        if self._state != "new":
            raise ValueError("this GradientCapture was already used: a capture records one "
                             "forward pass; create a new one for each batch.")
        self._state = "recording"
        self._records = [[] for _ in self._layers]
        try:
            # transformers' reentrant checkpointing, whose layers no backward could reach
            # with torch.autograd.grad, recorded as non-reentrant (the same gradients)
            run_non_reentrant(self._model, self._swapped)
            for index, layer in enumerate(self._layers):
                self._handles.append(layer.module.register_forward_hook(
                    self._hook(index), with_kwargs=True))
            for index, (_, module) in enumerate(self._embeddings):
                self._handles.append(module.register_forward_hook(self._lookup_hook(index)))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove()
        if self._state == "recording":  # gram() inside the block already consumed it
            self._state = "recorded"

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        restore(self._swapped)
        self._swapped = []

    def _hook(self, index: int) -> Callable[..., None]:
        torch = _torch()
        records = self._records
        assert records is not None
        # a bias alone needs no input: the capture keeps only what the products read
        keep = self._layers[index].weight

        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
                 ) -> None:
            if self._state != "recording":
                return  # gram()'s backward re-running a checkpointed layer: not a forward
            if not (torch.is_tensor(output) and output.requires_grad):
                # under no_grad (e.g. old log-probabilities): nothing to differentiate; or
                # inside a reentrant checkpoint, whose forward runs without gradients
                self._nograd.add(index)
                return
            x = args[0] if args else next(iter(kwargs.values()))
            frame, recomputing = _checkpoint_frame(torch) if keep else (None, False)
            if recomputing:  # a backward inside the forward: not a checkpointed forward
                frame = None
            slot = sum(1 for call in records[index]
                       if call.frame is not None and call.frame() is frame)
            records[index].append(_Call(index, self._count, x, keep, output, False,
                                        frame, slot))
            self._count += 1

        return hook

    def _lookup_hook(self, index: int) -> Callable[..., None]:
        torch = _torch()
        calls = self._looked_up[index]

        def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
            if self._state == "recording" and torch.is_tensor(output) \
                    and output.requires_grad and args and torch.is_tensor(args[0]):
                calls.append(_Call(index, self._count, args[0].detach(), True, output, True))
                self._count += 1

        return hook

    # ------------------------------------------------------------------ Gram

    def gram(self, objectives: Any, offsets: Any = None, group_ids: Any = None, *,
             group_size: int | None = None, output: str = "numpy",
             start: tuple[Any, Any] | None = None, tokens: Any = None) -> Any:
        """Gram matrices of the responses' policy gradients, group by group.

        Call it after the forward pass (inside or after the ``with`` block) and before the
        trainer's ``backward`` (which frees the graph).  Once per capture: it releases the
        recorded activations.

        Parameters
        ----------
        objectives : torch.Tensor, shape (N,)
            One scalar objective per response, computed from the forward pass under this
            capture (:func:`response_objectives`); response i must be row i of the batch.
        offsets : array_like of int, shape (B + 1,), optional
            CSR group boundaries: flat row-major n_q × n_q blocks in group order.
        group_ids : sequence of hashable, length N, or GroupIndex, optional
            Per-response group labels: flat blocks, groups in order of first appearance,
            rows in the responses' order within a group (as :func:`advcal.setgrpo` takes
            them with ``group_ids``).  The :func:`advcal.groups_from_ids` of the labels may
            be passed instead, when the caller has it already.
        group_size : int, optional
            Consecutive groups of ``group_size`` responses: ``(B, G, G)`` blocks, for dense
            ``(B, G)`` rewards.
        output : {"numpy", "tensor"}, default "numpy"
            A float64 numpy array, or a tensor on the model's device in the accumulation
            dtype (float64 for float64 models, float32 otherwise).
        start : (torch.Tensor, torch.Tensor), optional
            ``(tensor, gradient of objectives.sum() at it)``: the backward to the covered
            layers starts there instead of at the objectives, for a caller that computed
            that gradient itself (the TRL integration does, at the input of TRL's fused LM
            head, to skip the head's recomputation).  Every path from the objectives to the
            covered layers must pass through ``tensor``.
        tokens : array_like of int, shape (L,), optional
            A packed batch: the covered layers see every response's tokens along one axis
            of L tokens (verl's ``use_remove_padding``, TRL's padding-free batches) instead
            of one row per response, and ``tokens[t]`` is the response of token t (-1 for
            a token of none).  Each layer's input and output are then read as L token rows
            (every axis but the features flattened, in order).  Build it with
            :func:`tokens_from_cu_seqlens` or :func:`tokens_from_position_ids`.

        Returns
        -------
        ndarray or torch.Tensor
            ``(B, G, G)`` with ``group_size``; flat blocks of length Σ n_q² otherwise.

        Raises
        ------
        ValueError
            Besides bad arguments: when covered layers ran inside a reentrant activation
            checkpoint that the model's code calls itself
            (``torch.utils.checkpoint.checkpoint(..., use_reentrant=True)``), or a covered
            layer's gradient flows through one, since K could not cover them (checkpointing
            set by transformers' ``gradient_checkpointing_enable`` runs non-reentrant under
            the capture, whatever its ``use_reentrant``, and is exact); when the Gram
            matrix is not finite (naming the objectives, the layers whose inputs or output
            gradients hold NaN or inf, or an overflow).
        """
        if output not in OUTPUTS:
            raise ValueError(f"`output` must be one of {OUTPUTS}; got {output!r}.")
        n = self._check_objectives(objectives)
        order, bounds, dense = _group_layout(n, offsets, group_ids, group_size)
        torch = _torch()
        out = self._run(objectives, n, tokens, start,
                        lambda acc, device: _Blocks(torch, order, bounds, acc, device), dense)
        if output == "tensor":
            return out
        return out.detach().to(device="cpu", dtype=torch.float64).numpy()

    def rows(self, objectives: Any, *, tokens: Any = None,
             start: tuple[Any, Any] | None = None) -> Any:
        """Per-response gradient rows R, one row per response, with K = R Rᵀ.

        The rows of a sketched capture are the responses' sketched gradients
        (P_out Δ_iᵀ)(H_i P_inᵀ), with layers of at most ``sketch_dim`` weights and every bias
        exact; without ``sketch_dim`` they are the exact per-response gradients of the
        covered parameters (only sensible for small parameter sets such as LoRA adapters).
        Rows are linear in the gradient, so they add up: where a group's responses run in
        several forward passes (micro-batches, data-parallel ranks), each pass's capture
        gives the rows of its responses, and :func:`gram_from_rows` makes K of their
        concatenation.  Captures of one model with the same layers, ``sketch_dim``,
        ``seed`` and ``sketch`` lay their columns out alike (the same projections, columns
        ordered by layer), so their rows can be put side by side.

        Parameters
        ----------
        objectives : torch.Tensor, shape (N,)
            As for :meth:`gram`.
        tokens : array_like of int, optional
            A packed batch's token map, as for :meth:`gram`.
        start : (torch.Tensor, torch.Tensor), optional
            Where the backward starts, as for :meth:`gram`.

        Returns
        -------
        torch.Tensor, shape (N, F)
            float64 (float32 on MPS), on the model's device.

        Raises
        ------
        ValueError
            As :meth:`gram`; also when a covered layer did not run (its columns would be
            missing, so rows of other passes could not line up).
        """
        n = self._check_objectives(objectives)
        missing = [self._layers[i].name for i, calls in enumerate(self._records or [])
                   if not calls]
        if missing:
            raise ValueError(f"`layers`: {_shorten(missing)} did not run with gradients in "
                             "this forward pass, so its rows would lack their columns and "
                             "not line up with other passes'; select only layers that run.")
        torch = _torch()
        return self._run(objectives, n, tokens, start,
                         lambda acc, device: _Collect(torch, n, acc, device), False)

    def _check_objectives(self, objectives: Any) -> int:
        torch = _torch()
        if self._state == "new":
            raise ValueError("`objectives` were not produced under this capture: run the "
                             "forward pass inside `with capture:` before gram().")
        if self._state == "done":
            raise ValueError("gram() was already called on this capture (it releases the "
                             "recorded activations); create a new GradientCapture.")
        if not torch.is_tensor(objectives):
            raise TypeError(f"`objectives` must be a torch.Tensor; got "
                            f"{type(objectives).__name__}.")
        if objectives.ndim != 1 or objectives.numel() == 0:
            raise ValueError("`objectives` must be a non-empty 1-D tensor (one scalar per "
                             f"response); got shape {tuple(objectives.shape)}.")
        if not objectives.is_floating_point():
            raise TypeError(f"`objectives` must be floating point; got {objectives.dtype}.")
        if objectives.grad_fn is None:
            raise ValueError("`objectives` has no grad_fn: compute it from the forward pass "
                             "under the capture, with gradients enabled (it depends on no "
                             "parameter that needs a gradient: with every trainable one "
                             "inside reentrant checkpoints whose inputs need none, call the "
                             "model's enable_input_require_grads()).")
        return int(objectives.shape[0])

    def _run(self, objectives: Any, n: int, tokens: Any, start: tuple[Any, Any] | None,
             sink: Callable[[Any, Any], Any], dense: bool) -> Any:
        """The streamed backward, its contributions added into ``sink(acc, device)`` (the
        groups' blocks, or the rows themselves); returns the sink's result."""
        torch = _torch()
        self._packing = None if tokens is None else _Packing(tokens, n)
        records = self._records
        assert records is not None
        root, seed = (objectives.sum(), None) if start is None else start
        # calls whose output the root does not reach add nothing to ∇J (a layer called on
        # detached work, as peft's DoRA computes its weight norm)
        reach, keep = _reaches(root.grad_fn, set(), set()) if root.grad_fn is not None \
            else ({}, [])
        flat = [call for layer_records in records for call in layer_records
                if id(call.node) in reach or call.view]
        silent = {i for i, recs in enumerate(records) if not recs}
        hidden = sorted(silent & self._nograd)
        if hidden and reentrant_below(objectives.grad_fn):
            names = [self._layers[i].name for i in hidden]
            raise ValueError(f"`layers`: {_shorten(names)} ran inside reentrant activation "
                             f"checkpointing, so K cannot cover them. {REENTRANT}")
        if not flat:
            raise ValueError("`objectives` was not produced under the capture: no selected "
                             "layer ran with gradients enabled inside the `with` block.")
        if silent and self._named:
            names = [self._layers[i].name for i in sorted(silent)]
            if hidden:
                raise ValueError(f"`layers`: {_shorten(names)} ran only with gradients "
                                 "disabled (under torch.no_grad), so K cannot cover their "
                                 "gradients; run the forward pass with gradients enabled "
                                 "or leave them out.")
            raise ValueError(f"`layers`: {_shorten(names)} did not run in the forward pass "
                             "(a fused LM head, for example, uses its weight without "
                             "calling the module), so K cannot cover their gradients; "
                             "leave them out.")
        # Chosen by a rule: K covers the layers that ran (their indices keep the sketch's
        # per-layer seeds).
        self._silent = silent
        lookups = [call for calls in self._looked_up for call in calls
                   if id(call.node) in reach]
        for call in flat:
            # only the inputs are read: an output edited in place (a residual added into
            # it) still hands its layer's node the gradient of the layer's own output
            if call.x is not None and call.x._version != call.x_version:
                raise ValueError(f"layer {self._call_name(call)!r}: its input was modified "
                                 "in place after the layer ran, so the recorded values are "
                                 "not those the gradient flowed through.")
        for call in flat:  # before anything is consumed
            name = self._call_name(call)
            self._check_rows(call.x_shape, n, name, "input")
            self._check_rows(call.shape, n, name, "output")
        for call in lookups:
            self._check_rows(call.shape, n, self._call_name(call), "output")
        self._state = "done"  # from here on the capture is consumed, even if this fails
        self._records = None
        self._looked_up = [[] for _ in self._embeddings]
        calls = flat + lookups
        del flat, lookups, records
        for pos, call in enumerate(calls):
            call.pos = pos
        params = self.parameters()
        acc = torch.float64 if torch.float64 in {p.dtype for p in params} else torch.float32
        device = params[0].device
        targets = self._targets(root, calls, (reach, keep))
        del reach, keep
        units, unit_calls = self._units(calls)
        names = [unit.name for unit in units]
        blocks = sink(acc, device)
        stream = _Stream(self, calls, units, unit_calls, n, blocks,
                         _Rows(torch, blocks, n, acc), acc)
        del units, unit_calls
        by_node: dict[int, list[_Call]] = {}
        for call in calls:
            by_node.setdefault(id(call.node), []).append(call)
        handles = []
        try:
            for group in by_node.values():
                handles.append(group[0].node.register_prehook(stream.prehook(group)))
            for index in stream.layers_recomputed:
                handles.append(self._layers[index].module.register_forward_pre_hook(
                    stream.recompute_hook(index), with_kwargs=True))
            del calls, by_node
            # The backward runs to the cheapest tensors below the covered layers (see
            # _targets); each covered layer's δ is consumed by its hook as the backward
            # reaches it, so the δ of the layers are never held all at once.
            if targets:  # none: the root reaches no covered layer
                grads = torch.autograd.grad(root, targets, grad_outputs=seed,
                                            retain_graph=True, allow_unused=True)
                del grads
            del targets
        except RuntimeError as exc:
            if "backward through the graph a second time" in str(exc):
                raise ValueError("the graph of `objectives` was freed (a backward pass ran "
                                 "first): call gram() before the trainer's backward.") from exc
            if "use_reentrant=True" in str(exc):
                # a covered layer ran before a reentrant checkpoint: its δ would need
                # autograd.grad through the checkpoint, which that mode cannot do
                raise ValueError("a covered layer's gradient flows through reentrant "
                                 "activation checkpointing, so K cannot be computed. "
                                 f"{REENTRANT}") from exc
            raise
        finally:
            for handle in handles:
                handle.remove()
            self._packing = None
        stream.check_recomputed()
        if not stream.arrived:
            raise ValueError("`objectives` was not produced under the capture: it does not "
                             "depend on any recorded layer output.")
        out = stream.finish(dense)
        _check_finite(out, objectives, names, stream.extremes)
        return out

    def _call_name(self, call: _Call) -> str:
        return self._embeddings[call.owner][0] if call.lookup else self._layers[call.owner].name

    def _targets(self, root: Any, calls: list[_Call],
                 reached: tuple[dict[int, bool], list[Any]]) -> list[Any]:
        """The tensors gram()'s backward differentiates to: as few and as cheap as possible,
        such that autograd runs the node of every covered output that the root reaches
        (it runs exactly the nodes with a path to a requested tensor).  The input of the
        first covered layer (below every later layer in a sequential model) usually does
        it alone; a layer on a branch that does not reach it adds its own input, or its
        smallest trainable parameter (the bias where it has one) when its input needs no
        gradient.  ``reached`` is ``_reaches(root.grad_fn, set(), set())``, computed once by
        the caller.  A view output that an in-place edit bypassed takes the node of its base
        (down its chain of views), where δ then arrives."""
        torch = _torch()
        root_fn = root.grad_fn
        if root_fn is None:
            return [root] if root.requires_grad else []
        reach, keep = reached  # _reaches(root_fn, set(), set()); keep: ids stay valid
        reachable = set(reach)
        for call in calls:
            if id(call.node) not in reachable and call.view:
                # an in-place edit of a view output (a linear layer's 3-D output is a view
                # of its 2-D product) rebased its history past its node: δ arrives at the
                # view's base instead, and is read in the output's shape (see deliver)
                # (down a chain of views to the first node the root still reaches)
                node, base = call.node, None
                for _ in range(8):
                    children = [(child, nr) for child, nr in node.next_functions
                                if child is not None]
                    if len(children) != 1:
                        break
                    if id(children[0][0]) in reachable:
                        base = children[0]
                        break
                    node = children[0][0]
                if base is not None:
                    call.node, call.output_nr = base
                    call.rebased = True
        live = sorted((call for call in calls if id(call.node) in reachable),
                      key=lambda call: call.order)
        nodes = {id(call.node) for call in calls}
        targets: list[Any] = []
        target_nodes: set[int] = set()
        leaves: set[int] = set()
        anchors: list[Any] = []  # keeps the target nodes' wrappers (and their ids) alive

        def add(target: Any) -> None:
            if any(target is t for t in targets):
                return
            targets.append(target)
            if torch.is_tensor(target):  # a parameter
                leaves.add(id(target))
            else:  # the gradient edge of a layer's input
                anchors.append(target.node)
                target_nodes.add(id(target.node))

        for attempt in range(3):
            uncovered = [call for call in live if not reach[id(call.node)]]
            if not uncovered:
                return targets
            if attempt == 2:
                break
            call = uncovered[0]
            if call.edge is not None and id(call.edge.node) not in nodes:
                add(call.edge)
            else:
                add(self._smallest_parameter(call))
            reach, keep = _reaches(root_fn, target_nodes, leaves)
        for call in uncovered:
            add(self._smallest_parameter(call))
        reach, keep = _reaches(root_fn, target_nodes, leaves)
        missed = [self._call_name(call) for call in live if not reach[id(call.node)]]
        if missed:
            raise ValueError(f"layers {_shorten(missed)}: their outputs do not depend on "
                             "their own parameters in the autograd graph, so their output "
                             "gradients cannot be captured.")
        return targets

    def _smallest_parameter(self, call: _Call) -> Any:
        if call.lookup:
            return self._embeddings[call.owner][1].weight
        layer = self._layers[call.owner]
        return layer.module.bias if layer.bias else layer.module.weight

    def _units(self, calls: list[_Call]) -> tuple[list[_Unit], list[list[tuple[int, bool]]]]:
        """The Gram's work: per unit (see ``_Unit``) its calls, as (position in ``calls``,
        whether input and output gradient swap roles).  One unit per layer, unless covered
        layers share a parameter: then the shared parameter is one unit over the calls of
        all its layers, as one layer called several times is, and the lookups of an
        embedding that shares a covered weight join that weight's unit."""
        units = [_Unit(index, layer.name, layer.weight, layer.bias)
                 for index, layer in enumerate(self._layers)]
        per_layer: list[list[tuple[int, bool]]] = [[] for _ in self._layers]
        tied: dict[int, list[tuple[int, bool]]] = {}
        for call in calls:
            if call.lookup:
                weight = self._embeddings[call.owner][1].weight
                tied.setdefault(id(weight), []).append((call.pos, False))
            else:
                per_layer[call.owner].append((call.pos, False))
        if not self._shared:
            return units, per_layer
        torch = _torch()
        out: list[_Unit] = []
        work: list[list[tuple[int, bool]]] = []
        slots: dict[int, int] = {}  # id(parameter) -> its unit in ``out``
        linear: dict[int, bool] = {}  # id(weight) -> orientation of its first use
        for unit, layer, pairs in zip(units, self._layers, per_layer, strict=True):
            module = layer.module
            weight = unit.weight and id(module.weight) in self._shared
            bias = unit.bias and id(module.bias) in self._shared
            if not pairs or not (weight or bias):
                out.append(unit)
                work.append(pairs)
                continue
            if unit.weight != weight or unit.bias != bias:  # its own part, on its own
                out.append(_Unit(unit.index, unit.name, unit.weight and not weight,
                                 unit.bias and not bias))
                work.append(pairs)
            for role, shared in (("weight", weight), ("bias", bias)):
                if not shared:
                    continue
                param = getattr(module, role)
                uses = pairs
                if role == "weight":
                    # nn.Linear stores its weight (d_out, d_in), Conv1D (d_in, d_out): a use
                    # in the other orientation than the first one swaps the two sides
                    is_linear = isinstance(module, torch.nn.Linear)
                    if linear.setdefault(id(param), is_linear) != is_linear:
                        uses = [(pos, not swap) for pos, swap in pairs]
                slot = slots.get(id(param))
                if slot is None:
                    slots[id(param)] = len(out)
                    out.append(_Unit(unit.index, unit.name, role == "weight", role == "bias"))
                    work.append(list(uses))
                else:
                    out[slot].name += f"+{unit.name}"
                    work[slot].extend(uses)
        names = {id(m.weight): name for name, m in self._embeddings}
        for key, uses in tied.items():
            slot = slots.get(key)
            if slot is None:  # the weight's layer did not run: K does not cover it
                continue
            out[slot].name += f"+{names[key]}"
            # an embedding's weight is (vocabulary, features), as nn.Linear's (d_out, d_in);
            # a lookup's pair is (δ at its output, one-hot rows of its ids)
            work[slot].extend(uses if linear[key] else [(pos, True) for pos, _ in uses])
        return out, work

    def _sides(self, unit: _Unit, pairs: list[tuple[Any, Any]]) -> tuple[int, int] | None:
        """The sketch's (k_out, k_in) for a unit; None when its weight is kept exactly."""
        if self._sketch_dim is None or not unit.weight:
            return None
        x, d = pairs[0]
        return _sketch_sides(int(d.shape[-1]), int(x.shape[-1]), self._sketch_dim)

    def _token_rows(self, tensor: Any, n: int) -> Any:
        """(N, tokens, features) view of a layer input or output (checked by gram)."""
        if self._packing is not None:
            return self._packing.rows(tensor)
        if self._batch_dim % tensor.ndim:
            tensor = tensor.movedim(self._batch_dim, 0)
        return tensor.reshape(n, -1, tensor.shape[-1])

    def _check_rows(self, shape: tuple[int, ...], n: int, name: str, what: str) -> None:
        if self._packing is not None:
            self._packing.check(shape, name, what)
            return
        dim, ndim = self._batch_dim, len(shape)
        if ndim == 2 and dim == 0 and shape[0] % n == 0 and shape[0] > n:
            # (N·T, features): a batch-first (N, T, features) flattened, as OPT's MLP does
            return
        if ndim < 2 or not -ndim <= dim < ndim or shape[dim] != n:
            raise ValueError(f"layer {name!r}: its {what} has shape {shape}, whose axis "
                             f"batch_dim={dim} is not the {n} responses of `objectives`.")
        if dim % ndim == ndim - 1:
            raise ValueError(f"`batch_dim`={dim} is the feature axis of layer {name!r}.")

    def _accumulate(self, unit: _Unit, pairs: list[tuple[Any, Any]], n: int,
                    blocks: _Blocks, rows: _Rows, acc: Any,
                    extremes: Any) -> None:
        """Add one unit's calls (input, δ) to the blocks, and write the extremes of its δ
        and inputs into ``extremes`` ((δ, input) × (min, max))."""
        torch = _torch()
        # a tied embedding's lookups: their one-hot rows, dense for the exact routes
        pairs = [(x.dense(acc) if isinstance(x, _OneHot) else x,
                  d.dense(acc) if isinstance(d, _OneHot) else d) for x, d in pairs]
        ds = [self._token_rows(d, n) for _, d in pairs]
        # a unit of several calls: its gradient sums over every call's tokens
        d = ds[0] if len(ds) == 1 else torch.cat(ds, dim=1)
        # (min, max) reductions on the device, which propagate NaN; read only when K is not
        # finite
        extremes[0] = torch.stack(torch.aminmax(d))
        h = None
        if unit.weight:
            hs = [self._token_rows(x, n) for x, _ in pairs]
            h = hs[0] if len(hs) == 1 else torch.cat(hs, dim=1)
            extremes[1] = torch.stack(torch.aminmax(h))
        del ds, pairs
        if unit.bias:
            rows.add_sums(d)
        if h is None:
            return
        if blocks.token_pairs_cheaper(int(h.shape[1]), int(d.shape[-1]), int(h.shape[-1])):
            blocks.add_token_pairs(d.to(acc), h.to(acc))
            return
        rows.add_products(d, h)


    def _sketch_call(self, unit: _Unit, x: Any, d: Any, n: int, acc: Any, capacity: int,
                     extremes: Any) -> tuple[Any, Any]:
        """One call's sketched rows: (P_out Δᵀ)(H P_inᵀ) flattened (N, k_out·k_in), or Δᵀ H
        for a weight of at most ``sketch_dim`` numbers, and Σ_t δ_t (N, d_out) for a bias
        (None for what the unit does not cover).  Tokens in chunks, so that the widened and
        projected copies stay within ``capacity`` numbers; the sketch of several calls is
        the sum of theirs (it is linear)."""
        torch = _torch()
        dense_d = not isinstance(d, _OneHot)
        drows = self._token_rows(d, n) if dense_d else None
        if dense_d:
            _extend(extremes[0], drows)
        sums = drows.sum(dim=1, dtype=acc) if unit.bias and drows is not None else None
        if not unit.weight:
            return None, sums
        hrows = self._token_rows(x, n) if not isinstance(x, _OneHot) else None
        if hrows is not None:
            _extend(extremes[1], hrows)
        d_out, d_in = int(d.shape[-1]), int(x.shape[-1])
        assert self._sketch_dim is not None
        sides = _sketch_sides(d_out, d_in, self._sketch_dim)
        k_out, k_in = sides if sides is not None else (d_out, d_in)
        p_out = None if k_out == d_out else _projection(
            torch, k_out, d_out, self._sketch, self._seed, unit.index, 0)
        p_in = None if k_in == d_in else _projection(
            torch, k_in, d_in, self._sketch, self._seed, unit.index, 1)
        device = (drows if drows is not None else d.ids).device

        def side(full: Any, rows: Any, p: Any, start: int, stop: int) -> Any:
            if rows is None:  # one-hot rows: columns of the projection, or dense
                ids = self._token_ids(full.ids, n)[:, start:stop].to(device=device,
                                                                     dtype=torch.long)
                if p is None:
                    return _OneHot(ids, full.vocab, full.padding_idx).dense(acc)
                return full.project(p, ids)
            part = rows[:, start:stop].to(acc)
            return part if p is None else part @ p.T

        p_out = None if p_out is None else p_out.to(device=device, dtype=acc)
        p_in = None if p_in is None else p_in.to(device=device, dtype=acc)
        dense_rows: Any = drows if drows is not None else hrows
        t = int(dense_rows.shape[1])
        chunk = max(1, capacity // max(1, n * (d_out + d_in + k_out + k_in)))
        out = torch.zeros(n, k_out, k_in, dtype=acc, device=device)
        for start in range(0, t, chunk):
            stop = min(t, start + chunk)
            out.baddbmm_(side(d, drows, p_out, start, stop).transpose(1, 2),
                         side(x, hrows, p_in, start, stop))
        return out.reshape(n, -1), sums

    def _token_ids(self, ids: Any, n: int) -> Any:
        """(N, tokens) view of an embedding's ids (its output's axes but the last)."""
        if self._packing is not None:
            return self._packing.ids(ids)
        dim = self._batch_dim % (ids.ndim + 1)
        if dim:
            ids = ids.movedim(dim, 0)
        return ids.reshape(n, -1)


