"""Chapter 8c: GPU puzzles — write a kernel for every thread; the emulator runs and grades it.

What this teaches:
- a GPU kernel is one program that every thread runs with its own ids: `k.thread_id(0)` is the
  thread's index in its work-group, `k.group_id(0)` the group's (CUDA's threadIdx.x and
  blockIdx.x). A student writes the kernel as a Python function; each line builds UOps
  (chapter 3) and `build_kernel` collects them, in order, into the linear program that the
  PYTHON device's emulator (runtime/python.py, chapter 8b) runs, one numpy lane per thread;
- the function runs once, for all threads together, so a thread's value cannot steer Python:
  `with k.when(i < n):` guards the loads and stores inside it (a guarded load gives 0), and
  `for t in k.loop(n):` is a loop that every thread runs n times. `k.shared(n)` is the group's
  shared memory, `k.barrier()` its barrier, `k.register(0.0)` an accumulator (`acc += x`);
  memory is flat: element (row, column) of a matrix `width` wide is `row * width + column`;
- a puzzle (PUZZLES) is a task with its numpy spec, its launch and a read budget. `grade_puzzles`
  runs a student's kernel on the emulator and checks what GPU-Puzzles and Triton-Puzzles check:
  the values, no race (the emulator's shared-memory check, plus two threads writing one element
  of global memory), no access out of bounds, and at most so many global and shared reads per
  thread (Trace.reads_per_thread). Every failure names a thread.

Builds on: ir/uop.py, codegen/lower.py (LinearProgram), runtime/python.py (emulate),
exercises/report.py.
Used by: chapters/08c_gpu_puzzles.ipynb and `python -m tinyteach.exercises` (autograder.py).

>>> @solves("map")
... def add_ten(k, out, a):
...     i = k.thread_id(0)
...     out[i] = a[i] + 10
>>> grade_puzzles([add_ten]).summary()
'GPU puzzles: 1 of 1 pass, 0 fail, 0 not implemented'
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyteach.codegen.lower import LinearProgram
from tinyteach.dtype import DType, dtypes
from tinyteach.exercises.report import FAIL, NOT_IMPLEMENTED, PASS, Failure, GradeReport, Row, show
from tinyteach.ir.uop import Ops, UOp, toposort_of
from tinyteach.runtime.python import BarrierDivergenceError, EmulatorError, Trace, emulate

FLOAT, INDEX, BOOL = dtypes.float32, dtypes.int32, dtypes.bool


class PuzzleError(ValueError):
    """A kernel that cannot be built as written; the message says what to write instead."""


class BarrierInWhen(PuzzleError):
    """`k.barrier()` inside `with k.when(...)`; it keeps the builder and the condition, so that
    run_puzzle can find the threads that would wait and those that would never arrive."""

    def __init__(self, builder: KernelBuilder, condition: UOp):
        super().__init__("k.barrier() inside `with k.when(...)`: the threads whose condition is "
                         "false never reach it. Put the barrier outside the block")
        self.builder, self.condition = builder, condition


NO_TRUTH = ("a thread's value has no True or False while the kernel is built: the function runs "
            "once for every thread at the same time. Guard with `with k.when(condition):`, and "
            "loop with `for t in k.loop(n):`")


# ---- a value of every thread ----

class Value:
    """One value per thread (a UOp), with Python's operators: `i + 1`, `a[i] * 2`, `i < n`.
    An int32 meeting a float32 becomes a float32, as in C."""

    def __init__(self, uop: UOp):
        self.uop = uop

    def __repr__(self) -> str:
        return f"Value({self.uop.op.name}, {self.uop.dtype.name})"

    def _pair(self, other: Value | int | float) -> tuple[UOp, UOp]:
        return promoted(self.uop, operand_of(other, self.uop.dtype))

    def _arithmetic(self, op: Ops, other: Value | int | float, reverse: bool = False) -> Value:
        left, right = self._pair(other)
        if BOOL in (left.dtype, right.dtype):
            raise PuzzleError("a comparison is a condition for k.when, not a number")
        return Value(right.alu(op, left) if reverse else left.alu(op, right))

    def __add__(self, other: Value | int | float) -> Value:
        return self._arithmetic(Ops.ADD, other)

    def __radd__(self, other: int | float) -> Value:
        return self._arithmetic(Ops.ADD, other, reverse=True)

    def __mul__(self, other: Value | int | float) -> Value:
        return self._arithmetic(Ops.MUL, other)

    def __rmul__(self, other: int | float) -> Value:
        return self._arithmetic(Ops.MUL, other, reverse=True)

    def __neg__(self) -> Value:
        return Value(-self.uop)

    def __sub__(self, other: Value | int | float) -> Value:
        return self + (-Value(operand_of(other, self.uop.dtype)))

    def __rsub__(self, other: int | float) -> Value:
        return Value(operand_of(other, self.uop.dtype)) + (-self)

    def __floordiv__(self, other: Value | int) -> Value:
        return self._integer(Ops.IDIV, other)

    def __mod__(self, other: Value | int) -> Value:
        return self._integer(Ops.MOD, other)

    def _integer(self, op: Ops, other: Value | int) -> Value:
        result = self._arithmetic(op, other)
        if result.uop.dtype != INDEX:
            raise PuzzleError(f"{op.name} (// or %) is for int32 values, not "
                              f"{result.uop.dtype.name}")
        return result

    def __truediv__(self, other: Value | int | float) -> Value:
        left, right = promoted(self.uop.cast(FLOAT), operand_of(other, FLOAT))
        return Value(left.alu(Ops.FDIV, right))

    def __lt__(self, other: Value | int | float) -> Value:
        left, right = self._pair(other)
        return Value(left.lt(right))

    def __gt__(self, other: Value | int | float) -> Value:
        left, right = self._pair(other)
        return Value(right.lt(left))

    def __le__(self, other: Value | int | float) -> Value:
        return ~(self > other)

    def __ge__(self, other: Value | int | float) -> Value:
        return ~(self < other)

    def __eq__(self, other: object) -> Value:  # type: ignore[override]
        return ~self._not_equal(other)

    def __ne__(self, other: object) -> Value:  # type: ignore[override]
        return self._not_equal(other)

    __hash__ = None  # type: ignore[assignment]  # == builds a condition, so no hashing

    def _not_equal(self, other: object) -> Value:
        if not isinstance(other, (Value, int, float)):
            raise PuzzleError(f"cannot compare a thread's value with {type(other).__name__}")
        left, right = self._pair(other)
        return Value(left.ne(right))

    def __invert__(self) -> Value:
        return Value(self._condition() ^ True)

    def __and__(self, other: Value) -> Value:
        return Value(self._condition() & condition_of(other))

    def __or__(self, other: Value) -> Value:
        return Value(self._condition() | condition_of(other))

    def _condition(self) -> UOp:
        return condition_of(self)

    def float(self) -> Value:
        return Value(self.uop.cast(FLOAT))

    def __bool__(self) -> bool:
        raise PuzzleError(NO_TRUTH)

    def __index__(self) -> int:
        raise PuzzleError(NO_TRUTH)


def operand_of(value: Value | int | float | object, like: DType) -> UOp:
    """A Value's UOp, or a Python number as a constant (an int beside a float32 is a float32)."""
    if isinstance(value, Value):
        return value.uop
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PuzzleError(f"a kernel computes with thread values and numbers, not "
                          f"{type(value).__name__}")
    dtype = FLOAT if isinstance(value, float) or like == FLOAT else INDEX
    return UOp.const(dtype, value)


def promoted(left: UOp, right: UOp) -> tuple[UOp, UOp]:
    if left.dtype == right.dtype:
        return left, right
    if {left.dtype, right.dtype} == {INDEX, FLOAT}:
        return left.cast(FLOAT), right.cast(FLOAT)
    raise PuzzleError(f"cannot combine a {left.dtype.name} and a {right.dtype.name} value")


def condition_of(value: object) -> UOp:
    if not isinstance(value, Value) or value.uop.dtype != BOOL:
        raise PuzzleError("a condition is a comparison of thread values, such as `i < n`")
    return value.uop


# ---- memory: global arrays (the kernel's parameters) and shared arrays ----

class Array:
    """A flat array in global or shared memory: `array[index]` loads, `array[index] = value`
    stores, for every thread at once, each at its own index."""

    def __init__(self, builder: KernelBuilder, define: UOp, name: str,
                 shape: tuple[int, ...]):
        self.builder, self.define, self.name, self.shape = builder, define, name, shape

    @property
    def size(self) -> int:
        return int(self.define.arg[1])

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Array({self.name}, shape {self.shape})"

    def __getitem__(self, index: Value | int) -> Value:
        return self.builder.load(self.define, flat_index(index, self.name))

    def __setitem__(self, index: Value | int, value: Value | int | float) -> None:
        self.builder.store(self.define, flat_index(index, self.name), value)


def flat_index(index: object, name: str) -> UOp:
    if isinstance(index, tuple):
        raise PuzzleError(f"memory is flat: write {name}[row * width + column], not "
                          f"{name}[row, column]")
    uop = operand_of(index, INDEX)
    if uop.dtype != INDEX:
        raise PuzzleError(f"the index of {name} is a {uop.dtype.name}; an index is an int32")
    return uop


class Register(Value):
    """A thread's accumulator (DEFINE_ACC): `acc += x` adds x every time it runs, in every
    iteration of the loops around it. Reading it (`out[i] = acc`, `acc * 2`) takes its value
    at that point of the program: a copy, so that a later `+=` does not change what was read."""

    def __init__(self, builder: KernelBuilder, define: UOp):  # (no Value.__init__: uop is read)
        self.builder, self.define = builder, define

    @property
    def uop(self) -> UOp:  # type: ignore[override]  # Value's is a plain attribute
        return self.builder.copy_of(self.define)

    def __iadd__(self, value: Value | int | float) -> Register:
        self.builder.accumulate(self.define, value)
        return self


# ---- the builder: the student's function fills it, in program order ----

class KernelBuilder:
    """What a kernel function gets as `k`: the thread's ids and the GPU's tools. Every load,
    store, barrier, loop and register read is appended to the program where the function
    reaches it; the arithmetic in between goes in just before the first step that needs it.
    That is safe because arithmetic only computes, and each load and register read is a node
    of its own, whose value is the one at the point where the function made it."""

    def __init__(self, threads: tuple[int, ...], groups: tuple[int, ...]):
        self.threads, self.groups = threads, groups
        self.uops: list[UOp] = []
        self.emitted: set[UOp] = set()
        self.conditions: list[UOp] = []
        self.last_barrier: UOp | None = None
        self.since_barrier: list[UOp] = []  # shared-memory accesses since the last barrier
        self.numbers = itertools.count()  # a unique arg for each load, barrier, loop, register
        self.open_loops: list[UOp] = []  # the counters of the k.loops around this point
        self.shared_count = 0
        self.thread_ids = [UOp(Ops.SPECIAL, INDEX, (), ("l", dim, size))
                           for dim, size in enumerate(threads)]
        # the emulator gives dimension 0 to the innermost 'w' loop: number them outermost first
        count = len(groups)
        self.group_ids = [UOp(Ops.RANGE, INDEX, (), ("w", count - 1 - dim, size))
                          for dim, size in enumerate(groups)]
        for uop in [*self.thread_ids, *reversed(self.group_ids)]:
            self._effect(uop)

    # ---- ids and sizes ----

    def thread_id(self, dim: int = 0) -> Value:
        """This thread's index in its work-group along `dim` (0 is x): threadIdx.x."""
        return Value(self.thread_ids[self._dimension(dim, self.threads)])

    def group_id(self, dim: int = 0) -> Value:
        """This work-group's index along `dim`: blockIdx.x."""
        return Value(self.group_ids[self._dimension(dim, self.groups)])

    def group_size(self, dim: int = 0) -> int:
        """Threads per work-group along `dim` (a number, the same for every thread)."""
        return self.threads[self._dimension(dim, self.threads)]

    @staticmethod
    def _dimension(dim: int, shape: tuple[int, ...]) -> int:
        if not 0 <= dim < len(shape):
            raise PuzzleError(f"this launch has {len(shape)} dimension(s), 0 to "
                              f"{len(shape) - 1}; there is no dimension {dim}")
        return dim

    # ---- memory ----

    def global_array(self, number: int, name: str, shape: tuple[int, ...]) -> Array:
        define = UOp(Ops.DEFINE_GLOBAL, FLOAT, (), (number, int(np.prod(shape))))
        self._effect(define)
        return Array(self, define, name, shape)

    def shared(self, size: int) -> Array:
        """`size` float32s of shared memory, one array per work-group (garbage until written)."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise PuzzleError("k.shared(size) takes a number of elements (the same for every "
                              "thread), not a thread's value")
        define = UOp(Ops.DEFINE_LOCAL, FLOAT, (), (self.shared_count, size))
        self.shared_count += 1
        self._effect(define)
        return Array(self, define, f"local{define.arg[0]}", (size,))

    def load(self, buffer: UOp, index: UOp) -> Value:
        sources = [buffer, index, *self._guard()]
        if buffer.op is Ops.DEFINE_LOCAL and self.last_barrier is not None:
            sources.append(self.last_barrier)
        # each load is its own node (a unique arg): the same element read again later is a
        # new read, not the old value
        load = UOp(Ops.LOAD, buffer.dtype, tuple(sources), next(self.numbers))
        self._shared_access(buffer, load)
        return Value(self._effect(load))

    def store(self, buffer: UOp, index: UOp, value: Value | int | float) -> None:
        stored = operand_of(value, buffer.dtype)
        if stored.dtype != buffer.dtype:
            stored = promoted(stored, UOp.const(buffer.dtype, 0))[0]
        sources = [buffer, index, stored, *self._guard()]
        if buffer.op is Ops.DEFINE_LOCAL and self.last_barrier is not None:
            sources.append(self.last_barrier)
        store = UOp(Ops.STORE, buffer.dtype, tuple(sources))
        self._shared_access(buffer, store)
        self._effect(store)

    def _shared_access(self, buffer: UOp, access: UOp) -> None:
        if buffer.op is Ops.DEFINE_LOCAL:
            self.since_barrier.append(access)

    def _guard(self) -> list[UOp]:
        """The conditions of the `when` blocks around this point, as one (or none)."""
        if not self.conditions:
            return []
        return [functools.reduce(lambda a, b: a & b, self.conditions)]

    # ---- control: guards, loops, barriers ----

    def when(self, condition: Value) -> contextlib.AbstractContextManager[None]:
        """Loads and stores inside happen only in the threads where `condition` holds."""
        return self._guarded(condition_of(condition))

    @contextlib.contextmanager
    def _guarded(self, condition: UOp) -> Iterator[None]:
        self.conditions.append(condition)
        try:
            yield
        finally:
            self.conditions.pop()

    def loop(self, steps: int) -> Iterator[Value]:
        """`for t in k.loop(steps):` a loop that every thread runs `steps` times, t = 0, 1, ..."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise PuzzleError("k.loop(steps) takes a number of steps >= 1, the same for every "
                              "thread, not a thread's value")
        return self._loop_body(steps)

    def _loop_body(self, steps: int) -> Iterator[Value]:
        """The RANGE, the body (the `for` block, run once to build it), the END_RANGE."""
        counter = UOp(Ops.RANGE, INDEX, (), ("r", next(self.numbers), steps))
        self._effect(counter)
        self.open_loops.append(counter)
        yield Value(counter)
        self.open_loops.pop()
        self._effect(UOp(Ops.END_RANGE, BOOL, (counter,)))

    def barrier(self) -> None:
        """Every thread of the work-group waits here until all of them have arrived."""
        guard = self._guard()
        if guard:
            raise BarrierInWhen(self, guard[0])
        previous = () if self.last_barrier is None else (self.last_barrier,)
        barrier = UOp(Ops.BARRIER, BOOL, (*previous, *self.since_barrier), next(self.numbers))
        self._effect(barrier)
        self.last_barrier, self.since_barrier = barrier, []

    def register(self, initial: float = 0.0) -> Register:
        """A float32 accumulator of this thread, starting at `initial` where it is made."""
        acc = UOp(Ops.DEFINE_ACC, FLOAT, (UOp.const(FLOAT, float(initial)),),
                  next(self.numbers))
        return Register(self, self._effect(acc))

    def copy_of(self, acc: UOp) -> UOp:
        """An accumulator's value here. A UOp is one value slot wherever it is used (UOps are
        hash-consed), and an accumulator's slot changes with every `+=`: the copy is a fresh
        accumulator, -0.0 + acc (exact for every value, -0.0 included)."""
        copy = UOp(Ops.DEFINE_ACC, FLOAT, (UOp.const(FLOAT, -0.0),), next(self.numbers))
        self._effect(copy)
        self._effect(UOp(Ops.ACCUMULATE, FLOAT, (copy, acc), Ops.ADD))
        return copy

    def accumulate(self, acc: UOp, value: Value | int | float) -> None:
        added = promoted(operand_of(value, FLOAT), UOp.const(FLOAT, 0.0))[0]
        guard = self._guard()
        if guard:  # a thread outside the `when` adds nothing
            added = guard[0].where(added, 0.0)
        self._effect(UOp(Ops.ACCUMULATE, FLOAT, (acc, added), Ops.ADD))

    # ---- the program ----

    def _effect(self, uop: UOp) -> UOp:
        """Append `uop` here, after whichever of its sources are not in the program yet."""
        for source in toposort_of([uop])[:-1]:
            if source not in self.emitted:
                self.uops.append(source)
                self.emitted.add(source)
        self.uops.append(uop)
        self.emitted.add(uop)
        return uop

    def finish(self) -> LinearProgram:
        if self.open_loops:
            raise PuzzleError("a `for ... in k.loop(n)` was left early (break or return): "
                              "every thread runs all its steps")
        return self.closed(self.uops)

    def closed(self, uops: list[UOp]) -> LinearProgram:
        """`uops` with the loops that are open here closed: the k.loops, then the groups'."""
        loops = [*self.group_ids[::-1], *self.open_loops]  # outermost first
        ends = [UOp(Ops.END_RANGE, BOOL, (loop,)) for loop in reversed(loops)]
        return LinearProgram(uops + ends, (self.thread_count,))

    @property
    def thread_count(self) -> int:
        return int(np.prod(self.threads)) * int(np.prod(self.groups))

    def linear_thread(self) -> UOp:
        """Every thread's number in the launch: thread ids, then group ids, dimension 0
        fastest (as the emulator numbers its lanes)."""
        number, stride = UOp.const(INDEX, 0), 1
        for ids, sizes in ((self.thread_ids, self.threads), (self.group_ids, self.groups)):
            for uop, size in zip(ids, sizes):
                number, stride = number + uop * stride, stride * size
        return number


# ---- the puzzles ----

@dataclass(frozen=True)
class Puzzle:
    """A task: the numpy `spec` of the output from the `inputs`, the launch (`threads` per
    work-group, `groups` of them) and the most elements one thread may read."""

    name: str
    task: str
    spec: Callable[..., np.ndarray]
    inputs: dict[str, np.ndarray]
    output_shape: tuple[int, ...]
    threads: tuple[int, ...]
    groups: tuple[int, ...]
    global_reads: int   # per thread, at most
    shared_reads: int   # per thread, at most
    hint: str

    def describe(self) -> str:
        inputs = ", ".join(f"{name} {shape_text(array.shape)}"
                           for name, array in self.inputs.items())
        return (f"{self.name}: {self.task}\n"
                f"  inputs: {inputs}; output: out {shape_text(self.output_shape)}\n"
                f"  launch: {shape_text(self.groups)} work-group(s) of "
                f"{shape_text(self.threads)} threads\n"
                f"  budget per thread: {self.global_reads} global read(s), "
                f"{self.shared_reads} shared read(s)")


def shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(size) for size in shape)


def _floats(values: Any) -> np.ndarray:
    """A puzzle's input: float32, read-only (every run gets its own copy)."""
    array = np.array(values, dtype=np.float32)
    array.flags.writeable = False
    return array


def map_spec(a: np.ndarray) -> np.ndarray:
    return a + 10


def broadcast_spec(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a[:, None] + b[None, :]


def block_sum_spec(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, 8).sum(axis=1)


def prefix_sum_spec(a: np.ndarray) -> np.ndarray:
    return np.cumsum(a)


def matmul_spec(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ b


_rng = np.random.default_rng(8)
PUZZLES: dict[str, Puzzle] = {puzzle.name: puzzle for puzzle in (
    Puzzle("map", "out[i] = a[i] + 10, one thread per element", map_spec,
           {"a": _floats(np.arange(4))}, (4,), threads=(4,), groups=(1,),
           global_reads=1, shared_reads=0, hint="thread i reads a[i] and writes out[i]"),
    Puzzle("guard", "out[i] = a[i] + 10, with more threads than elements", map_spec,
           {"a": _floats(np.arange(4))}, (4,), threads=(8,), groups=(1,),
           global_reads=1, shared_reads=0,
           hint="threads 4 to 7 have no element: keep them out with `with k.when(i < 4):`"),
    Puzzle("broadcast", "out[i, j] = a[i] + b[j] (out is 3x3, row i after row i - 1)",
           broadcast_spec, {"a": _floats([0, 1, 2]), "b": _floats([0, 10, 20])}, (3, 3),
           threads=(4, 4), groups=(1,), global_reads=2, shared_reads=0,
           hint="thread (j, i) computes row i, column j, flat index i * 3 + j; guard both"),
    Puzzle("blocks", "out[i] = a[i] + 10, with 3 work-groups of 4 threads for 9 elements",
           map_spec, {"a": _floats(np.arange(9))}, (9,), threads=(4,), groups=(3,),
           global_reads=1, shared_reads=0,
           hint="element i = group id * threads per group + thread id, and guard it"),
    Puzzle("block sum", "out[g] = a[8g] + ... + a[8g + 7]: work-group g sums its block of 8 "
           "in shared memory", block_sum_spec, {"a": _floats(_rng.integers(0, 10, 16))}, (2,),
           threads=(8,), groups=(2,), global_reads=1, shared_reads=7,
           hint="each thread loads one element into shared memory; then a tree: the first "
                "4 threads add pairs 4 apart, barrier, the first 2, barrier, thread 0"),
    Puzzle("prefix sum", "out[i] = a[0] + ... + a[i] (an inclusive scan of 8 elements)",
           prefix_sum_spec, {"a": _floats(_rng.integers(0, 10, 8))}, (8,), threads=(8,),
           groups=(1,), global_reads=1, shared_reads=6,
           hint="three steps (Hillis-Steele): thread i adds the partial sum 1, 2, then 4 "
                "places to its left; read, barrier, write, barrier in each step"),
    Puzzle("tiled matmul", "out = a @ b, a 8x12 and b 12x8, in 4x4 tiles of shared memory",
           matmul_spec, {"a": _floats(_rng.integers(-3, 4, (8, 12))),
                         "b": _floats(_rng.integers(-3, 4, (12, 8)))}, (8, 8),
           threads=(4, 4), groups=(2, 2), global_reads=6, shared_reads=24,
           hint="in each of 3 steps every thread copies one element of a and one of b into "
                "two 4x4 tiles, barrier, adds its row of the a tile times its column of the b "
                "tile, barrier"),
)}


# ---- a student's kernel, and its run ----

@dataclass(frozen=True)
class PuzzleKernel:
    """A student's kernel function for the puzzle `puzzle` (what @solves makes)."""

    puzzle: str
    function: Callable[..., None]

    def __repr__(self) -> str:
        return f"PuzzleKernel({self.puzzle!r}, {getattr(self.function, '__name__', '?')})"


def solves(name: str) -> Callable[[Callable[..., None]], PuzzleKernel]:
    """`@solves("map")` above `def kernel(k, out, a): ...` marks it as that puzzle's kernel."""
    if name not in PUZZLES:
        raise KeyError(f"no puzzle {name!r}; the puzzles are {list(PUZZLES)}")

    def mark(function: Callable[..., None]) -> PuzzleKernel:
        return PuzzleKernel(name, function)
    return mark


def build_kernel(kernel: PuzzleKernel) -> LinearProgram:
    """Call the student's function once, with a builder and the puzzle's arrays."""
    puzzle = PUZZLES[kernel.puzzle]
    builder = KernelBuilder(puzzle.threads, puzzle.groups)
    arrays = [builder.global_array(0, "out", puzzle.output_shape)]
    arrays += [builder.global_array(number, name, array.shape)
               for number, (name, array) in enumerate(puzzle.inputs.items(), start=1)]
    kernel.function(builder, *arrays)
    return builder.finish()


@dataclass
class PuzzleRun:
    """One run on the emulator: the program, the output and the record of every access."""

    program: LinearProgram
    output: np.ndarray
    trace: Trace


def run_puzzle(kernel: PuzzleKernel) -> PuzzleRun:
    """Build the kernel and run it on fresh copies of the inputs; `out` starts as NaN, so an
    element no thread writes shows. Emulator errors are raised, with the arrays' names."""
    puzzle = PUZZLES[kernel.puzzle]
    try:
        program = build_kernel(kernel)
    except BarrierInWhen as stopped:
        raise divergence(stopped, puzzle) from None
    output = np.full(int(np.prod(puzzle.output_shape)), np.nan, dtype=np.float32)
    try:
        trace = emulate(program, [output, *fresh_inputs(puzzle)],
                        kernel.puzzle.replace(" ", "_"), record=True)
    except EmulatorError as error:
        raise type(error)(with_array_names(str(error), puzzle)) from None
    return PuzzleRun(program, output.reshape(puzzle.output_shape), trace)


def fresh_inputs(puzzle: Puzzle) -> list[np.ndarray]:
    return [array.reshape(-1).copy() for array in puzzle.inputs.values()]


def divergence(stopped: BarrierInWhen, puzzle: Puzzle) -> Exception:
    """A barrier inside `when`: run the kernel up to it, each thread storing its condition. A
    work-group whose threads disagree would wait forever: BarrierDivergenceError, naming a
    thread that waits and one that never arrives (or the error the kernel meets before)."""
    builder = stopped.builder
    flags = UOp(Ops.DEFINE_GLOBAL, FLOAT, (), (len(puzzle.inputs) + 1, builder.thread_count))
    store = UOp(Ops.STORE, FLOAT, (flags, builder.linear_thread(),
                                   stopped.condition.where(UOp.const(FLOAT, 1.0),
                                                           UOp.const(FLOAT, 0.0))))
    new = [u for u in toposort_of([store]) if u not in builder.emitted]
    holds = np.zeros(builder.thread_count, dtype=np.float32)
    output = np.zeros(int(np.prod(puzzle.output_shape)), dtype=np.float32)
    try:
        emulate(builder.closed(builder.uops + new), [output, *fresh_inputs(puzzle), holds])
    except EmulatorError as error:
        return type(error)(with_array_names(str(error), puzzle))
    per_group = holds.reshape(-1, int(np.prod(puzzle.threads))) > 0
    split = np.flatnonzero(per_group.any(axis=1) & ~per_group.all(axis=1))
    if not split.size:
        return stopped
    group = int(split[0])
    waiting, missing = np.flatnonzero(per_group[group]), np.flatnonzero(~per_group[group])
    group_id = ids_of(group, puzzle.groups)
    return BarrierDivergenceError(
        f"barrier divergence: k.barrier() inside `with k.when(...)`: in work-group {group_id}, "
        f"{len(waiting)} threads wait at the barrier but {len(missing)} never reach it, e.g. "
        f"{thread_text(group_id, ids_of(int(missing[0]), puzzle.threads))}: the group would "
        "wait forever. Put the barrier outside the block")


def ids_of(number: int, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """A thread's (or group's) 3-d id from its number, dimension 0 fastest."""
    ids = []
    for size in (*shape, 1, 1, 1)[:3]:
        ids.append(number % size)
        number //= size
    return (ids[0], ids[1], ids[2])


def with_array_names(message: str, puzzle: Puzzle) -> str:
    """The emulator's `data0`, `data1`, ... as the kernel's names: `out`, `a`, ..."""
    names = ["out", *puzzle.inputs]
    return re.sub(r"\bdata(\d+)\b", lambda found: names[int(found.group(1))], message)


def thread_text(group: tuple[int, ...], thread: tuple[int, ...]) -> str:
    """As the emulator names a thread."""
    return f"thread {tuple(thread)} of work-group {tuple(group)}"


def global_write_race(trace: Trace, puzzle: Puzzle) -> str | None:
    """Two threads that write the same element of global memory: which one wins is not
    defined on a GPU. The first such element, with both threads, or None."""
    writer: dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for event in trace.accesses("write"):
        if event.is_shared:
            continue
        for group, thread, address in zip(event.groups.tolist(), event.threads.tolist(),
                                          event.addresses.tolist()):
            who = (tuple(group), tuple(thread))
            first = writer.setdefault((event.buffer, address), who)
            if first != who:
                element = with_array_names(f"{event.buffer}[{address}]", puzzle)
                return (f"global-memory race: {thread_text(*who)} writes {element}, which "
                        f"{thread_text(*first)} wrote too")
    return None


# ---- grading ----

def grade_puzzles(kernels: Iterable[PuzzleKernel]) -> GradeReport:
    """One row per kernel: pass, fail (with what went wrong, naming a thread) or not
    implemented. In a notebook the report shows as a table."""
    return GradeReport("GPU puzzles", [grade_kernel(kernel) for kernel in kernels])


def check(kernel: PuzzleKernel) -> GradeReport:
    """Grade one kernel (a notebook cell's check)."""
    return grade_puzzles([kernel])


def grade_kernel(kernel: PuzzleKernel) -> Row:
    puzzle = PUZZLES[kernel.puzzle]
    try:
        run = run_puzzle(kernel)
    except NotImplementedError as error:
        return Row(puzzle.name, NOT_IMPLEMENTED, str(error) or "raises NotImplementedError")
    except EmulatorError as error:  # names the thread
        return failed(puzzle, "the emulator stopped the kernel", "no error",
                      f"{type(error).__name__}: {error}")
    except Exception as error:  # the student's code could not be built: show why
        return failed(puzzle, "the kernel could not be built", "a kernel",
                      f"{type(error).__name__}: {error}")
    race = global_write_race(run.trace, puzzle)
    if race is not None:
        return failed(puzzle, "two threads write one element", "each element written by "
                      "one thread", race)
    expected = np.asarray(puzzle.spec(*puzzle.inputs.values()), dtype=np.float32)
    if not np.allclose(run.output, expected, rtol=1e-5, atol=1e-5):
        return failed(puzzle, "wrong values", show(expected), wrong_values(run.output, expected),
                      inputs=", ".join(f"{name} = {show(array)}"
                                       for name, array in puzzle.inputs.items()))
    return over_budget(puzzle, run.trace) or Row(puzzle.name, PASS, reads_note(puzzle, run.trace))


def wrong_values(output: np.ndarray, expected: np.ndarray) -> str:
    flat_out, flat_expected = output.reshape(-1), expected.reshape(-1)
    wrong = ~np.isclose(flat_out, flat_expected, rtol=1e-5, atol=1e-5)
    first = int(np.argmax(wrong))
    never = np.isnan(flat_out[first])
    what = "was never written" if never else f"is {flat_out[first]:g}, not {flat_expected[first]:g}"
    return f"{show(output)}: out[{first}] {what}"


def over_budget(puzzle: Puzzle, trace: Trace) -> Row | None:
    for shared, budget in ((False, puzzle.global_reads), (True, puzzle.shared_reads)):
        counts = trace.reads_per_thread(shared)
        if not counts:
            continue
        (group, thread), most = max(counts.items(), key=lambda item: item[1])
        if most > budget:
            memory = "shared" if shared else "global"
            return failed(puzzle, f"too many {memory} reads", f"at most {budget} per thread",
                          f"{thread_text(group, thread)} reads {most} elements of {memory} "
                          "memory")
    return None


def reads_note(puzzle: Puzzle, trace: Trace) -> str:
    most = [max(trace.reads_per_thread(shared).values(), default=0) for shared in (False, True)]
    return (f"right values; reads per thread: global {most[0]} (budget {puzzle.global_reads}), "
            f"shared {most[1]} (budget {puzzle.shared_reads})")


def failed(puzzle: Puzzle, case: str, expected: str, received: str, inputs: str = "") -> Row:
    return Row(puzzle.name, FAIL, case, Failure(case, inputs, expected, received), puzzle.hint)
