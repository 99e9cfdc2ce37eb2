"""Batch layouts: dense ``(B, G)`` rows and ragged flat arrays with CSR ``offsets``.

Group q of a ragged batch is ``x[offsets[q]:offsets[q + 1]]``.  The helpers
here build ``offsets`` from group sizes or from per-response labels (the verl ``uid``
layout), so every public function can take whichever layout a trainer already has.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["GroupIndex", "offsets_from_sizes", "groups_from_ids"]


class GroupIndex(NamedTuple):
    """How per-response labels map onto contiguous groups.

    Attributes
    ----------
    offsets : ndarray of int64, shape (B + 1,)
        CSR offsets of the grouped order.
    order : ndarray of int64, shape (N,)
        ``values[order]`` lists the responses group by group; within a group they keep
        the caller's relative order.
    labels : ndarray, shape (B,)
        The label of each group, in order of first appearance.
    """

    offsets: np.ndarray
    order: np.ndarray
    labels: np.ndarray


def offsets_from_sizes(sizes: Any) -> np.ndarray:
    """CSR offsets from the number of responses in each group.

    Parameters
    ----------
    sizes : array_like of int, shape (B,)
        Non-negative group sizes; zero-size groups are allowed.

    Returns
    -------
    offsets : ndarray of int64, shape (B + 1,)
        ``offsets[0] == 0`` and ``offsets[q + 1] - offsets[q] == sizes[q]``.

    Examples
    --------
    >>> from advcal import offsets_from_sizes
    >>> offsets_from_sizes([3, 0, 2])
    array([0, 3, 3, 5])
    """
    arr = np.asarray(sizes)
    if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        raise TypeError(f"`sizes` must be an integer array; got dtype {arr.dtype}.")
    if arr.ndim != 1:
        raise ValueError(f"`sizes` must be 1-D; got shape {arr.shape}.")
    if (arr < 0).any():
        raise ValueError("`sizes` must be non-negative.")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError("`sizes` must sum to at most 2**63 - 1.")
    offsets = np.zeros(arr.size + 1, dtype=np.int64)
    with np.errstate(over="ignore"):
        np.cumsum(arr.astype(np.int64, copy=False), out=offsets[1:])
    # Each size is below 2**63, so a sum past int64 wraps to a smaller offset: detect it.
    if arr.size and (offsets[1:] < offsets[:-1]).any():
        raise ValueError("`sizes` must sum to at most 2**63 - 1.")
    return offsets


def groups_from_ids(group_ids: Any) -> GroupIndex:
    """Group responses by arbitrary per-response labels (the verl ``uid`` layout).

    Parameters
    ----------
    group_ids : sequence of hashable, length N
        Any labels (strings, integers, tuples, ...) in any order.  Responses with equal
        labels form one group.

    Returns
    -------
    GroupIndex
        ``offsets``, the grouping permutation ``order`` and the group ``labels`` in order
        of first appearance.  Public functions that take ``group_ids`` use it to group the
        rewards and return their results in the caller's original order.

    Examples
    --------
    >>> from advcal import groups_from_ids
    >>> index = groups_from_ids(["b", "a", "b", "c"])
    >>> index.offsets, index.order, index.labels
    (array([0, 2, 3, 4]), array([0, 2, 1, 3]), array(['b', 'a', 'c'], dtype=object))
    """
    if isinstance(group_ids, (str, bytes)):
        raise TypeError("`group_ids` must be a sequence of labels, not a single string.")
    try:
        ids = np.asarray(group_ids)
    except (TypeError, ValueError):
        ids = None
    if ids is not None and ids.ndim != 1:
        if ids.ndim == 0:
            raise TypeError("`group_ids` must be a sequence of labels.")
        if isinstance(group_ids, np.ndarray):
            raise ValueError(f"`group_ids` must be 1-D; got shape {ids.shape}.")
        ids = None  # a list of tuples: each tuple is one label
    if ids is not None and ids.dtype.kind in "US" and not isinstance(group_ids, np.ndarray):
        ids = None  # numpy would coerce [1, "1"] to two equal strings: hash the labels
    if ids is not None and ids.dtype.kind in "biufcUSmM":
        if ids.dtype.kind in "fc" and np.isnan(ids).any():
            raise ValueError("`group_ids` must not contain NaN (NaN != NaN cannot label a group).")
        labels, first, codes = np.unique(ids, return_index=True, return_inverse=True)
        # np.unique sorts labels; renumber groups by first appearance instead.
        by_appearance = np.argsort(first, kind="stable")
        rank = np.empty_like(by_appearance)
        rank[by_appearance] = np.arange(by_appearance.size)
        codes = rank[codes.reshape(-1)]
        labels = labels[by_appearance]
    else:
        codes, labels = _codes_by_hashing(group_ids)
    order = np.argsort(codes, kind="stable").astype(np.int64, copy=False)
    sizes = np.bincount(codes, minlength=labels.size) if codes.size else np.zeros(0, np.int64)
    return GroupIndex(offsets_from_sizes(sizes.astype(np.int64)), order, labels)


def _codes_by_hashing(group_ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """Group codes for labels numpy cannot sort (mixed types, tuples): one dict pass."""
    try:
        items = list(group_ids)
    except TypeError:
        raise TypeError("`group_ids` must be a sequence of hashable labels.") from None
    seen: dict[Any, int] = {}
    codes = np.empty(len(items), dtype=np.int64)
    try:
        for i, label in enumerate(items):
            if isinstance(label, (float, complex, np.inexact)) and label != label:
                raise ValueError(
                    "`group_ids` must not contain NaN (NaN != NaN cannot label a group)."
                )
            codes[i] = seen.setdefault(label, len(seen))
    except TypeError:
        raise TypeError(
            f"`group_ids` must hold hashable labels; got {type(label).__name__} at {i}."
        ) from None
    labels = np.empty(len(seen), dtype=object)
    for label, code in seen.items():
        labels[code] = label
    return codes, labels
