"""Chapter 8b (part 1): the GPU half of lowering — work-groups, shared memory and tensor cores.

What this teaches (codegen/lower.py is the CPU half: loops, tiles, vectors):
- a **group reduction** gives each output a work-group: thread `lidx0` sums a strided slice of
  the reduced axis (GROUPTOP: a contiguous one), the partial sums meet in shared memory
  (`DEFINE_LOCAL`) after a `BARRIER`, and are combined by a tree (halving) or by thread 0;
- a **row kernel** (a fused softmax or layernorm) gives each row a work-group: every reduction
  of the row is a group reduction, computed once per row (`row_output_index`);
- a **local tile** stages a tile of X and one of Y in shared memory per step of the reduction,
  every thread copying one element (or r of each with an r x r block), then sums a row of the
  one tile times a column of the other (`tile_output_indices`);
- with **tensor cores** (codegen/wmma.py) the reduction is a loop of fragment loads and `WMMA`s.

`GPULowering` is these methods of the lowerer (codegen/lower.py's `_Lowerer` inherits them);
each reads the plan's GPU fields and returns what the lowerer's walk expects: the tasks to
lower first and how to combine them (ir/view.py's Task and Combine).

Builds on: ir/uop.py, ir/view.py, codegen/plan.py (TilePlan), codegen/wmma.py. Used by:
codegen/lower.py.

>>> from tinyteach.ir.uop import Ops
>>> [entry.op for entry in tile_output_index((32, 32), 16)]
[<Ops.ADD: ...>, <Ops.ADD: ...>]
"""
from __future__ import annotations

import itertools

from tinyteach.codegen.plan import TilePlan
from tinyteach.codegen.wmma import TensorCoreLowering
from tinyteach.dtype import DType, dtypes
from tinyteach.ir.uop import Ops, UOp, identity_element, make_range
from tinyteach.ir.view import Combine, Index, Task, Valid, and_valid, below, guarded, index_const


def local_thread_id(threads: int, dimension: int = 0) -> UOp:
    """This thread's index in its work-group along `dimension`, 0 <= lidx < threads."""
    return UOp(Ops.SPECIAL, dtypes.int32, (), ("l", dimension, threads))


class GPULowering:
    """The lowerer's GPU reductions. The state they read and write is the lowerer's (the
    fields of codegen/lower.py's _Lowerer dataclass, declared here for the type checker)."""

    group: int
    group_combine: str
    group_top: bool
    rows: bool
    tile: TilePlan | None
    tile_size: int
    tile_upcast: int
    tile_indices: dict[tuple[int, int], Index]
    tile_position: tuple[int, int]
    tile_stages: dict[UOp, tuple[UOp, UOp, UOp]]
    output_index: Index
    tensor_core: TensorCoreLowering | None
    reduce_count: int
    local_count: int
    group_results: list[UOp]
    reduce_ranges: dict[UOp, list[UOp]]

    def _plan_tensor_core_reduce(self, node: UOp) -> tuple[list[Task], Combine]:
        """Tensor cores (codegen/wmma.py): this thread's fragments of X and Y at each step of the k
        loop, and the sum of its element of the warp's WMMA."""
        assert self.tensor_core is not None
        core, output_index = self.tensor_core, self.output_index
        if node not in self.reduce_ranges:
            self.reduce_ranges[node] = [core.k_steps(self.reduce_count)]
            self.reduce_count += 1
        k_step = self.reduce_ranges[node][0]
        tasks = core.fragment_tasks(k_step)
        return tasks, lambda values: core.reduce(node, output_index, k_step, values, tasks)

    # ---- a reduction shared by the threads of a work-group ----

    def _plan_group_reduce(self, node: UOp, index: Index,
                           valid: Valid) -> tuple[list[Task], Combine]:
        """Thread `lidx0` of the group sums elements lidx0, lidx0 + T, lidx0 + 2T, ... of the last
        reduced axis (T threads: neighbours read neighbours); its partial sum then goes through
        shared memory (`_combine_in_group`). Elements past the end count as the identity."""
        reduce_op, axes = node.arg
        source_shape = node.src[0].shape
        split_axis, threads = axes[-1], self.group
        steps = -(-source_shape[split_axis] // threads)
        if node not in self.reduce_ranges:
            sizes = [source_shape[axis] for axis in axes[:-1]] + [steps]
            self.reduce_ranges[node] = [make_range("r", self.reduce_count + k, size)
                                        for k, size in enumerate(sizes)]
            self.reduce_count += len(axes)
        ranges = self.reduce_ranges[node]
        inner_index = list(index)
        for axis, loop in zip(axes[:-1], ranges):
            inner_index[axis] = loop
        element = local_thread_id(threads) * steps + ranges[-1] if self.group_top \
            else ranges[-1] * threads + local_thread_id(threads)
        inner_index[split_axis] = element
        inside = None if source_shape[split_axis] % threads == 0 \
            else element.lt(source_shape[split_axis])
        identity = UOp.const(node.dtype, identity_element(reduce_op, node.dtype))

        def combine(values: list[UOp]) -> UOp:
            value = values[0] if inside is None else inside.where(values[0], identity)
            partial = UOp(Ops.REDUCE, node.dtype, (value, *ranges), reduce_op)
            return self._combine_in_group(partial, reduce_op)
        return [(node.src[0], tuple(inner_index), and_valid(valid, inside))], combine

    def _combine_in_group(self, partial: UOp, reduce_op: Ops) -> UOp:
        """Every thread stores its partial result in shared memory; after a barrier they are
        combined, and every thread reads the result from element 0."""
        threads, lidx = self.group, local_thread_id(self.group)
        shared = UOp(Ops.DEFINE_LOCAL, partial.dtype, (), (self.local_count, threads))
        self.local_count += 1
        barrier = UOp(Ops.BARRIER, dtypes.bool, (UOp(Ops.STORE, partial.dtype,
                                                     (shared, lidx, partial)),))
        if self.group_combine == "serial":
            result = self._serial_combine(shared, barrier, reduce_op)
            if self.rows:  # every thread of a row's group needs the result: thread 0 shares it
                result = self._share_from_first(shared, result)
            self.group_results.append(result)
            return result
        half = threads // 2
        while half >= 1:  # a tree: the first `half` threads each combine two partials
            active = lidx.lt(half)
            mine = UOp(Ops.LOAD, partial.dtype, (shared, lidx, active, barrier))
            partner = UOp(Ops.LOAD, partial.dtype, (shared, lidx + half, active, barrier))
            combined = UOp(reduce_op, partial.dtype, (mine, partner))
            store = UOp(Ops.STORE, partial.dtype, (shared, lidx, combined, active))
            barrier = UOp(Ops.BARRIER, dtypes.bool, (store,))
            half //= 2
        result = UOp(Ops.LOAD, partial.dtype, (shared, index_const(0), barrier))
        self.group_results.append(result)
        return result

    def _serial_combine(self, shared: UOp, barrier: UOp, reduce_op: Ops) -> UOp:
        """Thread 0 alone loops over the partials (the others read nothing: their value is
        never stored)."""
        loop = make_range("r", self.reduce_count, self.group)
        self.reduce_count += 1
        first = local_thread_id(self.group).lt(1)
        value = UOp(Ops.LOAD, shared.dtype, (shared, loop, first, barrier))
        return UOp(Ops.REDUCE, shared.dtype, (value, loop), reduce_op)


    def _share_from_first(self, shared: UOp, result: UOp) -> UOp:
        """Thread 0 writes its serial result into element 0 (it alone read the partials since
        the last barrier); after a barrier every thread reads it."""
        first = local_thread_id(self.group).lt(1)
        published = UOp(Ops.STORE, shared.dtype, (shared, index_const(0), result, first))
        return UOp(Ops.LOAD, shared.dtype, (shared, index_const(0),
                                            UOp(Ops.BARRIER, dtypes.bool, (published,))))

    # ---- a matmul-like reduction from tiles in shared memory ----

    def _plan_tile_reduce(self, node: UOp) -> tuple[list[Task], Combine]:
        """Thread (row, column) = (lidx1, lidx0) stages X at (its row, step * T + column) and Y
        at (step * T + row, its column); elements past an edge are staged as 0. With a block
        of r x r outputs per thread (`tile_upcast`), it stages r rows of X (its row + i * T)
        and r columns of Y (its column + j * T): the tasks are those 2r copies, the same for
        each of its outputs, and `_sum_of_tiles` builds the staging once."""
        assert self.tile is not None
        tile, size = self.tile, self.tile_size
        shape = node.src[0].shape
        if node not in self.reduce_ranges:
            self.reduce_ranges[node] = [
                make_range("r", self.reduce_count, -(-shape[tile.k_axis] // size)),
                make_range("r", self.reduce_count + 1, size)]
            self.reduce_count += 2
        steps, within = self.reduce_ranges[node]
        column, row = local_thread_id(size, 0), local_thread_id(size, 1)
        tasks: list[Task] = []
        for i in range(self.tile_upcast):  # the X rows this thread stages
            base = self._source_index(self.tile_indices.get((i, 0), self.output_index), shape)
            x_index = list(base)
            x_index[tile.n_axis], x_index[tile.k_axis] = index_const(0), steps * size + column
            tasks.append((tile.x, tuple(x_index),
                          and_valid(below(base[tile.m_axis], shape[tile.m_axis]),
                                    below(x_index[tile.k_axis], shape[tile.k_axis]))))
        for j in range(self.tile_upcast):  # the Y columns
            base = self._source_index(self.tile_indices.get((0, j), self.output_index), shape)
            y_index = list(base)
            y_index[tile.m_axis], y_index[tile.k_axis] = index_const(0), steps * size + row
            tasks.append((tile.y, tuple(y_index),
                          and_valid(below(base[tile.n_axis], shape[tile.n_axis]),
                                    below(y_index[tile.k_axis], shape[tile.k_axis]))))
        position = self.tile_position

        def combine(values: list[UOp]) -> UOp:
            staged = [guarded(value, task[2]) for value, task in zip(values, tasks)]
            return self._sum_of_tiles(node, staged, position, steps, within)
        return tasks, combine

    def _source_index(self, output_index: Index, shape: tuple[int, ...]) -> list[UOp]:
        """The reduction's source index of an output of this thread (the output's axes of size
        > 1 are the source's, in order; plan.local_tile_plan checked it)."""
        assert self.tile is not None
        outputs = iter(entry for entry in output_index if entry.op is not Ops.CONST)
        return [next(outputs) if size > 1 and axis != self.tile.k_axis else index_const(0)
                for axis, size in enumerate(shape)]

    def _sum_of_tiles(self, node: UOp, staged: list[UOp], position: tuple[int, int],
                      steps: UOp, within: UOp) -> UOp:
        """Stage both tiles (once per reduction), wait, then sum row i of X's tile times column
        j of Y's tile, for this output's place (i, j) in the thread's block; the sum over the
        steps adds those partial sums. X's tile is (T * r) rows x T, Y's is T x (T * r)."""
        if node not in self.tile_stages:
            self.tile_stages[node] = self._stage_tiles(staged[0].dtype, staged, steps)
        x_tile, y_tile, ready = self.tile_stages[node]
        size, block = self.tile_size, self.tile_upcast
        column, row = local_thread_id(size, 0), local_thread_id(size, 1)
        i, j = position
        x_element = UOp(Ops.LOAD, x_tile.dtype, (x_tile, (row + i * size) * size + within,
                                                 ready))
        y_element = UOp(Ops.LOAD, y_tile.dtype, (y_tile, within * (size * block) + column +
                                                 j * size, ready))
        product = x_element * y_element
        if product.dtype != node.dtype:  # a half matmul's widening cast (plan.tile_plan)
            product = product.cast(node.dtype)
        partial = UOp(Ops.REDUCE, node.dtype, (product, within), Ops.ADD)
        return UOp(Ops.REDUCE, node.dtype, (partial, steps), Ops.ADD)

    def _stage_tiles(self, dtype: DType, staged: list[UOp],
                     steps: UOp) -> tuple[UOp, UOp, UOp]:
        """The two tiles in shared memory and the barrier after every thread's copies into
        them: X's row i (of r) at slot (lidx1 + i * T) * T + lidx0, Y's column j at slot
        lidx1 * T * r + lidx0 + j * T. A barrier at the top of each step keeps the copies from
        overwriting what slower threads still read of the last step."""
        size, block = self.tile_size, self.tile_upcast
        column, row = local_thread_id(size, 0), local_thread_id(size, 1)
        x_tile = UOp(Ops.DEFINE_LOCAL, dtype, (), (self.local_count, size * size * block))
        y_tile = UOp(Ops.DEFINE_LOCAL, dtype, (), (self.local_count + 1, size * size * block))
        self.local_count += 2
        step_start = UOp(Ops.BARRIER, dtypes.bool, (steps,))
        x_stores = [UOp(Ops.STORE, dtype, (x_tile, (row + i * size) * size + column, value,
                                           step_start))
                    for i, value in enumerate(staged[:block])]
        y_stores = [UOp(Ops.STORE, dtype, (y_tile, row * (size * block) + column + j * size,
                                           value, step_start))
                    for j, value in enumerate(staged[block:])]
        return x_tile, y_tile, UOp(Ops.BARRIER, dtypes.bool, (*x_stores, *y_stores))


    def _group_store_sources(self) -> tuple[UOp, ...]:
        """In a group reduction every thread of the group holds the result: a gate lets thread 0
        alone store it. And a last barrier: every thread has read the result before the group's
        next output (another turn of its loops) writes new partial sums over it."""
        if not self.group:
            return ()
        gate = local_thread_id(self.group).lt(1)
        return gate, UOp(Ops.BARRIER, dtypes.bool, tuple(self.group_results))


# ---- where a GPU thread's outputs are ----

def tile_output_index(shape: tuple[int, ...], size: int) -> Index:
    """A local tile's output index: the last two axes longer than 1 are `tile * size + lidx`
    (lidx1 along the rows, lidx0 along the columns), over loops of work-groups ('w'); other
    axes get a work-group each."""
    return tile_output_indices(shape, size)[(0, 0)]


def tile_output_indices(shape: tuple[int, ...], size: int,
                        block: int = 1) -> dict[tuple[int, int], Index]:
    """Every output of a local tile's thread, by its place (i, j) in the thread's r x r block
    (r = `block`): row `tile * size * r + i * size + lidx1`, column `... + j * size + lidx0`.
    The block's rows are `size` apart, so neighbouring threads still store neighbouring
    columns, and a group covers (size * r) x (size * r) outputs."""
    kept = [axis for axis, length in enumerate(shape) if length > 1]
    thread_dimension = {kept[-1]: 0, kept[-2]: 1}
    per_axis: list[list[UOp]] = []
    for axis, length in enumerate(shape):
        if length == 1:
            per_axis.append([index_const(0)])
        elif axis in thread_dimension:
            tiles = make_range("w", axis, -(-length // (size * block)))
            thread = local_thread_id(size, thread_dimension[axis])
            per_axis.append([tiles * (size * block) + offset * size + thread
                             for offset in range(block)])
        else:
            per_axis.append([make_range("w", axis, length)])
    row_axis, column_axis = kept[-2], kept[-1]
    indices = {}
    for combination in itertools.product(*(range(len(entries)) for entries in per_axis)):
        index = tuple(entries[k] for entries, k in zip(per_axis, combination))
        indices[(combination[row_axis], combination[column_axis])] = index
    return indices


def row_output_index(shape: tuple[int, ...], row_axis: int, threads: int) -> tuple[Index, Valid]:
    """The output index of a kernel over whole rows (plan.row_kernel_axis), and where it exists.
    Every other axis is a loop over work-groups ('w'): one group per row. Along the row,
    thread `lidx0` of the group stores columns lidx0, lidx0 + T, lidx0 + 2T, ... (a 'c' loop
    over steps of T): neighbouring threads store neighbouring columns. Where the row is not a
    multiple of T, the last step's guard keeps the threads past its end from loading or
    storing."""
    steps = -(-shape[row_axis] // threads)
    index: list[UOp] = []
    for axis, size in enumerate(shape):
        if axis == row_axis:
            index.append(make_range("c", axis, steps) * threads + local_thread_id(threads))
        else:
            index.append(index_const(0) if size == 1 else make_range("w", axis, size))
    inside = below(index[row_axis], shape[row_axis]) if shape[row_axis] % threads else None
    return tuple(index), inside
