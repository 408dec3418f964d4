"""Chapter 9 (part 5): the OPENCL device — OpenCL C through pyopencl.

What this teaches:
- OpenCL is a standard API over many vendors' drivers (a *platform* each); a platform offers
  devices; a *context* ties devices and memory together and a *command queue* takes work in
  order. `pip install 'pyopencl[pocl]'` brings pocl, an OpenCL that runs on the CPU;
- the backend's three pieces: the Allocator makes `cl.Buffer`s and copies with
  `enqueue_copy`; the Compiler builds the source for the device (the binary is a built
  `cl.Program`); the Program enqueues the kernel with its global and local sizes and returns
  at once — the device runs it later. `synchronize()` waits for the queue to drain (reading a
  buffer waits too, because the queue runs in order);
- graph execution for the JIT: enqueue every captured kernel, then wait once.

`OPENCL_PLATFORM` chooses the platform, by index or by a part of its name (default: pocl if
present, else the first platform with a device).

Builds on: device.py, render/opencl.py, render/gpu.py.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from tinyteach.device import Allocator, Backend, Buffer, CompileError, Compiler, DeviceUnavailable
from tinyteach.render.gpu import launch_of
from tinyteach.render.opencl import EXTENSIONS, OpenCLRenderer

cl: Any = None
try:
    import pyopencl as cl
except ImportError:  # the device reports itself unavailable; the renderer still works
    pass


def choose_platform(platforms: list[Any], wanted: str | None) -> Any:
    """The platform `wanted` names (an index or part of a name), else pocl, else the first."""
    if not platforms:
        raise DeviceUnavailable("pyopencl finds no OpenCL platform (install 'pyopencl[pocl]' "
                                "for one that runs on the CPU)")
    names = [f"{i}: {p.name}" for i, p in enumerate(platforms)]
    if wanted is not None and wanted.isdigit():
        if int(wanted) >= len(platforms):
            raise DeviceUnavailable(f"OPENCL_PLATFORM={wanted} but the platforms are {names}")
        return platforms[int(wanted)]
    if wanted is not None:
        matches = [p for p in platforms if wanted.lower() in p.name.lower()]
        if not matches:
            raise DeviceUnavailable(f"OPENCL_PLATFORM={wanted!r} matches none of {names}")
        return matches[0]
    pocl = [p for p in platforms if "portable computing language" in p.name.lower()]
    return (pocl or platforms)[0]


class OpenCLAllocator(Allocator):
    def __init__(self, context: Any, queue: Any):
        self.context, self.queue = context, queue

    def alloc(self, nbytes: int) -> Any:
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))

    def copyin(self, dest: Any, src: np.ndarray) -> None:
        if src.nbytes:
            cl.enqueue_copy(self.queue, dest, np.ascontiguousarray(src), is_blocking=True)

    def copyout(self, dest: np.ndarray, src: Any) -> None:
        if dest.nbytes:
            cl.enqueue_copy(self.queue, dest, src, is_blocking=True)


class OpenCLCompiler(Compiler):
    """Builds OpenCL C for one device; refuses half or double when the device lacks them."""

    def __init__(self, context: Any, device: Any):
        self.context, self.device = context, device
        self.cache_key = f"opencl {device.platform.name} {device.name} {device.version}"

    def compile(self, source: str) -> Any:
        for dtype, extension in EXTENSIONS.items():
            if extension in source and extension not in self.device.extensions:
                raise CompileError(f"OPENCL device {self.device.name!r} does not support "
                                   f"{dtype.name} (it lacks the {extension} extension)")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # build logs of successful builds
                return cl.Program(self.context, source).build(options=["-w"])  # no warnings
        except cl.RuntimeError as error:
            raise CompileError(f"OpenCL kernel failed to compile:\n{error}\nin:\n{source}") \
                from None


class OpenCLProgram:
    """One kernel, ready to enqueue. Calling it enqueues and returns without waiting."""

    def __init__(self, queue: Any, name: str, program: Any, source: str):
        self.queue, self.name = queue, name
        self.kernel = getattr(program, name)  # kept: re-reading program.name warns and costs
        launch = launch_of(source)
        self.global_size, self.local_size = launch.global_size, launch.local_size

    def __call__(self, *buffers: Buffer) -> Any:
        self.kernel.set_args(*(b.storage for b in buffers))
        return cl.enqueue_nd_range_kernel(self.queue, self.kernel, self.global_size,
                                          self.local_size)


class OpenCLGraph:
    """Graph execution for TinyJit: enqueue every captured kernel, wait once."""

    def __init__(self, launches: list) -> None:
        self.queue = launches[0].runner.program.queue

    def __call__(self, launches: list, changed: list[tuple[int, int]]) -> None:
        for launch in launches:
            launch.runner.program(*launch.buffers)
        self.queue.finish()


class OpenCLBackend(Backend):
    """The OPENCL device: one platform, its first device, one in-order queue."""

    def __init__(self, platform: Any):
        devices = platform.get_devices()
        if not devices:
            raise DeviceUnavailable(f"OpenCL platform {platform.name!r} has no device")
        self.cl_device = devices[0]
        self.context = cl.Context([self.cl_device])
        self.queue = cl.CommandQueue(self.context, self.cl_device)
        compiler = OpenCLCompiler(self.context, self.cl_device)
        renderer = OpenCLRenderer()
        # float16, float8, ...: OpenCL's own vector types, as wide as the device prefers
        renderer.vector_width = self.cl_device.preferred_vector_width_float \
            if self.cl_device.preferred_vector_width_float in (2, 4, 8, 16) else 0
        super().__init__("OPENCL", OpenCLAllocator(self.context, self.queue), renderer,
                         compiler, self._make_program)
        self.graph = OpenCLGraph
        self.unsupported_dtypes = {dtype: f"the OpenCL device lacks {extension}"
                                   for dtype, extension in EXTENSIONS.items()
                                   if extension not in self.cl_device.extensions}

    def _make_program(self, name: str, binary: Any) -> OpenCLProgram:
        return OpenCLProgram(self.queue, name, binary, binary.get_info(cl.program_info.SOURCE))

    def synchronize(self) -> None:
        self.queue.finish()


def make_backend() -> Backend:
    if cl is None:
        raise DeviceUnavailable("pyopencl is not installed (pip install 'pyopencl[pocl]')")
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # "no platforms found" is an error in some ICD loaders
        platforms = []
    return OpenCLBackend(choose_platform(platforms, os.environ.get("OPENCL_PLATFORM")))

