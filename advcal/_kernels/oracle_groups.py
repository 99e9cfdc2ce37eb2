"""The group iterator of the numpy reference engines (``*_numpy``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def groups(x: np.ndarray, offsets: np.ndarray, omit_nan: bool = False
           ) -> Iterator[tuple[int, slice, np.ndarray, np.ndarray]]:
    """Yield (q, slice, valid mask, valid values as float64) for every group q of the CSR
    batch ``x[offsets[q]:offsets[q + 1]]``; with ``omit_nan`` NaN values are not valid."""
    for q in range(offsets.size - 1):
        sl = slice(int(offsets[q]), int(offsets[q + 1]))
        g = x[sl].astype(np.float64)
        valid = ~np.isnan(g) if omit_nan else np.ones(g.size, dtype=bool)
        yield q, sl, valid, g[valid]
