"""Chapter 8 (part 7): exp2 from primitive ops, so that loops calling them vectorize.

C's `exp2f` is a call into libm. A compiler cannot turn a loop with a call in it into vector
instructions (it would need a vector version of the function), so softmax's column loop ran one
element at a time. Written as additions, multiplications, comparisons and integer ops, exp2 is
like any other arithmetic: gcc -O2 computes 8 of them at once (AVX2). tinygrad does the same
(its `codegen/transcendental.py`); this file is our version of the idea.

exp2(x), for a float32 x:
1. clamp x to [-152, 130] (beyond, the result is 0 or inf anyway); a NaN stays NaN;
2. split it: x = n + f with n the nearest integer and f in [-0.5, 0.5]: adding 1.5 * 2**23
   rounds x to an integer (the sum keeps no bits below the units), and the low bits of that
   sum hold n itself (read through a BITCAST, no float-to-int conversion: gcc does not
   vectorize a conversion of a value chosen by a comparison, as the clamp's is);
3. 2**f by a polynomial of degree 6 (Horner's rule: 6 multiplications and 6 additions);
4. 2**n by building the float from its bits: the exponent field holds n + 127 (`_power_of_two`),
   a BITCAST — the same 32 bits read as a float. Written in two steps, 2**(n//2) * 2**(n-n//2),
   so that n from -152 to 130 works: each half is a normal float, and only the last
   multiplication rounds, also when the result is a subnormal number.

A BITCAST is a CAST node whose arg is `BITCAST` (a plain CAST converts the value: 1.0 -> 1;
a bitcast keeps the bits: 1.0 -> 1065353216), the node `Tensor.bitcast` builds too: `BITCAST`
and `is_bitcast` are ir/uop.py's (the tensor layer needs them), re-exported here.

Where it is applied: a renderer that sets `decompose_transcendentals` (the C renderer: its math
functions are libm calls) gets the scalar float32 EXP2 of its program replaced by these ops
(`decompose_program`): those in a loop marked for SIMD (a sum split across vector lanes, which
gcc vectorizes), or with `TRANSCENDENTAL=2` every one; `TRANSCENDENTAL=0` keeps the calls. Where
the loop stays scalar the call is not slower than the arithmetic: softmax 4096x1024 on one
thread (CPU time) took 28.5 ms with exp2f, 31.4 ms with every exp2 decomposed (its column loop
does not vectorize) and 22.6 ms with the sum loop's alone. LOG2 and SIN stay libm calls. exp2 is
checked against numpy's (in float64, rounded to float32) over a dense sweep: within 1 ulp, the
special values exact (tests/test_transcendental.py).

Builds on: ir/uop.py, codegen/lower.py (the program it rewrites). Used by: render/c.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tinyteach.codegen.lower import LinearProgram
from tinyteach.codegen.plan import index_value
from tinyteach.dtype import DType, dtypes
from tinyteach.ir.uop import BITCAST, Ops, UOp, is_bitcast  # noqa: F401  (BITCAST: re-exported)
from tinyteach.settings import TRANSCENDENTAL  # noqa: F401  (re-exported: its old home)

# 2**f = 1 + f*(c1 + f*(c2 + ...)) on [-0.5, 0.5]: a least-squares fit of the relative error on
# Chebyshev points (c_k close to ln(2)**k / k!, Taylor's coefficients); error below 0.3 of
# half an ulp before rounding
EXP2_COEFFICIENTS = (1.0, 0.6931471824645996, 0.24022647738456726, 0.05550329014658928,
                     0.009618373587727547, 0.0013399848248809576, 0.00015370704932138324)
# 1.5 * 2**23: adding it to a float of magnitude < 2**22 leaves no bits below the units, so the
# hardware rounds to the nearest integer (ties to even); subtracting it gives that integer, and
# the sum's bits minus ROUNDER's bits are that integer as an int32
ROUNDER = 12582912.0
ROUNDER_BITS = 0x4B400000
MANTISSA_BITS = 23
EXPONENT_BIAS = 127
EXPONENT_FIELD = 0xFF  # the 8 bits of a float32's exponent
SIGN_CLEARED = 0x7FFFFFFF
MIN_VECTOR_LOOP = 16  # steps below which an elementwise loop keeps exp2f (elementwise_loops)


def bitcast(value: UOp, dtype: DType) -> UOp:
    """The same 32 bits, read as `dtype` (float32 <-> int32; `UOp.bitcast`), lane by lane for
    a vector."""
    return value.bitcast(dtype.vec(value.dtype.count) if value.dtype.count > 1 else dtype)


def _const(like: UOp, value: float | int) -> UOp:
    """A scalar constant of `like`'s lane type: in a vector op it counts for every lane."""
    return UOp.const(like.dtype.scalar, value)


def _less(a: UOp, b: UOp) -> UOp:
    """a < b: a bool, or for vectors a mask (one bool per lane)."""
    lanes = max(a.dtype.count, b.dtype.count)
    return UOp(Ops.CMPLT, dtypes.bool.vec(lanes) if lanes > 1 else dtypes.bool, (a, b))


def _clamp(x: UOp, low: float, high: float) -> UOp:
    """x limited to [low, high] by comparisons, so that a NaN (every comparison false) stays."""
    above_low = UOp(Ops.WHERE, x.dtype, (_less(x, _const(x, low)), _const(x, low), x))
    return UOp(Ops.WHERE, x.dtype, (_less(_const(x, high), above_low), _const(x, high),
                                    above_low))


def _nearest_integer(x: UOp) -> tuple[UOp, UOp]:
    """round(x) for |x| < 2**22 (ties to even), as a float and as an int32: x + 1.5*2**23 keeps
    no fraction; minus 1.5*2**23 it is the float, and its bits minus those of 1.5*2**23 are the
    integer (kernels are compiled without -ffast-math, so the compiler keeps both roundings)."""
    shifted = x + _const(x, ROUNDER)
    # (the sign bit cleared: a no-op for the positive sum, and a NaN's bits minus ROUNDER_BITS
    # cannot overflow: render/c.py compiles such kernels without -fwrapv)
    bits = bitcast(shifted, dtypes.int32) & UOp.const(dtypes.int32, SIGN_CLEARED)
    return shifted - _const(x, ROUNDER), bits - UOp.const(dtypes.int32, ROUNDER_BITS)


def horner(x: UOp, coefficients: tuple[float, ...]) -> UOp:
    """c0 + x*(c1 + x*(c2 + ...)): one multiplication and one addition per coefficient. (The
    first product is built with x's dtype: for a vector x, every step is a vector.)"""
    result = UOp(Ops.MUL, x.dtype, (_const(x, coefficients[-1]), x)) + _const(x, coefficients[-2])
    for coefficient in reversed(coefficients[:-2]):
        result = result * x + _const(x, coefficient)
    return result


def _power_of_two(exponent: UOp) -> UOp:
    """2**exponent, for an int32 exponent in [-126, 127]: its bits are the biased exponent
    shifted into the exponent field (a multiplication by 2**23), with sign and mantissa 0."""
    biased = exponent + UOp.const(dtypes.int32, EXPONENT_BIAS)
    # (kept to the 8 bits of the field: no change in that range, and a NaN's meaningless
    # exponent cannot overflow the multiplication)
    field = biased & UOp.const(dtypes.int32, EXPONENT_FIELD)
    return bitcast(field * UOp.const(dtypes.int32, 1 << MANTISSA_BITS), dtypes.float32)


def exp2(x: UOp) -> UOp:
    """2**x for a float32 x, from primitive ops (the module docstring gives the steps)."""
    clamped = _clamp(x, -152.0, 130.0)
    nearest, exponent = _nearest_integer(clamped)
    fraction = clamped - nearest  # exact: x and its nearest integer share their high bits
    # (a NaN's exponent means nothing, but its polynomial is NaN, and so is the product)
    power = horner(fraction, EXP2_COEFFICIENTS)
    half = exponent.alu(Ops.IDIV, UOp.const(dtypes.int32, 2))
    return power * _power_of_two(half) * _power_of_two(exponent - half)


def decompose(node: UOp) -> UOp | None:
    """The primitive-op version of one node, or None when it stays as it is (only float32
    EXP2 is decomposed, scalar or vector; half floats keep the math function)."""
    if node.dtype.scalar != dtypes.float32:
        return None
    if node.op is Ops.EXP2:
        return exp2(node.src[0])
    return None


def decompose_program(program: LinearProgram, simd_loops_only: bool = False) -> LinearProgram:
    """Each float32 EXP2 of a linear program replaced by its ops, placed where it was (in the
    same loop); the nodes after it that use it are rebuilt on the new value. A replacement's
    nodes are placed anew each time (one placed in another loop is out of scope here); only
    the program's own nodes, all in scope where it used them, are not repeated.
    `simd_loops_only`: only the EXP2 inside a loop the compiler is known to vectorize: one
    marked for SIMD (`program.simd_loops`, a sum split across vector lanes), a row
    kernel's column loop (`row_column_loops`) or an elementwise kernel's long inner loop
    (`elementwise_loops`); elsewhere the call costs about what the
    arithmetic does when the loop stays scalar."""
    new_of: dict[UOp, UOp] = {}
    in_program: set[UOp] = set()
    uops: list[UOp] = []
    open_loops: list[UOp] = []
    vector_loops = set(program.simd_loops) | row_column_loops(program) | \
        elementwise_loops(program)
    for node in program.uops:
        sources = tuple(new_of.get(s, s) for s in node.src)
        rebuilt = node if sources == node.src else node.replace(src=sources)
        if node.op is Ops.RANGE:
            open_loops.append(node)
        elif node.op is Ops.END_RANGE and open_loops:
            open_loops.pop()
        wanted = not simd_loops_only or node.dtype.count > 1 or \
            (open_loops and open_loops[-1] in vector_loops)
        replacement = decompose(rebuilt) if wanted else None
        if replacement is not None:
            uops += [n for n in replacement.toposort if n not in in_program]
            new_of[node] = replacement
            continue
        if rebuilt is not node:
            new_of[node] = rebuilt
        uops.append(rebuilt)
        in_program.add(rebuilt)
    if not new_of:
        return program
    accumulators = {new_of.get(k, k): new_of.get(v, v) for k, v in program.accumulators.items()}
    simd_loops = {new_of.get(k, k): [new_of.get(a, a) for a in accs]
                  for k, accs in program.simd_loops.items()}
    return replace(program, uops=uops, accumulators=accumulators, simd_loops=simd_loops)


def row_column_loops(program: LinearProgram) -> set[UOp]:
    """The column loops of a kernel over whole rows (softmax's output loop, after its max and
    its sum) that walk memory in order: an output loop opened after a reduction was closed,
    with no loop inside, whose every load and store moves by 0 or 1 element per step. gcc
    vectorizes such a loop once nothing in it is a call."""
    return _in_order_loops(program, lambda reduced, loop: reduced)


def elementwise_loops(program: LinearProgram) -> set[UOp]:
    """The innermost loop of an elementwise kernel (no reduction at all: sigmoid, gelu and
    their gradients) that walks memory in order and runs at least MIN_VECTOR_LOOP steps. gcc
    vectorizes it once nothing in it is a call: a 16x64x512 sigmoid took 6.4 ms with exp2f
    and 0.67 ms with exp2 as arithmetic (gelu 9.3 -> 1.05 ms). A shorter loop gains nothing
    from vectors, and its source keeps the one readable call."""
    if any(node.op is Ops.REDUCE for node in program.uops):
        return set()
    return _in_order_loops(program, lambda reduced, loop: isinstance(loop.arg[2], int) and
                           loop.arg[2] >= MIN_VECTOR_LOOP)


def _in_order_loops(program: LinearProgram, wanted: Callable[[bool, UOp], bool]) -> set[UOp]:
    """Output loops with no loop inside whose loads and stores move by 0 or 1 element per
    step, and for which `wanted(a reduction came before, loop)` holds."""
    found: set[UOp] = set()
    reduced, candidate = False, None
    memory: list[UOp] = []
    for node in program.uops:
        if node.op is Ops.REDUCE:
            reduced = True
        elif node.op is Ops.RANGE:
            is_output = node.arg[0] == "g"
            candidate, memory = (node if is_output and wanted(reduced, node) else None), []
        elif node.op in (Ops.LOAD, Ops.STORE) and candidate is not None:
            memory.append(node.src[1])
        elif node.op is Ops.END_RANGE and candidate is not None:
            if node.src[0] is candidate and all(_steps_by_one(i, candidate) for i in memory):
                found.add(candidate)
            candidate = None
    return found


def _steps_by_one(index: UOp, loop: UOp) -> bool:
    """Does `index` move by 0 or 1 as `loop` counts 0, 1, 2 (every other loop held at 0)?"""
    values = [index_value(index, {loop: step}) for step in (0, 1, 2)]
    if any(value is None for value in values):
        return False
    return all(b - a in (0, 1) for a, b in zip(values, values[1:]))  # type: ignore[operator]
