"""Chapter 8 (part 2): C — the CPU device's language.

A kernel is a plain C function over pointers, one loop per output axis:

    void E_4_4(float* restrict data0, const float* restrict data1, ...) {
      for (int gidx0 = 0; gidx0 < 4; gidx0++) { ... data0[...] = ...; }
    }

`restrict` promises the compiler that buffers do not overlap (each kernel writes a fresh one),
which lets it vectorize. Half floats use C's `_Float16`; math functions on them go through float.

Builds on: render/__init__.py.
"""
from __future__ import annotations

from tinyteach.dtype import DType, dtypes
from tinyteach.lower import LinearProgram
from tinyteach.render import MATH_FUNCTIONS, CStyleRenderer, KernelWriter, typed_math_function
from tinyteach.uop import Ops, UOp

C_PRELUDE = "#include <math.h>\n#include <stdbool.h>\n"
FMA_ATTRIBUTE = '__attribute__((optimize("fp-contract=fast")))'


class CRenderer(CStyleRenderer):
    device = "CPU"
    type_names = {**CStyleRenderer.type_names, dtypes.float16: "_Float16"}
    code_for_op = {**CStyleRenderer.code_for_op,
                   **{op: typed_math_function(name, "(float)({})", "((_Float16){})")
                      for op, name in MATH_FUNCTIONS.items()}}

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
        instruction does both at once, twice as fast and rounded once."""
        source = super().render(name, program)
        if self.fused_multiply_add and any(u.op is Ops.ACCUMULATE and u.dtype.count > 1
                                           for u in program.uops):
            source = source.replace(f"void {name}(", f"{FMA_ATTRIBUTE}\nvoid {name}(", 1)
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
        lines = [C_PRELUDE + f"void {name}({', '.join(params)}) {{", *body, "}"]
        return "\n".join(lines) + "\n"
