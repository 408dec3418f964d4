"""The PYTHON device (a GPU emulator) and the group reduction: the same numbers as numpy and as
the serial reduction, and every check of the emulator fires on a kernel broken on purpose."""
from __future__ import annotations

import numpy as np
import pytest

from tinyteach import Context, Tensor, nn
from tinyteach.codegen.lower import LinearProgram, lower
from tinyteach.codegen.plan import KernelOptions
from tinyteach.device import Device
from tinyteach.dtype import dtypes
from tinyteach.engine.realize import record_launches
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.uop import Ops, UOp, toposort_of
from tinyteach.opt import search as search_module
from tinyteach.opt.heuristic import GROUP_THREADS, choose_options, options_for_renderer
from tinyteach.runtime.python import (
    BarrierDivergenceError,
    OutOfBoundsError,
    SharedMemoryRaceError,
    emulate,
    plan_group_launch,
    record_threads,
)


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def last_kernel(tensor: Tensor):
    items, _ = create_schedule([tensor.uop], "PYTHON")
    return [item for item in items if item.kind == "kernel"][-1]


def run_with(item, options: KernelOptions, **emulate_args):
    """Lower the kernel with `options`, emulate it on copies of its inputs; (output, trace)."""
    program = lower(item.ast, options)
    output = np.zeros(item.buffers[0].size, dtype=item.buffers[0].dtype.np)
    arrays = [output] + [b.numpy() for b in item.buffers[1:]]
    trace = emulate(program, arrays, **emulate_args)
    return output, trace


@pytest.fixture
def heuristic_reads_the_renderer(monkeypatch):
    """The engine asks search.heuristic_options for a kernel's options; make it ask the
    renderer's flags through opt/heuristic.py's options_for_renderer (until opt/search.py calls
    it itself)."""
    monkeypatch.setattr(search_module, "heuristic_options",
                        lambda backend, ast: options_for_renderer(ast, backend.renderer))


# ---- the group reduction gives the serial reduction's numbers ----

REDUCTIONS = {
    "sum": (lambda t, axis: t.sum(axis=axis), lambda a, axis: a.sum(axis=axis)),
    "max": (lambda t, axis: t.max(axis=axis), lambda a, axis: a.max(axis=axis)),
    "mean": (lambda t, axis: t.mean(axis=axis), lambda a, axis: a.mean(axis=axis)),
}
SHAPES = [((5, 77), 1), ((3, 33), 1), ((64,), 0), ((7, 16), 1), ((2, 3, 50), 2), ((40, 6), 0)]


@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("shape, axis", SHAPES)
@pytest.mark.parametrize("combine", ["tree", "serial"])
@pytest.mark.parametrize("threads", [2, 16, 32])
def test_group_reduction_matches_numpy(name, shape, axis, combine, threads):
    ours, numpys = REDUCTIONS[name]
    array = data(*shape)
    item = last_kernel(ours(Tensor(array, device="PYTHON"), axis))
    output, _ = run_with(item, KernelOptions(group=threads, group_combine=combine))
    serial, _ = run_with(item, KernelOptions())
    np.testing.assert_allclose(output, numpys(array, axis).reshape(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(output, serial, rtol=1e-5, atol=1e-6)


KERNELS = {  # one kernel each: elementwise work before and after, padding, several axes
    "full": (lambda t: t.sum(), (3, 50)),
    "two_axes": (lambda t: t.sum(axis=(0, 2)), (3, 4, 37)),
    "leading_axes": (lambda t: t.max(axis=(0, 1)), (5, 9, 3)),
    "fused": (lambda t: (t * t + 1).sum(axis=1).sqrt(), (6, 45)),
    "padded": (lambda t: t.pad(((0, 0), (3, 5))).sum(axis=1), (4, 33)),
    "flip_shrink": (lambda t: t.flip(1)[:, 2:40].max(axis=1), (3, 50)),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("combine", ["tree", "serial"])
def test_group_reduction_of_fused_and_multi_axis_kernels(name, combine):
    build, shape = KERNELS[name]
    array = data(*shape)
    expected = build(Tensor(array, device="NUMPY")).numpy().reshape(-1)
    item = last_kernel(build(Tensor(array, device="PYTHON")))
    for threads in (4, 64):
        output, _ = run_with(item, KernelOptions(group=threads, group_combine=combine))
        np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-5)


def test_group_reduction_of_ints_is_exact():
    array = np.random.default_rng(1).integers(-1000, 1000, size=(3, 45)).astype(np.int32)
    item = last_kernel(Tensor(array, device="PYTHON").sum(axis=1))
    output, _ = run_with(item, KernelOptions(group=8))
    np.testing.assert_array_equal(output, array.sum(axis=1))


def test_group_max_keeps_nan_and_minus_infinity():
    array = np.full((2, 40), -np.inf, dtype=np.float32)
    array[1, 37] = np.nan
    item = last_kernel(Tensor(array, device="PYTHON").max(axis=1))
    output, _ = run_with(item, KernelOptions(group=16))
    np.testing.assert_array_equal(output, array.max(axis=1))


def test_one_group_at_a_time_gives_the_same_result():
    item = last_kernel(Tensor(data(9, 70), device="PYTHON").sum(axis=1))
    together, _ = run_with(item, KernelOptions(group=16))
    one_by_one, _ = run_with(item, KernelOptions(group=16), groups_at_once=1)
    np.testing.assert_array_equal(together, one_by_one)


def test_group_program_has_shared_memory_and_barriers():
    item = last_kernel(Tensor(data(4, 64), device="PYTHON").sum(axis=1))
    tree = lower(item.ast, KernelOptions(group=16))
    ops = [u.op for u in tree.uops]
    assert ops.count(Ops.DEFINE_LOCAL) == 1 and ops.count(Ops.SPECIAL) == 1
    # after the partial sums, one per halving, and one after all threads read the result
    assert ops.count(Ops.BARRIER) == 1 + 4 + 1
    assert tree.local_size == (16, 1, 1) and tree.locals[0].arg == (0, 16)
    serial = lower(item.ast, KernelOptions(group=16, group_combine="serial"))
    assert [u.op for u in serial.uops].count(Ops.BARRIER) == 2
    launch = plan_group_launch(tree)
    assert launch.groups == (4, 1, 1) and launch.local_size == (16, 1, 1)


def test_group_options_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        KernelOptions(group=12)
    with pytest.raises(ValueError, match="group_combine"):
        KernelOptions(group=16, group_combine="butterfly")
    with pytest.raises(ValueError, match="upcasts"):
        KernelOptions(upcasts=((0, 4),), group=16)
    rows, columns = Tensor(data(4, 64), device="PYTHON"), Tensor(data(64, 4), device="PYTHON")
    item = last_kernel(rows.sum(axis=1) + columns.max(axis=0))
    with pytest.raises(ValueError, match="the same axes of the same shape"):
        lower(item.ast, KernelOptions(group=16))


def test_two_reductions_over_the_same_rows_are_two_group_reductions():
    """A chain over the same rows (codegen/lower.py): one round of shared memory per reduction."""
    array = data(4, 64)
    x = Tensor(array, device="PYTHON")
    item = last_kernel(x.sum(axis=1) + x.max(axis=1))
    output, _ = run_with(item, KernelOptions(group=16))
    np.testing.assert_allclose(output, array.sum(axis=1) + array.max(axis=1), rtol=1e-5)
    assert len(lower(item.ast, KernelOptions(group=16)).locals) == 2


# ---- the heuristic: only where the renderer supports it, never under NOOPT ----

def test_heuristic_groups_long_reductions_only_where_supported():
    item = last_kernel(Tensor(data(8, 256), device="PYTHON").sum(axis=1))
    assert choose_options(item.ast, 0, group_reduce=True).group == GROUP_THREADS
    assert choose_options(item.ast, 0).group == 0
    assert options_for_renderer(item.ast, Device["PYTHON"].renderer).group == GROUP_THREADS
    assert options_for_renderer(item.ast, Device["CPU"].renderer).group == 0
    short = last_kernel(Tensor(data(8, 8), device="PYTHON").sum(axis=1))
    assert choose_options(short.ast, 0, group_reduce=True).group == 0
    with Context(NOOPT=1):
        assert choose_options(item.ast, 0, group_reduce=True) == KernelOptions()


def test_engine_uses_the_group_reduction_on_python(heuristic_reads_the_renderer, capsys):
    array = data(6, 100)
    with Context(DEBUG=3), record_launches() as launches:
        result = Tensor(array, device="PYTHON").sum(axis=1).numpy()
    np.testing.assert_allclose(result, array.sum(axis=1), rtol=1e-5)
    assert launches[-1].runner.linear.options.group == GROUP_THREADS
    assert "group reduce: 16 threads of a work-group" in capsys.readouterr().out


def test_noopt_keeps_one_thread_per_output(heuristic_reads_the_renderer):
    with Context(NOOPT=1), record_launches() as launches:  # (a shape no other test compiles)
        Tensor(data(5, 99), device="PYTHON").sum(axis=1).numpy()
    assert launches[-1].runner.linear.options == KernelOptions()


def test_a_few_training_steps_match_numpy(heuristic_reads_the_renderer):
    def losses(device: str) -> list[float]:
        rng = np.random.default_rng(0)
        images = rng.normal(size=(8, 40)).astype(np.float32)
        labels = rng.integers(0, 3, size=8)
        first, second = nn.Linear(40, 32), nn.Linear(32, 3)
        for layer, seed in ((first, 1), (second, 2)):
            weights = np.random.default_rng(seed).normal(size=layer.weight.shape) * 0.1
            layer.weight = Tensor(weights.astype(np.float32), device=device)
            layer.bias = Tensor(np.zeros(layer.bias.shape, np.float32), device=device)
        parameters = [first.weight, first.bias, second.weight, second.bias]
        optimizer = nn.optim.SGD(parameters, lr=0.1)
        x, y = Tensor(images, device=device), Tensor(labels, device=device)
        result = []
        with Tensor.train():
            for _ in range(3):
                optimizer.zero_grad()
                loss = second(first(x).relu()).sparse_categorical_crossentropy(y)
                loss.backward()
                optimizer.step()
                result.append(loss.item())
        return result
    np.testing.assert_allclose(losses("PYTHON"), losses("NUMPY"), rtol=1e-5)


def test_fuzzed_graphs_with_group_reductions_match_numpy(heuristic_reads_the_renderer,
                                                        monkeypatch):
    """The differential fuzzer's graphs are small: with the heuristic's thresholds lowered,
    most of their reductions become group reductions (a fixed-seed slice)."""
    from fuzz_graphs import fuzz

    import tinyteach.opt.heuristic as heuristic
    monkeypatch.setattr(heuristic, "GROUP_MIN_REDUCE", 2)
    monkeypatch.setattr(heuristic, "GROUP_THREADS", 4)
    monkeypatch.setattr(heuristic, "_chosen", {})
    chosen: list[KernelOptions] = []
    choose = heuristic._choose

    def counting(*args):
        chosen.append(choose(*args))
        return chosen[-1]
    monkeypatch.setattr(heuristic, "_choose", counting)
    report = fuzz(40, ["PYTHON"], seed=4242)
    assert report.ok(), "\n\n".join(report.failures[:3])
    assert sum(1 for options in chosen if options.group) >= 10


# ---- the checks fire on kernels broken on purpose ----

def _global(number: int, size: int) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (number, size))


def _program(stores: list[UOp], loop: UOp | None, sizes: tuple[int, ...]) -> LinearProgram:
    """A hand-made linear program: every node the stores need, sources first, then the
    loop's end (nodes after the RANGE run inside it)."""
    uops = toposort_of(stores)
    if loop is not None:
        uops.append(UOp(Ops.END_RANGE, dtypes.bool, (loop,)))
    return LinearProgram(uops, sizes)


def _copy_program(size: int, offset: int) -> LinearProgram:
    """data0[i] = data1[i + offset] for i < size: out of bounds when offset > 0."""
    out, source = _global(0, size), _global(1, size)
    loop = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, size))
    load = UOp(Ops.LOAD, dtypes.float32, (source, loop + offset))
    return _program([UOp(Ops.STORE, dtypes.float32, (out, loop, load))], loop, (size,))


def test_an_out_of_bounds_load_names_the_thread_and_the_address():
    arrays = [np.zeros(6, np.float32), np.arange(6, dtype=np.float32)]
    emulate(_copy_program(6, 0), arrays)
    np.testing.assert_array_equal(arrays[0], arrays[1])
    with pytest.raises(OutOfBoundsError, match=r"thread \(5, 0, 0\) of work-group \(0, 0, 0\) "
                                               r"reads data1\[6\], but data1 has 6 elements"):
        emulate(_copy_program(6, 1), arrays)


def test_an_out_of_bounds_store_is_caught():
    out, loop = _global(0, 4), UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 4))
    store = UOp(Ops.STORE, dtypes.float32, (out, loop * 2, UOp.const(dtypes.float32, 1.0)))
    program = _program([store], loop, (4,))
    with pytest.raises(OutOfBoundsError, match=r"thread \(2, 0, 0\).*writes data0\[4\]"):
        emulate(program, [np.zeros(4, np.float32)])


def test_a_barrier_that_some_threads_skip_is_divergence():
    """Six outputs run on a group of 8 threads: threads 6 and 7 never enter the loop, so a
    barrier inside it waits for them forever."""
    out, source = _global(0, 6), _global(1, 6)
    shared = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (0, 8))
    loop = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 6))
    load = UOp(Ops.LOAD, dtypes.float32, (source, loop))
    publish = UOp(Ops.STORE, dtypes.float32, (shared, loop, load))
    barrier = UOp(Ops.BARRIER, dtypes.bool, (publish,))
    back = UOp(Ops.LOAD, dtypes.float32, (shared, loop, barrier))
    program = _program([UOp(Ops.STORE, dtypes.float32, (out, loop, back))], loop, (6,))
    arrays = [np.zeros(6, np.float32), np.arange(6, dtype=np.float32)]
    with pytest.raises(BarrierDivergenceError, match=r"work-group \(0, 0, 0\), 6 threads wait "
                                                     r".* 2 never reach it, e.g. thread \(6"):
        emulate(program, arrays)


def test_a_tree_without_its_barriers_races():
    item = last_kernel(Tensor(data(2, 64), device="PYTHON").sum(axis=1))
    program = lower(item.ast, KernelOptions(group=16))
    broken = LinearProgram([u for u in program.uops if u.op is not Ops.BARRIER],
                           program.global_sizes, program.accumulators, program.options)
    arrays = [np.zeros(2, np.float32), item.buffers[1].numpy()]
    with pytest.raises(SharedMemoryRaceError,
                       match=r"thread \(0, 0, 0\) of work-group \(0, 0, 0\) reads local0\[8\], "
                             r"which thread \(8, 0, 0\) wrote since the last barrier"):
        emulate(broken, arrays)


def test_two_threads_writing_one_shared_element_race():
    shared = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (0, 4))
    lidx = UOp(Ops.SPECIAL, dtypes.int32, (), ("l", 0, 4))
    store = UOp(Ops.STORE, dtypes.float32,
                (shared, UOp.const(dtypes.int32, 0), lidx.cast(dtypes.float32)))
    program = _program([store], None, ())
    with pytest.raises(SharedMemoryRaceError, match=r"writes local0\[0\], which thread "
                                                    r"\(3, 0, 0\) wrote"):
        emulate(program, [])


def test_reading_after_a_barrier_is_not_a_race():
    item = last_kernel(Tensor(data(2, 64), device="PYTHON").sum(axis=1))
    output, trace = run_with(item, KernelOptions(group=16), record=True)
    np.testing.assert_allclose(output, item.buffers[1].numpy().reshape(2, 64).sum(axis=1),
                               rtol=1e-5)
    assert trace.barriers == 6


@pytest.mark.parametrize("combine", ["tree", "serial"])
def test_a_group_with_several_outputs_waits_before_reusing_shared_memory(combine):
    """A 4-d output: three axes are group dimensions, the fourth a loop every group runs, so
    each group computes several outputs one after another in the same shared memory. Without
    the barrier after the result is read, the next output's partial sums overwrite it while
    other threads may still read it."""
    array = data(2, 2, 2, 3, 40)
    item = last_kernel(Tensor(array, device="PYTHON").sum(axis=4))
    output, trace = run_with(item, KernelOptions(group=16, group_combine=combine))
    np.testing.assert_allclose(output, array.sum(axis=4).reshape(-1), rtol=1e-5)
    assert trace.launch.groups == (3, 2, 2)  # the outermost axis is a loop in each group
    program = lower(item.ast, KernelOptions(group=16, group_combine=combine))
    last_barrier = [u for u in program.uops if u.op is Ops.BARRIER][-1]
    broken = LinearProgram([u for u in program.uops if u is not last_barrier],
                           program.global_sizes, program.accumulators, program.options)
    arrays = [np.zeros(item.buffers[0].size, np.float32), item.buffers[1].numpy()]
    with pytest.raises(SharedMemoryRaceError, match="writes local0"):
        emulate(broken, arrays)


# ---- the record of every thread's reads and writes ----

def test_the_record_holds_every_threads_addresses():
    rows, columns, threads = 3, 40, 16
    item = last_kernel(Tensor(data(rows, columns), device="PYTHON").sum(axis=1))
    _, trace = run_with(item, KernelOptions(group=threads), record=True)
    reads = trace.accesses("read", "data1")
    seen = {(int(g[0]), int(t[0]), int(a)) for e in reads
            for g, t, a in zip(e.groups, e.threads, e.addresses)}
    expected = {(row, thread, row * columns + step * threads + thread)
                for row in range(rows) for thread in range(threads) for step in range(3)
                if step * threads + thread < columns}
    assert seen == expected  # each element once, by thread (element % 16) of its row's group
    writes = trace.accesses("write", "data0")
    assert [(int(g[0]), int(t[0]), int(a)) for e in writes
            for g, t, a in zip(e.groups, e.threads, e.addresses)] == [(0, 0, 0), (1, 0, 1),
                                                                        (2, 0, 2)]
    assert trace.shared_bytes == threads * 4 and trace.launch.groups == (rows, 1, 1)


def test_record_threads_collects_each_launch():
    array = data(4, 8)
    with record_threads() as traces:
        result = (Tensor(array, device="PYTHON") * 2).numpy()
    np.testing.assert_allclose(result, array * 2)
    (trace,) = traces
    written = sorted(int(a) for e in trace.accesses("write") for a in e.addresses)
    assert written == list(range(32))


def test_grid_stride_threads_match_the_gpu_launch():
    """An elementwise kernel: each output element is written once, by the thread the GPU
    renderers' launch gives it."""
    program = _copy_program(300, 0)
    launch = plan_group_launch(program)
    assert launch.local_size == (256, 1, 1) and launch.groups == (2, 1, 1)
    arrays = [np.zeros(300, np.float32), np.arange(300, dtype=np.float32)]
    trace = emulate(program, arrays, record=True)
    (write,) = trace.accesses("write")
    global_ids = write.groups[:, 0] * 256 + write.threads[:, 0]
    np.testing.assert_array_equal(global_ids, write.addresses)
