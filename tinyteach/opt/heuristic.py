"""Chapter 7 (part 2b): the heuristic — which actions a kernel gets when nobody says.

What this teaches:
- `hand_coded_optimizations(kernel)` (tinygrad's name) reads the kernel and its device's
  Capabilities and returns a list of actions (kernel.py's Opt): tile reductions into register
  blocks, vectors where the device has them, threads for big kernels, and on GPUs group
  reductions, local tiles and tensor cores;
- `choose_options` is the same choice as a plan (KernelOptions), remembered per kernel:
  the engine, opt/pack.py and opt/search.py all ask; `actions_of` turns a plan back into actions;
- every threshold is a named constant with the measurement that set it.

Builds on: kernel.py (the actions), codegen/plan.py (the facts about a kernel),
codegen/wmma.py (whether a tensor core is worth it), codegen/lower.py (can it vectorize?).
Used by: opt/search.py (the starting point), opt/pack.py, engine/realize.py, runtime/cuda.py.

>>> from tinyteach import Tensor
>>> from tinyteach.engine.schedule import create_schedule
>>> a, b = Tensor.ones(256, 256).realize(), Tensor.ones(256, 256).realize()
>>> item = create_schedule([(a @ b).uop], "CPU")[0][0]
>>> choose_options(item.ast).describe()
['upcast axis 0 by 4', 'upcast axis 1 by 8', 'threads: split the outer loop across cores']
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from tinyteach.codegen.lower import SIMD_MIN_LOOP, lower_ast, vectorize
from tinyteach.codegen.plan import (
    NO_OPTIONS,
    TENSOR_CORE_TILE,
    KernelOptions,
    can_group_reduce,
    kernel_value,
    reads_contiguously_along_reduction,
    row_group_threads,
    row_kernel_axis,
    tile_plan,
)
from tinyteach.codegen.wmma import tensor_core_plan, worth_a_tensor_core
from tinyteach.device import NO_CAPABILITIES, Capabilities, capabilities_of
from tinyteach.helpers import NOOPT, prod, remember
from tinyteach.ir.uop import ALU, Ops, UOp, sym_max, sym_prod
from tinyteach.opt.kernel import Kernel, Opt, actions_of, local_tile_shared_bytes, outer_loop_size

UPCAST = 4                 # tile size per upcast axis
WIDE_UPCAST = 8            # for the innermost axis: one AVX register of float32
MAX_UPCAST_GRAPH = 120     # bigger kernels (convolutions, fused backward passes) stay untiled:
                           # a tile copies the kernel's whole body 16 times
MAX_UPCAST_AXES = 2        # 4x4 = 16 accumulators fit in registers
SHORT_REDUCE = 64          # a sum this short (or shorter) per output: writing the output dominates
BLOCK_AXIS = 7             # output axes this short may be upcast whole (a window's taps) ...
MAX_BLOCK = 49             # ... into a block of at most this many consecutive outputs
PARALLEL_MIN_WORK = 1 << 20  # operations below which waking threads costs more than it saves
GROUP_THREADS = 16         # threads of a work-group that share one reduction (a power of two)
GROUP_MIN_REDUCE = 32      # shorter reductions stay one thread per output
GROUP_MAX_OUTPUTS = 4096   # more outputs than this already fill a GPU with one thread each
TENSOR_CORE_BLOCK = (2, 2, 2, 4)  # 2x2 warps, each 2x4 tiles: 64x64 outputs, 128 threads
LOCAL_TILE = 16            # a local tile: LOCAL_TILE x LOCAL_TILE threads (256, every GPU allows)
TILE_UPCAST = 4            # ... each thread a TILE_UPCAST x TILE_UPCAST block of outputs
MAX_SHARED_BYTES = 16384   # shared memory per work-group that every GPU API guarantees (WebGPU's
                           # default maxComputeWorkgroupStorageSize is the smallest)
GPU_UPCAST = 4             # rows per thread of a big elementwise GPU kernel (an outer axis)
GPU_RESIDENT_THREADS = 1 << 18  # about the threads a big GPU runs at once (H200: 132 x 2048):
                                # a kernel with 4x as many outputs still fills it at 4 per thread


def hand_coded_optimizations(kernel: Kernel) -> list[Opt]:
    """The hand-written heuristic's actions for a kernel on its device (tinygrad's name)."""
    return heuristic_actions(kernel.ast, kernel.capabilities)


def heuristic_actions(ast: UOp, capabilities: Capabilities) -> list[Opt]:
    """The heuristic's choice for a kernel on a device with these capabilities, as actions."""
    return actions_of(ast, options_for(ast, capabilities))


def choose_options(ast: UOp, vector_width: int = 0, group_reduce: bool = False,
                   local_tile: bool = False, tensor_core: bool = False) -> KernelOptions:
    """The hand-written heuristic: tile reductions, thread big kernels. `vector_width`: how
    many floats the device's vector registers hold (0: it has no vector types).
    `group_reduce`: the device's renderer can share a reduction across a work-group (shared
    memory and barriers); `local_tile`: it can stage matmul tiles in shared memory;
    `tensor_core`: it has tensor cores (WMMA, codegen/wmma.py).
    Remembered per kernel: the engine, opt/pack.py and opt/search.py all ask. A kernel over a
    symbolic size gets none: upcasts and tiles split loops of a known size."""
    if NOOPT or ast.has_symbols:
        return NO_OPTIONS
    return remember(_chosen, (ast, vector_width, group_reduce, local_tile, tensor_core),
                    lambda: _choose(ast, vector_width, group_reduce, local_tile, tensor_core))


def options_for(ast: UOp, capabilities: Capabilities) -> KernelOptions:
    """The heuristic's plan for a device with these capabilities (NO_CAPABILITIES: an
    interpreter, which takes none). A vector tile this kernel cannot vectorize (8 x 32 is too
    big in scalars) gives way to the heuristic's scalar choice."""
    if capabilities == NO_CAPABILITIES:
        return NO_OPTIONS
    chosen = choose_options(ast, capabilities.vector_width, capabilities.group_reduce,
                            capabilities.local_tile, TENSOR_CORE_TILE in capabilities.tensor_cores)
    if chosen.vector_width and vectorize(lower_ast(ast, chosen)) is None:
        chosen = choose_options(ast)
    if chosen.parallel and not capabilities.threads:  # (a GPU's threads are its launch)
        chosen = replace(chosen, parallel=False)
    return chosen


def heuristic_plan(ast: UOp, vector_width: int = 0) -> KernelOptions:
    """The heuristic's plan for a CPU with `vector_width` lanes (lower.lower's default)."""
    return options_for(ast, Capabilities(vector_width=vector_width, threads=True))


def options_for_renderer(ast: UOp, renderer: Any) -> KernelOptions:
    """`options_for` the renderer's Capabilities (None: an interpreter)."""
    return options_for(ast, capabilities_of(renderer))


_chosen: dict[tuple[UOp, int, bool, bool, bool], KernelOptions] = {}


def _choose(ast: UOp, vector_width: int, group_reduce: bool = False,
            local_tile: bool = False, tensor_core: bool = False) -> KernelOptions:
    value = kernel_value(ast)
    shape = value.shape
    reduces = [n for n in value.toposort if n.op is Ops.REDUCE_AXIS]
    if group_reduce and row_kernel_axis(ast) is not None:
        return KernelOptions(group=row_group_threads(ast))
    if group_reduce and not reduces:  # (group_reduce: a GPU renderer)
        return gpu_elementwise_upcast(shape)
    if row_kernel_axis(ast) is not None:
        return _one_row_at_a_time(value, shape)
    if tensor_core and worth_a_tensor_core(ast):
        return KernelOptions(tensor_core=True, tensor_core_block=tensor_core_block_for(ast))
    if local_tile and worth_a_local_tile(ast):
        return KernelOptions(local_tile=LOCAL_TILE, tile_upcast=heuristic_tile_upcast(ast))
    if group_reduce and can_group_reduce(ast) and prod(shape) <= GROUP_MAX_OUTPUTS \
            and reduces[0].src[0].shape[reduces[0].arg[1][-1]] >= GROUP_MIN_REDUCE:
        return KernelOptions(group=GROUP_THREADS)
    if reduces and vector_width and len(value.toposort) <= MAX_UPCAST_GRAPH \
            and not _vectors_go_to_the_sum(reduces[0]):
        vectored = _vector_tile(shape, vector_width)
        if vectored is not None:
            return _with_threads(vectored, shape, reduces)
    block = _output_block(shape, reduces) if len(value.toposort) <= MAX_UPCAST_GRAPH else None
    if block is not None:
        return block  # one thread: under gcc's OpenMP the block ran 5x slower (measured)
    upcasts: list[tuple[int, int]] = []
    if reduces and len(value.toposort) <= MAX_UPCAST_GRAPH:
        # tile the output axes (innermost last): each loaded value serves several accumulators.
        # The innermost axis gets a whole vector register (8 floats) when it divides evenly:
        # its loads are usually contiguous, so the compiler turns the tile's rows into vectors
        # ... unless the reduction itself walks memory contiguously: then its sum is split into
        # vector lanes instead (codegen/lower.py), an array of lanes per accumulator, and one
        # axis of 4 rows is tiled: a 4x4 tile of 16 arrays (a BatchNorm's statistics over
        # 20x20 images) ran no faster (0.22 against 0.19 ms) and took gcc 300 ms to build
        # against 110, which the first steps of a training run wait for. (A sum shorter than
        # SIMD_MIN_LOOP along it is not split: a 3x3 convolution keeps its 4x4 tile)
        wide = not reads_contiguously_along_reduction(reduces[0])
        axes = 1 if not wide and _long_last_axis(reduces[0]) else MAX_UPCAST_AXES
        for axis in reversed(range(len(shape))):
            factor = WIDE_UPCAST if wide and not upcasts and shape[axis] % WIDE_UPCAST == 0 \
                else UPCAST
            if len(upcasts) < axes and shape[axis] % factor == 0 \
                    and shape[axis] >= 2 * factor:
                upcasts.append((axis, factor))
    upcasts.sort()
    if not reduces:
        return _elementwise_with_threads(value, shape)
    return _with_threads(KernelOptions(tuple(upcasts)), shape, reduces)


def _one_row_at_a_time(value: UOp, shape: tuple[int, ...]) -> KernelOptions:
    """A kernel over whole rows (a fused softmax or layernorm) on a CPU: no tile, one row per
    iteration of the outer loop, the rows split across cores. Each of the row's loops (the
    max, the sum, the output's columns) then walks one row in order, which the compiler
    turns into vector instructions. (A 4x4 tile interleaved 4 rows: the column loop wrote 16
    outputs from 4 rows per iteration, and gcc did not vectorize it.)

    Its work is its outputs times the ops it computes per output, as an elementwise kernel's
    (each output reads its row in every pass): a softmax's row sum is as long as its output
    row, so counting outputs times the sum's length per output (1) kept attention's 262,144
    masked exponentials on one core."""
    return _elementwise_with_threads(value, shape)


def tensor_core_block_for(ast: UOp) -> tuple[int, ...]:
    """TENSOR_CORE_BLOCK where the kernel fills a whole block along both output axes (its
    operands then go through shared memory); a smaller kernel keeps one warp per tile."""
    plan = tensor_core_plan(ast)
    if plan is None:
        return ()
    shape, (warps_m, warps_n, tiles_m, tiles_n) = plan.tile.reduce.src[0].shape, TENSOR_CORE_BLOCK
    fills = shape[plan.tile.m_axis] >= warps_m * tiles_m * TENSOR_CORE_TILE[0] and \
        shape[plan.tile.n_axis] >= warps_n * tiles_n * TENSOR_CORE_TILE[1]
    return TENSOR_CORE_BLOCK if fills else ()


def _output_block(shape: tuple[int, ...], reduces: list[UOp]) -> KernelOptions | None:
    """A kernel with a short sum and a big output (a convolution's window gradient: for every
    pixel of every window, a sum over the output channels) spends its time writing the output.
    When the output's innermost axes are short (a window's 3x3 or 5x5 taps), upcast them whole:
    each loop iteration then computes a block of consecutive outputs and stores it in order.
    (A 4x4 tile over other axes wrote 16 outputs far apart: 6-10x slower.)"""
    if not reduces or prod(reduces[0].src[0].shape) // max(prod(shape), 1) > SHORT_REDUCE:
        return None
    block: list[tuple[int, int]] = []
    for axis in reversed(range(len(shape))):
        if shape[axis] == 1:
            continue
        if shape[axis] > BLOCK_AXIS or prod(f for _, f in block) * shape[axis] > MAX_BLOCK:
            break
        block.append((axis, shape[axis]))
    if len(block) < 2 or prod(shape) < PARALLEL_MIN_WORK // SHORT_REDUCE:
        return None
    return KernelOptions(tuple(sorted(block)))


def worth_a_local_tile(ast: UOp) -> bool:
    """The heuristic's rule: a local tile pays when the tile is filled along both output axes
    and the reduction (each staged element is then read LOCAL_TILE times)."""
    plan = tile_plan(ast)
    if plan is None:
        return False
    shape = plan.reduce.src[0].shape
    return all(shape[axis] >= LOCAL_TILE for axis in (plan.m_axis, plan.n_axis, plan.k_axis))


def gpu_elementwise_upcast(shape: tuple[int, ...]) -> KernelOptions:
    """An elementwise kernel on a GPU: one output per thread, unless it has more than
    GPU_UPCAST x GPU_RESIDENT_THREADS outputs (more threads than the GPU runs at once even at
    GPU_UPCAST outputs each): then each thread computes GPU_UPCAST rows of an outer axis.
    Never the innermost axis: neighbouring threads still walk neighbouring columns, so their
    loads stay coalesced (4 consecutive columns per thread would spread a warp's loads over
    4 times the memory)."""
    axes = [axis for axis, size in enumerate(shape) if size > 1]
    if prod(shape) < GPU_UPCAST * GPU_RESIDENT_THREADS:
        return NO_OPTIONS
    for axis in reversed(axes[:-1]):
        if shape[axis] % GPU_UPCAST == 0 and shape[axis] >= 2 * GPU_UPCAST:
            return KernelOptions(((axis, GPU_UPCAST),))
    return NO_OPTIONS


def heuristic_tile_upcast(ast: UOp) -> int:
    """The heuristic's register block for a local tile: the biggest of TILE_UPCAST x
    TILE_UPCAST (or half that on a side) outputs per thread whose group's tile both output
    axes fill and whose shared memory fits; otherwise one output per thread."""
    plan = tile_plan(ast)
    if plan is None:
        return 1
    shape = plan.reduce.src[0].shape
    for block in (TILE_UPCAST, TILE_UPCAST // 2):
        filled = all(shape[axis] >= LOCAL_TILE * block for axis in (plan.m_axis, plan.n_axis))
        fits = local_tile_fits(KernelOptions(local_tile=LOCAL_TILE, tile_upcast=block),
                               plan.x.dtype.itemsize)
        if filled and fits and block > 1:
            return block
    return 1


def local_tile_fits(options: KernelOptions, itemsize: int) -> bool:
    """Does the tile's shared memory fit what every GPU guarantees (MAX_SHARED_BYTES)?"""
    return local_tile_shared_bytes(options, itemsize) <= MAX_SHARED_BYTES


def _with_threads(options: KernelOptions, shape: tuple[int, ...],
                  reduces: list[UOp]) -> KernelOptions:
    """Split a reduction's outer loop across cores when it does enough work to pay for it: its
    outputs times the length of its sum times the ops of each summed term (an elementwise
    kernel: _elementwise_with_threads). A matmul's term is one multiply; attention's softmax
    gradient recomputes a masked exponential in each of its 64 terms per output (30 ops),
    which counted as one kept it on one core at 1 GFLOP/s."""
    reduce_work = prod(reduces[0].src[0].shape) // max(prod(shape), 1) if reduces else 1
    term_ops = sum(1 for n in reduces[0].src[0].toposort if n.op in ALU) if reduces else 1
    outer = outer_loop_size(shape, options)
    parallel = prod(shape) * reduce_work * max(term_ops, 1) >= PARALLEL_MIN_WORK and outer >= 2
    return replace(options, parallel=parallel)


def _elementwise_with_threads(value: UOp, shape: tuple[int, ...]) -> KernelOptions:
    """An elementwise kernel splits its outer loop across cores when its outputs times its
    ops per output reach PARALLEL_MIN_WORK (a 16x64x512 gelu gradient: 0.5 M outputs, dozens
    of ops each; counting outputs alone kept it on one core). A padded read counts as an op
    too (its guard is a comparison and a select per output): the GPT backward's concatenation
    of dq, dk and dv (16x64x384, two adds of three padded reads) took 0.41 ms on one core."""
    ops = sum(1 for node in value.toposort if node.op in ALU or node.op is Ops.PAD)
    outer = outer_loop_size(shape, NO_OPTIONS)
    return replace(NO_OPTIONS, parallel=prod(shape) * max(ops, 1) >= PARALLEL_MIN_WORK and
                   outer >= 2)


def _vectors_go_to_the_sum(reduce: UOp) -> bool:
    """Do the vectors belong to the sum, not to the outputs' tile? When the sum reads memory
    contiguously along its last reduced axis, codegen splits it into lanes (lower.py), except
    where that axis is shorter than SIMD_MIN_LOOP. A short sum (SHORT_REDUCE terms or fewer)
    with such an axis leaves the vectors to the outputs: a one-channel 5x5 convolution reads
    contiguously along its 5 kernel columns, and beautiful_mnist's conv1 stayed in scalar 4x4
    tiles (8.6 ms, 13.8 GFLOP/s; 1.6 ms in vectors). A longer sum keeps the old answer, so
    opt/pack.py's channel tile, which takes such kernels, still does."""
    if not reads_contiguously_along_reduction(reduce):
        return False
    shape = reduce.src[0].shape
    terms = sym_max(sym_prod(shape)) // max(sym_max(sym_prod(reduce.shape)), 1)
    return _long_last_axis(reduce) or terms > SHORT_REDUCE


def _long_last_axis(reduce: UOp) -> bool:
    """Is the sum's last reduced axis long enough to be split into vector lanes, when it reads
    memory contiguously (SIMD_MIN_LOOP, lower.py)?"""
    return sym_max(reduce.src[0].shape[reduce.arg[1][-1]]) >= SIMD_MIN_LOOP


def vector_registers(width: int) -> int:
    """The vector registers of a target with `width` float32 lanes: x86's AVX-512 (16 lanes)
    has 32, AVX2 (8) has 16. Only the lane count decides, so a pinned CPU_VECTOR_WIDTH plans
    the same kernels on every machine."""
    return 32 if width >= 16 else 16


def _tile_registers(vectors_per_row: int, rows: int = 8) -> int:
    """The vector registers a tile of `rows` x `vectors_per_row` holds at once: its
    accumulators, one loaded vector per column block, and one broadcast row value."""
    return rows * vectors_per_row + vectors_per_row + 1


def _vector_tile(shape: tuple[int, ...], width: int) -> KernelOptions | None:
    """A matmul-like tile in vector registers: the innermost output axis in one or two vectors
    of `width` lanes, the next axis by 8 (or 4) rows: 8 x 2 vectors = 16 accumulators, plus the
    two vectors loaded each step. Each loaded vector serves 8 rows; each row's one loaded
    number serves 32 outputs. A long epilogue (gelu after the sum, gelu's gradient) keeps the
    8 rows: on an idle AVX2 machine 1024x128 @ 128x512 + gelu takes 2.20 ms with 8 rows and
    2.43 with 4, and gelu's gradient 1.77 against 2.06 (an earlier rule gave such kernels 4
    rows on figures taken while other processes shared the cores).

    When the innermost axis does not divide by the target's lanes, half-width vectors are
    used (an AVX-512 target's 8-lane ymm halves, still 32 registers): a convolution's 24 or 8
    pixels per row. With 32 registers, three vectors per row fit too (8 x 3 accumulators, 3
    loads, 1 broadcast): the input gradient of beautiful_mnist's second convolution
    (128x32x24x24, a sum over 32x5x5) took 347 ms in scalar 4x8 tiles on an AVX-512 machine
    and takes 28 ms as 8 rows x 3 vectors of 8 (the 8 x 8 tile: 32 ms); its fourth (8x8
    pixels) 38.5 ms against 5.8. (Where its channels fill whole vectors of the target's
    width, opt/pack.py's channel tile does better still: 16 ms, in vectors of 16.)

    A row axis that divides by neither but has at most 8 rows is taken whole: the weight
    gradient of beautiful_mnist's first convolution, (ky, kx, 32 channels) summed over
    128x24x24 pixels, had 2 accumulators and waited on each one's previous FMA (3.7 ms);
    with its 5 kx as rows it has 10, and takes 1.3 ms.

    The loops are interchanged: the column loop goes outside the row loop, so one panel of
    columns of `b` (all its rows, 32 columns wide) stays in cache while every row of `a` passes
    by, instead of all of `b` streaming through the cache once per row block."""
    axes = [axis for axis, size in enumerate(shape) if size > 1]
    if not axes:
        return None
    inner = axes[-1]
    vector = next((w for w in (width, width // 2) if w >= 8 and shape[inner] % w == 0), None)
    if vector is None:
        return None
    lanes = next(k * vector for k in (2, 3, 1) if shape[inner] % (k * vector) == 0 and
                 (k < 3 or _tile_registers(k) <= vector_registers(width)))
    upcasts = [(inner, lanes)]
    order: tuple[int, ...] = ()
    if len(axes) >= 2:
        rows = next((f for f in (8, 4) if shape[axes[-2]] % f == 0),
                    shape[axes[-2]] if shape[axes[-2]] <= 8 else None)
        if rows is not None:
            upcasts.insert(0, (axes[-2], rows))
        order = (*axes[:-2], inner, axes[-2])
    return KernelOptions(tuple(upcasts), vector_width=vector, loop_order=order)
