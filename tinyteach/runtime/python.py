"""Chapter 8b (part 2): the PYTHON device — a GPU emulator that runs a kernel's linear
program in numpy, and checks it.

What this teaches:
- a GPU runs one program on many *threads*. Threads come in *work-groups*; the threads of a
  group run side by side, share a small fast memory (*shared* or *local* memory,
  `DEFINE_LOCAL`) and can wait for each other at a *barrier* (`BARRIER`). Groups never wait for
  each other. This device runs exactly that model, in Python: the threads of a work-group are
  the lanes of numpy arrays, so one step of the program is one numpy operation for every thread;
- a kernel's output loops become threads as on every GPU backend (render/gpu.py's
  `plan_launch`: grid-stride loops over the threads); a kernel with local thread ids
  (`SPECIAL`, a group reduction) gets one work-group per output element (its 'w' loops);
- threads of one group may take different paths (a grid-stride loop runs once for some threads
  and not at all for others): each lane has an *active* bit, and a lane that is not active
  neither reads, writes nor accumulates;
- the emulator checks what a real GPU silently gets wrong, and names the thread and the address:
  an access outside a buffer (`OutOfBoundsError`), a barrier that some threads of a group do not
  reach (`BarrierDivergenceError`), and two threads of a group that touch the same shared
  element between two barriers, one of them writing (`SharedMemoryRaceError`);
- with `record_threads()` it keeps every thread's reads and writes (viz/threads.py draws them);
- a tensor core (`WMMA`, codegen/wmma.py) is a warp's instruction: the emulator gathers every lane's
  fragment elements into the matrices A and B by the instruction's layout, multiplies them in
  float32 and hands each lane its elements of D. All 32 threads must take part
  (`WarpDivergenceError` otherwise, as `mma.sync.aligned` demands); the record keeps the
  layout it used (`FragmentEvent`), which viz/threads.py draws.

The values are the NUMPY device's (the same reference functions compute every op), so this
device gives NUMPY's numbers, up to the order of float sums. bfloat16 lanes hold the dtype's
host format, 16-bit words; an op on them computes in float32 and rounds back, as NUMPY does.

Conceptually the emulator runs one work-group at a time. Groups that fit in MAX_LANES lanes are
run side by side as more lanes (their barriers, shared memory and checks stay their own): the
result is the same, and Python's overhead is paid once per step instead of once per group.

Builds on: device.py, codegen/lower.py (LinearProgram), runtime/numpy.py (the ops), render/gpu.py
(the launch). Used by: tests, viz/threads.py, chapter 8b.

>>> from tinyteach import Tensor
>>> (Tensor([[1.0, 2.0], [3.0, 4.0]], device="PYTHON").sum(axis=1)).numpy().tolist()
[3.0, 7.0]
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tinyteach.codegen.lower import LinearProgram, ProgramSpec, spec_of
from tinyteach.codegen.wmma import WMMAArg, wmma_reference
from tinyteach.device import GPU_CAPABILITIES, Backend, Buffer, Compiler, HostAllocator
from tinyteach.dtype import DType, dtypes, from_bfloat16_bits, to_bfloat16_bits
from tinyteach.ir.uop import (
    ALU,
    Ops,
    UOp,
    is_bitcast,
    load_parts,
    store_parts,
    sym_eval,
    sym_max,
)
from tinyteach.render.gpu import output_loops, plan_launch, plan_local_launch
from tinyteach.runtime.numpy import NUMPY_OPS

MAX_LANES = 1 << 14  # threads emulated side by side (several work-groups when they are small)


class EmulatorError(RuntimeError):
    """A kernel did something a GPU does not define: the message names the thread."""


class OutOfBoundsError(EmulatorError):
    """A load or store outside its buffer."""


class BarrierDivergenceError(EmulatorError):
    """Some threads of a work-group reach a barrier and others of the same group do not."""


class SharedMemoryRaceError(EmulatorError):
    """Two threads of a group touch one shared element between two barriers, one writing."""


class WarpDivergenceError(EmulatorError):
    """Some threads of a warp run a tensor-core instruction and others do not."""


# ---- the launch: how many groups, how many threads each ----

@dataclass(frozen=True)
class GroupLaunch:
    """`groups` work-groups of `local_size` threads (each a 3-d shape). `thread_loops`: output
    loops each thread runs grid-stride along a dimension; `group_loops`: loops each group runs
    grid-stride over the group ids along a dimension."""

    groups: tuple[int, int, int]
    local_size: tuple[int, int, int]
    thread_loops: dict[UOp, int] = field(default_factory=dict)
    group_loops: dict[UOp, int] = field(default_factory=dict)

    @property
    def threads_per_group(self) -> int:
        return self.local_size[0] * self.local_size[1] * self.local_size[2]

    @property
    def group_count(self) -> int:
        return self.groups[0] * self.groups[1] * self.groups[2]

    @property
    def global_size(self) -> tuple[int, int, int]:
        g, size = self.groups, self.local_size
        return (g[0] * size[0], g[1] * size[1], g[2] * size[2])


def plan_group_launch(program: LinearProgram) -> GroupLaunch:
    """A kernel without local thread ids: render/gpu.py's launch (the same one OPENCL, CUDA and
    WEBGPU use). With them: the program's own group shape, one group per element of the 'w'
    loops (the innermost three become group dimensions 0, 1, 2)."""
    has_local_ids = any(u.op is Ops.SPECIAL for u in program.uops)
    if not has_local_ids:
        loops = output_loops(program)
        launch = plan_launch(tuple(sym_max(loop.arg[2]) for loop in loops))
        mapping = {loops[position]: dim for position, dim in launch.dimension_of.items()}
        return GroupLaunch(launch.groups, launch.local_size, thread_loops=mapping)
    if any(u.op is Ops.RANGE and u.arg[0] == "g" for u in program.uops):
        raise EmulatorError("a kernel with local thread ids has its outputs in 'w' loops "
                            "(one work-group per output), not 'g' loops")
    launch, dimension_of = plan_local_launch(program)
    return GroupLaunch(launch.groups, launch.local_size, group_loops=dimension_of)


# ---- what a run records ----

@dataclass(frozen=True)
class AccessEvent:
    """One LOAD or STORE step of the program, for every thread that took part: `groups[i]`,
    `threads[i]` (a 3-d id each) accessed `addresses[i]` of `buffer` in barrier `phase`."""

    step: int                # the op's position in the linear program
    kind: str                # "read" or "write"
    buffer: str              # "data1" (a kernel parameter) or "local0" (shared memory)
    phase: int               # barriers the group had passed before this access
    groups: np.ndarray       # (n, 3) work-group ids
    threads: np.ndarray      # (n, 3) thread ids within the group
    addresses: np.ndarray    # (n,) element index in the buffer

    @property
    def is_shared(self) -> bool:
        return self.buffer.startswith("local")


@dataclass(frozen=True)
class FragmentEvent:
    """A tensor-core step of the program (recorded once per launch): which element of A, B
    and D each lane of the warp held. `a_cells[lane, i]` is the (row, k) of lane's i-th A
    element, `b_cells[lane, i]` its (k, column) of B, `c_cells[lane]` the (row, column) of D
    that this step's `element` is."""

    step: int
    instruction: str         # "m16n8k16"
    shape: tuple[int, int, int]  # (m, n, k)
    element: int
    a_cells: np.ndarray      # (lanes, A elements, 2)
    b_cells: np.ndarray      # (lanes, B elements, 2)
    c_cells: np.ndarray      # (lanes, 2)


@dataclass
class Trace:
    """Everything one launch did, for viz/threads.py: the launch, the buffers' sizes, every
    access (when recorded) and the number of barriers each group passed."""

    name: str
    launch: GroupLaunch
    buffer_sizes: dict[str, int]
    shared_bytes: int
    events: list[AccessEvent] = field(default_factory=list)
    barriers: int = 0
    fragments: list[FragmentEvent] = field(default_factory=list)

    def accesses(self, kind: str | None = None, buffer: str | None = None) -> list[AccessEvent]:
        return [e for e in self.events if (kind is None or e.kind == kind)
                and (buffer is None or e.buffer == buffer)]

    def reads_per_thread(self, shared: bool) -> dict[tuple[tuple[int, ...], tuple[int, ...]],
                                                     int]:
        """Elements each thread read from shared memory (`shared`) or from global memory, by
        (work-group id, thread id); a thread that read none is not listed."""
        counts: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        for event in self.accesses("read"):
            if event.is_shared != shared:
                continue
            for group, thread in zip(event.groups.tolist(), event.threads.tolist()):
                key = (tuple(group), tuple(thread))
                counts[key] = counts.get(key, 0) + 1
        return counts


_trace_logs: list[list[Trace]] = []


@contextlib.contextmanager
def record_threads() -> Iterator[list[Trace]]:
    """Record every thread's reads and writes of each PYTHON launch inside the block:
    `with record_threads() as traces: ...` (one Trace per launch)."""
    traces: list[Trace] = []
    _trace_logs.append(traces)
    try:
        yield traces
    finally:
        _trace_logs.remove(traces)


# ---- running a batch of work-groups ----

def _thread(lanes: _Lanes, lane: int) -> str:
    return f"thread {tuple(int(v) for v in lanes.local_id[lane])}"


def _thread_name(lanes: _Lanes, lane: int) -> str:
    return f"{_thread(lanes, lane)} of work-group {tuple(int(v) for v in lanes.group_id[lane])}"


@dataclass
class _Lanes:
    """The threads of a batch of work-groups, one numpy lane each."""

    group_id: np.ndarray     # (lanes, 3)
    local_id: np.ndarray     # (lanes, 3)
    group_index: np.ndarray  # (lanes,) which group of the batch, 0.. (for shared memory)
    groups_in_batch: int

    @property
    def count(self) -> int:
        return len(self.local_id)


def _make_lanes(launch: GroupLaunch, first_group: int, group_count: int) -> _Lanes:
    """Lanes for groups first_group .. first_group + group_count - 1 (groups numbered with
    dimension 0 fastest, threads within a group likewise)."""
    lx, ly, lz = launch.local_size
    gx, gy, _ = launch.groups
    per_group = launch.threads_per_group
    lane = np.arange(group_count * per_group)
    within, batch_group = lane % per_group, lane // per_group
    local_id = np.stack([within % lx, (within // lx) % ly, within // (lx * ly)], axis=1)
    group = batch_group + first_group
    group_id = np.stack([group % gx, (group // gx) % gy, group // (gx * gy)], axis=1)
    return _Lanes(group_id, local_id, batch_group, group_count)


@dataclass
class _Loop:
    start: int            # position of the RANGE in the program
    outer_active: np.ndarray
    step: int


class _Run:
    """One batch: the program's values (one numpy lane per thread), the active lanes, the
    loops that are open, shared memory and the race bookkeeping of the current phase."""

    def __init__(self, program: LinearProgram, launch: GroupLaunch, arrays: list[np.ndarray],
                 lanes: _Lanes, trace: Trace | None, var_vals: dict[str, int] | None = None):
        self.program, self.launch, self.lanes, self.trace = program, launch, lanes, trace
        self.var_vals = {} if var_vals is None else var_vals  # the Variables' values
        self.arrays = arrays
        self.values: dict[UOp, np.ndarray] = {}
        self.active = np.ones(lanes.count, dtype=bool)
        self.loops: list[_Loop] = []
        self.phase = 0
        self.shared: dict[UOp, np.ndarray] = {}
        self.writers: dict[UOp, tuple[np.ndarray, np.ndarray]] = {}
        self.products: dict[tuple, tuple[list[np.ndarray], np.ndarray]] = {}  # WMMA, per step
        self.readers: dict[UOp, tuple[np.ndarray, np.ndarray]] = {}
        for define in program.locals:
            # fresh shared memory holds garbage on a GPU: NaN (or a large int) makes a read
            # before any write show up in the results
            garbage = np.nan if define.dtype.np.kind == "f" else 0x5A5A
            shape = (lanes.groups_in_batch, define.arg[1])
            self.shared[define] = np.full(shape, garbage).astype(define.dtype.np)
        self._reset_phase()

    def _reset_phase(self) -> None:
        """A barrier: what each thread touched before it no longer races with what comes after.
        Per element: the smallest and largest thread (lane) that wrote / read it, or -1."""
        for define, memory in self.shared.items():
            empty = np.full(memory.size, -1, dtype=np.int64)
            self.writers[define] = (empty.copy(), empty.copy())
            self.readers[define] = (empty.copy(), empty.copy())

    def run(self) -> None:
        uops, pc = self.program.uops, 0
        ends = _matching_ends(uops)
        with np.errstate(all="ignore"):  # inf, nan and wrap-around are values, not errors
            while pc < len(uops):
                pc = self.step(pc, uops[pc], ends)

    def step(self, pc: int, u: UOp, ends: dict[int, int]) -> int:
        """Run the op at `pc`; returns the position of the next one."""
        if u.op is Ops.RANGE:
            return self._open_loop(pc, u, ends)
        if u.op is Ops.END_RANGE:
            return self._close_loop(pc, u)
        handler = _HANDLERS.get(u.op)
        if handler is not None:
            handler(self, pc, u)
        elif u.op in ALU:
            sources = [self.values[s] for s in u.src]
            self.values[u] = np.broadcast_to(_alu(u, sources), (self.lanes.count,))
        else:
            raise NotImplementedError(f"the PYTHON device cannot run {u.op.name}")
        return pc + 1

    # ---- loops ----

    def _loop_start(self, u: UOp) -> tuple[np.ndarray, int]:
        """Each lane's first value of a loop, and its step: grid-stride over the threads ('g'
        loops that are thread dimensions) or the groups ('w' loops), else 0, 1, 2, ..."""
        kind, _, size = u.arg
        if u in self.launch.thread_loops:
            dim = self.launch.thread_loops[u]
            first = self.lanes.group_id[:, dim] * self.launch.local_size[dim] + \
                self.lanes.local_id[:, dim]
            return first.astype(np.int32), self.launch.global_size[dim]
        if u in self.launch.group_loops:
            dim = self.launch.group_loops[u]
            return self.lanes.group_id[:, dim].astype(np.int32), self.launch.groups[dim]
        if kind == "v":
            raise NotImplementedError("the PYTHON device runs scalar kernels (no vector lanes)")
        return np.zeros(self.lanes.count, dtype=np.int32), 1

    def loop_size(self, u: UOp) -> int:
        """A loop's trip count: its size, a symbolic one evaluated with this launch's values."""
        return sym_eval(u.arg[2], self.var_vals)

    def _open_loop(self, pc: int, u: UOp, ends: dict[int, int]) -> int:
        first, step = self._loop_start(u)
        active = self.active & (first < self.loop_size(u))
        if not active.any():
            return ends[pc] + 1  # no thread runs this loop
        self.loops.append(_Loop(pc, self.active, step))
        self.values[u] = first
        self.active = active
        return pc + 1

    def _close_loop(self, pc: int, u: UOp) -> int:
        loop = self.loops[-1]
        counter = u.src[0]
        following = self.values[counter] + loop.step
        active = loop.outer_active & (following < self.loop_size(counter))
        if active.any():
            self.values[counter] = following
            self.active = active
            return loop.start + 1
        self.loops.pop()
        self.active = loop.outer_active
        return pc + 1

    # ---- memory ----

    def memory_of(self, define: UOp) -> tuple[np.ndarray, str]:
        if define.op is Ops.DEFINE_LOCAL:
            return self.shared[define], f"local{define.arg[0]}"
        return self.arrays[define.arg[0]], f"data{define.arg[0]}"

    def check_bounds(self, pc: int, kind: str, define: UOp, lanes: np.ndarray,
                     addresses: np.ndarray) -> None:
        size = define.arg[1]
        outside = (addresses < 0) | (addresses >= size)
        if outside.any():
            lane = int(lanes[np.argmax(outside)])
            _, name = self.memory_of(define)
            address = int(addresses[np.argmax(outside)])
            verb = "reads" if kind == "read" else "writes"
            raise OutOfBoundsError(
                f"out-of-bounds {'load' if kind == 'read' else 'store'} at step %{pc}: "
                f"{_thread_name(self.lanes, lane)} {verb} {name}[{address}], but {name} has "
                f"{size} elements")

    def record(self, pc: int, kind: str, define: UOp, lanes: np.ndarray,
               addresses: np.ndarray) -> None:
        if self.trace is None or not lanes.size:
            return
        _, name = self.memory_of(define)
        self.trace.events.append(AccessEvent(
            pc, kind, name, self.phase, self.lanes.group_id[lanes], self.lanes.local_id[lanes],
            addresses.astype(np.int64)))

    def track_shared(self, pc: int, kind: str, define: UOp, lanes: np.ndarray,
                     addresses: np.ndarray) -> None:
        """Race check: between two barriers, an element of shared memory may be written by
        one thread only, and read by others only if nobody writes it."""
        slots = self.lanes.group_index[lanes] * define.arg[1] + addresses
        _update_range((self.writers if kind == "write" else self.readers)[define], slots, lanes)
        others = [self.writers[define]] if kind == "read" else \
            [self.writers[define], self.readers[define]]
        for low_high in others:
            low, high = low_high[0][slots], low_high[1][slots]
            clash = (high >= 0) & ((low != lanes) | (high != lanes))
            if clash.any():
                at = int(np.argmax(clash))
                other = int(low[at]) if low[at] != lanes[at] else int(high[at])
                self._raise_race(pc, kind, define, int(lanes[at]), other,
                                 int(addresses[at]), low_high is self.writers[define])

    def _raise_race(self, pc: int, kind: str, define: UOp, lane: int, other: int,
                    address: int, other_wrote: bool) -> None:
        _, name = self.memory_of(define)
        verb = "writes" if kind == "write" else "reads"
        other_verb = "wrote" if other_wrote else "read"
        raise SharedMemoryRaceError(
            f"shared-memory race at step %{pc}: {_thread_name(self.lanes, lane)} {verb} "
            f"{name}[{address}], which {_thread(self.lanes, other)} "
            f"{other_verb} since the last barrier (phase {self.phase}): put a barrier "
            "between them")


def _update_range(low_high: tuple[np.ndarray, np.ndarray], slots: np.ndarray,
                  lanes: np.ndarray) -> None:
    """Widen each slot's (smallest, largest) lane to include `lanes` (-1: none yet)."""
    low, high = low_high
    unset = np.iinfo(np.int64).max
    widened = np.where(low < 0, unset, low)
    np.minimum.at(widened, slots, lanes)
    low[:] = np.where(widened == unset, -1, widened)
    np.maximum.at(high, slots, lanes)


def _alu(u: UOp, sources: list[np.ndarray]) -> np.ndarray:
    """One ALU op for every lane, with NUMPY's function. bfloat16 lanes hold 16-bit words (the
    host format): an op on them computes on their float32 values and rounds back to words, as
    the NUMPY device does (WHERE moves words as they are, a bitcast reads them as bits)."""
    bfloat16 = dtypes.bfloat16
    if u.op is Ops.WHERE or is_bitcast(u) or bfloat16 not in (u.dtype, *(s.dtype for s in u.src)):
        return np.asarray(NUMPY_OPS[u.op](u, *sources), dtype=u.dtype.np)
    wide = [from_bfloat16_bits(value) if s.dtype == bfloat16 else value
            for value, s in zip(sources, u.src)]
    as_float = u.replace(dtype=dtypes.float32) if u.dtype == bfloat16 else u
    result = np.asarray(NUMPY_OPS[u.op](as_float, *wide))
    return to_bfloat16_bits(result) if u.dtype == bfloat16 else result.astype(u.dtype.np)


def _constant(value: float | int | bool, dtype: DType, count: int) -> np.ndarray:
    """`count` lanes of a constant (a bfloat16 one as its word)."""
    if dtype == dtypes.bfloat16:
        return to_bfloat16_bits(np.full(count, value, dtype=np.float32))
    return np.full(count, value, dtype=dtype.np)


def _matching_ends(uops: list[UOp]) -> dict[int, int]:
    """The position of each RANGE's END_RANGE."""
    ends, open_loops = {}, []
    for pc, u in enumerate(uops):
        if u.op is Ops.RANGE:
            open_loops.append(pc)
        elif u.op is Ops.END_RANGE:
            ends[open_loops.pop()] = pc
    return ends


# ---- one small function per op that is not plain arithmetic ----

def _run_define(run: _Run, pc: int, u: UOp) -> None:
    """Buffers are looked up by LOAD and STORE; nothing to compute."""


def _run_const(run: _Run, pc: int, u: UOp) -> None:
    run.values[u] = _constant(u.arg, u.dtype, run.lanes.count)


def _run_special(run: _Run, pc: int, u: UOp) -> None:
    run.values[u] = run.lanes.local_id[:, u.arg[1]].astype(np.int32)


def _access(run: _Run, pc: int, kind: str, buffer: UOp, index: UOp,
            condition: UOp | None) -> tuple[np.ndarray, np.ndarray]:
    """The lanes a LOAD or STORE touches (active, and its guard or gate true) and their
    addresses, checked against the buffer's bounds."""
    taking = run.active.copy()
    if condition is not None:
        taking &= run.values[condition].astype(bool)
    lanes = np.flatnonzero(taking)
    addresses = run.values[index][lanes].astype(np.int64)
    run.check_bounds(pc, kind, buffer, lanes, addresses)
    return lanes, addresses


def _run_load(run: _Run, pc: int, u: UOp) -> None:
    parts = load_parts(u)
    lanes, addresses = _access(run, pc, "read", parts.buffer, parts.index, parts.valid)
    memory, _ = run.memory_of(parts.buffer)
    result = np.zeros(run.lanes.count, dtype=u.dtype.np)
    if parts.buffer.op is Ops.DEFINE_LOCAL:
        run.track_shared(pc, "read", parts.buffer, lanes, addresses)
        result[lanes] = memory[run.lanes.group_index[lanes], addresses]
    else:
        result[lanes] = memory[addresses]
    run.record(pc, "read", parts.buffer, lanes, addresses)
    run.values[u] = result


def _run_store(run: _Run, pc: int, u: UOp) -> None:
    parts = store_parts(u)
    lanes, addresses = _access(run, pc, "write", parts.buffer, parts.index, parts.gate)
    memory, _ = run.memory_of(parts.buffer)
    values = run.values[parts.value][lanes]
    if parts.buffer.op is Ops.DEFINE_LOCAL:
        run.track_shared(pc, "write", parts.buffer, lanes, addresses)
        memory[run.lanes.group_index[lanes], addresses] = values
    else:
        memory[addresses] = values
    run.record(pc, "write", parts.buffer, lanes, addresses)


def _run_barrier(run: _Run, pc: int, u: UOp) -> None:
    """Every thread of a group that runs this step must be here: a group is either all active
    or (it finished its loop early) all inactive."""
    per_group = run.active.reshape(run.lanes.groups_in_batch, -1)
    split = per_group.any(axis=1) & ~per_group.all(axis=1)
    if split.any():
        group = int(np.argmax(split))
        waiting = np.flatnonzero(per_group[group])
        missing = np.flatnonzero(~per_group[group])
        start = group * per_group.shape[1]
        raise BarrierDivergenceError(
            f"barrier divergence at step %{pc}: in work-group "
            f"{tuple(int(v) for v in run.lanes.group_id[start])}, {len(waiting)} threads wait "
            f"at the barrier but {len(missing)} never reach it, e.g. "
            f"{_thread(run.lanes, start + int(missing[0]))}: "
            "the group would wait forever")
    run.phase += 1
    run._reset_phase()
    if run.trace is not None:
        run.trace.barriers = max(run.trace.barriers, run.phase)


def _run_define_var(run: _Run, pc: int, u: UOp) -> None:
    run.values[u] = np.full(run.lanes.count, sym_eval(u, run.var_vals), dtype=np.int32)


def _run_wmma(run: _Run, pc: int, u: UOp) -> None:
    """A warp's tensor-core instruction (codegen/wmma.py): each 32 consecutive threads of a group
    are one warp; its lanes' sources are their fragments of A and B; this node's value is each
    lane's element `arg.element` of D = A @ B. The WMMA nodes of one instruction share one
    product."""
    arg: WMMAArg = u.arg
    core = arg.core
    if run.launch.threads_per_group % core.threads or run.launch.local_size[0] != core.threads:
        raise EmulatorError(f"a WMMA ({core.name}) runs on warps of {core.threads} threads "
                            f"(along dimension 0 of the work-group); this work-group has "
                            f"{run.launch.local_size}")
    groups = run.lanes.count // core.threads  # warps: consecutive threads of a work-group
    per_group = run.active.reshape(groups, core.threads)
    split = per_group.any(axis=1) & ~per_group.all(axis=1)
    if split.any():
        group = int(np.argmax(split))
        lane = group * core.threads + int(np.argmax(~per_group[group]))
        raise WarpDivergenceError(
            f"warp divergence at step %{pc}: {_thread_name(run.lanes, lane)} does not run the "
            f"tensor-core instruction ({core.name}) that the rest of its warp runs")
    sources = [run.values[s] for s in u.src]
    key = (u.src, arg.instruction)
    cached = run.products.get(key)
    if cached is None or any(a is not b for a, b in zip(cached[0], sources)):
        a = np.stack(sources[:core.a_elements], axis=-1).reshape(groups, core.threads, -1)
        b = np.stack(sources[core.a_elements:], axis=-1).reshape(groups, core.threads, -1)
        cached = (sources, wmma_reference(core, a, b, arg.dtype_in))
        run.products[key] = cached
    run.values[u] = cached[1][:, :, arg.element].reshape(-1).astype(u.dtype.np)
    if run.trace is not None and all(event.step != pc for event in run.trace.fragments):
        a_table, b_table, c_table = core.tables
        run.trace.fragments.append(FragmentEvent(pc, core.name, (core.m, core.n, core.k),
                                                 arg.element, a_table, b_table,
                                                 c_table[:, arg.element]))


def _run_define_acc(run: _Run, pc: int, u: UOp) -> None:
    run.values[u] = _constant(u.src[0].arg, u.dtype, run.lanes.count)


def _run_accumulate(run: _Run, pc: int, u: UOp) -> None:
    acc, value = u.src
    combined = _alu(UOp(u.arg, u.dtype, u.src), [run.values[acc], run.values[value]])
    run.values[acc] = np.where(run.active, combined, run.values[acc]).astype(u.dtype.np)


def _run_reduce(run: _Run, pc: int, u: UOp) -> None:
    run.values[u] = run.values[run.program.accumulators[u]]


_HANDLERS = {
    Ops.DEFINE_GLOBAL: _run_define, Ops.DEFINE_LOCAL: _run_define, Ops.CONST: _run_const,
    Ops.SPECIAL: _run_special, Ops.LOAD: _run_load, Ops.STORE: _run_store,
    Ops.BARRIER: _run_barrier, Ops.DEFINE_ACC: _run_define_acc,
    Ops.ACCUMULATE: _run_accumulate, Ops.REDUCE: _run_reduce, Ops.WMMA: _run_wmma,
    Ops.DEFINE_VAR: _run_define_var,
}


# ---- the whole launch ----

def emulate(program: LinearProgram, arrays: list[np.ndarray], name: str = "kernel",
            record: bool = False, groups_at_once: int | None = None,
            var_vals: dict[str, int] | None = None) -> Trace:
    """Run `program` on `arrays` (one flat numpy array per DEFINE_GLOBAL, written in place),
    work-group by work-group. `record`: keep every thread's reads and writes in the Trace.
    `groups_at_once`: how many groups run side by side (default: as many as MAX_LANES
    threads allow; 1 runs them strictly one after another). `var_vals`: the values of the
    program's Variables, by name (a kernel over symbolic sizes)."""
    if any(u.dtype.count > 1 for u in program.uops):
        raise NotImplementedError("the PYTHON device runs scalar kernels (no vector types)")
    launch = plan_group_launch(program)
    sizes = {f"data{g.arg[0]}": g.arg[1] for g in program.globals}
    sizes.update({f"local{d.arg[0]}": d.arg[1] for d in program.locals})
    shared_bytes = sum(d.arg[1] * d.dtype.itemsize for d in program.locals)
    trace = Trace(name, launch, sizes, shared_bytes)
    batch = groups_at_once or max(1, MAX_LANES // launch.threads_per_group)
    for first in range(0, launch.group_count, batch):
        lanes = _make_lanes(launch, first, min(batch, launch.group_count - first))
        _Run(program, launch, arrays, lanes, trace if record else None, var_vals).run()
    return trace


# ---- the device: Renderer, Compiler and Program ----

class PythonRenderer:
    """The PYTHON device's "source" is the linear program itself, printed; the compiler gets
    the program back. It supports group reductions and local tiles (shared memory and
    barriers), and tensor cores (their semantics, codegen/wmma.py)."""

    device = "PYTHON"
    vector_width = 0
    capabilities = replace(GPU_CAPABILITIES, tensor_cores=((16, 8, 16),))

    def __init__(self) -> None:
        self.programs: dict[str, LinearProgram] = {}

    def spec(self, name: str, program: LinearProgram) -> ProgramSpec:
        launch = plan_group_launch(program)
        return spec_of(name, self.render(name, program), program,
                       global_size=launch.global_size, local_size=launch.local_size)

    def render(self, name: str, program: LinearProgram) -> str:
        launch = plan_group_launch(program)
        source = (f"// launch: global {launch.global_size} local {launch.local_size}\n"
                  f"// kernel {name}\n{program}\n")
        self.programs[source] = program
        return source


class PythonCompiler(Compiler):
    """Nothing to compile: the "binary" is the program the source was printed from."""

    cache_key = "python-emulator"

    def __init__(self, renderer: PythonRenderer):
        self.renderer = renderer

    def compile(self, source: str) -> Any:
        if source not in self.renderer.programs:
            raise ValueError("the PYTHON device runs programs its renderer printed")
        return self.renderer.programs[source]


class PythonProgram:
    """Runs one linear program on buffers, and hands its record to `record_threads`."""

    def __init__(self, name: str, program: LinearProgram):
        self.name, self.linear = name, program

    def __call__(self, *buffers: Buffer, vals: tuple[int, ...] = ()) -> None:
        arrays = [b.storage.view(b.dtype.np, b.size) for b in buffers]
        var_vals = {v.arg[0]: value for v, value in zip(self.linear.variables, vals)}
        trace = emulate(self.linear, arrays, self.name, record=bool(_trace_logs),
                        var_vals=var_vals)
        for log in _trace_logs:
            log.append(trace)


def make_backend() -> Backend:
    renderer = PythonRenderer()
    backend = Backend("PYTHON", HostAllocator(), renderer, PythonCompiler(renderer),
                      PythonProgram)
    backend.unsupported_dtypes = {}  # type: ignore[attr-defined]  # numpy holds every dtype
    return backend

