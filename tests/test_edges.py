"""Regression tests for the adversarial inputs of issue 16, each on both engines.

Expected values are derived by hand in each test (exact arithmetic on small groups).
"""

from __future__ import annotations

import numpy as np
import pytest

import advcal

BACKENDS = ("numba", "numpy")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpg_tiny_f_norm_is_a_clear_error(backend):
    # N / k = 3 / 2, u = (0.5, -0.5, 0): 0.5 * 1.5 / 1e-320 overflows float64.
    with pytest.raises(ValueError, match="`f_norm`"):
        advcal.gpg([[1.0, 0.0, 0.5]], f_norm=1e-320, backend=backend)
    # A small f_norm whose advantages fit is fine: 0.5 * 1.5 / 1e-300 = 7.5e299.
    out = advcal.gpg([[1.0, 0.0, 0.5]], f_norm=1e-300, backend=backend)
    np.testing.assert_allclose(out, [[7.5e299, -7.5e299, 0.0]], rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_opo_lengths_near_float_max(backend):
    # Equal lengths: the baseline is the plain mean 0.5.
    out = advcal.opo([[1.0, 0.0]], lengths=[[1e308, 1e308]], backend=backend)
    np.testing.assert_array_equal(out, [[0.5, -0.5]])
    # Lengths 1e308 and 3e307 weigh like 10 : 3, baseline 10/13.
    out = advcal.opo([[1.0, 0.0]], lengths=[[1e308, 3e307]], backend=backend)
    np.testing.assert_allclose(out, [[3 / 13, -10 / 13]], rtol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reinforce_pp_token_counts_near_float_max(backend):
    r = [[1.0, 0.0, 0.5, 0.25]]
    # u = r - 0.4375; equal weights W -> inf: Bessel's factor W / (W - 1) -> 1, so the
    # whitening is u / sqrt(mean(u^2) + eps) with the biased variance.
    u = np.array(r[0]) - 0.4375
    expected = u / np.sqrt(np.mean(u**2) + 1e-8)
    out = advcal.reinforce_pp_baseline(r, token_counts=[[1e308] * 4], backend=backend)
    np.testing.assert_allclose(out[0], expected, rtol=1e-12)
    # The same weights at a representable total keep their Bessel correction.
    out = advcal.reinforce_pp_baseline(r, token_counts=[[1e300] * 4], backend=backend)
    np.testing.assert_allclose(out[0], expected, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [">f8", ">f4", "<f8", ">f2", ">i4"])
def test_big_endian_rewards(backend, dtype):
    r = np.array([[2.0, 0.0, 1.0]], dtype=dtype)
    native = advcal.grpo(r.astype(r.dtype.newbyteorder("=")), backend=backend)
    out = advcal.grpo(r, backend=backend)
    np.testing.assert_array_equal(out, native)
    assert out.dtype.isnative
    # std of (2, 0, 1) with ddof 1 is 1: advantages (1, -1, 0) / (1 + 1e-6).
    np.testing.assert_allclose(out, [[1.0, -1.0, 0.0]], rtol=1e-5)


@pytest.mark.parametrize("labels", [
    [float("nan"), "b", float("nan"), "b"],
    [np.float32("nan"), "b", np.float32("nan"), "b"],
    [complex("nan"), 1, complex("nan"), 1],
])
def test_nan_group_labels_rejected_in_mixed_labels(labels):
    with pytest.raises(ValueError, match="`group_ids` must not contain NaN"):
        advcal.grpo([0.0, 1.0, 1.0, 0.0], group_ids=labels)


def test_categories_keep_label_types():
    from advcal.labels import category_codes

    labels, codes = category_codes([1, "1", 1, "1"], (4,))
    assert labels == [1, "1"] and codes.tolist() == [0, 1, 0, 1]
    labels, codes = category_codes([[1, "1"], [1, "1"]], (2, 2))
    assert labels == [1, "1"] and codes.tolist() == [0, 1, 0, 1]
    # Through the public function: two categories, each calibrated on its own scores.
    judge = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    reference = np.array([0.1, 0.9, 0.1, 0.9, 0.1, 0.9])
    cal = advcal.calibrate_ranges(judge, reference, alpha=0.5, bounds=(0.0, 1.0),
                                  categories=[1, "1", 1, "1", 1, "1"])
    ranges = cal.ranges(np.zeros(2), categories=[1, "1"])
    # m = 3 per category, rank ceil(4 * 0.5) = 2: radius 0.1 for 1 and 0.9 for "1".
    np.testing.assert_allclose(ranges.hi, [0.1, 0.9])


def test_ucb_extremes_are_finite():
    from advcal.bounds import ucb

    value = ucb(10**17, 10**18, 0.1)
    assert np.isfinite(value) and 0.1 <= value <= 0.1 + 1e-8
    assert ucb(1, 10, 5e-324) == 1.0


def test_offsets_from_sizes_overflow():
    with pytest.raises(ValueError, match="`sizes` must sum"):
        advcal.offsets_from_sizes([2**62] * 3)
    with pytest.raises(ValueError, match="`sizes` must sum"):
        advcal.offsets_from_sizes(np.array([2**63], dtype=np.uint64))
    np.testing.assert_array_equal(advcal.offsets_from_sizes([2**62, 2**62 - 1]),
                                  [0, 2**62, 2**63 - 1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["dr_grpo", "rloo", "gpg", "grpo"])
def test_float32_values_near_max_that_fit(backend, name):
    # +-1e38 alternating, G = 16: mean 0, the squares overflow float32 (and the L2 norm
    # 4e38 > float32 max) but every advantage fits, as TRL returns them.
    r = np.tile(np.float32([1e38, -1e38]), 8)[None]
    out = getattr(advcal, name)(r, backend=backend)
    assert out.dtype == np.float32
    # dr_grpo: u; gpg: u * N/k = u (all nonzero); rloo: u * 16/15; grpo: u / std, std =
    # 1e38 * sqrt(16/15).
    factor = {"dr_grpo": 1.0, "gpg": 1.0, "rloo": 16 / 15, "grpo": 1 / 1e38 / np.sqrt(16 / 15)}
    np.testing.assert_allclose(out, r.astype(np.float64) * factor[name], rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_statistics_overflow_is_rescaled(backend):
    np.testing.assert_array_equal(advcal.dr_grpo([[9e153, -9e153]], backend=backend),
                                  [[9e153, -9e153]])
    # rloo: 1e308 - mean(0, 0) = 1e308; 0 - mean(1e308, 0) = -5e307.
    np.testing.assert_allclose(advcal.rloo([[1e308, 0.0, 0.0]], backend=backend),
                               [[1e308, -5e307, -5e307]], rtol=1e-15)
    # grpo is scale-free: (1, -1) / sqrt(2) whatever the magnitude.
    np.testing.assert_allclose(advcal.grpo([[1.5e308, -1.5e308]], backend=backend),
                               [[2**-0.5, -(2**-0.5)]], rtol=1e-12)
    # A raw lone response keeps r / (1 + eps) after the rescaled retry.
    out = advcal.grpo([1.5e308, -1.5e308, 3.0], offsets=[0, 2, 3], singleton="raw",
                      backend=backend)
    np.testing.assert_allclose(out, [2**-0.5, -(2**-0.5), 3.0 / (1 + 1e-6)], rtol=1e-12)
    out = advcal.passk([[1.5e308, -1.5e308]], backend=backend)
    np.testing.assert_allclose(out, [[2**0.5, 0.0]], rtol=1e-12)  # gap 3e308 / std
    # opo: baseline (1e308 - 3e308) / 4 = -0.5e308.
    out = advcal.opo([[1e308, -1e308]], lengths=[[1, 3]], backend=backend)
    np.testing.assert_allclose(out, [[1.5e308, -0.5e308]], rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_true_overflow_is_an_error(backend):
    # rloo of (1.5e308, -1.5e308): 2 * 1.5e308 = 3e308 does not fit float64.
    with pytest.raises(ValueError, match="too large"):
        advcal.rloo([[1.5e308, -1.5e308]], backend=backend)
    # float32: rloo of (3e38, -3e38) is 6e38 > float32 max.
    with pytest.raises(ValueError, match="too large"):
        advcal.rloo(np.float32([[3e38, -3e38]]), backend=backend)


def test_calibrate_sets_unknown_estimator():
    a = np.random.default_rng(0).random((20, 4))
    with pytest.raises(ValueError, match="`estimator` must be one of"):
        advcal.calibrate_sets(a, a, alpha=0.2, estimator="bogus")


def test_grpo_jacobian_eps_zero_constant_group_names_eps():
    with pytest.raises(ValueError, match="`eps` = 0.0 leaves"):
        advcal.coefficient_jacobian([[0.0, 1.0, 2.0], [0.5, 0.5, 0.5]], eps=0.0)
    rng = np.random.default_rng(1)
    a = rng.random((20, 4))
    a[3] = 0.5
    with pytest.raises(ValueError, match="`eps` = 0.0 leaves"):
        advcal.calibrate_sets(a, a + 0.01 * rng.random((20, 4)), alpha=0.2, eps=0)
    # eps > 0 is defined: a constant group's J is C / eps.
    J = advcal.coefficient_jacobian([[0.5, 0.5, 0.5]], eps=0.5)
    np.testing.assert_allclose(J[0], (np.eye(3) - 1 / 3) / 0.5, atol=1e-12)


@pytest.mark.parametrize("options", [
    {"tau_res": 0.1, "return_scale": True},
    {"tau_res": 0.1, "offsets": 3},
    {"tau_res": 0.1, "group_ids": 1},
    {"tau_res": 0.1, "rewards": 1},
    {"tau_res": 0.1, "bogus": 1},
])
def test_calibrate_sets_options_that_are_not_options(options):
    a = np.random.default_rng(2).random((20, 4))
    with pytest.raises(ValueError, match="`options` key"):
        advcal.calibrate_sets(a, a + 0.01, alpha=0.2, estimator="maxnorm", options=options)
    with pytest.raises(ValueError, match="`options` key"):
        advcal.coefficient_jacobian(a, estimator="maxnorm", options=options)


def test_calibrate_sets_per_response_option_rejected():
    a = np.random.default_rng(2).random((20, 4))
    with pytest.raises(ValueError, match="`options` key 'token_counts'"):
        advcal.coefficient_jacobian(a, estimator="reinforce_pp_baseline",
                                    options={"token_counts": 3})


def test_coefficient_sets_own_their_offsets():
    rng = np.random.default_rng(3)
    a = rng.random(40)
    off = np.arange(0, 41, 4)
    cal = advcal.calibrate_sets(a, a + 0.02 * rng.standard_normal(40), offsets=off,
                                alpha=0.2)
    train = rng.random(12)
    offsets = np.array([0, 4, 8, 12])
    sets = advcal.coefficient_sets(train, offsets, calibration=cal)
    directions = rng.standard_normal(12)
    before = sets.support(directions)
    centers = sets.centers.copy()
    offsets[1] = 2
    train[:] = 0.0
    np.testing.assert_array_equal(sets.support(directions), before)
    np.testing.assert_array_equal(sets.centers, centers)


def _no_work(*args, **kwargs):
    raise AssertionError("the demo started its work before checking --out")


def test_demo_unwritable_out_fails_before_the_work(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    import tempfile

    from advcal import cli
    from advcal.cli import demo

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(demo, "demo_batch", _no_work)  # where the demo looks it up
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    assert cli.main(["demo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot write the figures to" in err and "Permission denied" in err


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0,
                    reason="root writes into read-only directories")
def test_demo_read_only_out_directory(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    from advcal import cli
    from advcal.cli import demo

    out = tmp_path / "figs"
    out.mkdir()
    out.chmod(0o500)
    monkeypatch.setattr(demo, "demo_batch", _no_work)
    try:
        assert cli.main(["demo", "--out", str(out)]) == 2
    finally:
        out.chmod(0o700)
    assert "cannot write the figures to" in capsys.readouterr().err


@pytest.mark.parametrize("backend", BACKENDS)
def test_subnormal_groups_keep_their_advantages(backend):
    # The squares of a spread of 1e-310 underflow to 0: the group is not constant, and
    # its advantages are representable: dr_grpo +-5e-311; grpo with eps=0 +-1/sqrt(2).
    np.testing.assert_array_equal(advcal.dr_grpo([[0.0, 1e-310]], backend=backend),
                                  [[-5e-311, 5e-311]])
    np.testing.assert_allclose(advcal.grpo([[0.0, 1e-310]], eps=0.0, backend=backend),
                               [[-(2**-0.5), 2**-0.5]], rtol=1e-12)
    np.testing.assert_allclose(advcal.passk([[0.0, 1e-310]], eps=0.0, backend=backend),
                               [[0.0, 2**0.5]], rtol=1e-12)
    # A constant group stays exactly 0.
    np.testing.assert_array_equal(advcal.grpo([[1e-310, 1e-310]], eps=0.0, backend=backend),
                                  [[0.0, 0.0]])


def test_calibrate_sets_tiny_scores_clear_error():
    rng = np.random.default_rng(0)
    a = rng.uniform(size=(24, 4)) * 1e-300
    b = a + 0.01 * rng.standard_normal(a.shape) * 1e-300
    with pytest.raises(ValueError, match="rescale the scores"):
        advcal.calibrate_sets(a, b, alpha=0.2, estimator="batch_std")


@pytest.mark.parametrize("backend", BACKENDS)
def test_groups_of_very_different_magnitudes_are_rescaled_one_by_one(backend):
    out = advcal.dr_grpo([[1.0, 0.0], [0.0, 1e-310]], backend=backend)
    np.testing.assert_array_equal(out, [[0.5, -0.5], [-5e-311, 5e-311]])
    out = advcal.grpo([[1e308, -1e308], [0.0, 1e-310]], eps=0.0, backend=backend)
    np.testing.assert_allclose(out, [[2**-0.5, -(2**-0.5)], [-(2**-0.5), 2**-0.5]],
                               rtol=1e-12)
