"""Packed batches for :class:`~advcal.torch.GradientCapture`: every response's tokens along
one axis (verl's ``use_remove_padding``, TRL's padding-free batches) with a map from token
to response, and the conversions from the ways trainers describe such a batch."""

from __future__ import annotations

from typing import Any

import numpy as np

from advcal.torch._layers import _torch

__all__ = ["tokens_from_cu_seqlens", "tokens_from_position_ids"]


def _int_vector(values: Any, name: str) -> np.ndarray:
    torch = _torch()
    if torch.is_tensor(values):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D array of integers; got dtype {arr.dtype}, "
                         f"shape {arr.shape}.")
    return arr.astype(np.int64)


def tokens_from_cu_seqlens(cu_seqlens: Any, total: int | None = None) -> np.ndarray:
    """The response of each token of a packed batch described by cumulative lengths.

    Parameters
    ----------
    cu_seqlens : array_like of int, shape (N + 1,)
        ``0 = c_0 <= c_1 <= ... <= c_N``: response i holds tokens ``c_i`` to ``c_{i+1} - 1``
        (flash-attention's varlen layout, as verl's ``use_remove_padding`` builds it).
    total : int, optional
        Tokens along the packed axis (default ``c_N``); those past ``c_N`` (padding added
        to reach a fixed length) belong to no response.

    Returns
    -------
    ndarray of int64, shape (total,)
        Response index per token, -1 for a token of none: ``GradientCapture.gram``'s
        ``tokens``.

    Examples
    --------
    >>> from advcal.torch import tokens_from_cu_seqlens
    >>> tokens_from_cu_seqlens([0, 3, 5], total=7)
    array([ 0,  0,  0,  1,  1, -1, -1])
    """
    cu = _int_vector(cu_seqlens, "cu_seqlens")
    if cu.size < 1 or cu[0] != 0 or bool((np.diff(cu) < 0).any()):
        raise ValueError("`cu_seqlens` must start at 0 and never decrease.")
    end = int(cu[-1])
    total = end if total is None else total
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or total < end:
        raise ValueError(f"`total` must be an integer of at least cu_seqlens[-1] = {end}; got "
                         f"{total!r}.")
    out = np.full(int(total), -1, dtype=np.int64)
    out[:end] = np.repeat(np.arange(cu.size - 1, dtype=np.int64), np.diff(cu))
    return out


def tokens_from_position_ids(position_ids: Any) -> np.ndarray:
    """The response of each token of a packed batch whose positions restart at 0 for each
    response (TRL's padding-free batches, transformers' packed ``position_ids``).

    Parameters
    ----------
    position_ids : array_like of int, shape (L,) or (1, L)
        A response starts wherever the position is 0; the first must be.

    Returns
    -------
    ndarray of int64, shape (L,)
        Response index per token (``GradientCapture.gram``'s ``tokens``).

    Examples
    --------
    >>> from advcal.torch import tokens_from_position_ids
    >>> tokens_from_position_ids([[0, 1, 2, 0, 1, 0]])
    array([0, 0, 0, 1, 1, 2])
    """
    torch = _torch()
    if torch.is_tensor(position_ids):
        position_ids = position_ids.detach().cpu().numpy()
    arr = np.asarray(position_ids)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    pos = _int_vector(arr, "position_ids")
    if pos.size == 0 or pos[0] != 0:
        raise ValueError("`position_ids` must be non-empty and start at 0 (a response's "
                         "first token).")
    return np.cumsum(pos == 0, dtype=np.int64) - 1


class _Packing:
    """A packed batch's token map, ready to lay any (…, L, F) tensor of the covered layers
    out as (N, T, F) rows, response i's tokens first in row i and zeros after them (which
    add nothing to a gradient, a product or a sketch)."""

    def __init__(self, tokens: Any, n: int) -> None:
        torch = _torch()
        owner = _int_vector(tokens, "tokens")
        if owner.size == 0:
            raise ValueError("`tokens` must map at least one token.")
        if bool((owner < -1).any()) or bool((owner >= n).any()):
            raise ValueError(f"`tokens` must hold response indices in [0, {n}) of "
                             "`objectives`, or -1 for a token of no response.")
        self.length = int(owner.size)
        kept = np.flatnonzero(owner >= 0)
        who = owner[kept]
        counts = np.bincount(who, minlength=n)
        # position of each kept token within its response, in token order
        order = np.argsort(who, kind="stable")
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        pos = np.empty_like(who)
        pos[order] = np.arange(who.size) - np.repeat(starts, counts)
        self.width = max(1, int(counts.max(initial=0)))
        self.n = n
        self.kept = torch.as_tensor(kept)
        # flat index into (N·T) of each kept token
        self.slot = torch.as_tensor(who * self.width + pos)
        self.all_kept = kept.size == self.length

    def check(self, shape: tuple[int, ...], name: str, what: str) -> None:
        tokens = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) >= 2 else -1
        if tokens != self.length:
            raise ValueError(f"layer {name!r}: its {what} has shape {shape}, whose axes but the "
                             f"last hold {tokens} tokens, not the {self.length} of `tokens`.")

    def rows(self, tensor: Any) -> Any:
        """(N, T, F) rows of a (…, L, F) tensor."""
        flat = tensor.reshape(-1, tensor.shape[-1])
        device = flat.device
        kept, slot = self.kept.to(device), self.slot.to(device)
        out = flat.new_zeros(self.n * self.width, flat.shape[-1])
        out.index_copy_(0, slot, flat if self.all_kept else flat.index_select(0, kept))
        return out.view(self.n, self.width, -1)

    def ids(self, ids: Any) -> Any:
        """(N, T) token ids of an embedding's (…, L) ids, -1 where no token is."""
        flat = ids.reshape(-1)
        device = flat.device
        kept, slot = self.kept.to(device), self.slot.to(device)
        out = flat.new_full((self.n * self.width,), -1)
        out.index_copy_(0, slot, flat if self.all_kept else flat.index_select(0, kept))
        return out.view(self.n, self.width)
