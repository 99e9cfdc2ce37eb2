"""advcal.integrations.verl against a real verl install: DataProto, compute_advantage, Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest

import advcal

torch = pytest.importorskip("torch")
verl = pytest.importorskip("verl")
ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # noqa: E402

from advcal.integrations import verl as integration  # noqa: E402
from advcal.integrations.verl import _config as verl_config  # noqa: E402

G, T = 4, 5
UIDS = np.array(["p", "q", "p", "r", "q", "p", "r", "q", "r", "p", "q", "r"], dtype=object)


def _data(scores: np.ndarray, lengths: np.ndarray) -> DataProto:
    """A verl batch: the sequence reward at each response's last token, as verl places it."""
    n = scores.size
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    token_rewards = np.zeros((n, T), dtype=np.float32)
    token_rewards[np.arange(n), lengths - 1] = scores
    return DataProto.from_dict(
        tensors={"token_level_rewards": torch.as_tensor(token_rewards),
                 "response_mask": torch.as_tensor(mask)},
        non_tensors={"uid": UIDS.copy()})


@pytest.fixture
def batch() -> tuple[DataProto, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    scores = np.round(rng.uniform(0, 1, UIDS.size), 2).astype(np.float32)
    lengths = rng.integers(1, T + 1, UIDS.size)
    return _data(scores, lengths), scores.astype(np.float64), lengths


@pytest.fixture(autouse=True)
def _fresh_options(monkeypatch):
    monkeypatch.delenv(integration.OPTIONS_ENV, raising=False)
    verl_config._configured.clear()
    yield
    verl_config._configured.clear()


def _per_token(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    mask = np.arange(T)[None, :] < lengths[:, None]
    return np.where(mask, values.astype(np.float32)[:, None], 0.0)


def test_registered_with_verl() -> None:
    for name, fn in integration.ESTIMATORS.items():
        assert get_adv_estimator_fn(name) is fn


def test_maxnorm_through_verls_compute_advantage(batch) -> None:
    data, scores, lengths = batch
    integration.configure("maxnorm", tau_res=0.05)
    out = ray_trainer.compute_advantage(data, "maxnorm")
    expected = advcal.maxnorm(scores.astype(np.float32).astype(np.float64), group_ids=UIDS,
                              tau_res=0.05)
    np.testing.assert_array_equal(out.batch["advantages"].numpy(), _per_token(expected, lengths))
    np.testing.assert_array_equal(out.batch["returns"].numpy(), _per_token(expected, lengths))


def test_range_grpo_reads_its_calibration_file_from_the_environment(batch, tmp_path,
                                                                   monkeypatch) -> None:
    data, scores, lengths = batch
    rng = np.random.default_rng(1)
    reference = rng.uniform(0, 1, 300)
    judge = np.clip(reference + rng.normal(0, 0.05, 300), 0, 1)
    calibration = advcal.calibrate_ranges(judge, reference, alpha=0.2, bounds=(0.0, 1.0))
    path = tmp_path / "ranges.npz"
    advcal.save_calibration(path, calibration)
    monkeypatch.setenv(integration.OPTIONS_ENV, json.dumps(
        {"range_grpo": {"calibration": str(path), "relation": "midpoint"}}))
    out = ray_trainer.compute_advantage(data, "range_grpo")
    ranges = calibration.ranges(scores.astype(np.float32).astype(np.float64))
    expected = advcal.range_advantages(ranges.lo, ranges.hi, group_ids=UIDS, relation="midpoint")
    np.testing.assert_array_equal(out.batch["advantages"].numpy(), _per_token(expected, lengths))


def test_missing_options_say_what_and_how(batch) -> None:
    data, _, _ = batch
    with pytest.raises(ValueError, match=r"needs option 'tau_res'.*configure\('maxnorm'"):
        ray_trainer.compute_advantage(data, "maxnorm")
    with pytest.raises(ValueError, match="needs option 'calibration'"):
        ray_trainer.compute_advantage(data, "range_grpo")


def test_bad_options_json_is_named(batch, monkeypatch) -> None:
    data, _, _ = batch
    monkeypatch.setenv(integration.OPTIONS_ENV, "{not json")
    with pytest.raises(ValueError, match="ADVCAL_VERL_OPTIONS is not valid JSON"):
        ray_trainer.compute_advantage(data, "maxnorm")


def _gram_blocks(rng: np.random.Generator) -> np.ndarray:
    index = advcal.groups_from_ids(UIDS)
    blocks = []
    for size in np.diff(index.offsets):
        features = rng.normal(size=(size, 3))
        blocks.append((features @ features.T).ravel())
    return np.concatenate(blocks)


def test_gram_rows_round_trip_and_layout() -> None:
    gram = _gram_blocks(np.random.default_rng(2))
    rows = integration.gram_rows(gram, UIDS)
    assert rows.shape == (UIDS.size, G)
    # row 0 is response 0 ("p"): its group's members in batch order are 0, 2, 5, 9
    index = advcal.groups_from_ids(UIDS)
    p = list(index.labels).index("p")
    start = int(np.sum(np.diff(index.offsets)[:p] ** 2))
    np.testing.assert_array_equal(rows[0], gram[start:start + G])
    np.testing.assert_array_equal(rows[5], gram[start + 2 * G:start + 3 * G])
    np.testing.assert_array_equal(integration.gram_blocks(rows, UIDS), gram)
    with pytest.raises(ValueError, match="one n_q x n_q block per group"):
        integration.gram_rows(gram[:-1], UIDS)


def test_setgrpo_without_gram_says_what_is_missing(batch) -> None:
    data, _, _ = batch
    with pytest.raises(ValueError, match="missing the Gram matrices.*attach_gram"):
        ray_trainer.compute_advantage(data, "setgrpo")


def test_setgrpo_with_gram_rows_in_the_dataproto(batch, tmp_path) -> None:
    data, scores, lengths = batch
    rng = np.random.default_rng(3)
    clean = rng.uniform(0, 1, (200, G))
    calibration = advcal.calibrate_sets(clean + rng.normal(0, 0.02, clean.shape),
                                        clean + rng.normal(0, 0.02, clean.shape), alpha=0.2)
    path = tmp_path / "sets.npz"
    advcal.save_calibration(path, calibration)
    integration.configure("setgrpo", calibration=str(path), tau=0.3)
    gram = _gram_blocks(rng)
    integration.attach_gram(data, gram)
    # DataProto carries the rows like any per-response tensor: it splits and re-joins them
    halves = data.chunk(2)
    np.testing.assert_array_equal(DataProto.concat(halves).batch["advcal_gram"].numpy(),
                                  data.batch["advcal_gram"].numpy())
    out = integration.compute_advantage(data, "setgrpo")
    expected = advcal.setgrpo(scores.astype(np.float32).astype(np.float64), group_ids=UIDS,
                              gram=gram, calibration=calibration, tau=0.3).coefficients
    np.testing.assert_allclose(out.batch["advantages"].numpy(), _per_token(expected, lengths),
                               rtol=1e-6, atol=1e-7)
    # patched, verl's own compute_advantage forwards the rows too
    original = ray_trainer.compute_advantage
    try:
        integration.patch_compute_advantage()
        integration.patch_compute_advantage()  # idempotent
        again = ray_trainer.compute_advantage(data, "setgrpo")
        np.testing.assert_array_equal(again.batch["advantages"].numpy(),
                                      out.batch["advantages"].numpy())
        integration.configure("maxnorm", tau_res=0.05)
        ray_trainer.compute_advantage(data, "maxnorm")  # other estimators still reach verl
    finally:
        ray_trainer.compute_advantage = original
        del ray_trainer._advcal_original_compute_advantage


def test_a_ray_worker_sees_the_registration(monkeypatch) -> None:
    ray = pytest.importorskip("ray")
    import shutil
    import tempfile

    # Ray's socket paths must stay under 107 bytes: pytest's tmp_path is too deep.
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")

    @ray.remote(num_cpus=1)
    class Worker:
        def registered(self) -> list[str]:
            from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

            return sorted(set(ADV_ESTIMATOR_REGISTRY) & {"maxnorm", "range_grpo", "setgrpo"})

    # The explicit mechanism only: plugins off, the module named in the workers' environment
    # (inherited from this process: a runtime_env with env_vars costs a minute to set up).
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "advcal.integrations.verl")
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    try:
        worker = Worker.remote()
        assert ray.get(worker.registered.remote(), timeout=300) == [
            "maxnorm", "range_grpo", "setgrpo"]
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_configure_without_options_falls_back_to_the_environment(monkeypatch):
    monkeypatch.setenv(integration.OPTIONS_ENV, json.dumps({"maxnorm": {"tau_res": 0.5}}))
    integration.configure("maxnorm", tau_res=0.05)
    assert verl_config._options("maxnorm") == {"tau_res": 0.05}
    integration.configure("maxnorm")
    assert verl_config._options("maxnorm") == {"tau_res": 0.5}
