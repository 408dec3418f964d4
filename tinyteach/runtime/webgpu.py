"""Chapter 9 (part 6): the WEBGPU device — WGSL through wgpu-py.

What this teaches:
- WebGPU is the GPU API of browsers, also usable from Python (wgpu-py, over Vulkan, Metal, D3D12
  or OpenGL). On a machine without a GPU, Mesa's lavapipe is a Vulkan that runs on the CPU;
- an *adapter* is a GPU as found; a *device* is our connection to it, opened with the
  features (shader-f16) and limits (storage buffers per kernel, buffer sizes) we ask for;
- the Allocator makes GPU buffers and copies through the device's queue. WGSL has no 8-bit,
  16-bit or bool buffer elements, so those are widened to 32 bits on the way in and narrowed
  on the way out; 64-bit dtypes are refused (see render/wgsl.py);
- the Compiler turns WGSL into a *compute pipeline*; a Program records one dispatch in a
  command encoder (bind group = the buffers, dispatch = the number of workgroups) and submits
  it. Reading a buffer waits for the GPU, so that is how `synchronize()` waits;
- graph execution for the JIT: every captured dispatch recorded in one command encoder,
  submitted once.

Builds on: device.py, render/wgsl.py, render/gpu.py.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyteach.codegen.lower import ProgramSpec
from tinyteach.device import Allocator, Backend, Buffer, CompileError, Compiler, DeviceUnavailable
from tinyteach.dtype import DType, dtypes
from tinyteach.helpers import programs_of
from tinyteach.render.wgsl import (
    DEFAULT_STORAGE_BUFFERS,
    MISSING_DTYPES,
    UnsupportedDType,
    WGSLRenderer,
)
from tinyteach.settings import XDG_RUNTIME_DIR

# the numpy dtype a buffer of each dtype holds on the GPU (WGSL has only 32-bit integers)
STORAGE_NP = {dtypes.bool: np.uint32, dtypes.int8: np.int32, dtypes.int16: np.int32,
              dtypes.uint8: np.uint32, dtypes.uint16: np.uint32}


def _wgpu() -> Any:
    if not XDG_RUNTIME_DIR.value:  # lavapipe complains without one
        os.environ[XDG_RUNTIME_DIR.key] = tempfile.mkdtemp(prefix="tinyteach-xdg-")  # mode 0700
    try:
        import wgpu
    except ImportError:
        return None
    return wgpu


class WebGPUMemory:
    """A GPU buffer, created when its dtype is first known (a copy in, or a kernel's use):
    the dtype decides how wide each element is on the GPU."""

    def __init__(self, device: Any, nbytes: int, max_bytes: int):
        self.device, self.nbytes, self.max_bytes = device, nbytes, max_bytes
        self.buffer: Any = None
        self.dtype: DType | None = None

    def gpu_buffer(self, dtype: DType) -> Any:
        if self.buffer is None:
            if dtype in MISSING_DTYPES:
                raise UnsupportedDType(f"WEBGPU cannot hold {dtype.name}: "
                                       f"{MISSING_DTYPES[dtype]}")
            size = self.nbytes // dtype.itemsize
            wide = np.dtype(STORAGE_NP.get(dtype, dtype.np)).itemsize * size
            padded = max(-(-wide // 4) * 4, 4)  # WebGPU copies whole 4-byte words
            if padded > self.max_bytes:
                raise RuntimeError(f"WEBGPU: a buffer of {padded} bytes is larger than the "
                                   f"device's limit of {self.max_bytes} bytes per binding")
            import wgpu
            usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
            self.buffer = self.device.create_buffer(size=padded, usage=usage)
            self.dtype = dtype
        return self.buffer


def to_storage(array: np.ndarray, dtype: DType) -> bytes:
    """Host values -> the bytes the GPU buffer holds (bools and narrow ints become 32-bit)."""
    wide = np.ascontiguousarray(array.reshape(-1)).astype(STORAGE_NP.get(dtype, dtype.np))
    data = wide.tobytes()
    return data + b"\0" * (-len(data) % 4)


class WebGPUAllocator(Allocator):
    # a GPU buffer is made, in its dtype's width, when a first dtype uses the memory: memory
    # used for one dtype cannot serve another
    holds_bytes = False

    def __init__(self, device: Any, max_bytes: int):
        self.device, self.max_bytes = device, max_bytes

    def alloc(self, nbytes: int) -> WebGPUMemory:
        return WebGPUMemory(self.device, nbytes, self.max_bytes)

    def copyin(self, dest: WebGPUMemory, src: np.ndarray) -> None:
        dtype = dtypes.from_np(src.dtype)
        buffer = dest.gpu_buffer(dtype)
        if src.size:
            self.device.queue.write_buffer(buffer, 0, to_storage(src, dtype))

    def copyout(self, dest: np.ndarray, src: WebGPUMemory) -> None:
        dtype = dtypes.from_np(dest.dtype)
        buffer = src.gpu_buffer(dtype)
        storage = np.dtype(STORAGE_NP.get(dtype, dtype.np))
        nbytes = -(-dest.size * storage.itemsize // 4) * 4
        data = self.device.queue.read_buffer(buffer, 0, nbytes)
        values = np.frombuffer(data, dtype=storage)[: dest.size]
        dest.reshape(-1)[:] = values != 0 if dtype == dtypes.bool else values.astype(dest.dtype)


@dataclass(frozen=True)
class WebGPUShader:
    """What the compiler gives: the WGSL module, checked by the driver."""

    module: Any
    source: str


class WebGPUKernel:
    """A loaded kernel: its pipeline, the layout of its bindings and its dispatch size, all
    from its ProgramSpec (buffers 0..n-1, then the Variables' buffer; the entry point is the
    kernel's name)."""

    def __init__(self, device: Any, shader: WebGPUShader, spec: ProgramSpec):
        import wgpu
        self.bindings = list(range(spec.buffers + (1 if spec.variables else 0)))
        entries = [{"binding": b, "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": wgpu.BufferBindingType.storage}} for b in self.bindings]
        try:
            self.layout = device.create_bind_group_layout(entries=entries)
            pipeline_layout = device.create_pipeline_layout(bind_group_layouts=[self.layout])
            self.pipeline = device.create_compute_pipeline(
                layout=pipeline_layout, compute={"module": shader.module,
                                                 "entry_point": spec.name})
        except wgpu.GPUError as error:
            raise CompileError(f"WGSL kernel {spec.name} failed to load:\n{error}\nin:\n"
                               f"{shader.source}") from None
        self.groups = spec.groups


class WebGPUCompiler(Compiler):
    """WGSL -> a compute pipeline (the driver compiles the shader when the pipeline is made)."""

    def __init__(self, device: Any, adapter_name: str):
        self.device = device
        self.cache_key = f"webgpu {adapter_name}"

    def compile(self, source: str) -> WebGPUShader:
        import wgpu
        try:
            module = self.device.create_shader_module(code=source)
        except wgpu.GPUError as error:
            raise CompileError(f"WGSL kernel failed to compile:\n{error}\nin:\n{source}") from None
        return WebGPUShader(module, source)


class WebGPUProgram:
    """One kernel; calling it records and submits one dispatch (it does not wait)."""

    def __init__(self, device: Any, shader: WebGPUShader, spec: ProgramSpec):
        self.device, self.name = device, spec.name
        self.kernel = WebGPUKernel(device, shader, spec)

    def bind_group(self, buffers: tuple[Buffer, ...] | list[Buffer]) -> Any:
        entries = []
        for binding in self.kernel.bindings:
            gpu_buffer = buffers[binding].storage.gpu_buffer(buffers[binding].dtype)
            entries.append({"binding": binding,
                            "resource": {"buffer": gpu_buffer, "offset": 0,
                                         "size": gpu_buffer.size}})
        return self.device.create_bind_group(layout=self.kernel.layout, entries=entries)

    def record(self, compute_pass: Any, bind_group: Any) -> None:
        compute_pass.set_pipeline(self.kernel.pipeline)
        compute_pass.set_bind_group(0, bind_group)
        compute_pass.dispatch_workgroups(*self.kernel.groups)

    def __call__(self, *buffers: Buffer, vals: tuple[int, ...] = ()) -> None:
        """Dispatch on the buffers; the Variables' values go in one more buffer of i32 (WGSL
        has no scalar kernel parameters: the renderer reads them as `vars[k]`)."""
        if vals:
            values = Buffer("WEBGPU", len(vals), dtypes.int32)
            buffers = (*buffers, values.copyin(np.array(vals, dtype=np.int32)))
        encoder = self.device.create_command_encoder()
        compute_pass = encoder.begin_compute_pass()
        self.record(compute_pass, self.bind_group(buffers))
        compute_pass.end()
        self.device.queue.submit([encoder.finish()])


class WebGPUGraph:
    """Graph execution for TinyJit: all captured dispatches in one command encoder, submitted
    once. Bind groups are made once and remade only for launches whose inputs changed."""

    def __init__(self, launches: list[Any], slots: list[tuple[int, ...]],
                 inputs: set[int]) -> None:
        self.programs = programs_of(launches, WebGPUProgram, "WEBGPU")
        self.device = self.programs[0].device
        self.slots = slots
        # the launches that read an input get a new bind group each call, the others keep theirs
        self.refreshed = [k for k, launch_slots in enumerate(slots) if inputs & set(launch_slots)]
        self.bind_groups = [None if k in self.refreshed else program.bind_group(launch.buffers)
                            for k, (program, launch) in enumerate(zip(self.programs, launches))]

    def __call__(self, buffers: list[Buffer]) -> None:
        for k in self.refreshed:
            self.bind_groups[k] = self.programs[k].bind_group([buffers[s] for s in self.slots[k]])
        encoder = self.device.create_command_encoder()
        compute_pass = encoder.begin_compute_pass()
        for program, bind_group in zip(self.programs, self.bind_groups):
            program.record(compute_pass, bind_group)
        compute_pass.end()
        self.device.queue.submit([encoder.finish()])


class WebGPUBackend(Backend):
    """The WEBGPU device: the high-performance adapter, with shader-f16 when it has it and the
    adapter's own limits for storage buffers."""

    def __init__(self, wgpu: Any, adapter: Any):
        features = ["shader-f16"] if "shader-f16" in adapter.features else []
        wanted = ["max-storage-buffers-per-shader-stage", "max-storage-buffer-binding-size",
                  "max-buffer-size"]
        limits = {name: adapter.limits[name] for name in wanted if name in adapter.limits}
        self.device = adapter.request_device_sync(required_features=features,
                                                  required_limits=limits)
        self.adapter_name = f"{adapter.info['device']} via {adapter.info['backend_type']}"
        storage_buffers = limits.get("max-storage-buffers-per-shader-stage",
                                     DEFAULT_STORAGE_BUFFERS)
        renderer = WGSLRenderer(bool(features), storage_buffers)
        max_bytes = limits.get("max-storage-buffer-binding-size", 128 << 20)
        super().__init__("WEBGPU", WebGPUAllocator(self.device, max_bytes), renderer,
                         WebGPUCompiler(self.device, self.adapter_name), self._make_program)
        self.graph = WebGPUGraph
        self.unsupported_dtypes = {dtype: reason for dtype in [*MISSING_DTYPES, dtypes.float16]
                                   if (reason := renderer.missing(dtype)) is not None}
        usage = wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        self._sync_buffer = self.device.create_buffer(size=4, usage=usage)

    def _make_program(self, name: str, shader: WebGPUShader) -> WebGPUProgram:
        raise TypeError(f"a WebGPU program needs its bindings and dispatch size: load {name} "
                        "with backend.load_program(spec, binary), the spec from renderer.spec()")

    def load_program(self, spec: ProgramSpec, shader: WebGPUShader) -> WebGPUProgram:
        return WebGPUProgram(self.device, shader, spec)

    def synchronize(self) -> None:
        # wgpu 0.32's queue.on_submitted_work_done_sync() raises TypeError; reading a buffer
        # waits for every submitted command, so read a tiny one
        self.device.queue.read_buffer(self._sync_buffer, 0, 4)


def make_backend() -> Backend:
    wgpu = _wgpu()
    if wgpu is None:
        raise DeviceUnavailable("wgpu is not installed (pip install wgpu)")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as error:  # wgpu raises a plain RuntimeError when it finds no adapter
        raise DeviceUnavailable(f"wgpu finds no adapter ({error}); on a machine without a GPU "
                                "install Vulkan's lavapipe: apt-get install mesa-vulkan-drivers "
                                "libvulkan1") from None
    if adapter is None:
        raise DeviceUnavailable("wgpu finds no adapter (install mesa-vulkan-drivers and "
                                "libvulkan1 for lavapipe)")
    return WebGPUBackend(wgpu, adapter)
