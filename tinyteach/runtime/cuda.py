"""Chapter 9 (part 7): the CUDA device — CUDA C compiled to PTX, run through the CUDA driver.

What this teaches:
- compiling and running are separate: NVRTC (NVIDIA's runtime compiler, a library) or nvcc turn
  CUDA C into PTX, a portable assembly, on any machine — no GPU needed. The driver turns PTX
  into machine code for the GPU it finds when a module is loaded (or NVRTC compiles straight to
  machine code, a *cubin*, when it is given a real architecture such as `sm_90`);
- so the compile path is usable on its own: `CUDACompiler().compile(source)` and
  `compile_for_cuda(name, ast)` give PTX anywhere NVRTC (`pip install
  'nvidia-cuda-nvrtc==13.0.*' cuda-bindings`) or nvcc is;
- running needs a GPU, its driver (libcuda) and one of two Python bindings, chosen
  automatically: pycuda where it is installed, otherwise NVIDIA's `cuda-bindings` (its driver
  API: `cuInit`, `cuMemAlloc`, `cuModuleLoadData`, `cuLaunchKernel`, ...). `DEBUG=1` names the
  one in use, e.g. "CUDA: cuda-bindings driver API, NVIDIA H200, sm_90". Without them
  `Device["CUDA"]` says "no CUDA device" and why (e.g. "no CUDA driver: libcuda.so not found");
- the backend: device memory is the Allocator; a Program loads the compiled module and
  launches its function on a grid of blocks, asynchronously; `synchronize()` waits. Shared
  memory is declared in the kernel (`__shared__` arrays of a fixed size), so a launch asks for
  no dynamic shared memory;
- graph execution for the JIT: a batched launch (every captured kernel launched back to back,
  one wait).

`CUDA_ARCH` picks the architecture (default: the GPU's `sm_XY` when running, else
compute_80 for PTX only).

Builds on: device.py, render/cuda.py, render/gpu.py.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinyteach.codegen.lower import ProgramSpec, lower
from tinyteach.device import Allocator, Backend, Buffer, CompileError, Compiler, DeviceUnavailable
from tinyteach.helpers import programs_of
from tinyteach.ir.uop import UOp
from tinyteach.opt.heuristic import options_for
from tinyteach.render.cuda import CUDARenderer
from tinyteach.settings import CUDA_ARCH, CUDA_HOME, CUDA_PATH, DEBUG

NVCC = "/usr/local/cuda/bin/nvcc"
DEFAULT_ARCH = "compute_80"


@dataclass(frozen=True)
class PTXKernel:
    """What the CUDA compiler produces: the PTX text, and the machine code (cubin) when NVRTC
    compiled for a real GPU architecture (`sm_XY`), else None. How to launch it is the
    ProgramSpec's (backend.load_program)."""

    ptx: str
    cubin: bytes | None = None


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None
    try:
        nvrtc.nvrtcVersion()
    except Exception:  # the bindings are there but libnvrtc is not
        return None
    return nvrtc


def _check(result: tuple, what: str, log: str = "") -> Any:
    status = result[0]
    if int(status) != 0:
        raise CompileError(f"NVRTC {what} failed ({status.name}){':' if log else ''}\n{log}")
    return result[1] if len(result) > 1 else None


def cuda_include_directory() -> str | None:
    """Where cuda_fp16.h is (NVRTC knows no include path of its own)."""
    roots = [CUDA_PATH.value, CUDA_HOME.value, "/usr/local/cuda"]
    for root in roots:
        if root and os.path.exists(os.path.join(root, "include", "cuda_fp16.h")):
            return os.path.join(root, "include")
    return None


def compile_with_nvrtc(nvrtc: Any, source: str, arch: str) -> str:
    """CUDA C -> PTX text."""
    return compile_with_nvrtc_to_cubin(nvrtc, source, arch)[0]


def compile_with_nvrtc_to_cubin(nvrtc: Any, source: str, arch: str) -> tuple[str, bytes | None]:
    """CUDA C -> PTX, and machine code (a cubin) when `arch` is a real architecture (`sm_90`,
    not `compute_90`): the driver loads a cubin as it is, without compiling PTX again (a PTX
    newer than the driver would be refused)."""
    program = _check(nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []), "create")
    try:
        options = [f"--gpu-architecture={arch}".encode(), b"-default-device"]
        include = cuda_include_directory()
        if include is not None:
            options.append(f"--include-path={include}".encode())
        compiled = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if int(compiled[0]) != 0:
            size = _check(nvrtc.nvrtcGetProgramLogSize(program), "log size")
            log = b" " * size
            _check(nvrtc.nvrtcGetProgramLog(program, log), "log")
            raise CompileError(f"CUDA kernel failed to compile:\n{log.decode(errors='replace')}"
                               f"\nin:\n{source}")
        size = _check(nvrtc.nvrtcGetPTXSize(program), "PTX size")
        ptx = b" " * size
        _check(nvrtc.nvrtcGetPTX(program, ptx), "PTX")
        cubin = None
        if arch.startswith("sm_"):
            size = _check(nvrtc.nvrtcGetCUBINSize(program), "cubin size")
            cubin = b" " * size
            _check(nvrtc.nvrtcGetCUBIN(program, cubin), "cubin")
        return ptx.rstrip(b"\0").decode(), cubin
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def compile_with_nvcc(nvcc: str, source: str, arch: str) -> str:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "kernel.cu"
        path.write_text(source)
        result = subprocess.run([nvcc, "--ptx", f"--gpu-architecture={arch}", str(path),
                                 "-o", str(path.with_suffix(".ptx"))],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(f"CUDA kernel failed to compile (nvcc):\n{result.stderr}"
                               f"\nin:\n{source}")
        return path.with_suffix(".ptx").read_text()


def find_nvcc() -> str | None:
    return shutil.which("nvcc") or (NVCC if os.path.exists(NVCC) else None)


class CUDACompiler(Compiler):
    """CUDA C -> PTX with NVRTC, or nvcc when NVRTC is missing. Needs no GPU. For a real
    architecture (`sm_XY`) NVRTC also gives the machine code."""

    def __init__(self, arch: str | None = None):
        self.arch = arch or CUDA_ARCH.get(DEFAULT_ARCH)
        self.nvrtc = _nvrtc()
        self.nvcc = None if self.nvrtc is not None else find_nvcc()
        if self.nvrtc is None and self.nvcc is None:
            raise DeviceUnavailable("no CUDA compiler: install NVRTC (pip install "
                                    "'nvidia-cuda-nvrtc==13.0.*' cuda-bindings) or nvcc")
        self.cache_key = f"cuda {'nvrtc' if self.nvrtc else self.nvcc} {self.arch}"

    def compile(self, source: str) -> PTXKernel:
        if self.nvrtc is not None:
            ptx, cubin = compile_with_nvrtc_to_cubin(self.nvrtc, source, self.arch)
            return PTXKernel(ptx, cubin)
        assert self.nvcc is not None
        return PTXKernel(compile_with_nvcc(self.nvcc, source, self.arch))


def render_for_cuda(name: str, ast: UOp) -> str:
    """Lower and render one kernel for CUDA, with the heuristic's plan for CUDA."""
    return spec_for_cuda(name, ast).source


def spec_for_cuda(name: str, ast: UOp) -> ProgramSpec:
    """The ProgramSpec of one kernel for CUDA, with the heuristic's plan for CUDA."""
    renderer = CUDARenderer()
    return renderer.spec(name, lower(ast, options_for(ast, renderer.capabilities)))


def compile_for_cuda(name: str, ast: UOp, compiler: CUDACompiler | None = None) -> PTXKernel:
    """Lower, render and compile one kernel for CUDA without a GPU (what the tests check)."""
    return (compiler or CUDACompiler()).compile(render_for_cuda(name, ast))


# ---- running (1): pycuda ----

class PyCUDAAllocator(Allocator):
    def __init__(self, driver: Any):
        self.driver = driver

    def alloc(self, nbytes: int) -> Any:
        return self.driver.mem_alloc(max(nbytes, 1))

    def copyin(self, dest: Any, src: np.ndarray) -> None:
        if src.nbytes:
            self.driver.memcpy_htod(dest, np.ascontiguousarray(src))

    def copyout(self, dest: np.ndarray, src: Any) -> None:
        if dest.nbytes:
            self.driver.memcpy_dtoh(dest, src)


def launch_local_size(spec: ProgramSpec) -> tuple[int, int, int]:
    """The threads per block of a kernel rendered for CUDA (its spec says)."""
    if spec.local_size is None:
        raise ValueError(f"{spec.name} has no launch sizes: was it rendered by CUDARenderer?")
    return spec.local_size


def module_image(kernel: PTXKernel) -> bytes:
    """What the driver loads: the cubin when there is one, else the PTX, NUL-terminated."""
    return kernel.cubin if kernel.cubin is not None else kernel.ptx.encode() + b"\0"


class PyCUDAProgram:
    """A kernel loaded through pycuda; calling it launches it and returns without waiting."""

    def __init__(self, driver: Any, kernel: PTXKernel, spec: ProgramSpec):
        name = spec.name
        self.driver, self.name = driver, name
        self.module = driver.module_from_buffer(module_image(kernel))
        self.function = self.module.get_function(name)
        self.grid, self.block = spec.groups, launch_local_size(spec)

    def __call__(self, *buffers: Buffer, vals: tuple[int, ...] = ()) -> None:
        """Launch on the buffers, then the Variables' values (`const int i` parameters)."""
        self.function(*(b.storage for b in buffers), *(np.int32(v) for v in vals),
                      block=self.block, grid=self.grid)


class PyCUDAGraph:
    """Graph execution for TinyJit: every captured kernel launched back to back, one wait."""

    def __init__(self, launches: list[Any], slots: list[tuple[int, ...]],
                 inputs: set[int]) -> None:
        self.programs = programs_of(launches, PyCUDAProgram, "CUDA")
        self.slots = slots
        self.driver = self.programs[0].driver

    def __call__(self, buffers: list[Buffer]) -> None:
        for program, slots in zip(self.programs, self.slots):
            program(*[buffers[slot] for slot in slots])
        self.driver.Context.synchronize()


class PyCUDABackend(Backend):
    """The CUDA device through pycuda: GPU 0's primary context, made current for this
    process."""

    def __init__(self, driver: Any):
        self.driver = driver
        gpu = driver.Device(0)
        self.context = gpu.retain_primary_context()
        self.context.push()
        atexit.register(self.context.pop)
        major, minor = gpu.compute_capability()
        compiler = CUDACompiler(CUDA_ARCH.get(f"sm_{major}{minor}"))
        super().__init__("CUDA", PyCUDAAllocator(driver), CUDARenderer(), compiler,
                         self._make_program)
        self.graph = PyCUDAGraph
        self.gpu_name = gpu.name()
        self.description = f"CUDA: pycuda, {self.gpu_name}, sm_{major}{minor}"

    def _make_program(self, name: str, kernel: PTXKernel) -> PyCUDAProgram:
        raise TypeError(f"a CUDA program needs its launch sizes: load {name} with "
                        "backend.load_program(spec, binary), the spec from renderer.spec()")

    def load_program(self, spec: ProgramSpec, kernel: PTXKernel) -> PyCUDAProgram:
        return PyCUDAProgram(self.driver, kernel, spec)

    def synchronize(self) -> None:
        self.context.synchronize()


def make_pycuda_backend(driver: Any) -> Backend:
    try:
        driver.init()
        count = driver.Device.count()
    except driver.Error as error:
        raise DeviceUnavailable(f"no CUDA device: the CUDA driver says {error}") from None
    if count == 0:
        raise DeviceUnavailable("no CUDA device: the CUDA driver finds no GPU")
    return PyCUDABackend(driver)


# ---- running (2): NVIDIA's cuda-bindings, the driver API itself ----
#
# Every driver call returns a tuple: the status (a CUresult) first, then what it made. `check`
# raises on a failed status, naming the call, and returns the rest.

class CUDAError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


def error_text(driver: Any, status: Any) -> str:
    """`CUDA_ERROR_OUT_OF_MEMORY: out of memory`: the error's name and the driver's words for
    it (just the name where the driver cannot be asked)."""
    name = getattr(status, "name", str(status))
    try:
        found, text = driver.cuGetErrorString(status)
    except Exception:  # no libcuda to ask
        return name
    if int(found) != 0 or not text:
        return name
    return f"{name}: {text.decode(errors='replace') if isinstance(text, bytes) else text}"


def check(driver: Any, result: tuple[Any, ...], call: str) -> Any:
    """The values a driver call returned after its status: None, one value, or a tuple."""
    status = result[0]
    if int(status) != 0:
        raise CUDAError(f"{call} failed: {error_text(driver, status)}")
    values = result[1:]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


@dataclass
class KernelParams:
    """cuLaunchKernel's `kernelParams`: an array of pointers, one per kernel parameter, each
    pointing at the parameter's value (a device address, 8 bytes; a Variable's value, an
    `int` of 4 bytes, after the buffers)."""

    values: ctypes.Array[ctypes.c_void_p]
    pointers: ctypes.Array[ctypes.c_void_p]
    ints: ctypes.Array[ctypes.c_int32] | None = None

    @property
    def address(self) -> int:
        return ctypes.addressof(self.pointers)


def pack_params(addresses: list[int], ints: tuple[int, ...] = ()) -> KernelParams:
    """Pack device addresses, then ints, as cuLaunchKernel wants them (`void** kernelParams`)."""
    count = len(addresses)
    values = (ctypes.c_void_p * count)(*addresses)
    integers = (ctypes.c_int32 * len(ints))(*ints)
    size, int_size = ctypes.sizeof(ctypes.c_void_p), ctypes.sizeof(ctypes.c_int32)
    base, int_base = ctypes.addressof(values), ctypes.addressof(integers)
    pointers = (ctypes.c_void_p * (count + len(ints)))(
        *(base + i * size for i in range(count)), *(int_base + i * int_size
                                                    for i in range(len(ints))))
    return KernelParams(values, pointers, integers)


class DeviceMemory:
    """`nbytes` of GPU memory from cuMemAlloc, freed with cuMemFree when unreferenced."""

    def __init__(self, driver: Any, nbytes: int):
        self.driver, self.nbytes = driver, nbytes
        self.pointer = check(driver, driver.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc")
        self.address: int = int(self.pointer)

    def __del__(self) -> None:
        try:
            self.driver.cuMemFree(self.pointer)
        except Exception:  # the interpreter is shutting down: the driver frees it at exit
            pass


class DriverAllocator(Allocator):
    def __init__(self, driver: Any):
        self.driver = driver

    def alloc(self, nbytes: int) -> DeviceMemory:
        return DeviceMemory(self.driver, nbytes)

    def copyin(self, dest: DeviceMemory, src: np.ndarray) -> None:
        if src.nbytes:
            host = np.ascontiguousarray(src)
            check(self.driver, self.driver.cuMemcpyHtoD(dest.pointer, host.ctypes.data,
                                                        host.nbytes), "cuMemcpyHtoD")

    def copyout(self, dest: np.ndarray, src: DeviceMemory) -> None:
        if not dest.nbytes:
            return
        host = dest if dest.flags.c_contiguous else np.empty_like(dest, order="C")
        check(self.driver, self.driver.cuMemcpyDtoH(host.ctypes.data, src.pointer, host.nbytes),
              "cuMemcpyDtoH")
        if host is not dest:
            dest[...] = host


class DriverProgram:
    """A kernel loaded with cuModuleLoadData; calling it launches it on the default stream and
    returns without waiting."""

    def __init__(self, driver: Any, kernel: PTXKernel, spec: ProgramSpec):
        name = spec.name
        self.driver, self.name = driver, name
        self.module = check(driver, driver.cuModuleLoadData(module_image(kernel)),
                            f"cuModuleLoadData ({name})")
        self.function = check(driver, driver.cuModuleGetFunction(self.module, name.encode()),
                              f"cuModuleGetFunction ({name})")
        self.grid, self.block = spec.groups, launch_local_size(spec)

    def __call__(self, *buffers: Buffer, vals: tuple[int, ...] = ()) -> None:
        params = pack_params([b.storage.address for b in buffers], vals)
        check(self.driver, self.driver.cuLaunchKernel(
            self.function, *self.grid, *self.block,
            0,  # dynamic shared memory: none, the kernel declares its __shared__ arrays
            0,  # the default stream: launches run in order
            params.address, 0), f"cuLaunchKernel ({self.name})")


class DriverGraph:
    """Graph execution for TinyJit: every captured kernel launched back to back, one wait."""

    def __init__(self, launches: list[Any], slots: list[tuple[int, ...]],
                 inputs: set[int]) -> None:
        self.programs = programs_of(launches, DriverProgram, "CUDA")
        self.slots = slots
        self.driver = self.programs[0].driver

    def __call__(self, buffers: list[Buffer]) -> None:
        for program, slots in zip(self.programs, self.slots):
            program(*[buffers[slot] for slot in slots])
        check(self.driver, self.driver.cuCtxSynchronize(), "cuCtxSynchronize")


def device_attribute(driver: Any, device: Any, name: str) -> int:
    attribute = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(check(driver, driver.cuDeviceGetAttribute(attribute, device),
                     f"cuDeviceGetAttribute ({name})"))


class DriverBackend(Backend):
    """The CUDA device through cuda-bindings: GPU 0's primary context (the one the CUDA
    runtime, and so PyTorch, shares), current on this thread."""

    def __init__(self, driver: Any):
        self.driver = driver
        check(driver, driver.cuInit(0), "cuInit")
        if check(driver, driver.cuDeviceGetCount(), "cuDeviceGetCount") == 0:
            raise DeviceUnavailable("no CUDA device: the CUDA driver finds no GPU")
        self.device = check(driver, driver.cuDeviceGet(0), "cuDeviceGet")
        self.context = check(driver, driver.cuDevicePrimaryCtxRetain(self.device),
                             "cuDevicePrimaryCtxRetain")
        check(driver, driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        major = device_attribute(driver, self.device, "COMPUTE_CAPABILITY_MAJOR")
        minor = device_attribute(driver, self.device, "COMPUTE_CAPABILITY_MINOR")
        name = check(driver, driver.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.gpu_name = bytes(name).split(b"\0")[0].decode(errors="replace")
        compiler = CUDACompiler(CUDA_ARCH.get(f"sm_{major}{minor}"))
        super().__init__("CUDA", DriverAllocator(driver), CUDARenderer(), compiler,
                         self._make_program)
        self.graph = DriverGraph
        self.description = f"CUDA: cuda-bindings driver API, {self.gpu_name}, sm_{major}{minor}"

    def _make_program(self, name: str, kernel: PTXKernel) -> DriverProgram:
        raise TypeError(f"a CUDA program needs its launch sizes: load {name} with "
                        "backend.load_program(spec, binary), the spec from renderer.spec()")

    def load_program(self, spec: ProgramSpec, kernel: PTXKernel) -> DriverProgram:
        return DriverProgram(self.driver, kernel, spec)

    def synchronize(self) -> None:
        check(self.driver, self.driver.cuCtxSynchronize(), "cuCtxSynchronize")


# ---- choosing the binding ----

def import_pycuda() -> Any:
    try:
        import pycuda.driver as driver
    except ImportError:  # not installed, or installed without a driver to load
        return None
    return driver


def import_cuda_bindings() -> Any:
    """`cuda.bindings.driver` (cuda-bindings 12.6 and later), or `cuda.cuda`, its older name."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver
        except ImportError:
            return None
    return driver


def find_libcuda() -> str | None:
    """The CUDA driver library's name if this process can load it (it comes with the NVIDIA
    driver, not with any pip package)."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


NO_DRIVER = ("no CUDA device: no CUDA driver: libcuda.so not found (it comes with the NVIDIA "
             "driver; without a GPU, CUDA kernels still compile to PTX: CUDACompiler)")


def make_driver_backend(driver: Any) -> Backend:
    if find_libcuda() is None:
        raise DeviceUnavailable(NO_DRIVER)
    try:
        return DriverBackend(driver)
    except DeviceUnavailable:
        raise
    except CUDAError as error:
        raise DeviceUnavailable(f"no CUDA device: {error}") from None
    except RuntimeError as error:  # cuda-bindings could not load or bind the driver library
        raise DeviceUnavailable(f"no CUDA device: the CUDA driver failed to load: {error}") \
            from None


def make_backend() -> Backend:
    """pycuda where it is installed, otherwise cuda-bindings; `DEBUG=1` says which."""
    pycuda_driver = import_pycuda()
    if pycuda_driver is not None:
        backend = make_pycuda_backend(pycuda_driver)
    else:
        bindings = import_cuda_bindings()
        if bindings is None:
            raise DeviceUnavailable("no CUDA device: neither pycuda nor cuda-bindings is "
                                    "installed (pip install cuda-bindings, on a machine with an "
                                    "NVIDIA GPU and driver)")
        backend = make_driver_backend(bindings)
    if DEBUG >= 1:
        print(getattr(backend, "description", "CUDA"))
    return backend
