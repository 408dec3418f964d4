# %% [markdown] id="dev-01"
# # Chapter 9 — Devices and runtimes
#
# Chapters 6-8 produce, for each kernel, an AST, a linear program and source code. This chapter
# is about what finally runs them:
#
# - a **backend** is three small pieces: an **Allocator** (get memory, copy bytes in and out), a
#   **Compiler** (source → binary) and a **Program** (run a binary on buffers);
# - two kinds of backend: the **NUMPY** device *interprets* a kernel's ops with numpy (no
#   renderer, no compiler), the **CPU** device *compiles* the generated C with gcc or clang and
#   calls it with ctypes. Same schedule, same results;
# - the **engine** (`engine/realize.py`): schedule → get a runnable program per kernel → run them in
#   order, counting everything in `GlobalCounters`. Programs are cached, in memory and on disk;
# - `Device.DEFAULT` and `DEV=NAME` choose the device; a `Buffer` is allocated when first needed
#   and freed when nothing refers to it; the host allocator keeps freed memory in a **pool**;
# - a device with memory of its own, **OPENCL**: **copies** between host and device, an
#   **asynchronous queue** (a launch returns at once, `synchronize()` waits), timing with the
#   device's own **events**, and one expression walked from schedule to result;
# - **several devices**: `CPU:1` is a second CPU; `shard` splits a tensor over devices, ops run
#   per shard, a reduction over the split axis is a **ring all-reduce**, and data-parallel
#   training on two devices gives one device's losses.
#
# Modules: [`tinyteach/device.py`](../tinyteach/device.py) (Allocator, Compiler, Buffer, Device),
# [`tinyteach/engine/realize.py`](../tinyteach/engine/realize.py) (the engine),
# [`runtime/numpy.py`](../tinyteach/runtime/numpy.py) (the interpreter, and the reference
# meaning of every primitive op), [`runtime/cpu.py`](../tinyteach/runtime/cpu.py) (compiled C),
# [`runtime/opencl.py`](../tinyteach/runtime/opencl.py) (OpenCL C through pyopencl) and
# [`tinyteach/tensor/multi.py`](../tinyteach/tensor/multi.py) (tensors over several devices).

# %% id="dev-02"
# %load_ext tinyteach
import numpy as np

from tinyteach import Context, Device, GlobalCounters, Tensor

Device.DEFAULT = "CPU"   # every chapter runs on the CPU device: generated C, compiled here
Tensor.manual_seed(0)
rng = np.random.default_rng(0)

import gc
import os
import subprocess
import sys
import weakref

from tinyteach.device import Buffer
from tinyteach.dtype import dtypes
from tinyteach.engine.realize import get_runner, runner_cache
from tinyteach.engine.schedule import create_schedule

# %% [markdown] id="dev-03"
# ## A backend is three pieces
#
# `Device[name]` loads a backend by name. Look at what the two host devices are made of:

# %% id="dev-04"
def describe(name):
    backend = Device[name]
    parts = {"allocator": backend.allocator, "renderer": backend.renderer,
             "compiler": backend.compiler}
    print(name)
    for part, value in parts.items():
        print(f"  {part:9}: {type(value).__name__ if value is not None else None}")
    print(f"  program  : {getattr(backend.program, '__name__', type(backend.program).__name__)}")

describe("NUMPY")
describe("CPU")
assert Device["NUMPY"].renderer is None and Device["NUMPY"].compiler is None


# %% [markdown] id="dev-05"
# Both keep their memory in the host's RAM (`HostAllocator`). The NUMPY device has neither a
# renderer nor a compiler: its program walks the kernel's AST. The CPU device renders C
# (chapter 8) and compiles it.
#
# ## Choosing a device
#
# The first cell of every chapter sets `Device.DEFAULT = "CPU"`. Without that, tinyteach picks
# the best device available, and the environment variable `DEV=NAME` (or tinygrad's `NAME=1`)
# overrides the choice. Settings are read when a program starts, so we start small Python
# programs to see it:

# %% id="dev-06"
def default_device_with(**environment):
    program = "from tinyteach import Device; print(Device.DEFAULT)"
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            env={**os.environ, **environment})
    return result.stdout.strip() or result.stderr.strip().splitlines()[-1]

print("DEV=NUMPY ->", default_device_with(DEV="NUMPY"))
print("NUMPY=1   ->", default_device_with(NUMPY="1"))
print("DEV=CPU   ->", default_device_with(DEV="CPU"))
assert default_device_with(DEV="NUMPY") == "NUMPY"

# %% [markdown] id="dev-07"
# A tensor can also name its device, and `.to()` copies between devices:

# %% id="dev-08"
x_numpy = Tensor([1.0, 2.0, 3.0], device="NUMPY")
x_cpu = x_numpy.to("CPU")
print(x_numpy.device, x_cpu.device, (x_cpu * 2).tolist())
assert Device.DEFAULT == "CPU" and Device.is_available("NUMPY")

# %% [markdown] id="dev-09"
# ## Buffers: allocated late, freed by Python
#
# A `Buffer` is a size and a dtype on a device. It takes no memory until something needs its
# storage — a copy in, or a kernel that writes it:

# %% id="dev-10"
buffer = Buffer("CPU", 4, dtypes.float32)
print(buffer)
buffer.copyin(np.array([1, 2, 3, 4], dtype=np.float32))
print(buffer)
print(buffer.numpy())
assert buffer.is_allocated

# %% [markdown] id="dev-11"
# The schedule creates the output buffers of its kernels, but allocates nothing: allocation
# happens in the engine, right before a kernel runs.

# %% id="dev-12"
a = Tensor(rng.standard_normal((4, 4)).astype(np.float32)).realize()
items, _ = create_schedule([(a * 2).sum(1).uop], "CPU")
print("before running:", items[0].output)


# %% [markdown] id="dev-13"
# Nobody frees a buffer by hand: when the last tensor (or schedule item) that refers to it is
# gone, Python's garbage collector releases the memory. A weak reference lets us watch that
# happen without keeping the buffer alive:

# %% id="dev-14"
def buffer_of(tensor):
    node = tensor.uop
    while node.op.name == "RESHAPE":
        node = node.src[0]
    return node.arg

temporary = (a + 1).realize()
watcher = weakref.ref(buffer_of(temporary))
print("while the tensor lives:", watcher())
del temporary
gc.collect()
print("after `del` :", watcher())
assert watcher() is None

# %% [markdown] id="dev-46"
# ## The allocator's pool
#
# Asking the operating system for fresh memory is cheap, but *touching* it is not: the first
# write to each page (4 KB, or 2 MB where the system uses huge pages) stops the program (a
# **page fault**) while the operating system finds a page and clears it. For a big buffer that
# can cost more than the copy or the kernel that fills it. So the host
# allocator (`HostMemory` in device.py) does what tinygrad's LRU allocator does: freed memory
# goes into `HostMemory.pool`, by size, and the next allocation of the same size takes it back —
# already touched, and not cleared (a kernel writes all of its output anyway).
#
# We free a 64 MB buffer, allocate another of the same size, and compare addresses; the
# operating system's count of page faults (`ru_minflt`) shows what the pool saves. (OPENCL's
# allocator has no pool: every buffer is a new `cl.Buffer`.)

# %% id="dev-47"
import resource
import time

from tinyteach.device import HostMemory


def page_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed_copyin(buffer, data):
    """(microseconds, page faults) of copying `data` into `buffer`, allocating it first."""
    start_faults, start = page_faults(), time.perf_counter()
    buffer.copyin(data)
    return (time.perf_counter() - start) * 1e6, page_faults() - start_faults


big_data = np.ones(16 << 20, dtype=np.float32)          # 64 MB
first = Buffer("CPU", big_data.size, dtypes.float32)
fresh_us, fresh_faults = timed_copyin(first, big_data)
first_address = first.storage.address
del first                                               # its memory goes into the pool
gc.collect()
print("in the pool after `del`:", bool(HostMemory.pool.get(big_data.nbytes)))
second = Buffer("CPU", big_data.size, dtypes.float32)
reused_us, reused_faults = timed_copyin(second, big_data)
print("the same memory came back:", second.storage.address == first_address)
print(f"copy into fresh memory: {fresh_us:.0f} us, into reused memory: {reused_us:.0f} us")
print("fewer page faults in reused memory:", reused_faults < fresh_faults)
assert second.storage.address == first_address and reused_faults < fresh_faults
del second

# %% [markdown] id="dev-15"
# ## One schedule, two backends
#
# The schedule is the same for every device: only `item.device` differs. Here is softmax on both
# host devices — one kernel each, the row's max and sum computed in the softmax's own kernel
# (chapter 6's row fusion):

# %% id="dev-16"
data = rng.standard_normal((3, 5)).astype(np.float32)
on_numpy = Tensor(data, device="NUMPY").softmax(1)
on_cpu = Tensor(data, device="CPU").softmax(1)
names = {}
for tensor in (on_numpy, on_cpu):
    items, _ = create_schedule([tensor.uop], tensor.device)
    names[tensor.device] = [item.name for item in items]
    print(tensor.device, [(item.name, item.device) for item in items])
assert names["NUMPY"] == names["CPU"] and len(names["CPU"]) == 1

# %% [markdown] id="dev-17"
# The engine's `get_runner` turns an item into something runnable. For NUMPY the runner holds an
# interpreter and no source; for CPU it holds the linear program, the C source and the loaded
# function:

# %% id="dev-18"
for tensor in (on_numpy, on_cpu):
    items, _ = create_schedule([tensor.uop], tensor.device)
    runner = get_runner(items[-1])
    source = "no source (interpreted)" if runner.source is None else \
        f"{len(runner.source.splitlines())} lines of C"
    print(f"{runner.device:5} {runner.name}: {source}; program {type(runner.program).__name__}")

# %% [markdown] id="dev-19"
# and the results agree to float rounding — the NUMPY device is the reference every other
# backend is tested against:

# %% id="dev-20"
np.testing.assert_allclose(on_cpu.numpy(), on_numpy.numpy(), rtol=1e-6)
np.testing.assert_allclose(on_cpu.numpy().sum(1), np.ones(3), rtol=1e-6)
print(on_cpu.numpy().round(3))

# %% [markdown] id="dev-21"
# What does "interpret" mean? The NUMPY device has one small numpy function per primitive op —
# this table *is* the definition of what each op means. It has 27 entries for 29 primitive ops:
# the two missing are `BUFFER` and `COPY`, which compute nothing — a `BUFFER` is memory the
# engine allocates and passes in, and a `COPY` between devices is a step of its own in the
# schedule (chapter 6), done by the engine, not inside a kernel:

# %% id="dev-22"
from tinyteach.ir.uop import PRIMITIVE_OPS
from tinyteach.runtime.numpy import NUMPY_OPS

print(len(NUMPY_OPS), "numpy functions;", len(PRIMITIVE_OPS), "primitive ops")
print(sorted(op.name for op in NUMPY_OPS)[:10], "...")
print("not in the table:", [op.name for op in PRIMITIVE_OPS if op not in NUMPY_OPS])
assert {op.name for op in PRIMITIVE_OPS if op not in NUMPY_OPS} == {"BUFFER", "COPY"}

# %% [markdown] id="dev-23"
# ## Compiling once: two caches
#
# Compiling C costs tens of milliseconds, so the engine never does it twice:
#
# 1. **in memory**, runners are cached by kernel AST. New *data* with the same shapes gives the
#    same AST (inputs are `DEFINE_GLOBAL`s, not values), so nothing is compiled again. The cache
#    keeps the 4,096 programs used most recently (an LRU cache, `realize.runner_cache`), and
#    `tinyteach.clear_caches()` empties it and every other cache in memory;
# 2. **on disk**, the compiled shared object is keyed by a hash of the source, the compiler and
#    its flags, under `$TINYTEACH_CACHE` (default `~/.cache/tinyteach`): a new Python process
#    reuses it.

# %% id="dev-24"
x1 = Tensor(rng.standard_normal((8, 8)).astype(np.float32)).realize()
(x1.exp() * 3).sum(0).realize()
cached_before = len(runner_cache)
x2 = Tensor(rng.standard_normal((8, 8)).astype(np.float32)).realize()  # new data, same shape
(x2.exp() * 3).sum(0).realize()
print("runners compiled for the second call:", len(runner_cache) - cached_before)
assert len(runner_cache) == cached_before
assert runner_cache.limit == 4096

# %% [markdown] id="dev-25"
# The disk cache, in a fresh temporary directory so that we see it fill (the path is not
# printed: it differs on every run). The second compile of the same source is a lookup:

# %% id="dev-26"
import tempfile
from pathlib import Path

compiler = Device["CPU"].compiler
source = "void add_one(float* restrict out) { out[0] += 1.0f; }\n"
saved = os.environ.get("TINYTEACH_CACHE")
with tempfile.TemporaryDirectory() as directory:
    os.environ["TINYTEACH_CACHE"] = directory
    start = time.perf_counter()
    first = compiler.compile(source)
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    second = compiler.compile(source)
    lookup_seconds = time.perf_counter() - start
    files = sorted(p.suffix for p in Path(directory).rglob("*") if p.is_file())
    print("files in the cache:", files)
    print("same file both times:", first == second)
    print("the lookup is >10x faster than compiling:", lookup_seconds * 10 < compile_seconds)
    assert first == second and files == [".so"]
if saved is None:
    del os.environ["TINYTEACH_CACHE"]
else:
    os.environ["TINYTEACH_CACHE"] = saved

# %% [markdown] id="dev-27"
# A kernel that does not compile raises `CompileError` with the compiler's message and the
# offending source line — never a crash deep inside ctypes:

# %% id="dev-28"
from tinyteach.device import CompileError

try:
    compiler.compile("void broken(float* out) { out[0] = 1.0f }\n")
except CompileError as error:
    message = str(error)
    print(message.splitlines()[0])
    print([line for line in message.splitlines() if line.startswith("  line")])

# %% [markdown] id="dev-29"
# ## Counting: `GlobalCounters` and `DEBUG=2`
#
# The engine counts every launch: kernels, estimated arithmetic operations, and bytes of the
# buffers each kernel touches (time too, which we do not print). `DEBUG=1` prints a line per
# launch and `DEBUG=2` adds its time. That is the time of *one* launch, and noisy: a first launch
# pays for cold caches, and any launch can be slowed by the rest of the machine — read it as a
# rough size, not as the kernel's cost (chapter 7 measures that: warm-up, then the minimum of many
# launches). The times below are the ones measured when this notebook was stored; yours will
# differ, and validation compares them as `TIME`.

# %% id="dev-30"
y = Tensor(rng.standard_normal((16, 16)).astype(np.float32)).realize()
GlobalCounters.reset()
with Context(DEBUG=2, CPU_TIERED=0):  # optimized builds only: the tiers come later (dev-70)
    (y @ y).relu().sum().realize()
print("kernels:", GlobalCounters.kernel_count, " ops:", GlobalCounters.global_ops,
      " bytes:", GlobalCounters.global_mem)
assert GlobalCounters.kernel_count == 2

# %% [markdown] id="dev-31"
# `%%tinyteach` shows the same launches, with what each one fused and how long it took:

# %% id="dev-32"
# %%tinyteach --show kernels
z = Tensor(rng.standard_normal((16, 16)).astype(np.float32))
(z.softmax(1) * 2).realize()

# %% [markdown] id="dev-70"
# ## Two builds of each new kernel: tiered compilation
#
# A training step's first run brings dozens of new kernels, and `cc -O2` needs 50-100 ms of CPU
# for each. So the CPU device builds a schedule's new kernels twice, as the JIT of a virtual
# machine does (`runtime/cpu.py`): a **fast tier** first — tcc, which builds a kernel in a few
# milliseconds, or `cc -O0` where tcc is missing — and the kernel runs that build at once, while
# `cc -O2` builds the optimized library in a background thread. When it is done, each program
# swaps its function pointer: later launches, and JIT graphs, run the optimized code.
#
# Tiering must never change a number. An unoptimized build does each float operation as
# written, in the order written; so does `cc -O2`, except where the source lets it reorder:
# with `FIXED_LANES=0`, a sum split into vector lanes by `#pragma omp simd reduction`. Such a
# kernel skips the fast tier and waits for its optimized build. Lanes in a fixed order
# (chapter 8) are written out in the C source, so tcc builds those sums bit for bit, and a
# vector matmul's multiply-adds are written as fused multiply-adds (the kernel's macro: the
# vector FMA instruction's builtin, or one `__builtin_fmaf` per lane where the target has no
# such instruction): rounded once on every tier, and one vector instruction under `cc -O2`
# (`tests/test_fma_tiers.py` checks both). One more
# kernel waits: one so large (2^24 multiply-adds or more) that its unoptimized build would run
# longer than `cc -O2` takes to compile it.
#
# `DEBUG=2` shows the tiers: a note names the build before a fast-tier launch, and the launch
# line ends with the tier in parentheses; a launch of an optimized build has no mark. (We hold
# the background thread for a moment so the first launch surely finds the fast build; the
# empty cache directory makes every kernel new.)

# %% id="dev-71"
import threading

import tinyteach.runtime.cpu as cpu
from tinyteach.engine.realize import record_launches

saved = os.environ.get("TINYTEACH_CACHE")
with tempfile.TemporaryDirectory() as directory:
    os.environ["TINYTEACH_CACHE"] = directory
    runner_cache.clear()  # forget this session's programs: both kernels are built anew
    w = Tensor(np.arange(65536, dtype=np.float32) / 65536).realize()
    square = w.reshape(256, 256)  # 256x256 @ 256x256: 2^24 multiply-adds
    release = threading.Event()
    cpu.background().submit(release.wait, 60)  # the optimized builds wait behind this
    with Context(DEBUG=2), record_launches() as launches:
        Tensor.realize((w * 0.375).exp2(), square @ square)
    tiers = [launch.runner.program.tier for launch in launches]  # before the swap
    release.set()
    cpu.wait_for_optimized_builds()
    print("after the swap:")
    with Context(DEBUG=2):
        (w * 0.375).exp2().realize()
if saved is None:
    del os.environ["TINYTEACH_CACHE"]
else:
    os.environ["TINYTEACH_CACHE"] = saved
waited = [cpu.starts_optimized(launch.runner.source, launch.runner.spec.heavy)
          for launch in launches]  # (heavy: a flag of the kernel's ProgramSpec)
assert waited == [False, True] and tiers[0] != "optimized" and tiers[1] == "optimized"
assert not any(cpu.needs_optimized_build(launch.runner.source) for launch in launches)
assert launches[0].runner.program.tier == "optimized"  # swapped in
np.testing.assert_allclose(launches[0].buffers[0].numpy(),
                           np.exp2(np.arange(65536, dtype=np.float32) / 65536 * 0.375), rtol=1e-6)
square_np = (np.arange(65536, dtype=np.float32) / 65536).reshape(256, 256).astype(np.float64)
np.testing.assert_allclose(launches[1].buffers[0].numpy().reshape(256, 256),
                           square_np @ square_np, rtol=1e-5)

# %% [markdown] id="dev-72"
# The elementwise kernel ran its tcc build first; the large matmul waited for `cc -O2` (its
# bits would have been the same: it waited for speed alone). `CPU_TIERED=0` (or
# `Context(CPU_TIERED=0)`) turns the fast tier off. Both tiers give the same bits for every
# kernel that is tiered: `tests/test_cpu_tiers.py` compares NaN, ±inf, -0.0, subnormals, casts
# and integer division by zero byte for byte.

# %% [markdown] id="dev-73"
# ### The first training step, stage by stage
#
# A training step with an empty cache goes through every stage of the book once per kernel:
# the scheduler cuts the graph into kernels (chapter 6), each is lowered to loops and index
# arithmetic (chapter 7) and rendered as C (chapter 8), the fast tier builds them all, tcc the
# scalar kernels and `cc -O0` the vector matmuls (tcc knows no vector types), and then they
# run; no kernel waits for `cc -O2`. Below, the
# first step of a 784-128-10 MLP with Adam, watched with `DEBUG=2`: the summary line of
# `compile_many`, then which build each launch ran (the tier at the end of its line, counted
# here rather than printed 30 times). The optimized builds are held back again, so every
# fast-tier launch surely finds its fast build. (`tests/test_cpu_tiers.py` runs the same step
# and checks that every launch names a fast tier and that the loss is numpy's.)

# %% id="dev-74"
import contextlib
import cProfile
import io
import re
from collections import Counter
from unittest import mock

from tinyteach import nn
from tinyteach.nn import optim

Tensor.manual_seed(0)
layer1, layer2 = nn.Linear(784, 128), nn.Linear(128, 10)
parameters = [layer1.weight, layer1.bias, layer2.weight, layer2.bias]
adam = optim.Adam(parameters, lr=1e-3)
images = rng.standard_normal((128, 784)).astype(np.float32)
labels = rng.integers(0, 10, 128).astype(np.int32)
Tensor.realize(*parameters)
profile = cProfile.Profile()  # for the next cells: where the step's time goes
with tempfile.TemporaryDirectory() as directory, \
        mock.patch.dict(os.environ, TINYTEACH_CACHE=directory):
    runner_cache.clear()  # every kernel of the step is new
    release = threading.Event()
    cpu.background().submit(release.wait, 60)  # the optimized builds wait behind this
    shown = io.StringIO()
    with Context(DEBUG=2, TRAINING=1), contextlib.redirect_stdout(shown):
        step_start = time.perf_counter()
        profile.enable()
        adam.zero_grad()
        loss = layer2(layer1(Tensor(images)).relu()).sparse_categorical_crossentropy(
            Tensor(labels)).backward()
        Tensor.realize(loss, *adam.schedule_step())
        profile.disable()
        step_seconds = time.perf_counter() - step_start
    release.set()
    cpu.wait_for_optimized_builds()
lines = shown.getvalue().splitlines()
summary = next(line.strip() for line in lines if "new kernels on the fast tier" in line)
print(summary.replace(Device["CPU"].compiler.optimized_tier, "cc -O2"))
launches = [line for line in lines if line.startswith("*** CPU")]
tiers = Counter(re.search(r"us \((.+)\)$", line).group(1) for line in launches)
print(f"{len(launches)} launches:", ", ".join(f"{n} ran a {t} build" for t, n in tiers.items()))

# %% [markdown] id="dev-75"
# Where did the step's time go? Python's profiler answers: `cProfile` (enabled around the step
# above) records every Python call, and `pstats` gives each function's *cumulative* time, its
# own and that of everything it called. Five functions are the stages: `build_schedule`
# (chapter 6), `lower` (chapter 7), the renderer's `spec`, which renders the source and says
# how to build and launch it (chapter 8), the compiler's `compile_many` and the executor's
# `run`, which launches every kernel of a realize (this chapter). "compile" is the time the
# step waited in `compile_many`: the tcc call and, at the same time, the `cc -O0` build of the
# vector matmuls; the optimized builds start after it, in the background. The profiler adds a cost
# to every Python call, so the Python stages look slower than they run without it, while
# compile, mostly waiting for the compilers' processes, does not (`DEBUG=2` adds its printing
# to the run stage too). Measured here, so different on every run and machine;
# `benchmarks/run.py` measures the whole first step against PyTorch.

# %% id="dev-76"
# NBVAL_IGNORE_OUTPUT
import pstats

import tinyteach.engine.realize as realize

STAGES = {"schedule": realize.build_schedule, "lower": realize.lower,
          "render": Device["CPU"].renderer.spec, "compile": Device["CPU"].compiler.compile_many,
          "run": realize.run}
recorded = pstats.Stats(profile).stats  # (file, line, name) -> (calls, calls, own, cumulative, _)
for stage, function in STAGES.items():
    code = getattr(function, "__func__", function).__code__  # (a method's function)
    _, calls, _, cumulative, _ = recorded[(code.co_filename, code.co_firstlineno, code.co_name)]
    print(f"{stage:<9} {cumulative * 1e3:7.1f} ms in {calls:3} calls")
print(f"{'the step':<9} {step_seconds * 1e3:7.1f} ms (with the profiler on)")

# %% [markdown] id="dev-48"
# ## A device with memory of its own: OPENCL
#
# The NUMPY and CPU devices work in the host's RAM, and a kernel has finished when the call
# returns. A GPU is different in two ways: it has **its own memory**, so data must be copied
# there and back, and it has a **command queue**: the host puts work in and goes on, the device
# runs it later, in order. OpenCL is a standard API over many vendors' drivers; `pip install
# 'pyopencl[pocl]'` (or Debian's `pocl-opencl-icd`) brings **pocl**, an OpenCL that runs on the
# CPU but keeps both rules, so everything below behaves as it would on a GPU — on any laptop.
#
# The OPENCL backend is the same three pieces, built on pyopencl: an allocator of `cl.Buffer`s,
# a compiler that builds OpenCL C into a `cl.Program`, and a Program class that *enqueues* a
# kernel. Each OPENCL cell below checks that the device runs here, and says why not otherwise.

# %% id="dev-49"
from tinyteach.runtime import opencl

cl = opencl.cl  # pyopencl, or None where it is not installed


def opencl_here():
    """True when OPENCL runs here; otherwise says why not and returns False."""
    if Device.is_available("OPENCL"):
        return True
    print("OPENCL is not available here:", Device.why_unavailable("OPENCL"))
    return False


if opencl_here():
    backend = Device["OPENCL"]
    for part in ("allocator", "renderer", "compiler"):
        print(f"  {part:9}: {type(getattr(backend, part)).__name__}")
    print("  program  : OpenCLProgram, made by backend.load_program(spec, binary)")
    print("  and one", type(backend.context).__name__, "with one", type(backend.queue).__name__)
    # the backend reads its vector width from the device (8 or 16 floats on a CPU); pinned here so
    # that the kernels printed below are the same on every machine
    backend.renderer.vector_width = 8

# %% [markdown] id="dev-50"
# ### Which OpenCL?
#
# A machine can have several OpenCL **platforms** (drivers): here Debian's pocl and the copy of
# pocl inside the pyopencl wheel (two platforms of the same name), elsewhere a GPU vendor's. Being listed does not mean working:
# the wheel's pocl uses LLVM 14, which does not know some newer CPUs and then fails every build.
# So the backend *probes* (`find_working_device` in runtime/opencl.py): it builds and runs a
# 4-thread kernel on each candidate device, pocl's platforms first, and takes the first device
# that computes the right numbers. (`OPENCL_PLATFORM=` chooses one by index or name.)

# %% id="dev-51"
if opencl_here():
    platforms = cl.get_platforms()
    print("pyopencl lists platforms named:", sorted({platform.name for platform in platforms}))
    chosen = Device["OPENCL"].cl_device
    print("the backend took:", chosen.platform.name)
    print(opencl.PROBE_SOURCE)
    print("probe on the chosen device:", opencl.probe_device(chosen) or "computed [1, 3, 5, 7]")
    assert chosen.platform in platforms and opencl.probe_device(chosen) is None

# %% [markdown] id="dev-52"
# ## Copies between host and device
#
# `Buffer.copyin` and `Buffer.numpy()` are the two directions, and on OPENCL each is a real copy
# (`cl.enqueue_copy`) between a host array and device memory. A tensor moved with `.to("OPENCL")`
# gets a **COPY** item in its schedule — a step of its own, done by the engine, not a kernel
# (chapter 6): it reads the source buffer into a host array (`numpy()`) and writes that into the
# destination (`copyin`). Here a CPU tensor goes to OPENCL, is doubled there, and comes back:

# %% id="dev-53"
if opencl_here():
    host = Tensor(np.arange(6, dtype=np.float32)).realize()        # on CPU
    round_trip = (host.to("OPENCL") * 2).to("CPU")
    items, _ = create_schedule([round_trip.uop], "CPU")
    for item in items:
        print(f"{item.kind:6} {item.name:16} on {item.device}")
    GlobalCounters.reset()
    with Context(DEBUG=1):
        result = round_trip.numpy()
    print(result)
    assert [item.kind for item in items] == ["copy", "kernel", "copy"]
    np.testing.assert_equal(result, np.arange(6) * 2)

# %% [markdown] id="dev-54"
# A CPU tensor and an OPENCL tensor never share memory: the host's is a `HostMemory` (a numpy
# array in RAM), the device's a `cl.Buffer`, and the copy is taken at the moment the COPY runs.
# Overwrite the CPU tensor's memory afterwards and the OPENCL tensor still holds the old values:

# %% id="dev-55"
if opencl_here():
    on_host = Tensor(np.arange(4, dtype=np.float32)).realize()
    on_device = on_host.to("OPENCL").realize()
    host_buffer, device_buffer = buffer_of(on_host), buffer_of(on_device)
    print("CPU memory   :", type(host_buffer.storage).__name__)
    print("OPENCL memory:", "pyopencl", type(device_buffer.storage).__name__)
    host_buffer.copyin(np.full(4, -1, dtype=np.float32))    # write into the CPU tensor's memory
    print("CPU tensor   :", on_host.tolist())
    print("OPENCL tensor:", on_device.tolist())
    assert on_device.tolist() == [0.0, 1.0, 2.0, 3.0] and on_host.tolist() == [-1.0] * 4

# %% [markdown] id="dev-56"
# ## A launch returns at once: the queue and `synchronize`
#
# `OpenCLProgram.__call__` sets the kernel's arguments and calls `cl.enqueue_nd_range_kernel`:
# the kernel is *put in the queue* and the call returns — the device runs it later, and the
# queue runs its work in the order it came. `Device["OPENCL"].synchronize()` waits until the
# queue is empty (`queue.finish()`); the host devices' `synchronize` does nothing, since their
# work is done when the call returns. We time a 768×768 matmul both ways (after one warm-up
# launch, and the fastest of five, as chapter 7 measures):

# %% id="dev-57"
if opencl_here():
    size = 768
    left = Tensor(rng.standard_normal((size, size)).astype(np.float32), device="OPENCL")
    right = Tensor(rng.standard_normal((size, size)).astype(np.float32), device="OPENCL")
    (matmul_item,), _ = create_schedule([(left @ right).uop], "OPENCL")
    matmul = get_runner(matmul_item)            # lowered, rendered and built: OpenCLProgram
    matmul.program(*matmul_item.buffers)        # warm-up launch
    Device["OPENCL"].synchronize()
    enqueue_times, finished_times = [], []
    for _ in range(5):
        start = time.perf_counter()
        event = matmul.program(*matmul_item.buffers)    # returns at once
        enqueue_times.append(time.perf_counter() - start)
        Device["OPENCL"].synchronize()                  # waits for the kernel
        finished_times.append(time.perf_counter() - start)
    enqueue_us, finished_us = min(enqueue_times) * 1e6, min(finished_times) * 1e6
    print(f"the call returned after    {enqueue_us:.0f} us")
    print(f"the kernel had finished at {finished_us:.0f} us")
    print("after synchronize:", cl.command_execution_status.to_string(
        event.command_execution_status))
    assert enqueue_us * 5 < finished_us

# %% [markdown] id="dev-58"
# So any time measured around a launch alone is the time to *enqueue* it. Reading a buffer
# needs no explicit wait: `Buffer.numpy()` synchronizes, and its copy is queued after the
# kernels that write the buffer, so the queue's order makes it wait for them. The engine relies
# on this: it enqueues kernel after kernel and waits only when a value is read (the JIT's graph
# of launches, chapter 10, enqueues them all and waits once).

# %% id="dev-59"
if opencl_here():
    matmul.program(*matmul_item.buffers)        # enqueued, not waited for
    product = matmul_item.output.numpy().reshape(size, size)   # waits, then copies back
    np.testing.assert_allclose(product, left.numpy() @ right.numpy(), rtol=1e-4, atol=1e-3)
    print("read back right after the launch: equals numpy's matmul")

# %% [markdown] id="dev-60"
# ## Timing a device: events
#
# Wall-clock time on the host cannot tell when the device started or finished a kernel: it sees
# the enqueue, and the end of a wait (which includes waking the host up). OpenCL can record the
# device's own times: a queue made with `PROFILING_ENABLE` stamps every command's **event** when
# it was queued, submitted to the device, started and ended (`event.profile`, in nanoseconds).
# The backend's queue has no profiling, so we make a queue of our own on the backend's context
# and device, and launch the same built kernel on it:

# %% id="dev-61"
if opencl_here():
    profiling_queue = cl.CommandQueue(
        Device["OPENCL"].context, Device["OPENCL"].cl_device,
        properties=cl.command_queue_properties.PROFILING_ENABLE)
    kernel = matmul.program.kernel
    kernel.set_args(*(buffer.storage for buffer in matmul_item.buffers))

    def profiled_launch():
        """(microseconds the host spent enqueueing, the event's profile)."""
        start = time.perf_counter()
        event = cl.enqueue_nd_range_kernel(profiling_queue, kernel, matmul.program.global_size,
                                           matmul.program.local_size)
        enqueue_us = (time.perf_counter() - start) * 1e6
        event.wait()
        return enqueue_us, event.profile

    def kernel_nanoseconds(profile):
        return profile.end - profile.start

    profiled_launch()                           # warm-up: a new queue's first launch
    launches = [profiled_launch() for _ in range(3)]
    enqueue_us = min(host_us for host_us, _ in launches)
    stamps = min((profile for _, profile in launches), key=kernel_nanoseconds)
    kernel_us = kernel_nanoseconds(stamps) / 1e3
    print(f"host: the enqueue took {enqueue_us:.0f} us")
    print(f"device: queued -> submitted {(stamps.submit - stamps.queued) / 1e3:.0f} us, "
          f"submitted -> started {(stamps.start - stamps.submit) / 1e3:.0f} us, "
          f"started -> ended {kernel_us:.0f} us")
    assert stamps.queued <= stamps.submit <= stamps.start <= stamps.end
    assert enqueue_us < kernel_us

# %% [markdown] id="dev-62"
# `started -> ended` is the kernel's own time, with nothing of the host in it. (tinyteach's
# `DEBUG=2` is simpler: it synchronizes after each launch and reads the wall clock, so its time
# includes the enqueue and the wait — fine for a rough size, not for a kernel's cost.)
#
# ## One expression on OPENCL, end to end
#
# Now every step the engine takes, by hand, for `relu((x * w).sum(1) + 1)` on OPENCL. First the
# **schedule** (chapter 6): one kernel, everything fused into it. The inputs were made on
# OPENCL, so they were copied in when they were created, and no COPY item is needed:

# %% id="dev-63"
if opencl_here():
    x_data = rng.standard_normal((16, 64)).astype(np.float32)
    w_data = rng.standard_normal(64).astype(np.float32)

    def expression(device):
        x, w = Tensor(x_data, device=device), Tensor(w_data, device=device)
        return ((x * w).sum(1) + 1).relu()

    (walk_item,), _ = create_schedule([expression("OPENCL").uop], "OPENCL")
    print(walk_item.kind, walk_item.name, "on", walk_item.device)
    for note in walk_item.fusions:
        print("   ", note)
    print("buffers:", walk_item.buffers)

# %% [markdown] id="dev-64"
# The **source**: lowering (chapter 7) and the OpenCL renderer (chapter 8) give an OpenCL C
# kernel, in a `ProgramSpec` that also says how many threads to launch: a *global size*
# (threads in all) and a *local size* (threads per work-group); the source's first line repeats
# them as a comment, for the reader. OpenCL can share a reduction across a work-group, so the optimizer gives each of
# the 16 rows a group of 16 threads (chapter 8b's group reduction): thread `lidx0` sums every
# 16th product, the 16 partial sums meet in `__local` memory and are added in halves between
# barriers, and thread 0 stores the row. The group loop `gidx0` steps by the number of groups,
# so that any number of groups would cover all the rows:

# %% id="dev-65"
if opencl_here():
    walk_runner = get_runner(walk_item)
    walk_spec = walk_runner.spec
    print(walk_spec.source)
    print("spec: global size", walk_spec.global_size, "local size", walk_spec.local_size,
          "buffers", walk_spec.buffers)

# %% [markdown] id="dev-66"
# The **build**: `Device["OPENCL"].compiler.compile` hands the source to the OpenCL driver
# (`cl.Program(context, source).build()`), which compiles it for the device. The "binary" is an
# `OpenCLBinary`: the built `cl.Program` and the kernel's own source (a kernel that does not build
# raises `CompileError` with the driver's log). Every build costs pocl about 0.1 s however many
# kernels it holds, so realize builds a schedule's new kernels as one program (`compile_many`),
# and each binary keeps its own kernel's source.

# %% id="dev-67"
if opencl_here():
    built = Device["OPENCL"].compiler.compile(walk_spec.source)
    program_built = built.program
    print(type(program_built).__module__, type(program_built).__name__, "with kernels:",
          program_built.kernel_names)
    assert program_built.kernel_names == walk_item.name

# %% [markdown] id="dev-68"
# The **launch**: `Device["OPENCL"].load_program(spec, built)` makes an `OpenCLProgram`, which
# takes the launch sizes from the spec (never from the source) and keeps the `cl.Kernel`. We
# allocate the output, enqueue, wait, and **copy back** — then compute the same expression on
# the NUMPY device, the reference:

# %% id="dev-69"
if opencl_here():
    program = Device["OPENCL"].load_program(walk_spec, built)
    print(type(program).__name__, "global size", program.global_size,
          "local size", program.local_size)
    output, *inputs = walk_item.buffers
    print("output before the launch:", output)
    program(output, *inputs)            # enqueue
    Device["OPENCL"].synchronize()      # wait
    on_opencl = output.numpy()          # copy back
    on_numpy = expression("NUMPY").numpy()
    print(on_opencl.round(3))
    np.testing.assert_allclose(on_opencl, on_numpy, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(on_numpy, np.maximum((x_data * w_data).sum(1) + 1, 0),
                               rtol=1e-5, atol=1e-5)

# %% [markdown] id="dev-80"
# ## Several devices: `shard`
#
# One device has only so much memory and so many cores. tinygrad goes past one device the
# simplest way there is: a device name may carry an **index**. `CPU:1` is a second CPU device:
# a Backend with an allocator of its own (its buffers are its own), and the first CPU's
# renderer and compiler, so the same kernels run on it. `CPU:0` is `CPU`.

# %% id="dev-81"
print(Device.canonicalize("cpu:1"), Device.canonicalize("CPU:0"))
second = Device["CPU:1"]
print(second.name, "own allocator:", second.allocator is not Device["CPU"].allocator,
      "same compiler:", second.compiler is Device["CPU"].compiler)
on_second = Tensor([1.0, 2.0, 3.0], device="CPU:1")
print(on_second.device, (on_second * 2).to("CPU").tolist())

# %% [markdown] id="dev-82"
# A tensor over several devices is a **sharded** tensor: `t.shard(devices, axis)` cuts `t` into
# equal parts along `axis` and copies part i to `devices[i]` (`axis=None` copies all of it to
# each: a *replicated* tensor). Its `.device` is the tuple of devices, and its graph is one UOp
# graph per device, the **shards** ([`tinyteach/tensor/multi.py`](../tinyteach/tensor/multi.py)'s
# `MultiUOp`). An op that needs nothing from another shard — elementwise ops, and movement
# ops that leave the split axis alone — runs on each device by itself. `DEBUG=1` shows the
# kernels on both devices:

# %% id="dev-83"
TWO = ("CPU", "CPU:1")
x_data = np.arange(24, dtype=np.float32).reshape(4, 6)
x_split = Tensor(x_data).shard(TWO, axis=0)
print("device", x_split.device, "shape", x_split.shape, "split on axis", x_split.uop.axis)
print("shards:", [shard.shape for shard in x_split.uop.shards])
with Context(DEBUG=1):
    y_split = (x_split * 2 + 1).relu().realize()
np.testing.assert_array_equal(y_split.numpy(), np.maximum(x_data * 2 + 1, 0))

# %% [markdown] id="dev-84"
# The first half of `x` stays on `CPU` as it is (a view of its buffer); the second half is first
# gathered into a buffer of its own (a copy moves whole buffers) and copied to `CPU:1`. Then the
# same kernel runs once on each device.
#
# A **reduction over the split axis** cannot stay on one device: each device reduces its own
# rows, and then the partial results must be combined. That is an **all-reduce**: afterwards
# every device holds the whole sum. tinyteach does it as a **ring**, as NCCL and tinygrad do.
# Each partial result is cut into one chunk per device. In the *reduce-scatter* rounds, chunk
# c leaves device c and travels around the ring, and each device it reaches adds its own part
# of chunk c; after n-1 rounds one device holds all of chunk c. In the *all-gather* rounds the
# finished chunks travel n-1 more times, until every device has every chunk. Each device
# sends 2(n-1)/n of one partial result in all, however many devices there are. Here are the
# steps for three devices:

# %% id="dev-85"
from tinyteach.tensor.multi import ring_steps

for step in ring_steps(3):
    print(f"{step.phase:>14} round {step.round}: chunk {step.chunk}  "
          f"device {step.source} -> device {step.dest}")

# %% [markdown] id="dev-86"
# Each step is a COPY between two devices and an ADD (or MAX) — ordinary graph nodes, which
# the scheduler runs like any other. `DEBUG=1` prints the ring's steps, naming the devices,
# when it is built, and then the kernels and copies as they run:

# %% id="dev-87"
with Context(DEBUG=1):
    column_sums = x_split.sum(axis=0).realize()
print("split on", column_sums.uop.axis, "(None: every device holds all of it)")
np.testing.assert_array_equal(column_sums.numpy(), x_data.sum(0))
for shard, device in zip(column_sums.uop.shards, TWO):  # each device's own copy of the sum
    buffer = shard.toposort[0].arg
    assert buffer.device == device
    np.testing.assert_array_equal(buffer.numpy(), x_data.sum(0))

# %% [markdown] id="dev-96"
# viz draws the same all-reduce: `viz.schedule` takes the shards' graphs (a MultiUOp's
# `shards`, one UOp graph per device) and shows every kernel and every copy, with its device
# and the reason it is a step of its own:

# %% id="dev-97"
import viz

viz.schedule(*x_split.sum(axis=0).uop.shards)

# %% [markdown] id="dev-88"
# `.to(device)` (and `.numpy()`) **gathers**: every shard is copied to the device and the
# shards are concatenated along the axis. A reduction over another axis needs no all-reduce,
# and stays split:

# %% id="dev-89"
row_sums = x_split.sum(axis=1)
print("row sums split on", row_sums.uop.axis, "->", row_sums.to("CPU").tolist())
np.testing.assert_array_equal(row_sums.numpy(), x_data.sum(1))

# %% [markdown] id="dev-90"
# **matmul** is built from a broadcast multiply and a sum (chapter 1), so it follows from the
# rules above. A replicated input times a weight split on its columns (axis 1) gives a result
# split on its columns: each device computes its own columns, with no communication at all.
# A batch split on axis 0 times a replicated weight gives a batch-split result. (Split both on
# the inner axis and the sum over it becomes an all-reduce.)

# %% id="dev-91"
a_data = rng.standard_normal((5, 8)).astype(np.float32)
w_data = rng.standard_normal((8, 6)).astype(np.float32)
by_columns = Tensor(a_data).shard(TWO) @ Tensor(w_data).shard(TWO, axis=1)
print("replicated @ column-split: split on", by_columns.uop.axis,
      "shards", [s.shape for s in by_columns.uop.shards])
np.testing.assert_allclose(by_columns.numpy(), a_data @ w_data, rtol=1e-5, atol=1e-5)
batch = rng.standard_normal((6, 8)).astype(np.float32)
by_rows = Tensor(batch).shard(TWO, axis=0) @ Tensor(w_data).shard(TWO)
print("batch-split @ replicated: split on", by_rows.uop.axis)
np.testing.assert_allclose(by_rows.numpy(), batch @ w_data, rtol=1e-5, atol=1e-5)

# %% [markdown] id="dev-92"
# ### Data-parallel training
#
# Autograd needs nothing new: the shards are plain UOp graphs, joined by COPY nodes, and a
# COPY's gradient is a copy back (chapter 2). The one new rule is for a **replicated**
# parameter: each device used its own copy of it, on its own part of the batch, so its
# gradient is the **sum** of its copies' gradients — one more all-reduce, on every step.
# That is data-parallel training: replicate the parameters with `shard_` (in place: the model
# keeps its tensors), split the batch on axis 0, and run the single-device code unchanged.
# It gives the single-device losses:

# %% id="dev-93"
from tinyteach import nn
from tinyteach.nn.state import get_parameters

features = rng.standard_normal((16, 8)).astype(np.float32)
targets = rng.standard_normal((16, 4)).astype(np.float32)


def train(devices=None, steps=5):
    Tensor.manual_seed(1)
    layers = [nn.Linear(8, 16), nn.Linear(16, 4)]
    params = get_parameters(layers)
    x, y = Tensor(features), Tensor(targets)
    if devices is not None:
        for param in params:
            param.shard_(devices)                                     # replicated
        x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)    # the batch, split
    optimizer = nn.optim.SGD(params, lr=0.05, momentum=0.9)
    losses = []
    with Tensor.train():
        for _ in range(steps):
            optimizer.zero_grad()
            loss = ((layers[1](layers[0](x).relu()) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


one_device = train()
two_devices = train(TWO)
four_devices = train(("CPU", "CPU:1", "CPU:2", "CPU:3"))
for step, losses in enumerate(zip(one_device, two_devices, four_devices)):
    print(f"step {step}: " + "  ".join(f"{loss:.6f}" for loss in losses))
np.testing.assert_allclose(two_devices, one_device, rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(four_devices, one_device, rtol=1e-5, atol=1e-5)

# %% [markdown] id="dev-94"
# The columns agree to every printed digit. They are not bit for bit the same: each device sums
# its own rows first, and sums added in another order round a little differently (by about
# 1e-7 here). Nothing in `train` names the hardware
# but the tuple of devices. With two OpenCL devices it is `("OPENCL", "OPENCL:1")`: the OPENCL
# backend's `another(index)` opens its platform's index-th device, with a context and a queue
# of its own (pocl gives a CPU two with `POCL_DEVICES="pthread pthread"`; without a second
# device, `OPENCL:1` says how many there are). A backend for several GPUs adds the same
# method; tinyteach's CUDA backend opens one device today.
#
# What a sharded tensor refuses, it refuses by name: an op that would mix the shards of the
# split axis raises `ShardingError`, naming the op and the axis, and a split that is not even
# is refused when it is made:

# %% id="dev-95"
from tinyteach.tensor.multi import ShardingError

try:
    x_split.pad(((1, 0), (0, 0)))
except ShardingError as error:
    print("ShardingError:", error)
try:
    Tensor(np.zeros((5, 2), dtype=np.float32)).shard(TWO, axis=0)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown] id="dev-33"
# ## Try it

# %% [markdown] id="dev-34"
# **Try it — interpreter vs compiler.** Realize `(t * t).sum()` for `t = Tensor(np.arange(10, dtype=np.float32), device=...)` on
# both NUMPY and CPU and check the results agree. Which of the two runners has a `.linear`
# program?

# %% id="dev-35"
# your code here

# %% [markdown] id="dev-36"
# *Solution* (click the collapsed cell below to show it):

# %% id="dev-37" jupyter={"source_hidden": true} tags=["solution"]
results = {}
for name in ("NUMPY", "CPU"):
    t = Tensor(np.arange(10, dtype=np.float32), device=name)
    items, _ = create_schedule([(t * t).sum().uop], name)
    runner = get_runner(items[0])
    results[name] = (t * t).sum().item()
    print(name, results[name], "linear program:", runner.linear is not None)
assert results["NUMPY"] == results["CPU"] == 285.0

# %% [markdown] id="dev-38"
# **Try it — count the bytes.** Before running it, predict `GlobalCounters.global_mem` for `(p + q).realize()` with two
# realized 4×4 float32 tensors `p` and `q`. Then check.

# %% id="dev-39"
# your code here

# %% [markdown] id="dev-40"
# *Solution* (click the collapsed cell below to show it):

# %% id="dev-41" jupyter={"source_hidden": true} tags=["solution"]
p = Tensor(np.ones((4, 4), dtype=np.float32)).realize()
q = Tensor(np.full((4, 4), 2, dtype=np.float32)).realize()
GlobalCounters.reset()
(p + q).realize()
print(GlobalCounters.global_mem, "bytes")  # 3 buffers (out, p, q) x 16 floats x 4 bytes
assert GlobalCounters.global_mem == 3 * 16 * 4

# %% [markdown] id="dev-42"
# **Try it — your own Program.** A backend's Program is just a callable on buffers. Compile this C with
# `Device["CPU"].compiler`, load it with `Device["CPU"].program("scale", path)` and run it on
# a 4-element Buffer: `void scale(float* restrict out) { for (int i = 0; i < 4; i++)
# out[i] *= 2.0f; }`.

# %% id="dev-43"
# your code here

# %% [markdown] id="dev-44"
# *Solution* (click the collapsed cell below to show it):

# %% id="dev-45" jupyter={"source_hidden": true} tags=["solution"]
path = Device["CPU"].compiler.compile(
    "void scale(float* restrict out) { for (int i = 0; i < 4; i++) out[i] *= 2.0f; }\n")
scale = Device["CPU"].program("scale", path)
values = Buffer("CPU", 4, dtypes.float32).copyin(np.arange(4, dtype=np.float32))
scale(values)
print(values.numpy())
assert values.numpy().tolist() == [0.0, 2.0, 4.0, 6.0]
