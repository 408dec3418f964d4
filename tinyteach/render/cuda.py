"""Chapter 8 (part 5): CUDA C — C++ for NVIDIA GPUs.

A CUDA kernel is a C++ function marked `__global__`; `extern "C"` keeps its name unmangled so
the runtime can find it. Threads come in *blocks* on a *grid*: a thread's index along x is
`blockIdx.x*blockDim.x+threadIdx.x`, and the number of threads along x is
`gridDim.x*blockDim.x` (OpenCL's get_global_id / get_global_size):

    extern "C" __global__ void E_6_3(float* __restrict__ data0, const float* __restrict__ data1) {
      for (int gidx0 = (blockIdx.y*blockDim.y+threadIdx.y); gidx0 < 6; ...

Half floats come from `cuda_fp16.h`; math functions on them go through float. NVRTC compiles
without the C library's headers, so INFINITY and NAN are spelled with bit patterns.

Builds on: render/gpu.py.
"""
from __future__ import annotations

from tinyteach.dtype import DType, dtypes
from tinyteach.lower import LinearProgram
from tinyteach.render import (
    MATH_FUNCTIONS,
    CStyleRenderer,
    KernelWriter,
    cast,
    remainder,
    typed_math_function,
)
from tinyteach.render.gpu import GPURenderer, Launch, gpu_writer, launch_comment
from tinyteach.uop import Ops, UOp

CUDA_PRELUDE = """#define INFINITY (__int_as_float(0x7f800000))
#define NAN (__int_as_float(0x7fffffff))
"""
HALF_HEADER = "#include <cuda_fp16.h>\n"  # only when a kernel uses half: NVRTC needs its path
AXES = "xyz"


def cuda_cast(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    """half converts to and from other types through float (cuda_fp16.h has no direct
    conversions to bool or to 8-bit integers)."""
    (a,) = operands
    if operand_dtypes[0] == dtypes.half:
        a = f"__half2float({a})"
    if dtype == dtypes.half:
        return f"__float2half((float)({a}))"
    return cast(renderer, [a], operand_dtypes, dtype)


def cuda_remainder(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
                   dtype: DType) -> str:
    if dtype == dtypes.half:  # fmod of half goes through float
        a, b = operands
        return f"__float2half(fmodf(__half2float({a}),__half2float({b})))"
    return remainder(renderer, operands, operand_dtypes, dtype)


class CUDARenderer(GPURenderer):
    device = "CUDA"
    supports_group_reduce = True  # shared memory and barriers (render/gpu.py)
    supports_local_tile = True  # matmul tiles staged in shared memory (lower.py)
    code_for_op = {**GPURenderer.code_for_op, Ops.CAST: cuda_cast, Ops.MOD: cuda_remainder,
                   **{op: typed_math_function(name, "__half2float({})", "__float2half({})")
                      for op, name in MATH_FUNCTIONS.items()}}

    def thread_id(self, dimension: int) -> str:
        axis = AXES[dimension]
        return f"(blockIdx.{axis}*blockDim.{axis}+threadIdx.{axis})"

    def thread_count(self, launch: Launch, dimension: int) -> str:
        axis = AXES[dimension]
        return f"(gridDim.{axis}*blockDim.{axis})"

    def group_id(self, dimension: int) -> str:
        return f"blockIdx.{AXES[dimension]}"

    def group_count(self, launch: Launch, dimension: int) -> str:
        return f"gridDim.{AXES[dimension]}"

    def local_id(self, dimension: int) -> str:
        return f"threadIdx.{AXES[dimension]}"

    def define_local(self, writer: KernelWriter, name: str, dtype: DType, size: int) -> str:
        return f"__shared__ {self.type_name(dtype)} {name}[{size}];"

    def barrier(self) -> str:
        return "__syncthreads();"

    def float_literal(self, value: float, dtype: DType) -> str:
        if dtype == dtypes.float16:
            return f"__float2half({value!r}f)"
        return super().float_literal(value, dtype)

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        text = super().render_const(value, dtype)
        if dtype == dtypes.float16 and text in (self.infinity, f"-{self.infinity}", self.nan):
            return f"__float2half({text})"
        return text

    def param(self, define: UOp, is_output: bool) -> str:
        const = "" if is_output else "const "
        return f"{const}{self.type_name(define.dtype)}* __restrict__ data{define.arg[0]}"

    def render(self, name: str, program: LinearProgram) -> str:
        source = super().render(name, program)
        if not any(u.dtype == dtypes.half for u in program.uops):
            return source
        first_line, rest = source.split("\n", 1)  # the launch comment stays first
        return first_line + "\n" + HALF_HEADER + rest

    def render_kernel(self, writer: KernelWriter, name: str, params: list[str],
                      body: list[str]) -> str:
        lines = [launch_comment(gpu_writer(writer).launch),
                 CUDA_PRELUDE + f'extern "C" __global__ void {name}({", ".join(params)}) {{',
                 *body, "}"]
        return "\n".join(lines) + "\n"
