"""The CUDA runtime (issue 14): pycuda where installed, otherwise NVIDIA's cuda-bindings driver API.

Without a GPU (here) the driver API is checked against a fake driver that keeps "device"
memory in host RAM and runs each launched kernel with numpy, reading the kernel parameters
back through the pointers cuLaunchKernel receives, so allocation, copies, module loading,
parameter packing, launch geometry, synchronization and error reporting are all exercised.
Where a GPU and its driver exist the last test runs real kernels instead.
"""
from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tinyteach import Tensor, TinyJit
from tinyteach.codegen.lower import ProgramSpec
from tinyteach.device import Buffer, Device, DeviceUnavailable
from tinyteach.dtype import dtypes
from tinyteach.helpers import Context
from tinyteach.runtime import cuda

driver = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
SUCCESS = driver.CUresult.CUDA_SUCCESS
ATTRIBUTE = driver.CUdevice_attribute

ADD_ONE = ("// launch: global (4, 1, 1) local (4, 1, 1)\n"
           'extern "C" __global__ void add_one(float* __restrict__ data0, '
           "const float* __restrict__ data1) {\n"
           "  data0[threadIdx.x] = data1[threadIdx.x] + 1.0f;\n}\n")


def float_view(address: int, count: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_float * count).from_address(address))


class FakeDriver:
    """The few driver calls the runtime makes, with cuda-bindings' conventions: every call
    returns a tuple whose first element is a CUresult."""

    CUresult = driver.CUresult
    CUdevice_attribute = ATTRIBUTE
    CUdeviceptr = driver.CUdeviceptr

    def __init__(self, gpus: int = 1, memory_limit: int = 1 << 20) -> None:
        self.gpus, self.memory_limit = gpus, memory_limit
        self.memory: dict[int, np.ndarray] = {}
        self.images: list[bytes] = []
        self.launches: list[dict[str, Any]] = []
        self.synchronized = 0
        self.current: Any = None

    def cuInit(self, flags: int) -> tuple:
        return (SUCCESS,)

    def cuDeviceGetCount(self) -> tuple:
        return (SUCCESS, self.gpus)

    def cuDeviceGet(self, ordinal: int) -> tuple:
        return (SUCCESS, ordinal)

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple:
        return (SUCCESS, "primary context")

    def cuCtxSetCurrent(self, context: Any) -> tuple:
        self.current = context
        return (SUCCESS,)

    def cuDeviceGetAttribute(self, attribute: Any, device: int) -> tuple:
        values = {ATTRIBUTE.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
                  ATTRIBUTE.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0}
        return (SUCCESS, values[attribute])

    def cuDeviceGetName(self, length: int, device: int) -> tuple:
        return (SUCCESS, b"Fake GPU\0\0\0\0")

    def cuMemAlloc(self, nbytes: int) -> tuple:
        if nbytes > self.memory_limit:
            return (driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        block = np.zeros(nbytes, np.uint8)
        self.memory[block.ctypes.data] = block
        return (SUCCESS, driver.CUdeviceptr(block.ctypes.data))

    def cuMemFree(self, pointer: Any) -> tuple:
        self.memory.pop(int(pointer))
        return (SUCCESS,)

    def cuMemcpyHtoD(self, device: Any, host: int, nbytes: int) -> tuple:
        ctypes.memmove(int(device), host, nbytes)
        return (SUCCESS,)

    def cuMemcpyDtoH(self, host: int, device: Any, nbytes: int) -> tuple:
        ctypes.memmove(host, int(device), nbytes)
        return (SUCCESS,)

    def cuModuleLoadData(self, image: bytes) -> tuple:
        self.images.append(image)
        return (SUCCESS, f"module {len(self.images)}")

    def cuModuleGetFunction(self, module: str, name: bytes) -> tuple:
        if name != b"add_one":
            return (driver.CUresult.CUDA_ERROR_NOT_FOUND, None)
        return (SUCCESS, name)

    def cuLaunchKernel(self, function: bytes, gx: int, gy: int, gz: int, bx: int, by: int,
                       bz: int, shared: int, stream: int, params: int, extra: int) -> tuple:
        pointers = (ctypes.c_void_p * 2).from_address(params)  # add_one has 2 parameters
        out, inp = (ctypes.c_void_p.from_address(p).value for p in pointers)
        assert out in self.memory and inp in self.memory, "a parameter is no device address"
        threads = gx * gy * gz * bx * by * bz
        float_view(out, threads)[:] = float_view(inp, threads) + 1
        self.launches.append({"grid": (gx, gy, gz), "block": (bx, by, bz), "shared": shared,
                              "addresses": (out, inp)})
        return (SUCCESS,)

    def cuCtxSynchronize(self) -> tuple:
        self.synchronized += 1
        return (SUCCESS,)

    def cuGetErrorString(self, status: Any) -> tuple:
        return (SUCCESS, b"out of memory")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A FAKECUDA device: the cuda-bindings backend on the fake driver."""
    monkeypatch.delenv("CUDA_ARCH", raising=False)
    fake_driver = FakeDriver()
    backend = cuda.DriverBackend(fake_driver)
    Device.register("FAKECUDA", lambda: backend)
    yield SimpleNamespace(driver=fake_driver, backend=backend)
    Device._backends.pop("FAKECUDA", None)
    Device._registered.pop("FAKECUDA", None)


def _compiler(arch: str) -> cuda.CUDACompiler:
    try:
        return cuda.CUDACompiler(arch)
    except DeviceUnavailable as error:
        pytest.skip(str(error))


# ---- without libcuda: a clear reason ----

def test_without_libcuda_the_device_says_why():
    if cuda.find_libcuda() is not None:
        pytest.skip("this machine has a CUDA driver")
    assert "no CUDA driver: libcuda.so not found" in (Device.why_unavailable("CUDA") or "")
    with pytest.raises(DeviceUnavailable, match="no CUDA device: no CUDA driver: libcuda.so "
                                                "not found"):
        Device["CUDA"]


def test_no_driver_library_is_named_before_any_driver_call(monkeypatch):
    monkeypatch.setattr(cuda, "import_pycuda", lambda: None)
    monkeypatch.setattr(cuda, "import_cuda_bindings", lambda: FakeDriver())
    monkeypatch.setattr(cuda, "find_libcuda", lambda: None)
    with pytest.raises(DeviceUnavailable, match="no CUDA driver: libcuda.so not found"):
        cuda.make_backend()


def test_no_binding_at_all_says_so(monkeypatch):
    monkeypatch.setattr(cuda, "import_pycuda", lambda: None)
    monkeypatch.setattr(cuda, "import_cuda_bindings", lambda: None)
    with pytest.raises(DeviceUnavailable, match="neither pycuda nor cuda-bindings"):
        cuda.make_backend()


def test_pycuda_is_preferred_where_installed(monkeypatch):
    made = []
    monkeypatch.setattr(cuda, "import_pycuda", lambda: "pycuda.driver")
    monkeypatch.setattr(cuda, "make_pycuda_backend", lambda d: made.append(d) or "pycuda")
    monkeypatch.setattr(cuda, "make_driver_backend", lambda d: pytest.fail("bindings chosen"))
    assert cuda.make_backend() == "pycuda" and made == ["pycuda.driver"]


def test_cuda_bindings_are_used_otherwise_and_debug_names_them(monkeypatch, capsys):
    monkeypatch.delenv("CUDA_ARCH", raising=False)
    monkeypatch.setattr(cuda, "import_pycuda", lambda: None)
    monkeypatch.setattr(cuda, "import_cuda_bindings", lambda: FakeDriver())
    monkeypatch.setattr(cuda, "find_libcuda", lambda: "libcuda.so.1")
    with Context(DEBUG=1):
        backend = cuda.make_backend()
    assert isinstance(backend, cuda.DriverBackend)
    assert capsys.readouterr().out.strip() == "CUDA: cuda-bindings driver API, Fake GPU, sm_90"
    assert backend.compiler.arch == "sm_90"  # type: ignore[union-attr]


def test_driver_errors_become_clear_unavailable_reasons(monkeypatch):
    monkeypatch.setattr(cuda, "find_libcuda", lambda: "libcuda.so.1")
    with pytest.raises(DeviceUnavailable, match="^no CUDA device: the CUDA driver finds no GPU$"):
        cuda.make_driver_backend(FakeDriver(gpus=0))
    failing = FakeDriver()
    failing.cuInit = lambda flags: (driver.CUresult.CUDA_ERROR_NO_DEVICE,)  # type: ignore
    with pytest.raises(DeviceUnavailable, match="no CUDA device: cuInit failed: "
                                                "CUDA_ERROR_NO_DEVICE"):
        cuda.make_driver_backend(failing)


# ---- the pieces of the driver-API backend ----

def test_check_returns_the_values_and_names_a_failed_call():
    assert cuda.check(driver, (SUCCESS,), "cuInit") is None
    assert cuda.check(driver, (SUCCESS, 7), "cuDeviceGetCount") == 7
    assert cuda.check(driver, (SUCCESS, 1, 2), "two") == (1, 2)
    with pytest.raises(cuda.CUDAError, match="^cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: "
                                             "out of memory$"):
        cuda.check(FakeDriver(), (driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAlloc")


def test_error_text_without_a_driver_is_the_error_name():
    text = cuda.error_text(driver, driver.CUresult.CUDA_ERROR_INVALID_VALUE)
    assert text.startswith("CUDA_ERROR_INVALID_VALUE")
    if cuda.find_libcuda() is None:
        assert text == "CUDA_ERROR_INVALID_VALUE"


def test_kernel_params_point_at_each_address():
    addresses = [0x1000, 0x7F00DEADBE00, 0x20]
    params = cuda.pack_params(addresses)
    pointers = (ctypes.c_void_p * 3).from_address(params.address)
    assert [ctypes.c_void_p.from_address(p).value for p in pointers] == addresses


def test_allocator_copies_round_trip_and_frees(fake):
    allocator = fake.backend.allocator
    memory = allocator.alloc(4 * 6)
    source = np.arange(6, dtype=np.float32) * 1.5
    allocator.copyin(memory, source)
    back = np.zeros(6, np.float32)
    allocator.copyout(back, memory)
    np.testing.assert_array_equal(back, source)
    strided = np.zeros((6, 2), np.float32)[:, 0]  # not contiguous: copied through a temporary
    allocator.copyout(strided, memory)
    np.testing.assert_array_equal(strided, source)
    address = memory.address
    del memory
    assert address not in fake.driver.memory


def test_out_of_memory_names_the_call(fake):
    with pytest.raises(cuda.CUDAError, match="cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"):
        fake.backend.allocator.alloc(2 << 20)


def spec_named(name: str) -> ProgramSpec:
    """The spec of ADD_ONE, written by hand: one block of 4 threads, two buffers."""
    return ProgramSpec(name, ADD_ONE, global_size=(4, 1, 1), local_size=(4, 1, 1), buffers=2)


def test_a_program_without_its_spec_is_refused(fake):
    kernel = _compiler("compute_80").compile(ADD_ONE)
    with pytest.raises(TypeError, match="needs its launch sizes"):
        fake.backend.program("add_one", kernel)


def test_a_program_loads_the_cubin_and_launches_on_the_buffers(fake):
    kernel = _compiler("sm_90").compile(ADD_ONE)
    assert kernel.cubin is not None and kernel.cubin.startswith(b"\x7fELF")
    program = fake.backend.load_program(spec_named("add_one"), kernel)
    assert fake.driver.images == [kernel.cubin]
    x = np.array([1, 2, 3, 4], np.float32)
    out, inp = Buffer("FAKECUDA", 4, dtypes.float32), Buffer("FAKECUDA", 4, dtypes.float32)
    inp.copyin(x)
    program(out, inp)
    fake.backend.synchronize()
    assert fake.driver.synchronized == 1
    np.testing.assert_array_equal(out.numpy(), x + 1)
    launch = fake.driver.launches[-1]
    assert launch["grid"] == (1, 1, 1) and launch["block"] == (4, 1, 1)
    assert launch["shared"] == 0
    assert launch["addresses"] == (out.storage.address, inp.storage.address)


def test_ptx_is_loaded_nul_terminated_when_there_is_no_cubin(fake):
    kernel = _compiler("compute_80").compile(ADD_ONE)
    assert kernel.cubin is None
    fake.backend.load_program(spec_named("add_one"), kernel)
    image = fake.driver.images[-1]
    assert image.endswith(b"\0") and b".entry add_one(" in image


def test_missing_function_names_the_kernel(fake):
    kernel = _compiler("compute_80").compile(ADD_ONE.replace("add_one", "other"))
    with pytest.raises(cuda.CUDAError, match=r"cuModuleGetFunction \(other\) failed: "
                                             "CUDA_ERROR_NOT_FOUND"):
        fake.backend.load_program(spec_named("other"), kernel)


def test_graph_launches_every_kernel_then_waits_once(fake):
    kernel = _compiler("compute_80").compile(ADD_ONE)
    program = fake.backend.load_program(spec_named("add_one"), kernel)
    a, b, c = (Buffer("FAKECUDA", 4, dtypes.float32) for _ in range(3))
    a.copyin(np.zeros(4, np.float32))
    launches = [SimpleNamespace(runner=SimpleNamespace(program=program), buffers=[b, a]),
                SimpleNamespace(runner=SimpleNamespace(program=program), buffers=[c, b])]
    graph = fake.backend.graph(launches, [(1, 0), (2, 1)], {0})  # slots: a 0, b 1, c 2
    graph([a, b, c])
    assert len(fake.driver.launches) == 2 and fake.driver.synchronized == 1
    np.testing.assert_array_equal(c.numpy(), np.full(4, 2, np.float32))


def test_graph_refuses_another_devices_programs(fake):
    other = SimpleNamespace(runner=SimpleNamespace(program=lambda *b: None), buffers=[])
    with pytest.raises(TypeError, match="not a DriverProgram"):
        fake.backend.graph([other], [()], set())


# ---- on a real GPU ----

def test_on_a_gpu_kernels_and_the_jit_match_numpy():
    if not Device.is_available("CUDA"):
        pytest.skip(Device.why_unavailable("CUDA") or "no CUDA device")
    assert Device["CUDA"].description.startswith("CUDA: ")  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((33, 70), np.float32), rng.standard_normal((70, 17), np.float32)
    got = (Tensor(a, device="CUDA") @ Tensor(b, device="CUDA")).relu().sum(axis=0).numpy()
    np.testing.assert_allclose(got, np.maximum(a @ b, 0).sum(axis=0), rtol=1e-4, atol=1e-4)
    step = TinyJit(lambda x: ((x * 2).exp() - 1).sum(axis=1).realize())
    for _ in range(4):  # run, capture, replay twice with new values
        x = rng.standard_normal((8, 300), np.float32)
        np.testing.assert_allclose(step(Tensor(x, device="CUDA")).numpy(),
                                   (np.exp(x * 2) - 1).sum(axis=1), rtol=1e-4, atol=1e-3)
