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


def label_key(label: Any) -> Any:
    """A hashable key under which two labels are equal iff they have the same type and value.

    Python's own equality makes ``1``, ``True`` and ``1.0`` one dict key; advcal keeps
    them apart, as the log readers and the calibration file format do.  numpy scalars
    count as the Python type they stand for (``np.int64(1)`` is the int ``1``, as the
    labels of an integer array are), and tuples compare element by element.
    """
    if label is None:
        return ("none",)
    if isinstance(label, (bool, np.bool_)):
        return ("bool", bool(label))
    if type(label) is int or isinstance(label, np.integer):
        return ("int", int(label))
    if type(label) is float or isinstance(label, np.floating):
        return ("float", float(label))
    if type(label) is complex or isinstance(label, np.complexfloating):
        return ("complex", complex(label))
    if type(label) is str or isinstance(label, np.str_):
        return ("str", str(label))
    if type(label) is bytes or isinstance(label, np.bytes_):
        return ("bytes", bytes(label))
    if type(label) is tuple:
        return ("tuple", tuple(label_key(v) for v in label))
    if type(label) is frozenset:
        return ("frozenset", frozenset(label_key(v) for v in label))
    return (type(label), label)  # other hashables: equal within their own type


def numpy_keeps_labels(values: Any) -> bool:
    """Whether ``np.asarray(values)`` keeps the labels apart exactly as :func:`label_key`.

    numpy converts a list element by element into one common type, so a list that mixes
    ``1``, ``True`` and ``1.0`` (or ``1`` and ``"1"``) would become equal values: only a
    list or tuple of one numeric scalar type is safe.  Arrays and other array-likes are
    typed already.  (Lists of strings are hashed by the callers, to keep ``str`` labels.)
    """
    if not isinstance(values, (list, tuple)):
        return True
    kinds = set(map(type, values))
    if len(kinds) != 1:
        return not values
    kind = kinds.pop()
    return kind in (int, float, bool) or (issubclass(kind, np.generic)
                                          and not issubclass(kind, (np.str_, np.bytes_)))


def groups_from_ids(group_ids: Any) -> GroupIndex:
    """Group responses by arbitrary per-response labels (the verl ``uid`` layout).

    Parameters
    ----------
    group_ids : sequence of hashable, length N
        Any labels (strings, integers, tuples, ...) in any order.  Responses with equal
        labels form one group; labels are equal when they have the same type and value
        (``1``, ``True``, ``1.0`` and ``"1"`` are four groups; a numpy scalar counts as
        the Python type it stands for).

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
    if ids is not None and not isinstance(group_ids, np.ndarray) and (
            ids.dtype.kind in "US" or not numpy_keeps_labels(group_ids)):
        ids = None  # numpy would coerce [1, "1"] or [1, True, 1.0] to equal values: hash
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
    labels_seen: list[Any] = []
    codes = np.empty(len(items), dtype=np.int64)
    try:
        for i, label in enumerate(items):
            if isinstance(label, (float, complex, np.inexact)) and label != label:
                raise ValueError(
                    "`group_ids` must not contain NaN (NaN != NaN cannot label a group)."
                )
            key = label_key(label)
            code = seen.setdefault(key, len(seen))
            if code == len(labels_seen):
                labels_seen.append(label)
            codes[i] = code
    except TypeError:
        raise TypeError(
            f"`group_ids` must hold hashable labels; got {type(label).__name__} at {i}."
        ) from None
    labels = np.empty(len(labels_seen), dtype=object)
    for code, label in enumerate(labels_seen):  # one by one: tuples stay single labels
        labels[code] = label
    return codes, labels
