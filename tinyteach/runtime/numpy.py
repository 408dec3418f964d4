"""Chapter 9 (part 2): the NUMPY device — the reference semantics of every primitive op.

What this teaches:
- each of the 29 primitive ops in `uop.PRIMITIVE_OPS` is one small numpy function here. This table
  *is* the definition of what an op means; every other backend is tested against it;
- an interpreter backend needs no compiler: its Program walks the kernel's AST and applies these
  functions. Fusion still happens (the schedule is the same for every device), but inside a
  kernel each op makes a temporary array;
- this is also the solution to Exercise A, where students write these functions themselves.

bfloat16 is held as 16-bit words (numpy has none, dtype.py): an op on bfloat16 decodes its
operands to float32, computes there, and rounds the result back to a word (`_in_float32`), as
PyTorch and tinygrad compute it; movement ops and `where` move the words as they are, and a
bitcast (a CAST with arg BITCAST) reads them as the bits they are: numpy's `view`.

Integer semantics are C's (which every compiled backend shares): IDIV truncates toward zero, MOD
takes the dividend's sign, dividing by zero gives 0, and integers wrap around on overflow. Float
semantics are IEEE 754's: FDIV is the correctly rounded quotient, x/0 is +-inf, 0/0 is NaN. A
CAST of a float to an integer type, which C leaves undefined outside the type's range, truncates
toward zero and saturates, NaN -> 0 (as OpenCL's `convert_int_sat_rtz`; dtype.float_to_int).

Builds on: ir/uop.py, device.py.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tinyteach.device import Backend, Buffer, HostAllocator
from tinyteach.dtype import dtypes, float_to_int, from_bfloat16_bits, to_bfloat16_bits
from tinyteach.ir.uop import MOVEMENT, Ops, UOp, is_bitcast, substitute_symbols, variables_of


def _idiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's a/b: truncate toward zero; a/0 gives 0; MIN/-1 wraps around to MIN."""
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    remainder = np.fmod(a, safe)
    # a - remainder is an exact multiple of b, so floor division there is exact (no abs(), which
    # overflows for the smallest integer)
    quotient = np.floor_divide(a - remainder, safe) if a.dtype.kind in "iu" else a // safe
    return np.where(b == 0, 0, quotient).astype(a.dtype)


def _fdiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE 754 division, correctly rounded in the operands' dtype; floats only (integers
    divide with IDIV, or are cast to a float first, as Tensor.div does)."""
    if a.dtype.kind != "f":
        raise TypeError(f"FDIV divides floats, not {a.dtype} (integers use IDIV)")
    return np.divide(a, b, dtype=a.dtype)


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, np.fmod(a, safe)).astype(a.dtype)


def _where(condition: np.ndarray, if_true: np.ndarray, if_false: np.ndarray) -> np.ndarray:
    return np.asarray(np.where(condition, if_true, if_false))


def _max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a if a > b or a is NaN, else b: NaN wins, and of two equal values (-0.0 and 0.0) the
    second. Spelled out because numpy's own maximum keeps the first of a tie for float16 and
    the second for float32 (the compiled backends all use this rule)."""
    if a.dtype.kind != "f":
        return np.maximum(a, b)
    return np.asarray(np.where((a > b) | np.isnan(a), a, b))


def _exp2(a: np.ndarray) -> np.ndarray:
    """2**a (np.exp2), exact where a is a whole number: there it is a power of two, built
    by np.ldexp (the exponent put in place, rounded once: 0 or a subnormal far below, inf
    above). numpy's own float32 exp2 is an ulp high at 127 on AVX-512 CPUs (on others not),
    which C's exp2f, the other devices and codegen/transcendental.py's exp2 are not."""
    result = np.exp2(a)
    if a.dtype.kind != "f":
        return result
    whole = (a == np.floor(a)) & (np.abs(a) < 4096)  # (NaN and +-inf are not)
    exponent = np.where(whole, a, 0).astype(np.int32)
    return np.where(whole, np.ldexp(np.ones_like(a), exponent), result)


def _reciprocal(a: np.ndarray) -> np.ndarray:
    return np.divide(np.ones_like(a), a)


def _cast(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A conversion of the value: to bool, `a != 0` (NaN is true); a float to an integer
    type toward zero, saturated to its range, NaN -> 0 (dtype.float_to_int: C leaves that
    undefined, and numpy's own answer changes with the CPU); anything else numpy's `astype`
    (integers wrap around, floats round to nearest)."""
    if dtype == np.bool_:
        return a != 0
    if a.dtype.kind == "f" and dtype.kind in "iu":
        return float_to_int(a, dtype)
    return a.astype(dtype)


def _bitcast(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The same bytes read as `dtype` (its size is the same): numpy's `view`, which copies and
    computes nothing, so every bit pattern, a NaN's payload too, stays as it was. (bfloat16's
    words are viewed as they are: they are its bits.)"""
    return np.asarray(a).view(dtype)


def _convert(node: UOp, a: np.ndarray) -> np.ndarray:
    """CAST: a conversion of the value, or, with arg BITCAST, the same bits (ir/uop.py)."""
    if is_bitcast(node):
        return _bitcast(a, node.dtype.np)
    return _cast(a, node.dtype.np)


def _lowest(dtype: np.dtype) -> float | int | bool:
    """The smallest value of a dtype: where a max starts from."""
    if dtype.kind == "f":
        return -np.inf
    if dtype == np.bool_:
        return False
    return int(np.iinfo(dtype).min)


def _reduce(a: np.ndarray, op: Ops, axes: tuple[int, ...]) -> np.ndarray:
    if op is Ops.ADD:
        return np.sum(a, axis=axes, keepdims=True, dtype=a.dtype)
    if a.size == 0:  # the max of nothing is the smallest value the dtype has
        shape = tuple(1 if i in axes else s for i, s in enumerate(a.shape))
        return np.full(shape, _lowest(a.dtype), dtype=a.dtype)
    return np.max(a, axis=axes, keepdims=True)


# One function per primitive op: (the node, its evaluated sources) -> a numpy array.
# BUFFER and COPY are handled by the engine and the kernel loader, not here.
NUMPY_OPS: dict[Ops, Callable[..., np.ndarray]] = {
    Ops.CONST: lambda node: np.array(node.arg, dtype=node.dtype.np),
    Ops.NEG: lambda node, a: np.negative(a) if a.dtype != np.bool_ else np.logical_not(a),
    Ops.EXP2: lambda node, a: _exp2(a),
    Ops.LOG2: lambda node, a: np.log2(a),
    Ops.SIN: lambda node, a: np.sin(a),
    Ops.SQRT: lambda node, a: np.sqrt(a),
    Ops.RECIPROCAL: lambda node, a: _reciprocal(a),
    Ops.CAST: _convert,
    Ops.ADD: lambda node, a, b: np.add(a, b, dtype=a.dtype),
    Ops.MUL: lambda node, a, b: np.multiply(a, b, dtype=a.dtype),
    Ops.IDIV: lambda node, a, b: _idiv(a, b),
    Ops.FDIV: lambda node, a, b: _fdiv(a, b),
    Ops.MOD: lambda node, a, b: _mod(a, b),
    Ops.MAX: lambda node, a, b: _max(a, b),
    Ops.CMPLT: lambda node, a, b: np.less(a, b),
    Ops.CMPNE: lambda node, a, b: np.not_equal(a, b),
    Ops.AND: lambda node, a, b: np.bitwise_and(a, b),
    Ops.OR: lambda node, a, b: np.bitwise_or(a, b),
    Ops.XOR: lambda node, a, b: np.bitwise_xor(a, b),
    Ops.WHERE: lambda node, c, a, b: _where(c, a, b),
    Ops.REDUCE_AXIS: lambda node, a: _reduce(a, *node.arg),
    Ops.RESHAPE: lambda node, a: np.reshape(a, node.arg),
    Ops.PERMUTE: lambda node, a: np.transpose(a, node.arg),
    Ops.EXPAND: lambda node, a: np.broadcast_to(a, node.arg),
    Ops.PAD: lambda node, a: np.pad(a, node.arg),
    Ops.SHRINK: lambda node, a: a[tuple(slice(start, end) for start, end in node.arg)],
    Ops.FLIP: lambda node, a: np.flip(a, node.arg),
}


# ops that move bfloat16 words without computing on them (a bitcast, too, takes the words as
# they are: `_evaluate`)
WORD_OPS = (*MOVEMENT, Ops.WHERE, Ops.DEFINE_GLOBAL)


class InterpretedProgram:
    """Runs one kernel AST by evaluating each node with `ops` (the reference table by default)."""

    def __init__(self, ast: UOp, ops: dict[Ops, Callable[..., np.ndarray]] | None = None):
        self.ast, self.ops = ast, NUMPY_OPS if ops is None else ops
        self.variables = variables_of([ast])

    def with_values(self, vals: tuple[int, ...]) -> UOp:
        """The AST with each Variable (in name order) replaced by its value: every symbolic
        size becomes an int again, and numpy evaluates it as any other kernel."""
        if len(vals) != len(self.variables):
            raise ValueError(f"this kernel takes {len(self.variables)} Variable values, got "
                             f"{len(vals)}")
        values = {v: UOp.const(dtypes.int32, value) for v, value in zip(self.variables, vals)}
        return substitute_symbols([self.ast], values)[0]

    def __call__(self, *buffers: Buffer, vals: tuple[int, ...] = ()) -> None:
        ast = self.with_values(vals) if self.variables or vals else self.ast
        store = ast.src[0]
        arrays = [b.storage.view(b.dtype.np, b.size) for b in buffers]
        values: dict[UOp, np.ndarray] = {}
        with np.errstate(all="ignore"):  # inf, nan and wrap-around are values, not errors
            for node in store.src[1].toposort:
                values[node] = self._evaluate(node, values, arrays)
        result = values[store.src[1]]
        flat = np.asarray(result, dtype=buffers[0].dtype.np).reshape(-1)
        arrays[0][:flat.size] = flat  # (a symbolic size fills the start of its buffer)

    def _evaluate(self, node: UOp, values: dict[UOp, np.ndarray], arrays: list[Any]) -> Any:
        if node.op is Ops.DEFINE_GLOBAL:
            return arrays[node.arg[0]]
        if node.op not in self.ops:
            raise NotImplementedError(f"op {node.op.name} is not implemented by this backend")
        sources = [values[s] for s in node.src]
        touches_bfloat16 = dtypes.bfloat16 in (node.dtype, *(s.dtype for s in node.src))
        if touches_bfloat16 and node.op not in WORD_OPS and not is_bitcast(node):
            return self._in_float32(node, sources)
        result = self.ops[node.op](node, *sources)
        return np.asarray(result, dtype=node.dtype.np) if node.op is not Ops.CAST else result

    def _in_float32(self, node: UOp, sources: list[Any]) -> np.ndarray:
        """An op on bfloat16: its bfloat16 operands as float32 (exact), the op computed in
        float32, a bfloat16 result rounded to the nearest word (ties to even)."""
        wide = [from_bfloat16_bits(np.asarray(value)) if source.dtype == dtypes.bfloat16
                else value for value, source in zip(sources, node.src)]
        as_float = node.replace(dtype=dtypes.float32) if node.dtype == dtypes.bfloat16 else node
        result = np.asarray(self.ops[node.op](as_float, *wide))
        if node.dtype == dtypes.bfloat16:
            return to_bfloat16_bits(result)
        return np.asarray(result, dtype=node.dtype.np)


def make_backend() -> Backend:
    return Backend("NUMPY", HostAllocator(), None, None, InterpretedProgram)
