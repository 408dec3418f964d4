"""Chapter 8 (part 3): from loops to threads — what every GPU language shares.

What this teaches:
- on a GPU the output loops of a kernel become *threads*: thousands of copies of the kernel body
  run at once, each with its own index. The C loop `for (gidx0 = 0; gidx0 < 6; gidx0++)` becomes
  a *grid-stride* loop that starts at this thread's id and steps by the number of threads:

      for (int gidx0 = get_global_id(0); gidx0 < 6; gidx0 += get_global_size(0)) { ... }

  With at least 6 threads it runs once per thread (or not at all for the spare ones); with fewer
  it still covers every index. So the launch size can be anything the hardware allows;
- threads come in *work-groups* (OpenCL) / *blocks* (CUDA) / *workgroups* (WebGPU) of up to a
  few hundred threads, in up to 3 dimensions. The innermost output axis goes to dimension 0,
  whose neighbouring threads read neighbouring memory; up to 3 output axes become thread
  dimensions, the outer ones stay loops;
- the launch configuration is part of the kernel: `spec()` returns it with the source in a
  `ProgramSpec` (global and local sizes), which the runtime reads; the renderer also writes it
  into the source's first line (`// launch: global (8, 4, 1) local (8, 4, 1)`), for the reader
  (DEBUG=4 shows it; `launch_of(source)` reads it back);
- a kernel that uses its threads' ids within a group (`SPECIAL`: a group reduction, a local
  tile) says its own group shape (`LinearProgram.local_size`), and its output loops are loops
  over *groups* (kind 'w'): `for (gidx0 = get_group_id(0); gidx0 < 5; gidx0 +=
  get_num_groups(0))`. The innermost three become group dimensions 0, 1, 2, with
  min(size, MAX_GROUPS) groups each (`plan_local_launch`; the PYTHON emulator runs the same launch).
  Its threads share memory (`DEFINE_LOCAL`) and wait for each other at barriers (`BARRIER`).

Builds on: render/__init__.py. Used by: render/opencl.py, render/cuda.py, render/wgsl.py.

>>> plan_launch((6, 3))
Launch(global_size=(4, 8, 1), local_size=(4, 8, 1), dimension_of={1: 0, 0: 1})
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from tinyteach.codegen.lower import LinearProgram, ProgramSpec, spec_of
from tinyteach.device import GPU_CAPABILITIES
from tinyteach.ir.uop import Ops, UOp, sym_max
from tinyteach.render import CStyleRenderer, KernelWriter

# Limits every GPU API guarantees (WebGPU's defaults are the smallest): threads per group,
# threads per group along each dimension, groups along each dimension.
MAX_THREADS_PER_GROUP = 256
MAX_GROUP_SHAPE = (256, 256, 64)
MAX_GROUPS = 65535


@dataclass(frozen=True)
class Launch:
    """How many threads run a kernel: `global_size` threads in all along each of 3 dimensions,
    in groups of `local_size`. `dimension_of` maps an output loop's position (0 = outermost)
    to the thread dimension that replaces it."""

    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int]
    dimension_of: dict[int, int]

    @property
    def groups(self) -> tuple[int, int, int]:
        """Work-groups per dimension (CUDA's grid, WebGPU's dispatch size)."""
        g, l = self.global_size, self.local_size
        return (g[0] // l[0], g[1] // l[1], g[2] // l[2])


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def plan_launch(sizes: tuple[int, ...]) -> Launch:
    """Threads for output loops of `sizes` (outermost first): the last 3 loops become thread
    dimensions 0, 1, 2 (innermost first); a group is as square as the sizes allow, at most
    MAX_THREADS_PER_GROUP threads; the whole launch is capped at MAX_GROUPS groups per
    dimension (the grid-stride loops cover the rest)."""
    threaded = list(range(len(sizes)))[-3:][::-1]  # loop positions, innermost first
    dimension_of = {position: dim for dim, position in enumerate(threaded)}
    local, global_ = [1, 1, 1], [1, 1, 1]
    room = MAX_THREADS_PER_GROUP
    for dim, position in enumerate(threaded):
        size = max(sizes[position], 1)
        local[dim] = min(_power_of_two_at_least(size), MAX_GROUP_SHAPE[dim], room)
        room //= local[dim]
        groups = min(-(-size // local[dim]), MAX_GROUPS)
        global_[dim] = groups * local[dim]
    return Launch((global_[0], global_[1], global_[2]), (local[0], local[1], local[2]),
                  dimension_of)


def launch_comment(launch: Launch) -> str:
    return f"// launch: global {launch.global_size} local {launch.local_size}"


_LAUNCH_LINE = re.compile(r"launch: global \((\d+), (\d+), (\d+)\) local \((\d+), (\d+), (\d+)\)")


def launch_of(source: str) -> Launch:
    """Read the launch back from a rendered GPU kernel's comment: for a reader (the book, the
    tests) looking at source alone. The runtimes read the ProgramSpec (`spec()`), never this."""
    found = _LAUNCH_LINE.search(source)
    if found is None:
        raise ValueError("this source has no '// launch: global (...) local (...)' line: "
                         "was it rendered by a GPU renderer?")
    numbers = [int(n) for n in found.groups()]
    return Launch((numbers[0], numbers[1], numbers[2]), (numbers[3], numbers[4], numbers[5]), {})


def group_loops(program: LinearProgram) -> list[UOp]:
    """The loops over work-groups ('w') that become group dimensions, innermost first (the
    innermost three; outer ones stay plain loops over every group)."""
    loops = sorted((u for u in program.uops if u.op is Ops.RANGE and u.arg[0] == "w"),
                   key=lambda u: u.arg[1])
    return loops[-3:][::-1]


def uses_local_ids(program: LinearProgram) -> bool:
    """Does the program use its threads' ids within a group (so it sets its own group shape)?"""
    return any(u.op is Ops.SPECIAL for u in program.uops)


def plan_local_launch(program: LinearProgram) -> tuple[Launch, dict[UOp, int]]:
    """The launch of a program with local thread ids: its own group shape, min(size,
    MAX_GROUPS) groups along the dimension of each 'w' loop; and each loop's dimension."""
    local = program.local_size
    if local[0] * local[1] * local[2] > MAX_THREADS_PER_GROUP or \
            any(size > limit for size, limit in zip(local, MAX_GROUP_SHAPE)):
        raise ValueError(f"a work-group of {local} threads is more than every GPU allows "
                         f"({MAX_THREADS_PER_GROUP} threads, at most {MAX_GROUP_SHAPE})")
    loops = group_loops(program)
    groups = [1, 1, 1]
    for dim, loop in enumerate(loops):
        groups[dim] = min(loop.arg[2], MAX_GROUPS)
    global_size = (groups[0] * local[0], groups[1] * local[1], groups[2] * local[2])
    return Launch(global_size, local, {}), {loop: dim for dim, loop in enumerate(loops)}


def output_loops(program: LinearProgram) -> list[UOp]:
    """The output ('g') loops of a program, outermost first."""
    return sorted((u for u in program.uops if u.op is Ops.RANGE and u.arg[0] == "g"),
                  key=lambda u: u.arg[1])


@dataclass
class GPUKernelWriter(KernelWriter):
    """A KernelWriter that also holds the kernel's launch, and the thread dimension that each
    output loop (by name, `gidx0`) runs along."""

    launch: Launch = field(default_factory=lambda: plan_launch(()))
    loop_dimension: dict[str, int] = field(default_factory=dict)
    group_dimension: dict[str, int] = field(default_factory=dict)  # 'w' loops, by name
    module_lines: list[str] = field(default_factory=list)  # declared outside the kernel (WGSL)


def gpu_writer(writer: KernelWriter) -> GPUKernelWriter:
    """The writer of a GPU render (GPURenderer.new_writer made it)."""
    if not isinstance(writer, GPUKernelWriter):
        raise TypeError("a GPU renderer renders with the GPUKernelWriter of its new_writer()")
    return writer


class GPURenderer(CStyleRenderer):
    """A C-style renderer whose output loops are grid-stride loops over threads.

    A subclass says how a thread reads its id and the thread count along a dimension
    (`thread_id`, `thread_count`) and writes the kernel (`render_kernel`), whose first line is
    the launch comment. The launch of the kernel being rendered is planned when the render
    starts and kept in its GPUKernelWriter (it is what `loop` and `render_kernel` consult)."""

    device_capabilities = GPU_CAPABILITIES  # work-groups with shared memory (a subclass adds)

    def thread_id(self, dimension: int) -> str:
        raise NotImplementedError

    def thread_count(self, launch: Launch, dimension: int) -> str:
        raise NotImplementedError

    def group_id(self, dimension: int) -> str:
        """This work-group's index along `dimension`."""
        raise NotImplementedError

    def group_count(self, launch: Launch, dimension: int) -> str:
        """The number of work-groups along `dimension`."""
        raise NotImplementedError

    def spec(self, name: str, program: LinearProgram) -> ProgramSpec:
        """The kernel with its launch: the runtime reads the sizes here, not in the source
        (whose first line, the launch comment, is for the reader)."""
        launch = self.new_writer(program).launch
        return spec_of(name, self.render(name, program), program,
                       global_size=launch.global_size, local_size=launch.local_size)

    def new_writer(self, program: LinearProgram) -> GPUKernelWriter:
        if uses_local_ids(program):
            launch, dimension_of = plan_local_launch(program)
            names = {f"gidx{loop.arg[1]}": dim for loop, dim in dimension_of.items()}
            return GPUKernelWriter(self, program, launch=launch, group_dimension=names)
        loops = output_loops(program)
        launch = plan_launch(tuple(sym_max(loop.arg[2]) for loop in loops))  # (symbolic: its max)
        loop_dimension = {f"gidx{loop.arg[1]}": launch.dimension_of[position]
                          for position, loop in enumerate(loops)
                          if position in launch.dimension_of}
        return GPUKernelWriter(self, program, launch=launch, loop_dimension=loop_dimension)

    def loop(self, writer: KernelWriter, name: str, size: int | str) -> str:
        start, step = self.loop_start_and_step(writer, name)
        if start is None:  # a reduction, or an output axis beyond the third: a plain loop
            return super().loop(writer, name, size)
        return f"for (int {name} = {start}; {name} < {size}; {name} += {step}) {{"

    def loop_start_and_step(self, writer: KernelWriter, name: str) -> tuple[str | None, str]:
        """Where a loop starts and how far it steps: grid-stride over the threads (output
        loops), over the groups ('w' loops), or (None, "1") for a plain loop."""
        state = gpu_writer(writer)
        if name in state.group_dimension:
            dimension = state.group_dimension[name]
            return self.group_id(dimension), self.group_count(state.launch, dimension)
        if name in state.loop_dimension:
            dimension = state.loop_dimension[name]
            return self.thread_id(dimension), self.thread_count(state.launch, dimension)
        return None, "1"
