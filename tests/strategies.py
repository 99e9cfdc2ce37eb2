"""Hypothesis strategies shared by the test modules (one place, as in flox)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from advcal import offsets_from_sizes

FLOAT_DTYPES = (np.float32, np.float64)

# Group sizes that exercise every code path: empty, singleton, pair, and larger groups.
group_sizes = st.one_of(st.sampled_from([0, 1, 2]), st.integers(3, 40))


@dataclass
class RaggedBatch:
    values: np.ndarray
    offsets: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)


def reward_values(dtype: type, *, bound: float = 1e3) -> st.SearchStrategy[float]:
    """Finite rewards representable in ``dtype``, with frequent exact ties."""
    width = 32 if dtype == np.float32 else 64
    return st.one_of(
        st.sampled_from([0.0, 0.1, 0.5, 1.0]),
        st.floats(-bound, bound, allow_nan=False, allow_infinity=False, width=width),
    )


@st.composite
def ragged_batches(
    draw: st.DrawFn,
    *,
    dtype: type | None = None,
    max_groups: int = 12,
    bound: float = 1e3,
    min_size: int = 0,
) -> RaggedBatch:
    """A ragged batch: float32 or float64 rewards with groups of size 0, 1, 2 and larger."""
    dtype = dtype or draw(st.sampled_from(FLOAT_DTYPES))
    sizes = draw(st.lists(group_sizes.filter(lambda s: s >= min_size), max_size=max_groups))
    values = []
    for size in sizes:
        if size and draw(st.booleans()) and draw(st.booleans()):
            values += [draw(reward_values(dtype, bound=bound))] * size  # a zero-gap group
        else:
            values += draw(st.lists(reward_values(dtype, bound=bound), min_size=size,
                                    max_size=size))
    return RaggedBatch(np.array(values, dtype=dtype), offsets_from_sizes(np.array(sizes, int)))


@st.composite
def dense_batches(draw: st.DrawFn, *, dtype: type | None = None, bound: float = 1e3
                  ) -> np.ndarray:
    """A dense (B, G) reward matrix."""
    dtype = dtype or draw(st.sampled_from(FLOAT_DTYPES))
    n_groups = draw(st.integers(0, 8))
    width = draw(st.integers(0, 20))
    flat = draw(st.lists(reward_values(dtype, bound=bound), min_size=n_groups * width,
                         max_size=n_groups * width))
    return np.array(flat, dtype=dtype).reshape(n_groups, width)


# --- garbage input for the bad-input fuzz tests (issue 4) ---------------------------------

GARBAGE_DTYPES = (np.bool_, np.int8, np.int64, np.uint64, np.float16, np.float32,
                  np.float64, np.complex128, np.str_, object)


@st.composite
def garbage_arrays(draw: st.DrawFn, *, max_dims: int = 3, max_side: int = 5) -> object:
    """Anything a careless caller might pass: odd shapes, dtypes, NaN/inf, lists, None."""
    kind = draw(st.sampled_from(["array", "array", "array", "scalar", "list", "none"]))
    if kind == "none":
        return None
    if kind == "scalar":
        return draw(st.one_of(st.floats(), st.integers(-(2**70), 2**70), st.booleans(),
                              st.text(max_size=3), st.complex_numbers()))
    if kind == "list":  # possibly ragged nested lists
        return draw(st.lists(st.one_of(st.floats(), st.lists(st.floats(), max_size=3)),
                             max_size=4))
    shape = tuple(draw(st.lists(st.integers(0, max_side), max_size=max_dims)))
    dtype = draw(st.sampled_from(GARBAGE_DTYPES))
    size = int(np.prod(shape)) if shape else 1
    raw = draw(st.lists(st.one_of(st.floats(), st.integers(-1000, 1000),
                                  st.sampled_from([0.0, 0.5, 1.0, -1.0])),
                        min_size=size, max_size=size))
    values = np.array(raw, dtype=object).reshape(shape)
    try:
        with np.errstate(all="ignore"):
            return values.astype(dtype)
    except (ValueError, TypeError, OverflowError):
        return values


# --- adversarial inputs for the standing fuzz suite (tests/test_fuzz.py, issue 16) --------

# Dtypes a caller may hand over: both byte orders, half and extended precision, integers.
FUZZ_DTYPES = ("<f8", ">f8", "<f4", ">f4", "<f2", "longdouble", "<i8", ">i4", "u1", "?")


def _native(dtype: str) -> np.dtype:
    return np.dtype(dtype).newbyteorder("=")


def magnitudes(dtype: str) -> st.SearchStrategy[float]:
    """Values of one magnitude regime of ``dtype``: unit, subnormal, near the largest
    finite value, or anywhere finite (exact in float64 before the cast)."""
    native = _native(dtype)
    if native.kind in "iub":
        info = np.iinfo(native) if native.kind in "iu" else None
        lo, hi = (0, 1) if info is None else (int(info.min), int(info.max))
        return st.one_of(st.sampled_from([lo, hi, 0, 1]), st.integers(lo, hi)).map(float)
    finfo = np.finfo(native if native != np.longdouble else np.float64)
    big = float(finfo.max)
    tiny = float(finfo.smallest_subnormal)
    width = {2: 16, 4: 32}.get(native.itemsize, 64)
    return st.one_of(
        st.sampled_from([0.0, 0.1, 0.5, 1.0, -1.0]),
        st.sampled_from([tiny, -tiny, tiny * 3, float(finfo.smallest_normal)]),
        st.sampled_from([big, -big, big / 2, -big / 2, big / 16, big / 3]),
        st.sampled_from([1e38, -1e38, 9e153, -9e153, 1e308, 3e38]).filter(lambda v: abs(v) <= big),
        st.floats(-big, big, allow_nan=False, allow_infinity=False, width=width),
    )


@st.composite
def one_group(draw: st.DrawFn, *, dtype: str, size: int, nan: bool = True) -> list[float]:
    """One group of rewards in one magnitude regime (sometimes constant; sometimes with a
    NaN or an infinity)."""
    values = magnitudes(dtype)
    if draw(st.integers(0, 4)) == 0:
        group = [draw(values)] * size
    else:
        group = draw(st.lists(values, min_size=size, max_size=size))
    if nan and size and _native(dtype).kind == "f" and draw(st.integers(0, 9)) == 0:
        group[draw(st.integers(0, size - 1))] = draw(st.sampled_from(
            [float("nan"), float("nan"), float("inf")]))
    return group


@st.composite
def fuzz_groups(draw: st.DrawFn, *, dtype: str, max_groups: int = 4, max_size: int = 6,
                nan: bool = True) -> list[list[float]]:
    """Groups of rewards of sizes 0 to ``max_size``, each as :func:`one_group`."""
    return [draw(one_group(dtype=dtype, size=size, nan=nan))
            for size in draw(st.lists(st.integers(0, max_size), max_size=max_groups))]


def as_dtype(values: list[float] | np.ndarray, dtype: str) -> np.ndarray:
    """``values`` cast to ``dtype`` (values that do not fit become inf, as a caller's would)."""
    with np.errstate(all="ignore"):
        wide = np.asarray(values, dtype=np.longdouble if dtype == "longdouble" else np.float64)
        return wide.astype(np.dtype(dtype))


# Labels a verl-style caller might use for groups: ints, strings, mixed types, tuples,
# floats including NaN (which must be rejected).
LABEL_KINDS = ("int", "str", "mixed", "tuple", "float", "nan")


def labels_for(kind: str, n_groups: int) -> list[object]:
    """One distinct label per group (``"nan"``: group 0's label is a NaN float)."""
    if kind == "int":
        return [10 * q - 7 for q in range(n_groups)]
    if kind == "str":
        return [f"uid-{q}" for q in range(n_groups)]
    if kind == "mixed":  # 1 and "1" are different groups
        return [q // 2 if q % 2 == 0 else str(q // 2) for q in range(n_groups)]
    if kind == "tuple":
        return [("p", q) for q in range(n_groups)]
    if kind == "float":
        return [q + 0.5 for q in range(n_groups)]
    return [float("nan")] + [f"uid-{q}" for q in range(1, n_groups)]


@st.composite
def fuzz_batches(draw: st.DrawFn, *, max_groups: int = 4, max_size: int = 6,
                 nan: bool = True) -> tuple[np.ndarray, dict[str, object], str, list[int]]:
    """``(rewards, layout, label_kind, sizes)``: rewards of a fuzz dtype in a dense,
    offsets or group_ids layout (``layout`` holds ``offsets`` / ``group_ids``)."""
    dtype = draw(st.sampled_from(FUZZ_DTYPES))
    layout = draw(st.sampled_from(["dense", "offsets", "group_ids"]))
    if layout == "dense":
        n_groups = draw(st.integers(0, max_groups))
        width = draw(st.integers(0, max_size))
        groups = [draw(one_group(dtype=dtype, size=width, nan=nan)) for _ in range(n_groups)]
        flat = [v for g in groups for v in g]
        rewards = as_dtype(flat, dtype).reshape(n_groups, width)
        return rewards, {}, "none", [width] * n_groups
    groups = draw(fuzz_groups(dtype=dtype, max_groups=max_groups, max_size=max_size, nan=nan))
    sizes = [len(g) for g in groups]
    flat = as_dtype([v for g in groups for v in g], dtype)
    if layout == "offsets":
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        as_list = draw(st.booleans())
        return flat, {"offsets": offsets.tolist() if as_list else offsets}, "none", sizes
    kind = draw(st.sampled_from(LABEL_KINDS))
    labels = labels_for(kind, len(groups))
    ids = [labels[q] for q, g in enumerate(groups) for _ in g]
    perm = draw(st.permutations(range(len(ids))))
    rewards = flat[list(perm)] if perm else flat
    return rewards, {"group_ids": [ids[i] for i in perm]}, kind, sizes


def per_response(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    """Per-response weights (lengths, token counts): ordinary, huge, tiny, zero, bad."""
    size = int(np.prod(shape)) if shape else 0

    def build(regime: str, ints: list[int]) -> np.ndarray:
        base = np.asarray(ints, dtype=np.float64).reshape(shape)
        if regime == "huge":
            return base * 1e307
        if regime == "tiny":
            return base * 1e-300
        if regime == "zero" and size:
            base.reshape(-1)[0] = 0.0
        if regime == "nan" and size:
            base.reshape(-1)[0] = np.nan
        return base

    return st.builds(build, st.sampled_from(["plain", "plain", "huge", "tiny", "zero", "nan"]),
                     st.lists(st.integers(1, 17), min_size=size, max_size=size))


# Option values at and past their limits, per keyword of the estimators.
OPTION_VALUES: dict[str, list[object]] = {
    "eps": [1e-6, 0.0, 1e-4, 1e-320, 1e300, -1e-9, float("nan"), float("inf"), "1"],
    "ddof": [0, 1, 2, 1.0],
    "std_floor": [0.0, 1e-3, 1e300, -1.0],
    "singleton": ["zero", "raw", "error", "drop"],
    "nan_policy": ["raise", "omit", "propagate"],
    "f_norm": [1.0, 1e-320, 1e-300, 1e300, 0.0, -1.0],
    "scale": ["none", "batch", "group"],
    "var_floor": [0.0, 1e-8, 1e300, -1.0],
    "std_norm": [True, False, 1],
    "tau_res": [0.1, 1e-300, 0.0, 1e300, -1.0, float("nan")],
    "baseline": ["rloo", "mean", "median"],
    "resolution": [None, 0.1, 1e-300, 0.0],
    "relation": ["dominance", "bogus"],
}
