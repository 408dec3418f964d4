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

from collections.abc import Callable

from tinyteach.dtype import DType, dtypes
from tinyteach.render import CStyleRenderer, typed_math_function
from tinyteach.uop import Ops, UOp

C_PRELUDE = "#include <math.h>\n#include <stdbool.h>\n"


class CRenderer(CStyleRenderer):
    device = "CPU"
    type_names = {**CStyleRenderer.type_names, dtypes.float16: "_Float16"}

    def _math_function(self, op: Ops) -> Callable[[str, DType], str]:
        return typed_math_function(self.math_functions[op], "(float)({})", "((_Float16){})")

    def float_literal(self, value: float, dtype: DType) -> str:
        if dtype == dtypes.float16:
            return f"((_Float16){value!r}f)"
        return super().float_literal(value, dtype)

    def parallel_pragma(self) -> str | None:
        return "#pragma omp parallel for"

    def simd_pragma(self, accumulators: list[str]) -> str | None:
        return f"#pragma omp simd reduction(+:{','.join(accumulators)})"

    def param(self, define: UOp, is_output: bool) -> str:
        const = "" if is_output else "const "
        return f"{const}{self.type_name(define.dtype)}* restrict data{define.arg[0]}"

    def render_kernel(self, name: str, params: list[str], body: list[str]) -> str:
        lines = [C_PRELUDE + f"void {name}({', '.join(params)}) {{", *body, "}"]
        return "\n".join(lines) + "\n"
