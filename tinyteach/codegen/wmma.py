"""Chapter 8b (part 3): tensor cores — a warp multiplies small matrices in one instruction.

What this teaches:
- a *tensor core* multiplies a small matrix by another in one instruction. It is not one
  thread's instruction but a *warp's*: the 32 threads of a warp execute it together, and each
  holds a few elements of each matrix in its registers, its *fragments*. NVIDIA's
  `mma.sync.aligned.m16n8k16` (sm_80 and later) multiplies A (16x16, half or bfloat16) by
  B (16x8) and gives D = A @ B (16x8, float32): each thread holds 8 elements of A, 4 of B and
  4 of D;
- which thread holds which element is the instruction's *layout* (PTX ISA, "Matrix Fragments
  for mma.m16n8k16"). Lane `l` is in group `g = l // 4` and is thread `t = l % 4` of its
  group; its D elements are rows g and g + 8, columns 2t and 2t + 1 (`c_cell` below). The
  layout is data here (`TensorCore`): the lowering, the emulator (runtime/python.py), the CUDA
  renderer and viz/threads.py all read the same functions;
- a matmul-like kernel (a sum over k of X * Y, both half or bfloat16 read from memory, the
  plan of plan.local_tile_plan) is lowered so that each work-group is one warp computing one
  16 x 8 tile of outputs: per step of 16 along k, every thread loads its 8 + 4 fragment
  elements straight from global memory (elements past an edge load as 0, so any size works),
  the warp runs one WMMA, and each thread adds its 4 results to 4 float32 accumulators.
  Products of halves are exact in float32 and the sums are float32 (every half sum in
  tinyteach is, tensor_core.sum_acc_dtype; only the tensor core also keeps the products exact);
- a *block* (`TensorCoreBlock`, KernelOptions.tensor_core_block) makes a work-group of several
  warps, each computing several tiles (the heuristic's: 2x2 warps of 2x4 tiles, 64x64 outputs).
  Per step of 16 along k the group copies both operands' k-slices into shared memory
  (cooperative: each thread a few elements, neighbours neighbouring elements; zeros past the
  edges), waits at a barrier, and each warp reads its fragments from shared memory: every
  element read from global memory then serves a whole row or column of the block's tiles
  (`StagedTensorCoreLowering`);
- in the IR, a `WMMA` node is one element of a thread's D fragment (the program stays scalar:
  the linearizer, the accumulators and the emulator need nothing new). The 4 WMMA nodes that
  share their sources are one instruction: the CUDA renderer issues it once, the emulator
  computes the warp's whole product.

tinygrad: its WMMA UOp takes vector fragments and returns a vector (with GEP to take elements
apart) and the TC optimization upcasts and permutes axes to build them; here the fragment
elements are plain scalar loads, and the instruction is fixed (16 x 8 x 16).

Builds on: ir/uop.py, ir/view.py, codegen/plan.py (the matmul plan). Used by: codegen/lower.py (the
`tensor_core` option), render/cuda.py (mma.sync), runtime/python.py (the semantics), viz/threads.py.

>>> M16N8K16.c_cell(5, 2)  # lane 5 holds D[row 9, column 2] as its element 2
(9, 2)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from tinyteach.codegen.plan import TilePlan, buffer_reads, kernel_value, step_along, tile_plan
from tinyteach.dtype import DType, dtypes, from_bfloat16_bits
from tinyteach.ir.uop import MOVEMENT, Ops, UOp
from tinyteach.ir.view import Index, Valid, and_valid, below, guarded, index_const

Cell = Callable[..., tuple]  # (lane, element) -> (row, column); lane an int or an index UOp


# ---- the instruction and its layout ----

def _a_cell(lane, i: int) -> tuple:
    """Element i (0..7) of lane's A fragment is A[row, k]: pairs of k, rows g and g + 8."""
    return (lane // 4 + 8 * ((i // 2) % 2), (lane % 4) * 2 + i % 2 + 8 * (i // 4))


def _b_cell(lane, i: int) -> tuple:
    """Element i (0..3) of lane's B fragment is B[k, column g]."""
    return ((lane % 4) * 2 + i % 2 + 8 * (i // 2), lane // 4)


def _c_cell(lane, j: int) -> tuple:
    """Element j (0..3) of lane's C/D fragment is D[row, column]."""
    return (lane // 4 + 8 * (j // 2), (lane % 4) * 2 + j % 2)


@dataclass(frozen=True, repr=False)
class TensorCore:
    """One tensor-core instruction: D (m x n, float32) = A (m x k) @ B (k x n) on a warp of
    `threads` threads. `a_cell(lane, i)` is the (row, k) of the i-th A element that `lane`
    holds; `b_cell` gives (k, column), `c_cell` (row, column) of D."""

    name: str
    m: int
    n: int
    k: int
    threads: int
    a_elements: int
    b_elements: int
    c_elements: int
    a_cell: Cell
    b_cell: Cell
    c_cell: Cell

    def __repr__(self) -> str:
        return self.name

    @cached_property
    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The layout as arrays: [lane, element] -> (row, column) for A, B and C."""
        def table(cell: Cell, elements: int) -> np.ndarray:
            return np.array([[cell(lane, i) for i in range(elements)]
                             for lane in range(self.threads)])
        return (table(self.a_cell, self.a_elements), table(self.b_cell, self.b_elements),
                table(self.c_cell, self.c_elements))


M16N8K16 = TensorCore("m16n8k16", 16, 8, 16, 32, 8, 4, 4, _a_cell, _b_cell, _c_cell)
TENSOR_CORES = (M16N8K16,)
FRAGMENT_DTYPES = (dtypes.float16, dtypes.bfloat16)  # what a fragment may hold


@dataclass(frozen=True)
class WMMAArg:
    """The arg of a WMMA node: the instruction, the dtype of A and B, the accumulator's dtype,
    and which element of the thread's D fragment this node is."""

    core: TensorCore
    dtype_in: DType
    dtype_acc: DType
    element: int

    @property
    def instruction(self) -> WMMAArg:
        """The arg shared by the WMMA nodes of one instruction (element 0's)."""
        return replace(self, element=0)


def wmma_reference(core: TensorCore, a: np.ndarray, b: np.ndarray,
                   dtype_in: DType = dtypes.float16) -> np.ndarray:
    """What one WMMA computes, from the fragments: `a[w, lane, i]` and `b[w, lane, i]` for
    warps w; returns `d[w, lane, j]`. The layout puts each lane's elements into the matrices,
    which are multiplied in float32 (products of halves or bfloat16s are exact in float32).
    bfloat16 fragments come as their 16-bit words (dtype.py's host format)."""
    a_table, b_table, c_table = core.tables
    warps = a.shape[0]
    if dtype_in.name == "bfloat16":
        a, b = from_bfloat16_bits(a), from_bfloat16_bits(b)
    a_matrix = np.zeros((warps, core.m, core.k), dtype=np.float32)
    b_matrix = np.zeros((warps, core.k, core.n), dtype=np.float32)
    a_matrix[:, a_table[..., 0], a_table[..., 1]] = a.astype(np.float32)
    b_matrix[:, b_table[..., 0], b_table[..., 1]] = b.astype(np.float32)
    d_matrix = a_matrix @ b_matrix
    return d_matrix[:, c_table[..., 0], c_table[..., 1]]


# ---- a block of warps, its operands staged in shared memory ----

@dataclass(frozen=True)
class TensorCoreBlock:
    """A work-group of `warps` = (along m, along n) warps, each computing `tiles` = (along m,
    along n) tiles of the instruction: a block of `rows` x `columns` outputs. Per step of
    core.k along the reduction, the group's threads copy the step's k-slice of both operands
    (X: rows x k, Y: k x columns) into shared memory, each thread a few elements, neighbouring
    threads neighbouring elements; after a barrier each warp reads its fragments from there.
    Every element the group reads from global memory serves a whole row or column of tiles.

    Thread `t` of the group is lane t % 32 of warp t // 32 (CUDA's warps: consecutive thread
    ids). Warp w covers block rows from (w // warps[1]) * tiles[0] * core.m and columns from
    (w % warps[1]) * tiles[1] * core.n. Each row of a slice in shared memory is `padding`
    elements longer than the slice, so the 8 rows one fragment load touches fall in different
    banks (a row of 16 halves is 8 of the 32 four-byte banks: rows g and g + 4 would clash)."""

    core: TensorCore
    warps: tuple[int, int]
    tiles: tuple[int, int]
    padding: int = 8

    def __post_init__(self) -> None:
        if min(*self.warps, *self.tiles) < 1:
            raise ValueError(f"a tensor-core block needs at least one warp and one tile along "
                             f"each axis, got warps {self.warps} and tiles {self.tiles}")

    def __repr__(self) -> str:
        return (f"{self.rows}x{self.columns} block: {self.warps[0]}x{self.warps[1]} warps of "
                f"{self.tiles[0]}x{self.tiles[1]} {self.core.name} tiles")

    @property
    def warp_count(self) -> int:
        return self.warps[0] * self.warps[1]

    @property
    def threads(self) -> int:
        return self.core.threads * self.warp_count

    @property
    def rows(self) -> int:
        return self.warps[0] * self.tiles[0] * self.core.m

    @property
    def columns(self) -> int:
        return self.warps[1] * self.tiles[1] * self.core.n

    @property
    def a_row_length(self) -> int:
        """Elements per row of X's slice in shared memory (row-major, padded)."""
        return self.core.k + self.padding

    @property
    def b_row_length(self) -> int:
        """Elements per row (one k) of Y's slice in shared memory (padded)."""
        return self.columns + self.padding

    @property
    def a_size(self) -> int:
        return self.rows * self.a_row_length

    @property
    def b_size(self) -> int:
        return self.core.k * self.b_row_length

    @property
    def a_elements(self) -> int:
        """Elements of X's k-slice that the group copies per step (rows x k)."""
        return self.rows * self.core.k

    @property
    def b_elements(self) -> int:
        return self.core.k * self.columns

    def loads_per_thread(self, elements: int) -> int:
        return -(-elements // self.threads)

    def tile_origin(self, warp, tile_m: int, tile_n: int) -> tuple:
        """The block (row, column) where warp `warp`'s tile (tile_m, tile_n) starts."""
        row = (warp // self.warps[1] * self.tiles[0] + tile_m) * self.core.m
        column = (warp % self.warps[1] * self.tiles[1] + tile_n) * self.core.n
        return row, column

    def a_staging_cell(self, element, k_fastest: bool) -> tuple:
        """Element `element` of X's slice (copied by thread element % threads) as (row, k):
        k fastest when X is contiguous along k (a row-major A), else rows fastest."""
        if k_fastest:
            return element // self.core.k, element % self.core.k
        return element % self.rows, element // self.rows

    def b_staging_cell(self, element, columns_fastest: bool) -> tuple:
        """Element `element` of Y's slice as (k, column): columns fastest when Y is
        contiguous along its columns (a row-major B), else k fastest."""
        if columns_fastest:
            return element // self.columns, element % self.columns
        return element % self.core.k, element // self.core.k

    def a_slot(self, row, k):
        return row * self.a_row_length + k

    def b_slot(self, k, column):
        return k * self.b_row_length + column

    @cached_property
    def warp_map(self) -> np.ndarray:
        """[block row // core.m, block column // core.n] -> the warp computing that tile."""
        owner = np.zeros((self.rows // self.core.m, self.columns // self.core.n), np.int64)
        for warp in range(self.warp_count):
            for tile_m in range(self.tiles[0]):
                for tile_n in range(self.tiles[1]):
                    row, column = self.tile_origin(warp, tile_m, tile_n)
                    owner[row // self.core.m, column // self.core.n] = warp
        return owner


def tensor_core_block(core: TensorCore, shape: tuple[int, ...]) -> TensorCoreBlock:
    """KernelOptions.tensor_core_block (warps along m, along n, tiles along m, along n) as a
    block of `core`."""
    warps_m, warps_n, tiles_m, tiles_n = shape
    return TensorCoreBlock(core, (warps_m, warps_n), (tiles_m, tiles_n))


# ---- which kernels can use it ----

@dataclass(frozen=True)
class TensorCorePlan:
    """A matmul-like kernel (plan.TilePlan) whose X and Y are read from buffers of `dtype_in`."""

    tile: TilePlan
    core: TensorCore
    dtype_in: DType


def fragment_dtype(operand: UOp) -> DType | None:
    """The dtype a tensor core can read `operand` in: a buffer of half or bfloat16 seen through
    movement ops and casts to a wider float (which change no value). None otherwise."""
    node = operand
    while node.op in MOVEMENT or (node.op is Ops.CAST and dtypes.is_float(node.dtype)
                                  and node.dtype.itemsize > node.src[0].dtype.itemsize):
        node = node.src[0]
    if node.op is Ops.DEFINE_GLOBAL and node.dtype in FRAGMENT_DTYPES:
        return node.dtype
    return None


def why_no_tensor_core(ast: UOp) -> str | None:
    """None when `tensor_core_plan` has a plan for this kernel, else the reason in words."""
    tile = tile_plan(ast)  # the widening cast of a half/bf16 sum seen through
    if tile is None:
        return ("a tensor core needs a matmul-like kernel: one sum over one axis of a product "
                "X * Y, X constant along the output's last axis, Y along the one before")
    x_dtype, y_dtype = fragment_dtype(tile.x), fragment_dtype(tile.y)
    names = "/".join(d.name for d in FRAGMENT_DTYPES)
    if x_dtype is None or x_dtype != y_dtype:
        return (f"a tensor core reads both operands from {names} buffers (through movement "
                f"ops and widening casts only); got {tile.x.dtype.name} and {tile.y.dtype.name}")
    if not dtypes.is_float(tile.reduce.dtype):
        return "a tensor core sums floats"
    return None


def tensor_core_plan(ast: UOp) -> TensorCorePlan | None:
    """The plan of a kernel that M16N8K16 can compute, or None (`why_no_tensor_core` says why).
    Any sizes: the edges of the tiles are padded with zeros."""
    if why_no_tensor_core(ast) is not None:
        return None
    tile = tile_plan(ast)  # the widening cast of a half/bf16 sum seen through
    assert tile is not None
    dtype_in = fragment_dtype(tile.x)
    assert dtype_in is not None
    return TensorCorePlan(tile, M16N8K16, dtype_in)


def worth_a_tensor_core(ast: UOp) -> bool:
    """The heuristic's rule: a half or bfloat16 matmul at least one tile big on every axis."""
    plan = tensor_core_plan(ast)
    if plan is None:
        return False
    shape, core, tile = plan.tile.reduce.src[0].shape, plan.core, plan.tile
    return shape[tile.m_axis] >= core.m and shape[tile.n_axis] >= core.n and \
        shape[tile.k_axis] >= core.k


# ---- lowering: outputs, fragments and the instruction ----

def _lane(core: TensorCore) -> UOp:
    return UOp(Ops.SPECIAL, dtypes.int32, (), ("l", 0, core.threads))




@dataclass
class TensorCoreLowering:
    """How one kernel's outputs and its one reduction run on warps (codegen/lower.py asks it).

    The output's last two axes longer than 1 are tiled by 16 (rows) and 8 (columns): one
    work-group per tile (loops over groups, kind 'w'), other output axes a work-group each.
    Thread `lane` computes the 4 outputs of its D fragment (`output_indices`, one per
    element); the reduction becomes a loop over steps of 16 along k (`reduce`)."""

    plan: TensorCorePlan
    shape: tuple[int, ...]  # the kernel's output shape

    @cached_property
    def tile_loops(self) -> dict[int, UOp]:
        """A loop over work-groups for each output axis longer than 1 (the last two count
        tiles, the others elements)."""
        core, kept = self.plan.core, self.kept_output_axes
        loops = {}
        for axis in kept:
            per_group = {kept[-2]: core.m, kept[-1]: core.n}.get(axis, 1)
            loops[axis] = UOp(Ops.RANGE, dtypes.int32, (), ("w", axis,
                                                             -(-self.shape[axis] // per_group)))
        return loops

    @property
    def kept_output_axes(self) -> list[int]:
        return [axis for axis, size in enumerate(self.shape) if size > 1]

    @cached_property
    def output_indices(self) -> list[Index]:
        """One output index per element j of the D fragment: (row, column) from `c_cell`."""
        core, kept, lane = self.plan.core, self.kept_output_axes, _lane(self.plan.core)
        indices = []
        for j in range(core.c_elements):
            row, column = core.c_cell(lane, j)
            offsets = {kept[-2]: self.tile_loops[kept[-2]] * core.m + row,
                       kept[-1]: self.tile_loops[kept[-1]] * core.n + column}
            indices.append(tuple(offsets.get(axis, self.tile_loops.get(axis, index_const(0)))
                                 for axis in range(len(self.shape))))
        return indices

    def _source_index(self, m_entry: UOp, n_entry: UOp, k_entry: UOp) -> list[UOp]:
        """An index into the reduction's source: m, n and k as given, other axes longer than 1
        follow the output's axes in order (plan.local_tile_plan checked they match)."""
        tile = self.plan.tile
        source_shape = tile.reduce.src[0].shape
        batch = iter(self.tile_loops[axis] for axis in self.kept_output_axes[:-2])
        entries = {tile.m_axis: m_entry, tile.n_axis: n_entry, tile.k_axis: k_entry}
        index = []
        for axis, size in enumerate(source_shape):
            if axis in entries:
                index.append(entries[axis])
            else:
                index.append(next(batch) if size > 1 else index_const(0))
        return index

    def fragment_tasks(self, k_step: UOp) -> list[tuple[UOp, Index, Valid]]:
        """What to lower for this thread's fragments at step `k_step`: its A elements (X at
        (row, k)), then its B elements (Y at (k, column)), each valid inside the matrices."""
        core, tile, kept = self.plan.core, self.plan.tile, self.kept_output_axes
        lane, zero = _lane(core), index_const(0)
        shape = tile.reduce.src[0].shape
        rows, columns = self.tile_loops[kept[-2]] * core.m, self.tile_loops[kept[-1]] * core.n
        tasks = []
        for i in range(core.a_elements):
            row, k = core.a_cell(lane, i)
            m_entry, k_entry = rows + row, k_step * core.k + k
            valid = and_valid(below(m_entry, shape[tile.m_axis]),
                              below(k_entry, shape[tile.k_axis]))
            tasks.append((tile.x, tuple(self._source_index(m_entry, zero, k_entry)), valid))
        for i in range(core.b_elements):
            k, column = core.b_cell(lane, i)
            n_entry, k_entry = columns + column, k_step * core.k + k
            valid = and_valid(below(n_entry, shape[tile.n_axis]),
                              below(k_entry, shape[tile.k_axis]))
            tasks.append((tile.y, tuple(self._source_index(zero, n_entry, k_entry)), valid))
        return tasks

    def k_steps(self, number: int) -> UOp:
        """The loop over steps of k (a reduction loop, ridx`number`)."""
        k_size = self.plan.tile.reduce.src[0].shape[self.plan.tile.k_axis]
        return UOp(Ops.RANGE, dtypes.int32, (), ("r", number, -(-k_size // self.plan.core.k)))

    def reduce(self, node: UOp, output_index: Index, k_step: UOp,
               values: list[UOp], tasks: list[tuple[UOp, Index, Valid]]) -> UOp:
        """The lowered reduction for the output at `output_index`: the sum over the k steps of
        this thread's element of the warp's WMMA, in float32, cast to the reduction's dtype.
        `values` are the lowered `fragment_tasks` (padding outside the matrices reads 0)."""
        plan, element = self.plan, self.output_indices.index(output_index)
        fragments = tuple(guarded(value, valid).cast(plan.dtype_in)
                          for value, (_, _, valid) in zip(values, tasks))
        arg = WMMAArg(plan.core, plan.dtype_in, dtypes.float32, element)
        wmma = UOp(Ops.WMMA, dtypes.float32, fragments, arg)
        total = UOp(Ops.REDUCE, dtypes.float32, (wmma, k_step), Ops.ADD)
        return total.cast(node.dtype)


def _warp(block: TensorCoreBlock) -> UOp:
    return UOp(Ops.SPECIAL, dtypes.int32, (), ("l", 1, block.warp_count))


def _contiguous_along(operand: UOp, axis: int) -> bool:
    """Does every buffer `operand` reads move by one element along `axis` of its shape?"""
    loops = tuple(UOp(Ops.RANGE, dtypes.int32, (), ("r", k, size))
                  for k, size in enumerate(operand.shape))
    steps = [step_along(chain, loops, loops[axis]) for chain in buffer_reads(operand)]
    return bool(steps) and all(step == 1 for step in steps)


@dataclass
class StagedTensorCoreLowering(TensorCoreLowering):
    """Tensor cores fed from shared memory: one work-group per block of outputs
    (TensorCoreBlock), the last two output axes tiled by `block.rows` and `block.columns`.

    Thread (lane lidx0, warp lidx1) computes 4 outputs of each of its warp's tiles. Per step
    of k: a barrier (slower warps have read the last step's slices), every thread copies its
    elements of both k-slices into shared memory (`fragment_tasks` are those global loads),
    a barrier, then each warp loads its fragments from shared memory and runs one WMMA per
    tile; the accumulators sum them in float32."""

    block: TensorCoreBlock

    @cached_property
    def tile_loops(self) -> dict[int, UOp]:
        """A loop over work-groups for each output axis longer than 1 (the last two count
        blocks, the others elements)."""
        kept = self.kept_output_axes
        per_group = {kept[-2]: self.block.rows, kept[-1]: self.block.columns}
        return {axis: UOp(Ops.RANGE, dtypes.int32, (),
                          ("w", axis, -(-self.shape[axis] // per_group.get(axis, 1))))
                for axis in kept}

    @cached_property
    def output_cells(self) -> list[tuple[int, int, int]]:
        """(tile along m, tile along n, element of D) of each output index, in order."""
        tiles_m, tiles_n = self.block.tiles
        return [(tile_m, tile_n, j) for tile_m in range(tiles_m) for tile_n in range(tiles_n)
                for j in range(self.plan.core.c_elements)]

    @cached_property
    def output_indices(self) -> list[Index]:
        core, kept, block = self.plan.core, self.kept_output_axes, self.block
        lane, warp = _lane(core), _warp(block)
        indices = []
        for tile_m, tile_n, j in self.output_cells:
            origin_row, origin_column = block.tile_origin(warp, tile_m, tile_n)
            row, column = core.c_cell(lane, j)
            offsets = {kept[-2]: self.tile_loops[kept[-2]] * block.rows + origin_row + row,
                       kept[-1]: self.tile_loops[kept[-1]] * block.columns + origin_column +
                       column}
            indices.append(tuple(offsets.get(axis, self.tile_loops.get(axis, index_const(0)))
                                 for axis in range(len(self.shape))))
        return indices

    @cached_property
    def shared(self) -> tuple[UOp, UOp]:
        """The k-slices of X and Y in shared memory (local0, local1)."""
        dtype = self.plan.dtype_in
        return (UOp(Ops.DEFINE_LOCAL, dtype, (), (0, self.block.a_size)),
                UOp(Ops.DEFINE_LOCAL, dtype, (), (1, self.block.b_size)))

    def _thread(self) -> UOp:
        return _warp(self.block) * self.plan.core.threads + _lane(self.plan.core)

    def staging(self) -> list[tuple[UOp, tuple, Valid]]:
        """Each element this thread copies per step: (operand, its cell in the slice,
        whether it exists: the last round of copies may have fewer elements than threads)."""
        tile, block = self.plan.tile, self.block
        k_fastest = _contiguous_along(tile.x, tile.k_axis)
        columns_fastest = _contiguous_along(tile.y, tile.n_axis)
        copies = []
        for operand, count in ((tile.x, block.a_elements), (tile.y, block.b_elements)):
            for j in range(block.loads_per_thread(count)):
                element = self._thread() + j * block.threads
                within = None if (j + 1) * block.threads <= count else element.lt(count)
                cell = block.a_staging_cell(element, k_fastest) if operand is tile.x \
                    else block.b_staging_cell(element, columns_fastest)
                copies.append((operand, cell, within))
        return copies

    def fragment_tasks(self, k_step: UOp) -> list[tuple[UOp, Index, Valid]]:
        """The global loads of this thread's copies at step `k_step`, each valid inside the
        matrices (the padding past an edge is copied as 0)."""
        core, tile, kept, block = self.plan.core, self.plan.tile, self.kept_output_axes, \
            self.block
        shape, zero = tile.reduce.src[0].shape, index_const(0)
        rows = self.tile_loops[kept[-2]] * block.rows
        columns = self.tile_loops[kept[-1]] * block.columns
        tasks = []
        for operand, cell, within in self.staging():
            if operand is tile.x:
                m_entry, k_entry = rows + cell[0], k_step * core.k + cell[1]
                valid = and_valid(within, and_valid(below(m_entry, shape[tile.m_axis]),
                                                    below(k_entry, shape[tile.k_axis])))
                index = self._source_index(m_entry, zero, k_entry)
            else:
                n_entry, k_entry = columns + cell[1], k_step * core.k + cell[0]
                valid = and_valid(within, and_valid(below(n_entry, shape[tile.n_axis]),
                                                    below(k_entry, shape[tile.k_axis])))
                index = self._source_index(zero, n_entry, k_entry)
            tasks.append((operand, tuple(index), valid))
        return tasks

    def _staged(self, k_step: UOp, values: list[UOp],
                tasks: list[tuple[UOp, Index, Valid]]) -> UOp:
        """The barrier after this step's copies into shared memory (a barrier before them too:
        no warp still reads the previous step's slices)."""
        step_start = UOp(Ops.BARRIER, dtypes.bool, (k_step,))
        a_memory, b_memory = self.shared
        stores = []
        for value, (_, _, valid), (operand, cell, within) in zip(values, tasks, self.staging()):
            is_a = operand is self.plan.tile.x
            memory = a_memory if is_a else b_memory
            slot = self.block.a_slot(*cell) if is_a else self.block.b_slot(*cell)
            stored = guarded(value, valid).cast(self.plan.dtype_in)
            gate = () if within is None else (within,)
            stores.append(UOp(Ops.STORE, stored.dtype, (memory, slot, stored, *gate,
                                                        step_start)))
        return UOp(Ops.BARRIER, dtypes.bool, tuple(stores))

    def reduce(self, node: UOp, output_index: Index, k_step: UOp,
               values: list[UOp], tasks: list[tuple[UOp, Index, Valid]]) -> UOp:
        """This output's element of its tile's WMMA, with fragments read from shared memory,
        summed over the k steps in float32 and cast to the reduction's dtype."""
        plan, block, core = self.plan, self.block, self.plan.core
        tile_m, tile_n, element = self.output_cells[self.output_indices.index(output_index)]
        staged = self._staged(k_step, values, tasks)
        lane, (a_memory, b_memory) = _lane(core), self.shared
        origin_row, origin_column = block.tile_origin(_warp(block), tile_m, tile_n)
        fragments = []
        for i in range(core.a_elements):
            row, k = core.a_cell(lane, i)
            fragments.append(UOp(Ops.LOAD, plan.dtype_in,
                                 (a_memory, block.a_slot(origin_row + row, k), staged)))
        for i in range(core.b_elements):
            k, column = core.b_cell(lane, i)
            fragments.append(UOp(Ops.LOAD, plan.dtype_in,
                                 (b_memory, block.b_slot(k, origin_column + column), staged)))
        arg = WMMAArg(core, plan.dtype_in, dtypes.float32, element)
        wmma = UOp(Ops.WMMA, dtypes.float32, tuple(fragments), arg)
        total = UOp(Ops.REDUCE, dtypes.float32, (wmma, k_step), Ops.ADD)
        return total.cast(node.dtype)


def tensor_core_lowering(ast: UOp, block: tuple[int, ...] = ()) -> TensorCoreLowering:
    """The lowering of a kernel under KernelOptions(tensor_core=True): one warp per tile, or
    with `block` (KernelOptions.tensor_core_block) a block of warps fed from shared memory. A
    ValueError says why a kernel cannot have one."""
    reason = why_no_tensor_core(ast)
    if reason is not None:
        raise ValueError(reason)
    plan = tensor_core_plan(ast)
    assert plan is not None
    if block:
        return StagedTensorCoreLowering(plan, kernel_value(ast).shape,
                                        tensor_core_block(plan.core, block))
    return TensorCoreLowering(plan, kernel_value(ast).shape)


def instructions(uops: list[UOp]) -> dict[tuple[tuple[UOp, ...], WMMAArg], list[UOp]]:
    """The WMMA nodes of a program by instruction (the same sources and instruction arg)."""
    found: dict[tuple[tuple[UOp, ...], WMMAArg], list[UOp]] = {}
    for u in uops:
        if u.op is Ops.WMMA:
            found.setdefault((u.src, u.arg.instruction), []).append(u)
    return found
