"""Checks of a calibration's stored fields, shared by the classes' own validation
(``SetCalibration``, ``RangeCalibration``, ``ThresholdSelection``) and the file format: exact
types (numpy arrays of a kind, real numbers that may be infinite), each error naming the
field."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def real(value: Any, name: str, *, low: float | None = None, high: float | None = None,
          low_open: bool = False, high_open: bool = False, allow_inf: bool = False,
          allow_neg_inf: bool = False) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number; got {type(value).__name__}.")
    try:
        v = float(value)
    except OverflowError:  # an integer beyond the float range
        raise ValueError(f"`{name}` must be finite; got an integer beyond the float "
                         "range.") from None
    if math.isnan(v):
        raise ValueError(f"`{name}` must not be NaN.")
    if math.isinf(v) and not ((v > 0 and allow_inf) or (v < 0 and allow_neg_inf)):
        raise ValueError(f"`{name}` must be finite; got {v}.")
    if low is not None and (v < low or (low_open and v == low)):
        raise ValueError(f"`{name}` must be {'>' if low_open else '>='} {low!r}; got {v!r}.")
    if high is not None and (v > high or (high_open and v == high)):
        raise ValueError(f"`{name}` must be {'<' if high_open else '<='} {high!r}; got {v!r}.")
    return v


def alpha(value: Any, name: str = "alpha") -> float:
    return real(value, name, low=0.0, high=1.0, low_open=True, high_open=True)


def float_vector(value: Any, name: str, *, size: int | None = None,
                  allow_empty: bool = False) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"`{name}` must be a numpy array; got {type(value).__name__}.")
    if value.dtype.kind != "f":
        raise ValueError(f"`{name}` must have a floating dtype; got {value.dtype}.")
    if value.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {value.shape}.")
    if size is not None and value.size != size:
        raise ValueError(f"`{name}` must have shape ({size},); got {value.shape}.")
    if value.size == 0 and not allow_empty:
        raise ValueError(f"`{name}` must hold at least one value; got none.")
    return value


def int_vector(value: Any, name: str, size: int) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"`{name}` must be a numpy array; got {type(value).__name__}.")
    if value.dtype.kind not in "iu":
        raise ValueError(f"`{name}` must have an integer dtype; got {value.dtype}.")
    if value.shape != (size,):
        raise ValueError(f"`{name}` must have shape ({size},); got {value.shape}.")
    return value
