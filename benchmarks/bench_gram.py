"""Per-response Gram matrices (advcal.torch.GradientCapture) against a trainer's backward pass.

A tiny causal transformer (4 blocks, d = 256, T = 128, 4 groups of 16 responses, CPU): the
forward pass plus the exact Gram matrix against the forward pass plus one backward pass of
the batch loss, the sketched Gram matrix, and the fixed peers for per-sample gradients:
torch.func (vmap of grad), Opacus's per-sample gradients (GradSampleModule, where opacus is
installed) and brute force (one autograd pass per response), each followed by G Gᵀ.  The
same model with every block under non-reentrant activation checkpointing gives the
checkpointed backward and Gram.  Peak memory is the growth of the peak resident set of a
fresh process running one step.
"""

from __future__ import annotations

import importlib.util
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import Case

SIZES = {  # (blocks, d, T, G, groups, vocab)
    False: (4, 256, 128, 16, 4, 512),
    True: (2, 64, 32, 4, 2, 128),
}
SKETCH_DIMS = (256, 1024, 4096)
# Memory against the number of covered blocks: (blocks, d, T, G, vocab), one group.
SCALING = {
    False: ((2, 4, 8), 256, 256, 16, 512),
    True: ((1, 2), 32, 16, 4, 64),
}
BRUTE = "forward + 2 per-response passes"


def _setup(quick: bool, sizes: tuple[int, ...] | None = None, checkpointing: bool = False
           ) -> tuple[Any, Any, Callable[[], Any], int]:
    import torch
    from torch import nn
    from torch.nn import functional as F

    from advcal.torch import response_objectives

    n_blocks, d, t, g, groups, vocab = SIZES[quick] if sizes is None else sizes
    heads = 4

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b = x.shape[0]
            h = self.norm1(x)
            q, k, v = (m(h).view(b, t, heads, d // heads).transpose(1, 2)
                       for m in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(n_blocks))
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            from torch.utils.checkpoint import checkpoint

            x = self.embed(ids)
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False) if checkpointing else block(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    model = LM()
    n = g * groups
    ids = torch.randint(0, vocab, (n, t + 1))
    lengths = torch.randint(t // 2, t + 1, (n,))
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()

    def objectives(net: Any = model, rows: Any = None) -> Any:
        """response_objectives' "grpo" J of every response, or of ``rows`` only (the
        per-sample peers' single rows), normalised as in the whole batch."""
        tokens = ids if rows is None else ids[rows]
        weights = mask if rows is None else mask[rows]
        logits = net(tokens[:, :-1])
        logps = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
        if rows is None:
            return response_objectives(logps, weights)
        return (logps * weights).sum(dim=1) / (weights.sum(dim=1).clamp(min=1) * n)

    return model, torch.randn(n), objectives, g


def _candidates(quick: bool) -> tuple[dict[str, Callable[[], object]], Any]:
    import torch

    from advcal.torch import GradientCapture

    model, adv, objectives, g = _setup(quick)

    def forward() -> None:
        objectives()  # builds the graph, as the other candidates' forward does

    def backward() -> None:
        model.zero_grad(set_to_none=True)
        (-(adv * objectives()).sum()).backward()

    def gram(sketch_dim: int | None = None) -> Callable[[], object]:
        def run() -> object:
            with GradientCapture(model, sketch_dim=sketch_dim) as capture:
                j = objectives()
            return capture.gram(j, group_size=g)
        return run

    def two_passes() -> None:
        # brute force: one autograd pass per response over the batch graph; the passes cost
        # the same, so two are timed and the notes scale them to G and N
        with GradientCapture(model) as capture:  # only for its parameter list
            pass
        j = objectives()
        for i in range(2):
            torch.autograd.grad(j[i], capture.parameters(), retain_graph=True)

    covered = GradientCapture(model).parameters()
    names = {id(p): name for name, p in model.named_parameters()}
    n = adv.shape[0]

    def blocks_of(per_sample: Any) -> Any:
        rows = per_sample.reshape(n // g, g, -1).double()
        return rows @ rows.transpose(1, 2)

    def func_peer() -> object:
        # torch.func: per-sample gradients of the covered parameters by vmap(grad), then G Gᵀ
        from torch.func import functional_call, grad, vmap

        fixed = {name: p.detach() for name, p in model.named_parameters()}
        wanted = {names[id(p)]: p.detach() for p in covered}

        def one(params: dict[str, Any], row: Any) -> Any:
            net = lambda tokens: functional_call(model, {**fixed, **params}, (tokens,))  # noqa: E731
            return objectives(net, row[None])[0]

        per = vmap(grad(one), in_dims=(None, 0))(wanted, torch.arange(n))
        return blocks_of(torch.cat([per[names[id(p)]].reshape(n, -1) for p in covered], 1))

    candidates = {
        "forward + backward of the loss": backward,
        "forward only": forward,
        "forward + exact Gram": gram(),
        "forward + sketched Gram, k = 1024": gram(1024),
        "torch.func vmap(grad) + G G^T": func_peer,
        BRUTE: two_passes,
    }
    if importlib.util.find_spec("opacus") is not None:
        candidates["Opacus per-sample grads + G G^T"] = _opacus_peer(model, objectives,
                                                                   covered, blocks_of)
    return candidates, (model, adv, objectives, g)


def _opacus_peer(model: Any, objectives: Callable[..., Any], covered: list[Any],
                 blocks_of: Callable[[Any], Any]) -> Callable[[], object]:
    import copy

    import torch
    from opacus import GradSampleModule

    # Opacus hooks a copy (it wraps the module); only the covered parameters train
    twin = copy.deepcopy(model)
    wanted = {name for name, p in model.named_parameters()
              if any(p is q for q in covered)}
    for name, p in twin.named_parameters():
        p.requires_grad_(name in wanted)
    sampled = GradSampleModule(twin, loss_reduction="sum")
    params = [p for name, p in twin.named_parameters() if name in wanted]

    def run() -> object:
        sampled.zero_grad(set_to_none=True)
        for p in params:
            p.grad_sample = None
        objectives(sampled).sum().backward()
        return blocks_of(torch.cat([p.grad_sample.reshape(p.grad_sample.shape[0], -1)
                                    for p in params], dim=1))

    return run


def _checkpointed(quick: bool) -> dict[str, Callable[[], object]]:
    """The same model with every block under non-reentrant activation checkpointing."""
    from advcal.torch import GradientCapture

    model, adv, objectives, g = _setup(quick, checkpointing=True)

    def backward() -> None:
        model.zero_grad(set_to_none=True)
        (-(adv * objectives()).sum()).backward()

    def gram() -> object:
        with GradientCapture(model) as capture:
            j = objectives()
        return capture.gram(j, group_size=g)

    return {CKPT_BACKWARD: backward, CKPT_GRAM: gram}


CKPT_BACKWARD = "checkpointed: forward + backward of the loss"
CKPT_GRAM = "checkpointed: forward + exact Gram"


class _Timed:
    """Wraps candidates to keep each one's best per-call time, for the notes."""

    def __init__(self) -> None:
        self.best: dict[str, float] = {}

    def wrap(self, label: str, fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            start = time.perf_counter()
            out = fn()
            elapsed = time.perf_counter() - start
            self.best[label] = min(self.best.get(label, float("inf")), elapsed)
            return out
        return run


class _Notes(list[str]):
    """Notes computed when the runner prints them: after the rounds."""

    def __init__(self, make: Callable[[], list[str]]) -> None:
        super().__init__()
        self.make = make

    def __iter__(self) -> Any:
        return iter(self.make())


def _peak_rss() -> int:
    """This process's peak resident set in bytes.  VmHWM where Linux has it: ru_maxrss also
    counts the forked parent's peak (it survives exec), so a child of a big runner reads
    the runner's."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_growth(mode: str, quick: bool) -> int:
    """Growth (bytes) of this process's peak resident set over one step in ``mode``."""
    import torch

    torch.set_num_threads(1)
    candidates, _ = _candidates(quick)
    with torch.no_grad():  # page in the weights and the allocator's first pools
        candidates["forward only"]()
    before = _peak_rss()
    {"backward": candidates["forward + backward of the loss"],
     "exact": candidates["forward + exact Gram"],
     "sketch": candidates["forward + sketched Gram, k = 1024"]}[mode]()
    return _peak_rss() - before


def scaling_peak(mode: str, blocks: int, quick: bool) -> int:
    """Growth (bytes) of this process's peak resident set over one step in ``mode`` on the
    model of ``SCALING`` with ``blocks`` blocks, every linear layer covered."""
    import torch

    from advcal.torch import GradientCapture

    torch.set_num_threads(1)
    _, d, t, g, vocab = SCALING[quick]
    model, adv, objectives, _ = _setup(quick, (blocks, d, t, g, 1, vocab))
    with torch.no_grad():  # page in the weights and the allocator's first pools
        objectives()
    before = _peak_rss()
    if mode == "backward":
        (-(adv * objectives()).sum()).backward()
    else:
        with GradientCapture(model, sketch_dim=None if mode == "exact" else 1024) as capture:
            j = objectives()
        capture.gram(j, group_size=g)
    return _peak_rss() - before


def _scaling_notes(quick: bool) -> list[str]:
    """Peak memory growth of a backward pass and of the Gram (fresh process each) against
    the number of covered blocks: the Gram's extra must not grow with them."""
    counts, d, t, g, _ = SCALING[quick]
    lines = []
    for blocks in counts:
        peaks = {}
        for mode in ("backward", "exact", "sketch"):
            code = ("from benchmarks.bench_gram import scaling_peak; "
                    f"print(scaling_peak({mode!r}, {blocks}, {quick}))")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                 text=True, check=True)
            peaks[mode] = int(out.stdout.split()[-1])
        base = peaks["backward"]
        lines.append(
            f"memory, {blocks} covered blocks (d={d}, T={t}, {g} responses, float32, fresh "
            f"process): backward +{base / 2**20:.0f} MiB; exact Gram "
            f"+{peaks['exact'] / 2**20:.0f} MiB (extra {(peaks['exact'] - base) / 2**20:+.0f}"
            f" MiB, {peaks['exact'] / base:.2f}x the backward's growth); sketched k=1024 "
            f"+{peaks['sketch'] / 2**20:.0f} MiB ({peaks['sketch'] / base:.2f}x)")
    return lines


def _memory_notes(quick: bool) -> list[str]:
    peaks = {}
    for mode in ("backward", "exact", "sketch"):
        code = ("from benchmarks.bench_gram import peak_rss_growth; "
                f"print(peak_rss_growth({mode!r}, {quick}))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True)
        peaks[mode] = int(out.stdout.split()[-1])
    return [f"peak memory growth of one step, fresh process: forward + backward "
            f"{peaks['backward'] / 2**20:.0f} MiB, forward + exact Gram "
            f"{peaks['exact'] / 2**20:.0f} MiB, forward + sketched k=1024 "
            f"{peaks['sketch'] / 2**20:.0f} MiB"]


def _sketch_errors(state: Any, quick: bool) -> list[str]:
    """Sketch errors against the exact Gram."""
    import numpy as np

    from advcal.torch import GradientCapture

    model, _, objectives, g = state

    def exact_gram() -> Any:
        with GradientCapture(model) as capture:
            j = objectives()
        return capture.gram(j, group_size=g), capture.parameters()

    exact, _ = exact_gram()
    lines = []
    for k in SKETCH_DIMS:
        errors = []
        for seed in range(3):
            with GradientCapture(model, sketch_dim=k, seed=seed) as capture:
                j = objectives()
            approx = capture.gram(j, group_size=g)
            errors.append(np.linalg.norm(approx - exact) / np.linalg.norm(exact))
        lines.append(f"sketch k = {k:>4}: relative Frobenius error of K over 3 seeds "
                     f"{min(errors):.3f} .. {max(errors):.3f}")
    return lines


def cases(quick: bool) -> list[Case]:
    if importlib.util.find_spec("torch") is None:
        return []
    blocks, d, t, g, groups, vocab = SIZES[quick]
    name = (f"Gram matrices, {blocks}-block transformer d={d}, T={t}, {groups} groups of "
            f"{g}, CPU, one torch thread")
    # Built only when selected: the model, the sketch errors and the fresh processes of
    # the memory notes are not for a run of other benchmarks (--only) to pay for.
    return [Case(name, {}, "forward + backward of the loss",
                 target="exact Gram <= 1.5x the backward pass",
                 build=lambda: _case(quick, name))]


def _case(quick: bool, name: str) -> Case:
    import torch

    blocks, d, t, g, groups, vocab = SIZES[quick]
    # One thread: on a shared 2-core machine torch's pool mostly measures contention.
    torch.set_num_threads(1)
    candidates, state = _candidates(quick)
    candidates.update(_checkpointed(quick))
    timed = _Timed()
    wrapped = {label: timed.wrap(label, fn) for label, fn in candidates.items()}
    base, fwd = "forward + backward of the loss", "forward only"
    extra = _sketch_errors(state, quick) + _memory_notes(quick) + _scaling_notes(quick)

    def notes() -> list[str]:
        best = timed.best
        lines = []
        if base in best and fwd in best:
            for label in ("forward + exact Gram", "forward + sketched Gram, k = 1024"):
                if label in best:
                    ratio = (best[label] - best[fwd]) / (best[base] - best[fwd])
                    lines.append(f"{label} without the forward: {ratio:.2f}x the backward "
                                 "pass alone (best times, forward-only subtracted)")
        if CKPT_BACKWARD in best and CKPT_GRAM in best:
            ratio = best[CKPT_GRAM] / best[CKPT_BACKWARD]
            lines.append(f"checkpointed: forward + exact Gram {ratio:.2f}x forward + backward "
                         "of the loss, both under checkpointing (best times)")
        for peer in PEERS:
            if peer in best and "forward + exact Gram" in best:
                lines.append(f"{peer}: {best[peer] / best['forward + exact Gram']:.2f}x "
                             "forward + exact Gram (best times)")
        if "Opacus per-sample grads + G G^T" not in best:
            lines.append("Opacus not installed: its peer was not run (pip install opacus)")
        if BRUTE in best and fwd in best and "forward + exact Gram" in best:
            one = (best[BRUTE] - best[fwd]) / 2
            n = g * groups
            for count, what in ((g, f"G = {g} passes (one group)"),
                                (n, f"N = {n} passes (the batch)")):
                ratio = (best[fwd] + count * one) / best["forward + exact Gram"]
                lines.append(f"brute force, forward + {what}: {ratio:.1f}x forward + exact "
                             f"Gram of all {n} responses (best times; a pass "
                             f"{one / (best[base] - best[fwd]):.2f}x the backward pass)")
        return lines + extra

    def check() -> str:
        # the peers' K against the capture's: float32 per-sample gradients of sums over
        # T·d terms carry relative errors of about 1e-6 each, so 1e-4 of ‖K‖ is ample
        import numpy as np

        exact = np.asarray(candidates["forward + exact Gram"]())
        worst = 0.0
        for label in PEERS:
            if label in candidates:
                peer = np.asarray(candidates[label]())
                error = float(np.linalg.norm(peer - exact) / np.linalg.norm(exact))
                assert error <= 1e-4, f"{label}: K differs from the capture's by {error:.1e}"
                worst = max(worst, error)
        return (f"checked before timing: the peers' K within 1e-4 of the exact Gram's in "
                f"Frobenius norm (largest {worst:.1e}; float32 per-sample gradients)")

    return Case(name, wrapped, base, target="exact Gram <= 1.5x the backward pass",
                notes=_Notes(notes), check=check)


PEERS = ("torch.func vmap(grad) + G G^T", "Opacus per-sample grads + G G^T")
