"""Chapter 7 (part 2): kernel optimizations — the same kernel, laid out to run fast.

What this teaches:
- **upcast** (register blocking): instead of one output element per loop iteration, compute a
  small tile (e.g. 4x4) of them. The tile's values share loads: for a matmul, one row of `a`
  and one column of `b` serve 16 accumulators, so each load is used 4 times instead of once,
  and the compiler can keep the tile in vector registers;
- **threads**: the outermost loop is split across the machine's cores (an OpenMP pragma in C);
  only worth it when there is enough work to pay for waking the threads;
- optimizations never change results beyond float rounding (a tile still sums in order), every
  one is optional (`NOOPT=1` turns them all off) and visible (`DEBUG=3` lists them, viz shows
  them), so you can compare a kernel before and after.

The choice is a hand-written heuristic (`choose_options`); tinygrad also offers a search (BEAM)
that times candidates — see the optimizer issue.

Builds on: uop.py. Used by: lower.py (applies the options), render/ (the parallel pragma).

>>> from tinyteach import Tensor
>>> from tinyteach.schedule import create_schedule
>>> a, b = Tensor.ones(256, 256).realize(), Tensor.ones(256, 256).realize()
>>> item = create_schedule([(a @ b).uop], "CPU")[0][0]
>>> choose_options(item.ast).describe()
['upcast axis 0 by 4', 'upcast axis 1 by 4', 'threads: split the outer loop across cores']
"""
from __future__ import annotations

from dataclasses import dataclass

from tinyteach.helpers import NOOPT, prod
from tinyteach.uop import Ops, UOp

UPCAST = 4                 # tile size per upcast axis
MAX_UPCAST_GRAPH = 120     # bigger kernels (convolutions, fused backward passes) stay untiled:
                           # a tile copies the kernel's whole body 16 times
MAX_UPCAST_AXES = 2        # 4x4 = 16 accumulators fit in registers
PARALLEL_MIN_WORK = 1 << 21  # operations below which waking threads costs more than it saves


@dataclass(frozen=True)
class KernelOptions:
    """What to do to one kernel. `upcasts`: (output axis, factor) pairs."""

    upcasts: tuple[tuple[int, int], ...] = ()
    parallel: bool = False

    def describe(self) -> list[str]:
        steps = [f"upcast axis {axis} by {factor}" for axis, factor in self.upcasts]
        if self.parallel:
            steps.append("threads: split the outer loop across cores")
        return steps


NO_OPTIONS = KernelOptions()


def kernel_value(ast: UOp) -> UOp:
    """The value a kernel stores (the AST is SINK(STORE(output, value)))."""
    return ast.src[0].src[1]


def choose_options(ast: UOp) -> KernelOptions:
    """The hand-written heuristic: tile reductions, thread big kernels."""
    if NOOPT:
        return NO_OPTIONS
    value = kernel_value(ast)
    shape = value.shape
    reduces = [n for n in value.toposort if n.op is Ops.REDUCE_AXIS]
    upcasts: list[tuple[int, int]] = []
    if reduces and len(value.toposort) <= MAX_UPCAST_GRAPH:
        # tile the output axes (innermost last): each loaded value serves several accumulators
        for axis in reversed(range(len(shape))):
            if len(upcasts) < MAX_UPCAST_AXES and shape[axis] % UPCAST == 0 \
                    and shape[axis] >= 2 * UPCAST:
                upcasts.append((axis, UPCAST))
    upcasts.sort()
    reduce_work = prod(reduces[0].src[0].shape) // max(prod(shape), 1) if reduces else 1
    outer = _outer_loop_size(shape, dict(upcasts))
    parallel = prod(shape) * reduce_work >= PARALLEL_MIN_WORK and outer >= 2
    return KernelOptions(tuple(upcasts), parallel)


def _outer_loop_size(shape: tuple[int, ...], upcasts: dict[int, int]) -> int:
    for axis, size in enumerate(shape):
        if size != 1:
            return size // upcasts.get(axis, 1)
    return 1
