"""Chapter 6: scheduling — cutting the lazy graph into kernels (fusion).

What this teaches:
- a kernel reads some buffers and writes one; everything computed in between stays in registers.
  Fewer kernels means less memory traffic, so we fuse as much as we can;
- elementwise ops always fuse: into the input of a reduction, onto its output, and with each
  other (an elementwise node used by two kernels is simply recomputed in both — it is cheap —
  unless recomputing reads more than storing would: a GPT's residual stream, x0 + a1 + m1 +
  ..., is stored where it forks, `_store_wide_recomputations`);
- a reduction must be stored in its own buffer when its result is broadcast back over the axes it
  reduced (softmax's max), feeds another reduction, or is needed by more than one kernel;
- ... except a chain of reductions over the same short rows (`fuses_along_rows`: rows of at most
  MAX_FUSED_ROW_BYTES, the innermost axes, a device whose output loops are loops or a GPU whose
  work-group holds the row, `fuses_rows_on`): softmax and
  layernorm become one kernel that computes each row's reductions once, before the row's
  outputs (codegen/lower.py places them), reading the row again from cache. FUSE_ROWS=0 turns it
  off;
- `assign` writes into a buffer that already exists, so every kernel reading its old value runs
  first; when assigns read each other's old values (SGD over both `x` and `W` of `x @ W`), no
  order works, and one old value is copied into a fresh buffer before anything is overwritten;
- a very long chain of elementwise ops (`x = x + 1` in a loop of 100,000) is cut every
  `MAX_KERNEL_DEPTH` ops, so that no kernel's source grows too big to render and compile;
- every cut and every fusion is written down in plain words (`ScheduleItem.boundary_reason`,
  `.fusions`), so DEBUG=3 and viz can tell you *why* the kernels are what they are.

A kernel's AST is a UOp graph: SINK(STORE(DEFINE_GLOBAL 0, value)), where `value` is made of the
same ops as the Tensor graph and reads its inputs from DEFINE_GLOBAL 1, 2, ...

Builds on: ir/uop.py, device.py (Buffer). Used by: engine/realize.py (runs the schedule),
codegen/lower.py.

>>> from tinyteach import Tensor
>>> a, b, c = Tensor.ones(4, 4).realize(), Tensor.ones(4, 4).realize(), Tensor.ones(4, 4).realize()
>>> [item.name for item in create_schedule([((a + b) * c).relu().sum(1).uop], "NUMPY")[0]]
['r_4_4']
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

from tinyteach.device import NO_CAPABILITIES, Buffer, Capabilities, Device
from tinyteach.dtype import dtypes
from tinyteach.helpers import prod
from tinyteach.ir.uop import (
    ALU,
    MOVEMENT,
    Ops,
    UOp,
    base_buffer,
    sym_max,
    sym_prod,
    sym_str,
    symbolic_view,
    toposort_of,
)
from tinyteach.settings import FUSE_ROWS, NOOPT

# movement ops through which a reduction's result can still be read inside the same kernel:
# each output element needs at most one element of the reduction, so nothing is recomputed
FUSABLE_AFTER_REDUCE = (Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP)


@dataclass
class ScheduleItem:
    """One step of a schedule: a kernel (or a copy) with its buffers, output first."""

    kind: str                 # "kernel" or "copy"
    name: str
    ast: UOp                  # SINK(STORE(...)) for a kernel; the COPY node for a copy
    buffers: list[Buffer]
    device: str
    boundary_reason: str      # why this kernel's result is stored in memory
    fusions: list[str] = field(default_factory=list)
    input_reasons: list[str] = field(default_factory=list)
    old_contents_read: list[Buffer] = field(default_factory=list)  # read before any assign
    node: UOp | None = None              # the realized node this item computes
    input_nodes: list[UOp] = field(default_factory=list)
    # the values of the Variables its sizes use, for this run (name -> value): the AST holds
    # the unbound variables, so one compiled kernel serves every value
    var_vals: dict[str, int] = field(default_factory=dict)

    @property
    def output(self) -> Buffer:
        return self.buffers[0]


# ---- step 1: which nodes get their own buffer, and why ----

def _users(roots: list[UOp]) -> dict[UOp, list[UOp]]:
    users: dict[UOp, list[UOp]] = defaultdict(list)
    for node in _toposort(roots):
        for source in node.src:
            users[source].append(node)
    return users


def _toposort(roots: list[UOp]) -> list[UOp]:
    if len(roots) == 1:
        return roots[0].toposort  # (cached on the root: every step of the schedule asks)
    return toposort_of(roots)


def is_view_of_buffer(node: UOp) -> bool:
    """A chain of movement ops over a realized buffer: nothing to compute."""
    while node.op in MOVEMENT:
        node = node.src[0]
    return node.op is Ops.BUFFER


def is_contiguous_buffer(node: UOp) -> bool:
    """A buffer, possibly reshaped: its memory already holds the values in row-major order."""
    return base_buffer(node) is not None


def find_realized(outputs: list[UOp], devices: dict[UOp, str] | None = None) -> dict[UOp, str]:
    """Every node whose value must be stored in a buffer, with the reason in plain words.
    `devices`: each node's device (devices_of); where it is known, a chain of reductions over
    the rows of a device whose output loops are loops (not GPU threads) may fuse into one
    kernel (`fuses_along_rows`)."""
    realized: dict[UOp, str] = {}
    for out in outputs:
        if not is_view_of_buffer(out):
            realized.setdefault(out, "it is an output: realize() asked for it")
    users = _users(outputs)
    order = _toposort(outputs)
    for node in order:
        if node.op is Ops.CONTIGUOUS:
            realized.setdefault(node, "contiguous() asks for a fresh buffer")
        if node.op is Ops.COPY:
            realized.setdefault(node, "a copy between devices is its own step")
            if not is_contiguous_buffer(node.src[0]):
                realized.setdefault(node.src[0], "its value is copied to another device")
        if node.op is Ops.ASSIGN:
            realized.setdefault(node, "assign() writes the value into the tensor's own buffer")
    # walk from the outputs down, so each node's users are decided before the node itself
    kernels_of: dict[UOp, set[UOp]] = {}
    ops_above: dict[UOp, frozenset[Ops]] = {}
    views: dict[UOp, frozenset[int]] = {}
    feeds_reduction: dict[UOp, bool] = {}
    # (only the stores marked above can lie below a node when the loop reaches it: the loop
    # decides users before their sources)
    reaches = reaches_a_reduction(order, realized) if devices is not None else {}
    for node in reversed(order):
        ops_above[node] = _ops_between(node, users, realized, ops_above)
        views[node] = _views_read(node, users, realized, views)
        feeds_reduction[node] = _feeds_reduction(node, users, realized, feeds_reduction)
        if node in realized or node.op is Ops.BUFFER:
            kernels_of[node] = {node}
            continue
        kernels_of[node] = set().union(*(kernels_of[u] for u in users[node]))
        if node.op is Ops.REDUCE_AXIS:
            reason = _reduce_must_be_stored(node, realized, kernels_of, ops_above)
            if reason is not None and len(kernels_of[node]) == 1 and devices is not None and \
                    fuses_along_rows(node, users, realized, ops_above[node], devices[node]):
                reason = None  # computed once per row in its one kernel, before the row's outputs
        else:
            per_row = devices is not None and is_row_result(node, devices[node], reaches)
            reason = None if per_row else _recomputed_by_broadcast(node, users, realized,
                                                                   feeds_reduction)
            reason = reason or _read_through_many_views(node, views[node])
        if reason is not None:
            realized[node] = reason
            kernels_of[node] = {node}
    _store_wide_recomputations(order, users, realized, kernels_of)
    _cut_deep_chains(order, realized)
    for node in order:  # now that every other kernel is known, the in-place writes
        if node.op is Ops.ASSIGN and _reads_target_through_view(node, realized):
            realized.setdefault(node.src[1], "the assigned value reads its own target through "
                                "a view, so it is computed into a fresh buffer first")
    return realized


# an elementwise value that several kernels recompute is stored when recomputing it reads more
# than storing it would (`_store_wide_recomputations`); below this many elements a kernel's
# launch costs more than the reads it saves
MIN_STORED_ELEMENTS = 16 * 1024
MAX_COUNTED_INPUTS = 64  # inputs are counted up to this many (a sum of 10,000 tensors stays cheap)


def _worth_storing(inputs: int, kernels: int) -> bool:
    """Recomputed in each of `kernels` kernels, a value reads its `inputs` buffers in each:
    inputs x kernels elements per output element. Stored, it reads them once, writes itself
    once and is read once by each kernel: inputs + 1 + kernels."""
    return inputs * kernels > inputs + 1 + kernels


def _store_wide_recomputations(order: list[UOp], users: dict[UOp, list[UOp]],
                               realized: dict[UOp, str], kernels_of: dict[UOp, set[UOp]]) -> None:
    """Store an elementwise value that several kernels recompute from many buffers. A GPT's
    residual stream is such a value: x4 = x0 + a1 + m1 + ... + m4 (each sublayer's output added
    on), read by the next LayerNorm, the next residual add and the backward. Recomputed, the
    last block's kernels read 17 buffers for every element of x (and their sources, 15 KB of C
    each, cost gcc half a second); stored, each residual is one read. From the sources up, so a
    value's inputs are counted with the stores decided below it."""
    inputs: dict[UOp, frozenset[UOp]] = {}
    for node in order:
        if node in realized or node.op in (Ops.BUFFER, Ops.REDUCE_AXIS):
            inputs[node] = frozenset((node,))
            continue
        below = frozenset().union(*(inputs[s] for s in node.src))
        if len(below) > MAX_COUNTED_INPUTS:
            below = frozenset(list(below)[:MAX_COUNTED_INPUTS + 1])
        inputs[node] = below
        kernels = len(kernels_of.get(node, ()))
        if node.op in ALU and kernels > 1 and len(set(users[node])) > 1 and \
                sym_max(sym_prod(node.shape)) >= MIN_STORED_ELEMENTS and \
                _worth_storing(len(below), kernels):
            realized[node] = (f"{kernels} kernels would each recompute it from {len(below)} "
                              "buffers: stored once, it is one read in each")
            inputs[node] = frozenset((node,))


# the most ALU ops one kernel computes one after the other. A renderer writes a chain of values
# used once as one nested expression, (((x + 1) + 1) + ...), and the text of every level is kept
# while rendering: memory and time grow with the square of the depth (a chain of 100,000 would
# need ~35 GB). A deeper chain is stored part-way and continued by the next kernel.
MAX_KERNEL_DEPTH = 1000


def _cut_deep_chains(order: list[UOp], realized: dict[UOp, str]) -> None:
    """Store a node wherever the ALU ops computed in one kernel would chain deeper than
    MAX_KERNEL_DEPTH: `x = x + 1` done 100,000 times becomes 100 kernels of 1,000 adds each.
    (Sources first: a node's depth is that of its deepest source computed in the same kernel;
    a reduction's result is an accumulator, so the chain starts again above it.)"""
    depth: dict[UOp, int] = {}
    for node in order:
        below = max((depth[s] for s in node.src if s not in realized), default=0)
        if node.op is Ops.REDUCE_AXIS:
            below = 0
        depth[node] = below + (1 if node.op in ALU else 0)
        if depth[node] >= MAX_KERNEL_DEPTH and node not in realized:
            realized[node] = (f"the chain of ops is {MAX_KERNEL_DEPTH} deep here: cut so each "
                              "kernel's source stays small enough to render and compile")


# a computed value read through this many different views (or more) within its kernels is stored:
# each view lowers, and computes, the whole graph below it once more, and views of views multiply
# (`x = x.pad(...).shrink(...) + x.flip(0)`, repeated, doubles the work at every step)
MAX_VIEWS_PER_NODE = 64


def _views_read(node: UOp, users: dict[UOp, list[UOp]], realized: dict[UOp, str],
                views: dict[UOp, frozenset[int]]) -> frozenset[int]:
    """The different index paths (as numbers) by which the kernels above read `node`: an
    elementwise user reads it at its own index, a movement op or a reduction maps each of its
    paths through one more index function, and a stored user starts a kernel of its own.
    (From the users' own sets: the walk from the outputs down visits users first.)"""
    found = []
    for user in dict.fromkeys(users[node]):
        if user in realized:
            found.append(frozenset((id(user),)))
        elif user.op in MOVEMENT or user.op is Ops.REDUCE_AXIS:
            found.append(frozenset(hash((user, path)) for path in views[user]))
        else:
            found.append(views[user])
    return found[0] if len(found) == 1 else frozenset().union(*found)


def _read_through_many_views(node: UOp, paths: frozenset[int]) -> str | None:
    if node.op not in ALU or len(paths) < MAX_VIEWS_PER_NODE:
        return None
    return (f"it is read through {len(paths)} different views: stored once instead of "
            "computed again for each (views of views multiply)")


# elementwise work broadcast this many times (or more) into a reduction is stored, not recomputed
BROADCAST_RECOMPUTE_LIMIT = 16
COSTLY_OPS = 12            # ... and work of this many ALU ops per element or more ...
MIN_BROADCAST_COPIES = 8   # ... is stored from this many copies on (a 3x3 window: 9)


def _recomputed_by_broadcast(node: UOp, users: dict[UOp, list[UOp]], realized: dict[UOp, str],
                             feeds_reduction: dict[UOp, bool]) -> str | None:
    """An elementwise result read through an EXPAND by a reduction (dW = dH.T @ X reads dH once
    per column of X) would be recomputed for every broadcast copy: store it once instead, from
    BROADCAST_RECOMPUTE_LIMIT copies of 2 ops or more, or MIN_BROADCAST_COPIES copies of
    COSTLY_OPS ops or more. A convolution with one input channel reads its output gradient 9
    times (3x3 taps), and that gradient, behind a max-pool and a ReLU, is 15 ops: recomputed
    per tap, the CNN's conv1 weight gradient took 6.1 ms; stored, it is a plain sum."""
    if node.op not in ALU or sym_max(sym_prod(node.shape)) < BROADCAST_RECOMPUTE_LIMIT:
        return None  # (a few elements are cheaper to recompute than a kernel is to launch)
    elements = max(sym_max(sym_prod(node.shape)), 1)
    copies = [sym_max(sym_prod(expand.shape)) // elements
              for expand in _expands_above(node, users) if feeds_reduction[expand]]
    if not copies or max(copies) < MIN_BROADCAST_COPIES:
        return None  # (before counting its ops: most nodes are broadcast into no reduction)
    work = _alu_work(node, realized, limit=COSTLY_OPS)
    if work < 2:
        return None
    copies_needed = BROADCAST_RECOMPUTE_LIMIT if work < COSTLY_OPS else MIN_BROADCAST_COPIES
    factor = next((f for f in copies if f >= copies_needed), None)
    if factor is None:
        return None
    return (f"it is broadcast {factor}x into a reduction: stored once instead of "
            f"recomputed for each copy")


def _expands_above(node: UOp, users: dict[UOp, list[UOp]]) -> list[UOp]:
    """The EXPANDs that read `node` directly or through other movement ops, other EXPANDs
    included: a 5x5 window is one expand per axis (pool's _windows_1d, 6 copies each), and
    only the second one's shape counts all the copies (36, of which 25 taps are read); by the
    first alone, the ReLU of beautiful_mnist's first convolution was recomputed for each of
    the 25 taps of the second."""
    found, stack, seen = [], list(users[node]), set()
    while stack:
        user = stack.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op in MOVEMENT:
            if user.op is Ops.EXPAND:
                found.append(user)
            stack.extend(users[user])
    return found


def _feeds_reduction(node: UOp, users: dict[UOp, list[UOp]], realized: dict[UOp, str],
                     feeds_reduction: dict[UOp, bool]) -> bool:
    """Is `node` read by a reduction in its own kernel (through elementwise and movement ops)?
    From its users' answers, which the walk from the outputs down has already found."""
    for user in users[node]:
        if user.op is Ops.REDUCE_AXIS:  # (stored or not, it reads the broadcast inside its loop)
            return True
        if user not in realized and (user.op in ALU or user.op in MOVEMENT) and \
                feeds_reduction[user]:
            return True
    return False


def _alu_work(node: UOp, realized: dict[UOp, str], limit: int = 2) -> int:
    """How many ALU ops (up to `limit`) compute `node` inside one kernel."""
    count, stack, seen = 0, [node], set()
    while stack and count < limit:
        current = stack.pop()
        if current in seen or (current is not node and current in realized):
            continue
        seen.add(current)
        if current.op is Ops.REDUCE_AXIS:
            continue  # one result per row, stored or fused: not recomputed per broadcast copy
        if current.op in ALU and current.op is not Ops.CAST:
            count += 1
        stack.extend(current.src)
    return count


def _reduce_must_be_stored(node: UOp, realized: dict[UOp, str], kernels_of: dict[UOp, set[UOp]],
                           ops_above: dict[UOp, frozenset[Ops]]) -> str | None:
    if len(kernels_of[node]) > 1:
        return (f"the reduction is used by {len(kernels_of[node])} kernels: computed once "
                "and stored, not recomputed in each")
    # sorted: a set of Ops iterates in an order that changes from process to process
    for path_op in sorted(ops_above[node], key=lambda op: op.value):
        if path_op is Ops.EXPAND:
            return ("the reduction's result is broadcast back (EXPAND): storing it avoids "
                    "recomputing the reduction for every element")
        if path_op is Ops.REDUCE_AXIS:
            return "the reduction feeds another reduction"
        if path_op is Ops.PAD:
            return "the reduction's result is padded before use"
    return None


def _ops_between(node: UOp, users: dict[UOp, list[UOp]], realized: dict[UOp, str],
                 ops_above: dict[UOp, frozenset[Ops]]) -> frozenset[Ops]:
    """The ops on the paths from `node` up to the buffers it is stored into (not through ALU ops
    that merely combine, nor the fusable movement ops). Made from its users' own sets, which
    the walk from the outputs down has already found: walking up from every reduction instead
    would cost the square of the depth (a sum of 10,000 sums)."""
    found: set[Ops] = set()
    for user in users[node]:
        if user.op not in ALU and user.op not in FUSABLE_AFTER_REDUCE and user.op is not Ops.DETACH:
            found.add(user.op)
        if user not in realized:
            found |= ops_above[user]
    return frozenset(found)


# ---- a chain of reductions over the same rows, in one kernel ----

# FUSE_ROWS (settings.py), 1 by default: reductions over the rows of a tensor that fit in cache
# fuse into the kernel that reads them (softmax, layernorm: one kernel); 0: each is stored
# the longest row fused: the kernel reads each row two or three times, and a row this size
# (8,192 float32) is still in the core's L1/L2 cache the next time. A longer row would come
# from memory every time, as from three kernels, and leaves fewer rows to split across cores
MAX_FUSED_ROW_BYTES = 32 * 1024
# the longest row a GPU work-group takes whole (64 threads x 32 columns each): plan.MAX_GROUP_ROW,
# which must agree (tests/test_fuse_rows.py checks; engine/schedule.py may not import opt/, a layer
# above it)
MAX_GROUP_ROW = 2048
# the most nodes `fuses_along_rows` visits above one reduction before it gives up (and stores
# it): the check stays linear in the size of the graph
MAX_ROW_WALK = 256
ROW_FUSION_OPS = frozenset({Ops.EXPAND, Ops.REDUCE_AXIS})


def row_bytes(reduce: UOp) -> int:
    """Bytes of one row of a reduction: the elements it combines into one result."""
    shape, axes = reduce.src[0].shape, reduce.arg[1]
    return prod(shape[axis] for axis in axes) * reduce.src[0].dtype.itemsize


def rows_are_innermost(shape: tuple[int, ...], axes: tuple[int, ...]) -> bool:
    """Are the reduced axes after every other axis longer than 1? Then the kernel's loops over
    the other axes are outside those over a row, and a row's result, placed between them, is
    computed once per row (softmax over the last axis, not over the first)."""
    kept = [axis for axis, size in enumerate(shape) if size > 1 and axis not in axes]
    return not kept or not axes or max(kept) < min(axes)


def output_loops_are_threads(device: str) -> bool:
    """Does the device run every output element as its own thread (a GPU renderer)? Then a
    reduction placed before a row's outputs would be computed again by each of their threads.
    Its renderer says so in its Capabilities (`gpu`)."""
    return capabilities(device).gpu


def capabilities(device: str) -> Capabilities:
    """What the device's renderer can do (device.Capabilities); NO_CAPABILITIES for a device
    that cannot run here (its own error comes when it runs)."""
    try:
        return Device[device].capabilities
    except Exception:
        return NO_CAPABILITIES


def fuses_along_rows(reduce: UOp, users: dict[UOp, list[UOp]], realized: dict[UOp, str],
                     above: frozenset[Ops], device: str) -> bool:
    """May a reduction that is broadcast back over its rows, or feeds another reduction over
    the same rows, be computed in the kernel that reads it? Yes when FUSE_ROWS is on, its
    row is at most MAX_FUSED_ROW_BYTES, the rows are the innermost axes, the device can compute
    a row's reductions once per row (`fuses_rows_on`: its output loops are loops, or a GPU
    work-group per row), and everything between it and its kernel's output stays on the same rows
    (`_stays_on_rows`): then codegen/lower.py computes it once per row, before that row's
    outputs."""
    source_shape, axes = reduce.src[0].shape, reduce.arg[1]
    if any(isinstance(size, UOp) for size in source_shape):
        return False  # (a reduction over a symbolic shape keeps the stored path)
    if reduce.has_symbols and output_loops_are_threads(device):
        return False  # (a GPU row needs a work-group: a symbolic kernel gets no options)
    if not FUSE_ROWS or not above <= ROW_FUSION_OPS:
        return False
    if row_bytes(reduce) > MAX_FUSED_ROW_BYTES or not rows_are_innermost(source_shape, axes):
        return False
    return fuses_rows_on(device, reduce) and _stays_on_rows(reduce, users, realized)


def fuses_rows_on(device: str, reduce: UOp | None = None) -> bool:
    """Can the device compute a row's reductions once per row in the kernel of its outputs?
    A device whose output loops are loops can. A GPU whose renderer has work-groups with
    shared memory (Capabilities.group_reduce) can when the row fits one work-group: one long
    reduced axis (the last), at most plan.MAX_GROUP_ROW elements (64 threads x 32 columns
    each); the kernel then takes one work-group per row (codegen/lower_gpu.py's row_output_index).
    Not under NOOPT (no work-groups: every thread would redo its row's reductions)."""
    if not output_loops_are_threads(device):
        return True
    if NOOPT or not capabilities(device).group_reduce:
        return False
    if reduce is None:
        return True
    shape, axes = reduce.src[0].shape, reduce.arg[1]
    long_axes = [axis for axis in axes if shape[axis] > 1]
    return long_axes in ([], [axes[-1]]) and shape[axes[-1]] <= MAX_GROUP_ROW


def reaches_a_reduction(order: list[UOp], realized: dict[UOp, str]) -> dict[UOp, bool]:
    """For each node of `order` (sources first): is it a reduction, or computed from one
    through elementwise ops (and DETACH) that are not stored? Worked out once for the graph,
    so that `is_row_result` costs one look per source, not a walk below every node (a walk per
    node made a 10,000-op chain quadratic)."""
    reaches: dict[UOp, bool] = {}
    for node in order:
        reaches[node] = node.op is Ops.REDUCE_AXIS or (
            node not in realized and (node.op in ALU or node.op is Ops.DETACH) and
            any(reaches.get(source, False) for source in node.src))
    return reaches


def is_row_result(node: UOp, device: str, reaches: dict[UOp, bool]) -> bool:
    """Is `node` computed (in its kernel) from a row reduction's result, like layernorm's mean,
    sum * (1/n)? Broadcast back over the row, it is not recomputed per element: where its
    reduction fuses, codegen/lower.py computes it once per row; where that is stored, it is a little
    elementwise work on the stored result. `reaches`: `reaches_a_reduction` of the graph."""
    if not FUSE_ROWS or node.op not in ALU or not fuses_rows_on(device):
        return False
    return any(reaches.get(source, False) for source in node.src)


def _stays_on_rows(reduce: UOp, users: dict[UOp, list[UOp]], realized: dict[UOp, str]) -> bool:
    """Does every path from the reduction up to its kernel's output keep to the same rows:
    elementwise ops on the full shape or on the row results' shape, EXPANDs from the one to the
    other, and reductions over the same axes?"""
    full, rows, axes = reduce.src[0].shape, reduce.shape, reduce.arg[1]
    seen: set[UOp] = set()
    stack = [reduce]
    while stack:
        for user in users[stack.pop()]:
            if user in seen:
                continue
            seen.add(user)
            if len(seen) > MAX_ROW_WALK or not _keeps_rows(user, full, rows, axes):
                return False
            if user not in realized:
                stack.append(user)
    return True


def _keeps_rows(node: UOp, full: tuple[int, ...], rows: tuple[int, ...],
                axes: tuple[int, ...]) -> bool:
    if node.op in ALU or node.op in (Ops.DETACH, Ops.CONTIGUOUS):
        return node.shape in (full, rows)
    if node.op is Ops.EXPAND:
        return node.src[0].shape == rows and node.shape == full
    if node.op is Ops.REDUCE_AXIS:
        return node.arg[1] == axes and node.src[0].shape == full
    return False


def assign_target(node: UOp) -> Buffer:
    """The buffer an ASSIGN writes into: its target is a (reshaped) realized buffer."""
    target = base_buffer(node.src[0])
    if target is None:
        raise RuntimeError("assign() needs a realized target buffer")
    buffer: Buffer = target.arg
    return buffer


def _reads_target_through_view(node: UOp, realized: dict[UOp, str]) -> bool:
    """Does the assign's own kernel read its target other than element for element? Then
    writing in place would overwrite elements that are still to be read. (Reads in other
    kernels are safe: order_items runs them before the assign.)"""
    target = assign_target(node)
    stack: list[tuple[UOp, bool]] = [(node.src[1], True)]
    while stack:
        current, aligned = stack.pop()
        if current is not node.src[1] and current in realized:
            continue  # computed by another kernel, before this one
        if current.op is Ops.BUFFER and current.arg is target:
            if not aligned:
                return True
            continue
        keeps_alignment = current.op in ALU or current.op in (Ops.RESHAPE, Ops.CONTIGUOUS,
                                                              Ops.DETACH)
        stack.extend((s, aligned and keeps_alignment) for s in current.src)
    return False


# ---- step 2: each realized node becomes a kernel AST ----

@dataclass
class _KernelBuilder:
    """Replaces the kernel's inputs by DEFINE_GLOBALs while copying its graph."""

    buffer_of: dict[UOp, Buffer]
    output: Buffer | None = None
    inputs: list[Buffer] = field(default_factory=list)
    input_nodes: list[UOp] = field(default_factory=list)  # realized nodes this kernel reads
    old_contents_read: list[Buffer] = field(default_factory=list)  # via BUFFER nodes
    input_reasons: list[str] = field(default_factory=list)
    memo: dict[UOp, UOp] = field(default_factory=dict)

    def build(self, root: UOp, realized: dict[UOp, str]) -> UOp:
        """The kernel's value: `root`'s graph down to its inputs, which become DEFINE_GLOBALs.
        (An explicit stack: the graph may be a chain of 100,000 elementwise ops.)"""
        stack: list[tuple[UOp, bool]] = [(root, False)]
        while stack:
            node, sources_done = stack.pop()
            if node in self.memo:
                continue
            inputs = self._copied_sources(node, node is root, realized)
            if inputs is None:
                self.memo[node] = self._input(node, realized, node is root)
            elif not sources_done:
                stack.append((node, True))
                stack.extend((s, False) for s in reversed(inputs) if s not in self.memo)
            elif node.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN):
                self.memo[node] = self.memo[inputs[0]]  # the value passes through
            else:
                self.memo[node] = node.replace(src=tuple(self.memo[s] for s in inputs))
        return self.memo[root]

    @staticmethod
    def _copied_sources(node: UOp, is_root: bool,
                        realized: dict[UOp, str]) -> tuple[UOp, ...] | None:
        """The sources the kernel's copy of `node` is built from; None for a kernel input.
        (A BUFFER is always an input, even as the root: the kernel that copies its old
        contents, see `create_schedule`.)"""
        if node.op is Ops.BUFFER or (not is_root and node in realized):
            return None
        if node.op in (Ops.CONTIGUOUS, Ops.DETACH):
            return node.src[:1]
        if node.op is Ops.ASSIGN:
            return node.src[1:2]  # the value written, not the target
        return node.src

    def _input(self, node: UOp, realized: dict[UOp, str], is_root: bool) -> UOp:
        """A DEFINE_GLOBAL for one input: a realized buffer read as it is (its old contents),
        or the buffer another kernel of this schedule computes (or copied the old contents
        into)."""
        in_memory = node.op is Ops.BUFFER and (is_root or node not in self.buffer_of)
        buffer = node.arg if in_memory else self.buffer_of[node]
        if in_memory and buffer.overwritten:
            raise RuntimeError(f"this graph reads {buffer!r} as it was before assign() wrote into "
                               "it; realize the tensor before the assign (e.g. "
                               "`loss.realize()` before `optim.step()`)")
        if in_memory and buffer not in self.old_contents_read:
            self.old_contents_read.append(buffer)
        if not in_memory:
            self.input_nodes.append(node)
        size: int = buffer.size
        if buffer is self.output:  # an in-place assign reads its own target element-wise
            return symbolic_view(UOp(Ops.DEFINE_GLOBAL, node.dtype, (), (0, size)), node.shape)
        if buffer not in self.inputs:
            self.inputs.append(buffer)
            why = "a realized tensor" if in_memory else realized[node]
            self.input_reasons.append(f"input {len(self.inputs)}: {why}")
        index = 1 + self.inputs.index(buffer)
        define = UOp(Ops.DEFINE_GLOBAL, node.dtype, (), (index, buffer.size))
        return symbolic_view(define, node.shape)


def kernel_name(value: UOp) -> str:
    """tinygrad-style names: E_ for elementwise, r_ for kernels with a reduction, then sizes."""
    reduces = [n for n in value.toposort if n.op is Ops.REDUCE_AXIS]
    sizes = [s for s in value.shape if s != 1] or [1]
    if not reduces:
        return "E_" + "_".join(map(_name_part, sizes))
    reduced = reduces[0].src[0].shape
    reduced_sizes = [reduced[axis] for axis in reduces[0].arg[1]]
    return "r_" + "_".join(map(_name_part, sizes + reduced_sizes))


def _name_part(size: int | UOp) -> str:
    """A size in a kernel's name: `4`, or a symbolic one by its variables (`i`, `i1` for
    i+1): a name must be an identifier in every language."""
    return "".join(c for c in sym_str(size) if c.isalnum() or c == "_")


def describe_fusions(value: UOp, device: str | None = None) -> list[str]:
    """Plain words for what this kernel fused together (on `device`: its row limit)."""
    nodes = value.toposort
    reduces = [n for n in nodes if n.op is Ops.REDUCE_AXIS]
    inside = {n for r in reduces for n in r.src[0].toposort}
    alu_in = sorted({n.op.name for n in inside if n.op in ALU})
    alu_out = sorted({n.op.name for n in nodes if n.op in ALU and n not in inside})
    views = sorted({n.op.name for n in nodes if n.op in MOVEMENT and n.src[0].op is not Ops.CONST
                    and n.src[0].op is not Ops.DEFINE_GLOBAL})
    notes = []
    for reduce in reduces:
        kind = "sum" if reduce.arg[0] is Ops.ADD else "max"
        notes.append(f"a {kind} over axes {reduce.arg[1]} of shape {reduce.src[0].shape}")
    if alu_in:
        notes.append(f"elementwise ops fused into the reduction's input: {', '.join(alu_in)}")
    if alu_out and reduces:
        notes.append(f"elementwise ops fused onto the reduction's output: {', '.join(alu_out)}")
    elif alu_out:
        notes.append(f"elementwise ops fused into one loop: {', '.join(alu_out)}")
    if views:
        notes.append(f"movement ops became index arithmetic: {', '.join(views)}")
    return notes + describe_row_fusions(value, device)


def describe_row_fusions(value: UOp, device: str | None = None) -> list[str]:
    """Plain words for each reduction this kernel computes per row and reads again in the same
    kernel (broadcast back, or fed into another reduction): `fuses_along_rows` kept it here."""
    users: dict[UOp, list[UOp]] = defaultdict(list)
    for node in value.toposort:
        for source in node.src:
            users[source].append(node)
    notes = []
    how = "is read again from cache"
    limit = _bytes_in_words(MAX_FUSED_ROW_BYTES)
    if device is not None and output_loops_are_threads(device):  # one work-group per row
        how, limit = "is split over one work-group, combined in shared memory", \
            f"{MAX_GROUP_ROW:,} elements"
    for reduce in (n for n in value.toposort if n.op is Ops.REDUCE_AXIS):
        if not _read_again_in_kernel(reduce, users):
            continue
        kind = "sum" if reduce.arg[0] is Ops.ADD else "max"
        notes.append(f"the {kind} over each row (axes {reduce.arg[1]}) is computed in the same "
                     f"kernel, once per row: the row ({_bytes_in_words(row_bytes(reduce))}) {how} "
                     f"(rows up to {limit} fuse; FUSE_ROWS=0 stores it)")
    return notes


def _read_again_in_kernel(reduce: UOp, users: dict[UOp, list[UOp]]) -> bool:
    """Is the reduction's result broadcast back (EXPAND) or reduced again within the kernel?"""
    stack, seen = list(users[reduce]), set()
    while stack:
        user = stack.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op in ROW_FUSION_OPS:
            return True
        if user.op in ALU or user.op is Ops.DETACH:
            stack.extend(users[user])
    return False


def _bytes_in_words(count: int) -> str:
    return f"{count // 1024} KiB" if count >= 1024 and count % 1024 == 0 else f"{count} B"


def estimate_ops(ast: UOp) -> int:
    """Arithmetic operations a kernel performs (for GlobalCounters.global_ops)."""
    total = 0
    for node in ast.toposort:
        if node.op in ALU:
            total += sym_max(sym_prod(node.shape))  # (a symbolic size: at its largest)
        elif node.op is Ops.REDUCE_AXIS:
            total += sym_max(sym_prod(node.src[0].shape))
    return total


# ---- the schedule ----

def device_of(node: UOp, default: str) -> str:
    """The device of the buffers `node` reads (or of a copy that brings them there)."""
    return devices_of(node.toposort, default)[node]


def devices_of(order: list[UOp], default: str) -> dict[UOp, str]:
    """The device of every node of a graph (`order`: sources before users), in one pass from
    the sources up: a buffer's own, a copy's target, else that of its last source that has
    one (`default` for constants)."""
    found: dict[UOp, str | None] = {}
    for node in order:
        if node.op is Ops.BUFFER:
            found[node] = node.arg.device
        elif node.op is Ops.COPY:
            found[node] = node.arg
        else:
            found[node] = next((found[s] for s in reversed(node.src) if found[s] is not None),
                               None)
    return {node: default if device is None else device for node, device in found.items()}


@dataclass
class Schedule:
    """What the scheduler makes of a graph: the items in the order they run, for each realized
    output the BUFFER node (reshaped to its shape) that holds its value afterwards, and every
    node that got a buffer of its own, with the reason."""

    items: list[ScheduleItem]
    becomes: dict[UOp, UOp]
    realized: dict[UOp, str]


def create_schedule(outputs: list[UOp], default_device: str) -> tuple[list[ScheduleItem],
                                                                     dict[UOp, UOp]]:
    """Cut the graph of `outputs` into kernels. Returns the items in order, and for each
    realized output the BUFFER node (reshaped to its shape) that now holds its value."""
    schedule = schedule_graph(outputs, default_device)
    return schedule.items, schedule.becomes


# why a buffer's old contents get a kernel of their own (see schedule_graph)
OLD_CONTENTS_COPIED = ("assigns read each other's old values (no order of them works): this "
                       "buffer's old contents are copied first, and its readers read the copy")


def schedule_graph(outputs: list[UOp], default_device: str) -> Schedule:
    """`create_schedule`, with the realized nodes and their reasons.

    Assigns can need each other's old values. SGD over `x` and `W` of `loss = (x @ W).sum()`
    assigns `x - lr * dx`, where dx reads the old W, and `W - lr * dW`, where dW reads the old
    x: each assign must run after the other has read its old value, and no order works (a
    kernel reading both the old and the new value of one buffer is the same knot). Then the
    old contents of one assigned buffer are copied into a fresh buffer by a kernel that runs
    first; every reader of the old value reads the copy, so the assign into that buffer no
    longer waits for them. One copy at a time, until the schedule can be ordered: each breaks
    every wait on one assign, so it ends (the data flow itself never has a cycle)."""
    order = _toposort(outputs)
    devices = devices_of(order, default_device)
    realized = find_realized(outputs, devices)
    while True:
        items, buffer_of = _make_items(order, realized, devices)
        ordered = _ready_first_order(_ordering_constraints(items))
        if len(ordered) == len(items):
            break
        to_copy = [n for n in _old_contents_to_copy(items, ordered, order) if n not in realized]
        if not to_copy:  # (cannot happen: a copy is never waiting, so never stuck)
            raise RuntimeError("cannot order this schedule, even with old values copied")
        realized.update((node, OLD_CONTENTS_COPIED) for node in to_copy)
    becomes = {out: _buffer_node(buffer_of[out].alias() if out.op is Ops.ASSIGN else
                                 buffer_of[out], out) for out in outputs if out in buffer_of}
    return Schedule([items[k] for k in ordered], becomes, realized)


def _make_items(order: list[UOp], realized: dict[UOp, str],
                devices: dict[UOp, str]) -> tuple[list[ScheduleItem], dict[UOp, Buffer]]:
    """One item per realized node, in graph order, and the buffer each node is stored in."""
    buffer_of: dict[UOp, Buffer] = {}
    items: list[ScheduleItem] = []
    for node in order:
        if node not in realized:
            continue
        device = devices[node]
        if node.op is Ops.ASSIGN:
            buffer_of[node] = assign_target(node)
        else:
            # a symbolic shape is stored in a buffer with room for its largest value
            buffer_of[node] = Buffer(device, sym_max(sym_prod(node.shape)), node.dtype)
        items.append(_make_item(node, device, realized, buffer_of))
    return items, buffer_of


def _old_contents_to_copy(items: list[ScheduleItem], ordered: list[int],
                          order: list[UOp]) -> list[UOp]:
    """The BUFFER nodes of the first assigned buffer (in schedule order) whose old contents a
    kernel left unordered reads while the assign into it is left unordered too."""
    done = set(ordered)
    stuck = [item for k, item in enumerate(items) if k not in done]
    assign_into = {id(item.output): item for item in stuck
                   if item.node is not None and item.node.op is Ops.ASSIGN}
    for item in stuck:
        for buffer in item.old_contents_read:
            if assign_into.get(id(buffer), item) is not item:
                return [n for n in order if n.op is Ops.BUFFER and n.arg is buffer]
    raise RuntimeError("cannot order this schedule, and no assigned buffer's old contents "
                       "can be copied to fix it (a bug in the scheduler)")


def order_items(items: list[ScheduleItem]) -> list[ScheduleItem]:
    """Order kernels so each runs after the kernels whose outputs it reads, and every kernel
    that reads a buffer's *old* contents runs before an assign overwrites that buffer. Of the
    kernels ready to run, the one listed first goes first (Kahn's algorithm, with a heap)."""
    ordered = _ready_first_order(_ordering_constraints(items))
    if len(ordered) < len(items):
        raise RuntimeError("cannot order this schedule: a kernel needs both the old and the "
                           "new value of an assigned buffer (create_schedule copies the old "
                           "value first; these items were made without that copy)")
    return [items[k] for k in ordered]


def _ordering_constraints(items: list[ScheduleItem]) -> dict[int, set[int]]:
    """For each item (by position), the items that must run before it."""
    item_of = {item.node: k for k, item in enumerate(items)}
    assigns_to: dict[int, list[int]] = defaultdict(list)  # buffer id -> the assigns into it
    for w, writer in enumerate(items):
        if writer.node is not None and writer.node.op is Ops.ASSIGN:
            assigns_to[id(writer.output)].append(w)
    after: dict[int, set[int]] = {k: set() for k in range(len(items))}
    for k, item in enumerate(items):
        after[k] |= {item_of[n] for n in item.input_nodes if n in item_of}
        for buffer in item.old_contents_read:
            for w in assigns_to[id(buffer)]:
                if w != k:
                    after[w].add(k)  # the assign waits for this reader of the old contents
    return after


def _ready_first_order(after: dict[int, set[int]]) -> list[int]:
    """Kahn's algorithm: a topological order of 0..n-1 (k runs after every item in after[k])
    that always takes the smallest ready item; a heap keeps it linear in the number of edges,
    times log n. Items on or behind a cycle are left out (the caller checks the length)."""
    waiting = {k: len(before) for k, before in after.items()}
    unblocks: dict[int, list[int]] = defaultdict(list)
    for k, before in after.items():
        for b in before:
            unblocks[b].append(k)
    ready = [k for k, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    ordered: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        ordered.append(k)
        for user in unblocks[k]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    return ordered


def _buffer_node(buffer: Buffer, node: UOp) -> UOp:
    return symbolic_view(UOp(Ops.BUFFER, node.dtype, (), buffer), node.shape)


def _make_item(node: UOp, device: str, realized: dict[UOp, str],
               buffer_of: dict[UOp, Buffer]) -> ScheduleItem:
    if node.op is Ops.COPY:
        return _make_copy(node, device, realized, buffer_of)
    builder = _KernelBuilder(buffer_of, output=buffer_of[node])
    value = builder.build(node, realized)
    output = UOp(Ops.DEFINE_GLOBAL, node.dtype, (), (0, sym_max(sym_prod(node.shape))))
    ast = UOp(Ops.SINK, dtypes.bool, (UOp(Ops.STORE, node.dtype, (output, value)),))
    return ScheduleItem("kernel", kernel_name(value), ast, [buffer_of[node], *builder.inputs],
                        device, realized[node], describe_fusions(value, device),
                        builder.input_reasons, builder.old_contents_read, node,
                        builder.input_nodes)


def _make_copy(node: UOp, device: str, realized: dict[UOp, str],
               buffer_of: dict[UOp, Buffer]) -> ScheduleItem:
    """A copy between devices. Its source is stored by this schedule (find_realized sees to
    that), or a realized buffer (possibly reshaped), whose old contents it then reads."""
    source = node.src[0]
    if source not in buffer_of:
        base = base_buffer(source)
        assert base is not None, "find_realized stores a copy's source unless it is a buffer"
        source = base
    old_contents = [] if source in buffer_of else [source.arg]
    source_buffer = buffer_of[source] if source in buffer_of else source.arg
    return ScheduleItem("copy", f"copy {source_buffer.device} -> {device}", node,
                        [buffer_of[node], source_buffer], device, realized[node],
                        old_contents_read=old_contents, node=node,
                        input_nodes=[source] if source in buffer_of else [])
