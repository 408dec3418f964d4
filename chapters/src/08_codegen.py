# %% [markdown] id="codegen-01"
# # Chapter 8 — Code generation: C, OpenCL, CUDA, WGSL
#
# Chapter 7 ended with a `LinearProgram`: loops, loads, arithmetic and stores in order. A
# **renderer** walks that list once and writes source code. This chapter shows:
#
# - `code_for_op`: a table from each ALU op to a small function that writes its snippet —
#   `Ops.ADD` → `(a+b)`. That table is most of what differs between C-like languages;
# - one `CStyleRenderer` and small subclasses: C for the CPU, OpenCL C, CUDA C and WGSL for GPUs
#   (declarations, type names, thread indices and loops are what they change);
# - how the code stays readable: values used once are written inline, values used twice get a
#   name (`alu0`), loads always do (`val0`);
# - rendering is only string building: it needs no GPU. *Running* the CUDA kernel does.
#
# Modules: [`tinyteach/render/__init__.py`](../tinyteach/render/__init__.py) (the shared walk and
# `code_for_op`), [`render/c.py`](../tinyteach/render/c.py),
# [`render/gpu.py`](../tinyteach/render/gpu.py) (what the GPU languages share),
# [`render/opencl.py`](../tinyteach/render/opencl.py),
# [`render/cuda.py`](../tinyteach/render/cuda.py) and
# [`render/wgsl.py`](../tinyteach/render/wgsl.py).

# %% id="codegen-02"
# %load_ext tinyteach
import numpy as np

import viz
from tinyteach import Device, Tensor

Device.DEFAULT = "CPU"   # every chapter runs on the CPU device: generated C, compiled here
Tensor.manual_seed(0)
rng = np.random.default_rng(0)

from tinyteach.codegen.lower import lower
from tinyteach.dtype import dtypes
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.uop import Ops
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render.c import CRenderer
from tinyteach.render.cuda import CUDARenderer
from tinyteach.render.opencl import OpenCLRenderer
from tinyteach.render.wgsl import WGSLRenderer

RENDERERS = {"C": CRenderer(), "OpenCL": OpenCLRenderer(), "CUDA": CUDARenderer(),
             "WGSL": WGSLRenderer()}


def kernel_of(tensor):
    items, _ = create_schedule([tensor.uop], "CPU")
    return items[-1]


# %% [markdown] id="codegen-03"
# ## `code_for_op`: one small function per op
#
# Every entry of the table has the same signature, in every language — and it is the one you
# implement in chapter 12's exercise: `code(renderer, operands, operand_dtypes, dtype)`. It gets
# the renderer (for the language's words: `type_name`, `render_const`, `where`), the source text
# of each operand, their dtypes and the dtype of the result, and returns one expression. Here are
# a few ops in C:

# %% id="codegen-04"
c = RENDERERS["C"]
f32 = dtypes.float32


def snippet(renderer, op, *operands, dtype=f32):
    """What `renderer` writes for `op` on these operands, of dtype `dtype` (WHERE's condition
    is a bool, and so is the result of a comparison)."""
    operand_dtypes = [dtypes.bool if op is Ops.WHERE and i == 0 else dtype
                      for i in range(len(operands))]
    result = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else dtype
    return renderer.code_for_op[op](renderer, list(operands), operand_dtypes, result)


for op in (Ops.ADD, Ops.MUL, Ops.CMPLT, Ops.MAX):
    print(f"{op.name:6} {snippet(c, op, 'a', 'b')}")
print(f"{'NEG':6} {snippet(c, Ops.NEG, 'a')}")
print(f"{'EXP2':6} {snippet(c, Ops.EXP2, 'a')}")
print(f"{'WHERE':6} {snippet(c, Ops.WHERE, 'cond', 'a', 'b')}")
assert snippet(c, Ops.ADD, "a", "b") == "(a+b)"

# %% [markdown] id="codegen-05"
# `MAX` is longer than `a>b?a:b` on purpose: numpy's maximum returns NaN if either side is NaN,
# and every backend must agree with the NUMPY reference. Languages differ in a few entries only.
# Compare the four tables for the ops where they differ:

# %% id="codegen-06"
for op, operands in ((Ops.EXP2, ("a",)), (Ops.CAST, ("a",)), (Ops.WHERE, ("c", "a", "b"))):
    for language, renderer in RENDERERS.items():
        if op is Ops.CAST:  # float32 -> int32
            text = renderer.code_for_op[op](renderer, ["a"], [f32], dtypes.int32)
        else:
            text = snippet(renderer, op, *operands)
        print(f"{op.name:5} {language:7} {text}")
assert RENDERERS["WGSL"].where("c", "a", "b").startswith("select(")

# %% [markdown] id="codegen-07"
# WGSL has no `?:` (it says `select(if_false, if_true, condition)`), and its casts are written as
# constructors (`i32(a)`); C picks `exp2f` for floats where OpenCL overloads `exp2`. A float
# converted to an integer is the one CAST every language writes differently, because C leaves it
# undefined outside the integer's range (NaN, inf, 1e10 to int32) and CPUs disagree there (AVX2
# and AVX-512 code too). tinyteach defines it as OpenCL's `convert_int_sat_rtz` does: toward zero,
# saturated to the integer's range, NaN to 0. OpenCL has the function; C and CUDA call a small
# helper of comparisons (`tt_float_to_int32`); WGSL a helper that also finds NaN by its bits.
#
# The tables are class attributes, and a language is a table merged over its parent's:
# `code_for_op = {**CStyleRenderer.code_for_op, Ops.MAX: wgsl_max, ...}`. An entry that a
# language does not change is the parent's function — integer division, for example, is written
# once for all four (C and OpenCL wrap every entry, so that bfloat16 math is done in float32;
# for other dtypes the wrapper hands over to the parent's function). It must never trap (C's `x/0` kills the process), so it guards
# the divisor, except when the divisor is a literal that cannot be 0 or -1, as in index
# arithmetic:

# %% id="codegen-37"
int32 = dtypes.int32
for language in ("C", "WGSL"):
    renderer = RENDERERS[language]
    four = renderer.render_const(4, int32)
    print(f"{language:5} a/b  {snippet(renderer, Ops.IDIV, 'a', 'b', dtype=int32)}")
    print(f"{language:5} a/4  {snippet(renderer, Ops.IDIV, 'a', four, dtype=int32)}")
from tinyteach.render import CStyleRenderer

shared = CStyleRenderer.code_for_op[Ops.IDIV]
assert all(snippet(r, Ops.IDIV, "a", "b", dtype=int32) == shared(r, ["a", "b"], [int32] * 2, int32)
           for r in RENDERERS.values())

# %% [markdown] id="codegen-38"
# A renderer keeps nothing of the kernel it is writing: the names it gave, the loop depth and,
# on a GPU, the launch live in a `KernelWriter` made for that one render. So one renderer
# object serves every kernel of its device, even two at once.
#
# ## One kernel, four languages
#
# Take a fused elementwise kernel with a little of everything — a load, arithmetic, a math
# function and a comparison: `(x * 2 + 1).sqrt().maximum(x)`. It is lowered once; then each
# renderer writes it.

# %% id="codegen-08"
x = Tensor(rng.uniform(0, 4, (6, 3)).astype(np.float32)).realize()
item = kernel_of((x * 2 + 1).sqrt().maximum(x))
program = lower(item.ast, heuristic_plan(item.ast))
print(item.name)
print(RENDERERS["C"].render(item.name, program))

# %% [markdown] id="codegen-09"
# The C kernel is a plain function over pointers: `const` marks inputs, `restrict` promises that
# buffers do not overlap (so the compiler may vectorize). `val0` is the load; the index `alu0`
# gets a name because two uops use it (the load and the store); everything else is written
# inline. Notice the price of inlining: `MAX`'s snippet mentions its operand three times, so
# `sqrtf(...)` is written out four times. The C compiler computes it once (common subexpression
# elimination), but a reader would prefer a name — a renderer could name every operand of a
# snippet that repeats it.
#
# OpenCL C adds address spaces (`__global`) and replaces each output loop by a *grid-stride
# loop* over work-items: work-item `get_global_id(0)` starts at its own index and steps by the
# number of work-items, so any launch size covers the whole output. The comment on top is the
# launch size the runtime reads back.

# %% id="codegen-10"
opencl_source = RENDERERS["OpenCL"].render(item.name, program)
print(opencl_source)
assert "__kernel void" in opencl_source and "get_global_id(0)" in opencl_source

# %% [markdown] id="codegen-11"
# ### CUDA — shown here, run only on an NVIDIA GPU
#
# CUDA C is C++: `extern "C" __global__` marks a kernel with an unmangled name, and a thread's
# index is `blockIdx.x*blockDim.x+threadIdx.x`. Writing this source needs nothing but Python:

# %% id="codegen-12"
cuda_source = RENDERERS["CUDA"].render(item.name, program)
print(cuda_source)
assert '__global__ void' in cuda_source and "threadIdx.x" in cuda_source

# %% [markdown] id="codegen-13"
# **Running it needs an NVIDIA GPU** (and pycuda); compiling it to PTX needs NVRTC or nvcc,
# which work without a GPU (see [`runtime/cuda.py`](../tinyteach/runtime/cuda.py)). On a
# machine without a GPU, asking for the device says so clearly instead of pretending:

# %% id="codegen-14"
# NBVAL_IGNORE_OUTPUT
# (the output depends on whether this machine has an NVIDIA GPU)
from tinyteach.device import DeviceUnavailable

try:
    gpu_x = x.to("CUDA")
    print("ran on CUDA:", ((gpu_x * 2 + 1).sqrt().maximum(gpu_x)).numpy()[0])
except DeviceUnavailable as error:
    print(str(error).split(" Available here")[0])

# %% [markdown] id="codegen-15"
# ### WGSL — the shading language of WebGPU
#
# WGSL looks more like Rust: buffers are *bindings* declared outside the function, variables are
# `var name: type = value;`, the kernel is an `@compute` entry point and the thread index is
# the `global_invocation_id` builtin.

# %% id="codegen-16"
wgsl_source = RENDERERS["WGSL"].render(item.name, program)
print(wgsl_source)
assert "@compute" in wgsl_source and "select(" in wgsl_source

# %% [markdown] id="codegen-17"
# WGSL is also stricter: it has no 64-bit types. A renderer must never compute silently in
# another type, so a `float64` kernel is refused with an error that names the dtype:

# %% id="codegen-18"
doubles = Tensor(np.arange(4, dtype=np.float64)).realize()
double_kernel = kernel_of(doubles + 1)
double_program = lower(double_kernel.ast, heuristic_plan(double_kernel.ast))
try:
    RENDERERS["WGSL"].render(double_kernel.name, double_program)
    raise AssertionError("WGSL must refuse float64")
except Exception as error:
    print(type(error).__name__ + ":", error)
print(RENDERERS["C"].render(double_kernel.name, double_program).splitlines()[2])

# %% [markdown] id="codegen-19"
# ## All languages side by side
#
# `viz.kernel` renders a kernel with every renderer it finds in `tinyteach/render/`, with
# syntax highlighting — here the chapter 6 example:

# %% id="codegen-20"
a, b2, c2 = (Tensor(rng.standard_normal((4, 4)).astype(np.float32)).realize() for _ in range(3))
viz.kernel(((a + b2) * c2).relu().sum(1))

# %% [markdown] id="codegen-21"
# ## The C source is what the CPU runs
#
# On the CPU device, the engine (chapter 9) compiles exactly this C. `%%tinyteach` shows the
# source of each kernel a cell launched:

# %% id="codegen-22"
# %%tinyteach --show kernels,source
y = (x * 2 + 1).sqrt().maximum(x)
y.realize()

# %% id="codegen-23"
np.testing.assert_allclose(y.numpy(), np.maximum(np.sqrt(x.numpy() * 2 + 1), x.numpy()),
                           rtol=1e-6)


# %% [markdown] id="codegen-39"
# ## A convolution is a matmul, once its operands are in order
#
# The optimizer of chapter 7 gives a matmul a *vector tile*: 8 rows times 32 columns of the
# output per loop iteration (two vectors of 16 per row), each step loading 16 consecutive numbers
# of `b` as one vector and one number of `a` for all of them. A convolution is the same sum of products:
#
# `out[n, co, y, x] = sum over (ci, ky, kx) of image[n, ci, y+ky, x+kx] * w[co, ci, ky, kx]`
#
# — a matmul whose rows are the output pixels `(n, y, x)`, whose columns are the output channels
# `co` and whose sum runs over a window `(ci, ky, kx)` (chapter 4's window view of the image).
# But read off the memory, it is not a vector tile: the output's last axis is `x`, whose 16 pixels
# do not sit next to each other in `w`, and along the channel axis, the one to vectorize, `w`
# jumps a whole filter (`ci*ky*kx` = 72 floats) and so does the output (a `y*x` plane). So the
# scheduler's one kernel gets a scalar tile:

# %% id="codegen-40"
import time

from tinyteach.engine.realize import build_schedule

images = Tensor(rng.standard_normal((8, 8, 18, 18)).astype(np.float32)).realize()
filters = Tensor(rng.standard_normal((16, 8, 3, 3)).astype(np.float32)).realize()
conv = images.conv2d(filters)
plain, _ = create_schedule([conv.uop], "CPU")      # the scheduler's one kernel
packed = build_schedule([conv.uop], "CPU").items   # after packing (opt/pack.py): what realize runs


def inner_loop(item):
    """The C of a kernel's innermost loop: where it spends its time."""
    renderer = Device["CPU"].renderer
    program = lower(item.ast, heuristic_plan(item.ast, renderer.vector_width))
    source = renderer.render(item.name, program)
    lines = source.splitlines()
    start = max(k for k, line in enumerate(lines) if "for (int ridx" in line)
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(k for k in range(start + 1, len(lines))
               if lines[k].startswith(" " * indent + "}"))
    return "\n".join(line[indent:] for line in lines[start:end + 1])


print(plain[0].name)
print(inner_loop(plain[0]))

# %% [markdown] id="codegen-41"
# Sixteen scalar accumulators, 17 loads for 16 multiply-adds. Packing (the `opt/pack.py` section of
# chapter 7) fixes the layout instead of the loop. Its *channel tile* turns the one kernel into
# three:
#
# 1. copy `w` with its channel axis last, `(ci, ky, kx, co)`: a filter tap of all 16 output
#    channels is now 16 consecutive floats;
# 2. compute the output with the channel axis last as well, `(n, y, x, co)`, with the pixels
#    `x` in blocks of 8 as the tile's rows: now the kernel *is* a vector matmul tile;
# 3. copy the result back into the `(n, co, y, x)` order the rest of the graph reads.

# %% id="codegen-42"
for item in packed:
    print(f"{item.name:26} {item.boundary_reason}")
after = inner_loop(packed[1])
print(after)
assert [item.name.split("_")[0] for item in packed] == ["pack", "r", "unpack"]
assert "float_vec16" in after and "float_vec16" not in inner_loop(plain[0])

# %% [markdown] id="codegen-43"
# One vector load of 16 channels of `w` (`val1`) and 8 numbers of the image, neighbouring
# pixels, feed 8 vector multiply-adds: 128 of the sum's products per step instead of 16. The copies
# are small next to the work: `w` has 1,152 floats, the output 32,768, and the kernel does
# 2.4 million multiply-adds. The numbers are those of a plain convolution (numpy's sliding
# windows, multiplied and summed by `einsum`):

# %% id="codegen-44"
from numpy.lib.stride_tricks import sliding_window_view

windows = sliding_window_view(images.numpy(), (3, 3), axis=(2, 3))  # (n, ci, y, x, ky, kx)
expected = np.einsum("ncyxij,ocij->noyx", windows, filters.numpy())
np.testing.assert_allclose(conv.numpy(), expected, rtol=1e-4, atol=1e-4)

# %% [markdown] id="codegen-45"
# How much it pays, measured on this machine (the book renders for a 16-lane CPU; the timing
# compiles each kernel for the lanes this CPU really has, and runs on one thread). The figure
# varies from machine to machine and run to run:

# %% id="codegen-46"
# NBVAL_IGNORE_OUTPUT
from tinyteach.runtime.cpu import native_macros, native_vector_width

backend = Device["CPU"]
native = CRenderer(native_vector_width(native_macros(backend.compiler.compiler)),
                   fused_multiply_add=backend.renderer.fused_multiply_add)


def fastest(items, repeats=20):
    """Seconds to run these kernels once each, in order (the best of `repeats` tries)."""
    programs = []
    for item in items:
        program = lower(item.ast, heuristic_plan(item.ast, native.vector_width))
        source = native.render(item.name, program)
        source = source.replace("#pragma omp parallel for", "")  # one thread: a fair compare
        programs.append(backend.program(item.name, backend.compiler.compile(source)))
        for buffer in item.buffers:
            _ = buffer.storage  # allocated outside the clock
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for program, item in zip(programs, items):
            program(*item.buffers)
        best = min(best, time.perf_counter() - start)
    return best


multiply_adds = 8 * 16 * 16 * 16 * 8 * 3 * 3
print(f"vector lanes on this CPU: {native.vector_width}")
for label, items in (("one kernel, scalar tile", plain),
                     ("pack, vector tile, unpack", packed)):
    took = fastest(items)
    print(f"{label:26} {took * 1e3:6.3f} ms  {2 * multiply_adds / took / 1e9:5.1f} GFLOP/s")

# %% [markdown] id="codegen-47"
# The same plan serves both gradients of a convolution. For the weights' gradient the channel
# axis is again `co`, and the packed factor is the upstream gradient (with the ReLU's and the
# pooling's backward fused into it: the copy evaluates them once, where the kernel would redo
# them for each of the 9 taps). The input's gradient is a convolution too: conv2d states its
# gradient as a whole (chapter 2, `register_gradient`), and the input's is a *transposed*
# convolution of the upstream gradient with the same filters — a gather, one more convolution
# kernel. The primitive rules would go through the window view instead: a sum over the output
# channels for each tap of each window, stored (9 or 25 numbers per input pixel), then summed
# into the pixels. `NOOPT=1` turns the optimizations off, `CHANNEL_TILES=0` only the channel
# tiles, and `DEBUG=3` names the packing kernels and why they are there.

# %% [markdown] id="codegen-48"
# ## Pooling: a window view that is only a reshape
#
# `max_pool2d` is a max over chapter 4's window view, and its gradient is the gradient of that
# view. The general view (any stride, any dilation) repeats the image — pad, expand into copies,
# reshape, shrink — so its gradient *sums over the copies*: a kernel per pooled axis, each
# reading the whole gradient. When the windows do not overlap (kernel <= stride, no dilation: the
# 2x2 pools of a CNN), every pixel is in at most one window and the view is a reshape,
# `(n, c, 18, 18)` to `(n, c, 9, 2, 9, 2)` with the two window axes moved last
# (`tensor_core._tiled_windows`). Its gradient is a reshape back, with no sum at all. The kernels
# of the gradient, for windows that tile the image and for windows that overlap:

# %% id="codegen-49"
pixels = rng.standard_normal((8, 8, 18, 18)).astype(np.float32)


def pool_kernels(kernel, stride):
    """The kernels of the gradient of max_pool2d(pixels).sum() (the max among them)."""
    x = Tensor(pixels, requires_grad=True)
    x.max_pool2d(kernel, stride).sum().backward()
    items = build_schedule([x.grad.uop], "CPU").items
    return [item.name for item in items if item.kind == "kernel"], x.grad.numpy()


tiled, tiled_grad = pool_kernels(2, 2)
overlapping, _ = pool_kernels(3, 2)
print("2x2 windows, stride 2:", "  ".join(tiled))
print("3x3 windows, stride 2:", "  ".join(overlapping))
assert tiled == ["r_8_8_9_9_2_2", "r_8_8_9_9_2_2", "E_8_8_18_18"]
assert len([name for name in overlapping if name.startswith("r_")]) == 4
blocks = pixels.reshape(8, 8, 9, 2, 9, 2)  # numpy's own tiling: the gradient of a max is 1
is_max = blocks == blocks.max(axis=(3, 5), keepdims=True)  # where the max is (no ties here)
np.testing.assert_array_equal(tiled_grad, is_max.reshape(pixels.shape).astype(np.float32))

# %% [markdown] id="codegen-50"
# For the tiled windows, the first `r_` kernel is the max; the second counts each window's
# maxima (tinyteach splits the gradient evenly between ties, as tinygrad does and as PyTorch's
# `amax`; PyTorch's `max_pool2d` gives it all to the first); the `E_` kernel over the image is
# the gradient itself, elementwise — in the benchmark CNN's training step it fuses into its
# readers (the bias gradient's sum, the packed copy for the weights' gradient). The overlapping windows add two reductions over the copies, one
# per pooled axis (their last axis, 4, is the number of copies). In the benchmark CNN's training
# step this is 51 kernels instead of 54.

# %% [markdown] id="codegen-24"
# ## Try it

# %% [markdown] id="codegen-25"
# **Try it — your own snippet.** Make a C renderer whose `MAX` uses the C library's `fmaxf` (careful: `fmaxf` ignores NaN,
# unlike numpy — so this would fail the reference tests; it is only an exercise). Subclass
# `CRenderer`, merge your entry over its table (`code_for_op = {**CRenderer.code_for_op, Ops.MAX: ...}`), and render
# `x.maximum(1.0)`.

# %% id="codegen-26"
# your code here

# %% [markdown] id="codegen-27"
# *Solution* (click the collapsed cell below to show it):

# %% id="codegen-28" jupyter={"source_hidden": true} tags=["solution"]
def fmax_code(renderer, operands, operand_dtypes, dtype):
    a, b = operands
    return f"fmaxf({a},{b})"


class FmaxRenderer(CRenderer):
    code_for_op = {**CRenderer.code_for_op, Ops.MAX: fmax_code}


max_kernel = kernel_of(x.maximum(1.0))
max_program = lower(max_kernel.ast, heuristic_plan(max_kernel.ast))
source = FmaxRenderer().render(max_kernel.name, max_program)
print(source)
assert "fmaxf(" in source and "fmaxf(" not in CRenderer().render(max_kernel.name, max_program)

# %% [markdown] id="codegen-29"
# **Try it — where is exp?.** Render `x.exp()` in C. Which math function appears, and why not `expf`? (Hint: look for
# `EXP2` in `tinyteach/ir/uop.py`'s primitive ops.)

# %% id="codegen-30"
# your code here

# %% [markdown] id="codegen-31"
# *Solution* (click the collapsed cell below to show it):

# %% id="codegen-32" jupyter={"source_hidden": true} tags=["solution"]
exp_kernel = kernel_of(x.exp())
exp_program = lower(exp_kernel.ast, heuristic_plan(exp_kernel.ast))
source = RENDERERS["C"].render(exp_kernel.name, exp_program)
print(source)
# exp is not a primitive op: Tensor.exp is exp2(x * log2(e)), so only exp2 needs a snippet
assert "exp2f(" in source and "expf(" not in source

# %% [markdown] id="codegen-33"
# **Try it — OpenCL vs CUDA.** Use `difflib.unified_diff` to list the lines that differ between the OpenCL and the CUDA
# source of the kernel above. What do all the differences have in common?

# %% id="codegen-34"
# your code here

# %% [markdown] id="codegen-35"
# *Solution* (click the collapsed cell below to show it):

# %% id="codegen-36" jupyter={"source_hidden": true} tags=["solution"]
import difflib

diff = difflib.unified_diff(opencl_source.splitlines(), cuda_source.splitlines(),
                            "OpenCL", "CUDA", lineterm="", n=0)
print("\n".join(diff))
# declarations, thread indexing and the spelling of math functions (sqrt vs sqrtf) differ;
# the structure of the body (loads, arithmetic, store) is the same

# %% [markdown] id="codegen-51"
# ## exp from primitives: why a libm call stops vectorization
#
# `exp2f` is a function in libm. gcc vectorizes a loop only when every step in it has a vector
# instruction, and a call has none: so softmax's sum loop, `acc += exp2f(...)`, adds one element
# at a time. `tinyteach/codegen/transcendental.py` writes exp2 as arithmetic instead: clamp x to
# [-152, 130], split it into an integer n and a fraction f in [-0.5, 0.5], compute 2**f with a
# polynomial of degree 6 (Horner's rule), and build 2**n from its bits (n + 127 in the exponent
# field, read as a float: a BITCAST). The C renderer does this in the loops whose sums are split
# across SIMD lanes; `TRANSCENDENTAL=2` does it everywhere, `TRANSCENDENTAL=0` keeps the calls.

# %% id="codegen-52"
from tinyteach.helpers import Context

rows = Tensor(np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32))
softmax_kernel = kernel_of(rows.softmax(-1))
softmax_program = lower(softmax_kernel.ast, heuristic_plan(softmax_kernel.ast, 8))
sources = {}
for setting in (0, 1):
    with Context(TRANSCENDENTAL=setting):
        sources[setting] = CRenderer().render(softmax_kernel.name, softmax_program)


def sum_loop(source):
    start = source.index("for (int ridx1")
    return source[start:source.index("\n    }\n", start)]


print("\n".join(sum_loop(sources[1]).splitlines()[:8]))
assert "exp2f(" in sum_loop(sources[0]) and "exp2f(" not in sum_loop(sources[1])
assert "tt_bits_to_float(" in sum_loop(sources[1])  # 2**n from its bits

# %% [markdown] id="codegen-53"
# Is the arithmetic accurate? Over a million values from -160 to 130 (subnormal results
# included), exp2 is within one unit in the last place (ulp) of numpy's exp2 computed in float64
# and rounded to float32; most results are exactly rounded, the rest one ulp off (the polynomial's
# roundings). Softmax on the CPU still matches numpy.

# %% id="codegen-54"
sweep = np.linspace(-160, 130, 1_000_003, dtype=np.float32)
with Context(TRANSCENDENTAL=2):  # every exp2 as arithmetic (this kernel has no SIMD sum)
    ours = Tensor(sweep, device="CPU").exp2().numpy()
with np.errstate(over="ignore"):
    exact = np.exp2(sweep.astype(np.float64)).astype(np.float32)
ulps = np.abs(ours.view(np.int32).astype(np.int64) - exact.view(np.int32).astype(np.int64))
print(f"largest difference: {ulps.max()} ulp; exactly rounded: {(ulps == 0).mean():.0%}")
assert ulps.max() <= 1
x_np = rows.numpy()
expected = np.exp(x_np - x_np.max(-1, keepdims=True))
expected /= expected.sum(-1, keepdims=True)
np.testing.assert_allclose(rows.softmax(-1).numpy(), expected, rtol=2e-6, atol=1e-9)

# %% [markdown] id="codegen-61"
# ## Softmax in lanes, one row at a time: 7-8 ms where PyTorch takes 6
#
# Softmax over rows of 1024 is one kernel (row fusion, chapter 6): per row a max, a sum of
# exps, and a loop over the columns that writes exp / sum. Given the usual 4x4 tile (4 rows per
# iteration, the column loop writing 16 outputs from 4 rows), gcc vectorizes only the sum loop,
# which its `#pragma omp simd` allows it to. Three things stand in the way of the others:
#
# - **the tile**: the column loop's 16 stores per iteration are 4 short runs in 4 rows;
# - **`-fwrapv`**: every kernel is compiled with it, so that an int32 that overflows wraps as in
#   numpy. But then a position `row + column` may wrap, and once widened to an address it is
#   not a straight line in `column` (gcc: "evolution of base is not affine"): no vector loads;
# - **the max**: `acc = (acc > x) | (acc != acc) ? acc : x` (the NaN test keeps a NaN) is one
#   chain of dependent steps; a compiler will not split it, and OpenMP's `max` reduction would
#   drop a NaN.
#
# So the optimizer gives a row kernel one row per iteration (`heuristic._one_row_at_a_time`); a kernel
# whose integers are only positions is compiled without `-fwrapv`
# (`render.c.integers_are_positions`: no integer is loaded, stored, summed or converted, so
# nothing can wrap); and the renderer splits the max and the sums into lanes itself.
#
# Which loops gcc vectorizes is its decision *for a target CPU*, and the device builds for
# this machine's own (`-march=native`, or the `CPU_ARCH` setting), so the answer on an AVX-512
# machine need not be the one on an AVX2 machine. gcc 12 answers, compiling for two pinned
# targets, `x86-64-v3` (AVX2, 8 float lanes) and `x86-64-v4` (AVX-512, 16 lanes), with the
# device's other flags (`-fopt-info-vec` names the loops it vectorized):
#
# | loop | before: 4x4 tile, `-fwrapv`, `omp simd` | after: the kernel as the device builds it |
# |---|---|---|
# | the max over a row (`ridx0`) | scalar on both | vectorized on both |
# | the sum of exps (`ridx1`) | vectorized on both (`omp simd`) | vectorized on both |
# | the column loop (`gidx1`) | scalar on both | vectorized on both |
#
# (`tests/test_row_vectors.py` asks gcc the same questions for both targets and fails if an
# answer changes.) Here are the two kernels' loops as the renderer writes them: `before` with
# its pragma and a tile of 4 rows, `after` with one row per iteration, each reduction split
# into a loop over blocks of 16 and a loop over a block's 16 lanes, then the lanes combined by
# halving (`ridx0_half`), and built without `-fwrapv`:

# %% id="codegen-62"
import re

from tinyteach.codegen.plan import KernelOptions

norm_rows = Tensor(rng.standard_normal((4096, 1024)).astype(np.float32))
row_kernel = kernel_of(norm_rows.softmax(-1))
cpu = Device["CPU"].renderer  # its vector width: 16 lanes in the book (CPU_VECTOR_WIDTH)
tiled = KernelOptions(upcasts=((0, 4), (1, 4)), parallel=True)  # the usual 4x4 tile
with Context(FIXED_LANES=0, ROW_CACHE=0):  # sums under `omp simd`, exp computed twice
    before = cpu.render(row_kernel.name, lower(row_kernel.ast, tiled))
before = before.replace(', "no-wrapv"', "")  # built as every kernel was: with -fwrapv
after = cpu.render(row_kernel.name,
                   lower(row_kernel.ast, heuristic_plan(row_kernel.ast, cpu.vector_width)))


def loop_lines(source):
    """The lines of `source` that open a loop or say how the compiler may build it."""
    return [line.rstrip()[:100] for line in source.splitlines()  # (cut at 100 characters)
            if re.match(r"\s*(for \(|#pragma|__attribute__)", line)]


for name, source in (("before", before), ("after", after)):
    print(f"{name}:")
    print("\n".join(loop_lines(source)))
assert "#pragma omp simd" in before and "#pragma omp simd" not in after
assert '"no-wrapv"' in after and "no-wrapv" not in before
assert len(re.findall(r"for \(int ridx\d_lane = 0; ridx\d_lane < 16;", after)) == 2
assert "exp2f(" in before and "exp2f(" not in after

# %% [markdown] id="codegen-63"
# Take `-fwrapv` back alone, and gcc 12 leaves the column loop scalar again for x86-64-v3 (the
# lane loops index by `block + lane`, which it still follows). For x86-64-v4 it vectorizes it
# anyway: AVX-512 has a *scatter* store (`vscatterdps`), which writes 16 lanes to 16 addresses
# computed one by one, so the addresses need not be a straight line. AVX2 can gather (load)
# that way, but has no scatter. A scatter is much slower than one store of neighbouring floats
# (8 with AVX2, 16 with AVX-512), which is what the loop compiles to without `-fwrapv` (the
# same test checks both targets' answers, and that the kernel as built has no scatter).

# %% [markdown] id="codegen-65"
# **Lanes in a fixed order.** `acc0_lanes` holds W accumulators (W is the device's vector width,
# what `runtime/cpu.py` reports). Lane l takes elements l, l + W, l + 2W, ... of the row; after
# the loop the lanes are combined by halving (lane l with lane l + W/2, then l + W/4, ...). The
# loop over a block's W lanes has no dependence between lanes, so gcc makes it one vector
# operation, for the max as for the sum. And the order is written in the source: gcc -O2,
# gcc -O0 and tcc (the fast tier of chapter 9) compute the same operations in the same order and
# get the same bits, where `#pragma omp simd reduction(+:...)` let the compiler choose
# (`FIXED_LANES=0` gives that path).
#
# **exp once.** The sum loop computes exp(x - max) for every element, and the column loop needed
# it again. The values are the same UOps (with the loop counter renamed), so the renderer lets
# the sum loop store them in an array of one row on the stack (`local0`, `ROW_CACHE`), and the
# column loop reads them back: one exp per element, as PyTorch does.

# %% id="codegen-66"
start = after.index("    float acc0 = ")
print("\n".join(line[:110] for line in after[start:].splitlines()[:7]))
width = cpu.vector_width
assert f"acc0_lanes[{width}]" in after and "#pragma omp simd" not in after
assert "local0[ridx1] = " in after and "local0[gidx1]" in after
x_np = norm_rows.numpy()
expected = np.exp(x_np - x_np.max(-1, keepdims=True))
expected /= expected.sum(-1, keepdims=True)
np.testing.assert_allclose(norm_rows.softmax(-1).numpy(), expected, rtol=2e-6, atol=1e-9)

# %% [markdown] id="codegen-67"
# What each step buys, measured on a 2-core AVX2 machine shared with other jobs (so the figures are
# rough: the lowest CPU time of 30 runs, one thread, 4096 x 1024): the tiled kernel 26-37 ms;
# one row at a time in lanes 9-11 ms; with the exp kept in the row's array 7-8 ms; PyTorch's
# softmax 6.0-6.2 ms.
