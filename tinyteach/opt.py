"""Chapter 7 (part 2): kernel optimizations — the same kernel, laid out to run fast.

What this teaches:
- **upcast** (register blocking): instead of one output element per loop iteration, compute a
  small tile (e.g. 4x4) of them. The tile's values share loads: for a matmul, one row of `a`
  and one column of `b` serve 16 accumulators, so each load is used 4 times instead of once,
  and the compiler can keep the tile in vector registers;
- **vectors**: where the device has vector types (`vector_width` floats per register: 16 with
  AVX-512), a matmul-like tile is 8 rows x 2 vectors: one load of 16 consecutive floats of `b`
  and one float of `a` feed 16 multiply-adds at once (lower.py's `vectorize` does the rewriting;
  a kernel it cannot vectorize falls back to the scalar tile);
- **threads**: the outermost loop is split across the machine's cores (an OpenMP pragma in C);
  only worth it when there is enough work to pay for waking the threads;
- **group reduction** (GPU devices whose renderer says `supports_group_reduce`): a reduction
  with few outputs and a long reduced axis gives each output a whole work-group of
  GROUP_THREADS threads. Each thread sums every GROUP_THREADS-th element (neighbouring threads
  read neighbouring memory), writes its partial sum to shared memory, and after a barrier the
  partials are combined: by halving (a tree, log2 of the threads steps, one barrier each) or by
  thread 0 alone (serial). lower.py builds it;
- **local tiles** (GPU devices whose renderer says `supports_local_tile`): a matmul-like kernel
  (a sum of a product X * Y, X the same along the output's last axis, Y along the one before)
  gives each LOCAL_TILE x LOCAL_TILE block of outputs a work-group, one thread per output. Per
  step of LOCAL_TILE along the reduction, the group's threads copy a tile of X and a tile of Y
  into shared memory (one element each), wait at a barrier, and each thread sums its row of
  the one tile times its column of the other: every element a group reads from global memory
  serves LOCAL_TILE threads. lower.py builds it; sizes that are not multiples of the tile are
  padded with zeros (guards), and threads past the edge store nothing. With `tile_upcast` r
  each thread computes an r x r block of outputs (rows LOCAL_TILE apart): a group covers
  (LOCAL_TILE * r)^2 outputs, and each value a thread reads from shared memory serves r of
  them. The guards sit in the copies into shared memory, never in the loop over it, so a
  tile needs no padding to its size (tinygrad's PADTO: tests/test_gpu_options.py);
- **several outputs per thread on a GPU**: an elementwise kernel with more outputs than a GPU
  runs threads at once computes GPU_UPCAST rows of an outer axis per thread
  (`gpu_elementwise_upcast`); neighbouring threads still walk neighbouring columns;
- **tensor cores** (GPU devices whose renderer says `supports_tensor_core`: CUDA, and the
  PYTHON emulator, which runs their semantics): a matmul-like kernel reading half or bfloat16
  gives each 16x8 tile of outputs a warp of 32 threads that runs one `mma` per 16 steps of the
  reduction, summing in float32 (wmma.py);
- **output blocks**: a kernel with a short sum per output and a big output (a convolution's
  window gradient: 9 or 25 taps per pixel, each a sum over the channels) is bound by writing
  its output; its short innermost axes are upcast whole, so each iteration stores a block of
  consecutive outputs (`_output_block`);
- optimizations never change results beyond float rounding (a tile still sums in order), every
  one is optional (`NOOPT=1` turns them all off) and visible (`DEBUG=3` lists them, viz shows
  them), so you can compare a kernel before and after.

The choice is a hand-written heuristic (`choose_options`); `BEAM=n` replaces it by a timed
search (search.py), and pack.py copies big matmul operands into the order the tile reads them
(and a convolution's weights channels last: its channel tiles).

Builds on: uop.py. Used by: lower.py (applies the options), render/ (the parallel pragma).

>>> from tinyteach import Tensor
>>> from tinyteach.schedule import create_schedule
>>> a, b = Tensor.ones(256, 256).realize(), Tensor.ones(256, 256).realize()
>>> item = create_schedule([(a @ b).uop], "CPU")[0][0]
>>> choose_options(item.ast).describe()
['upcast axis 0 by 4', 'upcast axis 1 by 8', 'threads: split the outer loop across cores']
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tinyteach.dtype import dtypes
from tinyteach.helpers import NOOPT, prod, remember
from tinyteach.rewrite import PYTHON_ALU
from tinyteach.uop import ALU, MOVEMENT, Ops, UOp
from tinyteach.view import linear_index, view_index

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
GROUP_COMBINES = ("tree", "serial")
# a kernel over whole rows (a fused softmax or layernorm, schedule.fuses_along_rows) takes one
# work-group per row: ROW_GROUP_THREADS threads split the row, each at most ROW_STEPS columns
ROW_GROUP_THREADS = 64
ROW_STEPS = 32
MAX_GROUP_ROW = ROW_GROUP_THREADS * ROW_STEPS  # 2,048 elements: longer rows are not fused
TENSOR_CORE_TILE = (16, 8, 16)  # m, n, k of the tensor-core instruction (wmma.M16N8K16)
TENSOR_CORE_BLOCK = (2, 2, 2, 4)  # 2x2 warps, each 2x4 tiles: 64x64 outputs, 128 threads
LOCAL_TILE = 16            # a local tile: LOCAL_TILE x LOCAL_TILE threads (256, every GPU allows)
TILE_UPCAST = 4            # ... each thread a TILE_UPCAST x TILE_UPCAST block of outputs
MAX_SHARED_BYTES = 16384   # shared memory per work-group that every GPU API guarantees (WebGPU's
                           # default maxComputeWorkgroupStorageSize is the smallest)
GPU_UPCAST = 4             # rows per thread of a big elementwise GPU kernel (an outer axis)
GPU_RESIDENT_THREADS = 1 << 18  # about the threads a big GPU runs at once (H200: 132 x 2048):
                                # a kernel with 4x as many outputs still fills it at 4 per thread


@dataclass(frozen=True)
class KernelOptions:
    """What to do to one kernel. `upcasts`: (output axis, factor) pairs. `vector_width` > 0:
    the last upcast axis's tile is computed in vectors of that many lanes (lower.py)."""

    upcasts: tuple[tuple[int, int], ...] = ()
    parallel: bool = False
    vector_width: int = 0
    loop_order: tuple[int, ...] = ()  # output axes, outermost loop first (empty: axis order)
    group: int = 0  # > 0: threads per work-group that share the (one) reduction (GPU only)
    group_combine: str = "tree"  # how the partial sums are combined: "tree" or "serial"
    local_tile: int = 0  # > 0: a matmul-like kernel in tiles of local_tile^2 threads (GPU only)
    # with tensor_core: (warps along m, along n, 16x8 tiles per warp along m, along n) of a
    # work-group fed from shared memory (wmma.TensorCoreBlock); empty: one warp per tile
    tensor_core_block: tuple[int, ...] = ()
    tensor_core: bool = False  # a half/bf16 matmul on tensor cores: a warp per 16x8 tile (wmma.py)
    tile_upcast: int = 1  # > 1: each thread of a local tile computes a block of r x r outputs

    def __post_init__(self) -> None:
        if self.group and (self.group & (self.group - 1) or self.group < 2):
            raise ValueError(f"a group reduction needs a power of two >= 2 threads, "
                             f"got {self.group}")
        if self.group_combine not in GROUP_COMBINES:
            raise ValueError(f"group_combine is one of {GROUP_COMBINES}, "
                             f"got {self.group_combine!r}")
        if self.group and (self.upcasts or self.vector_width or self.parallel):
            raise ValueError("a group reduction does not combine with upcasts, vectors or "
                             "threads over the outer loop")
        if self.local_tile and (self.local_tile & (self.local_tile - 1) or self.local_tile < 2):
            raise ValueError(f"a local tile is a power of two >= 2 threads on a side, "
                             f"got {self.local_tile}")
        if self.local_tile and (self.group or self.upcasts or self.vector_width or self.parallel):
            raise ValueError("a local tile does not combine with a group reduction, upcasts, "
                             "vectors or threads over the outer loop")
        if self.tile_upcast < 1 or (self.tile_upcast > 1 and not self.local_tile):
            raise ValueError(f"a tile upcast is a block of r x r outputs per thread of a local "
                             f"tile (r >= 1, and r > 1 needs local_tile), got {self.tile_upcast}")
        if self.tensor_core and (self.local_tile or self.group or self.upcasts or
                                 self.vector_width or self.parallel):
            raise ValueError("tensor cores do not combine with a local tile, a group reduction, "
                             "upcasts, vectors or threads over the outer loop")
        if self.tensor_core_block:
            _check_tensor_core_block(self.tensor_core_block, self.tensor_core)

    def describe(self) -> list[str]:
        if self.tensor_core and self.tensor_core_block:
            return [_describe_tensor_core_block(self.tensor_core_block)]
        if self.tensor_core:
            return ["tensor cores: a warp of 32 threads per 16x8 tile of outputs, one "
                    "mma m16n8k16 (half/bf16 in, float32 sums) per 16 steps of the reduction"]
        if self.local_tile:
            size, block = self.local_tile, self.tile_upcast
            if block == 1:
                return [f"local tile: {size}x{size} threads per work-group, one output each; "
                        f"{size}x{size} tiles of both operands staged in shared memory per "
                        f"{size} steps of the reduction"]
            return [f"local tile: {size}x{size} threads per work-group, a {block}x{block} "
                    f"block of outputs each ({size * block}x{size * block} per group); "
                    f"{size * block}x{size} tiles of both operands staged in shared memory "
                    f"per {size} steps of the reduction; each value a thread reads from "
                    f"shared memory serves {block} of its outputs"]
        if self.group:
            how = "a tree (halving)" if self.group_combine == "tree" else "thread 0 (serial)"
            return [f"group reduce: {self.group} threads of a work-group share each reduction, "
                    f"partials in shared memory, combined by {how}"]
        steps = [f"upcast axis {axis} by {factor}" for axis, factor in self.upcasts]
        if self.vector_width:
            axis, factor = self.upcasts[-1]
            steps.append(f"vectors: axis {axis}'s {factor} values as {factor // self.vector_width}"
                         f" vector(s) of {self.vector_width} lanes")
        if self.loop_order:
            steps.append(f"loop order: axes {', '.join(map(str, self.loop_order))} from the "
                         "outside in")
        if self.parallel:
            steps.append("threads: split the outer loop across cores")
        return steps


NO_OPTIONS = KernelOptions()


def kernel_value(ast: UOp) -> UOp:
    """The value a kernel stores (the AST is SINK(STORE(output, value)))."""
    return ast.src[0].src[1]


def choose_options(ast: UOp, vector_width: int = 0, group_reduce: bool = False,
                   local_tile: bool = False, tensor_core: bool = False) -> KernelOptions:
    """The hand-written heuristic: tile reductions, thread big kernels. `vector_width`: how
    many floats the device's vector registers hold (0: it has no vector types).
    `group_reduce`: the device's renderer can share a reduction across a work-group (shared
    memory and barriers); `local_tile`: it can stage matmul tiles in shared memory;
    `tensor_core`: it has tensor cores (WMMA, wmma.py).
    Remembered per kernel: the engine, pack.py and search.py all ask. A kernel over a
    symbolic size gets none: upcasts and tiles split loops of a known size."""
    if NOOPT or ast.has_symbols:
        return NO_OPTIONS
    return remember(_chosen, (ast, vector_width, group_reduce, local_tile, tensor_core),
                    lambda: _choose(ast, vector_width, group_reduce, local_tile, tensor_core))


def options_for_renderer(ast: UOp, renderer: Any) -> KernelOptions:
    """The heuristic's choice for a device, read off its renderer: its `vector_width` and
    whether it `supports_group_reduce`, `supports_local_tile` and `supports_tensor_core`
    (None: an interpreter, which takes no options)."""
    if renderer is None:
        return NO_OPTIONS
    return choose_options(ast, renderer.vector_width,
                          getattr(renderer, "supports_group_reduce", False),
                          getattr(renderer, "supports_local_tile", False),
                          getattr(renderer, "supports_tensor_core", False))


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
        return _one_row_at_a_time(shape, reduces)
    if tensor_core and _worth_a_tensor_core(ast):
        return KernelOptions(tensor_core=True, tensor_core_block=tensor_core_block_for(ast))
    if local_tile and worth_a_local_tile(ast):
        return KernelOptions(local_tile=LOCAL_TILE, tile_upcast=heuristic_tile_upcast(ast))
    if group_reduce and can_group_reduce(ast) and prod(shape) <= GROUP_MAX_OUTPUTS \
            and reduces[0].src[0].shape[reduces[0].arg[1][-1]] >= GROUP_MIN_REDUCE:
        return KernelOptions(group=GROUP_THREADS)
    if reduces and vector_width and len(value.toposort) <= MAX_UPCAST_GRAPH \
            and not reads_contiguously_along_reduction(reduces[0]):
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
        # vector lanes instead (lower.py), and a 4x4 tile keeps the registers for that
        wide = not reads_contiguously_along_reduction(reduces[0])
        for axis in reversed(range(len(shape))):
            factor = WIDE_UPCAST if wide and not upcasts and shape[axis] % WIDE_UPCAST == 0 \
                else UPCAST
            if len(upcasts) < MAX_UPCAST_AXES and shape[axis] % factor == 0 \
                    and shape[axis] >= 2 * factor:
                upcasts.append((axis, factor))
    upcasts.sort()
    return _with_threads(KernelOptions(tuple(upcasts)), shape, reduces)


def _one_row_at_a_time(shape: tuple[int, ...], reduces: list[UOp]) -> KernelOptions:
    """A kernel over whole rows (a fused softmax or layernorm) on a CPU: no tile, one row per
    iteration of the outer loop, the rows split across cores. Each of the row's loops (the
    max, the sum, the output's columns) then walks one row in order, which the compiler
    turns into vector instructions. (A 4x4 tile interleaved 4 rows: the column loop wrote 16
    outputs from 4 rows per iteration, and gcc did not vectorize it.)"""
    return _with_threads(NO_OPTIONS, shape, reduces)


def _worth_a_tensor_core(ast: UOp) -> bool:
    from tinyteach.wmma import worth_a_tensor_core  # wmma.py builds on this module's TilePlan
    return worth_a_tensor_core(ast)


def tensor_core_block_for(ast: UOp) -> tuple[int, ...]:
    """TENSOR_CORE_BLOCK where the kernel fills a whole block along both output axes (its
    operands then go through shared memory); a smaller kernel keeps one warp per tile."""
    from tinyteach.wmma import tensor_core_plan
    plan = tensor_core_plan(ast)
    if plan is None:
        return ()
    shape, (warps_m, warps_n, tiles_m, tiles_n) = plan.tile.reduce.src[0].shape, TENSOR_CORE_BLOCK
    fills = shape[plan.tile.m_axis] >= warps_m * tiles_m * TENSOR_CORE_TILE[0] and \
        shape[plan.tile.n_axis] >= warps_n * tiles_n * TENSOR_CORE_TILE[1]
    return TENSOR_CORE_BLOCK if fills else ()


def _check_tensor_core_block(block: tuple[int, ...], tensor_core: bool) -> None:
    if not tensor_core:
        raise ValueError("a tensor-core block needs tensor_core=True")
    if len(block) != 4 or any(not isinstance(n, int) or n < 1 for n in block):
        raise ValueError(f"a tensor-core block is (warps along m, warps along n, tiles per "
                         f"warp along m, along n), four ints >= 1, got {block}")
    if 32 * block[0] * block[1] > 1024:
        raise ValueError(f"a tensor-core block of {block[0]}x{block[1]} warps is more than "
                         f"the 1024 threads every GPU allows per work-group")


def _describe_tensor_core_block(block: tuple[int, ...]) -> str:
    warps_m, warps_n, tiles_m, tiles_n = block
    rows, columns = warps_m * tiles_m * TENSOR_CORE_TILE[0], warps_n * tiles_n * TENSOR_CORE_TILE[1]
    k = TENSOR_CORE_TILE[2]
    return (f"tensor cores: a work-group of {warps_m}x{warps_n} warps per {rows}x{columns} "
            f"block of outputs, each warp {tiles_m}x{tiles_n} tiles of 16x8; per {k} steps of "
            f"the reduction both operands' k-slices ({rows}x{k}, {k}x{columns}) staged in "
            f"shared memory, one mma m16n8k16 per tile (half/bf16 in, float32 sums)")


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


def can_group_reduce(ast: UOp) -> bool:
    """A group reduction needs a kernel whose reductions, of floats or ints, all reduce the
    same axes of the same shape: one, or a chain over the same rows (softmax's max, then its
    sum), each its own round of shared memory."""
    reduces = [n for n in kernel_value(ast).toposort if n.op is Ops.REDUCE_AXIS]
    return bool(reduces) and all(r.dtype != dtypes.bool and r.arg[1] == reduces[0].arg[1] and
                                 r.src[0].shape == reduces[0].src[0].shape for r in reduces)


def row_kernel_axis(ast: UOp) -> int | None:
    """The row axis of a kernel that computes whole rows from reductions over them (a fused
    softmax or layernorm: the output has the reductions' source shape), or None. Such a kernel
    takes one work-group per row (lower.row_output_index): the row is the last reduced axis,
    the only one longer than 1 and the innermost, at most MAX_GROUP_ROW long."""
    value = kernel_value(ast)
    reduces = [n for n in value.toposort if n.op is Ops.REDUCE_AXIS]
    if not reduces or not can_group_reduce(ast) or value.shape != reduces[0].src[0].shape:
        return None
    shape, axes = value.shape, reduces[0].arg[1]
    long_axes = [axis for axis in axes if shape[axis] > 1]
    if long_axes not in ([], [axes[-1]]) or shape[axes[-1]] > MAX_GROUP_ROW or \
            any(size > 1 for size in shape[axes[-1] + 1:]):
        return None
    return axes[-1]


def row_group_threads(ast: UOp) -> int:
    """Threads of a row's work-group: ROW_GROUP_THREADS, or the power of two at or above a
    shorter row (a row of 10 takes 16 threads)."""
    axis = row_kernel_axis(ast)
    length = 1 if axis is None else kernel_value(ast).shape[axis]
    threads = 2
    while threads < min(length, ROW_GROUP_THREADS):
        threads *= 2
    return threads


@dataclass(frozen=True)
class TilePlan:
    """How a matmul-like kernel splits: the reduction's source is `reduce.src[0]` = X * Y, with
    X the same along source axis `n_axis` and Y the same along `m_axis`; `k_axis` is reduced."""

    reduce: UOp
    x: UOp
    y: UOp
    m_axis: int
    n_axis: int
    k_axis: int


def local_tile_plan(ast: UOp) -> TilePlan | None:
    """The TilePlan of a kernel that a local tile can compute, or None. It needs one sum over
    one axis of a product X * Y (not bools), with X constant along the output's last axis and
    Y along the one before (or the other way round), and only elementwise ops and reshapes
    (that add or drop size-1 axes) between the sum and the store."""
    value = kernel_value(ast)
    reduces = [n for n in value.toposort if n.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1 or reduces[0].arg[0] is not Ops.ADD or len(reduces[0].arg[1]) != 1:
        return None
    reduce = reduces[0]
    source = reduce.src[0]
    if source.op is not Ops.MUL or reduce.dtype == dtypes.bool or \
            not _only_elementwise_above(value, reduce):
        return None
    k_axis = reduce.arg[1][0]
    kept = [axis for axis, size in enumerate(source.shape) if size > 1 and axis != k_axis]
    if len(kept) < 2 or [source.shape[a] for a in kept] != [s for s in value.shape if s > 1]:
        return None
    m_axis, n_axis = kept[-2], kept[-1]
    x, y = source.src
    if not (_constant_along(x, n_axis) and _constant_along(y, m_axis)):
        x, y = y, x
    if not (_constant_along(x, n_axis) and _constant_along(y, m_axis)):
        return None
    return TilePlan(reduce, x, y, m_axis, n_axis, k_axis)


def tile_plan(ast: UOp) -> TilePlan | None:
    """`local_tile_plan`, also where a widening cast sits between the sum and the product (a
    half matmul sums in float32: REDUCE_AXIS(CAST(MUL))). The plan is then made on the kernel
    with the cast left out: its X, Y and axes are the kernel's own; the local tile stages X
    and Y in their dtype and casts each product (lower.py), as the kernel does."""
    plan = local_tile_plan(ast)
    if plan is not None:
        return plan
    reduces = [n for n in kernel_value(ast).toposort if n.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1:
        return None
    source = reduces[0].src[0]
    widening = source.op is Ops.CAST and source.src[0].op is Ops.MUL and \
        dtypes.is_float(source.dtype) and source.dtype.itemsize > source.src[0].dtype.itemsize
    return local_tile_plan(ast.substitute({source: source.src[0]})) if widening else None


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


def local_tile_shared_bytes(options: KernelOptions, itemsize: int) -> int:
    """Shared memory of a local tile: two tiles of (size * r) x size elements."""
    return 2 * options.local_tile ** 2 * options.tile_upcast * itemsize


def local_tile_fits(options: KernelOptions, itemsize: int) -> bool:
    """Does the tile's shared memory fit what every GPU guarantees (MAX_SHARED_BYTES)?"""
    return local_tile_shared_bytes(options, itemsize) <= MAX_SHARED_BYTES


def _only_elementwise_above(value: UOp, reduce: UOp) -> bool:
    """Between the stored value and the reduction: ALU ops and reshapes of size-1 axes only
    (then the output's index is the reduction's, and each thread's output is its own sum)."""
    stack, seen = [value], set()
    while stack:
        node = stack.pop()
        if node in seen or node is reduce or reduce not in node.toposort:
            continue
        seen.add(node)
        squeezed = [s for s in node.shape if s > 1]
        if node.op is Ops.RESHAPE and squeezed == [s for s in node.src[0].shape if s > 1]:
            stack.append(node.src[0])
        elif node.op in ALU:
            stack.extend(node.src)
        else:
            return False
    return True


def _constant_along(node: UOp, axis: int) -> bool:
    """Does every buffer `node` reads stay put as `axis` moves (a broadcast along it)?"""
    loops = tuple(UOp(Ops.RANGE, dtypes.int32, (), ("r", k, size))
                  for k, size in enumerate(node.shape))
    return all(step_along(chain, loops, loops[axis]) == 0 for chain in buffer_reads(node))


def _with_threads(options: KernelOptions, shape: tuple[int, ...],
                  reduces: list[UOp]) -> KernelOptions:
    """Split the outer loop across cores when the kernel does enough work to pay for it."""
    reduce_work = prod(reduces[0].src[0].shape) // max(prod(shape), 1) if reduces else 1
    outer = outer_loop_size(shape, options)
    parallel = prod(shape) * reduce_work >= PARALLEL_MIN_WORK and outer >= 2
    return replace(options, parallel=parallel)


def _vector_tile(shape: tuple[int, ...], width: int) -> KernelOptions | None:
    """A matmul-like tile in vector registers: the innermost output axis in one or two vectors
    of `width` lanes, the next axis by 8 (or 4) rows: 8 x 2 vectors = 16 accumulators, plus the
    two vectors loaded each step. Each loaded vector serves 8 rows; each row's one loaded
    number serves 32 outputs.

    The loops are interchanged: the column loop goes outside the row loop, so one panel of
    columns of `b` (all its rows, 32 columns wide) stays in cache while every row of `a` passes
    by, instead of all of `b` streaming through the cache once per row block."""
    axes = [axis for axis, size in enumerate(shape) if size > 1]
    if not axes or shape[axes[-1]] % width:
        return None
    inner = axes[-1]
    lanes = 2 * width if shape[inner] % (2 * width) == 0 else width
    upcasts = [(inner, lanes)]
    order: tuple[int, ...] = ()
    if len(axes) >= 2:
        rows = next((f for f in (8, 4) if shape[axes[-2]] % f == 0), None)
        if rows is not None:
            upcasts.insert(0, (axes[-2], rows))
        order = (*axes[:-2], inner, axes[-2])
    return KernelOptions(tuple(upcasts), vector_width=width, loop_order=order)


def reads_contiguously_along_reduction(reduce: UOp) -> bool:
    """Does every buffer the reduction reads move by 0 or 1 element along its last reduced
    axis? (Worked out from the views alone: each movement chain's index formula, simplified.)"""
    source = reduce.src[0]
    axis = reduce.arg[1][-1]
    loops = tuple(UOp(Ops.RANGE, dtypes.int32, (), ("r", k, size))
                  for k, size in enumerate(source.shape))
    steps = [step_along(chain, loops, loops[axis]) for chain in buffer_reads(source)]
    return bool(steps) and all(step in (0, 1) for step in steps) and 1 in steps


def buffer_reads(node: UOp) -> list[UOp]:
    """The movement chains that end in a kernel input, above elementwise ops only."""
    chains, stack, seen = [], [node], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        chain_end = current
        while chain_end.op in MOVEMENT:
            chain_end = chain_end.src[0]
        if chain_end.op is Ops.DEFINE_GLOBAL:
            chains.append(current)
        elif current.op in ALU:
            stack.extend(current.src)
    return chains


def step_along(chain: UOp, loops: tuple[UOp, ...], loop: UOp) -> int | None:
    """How far the buffer position moves when `loop` goes from 0 to 1 (other loops at 0)."""
    index: tuple[UOp, ...] = loops
    node = chain
    while node.op in MOVEMENT:  # (no pad conditions needed: only the position matters here)
        index, _ = view_index(node, index)
        node = node.src[0]
    position = linear_index(index, node.shape)
    start, step = index_value(position, {}), index_value(position, {loop: 1})
    return None if start is None or step is None else step - start


def index_value(root: UOp, loops: dict[UOp, int]) -> int | None:
    """The value of an index expression with the given loops set (the others at 0), computed
    in Python; None when it reads memory (a gather's index)."""
    values: dict[UOp, int] = {}
    for node in root.toposort:
        if node.op is Ops.RANGE:
            values[node] = loops.get(node, 0)
        elif node.op is Ops.CONST:
            values[node] = int(node.arg)
        elif node.op in PYTHON_ALU and all(s in values for s in node.src):
            values[node] = int(PYTHON_ALU[node.op](*(values[s] for s in node.src)))
    return values.get(root)


def outer_loop_size(shape: tuple[int, ...], options: KernelOptions) -> int:
    """Iterations of the outermost loop (the one threads split; axes of size 1 have no loop)."""
    upcasts = dict(options.upcasts)
    for axis in options.loop_order or range(len(shape)):
        if shape[axis] != 1:
            return shape[axis] // upcasts.get(axis, 1)
    return 1
