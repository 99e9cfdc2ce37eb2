"""The Gram backward's start below TRL's fused LM head (advcal.integrations._fused_head):
its ∂ΣJ/∂hidden equals what TRL's own backward gives, the Gram matrix is unchanged, and
anything it cannot vouch for falls back to TRL's backward."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
ChunkedLogProbFunction = pytest.importorskip("trl.kernels").ChunkedLogProbFunction

from advcal.integrations._fused_head import head_start  # noqa: E402
from advcal.torch import GradientCapture, response_objectives  # noqa: E402

N, T, H, V = 6, 5, 8, 11


class _Policy(torch.nn.Module):
    """Embedding, two linear layers, and a head weight used only through TRL's function."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(V, H)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(H, 2 * H), torch.nn.Tanh(),
                                       torch.nn.Linear(2 * H, H))
        self.head = torch.nn.Linear(H, V, bias=bias)

    def forward(self, ids, targets, *, temperature=1.0, softcap=None, scale=1.0,
                outputs=()):
        hidden = self.mlp(self.embed(ids)).reshape(-1, H)
        out = ChunkedLogProbFunction.apply(hidden, self.head.weight, self.head.bias,
                                           targets.reshape(-1), temperature, 4, softcap,
                                           scale, outputs)
        return out[0].view(N, T), out[1]


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (N, T), generator=gen)
    targets = torch.randint(0, V, (N, T), generator=gen)
    mask = (torch.rand(N, T, generator=gen) > 0.3).long()
    mask[:, 0] = 1
    return ids, targets, mask


KINDS = [dict(), dict(temperature=0.7), dict(softcap=2.0, scale=1.7), dict(bias=True),
         dict(temperature=0.5, softcap=1.5, scale=0.8, bias=True)]


def _policy_logps(kind, dtype):
    """A seeded policy of ``kind`` (head options, bias) and its log-probabilities and mask."""
    torch.manual_seed(1)
    kind = dict(kind)
    model = _Policy(kind.pop("bias", False)).to(dtype)
    ids, targets, mask = _batch()
    logps, _ = model(ids, targets, **kind)
    return model, logps, mask


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_head_gradient_is_trls_own(kind, dtype) -> None:
    _, logps, mask = _policy_logps(kind, dtype)
    objectives = response_objectives(logps, mask)
    start = head_start(objectives)
    assert start is not None
    hidden, grad = start
    (expected,) = torch.autograd.grad(objectives.sum(), hidden, retain_graph=True)
    # TRL's statistics and gradient are float32 whatever the model's dtype
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    # the mask's zeros leave their hidden rows without gradient, as in TRL's backward
    assert not grad.reshape(N, T, H)[mask == 0].any()


def test_bfloat16_logits_are_rounded_as_trl_rounds_them() -> None:
    torch.manual_seed(2)
    model = _Policy(True)
    ids, targets, mask = _batch(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logps, _ = model(ids, targets, temperature=0.9)
    objectives = response_objectives(logps, mask)
    start = head_start(objectives)
    assert start is not None
    (expected,) = torch.autograd.grad(objectives.sum(), start[0], retain_graph=True)
    # TRL's backward and head_start round the same float32 products; what differs is the
    # order of a few float32 sums: errors of order 2^-24 times the largest entry.
    torch.testing.assert_close(start[1], expected, rtol=1e-5,
                               atol=1e-5 * float(expected.abs().max()))


@pytest.mark.parametrize("route", ["materialise", "pairs"])
def test_the_gram_matrix_is_unchanged(monkeypatch, route) -> None:
    monkeypatch.setattr("advcal.torch._accumulate._FORCE_ROUTE", route)
    ids, targets, mask = _batch(2)
    grams = []
    for shortcut in (True, False):
        torch.manual_seed(3)
        model = _Policy(False).double()
        with GradientCapture(model) as capture:
            logps, _ = model(ids, targets, temperature=0.8)
        objectives = response_objectives(logps, mask)
        start = head_start(objectives) if shortcut else None
        assert (start is not None) == shortcut
        grams.append(capture.gram(objectives, group_size=3, start=start))
    # the head's module never runs, so K covers the two MLP layers in both; the start's
    # gradient is accumulated in float32 as TRL's is, so entries differ by float32
    # roundings of the largest: a bound relative to max |K|, not to each entry
    np.testing.assert_allclose(grams[0], grams[1], rtol=0,
                               atol=1e-5 * np.abs(grams[1]).max())
    assert np.abs(grams[1]).max() > 0


def test_what_it_cannot_vouch_for_falls_back() -> None:
    torch.manual_seed(4)
    model = _Policy(False)
    ids, targets, mask = _batch(3)
    logps, entropy = model(ids, targets, outputs=("entropy",))
    objectives = response_objectives(logps, mask)
    assert head_start(objectives) is not None
    # J that uses the entropy output too
    assert head_start(objectives + entropy.view(N, T).sum(dim=1)) is None
    # J that reaches a parameter other than through the head
    assert head_start(objectives + model.mlp[0].weight.sum()) is None
    # J that does not come from the fused head
    assert head_start(objectives.detach() * model.mlp[0].bias.sum()) is None
    assert head_start(objectives.detach().requires_grad_()) is None
    # a backbone without gradients (only the head trains): nothing to start below the head
    model.requires_grad_(False)
    model.head.weight.requires_grad_(True)
    logps, _ = model(ids, targets)
    assert head_start(response_objectives(logps, mask)) is None


def test_saved_values_it_cannot_reproduce_fall_back() -> None:
    torch.manual_seed(5)
    model = _Policy(False)
    ids, targets, mask = _batch(4)
    logps, _ = model(ids, targets, temperature=0.7)
    objectives = response_objectives(logps, mask)
    node = objectives.grad_fn
    while type(node).__name__ != "ChunkedLogProbFunctionBackward":
        node = next(fn for fn, _ in node.next_functions if fn is not None)
    args = dict(node.kernel_args)
    node.kernel_args = {**args, "inv_t": 1.0}  # another temperature than the forward's
    assert head_start(objectives) is None
    node.kernel_args = {key: value for key, value in args.items() if key != "HAS_SOFTCAP"}
    assert head_start(objectives) is None
    node.kernel_args = args
    assert head_start(objectives) is not None

