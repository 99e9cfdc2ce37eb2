"""Batch layouts: dense ``(B, G)`` rows and ragged flat arrays with CSR ``offsets``.

Group q of a ragged batch is ``x[offsets[q]:offsets[q + 1]]``.  The helpers
here build ``offsets`` from group sizes or from per-response labels (the verl ``uid``
layout), so every public function can take whichever layout a trainer already has.
"""

from __future__ import annotations

import ctypes
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
    index = _groups_of_plain_strings(group_ids)
    return index if index is not None else _groups_by_rule(group_ids)


def _groups_by_rule(group_ids: Any) -> GroupIndex:
    """:func:`groups_from_ids` for any labels (the general path)."""
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
        codes, labels = _codes_of_typed(ids)
    else:
        codes, labels = _codes_by_hashing(group_ids)
    order = _grouping_order(codes, labels.size)
    sizes = np.bincount(codes, minlength=labels.size) if codes.size else np.zeros(0, np.int64)
    return GroupIndex(offsets_from_sizes(sizes.astype(np.int64)), order, labels)


def _run_starts(equal_to_previous: np.ndarray) -> np.ndarray:
    """Start of each run, from whether each element (but the first) equals the one before."""
    starts = np.empty(equal_to_previous.size - np.count_nonzero(equal_to_previous) + 1,
                      dtype=np.intp)
    starts[0] = 0
    np.add(np.flatnonzero(~equal_to_previous), 1, out=starts[1:])
    return starts


def _codes_of_typed(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group codes by first appearance for a 1-D array of numbers, strings or dates."""
    if ids.size < 2:
        return np.zeros(ids.size, dtype=np.intp), ids.copy()
    # Equal neighbours (contiguous groups) need no sorting: label each run once.  A group's
    # first response always starts a run, so the labels are the same elements as before.
    starts = _run_starts(ids[1:] == ids[:-1])
    heads = ids[starts]
    if ids.dtype.kind in "US":
        # One dict pass over the runs: equal strings have equal (zero-padded) storage, so
        # Python's equality of their ``tolist`` strings is numpy's.
        seen: dict[Any, int] = {}
        run_codes = np.fromiter((seen.setdefault(v, len(seen)) for v in heads.tolist()),
                                dtype=np.intp, count=heads.size)
        firsts = _first_of_each_code(run_codes, len(seen))
    else:
        _, first, inverse = np.unique(heads, return_index=True, return_inverse=True)
        # np.unique sorts labels; renumber groups by first appearance instead.
        by_appearance = np.argsort(first, kind="stable")
        rank = np.empty_like(by_appearance)
        rank[by_appearance] = np.arange(by_appearance.size)
        run_codes = rank[inverse.reshape(-1)]
        firsts = first[by_appearance]
    return _codes_of_runs(run_codes, starts, ids.size), heads[firsts]


def _first_of_each_code(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """Where each code first occurs, for codes numbered by first appearance."""
    if n_codes == codes.size:
        return np.arange(n_codes)
    return np.unique(codes, return_index=True)[1]


def _codes_of_runs(run_codes: np.ndarray, starts: np.ndarray | None, n: int) -> np.ndarray:
    """A code per element from a code per run (``starts`` None: every element is a run)."""
    if starts is None or starts.size == n:
        return run_codes
    return np.repeat(run_codes, np.diff(starts, append=n))


def _grouping_order(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """``np.argsort(codes, kind="stable")`` as int64, for codes in ``[0, n_codes)``.

    Already grouped codes (contiguous groups) need no sort at all.
    """
    if codes.size < 2 or not (codes[1:] < codes[:-1]).any():
        return np.arange(codes.size, dtype=np.int64)
    return _radix_argsort(codes, n_codes).astype(np.int64, copy=False)


def _radix_argsort(values: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` for integers in ``[0, bound)``.

    Sorted digit by digit from the lowest, 16 bits (or the last 8) at a time: numpy's
    stable sort of 16- and 8-bit keys counts (a radix sort) instead of comparing, so each
    digit costs a few passes over the data, not a merge sort's log2(n).
    """
    if bound > 1 << 48:
        return np.argsort(values, kind="stable")
    order: np.ndarray | None = None
    shift = 0
    while order is None or (bound - 1) >> shift:
        wide = (bound - 1) >> shift > 0xFF
        digit = (values >> shift).astype(np.uint16 if wide else np.uint8)  # wraps: low bits
        order = (np.argsort(digit, kind="stable") if order is None
                 else order[np.argsort(digit[order], kind="stable")])
        shift += 16 if wide else 8
    return order


_PLAIN_STRINGS = (str, bytes)


def _groups_of_plain_strings(group_ids: Any) -> GroupIndex | None:
    """:func:`groups_from_ids` of an object array, list or tuple whose labels are all exactly
    ``str`` (or all exactly ``bytes``), as verl's uids are; None for any other labels.

    For such labels Python's equality is the label rule, and a label repeated by reference
    (verl repeats each uid object once per response) is one object: grouping the objects by
    address first leaves one Python-level look at each distinct object, not at each label.
    """
    if type(group_ids) is np.ndarray:
        if group_ids.dtype != object or group_ids.ndim != 1 or group_ids.size == 0:
            return None
        arr = np.ascontiguousarray(group_ids)
    elif type(group_ids) in (list, tuple):
        if not group_ids or type(group_ids[0]) not in _PLAIN_STRINGS:
            return None
        arr = np.fromiter(group_ids, dtype=object, count=len(group_ids))
    else:
        return None
    if arr.itemsize != np.dtype(np.uintp).itemsize:
        return None
    n = arr.size
    address = _object_addresses(arr)
    same = address[1:] == address[:-1]
    starts: np.ndarray | None = None
    run_object: np.ndarray | None = None  # None: run r holds candidate object r
    if 2 * (n - np.count_nonzero(same)) <= n:
        # Mostly runs of one object (contiguous groups): one candidate object per run.
        starts = _run_starts(same)
        objects = checked = starts
    else:
        run_object, objects, checked = _first_appearance_codes(address)
    del address, same
    # Checked in address order: reading the objects in memory order is several times faster.
    heads = arr[checked]
    candidates = heads.tolist()
    kinds = set(map(type, candidates))
    if len(kinds) != 1 or kinds.pop() not in _PLAIN_STRINGS:
        return None
    if len(set(candidates)) == len(candidates):  # distinct objects, distinct values
        labels = heads if checked is objects else arr[objects]
        run_codes = run_object
    else:
        seen: dict[Any, int] = {}
        value_codes = np.fromiter((seen.setdefault(v, len(seen)) for v in arr[objects].tolist()),
                                  dtype=np.intp, count=objects.size)
        labels = arr[objects[_first_of_each_code(value_codes, len(seen))]]
        run_codes = value_codes if run_object is None else value_codes[run_object]
    if run_codes is None:  # every run is a group of its own, in order
        assert starts is not None
        return GroupIndex(np.append(starts, n).astype(np.int64), np.arange(n, dtype=np.int64),
                          labels)
    codes = _codes_of_runs(run_codes, starts, n)
    sizes = np.bincount(codes, minlength=labels.size).astype(np.int64)
    return GroupIndex(offsets_from_sizes(sizes), _grouping_order(codes, labels.size), labels)


def _object_addresses(arr: np.ndarray) -> np.ndarray:
    """The address of each object a C-contiguous object array holds, read from its buffer
    (numpy lends no integer view of it).  ``arr`` holds a reference to each object, so while
    it lives equal addresses are the same object; the view must not outlive ``arr``."""
    raw = (ctypes.c_char * arr.nbytes).from_address(arr.ctypes.data)
    return np.frombuffer(memoryview(raw), dtype=np.uintp)


def _first_appearance_codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes of unsigned integers numbered by first appearance, where each code first occurs,
    and those first occurrences again in increasing order of their key."""
    n = keys.size
    offset = keys - keys.min()
    # Objects are aligned: without their common low zero bits, the addresses of objects
    # made together span a range near their number, which a table indexes without a sort.
    common = int(np.bitwise_or.reduce(offset))
    shift = (common & -common).bit_length() - 1 if common else 0
    size = (int(offset.max()) >> shift) + 1
    slot = offset >> shift
    del offset
    position = np.arange(n, dtype=np.intp)
    if size > 8 * n + 4096:  # a sparse table would cost more than sorting the keys
        by_key = _radix_argsort(slot, size)
        sorted_slot = slot[by_key]
        starts_key = np.empty(n, dtype=bool)
        starts_key[0] = True
        np.not_equal(sorted_slot[1:], sorted_slot[:-1], out=starts_key[1:])
        del sorted_slot
        first_by_key = by_key[starts_key]  # stable: the first occurrence of each key
        key_of = np.empty(n, dtype=np.intp)
        key_of[by_key] = np.cumsum(starts_key) - 1
        is_first = np.zeros(n, dtype=bool)
        is_first[first_by_key] = True
        firsts = np.flatnonzero(is_first)
        code_of_key = np.empty(firsts.size, dtype=np.intp)
        code_of_key[key_of[firsts]] = np.arange(firsts.size)
        return code_of_key[key_of], firsts, first_by_key
    index = np.dtype(np.int32 if n < 1 << 31 else np.intp)  # half the tables' memory
    first_in_slot: np.ndarray = np.full(size, n, dtype=index)
    slot = slot.astype(np.intp)
    np.minimum.at(first_in_slot, slot, position.astype(index, copy=False))
    firsts = np.flatnonzero(first_in_slot[slot] == position)
    code_of_slot = np.empty(size, dtype=index)  # read only at the slots written next
    code_of_slot[slot[firsts]] = np.arange(firsts.size, dtype=index)
    return (code_of_slot[slot].astype(np.intp), firsts,
            first_in_slot[first_in_slot < n].astype(np.intp))


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
