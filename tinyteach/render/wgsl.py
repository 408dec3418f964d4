"""Chapter 8 (part 6): WGSL — the shading language of WebGPU.

WGSL looks like Rust more than C, and it is stricter than both:
- no pointers: each buffer is a *binding*, declared once outside the kernel
  (`@group(0) @binding(1) var<storage, read_write> data1: array<f32>;`);
- the kernel is `@compute @workgroup_size(x, y, z) fn name(...)`; a thread's index is the
  `global_invocation_id` builtin, and the output loops are grid-stride loops over it;
- variables are declared `var name: type = value;`, loops are `for (var i: i32 = 0; ...)`;
- no `?:`: `select(if_false, if_true, condition)`;
- few types: i32, u32, f32, bool, and f16 with the `shader-f16` feature. No 64-bit types at
  all, no 8- or 16-bit integers in buffers, and bool cannot live in a buffer. So bools are
  stored as u32 (0 or 1), 8/16-bit integers as 32-bit ones, wrapped back into range after each
  operation that may overflow (int8 127+1 is -128, as numpy says). float64, int64 and uint64 are
  refused with an error that names the dtype — never silently computed in another type;
- WGSL promises nothing about NaN, and lavapipe's compiler takes it at its word: it folds
  `x != x` to false, rewrites `!(a < b)` as `a >= b` and its `max` drops NaN. So float max,
  < and != call small helper functions (`max_f32`, `less_f32`, `not_equal_f32`) that find NaN
  with an integer test on the bits, `(bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u`, which no
  optimizer may fold; a kernel gets only the helpers it uses (the example below shows two).
  The same compiler folds `x - x` and `x * 0.0` to 0 and mishandles subnormals in log2 and
  exp2: those get helpers too (`minus_itself_f32`, `times_zero_f32`, `log2_f32`, ...);
- WGSL's float `%` is x - y * trunc(x / y), rounded, not C's exact fmod: `fmod_f32`
  computes fmod exactly, by long division of the significands as integers;
- a device allows a limited number of storage buffers per kernel (8 is guaranteed; lavapipe
  has 32): a kernel with more buffers is refused with an error that says so;
- a bitcast is WGSL's own `bitcast<f32>(x)` for 32 bits. 16 bits have no such word here (naga
  cannot bitcast f16, and 16-bit integers are held in 32): a half float's bits are its word
  from `pack2x16float`, and a word becomes a half through `unpack2x16float`. Both convert
  through f32, exactly for every value; a NaN's payload is the driver's to keep (lavapipe
  keeps every one).

Builds on: render/gpu.py.

>>> from tinyteach import Tensor
>>> from tinyteach.codegen.lower import lower
>>> from tinyteach.opt.heuristic import heuristic_plan
>>> from tinyteach.engine.schedule import create_schedule
>>> item = create_schedule([(Tensor.ones(8).realize() < 2).uop], "CPU")[0][0]
>>> program = lower(item.ast, heuristic_plan(item.ast))
>>> print(WGSLRenderer().render("E_8", program))  # doctest: +NORMALIZE_WHITESPACE
// launch: global (8, 1, 1) local (8, 1, 1)
@group(0) @binding(0) var<storage, read_write> data0: array<u32>;
@group(0) @binding(1) var<storage, read_write> data1: array<f32>;
fn is_nan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn less_f32(a: f32, b: f32) -> bool { return !is_nan_f32(a) && !is_nan_f32(b) && a < b; }
@compute @workgroup_size(8, 1, 1)
fn E_8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  for (var gidx0: i32 = i32(gid.x); gidx0 < 8; gidx0 += i32(groups.x) * 8) {
    var val0: f32 = data1[gidx0];
    data0[gidx0] = select(0u, 1u, less_f32(val0, 2.0f));
  }
}
"""
from __future__ import annotations

import math
import re

import numpy as np

from tinyteach.codegen.lower import LinearProgram
from tinyteach.dtype import DType, dtypes
from tinyteach.ir.uop import Ops, UOp
from tinyteach.render import CodeForOp, CStyleRenderer, KernelWriter, infix, integer_remainder
from tinyteach.render.gpu import GPURenderer, Launch, gpu_writer, launch_comment

# dtypes WGSL has no way to hold, with the reason
MISSING_DTYPES = {
    dtypes.float64: "WGSL has no 64-bit floats",
    dtypes.int64: "WGSL has no 64-bit integers",
    dtypes.uint64: "WGSL has no 64-bit integers",
    dtypes.bfloat16: "WGSL has no bfloat16 and no 16-bit integer to hold its words",
}
# how a value of each dtype is held in a register and in a buffer
VALUE_TYPES = {
    dtypes.bool: "bool", dtypes.int8: "i32", dtypes.int16: "i32", dtypes.int32: "i32",
    dtypes.uint8: "u32", dtypes.uint16: "u32", dtypes.uint32: "u32",
    dtypes.float16: "f16", dtypes.float32: "f32",
}
STORAGE_TYPES = {**VALUE_TYPES, dtypes.bool: "u32"}
NARROW_INTS = (dtypes.int8, dtypes.int16, dtypes.uint8, dtypes.uint16)
DEFAULT_STORAGE_BUFFERS = 8  # what every WebGPU device guarantees per shader stage

# Helper functions a kernel gets when it uses them (name -> source). WGSL promises nothing
# about NaN: lavapipe's compiler treats float ops as "inexact", folds `x != x` to false, turns
# `!(a < b)` into `a >= b` and its max/min builtins drop NaN. So NaN is found with an integer
# test on the bits (integer ops are always exact): exponent all ones and a non-zero fraction.
HELPERS = {
    "inf_f32": "fn inf_f32() -> f32 { var bits = 0x7f800000u; return bitcast<f32>(bits); }",
    "nan_f32": "fn nan_f32() -> f32 { var bits = 0x7fc00000u; return bitcast<f32>(bits); }",
    "is_nan_f32": "fn is_nan_f32(x: f32) -> bool "
                  "{ return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }",
    "is_nan_or_inf_f32": "fn is_nan_or_inf_f32(x: f32) -> bool "
                         "{ return (bitcast<u32>(x) & 0x7fffffffu) >= 0x7f800000u; }",
    # naga cannot bitcast half floats; widening to f32 is exact and keeps NaN
    "is_nan_f16": "fn is_nan_f16(x: f16) -> bool { return is_nan_f32(f32(x)); }",
}
for _type in ("f32", "f16"):
    HELPERS[f"max_{_type}"] = (  # NaN wins, as in numpy's maximum; equal values give b
        f"fn max_{_type}(a: {_type}, b: {_type}) -> {_type} {{\n"
        f"  if (is_nan_{_type}(a)) {{ return a; }}\n"
        f"  if (is_nan_{_type}(b)) {{ return b; }}\n"
        f"  return select(b, a, a > b);\n}}")
    HELPERS[f"less_{_type}"] = (  # NaN < x and x < NaN are false
        f"fn less_{_type}(a: {_type}, b: {_type}) -> bool "
        f"{{ return !is_nan_{_type}(a) && !is_nan_{_type}(b) && a < b; }}")
    HELPERS[f"not_equal_{_type}"] = (  # NaN != x is true, NaN != NaN too
        f"fn not_equal_{_type}(a: {_type}, b: {_type}) -> bool "
        f"{{ return is_nan_{_type}(a) || is_nan_{_type}(b) || a != b; }}")
# lavapipe's log2 reads a subnormal as if its exponent were the smallest normal one: scale a
# subnormal (exactly) by 2^24 first and take 24 off the result
HELPERS["log2_f32"] = ("fn log2_f32(x: f32) -> f32 {\n"
                       "  if (x < 1.17549435e-38f) { return log2(x * 16777216.0f) - 24.0f; }\n"
                       "  return log2(x);\n}")
# and its exp2 flushes a subnormal result to zero: compute 2^(x+24), a normal number, and
# scale it down by 2^-24 (a multiplication does give subnormals)
HELPERS["exp2_f32"] = ("fn exp2_f32(x: f32) -> f32 {\n"
                       "  if (x < -126.0f) { return exp2(x + 24.0f) * 5.9604644775390625e-08f; }\n"
                       "  return exp2(x);\n}")
# ... and it folds `x - x` to 0 and `x * 0.0` to 0, which are NaN when x is ±inf or NaN (and
# x * 0.0 is -0.0 for a negative x), and `x + 0.0` to x, which is -0.0 for x = -0.0: the
# renderer writes these three as integer bit tests too
HELPERS["minus_itself_f32"] = ("fn minus_itself_f32(x: f32) -> f32 "
                               "{ return select(0.0f, nan_f32(), is_nan_or_inf_f32(x)); }")
HELPERS["times_zero_f32"] = (
    "fn times_zero_f32(x: f32, zero: f32) -> f32 {\n"
    "  var sign = (bitcast<u32>(x) ^ bitcast<u32>(zero)) & 0x80000000u;\n"
    "  return select(bitcast<f32>(sign), nan_f32(), is_nan_or_inf_f32(x));\n}")
# ... and it folds a division with a literal zero operand as if the other one were finite and
# nonzero: `x / 0.0f` and `0.0f / x` both come out 0 (IEEE: +-inf, NaN or a signed zero). Such
# a division is written with bit tests for its zero operands (a division by anything else,
# zeros that arrive at run time included, is IEEE's on lavapipe)
HELPERS["divide_f32"] = (
    "fn divide_f32(a: f32, b: f32) -> f32 {\n"
    "  var sign = (bitcast<u32>(a) ^ bitcast<u32>(b)) & 0x80000000u;\n"
    "  var a_zero = (bitcast<u32>(a) & 0x7fffffffu) == 0u;\n"
    "  var b_zero = (bitcast<u32>(b) & 0x7fffffffu) == 0u;\n"
    "  if (!a_zero && !b_zero) { return a / b; }\n"
    "  if ((a_zero && b_zero) || is_nan_f32(a) || is_nan_f32(b)) { return nan_f32(); }\n"
    "  return select(bitcast<f32>(sign), bitcast<f32>(sign | 0x7f800000u), b_zero);\n}")
HELPERS["divide_f16"] = ("fn divide_f16(a: f16, b: f16) -> f16 "
                         "{ return f16(divide_f32(f32(a), f32(b))); }")
# WGSL's float `%` is x - y * trunc(x / y): the rounded quotient makes it wrong for most pairs
# (1.5 % 0.1 is 0.1, not 0.09999998), while C's fmod is exact. So the remainder is computed
# as integers: long division of x's 24-bit significand by y's, a few bits at a time.
HELPERS["fmod_f32"] = """fn fmod_f32(x: f32, y: f32) -> f32 {
  var sign = bitcast<u32>(x) & 0x80000000u;  // the result has the sign of x
  var ax = bitcast<u32>(x) & 0x7fffffffu;
  var ay = bitcast<u32>(y) & 0x7fffffffu;
  // y = 0, x = +-inf or a NaN operand: NaN
  if (ay == 0u || ax >= 0x7f800000u || ay > 0x7f800000u) { return nan_f32(); }
  // |x| < |y| (y = +-inf included): x itself, -0.0 too
  if (ax < ay) { return x; }
  // |v| = significand * 2^(exponent - 150); a subnormal has exponent 1 and no hidden bit.
  // |x| >= |y|, so x's exponent is at least y's
  var ex = max(ax >> 23u, 1u);
  var ey = max(ay >> 23u, 1u);
  var mx = select(ax & 0x7fffffu, (ax & 0x7fffffu) | 0x800000u, ax >= 0x800000u);
  var my = select(ay & 0x7fffffu, (ay & 0x7fffffu) | 0x800000u, ay >= 0x800000u);
  // the remainder of mx * 2^(ex - ey) by my: r < my < 2^24, so r << 8 fits in 32 bits and
  // each step brings down 8 more bits of the dividend (u32 % is exact)
  var r = mx % my;
  var steps = ex - ey;
  while (steps > 0u && r != 0u) {
    var bits = min(steps, 8u);
    r = (r << bits) % my;
    steps -= bits;
  }
  if (r == 0u) { return bitcast<f32>(sign); }  // an exact multiple: a zero with x's sign
  // |result| = r * 2^(ey - 150), exact: move r's leading bit to bit 23 (a normal number),
  // or, where the exponent would fall below 1, leave it a subnormal (exponent field 0)
  var shift = countLeadingZeros(r) - 8u;
  if (ey > shift) {
    return bitcast<f32>(sign | ((ey - shift) << 23u) | ((r << shift) & 0x7fffffu));
  }
  return bitcast<f32>(sign | (r << (ey - 1u)));
}"""
# a half float's remainder is exact in f32, and representable in f16 (|r| < |y|, and r is a
# multiple of the smaller of the two operands' ulps)
HELPERS["fmod_f16"] = "fn fmod_f16(x: f16, y: f16) -> f16 { return f16(fmod_f32(f32(x), f32(y))); }"
HELPERS["plus_zero_f32"] = ("fn plus_zero_f32(x: f32) -> f32 "  # -0.0 + 0.0 is +0.0
                            "{ return select(x, 0.0f, bitcast<u32>(x) == 0x80000000u); }")
HELPERS["plus_zero_f16"] = ("fn plus_zero_f16(x: f16) -> f16 "
                            "{ return f16(plus_zero_f32(f32(x))); }")
HELPERS["minus_itself_f16"] = ("fn minus_itself_f16(x: f16) -> f16 "
                               "{ return f16(minus_itself_f32(f32(x))); }")
HELPERS["times_zero_f16"] = ("fn times_zero_f16(x: f16, zero: f16) -> f16 "
                             "{ return f16(times_zero_f32(f32(x), f32(zero))); }")
# a half float's 16 bits as a u32 word and back (a bitcast: naga cannot bitcast f16). The
# conversions between f16 and f32 are exact: every half, subnormals included, is a normal f32
HELPERS["half_to_bits"] = ("fn half_to_bits(x: f16) -> u32 "
                           "{ return pack2x16float(vec2<f32>(f32(x), 0.0f)) & 0xffffu; }")
HELPERS["bits_to_half"] = ("fn bits_to_half(bits: u32) -> f16 "
                           "{ return f16(unpack2x16float(bits & 0xffffu).x); }")
for _name in ("log2", "exp2"):  # half floats go through f32 (its subnormals are normal there)
    HELPERS[f"{_name}_f16"] = (f"fn {_name}_f16(x: f16) -> f16 "
                               f"{{ return f16({_name}_f32(f32(x))); }}")
# a float to an integer type, as every device converts it: toward zero, saturated to the type's
# range, NaN -> 0 (dtype.float_to_int). WGSL's own i32(x) and u32(x) clamp but promise nothing
# for NaN (found here by its bits: lavapipe folds `x != x`), and the 8- and 16-bit types are
# held in 32 bits
FLOAT_TO_INT_TARGETS = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
                        dtypes.uint32)


def float_to_int_helper(target: DType) -> str:
    """`to_int8_f32(x)`, ...: NaN is 0, a value below the range the type's smallest, above it
    the largest. The limits are exact in f32: the smallest (0 or -2^(bits-1)) and the largest
    plus one (2^bits or 2^(bits-1))."""
    held, bits = VALUE_TYPES[target], 8 * target.itemsize
    suffix = "u" if dtypes.is_unsigned(target) else "i"
    low = 0 if dtypes.is_unsigned(target) else -(1 << (bits - 1))
    high = 1 << (bits if dtypes.is_unsigned(target) else bits - 1)
    return (f"fn to_{target.name}_f32(x: f32) -> {held} {{\n"
            f"  if (is_nan_f32(x)) {{ return 0{suffix}; }}\n"
            f"  if (x < {float(low)!r}f) {{ return {held}({low}); }}\n"
            f"  if (x >= {float(high)!r}f) {{ return {high - 1}{suffix}; }}\n"
            f"  return {held}(x);\n}}")


for _target in FLOAT_TO_INT_TARGETS:
    HELPERS[f"to_{_target.name}_f32"] = float_to_int_helper(_target)
AXES = "xyz"


class UnsupportedDType(TypeError):
    """A device cannot hold or compute a dtype (WGSL has no float64, for example)."""


def wrap(value: str, dtype: DType) -> str:
    """Bring a 32-bit result back into a narrow integer type's range."""
    bits = 32 - 8 * dtype.itemsize
    if dtypes.is_unsigned(dtype):
        return f"({value} & {hex((1 << (8 * dtype.itemsize)) - 1)}u)"
    return f"(({value} << {bits}u) >> {bits}u)"  # >> on i32 copies the sign bit


# ---- the entries of code_for_op where WGSL differs from C ----

def wgsl_negate(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
                dtype: DType) -> str:
    (a,) = operands
    if dtype == dtypes.bool:
        return f"(!{a})"
    if dtypes.is_unsigned(dtype):
        return f"(0u-{a})"
    return f"(-({a}))"


def wgsl_cast(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    """Casts are constructors, `i32(a)`; a float to an integer type is `to_int32_f32(a)`, a
    helper that saturates each type alike and finds NaN by its bits (a half through f32)."""
    (a,) = operands
    if dtypes.is_float(operand_dtypes[0]) and dtypes.is_int(dtype):
        wide = f"f32({a})" if operand_dtypes[0] == dtypes.float16 else a
        return f"to_{dtype.name}_f32({wide})"
    return f"{renderer.type_name(dtype)}({a})"


def wgsl_add(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    a, b = operands
    return f"({a}||{b})" if dtype == dtypes.bool else f"({a}+{b})"  # WGSL has no bool + bool


def wgsl_mul(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    a, b = operands
    return f"({a}&&{b})" if dtype == dtypes.bool else f"({a}*{b})"


LITERAL_ZEROS = ("0.0f", "-0.0f", "0.0h", "-0.0h")  # how _float_const writes a zero


def wgsl_divide(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
                dtype: DType) -> str:
    """FDIV: `/`, or the `divide_f32` helper where an operand is a literal zero (lavapipe
    folds those divisions to 0)."""
    if not any(operand in LITERAL_ZEROS for operand in operands):
        return infix("/")(renderer, operands, operand_dtypes, dtype)
    a, b = operands
    return f"divide_{VALUE_TYPES[dtype]}({a}, {b})"


def wgsl_remainder(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
                   dtype: DType) -> str:
    if dtypes.is_float(dtype):
        a, b = operands  # not `%`: on floats that is x - y * trunc(x / y), inexact
        return f"fmod_{VALUE_TYPES[dtype]}({a}, {b})"
    return integer_remainder(renderer, operands, operand_dtypes, dtype)


def wgsl_max(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
    a, b = operands
    if dtypes.is_float(dtype):
        return f"max_{VALUE_TYPES[dtype]}({a}, {b})"  # not max(): that may drop NaN
    if dtype == dtypes.bool:
        return f"({a}||{b})"
    return f"max({a}, {b})"


def wgsl_less(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    a, b = operands
    if dtypes.is_float(operand_dtypes[0]):
        return f"less_{VALUE_TYPES[operand_dtypes[0]]}({a}, {b})"
    if operand_dtypes[0] == dtypes.bool:
        return f"((!{a})&&{b})"
    return f"({a}<{b})"


def wgsl_not_equal(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
                   dtype: DType) -> str:
    a, b = operands
    if dtypes.is_float(operand_dtypes[0]):
        return f"not_equal_{VALUE_TYPES[operand_dtypes[0]]}({a}, {b})"
    return f"({a}!={b})"


def typed_helper(name: str) -> CodeForOp:
    """`log2_f32(a)`: one of the HELPERS, for the operand's type."""
    def code(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
        return f"{name}_{VALUE_TYPES[dtype]}({operands[0]})"
    return code


def helpers_used(body: list[str]) -> list[str]:
    """The helper functions the kernel body calls, and the helpers they call, callees first."""
    wanted: list[str] = []
    pending = ["\n".join(body)]
    while pending:
        text = pending.pop()
        for name, source in HELPERS.items():
            if name not in wanted and re.search(rf"\b{name}\(", text):
                wanted.append(name)
                pending.append(source.split("{", 1)[1])  # the body: what it calls
    return [HELPERS[name] for name in HELPERS if name in wanted]  # HELPERS lists callees first


class WGSLRenderer(GPURenderer):
    device = "WEBGPU"
    type_names = VALUE_TYPES
    code_for_op = {**GPURenderer.code_for_op, Ops.NEG: wgsl_negate, Ops.CAST: wgsl_cast,
                   Ops.ADD: wgsl_add, Ops.MUL: wgsl_mul, Ops.FDIV: wgsl_divide,
                   Ops.MOD: wgsl_remainder,
                   Ops.MAX: wgsl_max, Ops.CMPLT: wgsl_less, Ops.CMPNE: wgsl_not_equal,
                   Ops.LOG2: typed_helper("log2"), Ops.EXP2: typed_helper("exp2")}
    # 8- and 16-bit integers are held as 32-bit ones: wrapped back into range after these
    wrapping_ops = (Ops.ADD, Ops.MUL, Ops.NEG, Ops.IDIV, Ops.CAST)
    narrow_dtypes = NARROW_INTS
    repeats_operands: frozenset[Ops] = frozenset()  # max_f32(a, b) is a function: once each

    def __init__(self, shader_f16: bool = True,
                 max_storage_buffers: int = DEFAULT_STORAGE_BUFFERS) -> None:
        self.shader_f16, self.max_storage_buffers = shader_f16, max_storage_buffers

    # ---- what this language cannot do ----

    def missing(self, dtype: DType) -> str | None:
        """Why this renderer cannot use `dtype`, or None when it can."""
        if dtype in MISSING_DTYPES:
            return MISSING_DTYPES[dtype]
        if dtype == dtypes.float16 and not self.shader_f16:
            return "float16 needs the shader-f16 feature, which this device lacks"
        return None

    def check(self, program: LinearProgram) -> None:
        for dtype in sorted({u.dtype for u in program.uops}):
            reason = self.missing(dtype)
            if reason is not None:
                raise UnsupportedDType(f"WEBGPU cannot compute {dtype.name}: {reason}")
        count = len(program.globals)
        if count > self.max_storage_buffers:
            raise RuntimeError(f"WEBGPU: this kernel needs {count} storage buffers, but the "
                               f"device allows {self.max_storage_buffers} per shader stage")

    # ---- the pieces of the language ----

    def render(self, name: str, program: LinearProgram) -> str:
        self.check(program)
        source = super().render(name, program)
        if any(u.dtype == dtypes.float16 for u in program.uops):
            first_line, rest = source.split("\n", 1)  # the launch comment stays first
            source = first_line + "\nenable f16;\n" + rest
        return source

    def thread_id(self, dimension: int) -> str:
        return f"i32(gid.{AXES[dimension]})"

    def thread_count(self, launch: Launch, dimension: int) -> str:
        return f"i32(groups.{AXES[dimension]}) * {launch.local_size[dimension]}"

    def group_id(self, dimension: int) -> str:
        return f"i32(wid.{AXES[dimension]})"

    def group_count(self, launch: Launch, dimension: int) -> str:
        return f"i32(groups.{AXES[dimension]})"

    def local_id(self, dimension: int) -> str:
        return f"i32(lid.{AXES[dimension]})"

    def define_local(self, writer: KernelWriter, name: str, dtype: DType, size: int) -> None:
        """Shared memory is a module-level variable in WGSL (a bool one holds u32s, as a
        buffer does, so from_storage and to_storage read and write both alike)."""
        gpu_writer(writer).module_lines.append(
            f"var<workgroup> {name}: array<{STORAGE_TYPES[dtype]}, {size}>;")

    def barrier(self) -> str:
        # WGSL wants it in uniform control flow: the loops around it run alike for every
        # thread of a group (over groups, or from 0 to a constant), and no `if` encloses it
        return "workgroupBarrier();"

    def guarded_load(self, name: str, dtype: DType, valid: str, value: str) -> str:
        """select() evaluates both sides: an `if`, so an invalid index is never read."""
        zero = self.render_const(0, dtype)
        return f"var {name}: {self.type_name(dtype)} = {zero}; if ({valid}) {{ {name} = {value}; }}"

    def loop(self, writer: KernelWriter, name: str, size: int | str) -> str:
        start, step = self.loop_start_and_step(writer, name)
        if start is None:
            return f"for (var {name}: i32 = 0; {name} < {size}; {name}++) {{"
        return f"for (var {name}: i32 = {start}; {name} < {size}; {name} += {step}) {{"

    def declare(self, name: str, dtype: DType, value: str) -> str:
        return f"var {name}: {self.type_name(dtype)} = {value};"

    def where(self, condition: str, if_true: str, if_false: str) -> str:
        return f"select({if_false}, {if_true}, {condition})"

    def from_storage(self, loaded: str, dtype: DType) -> str:
        if dtype == dtypes.bool:  # a bool buffer holds u32s
            return f"({loaded}!=0u)"
        return loaded

    def to_storage(self, value: str, dtype: DType) -> str:
        if dtype == dtypes.bool:
            return f"select(0u, 1u, {value})"
        if dtype in NARROW_INTS:
            return wrap(value, dtype)  # an accumulated sum may have left the range
        return value

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        if dtype == dtypes.bool:
            return "true" if value else "false"
        if dtypes.is_float(dtype):
            return self._float_const(float(value), dtype)
        if dtypes.is_unsigned(dtype):
            return f"{int(value)}u"
        if int(value) == -(1 << 31):
            return "i32(-2147483648)"  # 2147483648i is not a valid literal
        return f"{int(value)}i"

    def _float_const(self, value: float, dtype: DType) -> str:
        rounded = float(np.float16(value) if dtype == dtypes.float16 else np.float32(value))
        if np.isnan(rounded):
            text = "nan_f32()"
        elif np.isinf(rounded):
            text = "inf_f32()" if rounded > 0 else "(-inf_f32())"
        else:
            return f"{rounded!r}{'h' if dtype == dtypes.float16 else 'f'}"
        return f"f16({text})" if dtype == dtypes.float16 else text

    def wrap_narrow(self, expression: str, dtype: DType) -> str:
        return wrap(expression, dtype)

    def bitcast(self, operand: str, source: DType, dtype: DType) -> str:
        """`bitcast<f32>(x)` for 32 bits. 16 bits go through a u32 word: a half's from
        `half_to_bits`, an int16's or uint16's (held in 32 bits) from its low 16 bits; the
        word becomes a half (`bits_to_half`), a uint16, or an int16 with its sign bit
        copied up (`wrap`)."""
        if dtype.itemsize != 2:
            return f"bitcast<{self.type_name(dtype)}>({operand})"
        if source == dtypes.float16:
            word = f"half_to_bits({operand})"
        else:
            word = f"(u32({operand}) & 0xffffu)"  # (i32 -> u32 keeps the bits)
        if dtype == dtypes.float16:
            return f"bits_to_half({word})"
        return wrap(f"i32({word})", dtype) if dtype == dtypes.int16 else word

    def alu(self, node: UOp, operands: list[str]) -> str:
        """The table's snippet, except for x + (-x), x * 0.0 and x + 0.0 on floats: lavapipe
        folds those to 0 and x, which is wrong for NaN, ±inf and -0.0. Seeing them takes the
        graph, not the operands' text, so they are caught here, before the table."""
        if dtypes.is_float(node.dtype) and node.op in (Ops.ADD, Ops.MUL) and \
                self._folded_by_the_driver(node) is not None:
            return self._exact_identity(node, operands)
        return super().alu(node, operands)

    @staticmethod
    def _folded_by_the_driver(node: UOp) -> int | None:
        """For x + (-x), x * 0.0 and x + 0.0 (which lavapipe folds), the position of x."""
        for position, (x, other) in enumerate((node.src, node.src[::-1])):
            if node.op is Ops.ADD and other.op is Ops.NEG and other.src[0] is x:
                return position
            if node.op is Ops.ADD and other.op is Ops.CONST and other.arg == 0 and \
                    math.copysign(1.0, other.arg) > 0:
                return position
            if node.op is Ops.MUL and other.op is Ops.CONST and other.arg == 0:
                return position
        return None

    def _exact_identity(self, node: UOp, operands: list[str]) -> str:
        position = self._folded_by_the_driver(node)
        assert position is not None
        type_name = VALUE_TYPES[node.dtype]
        if node.op is Ops.ADD and node.src[1 - position].op is Ops.CONST:
            return f"plus_zero_{type_name}({operands[position]})"
        if node.op is Ops.ADD:
            return f"minus_itself_{type_name}({operands[position]})"
        return f"times_zero_{type_name}({operands[position]}, {operands[1 - position]})"

    def variable_params(self, program: LinearProgram) -> list[str]:
        """WGSL has no scalar kernel parameters: the Variables' values come in one small
        buffer of i32, bound after the data buffers (`vars[0]` is the first by name)."""
        if not program.variables:
            return []
        number = len(program.globals)
        return [f"@group(0) @binding({number}) var<storage, read_write> vars: array<i32>;"]

    def variable(self, writer: KernelWriter, name: str) -> str:
        names = [v.arg[0] for v in writer.program.variables]
        return f"vars[{names.index(name)}]"

    def param(self, define: UOp, is_output: bool) -> str:
        number = define.arg[0]
        return (f"@group(0) @binding({number}) var<storage, read_write> data{number}: "
                f"array<{STORAGE_TYPES[define.dtype]}>;")

    def render_kernel(self, writer: KernelWriter, name: str, params: list[str],
                      body: list[str]) -> str:
        state = gpu_writer(writer)
        launch = state.launch
        helpers = helpers_used(body)
        x, y, z = launch.local_size
        builtins = ("@builtin(global_invocation_id) gid: vec3<u32>, "
                    "@builtin(num_workgroups) groups: vec3<u32>")
        if state.group_dimension or state.module_lines:  # a kernel with work-group ids
            builtins += (", @builtin(local_invocation_id) lid: vec3<u32>, "
                         "@builtin(workgroup_id) wid: vec3<u32>")
        lines = [launch_comment(launch), *params, *state.module_lines, *helpers,
                 f"@compute @workgroup_size({x}, {y}, {z})", f"fn {name}({builtins}) {{",
                 *body, "}"]
        return "\n".join(lines) + "\n"
