"""Chapter 9 (part 4): the engine — running a schedule.

What this teaches:
- realizing a tensor is three steps: schedule its graph into kernels for its device
  (`build_schedule`: chapter 6's kernels, with packing copies before big matmuls, chapter 7),
  get a runnable program for each kernel (interpret it, or lower -> render -> compile it:
  chapters 7-8), then run them in order on their buffers. viz draws the schedule that
  `build_schedule` returns, so what it shows is what runs;
- programs are cached by kernel AST: the second time the same computation runs, nothing is
  lowered or compiled again (the cache holds at most `RUNNER_CACHE_SIZE` programs, and
  `clear_caches()` empties it);
- everything the engine does can be watched: DEBUG=1 prints each launch, 2 adds timings, 3 the
  AST and the fusion reasons, 4 the generated source; `GlobalCounters` counts kernels, ops,
  bytes and time; `record_launches()` hands each launch to Python code (viz, the JIT).

Builds on: device.py, schedule.py, pack.py, lower.py, render/. Used by: tensor.py, viz.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tinyteach import search
from tinyteach.device import Backend, Buffer, Device
from tinyteach.helpers import DEBUG, GlobalCounters, LRUCache, format_bytes
from tinyteach.lower import LinearProgram, lower
from tinyteach.pack import pack_operands
from tinyteach.schedule import Schedule, ScheduleItem, estimate_ops, schedule_graph
from tinyteach.uop import Ops, UOp, pretty


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


@dataclass
class Launch:
    """One kernel launch, as recorded by `record_launches`."""

    item: ScheduleItem
    runner: Runner | None
    seconds: float
    buffers: list[Buffer] = field(default_factory=list)


# compiled programs by (device, kernel AST, name); the least recently used go first past the
# bound (a long session builds many kernels that never come back)
RUNNER_CACHE_SIZE = 4096
runner_cache: LRUCache[tuple[str, UOp, str], Runner] = LRUCache("realize.runners",
                                                                 RUNNER_CACHE_SIZE)
_launch_logs: list[list[Launch]] = []


@contextlib.contextmanager
def record_launches() -> Iterator[list[Launch]]:
    """Collect every launch inside the block: `with record_launches() as launches: ...`."""
    launches: list[Launch] = []
    _launch_logs.append(launches)
    try:
        yield launches
    finally:
        _launch_logs.remove(launches)


def compile_kernel(backend: Backend, name: str, ast: UOp) -> Runner:
    """Interpret (no renderer) or lower, render and compile one kernel for a device."""
    if backend.renderer is None:
        return Runner(name, backend.name, backend.program(ast), ast, ops_estimate=estimate_ops(ast))
    linear = lower(ast, search.options_for(backend, name, ast))  # heuristic, or BEAM's choice
    if DEBUG >= 3:
        applied = linear.applied_opts or ["none"]
        print(f"    optimizations of {name}: {'; '.join(applied)}")
    source = backend.renderer.render(name, linear)
    if DEBUG >= 4:
        print(source)
    assert backend.compiler is not None
    binary = backend.compiler.compile(source)
    return Runner(name, backend.name, backend.program(name, binary), ast, linear, source,
                  estimate_ops(ast))


def get_runner(item: ScheduleItem) -> Runner:
    key = (item.device, item.ast, item.name)
    if key not in runner_cache:
        runner_cache[key] = compile_kernel(Device[item.device], item.name, item.ast)
    return runner_cache[key]


def forget_runners(device: str) -> None:
    """Drop the programs compiled for one device, so a re-registered backend (exercise 12)
    compiles everything again with its new code."""
    for key in runner_cache:
        if key[0] == device:
            del runner_cache[key]


def _print_item(item: ScheduleItem) -> None:
    print(f"--- kernel {item.name} on {item.device}: stored because {item.boundary_reason}")
    for note in item.fusions + item.input_reasons:
        print(f"    {note}")
    print(pretty(item.ast))


def run_item(item: ScheduleItem) -> None:
    if DEBUG >= 3:
        _print_item(item)
    runner = None if item.kind == "copy" else get_runner(item)
    for buffer in item.buffers:
        _ = buffer.storage  # allocate now, so allocation is not counted as kernel time
    start = time.perf_counter()
    if runner is None:
        item.output.copyin(item.buffers[1].numpy())
    else:
        runner.program(*item.buffers)
        if DEBUG >= 2:
            Device[item.device].synchronize()
    seconds = time.perf_counter() - start
    _count(item, runner, seconds)
    for log in _launch_logs:
        log.append(Launch(item, runner, seconds, list(item.buffers)))


def _count(item: ScheduleItem, runner: Runner | None, seconds: float) -> None:
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += runner.ops_estimate if runner else 0
    memory = sum(b.nbytes for b in item.buffers)
    GlobalCounters.global_mem += memory
    GlobalCounters.time_sum_s += seconds
    if DEBUG >= 1:
        timing = f" tm {seconds * 1e6:9.2f}us" if DEBUG >= 2 else ""
        print(f"*** {item.device:<6} {GlobalCounters.kernel_count:4d} {item.name:<26} "
              f"arg {len(item.buffers):2d} mem {format_bytes(memory):>9}{timing}")


def run_schedule(items: list[ScheduleItem]) -> None:
    """Run the items in order (as `build_schedule` made them: packing copies included)."""
    precompile(items)
    for item in items:
        run_item(item)


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
                (item.device, item.ast) not in queued:
            waiting.setdefault(item.device, []).append(item)
            queued.add((item.device, item.ast))
    for device, group in waiting.items():
        backend = Device[device]
        if len(group) > 1 and hasattr(backend.compiler, "compile_many"):
            _compile_together(backend, group)


def _compile_together(backend: Backend, group: list[ScheduleItem]) -> None:
    names = _unique_names([item.name for item in group])  # one library: no two alike
    linears = [lower(item.ast, search.options_for(backend, item.name, item.ast)) for item in group]
    sources = [backend.renderer.render(name, linear) for name, linear in zip(names, linears)]
    binaries = backend.compiler.compile_many(sources)  # type: ignore[union-attr]
    for item, name, linear, source, binary in zip(group, names, linears, sources, binaries):
        runner = Runner(name, backend.name, backend.program(name, binary), item.ast, linear,
                        source, estimate_ops(item.ast))
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

def build_schedule(roots: list[UOp], default_device: str) -> Schedule:
    """The schedule that runs: the scheduler's kernels in order (schedule.py), with a packing
    copy before each kernel that profits from one (pack.py). realize() runs exactly these
    items and viz draws exactly these, so a drawing shows every kernel that runs. Nothing is
    computed: the Buffers are allocated when a kernel first uses them."""
    schedule = schedule_graph(roots, default_device)
    return dataclasses.replace(schedule, items=pack_operands(schedule.items))


def realize_uops(roots: list[UOp], default_device: str) -> list[UOp]:
    """Compute `roots`; returns, for each, a BUFFER-backed node holding its value.

    Nothing is remembered between calls: a graph built again is computed again (a cache keyed
    by graph would have to guess when memory that assign() or a JIT replay rewrote is stale,
    and whether a value is still cached would depend on the garbage collector)."""
    schedule = build_schedule(roots, default_device)
    run_schedule(schedule.items)
    for item in schedule.items:
        if item.node is not None and item.node.op is Ops.ASSIGN:
            item.output.overwritten = True  # older graphs must not read it as if unchanged
    return [schedule.becomes.get(node, node) for node in roots]
