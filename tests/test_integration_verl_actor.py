"""advcal's worker-side Gram pass for verl: the objectives against verl's own policy loss, the
Gram rows against a brute-force per-response autograd Gram on a tiny float64 Llama, whole
groups whatever the micro-batching and verl's balance_batch reordering, SetGRPO advantages
through verl's compute_advantage, and the worker method dispatched by verl's single
controller (RayWorkerGroup) over two CPU ranks with groups split between them.

verl 0.9 has no CPU platform (its FSDP engine and ActorRolloutRefWorker need an accelerator),
so the actor model here is the tiny Llama itself, and once wrapped by torch's FSDP2
``fully_shard`` (verl's ``strategy=fsdp2``) in a one-process gloo group."""

from __future__ import annotations

import numpy as np
import pytest

import advcal

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("verl")
ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn  # noqa: E402
from verl.utils.model import compute_position_id_with_mask  # noqa: E402

from advcal.integrations import verl as integration  # noqa: E402
from advcal.integrations.verl import _actor as verl_actor  # noqa: E402
from advcal.integrations.verl import _config as verl_config  # noqa: E402
from tests.tiny_llm import llama_config, word_tokenizer  # noqa: E402

# The float64 Llama still runs 8 steps in float32 (5 RMSNorms, 2 softmaxes, RoPE), and the
# passes compared here see other sequence lengths (padded, chunked, one response alone), where
# torch's float32 kernels round differently (and differently again on AVX2 and AVX-512):
# each step ≤ 1 float32 ulp (2**-24), doubled because K is bilinear in the gradients,
# 16 · 2**-24 ≈ 1e-6 of K's largest entry.  (The float64 parts alone round to ~1e-13.)
RTOL64 = 16 * 2.0 ** -24
P, R = 4, 5  # prompt and response widths of the padded layout
UIDS = np.array(["p", "q", "r", "p", "q", "p", "r", "q", "p"], dtype=object)  # 4 + 3 + 2


@pytest.fixture(autouse=True)
def _fresh_options(monkeypatch):
    monkeypatch.delenv(integration.OPTIONS_ENV, raising=False)
    verl_config._configured.clear()
    yield
    verl_config._configured.clear()


def _model(seed: int = 0):
    torch.manual_seed(seed)
    config = llama_config(word_tokenizer())
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config).double().eval()


def _data(seed: int = 0, uids: np.ndarray = UIDS) -> DataProto:
    """verl's rollout layout: prompts left-padded to P, responses right-padded to R."""
    rng = np.random.default_rng(seed)
    n = uids.size
    prompt_len = rng.integers(1, P + 1, n)
    response_len = rng.integers(1, R + 1, n)
    response_len[0] = R  # one full-width response
    ids = rng.integers(4, 16, (n, P + R))
    prompt_mask = np.arange(P)[None, :] >= P - prompt_len[:, None]
    response_mask = np.arange(R)[None, :] < response_len[:, None]
    attention = np.concatenate([prompt_mask, response_mask], axis=1)
    ids = np.where(attention, ids, 0)
    attention_mask = torch.as_tensor(attention.astype(np.int64))
    return DataProto.from_dict(
        tensors={"input_ids": torch.as_tensor(ids), "attention_mask": attention_mask,
                 "position_ids": compute_position_id_with_mask(attention_mask),
                 "prompts": torch.as_tensor(ids[:, :P]),
                 "responses": torch.as_tensor(ids[:, P:]),
                 "response_mask": torch.as_tensor(response_mask.astype(np.int64))},
        non_tensors={"uid": uids.copy()})


def _linear_parameters(model) -> list:
    return [p for m in model.modules() if isinstance(m, torch.nn.Linear)
            for p in m.parameters() if p.requires_grad]


def _brute_rows(model, data: DataProto, mode: str = "token-mean") -> np.ndarray:
    """Each response's gradient from its own unpadded sequence (what verl's packed actor
    runs: use_remove_padding=True), its Gram rows by plain autograd."""
    batch = data.batch
    mask = batch["response_mask"].double()
    params = _linear_parameters(model)
    grads = []
    for i in range(len(data)):
        keep = batch["attention_mask"][i].bool()
        ids = batch["input_ids"][i][keep][None]
        n_resp = int(mask[i].sum())
        logits = model(input_ids=ids).logits[0, -n_resp - 1:-1]
        logp = torch.log_softmax(logits, -1).gather(-1, ids[0, -n_resp:, None])[:, 0]
        padded = torch.zeros(1, R, dtype=torch.float64)
        padded[0, :n_resp] = logp
        # J_i with the whole batch's constants, as the Gram pass uses them
        j = integration.policy_objectives(
            padded, mask[i:i + 1], mode, batch_num_tokens=float(mask.sum()),
            global_batch_size=float(len(data)))[0]
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(j, params)]))
    g = torch.stack(grads)
    gram = (g @ g.T).numpy()
    index = advcal.groups_from_ids(data.non_tensor_batch["uid"])
    blocks = [gram[np.ix_(m, m)].ravel() for m in _members(index)]
    return integration.gram_rows(np.concatenate(blocks), data.non_tensor_batch["uid"])


def _members(index) -> list[np.ndarray]:
    return [index.order[s:e] for s, e in zip(index.offsets[:-1], index.offsets[1:], strict=True)]


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL64) -> None:
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    scale = np.nanmax(np.abs(expected))
    np.testing.assert_allclose(np.nan_to_num(actual), np.nan_to_num(expected), rtol=0,
                               atol=rtol * scale)


# ------------------------------------------------------------------ objectives


@pytest.mark.parametrize("mode", integration.LOSS_AGG_MODES)
@pytest.mark.parametrize("dp_size", [1, 2])
def test_objectives_are_the_gradient_of_verls_policy_loss(mode, dp_size) -> None:
    """∇ of verl's own vanilla PPO loss at ratio 1 equals −Σ A_i ∇J_i, in every loss_agg_mode."""
    from verl.workers.config import FSDPActorConfig

    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(5, 6, generator=gen, dtype=torch.float64)
    mask = (torch.arange(6)[None, :] < torch.tensor([6, 3, 1, 5, 2])[:, None]).long()
    mask[2] = 0  # a response without tokens: excluded from seq-mean, J = 0
    advantages = torch.randn(5, generator=gen, dtype=torch.float64)
    constants = {"dp_size": dp_size, "batch_num_tokens": 23, "global_batch_size": 7,
                 "loss_scale_factor": 4 if mode.endswith("norm") else None}
    config = FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    config.global_batch_info.update(constants)
    theirs = logp.clone().requires_grad_(True)
    loss, _ = get_policy_loss_fn("vanilla")(
        old_log_prob=logp, log_prob=theirs, response_mask=mask.bool(), loss_agg_mode=mode,
        advantages=advantages[:, None].expand(5, 6), config=config, rollout_is_weights=None)
    (expected,) = torch.autograd.grad(loss, theirs)
    ours = logp.clone().requires_grad_(True)
    j = integration.policy_objectives(ours, mask, mode, **constants)
    (actual,) = torch.autograd.grad(-(advantages * j).sum(), ours)
    torch.testing.assert_close(actual, expected, rtol=1e-14, atol=1e-15)
    # and the value: agg_loss of -A·logp is -Σ A_i J_i
    value = agg_loss(-advantages[:, None] * logp, mask, mode, **constants)
    torch.testing.assert_close(-(advantages * j.detach()).sum(), value, rtol=1e-14, atol=0)


def test_objectives_defaults_follow_agg_loss_on_one_rank() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    for mode in integration.LOSS_AGG_MODES:
        a = torch.tensor([1.0, 0.0], dtype=torch.float64)
        torch.testing.assert_close(integration.policy_objectives(logp, mask, mode)[0],
                                   -agg_loss(-a[:, None] * logp, mask, mode))
    with pytest.raises(ValueError, match="loss_agg_mode"):
        integration.policy_objectives(logp, mask, "seq-sum")
    with pytest.raises(ValueError, match="batch_num_tokens"):
        integration.policy_objectives(logp, mask, batch_num_tokens=0)
    with pytest.raises(ValueError, match="response_mask"):
        integration.policy_objectives(logp, mask[:, :2])


# ------------------------------------------------------------------ the Gram pass


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_gram_rows_equal_brute_force(mode) -> None:
    model = _model()
    data = _data()
    rows = integration.compute_gram_rows(model, data, loss_agg_mode=mode)
    _close(rows, _brute_rows(model, data, mode))
    assert not any(p.grad is not None for p in model.parameters())  # nothing in .grad


def test_whole_groups_whatever_the_micro_batching_and_the_order() -> None:
    """A token budget below the batch (one group per forward, then two) and verl's own
    balance_batch reordering give the same rows, in the rows' new order."""
    model = _model(1)
    data = _data(1)
    whole = integration.compute_gram_rows(model, data)
    _close(whole, _brute_rows(model, data))
    lengths = data.batch["attention_mask"].sum(-1)
    for budget in (1, int(lengths.max()) * 7):
        _close(integration.compute_gram_rows(model, data, max_token_len=budget), whole)

    class Trainer:  # what RayPPOTrainer._balance_batch reads of its trainer
        actor_rollout_wg = None

        def _get_dp_size(self, worker_group, role):
            return 3

    shuffled = _data(1)
    before = shuffled.batch["input_ids"].clone()
    ray_trainer.RayPPOTrainer._balance_batch(Trainer(), shuffled, metrics={})
    moved = [int(np.flatnonzero((before == row).all(-1).numpy())[0])
             for row in shuffled.batch["input_ids"]]
    assert moved != list(range(len(data)))  # verl did permute the rows
    rows = integration.compute_gram_rows(model, shuffled, max_token_len=40)
    # row k of the shuffled batch is response moved[k]; its row lists its group's members
    # in the shuffled order
    expected = integration.gram_rows(_reordered_blocks(whole, moved),
                                     shuffled.non_tensor_batch["uid"])
    _close(rows, expected)


def _reordered_blocks(rows: np.ndarray, moved: list[int]) -> np.ndarray:
    """The flat blocks of the batch reordered so that row k is original row moved[k]."""
    uids = UIDS[moved]
    full = np.zeros((UIDS.size, UIDS.size))
    index = advcal.groups_from_ids(UIDS)
    for members in _members(index):
        full[np.ix_(members, members)] = rows[members, :members.size]
    full = full[np.ix_(moved, moved)]
    new = advcal.groups_from_ids(uids)
    return np.concatenate([full[np.ix_(m, m)].ravel() for m in _members(new)])


def test_a_given_number_of_forwards_for_ranks_in_step() -> None:
    """Under FSDP all ranks run as many forwards: split further, then spare forwards."""
    model = _model(1)
    data = _data(1)
    whole = integration.compute_gram_rows(model, data)
    calls = []
    handle = model.register_forward_hook(lambda *args: calls.append(1))
    try:
        assert integration.gram_forwards(data) == 1
        assert integration.gram_forwards(data, max_token_len=1) == 3  # three groups
        for forwards in (1, 2, 3, 5):
            calls.clear()
            rows = integration.compute_gram_rows(model, data, forwards=forwards)
            assert len(calls) == forwards
            _close(rows, whole)
    finally:
        handle.remove()
    with pytest.raises(ValueError, match="below the 3 forwards"):
        integration.compute_gram_rows(model, data, max_token_len=1, forwards=2)
    with pytest.raises(ValueError, match="forwards"):
        integration.compute_gram_rows(model, data, forwards=0)


def test_sketched_rows_do_not_depend_on_the_chunks() -> None:
    model = _model(2)
    data = _data(2)
    one = integration.compute_gram_rows(model, data, sketch_dim=6, seed=3)
    split = integration.compute_gram_rows(model, data, sketch_dim=6, seed=3, max_token_len=1)
    _close(split, one)
    other = integration.compute_gram_rows(model, data, sketch_dim=6, seed=4)
    assert np.nanmax(np.abs(other - one)) > 1e-6 * np.nanmax(np.abs(one))  # the seed matters


def test_gram_pass_under_fsdp2(tmp_path) -> None:
    """verl's strategy=fsdp2 wraps the actor with torch's fully_shard: same rows."""
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        data = _data(3)
        expected = _brute_rows(_model(3), data)
        model = _model(3)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        _close(integration.compute_gram_rows(model, data, max_token_len=20), expected)
    finally:
        dist.destroy_process_group()


def test_bad_batches_are_named() -> None:
    model = _model()
    data = _data()
    missing = data.select(batch_keys=["input_ids", "attention_mask", "position_ids",
                                      "responses"])
    with pytest.raises(ValueError, match=r"batch\['response_mask'\]"):
        integration.compute_gram_rows(model, missing)
    no_uid = DataProto.from_dict(tensors=dict(data.batch.items()))
    with pytest.raises(ValueError, match="uid"):
        integration.compute_gram_rows(model, no_uid)
    with pytest.raises(ValueError, match="max_token_len"):
        integration.compute_gram_rows(model, data, max_token_len=0)
    with pytest.raises(ValueError, match="width"):
        integration.compute_gram_rows(model, data, width=2)


def test_worker_settings_follow_the_actor_config() -> None:
    actor = {"loss_agg_mode": "seq-mean-token-mean", "loss_scale_factor": None,
             "ppo_micro_batch_size_per_gpu": 2, "use_dynamic_bsz": False,
             "ppo_max_token_len_per_gpu": 999}
    meta = {"temperature": 0.7, "advcal_longest": 7, "advcal_batch_num_tokens": 30.0,
            "advcal_global_batch_size": 9.0, "advcal_gram_width": 4}
    settings = verl_actor._gram_settings({"gram_sketch_dim": 64, "gram_layers": "lora"},
                                          actor, meta)
    assert settings == {"layers": "lora", "sketch_dim": 64, "seed": 0, "sketch": "gaussian",
                        "loss_agg_mode": "seq-mean-token-mean", "loss_scale_factor": None,
                        "max_token_len": 14, "temperature": 0.7, "batch_num_tokens": 30.0,
                        "global_batch_size": 9.0, "width": 4}
    dynamic = verl_actor._gram_settings({}, dict(actor, use_dynamic_bsz=True), meta)
    assert dynamic["max_token_len"] == 999 and dynamic["sketch_dim"] is None
    chosen = verl_actor._gram_settings({"gram_max_token_len": 50, "loss_agg_mode": "token-sum"},
                                        actor, meta)
    assert chosen["max_token_len"] == 50 and chosen["loss_agg_mode"] == "token-sum"


def test_worker_without_an_actor_model_is_named() -> None:
    with pytest.raises(ValueError, match="advcal_module"):
        verl_actor._actor_of(object())


# ------------------------------------------------------------------ SetGRPO in verl


def test_setgrpo_advantages_from_the_gram_pass(tmp_path) -> None:
    model = _model(4)
    data = _data(4)
    rng = np.random.default_rng(5)
    clean = rng.uniform(0, 1, (300, 4))
    calibration = advcal.calibrate_sets(clean + rng.normal(0, 0.02, clean.shape),
                                        clean + rng.normal(0, 0.02, clean.shape), alpha=0.2)
    path = tmp_path / "sets.npz"
    advcal.save_calibration(path, calibration)
    # the Gram pass's options ride along with the estimator's and do not reach it
    integration.configure("setgrpo", calibration=str(path), tau=0.3, gram_sketch_dim=None,
                          loss_agg_mode="token-mean")
    scores = np.round(rng.uniform(0, 1, UIDS.size), 2).astype(np.float32)
    lengths = data.batch["response_mask"].sum(-1).numpy()
    token_rewards = np.zeros((UIDS.size, R), dtype=np.float32)
    token_rewards[np.arange(UIDS.size), lengths - 1] = scores
    data.batch["token_level_rewards"] = torch.as_tensor(token_rewards)
    data.batch[verl_config.GRAM_KEY] = torch.as_tensor(
        integration.compute_gram_rows(model, data))
    original = ray_trainer.compute_advantage
    try:
        integration.patch_compute_advantage()
        out = ray_trainer.compute_advantage(data, "setgrpo")
    finally:
        ray_trainer.compute_advantage = original
        del ray_trainer._advcal_original_compute_advantage
    brute = _brute_rows(model, data)
    expected = advcal.setgrpo(scores.astype(np.float64), group_ids=UIDS,
                              gram=integration.gram_blocks(brute, UIDS),
                              calibration=calibration, tau=0.3).coefficients
    mask = data.batch["response_mask"].numpy().astype(bool)
    np.testing.assert_allclose(out.batch["advantages"].numpy(),
                               np.where(mask, expected.astype(np.float32)[:, None], 0),
                               rtol=1e-6, atol=1e-7)  # float32 advantages


# ------------------------------------------------------------------ regrouping for ranks


def test_whole_group_order_gives_each_rank_whole_groups() -> None:
    uids = np.array(list("abcdabcdbadc"), dtype=object)  # four groups of 3
    for ranks in (2, 4):
        order = verl_actor._whole_group_order(uids, ranks)
        assert sorted(order.tolist()) == list(range(uids.size))
        share = uids.size // ranks
        for k in range(ranks):
            part = uids[order[k * share:(k + 1) * share]]
            for label in set(part):
                assert np.sum(part == label) == 3  # whole groups only
    uneven = np.array(list("abcabcabcabc"), dtype=object)  # three groups of 4
    with pytest.raises(ValueError, match="data.train_batch_size"):
        verl_actor._whole_group_order(uneven, 2)
    with pytest.raises(ValueError, match="not a multiple of 5"):
        verl_actor._whole_group_order(uids, 5)


# ------------------------------------------------------------------ verl's single controller

from verl.single_controller.base import Worker  # noqa: E402
from verl.single_controller.base.decorator import (  # noqa: E402
    make_nd_compute_dataproto_dispatch_fn,
    register,
)


class TinyActor(Worker):
    """A CPU stand-in for verl's ActorRolloutRefWorker (which needs an accelerator): the
    tiny Llama as the actor model, the actor mesh's dispatch info, and a compute_log_prob
    in the model engine's output format (nested per-token tensors; zeros here)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._register_dispatch_collect_info("actor", dp_rank=self.rank, is_collect=True)
        self.advcal_module = _model(seed)
        self.received: list[list[str]] = []

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data):
        from verl.utils import tensordict_utils as tu

        ids = data["input_ids"]
        zeros = torch.nested.nested_tensor_from_jagged(
            torch.zeros(ids.values().shape, dtype=torch.float32), offsets=ids.offsets())
        return tu.get_tensordict(tensor_dict={"log_probs": zeros, "entropy": zeros.clone()},
                                 non_tensor_dict={"metrics": {"mfu": 0.0}})


@pytest.fixture(scope="module")
def worker_group():
    """verl's RayWorkerGroup of two CPU ranks, built from gram_worker_class(TinyActor)."""
    ray = pytest.importorskip("ray")
    import os
    import shutil
    import tempfile

    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # socket paths under 107 bytes
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "VERL_USE_EXTERNAL_PLUGINS")}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, saved["PYTHONPATH"]]))
    os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"  # the workers import the module itself
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    try:
        pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
        cls = RayClassWithInitArgs(cls=ray.remote(integration.gram_worker_class(TinyActor)),
                                   seed=0)
        yield RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls)
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


SPLIT = np.array(list("abcdabcdbadc"), dtype=object)  # verl's chunk(2) splits every group


def test_worker_method_over_two_ranks_with_split_groups(worker_group) -> None:
    data = _data(5, SPLIT)
    expected = integration.compute_gram_rows(_model(0), data)
    rows = integration.gram_from_workers(worker_group, data)
    _close(rows.numpy(), expected)
    # dispatched as it comes, each rank sees half of every group: not the groups' Gram
    naive = worker_group.compute_advcal_gram(data.select(
        batch_keys=list(verl_config.GRAM_FIELDS), non_tensor_batch_keys=["uid"]))
    assert naive.batch[verl_config.GRAM_KEY].shape[1] < expected.shape[1]
    with pytest.raises(ValueError, match="data.train_batch_size"):
        integration.gram_from_workers(worker_group,
                                      _data(5, np.array(list("abcabcabcabc"), dtype=object)))


def test_trainer_hook_between_old_log_prob_and_compute_advantage(worker_group, tmp_path
                                                                 ) -> None:
    """install()'s wrapper of verl's own RayPPOTrainer._compute_old_log_prob attaches the
    rows, which reach setgrpo through verl's compute_advantage."""
    from omegaconf import OmegaConf

    trainer_cls = ray_trainer.RayPPOTrainer
    saved = (trainer_cls.init_workers, trainer_cls._compute_old_log_prob,
             ray_trainer.compute_advantage)
    try:
        integration.install()
        integration.install()  # idempotent
        trainer = type("Trainer", (), {})()
        trainer.config = OmegaConf.create({
            "algorithm": {"adv_estimator": "setgrpo"},
            "actor_rollout_ref": {"actor": {}, "rollout": {"temperature": 1.0}}})
        trainer.actor_rollout_wg = worker_group
        batch = _data(6, SPLIT)
        old, _ = trainer_cls._compute_old_log_prob(trainer, batch)
        expected = integration.compute_gram_rows(_model(0), batch)
        _close(old.batch[verl_config.GRAM_KEY].numpy(), expected)
        batch = batch.union(old)  # as fit() does
        rng = np.random.default_rng(7)
        clean = rng.uniform(0, 1, (300, 3))
        calibration = advcal.calibrate_sets(clean + rng.normal(0, 0.02, clean.shape),
                                            clean + rng.normal(0, 0.02, clean.shape),
                                            alpha=0.2)
        integration.configure("setgrpo", calibration=calibration, tau=0.3)
        scores = np.round(rng.uniform(0, 1, SPLIT.size), 2).astype(np.float32)
        rewards = torch.zeros(SPLIT.size, R)
        rewards[:, 0] = torch.as_tensor(scores)
        batch.batch["token_level_rewards"] = rewards
        out = ray_trainer.compute_advantage(batch, "setgrpo")
        coefficients = advcal.setgrpo(
            scores.astype(np.float64), group_ids=SPLIT,
            gram=integration.gram_blocks(expected, SPLIT), calibration=calibration,
            tau=0.3).coefficients
        np.testing.assert_allclose(out.batch["advantages"][:, 0].numpy(), coefficients,
                                   rtol=1e-6, atol=1e-7)  # float32 advantages
        # another estimator: no Gram pass
        trainer.config.algorithm.adv_estimator = "grpo"
        old, _ = trainer_cls._compute_old_log_prob(trainer, _data(6, SPLIT))
        assert verl_config.GRAM_KEY not in old.batch.keys()
    finally:
        trainer_cls.init_workers, trainer_cls._compute_old_log_prob = saved[:2]
        ray_trainer.compute_advantage = saved[2]
        for obj, name in ((trainer_cls, "_advcal_installed"),
                          (ray_trainer, "_advcal_original_compute_advantage")):
            if hasattr(obj, name):
                delattr(obj, name)


def test_actor_roles_get_the_gram_worker() -> None:
    ray = pytest.importorskip("ray")
    mapping = {ray_trainer.Role.ActorRollout: ray.remote(TinyActor),
               ray_trainer.Role.Critic: ray.remote(TinyActor)}
    verl_actor._use_gram_workers(mapping)
    built = mapping[ray_trainer.Role.ActorRollout].__ray_metadata__.modified_class
    assert issubclass(built, integration.GramWorkerMixin) and issubclass(built, TinyActor)
    critic = mapping[ray_trainer.Role.Critic].__ray_metadata__.modified_class
    assert not issubclass(critic, integration.GramWorkerMixin)
    assert integration.gram_worker_class(TinyActor) is integration.gram_worker_class(TinyActor)


def test_options_in_the_environment_install_the_hooks() -> None:
    """verl loads advcal as a plugin in every process; with a "setgrpo" entry in
    ADVCAL_VERL_OPTIONS that import installs the trainer hooks."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, VERL_USE_EXTERNAL_PLUGINS="none",
               VERL_USE_EXTERNAL_MODULES="advcal.integrations.verl",
               ADVCAL_VERL_OPTIONS=json.dumps({"setgrpo": {"gram_sketch_dim": 64}}))
    code = ("import verl.trainer.ppo.ray_trainer as rt; "
            "print(getattr(rt.RayPPOTrainer, '_advcal_installed', False), "
            "rt.compute_advantage.__module__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()
    assert out[-2] == "True" and out[-1].startswith("advcal.integrations.verl")
