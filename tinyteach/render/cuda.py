"""Chapter 8 (part 5): CUDA C — C++ for NVIDIA GPUs.

A CUDA kernel is a C++ function marked `__global__`; `extern "C"` keeps its name unmangled so
the runtime can find it. Threads come in *blocks* on a *grid*: a thread's index along x is
`blockIdx.x*blockDim.x+threadIdx.x`, and the number of threads along x is
`gridDim.x*blockDim.x` (OpenCL's get_global_id / get_global_size):

    extern "C" __global__ void E_6_3(float* __restrict__ data0, const float* __restrict__ data1) {
      for (int gidx0 = (blockIdx.y*blockDim.y+threadIdx.y); gidx0 < 6; ...

Half floats come from `cuda_fp16.h`; math functions on them go through float. NVRTC compiles
without the C library's headers, so INFINITY and NAN are spelled with bit patterns. A bitcast
is one of CUDA's intrinsics that read bits as another type (`__int_as_float`,
`__half_as_short`, ...; `bits_functions`), with an integer cast for the unsigned ones. A float
becomes an integer through the C renderer's small functions (toward zero, saturated, NaN -> 0).

Tensor cores (codegen/wmma.py; sm_80 and later): the WMMA nodes of one instruction become one call
of a small device function that packs the thread's fragments, two halves per 32-bit register, into
the inline PTX `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (`.bf16` for bfloat16):

    __align__(16) half wmma0_a[8] = {alu0, alu1, ...};
    __align__(8) half wmma0_b[4] = {alu8, ...};
    float wmma0[4];
    mma_m16n8k16_f16(wmma0, wmma0_a, wmma0_b);
    acc0 = (acc0+wmma0[0]);

A tensor-core block (wmma.TensorCoreBlock) needs nothing more: its k-slices are `__shared__`
arrays, its barriers `__syncthreads()`, and its fragments plain loads from shared memory; a
work-group of (32, warps) threads makes threadIdx.y the warp, as CUDA numbers warps by
consecutive thread ids (x fastest).

Builds on: render/gpu.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from tinyteach.codegen.lower import LinearProgram
from tinyteach.codegen.wmma import WMMAArg, instructions
from tinyteach.device import GPU_CAPABILITIES
from tinyteach.dtype import DType, dtypes
from tinyteach.ir.uop import Ops, UOp
from tinyteach.render import (
    MATH_FUNCTIONS,
    RENDER_FOR_OP,
    CStyleRenderer,
    KernelWriter,
    cast,
    remainder,
    typed_math_function,
)
from tinyteach.render.c import float_to_int_functions, float_to_int_name
from tinyteach.render.gpu import (
    GPUKernelWriter,
    GPURenderer,
    Launch,
    gpu_writer,
    launch_comment,
)

CUDA_PRELUDE = """#define INFINITY (__int_as_float(0x7f800000))
#define NAN (__int_as_float(0x7fffffff))
"""
# the C renderer's float -> integer functions (render/c.py), compiled for the GPU
FLOAT_TO_INT_DEVICE = "__device__ __forceinline__"
HALF_HEADER = "#include <cuda_fp16.h>\n"  # only when a kernel uses half: NVRTC needs its path
BFLOAT16_HEADER = "#include <cuda_bf16.h>\n"
AXES = "xyz"
# a fragment dtype's C type and PTX name, by dtype name (bfloat16 where dtype.py has it)
FRAGMENT_TYPES = {"float16": ("half", "f16"), "bfloat16": ("__nv_bfloat16", "bf16")}

# One tensor-core instruction as a device function: D = A @ B, the thread's fragments packed two
# elements per 32-bit register (element 0 in the low half), C = 0 (the sum is the kernel's)
MMA_FUNCTION = """__device__ inline void NAME(float* d, const TYPE* a, const TYPE* b) {
  const unsigned* A = reinterpret_cast<const unsigned*>(a);
  const unsigned* B = reinterpret_cast<const unsigned*>(b);
  asm volatile("mma.sync.aligned.SHAPE.row.col.f32.PTX.PTX.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1]),
                 "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
}
"""


def mma_function_name(arg: WMMAArg) -> str:
    return f"mma_{arg.core.name}_{FRAGMENT_TYPES[arg.dtype_in.name][1]}"


def mma_function(arg: WMMAArg) -> str:
    """The device function of one tensor-core instruction (m16n8k16: 4 A registers, 2 B)."""
    if arg.core.name != "m16n8k16" or arg.dtype_in.name not in FRAGMENT_TYPES:
        raise NotImplementedError(f"CUDA has no tensor core {arg.core.name} for "
                                  f"{arg.dtype_in.name} here")
    type_name, ptx_type = FRAGMENT_TYPES[arg.dtype_in.name]
    return MMA_FUNCTION.replace("NAME", mma_function_name(arg)).replace("TYPE", type_name) \
        .replace("SHAPE", arg.core.name).replace("PTX", ptx_type)


@dataclass
class CUDAKernelWriter(GPUKernelWriter):
    """A GPU writer that also knows the name of each tensor-core instruction written so far
    (its WMMA nodes name their elements of it)."""

    fragments: dict[tuple[tuple[UOp, ...], WMMAArg], str] = field(default_factory=dict)


def _render_wmma(writer: KernelWriter, u: UOp, operands: list[str]) -> str | None:
    wmma = getattr(writer.renderer, "wmma", None)
    if wmma is None:
        raise NotImplementedError(f"{type(writer.renderer).__name__} has no tensor cores (WMMA)")
    return wmma(writer, u, operands)


RENDER_FOR_OP[Ops.WMMA] = _render_wmma  # only CUDA renders tensor cores (the others refuse)


def cuda_cast(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    """half (and bfloat16) convert to and from other types through float (cuda_fp16.h has
    no direct conversions to bool or to 8-bit integers). A float becomes an integer through
    the C renderer's function (render/c.py, `float_to_int_name`), as a device function: toward
    zero, saturated, NaN -> 0. Spelled out: CUDA C's cast is C's, undefined outside the range,
    and its conversion intrinsics (`__float2int_rz`, ...) have only 32- and 64-bit targets."""
    (a,) = operands
    if operand_dtypes[0] == dtypes.half:
        a = f"__half2float({a})"
    elif operand_dtypes[0].name == "bfloat16":
        a = f"__bfloat162float({a})"
    if dtype == dtypes.half:
        return f"__float2half((float)({a}))"
    if dtype.name == "bfloat16":
        return f"__float2bfloat16((float)({a}))"
    if dtypes.is_float(operand_dtypes[0]) and dtypes.is_int(dtype):
        return f"{float_to_int_name(operand_dtypes[0], dtype)}({a})"  # (FLOAT_TO_INT_DEVICE)
    return cast(renderer, [a], operand_dtypes, dtype)


def cuda_remainder(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
                   dtype: DType) -> str:
    if dtype == dtypes.half:  # fmod of half goes through float
        a, b = operands
        return f"__float2half(fmodf(__half2float({a}),__half2float({b})))"
    return remainder(renderer, operands, operand_dtypes, dtype)


class CUDARenderer(GPURenderer):
    device = "CUDA"
    # shared memory and barriers (render/gpu.py), matmul tiles staged in shared memory
    # (codegen/lower.py), mma.sync m16n8k16 for half and bfloat16, sm_80+ (codegen/wmma.py)
    device_capabilities = replace(GPU_CAPABILITIES, tensor_cores=((16, 8, 16),))
    code_for_op = {**GPURenderer.code_for_op, Ops.CAST: cuda_cast, Ops.MOD: cuda_remainder,
                   **{op: typed_math_function(name, "__half2float({})", "__float2half({})")
                      for op, name in MATH_FUNCTIONS.items()}}
    # a float's bits as the signed integer of its size and back (CStyleRenderer.bitcast)
    bits_functions = {dtypes.float16: ("__short_as_half", "__half_as_short"),
                      dtypes.bfloat16: ("__short_as_bfloat16", "__bfloat16_as_short"),
                      dtypes.float32: ("__int_as_float", "__float_as_int"),
                      dtypes.float64: ("__longlong_as_double", "__double_as_longlong")}

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
        if dtype.name == "bfloat16":
            return f"__float2bfloat16({value!r}f)"
        return super().float_literal(value, dtype)

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        text = super().render_const(value, dtype)
        if text not in (self.infinity, f"-{self.infinity}", self.nan):
            return text
        if dtype == dtypes.float16:
            return f"__float2half({text})"
        if dtype.name == "bfloat16":
            return f"__float2bfloat16({text})"
        return text

    def param(self, define: UOp, is_output: bool) -> str:
        const = "" if is_output else "const "
        return f"{const}{self.type_name(define.dtype)}* __restrict__ data{define.arg[0]}"

    def type_name(self, dtype: DType) -> str:
        if dtype.name == "bfloat16":
            return FRAGMENT_TYPES["bfloat16"][0]
        return super().type_name(dtype)

    def new_writer(self, program: LinearProgram) -> CUDAKernelWriter:
        writer = super().new_writer(program)
        return CUDAKernelWriter(**{f.name: getattr(writer, f.name) for f in fields(writer)})

    def wmma(self, writer: KernelWriter, u: UOp, operands: list[str]) -> str | None:
        """The first WMMA node of an instruction writes its fragments and calls it; every
        node of the instruction is one element of the result."""
        if not isinstance(writer, CUDAKernelWriter):
            raise TypeError("CUDA renders tensor cores with its CUDAKernelWriter")
        arg: WMMAArg = u.arg
        key, line = (u.src, arg.instruction), None
        if key not in writer.fragments:
            name, in_type = writer.new_name("wmma"), self.type_name(arg.dtype_in)
            a, b = operands[:arg.core.a_elements], operands[arg.core.a_elements:]
            writer.emit(f"__align__(16) {in_type} {name}_a[{len(a)}] = {{{', '.join(a)}}};")
            writer.emit(f"__align__(8) {in_type} {name}_b[{len(b)}] = {{{', '.join(b)}}};")
            writer.emit(f"float {name}[{arg.core.c_elements}];")
            line = f"{mma_function_name(arg)}({name}, {name}_a, {name}_b);"
            writer.fragments[key] = name
        writer.names[u] = f"{writer.fragments[key]}[{arg.element}]"
        return line

    def render(self, name: str, program: LinearProgram) -> str:
        source = super().render(name, program)
        headers = "".join(self.headers(program))
        if not headers:
            return source
        first_line, rest = source.split("\n", 1)  # the launch comment stays first
        return first_line + "\n" + headers + rest

    def headers(self, program: LinearProgram) -> list[str]:
        """What the kernel needs before it: cuda_fp16.h / cuda_bf16.h, and the device function
        of each tensor-core instruction it uses."""
        names = {u.dtype.name for u in program.uops} | \
            {u.arg.dtype_in.name for u in program.uops if u.op is Ops.WMMA}
        headers = [HALF_HEADER] if "float16" in names else []
        headers += [BFLOAT16_HEADER] if "bfloat16" in names else []
        arguments = sorted({arg for _, arg in instructions(program.uops)}, key=mma_function_name)
        return headers + [mma_function(arg) for arg in arguments]

    def render_kernel(self, writer: KernelWriter, name: str, params: list[str],
                      body: list[str]) -> str:
        prelude = CUDA_PRELUDE + float_to_int_functions(self, body, FLOAT_TO_INT_DEVICE)
        lines = [launch_comment(gpu_writer(writer).launch),
                 prelude + f'extern "C" __global__ void {name}({", ".join(params)}) {{',
                 *body, "}"]
        return "\n".join(lines) + "\n"
