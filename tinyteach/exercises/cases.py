"""Chapter 12 (test cases): for every op, a few small inputs that hit its edge cases, and a hint.

What this teaches:
- each op is tested on its own: a `Case` is one UOp node whose sources are placeholders, plus
  the numpy arrays those placeholders hold. A bug in ADD cannot hide a bug in MUL, and a
  failure names one op (MiniTorch's cascading tasks are what this avoids);
- the expected values always come from the reference table (runtime/numpy.py), never from
  numbers typed in here;
- edge cases are where backends differ: C's integer division truncates toward zero where
  Python's floors, x/0 must not crash, NaN must propagate through MAX, a reduction keeps its
  reduced axes (size 1), EXPAND broadcasts, PAD fills a bool mask with False.

Builds on: ir/uop.py, dtype.py. Used by: autograder.py.

>>> len(CASES[Ops.IDIV]) >= 2 and all(case.node.op is Ops.IDIV for case in CASES[Ops.IDIV])
True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyteach.dtype import DType, dtypes
from tinyteach.ir.uop import BITCAST, Ops, UOp

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
NAN, INF = float("nan"), float("inf")


@dataclass(frozen=True)
class Case:
    """One test of one op: `node` (whose sources are placeholders) applied to `inputs`."""

    label: str
    node: UOp
    inputs: tuple[np.ndarray, ...]


def placeholder(number: int, array: np.ndarray) -> UOp:
    """A source node with the array's dtype and shape (a kernel parameter, reshaped)."""
    dtype = dtypes.from_np(array.dtype)
    flat = UOp(Ops.DEFINE_GLOBAL, dtype, (), (number, max(array.size, 1)))
    return flat.reshape(array.shape)


def array(values: Any, dtype: DType) -> np.ndarray:
    return np.array(values, dtype=dtype.np)


def alu_case(label: str, op: Ops, *inputs: np.ndarray, dtype: DType | None = None) -> Case:
    """An ALU op on inputs of one shape; `dtype` is the result's (default: the last input's)."""
    sources = tuple(placeholder(i + 1, x) for i, x in enumerate(inputs))
    if dtype is None:
        dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else sources[-1].dtype
    return Case(label, UOp(op, dtype, sources), inputs)


def arg_case(label: str, op: Ops, source: np.ndarray, arg: Any) -> Case:
    """A movement or reduce op: one input and an arg."""
    return Case(label, UOp(op, dtypes.from_np(source.dtype), (placeholder(1, source),), arg),
                (source,))


def bitcast_case(label: str, source: np.ndarray, dtype: DType) -> Case:
    """A CAST whose arg is BITCAST: the same bits read as `dtype` (Tensor.rand makes its floats
    so)."""
    return Case(label, UOp(Ops.CAST, dtype, (placeholder(1, source),), BITCAST), (source,))


def const_case(label: str, dtype: DType, value: Any) -> Case:
    return Case(label, UOp.const(dtype, value), ())


f32, f64, i32, i8, u32, boolean = (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int8,
                                   dtypes.uint32, dtypes.bool)
SPECIAL_FLOATS = array([-1.5, 0.0, 2.0, INF, -INF, NAN], f32)
GRID = np.arange(12, dtype=np.float32).reshape(3, 4)


def unary(op: Ops, values: list[float]) -> list[Case]:
    return [alu_case("float32", op, array(values, f32)),
            alu_case("float64", op, array(values, f64))]


def binary_ints(op: Ops, a: list[int], b: list[int]) -> Case:
    return alu_case("int32", op, array(a, i32), array(b, i32))


CASES: dict[Ops, list[Case]] = {
    Ops.CONST: [const_case("float32 1.5", f32, 1.5), const_case("int32 -7", i32, -7),
                const_case("bool True", boolean, True), const_case("float32 -inf", f32, -INF)],
    Ops.NEG: [alu_case("float32", Ops.NEG, SPECIAL_FLOATS),
              alu_case("int32 (MIN wraps to MIN)", Ops.NEG, array([-3, 0, 5, INT_MIN], i32)),
              alu_case("bool: logical not", Ops.NEG, array([True, False], boolean))],
    Ops.EXP2: unary(Ops.EXP2, [-2.0, 0.0, 0.5, 10.0, -INF, INF, NAN]),
    Ops.LOG2: unary(Ops.LOG2, [0.25, 1.0, 8.0, 0.0, -1.0, INF, NAN]),
    Ops.SIN: unary(Ops.SIN, [0.0, 1.5707964, -3.0, 100.0, INF, NAN]),
    Ops.SQRT: unary(Ops.SQRT, [0.0, 4.0, 2.0, -1.0, INF, NAN]),
    Ops.RECIPROCAL: unary(Ops.RECIPROCAL, [2.0, -4.0, 0.0, -0.0, INF, NAN]),
    Ops.CAST: [
        alu_case("float32 -> int32 (truncates)", Ops.CAST, array([1.7, -1.7, 0.0, 3.0], f32),
                 dtype=i32),
        alu_case("int32 -> float32", Ops.CAST, array([-3, 0, 7, 1 << 20], i32), dtype=f32),
        alu_case("float32 -> bool (nonzero, NaN is true)", Ops.CAST,
                 array([0.0, 0.5, -1.0, NAN], f32), dtype=boolean),
        alu_case("int32 -> int8 (wraps)", Ops.CAST, array([127, 128, -129, 300], i32), dtype=i8),
        alu_case("bool -> float32", Ops.CAST, array([True, False], boolean), dtype=f32),
        bitcast_case("uint32 bits -> float32 (arg BITCAST: the same bits)",
                     array([0x3F800000, 0x3FC00000, 0xBF800000, 0x7F800000], u32), f32),
    ],
    Ops.ADD: [alu_case("float32", Ops.ADD, array([1.5, INF, -2.0, NAN], f32),
                       array([2.25, -INF, 2.0, 1.0], f32)),
              binary_ints(Ops.ADD, [INT_MAX, -5, 7], [1, 3, -7]),
              alu_case("int8 (127+1 wraps)", Ops.ADD, array([127, -128, 5], i8),
                       array([1, -1, 5], i8))],
    Ops.MUL: [alu_case("float32", Ops.MUL, array([1.5, 0.0, -2.0, NAN], f32),
                       array([-2.0, INF, -0.5, 1.0], f32)),
              binary_ints(Ops.MUL, [65536, -3, 7], [65536, 3, 0])],
    Ops.IDIV: [binary_ints(Ops.IDIV, [7, -7, 7, -7, 5, INT_MIN, 0], [2, 2, -2, -2, 0, -1, 3]),
               alu_case("uint32", Ops.IDIV, array([7, 5, 2**32 - 1], u32), array([2, 0, 3], u32))],
    Ops.FDIV: [alu_case("float32", Ops.FDIV,
                        array([7.0, -1.0, 1.0, -1.0, 0.0, INF, 0.0, 1.0], f32),
                        array([2.0, 3.0, 0.0, 0.0, 0.0, INF, -5.0, 1e-40], f32)),
               alu_case("float64", Ops.FDIV, array([1.0, -7.5, NAN], f64),
                        array([3.0, 0.5, 1.0], f64))],
    Ops.MOD: [binary_ints(Ops.MOD, [7, -7, 7, -7, 5, INT_MIN], [3, 3, -3, -3, 0, -1]),
              alu_case("float32 (fmod)", Ops.MOD, array([5.5, -5.5, 1.0], f32),
                       array([2.0, 2.0, 3.0], f32))],
    Ops.MAX: [alu_case("float32 (NaN wins)", Ops.MAX, array([1.0, NAN, 2.0, -INF], f32),
                       array([NAN, 3.0, -1.0, -5.0], f32)),
              binary_ints(Ops.MAX, [-3, 4, INT_MIN], [-7, 4, 0]),
              alu_case("bool", Ops.MAX, array([True, False, False], boolean),
                       array([False, True, False], boolean))],
    Ops.CMPLT: [alu_case("float32", Ops.CMPLT, array([1.0, 2.0, NAN, -INF], f32),
                         array([2.0, 2.0, 1.0, 0.0], f32)),
                binary_ints(Ops.CMPLT, [-3, 5, INT_MIN], [-2, 5, INT_MAX])],
    Ops.CMPNE: [alu_case("float32 (NaN != NaN)", Ops.CMPNE, array([1.0, NAN, 2.0], f32),
                         array([1.0, NAN, 3.0], f32)),
                binary_ints(Ops.CMPNE, [-3, 5], [-3, 4])],
    Ops.AND: [alu_case("bool", Ops.AND, array([True, True, False, False], boolean),
                       array([True, False, True, False], boolean)),
              binary_ints(Ops.AND, [12, -1, -8], [10, 5, 7])],
    Ops.OR: [alu_case("bool", Ops.OR, array([True, True, False, False], boolean),
                      array([True, False, True, False], boolean)),
             binary_ints(Ops.OR, [12, -8, 0], [10, 5, 0])],
    Ops.XOR: [alu_case("bool", Ops.XOR, array([True, True, False, False], boolean),
                       array([True, False, True, False], boolean)),
              binary_ints(Ops.XOR, [12, -1, 7], [10, 5, 7])],
    Ops.WHERE: [alu_case("float32", Ops.WHERE, array([True, False, True], boolean),
                         array([1.0, 2.0, NAN], f32), array([-1.0, NAN, -3.0], f32)),
                alu_case("int32", Ops.WHERE, array([False, True], boolean),
                         array([5, -6], i32), array([INT_MIN, 7], i32))],
    Ops.REDUCE_AXIS: [
        arg_case("sum over axis 1 (keeps it, size 1)", Ops.REDUCE_AXIS, GRID, (Ops.ADD, (1,))),
        arg_case("max over axis 0, with -inf", Ops.REDUCE_AXIS,
                 array([[-INF, 2.0], [-3.0, -INF]], f32), (Ops.MAX, (0,))),
        arg_case("int32 sum over both axes", Ops.REDUCE_AXIS,
                 array([[1, -2], [3, -4]], i32), (Ops.ADD, (0, 1))),
        arg_case("max of an empty axis", Ops.REDUCE_AXIS, np.zeros((0, 3), np.float32),
                 (Ops.MAX, (0,))),
    ],
    Ops.RESHAPE: [arg_case("(3, 4) -> (2, 6)", Ops.RESHAPE, GRID, (2, 6)),
                  arg_case("(3, 4) -> (1, 12, 1)", Ops.RESHAPE, GRID, (1, 12, 1))],
    Ops.PERMUTE: [arg_case("(3, 4) -> (4, 3)", Ops.PERMUTE, GRID, (1, 0)),
                  arg_case("(2, 3, 4) order (2, 0, 1)", Ops.PERMUTE,
                           np.arange(24, dtype=np.int32).reshape(2, 3, 4), (2, 0, 1))],
    Ops.EXPAND: [arg_case("broadcast rows (1, 4) -> (3, 4)", Ops.EXPAND, GRID[:1], (3, 4)),
                 arg_case("broadcast columns (3, 1) -> (3, 4)", Ops.EXPAND, GRID[:, :1], (3, 4)),
                 arg_case("bool (1, 1) -> (2, 3)", Ops.EXPAND, array([[True]], boolean), (2, 3))],
    Ops.PAD: [arg_case("float32 ((1, 0), (2, 1))", Ops.PAD, GRID, ((1, 0), (2, 1))),
              arg_case("bool mask pads with False", Ops.PAD, array([[True, True]], boolean),
                       ((1, 1), (0, 1))),
              arg_case("int32 ((0, 2),)", Ops.PAD, array([-1, -2], i32), ((0, 2),))],
    Ops.SHRINK: [arg_case("rows 1:3, all columns", Ops.SHRINK, GRID, ((1, 3), (0, 4))),
                 arg_case("one element", Ops.SHRINK, GRID, ((2, 3), (3, 4)))],
    Ops.FLIP: [arg_case("axis 1", Ops.FLIP, GRID, (1,)),
               arg_case("axes 0 and 1", Ops.FLIP, GRID, (0, 1))],
}

HINTS: dict[Ops, str] = {
    Ops.CONST: "return an array of node.arg with the node's dtype: np.array(node.arg, "
               "dtype=node.dtype.np).",
    Ops.NEG: "-x; for a bool, NEG is logical not (np.logical_not), since -True is not a bool. "
             "Integers wrap: -MIN is MIN.",
    Ops.EXP2: "2**x (np.exp2); exp2(-inf) is 0 and NaN stays NaN.",
    Ops.LOG2: "np.log2: log2(0) is -inf and log2 of a negative number is NaN, not an error.",
    Ops.SIN: "np.sin, in radians; sin(inf) is NaN.",
    Ops.SQRT: "np.sqrt: sqrt(-1) is NaN, not an error.",
    Ops.RECIPROCAL: "1/x: 1/0 is inf and 1/-0.0 is -inf, not an error.",
    Ops.CAST: "convert to node.dtype (a.astype(node.dtype.np)); float -> int truncates toward "
              "zero, int -> int8 wraps, and anything -> bool is x != 0 (NaN is true). In C: "
              "((type)(x)). With node.arg BITCAST (is_bitcast(node)) the bits stay as they are: "
              "a.view(node.dtype.np).",
    Ops.ADD: "a + b in the operands' dtype: integers wrap around (127+1 is -128 in int8).",
    Ops.MUL: "a * b in the operands' dtype: integers wrap around, 0*inf is NaN.",
    Ops.IDIV: "IDIV truncates toward zero as C does (-7/2 is -3, Python's // gives -4); "
              "dividing by zero gives 0, and MIN/-1 wraps to MIN.",
    Ops.FDIV: "a / b on floats, rounded once as IEEE 754 says (np.divide; C's /): x/0 is "
              "+-inf, 0/0 and inf/inf are NaN, 0/-5 is -0.0, not an error.",
    Ops.MOD: "the remainder takes the dividend's sign as in C (-7 % 3 is -1; np.fmod); "
             "x % 0 gives 0. Floats use fmod.",
    Ops.MAX: "np.maximum: if either side is NaN the result is NaN (C: a>b||a!=a ? a : b).",
    Ops.CMPLT: "a < b as a bool array; any comparison with NaN is false.",
    Ops.CMPNE: "a != b as a bool array; NaN != NaN is true.",
    Ops.AND: "bitwise and (np.bitwise_and) — for bools that is logical and (C: && for bool, & "
             "for integers).",
    Ops.OR: "bitwise or (np.bitwise_or) — for bools logical or (C: || for bool, | for ints).",
    Ops.XOR: "bitwise xor (np.bitwise_xor) — for bools a != b (C: != for bool, ^ for ints).",
    Ops.WHERE: "condition ? a : b elementwise (np.where); the sources are (condition, a, b).",
    Ops.REDUCE_AXIS: "node.arg is (Ops.ADD or Ops.MAX, axes): sum or max over those axes, "
                     "keeping them with size 1 (keepdims=True) and the input's dtype; the max "
                     "of an empty axis is the dtype's lowest value (-inf for floats).",
    Ops.RESHAPE: "node.arg is the new shape (np.reshape).",
    Ops.PERMUTE: "node.arg is the axis order (np.transpose).",
    Ops.EXPAND: "node.arg is the new shape; size-1 axes broadcast (np.broadcast_to).",
    Ops.PAD: "node.arg is ((before, after), ...) per axis; pad with zeros (False for bools): "
             "np.pad.",
    Ops.SHRINK: "node.arg is ((start, end), ...) per axis: a slice per axis.",
    Ops.FLIP: "node.arg is the axes to reverse (np.flip).",
}
