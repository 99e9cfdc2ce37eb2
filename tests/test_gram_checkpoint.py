"""GradientCapture under activation checkpointing, with parameters shared by several
layers, and with non-finite values.

The oracle is brute-force per-response autograd over the distinct parameters the capture
covers (``brute_force`` of tests/test_gram.py); float64 results must match it to rounding.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import advcal.torch._accumulate as tg  # noqa: E402
from advcal.torch import (  # noqa: E402
    GradientCapture,
    last_blocks,
)
from tests.test_gram import (  # noqa: E402
    LAYOUTS,
    TokenMLP,
    brute_force,
    captured,
    layout_blocks,
    make_batch,
    make_model,
    objectives_of,
    relative_error,
)

nn = torch.nn
# float64 throughout; Llama's RMSNorm computes in float32 inside, which the brute force
# shares, so both sides see the same rounding and differ by float64 summation order only
EXACT = 1e-10


@pytest.fixture(autouse=True)
def one_thread() -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def checkpointed_llama(reentrant: bool) -> nn.Module:
    model = make_model("llama")
    model.model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.model.config.use_cache = False
    return model.train()  # transformers checkpoints only in training mode (no dropout here)


def uncheckpointed_brute_force(model: nn.Module, batch: tuple[torch.Tensor, ...],
                               layout: dict) -> np.ndarray:
    """Brute force on the same model with checkpointing off (the same function)."""
    model.model.gradient_checkpointing_disable()
    params = list({id(p): p for p in GradientCapture(model).parameters()}.values())
    return layout_blocks(brute_force(model, batch, params), layout)


# --------------------------------------------------------------------------- checkpointing


@pytest.mark.parametrize("route", [None, "materialise", "pairs"])
def test_non_reentrant_checkpointing_is_exact(route: str | None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setattr(tg, "_FORCE_ROUTE", route)
    model = checkpointed_llama(reentrant=False)
    batch = make_batch(6, vocab=24)
    layout = LAYOUTS["dense"]
    gram, capture = captured(model, batch, layout)
    # every linear layer ran and is covered: 7 per block and the head
    assert len(capture.parameters()) == len(capture.layers) == 15
    expected = uncheckpointed_brute_force(model, batch, layout)
    assert relative_error(gram, expected) <= EXACT


@pytest.mark.parametrize("layers", [None, "last", "named"])
@pytest.mark.parametrize("route", [None, "pairs"])
def test_transformers_reentrant_checkpointing_is_exact(layers: str | None, route: str | None,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    # Its forward runs under no_grad: recorded as it is, K would cover the LM head alone
    # while capture.layers lists every layer.  The capture runs it non-reentrant instead.
    pytest.importorskip("transformers")
    monkeypatch.setattr(tg, "_FORCE_ROUTE", route)
    model = checkpointed_llama(reentrant=True)
    selection = {None: None, "last": last_blocks(model.model, 1),
                 "named": ["model.model.layers.1", "model.lm_head"]}[layers]
    batch = make_batch(6, vocab=24)
    layout = LAYOUTS["dense"]
    gram, capture = captured(model, batch, layout, layers=selection)
    assert capture.parameters() and len(capture.parameters()) == len(capture.layers)
    if layers == "named":
        assert len(capture.layers) == 8  # seven linear layers of block 1, and the head
    # brute force on the same function without checkpointing: reentrant checkpoints would
    # hide the parameters inside them from its torch.autograd.grad
    model.model.gradient_checkpointing_disable()
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), layout)
    assert relative_error(gram, expected) <= EXACT


def test_reentrant_checkpointing_sketched_rows_are_the_non_reentrant_ones() -> None:
    # Under the capture both run the same non-reentrant checkpoints: the same rows, bit
    # for bit, and the same sketched K.
    pytest.importorskip("transformers")
    batch = make_batch(6, vocab=24)
    rows = []
    for reentrant in (True, False):
        model = checkpointed_llama(reentrant=reentrant)
        with GradientCapture(model, sketch_dim=16, seed=3) as capture:
            objectives = objectives_of(model, batch)
        rows.append(capture.rows(objectives))
    assert rows[0].shape == rows[1].shape and rows[0].abs().sum() > 0
    assert torch.equal(rows[0], rows[1])


def test_objectives_reached_by_no_trainable_parameter_name_the_likely_cause() -> None:
    # Every trainable parameter inside reentrant checkpoints whose inputs need no gradient
    # (adapters behind a frozen embedding without enable_input_require_grads): the
    # objectives depend on nothing trainable, in the trainer's own backward too.
    pytest.importorskip("transformers")
    model = checkpointed_llama(reentrant=True)
    model.model.disable_input_require_grads()
    inner = model.model.model
    for p in [*inner.embed_tokens.parameters(), *inner.norm.parameters(),
              *model.model.lm_head.parameters()]:
        p.requires_grad_(False)
    with pytest.warns(UserWarning, match="requires_grad"), \
            pytest.raises(ValueError, match="no grad_fn.*enable_input_require_grads"):
        captured(model, make_batch(6, vocab=24), LAYOUTS["dense"])


@pytest.mark.parametrize("kwargs", [{}, {"use_reentrant": None}, {"use_reentrant": 1}])
def test_checkpointing_reentrant_by_torchs_default_is_swapped(kwargs: dict) -> None:
    # torch checkpoints reentrant when use_reentrant is not given or None (with a warning),
    # and when it is any true value
    pytest.importorskip("transformers")
    model = make_model("llama")
    model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.model.config.use_cache = False
    model.train()
    batch = make_batch(6, vocab=24)
    gram, capture = captured(model, batch, LAYOUTS["dense"])
    assert len(capture.layers) == 15
    model.model.gradient_checkpointing_disable()
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), LAYOUTS["dense"])
    assert relative_error(gram, expected) <= EXACT


def test_a_capture_failing_while_it_swaps_puts_back_what_it_swapped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    import advcal.torch._checkpointing as ck

    model = checkpointed_llama(reentrant=True)
    layers = [m for m in model.modules() if "_gradient_checkpointing_func" in m.__dict__]
    before = [m._gradient_checkpointing_func for m in layers]
    made = []

    class Failing(ck.NonReentrant):
        def __init__(self, original: object) -> None:
            made.append(original)
            if len(made) == 2:
                raise RuntimeError("no more")
            super().__init__(original)  # type: ignore[arg-type]

    monkeypatch.setattr(ck, "NonReentrant", Failing)
    with pytest.raises(RuntimeError, match="no more"), GradientCapture(model):
        pass
    assert len(made) == 2 < len(layers)
    assert all(m._gradient_checkpointing_func is b for m, b in zip(layers, before,
                                                                    strict=True))


def _gradients(model: nn.Module, batch: tuple[torch.Tensor, ...], capture: bool
               ) -> list[torch.Tensor]:
    """The trainer's gradient of a weighted loss, with or without a capture's gram() first."""
    model.zero_grad(set_to_none=True)
    weights = torch.linspace(-1.0, 1.0, batch[0].shape[0], dtype=torch.float64)
    if capture:
        with GradientCapture(model) as cap:
            objectives = objectives_of(model, batch)
        cap.gram(objectives, group_size=3)
    else:
        objectives = objectives_of(model, batch)
    (weights * objectives).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_reentrant_checkpointing_keeps_the_trainers_gradient() -> None:
    # The capture's non-reentrant checkpoints give the trainer's backward the gradient
    # reentrant ones give, bit for bit, and the model's own checkpointing comes back.
    pytest.importorskip("transformers")
    model = checkpointed_llama(reentrant=True)
    layers = [m for m in model.modules() if "_gradient_checkpointing_func" in m.__dict__]
    before = [m._gradient_checkpointing_func for m in layers]
    assert layers and all(f.keywords == {"use_reentrant": True} for f in before)
    batch = make_batch(6, vocab=24)
    plain = _gradients(model, batch, capture=False)
    assert all(g.abs().sum() > 0 for g in plain)  # every parameter has a gradient
    seen = []
    with GradientCapture(model):
        seen = [m._gradient_checkpointing_func for m in layers]
    assert all(f is not b for f, b in zip(seen, before, strict=True))
    assert [m._gradient_checkpointing_func for m in layers] == before
    assert all(m._gradient_checkpointing_func is b for m, b in zip(layers, before,
                                                                    strict=True))
    captured_grads = _gradients(model, batch, capture=True)
    assert all(torch.equal(a, b) for a, b in zip(plain, captured_grads, strict=True))
    # a capture that raised on entry or in the block puts it back as well
    with pytest.raises(RuntimeError, match="boom"), GradientCapture(model):
        raise RuntimeError("boom")
    assert all(m._gradient_checkpointing_func is b for m, b in zip(layers, before,
                                                                    strict=True))


def test_reentrant_checkpointing_without_inputs_needing_gradients_stays_reentrant() -> None:
    # Reentrant checkpointing gives the parameters inside a segment no gradient when none of
    # its inputs needs one (a frozen embedding without enable_input_require_grads).  The
    # capture keeps that, so the trainer's gradient is the same: K covers what has a
    # gradient, the head, and says so; layers named explicitly are refused.
    pytest.importorskip("transformers")
    model = checkpointed_llama(reentrant=True)
    model.model.model.embed_tokens.weight.requires_grad_(False)
    model.model.disable_input_require_grads()
    batch = make_batch(6, vocab=24)
    layout = LAYOUTS["dense"]
    with pytest.warns(UserWarning, match="requires_grad"):
        gram, capture = captured(model, batch, layout)
    assert capture.layers == ["model.lm_head"]
    assert capture.parameters() == [model.model.lm_head.weight]
    with pytest.warns(UserWarning, match="requires_grad"):
        expected = layout_blocks(brute_force(model, batch, capture.parameters()), layout)
    assert relative_error(gram, expected) <= EXACT
    with pytest.warns(UserWarning, match="requires_grad"), \
            pytest.raises(ValueError, match=r"\['model.model.layers.1.self_attn.q_proj', .*"
                          "gradients disabled"):
        captured(model, batch, layout, layers=["model.model.layers.1", "model.lm_head"])


class ReentrantMLP(TokenMLP):
    """A reentrant checkpoint around ``where``: "inside" fc1, "between" fc1 and fc2 (no
    covered layer inside, but fc1's δ flows through it), or "below" every covered layer."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        e = self.embed(ids)
        if self.where == "below":
            e = checkpoint(torch.sin, e, use_reentrant=True)
        if self.where == "inside":
            h = checkpoint(lambda x: torch.tanh(self.fc1(x)), e, use_reentrant=True)
        else:
            h = torch.tanh(self.fc1(e))
        if self.where == "between":
            h = checkpoint(torch.sin, h, use_reentrant=True)
        return self.fc2(h)


def test_reentrant_checkpoint_around_no_covered_layer() -> None:
    layout = {"group_size": 3}
    batch = make_batch(6)
    torch.manual_seed(0)
    inside = ReentrantMLP("inside").double()
    with pytest.raises(ValueError, match=r"\['fc1'\] ran inside reentrant"):
        captured(inside, batch, layout)
    with pytest.raises(ValueError, match=r"\['fc1'\] ran inside reentrant"):
        captured(inside, batch, layout, layers=["fc1", "fc2"])
    torch.manual_seed(0)
    between = ReentrantMLP("between").double()
    with pytest.raises(ValueError, match="flows through reentrant.*use_reentrant=False"):
        captured(between, batch, layout)
    # below every covered layer the Gram's backward never reaches the checkpoint: exact
    torch.manual_seed(0)
    below = ReentrantMLP("below").double()
    gram, capture = captured(below, batch, layout)
    assert capture.parameters() == [below.fc1.weight, below.fc1.bias, below.fc2.weight,
                                    below.fc2.bias]
    expected = layout_blocks(brute_force(below, batch, capture.parameters()), layout)
    assert relative_error(gram, expected) <= EXACT


def test_a_layer_run_only_without_gradients_is_named_so() -> None:
    class NoGrad(TokenMLP):
        def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                    ) -> torch.Tensor:
            e = self.embed(ids)
            with torch.no_grad():
                gate = torch.sigmoid(self.fc1(e)).mean(-1, keepdim=True)
            return self.fc2(torch.tanh(e.sum(-1, keepdim=True) * gate).expand(-1, -1, 9))

    torch.manual_seed(0)
    model = NoGrad().double()
    with pytest.raises(ValueError, match=r"\['fc1'\] ran only with gradients disabled"):
        captured(model, make_batch(6), {"group_size": 3}, layers=["fc1", "fc2"])
    # chosen by a rule, fc1 (whose gradient from J is zero) drops out, as before
    gram, capture = captured(model, make_batch(6), {"group_size": 3})
    assert capture.parameters() == [model.fc2.weight, model.fc2.bias]


# --------------------------------------------------------------------------- sharing


class Shared(TokenMLP):
    """fc1's parameters used by a second module: ``what`` is "weight" (g shares fc1's
    weight, has its own bias), "both" (g shares weight and bias), "bias" (g shares fc1's
    bias only), or "conv1d" (a transformers Conv1D uses fc1's weight transposed, and fc1
    runs twice)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        if what == "conv1d":
            from transformers.pytorch_utils import Conv1D

            self.g = Conv1D(6, 9)  # maps 9 -> 6 with a (9, 6) weight: fc1's, transposed
        else:
            self.g = nn.Linear(6, 9)
        if what in ("weight", "both", "conv1d"):
            self.g.weight = self.fc1.weight
        if what in ("both", "bias"):
            self.g.bias = self.fc1.bias

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        e = self.embed(ids)
        h = torch.tanh(self.fc1(e))
        if self.what == "conv1d":
            return self.fc2(torch.tanh(self.fc1(e + self.g(h))))
        return self.fc2(h * torch.tanh(self.g(e.flip(1) + 0.2)))


@pytest.mark.parametrize("route", ["materialise", "pairs"])
@pytest.mark.parametrize("what", ["weight", "both", "bias", "conv1d"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_parameter_shared_by_two_layers_keeps_its_cross_terms(
        what: str, layout: str, route: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The parameter's gradient is the sum over its uses: K_ij holds ⟨g_i^(1), g_j^(2)⟩.
    if what == "conv1d":
        pytest.importorskip("transformers")
    monkeypatch.setattr(tg, "_FORCE_ROUTE", route)
    torch.manual_seed(0)
    model = Shared(what).double()
    batch = make_batch(9)
    gram, capture = captured(model, batch, LAYOUTS[layout])
    assert capture.layers == ["fc1", "fc2", "g"]
    params = capture.parameters()
    assert len({id(p) for p in params}) == len(params)  # each parameter once
    assert {id(p) for p in params} == {id(p) for p in model.parameters()} - {
        id(model.embed.weight)}
    expected = layout_blocks(brute_force(model, batch, params), LAYOUTS[layout])
    assert relative_error(gram, expected) <= EXACT


def test_shared_parameters_sketched() -> None:
    # A sketch wide enough for every weight is exact; a narrow one is unbiased for the
    # true K (cross terms included): mean of 200 seeds within 4 standard errors.
    torch.manual_seed(0)
    model = Shared("weight").double()
    batch = make_batch(6)
    layout = {"offsets": np.array([0, 2, 6])}
    exact, capture = captured(model, batch, layout)
    assert relative_error(exact, layout_blocks(brute_force(model, batch, capture.parameters()),
                                               layout)) <= EXACT
    wide, _ = captured(model, batch, layout, sketch_dim=128)
    np.testing.assert_allclose(wide, exact, rtol=1e-12, atol=0)
    draws = np.stack([captured(model, batch, layout, sketch_dim=16, seed=seed)[0]
                      for seed in range(200)])
    mean = draws.mean(axis=0)
    se = draws.std(axis=0, ddof=1) / np.sqrt(len(draws))
    assert (se > 0).all() and (np.abs(mean - exact) <= 4 * se).all()


class TiedMLP(nn.Module):
    """An LM head tied to an embedding with a padding row (its row gets no gradient)."""

    def __init__(self, vocab: int = 11, d: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.fc1 = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        e = self.embed(ids)
        return self.head(e + torch.tanh(self.fc1(e)))


@pytest.mark.parametrize("route", [None, "materialise", "pairs"])
@pytest.mark.parametrize("kind", ["mlp", "llama"])
def test_a_head_tied_to_the_embedding_covers_both_uses(kind: str, route: str | None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The head's weight is also the embedding's: its gradient adds the lookups' (one-hot
    # rows of the ids times the δ at the embedding's output).
    monkeypatch.setattr(tg, "_FORCE_ROUTE", route)
    torch.manual_seed(0)
    if kind == "llama":
        from tests.test_gram import LlamaLogits, tiny_llama

        model = LlamaLogits(tiny_llama(tie_word_embeddings=True)).double()
        assert model.model.lm_head.weight is model.model.model.embed_tokens.weight
    else:
        model = TiedMLP().double()
    batch = make_batch(9, vocab=24 if kind == "llama" else 11)
    assert (batch[0] == 0).any()  # the padding row is looked up
    layout = LAYOUTS["shuffled ids"]
    gram, capture = captured(model, batch, layout)
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), layout)
    assert relative_error(gram, expected) <= EXACT
    # sketched: still the sum of the uses (a sketch as wide as every weight is exact)
    wide, _ = captured(model, batch, layout, sketch_dim=1 << 12)
    np.testing.assert_allclose(wide, gram, rtol=1e-10, atol=1e-12 * np.abs(gram).max())


def test_a_tied_embedding_scaled_by_frequency_is_refused() -> None:
    model = TiedMLP()
    model.embed.scale_grad_by_freq = True
    with pytest.raises(ValueError, match="'embed'.*scale_grad_by_freq"):
        GradientCapture(model)
    assert GradientCapture(model, layers=["fc1"]).layers == ["fc1"]


# --------------------------------------------------------------------------- non-finite


def test_non_finite_objectives_raise() -> None:
    model = make_model("mlp")
    with torch.no_grad():
        model.fc2.bias[3] = float("nan")
    with pytest.raises(ValueError, match="Gram matrix is not finite: `objectives`"):
        captured(model, make_batch(6), {"group_size": 3})


class MaskedInf(TokenMLP):
    """The last position's embedding is inf, and torch.where drops its logits: the
    objectives are finite, but fc1's weight gradient is 0 · inf there (NaN, as brute
    force gives it)."""

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        e = self.embed(ids).clone()
        e[:, -1] = float("inf")
        logits = self.fc2(torch.tanh(self.fc1(e)))
        keep = torch.ones_like(logits, dtype=torch.bool)
        keep[:, -1] = False
        return torch.where(keep, logits, torch.zeros_like(logits))


def test_non_finite_layer_input_is_named() -> None:
    torch.manual_seed(0)
    model = MaskedInf().double()
    batch = make_batch(6)
    with torch.no_grad():
        assert torch.isfinite(objectives_of(model, batch)).all()
    with pytest.raises(ValueError, match=r"not finite: NaN or inf in .*'fc1' \(input\)"):
        captured(model, batch, {"group_size": 3})


def test_overflow_raises() -> None:
    # float32 inputs of 1e19 and δ = 1 give finite objectives (about 1e20), but
    # K ~ (5 tokens · 1e19)² overflows float32's 3.4e38
    class Big(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x * 1e19)

    torch.manual_seed(0)
    model = Big()
    x = torch.rand(4, 5, 4) + 1.0
    with GradientCapture(model) as capture:
        objectives = model(x).sum(dim=(1, 2))
    assert torch.isfinite(objectives).all()
    with pytest.raises(ValueError, match="not finite: its products overflowed"):
        capture.gram(objectives, group_size=2)


# --------------------------------------------------------------------------- memory


def test_checkpointing_keeps_no_covered_input_alive() -> None:
    # Inside non-reentrant checkpoints the graph drops the layers' inputs and the backward
    # recomputes them; the capture takes them from that recomputation, so after the forward
    # only the head's input (outside the checkpoints, kept by the graph) is alive.
    pytest.importorskip("transformers")
    model = checkpointed_llama(reentrant=False)
    batch = make_batch(6, vocab=24)
    inputs = []
    handles = [m.register_forward_hook(lambda m, args, out: inputs.append(weakref.ref(args[0])))
               for m in model.modules() if isinstance(m, nn.Linear)]
    with GradientCapture(model) as capture:
        objectives = objectives_of(model, batch)
    for handle in handles:
        handle.remove()
    gc.collect()
    assert len(inputs) == 15
    assert sum(ref() is not None for ref in inputs) == 1
    gram = capture.gram(objectives, **LAYOUTS["dense"])
    expected = uncheckpointed_brute_force(model, batch, LAYOUTS["dense"])
    assert relative_error(gram, expected) <= EXACT


class Reused(TokenMLP):
    """fc1 run twice: inside one checkpoint ("one segment"), or once in each of two
    checkpoints ("two segments")."""

    def __init__(self, where: str) -> None:
        super().__init__(hidden=6)
        self.where = where

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        def twice(e: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.fc1(e)) * torch.tanh(self.fc1(e.flip(1) + 0.1))

        def once(e: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.fc1(e * 1.5))

        e = self.embed(ids)
        if self.where == "one segment":
            return self.fc2(checkpoint(twice, e, use_reentrant=False))
        h = checkpoint(once, e, use_reentrant=False)
        return self.fc2(checkpoint(once, h, use_reentrant=False))


@pytest.mark.parametrize("where", ["one segment", "two segments"])
def test_a_layer_run_twice_inside_checkpointing(where: str) -> None:
    # Each call's input comes from the recomputation of its own checkpoint, in the order
    # the checkpoint runs its calls again; none is kept by the capture after the forward.
    torch.manual_seed(0)
    model = Reused(where).double()
    batch = make_batch(6)
    layout = {"group_size": 3}
    inputs = []
    handle = model.fc1.register_forward_hook(
        lambda m, args, out: inputs.append(weakref.ref(args[0])))
    with GradientCapture(model) as capture:
        objectives = objectives_of(model, batch)
    handle.remove()
    gc.collect()
    # a checkpoint keeps its own input (the embedding's output, which the first call in
    # one segment reads), not the tensors computed inside it
    alive = sum(ref() is not None for ref in inputs)
    assert len(inputs) == 2 and alive == (1 if where == "one segment" else 0)
    gram = capture.gram(objectives, **layout)
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), layout)
    assert relative_error(gram, expected) <= EXACT
