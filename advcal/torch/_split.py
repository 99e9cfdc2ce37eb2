"""K from per-response gradient rows gathered over several forward passes: the micro-batches
of one step, or the data-parallel ranks that each hold part of a group."""

from __future__ import annotations

from typing import Any

from advcal.torch._accumulate import _Blocks, _group_layout
from advcal.torch._layers import _torch

__all__ = ["gather_rows", "gram_from_rows"]


def gram_from_rows(rows: Any, offsets: Any = None, group_ids: Any = None, *,
                   group_size: int | None = None, output: str = "numpy") -> Any:
    """Gram matrices K = R Rᵀ, group by group, from per-response gradient rows.

    Parameters
    ----------
    rows : torch.Tensor, shape (N, F)
        One row per response (:meth:`GradientCapture.rows`), the rows of several passes
        concatenated along the responses; a response whose tokens ran in several passes
        has the sum of its rows.
    offsets, group_ids, group_size
        The groups, exactly one of them, as :meth:`GradientCapture.gram` takes them.
    output : {"numpy", "tensor"}, default "numpy"
        A float64 numpy array, or a tensor on the rows' device in their dtype.

    Returns
    -------
    ndarray or torch.Tensor
        ``(B, G, G)`` with ``group_size``; flat blocks of length Σ n_q² otherwise.

    Examples
    --------
    >>> import torch
    >>> from advcal.torch import gram_from_rows
    >>> rows = torch.tensor([[1.0, 0.0], [1.0, 2.0], [0.0, 3.0], [1.0, 1.0]],
    ...                     dtype=torch.float64)
    >>> gram_from_rows(rows, group_size=2)
    array([[[1., 1.],
            [1., 5.]],
    <BLANKLINE>
           [[9., 3.],
            [3., 2.]]])
    """
    torch = _torch()
    if output not in ("numpy", "tensor"):
        raise ValueError(f"`output` must be 'numpy' or 'tensor'; got {output!r}.")
    if not torch.is_tensor(rows):
        raise TypeError(f"`rows` must be a torch.Tensor; got {type(rows).__name__}.")
    if rows.ndim != 2 or rows.shape[0] == 0 or not rows.is_floating_point():
        raise ValueError(f"`rows` must be a non-empty 2-D floating tensor (N, F); got shape "
                         f"{tuple(rows.shape)}, dtype {rows.dtype}.")
    if not bool(torch.isfinite(rows).all()):
        raise ValueError("`rows` holds NaN or inf.")
    n = int(rows.shape[0])
    order, bounds, dense = _group_layout(n, offsets, group_ids, group_size)
    blocks = _Blocks(torch, order, bounds, rows.dtype, rows.device)
    blocks.add_rows(rows.detach())
    out = blocks.result(dense).to(rows.dtype)
    if output == "tensor":
        return out
    return out.cpu().to(torch.float64).numpy()


def gather_rows(rows: Any, *, group: Any = None) -> Any:
    """Every data-parallel rank's rows, in rank order, on every rank.

    A collective (``torch.distributed.all_gather``): every rank of ``group`` must call it.
    Ranks may hold different numbers of responses; the columns must agree (captures with
    the same layers, ``sketch_dim``, ``seed`` and ``sketch``).  Each rank sends N_r · F
    numbers, ``sketch_dim`` a covered layer or fewer per response in sketched mode.

    Parameters
    ----------
    rows : torch.Tensor, shape (N_r, F)
        This rank's rows (:meth:`GradientCapture.rows`).
    group : torch.distributed process group, optional
        Default the whole world.

    Returns
    -------
    torch.Tensor, shape (Σ_r N_r, F)

    Examples
    --------
    One process here; under ``torchrun`` every rank calls it with its own rows.

    >>> import tempfile
    >>> import torch
    >>> import torch.distributed as dist
    >>> from advcal.torch import gather_rows
    >>> store = tempfile.NamedTemporaryFile(delete=False).name
    >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    >>> gather_rows(torch.ones(2, 3)).shape
    torch.Size([2, 3])
    >>> dist.destroy_process_group()
    """
    torch = _torch()
    dist = torch.distributed
    if not torch.is_tensor(rows):
        raise TypeError(f"`rows` must be a torch.Tensor; got {type(rows).__name__}.")
    if rows.ndim != 2:
        raise ValueError("`rows` must be a 2-D tensor (N, F) of this rank's rows.")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("gather_rows needs an initialised torch.distributed process group.")
    size = dist.get_world_size(group)
    shape = torch.tensor([rows.shape[0], rows.shape[1]], dtype=torch.int64,
                         device=rows.device)
    shapes = [torch.zeros_like(shape) for _ in range(size)]
    dist.all_gather(shapes, shape, group=group)
    widths = {int(s[1]) for s in shapes}
    if len(widths) != 1:
        raise ValueError(f"`rows`: the ranks' rows have different widths {sorted(widths)}; "
                         "capture the same layers with the same sketch settings on every "
                         "rank.")
    counts = [int(s[0]) for s in shapes]
    most = max(counts)
    padded = rows.new_zeros(most, rows.shape[1])
    padded[:rows.shape[0]] = rows
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])
