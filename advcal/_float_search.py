"""The floats where a monotone test changes: per element, the largest (or smallest) float64
in a range for which a vectorised predicate holds.  The conformal ranges use it to place
each endpoint exactly where the reward's score, computed in float as at calibration,
passes the radius (``advcal.conformal``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

_SIGN = np.int64(-(2**63))
_MAGNITUDE = np.int64(2**63 - 1)


def float_key(x: np.ndarray) -> np.ndarray:
    """Order-preserving int64 code of float64 values: adjacent floats differ by 1."""
    bits = np.ascontiguousarray(x, dtype=np.float64).view(np.int64)
    magnitude = bits & _MAGNITUDE
    return np.where(bits < 0, -magnitude, magnitude)  # -0.0 and 0.0 share code 0


def key_float(key: np.ndarray) -> np.ndarray:
    return np.where(key < 0, (-key) | _SIGN, key).view(np.float64)


def last_true(holds: Callable[[np.ndarray, Any], np.ndarray], start: np.ndarray,
               low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Per element, the largest code in ``[low, high]`` where ``holds`` is true.

    ``holds(codes, index)`` tests the elements ``index`` (a slice or an index array) and
    must be monotone in the code (true, then false).  ``low - 1`` where it holds nowhere.
    The float formula ``start`` is usually the answer or next to it: two passes over all
    elements settle those, and the few left gallop from there, then bisect.
    """
    everything = slice(None)
    probe = np.clip(start, low, high)
    ok = holds(probe, everything)
    side = np.where(ok, np.minimum(probe + 1, high), np.maximum(probe - 1, low))
    ok_side = holds(side, everything)
    # Invariant below: holds at true_at (low - 1 counts as true), fails at false_at.
    true_at = np.where(ok, np.where(ok_side, side, probe), np.where(ok_side, side, low - 1))
    false_at = np.where(ok, np.where(ok_side, high + 1, side), np.where(ok_side, probe, side))
    # At high, side is probe itself: high + 1 stays the (virtual) first failure.
    seen_true = ok | ok_side
    seen_false = ~ok | ~ok_side
    # The gap can exceed int64 for bounds of opposite sign near the float limits.
    gap = false_at.astype(np.uint64) - true_at.astype(np.uint64)
    index = np.flatnonzero(gap > 1)
    step = np.full(index.size, 2, dtype=np.int64)
    while index.size:
        t, f = true_at[index], false_at[index]
        gap = f.astype(np.uint64) - t.astype(np.uint64)
        jump = np.minimum(step.astype(np.uint64), gap - 1).astype(np.int64)
        half = (gap // 2).astype(np.int64)
        st, sf = seen_true[index], seen_false[index]
        at = np.where(st & sf, t + half, np.where(st, t + jump, f - jump))
        ok = holds(at, index)
        true_at[index[ok]] = at[ok]
        seen_true[index[ok]] = True
        false_at[index[~ok]] = at[~ok]
        seen_false[index[~ok]] = True
        gap = false_at[index].astype(np.uint64) - true_at[index].astype(np.uint64)
        live = gap > 1
        index, step = index[live], np.minimum(step[live] * 2, 2**62)
    return true_at


def last_float(holds: Callable[[np.ndarray, Any], np.ndarray], guess: np.ndarray,
                low: float, high: float) -> np.ndarray:
    """The largest float y in ``[low, high]`` with ``holds(y, index)`` (monotone in y:
    true, then false), per element; NaN where there is none.

    The guess is checked with its neighbour first (one pass, the answer nearly always);
    the rest are searched among the float codes.
    """
    everything = slice(None)
    y = np.clip(guess, low, high)
    ok = holds(y, everything)
    with np.errstate(over="ignore", invalid="ignore"):
        side = np.where(ok, np.nextafter(y, np.inf), np.nextafter(y, -np.inf))
        ok_side = holds(side, everything)
    done = np.where(ok, (y == high) | ~ok_side, ok_side & (y > low))
    y = np.where(ok, y, side)
    rest = np.flatnonzero(~done)
    if rest.size:
        lo_code, hi_code = float_key(np.array([low, high]))
        code = last_true(lambda k, i: holds(key_float(k), rest[i]), float_key(y[rest]),
                          np.full(rest.size, lo_code), np.full(rest.size, hi_code))
        y[rest] = np.where(code < lo_code, np.nan, key_float(code))
    return y + 0.0  # -0.0 prints as "-0."


def first_float(holds: Callable[[np.ndarray, Any], np.ndarray], guess: np.ndarray,
                 low: float, high: float) -> np.ndarray:
    """:func:`last_float` mirrored: the smallest y where ``holds`` (false, then true)."""
    everything = slice(None)
    y = np.clip(guess, low, high)
    ok = holds(y, everything)
    with np.errstate(over="ignore", invalid="ignore"):
        side = np.where(ok, np.nextafter(y, -np.inf), np.nextafter(y, np.inf))
        ok_side = holds(side, everything)
    done = np.where(ok, (y == low) | ~ok_side, ok_side & (y < high))
    y = np.where(ok, y, side)
    rest = np.flatnonzero(~done)
    if rest.size:
        lo_code, hi_code = float_key(np.array([low, high]))
        # The float axis reversed: the last code where the test holds.
        code = last_true(lambda k, i: holds(key_float(-k), rest[i]), -float_key(y[rest]),
                          np.full(rest.size, -hi_code), np.full(rest.size, -lo_code))
        y[rest] = np.where(code < -hi_code, np.nan, key_float(-code))
    return y + 0.0
