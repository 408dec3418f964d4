"""Chapter 8 (part 4): OpenCL C — C with address spaces and work-items.

OpenCL C is C99 with a few words added: `__kernel` marks a function the host can launch,
`__global` says a pointer is device memory, and `get_global_id(d)` / `get_global_size(d)` give
this work-item's index and the number of work-items along dimension `d`:

    // launch: global (4, 8, 1) local (4, 8, 1)
    __kernel void E_6_3(__global float* restrict data0, __global const float* restrict data1) {
      for (int gidx0 = get_global_id(1); gidx0 < 6; gidx0 += get_global_size(1)) {
        for (int gidx1 = get_global_id(0); gidx1 < 3; gidx1 += get_global_size(0)) { ... }

`half` needs the `cl_khr_fp16` extension and `double` `cl_khr_fp64`; the renderer enables them
when a kernel uses them (the runtime checks that the device has them). Math functions are
overloaded by type, as in C++, so `exp2(x)` works for every float type. bfloat16 is its word
(`ushort`), computed in float through two small functions, as in C (render/c.py). A bitcast is
OpenCL's own reinterpretation, `as_float(x)`, `as_ushort(x)`, ...: `as_<type>` for every type,
and a float becomes an integer through `convert_int_sat_rtz(x)`, whose semantics (toward zero,
saturated, NaN -> 0) are those of every device.

Builds on: render/gpu.py.

>>> from tinyteach import Tensor
>>> from tinyteach.codegen.lower import lower
>>> from tinyteach.opt.heuristic import heuristic_plan
>>> from tinyteach.engine.schedule import create_schedule
>>> item = create_schedule([(Tensor.ones(4, 4).realize() + 1).uop], "CPU")[0][0]
>>> program = lower(item.ast, heuristic_plan(item.ast))
>>> print(OpenCLRenderer().render("E_4_4", program))  # doctest: +NORMALIZE_WHITESPACE
// launch: global (4, 4, 1) local (4, 4, 1)
__kernel void E_4_4(__global float* restrict data0, __global const float* restrict data1) {
  for (int gidx0 = get_global_id(1); gidx0 < 4; gidx0 += get_global_size(1)) {
    for (int gidx1 = get_global_id(0); gidx1 < 4; gidx1 += get_global_size(0)) {
      int alu0 = ((gidx0*4)+gidx1);
      float val0 = data1[alu0];
      data0[alu0] = (val0+1.0f);
    }
  }
}
"""
from __future__ import annotations

from tinyteach.codegen.lower import LinearProgram
from tinyteach.dtype import DType, dtypes
from tinyteach.ir.uop import Ops, UOp
from tinyteach.render import CodeForOp, CStyleRenderer, KernelWriter, cast
from tinyteach.render.c import (
    BFLOAT16_TO_FLOAT,
    FLOAT_TO_BFLOAT16,
    bfloat16_literal,
    in_float32,
)
from tinyteach.render.gpu import GPURenderer, Launch, gpu_writer, launch_comment

# (extension, dtype): the pragma a kernel needs before it may use the dtype
EXTENSIONS = {dtypes.float16: "cl_khr_fp16", dtypes.float64: "cl_khr_fp64"}


# bfloat16 <-> float in OpenCL C (as_uint / as_float read a value's bits; see render/c.py)
# (guarded: the runtime builds a schedule's kernels as one program, each with its own copy)
BFLOAT16_CL = f"""#ifndef TT_BFLOAT16
#define TT_BFLOAT16
float {BFLOAT16_TO_FLOAT}(ushort h) {{ return as_float((uint)h << 16); }}
ushort {FLOAT_TO_BFLOAT16}(float f) {{
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}}
#endif"""


def opencl_cast(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
                dtype: DType) -> str:
    """CAST: a float to an integer type is OpenCL's own `convert_int_sat_rtz(x)`: toward zero
    (rtz), saturated to the type's range, NaN -> 0 (sat), what every device computes (C's
    cast is undefined outside the range); every other conversion is C's cast."""
    if dtypes.is_float(operand_dtypes[0]) and dtypes.is_int(dtype):
        return f"convert_{renderer.type_name(dtype)}_sat_rtz({operands[0]})"
    return cast(renderer, operands, operand_dtypes, dtype)


def dtypes_used(program: LinearProgram) -> set[DType]:
    return {u.dtype for u in program.uops}


class OpenCLRenderer(GPURenderer):
    device = "OPENCL"
    type_names = {**GPURenderer.type_names, dtypes.int8: "char", dtypes.uint8: "uchar",
                  dtypes.uint16: "ushort", dtypes.uint32: "uint", dtypes.int64: "long",
                  dtypes.uint64: "ulong", dtypes.bfloat16: "ushort"}
    code_for_op = {**GPURenderer.code_for_op, Ops.CAST: opencl_cast}

    def thread_id(self, dimension: int) -> str:
        return f"get_global_id({dimension})"

    def thread_count(self, launch: Launch, dimension: int) -> str:
        return f"get_global_size({dimension})"

    def group_id(self, dimension: int) -> str:
        return f"get_group_id({dimension})"

    def group_count(self, launch: Launch, dimension: int) -> str:
        return f"get_num_groups({dimension})"

    def local_id(self, dimension: int) -> str:
        return f"get_local_id({dimension})"

    def define_local(self, writer: KernelWriter, name: str, dtype: DType, size: int) -> str:
        return f"__local {self.type_name(dtype)} {name}[{size}];"

    def barrier(self) -> str:
        return "barrier(CLK_LOCAL_MEM_FENCE);"

    def int_literal(self, value: int, dtype: DType) -> str:
        suffix = {dtypes.int64: "l", dtypes.uint64: "ul", dtypes.uint32: "u"}.get(dtype, "")
        if value == dtype.min and value < 0:
            return f"({value + 1}{suffix}-1)"
        return f"{value}{suffix}"

    def code(self, op: Ops) -> CodeForOp:
        """The table's entry, computing bfloat16 in float (render/c.py's `in_float32`)."""
        return in_float32(super().code(op), op)

    bitcasts_vectors = True  # as_int8(x) reads a float8's bits

    def bitcast(self, operand: str, source: DType, dtype: DType) -> str:
        """`as_float(x)`: OpenCL reads the bits of any value (a vector too) as any type of
        its size. A scalar narrower than an int is cast to its own type first: C computes
        `a&b` or `c?a:b` on shorts as an int, of another size."""
        if source.itemsize < 4 and source != dtypes.float16:  # (a bfloat16 word too)
            operand = f"(({self.type_name(source)})({operand}))"
        return f"as_{self.type_name(dtype)}({operand})"

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        if dtype == dtypes.bfloat16:
            return bfloat16_literal(self, value)
        return super().render_const(value, dtype)

    def float_literal(self, value: float, dtype: DType) -> str:
        if dtype == dtypes.float16:
            return f"((half){value!r}f)"
        return super().float_literal(value, dtype)

    def param(self, define: UOp, is_output: bool) -> str:
        const = "" if is_output else "const "
        return f"__global {const}{self.type_name(define.dtype)}* restrict data{define.arg[0]}"

    def render(self, name: str, program: LinearProgram) -> str:
        pragmas = [f"#pragma OPENCL EXTENSION {EXTENSIONS[d]} : enable"
                   for d in sorted(dtypes_used(program) & set(EXTENSIONS))]
        if dtypes.bfloat16 in dtypes_used(program):
            pragmas.append(BFLOAT16_CL)
        source = super().render(name, program)
        if not pragmas:
            return source
        first_line, rest = source.split("\n", 1)  # the launch comment stays first
        return "\n".join([first_line, *pragmas, rest])

    def render_kernel(self, writer: KernelWriter, name: str, params: list[str],
                      body: list[str]) -> str:
        lines = [launch_comment(gpu_writer(writer).launch),
                 f"__kernel void {name}({', '.join(params)}) {{", *body, "}"]
        return "\n".join(lines) + "\n"

