"""Tensor cores (issue 14): the WMMA op for half/bfloat16 matmuls (tinyteach/codegen/wmma.py). The
layout against the PTX ISA's fragment tables, the emulator's semantics against numpy, kernels on the
PYTHON device against numpy's float32 matmul of the half inputs, the option (heuristic, DEBUG=3,
NOOPT, refusals with reasons), CUDA source compiled to machine code for sm_80 and sm_90 (no GPU
here: nothing runs), and viz's fragment drawing."""
from __future__ import annotations

import numpy as np
import pytest

from tinyteach import Context, Tensor, clear_caches
from tinyteach.codegen.lower import lower
from tinyteach.codegen.plan import KernelOptions
from tinyteach.codegen.wmma import M16N8K16, why_no_tensor_core, wmma_reference
from tinyteach.device import DeviceUnavailable, capabilities_of
from tinyteach.dtype import dtypes, from_bfloat16_bits, to_bfloat16_bits
from tinyteach.engine.realize import record_launches
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.uop import Ops
from tinyteach.opt import search as search_module
from tinyteach.opt.heuristic import choose_options, heuristic_plan, options_for_renderer
from tinyteach.render.cuda import CUDARenderer
from tinyteach.render.opencl import OpenCLRenderer
from tinyteach.render.wgsl import WGSLRenderer
from tinyteach.runtime.python import (
    PythonRenderer,
    WarpDivergenceError,
    _make_lanes,
    _Run,
    emulate,
    plan_group_launch,
    record_threads,
)


def halves(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float16)


def last_kernel(tensor: Tensor):
    items, _ = create_schedule([tensor.uop], "PYTHON")
    return [item for item in items if item.kind == "kernel"][-1]


# ---- the layout: PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" ----

def ptx_a(lane: int, i: int) -> tuple[int, int]:
    """The PTX table for A (.f16/.bf16), as the ISA writes it."""
    group, thread = lane >> 2, lane % 4
    row = group if i < 2 or 4 <= i < 6 else group + 8
    column = thread * 2 + (i & 1) if i < 4 else thread * 2 + (i & 1) + 8
    return row, column


def ptx_b(lane: int, i: int) -> tuple[int, int]:
    group, thread = lane >> 2, lane % 4
    row = thread * 2 + (i & 1) if i < 2 else thread * 2 + (i & 1) + 8
    return row, group


def ptx_c(lane: int, i: int) -> tuple[int, int]:
    group, thread = lane >> 2, lane % 4
    row = group if i < 2 else group + 8
    return row, thread * 2 + (i & 1)


def test_layout_is_the_ptx_table_and_covers_each_element_once():
    core = M16N8K16
    a_table, b_table, c_table = core.tables
    for lane in range(32):
        assert [tuple(a_table[lane, i]) for i in range(8)] == [ptx_a(lane, i) for i in range(8)]
        assert [tuple(b_table[lane, i]) for i in range(4)] == [ptx_b(lane, i) for i in range(4)]
        assert [tuple(c_table[lane, i]) for i in range(4)] == [ptx_c(lane, i) for i in range(4)]
    for table, rows, columns in ((a_table, 16, 16), (b_table, 16, 8), (c_table, 16, 8)):
        cells = {tuple(cell) for cell in table.reshape(-1, 2)}
        assert len(cells) == table.shape[0] * table.shape[1] == rows * columns
        assert cells == {(r, c) for r in range(rows) for c in range(columns)}


def test_wmma_reference_is_a_matmul_of_the_gathered_fragments():
    rng = np.random.default_rng(1)
    a_matrix = rng.normal(size=(3, 16, 16)).astype(np.float16)
    b_matrix = rng.normal(size=(3, 16, 8)).astype(np.float16)
    a_table, b_table, c_table = M16N8K16.tables
    a = a_matrix[:, a_table[..., 0], a_table[..., 1]]  # (warps, lanes, 8): what lanes hold
    b = b_matrix[:, b_table[..., 0], b_table[..., 1]]
    d = wmma_reference(M16N8K16, a, b)
    expected = np.einsum("wmk,wkn->wmn", a_matrix.astype(np.float64), b_matrix.astype(np.float64))
    np.testing.assert_allclose(d, expected[:, c_table[..., 0], c_table[..., 1]], rtol=1e-6,
                               atol=1e-5)


# ---- kernels on the emulator ----

MATMULS = {
    "one_tile": (lambda a, b: a @ b, [(16, 16), (16, 8)]),
    "odd": (lambda a, b: a @ b, [(37, 29), (29, 19)]),
    "k_odd": (lambda a, b: a @ b, [(20, 17), (17, 12)]),
    "transposed": (lambda a, b: a.T @ b.T, [(33, 18), (9, 33)]),
    "batched": (lambda a, b: a @ b, [(3, 17, 21), (3, 21, 9)]),
    "bias_relu": (lambda a, b, c: (a @ b + c).relu(), [(18, 20), (20, 10), (10,)]),
    "float_out": (lambda a, b: a.float() @ b.float(), [(24, 40), (40, 16)]),
}


@pytest.fixture
def forced_tensor_cores(monkeypatch):
    """Every kernel that can use tensor cores does (the heuristic needs a whole tile)."""
    clear_caches()

    def options(backend, ast):
        if bool(backend.capabilities.tensor_cores) and \
                why_no_tensor_core(ast) is None:
            return KernelOptions(tensor_core=True)
        return options_for_renderer(ast, backend.renderer)
    monkeypatch.setattr(search_module, "heuristic_options", options)
    yield
    clear_caches()


def float32_reference(build, arrays: list[np.ndarray]) -> np.ndarray:
    """The same graph on NUMPY in float32 from the same half values (what the tensor core
    computes: exact products, float32 sums)."""
    return build(*(Tensor(a.astype(np.float32), device="NUMPY") for a in arrays)).numpy()


@pytest.mark.parametrize("name", sorted(MATMULS))
def test_tensor_core_matmul_on_python_matches_numpy(name, forced_tensor_cores):
    build, shapes = MATMULS[name]
    arrays = [halves(*shape, seed=k) for k, shape in enumerate(shapes)]
    with record_launches() as launches:
        got = build(*(Tensor(a, device="PYTHON") for a in arrays)).numpy()
    assert any(launch.runner is not None and launch.runner.linear.options.tensor_core
               for launch in launches)
    expected = float32_reference(build, arrays)
    if got.dtype == np.float16:  # one rounding to half at the end
        np.testing.assert_allclose(got.astype(np.float32), expected, rtol=2e-3, atol=2e-3)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_tensor_cores_sum_in_float32_more_accurately_than_half_sums():
    a, b = halves(16, 512, seed=3), halves(512, 8, seed=4)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    item = last_kernel(Tensor(a).float() @ Tensor(b).float())
    out, arrays = np.zeros(16 * 8, np.float32), [a.reshape(-1), b.reshape(-1)]
    emulate(lower(item.ast, KernelOptions(tensor_core=True)), [out, *arrays])
    tensor_core_error = np.abs(out.reshape(16, 8) - exact).max()
    half_sums = np.zeros((16, 8), np.float16)  # a kernel that adds each product in half
    for step in range(512):
        half_sums = (half_sums + np.outer(a[:, step], b[step]).astype(np.float16))
    assert tensor_core_error < 1e-4
    assert tensor_core_error < np.abs(half_sums.astype(np.float64) - exact).max() / 10


def test_the_program_is_one_warp_per_tile_with_four_accumulators():
    item = last_kernel(Tensor(halves(37, 29)) @ Tensor(halves(29, 19)))
    program = lower(item.ast, KernelOptions(tensor_core=True))
    assert program.local_size == (32, 1, 1)
    launch = plan_group_launch(program)
    assert launch.groups == (3, 3, 1)  # ceil(19 / 8) x ceil(37 / 16) warps
    nodes = [u for u in program.uops if u.op is Ops.WMMA]
    assert [u.arg.element for u in nodes] == [0, 1, 2, 3]
    assert len({u.src for u in nodes}) == 1 and len(nodes[0].src) == 12
    loops = [u for u in program.uops if u.op is Ops.RANGE and u.arg[0] == "r"]
    assert [loop.arg[2] for loop in loops] == [2]  # ceil(29 / 16) steps of k
    assert sum(u.op is Ops.DEFINE_ACC for u in program.uops) == 4


def test_warp_divergence_at_a_wmma_is_caught():
    item = last_kernel(Tensor(halves(16, 16)) @ Tensor(halves(16, 8)))
    program = lower(item.ast, KernelOptions(tensor_core=True))
    launch = plan_group_launch(program)
    arrays = [np.zeros(128, np.float16), halves(256).reshape(-1), halves(128).reshape(-1)]
    run = _Run(program, launch, arrays, _make_lanes(launch, 0, 1), None)
    wmma_at = next(pc for pc, u in enumerate(program.uops) if u.op is Ops.WMMA)
    for u in program.uops[:wmma_at]:
        if u.op is not Ops.RANGE and u.op is not Ops.END_RANGE:
            run.step(0, u, {})
        else:
            run.values[u] = np.zeros(run.lanes.count, np.int32)
    run.active[5] = False
    with pytest.raises(WarpDivergenceError, match=r"thread \(5, 0, 0\).*m16n8k16"):
        run.step(wmma_at, program.uops[wmma_at], {})


# ---- the option ----

def test_heuristic_offers_tensor_cores_only_where_they_exist():
    half_matmul = last_kernel(Tensor(halves(64, 64)) @ Tensor(halves(64, 32)))
    for renderer in (CUDARenderer(), PythonRenderer()):
        assert options_for_renderer(half_matmul.ast, renderer) == KernelOptions(tensor_core=True)
    for renderer in (OpenCLRenderer(), WGSLRenderer()):  # no tensor cores: the flag is off
        assert not bool(capabilities_of(renderer).tensor_cores)
        assert not options_for_renderer(half_matmul.ast, renderer).tensor_core
    floats = last_kernel(Tensor(np.ones((64, 64), np.float32)) @
                         Tensor(np.ones((64, 32), np.float32)))
    assert not options_for_renderer(floats.ast, CUDARenderer()).tensor_core
    small = last_kernel(Tensor(halves(8, 64)) @ Tensor(halves(64, 32)))  # not one tile tall
    assert not options_for_renderer(small.ast, CUDARenderer()).tensor_core
    with Context(NOOPT=1):
        assert choose_options(half_matmul.ast, 0, True, True, True) == KernelOptions()


def test_tensor_cores_are_listed_and_refused_with_reasons():
    item = last_kernel(Tensor(halves(16, 16)) @ Tensor(halves(16, 8)))
    program = lower(item.ast, KernelOptions(tensor_core=True))
    assert any("tensor cores" in line and "m16n8k16" in line for line in program.applied_opts)
    with pytest.raises(ValueError, match="do not combine"):
        KernelOptions(tensor_core=True, local_tile=16)
    floats = last_kernel(Tensor(np.ones((16, 16), np.float32)) @
                         Tensor(np.ones((16, 8), np.float32)))
    with pytest.raises(ValueError, match="float16"):
        lower(floats.ast, KernelOptions(tensor_core=True))
    half_to_bfloat16 = last_kernel(Tensor(halves(16, 16)).cast(dtypes.bfloat16) @
                                   Tensor(halves(16, 8)).cast(dtypes.bfloat16))
    assert why_no_tensor_core(half_to_bfloat16.ast) is not None  # that cast rounds: no fragment
    row_sum = last_kernel(Tensor(halves(16, 16)).sum(axis=1))
    with pytest.raises(ValueError, match="matmul-like"):
        lower(row_sum.ast, KernelOptions(tensor_core=True))
    with pytest.raises(NotImplementedError, match="no tensor cores|cannot render WMMA"):
        OpenCLRenderer().render(item.name, program)


def test_engine_uses_tensor_cores_on_python_with_debug_3(capsys):
    clear_caches()
    a, b = halves(32, 48, seed=5), halves(48, 16, seed=6)
    with Context(DEBUG=3):
        got = (Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON")).numpy()
    assert "tensor cores: a warp of 32 threads" in capsys.readouterr().out
    expected = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=2e-3, atol=2e-3)


# ---- CUDA: mma.sync through inline PTX, compiled to machine code (nothing runs here) ----

def cuda_compiler(arch: str):
    from tinyteach.runtime.cuda import CUDACompiler, cuda_include_directory
    if cuda_include_directory() is None:
        pytest.skip("cuda_fp16.h not found (no CUDA toolkit)")
    try:
        return CUDACompiler(arch)
    except DeviceUnavailable as error:
        pytest.skip(str(error))


@pytest.mark.parametrize("name", sorted(MATMULS))
def test_cuda_tensor_core_kernels_compile_for_sm80_and_sm90(name):
    build, shapes = MATMULS[name]
    item = last_kernel(build(*(Tensor(halves(*shape)) for shape in shapes)))
    source = CUDARenderer().render(item.name, lower(item.ast, KernelOptions(tensor_core=True)))
    assert source.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 1
    assert "mma_m16n8k16_f16(wmma0, wmma0_a, wmma0_b);" in source
    for arch in ("sm_80", "sm_90"):
        kernel = cuda_compiler(arch).compile(source)
        assert kernel.cubin is not None  # ptxas accepted the mma for this architecture
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in kernel.ptx
    spec = CUDARenderer().spec(item.name, lower(item.ast, KernelOptions(tensor_core=True)))
    assert spec.source == source and spec.local_size == (32, 1, 1)


def bfloat16_matmul(m: int, k: int, n: int, seed: int = 0):
    """A bfloat16 matmul's kernel (it sums in float32: REDUCE_AXIS(CAST(MUL))) and its inputs
    as float32 arrays of bfloat16 values."""
    rng = np.random.default_rng(seed)
    a = from_bfloat16_bits(to_bfloat16_bits(rng.normal(size=(m, k)).astype(np.float32)))
    b = from_bfloat16_bits(to_bfloat16_bits(rng.normal(size=(k, n)).astype(np.float32)))
    x = Tensor(a, device="NUMPY").cast(dtypes.bfloat16).realize()
    y = Tensor(b, device="NUMPY").cast(dtypes.bfloat16).realize()
    return last_kernel(x @ y), a, b


def test_cuda_bfloat16_tensor_cores_compile():
    item, _, _ = bfloat16_matmul(20, 33, 12)
    assert options_for_renderer(item.ast, CUDARenderer()) == KernelOptions(tensor_core=True)
    source = CUDARenderer().render(item.name, lower(item.ast, KernelOptions(tensor_core=True)))
    assert "#include <cuda_bf16.h>" in source and "__nv_bfloat16 wmma0_a[8]" in source
    kernel = cuda_compiler("sm_80").compile(source)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in kernel.ptx
    assert kernel.cubin is not None


def test_bfloat16_tensor_cores_on_the_emulator_match_numpy():
    item, a, b = bfloat16_matmul(20, 33, 12, seed=2)
    out = np.zeros(20 * 12, dtypes.bfloat16.np)
    words = [to_bfloat16_bits(a).reshape(-1), to_bfloat16_bits(b).reshape(-1)]
    emulate(lower(item.ast, KernelOptions(tensor_core=True)), [out, *words])
    expected = a.astype(np.float64) @ b.astype(np.float64)  # then rounded once to bfloat16
    np.testing.assert_allclose(from_bfloat16_bits(out).reshape(20, 12), expected,
                               rtol=2 ** -8, atol=1e-6)


# ---- viz: the fragments from the record ----

def test_viz_draws_which_lane_holds_which_element():
    from viz import threads
    item = last_kernel(Tensor(halves(16, 16)) @ Tensor(halves(16, 8)))
    program = lower(item.ast, KernelOptions(tensor_core=True))
    arrays = [np.zeros(128, np.float16), halves(256), halves(128)]
    trace = emulate(program, arrays, item.name, record=True)
    figure = threads.fragment_layout(trace)
    text = figure.text.splitlines()
    a_rows = text[text.index("A (lane holding each element):") + 1:][:16]
    d_rows = text[text.index("D (lane holding each element):") + 1:][:16]
    for row in range(16):
        assert [int(v) for v in a_rows[row].split()] == \
            [next(lane for lane in range(32) for i in range(8) if ptx_a(lane, i) == (row, k))
             for k in range(16)]
        assert [int(v) for v in d_rows[row].split()] == \
            [next(lane for lane in range(32) for i in range(4) if ptx_c(lane, i) == (row, c))
             for c in range(8)]
    assert figure.svg is not None and figure.svg.count("<rect") == 16 * 16 + 16 * 8 + 16 * 8
    assert threads.fragment_layout(trace).svg == figure.svg  # deterministic
    doubled = last_kernel(Tensor(halves(4, 4)) * 2).ast
    plain = emulate(lower(doubled, heuristic_plan(doubled)), [np.zeros(16, np.float16),
                                                             halves(16)], record=True)
    with pytest.raises(ValueError, match="no tensor-core instruction"):
        threads.fragment_layout(plain)


def test_record_threads_keeps_fragments_of_an_engine_run(forced_tensor_cores):
    with record_threads() as traces:
        (Tensor(halves(16, 16), device="PYTHON") @ Tensor(halves(16, 8), device="PYTHON")).numpy()
    fragments = [e for trace in traces for e in trace.fragments]
    assert sorted(e.element for e in fragments) == [0, 1, 2, 3]
    assert all(e.instruction == "m16n8k16" and e.shape == (16, 8, 16) for e in fragments)



# ---- a block of warps fed from shared memory (KernelOptions.tensor_core_block) ----

BLOCK = (2, 2, 2, 4)  # the heuristic's: 2x2 warps, each 2x4 tiles of 16x8 (64x64 outputs)
BLOCKS = (BLOCK, (1, 1, 1, 1), (1, 2, 3, 1), (4, 1, 1, 4))
SIZES = (1, 15, 16, 17, 64, 100)


def block_name(block: tuple[int, ...]) -> str:
    return "x".join(map(str, block))


def forced_block(monkeypatch, block):
    """Every kernel that can use tensor cores does, in `block`."""
    clear_caches()

    def options(backend, ast):
        if bool(backend.capabilities.tensor_cores) and \
                why_no_tensor_core(ast) is not None:
            return options_for_renderer(ast, backend.renderer)
        if bool(backend.capabilities.tensor_cores):
            return KernelOptions(tensor_core=True, tensor_core_block=block)
        return options_for_renderer(ast, backend.renderer)
    monkeypatch.setattr(search_module, "heuristic_options", options)


def run_on_python(build, arrays):
    """The graph on PYTHON and the options of its kernels."""
    with record_launches() as launches:
        got = build(*(Tensor(a, device="PYTHON") for a in arrays)).numpy()
    options = [launch.runner.linear.options for launch in launches
               if launch.runner is not None and hasattr(launch.runner, "linear")]
    return got, options


def float64_reference(build, arrays):
    """numpy in float64 from the same half values (the graph on NUMPY in float64)."""
    return build(*(Tensor(a.astype(np.float64), device="NUMPY") for a in arrays)).numpy()


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("k", (1, 17, 64))
def test_staged_block_matmul_on_python_matches_float64(m, k, monkeypatch):
    n = {1: 16, 15: 100, 16: 8, 17: 17, 64: 64, 100: 15}[m]
    forced_block(monkeypatch, BLOCK)
    a, b = halves(m, k, seed=m), halves(k, n, seed=k + 1)
    got, options = run_on_python(lambda x, y: x @ y, [a, b])
    expected = a.astype(np.float64) @ b.astype(np.float64)
    uses_block = any(o.tensor_core_block == BLOCK for o in options)
    assert uses_block == (m > 1 and n > 1)  # a matrix-vector product is no matmul-like kernel
    # tensor cores: exact products, float32 sums, one rounding to half; without them each
    # product is rounded to half first (2^-11 relative)
    atol = 1e-3 if uses_block else 2e-3 * k ** 0.5
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-3, atol=atol)
    clear_caches()


STAGED_CASES = {
    "batched": (lambda a, b: a @ b, [(3, 17, 21), (3, 21, 9)]),
    "a_transposed": (lambda a, b: a.T @ b, [(33, 18), (33, 70)]),
    "b_transposed": (lambda a, b: a @ b.T, [(70, 33), (18, 33)]),
    "both_transposed": (lambda a, b: a.T @ b.T, [(40, 65), (66, 40)]),
    "bias_relu": (lambda a, b, c: (a @ b + c).relu(), [(65, 20), (20, 66), (66,)]),
    "float_out": (lambda a, b: a.float() @ b.float(), [(24, 40), (40, 16)]),
}


@pytest.mark.parametrize("block", BLOCKS, ids=block_name)
@pytest.mark.parametrize("name", sorted(STAGED_CASES))
def test_staged_blocks_on_python_match_float64(name, block, monkeypatch):
    build, shapes = STAGED_CASES[name]
    forced_block(monkeypatch, block)
    arrays = [halves(*shape, seed=k) for k, shape in enumerate(shapes)]
    got, options = run_on_python(build, arrays)
    assert any(o.tensor_core_block == block for o in options)
    tolerance = 1e-5 if got.dtype == np.float32 else 1e-3  # one rounding to half at the end
    np.testing.assert_allclose(got.astype(np.float64), float64_reference(build, arrays),
                               rtol=tolerance, atol=tolerance)
    clear_caches()


@pytest.mark.parametrize("block", BLOCKS[:2])
def test_staged_bfloat16_block_on_the_emulator_matches_float64(block):
    item, a, b = bfloat16_matmul(70, 33, 65, seed=3)
    out = np.zeros(70 * 65, dtypes.bfloat16.np)
    words = [to_bfloat16_bits(a).reshape(-1), to_bfloat16_bits(b).reshape(-1)]
    program = lower(item.ast, KernelOptions(tensor_core=True, tensor_core_block=block))
    assert [d.dtype for d in program.locals] == [dtypes.bfloat16] * 2
    emulate(program, [out, *words])
    expected = a.astype(np.float64) @ b.astype(np.float64)  # then rounded once to bfloat16
    np.testing.assert_allclose(from_bfloat16_bits(out).reshape(70, 65), expected,
                               rtol=2 ** -8, atol=1e-6)


def test_the_staged_program_is_a_block_of_warps_with_two_barriers_per_step():
    item = last_kernel(Tensor(halves(100, 40)) @ Tensor(halves(40, 129)))
    program = lower(item.ast, KernelOptions(tensor_core=True, tensor_core_block=BLOCK))
    assert program.local_size == (32, 4, 1)  # lane, warp
    assert plan_group_launch(program).groups == (3, 2, 1)  # ceil(129 / 64) x ceil(100 / 64)
    assert [d.arg[1] for d in program.locals] == [64 * (16 + 8), 16 * (64 + 8)]  # padded rows
    loop = next(pc for pc, u in enumerate(program.uops) if u.op is Ops.RANGE and u.arg[0] == "r")
    end = next(pc for pc, u in enumerate(program.uops) if u.op is Ops.END_RANGE and
               u.src[0] is program.uops[loop])
    inside = program.uops[loop:end]
    assert sum(u.op is Ops.BARRIER for u in inside) == 2
    assert sum(u.op is Ops.STORE for u in inside) == 16  # 8 elements of each slice per thread
    wmma = [u for u in inside if u.op is Ops.WMMA]
    assert len(wmma) == 8 * 4 and len({u.src for u in wmma}) == 8  # 2x4 tiles, 4 elements
    assert all(s.op is Ops.LOAD and s.src[0].op is Ops.DEFINE_LOCAL for u in wmma for s in u.src)
    assert sum(u.op is Ops.DEFINE_ACC for u in program.uops) == 32
    assert any("2x2 warps per 64x64 block" in line for line in program.applied_opts)


def global_reads_per_output(program, m: int, k: int, n: int) -> float:
    arrays = [np.zeros(m * n, np.float16), halves(m * k), halves(k * n)]
    trace = emulate(program, arrays, record=True)
    reads = sum(len(e.addresses) for e in trace.accesses("read") if not e.is_shared)
    return reads / (m * n)


def test_staging_reads_each_element_once_per_block_not_per_tile():
    m, k, n = 128, 32, 128
    item = last_kernel(Tensor(halves(m, k)) @ Tensor(halves(k, n)))
    per_tile = global_reads_per_output(lower(item.ast, KernelOptions(tensor_core=True)), m, k, n)
    staged = global_reads_per_output(
        lower(item.ast, KernelOptions(tensor_core=True, tensor_core_block=BLOCK)), m, k, n)
    # one warp per 16x8 tile: A is read once per 8 columns, B once per 16 rows
    assert per_tile == (m * k * (n // 8) + k * n * (m // 16)) / (m * n)
    # a 64x64 block: A and B once per 64 columns (rows)
    assert staged == (m * k * (n // 64) + k * n * (m // 64)) / (m * n)
    assert per_tile / staged == 6


STORED = {"plain": (lambda a, b: a @ b, (64, 32), (32, 64)),
          "a_transposed": (lambda a, b: a.T @ b, (32, 64), (32, 64)),
          "b_transposed": (lambda a, b: a @ b.T, (64, 32), (64, 32))}


@pytest.mark.parametrize("stored", sorted(STORED))
def test_staged_copies_are_coalesced_and_free_of_races(stored):
    """Whichever way an operand is stored, the copy order follows its memory: neighbouring
    threads read neighbouring halves (wmma.TensorCoreBlock's staging cells)."""
    from viz.threads import phase_traffic, strides
    build, a_shape, b_shape = STORED[stored]
    m, k, n = 64, 32, 64
    item = last_kernel(build(Tensor(halves(*a_shape)), Tensor(halves(*b_shape))))
    program = lower(item.ast, KernelOptions(tensor_core=True, tensor_core_block=BLOCK))
    arrays = [np.zeros(m * n, np.float16), halves(m * k), halves(k * n)]
    trace = emulate(program, arrays, record=True)  # the race check ran on every access
    for stride in strides(trace):
        if stride.kind == "read" and not stride.buffer.startswith("local"):
            assert stride.stride == 1  # neighbouring threads read neighbouring halves
    traffic = phase_traffic(trace)
    threads = 128
    copy_phases = [(p, r, w) for p, r, w in traffic if w]
    read_phases = [(p, r, w) for p, r, w in traffic if r]
    assert [w for _, _, w in copy_phases] == [threads * 16] * (k // 16)  # both slices
    # each thread loads its A fragment of each of its 2 rows of tiles and its B fragment of
    # each of its 4 columns of tiles once: 8 tiles from 2 x 8 + 4 x 4 loads
    assert [r for _, r, _ in read_phases] == [threads * (2 * 8 + 4 * 4)] * (k // 16)


def test_heuristic_takes_the_block_where_it_fills_one():
    big = last_kernel(Tensor(halves(64, 32)) @ Tensor(halves(32, 64)))
    for renderer in (CUDARenderer(), PythonRenderer()):
        assert options_for_renderer(big.ast, renderer) == \
            KernelOptions(tensor_core=True, tensor_core_block=BLOCK)
    narrow = last_kernel(Tensor(halves(64, 32)) @ Tensor(halves(32, 63)))
    assert options_for_renderer(narrow.ast, CUDARenderer()) == KernelOptions(tensor_core=True)
    for renderer in (OpenCLRenderer(), WGSLRenderer()):
        assert not options_for_renderer(big.ast, renderer).tensor_core
    with Context(NOOPT=1):
        assert choose_options(big.ast, 0, True, True, True) == KernelOptions()


def test_tensor_core_block_options_are_checked():
    with pytest.raises(ValueError, match="needs tensor_core=True"):
        KernelOptions(tensor_core_block=BLOCK)
    with pytest.raises(ValueError, match="four ints"):
        KernelOptions(tensor_core=True, tensor_core_block=(2, 2, 0, 4))
    with pytest.raises(ValueError, match="1024 threads"):
        KernelOptions(tensor_core=True, tensor_core_block=(8, 8, 1, 1))


@pytest.mark.parametrize("block", BLOCKS, ids=block_name)
@pytest.mark.parametrize("name", sorted(STAGED_CASES))
def test_cuda_staged_blocks_compile_for_sm80_and_sm90(name, block):
    build, shapes = STAGED_CASES[name]
    item = last_kernel(build(*(Tensor(halves(*shape)) for shape in shapes)))
    program = lower(item.ast, KernelOptions(tensor_core=True, tensor_core_block=block))
    source = CUDARenderer().render(item.name, program)
    assert source.count("__syncthreads();") == 2 and source.count("__shared__ half") == 2
    assert source.count("mma_m16n8k16_f16(wmma") == block[2] * block[3]  # one per tile
    for arch in ("sm_80", "sm_90"):
        kernel = cuda_compiler(arch).compile(source)
        assert kernel.cubin is not None and "bar.sync" in kernel.ptx
        assert kernel.ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") >= 1
    assert CUDARenderer().spec(item.name, program).local_size == (32, block[0] * block[1], 1)


def test_cuda_staged_bfloat16_block_compiles():
    item, _, _ = bfloat16_matmul(70, 33, 65)
    assert options_for_renderer(item.ast, CUDARenderer()) == \
        KernelOptions(tensor_core=True, tensor_core_block=BLOCK)
    source = CUDARenderer().render(item.name, lower(item.ast, options_for_renderer(
        item.ast, CUDARenderer())))
    assert source.count("__shared__ __nv_bfloat16") == 2
    kernel = cuda_compiler("sm_80").compile(source)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in kernel.ptx
    assert kernel.cubin is not None


def test_viz_draws_which_warp_computes_which_tile_of_a_block():
    from tinyteach.codegen.wmma import tensor_core_block
    from viz.threads import block_layout
    block = tensor_core_block(M16N8K16, BLOCK)
    figure = block_layout(block)
    rows = figure.text.splitlines()[1:]
    assert rows == ["0 0 0 0 1 1 1 1"] * 2 + ["2 2 2 2 3 3 3 3"] * 2  # 16x8 tiles of 64x64
    item = last_kernel(Tensor(halves(64, 16)) @ Tensor(halves(16, 64)))
    program = lower(item.ast, KernelOptions(tensor_core=True, tensor_core_block=BLOCK))
    out = np.zeros(64 * 64, np.float16)
    trace = emulate(program, [out, halves(64 * 16), halves(16 * 64)], record=True)
    for event in (e for e in trace.accesses("write") if not e.is_shared):
        rows_written, columns_written = event.addresses // 64, event.addresses % 64
        warps = event.threads[:, 1]  # the emulator's record: warp = lidx1
        np.testing.assert_array_equal(block.warp_map[rows_written // 16, columns_written // 8],
                                      warps)
    assert figure.svg is not None and figure.svg.count("<rect") == 4 * 8
