"""Chapter 7: lowering — from a kernel AST to loops, accumulators and index arithmetic.

What this teaches:
- a kernel computes every element of its output: one loop per output axis (`gidx0`, `gidx1`);
- lowering walks the AST from the store down, carrying the *index* being computed. Elementwise
  ops keep the index; movement ops change it (chapter 4); a reduction opens new loops
  (`ridx0`) over the axes it reduces and accumulates into a register; a buffer becomes a LOAD
  from `index_into_buffer`, guarded by a condition when padding may make it invalid;
- the symbolic rewrite rules (chapter 5) then tidy the index arithmetic;
- `linearize` orders the graph into a straight-line program: open loops, compute, accumulate,
  close loops. Work that does not depend on an inner loop is placed outside it;
- with a vector tile (opt/), one output axis is indexed by a *lane* that stands for 16
  columns at once; `vectorize` turns what depends on it into vector values (DType.vec): a load
  at `base + lane` becomes one vector load at `base`, and float math on it vector math.

- with a group reduction (opt/, GPU devices), each output is computed by a whole work-group:
  its output loops are loops over groups (kind 'w'), each thread (`SPECIAL` lidx0) sums a
  strided slice of the reduced axis, and the partial sums meet in shared memory
  (`DEFINE_LOCAL`), separated by `BARRIER`s, combined by a tree or by thread 0.
- with a local tile (opt/, GPU devices), a matmul-like kernel gives each tile of outputs a
  work-group, thread (lidx1, lidx0) computing output (row, column) of the tile. The reduction
  is two loops: over steps of the tile size (`ridx0`), in which every thread copies one element
  of X and one of Y into shared memory, then a barrier, then the sum of a row of the one tile
  times a column of the other (`ridx1`). A barrier at the top of each step keeps the copies of
  the next step from overwriting what slower threads still read. With a block of r x r
  outputs per thread (`tile_upcast`), a thread copies r elements of each operand per step,
  and its inner loop reads r + r values for r * r multiply-adds.
- with tensor cores (opt/, codegen/wmma.py), each 16 x 8 tile of outputs is a work-group of one
  warp; each thread's 4 outputs are its elements of the warp's D fragment, and the reduction
  is a loop over steps of 16 along k whose body is the thread's fragment loads and a `WMMA`.

The result, a `LinearProgram`, is what every renderer (chapter 8) turns into source code.

Builds on: ir/uop.py, ir/view.py, ir/rewrite.py. Used by: render/, engine/realize.py.

>>> from tinyteach import Tensor
>>> from tinyteach.engine.schedule import create_schedule
>>> x = Tensor.ones(4, 8).realize()
>>> item = create_schedule([x.sum(axis=1).uop], "CPU")[0][0]
>>> print(lower(item.ast, NO_OPTIONS))  # doctest: +NORMALIZE_WHITESPACE
%0   DEFINE_GLOBAL float32  () (0, 4)
%1   DEFINE_GLOBAL float32  () (1, 32)
%2   RANGE         int32    () ('g', 0, 4)
%3   CONST         int32    () 8
%4   MUL           int32    (%2, %3)
%5   CONST         float32  () 0.0
%6   DEFINE_ACC    float32  (%5) 0
%7   RANGE         int32    () ('r', 0, 8)
%8   ADD           int32    (%4, %7)
%9   LOAD          float32  (%1, %8)
%10  ACCUMULATE    float32  (%6, %9) Ops.ADD
%11  END_RANGE     bool     (%7)
%12  REDUCE        float32  (%9, %7) Ops.ADD
%13  STORE         float32  (%0, %2, %12)
%14  END_RANGE     bool     (%2)
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from tinyteach.codegen.lower_gpu import GPULowering, row_output_index, tile_output_indices
from tinyteach.codegen.plan import (
    NO_OPTIONS,
    KernelOptions,
    TilePlan,
    can_group_reduce,
    index_value,
    row_kernel_axis,
    tile_plan,
)
from tinyteach.codegen.wmma import TensorCoreLowering, tensor_core_lowering
from tinyteach.dtype import dtypes
from tinyteach.helpers import NOOPT, LRUCache, register_memo, remember
from tinyteach.ir.rewrite import (
    graph_rewrite,
    recording,
    simplify_given_valid,
    sum_terms,
    symbolic,
)
from tinyteach.ir.uop import (
    ALU,
    COMPARISONS,
    MOVEMENT,
    Ops,
    UOp,
    identity_element,
    make_range,
    sym_max,
    variables_of,
)
from tinyteach.ir.view import (
    Combine,
    Index,
    Task,
    Valid,
    and_valid,
    below,
    guarded,
    index_add,
    index_const,
    index_into_buffer,
    linear_index,
    view_index,
)
from tinyteach.settings import FIXED_LANES


@dataclass
class _Lowerer(GPULowering):
    """Turns the value graph of one kernel into index-carrying ALU, LOAD and REDUCE nodes.
    `group`: threads of a work-group that share each reduction (0: one thread per output)."""

    group: int = 0
    group_combine: str = "tree"
    group_top: bool = False  # each thread of the group sums a contiguous slice (GROUPTOP)
    unrolls: dict[int, int] = field(default_factory=dict)  # reduced axis -> elements per step
    rows: bool = False  # a kernel over whole rows: one work-group per row (row_output_index)
    tile: TilePlan | None = None  # a local tile: how the kernel splits (plan.local_tile_plan)
    tile_size: int = 0
    tile_upcast: int = 1  # a local tile's r x r block of outputs per thread
    tile_indices: dict[tuple[int, int], Index] = field(default_factory=dict)  # (i, j) -> output
    tile_position: tuple[int, int] = (0, 0)  # where output_index lies in the thread's block
    tile_stages: dict[UOp, tuple[UOp, UOp, UOp]] = field(default_factory=dict)  # per reduction
    output_index: Index = ()  # the output element this thread computes (for a local tile)
    tensor_core: TensorCoreLowering | None = None  # tensor cores: the reduction is WMMAs
    reduce_count: int = 0
    local_count: int = 0
    group_results: list[UOp] = field(default_factory=list)  # each group reduction's result
    memo: dict[tuple[UOp, Index, Valid], UOp] = field(default_factory=dict)
    # one set of loops per reduction: evaluated at several indices (an upcast tile), it still
    # loops once, and the linearizer puts all reductions over the same loops in one loop nest
    reduce_ranges: dict[UOp, list[UOp]] = field(default_factory=dict)

    def lower(self, node: UOp, index: Index, valid: Valid) -> UOp:
        """`node`'s value at `index`; `valid`: where the element exists (padding), or None.
        An explicit stack instead of recursion: a kernel may be a 100,000-op chain. Each task
        is planned (what it needs lowered first, and how to combine those), then finished."""
        root: Task = (node, index, valid)
        plans: dict[Task, tuple[list[Task], Combine]] = {}
        stack = [root]
        while stack:
            task = stack[-1]
            if task in self.memo:
                stack.pop()
                continue
            if task not in plans:  # first visit: plan it, lower what it needs first
                plans[task] = self._plan(*task)
                stack.extend(reversed([t for t in plans[task][0] if t not in self.memo]))
                continue
            stack.pop()
            needs, combine = plans.pop(task)
            self.memo[task] = combine([self.memo[t] for t in needs])
        return self.memo[root]

    def _plan(self, node: UOp, index: Index, valid: Valid) -> tuple[list[Task], Combine]:
        """What lowering `node` at `index` needs lowered first, and how to combine those."""
        if node.op in (Ops.CONST, Ops.DEFINE_VAR):  # (a Variable's value: the same everywhere)
            return [], lambda values: node
        if node.op is Ops.DEFINE_GLOBAL or (node.op in MOVEMENT and _reads_buffer_directly(node)):
            load = self._load(node, index, valid)
            return [], lambda values: load
        if node.op in MOVEMENT:
            inner_index, condition = view_index(node, index)
            return [(node.src[0], inner_index, and_valid(valid, condition))], \
                lambda values: guarded(values[0], condition)
        if node.op is Ops.REDUCE_AXIS:
            if self.rows and valid is not None:  # (the column guard: the same row's reduction)
                return [(node, index, None)], lambda values: values[0]
            return self._plan_reduce(node, index, valid)
        if node.op in ALU:  # (the arg too: a CAST's BITCAST keeps the bits)
            return [(s, index, valid) for s in node.src], \
                lambda values: UOp(node.op, node.dtype, tuple(values), node.arg)
        raise NotImplementedError(f"cannot lower {node.op.name}")

    def _load(self, node: UOp, index: Index, valid: Valid) -> UOp:
        define, position, condition = index_into_buffer(node, index)
        condition = and_valid(valid, condition)
        position = simplify_given_valid(position, condition)  # (read only where it holds)
        sources = (define, position) if condition is None else (define, position, condition)
        return UOp(Ops.LOAD, node.dtype, sources)

    def _plan_reduce(self, node: UOp, index: Index, valid: Valid) -> tuple[list[Task], Combine]:
        """A reduction's source is lowered at the index with its loops in the reduced axes."""
        if self.group:
            return self._plan_group_reduce(node, index, valid)
        if self.tile is not None:
            return self._plan_tile_reduce(node)
        if self.tensor_core is not None:
            return self._plan_tensor_core_reduce(node)
        reduce_op, axes = node.arg
        source_shape = node.src[0].shape
        unrolled = [self.unrolls.get(k, 1) for k in range(len(axes))]
        if node not in self.reduce_ranges:
            for k, (axis, unroll) in enumerate(zip(axes, unrolled)):
                size = source_shape[axis]
                if unroll > 1 and isinstance(size, int) and size % unroll:
                    raise ValueError(f"unroll of reduced axis {k} by {unroll}: the amount does "
                                     f"not divide the axis's size {size}")
            self.reduce_ranges[node] = [make_range("r", self.reduce_count + k,
                                                   source_shape[axis] if unroll == 1
                                                   else source_shape[axis] // unroll)
                                        for k, (axis, unroll) in enumerate(zip(axes, unrolled))]
            self.reduce_count += len(axes)
        ranges = self.reduce_ranges[node]
        tasks = []  # UNROLL: each step reads `unroll` consecutive elements, combined in order
        for offsets in itertools.product(*(range(unroll) for unroll in unrolled)):
            inner_index = list(index)
            for axis, loop, unroll, offset in zip(axes, ranges, unrolled, offsets):
                inner_index[axis] = loop if unroll == 1 else loop * unroll + offset
            tasks.append((node.src[0], tuple(inner_index), valid))

        def combine(values: list[UOp]) -> UOp:
            step = values[0]
            for value in values[1:]:
                step = UOp(reduce_op, node.dtype, (step, value))
            return UOp(Ops.REDUCE, node.dtype, (step, *ranges), reduce_op)
        return tasks, combine



def _reads_buffer_directly(node: UOp) -> bool:
    while node.op in MOVEMENT:
        node = node.src[0]
    return node.op is Ops.DEFINE_GLOBAL


def output_indices(shape: tuple[int, ...], options: KernelOptions) -> list[Index]:
    """The output index of every element one loop iteration computes. Without upcasts that is
    one index, (gidx0, gidx1, ...); an axis upcast by 4 loops over size/4 and contributes
    gidx*4 + 0, ..., gidx*4 + 3, so the iteration computes a whole tile. With vectors of 16
    lanes, an axis upcast by 32 contributes gidx*32 + lane and gidx*32 + 16 + lane: `lane`
    stands for all 16 lanes at once (`vectorize` below)."""
    if options.local_tile:
        return list(tile_output_indices(shape, options.local_tile, options.tile_upcast).values())
    if options.tensor_core:
        raise ValueError("with tensor cores the outputs are the warp's fragments: "
                         "wmma.TensorCoreLowering.output_indices")
    factors, padded = dict(options.upcasts), dict(options.padded)
    vector_axis = options.upcasts[-1][0] if options.vector_width else None
    output_kind = "w" if options.group else "g"  # with a group reduction: one group per output
    per_axis: list[list[UOp]] = []
    for axis, size in enumerate(shape):
        factor = factors.get(axis, 1)
        size = padded.get(axis, size)  # PADTO: the loop runs past the end, guarded (_lower_ast)
        _check_upcast(axis, size, factor, options.vector_width if axis == vector_axis else 0)
        if size == 1:
            per_axis.append([index_const(0)])
        elif factor == 1:
            per_axis.append([make_range(output_kind, axis, size)])
        elif axis == vector_axis:
            base = make_range("g", axis, size // factor) * factor
            lane = make_range("v", axis, options.vector_width)
            per_axis.append([index_add(index_add(base, index_const(offset)), lane)
                             for offset in range(0, factor, options.vector_width)])
        else:
            base = make_range("g", axis, size // factor) * factor
            per_axis.append([index_add(base, index_const(offset)) for offset in range(factor)])
    return [tuple(combination) for combination in itertools.product(*per_axis)]


def _check_upcast(axis: int, size: int, factor: int, lanes: int) -> None:
    """An upcast computes `factor` whole elements of the axis per iteration: the factor divides
    the axis (a PADTO to a multiple first, else the last iteration would read past the end and
    the loop would skip the rest), and a vector axis's factor is whole vectors."""
    if factor > 1 and isinstance(size, int) and size % factor:
        raise ValueError(f"upcast of axis {axis} by {factor}: the factor does not divide the "
                         f"axis's size {size} (pad the axis to a multiple first: PADTO)")
    if lanes and factor % lanes:
        raise ValueError(f"vectors of {lanes} lanes along axis {axis}: its upcast by {factor} "
                         f"is not a whole number of vectors")


def _inside_output(index: Index, shape: tuple[int, ...]) -> UOp | None:
    """Where a tile's thread has an output element (threads past the edge have none)."""
    inside = None
    for entry, length in zip(index, shape):
        inside = and_valid(inside, below(entry, length))
    return inside


_lowered: LRUCache[tuple[UOp, KernelOptions], UOp] = LRUCache("lower.lowered", limit=256)


def lower_ast(ast: UOp, options: KernelOptions = NO_OPTIONS) -> UOp:
    """SINK(STORE(out, value)) -> SINK(STORE(out, index, lowered value), ...) over loops:
    one STORE per element of the tile each loop iteration computes.

    Remembered by (kernel, options): UOps are immutable, so the same kernel lowers the same
    way, and a kernel is often lowered twice with the same options: once when the scheduler's
    packing decides whether it is a vector tile (opt/pack.py), once when it is compiled."""
    if recording():  # every rewrite is watched: do them all again
        return _lower_ast(ast, options)
    return remember(_lowered, (ast, options), lambda: _lower_ast(ast, options))


def _lower_ast(ast: UOp, options: KernelOptions) -> UOp:
    store = ast.src[0]
    output, value = store.src
    if options.group and not can_group_reduce(ast):
        raise ValueError("a group reduction needs a kernel whose (non-bool) reductions all "
                         "reduce the same axes of the same shape")
    tile = tile_plan(ast) if options.local_tile else None
    if options.local_tile and tile is None:
        raise ValueError("a local tile needs a matmul-like kernel: one sum over one axis of a "
                         "product X * Y, X constant along the output's last axis, Y along "
                         "the one before")
    lowerer = _Lowerer(options.group, options.group_combine, options.group_top,
                       dict(options.unrolls), tile=tile,
                       tile_size=options.local_tile, tile_upcast=options.tile_upcast)
    row_axis = row_kernel_axis(ast) if options.group else None
    if row_axis is not None:
        return _lower_rows(lowerer, ast, row_axis)
    lowerer.tensor_core = tensor_core_lowering(ast, options.tensor_core_block) \
        if options.tensor_core else None
    indices = lowerer.tensor_core.output_indices if lowerer.tensor_core is not None \
        else output_indices(value.shape, options)
    if tile is not None:
        lowerer.tile_indices = tile_output_indices(value.shape, options.local_tile,
                                                   options.tile_upcast)
        indices = list(lowerer.tile_indices.values())
    places = list(lowerer.tile_indices) or [(0, 0)] * len(indices)
    stores = []
    for index, place in zip(indices, places):
        gated = tile is not None or lowerer.tensor_core is not None or bool(options.padded)
        inside = _inside_output(index, value.shape) if gated else None
        lowerer.output_index, lowerer.tile_position = index, place
        lowered = lowerer.lower(value, index, inside)
        position = linear_index(index, value.shape)
        gate = () if inside is None else (inside,)
        stores.append(UOp(Ops.STORE, value.dtype, (output, position, lowered, *gate,
                                                   *lowerer._group_store_sources())))
    return graph_rewrite(UOp(Ops.SINK, dtypes.bool, tuple(stores)), symbolic,
                         memo=_symbolic_memo)


# ---- a kernel over whole rows: one work-group per row ----


def _lower_rows(lowerer: _Lowerer, ast: UOp, row_axis: int) -> UOp:
    """A fused row chain (softmax, layernorm) on a GPU: each reduction of the chain is a group
    reduction of the row's work-group (partials in shared memory, a barrier, a tree), computed
    once per row; after the last barrier every thread stores its columns of the row."""
    output, value = ast.src[0].src
    lowerer.rows = True
    index, inside = row_output_index(value.shape, row_axis, lowerer.group)
    lowered = lowerer.lower(value, index, inside)
    gate = () if inside is None else (inside,)
    # the last barrier: every thread has read the row's results before the group's next row
    # writes new partials over them
    done = UOp(Ops.BARRIER, dtypes.bool, tuple(lowerer.group_results))
    store = UOp(Ops.STORE, value.dtype, (output, linear_index(index, value.shape), lowered,
                                         *gate, done))
    return graph_rewrite(UOp(Ops.SINK, dtypes.bool, (store,)), symbolic, memo=_symbolic_memo)


_symbolic_memo: dict[UOp, UOp] = register_memo("lower.symbolic", {})  # every kernel's index math


# ---- vectorize: the lane loop becomes vector values ----

VECTOR_ALU = {Ops.ADD, Ops.MUL, Ops.NEG, Ops.MAX, Ops.RECIPROCAL, Ops.FDIV, Ops.WHERE,
              Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT}
MASK_LOGIC = (Ops.AND, Ops.OR, Ops.XOR)  # on bools: they combine comparisons' masks


def vectorize(lowered: UOp) -> UOp | None:
    """Replace the lane index (a RANGE of kind 'v') by vectors: a load at `base + lane` becomes
    one vector load at `base`, float math on it becomes vector math, a sum of vectors keeps a
    vector accumulator, and the store writes the whole vector. A comparison of float vectors
    gives a mask (a vector of bools) that WHERE picks with. Returns None (and the kernel stays
    scalar) when something depends on the lane in another way: a lane-dependent padding guard,
    a gather, an int value computed per lane, or a bool that is not a mask of floats."""
    lanes = [n for n in lowered.toposort if n.op is Ops.RANGE and n.arg[0] == "v"]
    if not lanes:
        return lowered
    lane, memo = lanes[0], dict[UOp, frozenset[UOp]]()
    done: dict[UOp, UOp] = {}
    for node in lowered.toposort:
        if lane not in ranges_of(node, memo) or node is lane:
            done[node] = node  # the same for every lane (or an index, handled by its load)
            continue
        sources = [done[s] for s in node.src]
        if node.op in (Ops.LOAD, Ops.STORE):
            base = _base_of_lane_index(node.src[1], lane)
            guard_per_lane = len(node.src) == 3 and node.op is Ops.LOAD and \
                lane in ranges_of(node.src[2], memo)
            scalar_store = node.op is Ops.STORE and sources[2].dtype.count == 1
            if base is None or guard_per_lane or scalar_store or not dtypes.is_float(node.dtype):
                return None
            dtype = node.dtype.vec(lane.arg[2]) if node.op is Ops.LOAD else node.dtype
            done[node] = UOp(node.op, dtype, (sources[0], base, *sources[2:]), node.arg)
        elif _has_vector_form(node):
            per_lane = [s for s, new in zip(node.src, sources)
                        if lane in ranges_of(s, memo) and new.dtype.count == 1]
            if per_lane:
                return None  # e.g. an index turned into a float: it would need int vectors
            done[node] = UOp(node.op, node.dtype.vec(lane.arg[2]), tuple(sources), node.arg)
        elif node.op is Ops.SINK:
            done[node] = UOp(Ops.SINK, node.dtype, tuple(sources))
        elif dtypes.is_int(node.dtype):
            done[node] = node  # index arithmetic: only a load's or store's position uses it
        else:
            return None
    result = done[lowered]
    if lane in ranges_of(result, memo):  # (UOps are hash-consed: the memo holds for new ones)
        return None  # a lane-dependent index reached something that is not a load or store
    return result


def _has_vector_form(node: UOp) -> bool:
    """Float math, and the masks that choose between floats: a comparison of floats gives a
    vector of bools (one per lane), and AND, OR, XOR and comparisons combine such masks.
    WHERE with a mask vector picks lane by lane. Integers stay scalar: they are positions."""
    if node.op in VECTOR_ALU | {Ops.REDUCE}:
        return dtypes.is_float(node.dtype)
    if node.op in COMPARISONS:  # (of two masks: `mask != True` is NOT)
        return dtypes.is_float(node.src[0].dtype) or node.src[0].dtype == dtypes.bool
    return node.op in MASK_LOGIC and node.dtype == dtypes.bool


def _base_of_lane_index(index: UOp, lane: UOp) -> UOp | None:
    """`base + lane` -> base, when `lane` is one term of the sum and appears nowhere else:
    then the lanes read consecutive elements, and one vector load at `base` reads them all."""
    terms = sum_terms(index)
    if terms.count(lane) != 1:
        return None
    rest = [t for t in terms if t is not lane]
    if any(lane in t.toposort for t in rest):
        return None
    base = index_const(0)
    for term in rest:
        base = base + term
    return graph_rewrite(base, symbolic, memo=_symbolic_memo)  # (the lanes' loads share terms)



# ---- linearize: a graph with loops -> a straight-line program ----

# loops over output elements: by thread ('g'), by work-group ('w'), by a thread of a row's group
OUTPUT_KINDS = ("g", "w", "c")

@dataclass
class LinearProgram:
    """The ordered UOps of one kernel, ready for a renderer."""

    uops: list[UOp]
    global_sizes: tuple[int, ...]
    accumulators: dict[UOp, UOp] = field(default_factory=dict)  # REDUCE -> its DEFINE_ACC
    options: KernelOptions = NO_OPTIONS
    # innermost reduction loops whose sums may be split into vector lanes -> their accumulators
    simd_loops: dict[UOp, list[UOp]] = field(default_factory=dict)
    # the Variables of a kernel over symbolic sizes, by name: each is an `int` parameter after
    # the buffers, and a loop's bound may be one (`for (int gidx0 = 0; gidx0 < i; ...)`)
    variables: tuple[UOp, ...] = ()

    @property
    def applied_opts(self) -> list[str]:
        """Every optimization this program carries, in plain words (DEBUG=3, viz)."""
        lanes = [f"vector lanes: the {self._reduction_words(loop)} over ridx{loop.arg[1]} is "
                 "split across SIMD lanes" for loop in self.simd_loops]
        return self.options.describe() + lanes

    def _reduction_words(self, loop: UOp) -> str:
        """'sum', 'max' or 'sum and max': what a lane loop's accumulators reduce."""
        ops = {r.arg for r, acc in self.accumulators.items() if acc in self.simd_loops[loop]}
        return " and ".join(word for op, word in ((Ops.ADD, "sum"), (Ops.MAX, "max"))
                            if op in ops) or "sum"

    @property
    def globals(self) -> list[UOp]:
        return sorted((u for u in self.uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg[0])

    @property
    def locals(self) -> list[UOp]:
        """The work-group's shared memory (DEFINE_LOCAL), in order."""
        return sorted((u for u in self.uops if u.op is Ops.DEFINE_LOCAL), key=lambda u: u.arg[0])

    @property
    def local_size(self) -> tuple[int, int, int]:
        """Threads per work-group along each dimension, when the program uses local thread ids
        (SPECIAL); (1, 1, 1) when it does not say (the renderer chooses)."""
        size = [1, 1, 1]
        for u in self.uops:
            if u.op is Ops.SPECIAL:
                size[u.arg[1]] = u.arg[2]
        return (size[0], size[1], size[2])

    def __str__(self) -> str:
        number = {u: i for i, u in enumerate(self.uops)}
        lines = []
        for u in self.uops:
            sources = ", ".join(f"%{number[s]}" for s in u.src if s in number)
            arg = "" if u.arg is None else f" {u.arg}"
            lines.append(f"%{number[u]:<3} {u.op.name:<13} {u.dtype.name:<8} ({sources}){arg}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ProgramSpec:
    """What a renderer hands a runtime for one kernel: its `name` and `source`, how it is
    launched (`global_size` threads in all, in groups of `local_size`; None on a device whose
    output loops are loops), its `buffers` (parameters 0..n-1) and `variables` (int parameters
    after them, by name), the `linear` program it was rendered from and the optimizer's actions
    that shaped it (`applied_opts`), and its compile flags: `heavy`, a kernel of so much work
    that the CPU builds it optimized at once (render/c.py, HEAVY_WORK), and `instructions`, how
    long its unoptimized build runs (the CPU optimizes the costliest first). A runtime reads sizes,
    bindings and flags here, never from the source; DEBUG=4 and viz show this source, the one
    that runs."""

    name: str
    source: str
    linear: LinearProgram | None = None
    global_size: tuple[int, int, int] | None = None
    local_size: tuple[int, int, int] | None = None
    buffers: int = 0
    variables: tuple[str, ...] = ()
    applied_opts: tuple[object, ...] = ()
    heavy: bool = False
    instructions: int = 0  # operations an unoptimized build runs (render/c.py instructions_of)

    @property
    def groups(self) -> tuple[int, int, int]:
        """Work-groups along each dimension (CUDA's grid, WebGPU's dispatch)."""
        if self.global_size is None or self.local_size is None:
            raise ValueError(f"{self.name} has no launch sizes: it was rendered for a device "
                             "whose output loops are loops")
        g, l = self.global_size, self.local_size
        return (g[0] // l[0], g[1] // l[1], g[2] // l[2])


def spec_of(name: str, source: str, program: LinearProgram, **launch: object) -> ProgramSpec:
    """The ProgramSpec of `source`, rendered from `program` (launch: global_size, local_size)."""
    return ProgramSpec(name, source, program, buffers=len(program.globals),
                       variables=tuple(v.arg[0] for v in program.variables),
                       **launch)  # type: ignore[arg-type]


def ranges_of(node: UOp, memo: dict[UOp, frozenset[UOp]] | None = None) -> frozenset[UOp]:
    """The loops a node's value depends on. A REDUCE closes its own loops: its result depends
    only on the loops outside it."""
    memo = {} if memo is None else memo
    if node in memo:
        return memo[node]
    stack = [node]
    while stack:  # sources first, skipping what an earlier call already worked out
        n = stack[-1]
        missing = [s for s in n.src if s not in memo]
        if missing:
            stack.extend(missing)
            continue
        stack.pop()
        if n.op is Ops.RANGE:
            memo[n] = frozenset((n,))
        elif n.op is Ops.REDUCE:
            memo[n] = memo[n.src[0]] - frozenset(n.src[1:])
        else:
            memo[n] = frozenset().union(*(memo[s] for s in n.src))
    return memo[node]


@dataclass
class _Linearizer:
    uops: list[UOp] = field(default_factory=list)
    placed: set[UOp] = field(default_factory=set)
    acc_count: int = 0
    accumulators: dict[UOp, UOp] = field(default_factory=dict)
    reductions: dict[tuple[UOp, ...], list[UOp]] = field(default_factory=dict)  # by their loops
    simd_loops: dict[UOp, list[UOp]] = field(default_factory=dict)
    vectorize: bool = True
    range_memo: dict[UOp, frozenset[UOp]] = field(default_factory=dict)

    def place(self, root: UOp) -> None:
        """Emit `root` after everything it needs (REDUCE emits its loop around its value).
        An explicit stack, as the value may be a chain 100,000 ops deep."""
        stack: list[tuple[UOp, bool]] = [(root, False)]
        while stack:
            node, sources_placed = stack.pop()
            if node in self.placed:
                continue
            if node.op is Ops.REDUCE:
                self._place_reduce(node)  # (nests only as deep as reductions in one kernel)
            elif not sources_placed:
                stack.append((node, True))
                stack.extend((s, False) for s in reversed(node.src) if s not in self.placed)
            else:
                self.uops.append(node)
                self.placed.add(node)

    def _place_reduce(self, node: UOp) -> None:
        """Place every reduction over the same loops as `node` in one loop nest:
        accumulators first, then the loops, each value and its accumulate, then close."""
        loops = node.src[1:]
        group = [r for r in self.reductions.get(loops, [node]) if r not in self.placed]
        own = set(loops)
        # hoist: everything the values need that does not depend on these loops (nor on the
        # loops of a reduction nested in them, which that reduction places itself)
        for reduce in group:
            for dep in reduce.src[0].toposort:
                inside = {r for r in ranges_of(dep, self.range_memo)
                          if r in own or (r.arg[0] == "r" and r not in self.placed)}
                if dep not in self.placed and not inside and dep.op is not Ops.RANGE:
                    self.place(dep)
        accumulators = [self._define_accumulator(reduce) for reduce in group]
        for loop in loops:
            self.uops.append(loop)
            self.placed.add(loop)
        for reduce, acc in zip(group, accumulators):
            self.place(reduce.src[0])
            self.uops.append(UOp(Ops.ACCUMULATE, reduce.dtype, (acc, reduce.src[0]), reduce.arg))
        for loop in reversed(loops):
            self.uops.append(UOp(Ops.END_RANGE, dtypes.bool, (loop,)))
        # after the loop, each reduction's value is its accumulator
        for reduce, acc in zip(group, accumulators):
            self.accumulators[reduce] = acc
            self.uops.append(reduce)
            self.placed.add(reduce)
        if self.vectorize and _sums_over_contiguous_memory(group, loops[-1]):
            self.simd_loops[loops[-1]] = accumulators

    def _define_accumulator(self, reduce: UOp) -> UOp:
        identity = UOp.const(reduce.dtype, identity_element(reduce.arg, reduce.dtype))
        acc = UOp(Ops.DEFINE_ACC, reduce.dtype, (identity,), self.acc_count)
        self.acc_count += 1
        self.place(identity)
        self.uops.append(acc)
        return acc


SIMD_MIN_LOOP = 16  # shorter loops are not split into vector lanes (see below)
# FIXED_LANES (settings.py) 1: a renderer that can (C) writes a lane loop's accumulators as W
# lanes combined in a fixed order (render/c.py), so float maxima are split into lanes too; 0:
# sums only, under `#pragma omp simd`, in the order the compiler picks


def _sums_over_contiguous_memory(group: list[UOp], loop: UOp) -> bool:
    """Can the innermost loop's float sums be split into vector lanes? Only when every load in
    it walks memory one element at a time (or stays put), without padding guards. Reordering a
    float sum changes rounding, as it does in tinygrad; never for ints. A float max is split
    only with FIXED_LANES (the renderer combines the lanes with the NaN-keeping max itself;
    OpenMP's max reduction may drop a NaN).

    And only when the loop is long (SIMD_MIN_LOOP): each time it ends, every accumulator's
    lanes are added up. A convolution's 3-tap loop over kernel columns, split into 8 lanes,
    spent more on those sums than on its multiply-adds: its 16 accumulators were summed
    across lanes after every 3 steps (the CNN's conv kernels ran 4-6x slower with it)."""
    if sym_max(loop.arg[2]) < SIMD_MIN_LOOP:  # (a symbolic loop: by its largest count)
        return False
    ops = (Ops.ADD, Ops.MAX) if FIXED_LANES else (Ops.ADD,)
    if not all(r.arg in ops and r.dtype.kind == "float" and r.dtype.count == 1 for r in group):
        return False
    loads = {n for r in group for n in r.src[0].toposort if n.op is Ops.LOAD}
    inside = [n for n in loads if loop in n.src[1].toposort or len(n.src) == 3]
    return bool(inside) and all(len(n.src) == 2 and _steps_by_one(n.src[1], loop)
                                for n in inside)


def _steps_by_one(index: UOp, loop: UOp) -> bool:
    """Does `index` move by 0 or 1 as `loop` counts 0, 1, 2 (all other loops held at 0)?"""
    values = [index_value(index, {loop: value}) for value in (0, 1, 2)]
    if any(v is None for v in values):
        return False
    return all(b - a in (0, 1) for a, b in zip(values, values[1:]))  # type: ignore[operator]



def linearize(lowered: UOp, options: KernelOptions = NO_OPTIONS) -> LinearProgram:
    """Order a lowered kernel: parameters, output loops, body, closing braces."""
    nodes = lowered.toposort
    defines = sorted((n for n in nodes if n.op is Ops.DEFINE_GLOBAL), key=lambda n: n.arg[0])
    shared = sorted((n for n in nodes if n.op is Ops.DEFINE_LOCAL), key=lambda n: n.arg[0])
    order = options.loop_order or tuple(sorted({n.arg[1] for n in nodes if n.op is Ops.RANGE}))
    global_loops = sorted((n for n in nodes if n.op is Ops.RANGE and n.arg[0] in OUTPUT_KINDS),
                          key=lambda n: order.index(n.arg[1]) if n.arg[1] in order else n.arg[1])
    thread_ids = sorted((n for n in nodes if n.op is Ops.SPECIAL), key=lambda n: n.arg[1])
    linearizer = _Linearizer(vectorize=not NOOPT)
    for node in nodes:
        if node.op is Ops.REDUCE:
            linearizer.reductions.setdefault(node.src[1:], []).append(node)
    row_loops = _loops_of_row_reductions(nodes, global_loops, linearizer.range_memo)
    if any(loop.arg[0] == "c" for loop in global_loops):  # a work-group per row: rows first
        row_loops = frozenset(loop for loop in global_loops if loop.arg[0] != "c")
    if row_loops is not None:
        global_loops = _rows_first(global_loops, row_loops)
        for node in [*defines, *shared, *thread_ids]:
            linearizer.uops.append(node)
            linearizer.placed.add(node)
        _place_loop_by_loop(linearizer, lowered, global_loops)
    else:
        for node in [*defines, *shared, *global_loops, *thread_ids]:
            linearizer.uops.append(node)
            linearizer.placed.add(node)
    for store in lowered.src:
        linearizer.place(store)
    for loop in reversed(global_loops):
        linearizer.uops.append(UOp(Ops.END_RANGE, dtypes.bool, (loop,)))
    sizes = tuple(loop.arg[2] for loop in global_loops)
    return LinearProgram(linearizer.uops, sizes, linearizer.accumulators, options,
                         linearizer.simd_loops)


# ---- a reduction computed once per row (schedule.fuses_along_rows) ----

def _loops_of_row_reductions(nodes: list[UOp], global_loops: list[UOp],
                             memo: dict[UOp, frozenset[UOp]]) -> frozenset[UOp] | None:
    """The output loops that the kernel's row reductions depend on, where some reduction
    depends on fewer output loops than the kernel has (softmax's max depends on the row, not
    on the column); None when every reduction depends on every output loop (the usual
    kernel), so nothing changes for it. (A loop of one iteration does not count: the index
    simplifier may drop it from a reduction that still runs once per output.)"""
    loops = frozenset(loop for loop in global_loops
                      if isinstance(loop.arg[2], UOp) or loop.arg[2] > 1)  # (symbolic: counts)
    per_row = [ranges_of(node, memo) & loops for node in nodes if node.op is Ops.REDUCE]
    per_row = [depends for depends in per_row if depends != loops]
    if not per_row:
        return None
    return frozenset().union(*per_row)


def _rows_first(global_loops: list[UOp], row_loops: frozenset[UOp]) -> list[UOp]:
    """The loops over rows outside the loops within a row (a loop order that put a column loop
    outside would compute every row's reductions once per column)."""
    return [loop for loop in global_loops if loop in row_loops] + \
        [loop for loop in global_loops if loop not in row_loops]


def _place_loop_by_loop(linearizer: _Linearizer, lowered: UOp, global_loops: list[UOp]) -> None:
    """Open the output loops one at a time; before each, place everything that depends only on
    the loops already open: each row's reductions, and what is computed from their results
    (1/sum, rsqrt(var + eps)), run once per row instead of once per output element."""
    nodes = [n for n in lowered.toposort if n.op not in (Ops.STORE, Ops.SINK, Ops.RANGE)]
    opened: set[UOp] = set()
    for loop in global_loops:
        for node in nodes:
            if node not in linearizer.placed and \
                    ranges_of(node, linearizer.range_memo) <= opened:
                linearizer.place(node)
        linearizer.uops.append(loop)
        linearizer.placed.add(loop)
        opened.add(loop)


def lower(ast: UOp, options: KernelOptions) -> LinearProgram:
    """The whole chapter: lower the AST as its plan says, simplify its index math, and
    linearize it. The plan comes from the optimizer (opt/): a Kernel's actions (what realize
    lowers), the heuristic's choice (`lower(ast, heuristic_plan(ast))`, opt/heuristic.py) or
    NO_OPTIONS. A vector plan this kernel cannot vectorize is lowered in scalars (the same
    tile)."""
    chosen = options
    lowered = lower_ast(ast, chosen)
    if chosen.vector_width:
        vectored = vectorize(lowered)
        if vectored is None:  # this kernel cannot use vectors: the same kernel in scalars
            chosen = replace(chosen, vector_width=0)
            lowered = lower_ast(ast, chosen)
        else:
            lowered = vectored
    program = linearize(lowered, chosen)
    # every buffer stays a parameter, even one the simplifier made unused (where(False, ...)):
    # the engine passes all of them, and OpenCL and WebGPU check the count
    present = {u for u in program.uops if u.op is Ops.DEFINE_GLOBAL}
    missing = [n for n in ast.toposort if n.op is Ops.DEFINE_GLOBAL and n not in present]
    program.uops[:0] = sorted(missing, key=lambda n: n.arg[0])
    program.variables = tuple(variables_of([ast]))
    return program
