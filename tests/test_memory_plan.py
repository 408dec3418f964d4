"""Chapter 10: TinyJit's memory planner, and `GlobalCounters.mem_used` that measures it.

A capture's intermediates share memory by lifetime; replays on the shared memory give the bits
of replays without it, and of the eager run; inputs, outputs, weights and optimizer states
keep their own memory; memory on two devices is never shared."""
from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from helpers import test_devices

from tinyteach import Context, Device, GlobalCounters, Tensor, TinyJit, nn
from tinyteach.device import Allocation, Backend, Buffer, HostAllocator
from tinyteach.dtype import dtypes
from tinyteach.engine.jit import BufferLifetime, assign_memory, buffer_lifetimes
from tinyteach.helpers import format_bytes
from tinyteach.ir.uop import Ops

BATCH, WIDTH, DEPTH = 64, 256, 16
ACTIVATION = BATCH * WIDTH * 4  # bytes of one float32 activation


@pytest.fixture(autouse=True)
def on_cpu() -> Iterator[None]:
    saved = Device.DEFAULT
    Device.DEFAULT = "CPU"
    yield
    Device.DEFAULT = saved


def buffer_of(tensor: Tensor) -> Buffer:
    node = tensor.uop
    while node.op is not Ops.BUFFER:
        node = node.src[0]
    buffer: Buffer = node.arg
    return buffer


# ---- GlobalCounters.mem_used ----

@pytest.mark.parametrize("device", [*test_devices(), "CPU:1"])
def test_mem_used_counts_allocation_and_free(device: str) -> None:
    gc.collect()
    before = GlobalCounters.mem_used
    buffer = Buffer(device, 1000, dtypes.float32)
    assert GlobalCounters.mem_used == before  # memory is allocated on first use
    buffer.copyin(np.arange(1000, dtype=np.float32))
    assert GlobalCounters.mem_used == before + 4000
    alias = buffer.alias()  # one piece of memory, counted once
    assert GlobalCounters.mem_used == before + 4000
    del buffer
    assert GlobalCounters.mem_used == before + 4000  # the alias still holds it
    np.testing.assert_array_equal(alias.numpy(), np.arange(1000, dtype=np.float32))
    del alias
    assert GlobalCounters.mem_used == before


def test_mem_used_follows_tensors() -> None:
    gc.collect()
    before = GlobalCounters.mem_used
    x = Tensor(np.ones((10, 10), dtype=np.float32)).realize()
    y = (x * 2).realize()
    assert GlobalCounters.mem_used == before + 800
    del x, y
    gc.collect()
    assert GlobalCounters.mem_used == before
    GlobalCounters.reset()  # a gauge: reset() zeroes the counts, not the memory in use
    assert GlobalCounters.mem_used == before


def test_buffer_in_memory_must_fit() -> None:
    memory = Allocation("CPU", 64)
    shared = Buffer.in_memory(memory, 8, dtypes.int16)  # 16 of 64 bytes, another dtype
    shared.copyin(np.arange(8, dtype=np.int16))
    np.testing.assert_array_equal(shared.numpy(), np.arange(8, dtype=np.int16))
    with pytest.raises(ValueError, match="does not fit"):
        Buffer.in_memory(memory, 17, dtypes.float32)


# ---- the two functions: lifetimes and the assignment ----

def lifetime(first: int, last: int, nbytes: int, device: str = "CPU") -> BufferLifetime:
    memory = Allocation(device, nbytes)
    return BufferLifetime(lambda: memory, device, nbytes, dtypes.float32,  # type: ignore
                          first, last, True)


def test_assign_memory_shares_by_lifetime_largest_first() -> None:
    chain = [lifetime(k, k + 1, 100) for k in range(6)]  # each read by the next launch only
    pieces = assign_memory(chain)
    assert len(pieces) == 2 and all(p.nbytes == 100 for p in pieces)
    for piece in pieces:
        assert not any(a.overlaps(b) for a in piece.tenants for b in piece.tenants if a is not b)
    big, small = lifetime(0, 1, 400), lifetime(3, 4, 40)
    pieces = assign_memory([small, big])  # by bytes: the small one fits in the big one's
    assert len(pieces) == 1 and pieces[0].nbytes == 400
    overlapping = [lifetime(0, 3, 100), lifetime(3, 5, 100)]  # launch 3 uses both
    assert len(assign_memory(overlapping)) == 2


def test_assign_memory_never_shares_across_devices() -> None:
    pieces = assign_memory([lifetime(0, 1, 100, "CPU"), lifetime(2, 3, 100, "CPU:1")])
    assert sorted(p.device for p in pieces) == ["CPU", "CPU:1"]


class TypedAllocator(HostAllocator):
    holds_bytes = False  # as WebGPU's: memory used for one dtype cannot serve another


def test_typed_memory_is_shared_by_one_dtype_only() -> None:
    Device.register("TYPEDMEM", lambda: Backend("TYPEDMEM", TypedAllocator(), None, None,
                                                lambda ast: None))
    floats = [lifetime(0, 1, 100, "TYPEDMEM"), lifetime(2, 3, 100, "TYPEDMEM")]
    integer = lifetime(4, 5, 100, "TYPEDMEM")
    integer.dtype = dtypes.int32
    pieces = assign_memory([*floats, integer])
    assert sorted((p.dtype.name if p.dtype else "", len(p.tenants)) for p in pieces) == \
        [("float32", 2), ("int32", 1)]
    untyped = [lifetime(0, 1, 100), lifetime(2, 3, 100)]
    untyped[1].dtype = dtypes.int32
    assert [p.dtype for p in assign_memory(untyped)] == [None]  # bytes: any dtype


# ---- a deep MLP's forward ----

def make_layers(seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    rng = np.random.default_rng(seed)
    return [(Tensor(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) / 16).realize(),
             Tensor(rng.standard_normal(WIDTH).astype(np.float32) / 16).realize())
            for _ in range(DEPTH)]


def mlp(layers: list[tuple[Tensor, Tensor]], realize_each: bool = False) -> Callable[
        [Tensor], Tensor]:
    def forward(x: Tensor) -> Tensor:
        for weight, bias in layers:
            x = (x @ weight + bias).relu()
            if realize_each:
                x = x.realize()
        return x.realize()
    return forward


def held_after_calls(forward: Callable[[Tensor], Tensor], inputs: list[np.ndarray],
                     planner: int) -> tuple[int, list[np.ndarray], TinyJit]:
    """Bytes a TinyJit of `forward` holds (beyond the weights and the input) once it has
    replayed, and its outputs, call by call."""
    jit = TinyJit(forward)
    with Context(MEMORY_PLANNER=planner):
        gc.collect()
        x = Tensor(inputs[0]).realize()
        before = GlobalCounters.mem_used  # the weights and one input
        outputs = []
        for data in inputs:
            del x
            x = Tensor(data).realize()
            outputs.append(jit(x).numpy())
        gc.collect()
        return GlobalCounters.mem_used - before, outputs, jit


@pytest.mark.parametrize("realize_each", [False, True])
def test_deep_mlp_forward_holds_a_few_activations(realize_each: bool) -> None:
    """The issue's measure: a captured 16-layer forward holds <= 6 activations' bytes of
    mem_used beyond the weights and the input (16 without the planner: 15 intermediates and
    the output), and gives the bits of the unplanned replays and of the eager calls."""
    layers = make_layers()
    forward = mlp(layers, realize_each)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((BATCH, WIDTH)).astype(np.float32) for _ in range(5)]
    eager = [forward(Tensor(data)).numpy() for data in inputs]
    unplanned, unplanned_outputs, _ = held_after_calls(forward, inputs, planner=0)
    planned, planned_outputs, jit = held_after_calls(forward, inputs, planner=1)
    assert unplanned == DEPTH * ACTIVATION
    assert planned <= 6 * ACTIVATION, planned / ACTIVATION
    for a, b, c in zip(planned_outputs, unplanned_outputs, eager):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    assert jit.captured is not None
    plan = jit.captured.memory_plan
    assert plan is not None and len(plan.pieces) == 2
    assert len(plan.moved) == DEPTH - 1 and plan.bytes_after == 2 * ACTIVATION


def test_debug_says_what_the_plan_saved(capsys: pytest.CaptureFixture[str]) -> None:
    jit = TinyJit(mlp(make_layers()))
    with Context(DEBUG=1):
        for _ in range(3):
            jit(Tensor(np.ones((BATCH, WIDTH), dtype=np.float32)))
    out = capsys.readouterr().out
    before, after = format_bytes((DEPTH - 1) * ACTIVATION), format_bytes(2 * ACTIVATION)
    assert f"TinyJit: memory plan: {DEPTH - 1} intermediates in 2 shared buffers, {before} " \
           f"-> {after}" in out


def test_planner_off_keeps_every_buffer() -> None:
    layers = make_layers()
    with Context(MEMORY_PLANNER=0):
        jit = TinyJit(mlp(layers))
        for _ in range(3):
            jit(Tensor(np.ones((BATCH, WIDTH), dtype=np.float32)))
    assert jit.captured is not None and jit.captured.memory_plan is None
    outputs = {id(launch.buffers[0].allocation) for launch in jit.captured.launches}
    assert len(outputs) == DEPTH


def test_lifetimes_of_a_capture() -> None:
    """Each activation lives from the launch that writes it to the next one, which reads it;
    the weights of a layer are touched by its launch only."""
    layers = make_layers()
    unplanned, planned = TinyJit(mlp(layers)), TinyJit(mlp(layers))
    for planner, jit in enumerate([unplanned, planned]):
        with Context(MEMORY_PLANNER=planner):
            for _ in range(3):
                jit(Tensor(np.ones((BATCH, WIDTH), dtype=np.float32)))
    assert unplanned.captured is not None and planned.captured is not None
    lifetimes = buffer_lifetimes(unplanned.captured.launches)
    written = [lt for lt in lifetimes if lt.written_first]
    assert [(lt.first, lt.last) for lt in written] == \
        [(k, min(k + 1, DEPTH - 1)) for k in range(DEPTH)]
    read = [lt for lt in lifetimes if not lt.written_first]
    assert len(read) == 2 * DEPTH + 1  # the weights, the biases and the input
    plan = planned.captured.memory_plan  # the planner saw the same lifetimes
    assert plan is not None
    assert [(lt.first, lt.last, lt.written_first) for lt in plan.lifetimes] == \
        [(lt.first, lt.last, lt.written_first) for lt in lifetimes]
    # after the plan the launches use two pieces of memory in turn, A B A B ...
    shared = [lt for lt in buffer_lifetimes(planned.captured.launches) if lt.written_first]
    assert [(lt.first, lt.last) for lt in shared] == [(0, DEPTH - 1), (1, DEPTH - 2),
                                                      (DEPTH - 1, DEPTH - 1)]


def test_an_eager_schedule_holds_every_intermediate_until_its_run_ends() -> None:
    """Chapter 10's jit-52/53: an eager realize of the 16-layer forward is one schedule, with
    the capture's lifetimes; tinyteach does not plan its memory (tinygrad 0.14 does), so
    mem_used grows by one activation per launch, nothing is freed before the run ends, and
    only the result stays after it. Watched through an observer that keeps no buffer."""
    import tinyteach.engine.realize as realize

    forward = mlp(make_layers())
    x = Tensor(np.ones((BATCH, WIDTH), dtype=np.float32)).realize()
    forward(x)  # compiled: the run below allocates activations only

    class MemoryAtEachLaunch(list):  # a launch log that notes mem_used and keeps nothing
        def append(self, launch: object) -> None:
            seen.append(GlobalCounters.mem_used - before)

    seen: list[int] = []
    gc.collect()
    before = GlobalCounters.mem_used
    log = MemoryAtEachLaunch()  # (a recording of fresh items: the run of a new schedule)
    realize._launch_logs.append(log)
    realize._logs_of_fresh_items.append(log)
    try:
        result = forward(x)
    finally:
        realize._launch_logs.pop()
        realize._logs_of_fresh_items.pop()
    gc.collect()
    assert seen == [(k + 1) * ACTIVATION for k in range(DEPTH)]
    assert GlobalCounters.mem_used - before == ACTIVATION  # the result
    np.testing.assert_array_equal(result.numpy(), forward(x).numpy())


def test_returned_intermediate_is_never_shared() -> None:
    """A function that returns an intermediate as well as its result: that buffer keeps its
    memory, which no other buffer of the capture uses, and holds its own value."""
    layers = make_layers()[:6]

    def forward(x: Tensor) -> tuple[Tensor, Tensor]:
        middle = None
        for k, (weight, bias) in enumerate(layers):
            x = (x @ weight + bias).relu().realize()
            if k == 1:
                middle = x
        assert middle is not None
        return middle, x

    jit = TinyJit(forward)
    rng = np.random.default_rng(2)
    for _ in range(4):
        data = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
        middle, out = jit(Tensor(data))
        expected_middle, expected_out = forward(Tensor(data))
        np.testing.assert_array_equal(middle.numpy(), expected_middle.numpy())
        np.testing.assert_array_equal(out.numpy(), expected_out.numpy())
    assert jit.captured is not None
    memory = buffer_of(middle).allocation
    users = [k for k, launch in enumerate(jit.captured.launches)
             for buffer in launch.buffers if buffer.allocation is memory]
    assert users == [1, 2]  # written by launch 1, read by launch 2, and nobody else's
    plan = jit.captured.memory_plan
    assert plan is not None and len(plan.pieces) == 2 and len(plan.moved) == 4


def test_memory_a_tensor_keeps_is_not_shared() -> None:
    """An intermediate the function stores somewhere (here in a list) lives on after the
    call: the planner leaves its memory alone, and it keeps its value after later calls."""
    layers = make_layers()[:4]
    kept: list[Tensor] = []

    def forward(x: Tensor) -> Tensor:
        for k, (weight, bias) in enumerate(layers):
            x = (x @ weight + bias).relu().realize()
            if k == 0:
                kept.append(x)
        return x

    jit = TinyJit(forward)
    for _ in range(3):
        jit(Tensor(np.ones((BATCH, WIDTH), dtype=np.float32)))
    assert jit.captured is not None
    assert len(kept) == 2  # the eager call's and the capture's: a replay runs no Python
    stored = kept[1]
    memory = buffer_of(stored).allocation
    users = {k for k, launch in enumerate(jit.captured.launches)
             for buffer in launch.buffers if buffer.allocation is memory}
    assert users == {0, 1}  # its own memory: no later activation overwrote it
    np.testing.assert_array_equal(stored.numpy(), kept[0].numpy())


def test_memory_read_before_it_is_written_keeps_its_contents() -> None:
    """A tensor made inside the function holds data copied in at the capture (no launch
    writes it), and an in-place assign reads it before it writes it: its memory is no
    intermediate, and the replays give what they give without the planner."""
    def accumulate(x: Tensor) -> Tensor:
        total = Tensor(np.arange(16, dtype=np.float32)).realize()
        step = (x + 1).realize()
        total.assign(total * 2 + step).realize()
        return (total + x).realize()

    outputs = []
    for planner in (0, 1):
        jit = TinyJit(accumulate)
        with Context(MEMORY_PLANNER=planner):
            outputs.append([jit(Tensor(np.ones(16, dtype=np.float32))).numpy()
                            for _ in range(4)])
    for planned, unplanned in zip(outputs[1], outputs[0]):
        np.testing.assert_array_equal(planned, unplanned)
    assert jit.captured is not None and jit.captured.memory_plan is not None
    assert len(jit.captured.memory_plan.moved) == 1  # `step` only


def train(jit: bool, planner: int, steps: int = 6) -> tuple[list[float], list[np.ndarray]]:
    """An MLP trained with Adam (optimizer states written with assign)."""
    rng = np.random.default_rng(0)
    shapes = [(32, 16), (32,), (32, 32), (32,), (10, 32), (10,)]
    params = [Tensor(rng.uniform(-0.3, 0.3, shape).astype(np.float32)).realize()
              for shape in shapes]
    optimizer = nn.optim.Adam(params, lr=0.01)
    batches = [(rng.random((8, 16), dtype=np.float32), rng.integers(0, 10, 8).astype(np.int32))
               for _ in range(3)]

    def step(x: Tensor, y: Tensor) -> Tensor:
        optimizer.zero_grad()
        hidden = x
        for k in range(0, len(params) - 2, 2):
            hidden = (hidden @ params[k].T + params[k + 1]).relu()
        loss = (hidden @ params[-2].T + params[-1]).sparse_categorical_crossentropy(y)
        loss.backward()
        Tensor.realize(loss, *optimizer.schedule_step())
        return loss

    run = TinyJit(step) if jit else step
    losses = []
    with Context(MEMORY_PLANNER=planner), Tensor.train():
        for k in range(steps):
            x, y = batches[k % len(batches)]
            losses.append(run(Tensor(x), Tensor(y)).item())
    if jit:
        assert isinstance(run, TinyJit) and run.captured is not None
        plan = run.captured.memory_plan
        assert (plan is not None) == bool(planner)
        if plan is not None:
            assert plan.moved and plan.bytes_after < plan.bytes_before
    return losses, [p.numpy() for p in params]


def test_training_step_with_an_optimizer_gives_the_eager_losses() -> None:
    eager_losses, eager_params = train(jit=False, planner=1)
    planned_losses, planned_params = train(jit=True, planner=1)
    unplanned_losses, unplanned_params = train(jit=True, planner=0)
    assert planned_losses == unplanned_losses
    np.testing.assert_allclose(planned_losses, eager_losses, rtol=1e-6)
    for a, b, c in zip(planned_params, unplanned_params, eager_params):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-7)
    assert planned_losses[3] < planned_losses[0]  # it trains (the same batch, later)


@pytest.mark.parametrize("device", test_devices())
def test_planned_replays_on_every_device(device: str) -> None:
    """A small chain whose intermediates are float32 and int32 (of the same bytes) in turn:
    on every device the planned replays give the unplanned ones' bits; where memory is typed
    (WebGPU), a piece of shared memory holds one dtype only."""
    rng = np.random.default_rng(4)
    weights = [Tensor(rng.standard_normal((16, 16)).astype(np.float32) / 4, device=device)
               .realize() for _ in range(4)]

    def forward(x: Tensor) -> Tensor:
        for weight in weights:
            x = (x @ weight).relu().realize()
            x = (x * 64).cast(dtypes.int32).realize()  # an int32 intermediate
            x = (x.cast(dtypes.float32) / 64).realize()
        return x

    inputs = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(4)]
    outputs = []
    for planner in (0, 1):
        jit = TinyJit(forward)
        with Context(MEMORY_PLANNER=planner):
            outputs.append([jit(Tensor(data, device=device)).numpy() for data in inputs])
    for planned, unplanned, data in zip(outputs[1], outputs[0], inputs):
        np.testing.assert_array_equal(planned, unplanned)
        np.testing.assert_array_equal(planned, forward(Tensor(data, device=device)).numpy())
    assert jit.captured is not None and jit.captured.memory_plan is not None
    plan = jit.captured.memory_plan
    assert len(plan.moved) == 3 * len(weights) - 1 and len(plan.pieces) < len(plan.moved)
    typed = not Device[device].allocator.holds_bytes
    for piece in plan.pieces:
        assert (piece.dtype is not None) == typed
        if typed:
            assert {tenant.dtype for tenant in piece.tenants} == {piece.dtype}
    mixed = any(len({tenant.dtype for tenant in piece.tenants}) > 1 for piece in plan.pieces)
    assert mixed != typed  # bytes are bytes: a float32 and an int32 buffer share


def test_buffers_on_two_devices_never_share() -> None:
    """A chain that goes CPU -> CPU:1 -> CPU: intermediates on each device share only with
    intermediates on the same device."""
    rng = np.random.default_rng(3)
    weights = [Tensor(rng.standard_normal((32, 32)).astype(np.float32) / 6,
                      device=device).realize() for device in ["CPU", "CPU", "CPU:1", "CPU:1"]]

    def forward(x: Tensor) -> Tensor:
        for weight in weights:
            x = (x.to(weight.device) @ weight).relu().realize()
        return x.to("CPU").realize()

    jit = TinyJit(forward)
    for _ in range(4):
        data = rng.standard_normal((8, 32)).astype(np.float32)
        np.testing.assert_array_equal(jit(Tensor(data)).numpy(), forward(Tensor(data)).numpy())
    assert jit.captured is not None and jit.captured.memory_plan is not None
    for piece in jit.captured.memory_plan.pieces:
        assert {tenant.device for tenant in piece.tenants} == {piece.device}
    for launch in jit.captured.launches:
        for buffer in launch.buffers:
            assert buffer.allocation.device == buffer.device
    assert {p.device for p in jit.captured.memory_plan.pieces} == {"CPU", "CPU:1"}


def test_a_sharded_result_keeps_its_shards() -> None:
    """A function that shards its input over CPU and CPU:1 and returns a sharded tensor: each
    shard of the result keeps its memory, and the replays equal the unplanned ones."""
    weight = Tensor(np.eye(8, dtype=np.float32) * 2).shard(("CPU", "CPU:1")).realize()

    def forward(x: Tensor) -> Tensor:
        return ((x.shard(("CPU", "CPU:1"), axis=0) @ weight).relu() + 1).realize()

    outputs = []
    for planner in (0, 1):
        jit = TinyJit(forward)
        with Context(MEMORY_PLANNER=planner):
            outputs.append([jit(Tensor(np.full((4, 8), k - 1.5, dtype=np.float32))).numpy()
                            for k in range(4)])
    for k, (planned, unplanned) in enumerate(zip(outputs[1], outputs[0])):
        np.testing.assert_array_equal(planned, unplanned)
        np.testing.assert_array_equal(planned, np.full((4, 8), max(2 * (k - 1.5), 0) + 1))
    assert jit.captured is not None and jit.captured.memory_plan is not None
    result = jit.captured.outputs()
    shard_memory = {id(buffer_of(Tensor(shard)).allocation) for shard in result.uop.shards}
    written = {id(launch.buffers[0].allocation) for launch in jit.captured.launches}
    assert len(shard_memory) == 2 and shard_memory <= written  # the launches write into them
