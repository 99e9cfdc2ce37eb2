"""The one place where public inputs are checked and normalized.

Public functions call these helpers once, in a private ``_<name>_iv`` function, and hand
the normalized arrays to kernels that trust them.  Every error names the
argument it is about, so a user can tell which of several arrays is wrong.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from advcal.layouts import groups_from_ids

BACKENDS = ("numba", "numpy")
SINGLETON_POLICIES = ("zero", "raw", "error")
NAN_POLICIES = ("raise", "omit")


def check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise naming ``name``."""
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"`{name}` must be one of {allowed}; got {value!r}.")
    return value


def check_real(
    value: Any,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> float:
    """Return ``value`` as a finite Python float within the given bounds."""
    if type(value) is not float:  # the common case skips the slow ABC checks
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"`{name}` must be a real number; got {type(value).__name__}.")
        value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"`{name}` must be finite; got {value}.")
    too_low = low is not None and (value < low if low_inclusive else value <= low)
    too_high = high is not None and (value > high if high_inclusive else value >= high)
    if too_low or too_high:
        left = "[" if low_inclusive else "("
        right = "]" if high_inclusive else ")"
        lo = "-inf" if low is None else repr(low)
        hi = "inf" if high is None else repr(high)
        raise ValueError(f"`{name}` must lie in {left}{lo}, {hi}{right}; got {value!r}.")
    return value


def check_keywords(function: Any, estimator: str, keywords: Any) -> None:
    """Raise a TypeError naming ``estimator`` and the option when ``keywords`` holds a
    keyword ``function`` does not take (the dispatchers' own message, not Python's)."""
    params = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    takes = [k for k, p in params.items()
             if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                           inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for key in keywords:
        if key not in takes:
            options = ", ".join(k for k in takes if k not in ("rewards", "offsets"))
            raise TypeError(f"estimator {estimator!r} takes no option {key!r}; "
                            f"its options are {options}.")


def check_bounds(bounds: Any, name: str = "bounds") -> tuple[float, float]:
    """Return ``bounds`` as a pair of finite floats ``(lo, hi)`` with ``lo < hi``."""
    message = f"`{name}` must be a pair (lo, hi) of finite numbers with lo < hi"
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise TypeError(f"{message}; got {bounds!r}.") from None
    lo = check_real(lo, f"{name}[0]")
    hi = check_real(hi, f"{name}[1]")
    if not lo < hi:
        raise ValueError(f"{message}; got ({lo!r}, {hi!r}).")
    return lo, hi


def check_int(value: Any, name: str, *, choices: Sequence[int] | None = None) -> int:
    """Return ``value`` as a Python int, optionally restricted to ``choices``."""
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"`{name}` must be an integer; got {type(value).__name__}.")
        value = int(value)
    if choices is not None and value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)}; got {value}.")
    return value


def as_float_array(values: Any, name: str) -> np.ndarray:
    """Convert to a float32/float64 array; other real dtypes are promoted to float64.

    float16 is promoted to float32 (numba has no float16 arithmetic); booleans and
    integers to float64.  Complex, string and object input is a ``TypeError``.
    """
    if type(values) is np.ndarray and values.dtype.char in "fd" and values.dtype.isnative:
        return values  # native float32/float64 ndarray: nothing to convert
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:  # ragged nested lists and the like
        raise TypeError(f"`{name}` must be an array of real numbers ({exc}).") from None
    kind = arr.dtype.kind
    if kind == "f":
        native = arr.dtype.newbyteorder("=")  # kernels and dtype tables need native order
        if native == np.float16:
            return arr.astype(np.float32)
        if native not in (np.float32, np.float64):  # longdouble
            return arr.astype(np.float64)
        return arr.astype(native, copy=False)
    if kind in "biu":
        return arr.astype(np.float64)
    raise TypeError(f"`{name}` must be an array of real numbers; got dtype {arr.dtype}.")


def check_offsets(offsets: Any, n_values: int) -> np.ndarray:
    """Validate CSR offsets for ``n_values`` values; return a contiguous int64 copy-or-view."""
    try:
        arr = np.asarray(offsets)
    except (TypeError, ValueError):
        raise TypeError("`offsets` must be an integer array.") from None
    if arr.ndim != 1 or arr.size == 0:  # before the dtype: [] is float64 to numpy
        raise ValueError(f"`offsets` must be 1-D with at least one entry; got shape {arr.shape}.")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"`offsets` must be an integer array; got dtype {arr.dtype}.")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError("`offsets` entries must fit in int64.")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr[0] != 0:
        raise ValueError(f"`offsets[0]` must be 0; got {arr[0]}.")
    if arr[-1] != n_values:
        raise ValueError(
            f"`offsets[-1]` must equal the number of rewards ({n_values}); got {arr[-1]}."
        )
    if arr.size > 1 and (arr[1:] < arr[:-1]).any():  # (no np.diff: one temporary less)
        raise ValueError("`offsets` must be non-decreasing.")
    return arr


class Batch:
    """Rewards normalized to the ragged layout, plus what is needed to undo it.

    ``values`` is flat, contiguous and grouped (group q is
    ``values[offsets[q]:offsets[q + 1]]``); ``shape`` is the caller's shape for dense
    input; ``order`` is the permutation that grouped ``group_ids`` input.  (A plain
    slotted class: a frozen dataclass's __init__ alone costs a microsecond per call.)
    """

    __slots__ = ("values", "offsets", "shape", "order")

    def __init__(self, values: np.ndarray, offsets: np.ndarray,
                 shape: tuple[int, ...] | None = None, order: np.ndarray | None = None
                 ) -> None:
        self.values = values
        self.offsets = offsets
        self.shape = shape
        self.order = order

    @property
    def n_groups(self) -> int:
        return self.offsets.size - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def gather(self, per_response: Any, name: str) -> np.ndarray:
        """Bring a second per-response array (lengths, scores) into this batch's order."""
        arr = as_float_array(per_response, name)
        expected = self.shape if self.shape is not None else self.values.shape
        if arr.shape != expected:
            raise ValueError(f"`{name}` must have shape {expected}; got {arr.shape}.")
        flat = arr.reshape(-1)
        if self.order is not None:
            flat = flat[self.order]
        return np.ascontiguousarray(flat, dtype=np.float64)

    def gather_weights(self, per_response: Any, name: str, *, positive: bool = False
                       ) -> np.ndarray:
        """:meth:`gather` a per-response array that must be finite and non-negative
        (positive with ``positive=True``): lengths, token counts, variances."""
        flat = self.gather(per_response, name)
        low_ok = flat > 0 if positive else flat >= 0
        if not (np.isfinite(flat).all() and low_ok.all()):
            sign = "positive" if positive else "non-negative"
            raise ValueError(f"`{name}` must be finite and {sign}.")
        return flat

    def restore(self, flat: np.ndarray) -> np.ndarray:
        """Return a per-response result in the layout and order the caller used."""
        if self.shape is not None:
            return flat.reshape(self.shape)
        if self.order is not None:
            out = np.empty_like(flat)
            out[self.order] = flat
            return out
        return flat


@lru_cache(maxsize=64)
def _dense_offsets(n_groups: int, width: int) -> np.ndarray:
    """Offsets of a dense (B, G) batch; cached (read-only) since trainers reuse one shape."""
    offsets = np.arange(n_groups + 1, dtype=np.int64) * width
    offsets.flags.writeable = False
    return offsets


def as_batch(rewards: Any, offsets: Any, group_ids: Any, *, name: str = "rewards") -> Batch:
    """Normalize ``(rewards, offsets, group_ids)`` in either layout (dense or ragged)."""
    values = as_float_array(rewards, name)
    if values.ndim == 2:
        if offsets is not None or group_ids is not None:
            raise ValueError(
                f"`offsets` and `group_ids` apply to 1-D `{name}` only; "
                f"2-D `{name}` are grouped by row."
            )
        flat = np.ascontiguousarray(values).reshape(-1)
        return Batch(flat, _dense_offsets(*values.shape), values.shape)
    if values.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D (with offsets or group_ids) or 2-D; "
                         f"got {values.ndim}-D.")
    if (offsets is None) == (group_ids is None):
        raise ValueError(f"1-D `{name}` need exactly one of `offsets` or `group_ids`.")
    if offsets is not None:
        return Batch(np.ascontiguousarray(values), check_offsets(offsets, values.size))
    index = groups_from_ids(group_ids)
    if index.order.size != values.size:
        raise ValueError(
            f"`group_ids` must have one label per reward ({values.size}); "
            f"got {index.order.size}."
        )
    order = index.order
    if (order[1:] > order[:-1]).all():
        # Labels already grouped (verl's usual layout): a permutation in increasing order
        # is the identity, so no gather now, no scatter back.
        return Batch(np.ascontiguousarray(values), index.offsets)
    return Batch(np.ascontiguousarray(values[order]), index.offsets, order=order)


def valid_counts(batch: Batch, omit_nan: bool) -> np.ndarray:
    """Number of responses per group that enter the group statistics."""
    if not omit_nan:
        return batch.sizes
    cum = np.concatenate(([0], np.cumsum(~np.isnan(batch.values))))
    return cum[batch.offsets[1:]] - cum[batch.offsets[:-1]]


def as_policy_batch(
    rewards: Any, offsets: Any, group_ids: Any, *, singleton: Any, nan_policy: Any, backend: Any
) -> tuple[Batch, bool, bool]:
    """The grouped batch plus the policies every group estimator shares.

    Returns ``(batch, raw_singletons, omit_nan)``; ``singleton="error"`` is enforced here.
    """
    check_choice(singleton, "singleton", SINGLETON_POLICIES)
    check_choice(nan_policy, "nan_policy", NAN_POLICIES)
    check_choice(backend, "backend", BACKENDS)
    batch = as_batch(rewards, offsets, group_ids)
    omit = nan_policy == "omit"
    if singleton == "error":
        counts = valid_counts(batch, omit)
        if (counts == 1).any():
            q = int(np.flatnonzero(counts == 1)[0])
            raise ValueError(
                f"group {q} has a single response and `singleton='error'`; "
                "pass singleton='zero' or 'raw' to accept lone responses."
            )
    return batch, singleton == "raw", omit


def raise_bad_values(values: np.ndarray, omit_nan: bool, name: str = "rewards") -> None:
    """Explain why a kernel saw non-finite numbers (called only on the error path)."""
    if not omit_nan and np.isnan(values).any():
        raise ValueError(
            f"`{name}` contain NaN; pass nan_policy='omit' to leave unscorable "
            "responses out of their groups."
        )
    if np.isinf(values).any():
        raise ValueError(f"`{name}` must be finite; got inf.")
    raise ValueError(
        f"`{name}` are too large: the advantages overflow {values.dtype} "
        "(rescale the rewards)."
    )
