"""advcal.torch's estimators read the numpy function's signature once, at wrap time, and
skip the conversions a plain CPU tensor does not need; what they return and raise is what
the numpy function on the same values returns and raises, as before.  No timings here
(``benchmarks/bench_coldstart.py`` measures the overhead)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import advcal
from advcal._validation import check_keywords

torch = pytest.importorskip("torch")
import advcal.torch as act  # noqa: E402

REWARDS = [[1.0, 0.0, 0.25, 1.0], [0.1, 0.1, 0.1, 0.1], [0.3, 0.9, 0.2, 0.5]]
# estimator: keyword-only options that change its result
OPTIONS = {
    "grpo": {"eps": 1e-4, "ddof": 0, "singleton": "raw"},
    "rloo": {"singleton": "raw", "nan_policy": "omit"},
    "passk": {"eps": 1e-4},
    "opo": {"lengths": [[3, 1, 2, 2], [1, 1, 1, 1], [5, 2, 2, 1]]},
    "maxnorm": {"tau_res": 0.1, "baseline": "mean"},
}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
          torch.bool]


def _numpy_function(name: str):
    return advcal.ESTIMATORS[name] if name in advcal.ESTIMATORS else getattr(advcal, name)


def _expected(name: str, rewards: torch.Tensor, **options):
    """The numpy function on the tensor's values (half precision widened to float32),
    as a tensor with the input's device and floating dtype: what the wrapper promised."""
    host = rewards.detach()
    if host.dtype in (torch.bfloat16, torch.float16):
        host = host.float()
    result = _numpy_function(name)(host.cpu().numpy(), **options)
    out = torch.from_numpy(result)
    if out.is_floating_point() and rewards.is_floating_point():
        return out.to(device=rewards.device, dtype=rewards.dtype)
    return out.to(device=rewards.device)


def _assert_same(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert isinstance(out, torch.Tensor) and not out.requires_grad
    assert out.dtype == expected.dtype and out.device == expected.device
    assert out.shape == expected.shape
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_results_dtypes_and_devices_are_the_numpy_functions(name: str,
                                                            dtype: torch.dtype) -> None:
    if dtype == torch.bool:
        rewards = torch.tensor(REWARDS) > 0.4
    else:
        rewards = (torch.tensor(REWARDS) * (4 if not dtype.is_floating_point else 1)).to(dtype)
    options = {k: v for k, v in OPTIONS[name].items() if k in ("lengths", "tau_res")}
    for opts in (options, OPTIONS[name]):
        _assert_same(getattr(act, name)(rewards, **opts), _expected(name, rewards, **opts))


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_tensors_that_need_converting_give_the_same_numbers(name: str) -> None:
    base = torch.tensor(REWARDS, dtype=torch.float64)
    opts = dict(OPTIONS[name])
    if "lengths" in opts:  # a tensor option is converted too
        opts["lengths"] = torch.tensor(opts["lengths"])
    for rewards in (base.clone().requires_grad_(True),  # detached
                    base.t().contiguous().t(),  # not contiguous
                    base.to(torch.float32)):
        expected = _expected(name, rewards, **{
            k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in opts.items()})
        _assert_same(getattr(act, name)(rewards, **opts), expected)


@pytest.mark.parametrize("name", ["grpo", "rloo", "passk", "dr_grpo", "batch_std"])
def test_dense_rewards_without_options_take_any_tensor(name: str) -> None:
    """The shortcut for a plain CPU float tensor, and the tensors it must leave to the
    general path (a subclass, autograd, other layouts), give the numpy function's result."""
    base = torch.tensor(REWARDS, dtype=torch.float64)
    for rewards in (base, base.to(torch.float32), base.t().contiguous().t(),
                    base.clone().requires_grad_(True), torch.nn.Parameter(base.clone()),
                    base[:, ::2]):
        _assert_same(getattr(act, name)(rewards), _expected(name, rewards))


def test_ragged_layouts_as_tensors() -> None:
    flat = torch.tensor([1.0, 0.0, 0.5, 3.0, 2.0, 2.0, 5.0], dtype=torch.float64)
    offsets = torch.tensor([0, 3, 3, 6, 7])
    ids = torch.tensor([4, 2, 4, 2, 9, 9, 1])
    for name in ("grpo", "rloo", "passk"):
        fn = getattr(act, name)
        np.testing.assert_array_equal(
            fn(flat, offsets).numpy(), _numpy_function(name)(flat.numpy(), offsets.numpy()))
        np.testing.assert_array_equal(
            fn(flat, group_ids=ids).numpy(),
            _numpy_function(name)(flat.numpy(), group_ids=ids.numpy()))


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gdpo", "batch_std"])
def test_an_unknown_option_raises_the_dispatchers_message(name: str) -> None:
    rewards = torch.tensor(REWARDS)
    function = _numpy_function(name)
    for options in ({"bogus": 1}, {"eps": 1e-4, "tau_res": 0.1, "bogus": 2}):
        with pytest.raises(TypeError) as wanted:  # the first option it does not take
            check_keywords(function, name, options)
        with pytest.raises(TypeError) as got:
            getattr(act, name)(rewards, **options)
        assert str(got.value) == str(wanted.value)
        assert str(got.value).startswith(f"estimator {name!r} takes no option ")
    # the registry's dispatcher says the same for its methods
    if name in advcal.ESTIMATORS:
        with pytest.raises(TypeError) as via_registry:
            act.advantages(rewards, method=name, bogus=1)
        with pytest.raises(TypeError) as direct:
            getattr(act, name)(rewards, bogus=1)
        assert str(via_registry.value) == str(direct.value)


def test_bad_input_raises_what_it_raised_before() -> None:
    with pytest.raises(TypeError, match=r"^`rewards` must be a torch.Tensor; got list\.$"):
        act.grpo(REWARDS)
    with pytest.raises(ValueError, match="`rewards` is on the meta device and holds no data"):
        act.grpo(torch.empty(2, 4, device="meta"))
    with pytest.raises(TypeError, match=r"^`rewards` must hold real numbers; got dtype "
                                        r"torch.complex64\.$"):
        act.grpo(torch.zeros(2, 4, dtype=torch.complex64))
    with pytest.raises(TypeError, match=r"^`lengths` must be a torch.Tensor"):
        act.to_numpy([1, 2], "lengths")
    # the numpy function's own checks, message for message
    bad = torch.tensor([[1.0, float("nan")]])
    for call in (lambda f, x: f(x), lambda f, x: f(x, eps=-1.0),
                 lambda f, x: f(x, singleton="nope")):
        with pytest.raises((TypeError, ValueError)) as wanted:
            call(advcal.grpo, bad.numpy())
        with pytest.raises(type(wanted.value)) as got:
            call(act.grpo, bad)
        assert str(got.value) == str(wanted.value)
    with pytest.raises(ValueError) as wanted:
        advcal.grpo(np.zeros(4), np.array([0, 5]))
    with pytest.raises(ValueError) as got:
        act.grpo(torch.zeros(4), torch.tensor([0, 5]))
    assert str(got.value) == str(wanted.value)


def test_the_signature_is_read_once_not_at_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    rewards = torch.tensor(REWARDS)
    act.grpo(rewards, eps=1e-4)
    assert inspect.signature(act.grpo) == inspect.signature(advcal.grpo)

    def refuse(*args, **kwargs):
        raise AssertionError("inspect.signature called per call")

    monkeypatch.setattr(inspect, "signature", refuse)
    expected = _expected("grpo", rewards, eps=1e-4, ddof=0)
    _assert_same(act.grpo(rewards, eps=1e-4, ddof=0), expected)
    _assert_same(act.opo(rewards, lengths=torch.ones(3, 4)),
                 _expected("opo", rewards, lengths=np.ones((3, 4), dtype=np.float32)))


def test_from_numpy_converts_only_what_it_must() -> None:
    like = torch.zeros(2, dtype=torch.float64)
    native = np.array([1.0, -1.0])
    out = act.from_numpy(native, like)
    assert out.dtype == torch.float64 and np.shares_memory(out.numpy(), native)
    swapped = native.astype(">f8")
    out = act.from_numpy(swapped, like)
    assert out.dtype == torch.float64 and out.tolist() == [1.0, -1.0]
    assert not np.shares_memory(out.numpy(), swapped)
    strided = np.arange(6.0)[::2]
    assert act.from_numpy(strided, like).tolist() == [0.0, 2.0, 4.0]
    half = act.from_numpy(native, torch.zeros(2, dtype=torch.bfloat16))
    assert half.dtype == torch.bfloat16
    mask = act.from_numpy(np.array([True, False]), like)
    assert mask.dtype == torch.bool
    assert act.from_numpy(np.float64(2.5), like) == 2.5
    assert act.from_numpy(np.array(3.0), like).shape == ()
    with pytest.raises(TypeError, match="must hold booleans or numbers"):
        act.from_numpy(np.array(["a"]), like)
