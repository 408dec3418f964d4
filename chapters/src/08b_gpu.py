# %% [markdown] id="gpu-01"
# # Chapter 8b — GPU kernels: threads, work-groups and shared memory
#
# Chapter 8 rendered every kernel for the GPU languages the CPU way: each output element is one
# *thread*, and each thread runs its whole reduction alone. This chapter looks at what a GPU
# adds, and runs it on the **PYTHON** device, a GPU emulator written in numpy:
#
# - **threads, warps and work-groups**: a GPU runs one program on many threads; threads come
#   in *work-groups* that run side by side, share a small fast memory (*shared* memory) and can
#   wait for each other at a *barrier*. Groups never wait for each other. Within a group, 32
#   consecutive threads are a *warp*, which runs each instruction for all 32 at once and reads
#   memory in 32-byte sectors: whether a warp's threads read neighbouring addresses decides how
#   many sectors a load moves;
# - **a reduction two ways**: one thread per output row, then a **group reduction**: a whole
#   work-group shares a row, each thread sums a slice, the partial sums meet in shared memory,
#   and a *tree* halves them until one is left;
# - **the emulator's drawings**: the launch as a grid of work-groups and warps, which thread
#   touches which element (GPU-Puzzles style, a colour per work-group), coalesced vs strided
#   memory access with the sectors each warp moves, shared-memory traffic between barriers,
#   and a launch summary;
# - **the emulator's checks**: an access out of bounds, a barrier that some threads of a group
#   skip, and a race on shared memory are errors that name the thread and the address;
# - **matmul** with local tiles in shared memory, then on **tensor cores**: a warp of 32
#   threads multiplies small matrices held in pieces across its threads, in one instruction;
#   then a block of warps whose operands are staged in shared memory;
# - **fused softmax, the GPU way**: one work-group per row, a group reduction for each
#   reduction of the chain, and every thread storing its columns: one kernel instead of three.
#
# Modules: [`tinyteach/runtime/python.py`](../tinyteach/runtime/python.py) (the emulator),
# [`tinyteach/codegen/lower.py`](../tinyteach/codegen/lower.py) and [`tinyteach/opt/`](../tinyteach/opt/)
# (the group reduction, local tiles), [`tinyteach/codegen/wmma.py`](../tinyteach/codegen/wmma.py) (tensor
# cores), [`viz/threads.py`](../viz/threads.py) (the drawings).

# %% id="gpu-02"
import numpy as np

from tinyteach import Device, Tensor

Device.DEFAULT = "CPU"   # every chapter runs on the CPU device; this one's tensors say PYTHON
Tensor.manual_seed(0)
rng = np.random.default_rng(0)

from tinyteach.codegen.lower import LinearProgram, lower
from tinyteach.codegen.plan import KernelOptions
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.uop import Ops
from tinyteach.runtime.python import SharedMemoryRaceError, emulate, record_threads
from viz.threads import (
    access_pattern,
    launch_grid,
    launch_summary,
    shared_traffic,
    strides,
    thread_map,
)

# %% [markdown] id="gpu-03"
# ## Threads and work-groups
#
# `x * 2` on a 4×8 matrix is one kernel with one output loop per axis. On a GPU each loop becomes
# a thread dimension: 8 threads along dimension 0 (the columns, so that neighbouring threads
# write neighbouring memory) and 4 along dimension 1. Here they fit in one work-group of 8×4.
# The GPU runs a group's threads in **warps**: 32 consecutive thread numbers (NVIDIA's name;
# AMD's *wavefronts* hold 32 or 64) that execute each instruction together, so this group of
# 32 threads is exactly one warp. `record_threads()` keeps every thread's reads and writes:

# %% id="gpu-04"
x = rng.normal(size=(4, 8)).astype(np.float32)
with record_threads() as traces:
    doubled = (Tensor(x, device="PYTHON") * 2).numpy()
assert np.array_equal(doubled, x * 2)
print(launch_summary(traces[0]).text)

# %% [markdown] id="gpu-05"
# Each square is one element of the output, `data0`, labelled with the thread that wrote it
# (its number within the group: x + 8·y). Thread 9 is thread (1, 1): row 1, column 1. With a
# single work-group every thread has a colour of its own; with several (below), each group has
# one, so that the groups stand out.

# %% id="gpu-06"
written = thread_map(traces[0], "data0", kind="write", columns=8)
write, = traces[0].accesses("write")
thread_numbers = write.threads[:, 0] + 8 * write.threads[:, 1]
assert np.array_equal(np.sort(write.addresses), np.arange(32))
assert np.array_equal(thread_numbers, write.addresses)  # thread n writes element n
written

# %% [markdown] id="gpu-82"
# `launch_grid` draws the launch itself: a box per work-group with a square per thread, and a
# dashed frame around each warp. Here: one group, one warp of 32 threads.

# %% id="gpu-83"
grid = launch_grid(traces[0])
assert grid.text.splitlines()[1] == "group 0 (0, 0, 0): threads 0..31, 1 warp"
grid

# %% [markdown] id="gpu-07"
# ## A row sum, one thread per row
#
# Now a reduction: the sum of each row of a 4×64 matrix. Without further options the kernel is
# chapter 7's: one thread per output, and each thread loops over its row.

# %% id="gpu-08"
matrix = rng.normal(size=(4, 64)).astype(np.float32)
item = create_schedule([Tensor(matrix, device="PYTHON").sum(axis=1).uop], "PYTHON")[0][-1]


def run(options):
    """The row-sum kernel lowered with `options`, emulated with a record of every access."""
    program = lower(item.ast, options)
    output = np.zeros(4, np.float32)
    trace = emulate(program, [output, matrix.reshape(-1).copy()], item.name, record=True)
    assert np.allclose(output, matrix.sum(axis=1), rtol=1e-5)  # numpy's numbers, each time
    return program, trace


one_per_row, row_trace = run(KernelOptions())
print(launch_summary(row_trace).text)

# %% [markdown] id="gpu-09"
# Four threads do all the work: each reads 64 elements, one after another. The drawing of the
# input shows a row per colour (a row of 64 elements is drawn as two lines of 32, each line
# starting with the address of its first element):

# %% id="gpu-10"
thread_map(row_trace, "data1", columns=64)

# %% [markdown] id="gpu-11"
# And at each step of the loop, the four threads read addresses 64 apart. Memory serves a warp
# at once, in **sectors** of 32 bytes: the sectors its threads' addresses fall in are what the
# load moves. Threads of a warp at *neighbouring* addresses share sectors (the access is
# *coalesced*): 32 threads reading 32 consecutive floats, 128 bytes, move 4 sectors. Addresses
# 64 floats apart need a sector each, of which one float is used. `access_pattern` shows the
# first threads' addresses in one step and the sectors the group's first warp moved, against
# the fewest its threads could need. These four threads are four lanes of one warp: 4 sectors
# for 16 bytes.

# %% id="gpu-12"
pattern = access_pattern(row_trace, threads=4)
read_step = next(s for s in strides(row_trace) if s.kind == "read")
assert (read_step.warp_lanes, read_step.sectors, read_step.fewest_sectors) == (4, 4, 1)
pattern

# %% [markdown] id="gpu-84"
# With a whole warp the difference is 8×. `x.T * 2` on a 64×64 matrix is one thread per output
# element, 64 threads along the output's row: each warp's 32 threads write 32 neighbouring
# floats, but read a *column* of `x`, 32 floats 64 apart. The write moves 4 sectors, the read
# 32, for the same 128 bytes of data. (This is why a GPU transpose stages a tile in shared
# memory: read rows, write columns of the tile, and both global accesses coalesce.)

# %% id="gpu-85"
square64 = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)  # (rng kept for later cells)
with record_threads() as transpose_traces:
    transposed = (Tensor(square64, device="PYTHON").T * 2).contiguous().numpy()
assert np.array_equal(transposed, square64.T * 2)
sectors = {s.kind: (s.warp_lanes, s.sectors) for s in strides(transpose_traces[0])}
assert sectors == {"read": (32, 32), "write": (32, 4)}
access_pattern(transpose_traces[0])

# %% [markdown] id="gpu-13"
# ## A group reduction in shared memory
#
# The **group reduction** gives each row a whole work-group of 16 threads. Thread `lidx0` sums
# elements `lidx0`, `lidx0 + 16`, `lidx0 + 32`, ... of its row, writes its partial sum to shared
# memory (`DEFINE_LOCAL`), and waits at a `BARRIER` until every thread of the group has. Then a
# tree: the first 8 threads each add two partials, barrier, the first 4, barrier, ..., until
# element 0 holds the row's sum, which every thread reads and thread 0 stores. A last barrier
# makes sure every thread has read it before the group's next output (when a group computes
# several) writes new partials over it. The linear program shows it all: the thread id is a
# `SPECIAL`, the output loop is a loop over work-groups (kind `'w'`), guarded loads and gated
# stores keep the idle threads of each step out of memory:

# %% id="gpu-14"
grouped, group_trace = run(KernelOptions(group=16))
print(grouped.applied_opts)
print(grouped)

# %% [markdown] id="gpu-15"
# Sixty-four threads in 4 groups now, each reading 4 elements instead of 64. Each group of 16
# threads is half a warp (a warp never spans two groups):

# %% id="gpu-16"
print(launch_summary(group_trace).text)
launch_grid(group_trace)

# %% [markdown] id="gpu-86"
# Which thread reads which element, each work-group in its own colour (even and odd threads in
# two shades of it):

# %% id="gpu-87"
thread_map(group_trace, "data1", columns=64)

# %% [markdown] id="gpu-17"
# Each row is one work-group's colour, and its 16 threads take turns along it: at each step
# the neighbouring threads read neighbouring addresses, coalesced. Sixteen floats are 64 bytes:
# the half warp moves 2 sectors, the fewest possible.

# %% id="gpu-18"
read_step = next(s for s in strides(group_trace) if s.kind == "read")
assert (read_step.warp_lanes, read_step.sectors) == (16, 2) and read_step.verdict == "coalesced"
access_pattern(group_trace)

# %% [markdown] id="gpu-19"
# Shared memory between the barriers: 16 writes of partial sums, then the tree's halving steps
# (8 threads read two partials each and write one, then 4, 2, 1), then every thread reads the
# result:

# %% id="gpu-20"
shared_traffic(group_trace)

# %% [markdown] id="gpu-21"
# The tree is one way to combine the partials. The other (`group_combine="serial"`): after one
# barrier, thread 0 adds all 16 partials alone. Two barriers instead of six, but 16 steps of
# one thread instead of 4 steps of many. Both give the serial sum's numbers:

# %% id="gpu-22"
serial, serial_trace = run(KernelOptions(group=16, group_combine="serial"))
barrier_counts = {name: sum(u.op is Ops.BARRIER for u in program.uops)
                  for name, program in [("tree", grouped), ("serial", serial)]}
assert barrier_counts == {"tree": 6, "serial": 2}
print(barrier_counts)
print(shared_traffic(serial_trace).text)

# %% [markdown] id="gpu-23"
# ## What the emulator catches
#
# On a real GPU, a missing barrier is a bug that shows up as wrong numbers now and then. The
# emulator tracks, between two barriers, which thread wrote and read each element of shared
# memory. Take the group reduction and delete its barriers:

# %% id="gpu-24"
no_barriers = LinearProgram([u for u in grouped.uops if u.op is not Ops.BARRIER],
                            grouped.global_sizes, grouped.accumulators, grouped.options)
try:
    emulate(no_barriers, [np.zeros(4, np.float32), matrix.reshape(-1).copy()])
except SharedMemoryRaceError as error:
    print(error)
else:
    raise AssertionError("the race was not caught")

# %% [markdown] id="gpu-25"
# Thread 0 reads element 8, its partner's partial sum, before thread 8 is known to have written
# it. Two more mistakes, in kernels written by hand from UOps (chapter 3): an off-by-one,
# `data0[i] = data1[i + 1]`, and a barrier inside the output loop of 6 elements, which runs on a
# group of 8 threads: threads 6 and 7 have no element, skip the loop, and never reach the
# barrier that the other six wait at.

# %% id="gpu-26"
from tinyteach.dtype import dtypes
from tinyteach.ir.uop import UOp, toposort_of
from tinyteach.runtime.python import BarrierDivergenceError, OutOfBoundsError


def hand_written(store, loop):
    """A linear program: everything the store needs, sources first, then the loop's end."""
    return LinearProgram(toposort_of([store]) + [UOp(Ops.END_RANGE, dtypes.bool, (loop,))],
                         (loop.arg[2],))


out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, 6))
source = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 6))
i = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 6))
arrays = [np.zeros(6, np.float32), np.arange(6, dtype=np.float32)]

off_by_one = UOp(Ops.STORE, dtypes.float32, (out, i, UOp(Ops.LOAD, dtypes.float32,
                                                          (source, i + 1))))
shared = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (0, 8))
publish = UOp(Ops.STORE, dtypes.float32, (shared, i, UOp(Ops.LOAD, dtypes.float32, (source, i))))
wait = UOp(Ops.BARRIER, dtypes.bool, (publish,))
in_the_loop = UOp(Ops.STORE, dtypes.float32, (out, i, UOp(Ops.LOAD, dtypes.float32,
                                                           (shared, i, wait))))
for broken, error in [(off_by_one, OutOfBoundsError), (in_the_loop, BarrierDivergenceError)]:
    try:
        emulate(hand_written(broken, i), arrays)
    except error as caught:
        print(f"{type(caught).__name__}: {caught}")
    else:
        raise AssertionError(f"{error.__name__} was not raised")

# %% [markdown] id="gpu-27"
# ## The same program in OpenCL, CUDA and WGSL
#
# The GPU renderers write the group reduction's program in their own words: shared memory is
# OpenCL's `__local`, CUDA's `__shared__` and WGSL's module-level `var<workgroup>`; the thread
# id is `get_local_id(0)`, `threadIdx.x`, `lid.x`; the loop over groups starts at the group's
# id (`get_group_id(0)`, `blockIdx.x`, `wid.x`) and steps by the number of groups; a barrier
# is `barrier(CLK_LOCAL_MEM_FENCE)`, `__syncthreads()`, `workgroupBarrier()`. The launch line
# asks for exactly the program's group of 16 threads, one group per row. The OpenCL kernel:

# %% id="gpu-28"
from tinyteach.render.cuda import CUDARenderer
from tinyteach.render.gpu import launch_of
from tinyteach.render.opencl import OpenCLRenderer
from tinyteach.render.wgsl import WGSLRenderer

sources = {type(r).__name__: r.render(item.name, grouped)
           for r in (OpenCLRenderer(), CUDARenderer(), WGSLRenderer())}
for words, source in zip([("__local float local0[16]", "barrier(CLK_LOCAL_MEM_FENCE)"),
                          ("__shared__ float local0[16]", "__syncthreads()"),
                          ("var<workgroup> local0: array<f32, 16>", "workgroupBarrier()")],
                         sources.values()):
    assert all(word in source for word in words)
    assert launch_of(source).local_size == (16, 1, 1) and launch_of(source).groups == (4, 1, 1)
print(sources["OpenCLRenderer"])

# %% [markdown] id="gpu-29"
# ## Matmul with local tiles
#
# In a matmul `C = A @ B` with one thread per output, every thread reads a whole row of `A` and
# a whole column of `B` from global memory: each element of `A` is read once per column of `C`.
# A **local tile** (`KernelOptions(local_tile=T)`) gives each T×T block of `C` a work-group of
# T×T threads, thread `(lidx1, lidx0)` computing row `lidx1`, column `lidx0` of the block. The
# reduction goes in steps of T: in each step every thread copies **one** element of `A` and one
# of `B` into two T×T tiles in shared memory, the group waits at a barrier, and each thread
# adds its row of the `A` tile times its column of the `B` tile. A barrier at the top of each
# step keeps the next copies from overwriting a tile that slower threads still read. Sizes
# that are not multiples of T are padded with zeros, and the threads past the edge store
# nothing. A 20×17 times 17×18 matmul in 8×8 tiles:

# %% id="gpu-30"
a = rng.normal(size=(20, 17)).astype(np.float32)
b = rng.normal(size=(17, 18)).astype(np.float32)
matmul = create_schedule([(Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON")).uop],
                         "PYTHON")[0][-1]


def run_matmul(options):
    """The matmul lowered with `options`, emulated with a record; checked against numpy."""
    program = lower(matmul.ast, options)
    output = np.zeros(20 * 18, np.float32)
    trace = emulate(program, [output, a.reshape(-1).copy(), b.reshape(-1).copy()],
                    matmul.name, record=True)
    np.testing.assert_allclose(output.reshape(20, 18), a @ b, rtol=1e-4, atol=1e-5)
    return program, trace


tiled, tile_trace = run_matmul(KernelOptions(local_tile=8))
print(tiled.applied_opts)
print(launch_summary(tile_trace).text)

# %% [markdown] id="gpu-31"
# Shared memory per barrier phase: in each of the 3 steps, 64 threads write one element of
# each tile, then, after the barrier, read 8 of each (the emulator's race check passed: no
# thread read a tile element in the phase it was written):

# %% id="gpu-32"
shared_traffic(tile_trace)

# %% [markdown] id="gpu-33"
# What the tiles save is global memory traffic. Counted from the two records, the one thread
# per output version reads every element of `A` 18 times and of `B` 20 times; the tiled one
# reads each 3 times (once per block of 8 columns of `C`, or 8 rows), and never loads the
# zeros of the padding:

# %% id="gpu-34"
plain, plain_trace = run_matmul(KernelOptions())


def global_reads(trace):
    return sum(len(e.addresses) for e in trace.accesses("read") if not e.is_shared)


reads = {"one thread per output": global_reads(plain_trace),
         "local tiles": global_reads(tile_trace)}
assert reads["one thread per output"] == 2 * 20 * 18 * 17
assert reads["local tiles"] == 3 * 20 * 17 + 3 * 17 * 18
print(reads)

# %% [markdown] id="gpu-50"
# ## A block of outputs per thread
#
# In a local tile each thread reads two values from shared memory per multiply-add: its row of
# the `A` tile and its column of the `B` tile, one element each. A thread that computes an
# r×r **block** of outputs instead (`KernelOptions(local_tile=T, tile_upcast=r)`, tinygrad's
# UPCAST inside a tile) reads r elements of the `A` tile and r of the `B` tile per step and
# does r·r multiply-adds with them: every value it reads serves r outputs, held in r·r
# registers. A work-group of T×T threads now covers (T·r)×(T·r) outputs, so each tile it
# copies from global memory is r times taller (or wider), and serves r times as many
# outputs. The block's rows are T apart (row `lidx1 + i·T`), so neighbouring threads still
# store neighbouring columns. A 64×32 times 32×64 matmul in 8×8 tiles, with 1, 2 and 4
# outputs a side per thread, counted from the emulator's record:

# %% id="gpu-51"
a64 = rng.normal(size=(64, 32)).astype(np.float32)
b64 = rng.normal(size=(32, 64)).astype(np.float32)
square = create_schedule([(Tensor(a64, device="PYTHON") @ Tensor(b64, device="PYTHON")).uop],
                         "PYTHON")[0][-1]


def run_square(options):
    """The 64x32x64 matmul lowered with `options`, emulated with a record, checked."""
    program = lower(square.ast, options)
    output = np.zeros(64 * 64, np.float32)
    trace = emulate(program, [output, a64.reshape(-1).copy(), b64.reshape(-1).copy()],
                    square.name, record=True)
    np.testing.assert_allclose(output.reshape(64, 64), a64 @ b64, rtol=1e-4, atol=1e-4)
    return program, trace


def reads_per_thread(trace):
    """(global, shared) elements each thread read, on average."""
    threads = trace.launch.threads_per_group * trace.launch.group_count
    reads = [e for e in trace.accesses("read")]
    return (sum(len(e.addresses) for e in reads if not e.is_shared) // threads,
            sum(len(e.addresses) for e in reads if e.is_shared) // threads)


blocks = {}
for block in (1, 2, 4):
    program, trace = run_square(KernelOptions(local_tile=8, tile_upcast=block))
    threads = trace.launch.threads_per_group * trace.launch.group_count
    blocks[block] = (trace.launch.groups, threads, *reads_per_thread(trace))
steps = 32 // 8
for block, (groups, threads, global_per_thread, shared_per_thread) in blocks.items():
    outputs = block * block
    assert threads * outputs == 64 * 64
    assert global_per_thread == steps * 2 * block      # r rows of A, r columns of B per step
    assert shared_per_thread == 32 * 2 * block         # 2r reads per step of the reduction
    print(f"{block}x{block} block: {groups} groups, {threads:4} threads, per thread "
          f"{global_per_thread:2} global and {shared_per_thread:3} shared reads for {outputs:2} "
          f"outputs: {shared_per_thread / outputs:.0f} shared reads per output")

# %% [markdown] id="gpu-52"
# Per output, the reads from shared memory fall from 64 to 32 to 16, and the reads from global
# memory by the same factor. Here is the 2×2 kernel in OpenCL C: each step copies 2 rows of
# `A` and 2 columns of `B` into tiles of 16×8 (the `if` guards of the copies stay out of the
# inner loop), and the loop over `ridx1` loads 2 + 2 values for its 4 multiply-adds:

# %% id="gpu-53"
blocked = lower(square.ast, KernelOptions(local_tile=8, tile_upcast=2))
blocked_source = OpenCLRenderer().render(square.name, blocked)
assert blocked_source.count("barrier(CLK_LOCAL_MEM_FENCE);") == 2
assert "__local float local0[128];" in blocked_source and "local1[128]" in blocked_source
print(blocked.applied_opts[0])
print(blocked_source)

# %% [markdown] id="gpu-54"
# **Padding to a tile** (tinygrad's PADTO) pads a size that is no multiple of the tile, so that
# the loops have no guard. A local tile does not need it: the guards sit where the tile is
# copied in (2r loads per thread per step) and where the outputs are stored, never in the loop
# over shared memory, which is the same for 63 as for 64 columns. Both run here, and the
# 63-column one reads no element twice and none past the edge:

# %% id="gpu-55"
def inner_loop(program):
    """The uops of the loop over a step's tile (the second reduction loop)."""
    uops = program.uops
    inner = [u for u in uops if u.op is Ops.RANGE and u.arg[0] == "r"][1]
    start = uops.index(inner)
    end = next(i for i, u in enumerate(uops) if u.op is Ops.END_RANGE and u.src[0] is inner)
    return [u.op.name for u in uops[start + 1:end]]


b63 = b64[:, :63].copy()
odd = create_schedule([(Tensor(a64, device="PYTHON") @ Tensor(b63, device="PYTHON")).uop],
                      "PYTHON")[0][-1]
odd_program = lower(odd.ast, KernelOptions(local_tile=8, tile_upcast=2))
output = np.zeros(64 * 63, np.float32)
odd_trace = emulate(odd_program, [output, a64.reshape(-1).copy(), b63.reshape(-1)], record=True)
np.testing.assert_allclose(output.reshape(64, 63), a64 @ b63, rtol=1e-4, atol=1e-4)
assert inner_loop(odd_program) == inner_loop(blocked)
assert "WHERE" not in inner_loop(odd_program) and "CMPLT" not in inner_loop(odd_program)
b_reads = np.concatenate([e.addresses for e in odd_trace.accesses("read", "data2")])
assert b_reads.max() < b63.size
print("the inner loop on 63 columns:", " ".join(inner_loop(odd_program)))

# %% [markdown] id="gpu-56"
# ## BEAM on the GPU devices
#
# `BEAM=n` (chapter 7) searches these options too on OPENCL, WEBGPU, PYTHON and CUDA: starting
# from the heuristic's choice, it tries other tile sizes and blocks, a group reduction, no
# option at all and upcasts, keeps the n fastest, and checks every candidate's output against
# the heuristic's. On the emulator wall time would measure numpy, not a GPU: there it ranks the
# candidates by a **cost model** from the emulator's record instead: the 32-byte sectors each
# warp's global loads and stores touch, the shared-memory wavefronts (more than one per warp
# when threads hit the same bank at different words), and each warp's barriers. With
# `DEBUG=2` it prints what it tried.
#
# The cost model counts traffic, not parallelism: it does not know how many work-groups a GPU
# runs at once, so fewer, larger groups always look better to it. For this 64×64 product it
# picks one work-group of 256 threads for the whole output. A real GPU runs a work-group on one
# of its streaming multiprocessors (an H100 has 132): one group keeps one of them busy and the
# others idle, and timed on the hardware, more and smaller groups would win.

# %% id="gpu-57"
import math

from tinyteach.opt import search

result = search.beam_search(Device["PYTHON"], square.ast, square.name, width=2)
assert result.unit == "cost" and result.best in result.tried


def label(options):
    if options.local_tile:
        size, block = options.local_tile, options.tile_upcast
        return f"local tile {size}x{size}, {block}x{block} outputs per thread"
    if options.group:
        return f"group reduction, {options.group} threads ({options.group_combine})"
    return "; ".join(options.describe()) or "no option"


for options, cost in sorted(result.tried.items(), key=lambda item: item[1]):
    if math.isfinite(cost):
        print(f"{cost:7.0f}  {label(options)}")
print("chosen:", label(result.best))
program = lower(square.ast, result.best)
output = np.zeros(64 * 64, np.float32)
chosen_trace = emulate(program, [output, a64.reshape(-1).copy(), b64.reshape(-1).copy()],
                       record=True)
np.testing.assert_allclose(output.reshape(64, 64), a64 @ b64, rtol=1e-4, atol=1e-4)
launch = launch_summary(chosen_trace).text.splitlines()[1]
print(launch)
assert launch.startswith("work-groups: 1 x 1 x 1 = 1,") and launch.endswith("= 256")

# %% [markdown] id="gpu-58"
# On OPENCL (pocl, on this machine's CPU) the same search times each candidate. Its choice is
# whatever ran fastest here, so it changes from run to run and machine to machine (a CPU's
# caches favour other tiles than a GPU's shared memory); the result is checked either way:

# %% id="gpu-59"
# NBVAL_IGNORE_OUTPUT
# (timings decide the search's winner, so the output differs from run to run)
import os
import tempfile

from tinyteach.helpers import Context

if Device.is_available("OPENCL"):
    search.clear_memory_cache()
    previous_cache = os.environ.get("TINYTEACH_CACHE")
    with tempfile.TemporaryDirectory() as empty_cache:
        os.environ["TINYTEACH_CACHE"] = empty_cache   # no cached choice: the search runs
        try:
            with Context(BEAM=1, DEBUG=2):
                on_opencl = (Tensor(a64, device="OPENCL") @ Tensor(b64, device="OPENCL"))
                searched = on_opencl.numpy()
        finally:
            if previous_cache is None:
                del os.environ["TINYTEACH_CACHE"]
            else:
                os.environ["TINYTEACH_CACHE"] = previous_cache
    np.testing.assert_allclose(searched, a64 @ b64, rtol=1e-4, atol=1e-4)

# %% [markdown] id="gpu-36"
# ## Tensor cores
#
# A **tensor core** multiplies two small matrices in one instruction. It is not one thread's
# instruction but a whole *warp's*: the 32 threads of a warp run it together, and each thread
# holds a few elements of each matrix in its registers, its *fragments*. NVIDIA's
# `mma.sync.aligned.m16n8k16` (sm_80 and later) multiplies A (16×16, half) by B (16×8) into
# D (16×8, float32); each thread holds 8 elements of A, 4 of B and 4 of D.
#
# `KernelOptions(tensor_core=True)` lowers a half matmul so that each 16×8 tile of outputs is a
# work-group of one warp. Per step of 16 along the reduction, every thread loads its 8 + 4
# fragment elements from global memory (past an edge they load as 0, so any size works), the
# warp runs one `WMMA`, and each thread adds its 4 results to 4 float32 accumulators. The
# emulator runs the instruction by its layout: it gathers every lane's elements into A and B
# as the instruction defines, multiplies them with float32 sums, and hands each lane its
# elements of D. What it cannot copy is the hardware's arithmetic: NVIDIA does not specify in
# which order a tensor core adds the products or how it rounds the partial sums, so the
# emulator, a GPU and numpy agree within a tolerance, not bit for bit.
# A 20×40 times 40×12 half matmul: 2×2 tiles of 16×8, 3 steps of 16 along k:

# %% id="gpu-37"
half_a = rng.normal(size=(20, 40)).astype(np.float16)
half_b = rng.normal(size=(40, 12)).astype(np.float16)
half_matmul = create_schedule([(Tensor(half_a, device="PYTHON") @
                                Tensor(half_b, device="PYTHON")).uop], "PYTHON")[0][-1]
on_tensor_cores = lower(half_matmul.ast, KernelOptions(tensor_core=True))
half_out = np.zeros(20 * 12, np.float16)
tc_trace = emulate(on_tensor_cores, [half_out, half_a.reshape(-1), half_b.reshape(-1)],
                   half_matmul.name, record=True)
expected = half_a.astype(np.float32) @ half_b.astype(np.float32)  # float32 sums, in numpy's order
np.testing.assert_allclose(half_out.reshape(20, 12), expected, rtol=2e-3, atol=2e-3)
print(on_tensor_cores.applied_opts)
print(launch_summary(tc_trace).text)

# %% [markdown] id="gpu-38"
# Which thread holds which element is the instruction's **layout** (the PTX manual's fragment
# tables). Lane `l` is thread `t = l % 4` of group `g = l // 4`: its D elements are rows g and
# g + 8, columns 2t and 2t + 1; its A elements are rows g and g + 8, columns 2t, 2t + 1 and
# 8 more; its B elements are column g. The emulator records the layout it used, and viz draws
# it, each square labelled with the lane that holds it:

# %% id="gpu-39"
from viz.threads import fragment_layout

fragments = fragment_layout(tc_trace)
lane_rows = fragments.text.splitlines()
d_rows = lane_rows[lane_rows.index("D (lane holding each element):") + 1:][:16]
assert d_rows[9].split() == ["4", "4", "5", "5", "6", "6", "7", "7"]  # row g + 8, g = 1
fragments

# %% [markdown] id="gpu-40"
# In the linear program, a `WMMA` node is one element of a thread's D: the 4 nodes that share
# their 12 sources (8 elements of A, 4 of B) are one instruction. The CUDA renderer issues it
# once, through inline PTX, packing two halves into each 32-bit register; the kernel is
# rendered, not run (there is no GPU here; the tests compile every such kernel to sm_80 and
# sm_90 machine code):

# %% id="gpu-41"
wmma_nodes = [u for u in on_tensor_cores.uops if u.op is Ops.WMMA]
assert [u.arg.element for u in wmma_nodes] == [0, 1, 2, 3]
assert len({u.src for u in wmma_nodes}) == 1 and len(wmma_nodes[0].src) == 12
cuda_source = CUDARenderer().render(half_matmul.name, on_tensor_cores)
assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in cuda_source
launch = launch_of(cuda_source)
assert launch.local_size == (32, 1, 1) and launch.groups == (2, 2, 1)  # a warp per 16x8 tile
shown = [line for line in cuda_source.splitlines()
         if "mma" in line or "acc" in line or "for (int ridx0" in line]
print("\n".join(shown))

# %% [markdown] id="gpu-42"
# The products of two halves are exact in float32 and the tensor core sums in float32. Every
# half sum in tinyteach does the same (`sum_acc_dtype` in tensor/core.py, as tinygrad and
# PyTorch): a half matmul's kernel is a sum in float32 of the products, cast back to half
# once. A sum kept in half would round after every addition: with k = 512, against float64,
# the half-sum error (simulated in numpy, one product at a time) is far above either kernel's:

# %% id="gpu-43"
long_a = rng.normal(size=(16, 512)).astype(np.float16)
long_b = rng.normal(size=(512, 8)).astype(np.float16)
long_matmul = create_schedule([(Tensor(long_a, device="PYTHON").float() @
                                Tensor(long_b, device="PYTHON").float()).uop], "PYTHON")[0][-1]
half_matmul_kernel = create_schedule([(Tensor(long_a, device="PYTHON") @
                                       Tensor(long_b, device="PYTHON")).uop], "PYTHON")[0][-1]
exact = long_a.astype(np.float64) @ long_b.astype(np.float64)


def largest_error(ast, options, dtype):
    out = np.zeros(16 * 8, dtype)
    emulate(lower(ast, options), [out, long_a.reshape(-1), long_b.reshape(-1)])
    return float(np.abs(out.reshape(16, 8) - exact).max())


sums_in_half = np.zeros((16, 8), np.float16)
for step in range(512):
    sums_in_half = sums_in_half + np.outer(long_a[:, step], long_b[step]).astype(np.float16)
errors = {"tensor cores (float32 out)": largest_error(long_matmul.ast,
                                                      KernelOptions(tensor_core=True),
                                                      np.float32),
          "one thread per output (half out)": largest_error(half_matmul_kernel.ast,
                                                            KernelOptions(), np.float16),
          "sums in half": float(np.abs(sums_in_half - exact).max())}
assert errors["tensor cores (float32 out)"] < 1e-4
half_step = float(np.spacing(np.float16(np.abs(exact).max())))  # one rounding to half
assert errors["one thread per output (half out)"] <= half_step
assert errors["sums in half"] > 4 * half_step
print("largest error against float64: tensor cores < 1e-4, float32 sums rounded to half once "
      "<= one half step, sums in half > 4 half steps")

# %% [markdown] id="gpu-70"
# ## Tensor cores fed from shared memory
#
# One warp per 16×8 tile reads its fragments straight from global memory: each element of A is
# read once per 8 columns of C, each element of B once per 16 rows. Fast GPU matmuls give a
# work-group a bigger **block** of outputs and stage the operands in shared memory, as the
# local tile did. `KernelOptions(tensor_core=True, tensor_core_block=(2, 2, 2, 4))` is a
# work-group of 2×2 warps, each computing 2×4 tiles of 16×8: a 64×64 block, 128 threads. Per
# step of 16 along k:
#
# 1. a barrier (no warp still reads the last step's slices);
# 2. the 128 threads copy the step's **k-slices** of both operands into shared memory, A's
#    64×16 and B's 16×64, 8 elements of each per thread, neighbouring threads neighbouring
#    elements (coalesced); past an edge they copy zeros, so any size works;
# 3. a barrier; then each warp reads its fragments from shared memory and runs 8 `mma`s, one
#    per tile, into 32 float32 accumulators per thread. A warp's 2 A fragments each serve 4
#    tiles, its 4 B fragments 2 tiles each.
#
# Each row of a slice in shared memory is 8 halves longer than the slice: shared memory has 32
# banks of 4 bytes, a row of 16 halves spans 8 of them, and without the padding rows g and
# g + 4 of a fragment load would hit the same banks. The layout is data
# (`wmma.TensorCoreBlock`): the lowering, the emulator and viz read it. The heuristic takes
# this block where a kernel fills one along both output axes. A 100×40 times 40×129 half
# matmul on the emulator:

# %% id="gpu-71"
from tinyteach.codegen.wmma import M16N8K16, tensor_core_block
from tinyteach.opt.heuristic import options_for_renderer
from tinyteach.runtime.python import PythonRenderer
from viz.threads import block_layout

block_rng = np.random.default_rng(70)
block_a = block_rng.normal(size=(100, 40)).astype(np.float16)
block_b = block_rng.normal(size=(40, 129)).astype(np.float16)
block_matmul = create_schedule([(Tensor(block_a, device="PYTHON") @
                                 Tensor(block_b, device="PYTHON")).uop], "PYTHON")[0][-1]
block_options = options_for_renderer(block_matmul.ast, PythonRenderer())
assert block_options == KernelOptions(tensor_core=True, tensor_core_block=(2, 2, 2, 4))
staged = lower(block_matmul.ast, block_options)
block_out = np.zeros(100 * 129, np.float16)
block_trace = emulate(staged, [block_out, block_a.reshape(-1), block_b.reshape(-1)],
                      block_matmul.name, record=True)
np.testing.assert_allclose(block_out.reshape(100, 129).astype(np.float64),
                           block_a.astype(np.float64) @ block_b.astype(np.float64),
                           rtol=1e-3, atol=1e-3)  # float32 sums, one rounding to half
print(staged.applied_opts)
print(launch_summary(block_trace).text)

# %% [markdown] id="gpu-72"
# Which warp computes which 16×8 tile of the block (warp `w` is threads 32w to 32w + 31,
# `lidx1` in the program):

# %% id="gpu-73"
block_layout(tensor_core_block(M16N8K16, (2, 2, 2, 4)))

# %% [markdown] id="gpu-74"
# Shared memory per barrier phase, from the emulator's record: in each of the 3 steps of k the
# 128 threads write 16 elements each (8 of A's slice, 8 of B's), then, after the barrier, read
# 32 each (2 A fragments of 8, 4 B fragments of 4), and the race check passed:

# %% id="gpu-75"
from viz.threads import phase_traffic

traffic = [(reads, writes) for _, reads, writes in phase_traffic(block_trace)]
assert [t for t in traffic if t[1]] == [(0, 128 * 16)] * 3
assert [t for t in traffic if t[0]] == [(128 * 32, 0)] * 3
shared_traffic(block_trace)

# %% [markdown] id="gpu-76"
# What staging saves is global memory traffic. For a 128×32 times 32×128 matmul, counted from
# the records: one warp per tile reads 6 elements from global memory per output (32/8 of A,
# 32/16 of B), the 64×64 block 1 (32/64 of each): 6 times fewer:

# %% id="gpu-77"
count_a = block_rng.normal(size=(128, 32)).astype(np.float16)
count_b = block_rng.normal(size=(32, 128)).astype(np.float16)
count_matmul = create_schedule([(Tensor(count_a, device="PYTHON") @
                                 Tensor(count_b, device="PYTHON")).uop], "PYTHON")[0][-1]


def global_reads_per_output(options):
    out = np.zeros(128 * 128, np.float16)
    trace = emulate(lower(count_matmul.ast, options), [out, count_a.reshape(-1),
                                                        count_b.reshape(-1)], record=True)
    np.testing.assert_allclose(out.reshape(128, 128).astype(np.float64),
                               count_a.astype(np.float64) @ count_b.astype(np.float64),
                               rtol=1e-3, atol=1e-3)
    reads = sum(len(e.addresses) for e in trace.accesses("read") if not e.is_shared)
    return reads / (128 * 128)


per_output = {"one warp per 16x8 tile": global_reads_per_output(KernelOptions(tensor_core=True)),
              "64x64 block, staged": global_reads_per_output(block_options)}
assert per_output == {"one warp per 16x8 tile": 6.0, "64x64 block, staged": 1.0}
print(per_output)

# %% [markdown] id="gpu-78"
# The CUDA source of the staged kernel (rendered, not run: there is no GPU here; the tests
# compile every such kernel to sm_80 and sm_90 machine code). Two `__shared__` slices, two
# `__syncthreads()` per step, and one `mma` call per tile:

# %% id="gpu-79"
staged_source = CUDARenderer().render(block_matmul.name, staged)
assert staged_source.count("__shared__ half") == 2
assert staged_source.count("__syncthreads();") == 2
assert staged_source.count("mma_m16n8k16_f16(wmma") == 8
assert launch_of(staged_source).local_size == (32, 4, 1)
shown = [line for line in staged_source.splitlines()
         if "__shared__" in line or "__syncthreads" in line or "mma_m16n8k16_f16(wmma" in line
         or "for (int ridx0" in line]
print("\n".join(shown))

# %% [markdown] id="gpu-44"
# ## Fused softmax, the GPU way
#
# Chapter 6 made softmax one kernel on the CPU: each row's max and sum are computed once, in
# loops placed before the loop over the row's outputs. On a GPU an output element is a thread,
# and a thread that computed its row's max and sum by itself would redo them for every element
# of the row. The GPU way (Triton's fused softmax, tinygrad's GROUP) is **one work-group per
# row**: the group's T threads split the row, and each reduction of the chain is a group
# reduction: every thread combines its columns `lidx0, lidx0 + T, ...`, the partials meet in
# shared memory, and a tree halves them, a barrier after each step. The max comes first, then
# the sum of `exp(x - max)`, each in its own shared array; after one last barrier every thread
# stores *its* columns of the row. The scheduler fuses the chain on a GPU when the row fits a
# work-group: at most `MAX_GROUP_ROW` = 64 threads × 32 columns = 2,048 elements (a longer row
# keeps three kernels). A softmax over rows of 200 on the emulator, with `FUSE_ROWS` on and off:

# %% id="gpu-45"
from tinyteach import GlobalCounters
from tinyteach.codegen.plan import MAX_GROUP_ROW
from tinyteach.helpers import Context
from tinyteach.opt.heuristic import options_for_renderer

scores = rng.normal(size=(8, 200)).astype(np.float32)
expected = np.exp(scores - scores.max(1, keepdims=True))
expected /= expected.sum(1, keepdims=True)
kernels = {}
for fuse_rows in (1, 0):
    with Context(FUSE_ROWS=fuse_rows):
        GlobalCounters.reset()
        got = Tensor(scores, device="PYTHON").softmax(1).numpy()
        kernels[fuse_rows] = GlobalCounters.kernel_count
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
print("kernels:", kernels[1], "fused,", kernels[0], "with FUSE_ROWS=0")
assert kernels == {1: 1, 0: 3} and MAX_GROUP_ROW == 2048

(row_kernel,) = create_schedule([Tensor(scores, device="PYTHON").softmax(1).uop], "PYTHON")[0]
row_program = lower(row_kernel.ast, options_for_renderer(row_kernel.ast, OpenCLRenderer()))
assert row_program.options.group == 64 and len(row_program.locals) == 2
print(OpenCLRenderer().render(row_kernel.name, row_program))

# %% [markdown] id="gpu-80"
# Each load's index ends in `% 1600`. The input has 8 × 200 = 1,600 floats, and the simplifier
# drops a position's `%` by the buffer's size only when it can prove the position is already
# below it. Here it cannot: a thread's columns run to 255 (4 steps of 64 for a row of 200), so
# as far as the bounds go `gidx0*200 + column` reaches 7·200 + 255 = 1,655. That the load sits
# under the guard `column < 200` is not used. The `%` changes no loaded value (under the guard
# the position is below 1,600); rows of 256, which need no guard, have none:

# %% id="gpu-81"
wide = create_schedule([Tensor(np.zeros((8, 256), np.float32), device="PYTHON").softmax(1).uop],
                       "PYTHON")[0][-1]
wide_program = lower(wide.ast, options_for_renderer(wide.ast, OpenCLRenderer()))
row_loads = [line.strip() for line in OpenCLRenderer().render(row_kernel.name, row_program)
             .splitlines() if "data1[" in line]
wide_loads = [line.strip() for line in OpenCLRenderer().render(wide.name, wide_program)
              .splitlines() if "data1[" in line]
print("rows of 200:", row_loads[0])
print("rows of 256:", wide_loads[0])
assert all("%1600" in line for line in row_loads) and not any("%" in line for line in wide_loads)

# %% [markdown] id="gpu-46"
# The kernel reads from the top: `local0` and `local1` are the two reductions' shared arrays;
# the loop over `gidx0` gives each work-group its rows (8 groups, one row each); `ridx0` is a
# thread's share of the max (4 steps of 64 columns; in the last, columns 192 to 255, a guard
# keeps the threads past column 199 out), then a barrier and a tree of six halving steps, each
# ending at a barrier; the same for the sum. After one last barrier, the loop over `gidx1` is
# a thread's 4 columns of the output. The emulator's record of one run shows each barrier
# phase's shared-memory traffic per work-group: phase 0 writes the 64 partial maxima, each tree
# step reads twice as many partials as it writes, down to one; in phase 7 every thread reads
# the max (element 0) and writes its partial sum; phase 14 reads the sum:

# %% id="gpu-47"
from viz.threads import phase_traffic

with record_threads() as traces:
    got = Tensor(scores, device="PYTHON").softmax(1).numpy()
np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
(row_trace,) = traces
traffic = phase_traffic(row_trace)
assert row_trace.barriers == 2 * 7 + 1 and traffic[0] == (0, 0, 64)
assert [writes for _, _, writes in traffic[1:7]] == [32, 16, 8, 4, 2, 1]
assert traffic[7] == (7, 64, 64) and traffic[-1] == (14, 64, 0)
shared_traffic(row_trace)

# %% [markdown] id="gpu-48"
# The same kernel runs on every GPU device here: OpenCL (pocl), WebGPU (lavapipe) and the
# emulator, each one kernel and each against numpy. log_softmax and layernorm are chains over
# the same rows too, and so are their gradients (one kernel each as well; tests/test_gpu_rows.py
# checks them against PyTorch, with rows of NaN and ±inf, rows of one element, rows that are
# not a multiple of the group):

# %% id="gpu-49"
gpu_devices = [name for name in ("OPENCL", "WEBGPU", "PYTHON") if Device.is_available(name)]
for name in gpu_devices:
    GlobalCounters.reset()
    on_device = Tensor(scores, device=name)
    softmax, normed = on_device.softmax(1).numpy(), on_device.layernorm(1).numpy()
    assert GlobalCounters.kernel_count == 2  # one kernel each
    np.testing.assert_allclose(softmax, expected, rtol=1e-5, atol=1e-7)
    centered = scores - scores.mean(1, keepdims=True)
    np.testing.assert_allclose(normed, centered / np.sqrt(scores.var(1, keepdims=True) + 1e-5),
                               rtol=1e-4, atol=1e-5)
assert "PYTHON" in gpu_devices
print("one kernel for softmax, one for layernorm, equal to numpy on the GPU devices here")

# %% [markdown] id="gpu-35"
# ## Where this goes next
#
# The optimizer chooses all three by itself on devices whose renderer says it can: a group
# reduction for a long reduction with few outputs and a local tile for a matmul whose tile is
# filled along both output axes and the reduction (`supports_group_reduce`,
# `supports_local_tile`: the emulator, OpenCL, CUDA and WGSL), tensor cores for a half matmul
# at least one tile big, staged in a 64×64 block where the kernel fills one
# (`supports_tensor_core`: CUDA and the emulator; OpenCL and WGSL have none here, so the
# option is not offered). Never under `NOOPT=1`, and each is listed by `DEBUG=3` like the
# CPU's upcasts. What the tensor-core kernel still lacks, and the fastest GPU matmuls have:
# the accumulators passed to the `mma` itself instead of added after it, `ldmatrix` to load
# fragments, and copies of the next k-slice that overlap the `mma`s of this one (`cp.async`,
# double buffering).
