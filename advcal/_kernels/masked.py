"""Masked-vector loops over one group, as numba intrinsics written in LLVM IR.

Why: on ragged batches of small groups (sizes 2..30, as trainers filter and pad), the
loops LLVM vectorizes over a group end in a vector epilogue and a scalar remainder whose
trip counts change from group to group; their mispredicted exits cost more than the
arithmetic.  These loops instead cover a group in chunks of ``CHUNK`` rewards, as
8-lane loads and stores masked to the group's own rewards, so one loop exit per group
remains.  A kernel's write loop repeats the trip count of its sums loop just before, and
the branch predictor, having just seen it, gets that exit right.  Measured serially on
2**15 groups (grpo): 0.97 ns a reward on random sizes 2..30, 1.40 with LLVM's loops; 0.81
against 0.84 on groups of 16 (0.90 and 0.72 with ``reciprocals``).  Masked-off lanes are
neither read nor written (``llvm.masked.load`` and ``llvm.masked.store``), so no access
leaves the group.

Arithmetic is float64 whatever the array dtype, in a fixed order (blocks pairwise, then
lanes pairwise).  The intrinsics add no fast-math flags of their own (but for "nnan" on
min/max, see ``_math``); a calling kernel's flags would apply to them as to the rest of
its code, so the kernels that call them are compiled without any (``modes.EXACT``).

Every intrinsic takes a 1-D C-contiguous float32/float64 array, the index ``lo`` of the
group's first reward and its size ``n``; callers guarantee ``0 <= lo`` and
``lo + n <= x.size``.

numba's on-disk cache keys a kernel on its own module's file only: after editing this
file, delete the ``*.nbi``/``*.nbc`` files under ``advcal/_kernels/__pycache__`` (or touch
the kernel modules), or the cached kernels keep the old loops.

Where the CPU has no masked vector loads and stores (x86 before AVX2, ARM without SVE),
LLVM emulates them lane by lane: grpo then measured 2.3-2.6 ns a reward against 1.1-1.6
for LLVM's own loops (``NUMBA_CPU_NAME=generic``); the masked loops therefore run only on
AVX-512 (see ``_has_native_masked_ops``).  ``ENABLED`` tells the kernels which
loops to run; the environment variable ``ADVCAL_GROUP_LOOPS`` (``auto``, ``masked`` or
``plain``) overrides it, e.g. to test both kinds on one machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic as numba_intrinsic

LANES = 8
BLOCKS = 1  # 8-lane blocks per chunk: 1 measured faster than 2 or 4 on groups of 2..30
CHUNK = LANES * BLOCKS  # at most 63: a chunk's lane mask is the low bits of an int64

_I1 = ir.IntType(1)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F64 = ir.DoubleType()
_V64 = ir.VectorType(_F64, LANES)
_VI64 = ir.VectorType(_I64, LANES)
_FLOAT_DTYPES = (types.float32, types.float64)


_NATIVE_FEATURES = ("avx512f", "avx512vl")


def _has_native_masked_ops() -> bool:
    """Whether numba compiles for a CPU with fast masked vector loads and stores.

    AVX-512 (with VL, for the 256-bit float32 blocks) has them natively.  AVX2's
    ``vmaskmovpd`` would do, but its stores are microcoded on AMD CPUs before Zen 4, and
    only Zen 4 was measured here, so AVX2-only CPUs keep LLVM's loops.
    """
    from numba.core import config

    features = getattr(config, "CPU_FEATURES", None)
    if features:  # the user fixed numba's target features (NUMBA_CPU_FEATURES)
        return all(f"+{name}" in features.split(",") for name in _NATIVE_FEATURES)
    if getattr(config, "CPU_NAME", None) not in (None, "", "host"):
        return False  # a named (often generic, portable) target: do not guess
    import llvmlite.binding as llvm

    try:
        host = llvm.get_host_cpu_features()
    except RuntimeError:  # not available on this platform
        return False
    return all(host.get(name, False) for name in _NATIVE_FEATURES)


def _enabled() -> bool:
    choice = os.environ.get("ADVCAL_GROUP_LOOPS", "auto")
    if choice not in ("auto", "masked", "plain"):
        raise ValueError("The environment variable ADVCAL_GROUP_LOOPS must be 'auto', "
                         f"'masked' or 'plain'; got {choice!r}.")
    return choice == "masked" or (choice == "auto" and _has_native_masked_ops())


ENABLED = _enabled()


def intrinsic(typing: Callable[..., Any]) -> Any:
    """numba's ``intrinsic``; typed ``Any``, since kernels call the result without the
    typing context its definition takes first."""
    return numba_intrinsic(typing)


def _is_flat_float(x: Any) -> bool:
    return (isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C"
            and x.dtype in _FLOAT_DTYPES)


def _splat(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    vector = ir.VectorType(value.type, LANES)
    single = builder.insert_element(ir.Constant(vector, ir.Undefined), value,
                                    ir.Constant(_I32, 0))
    return builder.shuffle_vector(single, ir.Constant(vector, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))


def _declare(builder: ir.IRBuilder, name: str, fnty: ir.FunctionType) -> ir.Function:
    return cgutils.get_or_insert_function(builder.module, fnty, name)


def _vector_suffix(vector: ir.VectorType) -> str:
    return f"v{LANES}{'f64' if vector.element == _F64 else 'f32'}"


def _pointer_suffix(vector: ir.VectorType) -> str:
    # Typed-pointer LLVM (older llvmlite) mangles the pointee into the intrinsic's name.
    pointer = vector.as_pointer()
    return "p0" if getattr(pointer, "is_opaque", False) else "p0" + _vector_suffix(vector)


def _masked_load(builder: ir.IRBuilder, pointer: ir.Value, mask: ir.Value,
                 element: ir.Type, fill: ir.Value | None = None) -> ir.Value:
    """The masked lanes of a vector at ``pointer``, as float64; the other lanes hold
    ``fill`` (a float64 scalar of ``element`` precision), or 0."""
    vector = ir.VectorType(element, LANES)
    name = f"llvm.masked.load.{_vector_suffix(vector)}.{_pointer_suffix(vector)}"
    fnty = ir.FunctionType(vector, [vector.as_pointer(), _I32, mask.type, vector])
    align = ir.Constant(_I32, 8 if element == _F64 else 4)
    if fill is None:
        passthru = ir.Constant(vector, [0.0] * LANES)
    else:
        passthru = _splat(builder, fill if element == _F64 else builder.fptrunc(fill, element))
    loaded = builder.call(_declare(builder, name, fnty),
                          [builder.bitcast(pointer, vector.as_pointer()), align, mask,
                           passthru])
    return loaded if element == _F64 else builder.fpext(loaded, _V64)


def _masked_store(builder: ir.IRBuilder, value: ir.Value, pointer: ir.Value,
                  mask: ir.Value, element: ir.Type) -> None:
    """Store the masked lanes of float64 ``value`` at ``pointer`` (rounded to ``element``)."""
    vector = ir.VectorType(element, LANES)
    if element != _F64:
        value = builder.fptrunc(value, vector)
    name = f"llvm.masked.store.{_vector_suffix(vector)}.{_pointer_suffix(vector)}"
    fnty = ir.FunctionType(ir.VoidType(), [vector, vector.as_pointer(), _I32, mask.type])
    align = ir.Constant(_I32, 8 if element == _F64 else 4)
    builder.call(_declare(builder, name, fnty),
                 [value, builder.bitcast(pointer, vector.as_pointer()), align, mask])


def _math(builder: ir.IRBuilder, name: str, *args: ir.Value, no_nan: bool = False
          ) -> ir.Value:
    """``llvm.<name>`` (minnum, maxnum, rint, fabs) on float64 scalars or vectors.

    ``no_nan`` flags the call "nnan": x86 then takes one min/max instruction instead of
    three, and a NaN operand gives an unspecified value, so callers test finiteness
    separately and branch on no result a NaN may have reached."""
    kind = args[0].type
    suffix = f"v{kind.count}f64" if isinstance(kind, ir.VectorType) else "f64"
    fnty = ir.FunctionType(kind, [kind] * len(args))
    return builder.call(_declare(builder, f"llvm.{name}.{suffix}", fnty), list(args),
                        fastmath=("nnan", "nsz") if no_nan else ())


def _reduce(builder: ir.IRBuilder, vector: ir.Value,
            combine: Callable[[ir.Value, ir.Value], ir.Value]) -> ir.Value:
    """Combine the lanes pairwise (halves, quarters, ...): a fixed order."""
    width = LANES
    while width > 1:
        half = width // 2
        low = builder.shuffle_vector(vector, vector,
                                     ir.Constant(ir.VectorType(_I32, half), list(range(half))))
        high = builder.shuffle_vector(
            vector, vector, ir.Constant(ir.VectorType(_I32, half), list(range(half, width))))
        vector = combine(low, high)
        width = half
    return builder.extract_element(vector, ir.Constant(_I32, 0))


def _pairwise(values: list[ir.Value], combine: Callable[[ir.Value, ir.Value], ir.Value]
              ) -> ir.Value:
    while len(values) > 1:
        values = [combine(a, b) for a, b in zip(values[::2], values[1::2], strict=True)]
    return values[0]


class _Group:
    """Pointers into one group of an array argument."""

    def __init__(self, context: Any, builder: ir.IRBuilder, array_type: Any,
                 array: ir.Value, lo: ir.Value) -> None:
        data = context.make_array(array_type)(context, builder, array).data
        self.element = context.get_data_type(array_type.dtype)
        self.base = builder.gep(data, [lo])

    def pointer(self, builder: ir.IRBuilder, index: ir.Value) -> ir.Value:
        return builder.gep(self.base, [index])


def _chunks(builder: ir.IRBuilder, n: ir.Value) -> Iterator[ir.Value]:
    """Emit ``do { body(start) } while ((start += CHUNK) < n)``; yields ``start`` once,
    with the builder inside the loop body.  Runs once for n <= CHUNK (also for n = 0:
    every lane masked off)."""
    start_slot = cgutils.alloca_once_value(builder, ir.Constant(_I64, 0))
    body = builder.append_basic_block("chunk")
    done = builder.append_basic_block("chunk.done")
    builder.branch(body)
    builder.position_at_end(body)
    start = builder.load(start_slot)
    yield start
    following = builder.add(start, ir.Constant(_I64, CHUNK))
    builder.store(following, start_slot)
    builder.cbranch(builder.icmp_signed("<", following, n), body, done)
    builder.position_at_end(done)


def _blocks(builder: ir.IRBuilder, start: ir.Value, n: ir.Value
            ) -> Iterator[tuple[int, ir.Value, ir.Value]]:
    """(block number, index of its first lane, mask of lanes < n) of one chunk.

    The masks are bits of one integer (lane i of the chunk valid: bit i), cut into bytes:
    integer instructions, where comparing lane indices takes three vector ones per block
    (the sums of a group took 9.6 ns with those, 7.9 with these)."""
    remaining = builder.sub(n, start)
    full = builder.icmp_signed(">=", remaining, ir.Constant(_I64, CHUNK))
    shift = builder.select(full, ir.Constant(_I64, 0), remaining)
    bits = builder.sub(builder.shl(ir.Constant(_I64, 1), shift), ir.Constant(_I64, 1))
    bits = builder.select(full, ir.Constant(_I64, (1 << CHUNK) - 1), bits)
    mask_type = ir.VectorType(_I1, LANES)
    for k in range(BLOCKS):
        first = builder.add(start, ir.Constant(_I64, k * LANES))
        byte = builder.trunc(builder.lshr(bits, ir.Constant(_I64, k * LANES)),
                             ir.IntType(LANES))
        yield k, first, builder.bitcast(byte, mask_type)


class _Accumulators:
    """One float64 vector per block, kept in stack slots that LLVM promotes to registers."""

    def __init__(self, builder: ir.IRBuilder, fill: float) -> None:
        self.slots = [cgutils.alloca_once_value(builder, ir.Constant(_V64, [fill] * LANES))
                      for _ in range(BLOCKS)]

    def update(self, builder: ir.IRBuilder, k: int,
               combine: Callable[[ir.Value, ir.Value], ir.Value], value: ir.Value) -> None:
        """Block k's accumulator becomes ``combine(accumulator, value)``."""
        builder.store(combine(builder.load(self.slots[k]), value), self.slots[k])

    def total(self, builder: ir.IRBuilder,
              combine: Callable[[ir.Value, ir.Value], ir.Value]) -> ir.Value:
        vector = _pairwise([builder.load(slot) for slot in self.slots], combine)
        return _reduce(builder, vector, combine)


def _select_lanes(builder: ir.IRBuilder, mask: ir.Value, value: ir.Value,
                  fill: float) -> ir.Value:
    return builder.select(mask, value, ir.Constant(_V64, [fill] * LANES))


def _min(builder: ir.IRBuilder) -> Callable[[ir.Value, ir.Value], ir.Value]:
    return lambda a, b: _math(builder, "minnum", a, b, no_nan=True)


def _max(builder: ir.IRBuilder) -> Callable[[ir.Value, ir.Value], ir.Value]:
    return lambda a, b: _math(builder, "maxnum", a, b, no_nan=True)


def _first_reward(builder: ir.IRBuilder, group: _Group, n: ir.Value) -> ir.Value:
    """x[lo] as float64, or 0.0 for an empty group (whose lo may be x.size): a load from
    a zero on the stack instead, so that no branch is needed."""
    zero = cgutils.alloca_once_value(builder, ir.Constant(group.element, 0.0))
    nonempty = builder.icmp_signed(">", n, ir.Constant(_I64, 0))
    value = builder.load(builder.select(nonempty, group.base, zero))
    return value if group.element == _F64 else builder.fpext(value, _F64)


@intrinsic
def group_sums(typingctx: Any, x: Any, lo: Any, n: Any) -> Any:
    """``(shift, t1, t2, low, high)`` of the group ``x[lo:lo + n]``: its first reward
    (0.0 if n = 0), the sums of d = v - shift and of d², and its smallest and largest
    reward.  A constant group has t1 = t2 = 0 exactly.  A NaN or inf reward makes t1 and
    t2 NaN or inf; ``low``/``high`` are then unspecified (see ``_math``)."""
    if not _is_flat_float(x):
        return None
    sig = types.UniTuple(types.float64, 5)(x, types.intp, types.intp)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        x_value, lo_value, n_value = args
        group = _Group(context, builder, signature.args[0], x_value, lo_value)
        shift = _first_reward(builder, group, n_value)
        shift_splat = _splat(builder, shift)
        sums = _Accumulators(builder, 0.0)
        squares = _Accumulators(builder, 0.0)
        lows = _Accumulators(builder, float("inf"))
        highs = _Accumulators(builder, float("-inf"))
        for start in _chunks(builder, n_value):
            for k, first, mask in _blocks(builder, start, n_value):
                v = _masked_load(builder, group.pointer(builder, first), mask, group.element)
                d = _select_lanes(builder, mask, builder.fsub(v, shift_splat), 0.0)
                sums.update(builder, k, builder.fadd, d)
                squares.update(builder, k, builder.fadd, builder.fmul(d, d))
                # the shift is a member of the group: as a masked lane it changes no extreme
                member = builder.select(mask, v, shift_splat)
                lows.update(builder, k, _min(builder), member)
                highs.update(builder, k, _max(builder), member)
        results = [shift, sums.total(builder, builder.fadd),
                   squares.total(builder, builder.fadd),
                   lows.total(builder, _min(builder)), highs.total(builder, _max(builder))]
        return context.make_tuple(builder, signature.return_type, results)

    return sig, codegen


@intrinsic
def group_sum_squares(typingctx: Any, x: Any, lo: Any, n: Any, shift: Any, mean: Any) -> Any:
    """Sum of ((v - shift) - mean)² over the group ``x[lo:lo + n]`` (the two-pass sum of
    squares, for groups where t2 - t1 * mean cancels)."""
    if not _is_flat_float(x):
        return None
    sig = types.float64(x, types.intp, types.intp, types.float64, types.float64)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        x_value, lo_value, n_value, shift_value, mean_value = args
        group = _Group(context, builder, signature.args[0], x_value, lo_value)
        shift_splat = _splat(builder, shift_value)
        mean_splat = _splat(builder, mean_value)
        squares = _Accumulators(builder, 0.0)
        for start in _chunks(builder, n_value):
            for k, first, mask in _blocks(builder, start, n_value):
                v = _masked_load(builder, group.pointer(builder, first), mask, group.element)
                d = builder.fsub(builder.fsub(v, shift_splat), mean_splat)
                d = _select_lanes(builder, mask, d, 0.0)
                squares.update(builder, k, builder.fadd, builder.fmul(d, d))
        return squares.total(builder, builder.fadd)

    return sig, codegen


def _map_group(context: Any, builder: ir.IRBuilder, signature: Any, args: Any,
               lanes: Callable[[ir.Value], ir.Value]) -> Any:
    """``out[i] = lanes(x[i])`` over the group of size ``n`` at ``lo``, for an intrinsic
    whose first arguments are ``(x, out, lo, n)``; ``lanes`` maps float64 vectors."""
    x_value, out_value, lo_value, n_value = args[:4]
    source = _Group(context, builder, signature.args[0], x_value, lo_value)
    target = _Group(context, builder, signature.args[1], out_value, lo_value)
    for start in _chunks(builder, n_value):
        for _, first, mask in _blocks(builder, start, n_value):
            v = _masked_load(builder, source.pointer(builder, first), mask, source.element)
            _masked_store(builder, lanes(v), target.pointer(builder, first), mask,
                          target.element)
    return context.get_dummy_value()


@intrinsic
def write_centered(typingctx: Any, x: Any, out: Any, lo: Any, n: Any, shift: Any,
                   mean: Any, factor: Any) -> Any:
    """``out[i] = (x[i] - (shift + mean)) * factor`` over the group at ``lo``.

    One subtraction per reward, not two; a constant group (mean exactly 0) still gives
    exact zeros."""
    if not (_is_flat_float(x) and _is_flat_float(out)):
        return None
    sig = types.void(x, out, types.intp, types.intp, types.float64, types.float64,
                     types.float64)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        shift_value, mean_value, factor_value = args[4:]
        center_splat = _splat(builder, builder.fadd(shift_value, mean_value))
        factor_splat = _splat(builder, factor_value)
        return _map_group(context, builder, signature, args,
                          lambda v: builder.fmul(builder.fsub(v, center_splat), factor_splat))

    return sig, codegen


def _clamp(builder: ir.IRBuilder, value: ir.Value, low: ir.Value, high: ir.Value
           ) -> ir.Value:
    """min(max(value, low), high); unspecified for a NaN value."""
    return _min(builder)(_max(builder)(value, low), high)


class _Weights:
    """The lanes of MaxNorm weights: ``u = (v - (shift + mean)) * factor``, 0 where
    ``|u| < dead_zone`` (``dead_zone`` None: no dead zone, and no select), then
    ``min(max(u * (1 / scale), -1), 1)``."""

    def __init__(self, builder: ir.IRBuilder, shift: ir.Value, mean: ir.Value,
                 factor: ir.Value, scale: ir.Value, dead_zone: ir.Value | None) -> None:
        self.builder = builder
        self.center = _splat(builder, builder.fadd(shift, mean))
        self.factor = _splat(builder, factor)
        self.dead_zone = None if dead_zone is None else _splat(builder, dead_zone)
        # one division per group, not per reward (a vector division costs as much as ten
        # multiplications); u * (1 / s) is within an ulp of u / s, and the clamp keeps
        # |w| <= 1 where that ulp would cross it
        self.inverse = _splat(builder, builder.fdiv(ir.Constant(_F64, 1.0), scale))

    def of(self, v: ir.Value) -> ir.Value:
        builder = self.builder
        u = builder.fmul(builder.fsub(v, self.center), self.factor)
        if self.dead_zone is not None:
            small = builder.fcmp_ordered("<", _math(builder, "fabs", u), self.dead_zone)
            u = builder.select(small, ir.Constant(_V64, [0.0] * LANES), u)
        return _clamp(builder, builder.fmul(u, self.inverse),
                      ir.Constant(_V64, [-1.0] * LANES), ir.Constant(_V64, [1.0] * LANES))


def _weights_typing(dead_zone: Any) -> tuple[Any, bool]:
    """The type of a ``dead_zone`` argument (float64 or None) and whether there is one."""
    with_dead_zone = not isinstance(dead_zone, types.NoneType)
    return (types.float64 if with_dead_zone else dead_zone), with_dead_zone


@intrinsic
def write_weights(typingctx: Any, x: Any, out: Any, lo: Any, n: Any, shift: Any,
                  mean: Any, factor: Any, scale: Any, dead_zone: Any) -> Any:
    """MaxNorm weights over the group at ``lo``: ``u = (x[i] - (shift + mean)) * factor``,
    0 where ``|u| < dead_zone``, then ``out[i] = min(max(u * (1 / scale), -1), 1)``.
    ``dead_zone=None``: no dead zone, and no select in the loop."""
    if not (_is_flat_float(x) and _is_flat_float(out)):
        return None
    dead_zone_type, with_dead_zone = _weights_typing(dead_zone)
    sig = types.void(x, out, types.intp, types.intp, *[types.float64] * 4, dead_zone_type)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        shift, mean, factor, scale = args[4:8]
        weights = _Weights(builder, shift, mean, factor, scale,
                           args[8] if with_dead_zone else None)
        return _map_group(context, builder, signature, args, weights.of)

    return sig, codegen


class _Binning:
    """The lanes of the Reward-Resolution Protocol: ``k = min(max(rint((v - lo) *
    inv_delta), 0), kmax)`` after an optional clip of v to ``[lo, hi]``, then
    ``min(lo + k / inv_delta, hi)``."""

    def __init__(self, builder: ir.IRBuilder, lo: ir.Value, hi: ir.Value, clip: ir.Value,
                 inv_delta: ir.Value, kmax: ir.Value) -> None:
        self.builder = builder
        self.lo, self.hi, self.inv_delta, self.kmax = (
            _splat(builder, value) for value in (lo, hi, inv_delta, kmax))
        self.clip = builder.trunc(clip, _I1) if clip.type != _I1 else clip

    def of(self, v: ir.Value) -> ir.Value:
        builder = self.builder
        v = builder.select(self.clip, _clamp(builder, v, self.lo, self.hi), v)
        index = _math(builder, "rint", builder.fmul(builder.fsub(v, self.lo), self.inv_delta))
        index = _clamp(builder, index, ir.Constant(_V64, [0.0] * LANES), self.kmax)
        return _min(builder)(builder.fadd(self.lo, builder.fdiv(index, self.inv_delta)),
                             self.hi)


_BINNING_TYPES = (types.float64, types.float64, types.boolean, types.float64, types.float64)


def _count(builder: ir.IRBuilder, flags: ir.Value) -> ir.Value:
    """The number of true lanes of an <8 x i1>, as i64 (a popcount of its bits)."""
    bits = builder.zext(builder.bitcast(flags, ir.IntType(LANES)), _I64)
    return builder.call(_declare(builder, "llvm.ctpop.i64", ir.FunctionType(_I64, [_I64])),
                        [bits])


@intrinsic
def write_binned(typingctx: Any, x: Any, out: Any, lo_index: Any, n: Any, lo: Any,
                 hi: Any, clip: Any, inv_delta: Any, kmax: Any) -> Any:
    """Bin the group at ``lo_index`` into ``out`` (the Reward-Resolution Protocol):
    ``k = min(max(rint((v - lo) * inv_delta), 0), kmax)`` after an optional clip of v to
    ``[lo, hi]``, ``out[i] = min(lo + k / inv_delta, hi)``.  Returns ``(n_nan, low, high,
    shift, total)``: the number of NaN rewards, the smallest and largest reward
    (unspecified if ``n_nan > 0``; both the first reward, or 0.0, for n <= 1), the first
    binned reward and the sum of binned rewards minus it, in float64 whatever the dtype
    of ``out`` (a group of equal bins sums to exactly 0; NaN rewards leave the sum
    unspecified).  Binning is monotone, so the extreme bin indices are those of ``low``
    and ``high``."""
    if not (_is_flat_float(x) and _is_flat_float(out)):
        return None
    sig = types.Tuple((types.intp, *[types.float64] * 4))(
        x, out, types.intp, types.intp, *_BINNING_TYPES)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        x_value, out_value, lo_index, n_value = args[:4]
        binning = _Binning(builder, *args[4:9])
        source = _Group(context, builder, signature.args[0], x_value, lo_index)
        target = _Group(context, builder, signature.args[1], out_value, lo_index)
        first_reward = _first_reward(builder, source, n_value)
        # the first reward binned by the same lane operations as every reward
        shift_splat = binning.of(_splat(builder, first_reward))
        n_nan = cgutils.alloca_once_value(builder, ir.Constant(_I64, 0))
        lows = _Accumulators(builder, float("inf"))
        highs = _Accumulators(builder, float("-inf"))
        sums = _Accumulators(builder, 0.0)
        for start in _chunks(builder, n_value):
            for k, first, mask in _blocks(builder, start, n_value):
                # masked-off lanes hold the first reward, a member: no extreme changes
                v = _masked_load(builder, source.pointer(builder, first), mask, source.element,
                                 fill=first_reward)
                nan = builder.and_(mask, builder.fcmp_unordered("uno", v, v))
                builder.store(builder.add(builder.load(n_nan), _count(builder, nan)), n_nan)
                lows.update(builder, k, _min(builder), v)
                highs.update(builder, k, _max(builder), v)
                binned = binning.of(v)
                # (masked-off lanes bin the first reward: their difference is 0 already)
                sums.update(builder, k, builder.fadd, builder.fsub(binned, shift_splat))
                _masked_store(builder, binned, target.pointer(builder, first), mask,
                              target.element)
        results = [builder.load(n_nan), lows.total(builder, _min(builder)),
                   highs.total(builder, _max(builder)),
                   builder.extract_element(shift_splat, ir.Constant(_I32, 0)),
                   sums.total(builder, builder.fadd)]
        return context.make_tuple(builder, signature.return_type, results)

    return sig, codegen


@intrinsic
def write_binned_weights(typingctx: Any, x: Any, out: Any, lo_index: Any, n: Any, lo: Any,
                         hi: Any, clip: Any, inv_delta: Any, kmax: Any, shift: Any,
                         mean: Any, factor: Any, scale: Any, dead_zone: Any) -> Any:
    """``write_weights`` of the group's binned rewards, binned again from ``x`` as
    ``write_binned`` bins them (in float64: for a float32 ``out``, which could not hold
    them exactly between the passes)."""
    if not (_is_flat_float(x) and _is_flat_float(out)):
        return None
    dead_zone_type, with_dead_zone = _weights_typing(dead_zone)
    sig = types.void(x, out, types.intp, types.intp, *_BINNING_TYPES,
                     *[types.float64] * 4, dead_zone_type)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        binning = _Binning(builder, *args[4:9])
        shift, mean, factor, scale = args[9:13]
        weights = _Weights(builder, shift, mean, factor, scale,
                           args[13] if with_dead_zone else None)
        return _map_group(context, builder, signature, args,
                          lambda v: weights.of(binning.of(v)))

    return sig, codegen
