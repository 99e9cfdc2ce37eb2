"""Category labels under advcal's label rule: two labels are one category only when they
have the same type and value (:func:`advcal.layouts.label_key`), so ``1``, ``True``, ``1.0``
and ``"1"`` are four categories.  The Mondrian calibration's codes per response, and the
read-only mapping its radii are kept in."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from advcal.layouts import label_key, numpy_keeps_labels

__all__ = ["LabelMapping", "category_codes", "hashed_codes"]


class LabelMapping(Mapping[Any, float]):
    """A read-only mapping from category labels, under advcal's label rule.

    Two labels are the same key only when they have the same type and value (see
    :func:`advcal.layouts.label_key`): ``1``, ``True``, ``1.0`` and ``"1"`` are four keys,
    where a ``dict`` would merge the first three.  Iteration yields the labels as they
    were given, in order of first appearance.

    Parameters
    ----------
    items : iterable of (label, value)
        The entries; a label given twice (under the rule) raises ``ValueError``.
    """

    __slots__ = ("_labels", "_values")

    def __init__(self, items: Iterable[tuple[Any, float]] = ()) -> None:
        labels: dict[Any, Any] = {}
        values: dict[Any, float] = {}
        for label, value in items:
            key = label_key(label)
            if key in labels:
                raise ValueError(f"`radius` has the label {label!r} twice.")
            labels[key] = label
            values[key] = value
        self._labels = labels
        self._values = values

    def __getitem__(self, label: Any) -> float:
        try:
            return self._values[label_key(label)]
        except TypeError:
            raise KeyError(label) from None
        except KeyError:
            raise KeyError(label) from None

    def __contains__(self, label: object) -> bool:
        try:
            return label_key(label) in self._values
        except TypeError:  # an unhashable label is never a key
            return False

    def __iter__(self) -> Iterator[Any]:
        return iter(self._labels.values())

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        body = ", ".join(f"{self._labels[k]!r}: {v!r}" for k, v in self._values.items())
        return f"LabelMapping({{{body}}})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        if isinstance(other, LabelMapping):
            return self._values == other._values
        try:
            typed = LabelMapping(other.items())
        except (TypeError, ValueError):
            return False
        return self._values == typed._values

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (LabelMapping, (list(self.items()),))


def category_codes(categories: Any, shape: tuple[int, ...]) -> tuple[list[Any], np.ndarray]:
    """Distinct labels and a code per response (flattened), for any hashable labels.

    Examples
    --------
    >>> from advcal.labels import category_codes
    >>> labels, codes = category_codes([1, True, 1.0, 1], (4,))
    >>> labels, codes.tolist()
    ([1, True, 1.0], [0, 1, 2, 0])
    """
    if isinstance(categories, (str, bytes)):
        raise TypeError("`categories` must be a sequence of labels, not a single string.")
    try:
        arr: np.ndarray | None = np.asarray(categories)
    except (TypeError, ValueError):  # ragged sequences of tuples and the like
        arr = None
    if arr is not None and arr.dtype.kind in "biuf" and not isinstance(categories, np.ndarray):
        flat = list(np.asarray(categories, dtype=object).reshape(-1))
        if not numpy_keeps_labels(flat):
            # [1, True, 1.0] would become three equal floats: hash the labels instead.
            if arr.shape == shape:
                return hashed_codes(flat)
            raise ValueError(f"`categories` must have shape {shape}; got {arr.shape}.")
    if (arr is not None and arr.dtype.kind in "US"
            and not isinstance(categories, np.ndarray)):
        # numpy would turn [1, "1"] (at any nesting) into ["1", "1"]: keep the labels'
        # own types, hashing them flat when they have the rewards' shape.
        labelled = np.asarray(categories, dtype=object)
        if labelled.shape == shape and not all(isinstance(c, (str, bytes))
                                               for c in labelled.reshape(-1)):
            return hashed_codes(list(labelled.reshape(-1)))
        if arr.ndim == 1 and not all(isinstance(c, (str, bytes)) for c in categories):
            arr = None
    if arr is not None and arr.dtype.kind in "biufUS":
        if arr.shape == shape:
            if arr.dtype.kind == "f" and np.isnan(arr).any():
                raise ValueError("`categories` must not contain NaN.")
            labels, inverse = np.unique(arr.reshape(-1), return_inverse=True)
            return labels.tolist(), inverse.reshape(-1)
        if isinstance(categories, np.ndarray) or arr.ndim != 2 or len(shape) != 1:
            raise ValueError(f"`categories` must have shape {shape}; got {arr.shape}.")
    # Labels numpy cannot hold as one array (tuples, mixed types): one dict pass.
    try:
        items = list(categories)
    except TypeError:
        raise TypeError("`categories` must be a sequence of hashable labels.") from None
    if len(shape) != 1 or len(items) != shape[0]:
        raise ValueError(f"`categories` must have shape {shape}; got {len(items)} labels.")
    return hashed_codes(items)


def hashed_codes(items: list[Any]) -> tuple[list[Any], np.ndarray]:
    """Labels in order of first appearance and a code per label, by hashing.

    Labels are equal only with the same type and value (:func:`label_key`); a numpy
    scalar label is kept as the Python scalar it stands for.

    Examples
    --------
    >>> from advcal.labels import hashed_codes
    >>> labels, codes = hashed_codes(["b", "a", "b", ("a", 1)])
    >>> labels, codes.tolist()
    (['b', 'a', ('a', 1)], [0, 1, 0, 2])
    """
    seen: dict[Any, int] = {}
    labels: list[Any] = []
    codes = np.empty(len(items), dtype=np.int64)
    for i, label in enumerate(items):
        if isinstance(label, (float, np.floating, complex, np.complexfloating)) \
                and label != label:
            raise ValueError("`categories` must not contain NaN.")
        try:
            code = seen.setdefault(label_key(label), len(seen))
        except TypeError:
            raise TypeError(
                f"`categories` must hold hashable labels; got {type(label).__name__}."
            ) from None
        if code == len(labels):
            labels.append(label.item() if isinstance(label, np.generic) else label)
        codes[i] = code
    return labels, codes
