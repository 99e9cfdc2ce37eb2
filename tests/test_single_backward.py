"""The Gram backward standing in for the trainer's (advcal.integrations._single_backward): where
every condition holds, the returned loss has the loss's value and its backward writes the
loss's own gradient; where one fails, it returns None and writes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
nn = torch.nn

from advcal._torch_gram import LOSS_TYPES  # noqa: E402
from advcal.integrations._single_backward import prepare, single_backward  # noqa: E402
from advcal.torch import GradientCapture, response_objectives  # noqa: E402
from tests.test_gram import (  # noqa: E402, F401 (one_thread: the tiny models' autouse fixture)
    VOCAB,
    TokenMLP,
    make_batch,
    make_model,
    one_thread,
    tiny_gpt2,
)

N, G = 9, 3


def _linear_only(model: nn.Module) -> nn.Module:
    """Freeze every parameter that is not a linear layer's."""
    linear = {id(p) for m in model.modules() if isinstance(m, nn.Linear)
              for p in m.parameters()}
    for p in model.parameters():
        if id(p) not in linear:
            p.requires_grad_(False)
    return model


def _grpo_loss(logps, mask, advantages, epsilon=0.2):
    """TRL's GRPO loss at the current policy: ratio exp(log p − log p.detach()) = 1, clipped."""
    ratio = torch.exp(logps - logps.detach())
    a = advantages[:, None]
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a)
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def _forward(model, batch, keep, autocast, loss_type="grpo"):
    ids, attention, completion = batch
    with GradientCapture(model) as capture, \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(ids, attention_mask=attention)
        logits = logits.float() if autocast else logits  # as TRL: log p in float32
        logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(
            -1, ids[:, 1:, None])[..., 0]
        objectives = response_objectives(logps, completion, loss_type=loss_type)
    plan = prepare(logps, model.parameters(), capture)
    keep = keep and plan is not None  # (None: no plan can hold)
    capture._gram(objectives, None, None, None, G, "numpy", keep, plan.below if keep else None)
    return capture, logps, objectives, completion.to(logps.dtype), plan


def _case(model, *, vocab=11, keep=True, autocast=False, loss_of=None, loss_type="grpo",
          seed=1, advantages=None):
    """(loss, what single_backward returns for it): by default TRL's GRPO loss."""
    capture, logps, objectives, mask, plan = _forward(
        model, make_batch(N, vocab=vocab, seed=seed), keep, autocast, loss_type)
    if advantages is None:
        advantages = torch.linspace(-1.0, 1.5, N)
    advantages = torch.as_tensor(advantages, dtype=logps.dtype)
    loss = _grpo_loss(logps, mask, advantages) if loss_of is None else \
        loss_of(logps, mask, advantages)
    return loss, None if plan is None else single_backward(loss, logps, objectives, capture,
                                                             plan)


def _check(model, loss, single, tol, scale=1.0):
    """single's value is the loss's, and its backward (after ``scale``) writes the loss's
    gradient, within ``tol`` relative to its largest entry."""
    params = [p for p in model.parameters() if p.requires_grad]
    expected = torch.autograd.grad(scale * loss, params, retain_graph=True)
    assert single is not None
    assert single.item() == loss.item()
    model.zero_grad(set_to_none=True)
    (scale * single).backward()
    for p, e in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, e, rtol=tol, atol=tol * float(e.abs().max()))


# lora: frozen base layers; mlp: biases too; llama: attention and MLP projections and head
# (its eager attention takes the softmax in float32, whatever the model's dtype)
@pytest.mark.parametrize(("kind", "tol"), [("lora", 1e-10), ("mlp", 1e-10), ("llama", 1e-6)])
def test_the_gradient_is_the_losss_own(kind, tol) -> None:
    model = _linear_only(make_model(kind))
    _check(model, *_case(model, vocab=VOCAB[kind]), tol)


@given(kind=st.sampled_from(["lora", "mlp"]), loss_type=st.sampled_from(LOSS_TYPES),
       seed=st.integers(0, 2**16),
       advantages=st.lists(st.sampled_from([-1.5, -0.25, 0.0, 0.5, 2.0]), min_size=N,
                           max_size=N))
def test_property_the_gradient_is_the_losss_own(kind, loss_type, seed, advantages) -> None:
    # Any masks, any objectives' normalisation (the loss keeps TRL's GRPO one: the two
    # differ by a factor per response), any coefficients, zeros included.
    model = make_model(kind, seed=seed % 7)
    _check(model, *_case(model, loss_type=loss_type, seed=seed, advantages=advantages), 1e-9)


def test_a_scaled_backward_scales_the_gradient() -> None:
    # the trainer may scale the loss (gradient accumulation, fp16 loss scaling)
    model = make_model("lora")
    _check(model, *_case(model), 1e-12, scale=0.25)


def test_shared_weights_and_repeated_calls_add_up() -> None:
    class Twice(TokenMLP):
        def __init__(self) -> None:
            super().__init__()
            self.fc3 = nn.Linear(9, 11)
            self.fc3.weight = self.fc2.weight  # one parameter, two layers

        def forward(self, ids, attention_mask=None):
            h = torch.tanh(self.fc1(self.embed(ids)))
            h2 = torch.tanh(self.fc1(self.embed(ids.flip(1)) + 0.1))  # fc1 called twice
            return self.fc2(h * h2) + self.fc3(h)

    torch.manual_seed(0)
    model = _linear_only(Twice().double())
    _check(model, *_case(model), 1e-10)


def test_conv1d_layers() -> None:
    transformers = pytest.importorskip("transformers")
    model = tiny_gpt2()
    conv1d = transformers.pytorch_utils.Conv1D
    covered = {id(p) for m in model.modules() if isinstance(m, (nn.Linear, conv1d))
               for p in m.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in covered)
    _check(model, *_case(model), 1e-10)


def test_inside_bfloat16_autocast() -> None:
    # The layers run in bfloat16 on cast copies of the weights: each copy's uses count.
    # autograd's own products round to bfloat16; these stay in float32.
    model = make_model("lora", dtype=torch.float32)
    _check(model, *_case(model, autocast=True), 2e-2)


def _unchanged(model, single):
    assert single is None
    assert all(p.grad is None for p in model.parameters())


# Trainable parameters outside the covered layers: the embedding (mlp, lora's is frozen),
# and the embedding and RMS norms (llama); the nodes using them get λ times ΣJ's gradient.
@pytest.mark.parametrize(("kind", "tol"), [("mlp", 1e-10), ("llama", 1e-6)])
def test_parameters_outside_the_covered_layers(kind, tol) -> None:
    model = make_model(kind)
    assert not all(isinstance(m, nn.Linear) for m in model.modules() if m._parameters)
    _check(model, *_case(model, vocab=VOCAB[kind]), tol)


def test_parameters_outside_the_covered_layers_inside_autocast() -> None:
    model = make_model("mlp", dtype=torch.float32)
    _check(model, *_case(model, autocast=True), 2e-2)


def test_a_parameter_used_through_an_op_on_itself() -> None:
    # gain.exp() has no rows of responses: λ cannot be placed on its gradient
    class Gained(TokenMLP):
        def __init__(self) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.zeros(9))

        def forward(self, ids, attention_mask=None):
            return self.fc2(torch.tanh(self.fc1(self.embed(ids))) * self.gain.exp())

    torch.manual_seed(0)
    model = Gained().double()
    _unchanged(model, _case(model)[1])


def test_a_loss_reaching_the_model_other_than_through_the_log_probabilities() -> None:
    model = make_model("lora")
    weight = model.fc1.lora_A["default"].weight
    _unchanged(model, _case(model, loss_of=lambda logps, mask, a: _grpo_loss(
        logps, mask, a) + 1e-3 * (weight ** 2).sum())[1])
    # ... or not through them at all
    _unchanged(model, _case(model, loss_of=lambda *args: (weight ** 2).sum())[1])


def test_a_loss_not_proportional_to_the_objectives_within_a_response() -> None:
    # per-token weights (as a KL term or an entropy mask gives) break the proportionality
    model = make_model("lora")
    _unchanged(model, _case(model, loss_of=lambda logps, mask, a: _grpo_loss(
        logps * torch.linspace(0.5, 1.5, logps.shape[1], dtype=logps.dtype), mask, a))[1])


def test_a_covered_weight_used_outside_its_layer() -> None:
    class Reused(TokenMLP):
        def forward(self, ids, attention_mask=None):
            x = self.embed(ids)
            h = torch.tanh(self.fc1(x)) + 0.1 * nn.functional.linear(x, self.fc1.weight)
            return self.fc2(h)

    torch.manual_seed(0)
    model = _linear_only(Reused().double())
    _unchanged(model, _case(model)[1])


def test_a_capture_that_kept_nothing() -> None:
    model = make_model("lora")
    _unchanged(model, _case(model, keep=False)[1])
