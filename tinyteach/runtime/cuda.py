"""Chapter 9 (part 7): the CUDA device — CUDA C compiled to PTX, run through pycuda.

What this teaches:
- compiling and running are separate: NVRTC (NVIDIA's runtime compiler, a library) or nvcc turn
  CUDA C into PTX, a portable assembly, on any machine — no GPU needed. The driver turns PTX
  into machine code for the GPU it finds when a module is loaded;
- so the compile path is usable on its own: `CUDACompiler().compile(source)` and
  `compile_for_cuda(name, ast)` give PTX anywhere NVRTC (`pip install
  'nvidia-cuda-nvrtc==13.0.*' cuda-bindings`) or nvcc is; running needs pycuda and a GPU, and
  without them `Device["CUDA"]` says "no CUDA device";
- the backend: pycuda's `mem_alloc` is the Allocator; a Program loads the PTX as a module and
  launches its function on a grid of blocks, asynchronously; `synchronize()` waits.
- graph execution for the JIT: a batched launch (every captured kernel launched back to back,
  one wait); pycuda has no stable CUDA-graph API to build on.

`CUDA_ARCH` picks the virtual architecture for PTX (default: the GPU's, else compute_80).

Builds on: device.py, render/cuda.py, render/gpu.py.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinyteach.device import Allocator, Backend, Buffer, CompileError, Compiler, DeviceUnavailable
from tinyteach.helpers import programs_of
from tinyteach.lower import lower
from tinyteach.opt import options_for_renderer
from tinyteach.render.cuda import CUDARenderer
from tinyteach.render.gpu import Launch, launch_of
from tinyteach.uop import UOp

NVCC = "/usr/local/cuda/bin/nvcc"
DEFAULT_ARCH = "compute_80"


@dataclass(frozen=True)
class PTXKernel:
    """What the CUDA compiler produces: the PTX text and how to launch it."""

    ptx: str
    launch: Launch


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
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    for root in roots:
        if root and os.path.exists(os.path.join(root, "include", "cuda_fp16.h")):
            return os.path.join(root, "include")
    return None


def compile_with_nvrtc(nvrtc: Any, source: str, arch: str) -> str:
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
        return ptx.rstrip(b"\0").decode()
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
    """CUDA C -> PTX with NVRTC, or nvcc when NVRTC is missing. Needs no GPU."""

    def __init__(self, arch: str | None = None):
        self.arch = arch or os.environ.get("CUDA_ARCH", DEFAULT_ARCH)
        self.nvrtc = _nvrtc()
        self.nvcc = None if self.nvrtc is not None else find_nvcc()
        if self.nvrtc is None and self.nvcc is None:
            raise DeviceUnavailable("no CUDA compiler: install NVRTC (pip install "
                                    "'nvidia-cuda-nvrtc==13.0.*' cuda-bindings) or nvcc")
        self.cache_key = f"cuda {'nvrtc' if self.nvrtc else self.nvcc} {self.arch}"

    def compile(self, source: str) -> PTXKernel:
        if self.nvrtc is not None:
            ptx = compile_with_nvrtc(self.nvrtc, source, self.arch)
        else:
            assert self.nvcc is not None
            ptx = compile_with_nvcc(self.nvcc, source, self.arch)
        return PTXKernel(ptx, launch_of(source))


def compile_for_cuda(name: str, ast: UOp, compiler: CUDACompiler | None = None) -> PTXKernel:
    """Lower, render and compile one kernel for CUDA without a GPU (what the tests check)."""
    renderer = CUDARenderer()
    source = renderer.render(name, lower(ast, options_for_renderer(ast, renderer)))
    return (compiler or CUDACompiler()).compile(source)


# ---- running: pycuda and a GPU ----

class CUDAAllocator(Allocator):
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


class CUDAProgram:
    """A kernel loaded from PTX; calling it launches it and returns without waiting."""

    def __init__(self, driver: Any, name: str, kernel: PTXKernel):
        self.driver, self.name = driver, name
        self.module = driver.module_from_buffer(kernel.ptx.encode())
        self.function = self.module.get_function(name)
        self.grid, self.block = kernel.launch.groups, kernel.launch.local_size

    def __call__(self, *buffers: Buffer, vals: tuple[int, ...] = ()) -> None:
        """Launch on the buffers, then the Variables' values (`const int i` parameters)."""
        self.function(*(b.storage for b in buffers), *(np.int32(v) for v in vals),
                      block=self.block, grid=self.grid)


class CUDAGraph:
    """Graph execution for TinyJit: every captured kernel launched back to back, one wait."""

    def __init__(self, launches: list[Any]) -> None:
        self.programs = programs_of(launches, CUDAProgram, "CUDA")
        self.driver = self.programs[0].driver

    def __call__(self, launches: list[Any], changed: list[tuple[int, int]]) -> None:
        for program, launch in zip(self.programs, launches):
            program(*launch.buffers)
        self.driver.Context.synchronize()


class CUDABackend(Backend):
    """The CUDA device: GPU 0's primary context, made current for this process."""

    def __init__(self, driver: Any):
        self.driver = driver
        gpu = driver.Device(0)
        self.context = gpu.retain_primary_context()
        self.context.push()
        atexit.register(self.context.pop)
        major, minor = gpu.compute_capability()
        compiler = CUDACompiler(os.environ.get("CUDA_ARCH", f"compute_{major}{minor}"))
        super().__init__("CUDA", CUDAAllocator(driver), CUDARenderer(), compiler,
                         self._make_program)
        self.graph = CUDAGraph
        self.gpu_name = gpu.name()

    def _make_program(self, name: str, kernel: PTXKernel) -> CUDAProgram:
        return CUDAProgram(self.driver, name, kernel)

    def synchronize(self) -> None:
        self.context.synchronize()


def make_backend() -> Backend:
    try:
        import pycuda.driver as driver
    except ImportError:
        raise DeviceUnavailable("no CUDA device: pycuda is not installed (it needs an NVIDIA "
                                "driver; `pip install pycuda` on a machine with a GPU)") from None
    try:
        driver.init()
        count = driver.Device.count()
    except driver.Error as error:
        raise DeviceUnavailable(f"no CUDA device: the CUDA driver says {error}") from None
    if count == 0:
        raise DeviceUnavailable("no CUDA device: the CUDA driver finds no GPU")
    return CUDABackend(driver)
