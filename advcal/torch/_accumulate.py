"""Where the Gram's contributions add up: per-group K blocks by either exact route (materialised
per-response gradients or token pairs), sketch rows, in a fixed workspace with float64 sums;
the group layout of the responses and the sketch projections."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from advcal._validation import check_offsets
from advcal.layouts import GroupIndex, groups_from_ids
from advcal.torch._layers import _torch

# Elements of one materialised block of per-response gradients (route "materialise"): a
# layer wider than this is done in slices of its output rows, so memory stays bounded.
WORKSPACE = 1 << 24


# The per-response rows gathered for G Gᵀ products (their workspace, and its float64
# copy) and each chunk of token pairs stay within this share of WORKSPACE.
_SHARE = 8


# Tests set this to "materialise" or "pairs" to run one exact route everywhere.
_FORCE_ROUTE: str | None = None


def _group_layout(n: int, offsets: Any, group_ids: Any, group_size: Any
                  ) -> tuple[np.ndarray | None, np.ndarray, bool]:
    """The groups as (order, bounds, dense): the responses in output order (None when that
    is the batch order), the groups' boundaries in that order, and whether the output is
    ``(B, G, G)``."""
    given = [name for name, value in (("offsets", offsets), ("group_ids", group_ids),
                                      ("group_size", group_size)) if value is not None]
    if len(given) != 1:
        raise ValueError("pass exactly one of `offsets`, `group_ids` (flat blocks) or "
                         f"`group_size` ((B, G, G) blocks); got {given or 'none'}.")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
                or group_size < 1:
            raise ValueError(f"`group_size` must be a positive integer; got {group_size!r}.")
        g = int(group_size)
        if n % g:
            raise ValueError(f"`objectives` has {n} entries, not a multiple of "
                             f"`group_size`={g}.")
        return None, np.arange(0, n + 1, g), True
    if offsets is not None:
        if _torch().is_tensor(offsets):
            offsets = offsets.detach().cpu().numpy()
        try:
            off = check_offsets(offsets, n)
        except ValueError as exc:
            raise ValueError(str(exc).replace("number of rewards", "length of `objectives`")) \
                from None
        return None, np.asarray(off, dtype=np.int64), False
    if isinstance(group_ids, GroupIndex):  # labels grouped once by the caller
        index = group_ids
        order = np.asarray(index.order)
        if order.ndim != 1 or order.size != n or order.dtype.kind not in "iu" \
                or (order < 0).any() or not (np.bincount(order, minlength=n) == 1).all():
            raise ValueError(f"`group_ids`: its GroupIndex order must be a permutation of the "
                             f"{n} responses.")
        check_offsets(index.offsets, n)
    else:
        if _torch().is_tensor(group_ids):
            group_ids = group_ids.detach().cpu().numpy()
        index = groups_from_ids(group_ids)
        if index.order.size != n:
            raise ValueError(f"`group_ids` must have one label per objective ({n}); got "
                             f"{index.order.size}.")
    order = np.asarray(index.order, dtype=np.int64)
    identity = bool((order == np.arange(n)).all())
    return (None if identity else order), np.asarray(index.offsets, dtype=np.int64), False


def _sketch_sides(d_out: int, d_in: int, k: int) -> tuple[int, int] | None:
    """(k_out, k_in) with k_out·k_in ≤ k, as even as the layer allows; None when the layer
    has at most k weights (then it is done exactly: as cheap, and no error)."""
    if d_out * d_in <= k:
        return None
    root = math.isqrt(k)
    if d_out <= d_in:
        k_out = min(d_out, root)
        return k_out, min(d_in, k // k_out)
    k_in = min(d_in, root)
    return min(d_out, k // k_in), k_in


def _projection(torch: Any, rows: int, cols: int, kind: str, seed: int, layer: int, side: int
                ) -> Any:
    """A (rows, cols) random matrix with E[PᵀP] = I, from its own seeded stream; drawn on the
    CPU so that every device gets the same matrix for the same seed."""
    state = np.random.SeedSequence([seed, layer, side]).generate_state(2, dtype=np.uint32)
    gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    if kind == "gaussian":
        p = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    else:
        p = torch.randint(0, 2, (rows, cols), generator=gen).to(torch.float64) * 2 - 1
    return p / math.sqrt(rows)


class _OneHot:
    """The one-hot rows of an embedding's token ids, the output-gradient side of its
    lookups as a linear layer's calls, formed only where a route needs them dense (the
    sketch gathers columns of its projection instead)."""

    def __init__(self, ids: Any, vocab: int, padding_idx: int | None) -> None:
        self.ids = ids
        self.vocab = vocab
        self.padding_idx = padding_idx
        self.shape = (*ids.shape, vocab)
        self.ndim = len(self.shape)

    def dense(self, dtype: Any) -> Any:
        torch = _torch()
        onehot = torch.zeros(self.shape, dtype=dtype, device=self.ids.device)
        ids = self.ids.to(torch.long)
        onehot.scatter_(-1, ids.clamp(min=0)[..., None], 1.0)
        if self.padding_idx is not None:  # its row gets no gradient
            onehot[..., self.padding_idx] = 0.0
        absent = ids < 0  # a packed batch's slot that holds no token
        if bool(absent.any()):
            onehot[absent] = 0.0
        return onehot

    def project(self, p: Any, ids: Any) -> Any:
        """P (k, vocab) applied to the one-hot rows of ``ids`` (a chunk of the rows)."""
        out = p.T[ids.clamp(min=0)]
        if self.padding_idx is not None:
            out[ids == self.padding_idx] = 0.0
        absent = ids < 0  # a packed batch's slot that holds no token
        if bool(absent.any()):
            out[absent] = 0.0
        return out


def _extend(extremes: Any, tensor: Any) -> None:
    """Widen ``extremes`` (min, max) to cover ``tensor``'s values (NaN propagates)."""
    torch = _torch()
    low, high = torch.aminmax(tensor)
    extremes[0] = torch.minimum(extremes[0], low.to(extremes.dtype))
    extremes[1] = torch.maximum(extremes[1], high.to(extremes.dtype))


def _check_finite(out: Any, objectives: Any, names: list[str], extremes: Any) -> None:
    """Raise a ValueError saying where a non-finite Gram matrix comes from (``extremes``:
    per unit, the (min, max) of its δ and of its input)."""
    torch = _torch()
    if bool(torch.isfinite(out).all()):
        return
    if not bool(torch.isfinite(objectives.detach()).all()):
        where = "`objectives` holds NaN or inf"
    else:
        finite = torch.isfinite(extremes).all(dim=2).cpu().tolist()
        bad = [f"{name!r} ({what})" for name, flags in zip(names, finite, strict=True)
               for what, flag in zip(("output gradient", "input"), flags, strict=True)
               if not flag]
        where = (f"NaN or inf in {', '.join(dict.fromkeys(bad))}" if bad else
                 f"its products overflowed {out.dtype} (K of magnitude beyond its range)")
    raise ValueError(f"the Gram matrix is not finite: {where}.")


class _Blocks:
    """The groups' Gram blocks.  Groups of one size are a (B, n, n) tensor, and every
    product runs for all of them at once; ragged groups are one block each."""

    def __init__(self, torch: Any, order: np.ndarray | None, bounds: np.ndarray, acc: Any,
                 device: Any) -> None:
        self.torch = torch
        self.device = device
        # K sums inner products of long rows (d_in·d_out numbers per response): they
        # accumulate in float64 also for float32 models (MPS has no float64)
        acc = torch.float64 if device.type != "mps" else acc
        self.dtype = acc
        self.order = None if order is None else torch.as_tensor(order, device=device)
        self.bounds: list[int] = bounds.tolist()
        self.sizes = [b - a for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)]
        self.n = self.bounds[-1]
        self.equal = self.sizes[0] if len(set(self.sizes)) == 1 else None
        self.squares = sum(size * size for size in self.sizes)
        if self.equal is not None:
            self.dense = torch.zeros(len(self.sizes), self.equal, self.equal, dtype=acc,
                                     device=device)
        else:
            self.blocks = [torch.zeros(s, s, dtype=acc, device=device) for s in self.sizes]

    def _grouped(self, x: Any) -> Any:
        """The rows of x (responses first) in group order."""
        return x if self.order is None else x.index_select(0, self.order)

    def add_rows(self, x: Any, key: int = 0) -> None:
        """K_ij += ⟨x_i, x_j⟩ within every group, for per-response feature rows x (N, F)."""
        x = self._grouped(x).to(self.dtype)
        if self.equal is not None:
            grouped = x.reshape(len(self.sizes), self.equal, -1)
            self.dense.baddbmm_(grouped, grouped.transpose(1, 2))
            return
        for a, b, block in zip(self.bounds[:-1], self.bounds[1:], self.blocks, strict=True):
            if b > a:
                block.addmm_(x[a:b], x[a:b].T)

    def token_pairs_cheaper(self, t: int, d_out: int, d_in: int) -> bool:
        """Whether token pairs cost less than materialising Δᵀ H, in multiply-adds.

        Besides the products' multiply-adds, each route moves memory: a materialised row
        element is written, widened to float64 and read by the float64 G Gᵀ (about 20
        multiply-adds' time), a float64 multiply-add costs about 4 float32 ones, and a
        token pair's product and sum about 36; each call has a fixed overhead.  The
        constants are fitted to both routes' times over T = 2 to 128, d = 32 to 1024 and
        groups of 4 to 16 (CPU): the choice is the faster route wherever they differ by
        more than 1.5×."""
        if _FORCE_ROUTE is not None:
            return _FORCE_ROUTE == "pairs"
        weights = d_out * d_in
        materialise = (self.n * t + 4 * self.squares + 20 * self.n) * weights + 2e5
        pairs = self.squares * t * t * (d_in + d_out + 36) + 1.5e6 + 4e4 * len(self.sizes)
        return pairs < materialise

    def add_token_pairs(self, d: Any, h: Any) -> None:
        """K_ij += Σ_{t∈i, s∈j} ⟨δ_t, δ_s⟩⟨h_t, h_s⟩ within every group."""
        d, h = self._grouped(d), self._grouped(h)
        t = int(d.shape[1])
        if self.equal is not None:
            g = self.equal
            # groups in chunks of at most WORKSPACE / _SHARE token pairs (three such arrays
            # live at once); a group larger than that is one chunk, as ragged groups are
            step = max(1, WORKSPACE // _SHARE // max(1, (g * t) ** 2))
            for q in range(0, len(self.sizes), step):
                dq = d[q * g:(q + step) * g].reshape(-1, g * t, d.shape[-1])
                hq = h[q * g:(q + step) * g].reshape(-1, g * t, h.shape[-1])
                prod = (dq @ dq.transpose(1, 2)).to(self.dtype) \
                    * (hq @ hq.transpose(1, 2)).to(self.dtype)
                self.dense[q:q + step] += prod.reshape(-1, g, t, g, t).sum(dim=(2, 4))
            return
        for a, b, block in zip(self.bounds[:-1], self.bounds[1:], self.blocks, strict=True):
            if b > a:
                df = d[a:b].reshape((b - a) * t, -1)
                hf = h[a:b].reshape((b - a) * t, -1)
                prod = (df @ df.T).to(self.dtype) * (hf @ hf.T).to(self.dtype)
                block += prod.reshape(b - a, t, b - a, t).sum(dim=(1, 3))

    def result(self, dense: bool) -> Any:
        # Each product is symmetric only up to rounding; GGSR checks symmetry.
        if self.equal is not None:
            out = (self.dense + self.dense.transpose(1, 2)) / 2
            return out if dense else out.reshape(-1)
        return self.torch.cat([((b + b.T) / 2).reshape(-1) for b in self.blocks])


class _Collect:
    """In place of :class:`_Blocks`, for ``GradientCapture.rows``: keeps the per-response rows
    themselves, in float64, ordered by the unit they come from (``key``) so that captures of
    the same model lay their columns out alike, whatever order the backward reaches the
    layers in."""

    def __init__(self, torch: Any, n: int, acc: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self.dtype = torch.float64 if device.type != "mps" else acc
        self.n = n
        self.parts: list[tuple[int, int, Any]] = []

    def add_rows(self, x: Any, key: int = 0) -> None:
        self.parts.append((key, len(self.parts), x.to(self.dtype, copy=True)))

    def token_pairs_cheaper(self, t: int, d_out: int, d_in: int) -> bool:
        return False  # rows are wanted, not their products

    def result(self, dense: bool) -> Any:
        parts = [x for _, _, x in sorted(self.parts, key=lambda part: part[:2])]
        self.parts = []
        if not parts:
            return self.torch.zeros(self.n, 0, dtype=self.dtype, device=self.device)
        return self.torch.cat(parts, dim=1)


class _Rows:
    """Per-response feature rows (weight gradients Δ_iᵀ H_i or their sketches, bias
    gradients), written side by side into one workspace of WORKSPACE / _SHARE numbers and
    added to the blocks as G Gᵀ, widened to the blocks' float64, when it is full (a wider
    layer is done in slices of its output rows).  The workspace and its float64 copy are
    allocated once per gram(): the products write into it, so that the layers' work does
    not allocate memory of varying sizes (which the C allocator would keep)."""

    def __init__(self, torch: Any, blocks: _Blocks | _Collect, n: int, acc: Any) -> None:
        self.torch = torch
        self.blocks = blocks
        self.n = n
        self.acc = acc
        self.capacity = max(n, WORKSPACE // _SHARE)
        self.buffer: Any = None
        self.wide: Any = None
        self.pieces: list[tuple[int, int, int]] = []  # (offset, width, key) of each piece
        self.used = 0
        self.key = 0  # the unit whose rows are being queued

    def _slot(self, width: int) -> Any:
        """A (n, width) piece of the workspace, for rows to be added."""
        size = self.n * width
        if self.used + size > self.capacity:
            self.flush()
        if size > self.capacity:  # one output row per response is more than the workspace
            self.capacity, self.buffer, self.wide = size, None, None
        if self.buffer is None:
            self.buffer = self.torch.empty(self.capacity, dtype=self.acc,
                                           device=self.blocks.device)
        piece = self.buffer[self.used:self.used + size].view(self.n, width)
        self.pieces.append((self.used, width, self.key))
        self.used += size
        return piece

    def add(self, piece: Any) -> None:
        """Queue rows (N, F)."""
        width = int(piece.shape[1])
        step = max(1, self.capacity // self.n)
        for start in range(0, width, step):
            part = piece[:, start:start + step]
            self._slot(int(part.shape[1])).copy_(part)

    def add_sums(self, d: Any) -> None:
        """Queue the rows Σ_t δ_t (N, d_out) of a bias gradient."""
        width = int(d.shape[-1])
        for start in range(0, width, self.capacity // self.n):
            part = d[..., start:start + self.capacity // self.n]
            self.torch.sum(part, dim=1, dtype=self.acc, out=self._slot(int(part.shape[-1])))

    def add_products(self, d: Any, h: Any) -> None:
        """Queue the rows Δ_iᵀ H_i (N, d_out · d_in), in slices of output rows; δ and h in
        chunks of tokens when they must be widened to the accumulation dtype, so that the
        widened copies stay within the workspace's size too."""
        torch = self.torch
        n, t, d_out, d_in = int(d.shape[0]), int(d.shape[1]), int(d.shape[-1]), int(h.shape[-1])
        step = max(1, self.capacity // max(1, n * d_in))
        cast = d.dtype != self.acc or h.dtype != self.acc
        chunk = max(1, self.capacity // (n * (d_out + d_in))) if cast else t
        dt = d.transpose(1, 2)
        for start in range(0, d_out, step):
            stop = min(d_out, start + step)
            out = self._slot((stop - start) * d_in).view(n, stop - start, d_in)
            for first in range(0, t, chunk):
                dc = dt[:, start:stop, first:first + chunk].to(self.acc)
                hc = h[:, first:first + chunk].to(self.acc)
                if first == 0:
                    torch.bmm(dc, hc, out=out)
                else:
                    out.baddbmm_(dc, hc)

    def flush(self) -> None:
        if not self.pieces:
            return
        rows = self.buffer
        if self.blocks.dtype != rows.dtype:
            if self.wide is None:
                self.wide = self.torch.empty(self.capacity, dtype=self.blocks.dtype,
                                             device=self.blocks.device)
            self.wide[:self.used].copy_(rows[:self.used])
            rows = self.wide
        for offset, width, key in self.pieces:
            self.blocks.add_rows(rows[offset:offset + self.n * width].view(self.n, width), key)
        self.pieces, self.used = [], 0
