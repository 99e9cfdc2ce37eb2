"""advcal.torch: tensors in, tensors out, same numbers as the numpy API."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import advcal

torch = pytest.importorskip("torch")
import advcal.torch as act  # noqa: E402

FLOAT_DTYPES = [torch.float32, torch.float64]
HALF_DTYPES = [torch.bfloat16, torch.float16]


def test_import_advcal_does_not_import_torch() -> None:
    code = "import sys, advcal; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo", "batch_std", "passk"])
def test_dense_matches_numpy_and_keeps_dtype(dtype: torch.dtype, method: str) -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.25, 1.0], [0.1, 0.1, 0.1, 0.1], [0.3, 0.9, 0.2, 0.5]],
                           dtype=dtype)
    out = act.advantages(rewards, method=method)
    expected = advcal.advantages(rewards.numpy(), method=method)
    assert isinstance(out, torch.Tensor)
    assert out.dtype == dtype and out.device == rewards.device and out.shape == rewards.shape
    np.testing.assert_array_equal(out.numpy(), expected)
    assert (out[1] == 0).all()  # zero-variance group stays exactly zero through the wrapper


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_precision_is_computed_in_float32_and_cast_back(dtype: torch.dtype) -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.75], [0.1, 0.1, 0.1, 0.1]], dtype=dtype)
    out = act.advantages(rewards, method="grpo", eps=1e-4)
    assert out.dtype == dtype
    wide = advcal.grpo(rewards.float().numpy(), eps=1e-4)
    assert wide.dtype == np.float32
    expected = torch.from_numpy(wide).to(dtype)
    assert torch.equal(out, expected)
    assert (out[1] == 0).all()


def test_ragged_offsets_and_group_ids_as_tensors() -> None:
    flat = torch.tensor([1.0, 0.0, 0.5, 3.0, 2.0, 2.0, 5.0])
    offsets = torch.tensor([0, 3, 3, 6, 7])
    out = act.advantages(flat, offsets, method="rloo")
    np.testing.assert_array_equal(
        out.numpy(), advcal.rloo(flat.numpy(), offsets=offsets.numpy())
    )
    ids = torch.tensor([4, 2, 4, 2, 9])
    values = torch.tensor([1.0, 0.0, 0.0, 1.0, 7.0], dtype=torch.float64)
    by_ids = act.advantages(values, group_ids=ids, method="grpo", singleton="raw")
    expected = advcal.grpo(values.numpy(), group_ids=[4, 2, 4, 2, 9], singleton="raw")
    np.testing.assert_array_equal(by_ids.numpy(), expected)
    by_list = act.advantages(values, group_ids=["a", "b", "a", "b", "c"], method="grpo")
    np.testing.assert_array_equal(by_list.numpy(), advcal.grpo(values.numpy(),
                                                                group_ids=list("abab") + ["c"]))


def test_tensor_keyword_arguments_are_converted() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    lengths = torch.tensor([[10, 30, 20], [5, 5, 40]])
    out = act.advantages(rewards, method="opo", lengths=lengths)
    expected = advcal.opo(rewards.numpy(), lengths=lengths.numpy())
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=0)
    whitened = act.advantages(rewards, method="reinforce_pp_baseline", token_counts=lengths)
    np.testing.assert_array_equal(
        whitened.numpy(),
        advcal.reinforce_pp_baseline(rewards.numpy(), token_counts=lengths.numpy()),
    )


def test_result_is_a_constant_and_input_untouched() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.5]], requires_grad=True)
    before = rewards.detach().clone()
    out = act.advantages(rewards)
    assert not out.requires_grad and out.grad_fn is None
    assert torch.equal(rewards.detach(), before)


def test_integer_rewards_give_float64() -> None:
    out = act.advantages(torch.tensor([[1, 0, 0, 1]]), method="dr_grpo")
    assert out.dtype == torch.float64
    np.testing.assert_array_equal(out.numpy(), [[0.5, -0.5, -0.5, 0.5]])


def test_results_follow_the_device_of_the_input() -> None:
    # The meta device stands in for an accelerator: placement logic, no arithmetic.
    like = torch.empty(3, device="meta", dtype=torch.bfloat16)
    out = act.from_numpy(np.array([1.0, 2.0, 3.0]), like)
    assert out.device.type == "meta" and out.dtype == torch.bfloat16
    mask = act.from_numpy(np.array([True, False]), like)
    assert mask.device.type == "meta" and mask.dtype == torch.bool


def test_containers_are_converted_field_by_field() -> None:
    from typing import NamedTuple

    class Pair(NamedTuple):
        weights: np.ndarray
        keep: np.ndarray
        count: int

    like = torch.zeros(1, dtype=torch.float16)
    pair = act.from_numpy(Pair(np.array([0.5]), np.array([True]), 3), like)
    assert isinstance(pair, Pair) and pair.count == 3
    assert pair.weights.dtype == torch.float16 and pair.keep.dtype == torch.bool
    plain = act.from_numpy((np.array([1.0]), 2.5), like)
    assert isinstance(plain, tuple) and plain[1] == 2.5


@pytest.mark.parametrize("dtype", [">f8", ">f4", ">f2", ">i4", ">u2", ">c16"])
def test_non_native_byte_order_is_converted_in_a_copy(dtype: str) -> None:
    # e.g. an array read from a big-endian file: torch takes native byte order only
    values = np.arange(-2, 4).astype(dtype)[::-2]  # and not contiguous
    before = values.tobytes()
    out = act.from_numpy(values, torch.zeros(1, dtype=torch.float64))
    native = values.astype(values.dtype.newbyteorder("="))
    expected = torch.from_numpy(native)
    if expected.is_floating_point():
        expected = expected.double()
    assert torch.equal(out, expected)
    assert values.tobytes() == before and not values.dtype.isnative  # the caller's array
    wide = act.from_numpy(np.array([1.5, -2.0], dtype=">f8"), torch.zeros(1))
    assert wide.dtype == torch.float32 and wide.tolist() == [1.5, -2.0]


def test_zero_dimensional_arrays_stay_zero_dimensional() -> None:
    out = act.from_numpy(np.array(2.5, dtype=">f8"), torch.zeros(1, dtype=torch.float64))
    assert out.shape == () and out.item() == 2.5
    assert act.from_numpy(np.array(True), torch.zeros(1)).shape == ()


def test_arrays_torch_cannot_hold_are_a_type_error_naming_array() -> None:
    like = torch.zeros(1)
    for bad in (np.array(["a"]), np.array([1], dtype=object), np.zeros(2, dtype="M8[s]")):
        with pytest.raises(TypeError, match=r"^`array` must hold booleans or numbers"):
            act.from_numpy(bad, like)
    if np.dtype(np.longdouble).itemsize > 8:  # an extended type torch has no dtype for
        with pytest.raises(TypeError, match=r"^`array` has dtype float128"):
            act.from_numpy(np.zeros(2, dtype=np.longdouble), like)


def test_non_tensor_rewards_are_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"^`rewards` must be a torch.Tensor; got ndarray\.$"):
        act.advantages(np.zeros((2, 3)))
    with pytest.raises(TypeError, match=r"^`rewards` must hold real numbers; got dtype "
                                        r"torch.complex64\.$"):
        act.advantages(torch.zeros((2, 3), dtype=torch.complex64))


def test_numpy_errors_pass_through_unchanged() -> None:
    with pytest.raises(ValueError, match="^`rewards` contain NaN"):
        act.advantages(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="^`method` must be one of"):
        act.advantages(torch.zeros((1, 2)), method="ppo")
    with pytest.raises(ValueError, match=r"^`offsets\[-1\]` must equal the number of rewards"):
        act.advantages(torch.zeros(3), torch.tensor([0, 2]))


@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(FLOAT_DTYPES + HALF_DTYPES),
    method=st.sampled_from(["grpo", "dr_grpo", "rloo"]),
)
def test_ragged_property_matches_numpy(sizes: list[int], seed: int, dtype: torch.dtype,
                                       method: str) -> None:
    offsets = advcal.offsets_from_sizes(sizes)
    rng = np.random.default_rng(seed)
    values = torch.from_numpy(rng.uniform(-2.0, 2.0, int(offsets[-1]))).to(dtype)
    out = act.advantages(values, torch.from_numpy(offsets), method=method)
    host = values.float().numpy() if dtype in HALF_DTYPES else values.numpy()
    expected = torch.from_numpy(advcal.advantages(host, offsets, method=method)).to(dtype)
    assert out.dtype == dtype and out.shape == values.shape
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + HALF_DTYPES)
def test_maxnorm_matches_numpy(dtype: torch.dtype) -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.7, 0.7, 0.7, 0.71], [0.5, 0.5, 0.5, 0.5]],
                           dtype=dtype)
    host = rewards.float().numpy() if dtype in HALF_DTYPES else rewards.numpy()
    out = act.maxnorm(rewards, tau_res=0.05, baseline="mean")
    expected = advcal.maxnorm(host, tau_res=0.05, baseline="mean")
    assert out.dtype == dtype and out.shape == rewards.shape
    assert torch.equal(out, torch.from_numpy(expected).to(dtype))
    assert out.abs().max() <= 1
    result = act.maxnorm(rewards, tau_res=0.05, return_scale=True)
    reference = advcal.maxnorm(host, tau_res=0.05, return_scale=True)
    assert isinstance(result, advcal.MaxNormResult)
    assert result.scale.dtype == dtype and result.scale.shape == (3,)
    assert torch.equal(result.scale, torch.from_numpy(reference.scale).to(dtype))
    assert torch.equal(result.advantages, torch.from_numpy(reference.advantages).to(dtype))


def test_maxnorm_ragged_with_group_ids_and_dispatcher() -> None:
    values = torch.tensor([0.2, 0.9, 0.4, 0.9, 0.1], dtype=torch.float64)
    ids = torch.tensor([1, 2, 1, 2, 1])
    out = act.maxnorm(values, group_ids=ids, tau_res=0.01, resolution=0.1)
    expected = advcal.maxnorm(values.numpy(), group_ids=[1, 2, 1, 2, 1], tau_res=0.01,
                              resolution=0.1)
    np.testing.assert_array_equal(out.numpy(), expected)
    assert (out[[1, 3]] == 0).all()  # group 2 is zero-gap


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + HALF_DTYPES)
@pytest.mark.parametrize("relation", ["dominance", "midpoint", "probabilistic"])
def test_range_advantages_match_numpy(dtype: torch.dtype, relation: str) -> None:
    lo = torch.tensor([[0.0, 0.5, 0.875, 0.25], [0.25, 0.25, 0.5, 0.5]], dtype=dtype)
    hi = lo + torch.tensor([[0.25, 0.25, 0.125, 0.5], [0.0, 0.5, 0.25, 0.0]], dtype=dtype)
    host_lo, host_hi = (t.float().numpy() if dtype in HALF_DTYPES else t.numpy() for t in (lo, hi))
    out = act.range_advantages(lo, hi, relation=relation)
    expected = advcal.range_advantages(host_lo, host_hi, relation=relation)
    assert out.dtype == dtype and out.shape == lo.shape
    assert torch.equal(out, torch.from_numpy(expected).to(dtype))


def test_range_advantages_ragged_and_points_collapse_to_dr_grpo() -> None:
    points = torch.tensor([0.2, 0.9, 0.4, 0.6, 0.1], dtype=torch.float64)
    offsets = torch.tensor([0, 3, 5])
    out = act.range_advantages(points, points, offsets)
    np.testing.assert_allclose(out.numpy(), advcal.dr_grpo(points.numpy(), offsets=[0, 3, 5]),
                               rtol=0, atol=1e-15)
    with pytest.raises(TypeError, match=r"^`hi` must be a torch.Tensor; got list\.$"):
        act.range_advantages(points, [0.0] * 5, offsets)


@pytest.fixture(scope="module")
def set_calibration() -> advcal.SetCalibration:
    from advcal.simulate import paired_scorings

    pair = paired_scorings(1000, 4, scale=0.02, seed=0)
    return advcal.calibrate_sets(pair.a, pair.b, alpha=0.1)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + HALF_DTYPES)
def test_setgrpo_matches_numpy(dtype: torch.dtype, set_calibration: advcal.SetCalibration) -> None:
    from advcal.simulate import gram_matrices, paired_scorings

    scores = torch.from_numpy(paired_scorings(6, 4, scale=0.02, seed=5).a).to(dtype)
    gram = gram_matrices(6, 4, seed=6).gram
    host = scores.float().numpy() if dtype in HALF_DTYPES else scores.numpy()
    out = act.setgrpo(scores, gram=torch.from_numpy(gram), calibration=set_calibration, tau=0.2)
    expected = advcal.setgrpo(host, gram=gram, calibration=set_calibration, tau=0.2)
    assert isinstance(out, advcal.Recovery)
    assert out.coefficients.dtype == dtype and out.coefficients.shape == scores.shape
    assert out.accepted.dtype == torch.bool
    assert torch.equal(out.accepted, torch.from_numpy(expected.accepted))
    for name in ("coefficients", "anchors", "eta", "m_full", "m_reward"):
        got, want = getattr(out, name), torch.from_numpy(getattr(expected, name)).to(dtype)
        assert got.dtype == dtype
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want)), name


def test_setgrpo_ragged_with_group_ids(set_calibration: advcal.SetCalibration) -> None:
    from advcal.simulate import gram_matrices

    values = torch.tensor([0.2, 0.6, 0.1, 0.9, 0.3, 0.5, 0.4, 0.8], dtype=torch.float64)
    ids = np.array(["a", "b", "a", "b", "a", "b", "a", "b"], dtype=object)
    gram = gram_matrices(2, 4, seed=1).gram.reshape(-1)  # ragged: flat row-major blocks
    out = act.setgrpo(values, group_ids=ids, gram=gram, calibration=set_calibration, tau=0.0)
    expected = advcal.setgrpo(values.numpy(), group_ids=ids, gram=gram,
                              calibration=set_calibration, tau=0.0)
    np.testing.assert_array_equal(out.coefficients.numpy(), expected.coefficients)
    assert out.coefficients.shape == values.shape


POINT_ESTIMATORS = ["grpo", "dr_grpo", "rloo", "batch_std", "reinforce_pp_baseline", "opo",
                    "gpg", "passk"]


@pytest.mark.parametrize("name", POINT_ESTIMATORS)
def test_every_estimator_by_name_matches_numpy(name: str) -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.25, 1.0], [0.3, 0.9, 0.2, 0.5]], dtype=torch.float64)
    lengths = torch.tensor([[3, 5, 2, 7], [1, 1, 4, 2]])
    options = {"lengths": lengths} if name == "opo" else {}
    out = getattr(act, name)(rewards, **options)
    numpy_options = {k: v.numpy() for k, v in options.items()}
    expected = getattr(advcal, name)(rewards.numpy(), **numpy_options)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    np.testing.assert_array_equal(out.numpy(), expected)
    assert name in act.__all__
    import inspect
    assert inspect.signature(getattr(act, name)) == inspect.signature(getattr(advcal, name))


def test_estimator_by_name_ragged_group_ids_tensor() -> None:
    values = torch.tensor([1.0, 0.0, 0.0, 1.0, 7.0])
    ids = torch.tensor([4, 2, 4, 2, 9])
    out = act.rloo(values, group_ids=ids, singleton="raw")
    np.testing.assert_array_equal(
        out.numpy(), advcal.rloo(values.numpy(), group_ids=ids.numpy(), singleton="raw"))


@pytest.mark.parametrize("call", [
    lambda r: act.dr_grpo(r, eps=1e-4),
    lambda r: act.advantages(r, method="dr_grpo", eps=1e-4),
    lambda r: advcal.advantages(r.numpy(), method="dr_grpo", eps=1e-4),
])
def test_option_an_estimator_does_not_take_names_both(call) -> None:
    with pytest.raises(TypeError, match="estimator 'dr_grpo' takes no option 'eps'"):
        call(torch.tensor([[1.0, 0.0]]))


def test_meta_device_tensor_is_a_clear_error() -> None:
    rewards = torch.zeros(2, 3, device="meta")
    with pytest.raises(ValueError, match="`rewards` is on the meta device"):
        act.grpo(rewards)
    with pytest.raises(ValueError, match="`lengths` is on the meta device"):
        act.opo(torch.zeros(2, 3), lengths=torch.ones(2, 3, device="meta"))


def test_every_registered_point_estimator_has_a_torch_function() -> None:
    from advcal.registry import REGISTRY

    for name, entry in REGISTRY.items():
        if entry.ranges:
            continue
        assert name in act.__all__ and callable(getattr(act, name)), name
    rewards = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    for name, entry in REGISTRY.items():
        if not entry.ranges and not entry.needs:
            expected = entry.function(rewards.numpy())
            np.testing.assert_array_equal(getattr(act, name)(rewards).numpy(),
                                          getattr(expected, "advantages", expected))
