"""The estimators with torch tensors in and out (see ``advcal.torch``)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from advcal._validation import check_keywords

_HALF_NAMES = ("bfloat16", "float16")
_torch_module: Any = None
# torch.float32 and torch.float64 once torch is imported: tensors that numpy holds as they are
_PLAIN_DTYPES: tuple[Any, ...] = ()
# their numpy twins (native byte order), by torch dtype
_TWINS: dict[Any, np.dtype[Any]] = {}
_TENSOR: Any = None  # torch.Tensor once torch is imported


def _torch() -> Any:
    global _torch_module, _PLAIN_DTYPES, _TWINS, _TENSOR
    if _torch_module is None:  # imported once: import_module costs microseconds a call
        try:
            torch = importlib.import_module("torch")
        except ImportError:  # pragma: no cover - exercised only without torch
            raise ImportError(
                "advcal.torch needs PyTorch; install it (pip install torch) or call the "
                "numpy functions of advcal directly."
            ) from None
        _PLAIN_DTYPES = (torch.float32, torch.float64)
        _TWINS = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
        _TENSOR = torch.Tensor
        _torch_module = torch
    return _torch_module


@functools.lru_cache(maxsize=256)
def _accepted_keywords(function: Callable[..., Any]) -> frozenset[str] | None:
    """The keywords ``function`` takes by name, or None where it takes any (``**kwargs``):
    its signature read once, not at every call."""
    params = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(k for k, p in params.items()
                     if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                   inspect.Parameter.POSITIONAL_OR_KEYWORD))


def _check_keywords(function: Callable[..., Any], accepted: frozenset[str] | None,
                    estimator: str, keywords: Any) -> None:
    """``check_keywords`` with the accepted keywords known: only a keyword outside them
    reads the signature again, to raise check_keywords' own message."""
    if accepted is not None and not accepted.issuperset(keywords):
        check_keywords(function, estimator, keywords)


def _is_tensor(value: Any) -> bool:
    torch = _torch()
    return bool(torch.is_tensor(value))


def to_numpy(tensor: Any, name: str = "tensor") -> np.ndarray:
    """A host numpy copy-or-view of a tensor; half precision is widened to float32.

    Parameters
    ----------
    tensor : torch.Tensor
        Any device and dtype; it is detached from the autograd graph.
    name : str, default "tensor"
        The argument name used in error messages.

    Returns
    -------
    ndarray
        float32 for bfloat16/float16 tensors, otherwise the numpy twin of the tensor's dtype.

    Examples
    --------
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> from advcal.torch import to_numpy
    >>> to_numpy(torch.tensor([0.5, 0.25], dtype=torch.bfloat16))
    array([0.5 , 0.25], dtype=float32)
    """
    torch = _torch_module if _torch_module is not None else _torch()
    if not isinstance(tensor, torch.Tensor):  # torch.is_tensor, without its call
        raise TypeError(f"`{name}` must be a torch.Tensor; got {type(tensor).__name__}.")
    if tensor.dtype in _PLAIN_DTYPES and tensor.is_cpu and not tensor.requires_grad:
        return tensor.numpy()  # the common case: every check below would pass
    # a tensor outside autograd is its own detached view: detach() only costs time
    host = tensor.detach() if tensor.requires_grad else tensor
    if host.is_meta:  # shapes only: there are no values to copy
        raise ValueError(f"`{name}` is on the meta device and holds no data; "
                         "materialise it (e.g. .to_empty(device=...) and fill it) first.")
    if host.is_complex():
        raise TypeError(f"`{name}` must hold real numbers; got dtype {host.dtype}.")
    if str(host.dtype).removeprefix("torch.") in _HALF_NAMES:
        host = host.float()
    return np.asarray((host if host.is_cpu else host.cpu()).numpy())


def from_numpy(array: Any, like: Any) -> Any:
    """A tensor from a numpy result, on ``like``'s device and, if floating, in its dtype.

    Floating results take the floating dtype of ``like`` (so bfloat16 input gives bfloat16
    output); when ``like`` is not floating they keep their own dtype.  Boolean and integer
    results (masks, counts) keep theirs.  Arrays in non-native byte order (read from a
    big-endian file, say) are converted to native order, in a copy.  Tuples (named or
    plain) and frozen dataclasses of arrays are converted field by field; scalars and
    other values pass through.

    Parameters
    ----------
    array : ndarray, tuple, dataclass or scalar
        A result of one of advcal's numpy functions.  Arrays must hold booleans or numbers
        of a dtype torch has (not longdouble).
    like : torch.Tensor
        The tensor whose device and floating dtype the result takes.

    Returns
    -------
    torch.Tensor or the same container of tensors

    Examples
    --------
    >>> import numpy as np
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> from advcal.torch import from_numpy
    >>> from_numpy(np.array([1.0, -1.0]), torch.zeros(2, dtype=torch.float16))
    tensor([ 1., -1.], dtype=torch.float16)
    """
    torch = _torch_module if _torch_module is not None else _torch()
    # the common case (a fresh float result for a CPU tensor of its dtype): what the
    # general path below returns, without its checks
    if type(array) is np.ndarray and array.dtype is _TWINS.get(like.dtype) and like.is_cpu \
            and array.flags.c_contiguous:
        return torch.from_numpy(array)
    if isinstance(array, np.ndarray):
        if array.dtype.kind not in "biufc":
            raise TypeError("`array` must hold booleans or numbers to become a tensor; got "
                            f"dtype {array.dtype}.")
        # torch takes native byte order only; order="C" (unlike ascontiguousarray) keeps
        # 0-d arrays 0-d.  A conversion copies: the caller's array is never changed.
        host = array
        if not (type(array) is np.ndarray and array.dtype.isnative
                and array.flags.c_contiguous):
            host = np.asarray(array, dtype=array.dtype.newbyteorder("="), order="C")
        try:
            out = torch.from_numpy(host)
        except TypeError as exc:  # a dtype torch lacks (longdouble, clongdouble)
            raise TypeError(f"`array` has dtype {array.dtype}, which torch cannot hold "
                            f"({exc}).") from None
        if like.is_cpu and out.dtype == like.dtype:
            return out  # what .to() would return, without its call
        if out.is_floating_point() and like.is_floating_point():
            return out.to(device=like.device, dtype=like.dtype)
        return out.to(device=like.device)
    if isinstance(array, tuple):
        converted = [from_numpy(item, like) for item in array]
        return type(array)(*converted) if hasattr(array, "_fields") else tuple(converted)
    if dataclasses.is_dataclass(array) and not isinstance(array, type):
        fields = {
            f.name: from_numpy(getattr(array, f.name), like)
            for f in dataclasses.fields(array)
            if f.init
        }
        return dataclasses.replace(array, **fields)
    return array


def _host_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        key: to_numpy(value, key) if _is_tensor(value) else value
        for key, value in kwargs.items()
    }


def _host_optional(value: Any, name: str) -> Any:
    return to_numpy(value, name) if value is not None and _is_tensor(value) else value


def advantages(
    rewards: Any,
    offsets: Any = None,
    *,
    method: str = "grpo",
    group_ids: Any = None,
    **kwargs: Any,
) -> Any:
    """:func:`advcal.advantages` on torch tensors.

    Parameters
    ----------
    rewards : torch.Tensor, shape (B, G) or (N,)
        Rewards on any device; 1-D needs ``offsets`` or ``group_ids``.
    offsets : torch.Tensor or array_like of int, shape (B + 1,), optional
        CSR group boundaries for 1-D ``rewards``.
    method : str, default "grpo"
        A key of :data:`advcal.ESTIMATORS` (``"grpo"``, ``"rloo"``, ``"maxnorm"``, ...).
    group_ids : torch.Tensor or sequence of hashable, optional
        Per-response group labels (verl's ``uid``) for 1-D ``rewards``.
    **kwargs
        Options of the chosen estimator (``eps``, ``singleton``, ``lengths``, ...);
        tensors among them are converted too.

    Returns
    -------
    torch.Tensor
        Advantages with the device, shape and (floating) dtype of ``rewards``.

    Examples
    --------
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> import advcal.torch as act
    >>> rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    >>> act.advantages(rewards, method="rloo")
    tensor([[ 0.6667, -0.6667, -0.6667,  0.6667],
            [ 0.0000,  0.0000,  0.0000,  0.0000]])
    >>> act.advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), group_ids=torch.tensor([7, 7, 9, 9]),
    ...                method="dr_grpo")
    tensor([ 0.5000, -0.5000,  0.0000,  0.0000])
    """
    from advcal._validation import check_choice
    from advcal.registry import REGISTRY
    from advcal.registry import advantages as np_advantages

    check_choice(method, "method", tuple(REGISTRY))
    function = REGISTRY[method].function
    _check_keywords(function, _accepted_keywords(function), method,
                    {"group_ids": group_ids, **kwargs})
    host = to_numpy(rewards, "rewards")
    result = np_advantages(
        host,
        _host_optional(offsets, "offsets"),
        method=method,
        group_ids=_host_optional(group_ids, "group_ids"),
        **_host_kwargs(kwargs),
    )
    return from_numpy(result, rewards)


def _point_estimator(name: str) -> Any:
    """``advcal.torch.<name>``: the numpy estimator of that name on torch tensors, with
    its signature; an option the estimator does not take is a TypeError naming both."""
    import advcal.estimators as numpy_estimators
    from advcal.registry import REGISTRY

    entry = REGISTRY.get(name)
    numpy_function = entry.function if entry else getattr(numpy_estimators, name)
    # How the example refers to the numpy function (registered ones by name).
    reference = f'advcal.ESTIMATORS["{name}"]' if entry else f"advcal.{name}"
    signature = inspect.signature(numpy_function)
    accepted = _accepted_keywords(numpy_function)

    def estimator(rewards: Any, offsets: Any = None, *, group_ids: Any = None,
                  **options: Any) -> Any:
        if offsets is None and group_ids is None and not options:  # dense (B, G) rewards
            if (rewards.__class__ is _TENSOR and rewards.dtype in _PLAIN_DTYPES
                    and rewards.is_cpu and not rewards.requires_grad):
                # to_numpy's and from_numpy's first cases, without their calls
                host = rewards.numpy()
                result = numpy_function(host)
                if (result.__class__ is np.ndarray and result.dtype is host.dtype
                        and result.flags.c_contiguous):
                    return _torch_module.from_numpy(result)
                return from_numpy(result, rewards)
            return from_numpy(numpy_function(to_numpy(rewards, "rewards")), rewards)
        if options:
            _check_keywords(numpy_function, accepted, name, options)
        result = numpy_function(
            to_numpy(rewards, "rewards"),
            _host_optional(offsets, "offsets"),
            group_ids=_host_optional(group_ids, "group_ids"),
            **(_host_kwargs(options) if options else options),
        )
        return from_numpy(result, rewards)

    estimator.__name__ = estimator.__qualname__ = name
    estimator.__signature__ = signature  # type: ignore[attr-defined]
    rewards, extra = _EXAMPLE_INPUTS.get(name, ("[[1.0, 0.0, 0.5, 0.25]]", ""))
    estimator.__doc__ = (
        f""":func:`advcal.{name}` on torch tensors.

    Takes the arguments of :func:`advcal.{name}`; tensors among them (``rewards``,
    ``offsets``, ``group_ids``, per-response options) are copied to the host.  An option
    :func:`advcal.{name}` does not take is a TypeError naming both.

    Returns
    -------
    torch.Tensor
        Advantages with the device, shape and (floating) dtype of ``rewards``.

    Examples
    --------
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> import advcal
    >>> import advcal.torch as act
    >>> r = torch.tensor({rewards}, dtype=torch.float64)
    >>> out = act.{name}(r{extra})
    >>> ref = {reference}(r.numpy(){extra})
    >>> out.dtype, bool((out.numpy() == ref).all())
    (torch.float64, True)
    """)
    return estimator


# Example inputs of the generated docstrings where the default ones do not fit.
_EXAMPLE_INPUTS = {
    "opo": ("[[1.0, 0.0, 0.5, 0.25]]", ", lengths=[[3, 1, 2, 2]]"),
    "gdpo": ("[[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 1.0]]]", ""),
}


grpo = _point_estimator("grpo")
dr_grpo = _point_estimator("dr_grpo")
rloo = _point_estimator("rloo")
batch_std = _point_estimator("batch_std")
reinforce_pp_baseline = _point_estimator("reinforce_pp_baseline")
opo = _point_estimator("opo")
gpg = _point_estimator("gpg")
passk = _point_estimator("passk")
gdpo = _point_estimator("gdpo")


def registry_estimators(defined: set[str]) -> dict[str, Any]:
    """Every other registered estimator of point rewards under its own name, so that
    ``advcal.torch.<name>`` exists for each key of :data:`advcal.ESTIMATORS`
    (``range`` is :func:`range_advantages`); ``defined``: the names already taken."""
    from advcal.registry import REGISTRY

    return {name: _point_estimator(name) for name, entry in REGISTRY.items()
            if not entry.ranges and name not in defined}


def maxnorm(
    rewards: Any,
    offsets: Any = None,
    *,
    group_ids: Any = None,
    tau_res: float,
    **kwargs: Any,
) -> Any:
    """:func:`advcal.maxnorm` (MaxNorm-AC weights) on torch tensors.

    Parameters
    ----------
    rewards : torch.Tensor, shape (B, G) or (N,)
        Rewards on any device; 1-D needs ``offsets`` or ``group_ids``.
    offsets, group_ids
        As in :func:`advantages`.
    tau_res : float
        The scale floor in reward units.
    **kwargs
        Further options of :func:`advcal.maxnorm` (``baseline``, ``resolution``,
        ``dead_zone``, ``return_scale``, ``bounds``, ``clip``, ...).

    Returns
    -------
    torch.Tensor or MaxNormResult of tensors
        The weights ``w`` with the device, shape and floating dtype of ``rewards``; with
        ``return_scale=True`` a :class:`advcal.MaxNormResult` whose per-group ``scale`` is
        a tensor on the same device and in the same floating dtype.

    Examples
    --------
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> import advcal.torch as act
    >>> act.maxnorm(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.70, 0.70, 0.70, 0.71]]),
    ...             tau_res=0.1)
    tensor([[ 1.0000, -1.0000, -1.0000,  1.0000],
            [-0.0333, -0.0333, -0.0333,  0.1000]])
    """
    from advcal.resolution import maxnorm as np_maxnorm

    result = np_maxnorm(
        to_numpy(rewards, "rewards"),
        _host_optional(offsets, "offsets"),
        group_ids=_host_optional(group_ids, "group_ids"),
        tau_res=tau_res,
        **_host_kwargs(kwargs),
    )
    return from_numpy(result, rewards)


def range_advantages(
    lo: Any,
    hi: Any,
    offsets: Any = None,
    *,
    group_ids: Any = None,
    **kwargs: Any,
) -> Any:
    """:func:`advcal.range_advantages` (Range-GRPO interval advantages) on torch tensors.

    Parameters
    ----------
    lo, hi : torch.Tensor, shape (B, G) or (N,)
        Lower and upper reward-range bounds, ``lo <= hi``, on any device.
    offsets, group_ids
        As in :func:`advantages`.
    **kwargs
        Further options of :func:`advcal.range_advantages` (``relation``, ``backend``).

    Returns
    -------
    torch.Tensor
        Advantages with the device, shape and floating dtype of ``lo``.

    Examples
    --------
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> import advcal.torch as act
    >>> lo = torch.tensor([[0.0, 0.5, 0.9]])
    >>> hi = torch.tensor([[0.2, 0.7, 1.0]])
    >>> act.range_advantages(lo, hi)
    tensor([[-0.3333,  0.0333,  0.3000]])
    """
    from advcal.ranges import range_advantages as np_range_advantages

    result = np_range_advantages(
        to_numpy(lo, "lo"),
        to_numpy(hi, "hi"),
        _host_optional(offsets, "offsets"),
        group_ids=_host_optional(group_ids, "group_ids"),
        **_host_kwargs(kwargs),
    )
    return from_numpy(result, lo)


def setgrpo(
    rewards: Any,
    offsets: Any = None,
    *,
    group_ids: Any = None,
    gram: Any,
    calibration: Any,
    tau: Any,
    **kwargs: Any,
) -> Any:
    """:func:`advcal.setgrpo` (one SetGRPO step) on torch tensors.

    Parameters
    ----------
    rewards : torch.Tensor, shape (B, G) or (N,)
        Training scores on any device.
    offsets, group_ids
        As in :func:`advantages`.
    gram : torch.Tensor or array_like
        Gram matrices of the responses' policy gradients, ``(B, G, G)`` for dense rewards
        (flat row-major blocks for ragged ones), e.g. from gradient sketches on the device.
    calibration : SetCalibration
        From :func:`advcal.calibrate_sets`, on groups independent of this batch.
    tau : float, ThresholdSelection or None
        The threshold, typically from :func:`advcal.select_threshold`.
    **kwargs
        Further options of :func:`advcal.setgrpo` (``noise_var``, ``backend``).

    Returns
    -------
    Recovery of tensors
        ``coefficients`` (to write into the GRPO loss in place of the advantages; 0 for
        rejected groups) and ``anchors`` with the device, shape and floating dtype of
        ``rewards``; per-group ``eta``, ``m_full``, ``m_reward`` on the same device and in
        the same floating dtype; ``accepted`` as a bool tensor.

    Examples
    --------
    >>> import pytest; torch = pytest.importorskip("torch")
    >>> import advcal
    >>> import advcal.torch as act
    >>> from advcal.simulate import gram_matrices, paired_scorings
    >>> cal = advcal.calibrate_sets(*paired_scorings(2000, 4, scale=0.02, seed=0).scores,
    ...                             alpha=0.1)
    >>> scores = torch.tensor([[0.20, 0.13, 0.13, 0.14], [0.11, 0.26, 0.22, 0.68]])
    >>> gram = torch.from_numpy(gram_matrices(2, 4, seed=4).gram)
    >>> out = act.setgrpo(scores, gram=gram, calibration=cal, tau=0.25)
    >>> out.accepted
    tensor([False,  True])
    >>> out.coefficients.dtype, out.coefficients.shape
    (torch.float32, torch.Size([2, 4]))
    """
    from advcal.risk import setgrpo as np_setgrpo

    result = np_setgrpo(
        to_numpy(rewards, "rewards"),
        _host_optional(offsets, "offsets"),
        group_ids=_host_optional(group_ids, "group_ids"),
        gram=_host_optional(gram, "gram"),
        calibration=calibration,
        tau=tau,
        **_host_kwargs(kwargs),
    )
    return from_numpy(result, rewards)


