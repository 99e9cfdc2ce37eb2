"""Which layers a Gram matrix covers: resolving ``layers`` (names, a rule, a preset) in a
torch model, a resolution reusable across batches (``LayerSelection``), ``last_blocks``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

PRESETS = ("all", "lora")


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
