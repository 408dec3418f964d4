"""Chapter 9 (part 4): the engine — running a schedule.

What this teaches:
- realizing a tensor is three steps: schedule its graph into kernels for its device
  (`build_schedule`: chapter 6's kernels, with packing copies before big matmuls, chapter 7),
  get a runnable program for each kernel (interpret it, or lower -> render -> compile it:
  chapters 7-8), then run them in order on their buffers. viz draws the schedule that
  `build_schedule` returns, so what it shows is what runs;
- one executor. The executor's contract: a `Plan` is a list of buffers by slot and the steps
  that launch one program each on their slots (writing the first, reading the rest), and
  `run(plan, buffers, var_vals)` launches its steps in order, counts each in GlobalCounters
  the same way, and shows each to whoever observes the run. Every eager realize and every
  TinyJit replay (engine/jit.py) is such a run; the plan cache, the lean key and a capture are ways
  to find a plan;
- programs are cached by kernel AST: the second time the same computation runs, nothing is
  lowered or compiled again (the cache holds at most `RUNNER_CACHE_SIZE` programs, and
  `clear_caches()` empties it);
- eager dispatch: a fresh graph of the same *structure* (ops, args, dtypes, shapes, devices,
  with its input buffers as numbered holes) is scheduled the same way, so the whole plan (the
  items, their programs, which buffer goes where) is cached by that structure (`plan_key`).
  A hit skips scheduling and lowering: it allocates the plan's new buffers and launches. The
  key holds no object identity and no buffer, so a hit never depends on the garbage collector
  or on stale memory; the cache is an LRU of `PLAN_CACHE_SIZE` plans (PLAN_CACHE=0 turns it
  off, `clear_caches()` empties it). The lean path (`realize_elementwise`) finds the plan of
  the commonest eager graph, one elementwise op over realized buffers and constants, without
  walking it: by the structures its leaves keep (`elementwise_key`);
- everything the engine does can be watched, by observers of that run: DEBUG=1 prints each
  launch, 2 adds timings (and the build a launch ran when it was not the optimized one:
  `(tcc)`, chapter 9), 3 the AST and the fusion reasons, 4 the generated source;
  `record_launches()` hands each launch to Python code (viz, the JIT); `GlobalCounters`
  counts kernels, ops, bytes and time on every run. When nobody observes, `run` checks that
  once and only launches; a watched realize plans afresh, so each step keeps the item the
  scheduler made (its reasons, its buffers), and is run by the same `run`.

Builds on: device.py, engine/schedule.py, opt/pack.py, codegen/lower.py, render/. Used by:
tensor/, viz.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tinyteach.codegen.lower import LinearProgram, ProgramSpec, lower
from tinyteach.codegen.plan import KernelOptions
from tinyteach.device import Backend, Buffer, Device
from tinyteach.dtype import DType
from tinyteach.engine import schedule
from tinyteach.engine.schedule import Schedule, ScheduleItem, estimate_ops, schedule_graph
from tinyteach.helpers import DEBUG, GlobalCounters, LRUCache, format_bytes
from tinyteach.ir.uop import (
    ALU,
    Ops,
    UOp,
    _arg_key,
    base_buffer,
    pretty,
    symbolic_view,
    unbind_graph,
    variables_of,
)
from tinyteach.opt import search
from tinyteach.opt.kernel import Opt, plan_of
from tinyteach.opt.pack import pack_operands
from tinyteach.settings import PLAN_CACHE, snapshot


@dataclass
class Runner:
    """A kernel ready to run on one device, with every stage that produced it kept for study."""

    name: str
    device: str
    program: Callable[..., Any]
    ast: UOp
    linear: LinearProgram | None = None
    source: str | None = None
    ops_estimate: int = 0
    variables: tuple[str, ...] = ()  # the Variables its sizes use: passed at each launch
    spec: ProgramSpec | None = None  # what the renderer gave the runtime (None: interpreted)

    @functools.cached_property
    def variable_ranges(self) -> tuple[tuple[int, int], ...]:
        """[min, max] of each of `variables`: its buffers are sized for the max, so a value
        outside would read and write past them."""
        return tuple((v.arg[1], v.arg[2]) for v in variables_of([self.ast]))


def launch_kernel(runner: Runner, buffers: list[Buffer], var_vals: dict[str, int]) -> None:
    """Run a kernel on its buffers, with the values of its Variables (`int i` parameters,
    after the buffers, in name order): a program over symbolic sizes is called with them,
    each checked against its Variable's range first, every other program with its buffers
    only."""
    if not runner.variables:
        runner.program(*buffers)
        return
    missing = [name for name in runner.variables if name not in var_vals]
    if missing:
        raise ValueError(f"kernel {runner.name} needs a value for the Variables {missing}")
    for name, (low, high) in zip(runner.variables, runner.variable_ranges):
        if not low <= var_vals[name] <= high:
            raise ValueError(f"kernel {runner.name}: Variable {name!r} is {var_vals[name]}, "
                             f"outside its range [{low}, {high}]; its buffers are sized for "
                             f"{name} <= {high}")
    runner.program(*buffers, vals=tuple(var_vals[name] for name in runner.variables))


@dataclass
class Launch:
    """One kernel launch, as recorded by `record_launches`."""

    item: ScheduleItem
    runner: Runner | None
    seconds: float
    buffers: list[Buffer] = field(default_factory=list)
    var_vals: dict[str, int] = field(default_factory=dict)  # the Variables' values it ran with


# compiled programs by (device, kernel AST, name); the least recently used go first past the
# bound (a long session builds many kernels that never come back)
RUNNER_CACHE_SIZE = 4096
runner_cache: LRUCache[tuple[str, UOp, str], Runner] = LRUCache("realize.runners",
                                                                 RUNNER_CACHE_SIZE)
_launch_logs: list[list[Launch]] = []
_logs_of_fresh_items: list[list[Launch]] = []  # the recordings that want items as scheduled


@contextlib.contextmanager
def record_launches(fresh_items: bool = True) -> Iterator[list[Launch]]:
    """Collect every launch inside the block: `with record_launches() as launches: ...`.
    Each launch's item is the one the scheduler made for this very graph (viz draws its
    buffers and its graph). `fresh_items=False`, for a recorder that reads only the
    launch's own buffers and the item's kernel (TinyJit's capture): a graph shaped like one
    seen before may run its cached plan, whose items were scheduled for that first graph,
    instead of being scheduled again."""
    launches: list[Launch] = []
    _launch_logs.append(launches)
    if fresh_items:
        _logs_of_fresh_items.append(launches)
    try:
        yield launches
    finally:
        _launch_logs.remove(launches)
        if fresh_items:
            _logs_of_fresh_items.remove(launches)


def compile_kernel(backend: Backend, name: str, ast: UOp) -> Runner:
    """Interpret (no renderer) or lower, render and compile one kernel for a device. A kernel
    over a symbolic size is lowered without optimizations (they split loops of known sizes)."""
    variables = tuple(v.arg[0] for v in variables_of([ast]))
    if backend.renderer is None:
        return Runner(name, backend.name, backend.program(ast), ast, ops_estimate=estimate_ops(ast),
                      variables=variables)
    actions = _actions(backend, name, ast)  # the heuristic's, or BEAM's
    linear = lower(ast, plan_of(ast, actions, backend.capabilities, backend.name))
    if DEBUG >= 3:  # the actions as a person would type them, then what they do, in words
        print(f"    actions of {name}: {actions}")
        applied = linear.applied_opts or ["none"]
        print(f"    optimizations of {name}: {'; '.join(applied)}")
    spec = backend.renderer.spec(name, linear)
    if DEBUG >= 4:
        print(spec.source)
    assert backend.compiler is not None
    binary = backend.compiler.compile(spec.source)
    return Runner(name, backend.name, backend.load_program(spec, binary), ast, linear,
                  spec.source, estimate_ops(ast), variables, spec)


def _actions(backend: Backend, name: str, ast: UOp) -> list[Opt]:
    """The actions a kernel is lowered with: those the heuristic (or BEAM) chose for it, applied
    to it one by one (opt.Kernel, `plan_of`), as a person would type them. A kernel over a
    symbolic size takes none (they split loops of known sizes)."""
    if ast.has_symbols:
        return []
    return search.actions_for(backend, name, ast)


def _plan(backend: Backend, name: str, ast: UOp) -> KernelOptions:
    """The plan those actions build: what lower() reads."""
    return plan_of(ast, _actions(backend, name, ast), backend.capabilities, backend.name)


def get_runner(item: ScheduleItem) -> Runner:
    key = (item.device, item.ast, item.name)
    if key not in runner_cache:
        runner_cache[key] = compile_kernel(Device[item.device], item.name, item.ast)
    return runner_cache[key]


def forget_runners(device: str) -> None:
    """Drop the programs compiled for one device, so a re-registered backend (exercise 12)
    compiles everything again with its new code. The cached plans that launch on it go too:
    each holds its runners."""
    for key in runner_cache:
        if key[0] == device:
            del runner_cache[key]
    for cache in (plan_cache, elementwise_plans):
        for plan_id in cache:
            plan = cache.entries[plan_id]
            if plan_id[2] == device or any(step.item.device == device for step in plan.steps):
                del cache[plan_id]


def run_schedule(items: list[ScheduleItem]) -> None:
    """Run the items in order (as `build_schedule` made them: packing copies included): their
    new kernels compiled together first (`precompile`), then the plan of the items as they
    are (`plan_of_items`) run by the executor."""
    precompile(items)
    plan, buffers = plan_of_items(items)
    values = {name: value for item in items for name, value in item.var_vals.items()}
    run(plan, buffers, values)


def precompile(items: list[ScheduleItem]) -> None:
    """Compile all of a schedule's new kernels for a device in one compiler call, when the
    device's compiler can (`compile_many`): starting gcc once per kernel costs ~50 ms each.
    (Skipped from DEBUG=3 on, which prints each kernel's stages just before it runs.)"""
    if DEBUG >= 3:
        return
    waiting: dict[str, list[ScheduleItem]] = {}
    queued: set[tuple[str, UOp]] = set()  # (a set: a deep chain's schedule has many kernels)
    for item in items:
        key = (item.device, item.ast, item.name)
        if item.kind == "kernel" and key not in runner_cache and \
                (item.device, item.ast) not in queued and not item.ast.has_symbols:
            waiting.setdefault(item.device, []).append(item)
            queued.add((item.device, item.ast))
    for device, group in waiting.items():
        backend = Device[device]
        if len(group) > 1 and backend.compiler is not None and backend.compiler.builds_together:
            _compile_together(backend, group)


def _compile_together(backend: Backend, group: list[ScheduleItem]) -> None:
    names = _unique_names([item.name for item in group])  # one library: no two alike
    linears = [lower(item.ast, _plan(backend, item.name, item.ast)) for item in group]
    specs = [backend.renderer.spec(name, linear) for name, linear in zip(names, linears)]
    assert backend.compiler is not None
    binaries = backend.compiler.compile_many(
        [spec.source for spec in specs], heavy=[spec.heavy for spec in specs],
        costs=[spec.instructions for spec in specs])
    for item, name, linear, spec, binary in zip(group, names, linears, specs, binaries):
        runner = Runner(name, backend.name, backend.load_program(spec, binary), item.ast,
                        linear, spec.source, estimate_ops(item.ast), spec=spec)
        runner_cache[(item.device, item.ast, item.name)] = runner


def _unique_names(names: list[str]) -> list[str]:
    """r_4_4, r_4_4, E_8 -> r_4_4, r_4_4n1, E_8 (tinygrad's way of telling kernels apart)."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        count = seen.get(name, 0)
        unique.append(name if count == 0 else f"{name}n{count}")
        seen[name] = count + 1
    return unique


# ---- realizing ----

def build_schedule(roots: list[UOp], default_device: str,
                   var_vals: dict[str, int] | None = None) -> Schedule:
    """The schedule that runs: the scheduler's kernels in order (engine/schedule.py), with a packing
    copy before each kernel that profits from one (opt/pack.py). realize() runs exactly these
    items and viz draws exactly these, so a drawing shows every kernel that runs. Nothing is
    computed is allocated when a kernel first uses them. `var_vals`: the values of the
    Variables of an unbound graph (`unbind_graph`), kept on each item."""
    schedule = schedule_graph(roots, default_device)
    items = pack_operands(schedule.items)
    values = var_vals or {}
    for item in items if values else []:  # each item: the values of its own Variables
        used = {v.arg[0] for v in variables_of([item.ast])}
        item.var_vals = {name: value for name, value in values.items() if name in used}
    return dataclasses.replace(schedule, items=items)


# ---- the executor: one plan, one run ----

@dataclass(frozen=True)
class PlanStep:
    """One launch of a plan: the item it came from, its program (None: a copy between
    devices; or not compiled yet, in a plan of a watched realize that compiles each kernel at
    its step), the slots of the plan's buffer list it runs on (output first: it writes
    `slots[0]` and reads the rest), and what it counts: its operations and bytes."""

    item: ScheduleItem
    runner: Runner | None
    slots: tuple[int, ...]
    nbytes: int
    ops: int = 0

    @property
    def writes(self) -> int:
        """The slot it writes."""
        return self.slots[0]

    @property
    def reads(self) -> tuple[int, ...]:
        """The slots it reads."""
        return self.slots[1:]


@dataclass(frozen=True)
class Plan:
    """What running a schedule does, on a list of buffers by slot. For an eager plan, holes
    0..n-1 are its input buffers and `fresh` the new buffers to allocate (slots n, n+1, ...);
    `steps` are the launches in order, `results` for each root (slot, alias?, its shape or
    None when symbolic) or None when the root stays as it is, and `assigned` the slots an
    assign writes into. `graph`: a device's batched executor of every step at once (a
    TinyJit capture's, called with the buffer list), and `captured`: the plan is a TinyJit
    capture, whose replay DEBUG reports in one line."""

    fresh: tuple[tuple[str, int, DType], ...]
    steps: tuple[PlanStep, ...]
    results: tuple[tuple[int, bool, tuple[int, ...] | None] | None, ...] = ()
    assigned: tuple[int, ...] = ()
    graph: Callable[[list[Buffer]], None] | None = None
    captured: bool = False

    @functools.cached_property  # (a frozen dataclass allows it: it writes the instance's dict)
    def ops(self) -> int:
        """The operations its launches count (GlobalCounters.global_ops)."""
        return sum(step.ops for step in self.steps)

    @functools.cached_property
    def nbytes(self) -> int:
        """The bytes its launches count (GlobalCounters.global_mem)."""
        return sum(step.nbytes for step in self.steps)


class Slots:
    """Numbers buffers by slot as a plan is made: the first buffer seen is slot 0, and so on
    (a Buffer is known by identity)."""

    def __init__(self, buffers: list[Buffer] | None = None):
        self.buffers: list[Buffer] = []
        self.number: dict[int, int] = {}
        for buffer in buffers or []:
            self.slot(buffer)

    def slot(self, buffer: Buffer) -> int:
        if id(buffer) not in self.number:
            self.number[id(buffer)] = len(self.buffers)
            self.buffers.append(buffer)
        return self.number[id(buffer)]


def step_of(item: ScheduleItem, runner: Runner | None, slots: tuple[int, ...],
            template: bool = False) -> PlanStep:
    """The step that launches `item` (with `runner`) on `slots`. A `template` step keeps the
    item without its buffers and graph (a cached plan runs on other buffers every time)."""
    ops = runner.ops_estimate if runner else 0
    if runner is None and item.kind == "kernel":
        ops = estimate_ops(item.ast)  # (compiled at its step: the count is the runner's)
    nbytes = sum(b.nbytes for b in item.buffers)
    if template:
        item = dataclasses.replace(item, buffers=[], old_contents_read=[], node=None,
                                   input_nodes=[])
    return PlanStep(item, runner, slots, nbytes, ops)


def plan_of_items(items: list[ScheduleItem]) -> tuple[Plan, list[Buffer]]:
    """The plan of a schedule's items as they are, and its buffers by slot (the items' own,
    allocated when a step first uses them). In a watched run each kernel not compiled yet is
    compiled at its step, so what its compile prints (DEBUG=3's stages, BEAM's line) follows
    the launches before it."""
    watched = DEBUG.value or _launch_logs
    slots = Slots()
    steps = []
    for item in items:
        runner = get_runner(item) if item.kind == "kernel" and not watched else None
        steps.append(step_of(item, runner, tuple(slots.slot(b) for b in item.buffers)))
    assigned = tuple(slots.slot(item.output) for item in items
                     if item.node is not None and item.node.op is Ops.ASSIGN)
    return Plan((), tuple(steps), assigned=assigned), slots.buffers


def run(plan: Plan, buffers: list[Buffer], var_vals: dict[str, int] | None = None) -> None:
    """The executor: launch the plan's steps in order on `buffers` (by slot), with the values
    of the Variables, and count them in GlobalCounters. Every realize and every TinyJit replay
    runs here. When nothing watches (no DEBUG, no recording) it only launches (the device's
    graph when the plan has one) and counts the whole plan at once; otherwise the observers
    see each launch (`observers`)."""
    if DEBUG.value or _launch_logs:
        _run_watched(plan, buffers, var_vals or {}, observers())
    else:
        _run_lean(plan, buffers, var_vals)
    for k in plan.assigned:
        buffers[k].overwritten = True  # older graphs must not read it as if unchanged


def _run_lean(plan: Plan, buffers: list[Buffer], var_vals: dict[str, int] | None) -> float:
    """Launch every step (or the plan's graph) and count them all at once; the seconds."""
    start = time.perf_counter()
    if plan.graph is not None:
        plan.graph(buffers)
    else:
        for step in plan.steps:
            if step.runner is None:
                buffers[step.slots[0]].copyin(buffers[step.slots[1]].numpy())
            elif step.runner.variables:  # a kernel over symbolic sizes: the values
                launch_kernel(step.runner, [buffers[k] for k in step.slots], var_vals or {})
            else:
                step.runner.program(*[buffers[k] for k in step.slots])
    seconds = time.perf_counter() - start
    GlobalCounters.time_sum_s += seconds
    GlobalCounters.kernel_count += len(plan.steps)
    GlobalCounters.global_ops += plan.ops
    GlobalCounters.global_mem += plan.nbytes
    return seconds


def _run_watched(plan: Plan, buffers: list[Buffer], var_vals: dict[str, int],
                 watching: list[Observer]) -> None:
    """The run with observers: launch by launch, each timed and counted on its own and shown
    to those that watch launches; the plan's graph runs only when none does."""
    per_launch = [observer for observer in watching if observer.watches_launches(plan)]
    if not per_launch and plan.graph is not None:
        seconds = _run_lean(plan, buffers, var_vals)
        for observer in watching:
            observer.finished(plan, seconds, batched=True)
        return
    total = 0.0
    for step in plan.steps:
        values = _values_of(step, var_vals)
        for observer in per_launch:
            observer.starting(step, values)
        launch = _launch_one(step, [buffers[k] for k in step.slots], var_vals, values)
        total += launch.seconds
        for observer in per_launch:
            observer.launched(launch, step)
    for observer in watching:
        observer.finished(plan, total, batched=False)


def _values_of(step: PlanStep, var_vals: dict[str, int]) -> dict[str, int]:
    """The values of the Variables one step's kernel uses, in this run: the run's, for the
    names its item keeps (a schedule made for these values), or for its program's Variables
    (a cached plan's items were scheduled without values)."""
    names = step.runner.variables if step.runner is not None else ()
    own = step.item.var_vals or {name: var_vals[name] for name in names if name in var_vals}
    return {name: var_vals.get(name, value) for name, value in own.items()}


def _launch_one(step: PlanStep, args: list[Buffer], var_vals: dict[str, int],
                values: dict[str, int]) -> Launch:
    """One step launched and counted, its program compiled first if it is not yet."""
    runner = step.runner
    if runner is None and step.item.kind == "kernel":
        runner = get_runner(step.item)
    for buffer in args:
        _ = buffer.storage  # allocate now, so allocation is not counted as kernel time
    start = time.perf_counter()
    if runner is None:
        args[0].copyin(args[1].numpy())
    else:
        launch_kernel(runner, args, var_vals)
        if DEBUG >= 2:
            Device[step.item.device].synchronize()
    seconds = time.perf_counter() - start
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += step.ops
    GlobalCounters.global_mem += step.nbytes
    GlobalCounters.time_sum_s += seconds
    return Launch(step.item, runner, seconds, args, values)


# ---- observers: what DEBUG prints, what record_launches keeps ----

class Observer:
    """Watches runs of the executor: `starting` before a launch, `launched` after it (both
    only when `watches_launches` of the plan), `finished` after the run."""

    def watches_launches(self, plan: Plan) -> bool:
        return True

    def starting(self, step: PlanStep, values: dict[str, int]) -> None:
        pass

    def launched(self, launch: Launch, step: PlanStep) -> None:
        pass

    def finished(self, plan: Plan, seconds: float, batched: bool) -> None:
        pass


class DebugPrinter(Observer):
    """DEBUG's lines: from 1 on a line per launch (2 adds its time and tier), from 3 the item
    before it (its AST and fusion reasons); a TinyJit replay is one line for the whole run."""

    def watches_launches(self, plan: Plan) -> bool:
        return not plan.captured

    def starting(self, step: PlanStep, values: dict[str, int]) -> None:
        if DEBUG >= 3:
            _print_item(step.item, values)

    def launched(self, launch: Launch, step: PlanStep) -> None:
        timing = f" tm {launch.seconds * 1e6:9.2f}us" if DEBUG >= 2 else ""
        values = "".join(f" {name}={value}" for name, value in sorted(launch.var_vals.items()))
        if DEBUG >= 2 and launch.runner is not None:
            timing += _tier_note(launch.runner)
        item = launch.item
        print(f"*** {item.device:<6} {GlobalCounters.kernel_count:4d} {item.name:<26} "
              f"arg {len(step.slots):2d} mem {format_bytes(step.nbytes):>9}{timing}{values}")

    def finished(self, plan: Plan, seconds: float, batched: bool) -> None:
        if plan.captured:
            how = "one graph call" if batched else "one by one"
            print(f"TinyJit: replayed {len(plan.steps)} kernels ({how}) in "
                  f"{seconds * 1e6:.1f}us")


class LaunchRecorder(Observer):
    """Appends each launch to a list: `record_launches`' (viz, TinyJit's capture)."""

    def __init__(self, log: list[Launch]):
        self.log = log

    def launched(self, launch: Launch, step: PlanStep) -> None:
        self.log.append(launch)


def observers() -> list[Observer]:
    """Who watches a run now: DEBUG's printer from DEBUG=1 on, and each open recording."""
    printer: list[Observer] = [DebugPrinter()] if DEBUG >= 1 else []
    return printer + [LaunchRecorder(log) for log in _launch_logs]


def _print_item(item: ScheduleItem, values: dict[str, int]) -> None:
    print(f"--- kernel {item.name} on {item.device}: stored because {item.boundary_reason}")
    for note in item.fusions + item.input_reasons:
        print(f"    {note}")
    if values:
        listed = ", ".join(f"{name}={value}" for name, value in sorted(values.items()))
        print(f"    symbolic sizes: {listed} (one compiled kernel serves every value)")
    print(pretty(item.ast))


def _tier_note(runner: Runner) -> str:
    """` (tcc)` when this launch ran a fast tier's build (the CPU's tiers, runtime/cpu.py: tcc
    or cc -O0 first, while cc -O2 builds the kernel in the background); nothing when it ran
    the optimized build, so a line reads the same whenever the disk cache was warm."""
    tier = getattr(runner.program, "tier", "optimized")
    if tier == "optimized":
        return ""
    return f" ({getattr(runner.program, 'tier_name', tier)})"


# ---- the plan cache (eager dispatch) ----

PLAN_CACHE_SIZE = 1024


plan_cache: LRUCache[tuple[Any, ...], Plan] = LRUCache("realize.plans", PLAN_CACHE_SIZE)


def plan_key(roots: list[UOp], default_device: str) -> tuple[tuple[Any, ...], list[Buffer]]:
    """The graph's structure, and its input buffers in hole order. Each node becomes
    (op, dtype, arg, source positions); a BUFFER's arg becomes its hole number with the
    buffer's device, size, dtype and whether assign() overwrote it. Two graphs with the same
    key are scheduled alike (the scheduler looks at nothing else)."""
    order = roots[0].toposort if len(roots) == 1 else schedule.toposort_of(roots)
    position: dict[UOp, int] = {}
    holes: dict[int, int] = {}
    buffers: list[Buffer] = []
    parts: list[Any] = []
    for node in order:
        position[node] = len(parts)
        if node.op is Ops.BUFFER:
            buffer: Buffer = node.arg
            hole = holes.setdefault(id(buffer), len(buffers))
            if hole == len(buffers):
                buffers.append(buffer)
            arg: Any = ("hole", hole, buffer.device, buffer.size, buffer.dtype.name,
                        buffer.overwritten)
        else:
            arg = _arg_key(node.arg)
        # this loop is the eager realize's hot path: a dtype enters the key by its name (each
        # dtype has its own: dtype.py makes them by name), a str whose hash Python keeps,
        # where hashing a DType is a Python call; and a list comprehension beats a generator
        parts.append((node.op, node.dtype.name, arg, tuple([position[s] for s in node.src])))
    key = (tuple(parts), tuple([position[r] for r in roots]), default_device, snapshot())
    return key, buffers


def make_plan(schedule_: Schedule, roots: list[UOp], holes: list[Buffer]) -> Plan:
    """The plan of a schedule just built, to cache: each buffer by slot (holes first, then
    the new ones, which each run allocates afresh), each step compiled and without buffers."""
    slots = Slots(holes)
    slot = slots.slot
    steps = []
    for item in schedule_.items:
        runner = None if item.kind == "copy" else get_runner(item)
        steps.append(step_of(item, runner, tuple(slot(b) for b in item.buffers), template=True))
    assigned = tuple(slot(item.output) for item in schedule_.items
                     if item.node is not None and item.node.op is Ops.ASSIGN)
    results: list[tuple[int, bool, tuple[int, ...] | None] | None] = []
    for root in roots:
        result = schedule_.becomes.get(root)
        if result is None:
            results.append(None)
            continue
        base = result
        while base.op is not Ops.BUFFER:
            base = base.src[0]
        is_alias = root.op is Ops.ASSIGN
        buffer = schedule.assign_target(root) if is_alias else base.arg
        shape = root.shape  # kept when plain ints: a later root of this structure has it too
        plain = None if any(isinstance(size, UOp) for size in shape) else shape
        results.append((slot(buffer), is_alias, plain))
    fresh = tuple((b.device, b.size, b.dtype) for b in slots.buffers[len(holes):])
    return Plan(fresh, tuple(steps), tuple(results), assigned)


def run_plan(plan: Plan, roots: list[UOp], holes: list[Buffer],
             var_vals: dict[str, int] | None = None) -> list[UOp]:
    """Run a cached plan on this graph's buffers (its holes, then new buffers allocated now,
    so allocation is not counted as kernel time) and return the roots' results. `var_vals`:
    this graph's values of its Variables (the plan's key holds no value, so a new value
    reuses the plan and its kernels run with the new value)."""
    for buffer in holes:
        if not buffer.is_allocated:  # (an input may be a tensor's memory not yet written)
            _ = buffer.storage
    buffers = holes + [Buffer(device, size, dtype, allocate=True)
                       for device, size, dtype in plan.fresh]
    run(plan, buffers, var_vals)
    results = []
    for root, result in zip(roots, plan.results):
        if result is None:
            results.append(root)
            continue
        k, is_alias, shape = result
        buffer = buffers[k].alias() if is_alias else buffers[k]
        if shape is None:  # symbolic: the first elements of a buffer sized for the largest
            results.append(schedule._buffer_node(buffer, root))
        else:
            results.append(_result_node(buffer, root.dtype, shape))
    return results


def _result_node(buffer: Buffer, dtype: DType, shape: tuple[int, ...]) -> UOp:
    """`buffer` read as `shape` (schedule._buffer_node, built directly for plain ints): a
    BUFFER node, reshaped unless the shape is the buffer's own, (size,)."""
    node = UOp(Ops.BUFFER, dtype, (), buffer)
    return node if shape == (buffer.size,) else UOp(Ops.RESHAPE, dtype, (node,), shape)


def schedule_uops(roots: list[UOp], default_device: str) -> tuple[list[ScheduleItem],
                                                                    list[UOp]]:
    """tinygrad's `schedule()`: the items that compute `roots`, not run, and for each root the
    BUFFER-backed node that will hold its value once `run_schedule(items)` has run them. The
    buffers an assign writes into count as overwritten from now on (graphs built before read
    the old contents, which the items read before they write)."""
    bound = roots
    roots, var_vals = unbind_graph(roots) if any(r.has_symbols for r in roots) else (roots, {})
    schedule_ = build_schedule(roots, default_device, var_vals)
    for item in schedule_.items:
        if item.node is not None and item.node.op is Ops.ASSIGN:
            item.output.overwritten = True
    results = [schedule_.becomes.get(node, node) for node in roots]
    if var_vals:  # (each item keeps the values of its Variables: run_schedule passes them)
        results = [_bound_result(b, u, r) for b, u, r in zip(bound, roots, results)]
    return schedule_.items, results


def realize_uops(roots: list[UOp], default_device: str) -> list[UOp]:
    """Compute `roots`; returns, for each, a BUFFER-backed node holding its value.

    Values are never remembered between calls: a graph built again is computed again. What
    is remembered is the *plan*, by the graph's structure (see `plan_key`): a graph shaped
    like one seen before runs the same kernels on its own buffers, without scheduling.

    A graph with bound Variables is first unbound (`unbind_graph`): its kernels and its plan
    are those of the unbound graph, the same for every value, and the values (`var_vals`)
    go to the launches. Each result is then read with the bound sizes of its root."""
    if not any(root.has_symbols for root in roots):
        return _realize_unbound(roots, default_device, {})
    unbound, var_vals = unbind_graph(roots)
    results = _realize_unbound(unbound, default_device, var_vals)
    return [_bound_result(root, free, result) for root, free, result in
            zip(roots, unbound, results)]


def _bound_result(root: UOp, unbound: UOp, result: UOp) -> UOp:
    """The result of a bound root: its buffer read with the root's own (bound) shape."""
    if result is unbound:  # nothing was computed: the root stays as it was
        return root
    base = base_buffer(result)
    assert base is not None, "a realized result is a view of its buffer"
    return symbolic_view(base, root.shape)


def _realize_unbound(roots: list[UOp], default_device: str,
                     var_vals: dict[str, int]) -> list[UOp]:
    if not PLAN_CACHE or DEBUG >= 1 or _logs_of_fresh_items:
        # a watched realize plans afresh: DEBUG prints each item as the scheduler made it,
        # and a recording such as viz's keeps each with its own buffers (TinyJit's capture
        # takes a cached plan: it keeps each launch's buffers); the executor that runs the
        # plan is the same
        schedule_ = build_schedule(roots, default_device, var_vals)
        run_schedule(schedule_.items)
        return [schedule_.becomes.get(node, node) for node in roots]
    plan, holes = plan_for(roots, default_device)
    return run_plan(plan, roots, holes, var_vals)


def plan_for(roots: list[UOp], default_device: str) -> tuple[Plan, list[Buffer]]:
    """The cached plan of this graph's structure (made and cached on a miss), and the graph's
    input buffers in hole order."""
    key, holes = plan_key(roots, default_device)
    plan = plan_cache.get(key)
    if plan is None:
        schedule_ = build_schedule(roots, default_device)
        precompile(schedule_.items)
        plan = make_plan(schedule_, roots, holes)
        plan_cache[key] = plan
    return plan, holes


# ---- the lean path: one elementwise kernel over realized buffers ----
# `(x + 1).realize()` in a loop is the common eager case: one ALU node whose sources are
# leaves, a buffer or a constant seen through movement ops. Its plan is cached like any other,
# but found without walking the graph: each leaf's structure is worked out once and kept on the
# leaf's node, so the key is the root's op and dtype, its leaves' structures, which
# leaves read the same buffer, and the settings. Every graph with that key has the same
# structure (plan_key's), so it shares that plan; the key holds no object and no buffer.

ELEMENTWISE = frozenset(ALU)
LEAF_OPS = frozenset((Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.SHRINK, Ops.FLIP))
NOT_A_LEAF: tuple[Any, None] = (None, None)
# the lean path's keys -> the plans plan_cache holds for the same graphs (its own LRU: a plan
# is counted once in plan_cache, and either table may drop an entry without the other)
elementwise_plans: LRUCache[tuple[Any, ...], Plan] = LRUCache("realize.elementwise_plans",
                                                              PLAN_CACHE_SIZE)


def leaf_of(node: UOp) -> tuple[Any, Buffer | None]:
    """(its structure, its buffer or None) for a leaf: a BUFFER or CONST seen through
    movement ops with constant arguments; NOT_A_LEAF for anything else. The structure is a
    tuple of what the plan depends on (ops, dtypes, args, the buffer's device, size, dtype),
    a property of the node alone: computed once and kept in the node's `__dict__`, as a
    cached_property keeps its value (no engine state: nothing to forget in clear_caches)."""
    found: tuple[Any, Buffer | None] | None = node.__dict__.get("_leaf")
    if found is None:
        found = node.__dict__["_leaf"] = _leaf_structure(node)
    return found


def _leaf_structure(node: UOp) -> tuple[Any, Buffer | None]:
    parts: list[Any] = []
    while node.op in LEAF_OPS:
        if any(isinstance(a, UOp) for a in _flat(node.arg)):
            return NOT_A_LEAF  # a symbolic size: the whole path binds its Variables
        parts.append((node.op, node.dtype.name, node.arg))
        node = node.src[0]
    if node.op is Ops.CONST:
        parts.append((node.op, node.dtype.name, _arg_key(node.arg)))
        buffer = None
    elif node.op is Ops.BUFFER:
        buffer = node.arg
        parts.append((node.op, node.dtype.name, buffer.device, buffer.size, buffer.dtype.name))
    else:
        return NOT_A_LEAF
    return tuple(parts), buffer


def _flat(arg: Any) -> tuple[Any, ...]:
    """A movement op's arg as a flat tuple: (2, 3) or ((0, 1), (0, 4)) -> its numbers."""
    if isinstance(arg, tuple) and arg and isinstance(arg[0], tuple):
        return tuple(x for pair in arg for x in pair)
    return arg if isinstance(arg, tuple) else (arg,)


def elementwise_key(root: UOp, default_device: str) -> tuple[tuple[Any, ...],
                                                            list[Buffer]] | None:
    """The lean path's plan key of `root` and its input buffers in hole order, or None when
    `root` is not one elementwise op over leaves. `slots` says, for each source, which input
    buffer it reads (-1: a constant); each buffer's `overwritten` flag is read now (assign()
    sets it later), as plan_key does."""
    if root.op not in ELEMENTWISE:
        return None
    structures, slots, buffers = [], [], []
    for source in root.src:
        structure, buffer = leaf_of(source)
        if structure is None:
            return None
        structures.append(structure)
        if buffer is None:
            slots.append(-1)
        else:
            if buffer not in buffers:  # (a Buffer compares by identity)
                buffers.append(buffer)
            slots.append(buffers.index(buffer))
    # (an ALU op's arg is None, a bitcast's BITCAST: in the key, a bitcast and a conversion
    # of the same buffer get different plans)
    arg = root.arg if root.arg is None else _arg_key(root.arg)
    key = ("elementwise", (root.op, root.dtype.name, arg), default_device,
           tuple(structures), tuple(slots), tuple([b.overwritten for b in buffers]), snapshot())
    return key, buffers


def realize_elementwise(root: UOp, default_device: str) -> UOp | None:
    """Realize `root` by the lean path, or None when it does not apply (the root is not one
    elementwise op over leaves, or the realize is watched: DEBUG, a recording, PLAN_CACHE=0).
    A miss makes the plan through `plan_for` (the whole path) and caches it under this key
    too, after checking that both keys number the input buffers alike."""
    if not PLAN_CACHE.value or DEBUG.value or _launch_logs:
        return None
    found = elementwise_key(root, default_device)
    if found is None:
        return None
    key, buffers = found
    plan = elementwise_plans.get(key)
    if plan is None:
        plan, holes = plan_for([root], default_device)
        if len(holes) != len(buffers) or any(h is not b for h, b in zip(holes, buffers)):
            return run_plan(plan, [root], holes)[0]  # (never seen: the full key's order is ours)
        elementwise_plans[key] = plan
    return run_plan(plan, [root], buffers)[0]
