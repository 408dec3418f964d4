"""Chapter 3: the primitive op set, its reference semantics (runtime/numpy.py), hash-consing,
shapes and value bounds. Expectations come from numpy / Python / C semantics, never from our own
output."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tinyteach.dtype import dtypes
from tinyteach.ir.uop import (
    BINARY,
    MOVEMENT,
    PRIMITIVE_OPS,
    REDUCE_OPS,
    SOURCES,
    TERNARY,
    UNARY,
    Ops,
    UOp,
)
from tinyteach.runtime.numpy import NUMPY_OPS

RNG = np.random.default_rng(0)


def rng_range(n: int) -> UOp:
    return UOp(Ops.RANGE, dtypes.int32, (), ("g", n, 5))


def node(op: Ops, dtype=dtypes.float32, arg=None, shape=(2, 3)) -> UOp:
    """A node of `op` over placeholder sources (NUMPY_OPS only looks at dtype and arg)."""
    source = UOp.const(dtype, 0).reshape((1,) * len(shape)).expand(shape)
    return UOp(op, dtype, (source,), arg)


# ---- the op set is pinned ----

def test_primitive_op_count_and_groups():
    assert len(PRIMITIVE_OPS) == 29
    assert len(set(PRIMITIVE_OPS)) == 29
    assert set(SOURCES) == {Ops.BUFFER, Ops.CONST, Ops.COPY}
    assert set(UNARY) == {Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL,
                          Ops.CAST}
    assert set(BINARY) == {Ops.ADD, Ops.MUL, Ops.IDIV, Ops.FDIV, Ops.MOD, Ops.MAX, Ops.CMPLT,
                           Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
    assert TERNARY == (Ops.WHERE,)
    assert REDUCE_OPS == (Ops.REDUCE_AXIS,)
    assert set(MOVEMENT) == {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK,
                             Ops.FLIP}
    groups = [SOURCES, UNARY, BINARY, TERNARY, REDUCE_OPS, MOVEMENT]
    assert sum(len(g) for g in groups) == 29
    assert set(PRIMITIVE_OPS) == set(itertools.chain(*groups))


def test_every_primitive_op_has_a_reference_implementation():
    engine_ops = {Ops.BUFFER, Ops.COPY}
    missing = [op.name for op in PRIMITIVE_OPS if op not in engine_ops and op not in NUMPY_OPS]
    assert missing == []
    extra = [op.name for op in NUMPY_OPS if op not in PRIMITIVE_OPS]
    assert extra == [], "the reference table implements only primitive ops"


# ---- the reference semantics, op by op ----

FLOATS = RNG.uniform(-3, 3, size=(2, 3)).astype(np.float32)
POSITIVE = RNG.uniform(0.1, 4, size=(2, 3)).astype(np.float32)


@pytest.mark.parametrize("op, inputs, expect", [
    (Ops.NEG, FLOATS, lambda a: -a),
    (Ops.EXP2, FLOATS, lambda a: 2.0 ** a),
    (Ops.LOG2, POSITIVE, lambda a: np.array([math.log2(v) for v in a.flat]).reshape(a.shape)),
    (Ops.SIN, FLOATS, lambda a: np.array([math.sin(v) for v in a.flat]).reshape(a.shape)),
    (Ops.SQRT, POSITIVE, lambda a: np.array([math.sqrt(v) for v in a.flat]).reshape(a.shape)),
    (Ops.RECIPROCAL, POSITIVE, lambda a: 1.0 / a.astype(np.float64)),
])
def test_unary_reference(op, inputs, expect):
    result = NUMPY_OPS[op](node(op), inputs)
    assert result.shape == inputs.shape
    np.testing.assert_allclose(result, expect(inputs.astype(np.float64)), rtol=1e-6, atol=1e-6)


def test_unary_special_values():
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0], dtype=np.float32)
    with np.errstate(all="ignore"):
        log = NUMPY_OPS[Ops.LOG2](node(Ops.LOG2), special)
        sqrt = NUMPY_OPS[Ops.SQRT](node(Ops.SQRT), special)
        recip = NUMPY_OPS[Ops.RECIPROCAL](node(Ops.RECIPROCAL), special)
    assert log[0] == -math.inf and log[2] == math.inf and math.isnan(log[4]) and math.isnan(log[5])
    assert math.isnan(sqrt[5]) and sqrt[2] == math.inf
    assert recip[0] == math.inf and recip[1] == -math.inf and recip[2] == 0.0


def test_neg_of_bool_is_not():
    values = np.array([True, False])
    result = NUMPY_OPS[Ops.NEG](node(Ops.NEG, dtypes.bool), values)
    assert result.tolist() == [False, True]


@pytest.mark.parametrize("source, target", [
    (np.float32, dtypes.int32), (np.float32, dtypes.bool), (np.int32, dtypes.float32),
    (np.int32, dtypes.uint8), (np.float32, dtypes.float16), (np.int64, dtypes.int8),
])
def test_cast_reference(source, target):
    values = np.array([-3.7, -1, 0, 0.5, 2.9, 300], dtype=np.float64).astype(source)
    result = NUMPY_OPS[Ops.CAST](node(Ops.CAST, target), values)
    assert result.dtype == target.np
    if target == dtypes.bool:
        expected = [bool(v) for v in values.tolist()]
    elif target.kind in ("int", "uint") and values.dtype.kind == "f":
        expected = [int(v) for v in values.tolist()]  # C truncates toward zero
    elif target.kind in ("int", "uint"):
        bits = 8 * target.itemsize
        expected = [(int(v) % 2 ** bits) for v in values.tolist()]
        if target.kind == "int":
            expected = [v - 2 ** bits if v >= 2 ** (bits - 1) else v for v in expected]
    else:
        expected = values.astype(target.np).tolist()
    assert result.tolist() == expected


@pytest.mark.parametrize("op, expect", [
    (Ops.ADD, lambda a, b: a + b), (Ops.MUL, lambda a, b: a * b),
    (Ops.MAX, max), (Ops.CMPLT, lambda a, b: a < b), (Ops.CMPNE, lambda a, b: a != b),
])
def test_binary_float_reference(op, expect):
    a = RNG.uniform(-3, 3, size=(4, 5)).astype(np.float32)
    b = RNG.uniform(-3, 3, size=(4, 5)).astype(np.float32)
    b[0, :2] = a[0, :2]  # some equal pairs for CMPNE
    result = NUMPY_OPS[op](node(op), a, b)
    expected = [expect(x, y) for x, y in zip(a.flat, b.flat)]
    np.testing.assert_allclose(np.asarray(result, dtype=np.float64).ravel(),
                               np.array(expected, dtype=np.float64), rtol=1e-6)


def test_max_propagates_nan():
    a = np.array([np.nan, 1.0], dtype=np.float32)
    result = NUMPY_OPS[Ops.MAX](node(Ops.MAX), a, np.array([0.0, np.nan], dtype=np.float32))
    assert all(math.isnan(v) for v in result)


def c_idiv(a: int, b: int) -> int:
    """C's a/b, written from its definition: truncate toward zero; our x/0 is 0."""
    if b == 0:
        return 0
    return math.trunc(a / b)  # exact for the small values used here


def wrap(value: int, bits: int, signed: bool) -> int:
    value %= 2 ** bits
    return value - 2 ** bits if signed and value >= 2 ** (bits - 1) else value


INT_CASES = [(a, b) for a in (-7, -6, -1, 0, 1, 5, 7, 100) for b in (-3, -2, -1, 1, 2, 3, 0)]


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int32, dtypes.int64])
def test_idiv_and_mod_follow_c(dtype):
    a = np.array([x for x, _ in INT_CASES], dtype=dtype.np)
    b = np.array([y for _, y in INT_CASES], dtype=dtype.np)
    quotient = NUMPY_OPS[Ops.IDIV](node(Ops.IDIV, dtype), a, b)
    remainder = NUMPY_OPS[Ops.MOD](node(Ops.MOD, dtype), a, b)
    for (x, y), q, r in zip(INT_CASES, quotient.tolist(), remainder.tolist()):
        assert q == c_idiv(x, y), (x, y)
        assert r == (0 if y == 0 else x - y * c_idiv(x, y)), (x, y)
        if y != 0 and r != 0:
            assert (r < 0) == (x < 0), "the remainder has the sign of the dividend"


def test_idiv_mod_at_the_smallest_integer():
    low = np.iinfo(np.int32).min
    a = np.array([low, low, low, low + 1], dtype=np.int32)
    b = np.array([2, -1, 1, -1], dtype=np.int32)
    with np.errstate(all="ignore"):
        quotient = NUMPY_OPS[Ops.IDIV](node(Ops.IDIV, dtypes.int32), a, b)
        remainder = NUMPY_OPS[Ops.MOD](node(Ops.MOD, dtypes.int32), a, b)
    assert quotient.tolist() == [low // 2, low, low, -(low + 1)]  # MIN/-1 wraps to MIN
    assert remainder.tolist() == [0, 0, 0, 0]


def test_idiv_unsigned():
    a = np.array([7, 2 ** 32 - 1, 5], dtype=np.uint32)
    b = np.array([2, 16, 0], dtype=np.uint32)
    result = NUMPY_OPS[Ops.IDIV](node(Ops.IDIV, dtypes.uint32), a, b)
    assert result.tolist() == [3, (2 ** 32 - 1) // 16, 0]


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint32])
def test_add_mul_wrap_around(dtype):
    bits, signed = 8 * dtype.itemsize, dtype.kind == "int"
    values = [dtype.max, dtype.min, dtype.max // 2 + 3, 1]
    a = np.array(values, dtype=dtype.np)
    b = np.array([1, -1 if signed else 0, 3, dtype.max], dtype=dtype.np)
    with np.errstate(all="ignore"):
        added = NUMPY_OPS[Ops.ADD](node(Ops.ADD, dtype), a, b)
        multiplied = NUMPY_OPS[Ops.MUL](node(Ops.MUL, dtype), a, b)
    assert added.dtype == dtype.np and multiplied.dtype == dtype.np
    assert added.tolist() == [wrap(x + y, bits, signed) for x, y in zip(a.tolist(), b.tolist())]
    assert multiplied.tolist() == [wrap(x * y, bits, signed)
                                   for x, y in zip(a.tolist(), b.tolist())]


@pytest.mark.parametrize("op, expect", [
    (Ops.AND, lambda a, b: a & b), (Ops.OR, lambda a, b: a | b), (Ops.XOR, lambda a, b: a ^ b),
])
def test_bitwise_reference(op, expect):
    a = RNG.integers(-100, 100, size=12).astype(np.int32)
    b = RNG.integers(-100, 100, size=12).astype(np.int32)
    result = NUMPY_OPS[op](node(op, dtypes.int32), a, b)
    assert result.tolist() == [expect(x, y) for x, y in zip(a.tolist(), b.tolist())]
    p, q = np.array([True, True, False, False]), np.array([True, False, True, False])
    logical = NUMPY_OPS[op](node(op, dtypes.bool), p, q)
    assert logical.tolist() == [bool(expect(x, y)) for x, y in zip(p.tolist(), q.tolist())]


def test_where_reference():
    c = np.array([True, False, True])
    result = NUMPY_OPS[Ops.WHERE](node(Ops.WHERE), c, np.array([1.0, 2, 3]), np.array([4.0, 5, 6]))
    assert np.asarray(result).tolist() == [1.0, 5.0, 3.0]


def test_const_reference():
    result = NUMPY_OPS[Ops.CONST](UOp.const(dtypes.int8, 300))
    assert result.dtype == np.int8 and int(result) == 300 - 256


@pytest.mark.parametrize("reduce_op, axes", [(Ops.ADD, (1,)), (Ops.MAX, (0, 2)), (Ops.ADD, ())])
def test_reduce_axis_reference(reduce_op, axes):
    a = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    result = NUMPY_OPS[Ops.REDUCE_AXIS](node(Ops.REDUCE_AXIS, arg=(reduce_op, axes)), a)
    keep = tuple(1 if i in axes else s for i, s in enumerate(a.shape))
    assert result.shape == keep
    for out_index in itertools.product(*(range(s) for s in keep)):
        values = [a[tuple(j if i in axes else o for i, (o, j) in
                          enumerate(zip(out_index, inner)))]
                  for inner in itertools.product(*(range(s) for s in a.shape))
                  if all(inner[i] == out_index[i] for i in range(3) if i not in axes)]
        expected = sum(values) if reduce_op is Ops.ADD else max(values)
        assert result[out_index] == pytest.approx(expected, rel=1e-5)


def test_reduce_max_of_nothing_is_the_lowest_value():
    empty = np.zeros((0, 3), dtype=np.int32)
    result = NUMPY_OPS[Ops.REDUCE_AXIS](node(Ops.REDUCE_AXIS, dtypes.int32, (Ops.MAX, (0,))),
                                        empty)
    assert result.tolist() == [[np.iinfo(np.int32).min] * 3]
    total = NUMPY_OPS[Ops.REDUCE_AXIS](node(Ops.REDUCE_AXIS, dtypes.int32, (Ops.ADD, (0,))), empty)
    assert total.tolist() == [[0, 0, 0]]


def test_movement_references():
    a = np.arange(24).reshape(2, 3, 4)
    ops = NUMPY_OPS
    assert ops[Ops.RESHAPE](node(Ops.RESHAPE, arg=(6, 4)), a).tolist() == \
        [[a.flat[r * 4 + c] for c in range(4)] for r in range(6)]
    permuted = ops[Ops.PERMUTE](node(Ops.PERMUTE, arg=(2, 0, 1)), a)
    assert permuted.shape == (4, 2, 3) and permuted[3, 1, 2] == a[1, 2, 3]
    expanded = ops[Ops.EXPAND](node(Ops.EXPAND, arg=(2, 5)), np.array([[1], [2]]))
    assert expanded.tolist() == [[1] * 5, [2] * 5]
    padded = ops[Ops.PAD](node(Ops.PAD, arg=((1, 0), (0, 2))), np.array([[1, 2]]))
    assert padded.tolist() == [[0, 0, 0, 0], [1, 2, 0, 0]]
    shrunk = ops[Ops.SHRINK](node(Ops.SHRINK, arg=((1, 2), (0, 3), (1, 3))), a)
    assert shrunk.tolist() == [[[a[1, j, k] for k in (1, 2)] for j in range(3)]]
    flipped = ops[Ops.FLIP](node(Ops.FLIP, arg=(0, 2)), a)
    assert flipped[0, 1, 0] == a[1, 1, 3]


# ---- hash-consing ----

def test_hash_consing_shares_equal_nodes():
    a = UOp.const(dtypes.int32, 3)
    assert UOp.const(dtypes.int32, 3) is a
    assert (a + 4) is (a + 4)
    assert (a + 4) is not (a + 5)
    assert UOp.const(dtypes.float32, 3.0) is not UOp.const(dtypes.int32, 3)


def test_hash_consing_keeps_zero_signs_and_bools_apart():
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert UOp(Ops.CONST, dtypes.int32, (), 1) is not UOp(Ops.CONST, dtypes.int32, (), True)


def test_replace_gives_the_consed_node():
    a, b = UOp.const(dtypes.int32, 1), UOp.const(dtypes.int32, 2)
    assert (a + a).replace(src=(a, b)) is (a + b)


def test_toposort_orders_sources_first():
    i = rng_range(0)
    expr = (i * 2 + i) * 3
    order = expr.toposort
    assert order[-1] is expr
    assert len(order) == len(set(order))
    for position, n in enumerate(order):
        assert all(order.index(s) < position for s in n.src)


# ---- shapes ----

def test_shapes_follow_each_op():
    x = UOp.const(dtypes.float32, 1.0).reshape((1, 1, 1)).expand((2, 3, 4))
    assert x.shape == (2, 3, 4)
    assert x.permute((2, 0, 1)).shape == (4, 2, 3)
    assert x.pad(((1, 2), (0, 0), (3, 0))).shape == (5, 3, 7)
    assert x.shrink(((0, 1), (1, 3), (0, 4))).shape == (1, 2, 4)
    assert x.flip((0,)).shape == (2, 3, 4)
    assert x.reduce(Ops.ADD, (1, 2)).shape == (2, 1, 1)
    assert x.reshape((6, 4)).shape == (6, 4)
    assert (x + x).shape == (2, 3, 4)
    assert x.lt(x).dtype == dtypes.bool
    assert x.lt(x).where(x, 0.0).shape == (2, 3, 4)


def test_alu_rejects_different_shapes():
    a = UOp.const(dtypes.float32, 1.0).reshape((1,)).expand((3,))
    b = UOp.const(dtypes.float32, 1.0).reshape((1,)).expand((4,))
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)"):
        a + b


def test_identity_movements_are_no_ops():
    x = UOp.const(dtypes.float32, 1.0).reshape((1, 1)).expand((2, 3))
    assert x.reshape((2, 3)) is x
    assert x.permute((0, 1)) is x
    assert x.pad(((0, 0), (0, 0))) is x
    assert x.shrink(((0, 2), (0, 3))) is x
    assert x.flip(()) is x


# ---- value bounds ----

def brute_bounds(expr: UOp, ranges: list[UOp]) -> tuple[int, int]:
    from tinyteach.ir.rewrite import PYTHON_ALU
    values = []
    for assignment in itertools.product(*(range(r.arg[2]) for r in ranges)):
        env = dict(zip(ranges, assignment))
        values.append(evaluate(expr, env, PYTHON_ALU))
    return min(values), max(values)


def evaluate(expr: UOp, env: dict, table) -> int:
    if expr in env:
        return env[expr]
    if expr.op is Ops.CONST:
        return expr.arg
    return table[expr.op](*(evaluate(s, env, table) for s in expr.src))


@pytest.mark.parametrize("build", [
    lambda i, j: i * 8 + j,
    lambda i, j: (i * 8 + j) // 8,
    lambda i, j: (i * 8 + j) % 3,
    lambda i, j: i % 7,
    lambda i, j: -i + j,
    lambda i, j: i * -3,
    lambda i, j: i.maximum(j * 2),
    lambda i, j: (i + 2) // 3,
])
def test_bounds_contain_every_value(build):
    i, j = rng_range(0), rng_range(1)
    expr = build(i, j)
    low, high = brute_bounds(expr, [i, j])
    assert expr.vmin <= low and high <= expr.vmax


def test_bounds_are_exact_for_simple_cases():
    i = rng_range(0)  # 0..4
    assert (i.vmin, i.vmax) == (0, 4)
    assert ((i * 3 + 2).vmin, (i * 3 + 2).vmax) == (2, 14)
    assert ((i // 2).vmin, (i // 2).vmax) == (0, 2)
    assert ((i % 3).vmin, (i % 3).vmax) == (0, 2)
    assert ((-i).vmin, (-i).vmax) == (-4, 0)
    assert UOp.const(dtypes.int32, 7).vmin == 7


def test_unknown_bounds_are_the_dtype_limits():
    x = UOp(Ops.DEFINE_GLOBAL, dtypes.int32, (), (1, 4))
    load = UOp(Ops.LOAD, dtypes.int32, (x, UOp.const(dtypes.int32, 0)))
    assert (load.vmin, load.vmax) == (-2 ** 31, 2 ** 31 - 1)
    f = UOp(Ops.LOAD, dtypes.float32, (x, UOp.const(dtypes.int32, 0)))
    assert (f.vmin, f.vmax) == (-math.inf, math.inf)
