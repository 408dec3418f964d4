"""Chapter 8 (part 2): C — the CPU device's language.

A kernel is a plain C function over pointers, one loop per output axis:

    void E_4_4(float* restrict data0, const float* restrict data1, ...) {
      for (int gidx0 = 0; gidx0 < 4; gidx0++) { ... data0[...] = ...; }
    }

`restrict` promises the compiler that buffers do not overlap (each kernel writes a fresh one),
which lets it vectorize. Half floats use C's `_Float16`; math functions on them go through float.
bfloat16 has no C type: a value is its 16-bit word (`uint16_t`), and every op on it converts its
operands to float with `tt_bf16_to_f32` (the word shifted into a float's top half), computes in
float, and rounds the result back with `tt_f32_to_bf16` (to nearest, ties to even): two small
functions at the top of the kernel (`BFLOAT16_C`), shared with OpenCL (`in_float32`).

Builds on: render/__init__.py.
"""
from __future__ import annotations

import functools
import math
import re
from collections import Counter
from dataclasses import dataclass, field, fields, replace

import numpy as np

from tinyteach.codegen.lower import LinearProgram, ProgramSpec, spec_of
from tinyteach.codegen.transcendental import decompose_program, row_column_loops
from tinyteach.device import Capabilities
from tinyteach.dtype import ALL_DTYPES, DType, dtypes, to_bfloat16_bits
from tinyteach.helpers import memo
from tinyteach.ir.uop import COMPARISONS, Ops, UOp, identity_element, is_bitcast, store_parts
from tinyteach.render import (
    ALU,
    MATH_FUNCTIONS,
    RENDER_FOR_OP,
    CodeForOp,
    CStyleRenderer,
    KernelWriter,
    _render_alu,
    cast,
    is_safe_divisor,
    typed_math_function,
)
from tinyteach.settings import FIXED_LANES, ROW_CACHE, TRANSCENDENTAL

# the ops gcc applies to whole vectors of 4-byte lanes besides + and * (CRenderer.vector_alu)
WHOLE_VECTOR_INFIX = {Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^",
                      Ops.IDIV: "/"}



def _four_byte_lanes(dtype: DType) -> bool:
    """Lanes of 4 bytes: float32 and int32, or a mask (its lanes are ints, vector_declarations)."""
    return dtype.scalar.itemsize == 4 or dtype.scalar == dtypes.bool


C_PRELUDE = "#include <stdbool.h>\n"
# <math.h> costs gcc ~17 ms of parsing: it is included only where the body may call a function
# (any name before a parenthesis that is not a keyword, one of the kernel's own helpers or a
# compiler builtin) or names INFINITY or NAN. Without the declaration, tcc would take a libm
# call to return an int: so the test errs on the side of including it
MATH_HEADER = "#include <math.h>\n"
CALL_OR_MACRO = re.compile(r"\b([A-Za-z_]\w*)\s*\(|\b(INFINITY|NAN)\b")
NOT_LIBM = ("for", "if", "while", "switch", "return", "sizeof", "__attribute__", "vector_size",
            "aligned")
KERNEL_HELPERS = ("tt_", "__builtin_", "fma_", "splat_")  # the kernel's own functions and macros

# bfloat16 <-> float, as C functions: a union reads a float's bits; rounding adds 0x7FFF plus the
# lowest kept bit, so that the carry reaches the kept half exactly when it should (ties to even);
# a NaN keeps its top half with the quiet bit set (rounding could carry it into inf). Guarded:
# several kernels may be compiled as one source
BFLOAT16_C = """#ifndef TT_BFLOAT16
#define TT_BFLOAT16
#include <stdint.h>
static inline float tt_bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
static inline uint16_t tt_f32_to_bf16(float f) {
  union { float f; uint32_t u; } v; v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
#endif
"""
BFLOAT16_TO_FLOAT, FLOAT_TO_BFLOAT16 = "tt_bf16_to_f32", "tt_f32_to_bf16"

# a BITCAST (ir/uop.py; Tensor.bitcast, and exp2's bit fields in codegen/transcendental.py): the
# same bits
# read as the other type. gcc and clang: a cast between one-lane vectors keeps the bits, and
# vectorizes (a union's local variable does not in an `omp simd` loop: gcc 12 keeps it in
# memory, one per lane); macros, since a function is not inlined into a kernel compiled with
# other options (NO_TRAPS below). The attribute's name is pasted from two tokens, so that the
# fast tier's check for vector types (runtime/cpu.py, TCC_CANNOT, a search of the text) still
# lets tcc build the kernel: tcc, which knows no vector types, reads the union version.
# float <-> int here; double <-> long long and _Float16 <-> short below, in the same way; every
# other pair is one of these and an integer cast (CStyleRenderer.bitcast)
BITCAST_C = """#ifndef TT_BITCAST
#define TT_BITCAST
#ifdef __TINYC__
static inline float tt_bits_to_float(int bits) {
  union { int i; float f; } v; v.i = bits; return v.f;
}
static inline int tt_float_to_bits(float f) {
  union { float f; int i; } v; v.f = f; return v.i;
}
#else
#define TT_LANES(bytes) __attribute__((vector_##size(bytes)))
typedef int tt_int_lane TT_LANES(4);
typedef float tt_float_lane TT_LANES(4);
#define tt_bits_to_float(bits) (((tt_float_lane)((tt_int_lane){(bits)}))[0])
#define tt_float_to_bits(f) (((tt_int_lane)((tt_float_lane){(f)}))[0])
#endif
#endif
"""
# gcc assumes a float operation may trap (-ftrapping-math) and then will not compute both sides
# of a comparison's choice at once (exp2's clamp), so the loop does not vectorize. No kernel
# reads the floating-point exception flags, and no result changes: a kernel with exp2 as
# arithmetic (any kernel with a bitcast, in fact) is compiled without that assumption
NO_TRAPS = "no-trapping-math"
# every kernel is compiled with -fwrapv (runtime/cpu.py): an int32 that overflows wraps, as in
# numpy. But then a position `row + column`, an int that may wrap, is not a straight line in
# `column` once widened for the address (gcc: "evolution of base is not affine"), and a loop over
# a row does not vectorize, or reads through gathers. A kernel whose only integers are positions
# (loop counters and the arithmetic on them, which stays far from 2**31) and exp2's bit fields
# (which cannot overflow, codegen/transcendental.py) has nothing that wraps: it is compiled without
NO_WRAP = "no-wrapv"
# gcc 12 -O2 keeps a value loaded in one iteration of a loop for the next one that reads the same
# address ("predictive commoning"). In a convolution's vector tile the pixels x+kx+1 .. x+kx+7
# of one tap are those the next tap reads at x+kx .. x+kx+6: gcc then loads one new pixel per
# tap and broadcasts the other seven from registers. A broadcast from memory is a load; from a
# register it is a shuffle, on the port of the second FMA unit of an AVX-512 core, so the tile
# ran at two thirds of its speed (beautiful_mnist's conv2 input gradient: 14.7 against 9.5 ms).
# A kernel in vectors is compiled without it
NO_COMMONING = "no-predictive-commoning"
BITCAST_FUNCTIONS = {dtypes.float32: "tt_bits_to_float", dtypes.int32: "tt_float_to_bits"}
# 64 bits, the same way (tcc has double and long long)
BITCAST64_C = """#ifndef TT_BITCAST64
#define TT_BITCAST64
#ifdef __TINYC__
static inline double tt_bits_to_double(long long bits) {
  union { long long i; double f; } v; v.i = bits; return v.f;
}
static inline long long tt_double_to_bits(double f) {
  union { double f; long long i; } v; v.f = f; return v.i;
}
#else
#define TT_LANES(bytes) __attribute__((vector_##size(bytes)))
typedef long long tt_long_lane TT_LANES(8);
typedef double tt_double_lane TT_LANES(8);
#define tt_bits_to_double(bits) (((tt_double_lane)((tt_long_lane){(bits)}))[0])
#define tt_double_to_bits(f) (((tt_long_lane)((tt_double_lane){(f)}))[0])
#endif
#endif
"""
# 16 bits: a kernel with _Float16 is never built by tcc (TCC_CANNOT), so only the vector version
BITCAST16_C = """#ifndef TT_BITCAST16
#define TT_BITCAST16
#define TT_LANES(bytes) __attribute__((vector_##size(bytes)))
typedef short tt_short_lane TT_LANES(2);
typedef _Float16 tt_half_lane TT_LANES(2);
#define tt_bits_to_half(bits) (((tt_half_lane)((tt_short_lane){(bits)}))[0])
#define tt_half_to_bits(f) (((tt_short_lane)((tt_half_lane){(f)}))[0])
#endif
"""
# each prelude, with the functions whose use in a kernel's body calls for it
BITCAST_PRELUDES = ((BITCAST_C, tuple(BITCAST_FUNCTIONS.values())),
                    (BITCAST64_C, ("tt_bits_to_double", "tt_double_to_bits")),
                    (BITCAST16_C, ("tt_bits_to_half", "tt_half_to_bits")))

# a CAST of a float to an integer type. C leaves it undefined outside the integer's range (NaN
# and inf too), and there compilers disagree: gcc with AVX-512 (vcvttps2udq) turns float -1.0
# into uint32 4294967295, other instructions and tcc give other numbers. Every device computes
# OpenCL's `convert_<type>_sat_rtz` instead (dtype.float_to_int): toward zero, saturated to the
# type's range, NaN -> 0. In C that is one small function per pair (float_to_int_function); a
# value inside the range takes C's own cast, as before, and gcc vectorizes the comparisons.
# A half and a bfloat16 convert through float, exactly (C computes bfloat16 in float already:
# in_float32; CUDA widens both first)
FLOAT_TO_INT_SOURCES = {dtypes.float16: "float", dtypes.bfloat16: "float", dtypes.float32: "float",
                        dtypes.float64: "double"}


def float_to_int_name(source: DType, target: DType) -> str:
    """The function that converts a `source` float to the integer type `target`, with every
    device's semantics: `tt_float_to_int32`, `tt_double_to_uint8`, ..."""
    return f"tt_{FLOAT_TO_INT_SOURCES[source.scalar]}_to_{target.scalar.name}"


def float_to_int_function(renderer: CStyleRenderer, source: str, target: DType,
                          qualifier: str = "static inline") -> str:
    """The C of one `float_to_int_name` function, from a `source` ("float" or "double").
    Its limits are exact in both: the type's smallest value (0 or -2^(bits-1)) and its largest
    plus one, a power of two written as a hex float (0x1p31f); the largest itself (2^63 - 1)
    is no float. Guarded, as BITCAST_C: several kernels may be compiled as one source."""
    wide = dtypes.float32 if source == "float" else dtypes.float64
    suffix = "f" if wide == dtypes.float32 else ""
    bits = 8 * target.itemsize - (0 if dtypes.is_unsigned(target) else 1)
    low = f"0.0{suffix}" if dtypes.is_unsigned(target) else f"-0x1p{bits}{suffix}"
    type_name, name = renderer.type_name(target), float_to_int_name(wide, target)
    smallest = renderer.render_const(target.min, target)
    largest = renderer.render_const(target.max, target)
    return (f"#ifndef {name.upper()}\n#define {name.upper()}\n"
            f"{qualifier} {type_name} {name}({source} x) {{\n"
            f"  return x != x ? 0 : x < {low} ? {smallest} : x >= 0x1p{bits}{suffix} ? "
            f"{largest} : ({type_name})x;\n}}\n#endif\n")


def float_to_int_functions(renderer: CStyleRenderer, body: list[str],
                           qualifier: str = "static inline") -> str:
    """The `float_to_int_function`s that the kernel's body calls."""
    text = "\n".join(body)
    integers = sorted(d for d in ALL_DTYPES.values() if dtypes.is_int(d))
    return "".join(float_to_int_function(renderer, source, target, qualifier)
                   for source in ("float", "double") for target in integers
                   if f"tt_{source}_to_{target.name}(" in text)


def c_cast(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
           dtype: DType) -> str:
    """CAST: a float to an integer type through its function (`float_to_int_name`), which
    defines what C leaves undefined; every other conversion is C's own cast."""
    if dtypes.is_float(operand_dtypes[0]) and dtypes.is_int(dtype):
        return f"{float_to_int_name(operand_dtypes[0], dtype)}({operands[0]})"
    return cast(renderer, operands, operand_dtypes, dtype)


@memo("render.c.in_float32")
@functools.cache  # one wrapper per (entry, op): the table keeps the entry itself
def in_float32(code: CodeForOp, op: Ops) -> CodeForOp:
    """`code` for an op that may see bfloat16: its bfloat16 operands converted to float, the
    op written on floats, a bfloat16 result rounded back (WHERE moves the words as they are)."""
    def render(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
               dtype: DType) -> str:
        bf16 = dtypes.bfloat16
        if op is Ops.WHERE or (dtype != bf16 and bf16 not in operand_dtypes):
            return code(renderer, operands, operand_dtypes, dtype)
        if dtype.count > 1 or any(d.count > 1 for d in operand_dtypes):
            raise TypeError(f"{renderer.device}: bfloat16 vectors are not supported")
        if op is Ops.CAST and operand_dtypes[0] == dtype:
            return operands[0]
        wide = [f"{BFLOAT16_TO_FLOAT}({x})" if d == bf16 else x
                for x, d in zip(operands, operand_dtypes)]
        wide_dtypes = [dtypes.float32 if d == bf16 else d for d in operand_dtypes]
        if op is Ops.CAST and dtype == bf16:
            return f"{FLOAT_TO_BFLOAT16}((float)({wide[0]}))"
        if op is Ops.CAST:
            return code(renderer, wide, wide_dtypes, dtype)
        result = code(renderer, wide, wide_dtypes, dtypes.float32 if dtype == bf16 else dtype)
        return f"{FLOAT_TO_BFLOAT16}({result})" if dtype == bf16 else result
    return render


def bfloat16_literal(renderer: CStyleRenderer, value: float | int | bool) -> str:
    """A bfloat16 constant: its word, as the storage type."""
    word = int(to_bfloat16_bits(np.array(float(value), dtype=np.float32)).view(np.uint16))
    return f"(({renderer.type_names[dtypes.bfloat16]}){word})"
# a vector multiply-accumulate `acc + x*y` is a fused multiply-add in every lane, rounded once:
# `acc0 = fma_float_vec16(splat_float_vec16(val0), val1, acc0);`. The kernel defines the two
# macros (`vector_fma_declarations`): where the compiler targets the vector instruction
# (VECTOR_FMA_INSTRUCTIONS: AVX-512's or AVX2's vfmadd231ps), the macro is the compiler's builtin
# for it; elsewhere it is one correctly rounded fmaf per lane, `(float_vec16){__builtin_fmaf(
# x[0], y[0], acc[0]), ...}`, the same bits. The choice is the preprocessor's, so a kernel's
# source is the same on every machine. (Lane by lane alone, gcc -O2 also made one instruction
# of the lanes, but a scalar used in every lane it loaded as a whole vector and broadcast: 64
# bytes read at every step, split across two cache lines 15 times out of 16, and registers
# copied around: a 512 x 512 matmul took 1.05 ms in 16 lanes, 0.73 with the builtin. And gcc
# fusing `a*b+c` itself under -ffp-contract=fast would give other bits at -O0, the fast tier.)
FMA_FUNCTIONS = {dtypes.float32: "__builtin_fmaf", dtypes.float64: "__builtin_fma"}
# (lane type, lanes) -> the feature macro of the instruction, and gcc's and clang's builtin for it
# (the intrinsics _mm512_fmadd_ps and the like are these; their header takes ~0.1 s to read)
VECTOR_FMA_INSTRUCTIONS = {
    (dtypes.float32, 16): ("__AVX512F__", "__builtin_ia32_vfmaddps512_mask(x, y, acc, -1, 4)"),
    (dtypes.float32, 8): ("__FMA__", "__builtin_ia32_vfmaddps256(x, y, acc)"),
    (dtypes.float32, 4): ("__FMA__", "__builtin_ia32_vfmaddps(x, y, acc)"),
    (dtypes.float64, 8): ("__AVX512F__", "__builtin_ia32_vfmaddpd512_mask(x, y, acc, -1, 4)"),
    (dtypes.float64, 4): ("__FMA__", "__builtin_ia32_vfmaddpd256(x, y, acc)"),
}


# the fast tier's unoptimized build runs a kernel ~10-30x slower than gcc -O2 (a vector
# multiply-add becomes a call per lane): a kernel with this many multiply-adds or stores (each
# lane counted) would run longer than the optimized build takes to compile, and every launch
# until the swap pays it. Such a kernel's ProgramSpec says so (`heavy`), and the CPU's
# compiler has it wait for its optimized build (runtime/cpu.py). A 1024x1024 matmul (2^30)
# and its packing (2^24) wait; the MLP's 128x784x128 matmuls (2^23.6) do not
HEAVY_WORK = 2**24


def work_of(program: LinearProgram) -> int:
    """How many accumulations and stores the kernel does, each lane counted: each one's lanes
    times the sizes of the loops around it (a loop of a symbolic size counts once)."""
    sizes: list[int] = []
    total = 0
    for u in program.uops:
        if u.op is Ops.RANGE:
            sizes.append(u.arg[2] if isinstance(u.arg[2], int) else 1)
        elif u.op is Ops.END_RANGE and sizes:
            sizes.pop()
        elif u.op in (Ops.ACCUMULATE, Ops.STORE):
            value = u if u.op is Ops.ACCUMULATE else store_parts(u).value
            total += value.dtype.count * math.prod(sizes)
    return total


def instructions_of(program: LinearProgram) -> int:
    """How many operations an unoptimized build executes: every operation inside the loops,
    times the sizes of the loops around it, a vector operation counted once (the fast tier
    runs the code as written, where gcc -O2 would vectorize the scalar loops). It predicts a
    kernel's time on the fast tier (about 0.5-1 ns an operation here), so the CPU's compiler
    optimizes the costliest kernels first."""
    sizes: list[int] = []
    total = 0
    for u in program.uops:
        if u.op is Ops.RANGE:
            sizes.append(u.arg[2] if isinstance(u.arg[2], int) else 1)
        elif u.op is Ops.END_RANGE and sizes:
            sizes.pop()
        elif u.op not in (Ops.CONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_ACC, Ops.DEFINE_LOCAL):
            total += math.prod(sizes)
    return total


def fused_products(program: LinearProgram) -> dict[UOp, UOp]:
    """The vector float32/float64 products whose only use is a sum's accumulation, each with
    that ACCUMULATE: each pair is written as one fused multiply-add (FMA_FUNCTIONS). (The
    REDUCE after the loop lists the product too, but reads only the accumulator.)"""
    uses = Counter(s for u in program.uops if u.op is not Ops.REDUCE for s in u.src)
    return {u.src[1]: u for u in program.uops
            if u.op is Ops.ACCUMULATE and u.arg is Ops.ADD and u.dtype.count > 1
            and u.dtype.scalar in FMA_FUNCTIONS and u.src[1].op is Ops.MUL
            and u.src[1].dtype == u.dtype and uses[u.src[1]] == 1}


def may_use_libm(line: str) -> bool:
    """Could this line of a kernel call a math function or name INFINITY/NAN (MATH_HEADER)?"""
    for match in CALL_OR_MACRO.finditer(line):
        called = match.group(1)
        if called is None or not (called in NOT_LIBM or called.startswith(KERNEL_HELPERS)):
            return True
    return False


def integers_are_positions(program: LinearProgram) -> bool:
    """Are the program's integers only positions (NO_WRAP)? No integer is loaded, stored,
    accumulated or converted to or from another type (a bitcast included: the bits of a float
    are data), so every integer op computes an index or a guard's bound. Asked before exp2 is
    written as arithmetic (codegen/transcendental.py), whose bit fields cannot overflow."""
    for u in program.uops:
        value_dtype = u.src[2].dtype if u.op is Ops.STORE else u.dtype
        if u.op in (Ops.LOAD, Ops.STORE, Ops.DEFINE_ACC) and not dtypes.is_float(value_dtype) \
                and value_dtype != dtypes.bool:
            return False
        if u.op is Ops.CAST and (dtypes.is_int(u.dtype) or dtypes.is_int(u.src[0].dtype)):
            return False
    return True


# ---- a row's values computed once (softmax's exp, kept for its column loop) ----

MAX_ROW_CACHE = 4096  # elements of one row kept on the stack (16 KB of float32)
COSTLY = (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT)  # worth storing rather than computing again


def cache_row_values(program: LinearProgram) -> LinearProgram:
    """Softmax's kernel computes exp(x - max) twice per element: in the sum loop and again in
    the column loop that divides it by the sum. Where a value of the column loop is, with its
    loop counter renamed, a value the sum loop computes (the same UOp: the graph is hash-
    consed), the sum loop also stores it in an array of one row (`DEFINE_LOCAL`, on the
    stack), and the column loop reads it back: the same bits, one exp per element.
    Only for a value with a costly op in it (COSTLY), a loop of a known length of at most
    MAX_ROW_CACHE, and the two loops in the same enclosing loop, the sum loop first."""
    spans = _loop_spans(program.uops)
    for column in sorted(row_column_loops(program), key=lambda loop: spans[loop][0]):
        for source in program.simd_loops:
            cached = _cache_between(program, source, column, spans) \
                if _same_row(spans, source, column) else program
            if cached is not program:
                program, spans = cached, _loop_spans(cached.uops)
                break
    return program


def _loop_spans(uops: list[UOp]) -> dict[UOp, tuple[int, int, UOp | None]]:
    """Each loop's (position of its RANGE, of its END_RANGE, enclosing loop)."""
    spans: dict[UOp, tuple[int, int, UOp | None]] = {}
    open_loops: list[tuple[UOp, int]] = []
    for position, u in enumerate(uops):
        if u.op is Ops.RANGE:
            open_loops.append((u, position))
        elif u.op is Ops.END_RANGE and open_loops:
            loop, start = open_loops.pop()
            spans[loop] = (start, position, open_loops[-1][0] if open_loops else None)
    return spans


def _same_row(spans: dict[UOp, tuple[int, int, UOp | None]], source: UOp, column: UOp) -> bool:
    size = source.arg[2]
    return source in spans and column in spans and spans[source][2] is spans[column][2] and \
        spans[source][1] < spans[column][0] and isinstance(size, int) and \
        size == column.arg[2] and size <= MAX_ROW_CACHE


def _cache_between(program: LinearProgram, source: UOp, column: UOp,
                   spans: dict[UOp, tuple[int, int, UOp | None]]) -> LinearProgram:
    uops = program.uops
    (source_start, source_end, _), (column_start, column_end, _) = spans[source], spans[column]
    in_source = set(uops[source_start + 1:source_end])
    body = uops[column_start + 1:column_end]
    renamed: dict[UOp, UOp] = {column: source}
    for node in body:
        if any(s in renamed for s in node.src):
            renamed[node] = node.replace(src=tuple(renamed.get(s, s) for s in node.src))
    shared = {node for node in renamed if node is not column and renamed[node] in in_source}
    used_outside = {s for node in body if node not in shared for s in node.src}
    kept = [node for node in body if node in shared and node in used_outside and
            dtypes.is_float(node.dtype) and node.dtype.count == 1 and
            any(n.op in COSTLY and n in shared for n in node.toposort)]
    if not kept:
        return program
    locals_used = sum(u.op is Ops.DEFINE_LOCAL for u in uops)
    rows = {node: UOp(Ops.DEFINE_LOCAL, node.dtype, (), (locals_used + number, source.arg[2]))
            for number, node in enumerate(kept)}
    stores = {renamed[node]: UOp(Ops.STORE, node.dtype, (row, source, renamed[node]))
              for node, row in rows.items()}
    new_of = {node: UOp(Ops.LOAD, node.dtype, (row, column)) for node, row in rows.items()}
    new_body: list[UOp] = []
    for node in body:
        if node in new_of:
            new_body.append(new_of[node])
            continue
        sources = tuple(new_of.get(s, s) for s in node.src)
        rebuilt = node if sources == node.src else node.replace(src=sources)
        if rebuilt is not node:
            new_of[node] = rebuilt
        new_body.append(rebuilt)
    new_body = _without_unused(new_body)
    before = [u for u in uops[:source_start]]
    in_loop = [v for u in uops[source_start:source_end] for v in (u, stores.get(u)) if v]
    result = [*before, *rows.values(), *in_loop, *uops[source_end:column_start + 1],
              *new_body, *uops[column_end:]]
    return replace(program, uops=result)


def _without_unused(body: list[UOp]) -> list[UOp]:
    """The body without the values nothing reads any more (those the cache replaced)."""
    effects = (Ops.STORE, Ops.ACCUMULATE, Ops.RANGE, Ops.END_RANGE, Ops.DEFINE_ACC)
    kept = list(body)
    while True:
        read = {s for node in kept for s in node.src}
        pruned = [node for node in kept if node.op in effects or node in read]
        if len(pruned) == len(kept):
            return kept
        kept = pruned


LANE_DTYPES = (dtypes.float32, dtypes.float64)


def _macro_argument(operand: str) -> str:
    """An operand as a macro's argument: a name as it is, anything else in parentheses (a
    vector literal's commas would otherwise split it into several arguments)."""
    return operand if operand.isidentifier() else f"({operand})"


@dataclass
class LanedProgram(LinearProgram):
    """A program some of whose reduction loops (`lane_loops`, loop -> its accumulators) the C
    renderer writes with `lanes` explicit lanes per accumulator (FIXED_LANES)."""

    lane_loops: dict[UOp, list[UOp]] = field(default_factory=dict)
    lanes: int = 0
    # each lane loop's outermost reduce loop: the loops of one reduction are a perfect nest,
    # so the lanes live across all of them and are combined once, after the nest
    lane_nest_starts: dict[UOp, UOp] = field(default_factory=dict)


def with_lanes(program: LinearProgram, width: int) -> LinearProgram:
    """The loops the linearizer marked for SIMD (`simd_loops`) as lane loops: with `width` >= 2
    lanes, where each accumulator is a float32 or float64. Elsewhere a loop of sums keeps the
    `omp simd` pragma (the compiler's order), and a loop with a max is an ordinary loop.

    Lane l of a lane loop takes the elements l, l + W, l + 2W, ... of each row in order, row
    after row of the reduction's outer loops (its lane arrays are declared before the nest's
    outermost loop, `lane_nest_starts`), and the lanes are combined once, by halving: the
    same operations in the same order under gcc -O2, gcc -O0 and tcc, so every compiler gives
    the same bits (the fast tier can build the kernel), and a max,
    whose NaN OpenMP's reduction would not keep, is split too. gcc vectorizes the lane loop
    (W consecutive elements, W independent accumulators)."""
    if not program.simd_loops:
        return program
    lane_loops, pragma_loops = {}, {}
    for loop, accumulators in program.simd_loops.items():
        reduces = [r for r, acc in program.accumulators.items() if acc in accumulators]
        if width >= 2 and all(r.dtype in LANE_DTYPES for r in reduces):
            lane_loops[loop] = accumulators
        elif all(r.arg is Ops.ADD for r in reduces):
            pragma_loops[loop] = accumulators
    fields_of = {f.name: getattr(program, f.name) for f in fields(LinearProgram)}
    return LanedProgram(**{**fields_of, "simd_loops": pragma_loops}, lane_loops=lane_loops,
                        lanes=width, lane_nest_starts=_nest_starts(program.uops, lane_loops))


def _nest_starts(uops: list[UOp], lane_loops: dict[UOp, list[UOp]]) -> dict[UOp, UOp]:
    """For each lane loop, the outermost of the reduce loops opened right before it (itself
    when there are none). Lanes declared there and combined after it: a sum over 32 x 26 x 26
    (a convolution's weight gradient) is 16 lanes combined once, not once per row of 26."""
    position = {u: i for i, u in enumerate(uops)}
    starts = {}
    for loop in lane_loops:
        i = position[loop]
        while i > 0 and uops[i - 1].op is Ops.RANGE and uops[i - 1].arg[0] == "r":
            i -= 1
        starts[loop] = uops[i]
    return starts


@dataclass
class LaneWriter(KernelWriter):
    """The C renderer's writer: it knows the program's lane loops by name, and after each
    one's closing brace writes the combination of its lanes (`CRenderer.combine_lanes`)."""

    lane_loop_names: dict[str, UOp] = field(default_factory=dict)
    lane_nests: dict[str, list[str]] = field(default_factory=dict)  # nest start -> lane loops
    open_lanes: list[tuple[int, str, list[UOp]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.program, LanedProgram):
            self.lane_loop_names = {f"ridx{loop.arg[1]}": loop
                                    for loop in self.program.lane_loops}
            for loop, start in self.program.lane_nest_starts.items():
                self.lane_nests.setdefault(f"ridx{start.arg[1]}", []).append(f"ridx{loop.arg[1]}")

    def emit(self, line: str) -> None:
        super().emit(line)
        if line == "}" and self.open_lanes and self.open_lanes[-1][0] == self.depth:
            _, name, accumulators = self.open_lanes.pop()
            renderer = self.renderer
            assert isinstance(renderer, CRenderer)
            renderer.combine_lanes(self, name, accumulators)


class CRenderer(CStyleRenderer):
    device = "CPU"
    type_names = {**CStyleRenderer.type_names, dtypes.float16: "_Float16",
                  dtypes.bfloat16: "uint16_t"}
    code_for_op = {**CStyleRenderer.code_for_op, Ops.CAST: c_cast,
                   **{op: typed_math_function(name, "(float)({})", "((_Float16){})")
                      for op, name in MATH_FUNCTIONS.items()}}
    # a bitcast reads bits through these (BITCAST_C and the others); bfloat16 is its word
    bits_functions = {dtypes.float16: ("tt_bits_to_half", "tt_half_to_bits"),
                      dtypes.float32: ("tt_bits_to_float", "tt_float_to_bits"),
                      dtypes.float64: ("tt_bits_to_double", "tt_double_to_bits")}
    held_as_integers = (dtypes.bfloat16,)
    bitcasts_vectors = True  # a cast between vector types of one size keeps the bits

    # exp2f is a libm call, and a loop with a call does not vectorize: EXP2 is written as
    # arithmetic instead in the loops gcc vectorizes (codegen/transcendental.py; TRANSCENDENTAL=0
    # keeps the calls, =2 decomposes every one)
    decompose_transcendentals = True

    def code(self, op: Ops) -> CodeForOp:
        """The table's entry, computing bfloat16 in float (`in_float32`)."""
        return in_float32(super().code(op), op)

    def bitcast(self, operand: str, source: DType, dtype: DType) -> str:
        """A vector: gcc's and clang's cast between vector types of one size, which keeps
        the bits (`(int_vec8)(val0)`); a scalar, CStyleRenderer's (BITCAST_C)."""
        if dtype.count > 1:
            return f"(({self.type_name(dtype)})({operand}))"
        return super().bitcast(operand, source, dtype)

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        if dtype == dtypes.bfloat16:
            return bfloat16_literal(self, value)
        return super().render_const(value, dtype)

    def float_literal(self, value: float, dtype: DType) -> str:
        if dtype == dtypes.float16:
            return f"((_Float16){value!r}f)"
        return super().float_literal(value, dtype)

    device_capabilities = Capabilities(threads=True)  # the outer loop over cores (OpenMP)

    def __init__(self, vector_width: int = 0, fused_multiply_add: bool = False) -> None:
        super().__init__()
        self.vector_width = vector_width
        self.fused_multiply_add = fused_multiply_add

    def spec(self, name: str, program: LinearProgram) -> ProgramSpec:
        """The rendered kernel (lower.ProgramSpec), `heavy` when it does at least HEAVY_WORK
        accumulations and stores: the CPU's compiler then builds it optimized at once. Its
        `instructions` (instructions_of) order the other kernels' optimized builds."""
        source, (work, instructions) = self._render_with_work(name, program)
        return spec_of(name, source, program, heavy=work >= HEAVY_WORK,
                       instructions=instructions)

    def render(self, name: str, program: LinearProgram) -> str:
        """Kernels are compiled with -ffp-contract=off, so `a*b+c` rounds twice, as numpy does.
        A vector multiply-accumulate is the exception (where the CPU has the instruction):
        written as a fused multiply-add (FMA_FUNCTIONS), twice as fast and rounded once, the
        same bits on every tier. EXP2 is written as arithmetic first (codegen/transcendental.py),
        and such a kernel is compiled without -ftrapping-math (NO_TRAPS)."""
        return self._render_with_work(name, program)[0]

    def _render_with_work(self, name: str,
                          program: LinearProgram) -> tuple[str, tuple[int, int]]:
        """The source, and the work and instructions (`work_of`, `instructions_of`) of the
        program it was written from: the program after the rewrites below."""
        if ROW_CACHE:
            program = cache_row_values(program)
        positions_only = integers_are_positions(program)  # (before exp2's bit fields)
        if self.decompose_transcendentals and TRANSCENDENTAL.value:
            program = decompose_program(program, simd_loops_only=TRANSCENDENTAL.value == 1)
        program = with_lanes(program, self.vector_width if FIXED_LANES else 0)
        source = self.render_fused(name, program)
        options = []
        if any(is_bitcast(u) for u in program.uops):
            options.append(NO_TRAPS)
        if positions_only:
            options.append(NO_WRAP)
        if any(u.dtype.count > 1 for u in program.uops):
            options.append(NO_COMMONING)
        if options:
            attribute = "__attribute__((optimize(" + ", ".join(f'"{o}"' for o in options) + ")))"
            source = source.replace(f"void {name}(", f"{attribute}\nvoid {name}(", 1)
        return source, (work_of(program), instructions_of(program))

    def render_fused(self, name: str, program: LinearProgram) -> str:
        """CStyleRenderer.render, but a product that only feeds a vector sum (`fused_products`)
        is not written: its accumulator's line is the fused multiply-add of its operands."""
        products = fused_products(program) if self.fused_multiply_add else {}
        writer = self.new_writer(program)
        for u in program.uops:
            operands = [writer.names.get(s, "") for s in u.src]
            if u in products:
                continue  # written by its ACCUMULATE
            if u.op is Ops.ACCUMULATE and u.src[1] in products:
                line: str | None = self.fused_accumulate(writer, u)
            else:
                render_op = RENDER_FOR_OP.get(u.op, _render_alu if u.op in ALU else None)
                if render_op is None:
                    raise NotImplementedError(f"{type(self).__name__} cannot render {u.op.name}")
                line = render_op(writer, u, operands)
            if line is not None:
                writer.emit(line)
        params = [self.param(g, g.arg[0] == 0) for g in program.globals]
        params += self.variable_params(program)
        vector_dtypes = sorted({u.dtype for u in program.uops if u.dtype.count > 1})
        fused = [u for u in program.uops if u.op is Ops.ACCUMULATE and u.src[1] in products]
        splats = {u.dtype for u in fused if any(s.dtype.count == 1 for s in u.src[1].src)}
        declarations = self.vector_declarations(vector_dtypes)
        declarations += self.vector_fma_declarations(sorted({u.dtype for u in fused}), splats)
        return self.render_kernel(writer, name, params,
                                  ["  " + line for line in declarations] + writer.body)

    def fused_accumulate(self, writer: KernelWriter, u: UOp) -> str:
        """`acc = acc + x*y` as the kernel's vector fused multiply-add (a scalar operand is
        splat: used in every lane)."""
        acc, product = writer.names[u.src[0]], u.src[1]
        vector = self.type_name(u.dtype)

        def operand(source: UOp) -> str:
            name = _macro_argument(writer.names[source])
            return f"splat_{vector}({name})" if source.dtype.count == 1 else name
        x, y = (operand(s) for s in product.src)
        return f"{acc} = fma_{vector}({x}, {y}, {acc});"

    def vector_fma_declarations(self, fused: list[DType], splats: set[DType]) -> list[str]:
        """The macros a kernel's fused multiply-adds are written with (see FMA_FUNCTIONS):
        `fma_<vector>(x, y, acc)` for each vector type in `fused`, the target's instruction
        where the compiler has it, else one fmaf per lane; and `splat_<vector>(s)`, a scalar
        in every lane, for those in `splats`."""
        lines = []
        for dtype in fused:
            vector, count = self.type_name(dtype), dtype.count
            if dtype in splats:
                lanes = ", ".join(["(s)"] * count)
                lines.append(f"#define splat_{vector}(s) (({vector}){{{lanes}}})")
            function = FMA_FUNCTIONS[dtype.scalar]
            by_lane = ", ".join(f"{function}((x)[{n}], (y)[{n}], (acc)[{n}])"
                                for n in range(count))
            fallback = f"#define fma_{vector}(x, y, acc) (({vector}){{{by_lane}}})"
            instruction = VECTOR_FMA_INSTRUCTIONS.get((dtype.scalar, count))
            if instruction is None:
                lines.append(fallback)
                continue
            feature, builtin = instruction
            lines += [f"#ifdef {feature}", f"#define fma_{vector}(x, y, acc) {builtin}", "#else",
                      fallback, "#endif"]
        return lines

    # vectors: GCC's and clang's vector extension. A typedef names a vector of 16 floats;
    # + and * then work lane by lane, v[3] reads lane 3. aligned(4): loads and stores may
    # start at any float, not only at a multiple of 64 bytes
    def vector_type_name(self, dtype: DType) -> str:
        return f"{self.type_names[dtype.scalar]}_vec{dtype.count}"

    def vector_declarations(self, vector_dtypes: list[DType]) -> list[str]:
        """A typedef per vector type. A mask (a vector of bools, lower.vectorize) has int
        lanes, each 0 or 1, written lane by lane: C has no vectors of bool."""
        lines = []
        for d in vector_dtypes:
            lane = dtypes.int32 if d.scalar == dtypes.bool else d.scalar
            lines.append(f"typedef {self.type_names[lane]} {self.type_name(d)} __attribute__(("
                         f"vector_size({lane.itemsize * d.count}), aligned({lane.itemsize})));")
        return lines

    def vector_literal(self, dtype: DType, lanes: list[str]) -> str:
        return f"({self.type_name(dtype)}){{{', '.join(lanes)}}}"

    def vector_alu(self, op: Ops, dtype: DType, sources: tuple[UOp, ...],
                   operands: list[str]) -> str:
        """GCC's vector extension also takes whole vectors of 4-byte lanes for what exp2's
        arithmetic and masks need: comparisons (each lane -1 or 0, negated into the mask's 1 or
        0), &, |, ^ and integer `/`, and WHERE as a select of bits (C's `?:` takes no vector
        condition). Written lane by lane, these kept gcc from vectorizing the kernel."""
        if not all(_four_byte_lanes(d) for d in (dtype, *(s.dtype for s in sources))):
            return super().vector_alu(op, dtype, sources, operands)
        if op is Ops.IDIV and not (dtypes.is_int(dtype) and is_safe_divisor(operands[1])):
            return super().vector_alu(op, dtype, sources, operands)  # (guards for 0 and -1)
        if op in WHOLE_VECTOR_INFIX:
            whole = f"({operands[0]}{WHOLE_VECTOR_INFIX[op]}{operands[1]})"
            return f"(-{whole})" if op in COMPARISONS else whole
        if op is Ops.WHERE and sources[0].dtype.count > 1:
            return self.select_bits(dtype, sources, operands)
        return super().vector_alu(op, dtype, sources, operands)

    def select_bits(self, dtype: DType, sources: tuple[UOp, ...], operands: list[str]) -> str:
        """where(mask, a, b) on vectors: a's bits where the mask's lane is 1, b's where 0
        (-mask is all ones or all zeros), read through the mask's int lanes and back: exact
        for every value, NaN payloads and -0.0 included."""
        mask = self.type_name(dtypes.bool.vec(dtype.count))
        condition, *values = operands
        whole = [o if s.dtype.count > 1 else self.broadcast(o, dtype)
                 for o, s in zip(values, sources[1:])]
        bits = [f"(({mask})({value}))" for value in whole]
        chosen = f"(({bits[0]}&(-{condition}))|({bits[1]}&~(-{condition})))"
        return f"(({self.type_name(dtype)})({chosen}))"

    def broadcast(self, scalar: str, dtype: DType) -> str:
        return self.vector_literal(dtype, [scalar] * dtype.count)

    def scalar_in_vector_op(self, scalar: str, dtype: DType) -> str:
        """GCC applies a scalar to every lane only when it converts to the lane type without
        loss. C computes on _Float16 in float (its excess precision), and a float does not fit
        a _Float16 lane: so a half scalar is spread into a vector first."""
        if dtype.scalar == dtypes.float16:
            return self.broadcast(scalar, dtype)
        return scalar

    def lane(self, vector: str, number: int) -> str:
        return f"{vector}[{number}]"

    def load_vector(self, buffer: str, index: str, dtype: DType) -> str:
        return f"*(const {self.type_name(dtype)}*)({buffer}+{index})"

    def store_vector(self, buffer: str, index: str, value: str, dtype: DType) -> str:
        return f"*({self.type_name(dtype)}*)({buffer}+{index}) = {value};"

    def parallel_pragma(self) -> str | None:
        return "#pragma omp parallel for"

    def define_local(self, writer: KernelWriter, name: str, dtype: DType, size: int) -> str:
        """An array of one row, on the stack (`cache_row_values`)."""
        return f"{self.type_name(dtype)} {name}[{size}];"

    def new_writer(self, program: LinearProgram) -> KernelWriter:
        return LaneWriter(self, program)

    def loop(self, writer: KernelWriter, name: str, size: int | str) -> str:
        """A loop; a lane loop (`LanedProgram`) is two: blocks of W steps, and the W lanes of
        a block, lane l adding into (or taking the max with) element l of each accumulator's
        lane array. The last block of a row that W does not divide has fewer lanes. Before
        the outermost loop of a lane loop's nest, that lane loop's arrays are declared."""
        if not isinstance(writer, LaneWriter):
            return super().loop(writer, name, size)
        for lane_loop in writer.lane_nests.get(name, []):
            self.declare_lanes(writer, lane_loop)  # before the nest's outermost loop
        if name not in writer.lane_loop_names:
            return super().loop(writer, name, size)
        program = writer.program
        assert isinstance(program, LanedProgram)
        width, block, lane = program.lanes, f"{name}_block", f"{name}_lane"
        lanes: int | str = width
        if not isinstance(size, int) or size % width:
            lanes = f"({size}-{block} < {width} ? {size}-{block} : {width})"
        return (f"for (int {block} = 0; {block} < {size}; {block} += {width}) "
                f"for (int {lane} = 0; {lane} < {lanes}; {lane}++) {{ "
                f"int {name} = {block}+{lane};")

    def declare_lanes(self, writer: LaneWriter, name: str) -> None:
        """Declare the lane arrays of lane loop `name`'s accumulators, where its nest of
        reduce loops begins; from here on the accumulators are written as lane l of them."""
        program = writer.program
        assert isinstance(program, LanedProgram)
        width, lane = program.lanes, f"{name}_lane"
        accumulators = program.lane_loops[writer.lane_loop_names[name]]
        for acc in accumulators:
            # lane 0 carries the accumulator's value in, the others start at the identity
            reduce_op = next(r.arg for r, a in program.accumulators.items() if a is acc)
            identity = self.render_const(identity_element(reduce_op, acc.dtype), acc.dtype)
            starts = [writer.names[acc]] + [identity] * (width - 1)
            writer.emit(self.declare(f"{writer.names[acc]}_lanes[{width}]", acc.dtype,
                                     "{" + ", ".join(starts) + "}"))
            writer.names[acc] = f"{writer.names[acc]}_lanes[{lane}]"
        writer.open_lanes.append((writer.depth, name, accumulators))

    def combine_lanes(self, writer: LaneWriter, name: str, accumulators: list[UOp]) -> None:
        """After a lane loop: each accumulator's W lanes combined by halving (lane l with lane
        l + W/2, then l + W/4, ...), a fixed order whatever the compiler, then the result
        back in the accumulator."""
        width = writer.program.lanes if isinstance(writer.program, LanedProgram) else 0
        half, lane = f"{name}_half", f"{name}_l"
        for acc in accumulators:
            lanes = writer.names[acc].split("[")[0]
            own, other = f"{lanes}[{lane}]", f"{lanes}[{lane}+{half}]"
            reduce_op = next(r.arg for r, a in writer.program.accumulators.items() if a is acc)
            combined = f"({own}+{other})" if reduce_op is Ops.ADD else \
                self.code(Ops.MAX)(self, [own, other], [acc.dtype, acc.dtype], acc.dtype)
            writer.emit(f"for (int {half} = {width // 2}; {half} > 0; {half} /= 2) "
                        f"for (int {lane} = 0; {lane} < {half}; {lane}++) {own} = {combined};")
            writer.names[acc] = lanes.removesuffix("_lanes")
            writer.emit(f"{writer.names[acc]} = {lanes}[0];")

    def simd_pragma(self, accumulators: list[str]) -> str | None:
        return f"#pragma omp simd reduction(+:{','.join(accumulators)})"

    def param(self, define: UOp, is_output: bool) -> str:
        """`const float* restrict data1`. A bool buffer is passed as bytes (`unsigned char*`,
        the same 0/1 bytes numpy's bool arrays hold): gcc finds no vector type for a load of
        `_Bool`, so every loop reading a mask (attention's causal mask) stayed scalar."""
        const = "" if is_output else "const "
        element = "unsigned char" if define.dtype == dtypes.bool else self.type_name(define.dtype)
        return f"{const}{element}* restrict data{define.arg[0]}"

    def render_kernel(self, writer: KernelWriter, name: str, params: list[str],
                      body: list[str]) -> str:
        # (a bfloat16 word is a uint16_t, which <stdint.h> in BFLOAT16_C declares: also where
        # a kernel only moves or bitcasts words)
        uses_bfloat16 = any(BFLOAT16_TO_FLOAT in line or FLOAT_TO_BFLOAT16 in line or
                            "uint16_t" in line for line in [*params, *body])
        bitcasts = "".join(prelude for prelude, functions in BITCAST_PRELUDES
                           if any(f in line for line in body for f in functions))
        math_header = MATH_HEADER if any(may_use_libm(line) for line in body) else ""
        prelude = math_header + C_PRELUDE + (BFLOAT16_C if uses_bfloat16 else "") + bitcasts + \
            float_to_int_functions(self, body)
        lines = [prelude + f"void {name}({', '.join(params)}) {{", *body, "}"]
        return "\n".join(lines) + "\n"
