"""Layout helpers for grouped flat arrays and per-group square blocks.

A batch in grouped order is a flat array plus CSR ``offsets``: group q is
``x[offsets[q]:offsets[q + 1]]``.  Per-group matrices (Jacobians, set shapes, Gram
matrices) are row-major n_q x n_q blocks concatenated in group order, block q starting at
``block_offsets(sizes)[q]``.  The dense paths work on all groups of one size at once:
:func:`size_classes` yields them, :func:`gather_rows` / :func:`gather_blocks` read them as
stacked arrays (views when the groups are consecutive) and :func:`scatter_blocks` writes
them back.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from advcal._validation import Batch


def segment_sum(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-group sums of a flat grouped array (empty groups give 0)."""
    n_groups = offsets.size - 1
    out = np.zeros(n_groups, dtype=np.float64)
    if x.size == 0 or n_groups == 0:
        return out
    starts = offsets[:-1]
    sizes = offsets[1:] - starts
    if (sizes == sizes[0]).all():
        return x.reshape(n_groups, -1).sum(axis=1)
    nonempty = sizes > 0
    out[nonempty] = np.add.reduceat(x, starts[nonempty])
    return out


def expand(per_group: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Repeat a per-group value for each response of its group."""
    return np.repeat(per_group, np.diff(offsets))


def block_offsets(sizes: np.ndarray) -> np.ndarray:
    """Offsets of row-major n_q × n_q blocks concatenated in group order."""
    out = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes.astype(np.int64) ** 2, out=out[1:])
    return out


# Groups per batched numpy step: bounds the (chunk, n, n) temporaries of the dense paths.
CLASS_CHUNK = 1 << 16


def size_classes(sizes: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(n, indices of up to CLASS_CHUNK groups of size n) covering every group once."""
    if sizes.size and (sizes == sizes[0]).all():
        classes = [(int(sizes[0]), np.arange(sizes.size))]
    else:
        classes = [(int(n), np.flatnonzero(sizes == n)) for n in np.unique(sizes)]
    for n, idx in classes:
        for start in range(0, idx.size, CLASS_CHUNK):
            yield n, idx[start:start + CLASS_CHUNK]


def consecutive(idx: np.ndarray) -> bool:
    """Whether ``idx`` is a run of consecutive groups (then their values are contiguous)."""
    return bool(idx.size) and int(idx[-1]) - int(idx[0]) + 1 == idx.size


def gather_rows(flat: np.ndarray, offsets: np.ndarray, idx: np.ndarray, n: int) -> np.ndarray:
    """The groups ``idx`` (all of size n) of a flat grouped array as an (len(idx), n) array
    (a view when they are consecutive)."""
    if consecutive(idx):
        start = int(offsets[idx[0]])
        return flat[start:start + idx.size * n].reshape(idx.size, n)
    return flat[offsets[idx][:, None] + np.arange(n)]


def gather_blocks(blocks: np.ndarray, boffsets: np.ndarray, idx: np.ndarray, n: int
                  ) -> np.ndarray:
    """The n × n blocks of the groups ``idx`` as an (len(idx), n, n) array (a view when
    they are consecutive)."""
    if consecutive(idx):
        start = int(boffsets[idx[0]])
        return blocks[start:start + idx.size * n * n].reshape(idx.size, n, n)
    return blocks[boffsets[idx][:, None] + np.arange(n * n)].reshape(-1, n, n)


def scatter_blocks(out: np.ndarray, boffsets: np.ndarray, idx: np.ndarray, n: int,
                   values: np.ndarray) -> None:
    """Write the (len(idx), n, n) ``values`` into the blocks of the groups ``idx``."""
    if consecutive(idx):
        start = int(boffsets[idx[0]])
        out[start:start + idx.size * n * n] = values.reshape(-1)
        return
    out[boffsets[idx][:, None] + np.arange(n * n)] = values.reshape(-1, n * n)


def restore_blocks(batch: Batch, blocks: np.ndarray) -> np.ndarray:
    """Per-group blocks in the caller's layout: (B, G, G) for dense input, flat otherwise."""
    if batch.shape is not None:
        n_groups, width = batch.shape
        return blocks.reshape(n_groups, width, width)
    return blocks


def centered(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """x − group mean, computed after shifting by the group's first value so a constant
    group gives exact zeros."""
    sizes = np.diff(offsets)
    first = np.zeros(sizes.size)
    nonempty = sizes > 0
    first[nonempty] = values[offsets[:-1][nonempty]]
    shifted = values - expand(first, offsets)
    mean = segment_sum(shifted, offsets) / np.maximum(sizes, 1)
    return shifted - expand(mean, offsets)
