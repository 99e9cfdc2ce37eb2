"""SetGRPO in TRL's real GRPOTrainer with groups split over two ranks (torchrun, gloo, CPU).

Six responses per rank with num_generations=4 on two processes: each generation batch of
12 responses is 3 groups, the middle one split 2 + 2 (rank 0 holds responses 0-5, rank 1
responses 6-11), as per_device_train_batch_size=6 (K from the loss's forward pass) or 3
with steps_per_generation=2 (K from the generation-time Gram pass).  Each rank's
coefficients must be those of SetGRPO on the whole generation batch with the brute-force
K: per-response gradients over the covered weights, computed on each rank with that
rank's own loss normalisation, gathered."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.environ["ADVCAL_ROOT"])
    import datasets, transformers, trl
    import advcal
    from advcal.integrations.trl import AdvcalGRPOMixin
    from advcal.torch import response_objectives
    from tests.tiny_llm import llama_config, word_tokenizer

    torch.set_num_threads(1)
    G, TAU = 4, 0.3
    LAYERS = ["model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj"]
    rng = np.random.default_rng(1)
    clean = rng.uniform(0, 1, (300, G))
    calibration = advcal.calibrate_sets(clean + rng.normal(0, 0.1, clean.shape),
                                        clean + rng.normal(0, 0.1, clean.shape), alpha=0.2)

    def spread(completions, **kwargs):
        return [(sum(map(ord, c)) * 7919 % 1009) / 1009 for c in completions]

    def expected(trainer, batch):
        # SetGRPO's coefficients of this rank's responses in batch, from every rank's
        # brute-force per-response gradients over the covered weights, gathered
        net = trainer.accelerator.unwrap_model(trainer.model)
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logps = trl.GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, net, ids, att, batch["completion_ids"].size(1))[0]
        objectives = response_objectives(  # this rank's loss normalisation
            logps, batch["completion_mask"], loss_type=trainer.loss_type,
            max_completion_length=trainer.max_completion_length,
            num_items_in_batch=batch.get("num_items_in_batch"),
            num_processes=trainer.accelerator.num_processes)
        params = [net.get_submodule(name).weight for name in LAYERS]
        grads = torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(
            j, params, retain_graph=True)]) for j in objectives]).double().numpy()
        mine = (batch["advcal_index"].numpy(), batch["advcal_group"].numpy(),
                batch["advcal_rewards"].numpy().astype(np.float64), grads)
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
        index = np.concatenate([p[0] for p in parts])
        order = np.argsort(index)
        groups = np.concatenate([p[1] for p in parts])[order]
        rewards = np.concatenate([p[2] for p in parts])[order]
        features = np.concatenate([p[3] for p in parts])[order]
        assert (np.diff(groups) >= 0).all() and groups.size % G == 0
        k = features @ features.T
        blocks = np.concatenate([k[q:q + G, q:q + G].ravel()
                                 for q in range(0, groups.size, G)])
        result = advcal.setgrpo(rewards, advcal.offsets_from_sizes(
            [G] * (groups.size // G)), gram=blocks, calibration=calibration, tau=TAU)
        Checked.etas.extend(result.eta.tolist())
        return result.coefficients[np.searchsorted(index[order], mine[0])]

    class Checked(AdvcalGRPOMixin, trl.GRPOTrainer):
        checked = 0
        etas = []

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if self.args.steps_per_generation > 1:  # K from the generation-time pass
                np.testing.assert_allclose(output["advantages"].numpy(),
                                           expected(self, output), rtol=1e-4, atol=1e-6)
                Checked.checked += 1
            return output

        def _compute_loss(self, model, inputs):
            if self.args.steps_per_generation > 1:
                return super()._compute_loss(model, inputs)
            want = expected(self, inputs)  # K from the loss's own forward pass
            loss = super()._compute_loss(model, inputs)
            np.testing.assert_allclose(inputs["advantages"].detach().numpy(), want,
                                       rtol=1e-4, atol=1e-6)
            Checked.checked += 1
            return loss

    tok = word_tokenizer()
    dataset = datasets.Dataset.from_dict({"prompt": ["a b c", "d e f", "g h", "i j k l"] * 6})
    steps = int(sys.argv[1])  # steps_per_generation
    config = trl.GRPOConfig(
        output_dir=None, per_device_train_batch_size=6 // steps, num_generations=G,
        steps_per_generation=steps, max_completion_length=6, max_steps=2 * steps,
        report_to=[], use_cpu=True, save_strategy="no", learning_rate=1e-2, logging_steps=1,
        seed=0, disable_tqdm=True,
        bf16=False)  # float32: the brute force's weight gradients are not rounded to bfloat16
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config(tok))
    trainer = Checked(model=model, reward_funcs=spread, args=config, train_dataset=dataset,
                      processing_class=tok, advantage="setgrpo", calibration=calibration,
                      tau=TAU, gram_layers=LAYERS)
    assert trainer.accelerator.num_processes == 2
    trainer.train()
    rank = trainer.accelerator.process_index
    np.save(os.path.join(os.environ["ADVCAL_OUT"], f"rank{rank}.npy"),
            np.array([Checked.checked, sum(e > 0 for e in Checked.etas), len(Checked.etas)]))
""")


@pytest.mark.parametrize("steps", [1, 2])
def test_setgrpo_with_groups_split_over_two_ranks(tmp_path: Path, steps: int) -> None:
    # steps_per_generation=1: K from the loss's forward pass, rows gathered in the loss;
    # 2: from the generation-time Gram pass, rows gathered there
    script = tmp_path / "trl_ranks.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "ADVCAL_ROOT": str(ROOT), "ADVCAL_OUT": str(tmp_path),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0", str(script), str(steps)],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    for rank in (0, 1):
        checked, accepted, groups = np.load(tmp_path / f"rank{rank}.npy")
        assert checked == 2  # both generation batches compared with the brute force
        assert groups == 3 * 2  # every rank ran the whole batch's three groups, twice
