"""Chapter 7 (part 4): packing — copying an operand into the order its kernel reads it.

A vector matmul tile (opt/) reads, at each step of its sum, 32 consecutive floats of one row
of `b`, then jumps a whole row (4 KB for 1024 floats) to the next step. Addresses 4 KB apart
fall into the same few sets of the CPU's caches, so the 1024 x 32 panel of `b` one tile walks
keeps evicting itself and is fetched again from far away for every tile.

Packing copies `b` once into panels: panel p holds columns 32p..32p+31 of every row, one row
after the other, so a tile walks 128 KB of consecutive memory that stays in cache. The copy is
one more kernel, generated like any other (a reshape and a permute made contiguous); the matmul
then reads the packed buffer through index arithmetic, which the symbolic rules tidy into
`panel*32768 + k*32 + lane`. BLAS libraries do the same, by hand.

It only pays for big operands: the copy reads and writes `b` once, and a small `b` (an MLP's
weights) stays in cache without it. `NOOPT=1` turns it off; DEBUG=3 shows the extra kernel and
why it is there.

**Channel tiles: a convolution as a matmul over a packed operand.** A convolution is a sum of
products, `out[n, co, y, x] = sum over (ci, ky, kx) of window[n, ci, y+ky, x+kx] *
w[co, ci, ky, kx]`: a matmul whose rows are the output pixels and whose columns are the output
channels. Its last output axis (x, 11 or 26 pixels) fills no vector, but the channel axis does
(8, 16, 32 channels), and along it the window stays put while `w` moves by a whole filter
(72 floats). So `plan_channel_tile` packs the factor that moves (`w`, as (ci, ky, kx, co)),
computes the output channels last, (y, x, n, co), where the vector tile reads 16 channels of
`w` as two vectors and one window value for all of them, and copies the result back into
(n, co, y, x). The same plan serves both gradients of a convolution (the weight gradient's
channel axis is co again; the packed factor is the upstream gradient, fused elementwise ops
and all) and x @ w.T (an MLP layer, whose output is channels-last already: no copy back).
A bias and an activation after the sum (`x.linear(w.T, b).gelu()`, `conv2d(x, w, b).relu()`)
stay in the kernel: they move with the output. Ops after the sum that read another tensor
across channels (a ReLU's mask in the input gradient of `conv2d(x.relu(), w)`: 32 channels
apart, channels last) would keep the kernel scalar; they go into the copy back instead, which
reads that tensor in its own order.
A weight gradient's sum runs over every image and pixel: each tile of outputs streams all
of the packed upstream gradient (6.5 MB for beautiful_mnist's second convolution), from far
caches. When many tiles do, the sum is taken in blocks of images, each block's slice staying
in cache across the tiles, and the copy back adds the blocks' partial sums up (_sum_blocks).
Three kernels instead of one, so only for long sums (more than heuristic.SHORT_REDUCE per output);
where no copy back is needed (the channel axis is the output's last already: x @ w.T, and
attention's q @ k.T and weights @ v over heads of 32), two kernels pay from sums of
CHANNEL_MIN_SUM on, in a kernel of SHORT_SUM_MIN_WORK multiply-adds or more.
`CHANNEL_TILES=0` turns channel tiles off alone.

Builds on: opt/ (which kernels get a vector tile), engine/schedule.py (ScheduleItem).
Used by: realize.build_schedule, between scheduling and running (so viz draws the packing
kernels too).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tinyteach.codegen.lower import _symbolic_memo, lower_ast, vectorize
from tinyteach.codegen.plan import buffer_reads, kernel_value, step_along
from tinyteach.device import Buffer, Device
from tinyteach.dtype import DType, dtypes
from tinyteach.engine.schedule import ScheduleItem
from tinyteach.helpers import NOOPT, LRUCache, prod, remember
from tinyteach.ir.rewrite import graph_rewrite, symbolic
from tinyteach.ir.uop import ALU, MOVEMENT, Ops, UOp
from tinyteach.ir.view import view_index
from tinyteach.opt.heuristic import SHORT_REDUCE, choose_options
from tinyteach.settings import CHANNEL_TILES

PACK_MIN_ELEMENTS = 1 << 19   # 2 MB of float32: smaller operands stay in cache unpacked
MAX_PACK_GROWTH = 2           # a channel tile's copy holds at most twice what it reads
PACK_MIN_ROW_BYTES = 1024     # a row step this long strides across cache sets


@dataclass(frozen=True)
class PackPlan:
    """How to pack one input of a kernel: `copy_ast` writes the panels, `kernel_ast` is the
    kernel reading them from a new last input."""

    input_index: int          # which DEFINE_GLOBAL of the kernel gets packed
    copy_ast: UOp
    kernel_ast: UOp           # the same kernel, reading the panels as that input
    packed_size: int
    dtype: DType
    panel: int                # columns per panel


_plans: LRUCache[tuple[UOp, int], PackPlan | None] = LRUCache("pack.plans", limit=10_000)


def pack_operands(items: list[ScheduleItem]) -> list[ScheduleItem]:
    """Put a packing copy before each kernel that profits from one."""
    if NOOPT:
        return items
    packed: list[ScheduleItem] = []
    for item in items:
        width = _vector_width(item) if not item.ast.has_symbols else 0  # (a symbolic size:
        plan = plan_packing(item.ast, width) if width else None        # no packing)
        if plan is not None:
            packed.extend(_packed_pair(item, plan))
            continue
        channels = plan_channel_tile(item.ast, width) if width and CHANNEL_TILES else None
        packed.extend([item] if channels is None else _channel_items(item, channels))
    return packed


def _packed_pair(item: ScheduleItem, plan: PackPlan) -> tuple[ScheduleItem, ScheduleItem]:
    """The packing kernel, and the item's kernel reading its panels instead of the operand."""
    panels = Buffer(item.device, plan.packed_size, plan.dtype)
    number = plan.input_index
    name = f"pack_{plan.panel}_{plan.packed_size}"
    pack = ScheduleItem(
        "kernel", name, plan.copy_ast, [panels, item.buffers[number]], item.device,
        f"packing: input {number} of {item.name} copied into panels of {plan.panel} columns, "
        "so the kernel reads it in order", ["a reshape and a permute, made contiguous"],
        [f"input 1: input {number} of {item.name}, the operand it packs"])
    buffers = list(item.buffers)
    buffers[number] = panels
    reasons = list(item.input_reasons)
    reasons[number - 1] = f"input {number}: the panels {name} wrote (the operand, packed)"
    kernel = ScheduleItem(item.kind, item.name, plan.kernel_ast, buffers, item.device,
                          item.boundary_reason, item.fusions, reasons, item.old_contents_read,
                          item.node, item.input_nodes)
    return pack, kernel


# ---- channel tiles: a convolution as a matmul over a packed operand ----

CHANNEL_MIN_WORK = 1 << 16    # multiply-adds below which three kernels cost more than one
CHANNEL_MIN_SUM = 16          # the shortest sum per output a channel tile without a copy back
#                               pays for (attention's q @ k.T over heads of 32: 0.72 -> 0.37 ms)
SHORT_SUM_MIN_WORK = 1 << 20  # ... and only in a kernel of this many multiply-adds or more
SUM_SLAB_BYTES = 1 << 19      # what one channel tile's sum may stream (its sum x its channels):
#                               beyond, blocks of the sum, each of this much at most
#                               (_sum_blocks), stay in a core's 1 MB cache across tiles
MIN_SUM_TILES = 16            # ... and only when that many tiles would stream it
MIN_PACKED_REUSE = 8          # multiply-adds per packed element, at least: a copy of w for a
#                               single row (generating one token: 1 x 128 @ 128 x 512) read it
#                               once, and cost 134 us where the product takes 30


@dataclass(frozen=True)
class ChannelPlan:
    """How a kernel gets vectors along a channel axis: `pack_ast` evaluates one factor of its
    product (from the kernel's `inputs`) with that axis last, into `packed_size` elements;
    `kernel_ast` reads them and computes the output with that axis last too (in a new buffer
    when `unpack_ast` is not None, which then copies it into the output's own order)."""

    inputs: tuple[int, ...]   # the kernel's inputs the packing copy reads (it may fuse ops)
    pack_ast: UOp
    packed_size: int
    kernel_ast: UOp           # reads the packed operand as a new last input
    kernel_slots: tuple[int, ...]  # for each of its buffers: the item's buffer number (or
    #                                len(item.buffers): the packed copy)
    unpack_ast: UOp | None
    dtype: DType
    channel_size: int
    # for each buffer of the copy back: the item's buffer number, or len(item.buffers) for the
    # channels-last result (empty: the output, then that result)
    unpack_slots: tuple[int, ...] = ()
    result_size: int = 0  # elements of the channels-last result (0: the output's; more: the
    #                       partial sums of blocks of the sum, which the copy back adds up)


_channel_plans: LRUCache[tuple[UOp, int], ChannelPlan | None] = LRUCache("pack.channels",
                                                                           limit=10_000)


def plan_channel_tile(ast: UOp, vector_width: int) -> ChannelPlan | None:
    """The channel tile a kernel profits from, or None (remembered per kernel)."""
    return remember(_channel_plans, (ast, vector_width),
                    lambda: _channel_plan(ast, vector_width))


def _channel_plan(ast: UOp, width: int) -> ChannelPlan | None:
    """A sum of products X * Y where Y varies along an output axis (the channel: output channels
    of a convolution, the columns of x @ w.T) and X does not: pack Y with that axis last, and
    the kernel's inner loop reads `width` channels of Y as one vector and one X value for all of
    them, as the vector matmul tile does (heuristic._vector_tile). The output is computed with the
    channel axis last as well, then copied back into its own order (a convolution's output is
    channels-first). Only for long sums: the copies are paid once per kernel."""
    if _vectorizes(ast, width, full=True):
        return None  # a vector tile of full width already (and not one that falls back to
        #              scalars: a padded image's guard that differs from lane to lane, as in a
        #              transposed conv). A narrower tile (a row of 24 pixels as 3 vectors of 8
        #              on a 16-lane CPU) computes half as much per instruction as 16 channels
    value = kernel_value(ast)
    found = _product_reduction(value)
    if found is None:
        return None
    reduce, x, y = found
    work = prod(reduce.src[0].shape)
    sum_length = work // max(prod(reduce.shape), 1)
    if sum_length < CHANNEL_MIN_SUM or work < CHANNEL_MIN_WORK:
        return None
    shape = reduce.src[0].shape
    used = {side: _axes_used(side, shape) for side in (x, y)}
    best = None
    for packed, other in ((y, x), (x, y)):
        packed_axes, other_axes = used[packed], used[other]
        if packed_axes is None or other_axes is None:
            continue
        cost = prod(shape[a] for a in packed_axes)  # the packed copy's elements
        if cost > MAX_PACK_GROWTH * _elements_read(packed):
            continue  # a convolution's windows: the copy would hold each pixel k*k times
        if work < MIN_PACKED_REUSE * cost:
            continue  # each packed element would serve too few outputs (one token's x @ w.T)
        for axis, size in enumerate(reduce.shape):
            if size > 1 and size % width == 0 and axis not in reduce.arg[1] and \
                    axis in packed_axes and axis not in other_axes and \
                    (best is None or cost < best[0]):
                best = (cost, axis, packed, other_axes)
    if best is None:
        return None
    _, axis, packed, other_axes = best
    plan = _build_channel_plan(ast, value, reduce, axis, packed, other_axes, width)
    if plan is not None and sum_length <= SHORT_REDUCE and \
            (plan.unpack_ast is not None or work < SHORT_SUM_MIN_WORK):
        return None  # a short sum pays neither for copying its output back nor when small
    return plan


def _elements_read(factor: UOp) -> int:
    """How many elements the buffers a factor loads hold (DEFINE_GLOBAL's arg: index, size)."""
    return sum(n.arg[1] for n in factor.toposort if n.op is Ops.DEFINE_GLOBAL)


def _product_reduction(value: UOp) -> tuple[UOp, UOp, UOp] | None:
    """(reduce, X, Y) when the kernel stores one float sum of a product, directly, through
    reshapes that only add or drop size-1 axes, or under an elementwise epilogue of the same
    shape (a Linear layer's bias and activation: x.linear(w.T, b).gelu()), and neither factor
    holds a reduction."""
    reductions = [n for n in value.toposort if n.op is Ops.REDUCE_AXIS]
    if len(reductions) != 1:
        return None
    reduce = reductions[0]
    if reduce.arg[0] is not Ops.ADD or not dtypes.is_float(reduce.dtype) or \
            reduce.src[0].op is not Ops.MUL or not _elementwise_above(value, reduce):
        return None
    if [n for n in value.shape if n > 1] != [n for n in reduce.shape if n > 1]:
        return None
    x, y = reduce.src[0].src
    return reduce, x, y


def _elementwise_above(value: UOp, reduce: UOp) -> bool:
    """Is every op between the stored value and `reduce` elementwise (or a reshape)? Then the
    sum's output axes are the value's: the epilogue moves with it when the output is stored
    channels last. (Reads of other buffers in the epilogue, a bias, may use any view.)"""
    reaching: set[UOp] = set()  # the nodes whose value depends on the sum
    for node in value.toposort:  # (sources first)
        if node is reduce or any(source in reaching for source in node.src):
            reaching.add(node)
    return all(node.op in ALU or node.op is Ops.RESHAPE for node in reaching - {reduce})


def _axes_used(node: UOp, shape: tuple[int, ...]) -> set[int] | None:
    """The axes of `shape` that `node`'s value may depend on: those whose loop appears in a
    buffer position or a padding condition it reaches (simplified first). None when it reads
    something this cannot follow (a gather's index, an op that is not a view or ALU)."""
    loops = tuple(UOp(Ops.RANGE, dtypes.int32, (), ("r", k, n)) for k, n in enumerate(shape))
    expressions: list[UOp] = []
    stack: list[tuple[UOp, tuple[UOp, ...]]] = [(node, loops)]
    seen: set[tuple[UOp, tuple[UOp, ...]]] = set()
    while stack:
        current, index = stack.pop()
        if (current, index) in seen:
            continue
        seen.add((current, index))
        if current.op is Ops.DEFINE_GLOBAL:
            expressions.extend(index)
        elif current.op in MOVEMENT:
            inner, condition = view_index(current, index)
            expressions.extend([] if condition is None else [condition])
            stack.append((current.src[0], inner))
        elif current.op in ALU:
            stack.extend((source, index) for source in current.src)
        elif current.op is not Ops.CONST:
            return None
    reached: set[UOp] = set()
    for expression in expressions:
        simplified = graph_rewrite(expression, symbolic, memo=_symbolic_memo)
        if any(n.op is Ops.LOAD for n in simplified.toposort):
            return None
        reached.update(n for n in simplified.toposort if n.op is Ops.RANGE)
    return {k for k, loop in enumerate(loops) if loop in reached}


def _build_channel_plan(ast: UOp, value: UOp, reduce: UOp, axis: int, packed: UOp,
                        other_axes: set[int], width: int) -> ChannelPlan | None:
    """Pack `packed` (evaluated over the axes it uses, channel axis last) into a new input of
    the kernel, and store the kernel's value channels last (or only its sum, when the ops
    after it would keep a kernel of `width` lanes scalar: `_epilogue_after_unpacking`)."""
    if any(n.op is Ops.DEFINE_GLOBAL and n.arg[0] == 0 for n in value.toposort):
        return None  # the kernel reads its own output (an in-place update)
    shape = reduce.src[0].shape
    kept = sorted(_axes_used(packed, shape) or ())
    operand = packed.shrink(tuple((0, n) if a in kept else (0, 1) for a, n in enumerate(shape)))
    operand = operand.reshape(tuple(shape[a] for a in kept))
    order = tuple(k for k, a in enumerate(kept) if a != axis) + (kept.index(axis),)
    defines = sorted({n for n in packed.toposort if n.op is Ops.DEFINE_GLOBAL},
                     key=lambda n: n.arg[0])
    renumbered = {d: UOp(Ops.DEFINE_GLOBAL, d.dtype, (), (k + 1, d.arg[1]))
                  for k, d in enumerate(defines)}
    copied = operand.substitute(renumbered).permute(order)
    size = prod(copied.shape)
    pack_ast = _store_ast(UOp(Ops.DEFINE_GLOBAL, packed.dtype, (), (0, size)), copied)
    number = 1 + max(n.arg[0] for n in ast.toposort if n.op is Ops.DEFINE_GLOBAL)
    panels = UOp(Ops.DEFINE_GLOBAL, packed.dtype, (), (number, size))
    inverse = tuple(order.index(k) for k in range(len(order)))
    reread = panels.reshape(copied.shape).permute(inverse).reshape(
        tuple(n if a in kept else 1 for a, n in enumerate(shape))).expand(shape)
    inputs = tuple(d.arg[0] for d in defines)
    packed_sum = reduce.substitute({packed: reread})

    def plan(kernel_ast: UOp, unpack_ast: UOp | None, unpack_slots: tuple[int, ...] = (),
             result_size: int = 0) -> ChannelPlan:
        kernel_ast, slots = _dense_inputs(kernel_ast, number)
        return ChannelPlan(inputs, pack_ast, size, kernel_ast, slots, unpack_ast, packed.dtype,
                           reduce.shape[axis], unpack_slots, result_size)
    split = _sum_blocks(value, reduce, axis)
    if split is not None:  # (the partial sums are the value: a bare sum has no epilogue)
        partial = _partial_sums(packed_sum, *split)
        return plan(*_channels_last_output(ast, partial, partial, axis, other_axes, split[0]),
                    result_size=prod(partial.shape))
    kernel_ast, unpack_ast = _channels_last_output(ast, value.substitute({packed: reread}),
                                                   reduce, axis, other_axes)
    if unpack_ast is not None and _epilogue_reads(value, reduce) and \
            reduce.dtype == value.dtype and not _vectorizes(kernel_ast, width):
        return plan(*_epilogue_after_unpacking(ast, value, reduce, packed_sum, axis, other_axes,
                                               number))
    return plan(kernel_ast, unpack_ast)


def _sum_blocks(value: UOp, reduce: UOp, axis: int) -> tuple[int, int] | None:
    """(reduced axis, blocks) when a bare sum is better computed as partial sums over blocks
    of its outermost reduced axis: each tile of the kernel streams the whole sum of the
    packed operand (SUM_SLAB_BYTES or more: its sum length x the channels), which then comes
    from far caches once per tile. beautiful_mnist's second weight gradient reads 6.5 MB per
    tile of 8 x 32 outputs, 100 times; in blocks of 8 images each block's 410 KB stays in
    its core's cache for all 100 tiles (16.5 -> 9.7 ms, and 0.6 ms to add the 16 blocks up).
    None when the sum is short, has an epilogue, or is streamed by few tiles."""
    while value.op is Ops.RESHAPE:
        value = value.src[0]
    if value is not reduce:
        return None
    shape, reduced = reduce.src[0].shape, reduce.arg[1]
    if any(not isinstance(n, int) for n in shape):
        return None
    slab = prod(shape[a] for a in reduced) * reduce.shape[axis] * reduce.dtype.itemsize
    outer = next((a for a in reduced if shape[a] > 1), None)
    tiles = prod(reduce.shape) // (reduce.shape[axis] * 8)  # (8 rows x the channels each)
    if slab < 2 * SUM_SLAB_BYTES or outer is None or tiles < MIN_SUM_TILES:
        return None  # (the first one's weight gradient has 5 tiles of 5 x 32: 1.2 -> 3.3 ms)
    blocks = next((b for b in range(2, shape[outer] + 1)
                   if shape[outer] % b == 0 and slab // b <= SUM_SLAB_BYTES), shape[outer])
    if blocks * prod(reduce.shape) * MIN_PACKED_REUSE > prod(shape):
        return None  # the partial sums would be about as big as what they sum
    return outer, blocks


def _partial_sums(reduce: UOp, summed: int, blocks: int) -> UOp:
    """The sum with its reduced axis `summed` split into `blocks` blocks, each summed on its
    own: the result has `blocks` entries along that axis (their sum is `reduce`)."""
    source = reduce.src[0]
    shape = source.shape
    split = (*shape[:summed], blocks, shape[summed] // blocks, *shape[summed + 1:])
    axes = tuple(summed + 1 if a == summed else a + (a > summed) for a in reduce.arg[1])
    partial = source.reshape(split).reduce(reduce.arg[0], axes)
    return partial.reshape(tuple(blocks if a == summed else n
                                 for a, n in enumerate(reduce.shape)))


def _vectorizes(ast: UOp, width: int, full: bool = False) -> bool:
    """Does the kernel lower to vector code on a CPU of `width` lanes (no gather keeps it
    scalar)? `full`: in vectors of all `width` lanes."""
    options = choose_options(ast, width)
    if not options.vector_width or (full and options.vector_width < width):
        return False
    return vectorize(lower_ast(ast, options)) is not None


def _epilogue_reads(value: UOp, reduce: UOp) -> bool:
    """Does the epilogue after the sum (a bias, a ReLU's mask) read a buffer?"""
    below = set(reduce.toposort)
    return any(n.op is Ops.DEFINE_GLOBAL and n not in below for n in value.toposort)


def _epilogue_after_unpacking(ast: UOp, value: UOp, reduce: UOp, packed_sum: UOp, axis: int,
                              other_axes: set[int],
                              number: int) -> tuple[UOp, UOp, tuple[int, ...]]:
    """The kernel storing the bare sum channels last, and the copy back applying the epilogue
    in the output's own order, with the slots of the copy's buffers. Computed channels last,
    the epilogue's reads would step across channels, a gather that keeps the whole kernel
    scalar: the input gradient of a convolution behind a ReLU (128x32x28x28, a sum over
    32x5x5) took 493 ms so; its ReLU's mask is read in order by the copy (33 ms in all). (A
    bias reads in order channels last too: such an epilogue stays in the kernel.)"""
    bare = packed_sum.reshape(value.shape)
    kernel_ast, unpack_ast = _channels_last_output(ast, bare, reduce, axis, other_axes)
    assert unpack_ast is not None, "the value with its epilogue needed a copy back"
    store = unpack_ast.src[0]
    back = store.src[1]  # the channels-last result read in the output's order (DEFINE_GLOBAL 1)
    result = next(n for n in back.toposort if n.op is Ops.DEFINE_GLOBAL)
    moved = UOp(Ops.DEFINE_GLOBAL, result.dtype, (), (number, result.arg[1]))
    epilogue = value.substitute({reduce: back.substitute({result: moved}).reshape(reduce.shape)})
    copy_ast, slots = _dense_inputs(_store_ast(store.src[0], epilogue), number)
    return kernel_ast, copy_ast, slots


def _dense_inputs(ast: UOp, panels: int) -> tuple[UOp, tuple[int, ...]]:
    """Number the kernel's inputs 0, 1, 2, ... again (an input only the packed factor read is
    gone: the engine passes buffers by position). Returns the AST and, for each new number,
    the old one (`panels` stands for the packed copy)."""
    defines = sorted({n for n in ast.toposort if n.op is Ops.DEFINE_GLOBAL},
                     key=lambda n: n.arg[0])
    renumbered = {d: UOp(Ops.DEFINE_GLOBAL, d.dtype, (), (k, d.arg[1]))
                  for k, d in enumerate(defines)}
    return ast.substitute(renumbered), tuple(d.arg[0] for d in defines)


def _store_ast(output: UOp, value: UOp) -> UOp:
    return UOp(Ops.SINK, dtypes.bool, (UOp(Ops.STORE, value.dtype, (output, value)),))


def _channels_last_output(ast: UOp, value: UOp, reduce: UOp, axis: int, other_axes: set[int],
                          summed: int | None = None) -> tuple[UOp, UOp | None]:
    """The kernel storing `value` with the channel axis last, and the copy back into the
    output's order (None when the channel axis is last already, as in x @ w.T). `summed`:
    `value` holds partial sums along that axis (_partial_sums), which the copy back adds up.

    Before the channel axis comes a block of 8 (or 4) rows along which the other operand moves:
    heuristic._vector_tile computes 8 rows x 16 channels per iteration. The rows are the innermost
    such axis, split in place: (n, y, x // 4, 4, co) for a 20-pixel row, (n // 8, y, x, 8, co)
    for an 11-pixel one. Neighbouring pixels share cache lines; 8 images 72 KB apart (a
    multiple of 4 KB) fall into the same cache sets and evict each other (5 GFLOP/s)."""
    output = ast.src[0].src[0]
    # the value's axes of size > 1 are the reduction's, in order (_product_reduction)
    value_axes = [a for a, n in enumerate(value.shape) if n > 1]
    reduce_axes = [a for a, n in enumerate(reduce.shape) if n > 1]
    channel = value_axes[reduce_axes.index(axis)]
    rows = [value_axes[k] for k, a in enumerate(reduce_axes) if a != axis and
            reduce.shape[a] % 4 == 0 and a in other_axes]
    rows = rows[-1:]  # the innermost: neighbouring pixels (8 images are far apart in memory,
    #                   rows 4 KB apart even fall into the same cache sets)
    last = [rows[0], channel] if rows else [channel]
    order = tuple(a for a in range(len(value.shape)) if a not in last) + tuple(last)
    if [a for a in order if value.shape[a] > 1] == value_axes and summed is None:
        return _store_ast(output, value), None  # the same order: store as it is
    split = value
    if rows:
        row = rows[0]
        block = 8 if value.shape[row] % 8 == 0 else 4
        split = value.reshape((*value.shape[:row], value.shape[row] // block, block,
                               *value.shape[row + 1:]))
        kept = [a + (a > row) for a in range(len(value.shape)) if a != channel]
        order = (*kept, row + 1, channel + (channel > row))
    permuted = split.permute(order)
    size = prod(value.shape)  # the output's elements, or the partial sums'
    kernel_ast = _store_ast(UOp(Ops.DEFINE_GLOBAL, value.dtype, (), (0, size)), permuted)
    result = UOp(Ops.DEFINE_GLOBAL, value.dtype, (), (1, size))
    inverse = tuple(order.index(k) for k in range(len(order)))
    back = result.reshape(permuted.shape).permute(inverse).reshape(value.shape)
    if summed is not None:
        back = back.reduce(Ops.ADD, (summed,)).reshape(kernel_value(ast).shape)
    return kernel_ast, _store_ast(UOp(Ops.DEFINE_GLOBAL, value.dtype, (), output.arg), back)


def _channel_items(item: ScheduleItem, plan: ChannelPlan) -> list[ScheduleItem]:
    """The packing copy, the kernel reading it (into a channels-last buffer when the output is
    unpacked after), and the copy back into the output."""
    panels = Buffer(item.device, plan.packed_size, plan.dtype)
    name = f"pack_c{plan.channel_size}_{plan.packed_size}"
    sources = ", ".join(f"input {number}" for number in plan.inputs)
    pack = ScheduleItem(
        "kernel", name, plan.pack_ast, [panels, *(item.buffers[n] for n in plan.inputs)],
        item.device, f"packing: a factor of {item.name} ({sources}) copied with its channel "
        f"axis last, so the kernel reads {plan.channel_size} channels as vectors",
        ["a permute, made contiguous"],
        [f"input {k + 1}: input {n} of {item.name}" for k, n in enumerate(plan.inputs)])
    every = [*item.buffers, panels]
    buffers = [every[slot] for slot in plan.kernel_slots]
    reasons = [f"input {k + 1}: the channels-last copy {name}" if slot == len(item.buffers)
               else f"input {k + 1}: input {slot} of the kernel before packing"
               for k, slot in enumerate(plan.kernel_slots[1:])]
    if plan.unpack_ast is None:
        return [pack, replace(item, ast=plan.kernel_ast, buffers=buffers, input_reasons=reasons)]
    channels_last = Buffer(item.device, plan.result_size or item.output.size, item.output.dtype)
    kernel = replace(item, ast=plan.kernel_ast, buffers=[channels_last, *buffers[1:]],
                     input_reasons=reasons, boundary_reason="channels last, for the unpacking "
                     f"copy into {item.name}'s output", node=None, input_nodes=[])
    # the copy back reads the channels-last result, and the epilogue's inputs when it moved
    # there (_epilogue_after_unpacking)
    slots = plan.unpack_slots or (0, len(item.buffers))
    moved = len(slots) > 2
    every = [*item.buffers, channels_last]
    result = "sum" if moved else "result"
    unpack = ScheduleItem(
        "kernel", f"unpack_{item.name}", plan.unpack_ast, [every[slot] for slot in slots],
        item.device, item.boundary_reason,
        ["a permute back into the output's order" + (
            ", and the ops after the sum (they read their other inputs in that order)"
            if moved else "")],
        [f"input {k + 1}: {item.name}'s {result}, channels last" if slot == len(item.buffers)
         else f"input {k + 1}: input {slot} of the kernel before packing"
         for k, slot in enumerate(slots[1:])], [], item.node, item.input_nodes)
    return [pack, kernel, unpack]


def _vector_width(item: ScheduleItem) -> int:
    if item.kind != "kernel":
        return 0
    return Device[item.device].capabilities.vector_width  # (0: no vector types, or no renderer)


def plan_packing(ast: UOp, vector_width: int) -> PackPlan | None:
    """The packing a kernel profits from, or None (remembered per kernel)."""
    return remember(_plans, (ast, vector_width), lambda: _plan(ast, vector_width))


def _plan(ast: UOp, vector_width: int) -> PackPlan | None:
    """Pack the vector tile's `b` (read along the vector axis, in panels of the tile's columns)
    or else its `a` (each step's few scalars, read along the other upcast axis, in panels of
    the tile's rows): whichever walks its sum's rows far apart in a big buffer. A GPT's weight
    gradient, X.T @ dY over 1024 rows of activations, reads 8 floats of each 2 KB row of X:
    those rows fall into two cache sets, and the kernel ran at half the speed of the same
    product over packed panels (0.73 -> 0.35 ms)."""
    options = choose_options(ast, vector_width)
    if not options.vector_width:
        return None
    value = kernel_value(ast)
    reduces = [n for n in value.toposort if n.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1:
        return None
    reduce = reduces[0]
    vector_axis, panel = options.upcasts[-1]
    columns = [(_matching_axis(value.shape, vector_axis, reduce.shape), panel)]
    if len(options.upcasts) >= 2:  # the tile's rows: the columns of `a`
        row_axis, rows = options.upcasts[0]
        columns.append((_same_axis(value.shape, row_axis, reduce.shape), rows))
    for column_axis, width in columns:
        if column_axis is None:
            continue
        for chain in buffer_reads(reduce.src[0]):
            plan = _plan_for_chain(ast, chain, column_axis, reduce.arg[1], width)
            if plan is not None:
                return plan
    return None


def _matching_axis(shape: tuple[int, ...], axis: int, reduce_shape: tuple[int, ...]) -> int | None:
    """The reduction's axis that is the kernel's output axis `axis` (the last one of size > 1
    in both, with the same size), or None when a reshape between them mixes axes."""
    outer = [a for a, size in enumerate(shape) if size > 1]
    inner = [a for a, size in enumerate(reduce_shape) if size > 1]
    if not outer or not inner or outer[-1] != axis or reduce_shape[inner[-1]] != shape[axis]:
        return None
    return inner[-1]


def _same_axis(shape: tuple[int, ...], axis: int, reduce_shape: tuple[int, ...]) -> int | None:
    """The reduction's axis that is output axis `axis`, when the output's axes of size > 1
    are the reduction's, in order and of the same sizes (no reshape mixes them)."""
    outer = [a for a, size in enumerate(shape) if size > 1]
    inner = [a for a, size in enumerate(reduce_shape) if size > 1]
    if axis not in outer or [shape[a] for a in outer] != [reduce_shape[a] for a in inner]:
        return None
    return inner[outer.index(axis)]


def _plan_for_chain(ast: UOp, chain: UOp, column: int, reduced: tuple[int, ...],
                    panel: int) -> PackPlan | None:
    """Pack this read when it walks columns in order and the rows of its sum far apart, reads
    a big buffer, and has no padding (a packed copy of padding would need the guard too). A sum
    over several axes (a batch's sequences and positions) is one walk when they lie one after
    the other in memory: each outer one steps over the whole inner one."""
    define = chain
    while define.op in MOVEMENT:
        if define.op is Ops.PAD:
            return None
        define = define.src[0]
    size = define.arg[1]
    if size < PACK_MIN_ELEMENTS:
        return None
    shape = chain.shape
    loops = tuple(UOp(Ops.RANGE, dtypes.int32, (), ("r", k, n)) for k, n in enumerate(shape))
    maybe_steps = [step_along(chain, loops, loop) for loop in loops]
    steps = [step for step in maybe_steps if step is not None]
    if len(steps) != len(loops) or steps[column] != 1 or shape[column] % panel:
        return None
    rows = [axis for axis in reduced if shape[axis] > 1]
    if not rows or 0 in (steps[axis] for axis in rows) or \
            any(steps[outer] != steps[inner] * shape[inner]
                for outer, inner in zip(rows, rows[1:])) or \
            abs(steps[rows[-1]]) * define.dtype.itemsize < PACK_MIN_ROW_BYTES:
        return None
    broadcast = [axis for axis, step in enumerate(steps) if step == 0 and shape[axis] > 1]
    # the operand without its broadcast axes: e.g. b as (K, J) out of a matmul's (I, J, K)
    kept = [axis for axis in range(len(shape)) if axis not in broadcast]
    operand = chain.shrink(tuple((0, 1) if a in broadcast else (0, n) for a, n in enumerate(shape)))
    operand = operand.reshape(tuple(shape[a] for a in kept))
    split, order = _panel_layout([shape[a] for a in kept], kept.index(column),
                                 [kept.index(a) for a in rows], panel)
    packed_value = operand.reshape(split).permute(order)
    panels_shape = packed_value.shape
    new_input = UOp(Ops.DEFINE_GLOBAL, define.dtype, (), (1, size))
    output = UOp(Ops.DEFINE_GLOBAL, define.dtype, (), (0, prod(panels_shape)))
    copy_value = packed_value.substitute({define: new_input})
    copy_ast = UOp(Ops.SINK, dtypes.bool, (UOp(Ops.STORE, define.dtype, (output, copy_value)),))
    # the kernel reads the panels (in the operand's place) back in the operand's order, then
    # broadcasts them as before
    panels = UOp(Ops.DEFINE_GLOBAL, define.dtype, (), (define.arg[0], prod(panels_shape)))
    inverse = tuple(order.index(k) for k in range(len(order)))
    unpacked = panels.reshape(panels_shape).permute(inverse).reshape(operand.shape)
    reread = unpacked.reshape(tuple(1 if a in broadcast else n for a, n in enumerate(shape)))
    if any(define in n.src and n not in chain.toposort for n in ast.toposort):
        return None  # the kernel also reads the operand elsewhere: leave it as it is
    kernel_ast = ast.substitute({chain: reread.expand(shape)})
    return PackPlan(define.arg[0], copy_ast, kernel_ast, prod(panels_shape), define.dtype, panel)


def _panel_layout(sizes: list[int], column: int, rows: list[int],
                  panel: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split the column axis into (panels, panel) and order the axes so that each panel is
    consecutive: (other axes..., panel number, rows..., column within the panel). Returns the
    split shape and the permutation."""
    split_positions: list[int] = []
    position = 0
    for k in range(len(sizes)):
        split_positions.append(position)
        position += 2 if k == column else 1
    others = [split_positions[k] for k in range(len(sizes)) if k != column and k not in rows]
    order = (*others, split_positions[column], *(split_positions[k] for k in rows),
             split_positions[column] + 1)
    split = tuple(n for k, size in enumerate(sizes)
                  for n in ((size // panel, panel) if k == column else (size,)))
    return split, order

