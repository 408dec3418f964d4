# %% [markdown] id="lower-01"
# # Chapter 7 — Lowering and the optimization space: actions and BEAM
#
# A kernel from chapter 6 is still a *graph*: `SINK(STORE(DEFINE_GLOBAL 0, value))`, with shapes
# but no loops. This chapter turns it into a **straight-line program** a renderer can print:
#
# - one loop per output axis (`gidx0`, `gidx1`), a loop per reduced axis (`ridx0`) around an
#   accumulator;
# - movement ops become **index arithmetic** on the loop counters, which the symbolic rewrite
#   rules of chapter 5 then simplify;
# - `linearize` orders everything: open loops, load, compute, accumulate, close loops — and puts
#   work that does not depend on an inner loop outside it;
# - **optimizations** lay the same kernel out to run faster: *upcast* (compute a tile of
#   outputs per iteration, so each load serves several accumulators), *vectors* (16 floats in one
#   register), *threads* (split the outer loop across cores), *packing* (copy an operand into
#   the order it is read) and an optional *search* (BEAM) that times variants. `NOOPT=1` turns
#   them off, `DEBUG=3` lists them.
#
# The last part is the **optimization space**: every optimization is an *action*
# (`Opt(OptOps.UPCAST, 0, 4)`, as in tinygrad), and a kernel's layout is a list of them. You
# apply actions by hand and watch the source change, read the list the heuristic chose and
# apply it one step at a time, run BEAM and read every candidate list with its time, and read
# the list BEAM's cache keeps, which realize applies the next time.
#
# Modules: [`tinyteach/codegen/lower.py`](../tinyteach/codegen/lower.py) (`lower_ast`, `vectorize`,
# `linearize`, `lower`, `LinearProgram`), [`tinyteach/opt/`](../tinyteach/opt/)
# (`Kernel`, `Opt`, `OptOps`, `hand_coded_optimizations`, the heuristic `choose_options`),
# [`tinyteach/codegen/plan.py`](../tinyteach/codegen/plan.py) (`KernelOptions`: the plan the actions build),
# [`tinyteach/opt/pack.py`](../tinyteach/opt/pack.py) (packing) and
# [`tinyteach/opt/search.py`](../tinyteach/opt/search.py) (BEAM).

# %% id="lower-02"
# %load_ext tinyteach
import numpy as np

import viz
from tinyteach import Context, Device, Tensor

Device.DEFAULT = "CPU"   # every chapter runs on the CPU device: generated C, compiled here
Tensor.manual_seed(0)
rng = np.random.default_rng(0)

from collections import Counter

from tinyteach.codegen.lower import lower
from tinyteach.codegen.plan import NO_OPTIONS, KernelOptions
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.rewrite import record_rewrites
from tinyteach.ir.uop import Ops, pretty
from tinyteach.opt.heuristic import choose_options
from tinyteach.render.c import CRenderer


def kernel_of(tensor):
    """The (last) kernel that realizing `tensor` would run."""
    items, _ = create_schedule([tensor.uop], "CPU")
    return items[-1]


def c_source(item, options=NO_OPTIONS):
    return CRenderer().render(item.name, lower(item.ast, options))


# %% [markdown] id="lower-03"
# ## From AST to loops
#
# Take the smallest kernel with a reduction: the row sums of a 4×8 matrix. Its AST says *what*
# to compute:

# %% id="lower-04"
x = Tensor(np.arange(32, dtype=np.float32).reshape(4, 8)).realize()
row_sums = kernel_of(x.sum(1))
print(pretty(row_sums.ast))

# %% [markdown] id="lower-05"
# `lower` says *how*: `NO_OPTIONS` keeps the plain layout (we turn to optimizations below).
# Read it top to bottom: the two buffers, the output loop `('g', 0, 4)`, the row offset
# `gidx0*8` (computed once, outside the inner loop), the accumulator starting at `0.0`, the
# reduction loop `('r', 0, 8)`, a load at `gidx0*8 + ridx0`, the accumulate, and the store after
# the loop closes.

# %% id="lower-06"
program = lower(row_sums.ast, NO_OPTIONS)
print(program)
ops = [u.op for u in program.uops]
assert ops.count(Ops.RANGE) == 2 and ops.count(Ops.END_RANGE) == 2
assert Ops.DEFINE_ACC in ops and Ops.ACCUMULATE in ops
print("loop sizes of the output:", program.global_sizes)

# %% [markdown] id="lower-07"
# The same program as C (chapter 8 explains the renderer). Each line above maps to one here:

# %% id="lower-08"
print(c_source(row_sums))

# %% [markdown] id="lower-09"
# ## Movement ops become index arithmetic
#
# Transpose, flatten and slice: `x.permute(1, 0).reshape(32)[4:12] * 2`. No data moves; each view
# rewrites the index the kernel loads from. Chapter 4's view rules produce an index like
# `((gidx0 + 4) // 4 * ...)`, with divisions and remainders that the symbolic rules of
# chapter 5 tidy up (a `* 1` or `+ 0` the views leave out themselves: chapter 4). Record which
# rules fired while lowering:

# %% id="lower-10"
view_kernel = kernel_of(x.permute(1, 0).reshape(32)[4:12] * 2)
with record_rewrites() as log:
    view_program = lower(view_kernel.ast, NO_OPTIONS)
fired = Counter(step.rule for step in log.steps)
for rule, count in sorted(fired.items()):
    print(f"{count} x  {rule}")
assert fired["(a*c+b)//c -> a+b//c"] > 0 and fired["(a*c+b)%c -> b%c"] > 0
assert "x*1 -> x" not in fired and "x+0 -> x" not in fired  # never built
print(c_source(view_kernel))

# %% [markdown] id="lower-11"
# The load index `((gidx0%4)*8) + (gidx0/4) + 1` reads element `gidx0 + 4` of the transposed,
# flattened matrix. Check it against numpy by running the kernel:

# %% id="lower-12"
result = (x.permute(1, 0).reshape(32)[4:12] * 2).numpy()
np.testing.assert_array_equal(result, x.numpy().T.reshape(32)[4:12] * 2)
print(result)

# %% [markdown] id="lower-13"
# Step through every rewrite with the explorer: the slider shows each rule, with the expression
# before and after.

# %% id="lower-14"
viz.rewrites(view_kernel)

# %% [markdown] id="lower-15"
# ## Optimizations: the same matmul, laid out differently
#
# A 256×256 matmul is one kernel (chapter 6). `choose_options(ast, vector_width)` decides how
# to lay it out, from the kernel and from the device: `vector_width` is how many floats the
# device's vector registers hold (`Device["CPU"].renderer.vector_width`: 16 with AVX-512, 8 with
# AVX2, 0 for a language without vector types). Without vectors it picks a 4×8 tile of outputs
# per iteration (an *upcast* of both output axes) and threads (the outer loop split across
# cores); with 16-float vectors an 8×32 tile, the 32 columns held in two vectors:

# %% id="lower-16"
m1 = Tensor(rng.standard_normal((256, 256)).astype(np.float32)).realize()
m2 = Tensor(rng.standard_normal((256, 256)).astype(np.float32)).realize()
matmul = kernel_of(m1 @ m2)
scalar_tile, vector_tile = choose_options(matmul.ast), choose_options(matmul.ast, 16)
print("no vector types:", scalar_tile.describe())
print("16-float vectors:", vector_tile.describe())
with Context(NOOPT=1):
    print("with NOOPT=1:", choose_options(matmul.ast, 16).describe())
assert scalar_tile.upcasts == ((0, 4), (1, 8)) and scalar_tile.parallel
assert vector_tile.upcasts == ((0, 8), (1, 32)) and vector_tile.vector_width == 16

# %% [markdown] id="lower-17"
# Build all three — lower with the options, render, compile with the CPU's compiler — and look
# at each. First the plain version: one accumulator, one output element per iteration.

# %% id="lower-18"
backend = Device["CPU"]


def build(options):
    """Lower, render (as for a CPU with 16-float vectors) and compile the matmul kernel."""
    source = CRenderer(vector_width=16, fused_multiply_add=True).render(
        matmul.name, lower(matmul.ast, options))
    return source, backend.program(matmul.name, backend.compiler.compile(source))


plain, tiled, vectored = build(NO_OPTIONS), build(scalar_tile), build(vector_tile)
print(plain[0])

# %% [markdown] id="lower-19"
# The scalar tile: the output loops now run 64 and 32 times (256 / 4, 256 / 8), there are 32
# accumulators, and each value loaded from `a` is multiplied with eight values of `b` (and each
# value of `b` with four of `a`). The OpenMP pragma hands the outer loop to several threads.
# Only its beginning is shown:

# %% id="lower-20"
lines = tiled[0].splitlines()
print("\n".join(lines[:34]))
print(f"... {len(lines)} lines in all (the plain kernel has {len(plain[0].splitlines())})")
assert "#pragma omp parallel for" in tiled[0] and "acc31" in tiled[0]
assert "acc1 " not in plain[0]

# %% [markdown] id="lower-21"
# ### Vectors
#
# The vector tile is lowered with a *lane* index standing for 16 columns at once
# (`gidx1*32 + lane` and `gidx1*32 + 16 + lane`); `vectorize` in codegen/lower.py then turns every value
# that depends on the lane into a vector. A load at `base + lane` becomes one vector load at
# `base`, `val0*val1` multiplies one float of `a` with 16 floats of `b`, each of the 16
# accumulators holds 16 sums, and a store writes 16 outputs. C has no vector types of its own:
# the kernel declares one with GCC's vector extension (`typedef float float_vec16
# __attribute__((vector_size(64)))`). The compiler is not allowed to fuse a multiply and an add
# by itself: every kernel is built with `-ffp-contract=off`, so `a*b + c` rounds twice, as in
# numpy. The renderer writes each vector multiply-accumulate as an explicit fused multiply-add
# instead, `acc0 = fma_float_vec16(splat_float_vec16(val0), val1, acc0)`, rounded once in each
# lane. The kernel defines that macro itself: where the compiler targets AVX-512 it is the
# builtin of the vector FMA instruction (`__builtin_ia32_vfmaddps512_mask`), elsewhere one
# `__builtin_fmaf` per lane, the same bits. An unoptimized build computes the same bits too
# (chapter 9). `splat_float_vec16(val0)` puts the one float of `a` in all 16 lanes: a
# *broadcast*, which the CPU does as part of a load from memory. The attribute above the
# function, `optimize("no-predictive-commoning")`, keeps it so: gcc would otherwise keep a float
# it loaded for the next step of the sum that reads it again (a convolution's window slides by
# one pixel per tap), and broadcast it from a register, a shuffle on the port of the second FMA
# unit, a third slower. Ops with no vector form (max, where, exp2, ...) are
# written lane by lane, and a kernel whose lanes would need different guards or a gather stays
# scalar (the fallback is automatic).

# %% id="lower-22"
lines = vectored[0].splitlines()
shown = [line for line in lines[:50]
         if "acc" not in line or "acc0" in line or line.lstrip().startswith("#")]
print("\n".join(line if len(line) < 150 else line[:150] + " ..." for line in shown))
print(f"... {len(lines)} lines in all")
assert "float_vec16 val1 = *(const float_vec16*)(data2+" in vectored[0]
from tinyteach.runtime.cpu import C_FLAGS

multiply_add = next(line for line in lines if line.strip().startswith("acc0 = "))
print("C_FLAGS:", " ".join(C_FLAGS))
print("one accumulator's update:", multiply_add.strip())
assert "-ffp-contract=off" in C_FLAGS
assert multiply_add.strip() == "acc0 = fma_float_vec16(splat_float_vec16(val0), val1, acc0);"

# %% [markdown] id="lower-23"
# All three compute the same numbers (a tile still sums in order; only the FMA's single
# rounding differs in the last bits):

# %% id="lower-24"
from tinyteach.device import Buffer


def run(program):
    output = Buffer("CPU", 256 * 256, m1.dtype)
    program(output, *matmul.buffers[1:])
    return output.numpy().reshape(256, 256)


expected = m1.numpy() @ m2.numpy()
for _, program in (plain, tiled, vectored):
    np.testing.assert_allclose(run(program), expected, rtol=1e-4, atol=1e-4)
print("same result: yes")

# %% [markdown] id="lower-25"
# Is it faster? Measure, don't guess — and measure with care. The first launch pays for cold
# caches, page faults and starting threads, and any one launch can be slowed by whatever else the
# machine is doing. So each kernel below is launched once to warm up, then 20 times; the cell
# reports the minimum (the best estimate of the kernel's own cost: noise only ever adds time), the
# median (how noisy the machine was) and the rate, 2·256³ floating-point operations (a multiply
# and an add per term) divided by the minimum. The vector tile is timed at *this* CPU's vector
# width (`native_vector_width`): the book's 16 lanes on an 8-lane (AVX2) CPU are split by the
# compiler into pieces, and can run slower than the plain loop.
#
# The numbers are those of the machine that stored this notebook (validation compares them as
# `TIME` and `RATE`); run the cell on yours. `benchmarks/` has figures against tinygrad and numpy.

# %% id="lower-26"
import time

from tinyteach.runtime.cpu import find_c_compiler, native_macros, native_vector_width

FLOPS = 2 * 256**3   # a multiply and an add for each of the 256 terms of 256×256 sums


def timings(program, repeats=20):
    """(min, median) seconds of `repeats` launches, after one warm-up launch."""
    program(*matmul.buffers)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        program(*matmul.buffers)
        times.append(time.perf_counter() - start)
    return min(times), float(np.median(times))


def build_native_vectors():
    """The vector tile for this CPU's own vector width (not the book's 16)."""
    width = native_vector_width(native_macros(find_c_compiler()))
    linear = lower(matmul.ast, choose_options(matmul.ast, width))
    source = CRenderer(vector_width=width, fused_multiply_add=True).render(matmul.name, linear)
    return source, backend.program(matmul.name, backend.compiler.compile(source))


# the plain loop with the C compiler's own vectorizer turned off: the loop as written
no_autovec = '#pragma GCC optimize("no-tree-vectorize")\n' + plain[0]
scalar = (no_autovec, backend.program(matmul.name, backend.compiler.compile(no_autovec)))
native = build_native_vectors()
np.testing.assert_allclose(run(native[1]), expected, rtol=1e-4, atol=1e-4)
for label, (_, program) in (("scalar", scalar), ("NOOPT=1", plain), ("4x8 tile", tiled),
                            ("vectors", native)):
    best, median = timings(program)
    print(f"{label:9} min {best * 1e6:.1f} us, median {median * 1e6:.1f} us, "
          f"{FLOPS / best / 1e9:.1f} GFLOP/s")

# %% [markdown] id="lower-52"
# Why is the 4×8 tile barely faster than the plain `NOOPT=1` loop, when it loads far less? Because
# the plain loop is not as plain as its source: gcc's `-O2` (gcc 12 and later) vectorizes its
# `gidx1` loop by itself (`-fopt-info-vec` reports "loop vectorized using 32 byte vectors" for an
# AVX2 CPU, x86-64-v3: 8 output columns at once; 64 byte vectors, 16 columns, on an AVX-512 one),
# while it leaves the tile's 32 separate accumulators scalar. The tile saves loads but does its
# arithmetic one float at a time; the row `scalar` is the plain loop with that vectorizer turned
# off, the loop as written. The vector tile has both the reuse and the vectors, so it wins. (The
# tiles also split their outer loop across cores; on a busy machine the threads wait for each
# other, which the median shows.)

# %% [markdown] id="lower-27"
# ### Packing: copying an operand into the order it is read
#
# At each step of its sum, the vector tile reads 32 consecutive floats of a row of `b`, then
# jumps a whole row ahead. For a big `b` those rows are kilobytes apart, land in the same few
# cache sets and evict each other. `opt/pack.py` adds one kernel before such a matmul: a copy of `b`
# into *panels* of 32 columns, each panel's rows one after the other, so the tile walks
# consecutive memory. The copy is generated like any kernel (a reshape and a permute made
# contiguous); the matmul reads the panels back through index arithmetic. Small operands (an
# MLP's weights) stay in cache without it, and are left alone.

# %% id="lower-28"
from tinyteach.opt.pack import plan_packing

big1 = Tensor(rng.standard_normal((1024, 1024)).astype(np.float32)).realize()
big2 = Tensor(rng.standard_normal((1024, 1024)).astype(np.float32)).realize()
plan = plan_packing(kernel_of(big1 @ big2).ast, 16)
print(f"input {plan.input_index} is packed into panels of {plan.panel} columns")
print(CRenderer().render("pack_32_1048576", lower(plan.copy_ast, NO_OPTIONS)))
assert plan_packing(matmul.ast, 16) is None  # 256x256 stays in cache: no packing

# %% [markdown] id="lower-29"
# The copy reads `b` row by row and writes panel after panel. The matmul's load of `b` becomes
# `data2[gidx1*32768 + ridx0*32 + lane]`: the panel number, then 32 floats per row. In the
# engine this happens on its own (on a CPU with vector registers). One function builds the
# schedule that runs, packing included (`realize.build_schedule`), and viz plans with it too, so
# `viz.schedule` draws the packing kernel before anything has run:

# %% id="lower-30"
from tinyteach.engine.realize import record_launches

drawn = [line for line in viz.schedule(big1 @ big2).text.splitlines()
         if line.startswith("kernel ")]
print("\n".join(drawn))
with record_launches() as launches:
    product = (big1 @ big2).numpy()
print([launch.item.name for launch in launches])
print(launches[0].item.boundary_reason)
assert drawn == [f"kernel {n + 1}: {launch.item.name} on CPU" for n, launch in enumerate(launches)]
np.testing.assert_allclose(product, big1.numpy() @ big2.numpy(), rtol=1e-4, atol=1e-3)

# %% [markdown] id="lower-31"
# ### Search: BEAM
#
# The heuristic is a guess. tinygrad can instead *search*: compile variants of each kernel
# (other upcast factors, threads on or off, vectors or scalars), time them on scratch buffers and
# keep the fastest. tinyteach does the same with `BEAM=n` (the beam width; `opt/search.py`), and adds a
# check of its own that tinygrad's BEAM does not make: each candidate's output is compared with the
# heuristic kernel's on the same inputs, and a candidate that disagrees is discarded, so a timing
# can never trade correctness. The choice is cached on disk, so each kernel is searched once per
# machine; the cell below points the cache at an empty temporary folder, so that the search runs
# and `DEBUG=2` prints its `beam ...` line. Its result depends on the machine's timings, so the
# output of this cell is not checked when the notebook is validated:

# %% id="lower-32"
# NBVAL_IGNORE_OUTPUT
# (timings decide the search's winner, so the output differs from run to run)
import os
import tempfile

small1 = Tensor(rng.standard_normal((128, 128)).astype(np.float32)).realize()
small2 = Tensor(rng.standard_normal((128, 128)).astype(np.float32)).realize()
previous_cache = os.environ.get("TINYTEACH_CACHE")
with tempfile.TemporaryDirectory() as empty_cache:
    os.environ["TINYTEACH_CACHE"] = empty_cache   # no cached choice: the search runs
    try:
        with Context(BEAM=2, DEBUG=2):
            searched = (small1 @ small2).numpy()
    finally:
        if previous_cache is None:
            del os.environ["TINYTEACH_CACHE"]
        else:
            os.environ["TINYTEACH_CACHE"] = previous_cache
np.testing.assert_allclose(searched, small1.numpy() @ small2.numpy(), rtol=1e-4, atol=1e-4)

# %% [markdown] id="lower-33"
# `DEBUG=3` lists the optimizations the engine applied to each kernel it compiles, twice: as the
# list of actions (`actions of ...`: the `Opt`s you could type yourself, tinygrad's
# `applied_opts`) and in words (`optimizations of ...`), along with the AST and the fusion reasons
# of chapter 6. A new shape means a new kernel, so this one compiles.
# The stored outputs are a 16-lane (AVX-512) CPU's: the book is executed with `CPU_VECTOR_WIDTH=16`.
# On yours the tile may differ (8 lanes with AVX2, 4 with NEON); set `CPU_VECTOR_WIDTH` before
# starting Python to see another:

# %% id="lower-34"
m3 = Tensor(rng.standard_normal((32, 256)).astype(np.float32)).realize()
with Context(DEBUG=3):
    (m3 @ m2).realize()

# %% [markdown] id="lower-53"
# ## The optimization space: actions by hand, the heuristic's list, BEAM and its cache
#
# Everything above was chosen for you. tinygrad's way to say what to do to a kernel, which its
# users know, is a list of **actions**: `Opt(OptOps.UPCAST, 1, 8)` upcasts output axis 1 by 8.
# tinyteach has the same API (`tinyteach/opt/`): a `Kernel(ast, device)`, `apply_opt(opt)`,
# `applied_opts` and `to_program()`. Each action is checked when it is applied. The heuristic
# (`hand_coded_optimizations`) and BEAM produce such lists, and the engine compiles every kernel
# by applying its list to it, one action at a time. The actions:
#
# | action | `axis` counts | what it does |
# |---|---|---|
# | `UPCAST` | output axes | compute `arg` consecutive outputs along the axis per iteration |
# | `VECTORIZE` | output axes | that upcast axis in vectors of `arg` lanes (tinyteach's own) |
# | `UNROLL` | reduced axes | the reduction's loop reads `arg` elements per step |
# | `PADTO` | output axes | the loop runs to a multiple of `arg`, guarded past the end |
# | `THREAD` | output axes | split the outer loop across cores (OpenMP; `arg` 0) |
# | `SWAP` | output axes | exchange two loops (`arg` is the other axis) |
# | `LOCAL` | output axes | a local tile: `arg` threads of a work-group along the axis (GPU) |
# | `GROUP`, `GROUPTOP` | reduced axes | `arg` threads share the reduction (GPU) |
# | `TC` | — | tensor cores (CUDA and the emulator) |
#
# Start from the 256×256 matmul of above. Its kernel has two output axes and one reduced axis,
# and the heuristic's choice is this list:

# %% id="lower-54"
from tinyteach.opt import Kernel, KernelOptError, Opt, OptOps, hand_coded_optimizations

kernel = Kernel(matmul.ast, "CPU")
print("output shape:", kernel.shape, "  reduced axes:", kernel.reduces[0].arg[1])
heuristic = hand_coded_optimizations(kernel)
for opt in heuristic:
    print("  ", opt)
assert heuristic[:2] == [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 32)]

# %% [markdown] id="lower-55"
# Apply two upcasts by hand and watch the source change: the loops run 64 and 32 times, and 32
# accumulators fill the body. `applied_opts` records what was done:

# %% id="lower-56"
by_hand = Kernel(matmul.ast, "CPU")
by_hand.apply_opt(Opt(OptOps.UPCAST, 0, 4))
by_hand.apply_opt(Opt(OptOps.UPCAST, 1, 8))
program = by_hand.to_program(matmul.name)
print(by_hand.applied_opts)
print("\n".join(line for line in program.source.splitlines() if "for (" in line))
assert program.linear.global_sizes == (64, 32) and "acc31" in program.source

# %% [markdown] id="lower-57"
# An action that does not fit raises an error that says why: 256 does not split into blocks of
# 7, a CPU has no work-groups, and threads split the outermost loop only:

# %% id="lower-58"
for wrong in [Opt(OptOps.UPCAST, 0, 7), Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.THREAD, 1, 0)]:
    try:
        Kernel(matmul.ast, "CPU").apply_opt(wrong)
    except KernelOptError as error:
        print(error)

# %% [markdown] id="lower-59"
# Now apply the heuristic's actions one at a time, and time each step. As in the timing cell
# above, the vector tile is built for *this* CPU's vector width, so each program is a kernel
# with the actions the heuristic picks for this CPU (for 8 lanes: a tile of 8 × 16), compiled by
# its compiler and checked against numpy:

# %% id="lower-60"
from tinyteach.device import Capabilities

this_cpu = Capabilities(vector_width=native_vector_width(native_macros(find_c_compiler())),
                        threads=True)
native_renderer = CRenderer(vector_width=this_cpu.vector_width, fused_multiply_add=True)
native_actions = hand_coded_optimizations(Kernel(matmul.ast, "CPU", this_cpu))
for count in range(len(native_actions) + 1):
    step = Kernel(matmul.ast, "CPU", this_cpu).apply_opts(native_actions[:count])
    source = native_renderer.render(matmul.name, step.linearize())
    program = backend.program(matmul.name, backend.compiler.compile(source))
    np.testing.assert_allclose(run(program), expected, rtol=1e-4, atol=1e-4)
    best, _ = timings(program)
    added = native_actions[count - 1].op.name if count else "no actions"
    print(f"{'+ ' if count else ''}{added:<12} {FLOPS / best / 1e9:.1f} GFLOP/s")

# %% [markdown] id="lower-69"
# Read the steps in order. The second UPCAST alone asks for 8 × 32 = 256 scalar accumulators,
# far more than a CPU has registers, so they spill to memory and the kernel slows down; the
# VECTORIZE that follows keeps the same 256 sums in 16 vector registers, and the tile pays off.
# An action list is a path through the space, and a step may only pay with the next one.

# %% [markdown] id="lower-61"
# The engine goes through exactly this path: the heuristic's list, applied by hand, gives the
# very source that `(a @ b).realize()` compiles (and `DEBUG=4` prints):

# %% id="lower-62"
from tinyteach.engine.realize import record_launches

m4 = Tensor(rng.standard_normal((256, 256)).astype(np.float32)).realize()
fresh = kernel_of(m1 @ m4)   # a kernel the engine has not compiled yet
typed = Kernel(fresh.ast, "CPU").apply_opts(hand_coded_optimizations(Kernel(fresh.ast, "CPU")))
with record_launches() as launches:
    (m1 @ m4).realize()
compiled = [launch.runner.source for launch in launches if launch.runner.ast is fresh.ast]
assert compiled == [typed.to_program(fresh.name).source]
print("realize compiled the list's source:", compiled == [typed.to_program(fresh.name).source])

# %% [markdown] id="lower-63"
# Two actions the heuristic does not use show what the list can say. `UNROLL` makes the sum read
# four elements per step (combined in order, then added to the accumulator); `PADTO` lets an axis
# of 30 rows be upcast by 4: its loop runs to 32, and the two extra rows are guarded:

# %% id="lower-64"
sums = kernel_of(Tensor(rng.standard_normal((8, 64)).astype(np.float32)).sum(axis=1))
unrolled = Kernel(sums.ast, "CPU").apply_opt(Opt(OptOps.UNROLL, 0, 4)).to_program(sums.name)
print("\n".join(line for line in unrolled.source.splitlines() if "ridx0" in line))
odd = kernel_of(Tensor(rng.standard_normal((30, 16)).astype(np.float32)) @ m2[:16, :8])
padded = Kernel(odd.ast, "CPU").apply_opts([Opt(OptOps.PADTO, 0, 4), Opt(OptOps.UPCAST, 0, 4)])
print(padded.applied_opts, "->", padded.to_program(odd.name).linear.global_sizes)

# %% [markdown] id="lower-65"
# On a GPU the list has more to say: `LOCAL` stages tiles of both operands in shared memory, one
# thread per output, and `TC` gives each 16×8 tile of outputs a warp's tensor-core instruction.
# The PYTHON device, the emulator of chapter 8b, takes both; its programs are linear programs, so
# here is what each asks of the GPU:

# %% id="lower-66"
gpu_matmul = kernel_of(m1.to("PYTHON")[:64, :64] @ m2.to("PYTHON")[:64, :64])
tiled_gpu = Kernel(gpu_matmul.ast, "PYTHON").apply_opts(
    [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 1, 16)]).linearize()
print("LOCAL 16x16: threads per group", tiled_gpu.local_size, "shared buffers",
      [u.arg for u in tiled_gpu.locals])
halves = kernel_of(m1.half().to("PYTHON")[:64, :64] @ m2.half().to("PYTHON")[:64, :64])
cores = Kernel(halves.ast, "PYTHON").apply_opt(Opt(OptOps.TC, 0, 0)).linearize()
print("TC: threads per group", cores.local_size, "WMMA nodes",
      sum(u.op is Ops.WMMA for u in cores.uops))
try:
    Kernel(gpu_matmul.ast, "PYTHON").apply_opt(Opt(OptOps.TC, 0, 0))
except KernelOptError as error:
    print(error)

# %% [markdown] id="lower-67"
# ### BEAM searches over lists
#
# `BEAM=n` starts from the heuristic's list and tries its neighbours (one factor changed,
# threads off, vectors off), keeps the `n` fastest, and repeats. Every candidate is a list of
# actions, and only a list the actions accept is timed: "vectors on axis 0" of this matmul is
# a neighbour, but its loads along axis 0 are not consecutive, so VECTORIZE rejects it and the
# search skips it. The search below prints each candidate with its time, and the disk cache holds
# the winner as a list too (`~/.cache/tinyteach/beam/*.json`), the list realize applies. The
# cell searches with a cache of its own, an empty folder, and writes the winner into it as
# realize does after a search. Timings decide, so the output is not checked:

# %% id="lower-68"
# NBVAL_IGNORE_OUTPUT
# (timings decide the search's winner)
import contextlib
import io
import json
import shutil

from tinyteach.opt import search
from tinyteach.opt.kernel import actions_of


@contextlib.contextmanager
def cache_in(directory: str):
    """TINYTEACH_CACHE set to `directory` inside the block, and as it was after it."""
    previous = os.environ.get("TINYTEACH_CACHE")
    os.environ["TINYTEACH_CACHE"] = directory
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TINYTEACH_CACHE"]
        else:
            os.environ["TINYTEACH_CACHE"] = previous


beam_cache = tempfile.mkdtemp()  # empty: this search's own cache (lower-71 removes it)
small = kernel_of(small1 @ small2)
with cache_in(beam_cache):
    result = search.beam_search(backend, small.ast, small.name, 2)
    for plan, seconds in sorted(result.tried.items(), key=lambda item: item[1]):
        actions = ", ".join(f"{o.op.name} {o.axis} {o.arg}"
                            for o in actions_of(small.ast, plan))
        print(f"{seconds * 1e6:9.1f} us  {actions or 'no actions'}")
    key = search.cache_key(backend, small.ast, 2)
    search.write_cached(key, small.ast, result)  # what realize does after its search

# %% [markdown] id="lower-70"
# ### Reading the cache
#
# The cache is one small JSON file per kernel. Its name is a hash of everything the choice
# depends on (`search.cache_key`): the device and what it can do, the compiler, this machine,
# the beam width and the kernel's AST, so another machine, compiler or kernel searches again.
# Inside are the winner's actions, its time and the heuristic's, and how many candidates were
# timed. Realize reads it back: with `BEAM=2` and this cache, `search.actions_for` (what realize
# asks for a kernel's actions) finds the file and searches nothing, so `DEBUG=2` prints no
# `beam` line, and the list it returns is the file's (the winner depends on the timings, so
# the output is not checked; what is asserted is that the list came from the file):

# %% id="lower-71"
# NBVAL_IGNORE_OUTPUT
# (the list is the winner of lower-68's timings)
with cache_in(beam_cache):
    entry_path = search.beam_cache_dir() / f"{key}.json"
    entry = json.loads(entry_path.read_text())
    print(f"{entry_path.name}:")
    for field, value in entry.items():
        print(f"  {field}: {value}")
    search.clear_memory_cache()  # forget this process's choices: the disk is asked
    shown = io.StringIO()
    with Context(BEAM=2, DEBUG=2), contextlib.redirect_stdout(shown):
        cached_actions = search.actions_for(backend, small.name, small.ast)
    search.clear_memory_cache()  # (the choice came from a folder that is removed next)
shutil.rmtree(beam_cache)
print("realize applies:", cached_actions)
assert "beam" not in shown.getvalue()  # found in the cache: nothing was searched
assert [[o.op.name, o.axis, o.arg] for o in cached_actions] == entry["actions"]
assert entry["candidates"] == result.candidates

# %% [markdown] id="lower-35"
# ## Every stage at once
#
# `viz.kernel` shows a kernel's summary (launch sizes, the optimizations applied), its AST, its
# linear program and its source in every language of chapter 8. Given a tensor, it lowers the
# kernel with the options for no vector types (the 4×8 scalar tile); given a *launch* — here
# recorded by `record_launches` — it shows the linear program that actually ran, the engine's
# vector tile of `DEBUG=3` above:

# %% id="lower-36"
with record_launches() as launches:
    (m1 @ m2).realize()
viz.kernel(launches[-1])

# %% [markdown] id="lower-37"
# and `%%tinyteach` shows what a cell launched, with the source that ran. `relu` after the matmul
# is a comparison and a WHERE, and the tile stays in vectors: the comparison of a float vector
# gives a *mask* (`bool_vec16`: C has no vectors of bool, so each lane is an int, 0 or 1), and
# WHERE takes each lane's bits from one value or the other with it (`&`, `|`, `~`: exact for
# every float, NaN and -0.0 included):

# %% id="lower-38"
# %%tinyteach --show kernels,source
(m3 @ m2).relu().realize()

# %% [markdown] id="lower-39"
# ## Try it

# %% [markdown] id="lower-40"
# **Try it — column sums.** Lower `x.sum(0)` (shape (4, 8) → (8,)) with `NO_OPTIONS`. How many output iterations and how
# many reduction iterations does it have? Find the two `RANGE` uops and check their sizes.

# %% id="lower-41"
# your code here

# %% [markdown] id="lower-42"
# *Solution* (click the collapsed cell below to show it):

# %% id="lower-43" jupyter={"source_hidden": true} tags=["solution"]
program = lower(kernel_of(x.sum(0)).ast, NO_OPTIONS)
ranges = [u.arg for u in program.uops if u.op is Ops.RANGE]
print(ranges)
assert ranges == [("g", 0, 8), ("r", 0, 4)]

# %% [markdown] id="lower-44"
# **Try it — no tile for elementwise.** What does `choose_options` pick for the elementwise kernel of `m1 + m2`, and why no upcast?
# (Read `choose_options` in `opt/`.)

# %% id="lower-45"
# your code here

# %% [markdown] id="lower-46"
# *Solution* (click the collapsed cell below to show it):

# %% id="lower-47" jupyter={"source_hidden": true} tags=["solution"]
print(choose_options(kernel_of(m1 + m2).ast).describe())
# no reduction: a tile would share no loads, so there is nothing to gain from an upcast;
# 65,536 elements is also below PARALLEL_MIN_WORK, so no threads
assert choose_options(kernel_of(m1 + m2).ast).upcasts == ()

# %% [markdown] id="lower-48"
# **Try it — your own options.** Lower the 256×256 matmul with `KernelOptions(upcasts=((1, 4),))` — a 1×4 tile, no threads.
# How many accumulators does the program define?

# %% id="lower-49"
# your code here

# %% [markdown] id="lower-50"
# *Solution* (click the collapsed cell below to show it):

# %% id="lower-51" jupyter={"source_hidden": true} tags=["solution"]
program = lower(matmul.ast, KernelOptions(upcasts=((1, 4),)))
accumulators = [u for u in program.uops if u.op is Ops.DEFINE_ACC]
print(len(accumulators), "accumulators; output loops", program.global_sizes)
assert len(accumulators) == 4 and program.global_sizes == (256, 64)
