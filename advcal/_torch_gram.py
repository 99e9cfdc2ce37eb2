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

import importlib
import math
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from advcal._validation import check_offsets
from advcal.layouts import GroupIndex, groups_from_ids

__all__ = ["GradientCapture", "last_blocks", "response_objectives"]

LOSS_TYPES = ("grpo", "dr_grpo", "bnpo", "dapo")
SKETCHES = ("gaussian", "rademacher")
OUTPUTS = ("numpy", "tensor")
PRESETS = ("all", "lora")
# Elements of one materialised block of per-response gradients (route "materialise"): a
# layer wider than this is done in slices of its output rows, so memory stays bounded.
WORKSPACE = 1 << 24
# The per-response rows gathered for G Gᵀ products (their workspace, and its float64
# copy) and each chunk of token pairs stay within this share of WORKSPACE.
_SHARE = 8
# Tests set this to "materialise" or "pairs" to run one exact route everywhere.
_FORCE_ROUTE: str | None = None


def _torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    try:
        return importlib.import_module("torch")
    except ImportError:  # pragma: no cover - exercised only without torch
        raise ImportError("advcal.torch.GradientCapture needs PyTorch; install it "
                          "(pip install torch).") from None


def _conv1d_type() -> Any:
    """transformers' Conv1D (GPT-2 style, weight stored (d_in, d_out)) if transformers is
    already imported; a model built from it imported it, so nothing is imported here."""
    module = sys.modules.get("transformers.pytorch_utils")
    return getattr(module, "Conv1D", None)


def _linear_types() -> tuple[type, ...]:
    conv1d = _conv1d_type()
    return (_torch().nn.Linear,) + ((conv1d,) if conv1d is not None else ())


def _is_linear(module: Any) -> bool:
    return isinstance(module, _linear_types())


class _Layer:
    """A selected layer and which of its parameters the Gram matrix covers."""

    __slots__ = ("name", "module", "weight", "bias")

    def __init__(self, name: str, module: Any) -> None:
        self.name = name
        self.module = module
        self.weight, self.bias = _trainable(module)

    @property
    def trainable(self) -> bool:
        return self.weight or self.bias

    def parameters(self) -> list[Any]:
        out = [self.module.weight] if self.weight else []
        return out + ([self.module.bias] if self.bias else [])


class _Call:
    """One recorded call of a covered layer (or lookup of a tied embedding): its input
    (kept only when a product reads it), and its output's autograd node rather than the
    output itself, so that the capture holds no activation the graph does not hold (the
    output only weakly, to see in-place edits while someone else keeps it)."""

    __slots__ = ("owner", "order", "pos", "x", "x_ref", "recompute", "edge", "x_version",
                 "x_shape", "node", "output_nr", "shape", "y", "y_version", "view", "lookup",
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
        self.y = weakref.ref(y)
        self.y_version = y._version
        self.view = bool(y._is_view())
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


def _attention_internals(torch: Any, named: list[tuple[str, Any]]) -> dict[int, str]:
    """Linear modules inside nn.MultiheadAttention: it uses their weights through
    F.multi_head_attention_forward without calling them, so hooks never see them."""
    out = {}
    for name, module in named:
        if isinstance(module, torch.nn.MultiheadAttention):
            for child_name, child in module.named_modules():
                if child is not module:
                    out[id(child)] = f"{name}.{child_name}" if name else child_name
    return out


def _resolve_layers(model: Any, layers: Any) -> list[_Layer]:
    torch = _torch()
    named = list(model.named_modules())
    hidden = _attention_internals(torch, named)
    types = _linear_types()
    linear = [(name, m) for name, m in named if isinstance(m, types) and id(m) not in hidden]
    explicit: list[tuple[str, Any]] = []
    if layers is None or (isinstance(layers, str) and layers == "all"):
        chosen = linear
    elif isinstance(layers, str):
        if layers != "lora":
            raise ValueError(f"`layers` must be one of {PRESETS}, a list of modules or names, "
                             f"or a predicate; got {layers!r}.")
        chosen = [(name, m) for name, m in linear
                  if any(part.startswith(("lora_A", "lora_B")) for part in name.split("."))]
        if not chosen:
            raise ValueError("`layers='lora'` found no LoRA adapter (no linear submodule under "
                             "a `lora_A` or `lora_B` name) in `model`.")
    elif callable(layers) and not isinstance(layers, torch.nn.Module):
        chosen = [(name, m) for name, m in linear if layers(name, m)]
    else:
        items = [layers] if isinstance(layers, (torch.nn.Module, str)) else layers
        try:
            items = list(items)
        except TypeError:
            raise TypeError("`layers` must be None, 'all', 'lora', a module, a list of modules "
                            f"or names, or a predicate; got {type(layers).__name__}.") from None
        names = {id(m): name for name, m in named}
        chosen = []
        for item in items:
            if isinstance(item, str):
                try:
                    module = model.get_submodule(item)
                except AttributeError:
                    raise ValueError(f"`layers`: {item!r} is not a submodule of `model`.") \
                        from None
                name = item
            elif isinstance(item, torch.nn.Module):
                if id(item) not in names:
                    raise ValueError(f"`layers`: the {type(item).__name__} given is not a "
                                     "submodule of `model`.")
                module, name = item, names[id(item)]
            else:
                raise TypeError("`layers` items must be modules or submodule names; got "
                                f"{type(item).__name__}.")
            if id(module) in hidden:
                raise TypeError(f"`layers`: {name!r} ({type(module).__name__}) belongs to an "
                                "nn.MultiheadAttention, which uses its weights without calling "
                                "it, so its gradients cannot be captured.")
            if _is_linear(module):
                explicit.append((name, module))
                continue
            inside = [(f"{name}.{sub}" if name else sub, m)
                      for sub, m in module.named_modules()
                      if _is_linear(m) and id(m) not in hidden]
            if not inside:
                raise TypeError(f"`layers`: {name!r} is a {type(module).__name__}, which is not "
                                "a supported layer (nn.Linear, transformers' Conv1D) and "
                                "contains none.")
            chosen.extend(inside)
        for name, module in explicit:
            if not _Layer(name, module).trainable:
                raise ValueError(f"`layers`: {name!r} has no trainable parameter "
                                 "(requires_grad is False).")
        chosen = explicit + chosen
    seen: set[int] = set()
    resolved = []
    for name, module in chosen:
        if id(module) in seen:
            continue
        seen.add(id(module))
        layer = _Layer(name, module)
        if layer.trainable:
            resolved.append(layer)
    if not resolved:
        raise ValueError("`layers` selects no linear layer with trainable parameters in "
                         "`model`.")
    return resolved


def _by_rule(layers: Any) -> bool:
    """Whether ``layers`` chooses by a rule (all, LoRA, a predicate) rather than naming
    layers one by one: named layers must run, layers chosen by a rule may not (a fused LM
    head uses its weight without calling the module)."""
    return (layers is None or isinstance(layers, str)
            or (callable(layers) and not isinstance(layers, _torch().nn.Module)))


def _trainable(module: Any) -> tuple[bool, bool]:
    bias = getattr(module, "bias", None)
    return bool(module.weight.requires_grad), bias is not None and bool(bias.requires_grad)


class LayerSelection:
    """The layers a ``layers`` argument selects in a model, resolved once and reusable for
    the captures of later batches while the model's modules (by identity) and the
    ``requires_grad`` of their linear layers' parameters stay as they were: then resolving
    again would select the same layers."""

    __slots__ = ("model", "layers", "named", "modules", "_linear", "_flags")

    def __init__(self, model: Any, layers: Any) -> None:
        self.model = model
        self.layers = _resolve_layers(model, layers)
        self.named = not _by_rule(layers)
        self.modules = tuple(model.modules())
        types = _linear_types()
        self._linear = [m for m in self.modules if isinstance(m, types)]
        self._flags = [_trainable(m) for m in self._linear]

    def current(self) -> bool:
        """Whether resolving ``layers`` in the model now would select the same layers."""
        return (tuple(self.model.modules()) == self.modules
                and [_trainable(m) for m in self._linear] == self._flags)


def last_blocks(model: Any, k: int, *, head: bool = True) -> Callable[[str, Any], bool]:
    """A layer selection: the linear layers of the last ``k`` blocks, plus the LM head.

    The blocks are the entries of the model's longest ``nn.ModuleList`` (the decoder layers
    of a transformers model, ``nn.TransformerEncoder.layers``, ...); the head is
    ``model.get_output_embeddings()`` when the model has one.

    Parameters
    ----------
    model : torch.nn.Module
        The policy.
    k : int
        Number of blocks, counted from the output side; at least 1.
    head : bool, default True
        Also select the output head.

    Returns
    -------
    callable
        A predicate ``(name, module) -> bool`` for ``GradientCapture(model, layers=...)``.

    Examples
    --------
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> from advcal.torch import GradientCapture, last_blocks
    >>> model = torch.nn.Sequential(
    ...     torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)]),
    ...     torch.nn.Linear(4, 2))
    >>> select = last_blocks(model, 1, head=False)
    >>> [name for name, m in model.named_modules() if select(name, m)]
    ['0.2']
    """
    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module; got {type(model).__name__}.")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"`k` must be a positive integer; got {k!r}.")
    lists = [(name, m) for name, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError("`model` has no nn.ModuleList of blocks.")
    _, blocks = max(lists, key=lambda item: len(item[1]))  # first of the longest
    chosen = {id(m) for block in list(blocks)[-int(k):] for m in block.modules()}
    if head:
        get_head = getattr(model, "get_output_embeddings", None)
        module = get_head() if callable(get_head) else None
        if module is None:
            raise ValueError("`model` has no get_output_embeddings(); pass head=False and "
                             "select the head by name.")
        chosen.add(id(module))

    def select(name: str, module: Any) -> bool:
        return id(module) in chosen

    return select


def _group_layout(n: int, offsets: Any, group_ids: Any, group_size: Any
                  ) -> tuple[np.ndarray | None, np.ndarray, bool]:
    """The groups as (order, bounds, dense): the responses in output order (None when that
    is the batch order), the groups' boundaries in that order, and whether the output is
    ``(B, G, G)``."""
    given = [name for name, value in (("offsets", offsets), ("group_ids", group_ids),
                                      ("group_size", group_size)) if value is not None]
    if len(given) != 1:
        raise ValueError("pass exactly one of `offsets`, `group_ids` (flat blocks) or "
                         f"`group_size` ((B, G, G) blocks); got {given or 'none'}.")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
                or group_size < 1:
            raise ValueError(f"`group_size` must be a positive integer; got {group_size!r}.")
        g = int(group_size)
        if n % g:
            raise ValueError(f"`objectives` has {n} entries, not a multiple of "
                             f"`group_size`={g}.")
        return None, np.arange(0, n + 1, g), True
    if offsets is not None:
        if _torch().is_tensor(offsets):
            offsets = offsets.detach().cpu().numpy()
        try:
            off = check_offsets(offsets, n)
        except ValueError as exc:
            raise ValueError(str(exc).replace("number of rewards", "length of `objectives`")) \
                from None
        return None, np.asarray(off, dtype=np.int64), False
    if isinstance(group_ids, GroupIndex):  # labels grouped once by the caller
        index = group_ids
        order = np.asarray(index.order)
        if order.ndim != 1 or order.size != n or order.dtype.kind not in "iu" \
                or (order < 0).any() or not (np.bincount(order, minlength=n) == 1).all():
            raise ValueError(f"`group_ids`: its GroupIndex order must be a permutation of the "
                             f"{n} responses.")
        check_offsets(index.offsets, n)
    else:
        if _torch().is_tensor(group_ids):
            group_ids = group_ids.detach().cpu().numpy()
        index = groups_from_ids(group_ids)
        if index.order.size != n:
            raise ValueError(f"`group_ids` must have one label per objective ({n}); got "
                             f"{index.order.size}.")
    order = np.asarray(index.order, dtype=np.int64)
    identity = bool((order == np.arange(n)).all())
    return (None if identity else order), np.asarray(index.offsets, dtype=np.int64), False


def _sketch_sides(d_out: int, d_in: int, k: int) -> tuple[int, int] | None:
    """(k_out, k_in) with k_out·k_in ≤ k, as even as the layer allows; None when the layer
    has at most k weights (then it is done exactly: as cheap, and no error)."""
    if d_out * d_in <= k:
        return None
    root = math.isqrt(k)
    if d_out <= d_in:
        k_out = min(d_out, root)
        return k_out, min(d_in, k // k_out)
    k_in = min(d_in, root)
    return min(d_out, k // k_in), k_in


def _projection(torch: Any, rows: int, cols: int, kind: str, seed: int, layer: int, side: int
                ) -> Any:
    """A (rows, cols) random matrix with E[PᵀP] = I, from its own seeded stream; drawn on the
    CPU so that every device gets the same matrix for the same seed."""
    state = np.random.SeedSequence([seed, layer, side]).generate_state(2, dtype=np.uint32)
    gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    if kind == "gaussian":
        p = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    else:
        p = torch.randint(0, 2, (rows, cols), generator=gen).to(torch.float64) * 2 - 1
    return p / math.sqrt(rows)


_REENTRANT = (
    "torch.utils.checkpoint.checkpoint(..., use_reentrant=True) (as transformers' "
    "gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True}) "
    "sets it) runs the checkpointed forward without gradients and cannot be differentiated "
    "by torch.autograd.grad; use use_reentrant=False (transformers' default), or no "
    "checkpointing for the forward pass under the capture.")


def _shorten(names: list[str], most: int = 8) -> str:
    """A list of layer names for a message, the first ``most`` of them."""
    if len(names) <= most:
        return str(names)
    return f"{names[:most]} and {len(names) - most} more"


def _reentrant_checkpoint(fn: Any) -> bool:
    """Whether the autograd graph below ``fn`` holds a reentrant checkpoint node
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
        Names of the layers the Gram matrix covers.

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
        self._state = "new"

    @property
    def layers(self) -> list[str]:
        return [layer.name for layer in self._layers]

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
             start: tuple[Any, Any] | None = None) -> Any:
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

        Returns
        -------
        ndarray or torch.Tensor
            ``(B, G, G)`` with ``group_size``; flat blocks of length Σ n_q² otherwise.

        Raises
        ------
        ValueError
            Besides bad arguments: when covered layers ran inside reentrant activation
            checkpointing (``use_reentrant=True``), or a covered layer's gradient flows
            through it, since K could not cover them (non-reentrant checkpointing is
            exact); when the Gram matrix is not finite (naming the objectives, the layers
            whose inputs or output gradients hold NaN or inf, or an overflow).
        """
        torch = _torch()
        if output not in OUTPUTS:
            raise ValueError(f"`output` must be one of {OUTPUTS}; got {output!r}.")
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
                             "under the capture, with gradients enabled.")
        n = int(objectives.shape[0])
        order, bounds, dense = _group_layout(n, offsets, group_ids, group_size)
        records = self._records
        assert records is not None
        flat = [call for layer_records in records for call in layer_records]
        silent = {i for i, recs in enumerate(records) if not recs}
        hidden = sorted(silent & self._nograd)
        if hidden and _reentrant_checkpoint(objectives.grad_fn):
            names = [self._layers[i].name for i in hidden]
            raise ValueError(f"`layers`: {_shorten(names)} ran inside reentrant activation "
                             f"checkpointing, so K cannot cover them. {_REENTRANT}")
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
        lookups = [call for calls in self._looked_up for call in calls]
        for call in flat + lookups:
            name = self._call_name(call)
            y = call.y()
            if call.x is not None and not call.lookup and call.x._version != call.x_version:
                raise ValueError(f"layer {name!r}: its input was modified in place after "
                                 "the layer ran, so the recorded values are not those the "
                                 "gradient flowed through.")
            if y is not None and y._version != call.y_version:
                raise _modified_output(name, call.lookup)
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
        root, seed = (objectives.sum(), None) if start is None else start
        targets = self._targets(root, calls)
        units, unit_calls = self._units(calls)
        names = [unit.name for unit in units]
        blocks = _Blocks(torch, order, bounds, acc, device)
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
                                 f"{_REENTRANT}") from exc
            raise
        finally:
            for handle in handles:
                handle.remove()
        stream.check_recomputed()
        if not stream.arrived:
            raise ValueError("`objectives` was not produced under the capture: it does not "
                             "depend on any recorded layer output.")
        out = stream.finish(dense)
        _check_finite(out, objectives, names, stream.extremes)
        if output == "tensor":
            return out
        return out.detach().to(device="cpu", dtype=torch.float64).numpy()

    def _call_name(self, call: _Call) -> str:
        return self._embeddings[call.owner][0] if call.lookup else self._layers[call.owner].name

    def _targets(self, root: Any, calls: list[_Call]) -> list[Any]:
        """The tensors gram()'s backward differentiates to: as few and as cheap as possible,
        such that autograd runs the node of every covered output that the root reaches
        (it runs exactly the nodes with a path to a requested tensor).  The input of the
        first covered layer (below every later layer in a sequential model) usually does
        it alone; a layer on a branch that does not reach it adds its own input, or its
        smallest trainable parameter (the bias where it has one) when its input needs no
        gradient.  Raises ValueError for an output modified in place (its node bypassed)."""
        torch = _torch()
        root_fn = root.grad_fn
        if root_fn is None:
            return [root] if root.requires_grad else []
        reach, keep = _reaches(root_fn, set(), set())  # keep: ids stay valid while it lives
        reachable = set(reach)
        for call in calls:
            if id(call.node) not in reachable and call.view and any(
                    child is not None and id(child) in reachable
                    for child, _ in call.node.next_functions):
                # an in-place edit of a view output rebased its history past its node
                raise _modified_output(self._call_name(call), call.lookup)
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
        if self._batch_dim % tensor.ndim:
            tensor = tensor.movedim(self._batch_dim, 0)
        return tensor.reshape(n, -1, tensor.shape[-1])

    def _check_rows(self, shape: tuple[int, ...], n: int, name: str, what: str) -> None:
        dim, ndim = self._batch_dim, len(shape)
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
        dim = self._batch_dim % (ids.ndim + 1)
        if dim:
            ids = ids.movedim(dim, 0)
        return ids.reshape(n, -1)


class _OneHot:
    """The one-hot rows of an embedding's token ids, the output-gradient side of its
    lookups as a linear layer's calls, formed only where a route needs them dense (the
    sketch gathers columns of its projection instead)."""

    def __init__(self, ids: Any, vocab: int, padding_idx: int | None) -> None:
        self.ids = ids
        self.vocab = vocab
        self.padding_idx = padding_idx
        self.shape = (*ids.shape, vocab)
        self.ndim = len(self.shape)

    def dense(self, dtype: Any) -> Any:
        torch = _torch()
        onehot = torch.zeros(self.shape, dtype=dtype, device=self.ids.device)
        onehot.scatter_(-1, self.ids.to(torch.long)[..., None], 1.0)
        if self.padding_idx is not None:  # its row gets no gradient
            onehot[..., self.padding_idx] = 0.0
        return onehot

    def project(self, p: Any, ids: Any) -> Any:
        """P (k, vocab) applied to the one-hot rows of ``ids`` (a chunk of the rows)."""
        out = p.T[ids]
        if self.padding_idx is not None:
            out[ids == self.padding_idx] = 0.0
        return out


def _extend(extremes: Any, tensor: Any) -> None:
    """Widen ``extremes`` (min, max) to cover ``tensor``'s values (NaN propagates)."""
    torch = _torch()
    low, high = torch.aminmax(tensor)
    extremes[0] = torch.minimum(extremes[0], low.to(extremes.dtype))
    extremes[1] = torch.maximum(extremes[1], high.to(extremes.dtype))


def _modified_output(name: str, lookup: bool) -> ValueError:
    if lookup:
        return ValueError(f"embedding {name!r}: its output was modified in place after it "
                          "ran, so the recorded values are not those the gradient flowed "
                          "through.")
    return ValueError(f"layer {name!r}: its output was modified in place after the layer "
                      "ran, so the recorded values are not those the gradient flowed through.")


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

    def __init__(self, capture: GradientCapture, calls: list[_Call], units: list[_Unit],
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


def _check_finite(out: Any, objectives: Any, names: list[str], extremes: Any) -> None:
    """Raise a ValueError saying where a non-finite Gram matrix comes from (``extremes``:
    per unit, the (min, max) of its δ and of its input)."""
    torch = _torch()
    if bool(torch.isfinite(out).all()):
        return
    if not bool(torch.isfinite(objectives.detach()).all()):
        where = "`objectives` holds NaN or inf"
    else:
        finite = torch.isfinite(extremes).all(dim=2).cpu().tolist()
        bad = [f"{name!r} ({what})" for name, flags in zip(names, finite, strict=True)
               for what, flag in zip(("output gradient", "input"), flags, strict=True)
               if not flag]
        where = (f"NaN or inf in {', '.join(dict.fromkeys(bad))}" if bad else
                 f"its products overflowed {out.dtype} (K of magnitude beyond its range)")
    raise ValueError(f"the Gram matrix is not finite: {where}.")


class _Blocks:
    """The groups' Gram blocks.  Groups of one size are a (B, n, n) tensor, and every
    product runs for all of them at once; ragged groups are one block each."""

    def __init__(self, torch: Any, order: np.ndarray | None, bounds: np.ndarray, acc: Any,
                 device: Any) -> None:
        self.torch = torch
        self.device = device
        # K sums inner products of long rows (d_in·d_out numbers per response): they
        # accumulate in float64 also for float32 models (MPS has no float64)
        acc = torch.float64 if device.type != "mps" else acc
        self.dtype = acc
        self.order = None if order is None else torch.as_tensor(order, device=device)
        self.bounds: list[int] = bounds.tolist()
        self.sizes = [b - a for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)]
        self.n = self.bounds[-1]
        self.equal = self.sizes[0] if len(set(self.sizes)) == 1 else None
        self.squares = sum(size * size for size in self.sizes)
        if self.equal is not None:
            self.dense = torch.zeros(len(self.sizes), self.equal, self.equal, dtype=acc,
                                     device=device)
        else:
            self.blocks = [torch.zeros(s, s, dtype=acc, device=device) for s in self.sizes]

    def _grouped(self, x: Any) -> Any:
        """The rows of x (responses first) in group order."""
        return x if self.order is None else x.index_select(0, self.order)

    def add_rows(self, x: Any) -> None:
        """K_ij += ⟨x_i, x_j⟩ within every group, for per-response feature rows x (N, F)."""
        x = self._grouped(x).to(self.dtype)
        if self.equal is not None:
            grouped = x.reshape(len(self.sizes), self.equal, -1)
            self.dense.baddbmm_(grouped, grouped.transpose(1, 2))
            return
        for a, b, block in zip(self.bounds[:-1], self.bounds[1:], self.blocks, strict=True):
            if b > a:
                block.addmm_(x[a:b], x[a:b].T)

    def token_pairs_cheaper(self, t: int, d_out: int, d_in: int) -> bool:
        """Whether token pairs cost less than materialising Δᵀ H, in multiply-adds.

        Besides the products' multiply-adds, each route moves memory: a materialised row
        element is written, widened to float64 and read by the float64 G Gᵀ (about 20
        multiply-adds' time), a float64 multiply-add costs about 4 float32 ones, and a
        token pair's product and sum about 36; each call has a fixed overhead.  The
        constants are fitted to both routes' times over T = 2 to 128, d = 32 to 1024 and
        groups of 4 to 16 (CPU): the choice is the faster route wherever they differ by
        more than 1.5×."""
        if _FORCE_ROUTE is not None:
            return _FORCE_ROUTE == "pairs"
        weights = d_out * d_in
        materialise = (self.n * t + 4 * self.squares + 20 * self.n) * weights + 2e5
        pairs = self.squares * t * t * (d_in + d_out + 36) + 1.5e6 + 4e4 * len(self.sizes)
        return pairs < materialise

    def add_token_pairs(self, d: Any, h: Any) -> None:
        """K_ij += Σ_{t∈i, s∈j} ⟨δ_t, δ_s⟩⟨h_t, h_s⟩ within every group."""
        d, h = self._grouped(d), self._grouped(h)
        t = int(d.shape[1])
        if self.equal is not None:
            g = self.equal
            # groups in chunks of at most WORKSPACE / _SHARE token pairs (three such arrays
            # live at once); a group larger than that is one chunk, as ragged groups are
            step = max(1, WORKSPACE // _SHARE // max(1, (g * t) ** 2))
            for q in range(0, len(self.sizes), step):
                dq = d[q * g:(q + step) * g].reshape(-1, g * t, d.shape[-1])
                hq = h[q * g:(q + step) * g].reshape(-1, g * t, h.shape[-1])
                prod = (dq @ dq.transpose(1, 2)).to(self.dtype) \
                    * (hq @ hq.transpose(1, 2)).to(self.dtype)
                self.dense[q:q + step] += prod.reshape(-1, g, t, g, t).sum(dim=(2, 4))
            return
        for a, b, block in zip(self.bounds[:-1], self.bounds[1:], self.blocks, strict=True):
            if b > a:
                df = d[a:b].reshape((b - a) * t, -1)
                hf = h[a:b].reshape((b - a) * t, -1)
                prod = (df @ df.T).to(self.dtype) * (hf @ hf.T).to(self.dtype)
                block += prod.reshape(b - a, t, b - a, t).sum(dim=(1, 3))

    def result(self, dense: bool) -> Any:
        # Each product is symmetric only up to rounding; GGSR checks symmetry.
        if self.equal is not None:
            out = (self.dense + self.dense.transpose(1, 2)) / 2
            return out if dense else out.reshape(-1)
        return self.torch.cat([((b + b.T) / 2).reshape(-1) for b in self.blocks])


class _Rows:
    """Per-response feature rows (weight gradients Δ_iᵀ H_i or their sketches, bias
    gradients), written side by side into one workspace of WORKSPACE / _SHARE numbers and
    added to the blocks as G Gᵀ, widened to the blocks' float64, when it is full (a wider
    layer is done in slices of its output rows).  The workspace and its float64 copy are
    allocated once per gram(): the products write into it, so that the layers' work does
    not allocate memory of varying sizes (which the C allocator would keep)."""

    def __init__(self, torch: Any, blocks: _Blocks, n: int, acc: Any) -> None:
        self.torch = torch
        self.blocks = blocks
        self.n = n
        self.acc = acc
        self.capacity = max(n, WORKSPACE // _SHARE)
        self.buffer: Any = None
        self.wide: Any = None
        self.pieces: list[tuple[int, int]] = []  # (offset, width) of each piece
        self.used = 0

    def _slot(self, width: int) -> Any:
        """A (n, width) piece of the workspace, for rows to be added."""
        size = self.n * width
        if self.used + size > self.capacity:
            self.flush()
        if size > self.capacity:  # one output row per response is more than the workspace
            self.capacity, self.buffer, self.wide = size, None, None
        if self.buffer is None:
            self.buffer = self.torch.empty(self.capacity, dtype=self.acc,
                                           device=self.blocks.device)
        piece = self.buffer[self.used:self.used + size].view(self.n, width)
        self.pieces.append((self.used, width))
        self.used += size
        return piece

    def add(self, piece: Any) -> None:
        """Queue rows (N, F)."""
        width = int(piece.shape[1])
        step = max(1, self.capacity // self.n)
        for start in range(0, width, step):
            part = piece[:, start:start + step]
            self._slot(int(part.shape[1])).copy_(part)

    def add_sums(self, d: Any) -> None:
        """Queue the rows Σ_t δ_t (N, d_out) of a bias gradient."""
        width = int(d.shape[-1])
        for start in range(0, width, self.capacity // self.n):
            part = d[..., start:start + self.capacity // self.n]
            self.torch.sum(part, dim=1, dtype=self.acc, out=self._slot(int(part.shape[-1])))

    def add_products(self, d: Any, h: Any) -> None:
        """Queue the rows Δ_iᵀ H_i (N, d_out · d_in), in slices of output rows; δ and h in
        chunks of tokens when they must be widened to the accumulation dtype, so that the
        widened copies stay within the workspace's size too."""
        torch = self.torch
        n, t, d_out, d_in = int(d.shape[0]), int(d.shape[1]), int(d.shape[-1]), int(h.shape[-1])
        step = max(1, self.capacity // max(1, n * d_in))
        cast = d.dtype != self.acc or h.dtype != self.acc
        chunk = max(1, self.capacity // (n * (d_out + d_in))) if cast else t
        dt = d.transpose(1, 2)
        for start in range(0, d_out, step):
            stop = min(d_out, start + step)
            out = self._slot((stop - start) * d_in).view(n, stop - start, d_in)
            for first in range(0, t, chunk):
                dc = dt[:, start:stop, first:first + chunk].to(self.acc)
                hc = h[:, first:first + chunk].to(self.acc)
                if first == 0:
                    torch.bmm(dc, hc, out=out)
                else:
                    out.baddbmm_(dc, hc)

    def flush(self) -> None:
        if not self.pieces:
            return
        rows = self.buffer
        if self.blocks.dtype != rows.dtype:
            if self.wide is None:
                self.wide = self.torch.empty(self.capacity, dtype=self.blocks.dtype,
                                             device=self.blocks.device)
            self.wide[:self.used].copy_(rows[:self.used])
            rows = self.wide
        for offset, width in self.pieces:
            self.blocks.add_rows(rows[offset:offset + self.n * width].view(self.n, width))
        self.pieces, self.used = [], 0


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


for _obj in (GradientCapture, last_blocks, response_objectives):
    _obj.__module__ = "advcal.torch"
