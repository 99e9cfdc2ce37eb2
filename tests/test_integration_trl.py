"""advcal.integrations.trl against a real TRL GRPOTrainer on a tiny local Llama (CPU)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import advcal
from advcal.integrations.trl import TRL_EPS, trl_rewards

# -- TRL's reward combination, hand-derived ---------------------------------------------------


def test_sum_then_normalize_drops_unscorable_rows() -> None:
    per_func = np.array([[1.0, np.nan], [np.nan, np.nan], [0.5, 2.0], [np.nan, 1.0]])
    out = trl_rewards(per_func, np.array([1.0, 0.5]), "sum_then_normalize", 2)
    np.testing.assert_array_equal(out, [[1.0, np.nan], [1.5, 0.5]])


def test_normalize_then_sum_normalizes_each_function_within_its_group() -> None:
    per_func = np.array([[0.0, 1.0], [2.0, 1.0], [1.0, 3.0], [1.0, 5.0]])
    out = trl_rewards(per_func, np.array([1.0, 2.0]), "normalize_then_sum", 2)
    # group 1: f1 = (-1, 1)/(sqrt 2 + eps), f2 constant -> 0; group 2: f1 -> 0, f2 = (-1, 1)·...
    s = np.sqrt(2.0) + TRL_EPS
    np.testing.assert_allclose(out, [[-1 / s, 1 / s], [-2 / s, 2 / s]], rtol=1e-15)


def test_unknown_aggregation_is_refused() -> None:
    with pytest.raises(ValueError, match="aggregation"):
        trl_rewards(np.zeros((2, 1)), np.ones(1), "mean", 2)


# -- a real trainer ---------------------------------------------------------------------------

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from packaging.version import Version  # noqa: E402

from advcal.integrations.trl import AdvcalGRPOMixin  # noqa: E402
from tests.tiny_llm import llama_config, word_tokenizer  # noqa: E402

G = 4
# TRL leaves a completion whose reward functions all returned None out of its group from 1.6
# on; before, its nansum counted it as reward 0 (advcal leaves it out on every version).
TRL_LEAVES_UNSCORABLE_OUT = Version(trl.__version__) >= Version("1.6")
# TRL's fused LM head, below which the Gram's backward starts, came later.
TRL_FUSED_HEAD = importlib.util.find_spec("trl.kernels") is not None


def _model(tok):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(llama_config(tok))


def _length_reward(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def _spread_reward(completions, **kwargs):
    # distinct rewards within a group, deterministic in the text
    return [(sum(map(ord, c)) * 7919 % 1009) / 1009 for c in completions]


def _sometimes_none(completions, **kwargs):
    # None for every third completion: TRL leaves those out of their group.
    return [None if i % 3 == 0 else float(len(c) % 4) for i, c in enumerate(completions)]


class _Recording(AdvcalGRPOMixin, trl.GRPOTrainer):
    """Records, per batch, advcal's and TRL's advantages and the advantages in the loss."""

    def __init__(self, *args, **kwargs):
        self.batches: list[dict] = []
        self.in_loss: list[tuple[np.ndarray, np.ndarray]] = []
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        n = output["advantages"].shape[0]
        self.batches.append({
            "rewards_per_func": self._advcal_rewards_per_func.detach().cpu().numpy(),
            "advcal": output["advantages"].detach().cpu().numpy().copy(),
            "trl": self.trl_advantages.cpu().numpy(),
        })
        output["row"] = torch.arange(n)  # travels through TRL's shuffle into the loss
        return output

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        self.in_loss.append((inputs["row"].cpu().numpy(),
                             inputs["advantages"].detach().cpu().numpy().copy()))
        return loss


def _train(reward_funcs=_length_reward, steps=2, **advcal_kwargs):
    tok = word_tokenizer()
    dataset = datasets.Dataset.from_dict({"prompt": ["a b c", "d e f", "g h", "i j k l"] * 4})
    config = trl.GRPOConfig(
        output_dir=None, per_device_train_batch_size=8, num_generations=G,
        max_completion_length=6, max_steps=steps, report_to=[], use_cpu=True,
        save_strategy="no", learning_rate=1e-2, logging_steps=1, seed=0,
        disable_tqdm=True)
    trainer = _Recording(model=_model(tok), reward_funcs=reward_funcs, args=config,
                         train_dataset=dataset, processing_class=tok, **advcal_kwargs)
    trainer.train()
    return trainer


def _combined(batch, trainer):
    return trl_rewards(batch["rewards_per_func"], trainer.reward_weights.numpy(),
                       trainer.multi_objective_aggregation, G)


def _float32_tolerance(batch, trainer):
    """How far TRL's float32 (r − μ)/(σ + eps) may lie from advcal's, per response.

    In float32 (u = 2^-24), over σ: the summed reward errs by u·max|r|, the mean by
    G·u·max|r|, r − μ by 2u·max|r|; the std's relative error ≲ G·u·κ scales |A| ≤ 1.5;
    the rest (eps, the division, advcal's rounding) a few u.  In all ≲ (3G + 2)·u·(1 + κ)
    with κ = max|r|/σ per group (a constant group gives 0 in both).
    """
    grouped = _combined(batch, trainer)
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.nanstd(grouped, axis=1, ddof=1)
        kappa = np.nanmax(np.abs(grouped), axis=1, initial=0.0) / sd
    kappa = np.where(np.isfinite(kappa), kappa, 0.0)
    return np.repeat((3 * G + 2) * 2.0**-24 * (1 + kappa), G)


def _check_loss_sees_advcal(trainer):
    assert len(trainer.in_loss) == len(trainer.batches) >= 2
    for batch, (rows, in_loss) in zip(trainer.batches, trainer.in_loss, strict=True):
        np.testing.assert_array_equal(in_loss, batch["advcal"][rows].astype(np.float32))


@pytest.fixture(scope="module")
def grpo_run():
    return _train(reward_funcs=[_length_reward, _sometimes_none], advantage="grpo")


def test_grpo_mode_equals_trls_own_advantages(grpo_run) -> None:
    for batch in grpo_run.batches:
        np.testing.assert_array_less(np.abs(batch["advcal"] - batch["trl"]),
                                     _float32_tolerance(batch, grpo_run))
    _check_loss_sees_advcal(grpo_run)


def test_all_none_completion_gets_zero_and_leaves_the_group() -> None:
    def only_sometimes(completions, **kwargs):
        return [None if i % 3 == 0 else len(c) / 10 for i, c in enumerate(completions)]

    run = _train(reward_funcs=only_sometimes, steps=2, advantage="grpo")
    for batch in run.batches:
        rewards = batch["rewards_per_func"][:, 0]
        none = np.isnan(rewards)
        assert none.any()
        np.testing.assert_array_equal(batch["advcal"][none], 0.0)
        if TRL_LEAVES_UNSCORABLE_OUT:
            np.testing.assert_array_less(np.abs(batch["advcal"] - batch["trl"]),
                                         _float32_tolerance(batch, run))
        # the group statistics of the others leave the None completions out
        grouped = rewards.reshape(-1, G)
        expected = advcal.grpo(grouped, eps=TRL_EPS, nan_policy="omit").ravel()
        # advcal's float64 advantages rounded to TRL's float32: half an ulp of |A| < 2
        np.testing.assert_allclose(batch["advcal"], expected, rtol=0, atol=2.0**-24)


@pytest.mark.parametrize(("mode", "options"), [
    ("dr_grpo", {}),
    ("rloo", {}),
    ("maxnorm", {"tau_res": 0.05, "bounds": (0.0, 2.0)}),
])
def test_point_modes_put_advcals_advantages_into_the_loss(mode, options) -> None:
    run = _train(advantage=mode, advantage_options=options)
    for batch in run.batches:
        rewards = _combined(batch, run)
        expected = advcal.advantages(rewards, method=mode, **options).ravel()
        # computed in float64, handed to TRL in its float32
        np.testing.assert_array_equal(batch["advcal"], expected.astype(np.float32))
    _check_loss_sees_advcal(run)
    logged = run.state.log_history[0]
    assert "advcal/inverse_scale_p95" in logged and "advcal/zero_gap_fraction" in logged


def test_range_mode_uses_conformal_ranges(tmp_path) -> None:
    rng = np.random.default_rng(0)
    reference = rng.uniform(0, 1, 200)
    judge = np.clip(reference + rng.normal(0, 0.05, 200), 0, 1)
    calibration = advcal.calibrate_ranges(judge, reference, alpha=0.2, bounds=(0.0, 1.0))
    path = tmp_path / "ranges.npz"
    advcal.save_calibration(path, calibration)
    run = _train(advantage="range", calibration=str(path))
    for batch in run.batches:
        scores = _combined(batch, run)
        ranges = calibration.ranges(scores.ravel())
        expected = advcal.range_advantages(ranges.lo.reshape(-1, G), ranges.hi.reshape(-1, G))
        np.testing.assert_array_equal(batch["advcal"], expected.ravel().astype(np.float32))
    _check_loss_sees_advcal(run)
    assert run.state.log_history[0]["advcal/range_width_mean"] > 0


TAU = 0.3


def test_setgrpo_mode_uses_a_real_gram_and_a_loaded_calibration(tmp_path, monkeypatch) -> None:
    import advcal.integrations.trl as integration

    starts = []  # the Gram's backward starts below TRL's fused head (and K is checked)

    def head_start(objectives, real=integration.head_start):
        starts.append(real(objectives))
        return starts[-1]

    monkeypatch.setattr(integration, "head_start", head_start)
    rng = np.random.default_rng(1)
    clean = rng.uniform(0, 1, (300, G))
    # noisy graders: sets wide enough that the gate binds on some groups
    a = clean + rng.normal(0, 0.1, clean.shape)
    b = clean + rng.normal(0, 0.1, clean.shape)
    calibration = advcal.calibrate_sets(a, b, alpha=0.2)
    path = tmp_path / "sets.npz"
    advcal.save_calibration(path, calibration)
    # TRL computes log-probabilities through a fused LM head, which never calls lm_head.
    layers = ["model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj"]

    class Checked(_Recording):
        def _compute_loss(self, model, inputs):
            # brute force: each response's objective gradient over the captured weights
            from advcal.torch import response_objectives

            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            logps = trl.GRPOTrainer._get_per_token_logps_and_entropies(
                self, model, ids, att, inputs["completion_ids"].size(1))[0]
            objectives = response_objectives(  # the trainer's loss normalisation
                logps, inputs["completion_mask"], loss_type=self.loss_type,
                max_completion_length=self.max_completion_length,
                num_items_in_batch=inputs.get("num_items_in_batch"))
            params = [model.get_submodule(name).weight for name in layers]
            grads = [torch.cat([g.reshape(-1) for g in torch.autograd.grad(
                j, params, retain_graph=True)]) for j in objectives]
            flat = torch.stack(grads).double()
            gram = (flat @ flat.T).numpy()
            groups = inputs["advcal_group"].numpy()
            rewards = inputs["advcal_rewards"].numpy().astype(np.float64)
            # TRL shuffled the batch: gather each group's rows and columns
            order = np.argsort(groups, kind="stable")
            blocks = [gram[np.ix_(order[i:i + G], order[i:i + G])].ravel()
                      for i in range(0, groups.size, G)]
            result = advcal.setgrpo(rewards[order], advcal.offsets_from_sizes(
                [G] * (groups.size // G)), gram=np.concatenate(blocks),
                calibration=calibration, tau=TAU)
            expected = result.coefficients
            self.etas.extend(result.eta.tolist())
            # the Gram matters: with K = I the coefficients would differ
            plain = advcal.setgrpo(rewards[order], advcal.offsets_from_sizes(
                [G] * (groups.size // G)), gram=np.concatenate([np.eye(G).ravel()] * (
                    groups.size // G)), calibration=calibration, tau=TAU).coefficients
            self.gram_mattered |= not np.allclose(plain, expected)
            loss = super()._compute_loss(model, inputs)
            got = inputs["advantages"].detach().numpy()[order]
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
            self.checked = getattr(self, "checked", 0) + 1
            return loss

    tok = word_tokenizer()
    dataset = datasets.Dataset.from_dict({"prompt": ["a b c", "d e f", "g h", "i j k l"] * 4})
    config = trl.GRPOConfig(
        output_dir=None, per_device_train_batch_size=8, num_generations=G,
        max_completion_length=6, max_steps=2, report_to=[], use_cpu=True,
        save_strategy="no", learning_rate=1e-2, logging_steps=1, seed=0, disable_tqdm=True)
    trainer = Checked(model=_model(tok), reward_funcs=_spread_reward, args=config,
                      train_dataset=dataset, processing_class=tok, advantage="setgrpo",
                      calibration=str(path), tau=TAU, gram_layers=layers)
    trainer.etas, trainer.gram_mattered = [], False
    trainer.train()
    assert trainer.checked == 2
    assert len(starts) == 2
    assert all((start is not None) == TRL_FUSED_HEAD for start in starts)
    # some groups pass the gate and some do not, and K decided it
    assert 0 < sum(eta > 0 for eta in trainer.etas) < len(trainer.etas)
    assert trainer.gram_mattered
    logged = trainer.state.log_history[0]
    assert 0 <= logged["advcal/accepted_fraction"] <= 1
    assert logged["advcal/tau"] == TAU


def test_setgrpo_at_generation_refuses_a_per_step_token_count() -> None:
    tok = word_tokenizer()
    dataset = datasets.Dataset.from_dict({"prompt": ["a b c", "d e f"] * 4})
    config = trl.GRPOConfig(
        output_dir=None, per_device_train_batch_size=4, num_generations=G,
        steps_per_generation=2, max_completion_length=4, max_steps=1, report_to=[],
        use_cpu=True, save_strategy="no", loss_type="bnpo")
    calibration = advcal.calibrate_sets(np.eye(G) + 0.1, np.eye(G), alpha=0.5)
    with pytest.raises(ValueError, match="steps_per_generation > 1.*bnpo"):
        _Recording(model=_model(tok), reward_funcs=_length_reward, args=config,
                   train_dataset=dataset, processing_class=tok, advantage="setgrpo",
                   calibration=calibration, tau=0.1)


@pytest.mark.parametrize("per_device", [4, 2])
def test_setgrpo_at_generation_when_steps_split_the_groups(per_device: int) -> None:
    # steps_per_generation > 1: TRL shuffles each generation batch of 8 (two groups) over
    # 2 or 4 steps of the loss, so K comes from the generation-time Gram pass (whole groups
    # per forward, one group per forward however small the loss's batches).
    rng = np.random.default_rng(1)
    clean = rng.uniform(0, 1, (300, G))
    calibration = advcal.calibrate_sets(clean + rng.normal(0, 0.1, clean.shape),
                                        clean + rng.normal(0, 0.1, clean.shape), alpha=0.2)
    layers = ["model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj"]

    class Checked(_Recording):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            from advcal.torch import response_objectives

            net = self.accelerator.unwrap_model(self.model)
            ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            att = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            logps = trl.GRPOTrainer._get_per_token_logps_and_entropies(
                self, net, ids, att, output["completion_ids"].size(1))[0]
            objectives = response_objectives(  # dapo: the step's token count, any split
                logps, output["completion_mask"], loss_type="dapo",
                num_items_in_batch=output["num_items_in_batch"])
            params = [net.get_submodule(name).weight for name in layers]
            flat = torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(
                j, params, retain_graph=True)]) for j in objectives]).double().numpy()
            k = flat @ flat.T
            n = k.shape[0]
            blocks = np.concatenate([k[q:q + G, q:q + G].ravel() for q in range(0, n, G)])
            result = advcal.setgrpo(output["advcal_rewards"].numpy().astype(np.float64),
                                    advcal.offsets_from_sizes([G] * (n // G)), gram=blocks,
                                    calibration=calibration, tau=TAU)
            np.testing.assert_allclose(output["advantages"].numpy(), result.coefficients,
                                       rtol=1e-4, atol=1e-6)
            self.checked = getattr(self, "checked", 0) + 1
            return output

    tok = word_tokenizer()
    dataset = datasets.Dataset.from_dict({"prompt": ["a b c", "d e f", "g h", "i j k l"] * 4})
    config = trl.GRPOConfig(
        output_dir=None, per_device_train_batch_size=per_device, num_generations=G,
        steps_per_generation=8 // per_device, max_completion_length=6, max_steps=4,
        report_to=[], use_cpu=True, save_strategy="no", learning_rate=1e-2, logging_steps=1,
        seed=0, disable_tqdm=True, loss_type="dapo", bf16=False)
    trainer = Checked(model=_model(tok), reward_funcs=_spread_reward, args=config,
                      train_dataset=dataset, processing_class=tok, advantage="setgrpo",
                      calibration=calibration, tau=TAU, gram_layers=layers)
    trainer.train()
    steps = 8 // per_device
    assert trainer.checked == 4 // steps
    # the loss uses those coefficients, each row after TRL's shuffle over the steps
    for index, batch in enumerate(trainer.batches):
        seen = np.zeros(8, dtype=bool)
        for rows, in_loss in trainer.in_loss[index * steps:(index + 1) * steps]:
            np.testing.assert_array_equal(in_loss, batch["advcal"][rows])
            seen[rows] = True
        assert seen.all()


class _FakeCapture:
    """A Gram matrix over every response, handed out in the layout GradientCapture.gram
    documents (flat blocks; groups in order of first appearance, rows in batch order)."""

    def __init__(self, full: np.ndarray) -> None:
        self.full = full

    def gram(self, objectives, offsets=None, group_ids=None, *, start=None):
        from advcal.layouts import GroupIndex

        assert start is None  # no fused head in these tests
        if offsets is not None:
            members = [np.arange(a, b) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        else:
            index = group_ids if isinstance(group_ids, GroupIndex) else \
                advcal.groups_from_ids(group_ids)
            members = [index.order[a:b] for a, b in zip(index.offsets[:-1], index.offsets[1:],
                                                        strict=True)]
        return np.concatenate([self.full[np.ix_(m, m)].ravel() for m in members])


def _set_calibration(rng: np.random.Generator, **options) -> advcal.SetCalibration:
    clean = rng.uniform(0, 1, (300, G))
    return advcal.calibrate_sets(clean + rng.normal(0, 0.1, clean.shape),
                                 clean + rng.normal(0, 0.1, clean.shape), alpha=0.2, **options)


def _setgrpo_state(calibration, parent: type = object, **settings):
    """The mixin in setgrpo mode over ``parent``, with the trainer attributes it reads."""
    import collections
    import types

    from advcal.integrations.trl import _settings_iv

    state = object.__new__(type("State", (AdvcalGRPOMixin, parent), {}))
    state._advcal = _settings_iv("setgrpo", None, calibration, TAU, settings.get("layers"),
                                 None, 0)
    state.loss_type, state.max_completion_length = "grpo", 3
    state.accelerator = types.SimpleNamespace(num_processes=1, unwrap_model=lambda m: m)
    state._metrics = {"train": collections.defaultdict(list)}
    return state


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("unscorable", [(), (1, 6, 7)])
def test_setgrpo_coefficients_of_whole_and_shuffled_batches(shuffled, unscorable) -> None:
    # In order (as generated) or shuffled (as TRL hands batches to the loss), with or
    # without None rewards: the coefficients are advcal.setgrpo's on what is left of each
    # group, and 0 for an unscorable completion.
    rng = np.random.default_rng(4)
    calibration = _set_calibration(rng)
    n = 3 * G
    perm = rng.permutation(n) if shuffled else np.arange(n)
    groups = np.repeat(np.arange(3), G)[perm]
    rewards = rng.uniform(0, 1, n).astype(np.float32).astype(np.float64)
    rewards[list(unscorable)] = np.nan
    features = rng.normal(size=(n, 5))
    full = features @ features.T

    state = _setgrpo_state(calibration)
    inputs = {"completion_mask": torch.ones(n, 3), "advcal_group": torch.as_tensor(groups),
              "advcal_rewards": torch.as_tensor(rewards, dtype=torch.float32)}
    logps = torch.zeros(n, 3, requires_grad=True)
    got = state._setgrpo_coefficients(_FakeCapture(full), inputs, logps).numpy()

    index = advcal.groups_from_ids(groups)
    kept = [m[~np.isnan(rewards[m])] for m in (index.order[a:b] for a, b in zip(
        index.offsets[:-1], index.offsets[1:], strict=True))]
    rows = np.concatenate(kept)
    result = advcal.setgrpo(rewards[rows], advcal.offsets_from_sizes([m.size for m in kept]),
                            gram=np.concatenate([full[np.ix_(m, m)].ravel() for m in kept]),
                            calibration=calibration, tau=TAU)
    expected = np.zeros(n)
    expected[rows] = result.coefficients
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert (got[list(unscorable)] == 0).all() and np.abs(got).max() > 0
    assert state._metrics["train"]["advcal/accepted_fraction"]


def test_setgrpo_refuses_infinite_rewards() -> None:
    rng = np.random.default_rng(5)
    state = _setgrpo_state(_set_calibration(rng))
    rewards = rng.uniform(0, 1, 2 * G)
    rewards[3] = np.inf
    inputs = {"completion_mask": torch.ones(2 * G, 3),
              "advcal_group": torch.arange(2 * G) // G,
              "advcal_rewards": torch.as_tensor(rewards)}
    with pytest.raises(ValueError, match="rewards must be finite"):
        state._setgrpo_coefficients(_FakeCapture(np.eye(2 * G)), inputs,
                                    torch.zeros(2 * G, 3, requires_grad=True))


@pytest.mark.parametrize(("tau", "options", "match"), [
    (1.0, {}, "`tau` must lie in"),
    (-0.1, {}, "`tau` must lie in"),
    ([0.2], {}, "`tau` must be a real number"),
    (0.2, {"noise": "diagonal", "noise_var": np.full((300, G), 1e-2)}, "noise='isotropic'"),
])
def test_setgrpo_settings_are_checked_at_init(tau, options, match) -> None:
    from advcal.integrations.trl import _settings_iv

    calibration = _set_calibration(np.random.default_rng(6), **options)
    with pytest.raises((ValueError, TypeError), match=match):
        _settings_iv("setgrpo", None, calibration, tau, None, None, 0)


def test_setgrpo_resolves_its_layers_once_per_model_structure() -> None:
    # The Gram's layers are resolved at the first loss and reused; freezing a layer or
    # replacing a module resolves them again.
    seen = []

    class Parent:
        def _compute_loss(self, model, inputs):
            seen.append(self._advcal_capture.layers)
            return model(inputs["x"]).sum()

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    state = _setgrpo_state(_set_calibration(np.random.default_rng(7)), Parent)
    inputs = {"x": torch.randn(2, 3)}
    state._compute_loss(model, inputs)
    first = state._advcal_selection
    state._compute_loss(model, inputs)
    assert state._advcal_selection is first
    model[0].requires_grad_(False)
    state._compute_loss(model, inputs)
    model[2] = torch.nn.Linear(4, 1)
    state._compute_loss(model, inputs)
    assert state._advcal_selection is not first
    assert seen == [["0", "2"], ["0", "2"], ["2"], ["2"]]
    assert state._advcal_selection.layers[0].module is model[2]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"advantage": "bogus"}, "advantage"),
    ({"advantage": "range"}, "RangeCalibration"),
    ({"advantage": "setgrpo"}, "SetCalibration"),
    ({"advantage": "maxnorm"}, "tau_res"),
    ({"advantage": "grpo", "tau": 0.1}, "tau"),
    ({"advantage": "grpo", "advantage_options": {"tau_res": 0.1}}, "no option 'tau_res'"),
    ({"advantage": "range", "advantage_options": {"eps": 0.1}}, "RangeCalibration"),
])
def test_bad_settings_name_the_argument(kwargs, match) -> None:
    tok = word_tokenizer()
    dataset = datasets.Dataset.from_dict({"prompt": ["a b c"] * 4})
    config = trl.GRPOConfig(output_dir=None, per_device_train_batch_size=4, num_generations=G,
                            max_steps=1, report_to=[], use_cpu=True, save_strategy="no")
    with pytest.raises((ValueError, TypeError), match=match):
        _Recording(model=_model(tok), reward_funcs=_length_reward, args=config,
                   train_dataset=dataset, processing_class=tok, **kwargs)


def _trls_own_advantages(rewards_per_func, weights, aggregation, scaling, group_size):
    """TRL's advantages by the lines of the installed ``GRPOTrainer`` itself, from its
    unscorable mask to its local slice (not a copy of its formulas), in float64: in
    TRL's float32 a group of close rewards loses digits that the test is not about."""
    import inspect
    import textwrap
    from types import SimpleNamespace

    from trl.trainer.utils import nanstd

    lines = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions).splitlines()
    first = next(i for i, line in enumerate(lines)
                 if "unscorable_mask = torch.isnan(rewards_per_func)" in line)
    last = next(i for i, line in enumerate(lines)
                if "advantages = advantages[process_slice]" in line)
    n, n_funcs = rewards_per_func.shape
    trainer = SimpleNamespace(
        reward_weights=torch.tensor(weights, dtype=torch.float64),
        multi_objective_aggregation=aggregation, scale_rewards=scaling,
        reward_funcs=[None] * n_funcs, accelerator=SimpleNamespace(process_index=0))
    namespace = {"self": trainer, "torch": torch, "nanstd": nanstd, "device": "cpu",
                 "rewards_per_func": torch.tensor(rewards_per_func, dtype=torch.float64),
                 "num_generations": group_size, "prompts": [None] * n}
    exec(textwrap.dedent("\n".join(lines[first:last + 1])), namespace)
    return namespace["advantages"].numpy()


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("scaling", ["group", "batch", "none"])
@pytest.mark.skipif(not TRL_LEAVES_UNSCORABLE_OUT,
                    reason="this TRL counts a completion with no reward as reward 0")
def test_grpo_mode_equals_trls_own_code_with_none_rewards(aggregation, scaling) -> None:
    from advcal.integrations.trl import _settings_iv

    rng = np.random.default_rng(0)
    weights = np.array([1.0, 0.5])
    mixin = object.__new__(AdvcalGRPOMixin)
    mixin._advcal = _settings_iv("grpo", None, None, None, None, None, 0)
    mixin.multi_objective_aggregation = aggregation
    mixin.scale_rewards = scaling
    for trial in range(20):
        n_groups, g = int(rng.integers(1, 12)), int(rng.integers(2, 7))
        per_func = np.round(rng.uniform(0, 1, (n_groups * g, 2)), 2)
        # None from one function, from the other, or from both (the row leaves its group)
        per_func[rng.uniform(size=per_func.shape) < (0.0, 0.1, 0.4)[trial % 3]] = np.nan
        expected = _trls_own_advantages(per_func, weights, aggregation, scaling, g)
        got, _ = mixin._advcal_advantages(trl_rewards(per_func, weights, aggregation, g))
        np.testing.assert_allclose(got.ravel(), expected, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(got.ravel()[np.isnan(per_func).all(axis=1)], 0.0)
