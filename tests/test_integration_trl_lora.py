"""SetGRPO in a real TRL GRPOTrainer with peft LoRA adapters: the Gram's backward stands in for
the trainer's, and the gradient is the one TRL's own backward gives."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import advcal

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from trl.trainer.utils import shuffle_sequence_dict  # noqa: E402

from advcal.integrations.trl import AdvcalGRPOMixin  # noqa: E402
from tests.tiny_llm import llama_config, word_tokenizer  # noqa: E402

G, TAU = 4, 0.2
PROMPTS = ["a b c", "d e f", "g h", "i j k l"]
# In full fine-tuning the LM head's weight is trained too. TRL's fused head (trl.kernels)
# uses it in one node above the Gram's pass; an older TRL calls the head as a layer, outside
# the Gram's layers, so the single backward cannot hold and TRL's backward runs.
FULL = [1.0] if importlib.util.find_spec("trl.kernels") is not None else [0.0]


class _Trainer(AdvcalGRPOMixin, trl.GRPOTrainer):
    pass


def _spread_reward(completions, **kwargs):
    return [(sum(map(ord, c)) * 7919 % 1009) / 1009 for c in completions]


def _calibration() -> advcal.SetCalibration:
    rng = np.random.default_rng(1)
    clean = rng.uniform(0, 1, (300, G))
    return advcal.calibrate_sets(clean + rng.normal(0, 0.1, clean.shape),
                                 clean + rng.normal(0, 0.1, clean.shape), alpha=0.2)


def _trainer(*, lora=True, bf16=False, steps=1, entropy_quantile=1.0, dropout=0.0,
             checkpointing=False, config=None, **kwargs) -> _Trainer:
    tok = word_tokenizer()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config or llama_config(tok))
    if lora:
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear",
                                                           lora_dropout=dropout))
        torch.manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)  # peft starts B at 0: A's gradients too
    config = trl.GRPOConfig(
        output_dir=None, per_device_train_batch_size=2 * G, num_generations=G,
        max_completion_length=6, max_steps=steps, report_to=[], use_cpu=True,
        save_strategy="no", learning_rate=1e-2, logging_steps=1, seed=0, disable_tqdm=True,
        bf16=bf16, top_entropy_quantile=entropy_quantile,
        gradient_checkpointing=checkpointing)
    return _Trainer(model=model, reward_funcs=_spread_reward, args=config,
                    train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS * 4}),
                    processing_class=tok, advantage="setgrpo", calibration=_calibration(),
                    tau=TAU, **kwargs)


def _gradients(trainers, batch, scale=1.0) -> list[dict[str, torch.Tensor]]:
    """Each trainer's gradient of its loss on one batch, by name (of ``scale`` times the
    loss, divided by ``scale``)."""
    out = []
    for trainer in trainers:
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() otherwise
        trainer.model.zero_grad(set_to_none=True)
        (scale * trainer.compute_loss(trainer.model, dict(batch))).backward()
        out.append({name: p.grad / scale for name, p in trainer.model.named_parameters()
                    if p.requires_grad})
    return out


def _distance(a, b) -> float:
    """The largest relative distance between two sets of gradients, parameter by parameter."""
    return max(float((a[name] - b[name]).norm() / b[name].norm()) for name in b)


def _batch(trainer) -> dict:
    trainer.model.train()
    with torch.no_grad():
        batch = trainer._generate_and_score_completions(
            [{"prompt": p} for p in PROMPTS[:2] for _ in range(G)])
    torch.manual_seed(0)
    return shuffle_sequence_dict(batch)  # as TRL hands a generation batch to the loss


def _used(trainer) -> list[float]:
    return trainer._metrics["train"].get("advcal/single_backward", [])


def test_lora_gradients_come_from_the_gram_backward() -> None:
    single, separate = _trainer(), _trainer(gram_single_backward=False)
    got, expected = _gradients([single, separate], _batch(single))
    assert _used(single) == [1.0] and _used(separate) == []
    assert got.keys() == expected.keys() and len(got) == 2 * 7 * 2  # A and B, 7 layers, 2 blocks
    for name, e in expected.items():
        torch.testing.assert_close(got[name], e, rtol=1e-5, atol=1e-5 * float(e.abs().max()))


@pytest.mark.parametrize("lora", [True, False])
def test_with_adapter_dropout_and_gradient_checkpointing(lora) -> None:
    # One trainer, the single backward on and off, the same dropout masks (same RNG state);
    # checkpointed blocks recompute their forward when a node using a norm's weight is run.
    trainer = _trainer(lora=lora, dropout=0.2, checkpointing=True)
    batch = _batch(trainer)
    grads = []
    for single in (True, False):
        trainer._advcal = trainer._advcal._replace(single_backward=single)
        torch.manual_seed(5)
        grads += _gradients([trainer], batch)
    assert _used(trainer) == ([1.0] if lora else FULL)
    for name, e in grads[1].items():
        torch.testing.assert_close(grads[0][name], e, rtol=1e-5,
                                   atol=1e-5 * float(e.abs().max()))


def test_in_bfloat16_within_the_rounding_of_trls_own_backward() -> None:
    # TRL's backward rounds its products to bfloat16, these stay in float32: the two differ
    # by about as much as TRL's own gradient moves when the loss is scaled by 3.
    single, separate = _trainer(bf16=True), _trainer(bf16=True, gram_single_backward=False)
    batch = _batch(single)
    got, expected = _gradients([single, separate], batch)
    (rescaled,) = _gradients([separate], batch, scale=3.0)
    assert _used(single) == [1.0]
    noise = _distance(rescaled, expected)
    assert 0 < _distance(got, expected) <= 3 * noise < 0.1


def test_full_fine_tuning_gradients_come_from_the_gram_backward() -> None:
    # Embeddings and norms are not linear layers: the nodes using them are differentiated
    # at λ times ΣJ's gradient; the LM head's weight, used by TRL's fused head above the
    # Gram's start, at the loss's own gradient.
    single, separate = _trainer(lora=False), _trainer(lora=False, gram_single_backward=False)
    got, expected = _gradients([single, separate], _batch(single))
    assert _used(single) == FULL
    assert len(expected) == 2 * 9 + 3  # 7 linear layers and 2 norms per block; embeddings,
    # the final norm, the head
    for name, e in expected.items():
        torch.testing.assert_close(got[name], e, rtol=1e-5, atol=1e-5 * float(e.abs().max()))


def test_tied_embeddings() -> None:
    # The embedding's weight is also the fused head's: both nodes' parts add up.
    config = llama_config(word_tokenizer())
    config.tie_word_embeddings = True
    single, separate = (_trainer(lora=False, config=config, gram_single_backward=flag)
                        for flag in (True, False))
    assert single.model.lm_head.weight is single.model.model.embed_tokens.weight
    got, expected = _gradients([single, separate], _batch(single))
    assert _used(single) == FULL
    for name, e in expected.items():
        torch.testing.assert_close(got[name], e, rtol=1e-5, atol=1e-5 * float(e.abs().max()))


def _last_block(name, module) -> bool:
    return ".layers.1." in name


@pytest.mark.parametrize("options", [{"entropy_quantile": 0.5}, {"gram_layers": _last_block}])
def test_where_it_would_differ_trls_backward_runs(options) -> None:
    # TRL's entropy mask (the loss leaves out tokens the objectives count), or adapters
    # outside the Gram's layers (their weights reach the loss through a transpose, which
    # has no rows of responses): TRL's own backward.
    single = _trainer(**options)
    separate = _trainer(**options, gram_single_backward=False)
    got, expected = _gradients([single, separate], _batch(single))
    assert _used(single) == [0.0] and _used(separate) == []
    for name, e in expected.items():
        torch.testing.assert_close(got[name], e, rtol=0, atol=0)


def test_a_lora_training_run() -> None:
    trainer = _trainer(steps=2)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert [log["advcal/single_backward"] for log in trainer.state.log_history
            if "advcal/single_backward" in log] == [1.0, 1.0]
    changed = [name for name, p in trainer.model.named_parameters()
               if not torch.equal(p, before[name])]
    assert changed and all("lora_" in name for name in changed)


def test_the_setting_is_checked() -> None:
    with pytest.raises(TypeError, match="gram_single_backward"):
        _trainer(gram_single_backward="yes")
