"""Chapter 7 (part 2a): a kernel's plan — what the optimizer decided, in the form codegen/lower.py
reads.

What this teaches:
- the optimizer (opt/) speaks in *actions*: `Opt(OptOps.UPCAST, 1, 8)`, `Opt(OptOps.LOCAL, 0,
  16)`, ... A kernel's optimization is the list of actions applied to it, in order, each one
  checked when it is applied (`opt.Kernel.apply_opt`);
- codegen/lower.py does not read actions one by one: it reads the **plan** they add up to, a
  `KernelOptions` (which upcasts, the vector lanes, the loop order, threads over cores, a group
  reduction, a local tile, tensor cores). Only `opt.Kernel` builds one from actions; a plan
  states what the lowering does, not why;
- both need the same facts about a kernel AST, and they live here: the value it stores
  (`kernel_value`), whether its reductions can share a work-group (`can_group_reduce`), whether
  it computes whole rows (`row_kernel_axis`), whether it is matmul-like (`tile_plan`: a sum of
  X * Y, X constant along one output axis and Y along another), and how each buffer it reads
  moves along a loop (`step_along`), worked out from the views alone.

Builds on: ir/uop.py, ir/view.py, ir/rewrite.py (Python's ALU). Used by: opt/ (builds plans from
actions), codegen/lower.py and codegen/wmma.py (read them), opt/pack.py and opt/search.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from tinyteach.dtype import dtypes
from tinyteach.ir.rewrite import PYTHON_ALU
from tinyteach.ir.uop import ALU, MOVEMENT, Ops, UOp
from tinyteach.ir.view import linear_index, view_index

GROUP_COMBINES = ("tree", "serial")
# a kernel over whole rows (a fused softmax or layernorm, schedule.fuses_along_rows) takes one
# work-group per row: ROW_GROUP_THREADS threads split the row, each at most ROW_STEPS columns
ROW_GROUP_THREADS = 64
ROW_STEPS = 32
MAX_GROUP_ROW = ROW_GROUP_THREADS * ROW_STEPS  # 2,048 elements: longer rows are not fused
TENSOR_CORE_TILE = (16, 8, 16)  # m, n, k of the tensor-core instruction (wmma.M16N8K16)


@dataclass(frozen=True)
class KernelOptions:
    """The plan of one kernel, as codegen/lower.py reads it (opt.Kernel builds it from actions).
    `upcasts`: (output axis, factor) pairs, by axis. `vector_width` > 0: the last upcast axis's
    tile is computed in vectors of that many lanes. `padded`: (output axis, size) pairs, an axis
    whose loop runs to a padded size, its extra iterations guarded (PADTO)."""

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
    tensor_core: bool = False  # a half/bf16 matmul on tensor cores: a warp per 16x8 tile
    tile_upcast: int = 1  # > 1: each thread of a local tile computes a block of r x r outputs
    group_top: bool = False  # a group's thread sums one contiguous slice (GROUPTOP), not a stride
    padded: tuple[tuple[int, int], ...] = ()  # (axis, padded size): PADTO
    unrolls: tuple[tuple[int, int], ...] = ()  # (reduced axis, amount): UNROLL

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
    takes one work-group per row (codegen/lower_gpu.py's row_output_index): the row is the last
    reduced axis, the only one longer than 1 and the innermost, at most MAX_GROUP_ROW long."""
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
    and Y in their dtype and casts each product (codegen/lower.py), as the kernel does."""
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
