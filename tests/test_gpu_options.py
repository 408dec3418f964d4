"""The GPU optimizer's options of issue 14: a local tile's block of r x r outputs per thread
(`tile_upcast`), several rows per thread of a big elementwise kernel, why a tile needs no
padding, and BEAM on every GPU device (OPENCL and WEBGPU timed, PYTHON ranked by the
emulator's record, CUDA compiled: no GPU here). Every result is checked against numpy."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from test_backends import gpu_device  # noqa: E402

from tinyteach import Context, Tensor, clear_caches  # noqa: E402
from tinyteach.codegen.lower import lower  # noqa: E402
from tinyteach.codegen.plan import KernelOptions, tile_plan
from tinyteach.device import Device, DeviceUnavailable  # noqa: E402
from tinyteach.engine.realize import record_launches  # noqa: E402
from tinyteach.engine.schedule import create_schedule  # noqa: E402
from tinyteach.ir.uop import Ops  # noqa: E402
from tinyteach.opt import search as search_module  # noqa: E402
from tinyteach.opt.heuristic import (
    GPU_RESIDENT_THREADS,
    GPU_UPCAST,
    LOCAL_TILE,
    choose_options,
    gpu_elementwise_upcast,
    local_tile_fits,
    options_for_renderer,
)
from tinyteach.render.cuda import CUDARenderer  # noqa: E402
from tinyteach.render.opencl import OpenCLRenderer  # noqa: E402
from tinyteach.render.wgsl import WGSLRenderer  # noqa: E402
from tinyteach.runtime.python import emulate  # noqa: E402

DEVICES = [gpu_device("OPENCL"), gpu_device("WEBGPU"), "PYTHON"]


def floats(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def last_kernel(tensor: Tensor):
    items, _ = create_schedule([tensor.uop], "PYTHON")
    return [item for item in items if item.kind == "kernel"][-1]


@pytest.fixture
def forced_options(monkeypatch):
    """The engine lowers every kernel of a GPU device with `choose(ast)` (the CPU keeps its
    own); nothing compiled under other options is reused."""
    heuristic = search_module.heuristic_options

    def force(choose) -> None:
        clear_caches()

        def options(backend, ast):
            if backend.capabilities.group_reduce:
                return choose(ast)
            return heuristic(backend, ast)
        monkeypatch.setattr(search_module, "heuristic_options", options)
    yield force
    clear_caches()


# ---- a local tile with a block of r x r outputs per thread ----

MATMULS = {
    "odd": (lambda a, b: a @ b, [(37, 29), (29, 19)]),
    "k_one": (lambda a, b: a @ b, [(5, 1), (1, 7)]),
    "transposed_relu": (lambda a, b: (a @ b.T).relu(), [(9, 13), (11, 13)]),
    "batched": (lambda a, b: a @ b, [(2, 6, 10), (2, 10, 17)]),
    "bias": (lambda a, b, c: a @ b + c, [(40, 7), (7, 33), (33,)]),
}


@pytest.mark.one_case_on_opencl("name")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tile, block", [(4, 2), (4, 3), (8, 4)])
@pytest.mark.parametrize("name", sorted(MATMULS))
def test_tile_upcast_matches_numpy(device, tile, block, name, forced_options):
    build, shapes = MATMULS[name]
    arrays = [floats(*shape, seed=k) for k, shape in enumerate(shapes)]
    chosen = KernelOptions(local_tile=tile, tile_upcast=block)
    forced_options(lambda ast: chosen if tile_plan(ast) is not None else KernelOptions())
    with record_launches() as launches:
        got = build(*(Tensor(a, device=device) for a in arrays)).numpy()
    assert any(launch.runner.linear.options == chosen for launch in launches)
    wide = [a.astype(np.float64) for a in arrays]
    expected = build(*(Tensor(a, device="NUMPY") for a in wide)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", [gpu_device("WEBGPU"), "PYTHON"])
def test_half_matmul_takes_a_tile_upcast_through_its_float32_sum(device, forced_options):
    """A half matmul sums in float32 (REDUCE_AXIS(CAST(MUL))): plan.tile_plan sees through the
    cast, the tiles hold half values, and each product is widened as the kernel says."""
    a, b = floats(33, 20).astype(np.float16), floats(20, 35, seed=1).astype(np.float16)
    chosen = KernelOptions(local_tile=8, tile_upcast=2)
    forced_options(lambda ast: chosen if tile_plan(ast) is not None else KernelOptions())
    with record_launches() as launches:
        got = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy()
    assert any(launch.runner.linear.options == chosen for launch in launches)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=5e-3, atol=2e-2)


def _global_and_shared_reads(m: int, k: int, n: int, options: KernelOptions):
    a, b = floats(m, k), floats(k, n, seed=1)
    program = lower(last_kernel(Tensor(a) @ Tensor(b)).ast, options)
    output = np.zeros(m * n, np.float32)
    trace = emulate(program, [output, a.reshape(-1), b.reshape(-1)], record=True)
    np.testing.assert_allclose(output.reshape(m, n), a @ b, rtol=1e-4, atol=1e-4)
    threads = trace.launch.threads_per_group * trace.launch.group_count
    global_reads = sum(len(e.addresses) for e in trace.events
                       if e.kind == "read" and not e.is_shared)
    shared_reads = sum(len(e.addresses) for e in trace.events if e.kind == "read" and e.is_shared)
    return threads, global_reads, shared_reads


def test_a_block_of_outputs_per_thread_reads_less_per_output():
    """The emulator's record of a 32x32x32 matmul in 8x8 tiles: with a 2x2 block per thread
    a work-group covers 16x16 outputs, so 4x fewer threads each copy 2 elements of each
    operand per step (global reads per output halve), and each value read from shared memory
    serves 2 outputs (shared reads per output halve too)."""
    m = k = n = 32
    threads_1, global_1, shared_1 = _global_and_shared_reads(m, k, n, KernelOptions(local_tile=8))
    threads_2, global_2, shared_2 = _global_and_shared_reads(
        m, k, n, KernelOptions(local_tile=8, tile_upcast=2))
    steps = k // 8
    assert threads_1 == m * n and threads_2 == m * n // 4
    assert global_1 == threads_1 * steps * 2                 # 1 element of X and of Y per step
    assert global_2 == threads_2 * steps * 2 * 2             # 2 rows of X, 2 columns of Y
    assert shared_1 == m * n * k * 2                         # 2 reads per multiply-add
    assert shared_2 == threads_2 * k * (2 + 2)               # 4 reads per 4 multiply-adds
    assert global_2 * 2 == global_1 and shared_2 * 2 == shared_1


def test_the_inner_loop_of_a_tile_has_no_guard_on_any_size():
    """Why a local tile needs no PADTO: a size that is no multiple of the tile is guarded
    where the tile is copied in (2r loads per thread per step) and where it is stored, never in
    the loop over shared memory (T * r * r multiply-adds per step), which is the same program
    for 255 as for 256."""
    for size in (256, 255):
        item = last_kernel(Tensor(floats(size, size)) @ Tensor(floats(size, size, seed=1)))
        program = lower(item.ast, KernelOptions(local_tile=16, tile_upcast=2))
        uops = program.uops
        steps, inner = [u for u in uops if u.op is Ops.RANGE and u.arg[0] == "r"]
        assert steps.arg[2] == 16 and inner.arg[2] == 16  # 256 / 16 steps, 16 within each
        start = uops.index(inner)
        end = next(i for i, u in enumerate(uops) if u.op is Ops.END_RANGE and u.src[0] is inner)
        body = uops[start + 1:end]
        assert not [u for u in body if u.op in (Ops.WHERE, Ops.CMPLT)]
        assert sum(1 for u in body if u.op is Ops.MUL and u.dtype.kind == "float") == 4
        guarded = [u for u in uops if u.op is Ops.LOAD and len(u.src) > 2
                   and u.src[0].op is Ops.DEFINE_GLOBAL]
        assert len(guarded) == (0 if size == 256 else 4)


@pytest.mark.parametrize("renderer", [OpenCLRenderer, WGSLRenderer, CUDARenderer])
def test_heuristic_blocks_big_tiles_and_keeps_small_ones(renderer):
    big = last_kernel(Tensor(floats(128, 64)) @ Tensor(floats(64, 96)))
    middle = last_kernel(Tensor(floats(40, 48)) @ Tensor(floats(48, 33)))
    small = last_kernel(Tensor(floats(20, 17)) @ Tensor(floats(17, 18)))
    assert options_for_renderer(big.ast, renderer()) == \
        KernelOptions(local_tile=LOCAL_TILE, tile_upcast=4)
    assert options_for_renderer(middle.ast, renderer()) == \
        KernelOptions(local_tile=LOCAL_TILE, tile_upcast=2)
    assert options_for_renderer(small.ast, renderer()) == KernelOptions(local_tile=LOCAL_TILE)
    assert options_for_renderer(big.ast, Device["CPU"].renderer).tile_upcast == 1
    with Context(NOOPT=1):
        assert options_for_renderer(big.ast, renderer()) == KernelOptions()


def test_tile_upcast_is_listed_by_debug_3_and_checked(forced_options, capsys):
    forced_options(lambda ast: options_for_renderer(ast, Device["PYTHON"].renderer))
    a, b = floats(40, 17), floats(17, 36, seed=1)
    with Context(DEBUG=3):
        got = (Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON")).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    assert "a 2x2 block of outputs each (32x32 per group)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs local_tile"):
        KernelOptions(tile_upcast=2)
    with pytest.raises(ValueError, match="r >= 1"):
        KernelOptions(local_tile=8, tile_upcast=0)
    assert local_tile_fits(KernelOptions(local_tile=16, tile_upcast=8), 4)
    assert not local_tile_fits(KernelOptions(local_tile=16, tile_upcast=16), 4)


def test_viz_lists_the_block_of_outputs_of_a_launch(forced_options):
    from viz.kernel import kernel
    forced_options(lambda ast: options_for_renderer(ast, Device["PYTHON"].renderer))
    a, b = floats(64, 20), floats(20, 64, seed=1)
    with record_launches() as launches:
        got = (Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON")).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    shown = kernel(launches[-1]).text
    assert "optimizations: local tile: 16x16 threads per work-group, a 4x4 block of outputs " \
        "each (64x64 per group)" in shown


# ---- several outputs per thread of an elementwise GPU kernel ----

def test_big_elementwise_kernels_take_rows_per_thread_on_an_outer_axis():
    rows = GPU_UPCAST * GPU_RESIDENT_THREADS // 1024
    assert gpu_elementwise_upcast((rows, 1024)) == KernelOptions(((0, GPU_UPCAST),))
    assert gpu_elementwise_upcast((rows // 2, 1024)) == KernelOptions()  # it fills the GPU
    assert gpu_elementwise_upcast((rows * 1024,)) == KernelOptions()  # no outer axis
    item = last_kernel(Tensor.ones(rows, 1024).contiguous() * 2)
    assert choose_options(item.ast, 0, True, True) == KernelOptions(((0, GPU_UPCAST),))
    assert choose_options(item.ast, 0, False, False).upcasts != ((0, GPU_UPCAST),)
    with Context(NOOPT=1):
        assert choose_options(item.ast, 0, True, True) == KernelOptions()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("upcasts", [((0, 4),), ((0, 2), (1, 3))])
def test_elementwise_upcasts_match_numpy(device, upcasts, forced_options):
    x, y = floats(8, 33), floats(33, seed=1)
    forced_options(lambda ast: KernelOptions(upcasts) if tile_plan(ast) is None
                   and kernel_is_elementwise(ast) else KernelOptions())
    with record_launches() as launches:
        got = (Tensor(x, device=device) * Tensor(y, device=device) + 1).exp().numpy()
    assert any(launch.runner.linear.options.upcasts == upcasts for launch in launches)
    np.testing.assert_allclose(got, np.exp(x * y + 1), rtol=1e-5)


def kernel_is_elementwise(ast) -> bool:
    return not any(n.op is Ops.REDUCE_AXIS for n in ast.toposort)


# ---- the emulator's cost model (how BEAM ranks PYTHON candidates) ----

def test_emulator_cost_counts_sectors_wavefronts_and_barriers():
    """64 threads (2 warps) reading 64 consecutive floats touch 8 sectors of 32 bytes and
    write 8; all of them reading one element, 1 sector per warp."""
    x = floats(64)
    item = last_kernel(Tensor(x) + 1)
    program = lower(item.ast, KernelOptions())
    trace = emulate(program, [np.zeros(64, np.float32), x], record=True)
    assert trace.launch.local_size == (64, 1, 1)
    assert search_module.emulator_cost(trace, program) == 8 + 8
    broadcast = last_kernel(Tensor(x[:1]).expand(64) + 1)
    program = lower(broadcast.ast, KernelOptions())
    trace = emulate(program, [np.zeros(64, np.float32), x[:1]], record=True)
    assert search_module.emulator_cost(trace, program) == 2 + 8
    tiled = lower(last_kernel(Tensor(floats(8, 8)) @ Tensor(floats(8, 8))).ast,
                  KernelOptions(local_tile=8))
    trace = emulate(tiled, [np.zeros(64, np.float32), floats(64), floats(64)], record=True)
    barriers = 2  # one before and one after the copies of the only step
    # 2 warps (4 rows of 8 threads each): copies into 2 tiles, then 8 steps of 2 reads, each
    # one wavefront (4 or 8 distinct words, all in different banks)
    shared_wavefronts = 2 * 2 + 8 * 2 * 2
    # X: each warp reads 4 rows of 8 floats, 32 bytes each: 4 sectors; Y the same; stores 8
    assert search_module.emulator_cost(trace, tiled) == \
        (2 * 4 + 2 * 4) + 8 + 0.25 * shared_wavefronts + barriers * 2


# ---- BEAM on every GPU device ----

@pytest.fixture
def tiny_beam(tmp_path, monkeypatch):
    monkeypatch.setattr(search_module, "beam_cache_dir", lambda: tmp_path / "beam")
    monkeypatch.setattr(search_module, "MAX_ROUNDS", 1)
    monkeypatch.setattr(search_module, "REPEATS", 1)
    clear_caches()
    yield
    clear_caches()


@pytest.mark.parametrize("device", [gpu_device("OPENCL"), gpu_device("WEBGPU"), "PYTHON"])
def test_beam_searches_the_gpu_options_and_keeps_the_result(device, tiny_beam, capsys):
    a, b = floats(40, 24), floats(24, 36, seed=1)
    tried: list[KernelOptions] = []
    measure = search_module.BeamSearch._measure

    def recording(self, candidate):
        tried.append(candidate.options)
        return measure(self, candidate)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search_module.BeamSearch, "_measure", recording)
        with Context(BEAM=1, DEBUG=2), record_launches() as launches:
            got = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    assert tried[0] == KernelOptions(local_tile=LOCAL_TILE, tile_upcast=2)  # the heuristic
    kinds = {search_module._kind(options) for options in tried}
    assert {"local tile", "plain", "group"} <= kinds
    assert any(o.local_tile and o.tile_upcast != 2 for o in tried)
    chosen = [launch.runner.linear.options for launch in launches
              if launch.runner is not None and hasattr(launch.runner, "linear")][-1]
    assert chosen in tried
    out = capsys.readouterr().out
    assert "beam " in out
    assert ("not by wall time" in out) == (device == "PYTHON")


def test_gpu_neighbours_stay_valid_and_switch_kinds():
    item = last_kernel(Tensor(floats(64, 64)) @ Tensor(floats(64, 64)))
    space = search_module.gpu_space(item.ast, OpenCLRenderer())
    assert space is not None and space.local_tile and space.group and not space.tensor_core
    found = search_module.neighbours(KernelOptions(local_tile=8, tile_upcast=4), (64, 64),
                                     space=space)
    assert KernelOptions(local_tile=16, tile_upcast=4) in found
    assert KernelOptions(local_tile=8) in found and KernelOptions() in found
    assert all(not o.parallel and not o.vector_width for o in found)
    assert search_module.gpu_space(item.ast, Device["CPU"].renderer) is None
    rows = last_kernel(Tensor(floats(8, 100)).softmax(axis=1))
    row_space = search_module.gpu_space(rows.ast, OpenCLRenderer())
    assert row_space is not None and row_space.rows
    for options in search_module.neighbours(KernelOptions(group=64), (8, 100), space=row_space):
        assert options.group or options == KernelOptions()


def _cuda_compiler():
    from tinyteach.runtime.cuda import CUDACompiler
    try:
        return CUDACompiler("sm_90")
    except DeviceUnavailable as error:
        pytest.skip(str(error))


@pytest.mark.parametrize("name, build", [
    ("matmul", lambda: (Tensor(floats(40, 24)) @ Tensor(floats(24, 36, seed=1))).relu()),
    ("sum", lambda: Tensor(floats(6, 300)).sum(axis=1)),
    ("softmax", lambda: Tensor(floats(6, 100)).softmax(axis=1)),
    ("elementwise", lambda: Tensor(floats(16, 40)).exp() * 2),
])
def test_every_candidate_a_cuda_beam_may_try_compiles(name, build):
    """No GPU here to time them: every option a CUDA search could reach in two rounds is
    rendered and compiled by NVRTC for sm_90 (PTX and machine code)."""
    compiler = _cuda_compiler()
    item = last_kernel(build())
    renderer = CUDARenderer()
    candidates = search_module.search_space(item.ast, renderer)
    assert len(candidates) >= 3
    for options in candidates:
        kernel = compiler.compile(renderer.render(item.name, lower(item.ast, options)))
        assert f".entry {item.name}(" in kernel.ptx, options


# ---- the options fuzzer (tests/fuzz_gpu_options.py), a fixed-seed slice ----

@pytest.mark.parametrize("device", DEVICES)
def test_fuzzed_matmuls_with_drawn_gpu_options_match_numpy(device):
    from fuzz_gpu_options import fuzz
    report = fuzz(6, [device], seed=11, cuda=False)
    assert report.ok(), "\n\n".join(report.failures[:3])
    assert report.runs >= 4 and report.drew_blocks() >= 1, report.options


def test_fuzzed_matmuls_with_drawn_gpu_options_compile_for_cuda():
    from fuzz_gpu_options import cuda_compiler, fuzz
    if cuda_compiler() is None:
        pytest.skip("no CUDA compiler (NVRTC or nvcc) with cuda_fp16.h here")
    report = fuzz(10, [], seed=5, cuda=True)
    assert report.ok(), "\n\n".join(report.failures[:3])
    assert report.compiled >= 10 and report.drew_blocks() >= 1, report.options


def test_a_cuda_search_of_a_half_matmul_reaches_both_tensor_core_kinds():
    """A half matmul that fills a 64x64 block: BEAM may try one warp per tile and the staged
    block (codegen/wmma.py), and each compiles for sm_90."""
    from tinyteach import dtypes
    from tinyteach.opt.heuristic import TENSOR_CORE_BLOCK
    a = Tensor(floats(128, 32)).cast(dtypes.half).realize()
    b = Tensor(floats(32, 128, seed=1)).cast(dtypes.half).realize()
    item = last_kernel(a @ b)
    renderer = CUDARenderer()
    space = search_module.gpu_space(item.ast, renderer)
    assert space is not None and space.tensor_core and space.tensor_core_block == TENSOR_CORE_BLOCK
    candidates = search_module.search_space(item.ast, renderer)
    blocks = {o.tensor_core_block for o in candidates if o.tensor_core}
    assert blocks == {(), TENSOR_CORE_BLOCK}, candidates
    compiler = _cuda_compiler()
    for options in candidates:
        if options.tensor_core:
            kernel = compiler.compile(renderer.render(item.name, lower(item.ast, options)))
            assert "mma.sync" in kernel.ptx, options
