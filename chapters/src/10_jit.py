# %% [markdown] id="jit-01"
# # Chapter 10 — The JIT and graph execution
#
# A training step builds the *same* graph every time: Python builds UOps, the scheduler cuts
# kernels, the engine looks up programs — and out comes the same list of kernel launches, only
# on new data. `TinyJit` skips all of that after it has seen the function twice:
#
# - **call 1** runs the function normally (compiling every kernel);
# - **call 2** runs it again while *capturing* every launch: program, buffers, sizes;
# - **call 3 on** *replays* that list with the new input buffers swapped in, without running the
#   Python that built the graph;
# - the JIT is honest: `DEBUG=1` says when it captured and what it replays, and an input of
#   another shape, dtype or device is an error with a clear message, never a silent wrong result;
# - **graph execution**: on the CPU a replay is one native call — a small generated C function
#   calls every kernel in turn;
# - **memory**: a capture keeps memory for every buffer its launches use, so a replay allocates
#   nothing — and writes into the *same* output buffers each time: a result you keep is
#   overwritten by the next call unless you copy it;
# - **memory planning**: most of those buffers are intermediates, each needed from the launch
#   that writes it to the last that reads it. Intermediates whose lifetimes do not overlap
#   share memory, so a deep network's capture holds a few activations, not one per layer. An
#   eager schedule has the same lifetimes, drawn too; tinyteach holds its buffers until the run
#   ends, where tinygrad plans a schedule as it plans a capture.
#
# Modules: [`tinyteach/engine/jit.py`](../tinyteach/engine/jit.py) (`TinyJit`, `CapturedJit`) and
# `CPUGraph` in [`tinyteach/runtime/cpu.py`](../tinyteach/runtime/cpu.py).

# %% id="jit-02"
# %load_ext tinyteach
import numpy as np

import viz
from tinyteach import Context, Device, Tensor

Device.DEFAULT = "CPU"   # every chapter runs on the CPU device: generated C, compiled here
Tensor.manual_seed(0)
rng = np.random.default_rng(0)

from tinyteach import TinyJit
from tinyteach.engine.jit import JitError
from tinyteach.runtime.cpu import CPUGraph, render_graph

# %% [markdown] id="jit-03"
# ## Capture and replay
#
# A small function: a layer with a fixed weight, then a softmax. We count how often its *Python
# body* runs.

# %% id="jit-04"
weight = Tensor(rng.standard_normal((8, 4)).astype(np.float32)).realize()
body_runs = 0

@TinyJit
def layer(x: Tensor) -> Tensor:
    global body_runs
    body_runs += 1
    return (x @ weight).relu().softmax(1).realize()


def reference(x: np.ndarray) -> np.ndarray:
    logits = np.maximum(x @ weight.numpy(), 0)
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


inputs = [rng.standard_normal((2, 8)).astype(np.float32) for _ in range(5)]

# %% [markdown] id="jit-05"
# Call it five times with new data each time, with `DEBUG=1` on so each call shows what runs.
# Call 1 launches kernels one by one; call 2 launches them again and says it captured them;
# calls 3-5 each print a single line: the replay, with the time of that one call (the times
# stored here are from the run that stored the notebook, one noisy call each; validation
# compares them as `TIME`).

# %% id="jit-06"
for call, data in enumerate(inputs, 1):
    print(f"--- call {call}")
    with Context(DEBUG=1):
        out = layer(Tensor(data))
    np.testing.assert_allclose(out.numpy(), reference(data), rtol=1e-5, atol=1e-6)
print("the Python body ran", body_runs, "times for 5 calls")
assert body_runs == 2

# %% [markdown] id="jit-07"
# Every result was checked against numpy, including the replays. What the JIT holds is a plain
# list of launches, each with its kernel and the buffers it was called with, and the places
# where the input buffer must be swapped in:

# %% id="jit-08"
captured = layer.captured
for launch in captured.launches:
    print(f"{launch.item.name:10} {len(launch.buffers)} buffers")
print("input slots (launch, argument, input):", captured.input_slots)
assert len(captured.launches) == 2 and captured.input_slots == [(0, 1, 0)]

# %% [markdown] id="jit-09"
# The captured launches are ordinary schedule items, so viz draws them like any schedule:

# %% id="jit-10"
viz.schedule(captured.launches)

# %% [markdown] id="jit-11"
# ## When an input changes shape
#
# Captured kernels have their sizes baked in: `r_2_4_8` loops over exactly 2 rows. A batch of 3
# rows cannot reuse them, and silently running them would read the wrong memory. The JIT
# checks every input against the captured signature and stops with a clear message:

# %% id="jit-12"
try:
    layer(Tensor(rng.standard_normal((3, 8)).astype(np.float32)))
    raise AssertionError("a new shape must not replay")
except JitError as error:
    print("JitError:", error)

# %% [markdown] id="jit-13"
# The same goes for the dtype or device of an input, and for non-Tensor arguments, which are
# baked into the kernels as constants. As the message says, `.reset()` forgets the capture;
# the next two calls then compile and capture for the new shape:

# %% id="jit-14"
layer.reset()
batch_of_three = [rng.standard_normal((3, 8)).astype(np.float32) for _ in range(3)]
for data in batch_of_three:
    np.testing.assert_allclose(layer(Tensor(data)).numpy(), reference(data), rtol=1e-5,
                               atol=1e-6)
print([launch.item.name for launch in layer.captured.launches])

# %% [markdown] id="jit-15"
# ## State that changes: write it in place
#
# A training step updates its weights. The captured launches point at *buffers*, so the update
# must write into the weight's own buffer — `Tensor.assign` — rather than make a new tensor
# (which the replay would never see). One step of gradient descent on `(w - target)²`:

# %% id="jit-16"
w = Tensor(np.zeros(3, dtype=np.float32)).realize()

@TinyJit
def sgd_step(target: Tensor) -> Tensor:
    loss = ((w - target) ** 2).sum()
    gradient = 2 * (w - target)
    w.assign(w - 0.25 * gradient)
    return loss.realize(), w.realize()

target = np.array([1.0, 2.0, 3.0], dtype=np.float32)
for step in range(6):
    loss, _ = sgd_step(Tensor(target))
    print(f"step {step}: loss {loss.item():.4f}  w {np.array2string(w.numpy(), precision=4)}")
assert np.allclose(w.numpy(), target * (1 - 0.5 ** 6))

# %% [markdown] id="jit-17"
# Each step halves the distance to the target, on replays too: the captured kernel writes into
# `w`'s buffer, and the next replay reads it.
#
# ## Graph execution
#
# A replay still calls every kernel from Python, a few microseconds each. On the CPU the JIT does
# better: `CPUGraph` generates a tiny C function that calls every captured kernel in turn, with
# the buffer addresses in one C array — the whole replay is one ctypes call, and only the input
# slots are rewritten between replays. This is the C it generates for two kernels with 3 and 2
# arguments:

# %% id="jit-18"
print(render_graph([3, 2]))
print("the captured layer replays through:", type(layer.captured.graph).__name__)
assert isinstance(layer.captured.graph, CPUGraph)

# %% [markdown] id="jit-19"
# How much does the JIT save? Compare one eager call (build the graph, schedule, look up the
# programs, launch) with one replay. Absolute times vary from machine to machine; the ratio is
# large everywhere, so we only print whether the replay wins.

# %% id="jit-20"
import time


def eager(x):
    return (x @ weight).relu().softmax(1).realize()

def best_time(function, repeats=20):
    """The fastest of `repeats` calls, after one warm-up call."""
    function(Tensor(batch_of_three[0]))
    times = []
    for _ in range(repeats):
        x = Tensor(batch_of_three[0])
        start = time.perf_counter()
        function(x)
        times.append(time.perf_counter() - start)
    return min(times)

eager_seconds, replay_seconds = best_time(eager), best_time(layer)
print("the replay is faster than the eager call:", replay_seconds < eager_seconds)
assert replay_seconds < eager_seconds


# %% [markdown] id="jit-21"
# `%%tinyteach` records the launches of a cell. Replays bypass the engine, so only calls that
# *run* the function are recorded — here the first call of a new jitted function:

# %% id="jit-22"
# %%tinyteach --show kernels
@TinyJit
def scaled_sum(x: Tensor) -> Tensor:
    return (x * 3).sum(0).realize()

scaled_sum(Tensor(np.ones((4, 4), dtype=np.float32)))

# %% [markdown] id="jit-36"
# ## Memory: a replay writes into the same buffers
#
# The captured launches hold the buffers they were called with, and only the *input* slots are
# swapped. Everything else — the intermediate results and the output — is the same memory on every
# replay. So the tensor a replay returns points at the capture's output buffer, and so does the one
# the next replay returns: a result you keep is overwritten by the next call (tinygrad's `TinyJit`
# behaves the same way). Watch it with a jitted `double`, called four times and every result kept:

# %% id="jit-37"
from tinyteach.ir.uop import Ops


@TinyJit
def double(x: Tensor) -> Tensor:
    return (x * 2).realize()


def buffer_of(tensor: Tensor):
    """The Buffer a realized tensor reads (under its RESHAPE)."""
    node = tensor.uop
    while node.op is not Ops.BUFFER:
        node = node.src[0]
    return node.arg


results = [double(Tensor([float(call)] * 3)) for call in (1, 2, 3, 4)]
print("kept results:", [float(result.numpy()[0]) for result in results], "expected [2, 4, 6, 8]")
print("the same buffer as call 4's:", [buffer_of(r) is buffer_of(results[3]) for r in results])
assert [float(result.numpy()[0]) for result in results] == [2.0, 8.0, 8.0, 8.0]

# %% [markdown] id="jit-38"
# Call 1 ran eagerly and got a buffer of its own. Call 2 was the capture: its output buffer is the
# one every replay writes, so calls 2, 3 and 4 all read 8 — the last call's value. A result that must
# outlive the next call has to be copied out of the capture's buffer: `.numpy()` copies it to the
# host, and `.clone()` (a `contiguous()` kernel, chapter 6) copies it into a fresh buffer on the
# device, at the price of one more launch per call:

# %% id="jit-39"
kept = [double(Tensor([float(call)] * 3)).clone().realize() for call in (1, 2, 3, 4)]
print("cloned results:", [float(result.numpy()[0]) for result in kept])
assert [float(result.numpy()[0]) for result in kept] == [2.0, 4.0, 6.0, 8.0]

# %% [markdown] id="jit-40"
# ### Buffer lifetimes
#
# An eager call allocates a fresh buffer for every result the scheduler stores (chapter 6), and
# frees each one as soon as nothing refers to it: the product `x @ weight` (the softmax's input)
# dies when the call returns, and its memory goes back to the allocator's pool (chapter 9) for
# the next call to reuse. A capture keeps memory for them all for as long as the JIT lives:
# memory held between calls, in exchange for replays that allocate nothing (how little of it
# a deep network needs is the next section's subject). Here is what `layer`'s capture holds,
# besides the input it swaps in (each launch's argument 0 is the buffer it writes):

# %% id="jit-41"
from tinyteach.engine.realize import record_launches

captured = layer.captured
swapped = {(k, position) for k, position, _ in captured.input_slots}
written = {id(launch.buffers[0]) for launch in captured.launches}
held = {}
for k, launch in enumerate(captured.launches):
    for position, buffer in enumerate(launch.buffers):
        if (k, position) not in swapped:
            held.setdefault(id(buffer), buffer)
for buffer in held.values():
    role = "written by a kernel" if id(buffer) in written else "only read: the weight"
    print(f"{buffer.size:3} x {buffer.dtype.name}: {role}")
print(sum(buffer.nbytes for buffer in held.values()), "bytes stay allocated between calls")

# an eager call makes new buffers every time; two replays write the same ones
x = Tensor(batch_of_three[0]).realize()
eager_outputs = []
for _ in range(2):
    with record_launches() as launches:
        eager(x)
    eager_outputs.append([launch.buffers[0] for launch in launches])
print("eager calls share an output buffer:",
      any(a is b for a, b in zip(*eager_outputs)))
first, second = layer(x), layer(x)
print("two replays return the same buffer:", buffer_of(first) is buffer_of(second))
assert len(held) == 3 and buffer_of(first) is buffer_of(second)


# %% [markdown] id="jit-46"
# ## Memory planning: buffer lifetimes and reuse, in TinyJit and in a schedule
#
# A 16-layer MLP (each layer `relu(x @ W + b)`, 256 wide, a batch of 64) is 16 kernels, and
# the capture holds an output buffer for each: 16 activations of 65,536 bytes. But activation 3 is
# needed only while launch 3 writes it and launch 4 reads it; from launch 5 on, its memory
# could hold activation 5. That span — from the first launch that touches a buffer to the
# last — is the buffer's **lifetime**, and two buffers whose lifetimes do not overlap can
# share memory. tinygrad's JIT plans memory this way; ours is `plan_memory` in engine/jit.py:
#
# 1. `buffer_lifetimes`: walk the launches once and note, for each piece of memory, the
#    first and last launch that use it, and whether the first one *writes* it (argument 0);
# 2. pick the **intermediates**: memory written before it is read, and held by nothing but
#    the launches. Inputs and outputs are not, and neither is memory that lives on after the
#    call: a weight, an optimizer's state that `assign` writes, a tensor the function stored
#    somewhere. The planner finds those by taking the launches' own buffers out and seeing
#    which memory stays allocated;
# 3. `assign_memory`: largest first, put each intermediate into the first piece of shared
#    memory on its device that is big enough and free for its whole lifetime, else into a new
#    piece. Memory is bytes, so buffers of any dtypes may share it (WebGPU's is typed: there
#    only buffers of one dtype share).
#
# `GlobalCounters.mem_used` is the bytes of device memory allocated right now, on every
# device: a buffer's memory is counted when it is allocated and uncounted when it is freed.
# With it we measure what each capture holds, with the planner off (`MEMORY_PLANNER=0`,
# tinygrad's `NO_MEMORY_PLANNER=1`) and on:

# %% id="jit-47"
import gc

from tinyteach import GlobalCounters

BATCH, WIDTH, DEPTH = 64, 256, 16
ACTIVATION = BATCH * WIDTH * 4  # bytes of one float32 activation
mlp_weights = [(Tensor((rng.standard_normal((WIDTH, WIDTH)) / 16).astype(np.float32)).realize(),
                Tensor((rng.standard_normal(WIDTH) / 16).astype(np.float32)).realize())
               for _ in range(DEPTH)]


def deep_mlp(x: Tensor) -> Tensor:
    for w_layer, b_layer in mlp_weights:
        x = (x @ w_layer + b_layer).relu()
    return x.realize()


mlp_inputs = [rng.standard_normal((BATCH, WIDTH)).astype(np.float32) for _ in range(4)]
held, results = {}, {}
for planner in (0, 1):
    with Context(MEMORY_PLANNER=planner):
        jitted_mlp = TinyJit(deep_mlp)
        x = Tensor(mlp_inputs[0]).realize()
        gc.collect()
        before = GlobalCounters.mem_used  # the weights and an input
        results[planner] = []
        for data in mlp_inputs:
            x = Tensor(data).realize()
            results[planner].append(jitted_mlp(x).numpy())
        held[planner] = GlobalCounters.mem_used - before
    print(f"MEMORY_PLANNER={planner}: the capture holds {held[planner]:8,} bytes = "
          f"{held[planner] // ACTIVATION:2} activations")
for planned, unplanned, data in zip(results[1], results[0], mlp_inputs):
    np.testing.assert_array_equal(planned, unplanned)            # the same bits
    np.testing.assert_array_equal(planned, deep_mlp(Tensor(data)).numpy())  # as eager too
assert held[0] == DEPTH * ACTIVATION and held[1] <= 6 * ACTIVATION

# %% [markdown] id="jit-48"
# Without the planner the capture holds all 16 activations: 15 intermediates and the output.
# With it, three: the output and two pieces of shared memory. Every replay gave the same bits
# as without the planner and as the eager call: the kernels are the same, only the addresses
# they write to changed. `captured.memory_plan` says what the planner did, and `chart()` draws
# it, a column per launch: a row per intermediate (`#` from the launch that writes it to the
# last that reads it), then a row per piece of shared memory, naming the intermediate it holds
# at each launch:

# %% id="jit-49"
plan = jitted_mlp.captured.memory_plan
print(plan.chart())
print(f"{len(plan.moved)} intermediates, {plan.bytes_before:,} bytes with a buffer each, "
      f"{plan.bytes_after:,} bytes in {len(plan.pieces)} shared pieces")
assert len(plan.moved) == DEPTH - 1 and len(plan.pieces) == 2

# %% [markdown] id="jit-50"
# Activation *k* is written by launch *k* and read by launch *k+1*, so at every launch two are
# alive, one being read and one being written: A and B take turns. The weights, the biases and
# the input are only read, and the output is returned: they keep their own memory. So does the
# state of a training step, written with `assign` and alive after the call. A two-layer MLP
# trained with Adam (chapter 11), jitted: its parameters and Adam's moments keep their memory,
# the forward and backward intermediates share, and the losses are the eager run's, bit for bit:

# %% id="jit-51"
from typing import Any

from tinyteach import nn


def train(jit: bool) -> tuple[list[float], Any]:
    """Six Adam steps of a small MLP from the same start: the losses, and the jitted step."""
    start = np.random.default_rng(7)
    params = [Tensor(start.uniform(-0.3, 0.3, shape).astype(np.float32)).realize()
              for shape in [(16, 32), (32,), (32, 10)]]
    optimizer = nn.optim.Adam(params, lr=0.01)

    def step(x: Tensor, y: Tensor) -> Tensor:
        optimizer.zero_grad()
        hidden = (x @ params[0] + params[1]).relu()
        loss = (hidden @ params[2]).sparse_categorical_crossentropy(y).backward()
        Tensor.realize(loss, *optimizer.schedule_step())
        return loss

    run = TinyJit(step) if jit else step
    batches = np.random.default_rng(8)
    x, y = batches.random((8, 16), dtype=np.float32), batches.integers(0, 10, 8).astype(np.int32)
    with Tensor.train():
        losses = [run(Tensor(x), Tensor(y)).item() for _ in range(6)]
    state = [params, optimizer.m, optimizer.v]
    return losses, (run, [buffer_of(t).allocation for group in state for t in group])


eager_losses, _ = train(jit=False)
jit_losses, (train_step, state_memory) = train(jit=True)
step_plan = train_step.captured.memory_plan
print("losses:", [round(loss, 4) for loss in jit_losses])
print(f"{step_plan.steps} launches use {len(step_plan.lifetimes)} pieces of memory; "
      f"{len(step_plan.moved)} intermediates moved into {len(step_plan.pieces)} shared pieces "
      f"({step_plan.bytes_before:,} -> {step_plan.bytes_after:,} bytes)")
written = {id(launch.buffers[0].allocation) for launch in train_step.captured.launches}
print("the launches write into each parameter's and each moment's own memory:",
      all(id(memory) in written for memory in state_memory))
assert jit_losses == eager_losses and step_plan.bytes_after < step_plan.bytes_before
assert all(id(memory) in written for memory in state_memory)

# %% [markdown] id="jit-52"
# ### Lifetimes in a schedule
#
# The lifetimes are not the JIT's: they are the schedule's. An eager `deep_mlp(x)` is one
# schedule of 16 kernels, with activation *k* needed from launch *k* to launch *k+1*, as in the
# capture. But an eager realize gives every value it stores a buffer of its own, allocated when
# its kernel first runs, and frees none before the whole schedule has run: the schedule refers
# to them all until it ends. Then the 15 intermediates are freed (only the result is still
# referred to) and their memory goes back to the allocator's pool (chapter 9), where the next
# call finds it. `jit.buffer_lifetimes` reads any list of launches, an eager run's as well as a
# capture's. The chart: `#` while a launch uses the activation, `-` while the run holds it
# after its last use:

# %% id="jit-53"
from tinyteach.engine.jit import MemoryPlan, assign_memory, buffer_lifetimes

eager_input = Tensor(mlp_inputs[0]).realize()
gc.collect()
before = GlobalCounters.mem_used
with record_launches() as eager_launches:
    eager_result = deep_mlp(eager_input)
# the record refers to every buffer as the run did: what the run held at its end
during = GlobalCounters.mem_used - before
lifetimes = buffer_lifetimes(eager_launches)
result_memory = buffer_of(eager_result).allocation
intermediates = [t for t in lifetimes if t.written_first and t.memory() is not result_memory]
steps = len(eager_launches)
print(f"{'launch':14}{''.join(str(step % 10) for step in range(steps))}")
for k, lifetime in enumerate(intermediates):
    row = ["#" if lifetime.first <= step <= lifetime.last else "-" if step > lifetime.last
           else "." for step in range(steps)]
    print(f"activation {k:<3}{''.join(row)}")
print(f"the eager run holds {during:,} bytes = {during // ACTIVATION} activations at its end")
del eager_launches
gc.collect()
after = GlobalCounters.mem_used - before
print(f"after it returns: {after:,} bytes = {after // ACTIVATION} activation, the result")
schedule_plan = MemoryPlan(steps, lifetimes, intermediates, assign_memory(intermediates))
print(f"planned by lifetime, its {len(intermediates)} intermediates would fit in "
      f"{len(schedule_plan.pieces)} pieces ({schedule_plan.bytes_after:,} bytes)")
assert during == DEPTH * ACTIVATION and after == ACTIVATION
assert len(intermediates) == DEPTH - 1 and len(schedule_plan.pieces) == 2

# %% [markdown] id="jit-54"
# This is where tinyteach and tinygrad differ. In tinygrad 0.14 the scheduler's last step is
# the planner its JIT runs too (`memory_plan_rewrite` in `tinygrad/schedule/memory.py`, on
# every device but DISK, OpenCL and WebGPU), so an eager realize of this network holds about
# two activations while it runs, as the capture does. tinyteach plans only TinyJit's
# captures, whose memory is held between calls; an eager schedule's intermediates live until
# its run ends, so its peak is every activation at once (here 16 × 65,536 bytes; for a large
# model at a large batch, the difference between fitting in memory and not). A planner for
# schedules would read the same lifetimes from the schedule's items before the run and give
# each intermediate its piece of shared memory, as `plan_memory` does for the launches.

# %% [markdown] id="jit-42"
# ## What an eager call costs, and the lean path
#
# Without the JIT, every call pays for Python. Take the smallest eager step there is,
# `(x + 1).realize()` on a 16-element tensor that already holds its values: the kernel runs in
# well under a microsecond, and everything else is Python: build the graph (a Tensor and an ADD
# node), find out what to run, allocate the output, launch, point the tensor at its buffer.
# The engine (chapter 9) does it in three ways, from the most general to the leanest:
#
# - the **whole path** (`PLAN_CACHE=0`): schedule the graph into kernels, look up each kernel's
#   program, run the schedule;
# - the **plan cache**: a graph of the same *structure* (ops, dtypes, shapes, constants, which
#   inputs are the same buffer, the settings; never an object's identity) was planned before,
#   so its plan runs on this graph's buffers. Finding it walks the graph (`plan_key`);
# - the **lean path**: a graph that is *one elementwise op over leaves* (a buffer or a
#   constant, seen through movement ops) skips the walk as well. Each leaf's structure is
#   numbered once and the number kept on the leaf's node, so the key is the op, its dtype, the
#   leaves' numbers, which leaves read the same buffer, and the settings
#   (`realize.elementwise_key`). `x + 1` also makes no Tensor for the constant: the broadcast
#   constant is one cached node.
#
# A replay of a jitted `add_one` skips even the graph. We count *Python function calls*
# (`sys.setprofile`), which, unlike a time, do not depend on how busy the machine is:

# %% id="jit-43"
# NBVAL_IGNORE_OUTPUT
import sys

from tinyteach.engine import realize


def python_calls(function) -> int:
    """How many Python functions run during `function()` (calls into C not counted)."""
    count = 0

    def on_event(frame, event, arg):
        nonlocal count
        count += event == "call"
    sys.setprofile(on_event)
    try:
        function()
    finally:
        sys.setprofile(None)
    return count


def add_one(x: Tensor) -> Tensor:
    return (x + 1).realize()


sixteen = np.arange(16, dtype=np.float32)
fresh = lambda: Tensor(sixteen.copy()).realize()  # a realized input, new every call
jitted_add_one = TinyJit(add_one)
for _ in range(3):
    add_one(fresh()), jitted_add_one(fresh())  # compile, plan, capture
inputs = [fresh() for _ in range(3)]
with Context(PLAN_CACHE=0):
    whole = python_calls(lambda: add_one(inputs[0]))
lean = python_calls(lambda: add_one(inputs[1]))
replay = python_calls(lambda: jitted_add_one(inputs[2]))
print(f"whole path {whole} calls, lean path {lean}, JIT replay {replay}")
assert lean < 60 and whole > 5 * lean and replay < 20

# %% [markdown] id="jit-44"
# (The counts printed here are stored, but nbval does not compare them: they change with the
# Python version.) The lean path makes a few dozen calls where the whole path makes hundreds;
# what is left is the graph, the output
# buffer and the result node, which a JIT replay does not build: it writes into the buffer of
# its capture and only makes the Tensor it returns. Time follows the count only roughly
# (a call into C, ctypes' launch among them, costs more than a Python call), which is why
# `benchmarks/run.py` reports the time, next to PyTorch's.
#
# A cache that may hand out a wrong plan is worse than none. Each input of the lean key is a
# structure, never a buffer; and what the key leaves out must not matter. Here the same
# buffer twice and two buffers, `+0.0` and `-0.0`, and a buffer that `assign()` overwrote,
# each against numpy:

# %% id="jit-45"
from tinyteach.helpers import clear_caches

clear_caches()
a, b = fresh(), fresh()
for _ in range(3):  # a new graph of one structure each time: one plan
    np.testing.assert_array_equal((fresh() + 1).numpy(), sixteen + 1)
print("plans after 3 calls of x + 1:", len(realize.elementwise_plans))
np.testing.assert_array_equal((a + a).numpy(), sixteen * 2)      # one buffer, read twice
np.testing.assert_array_equal((a + b).numpy(), sixteen * 2)      # two buffers: another plan
signs = [bool(np.signbit((-a * 0 + zero).numpy()[0])) for zero in (0.0, -0.0)]
print("-0.0 + 0.0 and -0.0 + -0.0 have the sign bits", signs, "as numpy:",
      [bool(np.signbit(np.float32(-0.0) + np.float32(z))) for z in (0.0, -0.0)])
assert signs == [False, True]
old = Tensor(a.uop)            # a's buffer as it is now
(old + 1).realize()            # plans x + 1 on a buffer not yet overwritten
a.assign(a * 3).realize()      # writes into that buffer: the old contents are gone
try:
    (old + 1).realize()        # not served the old plan: the scheduler's error
    raise AssertionError("a graph on overwritten memory must not run")
except RuntimeError as error:
    print("RuntimeError:", str(error).split(";")[0])
np.testing.assert_array_equal((a + 1).numpy(), sixteen * 3 + 1)
print("plans now:", len(realize.elementwise_plans))


# %% [markdown] id="jit-23"
# ## Try it

# %% [markdown] id="jit-24"
# **Try it — a changing constant.** Write a jitted `shift(x, amount)` that returns `(x + amount).realize()`, where `amount` is
# a Python float. Call it three times with the same `amount`, then once with another one.
# What happens, and why?

# %% id="jit-25"
# your code here

# %% [markdown] id="jit-26"
# *Solution* (click the collapsed cell below to show it):

# %% id="jit-27" jupyter={"source_hidden": true} tags=["solution"]
@TinyJit
def shift(x: Tensor, amount: float) -> Tensor:
    return (x + amount).realize()

for _ in range(3):
    shift(Tensor([1.0, 2.0]), 1.0)
try:
    shift(Tensor([1.0, 2.0]), 2.0)
except JitError as error:
    print(error)  # 1.0 is a constant inside the captured kernel's source

# %% [markdown] id="jit-28"
# **Try it — random numbers.** A replay runs the captured kernels and nothing else, so how can a
# function that calls `Tensor.rand` draw new numbers on every call? Try
# `TinyJit(lambda x: (x + Tensor.rand(2)).realize())`, call it three times, and compare the
# results. Then look for the kernels that advance the random state in `noisy.captured.launches`.

# %% id="jit-29"
# your code here

# %% [markdown] id="jit-30"
# *Solution* (click the collapsed cell below to show it):

# %% id="jit-31" jupyter={"source_hidden": true} tags=["solution"]
noisy = TinyJit(lambda x: (x + Tensor.rand(2)).realize())
draws = [noisy(Tensor([0.0, 0.0])).numpy() for _ in range(3)]   # the 2nd call captures
assert not np.array_equal(draws[1], draws[2])   # the replay drew new numbers
assert all(((0 <= d) & (d < 1)).all() for d in draws)
# the random state (a key and a 64-bit counter, chapter 1) lives in buffers on the device: the
# first three captured kernels copy the counter for the draw and advance it in place (into a
# fresh buffer, then back: the new words read the old ones through views), and a replay runs
# them again; the others compute the draw itself and x + rand
print(len(noisy.captured.launches), "captured launches:",
      [launch.item.name for launch in noisy.captured.launches])

# %% [markdown] id="jit-32"
# **Try it — how many kernels in a step?.** Capture `sgd_step` above again (`.reset()`, then two calls) and count its launches. Which of
# them writes into `w`'s buffer?

# %% id="jit-33"
# your code here

# %% [markdown] id="jit-34"
# *Solution* (click the collapsed cell below to show it):

# %% id="jit-35" jupyter={"source_hidden": true} tags=["solution"]
sgd_step.reset()
for _ in range(2):
    sgd_step(Tensor(target))
launches = sgd_step.captured.launches
print(len(launches), "launches:", [launch.item.name for launch in launches])
w_memory = buffer_of(w).allocation  # the launch whose output is w's memory
writers = [launch.item.name for launch in launches if launch.buffers[0].allocation is w_memory]
print("writes into w:", writers)
assert len(writers) == 1
