"""Chapter 9 (part 1): devices — what a backend is.

What this teaches:
- a backend is three small pieces: an **Allocator** (get memory, copy bytes in and out), a
  **Compiler** (source code -> a binary) and a **Program** (run a binary on buffers). An
  interpreter backend (NUMPY) skips the compiler: its "program" evaluates the kernel's ops one
  by one with the reference implementation of each primitive op;
- a `Buffer` is device memory of a size and dtype, allocated only when a kernel first needs it
  and freed when nothing refers to it any more (Python's garbage collector does the bookkeeping);
- `Device["CPU"]` loads a backend by name; `Device.DEFAULT` is the best one available, and
  `DEV=NAME` (or `NAME=1`, as in tinygrad) chooses another. tinygrad's names are aliases:
  `CL` is OPENCL (and `GPU`, `CLANG` are older tinygrad's OPENCL and CPU);
- a name may carry an index, as in tinygrad: `CPU:1` is a second CPU device with buffers of its
  own and the first one's compiler (`Backend.another`), and `CPU:0` is `CPU`. A tensor sharded
  over several devices is tensor/multi.py's.

Builds on: dtype.py. Used by: engine/schedule.py (buffers), engine/realize.py (the engine),
runtime/*.

>>> buffer = Buffer("NUMPY", 3, dtypes.float32)
>>> buffer.copyin(np.array([1, 2, 3], dtype=np.float32)).numpy().tolist()
[1.0, 2.0, 3.0]
"""
from __future__ import annotations

import copy
import ctypes
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyteach.dtype import DType, dtypes
from tinyteach.helpers import GlobalCounters
from tinyteach.settings import chosen_device

# every device tinyteach knows, with the module that implements it
KNOWN_DEVICES = {
    "NUMPY": "tinyteach.runtime.numpy",
    "CPU": "tinyteach.runtime.cpu",
    "OPENCL": "tinyteach.runtime.opencl",
    "WEBGPU": "tinyteach.runtime.webgpu",
    "CUDA": "tinyteach.runtime.cuda",
    "PYTHON": "tinyteach.runtime.python",  # a GPU emulator in numpy (slow; checks kernels)
}
PREFERENCE = ["CPU", "NUMPY"]  # Device.DEFAULT picks the first that works
# tinygrad's names for the same devices: `DEV=CL`, `CL=1`, `device="CL"` mean OPENCL. GPU and
# CLANG are the names older tinygrad releases used for OpenCL and the CPU.
DEVICE_ALIASES = {"CL": "OPENCL", "GPU": "OPENCL", "CLANG": "CPU"}


class DeviceUnavailable(RuntimeError):
    """A device is known but cannot run here (its library or hardware is missing)."""


class Allocator:
    """Device memory: `alloc` returns an opaque handle; copies go through host numpy arrays.
    `holds_bytes`: memory is plain bytes, so a buffer of any dtype may use memory allocated
    for another of as many bytes or more (TinyJit's memory planner shares it so)."""

    holds_bytes = True

    def alloc(self, nbytes: int) -> Any:
        raise NotImplementedError

    def copyin(self, dest: Any, src: np.ndarray) -> None:
        raise NotImplementedError

    def copyout(self, dest: np.ndarray, src: Any) -> None:
        raise NotImplementedError


class HostMemory:
    """Host RAM as a numpy byte array, with its address kept (asking numpy for it is slow).

    Freed memory is kept for the next allocation of the same size (up to POOL_LIMIT bytes in
    all), as tinygrad's LRU allocator does: fresh memory from the operating system costs a page
    fault on the first touch of every 4 KB page, which for a 16 MB buffer takes longer than
    the kernel that fills it. Reused memory is not cleared: kernels write all of their output."""

    __slots__ = ("array", "address")
    POOL_LIMIT = 256 << 20
    pool: dict[int, list[tuple[np.ndarray, int]]] = {}  # size -> free (array, address) pairs
    pooled_bytes = 0

    def __init__(self, nbytes: int):
        size = max(nbytes, 1)
        free = HostMemory.pool.get(size)
        if free:
            self.array, self.address = free.pop()  # the address kept too: ctypes.data costs ~3 us
            HostMemory.pooled_bytes -= size
        else:
            whole = np.zeros(size + 63, dtype=np.uint8)
            # the address through ctypes' buffer protocol: half the cost of `whole.ctypes.data`
            start = ctypes.addressof(ctypes.c_char.from_buffer(whole))  # type: ignore[arg-type]
            misalignment = -start % 64  # 64-byte aligned, for vector loads
            self.array = whole[misalignment: misalignment + size]
            self.address = start + misalignment

    def __del__(self) -> None:
        size = self.array.nbytes
        if HostMemory.pooled_bytes + size <= HostMemory.POOL_LIMIT:
            HostMemory.pool.setdefault(size, []).append((self.array, self.address))
            HostMemory.pooled_bytes += size

    def view(self, dtype: np.dtype, size: int) -> np.ndarray:
        return self.array[: size * dtype.itemsize].view(dtype)


class HostAllocator(Allocator):
    """Memory in the host's RAM (NUMPY and CPU use it)."""

    def alloc(self, nbytes: int) -> HostMemory:
        return HostMemory(nbytes)

    def copyin(self, dest: HostMemory, src: np.ndarray) -> None:
        dest.array[: src.nbytes] = np.ascontiguousarray(src).reshape(-1).view(np.uint8)

    def copyout(self, dest: np.ndarray, src: HostMemory) -> None:
        dest.reshape(-1).view(np.uint8)[:] = src.array[: dest.nbytes]


class Compiler:
    """Turns source code into a binary (whatever the device's Program loads: bytes, a path).
    `cache_key` names the compiler and its flags. `builds_together`: compile_many builds
    several kernels in one go (one gcc or OpenCL build for a schedule's new kernels), so the
    engine and BEAM hand it all of them; otherwise compile_many compiles them one by one."""

    cache_key = "none"
    builds_together = False

    def compile(self, source: str) -> Any:
        raise NotImplementedError

    def compile_many(self, sources: list[str], heavy: Sequence[bool] = (),
                     costs: Sequence[int] = ()) -> list[Any]:
        """Several kernels' binaries, in order (`heavy` and `costs`: the specs' flags and
        instructions, for a compiler with tiers). This one compiles each alone."""
        return [self.compile(source) for source in sources]


class CompileError(RuntimeError):
    """A kernel's source did not compile; the message shows the compiler's output and the line."""


@dataclass(frozen=True)
class Capabilities:
    """What a device's renderer can do, declared once as a value (`renderer.capabilities`):
    the scheduler and the optimizer read this, never the renderer's attributes.
    `vector_width`: float32 lanes per vector register (0: no vector types). `threads`: the outer
    loop may be split across CPU cores (OpenMP). `gpu`: each output element is a GPU thread (its
    output loops are the launch). `local_memory`: bytes of shared memory a work-group may use (0:
    none). `group_reduce`: a work-group may share a reduction (shared memory and barriers).
    `local_tile`: matmul tiles may be staged in shared memory. `tensor_cores`: the (m, n, k)
    shapes of its matrix instructions (half/bf16 in, float32 sums). `max_group_threads`: the most
    threads in one work-group."""

    vector_width: int = 0
    threads: bool = False
    gpu: bool = False
    local_memory: int = 0
    group_reduce: bool = False
    local_tile: bool = False
    tensor_cores: tuple[tuple[int, int, int], ...] = ()
    max_group_threads: int = 0


NO_CAPABILITIES = Capabilities()  # an interpreter (no renderer): it takes no optimizations
# what every GPU API here guarantees a work-group: 256 threads, 16 KiB of shared memory (WebGPU's
# default maxComputeWorkgroupStorageSize is the smallest)
GPU_CAPABILITIES = Capabilities(gpu=True, local_memory=16384, group_reduce=True, local_tile=True,
                                max_group_threads=256)


def capabilities_of(renderer: Any) -> Capabilities:
    """A renderer's Capabilities; NO_CAPABILITIES for None (an interpreter)."""
    return NO_CAPABILITIES if renderer is None else renderer.capabilities


class Backend:
    """A device: its name and its Allocator, Renderer (None for an interpreter), Compiler and
    Program class. The engine in engine/realize.py needs nothing more."""

    def __init__(self, name: str, allocator: Allocator, renderer: Any, compiler: Compiler | None,
                 program: Callable[..., Any]):
        self.name, self.allocator, self.renderer = name, allocator, renderer
        self.compiler, self.program = compiler, program
        # optional: a class that replays a JIT's launches in one go. Built once per capture as
        # `graph(launches, slots, inputs)` (each launch's slots of the plan's buffer list, and
        # the slots a replay may refill), it is called with the plan's buffers: `graph(buffers)`
        self.graph: Any = None

    def load_program(self, spec: Any, binary: Any) -> Callable[..., Any]:
        """The runnable program of a compiled kernel, from its ProgramSpec (codegen/lower.py) and
        its binary: `program(name, binary)`. A GPU backend also reads the spec's launch sizes."""
        return self.program(spec.name, binary)

    @property
    def capabilities(self) -> Capabilities:
        """What its renderer can do (NO_CAPABILITIES for an interpreter)."""
        return capabilities_of(self.renderer)

    def synchronize(self) -> None:
        """Wait for the device to finish its work (host devices are always finished)."""

    def another(self, index: int) -> Backend:
        """Device number `index` of this kind ("CPU:1" from "CPU"): its own allocator, so its
        buffers are its own, with this device's renderer, compiler and programs (the same
        kernels run on it). Devices in host memory can have as many as a program wants; a
        backend for real hardware overrides this to open its `index`-th device, or to say
        that there is none."""
        if not isinstance(self.allocator, HostAllocator):
            raise DeviceUnavailable(f"device {self.name}:{index} is not available: tinyteach "
                                    f"opens one {self.name} device only")
        twin = copy.copy(self)  # the same renderer, compiler, program and graph
        twin.name, twin.allocator = f"{self.name}:{index}", type(self.allocator)()
        return twin


class _DeviceRegistry:
    """`Device["CPU"]` gives the Backend; `Device.DEFAULT` the default device's name."""

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._default: str | None = None
        self._registered: dict[str, Callable[[], Backend]] = {}  # devices made in Python
        self._unavailable: dict[str, str] = {}  # why a device cannot run (each is tried once)

    def canonicalize(self, name: str | None) -> str:
        """The device's own name: upper case, tinygrad's aliases resolved, and an index only past
        the first device of its kind ("cpu" -> "CPU", "CPU:0" -> "CPU", "cpu:1" -> "CPU:1",
        "CL" -> "OPENCL"), as tinygrad names them."""
        if name is None:
            return self.DEFAULT
        if not isinstance(name, str):
            raise TypeError(f"a device name is a string such as 'CPU' or 'CPU:1', not {name!r}")
        kind, _, index = name.partition(":")
        upper = DEVICE_ALIASES.get(kind.upper(), kind.upper())
        if upper not in KNOWN_DEVICES and upper not in self._registered:
            raise ValueError(f"unknown device {name!r}; known devices: {list(KNOWN_DEVICES)} "
                             f"(also tinygrad's {list(DEVICE_ALIASES)}), "
                             f"available here: {self.available()}")
        if not index:
            return upper
        if not index.isdigit():
            raise ValueError(f"device {name!r}: the part after ':' is the device's index, a "
                             f"number such as {upper}:1")
        return upper if int(index) == 0 else f"{upper}:{int(index)}"

    def __getitem__(self, name: str) -> Backend:
        backend = self._backends.get(name)  # a loaded device by its own name: every launch asks
        if backend is not None:
            return backend
        name = self.canonicalize(name)
        kind, _, index = name.partition(":")
        if index:  # CPU:1: a second device of a kind, made from the first one
            if name not in self._backends and name not in self._unavailable:
                try:
                    self._backends[name] = self[kind].another(int(index))
                except DeviceUnavailable as error:
                    self._unavailable[name] = str(error)
                    raise
            if name in self._unavailable:
                raise DeviceUnavailable(self._unavailable[name])
            return self._backends[name]
        if name not in self._backends and name in self._registered:
            self._backends[name] = self._registered[name]()
        if name not in self._backends and name not in self._unavailable:
            try:
                module = importlib.import_module(KNOWN_DEVICES[name])
                self._backends[name] = module.make_backend()
            except (DeviceUnavailable, ImportError) as error:
                self._unavailable[name] = str(error)
        if name in self._unavailable:
            raise DeviceUnavailable(f"device {name} is not available: {self._unavailable[name]}. "
                                    f"Available here: {self.available()}")
        return self._backends[name]

    def register(self, name: str, make_backend: Callable[[], Backend]) -> None:
        """Add a device built in Python (the exercises' student backends), so that
        `Tensor(..., device=name)` runs on it. Registering a name again replaces its backend."""
        upper = name.upper()
        if upper in KNOWN_DEVICES or upper in DEVICE_ALIASES:
            raise ValueError(f"{upper} is a built-in device's name; register under another name")
        self._registered[upper] = make_backend
        self._backends.pop(upper, None)
        self._unavailable.pop(upper, None)

    def is_available(self, name: str) -> bool:
        return self.why_unavailable(name) is None

    def why_unavailable(self, name: str) -> str | None:
        """None when the device runs here, else the reason it cannot (its library, driver or
        hardware is missing). Each device is tried once per process; the answer is kept."""
        try:
            self[name]
        except (DeviceUnavailable, ImportError):
            canonical = self.canonicalize(name)
            reason = self._unavailable.get(canonical) or self._unavailable.get(
                canonical.partition(":")[0])
            return reason or "it failed to load"
        return None

    def available(self) -> list[str]:
        return [name for name in KNOWN_DEVICES if name in self._backends or
                self._probe(name)]

    def _probe(self, name: str) -> bool:
        if name in self._unavailable:
            return False
        try:
            module = importlib.import_module(KNOWN_DEVICES[name])
            self._backends[name] = module.make_backend()
        except (DeviceUnavailable, ImportError) as error:
            self._unavailable[name] = str(error)
            return False
        return True

    @property
    def DEFAULT(self) -> str:
        if self._default is None:
            self._default = self._choose_default()
        return self._default

    @DEFAULT.setter
    def DEFAULT(self, name: str) -> None:
        self._default = self.canonicalize(name)

    def _choose_default(self) -> str:
        wanted = chosen_device([*KNOWN_DEVICES, *DEVICE_ALIASES])  # CL=1 as well as OPENCL=1
        if wanted is not None:
            name = self.canonicalize(wanted)
            self[name]  # raises a clear error if it cannot run here
            return name
        return next(name for name in PREFERENCE if self.is_available(name))


Device = _DeviceRegistry()


class Allocation:
    """One piece of device memory: the allocator's handle and its size in bytes. It is counted
    in `GlobalCounters.mem_used` from the moment it is allocated until it is freed, which is
    when the last Buffer on it is gone (a Buffer's alias and the buffers TinyJit's memory
    planner puts into one piece of memory share one Allocation)."""

    __slots__ = ("handle", "nbytes", "device", "__weakref__")

    def __init__(self, device: str, nbytes: int):
        self.handle: Any = Device[device].allocator.alloc(nbytes)
        self.nbytes, self.device = nbytes, device
        GlobalCounters.mem_used += nbytes

    def __del__(self) -> None:
        GlobalCounters.mem_used -= self.nbytes

    def __repr__(self) -> str:
        return f"<Allocation {self.device} {self.nbytes} bytes>"


class Buffer:
    """`size` elements of `dtype` on `device`; memory is allocated on first use."""

    def __init__(self, device: str, size: int, dtype: DType, allocate: bool = False):
        self.device, self.size, self.dtype = device, size, dtype
        self._storage: Any = None  # the allocator's handle (read by every launch: kept here)
        self._allocation: Allocation | None = None
        self.overwritten = False  # set once assign() wrote new contents into this memory
        if allocate:  # now, not at first use (the engine allocates before it times a launch)
            self._allocate()

    @staticmethod
    def in_memory(allocation: Allocation, size: int, dtype: DType) -> Buffer:
        """A buffer in the first bytes of memory allocated already, big enough for it: an
        alias, or TinyJit's memory plan (buffers whose lifetimes do not overlap share
        memory). On a device whose memory is typed (`Allocator.holds_bytes` False) the dtype
        must be the one the memory was used for: that is the caller's to keep."""
        if size * dtype.itemsize > allocation.nbytes:
            raise ValueError(f"a buffer of {size} x {dtype.name} ({size * dtype.itemsize} "
                             f"bytes) does not fit in {allocation!r}")
        buffer = Buffer(allocation.device, size, dtype)
        buffer._storage, buffer._allocation = allocation.handle, allocation
        return buffer

    def alias(self) -> Buffer:
        """A new handle on the same memory: what a tensor holds after assign() wrote into it,
        so graphs built before the write (on the old handle) can be told apart."""
        return Buffer.in_memory(self.allocation, self.size, self.dtype)

    def __repr__(self) -> str:
        state = "allocated" if self.is_allocated else "not allocated"
        return f"<Buffer {self.device} {self.size} x {self.dtype.name}, {state}>"

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_allocated(self) -> bool:
        return self._storage is not None

    def _allocate(self) -> None:
        self._allocation = Allocation(self.device, self.size * self.dtype.itemsize)
        self._storage = self._allocation.handle

    @property
    def allocation(self) -> Allocation:
        """The memory this buffer uses (allocating it if needed), shared with its aliases."""
        if self._allocation is None:
            self._allocate()
        assert self._allocation is not None
        return self._allocation

    @property
    def storage(self) -> Any:
        """The device's handle for this memory, allocating it if needed."""
        if self._storage is None:
            self._allocate()
        return self._storage

    def copyin(self, data: np.ndarray) -> Buffer:
        if data.size != self.size or dtypes.from_np(data.dtype) != self.dtype:
            raise ValueError(f"copyin of {data.size} x {data.dtype} into {self!r}")
        Device[self.device].allocator.copyin(self.storage, data)
        return self

    def numpy(self) -> np.ndarray:
        """A host copy of the contents, as a flat numpy array."""
        result = np.empty(self.size, dtype=self.dtype.np)
        if self.size:
            Device[self.device].synchronize()
            Device[self.device].allocator.copyout(result, self.storage)
        return result
