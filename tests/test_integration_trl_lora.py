"""SetGRPO in a real TRL GRPOTrainer with peft LoRA adapters and in full fine-tuning: the loss's
gradient is TRL's own backward of TRL's loss with the recovered coefficients as advantages."""

from __future__ import annotations

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
        gradient_checkpointing=bool(checkpointing),
        gradient_checkpointing_kwargs={"use_reentrant": checkpointing == "reentrant"})
    return _Trainer(model=model, reward_funcs=_spread_reward, args=config,
                    train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS * 4}),
                    processing_class=tok, advantage="setgrpo", calibration=_calibration(),
                    tau=TAU, **kwargs)


def _gradients(trainer, inputs, loss=None) -> dict[str, torch.Tensor]:
    """The gradient of ``loss(model, inputs)`` (by default the trainer's loss), by name."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() otherwise
    trainer.model.zero_grad(set_to_none=True)
    (loss or trainer.compute_loss)(trainer.model, inputs).backward()
    return {name: p.grad for name, p in trainer.model.named_parameters() if p.requires_grad}


def _batch(trainer) -> dict:
    trainer.model.train()
    with torch.no_grad():
        batch = trainer._generate_and_score_completions(
            [{"prompt": p} for p in PROMPTS[:2] for _ in range(G)])
    torch.manual_seed(0)
    return shuffle_sequence_dict(batch)  # as TRL hands a generation batch to the loss


@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("checkpointing", [False, True, "reentrant"])
def test_the_gradient_is_trls_loss_with_the_coefficients(lora, checkpointing) -> None:
    # The Gram's pass leaves no gradient behind: the step's gradient is TRL's backward of
    # TRL's own loss, with the coefficients the mixin wrote as its advantages.
    trainer = _trainer(lora=lora, checkpointing=checkpointing)
    inputs = _batch(trainer)
    trls = inputs["advantages"].clone()
    got = _gradients(trainer, inputs)  # the mixin writes the coefficients into ``inputs``
    assert not torch.equal(inputs["advantages"], trls)  # the loss saw SetGRPO's, not TRL's

    def trls_loss(model, batch):
        return trl.GRPOTrainer._compute_loss(trainer, model, batch)

    expected = _gradients(trainer, dict(inputs), trls_loss)
    assert got.keys() == expected.keys()
    for name, e in expected.items():
        torch.testing.assert_close(got[name], e, rtol=0, atol=0)
    if checkpointing == "reentrant":
        # the same batch, the same K, so the same coefficients as with non-reentrant ones
        other = _trainer(lora=lora, checkpointing=True)
        again = dict(_batch(other), advantages=trls)
        assert torch.equal(again["completion_ids"], inputs["completion_ids"])
        _gradients(other, again)
        assert torch.equal(again["advantages"], inputs["advantages"])


def test_a_lora_training_run() -> None:
    trainer = _trainer(steps=2)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert any("advcal/accepted_fraction" in log for log in trainer.state.log_history)
    changed = [name for name, p in trainer.model.named_parameters()
               if not torch.equal(p, before[name])]
    assert changed and all("lora_" in name for name in changed)
