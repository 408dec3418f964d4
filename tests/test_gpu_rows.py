"""Issue 14 + 16: a fused row chain (softmax, layernorm) on GPU devices, one work-group per row.

On OPENCL, WEBGPU and PYTHON (and CUDA, compiled here with NVRTC) the scheduler fuses a chain of
reductions over the same rows into one kernel when the row fits a work-group (plan.MAX_GROUP_ROW
elements: 64 threads x 32 columns each). The kernel's threads split the row: each reduction of
the chain is a group reduction (partials in shared memory, barriers, a tree), and after the last
barrier every thread stores its columns. Values and gradients are checked against PyTorch (NaN
and inf rows, rows of one element, rows that are not a multiple of the group), the emulator
checks the kernels for races, and the structure is counted in the linear program and the
OpenCL source."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import test_devices

from tinyteach import GlobalCounters, Tensor
from tinyteach.codegen.lower import LinearProgram, lower
from tinyteach.codegen.plan import MAX_GROUP_ROW, ROW_GROUP_THREADS, KernelOptions, row_kernel_axis
from tinyteach.device import Device, DeviceUnavailable
from tinyteach.engine.schedule import ScheduleItem, create_schedule
from tinyteach.helpers import Context
from tinyteach.ir.uop import Ops
from tinyteach.opt.heuristic import options_for_renderer
from tinyteach.render.opencl import OpenCLRenderer
from tinyteach.runtime.python import SharedMemoryRaceError, emulate, record_threads

GPU_DEVICES = [d for d in test_devices() if d in ("OPENCL", "WEBGPU", "PYTHON")]


def torch_layernorm(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5)


OPS = {
    "softmax": (lambda x: x.softmax(-1), lambda x: torch.softmax(x, -1)),
    "log_softmax": (lambda x: x.log_softmax(-1), lambda x: torch.log_softmax(x, -1)),
    "layernorm": (lambda x: x.layernorm(-1, eps=1e-5), torch_layernorm),
}


def inputs(shape: tuple[int, ...], special: bool) -> np.ndarray:
    """Normal floats; with `special`, one row holds a NaN, one +inf, one is -inf everywhere and
    one holds a +inf and a -inf."""
    values = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 3
    if special:
        rows = values.reshape(-1, shape[-1])
        rows[0, 0] = np.nan
        rows[1 % len(rows), -1] = np.inf
        rows[2 % len(rows)] = -np.inf
        rows[3 % len(rows), :2] = [np.inf, -np.inf][: rows.shape[1]]
    return values


def schedule_of(tensor: Tensor) -> list[ScheduleItem]:
    items, _ = create_schedule([tensor.uop], tensor.device)
    return items


def kernel_count(build, device: str) -> int:
    GlobalCounters.reset()
    build().realize()
    return GlobalCounters.kernel_count


def gradient_of(name: str, x: Tensor, cotangent: np.ndarray) -> Tensor:
    (OPS[name][0](x) * Tensor(cotangent, device=x.device)).sum().backward()
    assert x.grad is not None
    return x.grad


# ---- kernel counts ----

@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("device", GPU_DEVICES)
def test_one_kernel_forward_and_backward_three_without_row_fusion(name, device):
    values = inputs((16, 64), special=False)
    x = Tensor(values, device=device).realize()
    assert kernel_count(lambda: OPS[name][0](x), device) == 1
    with Context(FUSE_ROWS=0):
        assert kernel_count(lambda: OPS[name][0](x), device) == 3
    leaf = Tensor(values, device=device, requires_grad=True)
    gradient = gradient_of(name, leaf, values * 0 + 0.5)
    assert kernel_count(lambda: gradient, device) == 1


def test_rows_longer_than_a_work_group_keep_three_kernels():
    x = Tensor(np.zeros((2, MAX_GROUP_ROW), np.float32), device="PYTHON").realize()
    assert len(schedule_of(x.softmax(-1))) == 1
    y = Tensor(np.zeros((2, MAX_GROUP_ROW + 1), np.float32), device="PYTHON").realize()
    assert len(schedule_of(y.softmax(-1))) == 3
    assert len(schedule_of(y.layernorm())) == 3


def test_without_optimizations_gpu_devices_keep_three_kernels():
    """NOOPT: no work-groups, so each output thread would redo its row's reductions."""
    x = Tensor(np.zeros((4, 32), np.float32), device="PYTHON").realize()
    with Context(NOOPT=1):
        assert len(schedule_of(x.softmax(-1))) == 3


# ---- values against PyTorch ----

@pytest.mark.one_case_on_opencl("shape")
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("shape", [(6, 33), (2, 3, 16), (5, 1), (17,), (3, 100), (2, 64)])
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("device", GPU_DEVICES)
def test_values_and_gradients_match_torch(device, name, shape, special):
    values = inputs(shape, special)
    cotangent = np.random.default_rng(2).uniform(0.5, 1.5, shape).astype(np.float32)
    x = Tensor(values, device=device, requires_grad=True)
    out = OPS[name][0](x)
    assert len(schedule_of(out)) == 1
    gradient = gradient_of(name, x, cotangent)
    expected_x = torch.tensor(values, requires_grad=True)
    expected = OPS[name][1](expected_x)
    (expected * torch.tensor(cotangent)).sum().backward()
    assert expected_x.grad is not None
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gradient.numpy(), expected_x.grad.numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("device", GPU_DEVICES)
def test_rows_above_the_limit_are_right_on_the_stored_path(device):
    values = inputs((2, MAX_GROUP_ROW + 3), special=False)
    got = Tensor(values, device=device).softmax(-1).numpy()
    np.testing.assert_allclose(got, torch.softmax(torch.tensor(values), -1), rtol=1e-4,
                               atol=1e-7)


# ---- the kernel: one work-group per row ----

def fused_program(name: str, shape: tuple[int, ...]) -> tuple[ScheduleItem, LinearProgram]:
    x = Tensor(inputs(shape, special=False), device="PYTHON").realize()
    (item,) = schedule_of(OPS[name][0](x))
    renderer = Device["PYTHON"].renderer
    return item, lower(item.ast, options_for_renderer(item.ast, renderer))


@pytest.mark.parametrize("name, reductions", [("softmax", 2), ("log_softmax", 2),
                                              ("layernorm", 2)])
def test_each_reduction_is_a_group_reduction_and_the_stores_come_after(name, reductions):
    _, program = fused_program(name, (8, 200))
    threads = ROW_GROUP_THREADS
    assert program.options.group == threads and program.local_size == (threads, 1, 1)
    assert len(program.locals) == reductions  # one round of shared memory per reduction
    tree_levels = threads.bit_length() - 1
    barriers = [i for i, u in enumerate(program.uops) if u.op is Ops.BARRIER]
    # per reduction: after the partials, after each level of the tree; then one before the stores
    assert len(barriers) == reductions * (tree_levels + 1) + 1
    columns = [i for i, u in enumerate(program.uops) if u.op is Ops.RANGE and u.arg[0] == "c"]
    stores = [i for i, u in enumerate(program.uops) if u.op is Ops.STORE
              and u.src[0].op is Ops.DEFINE_GLOBAL]
    assert len(columns) == 1 and barriers[-1] < columns[0] < stores[0]
    assert program.uops[columns[0]].arg[2] == -(-200 // threads)  # 4 columns per thread


def test_a_short_row_takes_a_smaller_group():
    _, program = fused_program("softmax", (4, 10))
    assert program.options.group == 16 and program.local_size == (16, 1, 1)


def test_the_opencl_source_has_one_group_per_row_and_every_thread_stores():
    x = Tensor(inputs((8, 200), special=False), device="PYTHON").realize()
    (item,) = schedule_of(x.softmax(-1))
    renderer = OpenCLRenderer()
    source = renderer.render("softmax", lower(item.ast, options_for_renderer(item.ast,
                                                                                renderer)))
    assert "get_group_id(0); gidx0 < 8; gidx0 += get_num_groups(0)" in source
    assert source.count("barrier(CLK_LOCAL_MEM_FENCE)") == 2 * 7 + 1
    tail = source[source.rindex("barrier(CLK_LOCAL_MEM_FENCE)"):]
    assert "for (int gidx1 = 0; gidx1 < 4; gidx1++)" in tail
    assert "lidx0<1" not in tail  # not thread 0 alone: each thread stores its columns
    assert "exp2" in tail and "data0[" in tail


def test_a_missing_barrier_is_a_race_the_emulator_names():
    item, program = fused_program("softmax", (2, 100))
    arrays = [np.zeros(item.buffers[0].size, np.float32), item.buffers[1].numpy()]
    emulate(program, [a.copy() for a in arrays])  # the kernel itself passes the checks
    barriers = [u for u in program.uops if u.op is Ops.BARRIER]
    for dropped in (barriers[0], barriers[len(barriers) // 2]):
        broken = LinearProgram([u for u in program.uops if u is not dropped],
                               program.global_sizes, program.accumulators, program.options)
        with pytest.raises(SharedMemoryRaceError):
            emulate(broken, [a.copy() for a in arrays])


def test_the_record_shows_each_phase_and_every_thread_writing_its_columns():
    values = inputs((3, 40), special=False)
    with record_threads() as traces:
        got = Tensor(values, device="PYTHON").softmax(-1).numpy()
    np.testing.assert_allclose(got, torch.softmax(torch.tensor(values), -1), rtol=1e-5,
                               atol=1e-7)
    (trace,) = traces
    writes = [e for e in trace.events if e.kind == "write" and e.buffer == "data0"]
    columns = np.concatenate([e.addresses for e in writes])
    assert sorted(columns.tolist()) == list(range(3 * 40))  # each output written once
    threads = {int(t) for e in writes for t in e.threads[:, 0]}
    assert threads == set(range(40))  # 64 threads for a row of 40: the first 40 store
    assert len({e.phase for e in writes}) == 1  # all after the last barrier
    assert trace.barriers == 2 * 7 + 1


def test_row_kernel_axis_needs_whole_rows_of_one_axis():
    x = Tensor(inputs((4, 6, 8), special=False), device="PYTHON").realize()
    (item,) = schedule_of(x.softmax(-1))
    assert row_kernel_axis(item.ast) == 2
    (plain,) = schedule_of(x.sum(-1))
    assert row_kernel_axis(plain.ast) is None  # its output is the rows' sums, not the rows


# ---- CUDA: the same kernels compile (NVRTC; nothing runs without a GPU) ----

def test_cuda_row_kernels_compile_for_sm90():
    from tinyteach.render.cuda import CUDARenderer
    from tinyteach.runtime.cuda import CUDACompiler
    try:
        compiler = CUDACompiler("sm_90")
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    renderer = CUDARenderer()
    values = inputs((6, 300), special=False)
    for name in OPS:
        x = Tensor(values, device="PYTHON", requires_grad=True)
        out = OPS[name][0](x)
        gradient = gradient_of(name, x, values * 0 + 0.5)
        for tensor in (out, gradient):
            (item,) = schedule_of(tensor)
            program = lower(item.ast, options_for_renderer(item.ast, renderer))
            assert program.options.group == ROW_GROUP_THREADS
            source = renderer.render(name, program)
            barriers = sum(u.op is Ops.BARRIER for u in program.uops)
            assert source.count("__syncthreads()") == barriers
            kernel = compiler.compile(source)
            assert kernel.ptx and "bar.sync" in kernel.ptx


# ---- other options a search may try on a row kernel ----

@pytest.mark.parametrize("options", [dict(group=16, group_combine="serial"), dict(group=4),
                                     dict(group=256), dict(group=128, group_combine="serial"),
                                     dict()])
@pytest.mark.parametrize("name", list(OPS))
def test_a_row_kernel_is_right_with_every_group_option(name, options):
    """opt/search.py's neighbours of the heuristic's choice: other group sizes, the serial combine
    (thread 0 then shares the result through shared memory), and no group at all (one thread
    per output, each redoing its row's reductions: slow, still right)."""
    values = inputs((3, 70), special=True)
    x = Tensor(values, device="PYTHON").realize()
    (item,) = schedule_of(OPS[name][0](x))
    output = np.zeros(item.buffers[0].size, np.float32)
    emulate(lower(item.ast, KernelOptions(**options)), [output, item.buffers[1].numpy()])
    expected = OPS[name][1](torch.tensor(values)).numpy().reshape(-1)
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", GPU_DEVICES)
def test_more_rows_than_groups_and_rows_along_three_group_dimensions(device):
    """More rows than a launch has groups (each group strides over the rows), and a 4-d input
    whose three row axes are the three group dimensions."""
    from tinyteach.render.gpu import MAX_GROUPS
    many = np.random.default_rng(3).standard_normal((MAX_GROUPS + 37, 5)).astype(np.float32)
    got = Tensor(many, device=device).log_softmax(-1).numpy()
    np.testing.assert_allclose(got, torch.log_softmax(torch.tensor(many), -1), rtol=1e-5,
                               atol=1e-5)
    blocks = np.random.default_rng(4).standard_normal((3, 5, 7, 9)).astype(np.float32)
    got = Tensor(blocks, device=device).layernorm(-1, eps=1e-5).numpy()
    np.testing.assert_allclose(got, torch_layernorm(torch.tensor(blocks)), rtol=1e-4, atol=1e-5)
