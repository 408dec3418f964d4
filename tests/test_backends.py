"""Chapters 8-9: the GPU backends — OPENCL (pocl), WEBGPU (lavapipe) and CUDA (compile only
without a GPU) — checked against the NUMPY reference, never against their own output."""
from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stdout

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fuzz_graphs import fuzz  # noqa: E402
from helpers import fuzz_budget  # noqa: E402

from tinyteach import Context, Tensor, TinyJit, dtypes  # noqa: E402
from tinyteach.codegen.lower import lower  # noqa: E402
from tinyteach.device import Device, DeviceUnavailable  # noqa: E402
from tinyteach.engine.schedule import create_schedule  # noqa: E402
from tinyteach.opt.heuristic import (
    heuristic_plan,
    options_for_renderer,  # noqa: E402
)
from tinyteach.render.cuda import CUDARenderer  # noqa: E402
from tinyteach.render.gpu import MAX_GROUPS, MAX_THREADS_PER_GROUP, launch_of, plan_launch  # noqa: E402
from tinyteach.render.opencl import OpenCLRenderer  # noqa: E402
from tinyteach.render.wgsl import UnsupportedDType, WGSLRenderer  # noqa: E402

GPU_DEVICES = ["OPENCL", "WEBGPU"]


def _why_unavailable(name: str) -> str:
    try:
        Device[name]
    except (DeviceUnavailable, ImportError) as error:
        return str(error)
    return ""


def gpu_device(name: str):
    return pytest.param(name, marks=pytest.mark.skipif(
        not Device.is_available(name), reason=f"{name} unavailable: {_why_unavailable(name)}"))


gpu = pytest.mark.parametrize("device", [gpu_device(name) for name in GPU_DEVICES])
# the same tests on the GPU emulator (PYTHON), where they do not check a language's source
gpu_or_emulator = pytest.mark.parametrize(
    "device", [*(gpu_device(name) for name in GPU_DEVICES), "PYTHON"])
rng = np.random.default_rng(0)


def numpy_result(build, *arrays: np.ndarray) -> np.ndarray:
    return build(*(Tensor(a, device="NUMPY") for a in arrays)).numpy()


def assert_matches_numpy(device: str, build, *arrays: np.ndarray, rtol: float = 1e-4,
                         atol: float = 1e-5) -> None:
    expected = numpy_result(build, *arrays)
    got = build(*(Tensor(a, device=device) for a in arrays)).numpy()
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def floats(*shape: int) -> np.ndarray:
    return rng.uniform(-2, 2, size=shape).astype(np.float32)


# ---- the canonical patterns ----

CANONICAL = {
    "fused_reduce": (lambda a, b, c: ((a + b) * c).relu().sum(axis=1), [(8, 16)] * 3),
    "matmul": (lambda x, w: x @ w, [(5, 7), (7, 3)]),
    "softmax": (lambda x: x.softmax(axis=-1), [(4, 10)]),
    "layernorm": (lambda x: x.layernorm(), [(3, 33)]),
    "pad_flip": (lambda x: x.pad(((1, 2), (0, 3))).flip(0) * 2, [(4, 5)]),
    "broadcast": (lambda a, b: (a * b).max(axis=0), [(6, 1, 4), (1, 5, 4)]),
    "permute_5d": (lambda x: x.permute(4, 2, 0, 3, 1).exp(), [(2, 3, 2, 3, 2)]),
    "conv2d": (lambda x, w: x.conv2d(w, padding=1), [(1, 2, 6, 6), (3, 2, 3, 3)]),
    "max_pool": (lambda x: x.max_pool2d(2), [(1, 2, 6, 6)]),
    "cumsum": (lambda x: x.cumsum(axis=1), [(3, 9)]),
    "scalar": (lambda x: x.sum(), [(7,)]),
}


@gpu_or_emulator
@pytest.mark.parametrize("pattern", sorted(CANONICAL))
def test_canonical_patterns(device, pattern):
    build, shapes = CANONICAL[pattern]
    assert_matches_numpy(device, build, *(floats(*s) for s in shapes))


@gpu_or_emulator
def test_large_output_uses_grid_stride_loops(device):
    # more elements than one launch of MAX_GROUPS groups could cover one thread each
    assert_matches_numpy(device, lambda x: x * 2 + 1, floats(300_001))
    launch = plan_launch((MAX_GROUPS * MAX_THREADS_PER_GROUP * 2,))
    assert launch.groups[0] == MAX_GROUPS


@gpu_or_emulator
def test_backward_matches_numpy(device):
    x, w = floats(4, 6), floats(6, 3)

    def gradient(dev: str) -> np.ndarray:
        tx = Tensor(x, device=dev, requires_grad=True)
        (tx @ Tensor(w, device=dev)).relu().sum().backward()
        assert tx.grad is not None
        return tx.grad.numpy()
    np.testing.assert_allclose(gradient(device), gradient("NUMPY"), rtol=1e-5, atol=1e-6)


# ---- dtypes ----

INTEGER_CASES = {
    "int8_wraps": (np.array([127, -128, 100, -3], dtype=np.int8), lambda t: t + t + 1),
    "uint8_wraps": (np.array([0, 255, 200, 7], dtype=np.uint8), lambda t: t * 3),
    "int16": (np.array([32767, -5, 1000], dtype=np.int16), lambda t: t * 2),
    "int32_floordiv_mod": (np.array([-7, 7, 0, 100, -1], dtype=np.int32),
                           lambda t: (t // 3) + (t % -4) * 10),
    "int32_divide_by_tensor": (np.array([-7, 7, 5, 100, -1], dtype=np.int32),
                               lambda t: t // (t % 3)),  # includes x // 0
    "uint32": (np.array([0, 1, 4294967295], dtype=np.uint32), lambda t: t + 1),
    "bool_logic": (np.array([True, False, True]), lambda t: (t ^ t.flip(0)) | ~t),
    "bool_from_compare": (np.array([1.0, -2.0, 3.0], dtype=np.float32),
                          lambda t: (t < 0.5).where(t, -t) > 0),
    "cast_chain": (np.array([1.5, -2.7, 300.0], dtype=np.float32),
                   lambda t: t.cast(dtypes.int32).cast(dtypes.int8).cast(dtypes.float32)),
    "argmax": (np.array([[1, 5, 5], [9, 0, 9]], dtype=np.int32), lambda t: t.argmax(axis=1)),
}


@gpu_or_emulator
@pytest.mark.parametrize("case", sorted(INTEGER_CASES))
def test_integer_and_bool_dtypes(device, case):
    array, build = INTEGER_CASES[case]
    assert_matches_numpy(device, build, array)


@gpu_or_emulator
def test_float16(device):
    if dtypes.float16 in Device[device].unsupported_dtypes:
        with pytest.raises(Exception, match="float16"):
            (Tensor(np.ones(4, np.float16), device=device) + 1).numpy()
        return
    x = floats(5, 4).astype(np.float16)
    assert_matches_numpy(device, lambda t: (t * 2).exp2().sum(axis=1), x, rtol=1e-2, atol=1e-2)


def test_opencl_float64():
    if not Device.is_available("OPENCL"):
        pytest.skip(f"OPENCL unavailable: {_why_unavailable('OPENCL')}")
    if dtypes.float64 in Device["OPENCL"].unsupported_dtypes:
        pytest.skip("this OpenCL device has no cl_khr_fp64")
    x = rng.uniform(0, 2, size=(3, 4))
    assert_matches_numpy("OPENCL", lambda t: (t.sqrt() + 1e-12).log().sum(axis=0), x,
                         rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.uint64])
def test_webgpu_refuses_64_bit_dtypes(dtype):
    if not Device.is_available("WEBGPU"):
        pytest.skip(f"WEBGPU unavailable: {_why_unavailable('WEBGPU')}")
    name = np.dtype(dtype).name
    with pytest.raises(UnsupportedDType, match=f"WEBGPU cannot hold {name}"):
        Tensor(np.ones(3, dtype), device="WEBGPU").realize()
    # computed inside a kernel from a supported input: refused by the renderer
    with pytest.raises(UnsupportedDType, match=f"WEBGPU cannot compute {name}"):
        Tensor(np.ones(3, np.float32), device="WEBGPU").cast(dtypes.as_dtype(dtype)).realize()


def test_wgsl_renderer_refuses_without_a_device():
    item = create_schedule([Tensor.ones(4, dtype=dtypes.float64).realize().sqrt().uop],
                           "CPU")[0][0]
    with pytest.raises(UnsupportedDType, match="float64.*no 64-bit floats"):
        WGSLRenderer().render(item.name, lower(item.ast, heuristic_plan(item.ast)))
    item16 = create_schedule([Tensor.ones(4, dtype=dtypes.float16).realize().sqrt().uop],
                             "CPU")[0][0]
    with pytest.raises(UnsupportedDType, match="shader-f16"):
        program = lower(item16.ast, heuristic_plan(item16.ast))
        WGSLRenderer(shader_f16=False).render(item16.name, program)
    program = lower(item16.ast, heuristic_plan(item16.ast))
    assert "enable f16;" in WGSLRenderer().render(item16.name, program)


def _sum_of(count: int, device: str) -> Tensor:
    total = Tensor(np.full(4, 1.0, np.float32), device=device)
    for k in range(1, count):
        total = total + Tensor(np.full(4, float(k + 1), np.float32), device=device)
    return total


def test_webgpu_storage_buffer_limit():
    item = create_schedule([_sum_of(9, "CPU").uop], "CPU")[0][-1]
    with pytest.raises(RuntimeError, match="needs 10 storage buffers.*allows 8"):
        program = lower(item.ast, heuristic_plan(item.ast))
        WGSLRenderer(max_storage_buffers=8).render(item.name, program)
    if not Device.is_available("WEBGPU"):
        pytest.skip(f"WEBGPU unavailable: {_why_unavailable('WEBGPU')}")
    limit = Device["WEBGPU"].renderer.max_storage_buffers
    assert _sum_of(limit - 1, "WEBGPU").numpy().tolist() == [limit * (limit - 1) / 2] * 4
    with pytest.raises(RuntimeError, match=f"allows {limit} per shader stage"):
        _sum_of(limit, "WEBGPU").numpy()


# ---- devices: copies, mixing, DEBUG=4, platform choice, JIT graphs ----

@gpu_or_emulator
def test_copies_between_devices(device):
    x = floats(3, 5)
    on_device = Tensor(x, device="CPU").to(device)
    assert on_device.device == device
    np.testing.assert_array_equal(on_device.numpy(), x)
    back = (on_device * 2).to("NUMPY")
    np.testing.assert_allclose(back.numpy(), x * 2)
    other = "WEBGPU" if device == "OPENCL" else "OPENCL"
    if Device.is_available(other):
        np.testing.assert_allclose((on_device.to(other) + 1).numpy(), x + 1, rtol=1e-6)


@gpu_or_emulator
def test_mixing_devices_names_both(device):
    with pytest.raises(Exception, match=f"(?s)(CPU.*{device}|{device}.*CPU)"):
        (Tensor([1.0, 2.0], device=device) + Tensor([1.0, 2.0], device="CPU")).numpy()


@gpu
def test_debug_4_prints_the_source(device):
    marker = 1234.5  # a constant no other test uses, so the kernel is compiled here
    output = io.StringIO()
    with redirect_stdout(output), Context(DEBUG=4):
        (Tensor([1.0, 2.0], device=device) * marker).numpy()
    text = output.getvalue()
    assert "// launch: global" in text and "1234.5" in text
    assert ("__kernel void" in text) if device == "OPENCL" else ("@compute" in text)


@gpu
def test_jit_replays_through_the_device_graph(device):
    w = floats(6, 3)
    weights = Tensor(w, device=device)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x @ weights).relu() * 2).sum(axis=1).realize()

    output = io.StringIO()
    with redirect_stdout(output), Context(DEBUG=1):
        for _ in range(4):
            x = floats(5, 6)
            expected = (np.maximum(x @ w, 0) * 2).sum(axis=1)
            np.testing.assert_allclose(step(Tensor(x, device=device)).numpy(), expected,
                                       rtol=1e-4, atol=1e-5)
    assert "one graph call" in output.getvalue()


def train_losses(device: str, jit: bool, steps: int = 5) -> list[float]:
    """An MLP trained by SGD with in-place assign on digit-sized inputs (8x8 images)."""
    data = np.random.default_rng(3)
    w1 = Tensor(data.standard_normal((64, 16)).astype(np.float32) * 0.1, device=device,
                requires_grad=True)
    w2 = Tensor(data.standard_normal((16, 10)).astype(np.float32) * 0.1, device=device,
                requires_grad=True)
    batches = [(data.uniform(0, 1, (32, 64)).astype(np.float32),
                data.integers(0, 10, 32).astype(np.int32)) for _ in range(2)]

    def step(x: Tensor, y: Tensor) -> Tensor:
        loss = x.dot(w1).relu().dot(w2).sparse_categorical_crossentropy(y)
        loss.backward()
        for weight in (w1, w2):
            assert weight.grad is not None
            weight.assign(weight - 0.5 * weight.grad)
            weight.grad = None
        return loss.realize(w1, w2)

    run = TinyJit(step) if jit else step
    return [run(Tensor(x, device=device), Tensor(y, device=device)).item()
            for x, y in (batches[k % 2] for k in range(steps))]


@gpu_or_emulator
def test_training_with_jit_gives_the_reference_loss_curve(device):
    expected = train_losses("NUMPY", jit=False)
    assert expected[-1] < expected[0]  # it learns
    np.testing.assert_allclose(train_losses(device, jit=True), expected, rtol=1e-4)


# ---- the differential fuzzer, a fixed-seed slice ----

@pytest.mark.parametrize("device", ["CPU", *[gpu_device(name) for name in GPU_DEVICES], "PYTHON"])
def test_fuzz_slice(device):
    """30 graphs (12 on OPENCL, whose pocl builds each kernel in ~0.2 s), some with NaN, ±inf,
    -0.0, subnormal and int32-limit inputs; `make fuzz` runs more."""
    graphs = fuzz_budget(12 if device.startswith("OPENCL") else 30)
    report = fuzz(graphs, [device], seed=2026)
    assert report.graphs == graphs
    assert report.special_results >= graphs // 6  # the slice reaches NaN and inf in results
    assert report.ok(), "\n\n".join(report.failures[:5])


# ---- CUDA: compiles here, runs only with a GPU ----

def _cuda_compiler():
    from tinyteach.runtime.cuda import CUDACompiler
    try:
        return CUDACompiler()
    except DeviceUnavailable as error:
        pytest.skip(str(error))


CUDA_PROGRAMS = {
    "elementwise": lambda a, b: ((a + b) * a - b / (b.abs() + 1)).relu(),
    "math": lambda a, b: a.exp() + b.abs().log() + a.sin() + b.abs().sqrt() + a.sigmoid(),
    "reduce_pad_flip": lambda a, b: a.pad(((1, 1), (0, 2))).flip(1).max(axis=0),
    "matmul": lambda a, b: a @ b.T,
    "softmax": lambda a, b: a.softmax(axis=1),
    "compare_where": lambda a, b: (a < b).where(a, b).maximum(a.minimum(b)),
    "int32": lambda a, b: (a.cast(dtypes.int32) // 3 + a.cast(dtypes.int32) % -2) * 7,
    "int8_uint8": lambda a, b: a.cast(dtypes.int8) * 3 + b.cast(dtypes.uint8).cast(dtypes.int8),
    "int64": lambda a, b: a.cast(dtypes.int64) * 5 // 2,
    "bool": lambda a, b: ((a > 0) ^ (b > 0)) | (a < b),
    "float16": lambda a, b: (a.cast(dtypes.float16) * 2).exp2().sum(axis=1),
    "float64": lambda a, b: (a.cast(dtypes.float64) + 1e-3).log2().sum(),
    "cumsum": lambda a, b: a.cumsum(axis=1),
}


@pytest.mark.parametrize("program", sorted(CUDA_PROGRAMS))
def test_cuda_kernels_compile_to_ptx(program):
    from tinyteach.runtime.cuda import compile_for_cuda
    compiler = _cuda_compiler()
    a = Tensor(floats(4, 5), device="CPU")
    b = Tensor(floats(4, 5), device="CPU")
    result = CUDA_PROGRAMS[program](a, b)
    items = [i for i in create_schedule([result.uop], "CPU")[0] if i.kind == "kernel"]
    assert items
    for item in items:
        renderer = CUDARenderer()  # the options compile_for_cuda chooses (a row's work-group)
        source = renderer.render(item.name, lower(item.ast, options_for_renderer(item.ast,
                                                                                  renderer)))
        assert f'extern "C" __global__ void {item.name}(' in source
        kernel = compile_for_cuda(item.name, item.ast, compiler)
        assert f".entry {item.name}(" in kernel.ptx and ".version" in kernel.ptx
        spec = renderer.spec(item.name, lower(item.ast, options_for_renderer(item.ast, renderer)))
        assert spec.source == source  # the runtime launches by the spec, the same as the comment
        assert (spec.global_size, spec.local_size) == (launch_of(source).global_size,
                                                       launch_of(source).local_size)


def test_cuda_compile_error_is_clear():
    from tinyteach.device import CompileError
    compiler = _cuda_compiler()
    with pytest.raises(CompileError, match="failed to compile"):
        compiler.compile("// launch: global (1, 1, 1) local (1, 1, 1)\n"
                         'extern "C" __global__ void broken(float* a) { a[0] = b; }\n')


def test_cuda_without_a_gpu_says_so():
    if Device.is_available("CUDA"):
        assert_matches_numpy("CUDA", lambda a, b: (a @ b).relu(), floats(5, 7), floats(7, 3))
        return
    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        Device["CUDA"]


def test_renderers_need_no_hardware():
    item = create_schedule([(Tensor.ones(4, 4).realize() + 1).uop], "CPU")[0][0]
    program = lower(item.ast, heuristic_plan(item.ast))
    for renderer, expected in [(OpenCLRenderer(), "get_global_id(0)"),
                               (CUDARenderer(), "threadIdx.x"),
                               (WGSLRenderer(), "global_invocation_id")]:
        source = renderer.render(item.name, program)
        assert expected in source
        assert launch_of(source).local_size == (4, 4, 1)
