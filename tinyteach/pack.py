"""Chapter 7 (part 4): packing — copying an operand into the order its kernel reads it.

A vector matmul tile (opt.py) reads, at each step of its sum, 32 consecutive floats of one row
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

Builds on: opt.py (which kernels get a vector tile), schedule.py (ScheduleItem).
Used by: realize.build_schedule, between scheduling and running (so viz draws the packing
kernels too).
"""
from __future__ import annotations

from dataclasses import dataclass

from tinyteach.device import Buffer, Device
from tinyteach.dtype import DType, dtypes
from tinyteach.helpers import NOOPT, LRUCache, prod, remember
from tinyteach.opt import buffer_reads, choose_options, kernel_value, step_along
from tinyteach.schedule import ScheduleItem
from tinyteach.uop import MOVEMENT, Ops, UOp

PACK_MIN_ELEMENTS = 1 << 20   # 4 MB of float32: smaller operands stay in cache unpacked
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
        if plan is None:
            packed.append(item)
            continue
        packed.extend(_packed_pair(item, plan))
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


def _vector_width(item: ScheduleItem) -> int:
    if item.kind != "kernel":
        return 0
    renderer = Device[item.device].renderer
    return renderer.vector_width if renderer is not None else 0


def plan_packing(ast: UOp, vector_width: int) -> PackPlan | None:
    """The packing a kernel profits from, or None (remembered per kernel)."""
    return remember(_plans, (ast, vector_width), lambda: _plan(ast, vector_width))


def _plan(ast: UOp, vector_width: int) -> PackPlan | None:
    options = choose_options(ast, vector_width)
    if not options.vector_width:
        return None
    value = kernel_value(ast)
    reduces = [n for n in value.toposort if n.op is Ops.REDUCE_AXIS]
    if len(reduces) != 1 or len(reduces[0].arg[1]) != 1:
        return None
    reduce = reduces[0]
    vector_axis, panel = options.upcasts[-1]
    column_axis = _matching_axis(value.shape, vector_axis, reduce.shape)
    if column_axis is None:
        return None
    for chain in buffer_reads(reduce.src[0]):
        plan = _plan_for_chain(ast, chain, column_axis, reduce.arg[1][0], panel)
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


def _plan_for_chain(ast: UOp, chain: UOp, column: int, row: int, panel: int) -> PackPlan | None:
    """Pack this read when it walks columns in order and rows far apart, reads a big buffer,
    and has no padding (a packed copy of padding would need the guard too)."""
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
    if len(steps) != len(loops) or steps[column] != 1 or \
            abs(steps[row]) * define.dtype.itemsize < PACK_MIN_ROW_BYTES:
        return None
    broadcast = [axis for axis, step in enumerate(steps) if step == 0 and shape[axis] > 1]
    # the operand without its broadcast axes: e.g. b as (K, J) out of a matmul's (I, J, K)
    kept = [axis for axis in range(len(shape)) if axis not in broadcast]
    operand = chain.shrink(tuple((0, 1) if a in broadcast else (0, n) for a, n in enumerate(shape)))
    operand = operand.reshape(tuple(shape[a] for a in kept))
    split, order = _panel_layout([shape[a] for a in kept], kept.index(column), kept.index(row),
                                 panel)
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


def _panel_layout(sizes: list[int], column: int, row: int,
                  panel: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split the column axis into (panels, panel) and order the axes so that each panel is
    consecutive: (other axes..., panel number, row, column within the panel). Returns the
    split shape and the permutation."""
    split_positions: list[int] = []
    position = 0
    for k in range(len(sizes)):
        split_positions.append(position)
        position += 2 if k == column else 1
    others = [split_positions[k] for k in range(len(sizes)) if k not in (column, row)]
    order = (*others, split_positions[column], split_positions[row], split_positions[column] + 1)
    split = tuple(n for k, size in enumerate(sizes)
                  for n in ((size // panel, panel) if k == column else (size,)))
    return split, order

