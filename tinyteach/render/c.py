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

import numpy as np

from tinyteach.dtype import DType, dtypes, to_bfloat16_bits
from tinyteach.lower import LinearProgram
from tinyteach.render import (
    MATH_FUNCTIONS,
    CodeForOp,
    CStyleRenderer,
    KernelWriter,
    typed_math_function,
)
from tinyteach.transcendental import TRANSCENDENTAL, decompose_program, is_bitcast
from tinyteach.uop import Ops, UOp

C_PRELUDE = "#include <math.h>\n#include <stdbool.h>\n"

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

# a BITCAST (transcendental.py): the same 32 bits read as the other type. gcc and clang: a cast
# between one-lane vectors keeps the bits, and vectorizes (a union's local variable does not in
# an `omp simd` loop: gcc 12 keeps it in memory, one per lane); macros, since a function is not
# inlined into a kernel compiled with other options (NO_TRAPS below). The attribute's name is
# pasted from two tokens, so that the fast tier's check for vector types (runtime/cpu.py,
# TCC_CANNOT, a search of the text) still lets tcc build the kernel: tcc, which knows no vector
# types, reads the union version
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
# arithmetic is compiled without that assumption
NO_TRAPS = "no-trapping-math"
BITCAST_FUNCTIONS = {dtypes.float32: "tt_bits_to_float", dtypes.int32: "tt_float_to_bits"}


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
FUSED_MULTIPLY_ADD = "fp-contract=fast"


class CRenderer(CStyleRenderer):
    device = "CPU"
    type_names = {**CStyleRenderer.type_names, dtypes.float16: "_Float16",
                  dtypes.bfloat16: "uint16_t"}
    code_for_op = {**CStyleRenderer.code_for_op,
                   **{op: typed_math_function(name, "(float)({})", "((_Float16){})")
                      for op, name in MATH_FUNCTIONS.items()}}

    # exp2f is a libm call, and a loop with a call does not vectorize: EXP2 is written as
    # arithmetic instead in the loops gcc vectorizes (transcendental.py; TRANSCENDENTAL=0
    # keeps the calls, =2 decomposes every one)
    decompose_transcendentals = True

    def code(self, op: Ops) -> CodeForOp:
        """The table's entry, computing bfloat16 in float (`in_float32`)."""
        return in_float32(super().code(op), op)

    def alu(self, node: UOp, operands: list[str]) -> str:
        """A BITCAST reads the bits as the other type (BITCAST_C); every other op, the table's
        entry."""
        if is_bitcast(node):
            return f"{BITCAST_FUNCTIONS[node.dtype]}({operands[0]})"
        return super().alu(node, operands)

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        if dtype == dtypes.bfloat16:
            return bfloat16_literal(self, value)
        return super().render_const(value, dtype)

    def float_literal(self, value: float, dtype: DType) -> str:
        if dtype == dtypes.float16:
            return f"((_Float16){value!r}f)"
        return super().float_literal(value, dtype)

    def __init__(self, vector_width: int = 0, fused_multiply_add: bool = False) -> None:
        super().__init__()
        self.vector_width = vector_width
        self.fused_multiply_add = fused_multiply_add

    def render(self, name: str, program: LinearProgram) -> str:
        """Kernels are compiled with -ffp-contract=off, so `a*b+c` rounds twice, as numpy does.
        A vector multiply-accumulate is the exception (with gcc): one fused multiply-add
        instruction does both at once, twice as fast and rounded once. EXP2 is written as
        arithmetic first (transcendental.py), and such a kernel is compiled without
        -ftrapping-math (NO_TRAPS)."""
        if self.decompose_transcendentals and TRANSCENDENTAL.value:
            program = decompose_program(program, simd_loops_only=TRANSCENDENTAL.value == 1)
        source = super().render(name, program)
        options = []
        if self.fused_multiply_add and any(u.op is Ops.ACCUMULATE and u.dtype.count > 1
                                           for u in program.uops):
            options.append(FUSED_MULTIPLY_ADD)
        if any(is_bitcast(u) for u in program.uops):
            options.append(NO_TRAPS)
        if options:
            attribute = "__attribute__((optimize(" + ", ".join(f'"{o}"' for o in options) + ")))"
            source = source.replace(f"void {name}(", f"{attribute}\nvoid {name}(", 1)
        return source

    # vectors: GCC's and clang's vector extension. A typedef names a vector of 16 floats;
    # + and * then work lane by lane, v[3] reads lane 3. aligned(4): loads and stores may
    # start at any float, not only at a multiple of 64 bytes
    def vector_type_name(self, dtype: DType) -> str:
        return f"{self.type_names[dtype.scalar]}_vec{dtype.count}"

    def vector_declarations(self, vector_dtypes: list[DType]) -> list[str]:
        return [f"typedef {self.type_names[d.scalar]} {self.type_name(d)} "
                f"__attribute__((vector_size({d.itemsize}), aligned({d.scalar.itemsize})));"
                for d in vector_dtypes]

    def vector_literal(self, dtype: DType, lanes: list[str]) -> str:
        return f"({self.type_name(dtype)}){{{', '.join(lanes)}}}"

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

    def simd_pragma(self, accumulators: list[str]) -> str | None:
        return f"#pragma omp simd reduction(+:{','.join(accumulators)})"

    def param(self, define: UOp, is_output: bool) -> str:
        const = "" if is_output else "const "
        return f"{const}{self.type_name(define.dtype)}* restrict data{define.arg[0]}"

    def render_kernel(self, writer: KernelWriter, name: str, params: list[str],
                      body: list[str]) -> str:
        uses_bfloat16 = any(BFLOAT16_TO_FLOAT in line or FLOAT_TO_BFLOAT16 in line
                            for line in body)
        uses_bitcast = any(function in line for line in body
                           for function in BITCAST_FUNCTIONS.values())
        prelude = C_PRELUDE + (BFLOAT16_C if uses_bfloat16 else "") + \
            (BITCAST_C if uses_bitcast else "")
        lines = [prelude + f"void {name}({', '.join(params)}) {{", *body, "}"]
        return "\n".join(lines) + "\n"
