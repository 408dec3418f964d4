"""Chapter 10: the JIT — capture a function's kernel launches once, replay them many times.

What this teaches:
- a training step rebuilds the same graph every time: Python builds UOps, the scheduler cuts
  kernels, the engine looks up programs. All of that produces the *same list of launches*. So
  `TinyJit` runs the function normally once (to compile everything), records every launch the
  second time (program, buffers, sizes), and from the third call on replays that list with the
  new input buffers swapped in — without running the Python that built the graph. (The second
  call's graph has the first's structure, so it runs the first call's cached plan: its
  schedule is not made twice; `record_launches(fresh_items=False)`);
- state that changes between calls (weights, optimizer moments) must be written *in place*
  (`Tensor.assign`), so the captured launches keep pointing at the right memory;
- graph execution: on the CPU, a replay is one native call — a small generated C function calls
  every kernel in turn — so a launch costs a few microseconds, not a trip through Python;
- a capture is a plan of the executor (engine/realize.py): the captured buffers by slot and a step
  per launch. A replay puts the new inputs in their slots and runs that plan with
  `realize.run`, the same run as an eager realize: counted the same in GlobalCounters,
  watched the same by DEBUG and `record_launches` (it calls the device's graph when nobody
  records each launch);
- the JIT is honest: DEBUG>=1 says when it captured and how many kernels it replays, and an
  input of another shape, dtype or device than the captured one is an error, never a silent
  wrong result;
- memory planning: a capture holds the buffers of its launches between calls, but most are
  intermediates, each needed only from the launch that writes it to the last that reads it.
  `plan_memory` finds each one's lifetime and lets buffers whose lifetimes do not overlap
  share memory (greedy, largest first, as tinygrad's memory planner does): a 16-layer MLP's
  capture holds two activations' memory for its 15 intermediates, not 15
  (`GlobalCounters.mem_used` shows it; `MEMORY_PLANNER=0` turns it off);
- symbolic sizes: a bound Variable passed as an argument (`step(x, v.bind(n))`), or an input
  whose shape holds one, may take a new value at every call. Its kernels were compiled for
  the variable, not the value, so one capture replays for every value: the new values are
  passed to the launches, and the outputs get the new sizes (a growing sequence, a KV cache).

Builds on: engine/realize.py (record_launches, Plan, run), device.py, tensor/. Used by:
nn training loops.

>>> from tinyteach import Tensor, TinyJit
>>> @TinyJit
... def double_plus_one(x: Tensor) -> Tensor:
...     return (x * 2 + 1).realize()
>>> [double_plus_one(Tensor([float(i)])).item() for i in range(4)]
[1.0, 3.0, 5.0, 7.0]
"""
from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from tinyteach.device import Allocation, Buffer, Device
from tinyteach.dtype import DType
from tinyteach.engine.realize import Launch, Plan, Slots, record_launches, run, step_of
from tinyteach.engine.schedule import ScheduleItem, is_contiguous_buffer
from tinyteach.helpers import format_bytes
from tinyteach.ir.uop import (
    Ops,
    UOp,
    base_buffer,
    binds_of,
    describe_size,
    sint,
    substitute_symbols,
    sym_max,
    sym_prod,
    symbolic_view,
    toposort_of,
    unbind_graph,
)
from tinyteach.settings import DEBUG, MEMORY_PLANNER
from tinyteach.tensor import Tensor
from tinyteach.tensor.multi import shards_of

ReturnType = TypeVar("ReturnType")


class JitError(RuntimeError):
    """A jitted function was called in a way its captured launches cannot replay."""


@dataclass(frozen=True)
class InputSignature:
    """What the captured launches assume about one input tensor."""

    shape: tuple[int, ...]
    dtype: Any
    device: str

    def describe_change(self, other: InputSignature) -> str:
        changes = [f"{field} {getattr(self, field)} -> {getattr(other, field)}"
                   for field in ("shape", "dtype", "device")
                   if getattr(self, field) != getattr(other, field)]
        return ", ".join(changes)


def _buffer_of(tensor: Tensor) -> Buffer:
    """The buffer of a realized, contiguous tensor argument (`_realized_inputs` made it so)."""
    node = base_buffer(tensor.uop)
    assert node is not None, "jitted inputs are realized contiguous buffers"
    buffer: Buffer = node.arg
    return buffer


def _split_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[
        list[tuple[str, Tensor]], list[tuple[str, Any]]]:
    """Tensor arguments (by name) and the other arguments, which must not change (a bound
    Variable is among the others by its variable alone: its value may change)."""
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    tensors = [(name, value) for name, value in named if isinstance(value, Tensor)]
    others = [(name, _unbound(value)) for name, value in named if not isinstance(value, Tensor)]
    return tensors, others


def _is_bound(value: Any) -> bool:
    return isinstance(value, UOp) and value.op is Ops.BIND


def _unbound(value: Any) -> Any:
    return value.unbind()[0] if _is_bound(value) else value


def _unbound_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape with its bound variables unbound: what stays the same from call to call."""
    sizes: list[sint] = [unbind_graph([s])[0][0] if isinstance(s, UOp) else s for s in shape]
    return cast(tuple[int, ...], tuple(sizes))


def call_var_vals(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, int]:
    """The values of the Variables of one call: bound Variables passed as arguments, and
    those in the shapes of its tensor arguments (name -> value)."""
    roots = [a for a in (*args, *kwargs.values()) if _is_bound(a)]
    roots += [s for a in (*args, *kwargs.values()) if isinstance(a, Tensor)
              for s in a.shape if isinstance(s, UOp)]
    return unbind_graph(roots)[1] if roots else {}


def _realized_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[
        tuple[Any, ...], dict[str, Any]]:
    """Every tensor argument as a realized, contiguous buffer (what launches can read)."""
    def prepare(value: Any) -> Any:
        if not isinstance(value, Tensor):
            return value
        value.realize()
        return value if is_contiguous_buffer(value.uop) else value.contiguous().realize()
    return tuple(prepare(a) for a in args), {k: prepare(v) for k, v in kwargs.items()}


def _returned_tensors(result: Any) -> list[Tensor]:
    if isinstance(result, Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [r for r in result if isinstance(r, Tensor)]
    if isinstance(result, dict):
        return [r for r in result.values() if isinstance(r, Tensor)]
    return []


# ---- memory planning: intermediates share memory by lifetime ----

@dataclass(eq=False)  # (one is itself only: compared by identity)
class BufferLifetime:
    """One piece of memory the captured launches use, and when: from launch `first`, the first
    that touches it, to launch `last`, the last. `written_first`: that first launch writes it
    and reads it nowhere, so the capture needs nothing it held before. `memory` is a weak
    reference: the planner must see whether anything but the launches holds it."""

    memory: weakref.ref[Allocation]
    device: str
    nbytes: int
    dtype: DType  # of the first buffer on it
    first: int
    last: int
    written_first: bool

    def overlaps(self, other: BufferLifetime) -> bool:
        return self.first <= other.last and other.first <= self.last


def buffer_lifetimes(launches: list[Launch]) -> list[BufferLifetime]:
    """The lifetime of every piece of memory the launches touch, in order of first use (a
    launch writes its argument 0 and reads the others)."""
    found: dict[int, BufferLifetime] = {}
    for step, launch in enumerate(launches):
        for position, buffer in enumerate(launch.buffers):
            memory = buffer.allocation
            lifetime = found.get(id(memory))
            if lifetime is not None:
                lifetime.last = step
                continue
            only_written = position == 0 and not _reads_its_output(launch) and \
                sum(other.allocation is memory for other in launch.buffers) == 1
            found[id(memory)] = BufferLifetime(weakref.ref(memory), buffer.device,
                                               memory.nbytes, buffer.dtype, step, step,
                                               only_written)
    return list(found.values())


def _reads_its_output(launch: Launch) -> bool:
    """Whether a kernel reads the buffer it writes (an in-place assign, `t.assign(t * 2)`):
    then what that buffer held before matters. A copy writes all of its output."""
    if launch.runner is None:
        return False
    for node in launch.item.ast.toposort:
        sources = node.src[1:] if node.op is Ops.STORE else node.src
        if any(source.op is Ops.DEFINE_GLOBAL and source.arg[0] == 0 for source in sources):
            return True
    return False


@dataclass(eq=False)  # (one is itself only: compared by identity)
class SharedMemory:
    """One piece of memory of a memory plan, and the intermediates that take turns in it.
    `dtype` is None where memory is plain bytes (any dtype may use it), else the one dtype
    its device's typed memory holds (`Allocator.holds_bytes`)."""

    device: str
    nbytes: int
    dtype: DType | None
    tenants: list[BufferLifetime]

    def fits(self, lifetime: BufferLifetime) -> bool:
        """Same device, big enough, a dtype it holds, and free for the whole lifetime."""
        return lifetime.device == self.device and lifetime.nbytes <= self.nbytes and \
            self.dtype in (None, lifetime.dtype) and \
            not any(lifetime.overlaps(tenant) for tenant in self.tenants)


def assign_memory(lifetimes: list[BufferLifetime]) -> list[SharedMemory]:
    """Greedy, largest first (tinygrad's planner does the same): each intermediate goes into
    the first piece of memory that fits it (`SharedMemory.fits`), or into a new piece of its
    own size. Largest first, so every piece is as big as its first, largest, tenant."""
    pieces: list[SharedMemory] = []
    for lifetime in sorted(lifetimes, key=lambda each: (-each.nbytes, each.first)):
        piece = next((p for p in pieces if p.fits(lifetime)), None)
        if piece is None:
            typed = not Device[lifetime.device].allocator.holds_bytes
            piece = SharedMemory(lifetime.device, lifetime.nbytes,
                                 lifetime.dtype if typed else None, [])
            pieces.append(piece)
        piece.tenants.append(lifetime)
    return pieces


@dataclass
class MemoryPlan:
    """What `plan_memory` did to a capture of `steps` launches: the `lifetimes` of every piece
    of memory they use, and the intermediates it `moved`, each into one of the shared
    `pieces`. The rest of `lifetimes` kept its memory: inputs, outputs, and memory that lives
    on after the call (a weight, an optimizer's state, a tensor the function kept)."""

    steps: int
    lifetimes: list[BufferLifetime]
    moved: list[BufferLifetime]
    pieces: list[SharedMemory]

    @property
    def bytes_before(self) -> int:
        """The intermediates' bytes, a buffer each."""
        return sum(lifetime.nbytes for lifetime in self.moved)

    @property
    def bytes_after(self) -> int:
        """Their bytes in the shared pieces."""
        return sum(piece.nbytes for piece in self.pieces)

    def chart(self) -> str:
        """The plan as text, a column per launch. A row per intermediate (numbered in order of
        first use): `#` from the launch that writes it to the last that reads it, and the
        piece it went into. Then a row per piece: which intermediate it holds at each launch
        (`.`: none)."""
        width = len(f"intermediate {max(len(self.moved) - 1, 0)}")
        ruler = "".join(str(step % 10) for step in range(self.steps))
        piece_of = {id(t): j for j, piece in enumerate(self.pieces) for t in piece.tenants}
        lines = [f"{'launch':{width}} {'':9}  {ruler}"]
        for k, lifetime in enumerate(self.moved):
            bar = "".join("#" if lifetime.first <= step <= lifetime.last else "."
                          for step in range(self.steps))
            lines.append(f"{f'intermediate {k}':{width}} {format_bytes(lifetime.nbytes):>9}  "
                         f"{bar}  in {_letter(piece_of[id(lifetime)])}")
        number = {id(lifetime): k for k, lifetime in enumerate(self.moved)}
        for j, piece in enumerate(self.pieces):
            row = ["."] * self.steps
            for tenant in piece.tenants:
                for step in range(tenant.first, tenant.last + 1):
                    row[step] = _symbol(number[id(tenant)])
            lines.append(f"{f'shared {_letter(j)}':{width}} {format_bytes(piece.nbytes):>9}  "
                         f"{''.join(row)}")
        return "\n".join(lines)


def _letter(number: int) -> str:
    """A piece of shared memory's name: A, B, ..., Z, then A26, A27, ..."""
    return chr(ord("A") + number) if number < 26 else f"A{number}"


def _symbol(number: int) -> str:
    """An intermediate in one character: 0-9, a-z, then the same again."""
    return "0123456789abcdefghijklmnopqrstuvwxyz"[number % 36]


def plan_memory(launches: list[Launch], kept: list[Buffer]) -> MemoryPlan:
    """Give the intermediates of captured launches shared memory by lifetime, in place.

    An intermediate is memory that the launches write before they read it and that nothing
    but the launches holds: not `kept` (the inputs, the outputs), and not memory a tensor or
    any other object still refers to (a weight or an optimizer's state that `assign` writes,
    a random state, a tensor the function stored). That last test takes the launches' own
    buffers out and sees which memory stays allocated (a weak reference). Each intermediate's
    lifetime runs from the launch that writes it to the last that touches it
    (`buffer_lifetimes`); intermediates whose lifetimes do not overlap get the same memory
    (`assign_memory`), on the same device only, and by bytes, whatever their dtypes. The
    launches then run on buffers in that memory, and the intermediates' own is freed."""
    lifetimes = buffer_lifetimes(launches)
    kept_memory = {id(buffer.allocation) for buffer in kept}
    candidates = [lifetime for lifetime in lifetimes
                  if lifetime.written_first and id(lifetime.memory()) not in kept_memory]
    holes = _take_out(launches, candidates)
    moved = [lifetime for lifetime in candidates if lifetime.memory() is None]
    pieces = assign_memory(moved)
    memory_of: dict[int, Allocation] = {}  # an intermediate's lifetime -> its piece's
    for piece in pieces:
        allocation = Allocation(piece.device, piece.nbytes)
        memory_of.update((id(tenant), allocation) for tenant in piece.tenants)
    handles: dict[tuple[int, int, DType], Buffer] = {}  # one Buffer per buffer taken out
    for k, position, lifetime in holes:
        placeholder = launches[k].buffers[position]
        key = (id(lifetime), placeholder.size, placeholder.dtype)
        if key not in handles:
            memory = lifetime.memory() or memory_of[id(lifetime)]  # held elsewhere: as it was
            handles[key] = Buffer.in_memory(memory, placeholder.size, placeholder.dtype)
        launches[k].buffers[position] = handles[key]
    for launch in launches:  # (each item shares its launch's list of buffers)
        if launch.item.old_contents_read:
            launch.item.old_contents_read = launch.buffers[:1]
    return MemoryPlan(len(launches), lifetimes, moved, pieces)


def _take_out(launches: list[Launch], candidates: list[BufferLifetime]) -> list[
        tuple[int, int, BufferLifetime]]:
    """Replace each buffer on a candidate's memory, in the launches and in their items, by an
    unallocated buffer of its size and dtype (`_item_on`); (launch, position, lifetime) of
    each hole. Once this returns, a candidate's memory is allocated only if something else
    holds it."""
    by_memory = {id(lifetime.memory()): lifetime for lifetime in candidates}
    holes = []
    for k, launch in enumerate(launches):
        for position, buffer in enumerate(launch.buffers):
            lifetime = by_memory.get(id(buffer.allocation))
            if lifetime is not None:
                holes.append((k, position, lifetime))
                launch.buffers[position] = Buffer(buffer.device, buffer.size, buffer.dtype)
        launch.item = _item_on(launch.item, launch.buffers)
    return holes


def _item_on(item: ScheduleItem, buffers: list[Buffer]) -> ScheduleItem:
    """The item on `buffers` instead of its own, and without what would hold the capture
    call's buffers: the graph it was scheduled from (a replay needs the kernel and its
    buffers only), and of the buffers it reads before an assign, all but its output (viz
    asks whether an assign reads what it overwrites). It takes the launch's list itself, so
    that the inputs a replay swaps into the launch are the item's too."""
    output = item.buffers[0].allocation if item.buffers else None  # (all are allocated)
    reads_own_output = any(b.allocation is output for b in item.old_contents_read)
    return dataclasses.replace(item, buffers=buffers, node=None, input_nodes=[],
                               old_contents_read=buffers[:1] if reads_own_output else [])


def _without_graphs(result: Any) -> Any:
    """A function's result with each tensor replaced by a tensor of the same node that keeps
    no graph for backward (`_lazy`)."""
    def lean(value: Any) -> Any:
        return Tensor._from_uop(value.uop, value.device) if isinstance(value, Tensor) else value
    if isinstance(result, (tuple, list)):
        return type(result)(lean(r) for r in result)
    if isinstance(result, dict):
        return {key: lean(value) for key, value in result.items()}
    return lean(result)


def _buffers_of(outputs: list[Tensor]) -> list[Buffer]:
    """Every buffer the returned tensors read (each shard's, for a sharded one)."""
    graphs = [shard for t in outputs for shard in shards_of(t.uop)]
    nodes = toposort_of(graphs) if graphs else []
    return [node.arg for node in nodes if node.op is Ops.BUFFER]


class CapturedJit:
    """The launches recorded during the capture call, ready to replay with new inputs. With
    MEMORY_PLANNER on, `plan_memory` has given their intermediates shared memory first
    (`memory_plan` says how). The list of launches is rewritten in place, and each launch's
    item keeps no graph (`_item_on`)."""

    def __init__(self, launches: list[Launch], input_buffers: list[Buffer], result: Any,
                 outputs: list[Tensor]):
        self.launches = launches
        self.memory_plan: MemoryPlan | None = None
        if MEMORY_PLANNER:
            self.memory_plan = plan_memory(launches, input_buffers + _buffers_of(outputs))
        else:  # each buffer as it was, and items that hold nothing of the capture call
            for launch in launches:
                launch.item = _item_on(launch.item, launch.buffers)
        self.result = result  # (its structure, and the devices, `outputs()` rebuilds)
        self.output_uops = [t.uop for t in outputs]
        self.input_slots = self._find_input_slots(input_buffers)
        self.symbolic = any(launch.var_vals for launch in launches)
        self.var_vals: dict[str, int] = {}  # the values of the latest replay
        self.plan, self.buffers = self._make_plan()
        # (plan slot, input) of each input: a replay puts the new buffers there
        self.inputs = sorted({(self.plan.steps[k].slots[position], i)
                              for k, position, i in self.input_slots})
        # a device graph replays the values it was built with: symbolic launches go one by one
        if not self.symbolic:
            self.plan = dataclasses.replace(self.plan, graph=self._make_graph())
        self._release_inputs()

    def _release_inputs(self) -> None:
        """Hold none of the capture call's input buffers (they are the caller's): their slots,
        and their places in the launches, get a buffer of their size without memory, until a
        replay puts its inputs there."""
        for slot, _ in self.inputs:
            old = self.buffers[slot]
            self.buffers[slot] = Buffer(old.device, old.size, old.dtype)
        for k, position, _ in self.input_slots:
            self.launches[k].buffers[position] = self.buffers[self.plan.steps[k].slots[position]]

    def _make_plan(self) -> tuple[Plan, list[Buffer]]:
        """The executor's plan of the launches (realize.Plan): each buffer by slot, and each
        launch a step on its slots (the device's graph is added by __init__)."""
        slots = Slots()
        steps = tuple(step_of(launch.item, launch.runner,
                              tuple(slots.slot(b) for b in launch.buffers))
                      for launch in self.launches)
        return Plan((), steps, captured=True), slots.buffers

    def _find_input_slots(self, input_buffers: list[Buffer]) -> list[tuple[int, int, int]]:
        """(launch, position, input) for every place an input buffer is passed."""
        slots = []
        for k, launch in enumerate(self.launches):
            for position, buffer in enumerate(launch.buffers):
                for i, input_buffer in enumerate(input_buffers):
                    if buffer is input_buffer:
                        slots.append((k, position, i))
        return slots

    def _make_graph(self) -> Any:
        """A device's batched executor, when every launch is a kernel on that device: built
        from the launches, the plan's slots of each and the input slots, and called with the
        plan's buffers (realize.run: `plan.graph(buffers)`)."""
        devices = {launch.item.device for launch in self.launches}
        if len(devices) != 1 or any(launch.runner is None for launch in self.launches):
            return None
        graph_class = Device[devices.pop()].graph
        if graph_class is None:
            return None
        return graph_class(self.launches, [step.slots for step in self.plan.steps],
                           {slot for slot, _ in self.inputs})

    @property
    def graph(self) -> Any:
        """The device's graph the plan replays through (None: launch by launch)."""
        return self.plan.graph

    @property
    def counts(self) -> tuple[int, int]:
        """(operations, bytes) of one replay, as the eager run of the same launches counts
        them (a replay's new inputs have the sizes of the captured ones)."""
        return self.plan.ops, self.plan.nbytes

    def replay(self, input_buffers: list[Buffer], var_vals: dict[str, int] | None = None) -> None:
        """Run the captured plan on new input buffers, with new values of the Variables: the
        executor's run (realize.run), as every realize, counted and watched the same way."""
        self.var_vals = {} if var_vals is None else var_vals
        buffers = list(self.buffers)
        for slot, i in self.inputs:
            buffers[slot] = input_buffers[i]
        for captured in self.launches if self.symbolic else ():  # (they show the latest)
            captured.var_vals.update((name, value) for name, value in self.var_vals.items()
                                     if name in captured.var_vals)
        run(self.plan, buffers, self.var_vals)

    def outputs(self) -> Any:
        """The function's result, with tensors pointing at the replayed output buffers (a
        symbolic size bound to this call's value)."""
        if isinstance(self.result, Tensor) and not self.var_vals:  # one tensor, as captured
            return Tensor._from_uop(self.output_uops[0], self.result.device)
        replacements = iter(self._rebound_outputs())

        def rebuild(value: Any) -> Any:
            # (the lean constructor: the node is built and the device canonical)
            return Tensor._from_uop(next(replacements), value.device) \
                if isinstance(value, Tensor) else value
        if isinstance(self.result, (tuple, list)):
            return type(self.result)(rebuild(r) for r in self.result)
        if isinstance(self.result, dict):
            return {key: rebuild(value) for key, value in self.result.items()}
        return rebuild(self.result)


    def _rebound_outputs(self) -> list[UOp]:
        """The output nodes with each bound variable bound to this call's value instead."""
        if not self.var_vals:  # (no Variables: the outputs as captured, without a graph walk)
            return self.output_uops
        binds = [b for b in binds_of(self.output_uops) if b.src[0].arg[0] in self.var_vals]
        if not binds:
            return self.output_uops
        rebind = {b: b.src[0].bind(self.var_vals[b.src[0].arg[0]]) for b in binds}
        return substitute_symbols(self.output_uops, rebind)


class TinyJit(Generic[ReturnType]):
    """Decorator: `@TinyJit def step(x, y): ...`. Call 1 runs, call 2 captures, later calls
    replay. Tensor arguments may change values between calls, not shapes, dtypes or devices;
    other arguments must not change at all. Realize what you return (or it is realized for you).
    """

    def __init__(self, fn: Callable[..., ReturnType]):
        self.fn = fn
        functools.update_wrapper(self, fn)
        self.reset()

    def reset(self) -> None:
        """Forget the capture: the next call runs normally again."""
        self.calls = 0
        self.captured: CapturedJit | None = None
        self.signature: list[tuple[str, InputSignature]] = []
        self.fixed_arguments: list[tuple[str, Any]] = []
        # (shape, dtype, device) of each argument, when all are tensors of plain-int shapes
        # and nothing is symbolic: what the lean replay compares (`_replay_plain`)
        self.plain_signature: list[tuple[tuple[int, ...], Any, str]] | None = None

    def __get__(self, obj: Any, objtype: Any = None) -> Callable[..., ReturnType]:
        return functools.partial(self.__call__, obj)  # a jitted method

    def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
        if self.plain_signature is not None and not kwargs:
            buffers = self._plain_buffers(args)
            if buffers is not None:  # the lean replay
                return self._replay(buffers, {})
        args, kwargs = _realized_inputs(args, kwargs)
        tensors, others = _split_arguments(args, kwargs)
        signature = [(name, InputSignature(_unbound_shape(t.shape), t.dtype, t.device))
                     for name, t in tensors]
        if self.calls == 0:
            self.calls = 1
            result = self.fn(*args, **kwargs)
            outputs = _returned_tensors(result)
            if outputs:
                Tensor.realize(*outputs)
            return result
        if self.calls == 1:
            return self._capture(args, kwargs, signature, others, tensors)
        self._check(signature, others)
        return self._replay([_buffer_of(t) for _, t in tensors], call_var_vals(args, kwargs))

    def _replay(self, buffers: list[Buffer], var_vals: dict[str, int]) -> ReturnType:
        assert self.captured is not None
        self.captured.replay(buffers, var_vals)
        self.calls += 1
        replayed: ReturnType = self.captured.outputs()
        return replayed

    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 signature: list[tuple[str, InputSignature]], others: list[tuple[str, Any]],
                 tensors: list[tuple[str, Tensor]]) -> ReturnType:
        with record_launches(fresh_items=False) as launches:
            result = self.fn(*args, **kwargs)
            outputs = _returned_tensors(result)
            if outputs:
                Tensor.realize(*outputs)
        # (random numbers need nothing here: each draw is kernels that copy and advance the
        # device's RNG state buffer, recorded with the rest, so a replay draws new numbers)
        # the result as a replay returns it, without the graphs its tensors were computed
        # from: those hold buffers the launches write, which could then not be planned
        result = _without_graphs(result)
        outputs = _returned_tensors(result)
        input_buffers = [_buffer_of(t) for _, t in tensors]
        # (the recorded list itself: the memory planner rewrites it, so that the capture's
        # intermediates are held by nothing once it has moved them)
        self.captured = CapturedJit(launches, input_buffers, result, outputs)
        self.signature, self.fixed_arguments, self.calls = signature, others, 2
        plain = [(t.uop.shape, t.dtype, t.device) for _, t in tensors]
        if not others and not kwargs and not self.captured.symbolic and \
                not any(isinstance(size, UOp) for shape, _, _ in plain for size in shape):
            self.plain_signature = plain
        if DEBUG >= 1:
            symbolic = " (over symbolic sizes: one capture for every value)" \
                if self.captured.symbolic else ""
            print(f"TinyJit: captured {len(launches)} kernels of {self.fn.__name__}{symbolic}")
            plan = self.captured.memory_plan
            if plan is not None and plan.bytes_after < plan.bytes_before:
                print(f"TinyJit: memory plan: {len(plan.moved)} intermediates in "
                      f"{len(plan.pieces)} shared buffers, {format_bytes(plan.bytes_before)} "
                      f"-> {format_bytes(plan.bytes_after)}")
        return result

    def _plain_buffers(self, args: tuple[Any, ...]) -> list[Buffer] | None:
        """The lean replay's check, for a capture whose arguments are all tensors with plain
        shapes: when each argument is already a buffer of the captured shape, dtype and
        device, the launches replay on those buffers (nothing else can differ), so here are
        the buffers. None when that is not so: the whole path then realizes, checks and
        explains."""
        expected = self.plain_signature
        if expected is None or len(args) != len(expected) or self.captured is None:
            return None
        buffers = []
        for value, (shape, dtype, device) in zip(args, expected):
            if not isinstance(value, Tensor):
                return None
            node = value.uop
            base = node if node.op is Ops.BUFFER else base_buffer(node)
            if base is None or node.shape != shape or node.dtype is not dtype or \
                    value.device != device or not base.arg.is_allocated:
                return None
            buffers.append(base.arg)
        return buffers

    def _check(self, signature: list[tuple[str, InputSignature]],
               others: list[tuple[str, Any]]) -> None:
        if [name for name, _ in signature] != [name for name, _ in self.signature]:
            raise JitError(f"{self.fn.__name__}: the tensor arguments changed: captured "
                           f"{[n for n, _ in self.signature]}, got {[n for n, _ in signature]}")
        for (name, captured), (_, now) in zip(self.signature, signature):
            if captured != now:
                raise JitError(f"{self.fn.__name__}: {name} changed since the capture "
                               f"({captured.describe_change(now)}); call .reset() to capture "
                               "again")
        for (name, captured_value), (_, value) in zip(self.fixed_arguments, others):
            if not _same_value(captured_value, value):
                raise JitError(f"{self.fn.__name__}: non-tensor {name} changed since the capture "
                               f"({_describe(captured_value)} -> {_describe(value)}); it is "
                               "baked into the kernels")


def _describe(value: Any) -> str:
    """An argument as an error message shows it: a Variable with its range (two Variables of
    one name may differ in range), anything else as repr."""
    if isinstance(value, UOp) and value.op is Ops.DEFINE_VAR:
        return describe_size(value)
    return repr(value)


def _same_value(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b



# ---- function: capture a function's graph once, reuse it lazily ----

@dataclass
class _Trace:
    """A function's graph, built once on placeholder inputs: the output nodes, the placeholder
    node of each tensor argument, and the bound variables it was built with."""

    result: Any
    outputs: list[UOp]
    placeholders: list[UOp]
    binds: list[UOp]
    # (index among the reachable tensors, its node after the body assigned to it): a
    # BatchNorm's running statistics, which each call assigns again
    assigned: list[tuple[int, UOp]] = dataclasses.field(default_factory=list)


class GraphFunction:
    """What `function` makes of a Python function: call it as the function. The first call
    with a given signature (each tensor argument's shape, dtype and device, the variable of
    each bound Variable, the value of every other argument) runs the Python once, on
    placeholder tensors, and keeps the lazy graph it builds. Every call then builds its
    result by putting its own arguments into that graph (`UOp.substitute`), without running
    the Python again. The result is lazy, as the function's own would be: it fuses with what
    comes after it, and backward() goes through it (it is made of the same primitive ops).

    tinygrad's `function` keeps the body as a CALL node of its IR (and can precompile it);
    tinyteach has no such node, so the body is substituted in, which gives the same values
    and the same kernels as calling the function. The function must only build a graph:
    computing a value while it is traced (realize, numpy, item) is an error, as is reading a
    tensor that is not an argument, unless `allow_implicit=True` (then that tensor's graph at
    the time of the first call is part of the body).

    A tensor reachable from an argument counts as an argument, as in tinygrad: the weights of
    a model passed in (or of `self`, for a method: `@function def __call__(self, x)`) are
    found through attributes, lists and dicts (nn.state.get_state_dict's walk), traced as
    placeholders, and each call reads their contents of that moment, so an optimizer step
    between two calls is seen. What the body assigns to them (a BatchNorm's running
    statistics in training) each call assigns again, to that call's tensors."""

    def __init__(self, fn: Callable[..., Any], allow_implicit: bool = False):
        self.fn, self.allow_implicit = fn, allow_implicit
        self.traces: dict[Any, _Trace] = {}
        functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, objtype: Any = None) -> Callable[..., Any]:
        return functools.partial(self.__call__, obj)  # a method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        named = [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
        key = tuple(_signature_part(name, value) for name, value in named)
        reachable = _reachable_tensors(named)
        key += tuple(_signature_part("reachable", t) for t in reachable)
        trace = self.traces.get(key)
        if trace is None:
            trace = self.traces[key] = self._trace(args, kwargs, reachable)
        tensors = [value for _, value in named if isinstance(value, Tensor)] + reachable
        replace = {p: t.uop for p, t in zip(trace.placeholders, tensors)}
        now = unbind_graph([v for _, v in named if _is_bound(v)] +
                           [s for t in tensors for s in t.shape if isinstance(s, UOp)])[1]
        for bind in trace.binds:  # the same variable, bound to this call's value
            var = bind.src[0]
            replace[bind] = var.bind(now[var.arg[0]]) if var.arg[0] in now else bind
        nodes = trace.outputs + [node for _, node in trace.assigned]
        substituted = substitute_symbols(nodes, replace) if nodes else []
        for (index, _), node in zip(trace.assigned, substituted[len(trace.outputs):]):
            _assign_as_traced(reachable[index], node)
        outputs = iter(substituted[:len(trace.outputs)])

        def rebuild(value: Any) -> Any:
            if not isinstance(value, Tensor):
                return value
            result = Tensor(next(outputs), value.device)
            result._inherit_grad(*tensors)
            return result
        if isinstance(trace.result, (tuple, list)):
            return type(trace.result)(rebuild(r) for r in trace.result)
        return rebuild(trace.result)

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any],
               reachable: list[Tensor]) -> _Trace:
        placeholders: list[UOp] = []

        def placeholder_node(value: Tensor) -> UOp:
            count = sym_prod(value.shape)
            stand_in = Buffer(value.device, sym_max(count), value.dtype)
            node = symbolic_view(UOp(Ops.BUFFER, value.dtype, (), stand_in), value.shape)
            placeholders.append(node)
            return node

        def placeholder(value: Any) -> Any:
            if not isinstance(value, Tensor):
                return value
            return Tensor(placeholder_node(value), value.device,
                          requires_grad=value.requires_grad)
        traced_args = tuple(placeholder(a) for a in args)
        traced_kwargs = {k: placeholder(v) for k, v in kwargs.items()}
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        # the reachable tensors themselves point at placeholders while the body runs
        originals = [t.uop for t in reachable]
        stand_in_nodes = [placeholder_node(t) for t in reachable]
        for tensor, node in zip(reachable, stand_in_nodes):
            tensor.uop = node
        try:
            result = self.fn(*traced_args, **traced_kwargs)
        finally:
            assigned = [(k, t.uop) for k, (t, node) in enumerate(zip(reachable, stand_in_nodes))
                        if t.uop is not node]
            for tensor, original in zip(reachable, originals):
                tensor.uop = original
        outputs = [t.uop for t in _returned_tensors(result)]
        stand_ins = {base_buffer(p).arg for p in placeholders}  # type: ignore[union-attr]
        if any(b.is_allocated for b in stand_ins):
            raise RuntimeError(f"function {name}: it computed a value while it was traced "
                               "(realize, numpy, item): a function must only build a graph")
        implicit = [n for n in toposort_of(outputs + [node for _, node in assigned])
                    if n.op is Ops.BUFFER and n.arg not in stand_ins]
        if implicit and not self.allow_implicit:
            shapes = ", ".join(str(n.arg.size) for n in implicit[:4])
            raise ValueError(f"function {name} reads {len(implicit)} tensor(s) that are not "
                             f"its arguments (buffers of {shapes} elements): pass them as "
                             "arguments, or use function(allow_implicit=True)")
        every = outputs + [node for _, node in assigned]
        return _Trace(result, outputs, placeholders, binds_of(every) if every else [], assigned)


def _assign_as_traced(tensor: Tensor, node: UOp) -> None:
    """Do to this call's `tensor` what the traced body's assign did to its placeholder, as
    Tensor.assign would: write into the tensor's buffer (after an assign still pending on it),
    or, for a tensor not in memory yet (a lazy zeros), take the value's graph."""
    if node.op is Ops.ASSIGN:
        target, value = node.src
        if target.op is Ops.ASSIGN:
            target = target.src[0]
        node = UOp(Ops.ASSIGN, node.dtype, (target, value)) if is_contiguous_buffer(target) \
            else value
    tensor.uop, tensor._lazy = node, None


def _reachable_tensors(named: list[tuple[str, Any]]) -> list[Tensor]:
    """The tensors found inside the arguments that are not tensors themselves (a model, a
    method's `self`, a list or dict of weights), each once, in the order of the walk: the walk
    nn.state.get_state_dict makes (attributes, lists, tuples, dicts), written here because the
    engine stands below nn."""
    found: dict[int, Tensor] = {}
    seen: set[int] = set()
    stack = [value for _, value in reversed(named) if not isinstance(value, Tensor)]
    while stack:
        value = stack.pop()
        if isinstance(value, Tensor):
            found.setdefault(id(value), value)
            continue
        if isinstance(value, (str, bytes, int, float, bool, type(None))) or id(value) in seen:
            continue
        seen.add(id(value))  # (a cycle, or a shared sub-object: visited once)
        if hasattr(value, "_asdict"):  # a namedtuple
            value = value._asdict()
        elif not isinstance(value, (list, tuple, dict)) and hasattr(value, "__dict__"):
            value = vars(value)
        if isinstance(value, (list, tuple)):
            stack.extend(reversed(value))
        elif isinstance(value, dict):
            stack.extend(reversed(list(value.values())))
    return list(found.values())


def _signature_part(name: str, value: Any) -> Any:
    """What a call must share with an earlier one to reuse its graph."""
    if isinstance(value, Tensor):
        return ("tensor", name, _unbound_shape(value.shape), value.dtype, value.device)
    if _is_bound(value):
        return ("variable", name, value.src[0])
    try:
        hash(value)
    except TypeError:
        return ("object", name, id(value))
    return ("value", name, value)


def function(fn: Callable[..., Any] | None = None, *, allow_implicit: bool = False) -> Any:
    """tinygrad's `function` decorator: `@function def f(a, b): return a + b`, or
    `@function(allow_implicit=True)`. The function's graph is captured once per signature and
    reused, lazily, at every call (see GraphFunction)."""
    if fn is None:
        return lambda inner: GraphFunction(inner, allow_implicit)
    return GraphFunction(fn, allow_implicit)
