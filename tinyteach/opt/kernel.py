"""Chapter 7 (part 2): kernel optimizations as actions — the same kernel, laid out to run fast.

What this teaches:
- **upcast** (register blocking): instead of one output element per loop iteration, compute a
  small tile (e.g. 4x4) of them. The tile's values share loads: for a matmul, one row of `a`
  and one column of `b` serve 16 accumulators, so each load is used 4 times instead of once,
  and the compiler can keep the tile in vector registers;
- **vectors**: where the device has vector types (`vector_width` floats per register: 16 with
  AVX-512), a matmul-like tile is 8 rows x 2 vectors: one load of 16 consecutive floats of `b`
  and one float of `a` feed 16 multiply-adds at once (codegen/lower.py's `vectorize` does the
  rewriting; a kernel it cannot vectorize falls back to the scalar tile);
- **threads**: the outermost loop is split across the machine's cores (an OpenMP pragma in C);
  only worth it when there is enough work to pay for waking the threads;
- **group reduction** (GPU devices whose renderer says `supports_group_reduce`): a reduction
  with few outputs and a long reduced axis gives each output a whole work-group of
  GROUP_THREADS threads. Each thread sums every GROUP_THREADS-th element (neighbouring threads
  read neighbouring memory), writes its partial sum to shared memory, and after a barrier the
  partials are combined: by halving (a tree, log2 of the threads steps, one barrier each) or by
  thread 0 alone (serial). codegen/lower.py builds it;
- **local tiles** (GPU devices whose renderer says `supports_local_tile`): a matmul-like kernel
  (a sum of a product X * Y, X the same along the output's last axis, Y along the one before)
  gives each LOCAL_TILE x LOCAL_TILE block of outputs a work-group, one thread per output. Per
  step of LOCAL_TILE along the reduction, the group's threads copy a tile of X and a tile of Y
  into shared memory (one element each), wait at a barrier, and each thread sums its row of
  the one tile times its column of the other: every element a group reads from global memory
  serves LOCAL_TILE threads. codegen/lower.py builds it; sizes that are not multiples of the tile
  are padded with zeros (guards), and threads past the edge store nothing. With `tile_upcast` r
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
  reduction, summing in float32 (codegen/wmma.py);
- **output blocks**: a kernel with a short sum per output and a big output (a convolution's
  window gradient: 9 or 25 taps per pixel, each a sum over the channels) is bound by writing
  its output; its short innermost axes are upcast whole, so each iteration stores a block of
  consecutive outputs (`_output_block`);
- optimizations never change results beyond float rounding (a tile still sums in order), every
  one is optional (`NOOPT=1` turns them all off) and visible (`DEBUG=3` lists them, viz shows
  them), so you can compare a kernel before and after.

Each optimization is an action, `Opt(OptOps.UPCAST, axis, amount)`, as in tinygrad: a
`Kernel(ast, device)` takes them one by one (`apply_opt`), checks each against the kernel, the
plan so far and the device's Capabilities (one that does not fit raises KernelOptError saying
why), and adds it to its plan (codegen/plan.py's KernelOptions, the form codegen/lower.py
reads). The hand-written heuristic's choice is such a list (heuristic.py,
`hand_coded_optimizations`); `BEAM=n` replaces it by a timed search over lists (opt/search.py),
and opt/pack.py copies big matmul operands into the order the tile reads them (and a
convolution's weights channels last: its channel tiles).

Builds on: ir/uop.py, codegen/plan.py, codegen/wmma.py (whether a tensor core fits),
codegen/lower.py (`Kernel.linearize`). Used by: heuristic.py, opt/search.py, engine/realize.py.

>>> from tinyteach import Tensor
>>> from tinyteach.engine.schedule import create_schedule
>>> a, b = Tensor.ones(256, 256).realize(), Tensor.ones(256, 256).realize()
>>> item = create_schedule([(a @ b).uop], "CPU")[0][0]
>>> kernel = Kernel(item.ast, "CPU").apply_opt(Opt(OptOps.UPCAST, 0, 4))
>>> kernel.applied_opts, kernel.plan.describe()
([Opt(OptOps.UPCAST, 0, 4)], ['upcast axis 0 by 4'])
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum, auto

from tinyteach.codegen.lower import LinearProgram, ProgramSpec, lower, lower_ast, vectorize
from tinyteach.codegen.plan import (
    NO_OPTIONS,
    TENSOR_CORE_TILE,
    KernelOptions,
    can_group_reduce,
    kernel_value,
    tile_plan,
)
from tinyteach.codegen.wmma import why_no_tensor_core
from tinyteach.device import Capabilities, Device
from tinyteach.ir.uop import Ops, UOp

# ---- actions: what a person, the heuristic and BEAM say to a kernel ----

class OptOps(Enum):
    """The optimizer's actions, with tinygrad's names (and two of tinyteach's own). Each is an
    `Opt(op, axis, arg)`; `axis` counts the output's axes (UPCAST, PADTO, LOCAL, THREAD, SWAP,
    VECTORIZE) or the kernel's reduced axes (UNROLL, GROUP, GROUPTOP)."""

    UPCAST = auto()     # compute `arg` consecutive outputs along `axis` per loop iteration
    VECTORIZE = auto()  # (tinyteach) the upcast `axis` in vectors of `arg` lanes
    UNROLL = auto()     # the reduced `axis`'s loop does `arg` elements per iteration
    PADTO = auto()      # the loop over `axis` runs to a multiple of `arg`, guarded past the end
    THREAD = auto()     # split the outer loop (`axis`) across CPU cores (`arg` 0: every core)
    SWAP = auto()       # exchange the loops over `axis` and `arg`
    LOCAL = auto()      # a local tile: `arg` threads of a work-group along output `axis`
    GROUP = auto()      # `arg` threads share the reduction; thread t sums every arg-th element
    GROUPTOP = auto()   # ... thread t sums one contiguous slice of the reduced axis
    SERIAL_COMBINE = auto()  # (tinyteach) a group's partial sums combined by thread 0 alone
    TC = auto()         # tensor cores: a warp per 16x8 tile (`arg` 0) or a block (warps, tiles)


@dataclass(frozen=True)
class Opt:
    """One action: `Opt(OptOps.UPCAST, 1, 8)` upcasts output axis 1 by 8."""

    op: OptOps
    axis: int = 0
    arg: int | tuple[int, ...] = 0

    def __repr__(self) -> str:
        return f"Opt(OptOps.{self.op.name}, {self.axis}, {self.arg!r})"


class KernelOptError(ValueError):
    """An action that does not fit the kernel or the device; the message says why."""


class Kernel:
    """One kernel AST on one device, and the actions applied to it so far (tinygrad's classic
    API): `k = Kernel(ast, "CPU"); k.apply_opt(Opt(OptOps.UPCAST, 0, 4)); k.to_program()`.
    Each action is checked when it is applied and raises KernelOptError naming what does not
    fit; `plan` is what the actions add up to, the form codegen/lower.py reads."""

    def __init__(self, ast: UOp, device: str | None = None,
                 capabilities: Capabilities | None = None) -> None:
        self.ast = ast
        self.device = Device.canonicalize(device)
        self.capabilities = capabilities if capabilities is not None else \
            Device[self.device].capabilities
        self.shape: tuple[int, ...] = tuple(int(s) for s in kernel_value(ast).shape) \
            if not ast.has_symbols else ()
        self.reduces = [n for n in kernel_value(ast).toposort if n.op is Ops.REDUCE_AXIS]
        self.applied_opts: list[Opt] = []
        self.plan: KernelOptions = NO_OPTIONS

    def copy(self) -> Kernel:
        twin = Kernel(self.ast, self.device, self.capabilities)
        twin.applied_opts, twin.plan = list(self.applied_opts), self.plan
        return twin

    def apply_opt(self, opt: Opt) -> Kernel:
        """Check `opt` against this kernel, its plan so far and the device, then apply it."""
        if not isinstance(opt, Opt):
            raise TypeError(f"apply_opt takes an Opt, e.g. Opt(OptOps.UPCAST, 0, 4), got {opt!r}")
        if self.ast.has_symbols:
            raise KernelOptError(f"{opt}: a kernel over a symbolic size takes no actions (they "
                                 "split loops of a known size)")
        self.plan = ACTIONS[opt.op](self, opt)
        self.applied_opts.append(opt)
        return self

    def apply_opts(self, opts: list[Opt] | tuple[Opt, ...]) -> Kernel:
        for opt in opts:
            self.apply_opt(opt)
        return self

    def finished_plan(self) -> KernelOptions:
        """The plan, after the checks that need every action (a local tile on both axes)."""
        _check_complete(self, self.plan)
        return self.plan

    def linearize(self) -> LinearProgram:
        return lower(self.ast, self.finished_plan())

    def to_program(self, name: str = "kernel") -> ProgramSpec:
        """Lower the kernel as its actions say and render it for its device: the ProgramSpec
        (codegen/lower.py) that realize compiles and the runtime loads."""
        renderer = Device[self.device].renderer
        if renderer is None:
            raise KernelOptError(f"{self.device} interprets kernels: it renders no program")
        return replace(renderer.spec(name, self.linearize()),
                       applied_opts=tuple(self.applied_opts))

    # -- what the checks ask --

    def fail(self, opt: Opt, why: str) -> KernelOptError:
        return KernelOptError(f"{opt} does not fit kernel of shape {self.shape}: {why}")

    def output_axis(self, opt: Opt) -> int:
        if not 0 <= opt.axis < len(self.shape):
            raise self.fail(opt, f"the output has axes 0..{len(self.shape) - 1}")
        if self.shape[opt.axis] == 1:
            raise self.fail(opt, f"axis {opt.axis} has size 1: it has no loop")
        return opt.axis

    def amount(self, opt: Opt, low: int = 2) -> int:
        if not isinstance(opt.arg, int) or opt.arg < low:
            raise self.fail(opt, f"the amount must be an int >= {low}, got {opt.arg!r}")
        return opt.arg

    def reduced_axes(self, opt: Opt) -> tuple[int, ...]:
        if not self.reduces:
            raise self.fail(opt, "the kernel has no reduction")
        axes = self.reduces[0].arg[1]
        if not 0 <= opt.axis < len(axes):
            raise self.fail(opt, f"the reduction has axes 0..{len(axes) - 1}")
        return axes

    def needs(self, opt: Opt, capability: bool, what: str) -> None:
        if not capability:
            raise self.fail(opt, f"{self.device} has no {what}")

    def padded_size(self, axis: int) -> int:
        return dict(self.plan.padded).get(axis, self.shape[axis])


def _gpu_mode(plan: KernelOptions) -> str:
    """Which kind of GPU kernel the plan is: it decides which actions may follow."""
    if plan.tensor_core:
        return "tensor cores"
    if plan.local_tile:
        return "a local tile"
    if plan.group:
        return "a group reduction"
    return ""


def _upcast(k: Kernel, opt: Opt) -> KernelOptions:
    axis, amount = k.output_axis(opt), k.amount(opt)
    plan = k.plan
    if plan.tensor_core or plan.group:
        raise k.fail(opt, f"upcasts do not combine with {_gpu_mode(plan)}")
    if plan.local_tile:  # a thread of the tile computes an r x r block of outputs
        if axis not in _tile_axes(k):
            raise k.fail(opt, f"in a local tile, UPCAST goes on the tile's axes {_tile_axes(k)}")
        if plan.tile_upcast > 1 and amount != plan.tile_upcast:
            raise k.fail(opt, f"a local tile's block is r x r: the other axis is upcast by "
                              f"{plan.tile_upcast}")
        return replace(plan, tile_upcast=amount)
    if axis in dict(plan.upcasts):
        raise k.fail(opt, f"axis {axis} is already upcast by {dict(plan.upcasts)[axis]}")
    size = k.padded_size(axis)
    if size % amount:
        raise k.fail(opt, f"axis {axis} of size {size} does not split into blocks of "
                          f"{amount} (PADTO first pads it to a multiple)")
    if plan.vector_width:
        raise k.fail(opt, "VECTORIZE is the last upcast: upcast every axis before it")
    return replace(plan, upcasts=tuple(sorted((*plan.upcasts, (axis, amount)))))


def _vectorize(k: Kernel, opt: Opt) -> KernelOptions:
    axis, lanes = k.output_axis(opt), k.amount(opt)
    width = k.capabilities.vector_width
    k.needs(opt, width > 0, "vector types")
    if lanes not in (width, width // 2) or lanes < 4:  # a half: AVX-512's ymm, AVX2's xmm
        halves = f" (or {width // 2} in their halves)" if width >= 8 else ""
        raise k.fail(opt, f"{k.device}'s vectors have {width} lanes{halves}, not {lanes}")
    upcasts = dict(k.plan.upcasts)
    if axis not in upcasts or upcasts[axis] % lanes:
        raise k.fail(opt, f"VECTORIZE needs axis {axis} upcast by a multiple of {lanes} first")
    if max(upcasts) != axis or k.plan.vector_width:
        raise k.fail(opt, "vectors go on the innermost upcast axis, once")
    if axis in dict(k.plan.padded):
        raise k.fail(opt, f"axis {axis} is padded: its guards are per element, not per vector")
    plan = replace(k.plan, vector_width=lanes)
    if vectorize(lower_ast(k.ast, plan)) is None:
        raise k.fail(opt, "this kernel's loads along the axis are not consecutive, or it has an "
                          "op without a vector form (lower.vectorize found no vector program)")
    return plan


def _unroll(k: Kernel, opt: Opt) -> KernelOptions:
    axes, amount = k.reduced_axes(opt), k.amount(opt)
    if _gpu_mode(k.plan):
        raise k.fail(opt, f"UNROLL does not combine with {_gpu_mode(k.plan)}")
    size = k.reduces[0].src[0].shape[axes[opt.axis]]
    if size % amount:
        raise k.fail(opt, f"the reduced axis {opt.axis} of size {size} does not split into "
                          f"steps of {amount}")
    if any(r.arg[1] != axes or r.src[0].shape != k.reduces[0].src[0].shape for r in k.reduces):
        raise k.fail(opt, "the kernel's reductions reduce different axes")
    if opt.axis in dict(k.plan.unrolls):
        raise k.fail(opt, f"the reduced axis {opt.axis} is already unrolled")
    return replace(k.plan, unrolls=tuple(sorted((*k.plan.unrolls, (opt.axis, amount)))))


def _padto(k: Kernel, opt: Opt) -> KernelOptions:
    axis, amount = k.output_axis(opt), k.amount(opt)
    if _gpu_mode(k.plan):
        raise k.fail(opt, f"PADTO does not combine with {_gpu_mode(k.plan)} (a local tile "
                          "needs none: its guards sit in the copies into shared memory)")
    if axis in dict(k.plan.upcasts) or axis in dict(k.plan.padded):
        raise k.fail(opt, f"pad axis {axis} before upcasting it, and once")
    size = k.shape[axis]
    if size % amount == 0:
        raise k.fail(opt, f"axis {axis} of size {size} is already a multiple of {amount}")
    padded = -(-size // amount) * amount
    return replace(k.plan, padded=tuple(sorted((*k.plan.padded, (axis, padded)))))


def _thread(k: Kernel, opt: Opt) -> KernelOptions:
    axis = k.output_axis(opt)
    k.needs(opt, k.capabilities.threads, "threads over CPU cores")
    if opt.arg != 0:
        raise k.fail(opt, "THREAD's arg is 0: OpenMP splits the loop over every core")
    outer = _loop_order(k)[0] if _loop_order(k) else None
    if axis != outer:
        raise k.fail(opt, f"threads split the outermost loop, over axis {outer}")
    if outer_loop_size(k.shape, k.plan) < 2:
        raise k.fail(opt, "the outer loop has fewer than 2 iterations to split")
    return replace(k.plan, parallel=True)


def _swap(k: Kernel, opt: Opt) -> KernelOptions:
    axis = k.output_axis(opt)
    other = k.output_axis(Opt(opt.op, opt.arg, 0)) if isinstance(opt.arg, int) else -1
    if other == axis or other < 0:
        raise k.fail(opt, "SWAP exchanges two different output axes: Opt(OptOps.SWAP, a, b)")
    if k.plan.parallel:
        raise k.fail(opt, "swap loops before THREAD: threads split the outer loop")
    order = list(_loop_order(k))
    i, j = order.index(axis), order.index(other)
    order[i], order[j] = order[j], order[i]
    return replace(k.plan, loop_order=tuple(order))


def _loop_order(k: Kernel) -> tuple[int, ...]:
    """The output axes that have loops, outermost first."""
    return k.plan.loop_order or tuple(a for a, size in enumerate(k.shape) if size > 1)


def _tile_axes(k: Kernel) -> tuple[int, int]:
    kept = [axis for axis, size in enumerate(k.shape) if size > 1]
    return (kept[-2], kept[-1]) if len(kept) >= 2 else (-1, -1)


def _local(k: Kernel, opt: Opt) -> KernelOptions:
    axis, size = k.output_axis(opt), k.amount(opt)
    k.needs(opt, k.capabilities.local_tile, "local tiles (shared memory)")
    if size & (size - 1):
        raise k.fail(opt, f"a local tile is a power of two threads on a side, got {size}")
    if k.plan.upcasts or k.plan.parallel or k.plan.padded or \
            _gpu_mode(k.plan) not in ("", "a local tile"):
        raise k.fail(opt, "LOCAL comes first: a local tile takes no other action before it")
    if tile_plan(k.ast) is None:
        raise k.fail(opt, "a local tile needs a matmul-like kernel: one sum over one axis of a "
                          "product X * Y, X constant along the output's last axis, Y along "
                          "the one before")
    if axis not in _tile_axes(k):
        raise k.fail(opt, f"a local tile's threads go along the output's last two axes "
                          f"{_tile_axes(k)}")
    if k.plan.local_tile and (size != k.plan.local_tile or
                              Opt(OptOps.LOCAL, axis, size) in k.applied_opts):
        raise k.fail(opt, f"a local tile is square: the other axis has {k.plan.local_tile}")
    if size * size > k.capabilities.max_group_threads and not k.plan.local_tile:
        raise k.fail(opt, f"{size}x{size} threads is more than the "
                          f"{k.capabilities.max_group_threads} a work-group may have")
    return replace(k.plan, local_tile=size)


def _group(k: Kernel, opt: Opt) -> KernelOptions:
    axes, threads = k.reduced_axes(opt), k.amount(opt)
    k.needs(opt, k.capabilities.group_reduce, "group reductions (shared memory)")
    if threads & (threads - 1):
        raise k.fail(opt, f"a group reduction needs a power of two threads, got {threads}")
    if threads > k.capabilities.max_group_threads:
        raise k.fail(opt, f"{threads} threads is more than the "
                          f"{k.capabilities.max_group_threads} a work-group may have")
    if opt.axis != len(axes) - 1:
        raise k.fail(opt, f"the group splits the last reduced axis: axis {len(axes) - 1}")
    if k.plan != NO_OPTIONS:
        raise k.fail(opt, "a group reduction takes no other action before it")
    if not can_group_reduce(k.ast):
        raise k.fail(opt, "a group reduction needs (non-bool) reductions that all reduce the "
                          "same axes of the same shape")
    return replace(k.plan, group=threads, group_top=opt.op is OptOps.GROUPTOP)


def _serial_combine(k: Kernel, opt: Opt) -> KernelOptions:
    if not k.plan.group:
        raise k.fail(opt, "SERIAL_COMBINE changes how a group reduction combines: GROUP first")
    return replace(k.plan, group_combine="serial")


def _tensor_core(k: Kernel, opt: Opt) -> KernelOptions:
    k.needs(opt, TENSOR_CORE_TILE in k.capabilities.tensor_cores, "tensor cores (m16n8k16)")
    if k.plan != NO_OPTIONS:
        raise k.fail(opt, "tensor cores take no other action before them")
    why = why_no_tensor_core(k.ast)
    if why is not None:
        raise k.fail(opt, why)
    block = () if opt.arg == 0 else opt.arg
    if not isinstance(block, tuple):
        raise k.fail(opt, "TC's arg is 0 (a warp per tile) or (warps along m, along n, tiles "
                          "per warp along m, along n)")
    try:
        return replace(k.plan, tensor_core=True, tensor_core_block=block)
    except ValueError as error:
        raise k.fail(opt, str(error)) from None


ACTIONS = {OptOps.UPCAST: _upcast, OptOps.VECTORIZE: _vectorize, OptOps.UNROLL: _unroll,
           OptOps.PADTO: _padto, OptOps.THREAD: _thread, OptOps.SWAP: _swap,
           OptOps.LOCAL: _local, OptOps.GROUP: _group, OptOps.GROUPTOP: _group,
           OptOps.SERIAL_COMBINE: _serial_combine, OptOps.TC: _tensor_core}


def _check_complete(k: Kernel, plan: KernelOptions) -> None:
    """The checks that need the whole list: a local tile names both axes, r x r, and fits."""
    if not plan.local_tile:
        return
    locals_ = {o.axis for o in k.applied_opts if o.op is OptOps.LOCAL}
    if locals_ != set(_tile_axes(k)):
        raise KernelOptError(f"a local tile needs LOCAL on both axes {_tile_axes(k)}, got "
                             f"{sorted(locals_)}")
    upcast = {o.axis for o in k.applied_opts if o.op is OptOps.UPCAST}
    if upcast and upcast != set(_tile_axes(k)):
        raise KernelOptError(f"a local tile's block of outputs is r x r: UPCAST both axes "
                             f"{_tile_axes(k)} by the same r")
    itemsize = tile_plan(k.ast).x.dtype.itemsize  # type: ignore[union-attr]
    if local_tile_shared_bytes(plan, itemsize) > k.capabilities.local_memory:
        raise KernelOptError(f"the local tile's shared memory "
                             f"({local_tile_shared_bytes(plan, itemsize)} bytes) is more than "
                             f"the {k.capabilities.local_memory} a work-group may use")


def actions_of(ast: UOp, plan: KernelOptions) -> list[Opt]:
    """The actions that build `plan` for `ast` (the heuristic's and BEAM's plans, as actions)."""
    if plan.tensor_core:
        return [Opt(OptOps.TC, 0, plan.tensor_core_block or 0)]
    value = kernel_value(ast)
    shape = value.shape
    if plan.local_tile:
        kept = [axis for axis, size in enumerate(shape) if size > 1]
        tile = [Opt(OptOps.LOCAL, axis, plan.local_tile) for axis in kept[-2:]]
        block = [Opt(OptOps.UPCAST, axis, plan.tile_upcast) for axis in kept[-2:]]
        return tile + (block if plan.tile_upcast > 1 else [])
    if plan.group:
        reduces = [n for n in value.toposort if n.op is Ops.REDUCE_AXIS]
        last = len(reduces[0].arg[1]) - 1
        group = [Opt(OptOps.GROUPTOP if plan.group_top else OptOps.GROUP, last, plan.group)]
        return group + ([Opt(OptOps.SERIAL_COMBINE)] if plan.group_combine == "serial" else [])
    opts = [Opt(OptOps.PADTO, axis, size) for axis, size in plan.padded]  # (pads to `size`)
    opts += [Opt(OptOps.UPCAST, axis, factor) for axis, factor in plan.upcasts]
    if plan.vector_width:
        opts.append(Opt(OptOps.VECTORIZE, plan.upcasts[-1][0], plan.vector_width))
    opts += [Opt(OptOps.UNROLL, axis, amount) for axis, amount in plan.unrolls]
    opts += _swaps(tuple(a for a, size in enumerate(shape) if size > 1), plan.loop_order)
    if plan.parallel:
        order = plan.loop_order or [a for a, size in enumerate(shape) if size > 1]
        opts.append(Opt(OptOps.THREAD, order[0], 0))
    return opts


def _swaps(start: tuple[int, ...], goal: tuple[int, ...]) -> list[Opt]:
    """SWAP actions that turn loop order `start` into `goal` (a selection sort)."""
    if not goal or goal == start:
        return []
    order, swaps = list(start), []
    for position, axis in enumerate(goal):
        if order[position] != axis:
            swaps.append(Opt(OptOps.SWAP, order[position], axis))
            other = order.index(axis)
            order[position], order[other] = order[other], order[position]
    return swaps


def plan_of(ast: UOp, opts: list[Opt] | tuple[Opt, ...], capabilities: Capabilities,
            device: str = "CPU") -> KernelOptions:
    """The plan a list of actions builds (each checked): what realize lowers."""
    if not opts:
        return NO_OPTIONS
    return Kernel(ast, device, capabilities).apply_opts(opts).finished_plan()


def local_tile_shared_bytes(options: KernelOptions, itemsize: int) -> int:
    """Shared memory of a local tile: two tiles of (size * r) x size elements."""
    return 2 * options.local_tile ** 2 * options.tile_upcast * itemsize


def outer_loop_size(shape: tuple[int, ...], options: KernelOptions) -> int:
    """Iterations of the outermost loop (the one threads split; axes of size 1 have no loop)."""
    upcasts = dict(options.upcasts)
    for axis in options.loop_order or range(len(shape)):
        if shape[axis] != 1:
            return shape[axis] // upcasts.get(axis, 1)
    return 1
