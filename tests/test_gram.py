"""advcal.torch.GradientCapture: per-response policy-gradient Gram matrices.

The oracle is brute force: one ``torch.autograd.grad`` per response over exactly the
parameters the capture covers (``capture.parameters()``), then all inner products.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import advcal
from advcal.layouts import groups_from_ids

torch = pytest.importorskip("torch")
import advcal.torch._accumulate as tg  # noqa: E402
from advcal.torch import (  # noqa: E402
    GradientCapture,
    LayerSelection,  # noqa: E402
    last_blocks,
    response_objectives,
)

nn = torch.nn


@pytest.fixture(autouse=True)
def one_thread() -> object:
    """The models are tiny: torch's thread pool only adds contention on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- models


class TokenMLP(nn.Module):
    """An MLP over token embeddings: logits for the next token at every position."""

    def __init__(self, vocab: int = 11, d: int = 6, hidden: int = 9) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(self.embed(ids))))


class TinyTransformer(nn.Module):
    """Two causal nn.TransformerEncoderLayers and a head."""

    def __init__(self, vocab: int = 13, d: int = 8, batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 2, 12, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        t = ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        pad = None if attention_mask is None else attention_mask == 0
        x = self.embed(ids)
        if self.batch_first:
            return self.head(self.encoder(x, mask=causal, src_key_padding_mask=pad))
        # sequence-first: every linear layer sees (T, N, features)
        out = self.head(self.encoder(x.transpose(0, 1), mask=causal, src_key_padding_mask=pad))
        return out.transpose(0, 1)


class LoraLinear(nn.Module):
    """A frozen linear layer with a peft-style LoRA adapter (lora_A / lora_B ModuleDicts)."""

    def __init__(self, d_in: int, d_out: int, r: int = 2) -> None:
        super().__init__()
        self.base_layer = nn.Linear(d_in, d_out)
        self.base_layer.requires_grad_(False)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(d_in, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, d_out, bias=False)})
        nn.init.normal_(self.lora_B["default"].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))


class LoraMLP(TokenMLP):
    def __init__(self) -> None:
        super().__init__()
        self.embed.requires_grad_(False)
        self.fc1 = LoraLinear(6, 9)
        self.fc2 = LoraLinear(9, 11)


def tiny_llama(**overrides: object) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=24, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        **overrides)
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config)


class LlamaLogits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=attention_mask).logits


def make_model(kind: str, dtype: torch.dtype = torch.float64, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "mlp":
        model = TokenMLP()
    elif kind == "transformer":
        model = TinyTransformer()
    elif kind == "transformer-seq-first":
        model = TinyTransformer(batch_first=False)
    elif kind == "lora":
        model = LoraMLP()
    else:
        model = LlamaLogits(tiny_llama())
    return model.to(dtype)


def make_batch(n: int, t: int = 7, vocab: int = 11, prompt: int = 2, seed: int = 1
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, a right-padded attention mask, and the completion mask of the targets."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, t), generator=gen)
    lengths = torch.randint(prompt + 2, t + 1, (n,), generator=gen)
    lengths[0] = t
    attention = (torch.arange(t)[None, :] < lengths[:, None]).long()
    completion = attention[:, 1:].clone()
    completion[:, : prompt - 1] = 0
    return ids, attention, completion


def objectives_of(model: nn.Module, batch: tuple[torch.Tensor, ...], loss_type: str = "grpo"
                  ) -> torch.Tensor:
    ids, attention, completion = batch
    logits = model(ids, attention_mask=attention)
    logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    return response_objectives(logps, completion, loss_type=loss_type)


def brute_force(model: nn.Module, batch: tuple[torch.Tensor, ...], params: list[torch.Tensor],
                loss_type: str = "grpo") -> np.ndarray:
    """Full (N, N) Gram matrix from one autograd pass per response, in float64."""
    objectives = objectives_of(model, batch, loss_type)
    rows = []
    for i in range(objectives.shape[0]):
        grads = torch.autograd.grad(objectives[i], params, retain_graph=True,
                                    allow_unused=True)
        rows.append(torch.cat([torch.zeros(p.numel(), dtype=torch.float64) if g is None
                               else g.reshape(-1).double()
                               for g, p in zip(grads, params, strict=True)]))
    features = torch.stack(rows)
    return (features @ features.T).numpy()


def layout_blocks(full: np.ndarray, layout: dict) -> np.ndarray:
    """The blocks of a full Gram matrix in the layout the capture is asked for."""
    n = full.shape[0]
    if "group_size" in layout:
        g = layout["group_size"]
        return np.stack([full[q * g:(q + 1) * g, q * g:(q + 1) * g] for q in range(n // g)])
    if "offsets" in layout:
        off = layout["offsets"]
        groups = [np.arange(a, b) for a, b in zip(off[:-1], off[1:], strict=True)]
    else:
        index = groups_from_ids(layout["group_ids"])
        groups = [index.order[a:b] for a, b in zip(index.offsets[:-1], index.offsets[1:],
                                                       strict=True)]
    return np.concatenate([full[np.ix_(g, g)].reshape(-1) for g in groups])


def captured(model: nn.Module, batch: tuple[torch.Tensor, ...], layout: dict,
             loss_type: str = "grpo", **options: object) -> tuple[np.ndarray, GradientCapture]:
    with GradientCapture(model, **options) as capture:
        objectives = objectives_of(model, batch, loss_type)
    return capture.gram(objectives, **layout), capture


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    # Against brute force, 1e-10 in float64: both runs see the same shapes, so even Llama's
    # float32 steps round alike; only float64 sums reorder (~10^3 terms · 2^-53 ≈ 1e-13).
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


LAYOUTS = {
    "dense": {"group_size": 3},
    "ragged": {"offsets": np.array([0, 4, 5, 5, 9])},
    "shuffled ids": {"group_ids": ["c", "a", "c", "b", "a", "c", "b", "a", "b"]},
}
VOCAB = {"mlp": 11, "transformer": 13, "transformer-seq-first": 13, "lora": 11, "llama": 24}


# --------------------------------------------------------------------------- exact mode


@pytest.mark.parametrize("route", [None, "materialise", "pairs"])
@pytest.mark.parametrize("kind", ["mlp", "transformer", "llama"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_exact_float64_equals_brute_force(kind: str, layout: str, route: str | None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if kind == "llama":
        pytest.importorskip("transformers")
    monkeypatch.setattr(tg, "_FORCE_ROUTE", route)
    model = make_model(kind)
    batch = make_batch(9, vocab=VOCAB[kind])
    gram, capture = captured(model, batch, LAYOUTS[layout])
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), LAYOUTS[layout])
    assert gram.dtype == np.float64 and gram.shape == expected.shape
    assert relative_error(gram, expected) <= 1e-10
    assert np.abs(gram - expected).max() <= 1e-10 * np.abs(expected).max()


def test_covered_parameters_are_named_exactly() -> None:
    # nn.MultiheadAttention uses in_proj_weight and out_proj through F.multi_head_attention_
    # forward without calling out_proj: the capture covers the feed-forward layers and head.
    model = make_model("transformer")
    capture = GradientCapture(model)
    assert capture.layers == ["encoder.layers.0.linear1", "encoder.layers.0.linear2",
                              "encoder.layers.1.linear1", "encoder.layers.1.linear2", "head"]
    names = {id(p): name for name, p in model.named_parameters()}
    assert [names[id(p)] for p in capture.parameters()] == [
        f"{layer}.{kind}" for layer in capture.layers for kind in ("weight", "bias")]
    with pytest.raises(TypeError, match="out_proj.*MultiheadAttention"):
        GradientCapture(model, layers=["encoder.layers.0.self_attn.out_proj"])


def test_llama_covers_every_linear_layer() -> None:
    model = make_model("llama")
    capture = GradientCapture(model)
    per_block = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert capture.layers == [f"model.model.layers.{b}.{name}" for b in range(2)
                              for name in per_block] + ["model.lm_head"]


def tiny_gpt2() -> nn.Module:
    """A one-block float64 GPT-2, whose layers are transformers' Conv1D."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=11,
                                     n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, tie_word_embeddings=False,
                                     bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    return LlamaLogits(transformers.GPT2LMHeadModel(config)).double()


def test_gpt2_conv1d_layers() -> None:
    model = tiny_gpt2()
    capture = GradientCapture(model)
    assert capture.layers == ["model.transformer.h.0.attn.c_attn",
                              "model.transformer.h.0.attn.c_proj",
                              "model.transformer.h.0.mlp.c_fc",
                              "model.transformer.h.0.mlp.c_proj", "model.lm_head"]
    batch = make_batch(9)
    layout = LAYOUTS["shuffled ids"]
    gram, capture = captured(model, batch, layout)
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), layout)
    assert relative_error(gram, expected) <= 1e-10


def test_sequence_first_model_with_batch_dim() -> None:
    model = make_model("transformer-seq-first")
    batch = make_batch(9, vocab=13)
    layout = LAYOUTS["ragged"]
    gram, capture = captured(model, batch, layout, batch_dim=1)
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), layout)
    assert relative_error(gram, expected) <= 1e-10
    with pytest.raises(ValueError, match="batch_dim=0"):
        captured(model, batch, layout)


@pytest.mark.parametrize("kind", ["mlp", "transformer", "llama"])
def test_exact_float32_within_1e_5(kind: str) -> None:
    model = make_model(kind, torch.float32)
    batch = make_batch(9, vocab=VOCAB[kind])
    layout = LAYOUTS["shuffled ids"]
    gram, capture = captured(model, batch, layout)
    assert gram.dtype == np.float64
    reference = make_model(kind, torch.float64)
    reference.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    covered = {id(p) for p in capture.parameters()}
    params = [q for p, q in zip(model.parameters(), reference.parameters(), strict=True)
              if id(p) in covered]
    expected = layout_blocks(brute_force(reference, batch, params), layout)
    assert relative_error(gram, expected) <= 1e-5
    tensor_gram, _ = captured(model, batch, layout, )
    with GradientCapture(model) as capture:
        objectives = objectives_of(model, batch)
    out = capture.gram(objectives, **layout, output="tensor")
    assert out.dtype == torch.float32 and out.device == objectives.device
    np.testing.assert_allclose(out.numpy(), tensor_gram, rtol=1e-6, atol=0)


def test_bfloat16_model_accumulates_in_float32() -> None:
    model = make_model("mlp", torch.bfloat16)
    batch = make_batch(6)
    with GradientCapture(model) as capture:
        objectives = objectives_of(model, batch)
    out = capture.gram(objectives, group_size=3, output="tensor")
    assert out.dtype == torch.float32
    reference = make_model("mlp", torch.float64)
    reference.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    expected = layout_blocks(brute_force(reference, batch, list(reference.parameters())[1:]),
                             {"group_size": 3})
    assert relative_error(out.double().numpy(), expected) <= 0.05  # bfloat16 activations


@pytest.mark.parametrize("route", ["materialise", "pairs"])
@pytest.mark.parametrize("sketch_dim", [None, 8])
def test_gram_inside_autocast_accumulates_as_outside(route: str, sketch_dim: int | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # A trainer may run its whole loss (and so gram()) under autocast: the products must
    # not be cast down to its bfloat16.
    monkeypatch.setattr(tg, "_FORCE_ROUTE", route)
    model = make_model("mlp", torch.float32)
    batch = make_batch(6)
    grams = []
    for inside in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with GradientCapture(model, sketch_dim=sketch_dim) as capture:
                objectives = objectives_of(model, batch)
            if inside:
                grams.append(capture.gram(objectives, group_size=3, output="tensor"))
        if not inside:
            grams.append(capture.gram(objectives, group_size=3, output="tensor"))
    assert grams[0].dtype == grams[1].dtype == torch.float32
    np.testing.assert_array_equal(grams[0].numpy(), grams[1].numpy())


@pytest.mark.parametrize("kind", ["transformer", "llama"])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "bnpo", "dapo"])
def test_padding_contributes_nothing(kind: str, loss_type: str) -> None:
    # Extra padded positions (masked in attention and loss) leave K unchanged.
    model = make_model(kind)
    ids, attention, completion = make_batch(6, t=6, vocab=VOCAB[kind])
    wide = (torch.cat([ids, torch.zeros(6, 3, dtype=ids.dtype)], 1),
            torch.cat([attention, torch.zeros(6, 3, dtype=attention.dtype)], 1),
            torch.cat([completion, torch.zeros(6, 3, dtype=completion.dtype)], 1))
    layout = {"group_size": 3}
    short, _ = captured(model, (ids, attention, completion), layout, loss_type)
    padded, _ = captured(model, wide, layout, loss_type)
    if loss_type == "dr_grpo":  # its constant divisor is the padded length
        short *= (5 / 8) ** 2
    # Llama runs 8 float32 steps in a float64 model (5 RMSNorms, 2 softmaxes, RoPE); at other
    # shapes their kernels round differently, each ≤ 1 ulp (2^-24), twice as K is bilinear:
    # 16·2^-24 ≈ 1e-6. The transformer is all float64: reordered sums of ~10^3 terms give
    # ≲ 10^3·2^-53 ≈ 1e-13, and 1e-10 leaves room for cancellation in K.
    tol = 1e-6 if kind == "llama" else 1e-10
    assert np.abs(padded - short).max() <= tol * np.abs(short).max()


def test_weight_sharing_and_repeated_calls() -> None:
    # A layer called twice in one forward: its gradient is the sum over both calls.
    class Twice(TokenMLP):
        def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                    ) -> torch.Tensor:
            h = torch.tanh(self.fc1(self.embed(ids)))
            h2 = torch.tanh(self.fc1(self.embed(ids.flip(1)) + 0.1))
            return self.fc2(h * h2)

    torch.manual_seed(0)
    model = Twice().double()
    batch = make_batch(9)
    layout = LAYOUTS["dense"]
    gram, capture = captured(model, batch, layout)
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), layout)
    assert relative_error(gram, expected) <= 1e-10


class SharedInput(TokenMLP):
    """Four layers read one tensor (as q/k/v projections do): one with a bias, one without,
    one with a frozen weight and a trainable bias, and one called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.b = nn.Linear(6, 4, bias=False)
        self.c = nn.Linear(6, 5)
        self.c.weight.requires_grad_(False)
        self.e = nn.Linear(6, 5)
        self.out = nn.Linear(5, 11)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        h = self.embed(ids)
        mixed = torch.tanh(self.a(h)) * torch.tanh(self.c(h)) + self.e(h) * self.e(h + 0.3)
        return self.out(mixed + self.b(h).sum(-1, keepdim=True))


@pytest.mark.parametrize("route", ["materialise", "pairs"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layers_sharing_an_input(layout: str, route: str, monkeypatch: pytest.MonkeyPatch
                                 ) -> None:
    # a and b bundle into one product; c (bias only) and e (called twice) stay apart
    monkeypatch.setattr(tg, "_FORCE_ROUTE", route)
    torch.manual_seed(0)
    model = SharedInput().double()
    batch = make_batch(9)
    assert GradientCapture(model).layers == ["fc1", "fc2", "a", "b", "c", "e", "out"]
    gram, capture = captured(model, batch, LAYOUTS[layout])
    # fc1 and fc2 do not run: after gram() the capture says it does not cover them
    assert capture.layers == ["a", "b", "c", "e", "out"]
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), LAYOUTS[layout])
    assert relative_error(gram, expected) <= 1e-10


@pytest.mark.parametrize("route", ["materialise", "pairs"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_small_workspace_slices_and_flushes(layout: str, route: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # A workspace of 64 numbers: every product in slices of one output row, rows added to
    # K a slice at a time, token pairs one group at a time; K is unchanged.
    model = make_model("llama")
    batch = make_batch(9, vocab=24)
    exact, _ = captured(model, batch, LAYOUTS[layout])
    monkeypatch.setattr(tg, "_FORCE_ROUTE", route)
    monkeypatch.setattr(tg, "WORKSPACE", 64)
    small, capture = captured(model, batch, LAYOUTS[layout])
    np.testing.assert_allclose(small, exact, rtol=1e-10, atol=1e-12 * np.abs(exact).max())
    sketched_small = captured(model, batch, LAYOUTS[layout], sketch_dim=32, seed=3)[0]
    monkeypatch.setattr(tg, "WORKSPACE", 1 << 24)
    sketched_large = captured(model, batch, LAYOUTS[layout], sketch_dim=32, seed=3)[0]
    np.testing.assert_allclose(sketched_small, sketched_large, rtol=1e-10,
                               atol=1e-12 * np.abs(sketched_large).max())


def test_equal_groups_in_any_order() -> None:
    # Equal groups (contiguous or interleaved ids, offsets) run as one (B, n, n) batch,
    # after a permutation when the ids interleave; unequal interleaved ids group by group.
    model = make_model("transformer")
    batch = make_batch(8, vocab=13)
    full = brute_force(model, batch, GradientCapture(model).parameters())
    for layout in ({"group_ids": [0, 0, 1, 1, 2, 2, 3, 3]}, {"group_ids": [1, 0, 1, 0] * 2},
                   {"offsets": np.array([0, 4, 8])}, {"group_ids": [2, 0, 1, 0, 2, 1, 1, 2]}):
        gram, _ = captured(model, batch, layout)
        assert relative_error(gram, layout_blocks(full, layout)) <= 1e-10


# --------------------------------------------------------------------------- selection


def test_lora_preset_and_frozen_layers() -> None:
    model = make_model("lora")
    capture = GradientCapture(model, layers="lora")
    assert capture.layers == ["fc1.lora_A.default", "fc1.lora_B.default",
                              "fc2.lora_A.default", "fc2.lora_B.default"]
    assert GradientCapture(model).layers == capture.layers  # frozen base layers drop out
    batch = make_batch(9)
    layout = LAYOUTS["ragged"]
    gram, capture = captured(model, batch, layout, layers="lora")
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in capture.parameters()}
    expected = layout_blocks(brute_force(model, batch, trainable), layout)
    assert relative_error(gram, expected) <= 1e-10
    with pytest.raises(ValueError, match="no trainable parameter"):
        GradientCapture(model, layers=["fc1.base_layer"])
    with pytest.raises(ValueError, match="no LoRA adapter"):
        GradientCapture(make_model("mlp"), layers="lora")


def test_peft_lora_adapters() -> None:
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = tiny_llama().double()
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj",
                                                                            "v_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(p, std=0.1)  # peft starts B at 0: make the A gradients non-zero
    wrapped = LlamaLogits(model)
    capture = GradientCapture(wrapped, layers="lora")
    assert len(capture.layers) == 2 * 2 * 2
    assert all(".lora_" in name for name in capture.layers)
    batch = make_batch(6, vocab=24)
    gram, capture = captured(wrapped, batch, {"group_size": 3}, layers="lora")
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in capture.parameters()}
    expected = layout_blocks(brute_force(wrapped, batch, trainable), {"group_size": 3})
    assert relative_error(gram, expected) <= 1e-10


def test_last_blocks_selection_and_lists() -> None:
    model = make_model("llama")
    capture = GradientCapture(model, layers=last_blocks(model.model, 1))
    assert capture.layers[-1] == "model.lm_head"
    assert all(name.startswith("model.model.layers.1.") for name in capture.layers[:-1])
    assert len(capture.layers) == 8
    no_head = GradientCapture(model, layers=last_blocks(model.model, 2, head=False))
    assert len(no_head.layers) == 14
    by_name = GradientCapture(model, layers=["model.lm_head", "model.model.layers.0.mlp"])
    assert by_name.layers == ["model.lm_head", "model.model.layers.0.mlp.gate_proj",
                              "model.model.layers.0.mlp.up_proj",
                              "model.model.layers.0.mlp.down_proj"]
    by_module = GradientCapture(model, layers=[model.model.lm_head])
    assert by_module.layers == ["model.lm_head"]
    predicate = GradientCapture(model, layers=lambda name, m: name.endswith("o_proj"))
    assert predicate.layers == ["model.model.layers.0.self_attn.o_proj",
                                "model.model.layers.1.self_attn.o_proj"]
    batch = make_batch(6, vocab=24)
    gram, capture = captured(model, batch, {"group_size": 2}, layers=last_blocks(model.model, 1))
    expected = layout_blocks(brute_force(model, batch, capture.parameters()), {"group_size": 2})
    assert relative_error(gram, expected) <= 1e-10


@pytest.mark.parametrize("layers", [None, ["model.model.layers.1"], "predicate"])
def test_a_resolved_selection_gives_the_gram_of_a_fresh_capture(layers: object) -> None:
    # A trainer resolves its layers once and captures batch after batch with them.
    model = make_model("llama")
    if layers == "predicate":
        layers = last_blocks(model.model, 1)
    selection = LayerSelection(model, layers)
    assert selection.current()
    for seed in (1, 2):  # two batches, one selection
        batch = make_batch(6, vocab=24, seed=seed)
        fresh, fresh_capture = captured(model, batch, LAYOUTS["dense"], layers=layers)
        with GradientCapture(model, selection) as capture:
            objectives = objectives_of(model, batch)
        assert capture.layers == fresh_capture.layers
        np.testing.assert_array_equal(capture.gram(objectives, group_size=3), fresh)
    with pytest.raises(ValueError, match="another model"):
        GradientCapture(make_model("llama"), selection)


def test_a_selection_notices_changed_modules_and_requires_grad() -> None:
    model = make_model("mlp")
    selection = LayerSelection(model, None)
    assert [layer.name for layer in selection.layers] == ["fc1", "fc2"]
    model.fc2.bias.requires_grad_(False)  # still selected, without its bias
    assert not selection.current()
    selection = LayerSelection(model, None)
    assert (selection.layers[1].weight, selection.layers[1].bias) == (True, False)
    model.fc1.requires_grad_(False)  # no longer selected
    assert not selection.current()
    assert [layer.name for layer in LayerSelection(model, None).layers] == ["fc2"]
    model = make_model("mlp")
    selection = LayerSelection(model, None)
    model.fc1 = nn.Linear(6, 9)  # a new module in the same place
    assert not selection.current()
    model = make_model("mlp")
    selection = LayerSelection(model, None)
    model.extra = nn.Linear(2, 2)  # a module more
    assert not selection.current()
    model = make_model("mlp")
    selection = LayerSelection(model, None)
    model.fc1.weight.requires_grad_(True)  # no change
    assert selection.current()


def test_unsupported_layers_raise_type_error_naming_them() -> None:
    model = make_model("mlp")
    with pytest.raises(TypeError, match="'embed' is a Embedding"):
        GradientCapture(model, layers=["embed"])
    with pytest.raises(TypeError, match="'embed' is a Embedding"):
        GradientCapture(model, layers=[model.embed])
    with pytest.raises(ValueError, match="not a submodule"):
        GradientCapture(model, layers=["nope"])
    with pytest.raises(ValueError, match="not a submodule"):
        GradientCapture(model, layers=[nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="`layers` items"):
        GradientCapture(model, layers=[3])
    with pytest.raises(ValueError, match="one of"):
        GradientCapture(model, layers="attention")
    with pytest.raises(ValueError, match="selects no linear layer"):
        GradientCapture(nn.Sequential(nn.Embedding(3, 2)))
    with pytest.raises(ValueError, match="selects no linear layer"):
        GradientCapture(model, layers=[])
    with pytest.raises(TypeError, match="`model`"):
        GradientCapture(lambda x: x)


# --------------------------------------------------------------------------- training


def test_training_gradients_are_untouched() -> None:
    model = make_model("llama")
    batch = make_batch(6, vocab=24)
    advantages = torch.linspace(-1, 1, 6, dtype=torch.float64)

    def loss_and_grads(capture: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        if capture:
            with GradientCapture(model) as cap:
                objectives = objectives_of(model, batch)
            cap.gram(objectives, group_size=3)
            assert all(p.grad is None for p in model.parameters())
        else:
            objectives = objectives_of(model, batch)
        (-(advantages * objectives).sum()).backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = loss_and_grads(False)
    with_capture = loss_and_grads(True)
    for a, b in zip(plain, with_capture, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # existing .grad (gradient accumulation) is left as it was
    before = [p.grad.clone() for p in model.parameters()]
    with GradientCapture(model) as cap:
        objectives = objectives_of(model, batch)
    cap.gram(objectives, group_size=3)
    for p, b in zip(model.parameters(), before, strict=True):
        torch.testing.assert_close(p.grad, b, rtol=0, atol=0)
    assert all(not m._forward_hooks for m in model.modules())


def test_response_objectives_match_trl_loss_normalisations() -> None:
    # TRL GRPOTrainer's losses at ratio 1 (no clipping, beta = 0), written from their
    # normalisations: grpo mean per sequence then over the batch, bnpo over the mask's sum,
    # dr_grpo over N * max_completion_length, dapo over num_items_in_batch / processes.
    gen = torch.Generator().manual_seed(3)
    logps = (-torch.rand(5, 6, generator=gen, dtype=torch.float64)).requires_grad_()
    mask = (torch.rand(5, 6, generator=gen) > 0.3).long()
    mask[2] = 0  # an empty completion
    adv = torch.randn(5, 1, generator=gen, dtype=torch.float64)
    ratio = torch.exp(logps - logps.detach())
    per_token = -ratio * adv
    m = mask.double()
    losses = {
        "grpo": ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean() / 2,
        "bnpo": (per_token * m).sum() / m.sum().clamp(min=1.0) / 2,
        "dr_grpo": (per_token * m).sum() / (5 * 10) / 2,
        "dapo": (per_token * m).sum() / (torch.tensor(40.0) / 4),
    }
    options = {"max_completion_length": 10, "num_items_in_batch": 40, "num_processes": 4}
    for loss_type, loss in losses.items():
        (expected,) = torch.autograd.grad(loss, logps, retain_graph=True)
        extra = {"gradient_accumulation_steps": 2} if loss_type != "dapo" else {}
        objectives = response_objectives(logps, mask, loss_type=loss_type, **options, **extra)
        (got,) = torch.autograd.grad(-(adv[:, 0] * objectives).sum(), logps)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-15)
    half = response_objectives(logps.detach().bfloat16(), mask)
    assert half.dtype == torch.float32


def test_response_objectives_bad_input() -> None:
    logps = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="loss_type"):
        response_objectives(logps, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="completion_mask"):
        response_objectives(logps, torch.ones(2, 4))
    with pytest.raises(ValueError, match="per_token_logps"):
        response_objectives(torch.zeros(6), torch.ones(6))
    with pytest.raises(TypeError, match="per_token_logps"):
        response_objectives(np.zeros((2, 3)), mask)
    with pytest.raises(ValueError, match="max_completion_length"):
        response_objectives(logps, mask, loss_type="dr_grpo", max_completion_length=0)
    with pytest.raises(ValueError, match="num_processes"):
        response_objectives(logps, mask, loss_type="dapo", num_processes=0)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        response_objectives(logps, mask, loss_type="dapo", num_items_in_batch=float("nan"))


# --------------------------------------------------------------------------- bad input


def test_gram_bad_input() -> None:
    model = make_model("mlp")
    batch = make_batch(6)

    def fresh() -> tuple[GradientCapture, torch.Tensor]:
        with GradientCapture(model) as capture:
            objectives = objectives_of(model, batch)
        return capture, objectives

    capture, objectives = fresh()
    with pytest.raises(ValueError, match="1-D"):
        capture.gram(objectives[:, None], group_size=3)
    with pytest.raises(ValueError, match="grad_fn"):
        capture.gram(objectives.detach(), group_size=3)
    with pytest.raises(TypeError, match="objectives"):
        capture.gram(objectives.detach().numpy(), group_size=3)
    with pytest.raises(ValueError, match="multiple of `group_size`"):
        capture.gram(objectives, group_size=4)
    with pytest.raises(ValueError, match="length of `objectives`"):
        capture.gram(objectives, offsets=[0, 2, 5])
    with pytest.raises(ValueError, match="one label per objective"):
        capture.gram(objectives, group_ids=[1, 1, 2])
    with pytest.raises(ValueError, match="exactly one of"):
        capture.gram(objectives)
    with pytest.raises(ValueError, match="exactly one of"):
        capture.gram(objectives, offsets=[0, 6], group_size=6)
    with pytest.raises(ValueError, match="output"):
        capture.gram(objectives, group_size=3, output="list")
    with pytest.raises(ValueError, match="batch_dim"):  # a sub-batch is not the responses
        capture.gram(objectives[:3], group_size=3)
    capture.gram(objectives, group_size=3)
    with pytest.raises(ValueError, match="already called"):
        capture.gram(objectives, group_size=3)
    with pytest.raises(ValueError, match="one forward pass"):
        with capture:
            pass

    outside = objectives_of(model, batch)
    with GradientCapture(model) as capture:
        pass
    with pytest.raises(ValueError, match="not produced under the capture"):
        capture.gram(outside, group_size=3)
    with GradientCapture(model) as capture:
        objectives_of(model, batch)
    with pytest.raises(ValueError, match="not produced under the capture"):
        capture.gram(outside, group_size=3)
    with GradientCapture(model) as capture, torch.no_grad():
        objectives_of(model, batch)
    with pytest.raises(ValueError, match="not produced under the capture"):
        capture.gram(outside, group_size=3)
    with pytest.raises(ValueError, match="forward pass inside"):
        GradientCapture(model).gram(outside, group_size=3)

    capture, objectives = fresh()
    objectives.sum().backward()
    with pytest.raises(ValueError, match="before the trainer's backward"):
        capture.gram(objectives, group_size=3)

    for bad, name in (({"sketch_dim": 0}, "sketch_dim"), ({"seed": -1}, "seed"),
                      ({"sketch": "sparse"}, "sketch"), ({"batch_dim": 0.5}, "batch_dim")):
        with pytest.raises((ValueError, TypeError), match=name):
            GradientCapture(model, **bad)


def test_hooks_are_removed_even_on_exceptions() -> None:
    model = make_model("mlp")
    with pytest.raises(ZeroDivisionError), GradientCapture(model):
        model(make_batch(3)[0])
        raise ZeroDivisionError
    assert all(not m._forward_hooks for m in model.modules())


# --------------------------------------------------------------------------- sketched mode


def sketched(model: nn.Module, batch: tuple[torch.Tensor, ...], layout: dict, k: int,
             seed: int, kind: str = "gaussian") -> np.ndarray:
    return captured(model, batch, layout, sketch_dim=k, seed=seed, sketch=kind)[0]


@pytest.mark.parametrize("kind", ["gaussian", "rademacher"])
def test_sketch_is_unbiased(kind: str) -> None:
    model = make_model("mlp")
    batch = make_batch(6)
    layout = {"offsets": np.array([0, 2, 6])}
    exact, capture = captured(model, batch, layout)
    # fc1 (9 x 6) and fc2 (11 x 9) are projected to 4 x 4 each
    assert tg._sketch_sides(9, 6, 16) == (4, 4) and tg._sketch_sides(11, 9, 16) == (4, 4)
    draws = np.stack([sketched(model, batch, layout, 16, seed, kind) for seed in range(200)])
    assert not np.allclose(draws[0], exact)
    mean = draws.mean(axis=0)
    se = draws.std(axis=0, ddof=1) / np.sqrt(len(draws))
    assert (se > 0).all()
    assert (np.abs(mean - exact) <= 4 * se).all()
    np.testing.assert_array_equal(sketched(model, batch, layout, 16, 7, kind), draws[7])


def kronecker_variance(x: np.ndarray, y: np.ndarray, k_out: int, k_in: int) -> float:
    """Var⟨A X Bᵀ, A Y Bᵀ⟩ for Gaussian A (k_out x d_out, entries N(0, 1/k_out)) and B
    (k_in x d_in); a side left unprojected (k = d) contributes no variance."""
    a = 0.0 if k_out == x.shape[0] else 1.0 / k_out
    b = 0.0 if k_in == x.shape[1] else 1.0 / k_in
    d, p, q = x.T @ y, x.T @ x, y.T @ y
    tr_dd, tr_ddt, tr_d = np.trace(d @ d), np.sum(d * d), np.trace(d)
    tr_pq = np.sum(p * q)
    return float(a * (tr_dd + (tr_ddt + tr_d ** 2) * b + tr_pq * (1 + b)
                      + np.trace(p) * np.trace(q) * b) + b * (tr_dd + tr_ddt))


def test_sketch_error_matches_its_variance() -> None:
    # E‖K̂ − K‖_F² = Σ over layers and pairs of the Kronecker sketch's variance, computed
    # in closed form from the per-response gradients; 120 seeds estimate it within 4 SE.
    torch.manual_seed(0)
    model = TokenMLP(vocab=40, d=24, hidden=48).double()
    batch = make_batch(6, t=6, vocab=40)
    layout = {"group_size": 6}
    exact, capture = captured(model, batch, layout)
    objectives = objectives_of(model, batch)
    k = 64
    expected = 0.0
    for layer in (model.fc1, model.fc2):
        grads = [torch.autograd.grad(objectives[i], layer.weight, retain_graph=True)[0].numpy()
                 for i in range(6)]
        k_out, k_in = tg._sketch_sides(*layer.weight.shape, k)
        expected += sum(kronecker_variance(x, y, k_out, k_in) for x in grads for y in grads)
    errors = np.array([np.sum((sketched(model, batch, layout, k, seed) - exact) ** 2)
                       for seed in range(120)])
    se = errors.std(ddof=1) / np.sqrt(errors.size)
    assert abs(errors.mean() - expected) <= 4 * se
    assert se < 0.25 * expected  # the test has power to see a wrong variance


def test_sketch_error_at_documented_sizes() -> None:
    # The relative Frobenius error at k = 256, 1024, 4096 shrinks and stays under the
    # Chebyshev-style bound 2·sqrt(E‖K̂ − K‖²)/‖K‖ on each seed (fixed seeds).
    torch.manual_seed(0)
    model = TokenMLP(vocab=96, d=64, hidden=128).double()
    batch = make_batch(8, t=8, vocab=96)
    layout = {"group_size": 4}
    exact, _ = captured(model, batch, layout)
    objectives = objectives_of(model, batch)
    grads = {}
    for layer in (model.fc1, model.fc2):
        grads[layer] = [torch.autograd.grad(objectives[i], layer.weight,
                                            retain_graph=True)[0].numpy() for i in range(8)]
    means = []
    for k in (256, 1024, 4096):
        variance = 0.0
        for layer, g in grads.items():
            k_out, k_in = tg._sketch_sides(*layer.weight.shape, k)
            for q in range(2):
                block = g[4 * q:4 * q + 4]
                variance += sum(kronecker_variance(x, y, k_out, k_in) for x in block
                                for y in block)
        bound = 2 * np.sqrt(variance) / np.linalg.norm(exact)
        errors = [relative_error(sketched(model, batch, layout, k, seed), exact)
                  for seed in range(5)]
        assert max(errors) <= bound
        means.append(np.mean(errors))
    assert means[0] > means[1] > means[2]


def test_sketch_keeps_small_layers_exact() -> None:
    model = make_model("mlp")
    batch = make_batch(6)
    exact, _ = captured(model, batch, {"group_size": 3})
    big_k, _ = captured(model, batch, {"group_size": 3}, sketch_dim=128)
    np.testing.assert_allclose(big_k, exact, rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- plug-in


def test_setgrpo_with_captured_gram_equals_brute_force() -> None:
    from advcal.simulate import paired_scorings

    model = make_model("llama")
    batch = make_batch(12, vocab=24)
    with GradientCapture(model) as capture:
        objectives = objectives_of(model, batch)
    gram = capture.gram(objectives, group_size=4)
    expected = layout_blocks(brute_force(model, batch, capture.parameters()),
                             {"group_size": 4})
    twice = paired_scorings(2000, 4, scale=0.02, seed=0)
    cal = advcal.calibrate_sets(twice.a, twice.b, alpha=0.1)
    rewards = paired_scorings(3, 4, scale=0.02, seed=5).a
    got = advcal.setgrpo(rewards, gram=gram, calibration=cal, tau=0.2)
    want = advcal.setgrpo(rewards, gram=expected, calibration=cal, tau=0.2)
    np.testing.assert_array_equal(got.accepted, want.accepted)
    assert got.accepted.any()
    np.testing.assert_allclose(got.coefficients, want.coefficients, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(got.eta, want.eta, rtol=1e-8, atol=1e-12)


class FusedHeadMLP(TokenMLP):
    """fc2's weight is used through F.linear, as a fused LM head does: its hook never fires."""

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        hidden = torch.tanh(self.fc1(self.embed(ids)))
        return nn.functional.linear(hidden, self.fc2.weight, self.fc2.bias)


def test_a_layer_that_never_runs() -> None:
    torch.manual_seed(0)
    model = FusedHeadMLP().double()
    batch = make_batch(6)
    # named one by one, it must run: K could not cover its gradients
    with pytest.raises(ValueError, match=r"\['fc2'\] did not run"):
        captured(model, batch, {"offsets": np.array([0, 3, 6])}, layers=["fc1", "fc2"])
    # chosen by a rule, K covers the layers that ran, and parameters() says which
    gram, capture = captured(model, batch, {"offsets": np.array([0, 3, 6])})
    assert capture.parameters() == [model.fc1.weight, model.fc1.bias]
    expected = brute_force(model, batch, [model.fc1.weight, model.fc1.bias])
    layout = {"offsets": np.array([0, 3, 6])}
    assert relative_error(gram, layout_blocks(expected, layout)) <= 1e-10


def test_group_index_for_group_ids() -> None:
    # the caller's groups_from_ids of the labels gives the same blocks as the labels
    model = make_model("mlp")
    batch = make_batch(9)
    ids = LAYOUTS["shuffled ids"]["group_ids"]
    by_labels, _ = captured(model, batch, {"group_ids": ids})
    by_index, _ = captured(model, batch, {"group_ids": groups_from_ids(ids)})
    np.testing.assert_array_equal(by_index, by_labels)
    index = groups_from_ids(ids)
    for order in (index.order[:-1], np.r_[index.order[:-1], index.order[0]],
                  np.r_[index.order[:-1], -1]):
        with pytest.raises(ValueError, match="permutation"):
            captured(model, batch, {"group_ids": index._replace(order=order)})
    with pytest.raises(ValueError, match="offsets"):
        captured(model, batch, {"group_ids": index._replace(offsets=index.offsets[:-1])})


class CheckpointedMLP(TokenMLP):
    """TokenMLP whose hidden layer is recomputed in the backward pass (non-reentrant
    activation checkpointing, as transformers' gradient checkpointing does)."""

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        def hidden(e: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.fc1(e))

        return self.fc2(checkpoint(hidden, self.embed(ids), use_reentrant=False))


def test_activation_checkpointing_records_only_the_forward() -> None:
    torch.manual_seed(0)
    model = CheckpointedMLP().double()
    batch = make_batch(6)
    calls = []
    model.fc1.register_forward_hook(lambda *args: calls.append(1))
    with GradientCapture(model) as capture:
        objectives = objectives_of(model, batch)
        assert len(calls) == 1
        gram = capture.gram(objectives, group_size=3)  # its backward re-runs fc1
    assert len(calls) == 2
    expected = layout_blocks(brute_force(model, batch, capture.parameters()),
                             {"group_size": 3})
    assert relative_error(gram, expected) < 1e-10


# --------------------------------------------------------------------------- streaming


class Checkpointed(nn.Module):
    """A model whose whole forward is one non-reentrant activation checkpoint."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.model, ids, attention_mask, use_reentrant=False)


def architecture(kind: str, checkpointing: bool | str) -> nn.Module:
    """The float64 models of this file, optionally under non-reentrant checkpointing (per
    block for transformers' models, as gradient_checkpointing_enable sets it; the whole
    forward for the others), or (``"reentrant"``, transformers' models) reentrant."""
    model = tiny_gpt2() if kind == "gpt2" else make_model(kind)
    if not checkpointing:
        return model
    if kind in ("llama", "gpt2"):
        model.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": checkpointing == "reentrant"})
        model.model.config.use_cache = False
        return model.train()  # transformers checkpoints in training mode only (no dropout)
    return Checkpointed(model)


@pytest.mark.parametrize(("kind", "checkpointing"), [
    (kind, checkpointing) for checkpointing in (False, True)
    for kind in ("mlp", "transformer", "llama", "lora", "gpt2")] + [
    ("llama", "reentrant"), ("gpt2", "reentrant")])
def test_streaming_gram_equals_brute_force(kind: str, checkpointing: bool | str) -> None:
    # Each layer's δ is consumed as the backward reaches it; under checkpointing its input
    # comes from the recomputation (transformers' reentrant checkpointing runs
    # non-reentrant under the capture). Exact and sketched (a sketch as wide as every
    # weight is exact) against brute force on the model without checkpointing.
    if kind in ("llama", "gpt2"):
        pytest.importorskip("transformers")
    model = architecture(kind, checkpointing)
    batch = make_batch(9, vocab=VOCAB.get(kind, 11))
    layout = LAYOUTS["shuffled ids"]
    gram, capture = captured(model, batch, layout)
    wide, _ = captured(model, batch, layout, sketch_dim=1 << 12)
    if checkpointing and kind in ("llama", "gpt2"):
        model.model.gradient_checkpointing_disable()
    params = capture.parameters()
    assert len(params) == len({id(p) for p in params}) > 0
    expected = layout_blocks(brute_force(model, batch, params), layout)
    assert relative_error(gram, expected) <= 1e-10
    assert np.abs(gram - expected).max() <= 1e-10 * np.abs(expected).max()
    np.testing.assert_allclose(wide, gram, rtol=1e-10, atol=1e-12 * np.abs(gram).max())


class Deep(nn.Module):
    """``depth`` residual blocks of two linear layers over token embeddings, each block
    optionally under its own non-reentrant checkpoint."""

    def __init__(self, depth: int, checkpointing: bool, d: int = 8, vocab: int = 11) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.Tanh(),
                                                  nn.Linear(2 * d, d)) for _ in range(depth))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        x = self.embed(ids)
        for block in self.blocks:
            x = x + (checkpoint(block, x, use_reentrant=False) if self.checkpointing
                     else block(x))
        return self.head(x)


def most_output_gradients_alive(depth: int, checkpointing: bool) -> int:
    """The most covered output gradients alive at once during gram() on ``Deep``: weak
    references to each, taken as the backward passes it; when one arrives, count the
    earlier ones still alive (distinct tensors: autograd may accumulate the residual
    stream's gradient in place into one tensor, which is then the δ of several layers in
    turn).  Also checks K against brute force."""
    torch.manual_seed(0)
    model = Deep(depth, checkpointing).double()
    batch = make_batch(6)
    seen: list[weakref.ref] = []
    most = 0
    recording = True

    def track(grad: torch.Tensor) -> None:
        nonlocal most
        most = max(most, len({id(ref()) for ref in seen} - {id(None)}))
        seen.append(weakref.ref(grad))

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        # the forward's outputs only, not the recomputation's
        if recording and output.requires_grad:
            output.register_hook(track)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, nn.Linear)]
    with GradientCapture(model) as capture:
        objectives = objectives_of(model, batch)
    recording = False
    gram = capture.gram(objectives, group_size=3)
    for handle in handles:
        handle.remove()
    assert len(seen) == 2 * depth + 1  # every covered output's δ passed
    expected = layout_blocks(brute_force(model, batch, capture.parameters()),
                             {"group_size": 3})
    assert relative_error(gram, expected) <= 1e-10
    return most


@pytest.mark.parametrize("checkpointing", [False, True])
def test_output_gradients_alive_at_once_do_not_grow_with_depth(checkpointing: bool) -> None:
    # Holding every δ until the end (one autograd.grad to all outputs) leaves 2·depth
    # alive; streaming leaves none but those autograd itself has in flight.
    shallow = most_output_gradients_alive(2, checkpointing)
    assert most_output_gradients_alive(8, checkpointing) == shallow <= 2


@pytest.mark.parametrize("route", [None, "materialise", "pairs"])
def test_float32_model_within_1e_5_of_the_float64_truth(route: str | None,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    # Rows of 256·1024 products: summed in float32, ⟨G_i, G_j⟩ loses ~1e-4 of the largest
    # entry; accumulated in float64 only the model's own float32 rounding remains
    # (activations ~1e-7, products over 32 tokens in float32: ~1e-6).
    monkeypatch.setattr(tg, "_FORCE_ROUTE", route)
    torch.manual_seed(0)
    reference = TokenMLP(vocab=256, d=256, hidden=1024).double()
    model = TokenMLP(vocab=256, d=256, hidden=1024).float()
    model.load_state_dict({k: v.float() for k, v in reference.state_dict().items()})
    batch = make_batch(8, t=32, vocab=256)
    layout = {"group_size": 8}
    gram, capture = captured(model, batch, layout)
    params = list(reference.parameters())[1:]  # fc1, fc2: every covered parameter
    assert len(params) == len(capture.parameters())
    expected = layout_blocks(brute_force(reference, batch, params), layout)
    assert np.abs(gram - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize(("g", "groups", "d_in", "d_out", "t", "pairs"), [
    # measured on CPU (one thread): the faster route, each at least 1.5x faster
    (16, 4, 256, 256, 16, True), (16, 4, 256, 1024, 32, True), (8, 2, 256, 1024, 32, True),
    (16, 4, 128, 512, 16, True), (16, 4, 256, 256, 64, False), (8, 2, 128, 128, 64, False),
    (16, 4, 64, 64, 32, False), (4, 4, 1024, 256, 128, False), (8, 2, 256, 256, 4, True),
])
def test_route_choice_at_measured_sizes(g: int, groups: int, d_in: int, d_out: int, t: int,
                                        pairs: bool) -> None:
    blocks = tg._Blocks(torch, None, np.arange(0, g * groups + 1, g), torch.float32,
                        torch.device("cpu"))
    assert blocks.token_pairs_cheaper(t, d_out, d_in) == pairs
