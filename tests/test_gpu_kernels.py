"""GPU kernels on every GPU language (issue 14, second part): the group reduction and the local
matmul tile rendered for OpenCL C, CUDA C and WGSL, run on OPENCL (pocl), WEBGPU (lavapipe) and
the PYTHON emulator against NUMPY, compiled to PTX for CUDA; and the heuristic's choices."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from helpers import fuzz_budget  # noqa: E402
from test_backends import gpu_device  # noqa: E402

import tinyteach.opt.heuristic as heuristic  # noqa: E402
from tinyteach import Context, Tensor, clear_caches  # noqa: E402
from tinyteach.codegen.lower import lower  # noqa: E402
from tinyteach.codegen.plan import KernelOptions, can_group_reduce, local_tile_plan
from tinyteach.device import Device, DeviceUnavailable  # noqa: E402
from tinyteach.engine.realize import record_launches  # noqa: E402
from tinyteach.engine.schedule import create_schedule  # noqa: E402
from tinyteach.opt import search as search_module  # noqa: E402
from tinyteach.opt.heuristic import LOCAL_TILE, choose_options, options_for_renderer
from tinyteach.render.cuda import CUDARenderer  # noqa: E402
from tinyteach.render.gpu import launch_of  # noqa: E402
from tinyteach.render.opencl import OpenCLRenderer  # noqa: E402
from tinyteach.render.wgsl import WGSLRenderer  # noqa: E402
from tinyteach.runtime.python import emulate, record_threads  # noqa: E402

DEVICES = [gpu_device("OPENCL"), gpu_device("WEBGPU"), "PYTHON"]
RENDERERS = {"OPENCL": OpenCLRenderer, "CUDA": CUDARenderer, "WEBGPU": WGSLRenderer}


def floats(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def last_kernel(tensor: Tensor):
    items, _ = create_schedule([tensor.uop], "CPU")
    return [item for item in items if item.kind == "kernel"][-1]


@pytest.fixture
def forced_options(monkeypatch):
    """The engine lowers every kernel of a GPU device with the options `choose(ast)` returns
    (the CPU, with no work-groups, keeps its own)."""
    heuristic = search_module.heuristic_options

    def force(choose) -> None:
        clear_caches()  # programs compiled under other options are not reused

        def options(backend, ast):
            if backend.capabilities.group_reduce:
                return choose(ast)
            return heuristic(backend, ast)
        monkeypatch.setattr(search_module, "heuristic_options", options)
    return force


# ---- what each language writes ----

SUM = (lambda a: a.sum(axis=1), (5, 77))
MATMUL = (lambda a, b: a @ b, (37, 29), (29, 19))


@pytest.mark.parametrize("language, words", [
    ("OPENCL", ["__local float local0[16];", "get_local_id(0)", "get_group_id(0)",
                "get_num_groups(0)", "barrier(CLK_LOCAL_MEM_FENCE);", "if (alu0) { data0[gidx0]"]),
    ("CUDA", ["__shared__ float local0[16];", "threadIdx.x", "blockIdx.x", "gridDim.x",
              "__syncthreads();"]),
    ("WEBGPU", ["var<workgroup> local0: array<f32, 16>;", "i32(lid.x)", "i32(wid.x)",
                "@builtin(local_invocation_id)", "workgroupBarrier();",
                "@workgroup_size(16, 1, 1)"]),
])
def test_group_reduction_source_in_each_language(language, words):
    item = last_kernel(SUM[0](Tensor(floats(*SUM[1]))))
    program = lower(item.ast, KernelOptions(group=16))
    source = RENDERERS[language]().render(item.name, program)
    for word in words:
        assert word in source, f"{word!r} missing from\n{source}"
    launch = launch_of(source)
    assert launch.local_size == program.local_size == (16, 1, 1)
    assert launch.groups == (5, 1, 1)  # one work-group per output row


def test_local_tile_launch_and_shared_memory():
    item = last_kernel(MATMUL[0](Tensor(floats(*MATMUL[1])), Tensor(floats(*MATMUL[2]))))
    program = lower(item.ast, KernelOptions(local_tile=8))
    assert program.local_size == (8, 8, 1)
    assert [d.arg for d in program.locals] == [(0, 64), (1, 64)]
    source = OpenCLRenderer().render(item.name, program)
    assert "get_local_id(1)" in source and source.count("barrier(") == 2
    # ceil(19 / 8) tiles of columns along dimension 0, ceil(37 / 8) of rows along dimension 1
    assert launch_of(source).groups == (3, 5, 1)


def test_wgsl_guarded_load_is_an_if_not_a_select():
    """select() evaluates both sides: a guarded load must not read an invalid index."""
    item = last_kernel(Tensor(floats(4, 33)).pad(((0, 0), (3, 5))).sum(axis=1))
    source = WGSLRenderer().render(item.name, lower(item.ast, KernelOptions(group=8)))
    loads = [line for line in source.splitlines() if "data1[" in line]
    assert loads and all(line.strip().startswith("var val") and " if (" in line
                         for line in loads)


def test_c_has_no_work_groups():
    from tinyteach.render.c import CRenderer
    item = last_kernel(SUM[0](Tensor(floats(*SUM[1]))))
    with pytest.raises(NotImplementedError, match="no work-groups"):
        CRenderer().render(item.name, lower(item.ast, KernelOptions(group=16)))


def test_a_group_bigger_than_every_gpu_allows_is_refused():
    item = last_kernel(MATMUL[0](Tensor(floats(*MATMUL[1])), Tensor(floats(*MATMUL[2]))))
    with pytest.raises(ValueError, match="more than every GPU allows"):
        OpenCLRenderer().render(item.name, lower(item.ast, KernelOptions(local_tile=32)))


# ---- the same numbers on every device ----

REDUCTIONS = {
    "sum": (lambda t: t.sum(axis=1), (6, 45)),
    "max_nan": (lambda t: t.max(axis=1), None),
    "fused_sqrt": (lambda t: (t * t + 1).sum(axis=1).sqrt(), (6, 45)),
    "padded": (lambda t: t.pad(((0, 0), (3, 5))).sum(axis=1), (4, 33)),
    "full": (lambda t: t.sum(), (3, 50)),
}


def _reduction_input(name: str) -> np.ndarray:
    if name == "max_nan":
        array = np.full((3, 40), -np.inf, dtype=np.float32)
        array[1, 37], array[2, 5] = np.nan, 7.0
        return array
    return floats(*REDUCTIONS[name][1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combine", ["tree", "serial"])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_group_reduction_matches_numpy(device, combine, name, forced_options):
    build = REDUCTIONS[name][0]
    array = _reduction_input(name)
    forced_options(lambda ast: KernelOptions(group=8, group_combine=combine)
                   if can_group_reduce(ast) else KernelOptions())
    with record_launches() as launches:
        got = build(Tensor(array, device=device)).numpy()
    assert launches[-1].runner.linear.options.group == 8
    expected = build(Tensor(array, device="NUMPY")).numpy()
    one_per_row = build(Tensor(array, device="CPU")).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)  # the op suite's tolerance
    np.testing.assert_allclose(got, one_per_row, rtol=1e-5, atol=1e-5)


MATMULS = {
    "square": (lambda a, b: a @ b, [(16, 16), (16, 16)]),
    "odd": (lambda a, b: a @ b, [(37, 29), (29, 19)]),
    "transposed_relu": (lambda a, b: (a @ b.T).relu(), [(9, 13), (11, 13)]),
    "batched": (lambda a, b: a @ b, [(3, 6, 10), (3, 10, 5)]),
    "bias": (lambda a, b, c: a @ b + c, [(10, 7), (7, 12), (12,)]),
}


@pytest.mark.one_case_on_opencl("name")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("name", sorted(MATMULS))
def test_local_tile_matmul_matches_numpy(device, size, name, forced_options):
    build, shapes = MATMULS[name]
    arrays = [floats(*shape, seed=k) for k, shape in enumerate(shapes)]
    forced_options(lambda ast: KernelOptions(local_tile=size) if local_tile_plan(ast)
                   else KernelOptions())
    with record_launches() as launches:
        got = build(*(Tensor(a, device=device) for a in arrays)).numpy()
    assert any(launch.runner.linear.options.local_tile == size for launch in launches)
    expected = build(*(Tensor(a, device="NUMPY") for a in arrays)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_local_tile_reads_each_element_once_per_tile():
    """The emulator's record: each thread copies one element of each operand per step, and
    every read of shared memory happens after the barrier that follows the copies."""
    a, b = floats(8, 8), floats(8, 8, seed=1)
    item = last_kernel(Tensor(a) @ Tensor(b))
    program = lower(item.ast, KernelOptions(local_tile=4))
    output = np.zeros(64, np.float32)
    trace = emulate(program, [output, a.reshape(-1), b.reshape(-1)], record=True)
    np.testing.assert_allclose(output.reshape(8, 8), a @ b, rtol=1e-5, atol=1e-5)
    global_reads = trace.accesses("read", "data1") + trace.accesses("read", "data2")
    assert sum(len(e.addresses) for e in global_reads) == 2 * 64 * 2  # 2 steps, 64 threads
    assert sum(len(e.addresses) for e in trace.accesses("read", "local0")) == 64 * 8
    writes = {e.phase for e in trace.accesses("write") if e.is_shared}
    reads = {e.phase for e in trace.accesses("read") if e.is_shared}
    assert not writes & reads  # a barrier always lies between a copy and its reads


def test_local_tile_without_its_first_barrier_races():
    from tinyteach.ir.uop import Ops
    from tinyteach.runtime.python import SharedMemoryRaceError
    item = last_kernel(Tensor(floats(8, 8)) @ Tensor(floats(8, 8, seed=1)))
    program = lower(item.ast, KernelOptions(local_tile=4))
    first = next(u for u in program.uops if u.op is Ops.BARRIER and u.src[0].op is Ops.RANGE)
    program.uops = [u for u in program.uops if u is not first]  # the STOREs keep it as a source
    with pytest.raises(SharedMemoryRaceError, match="race"):
        emulate(program, [np.zeros(64, np.float32), floats(64), floats(64, seed=1)])


# ---- the heuristic: where the renderer supports it, listed, off under NOOPT ----

def test_heuristic_chooses_local_tiles_for_matmul_only_where_supported():
    item = last_kernel(Tensor(floats(64, 48)) @ Tensor(floats(48, 32)))
    for device in ("PYTHON",):
        assert options_for_renderer(item.ast, Device[device].renderer).local_tile == LOCAL_TILE
    for renderer in (OpenCLRenderer(), CUDARenderer(), WGSLRenderer()):
        assert options_for_renderer(item.ast, renderer).local_tile == LOCAL_TILE
    assert options_for_renderer(item.ast, Device["CPU"].renderer).local_tile == 0
    small = last_kernel(Tensor(floats(4, 48)) @ Tensor(floats(48, 32)))
    assert choose_options(small.ast, 0, True, True).local_tile == 0  # the tile would be empty
    with Context(NOOPT=1):
        assert choose_options(item.ast, 0, True, True) == KernelOptions()


def test_local_tile_is_listed_and_checked():
    item = last_kernel(Tensor(floats(32, 32)) @ Tensor(floats(32, 32)))
    program = lower(item.ast, KernelOptions(local_tile=16))
    assert program.applied_opts[0].startswith("local tile: 16x16 threads per work-group")
    with pytest.raises(ValueError, match="power of two"):
        KernelOptions(local_tile=6)
    with pytest.raises(ValueError, match="does not combine"):
        KernelOptions(local_tile=8, group=8)
    not_matmul = last_kernel(Tensor(floats(6, 40)).sum(axis=1))
    assert local_tile_plan(not_matmul.ast) is None
    with pytest.raises(ValueError, match="matmul-like"):
        lower(not_matmul.ast, KernelOptions(local_tile=4))


def test_engine_uses_local_tiles_on_python_with_debug_3(forced_options, capsys):
    forced_options(lambda ast: options_for_renderer(ast, Device["PYTHON"].renderer))
    a, b = floats(20, 17), floats(17, 18, seed=1)
    with Context(DEBUG=3), record_threads() as traces:
        got = (Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON")).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-5)
    assert "local tile: 16x16 threads" in capsys.readouterr().out
    assert traces[-1].launch.local_size == (16, 16, 1) and traces[-1].barriers == 4


# ---- CUDA: every such kernel compiles to PTX (no GPU needed) ----

def _cuda_compiler():
    from tinyteach.runtime.cuda import CUDACompiler
    try:
        return CUDACompiler()
    except DeviceUnavailable as error:
        pytest.skip(str(error))


@pytest.mark.parametrize("options", [KernelOptions(group=16), KernelOptions(local_tile=16),
                                     KernelOptions(group=32, group_combine="serial")],
                         ids=["tree", "tile", "serial"])
def test_cuda_gpu_kernels_compile_to_ptx(options):
    compiler = _cuda_compiler()
    if options.local_tile:
        item = last_kernel((Tensor(floats(37, 29)) @ Tensor(floats(29, 19))).relu())
    else:
        item = last_kernel((Tensor(floats(5, 300)) * 2).max(axis=1))
    source = CUDARenderer().render(item.name, lower(item.ast, options))
    kernel = compiler.compile(source)
    assert f".entry {item.name}(" in kernel.ptx
    assert ".shared" in kernel.ptx and "bar.sync" in kernel.ptx
    spec = CUDARenderer().spec(item.name, lower(item.ast, options))
    assert spec.source == source and spec.local_size == launch_of(source).local_size


# ---- the fuzzer with every GPU option the heuristic has ----

@pytest.mark.parametrize("device", DEVICES)
def test_fuzzed_graphs_with_gpu_options_match_numpy(device, monkeypatch):
    """The differential fuzzer's graphs are small: with the thresholds lowered, most of their
    reductions become group reductions (a fixed-seed slice; its graphs have no matmuls, which
    the local-tile tests above cover)."""
    from fuzz_graphs import fuzz
    monkeypatch.setattr(heuristic, "GROUP_MIN_REDUCE", 2)
    monkeypatch.setattr(heuristic, "GROUP_THREADS", 4)
    monkeypatch.setattr(heuristic, "_chosen", {})
    monkeypatch.setattr(search_module, "heuristic_options",
                        lambda backend, ast: options_for_renderer(ast, backend.renderer))
    clear_caches()
    chosen: list[KernelOptions] = []
    choose = heuristic._choose

    def counting(*args):
        chosen.append(choose(*args))
        return chosen[-1]
    monkeypatch.setattr(heuristic, "_choose", counting)
    # 25 graphs, 10 on OPENCL (pocl builds each kernel in ~0.2 s); `make fuzz` runs more
    report = fuzz(fuzz_budget(10 if device.startswith("OPENCL") else 25), [device], seed=77)
    assert report.ok(), "\n\n".join(report.failures[:3])
    assert sum(1 for options in chosen if options.group) >= 5
