"""Chapter 9 (part 5): the OPENCL device — OpenCL C through pyopencl.

What this teaches:
- OpenCL is a standard API over many vendors' drivers (a *platform* each); a platform offers
  devices; a *context* ties devices and memory together and a *command queue* takes work in
  order. `pip install 'pyopencl[pocl]'` brings pocl, an OpenCL that runs on the CPU;
- the backend's three pieces: the Allocator makes `cl.Buffer`s and copies with
  `enqueue_copy`; the Compiler builds the source for the device (the binary is a built
  `cl.Program`, with the kernel's source; a schedule's new kernels are built as one program,
  since each build has a fixed cost of ~0.1 s); the Program enqueues the kernel with its
  global and local sizes and returns at once — the device runs it later. `synchronize()`
  waits for the queue to drain (reading a buffer waits too, because the queue runs in order);
- graph execution for the JIT: enqueue every captured kernel, then wait once.

Which platform? A machine may have several (Debian's pocl and the one inside the pyopencl wheel,
a GPU vendor's), and a platform can be listed yet unable to build anything: the pocl bundled
with pyopencl uses LLVM 14, which does not know some newer CPUs, names them `generic` and then
fails every build ("unknown target CPU 'generic'"). So the backend *probes*: it builds and runs
a tiny kernel on each candidate device, once, and takes the first that computes the right
numbers (pocl platforms first, so a run is the same on every machine). `OPENCL_PLATFORM` chooses
a platform explicitly, by index or by a part of its name. When nothing works, the error names
each platform tried and the line of its build log that failed.

Builds on: device.py, render/opencl.py, render/gpu.py.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyteach.codegen.lower import ProgramSpec
from tinyteach.device import Allocator, Backend, Buffer, CompileError, Compiler, DeviceUnavailable
from tinyteach.helpers import programs_of
from tinyteach.render.opencl import EXTENSIONS, OpenCLRenderer
from tinyteach.settings import OPENCL_PLATFORM, POCL_SIGFPE_HANDLER

# pocl installs a process-wide SIGFPE handler, after which C code in the same process (the CPU
# device, the exercises' forked children) no longer traps on an integer division by zero
POCL_SIGFPE_HANDLER.set_default()

cl: Any = None
try:
    import pyopencl as cl
except ImportError:  # the device reports itself unavailable; the renderer still works
    pass

INSTALL_HINT = ("install an OpenCL driver that can build for this machine, e.g. Debian's pocl: "
                "apt-get install pocl-opencl-icd ocl-icd-libopencl1 (`make system-deps` does it)")


def candidate_platforms(platforms: list[Any], wanted: str | None) -> list[Any]:
    """The platforms to try, in order: only the one `wanted` names (an index or part of a
    name), else every platform with pocl's first (a run is then the same on every machine)."""
    if not platforms:
        raise DeviceUnavailable(f"pyopencl finds no OpenCL platform; {INSTALL_HINT}")
    names = [f"{i}: {p.name}" for i, p in enumerate(platforms)]
    if wanted is not None and wanted.isdigit():
        if int(wanted) >= len(platforms):
            raise DeviceUnavailable(f"OPENCL_PLATFORM={wanted} but the platforms are {names}")
        return [platforms[int(wanted)]]
    if wanted is not None:
        matches = [p for p in platforms if wanted.lower() in p.name.lower()]
        if not matches:
            raise DeviceUnavailable(f"OPENCL_PLATFORM={wanted!r} matches none of {names}")
        return matches[:1]
    pocl = [p for p in platforms if "portable computing language" in p.name.lower()]
    return pocl + [p for p in platforms if p not in pocl]


# ---- the probe: can this device build and run a kernel? ----

PROBE_SOURCE = """__kernel void probe(__global float* out) {
  int i = get_global_id(0);
  out[i] = 2.0f * i + 1.0f;
}"""


def probe_device(device: Any) -> str | None:
    """Build and run a 4-thread kernel on `device`; None if it computed [1, 3, 5, 7], else
    why not, in one line (the build log's first error, when the build failed)."""
    try:
        context = cl.Context([device])
        queue = cl.CommandQueue(context, device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = cl.Program(context, PROBE_SOURCE).build()
        out = np.zeros(4, dtype=np.float32)
        buffer = cl.Buffer(context, cl.mem_flags.WRITE_ONLY, out.nbytes)
        cl.Kernel(program, "probe")(queue, (4,), None, buffer)
        cl.enqueue_copy(queue, out, buffer, is_blocking=True)
    except cl.Error as error:
        return first_error_line(str(error))
    if out.tolist() != [1.0, 3.0, 5.0, 7.0]:
        return f"the probe kernel computed {out.tolist()} instead of [1, 3, 5, 7]"
    return None


def first_error_line(message: str) -> str:
    """What failed, in one line: the build log's first line that mentions an error ("error:
    unknown target CPU 'generic'"), with the line after it when it ends in a colon; else the
    message's first line (pyopencl's own summary, e.g. "clBuildProgram failed: ...")."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    log = [line for line in lines[1:] if not line.startswith(("Build on", "(options"))]
    for k, line in enumerate(log):
        if "error" in line.lower():
            follows = log[k + 1] if line.endswith(":") and k + 1 < len(log) else ""
            return f"{line} {follows}".strip()
    return lines[0] if lines else "unknown error"


def find_working_device(platforms: list[Any]) -> Any:
    """The first device of these platforms that passes the probe; DeviceUnavailable naming
    every platform and device tried, and why each failed, when none does."""
    failures = []
    for platform in platforms:
        devices, why_none = devices_of(platform)
        if not devices:
            failures.append(f"{platform.name!r}: {why_none}")
        for device in devices:
            reason = probe_device(device)
            if reason is None:
                return device
            failures.append(f"{platform.name!r} ({platform.version}, device "
                            f"{device.name!r}): {reason}")
    raise DeviceUnavailable("no OpenCL device can build and run a kernel here; tried "
                            + "; ".join(failures) + f". To fix: {INSTALL_HINT}")


def devices_of(platform: Any) -> tuple[list[Any], str]:
    """The platform's devices, and what to say when there are none."""
    try:
        return platform.get_devices(), "it has no device"
    except cl.Error as error:  # some drivers raise DEVICE_NOT_FOUND instead of listing none
        return [], first_error_line(str(error))


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


def build_options(device: Any) -> list[str]:
    """`-w` (no warnings), and IEEE's correctly rounded float division and sqrt where the device
    offers them: OpenCL C allows `/` on floats an error of 2.5 ulp by default (pocl's CPU
    device divides exactly either way), and FDIV must give the reference's bits."""
    options = ["-w"]
    if device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
        options.append("-cl-fp32-correctly-rounded-divide-sqrt")
    return options


class OpenCLCompiler(Compiler):
    """Builds OpenCL C for one device; refuses half or double when the device lacks them."""

    builds_together = True  # a schedule's new kernels in one program: one pocl build

    def __init__(self, context: Any, device: Any):
        self.context, self.device = context, device
        self.options = build_options(device)
        self.cache_key = (f"opencl {device.platform.name} {device.name} {device.version} "
                          f"{' '.join(self.options)}")

    def compile(self, source: str) -> OpenCLBinary:
        self._check_extensions(source)
        return OpenCLBinary(self._build(source), source)

    def compile_many(self, sources: list[str], heavy: Sequence[bool] = (),
                     costs: Sequence[int] = ()) -> list[OpenCLBinary]:
        """Several kernels (with different names) built as one program: a build costs pocl
        ~0.1-0.2 s however many kernels it holds (the OpenCL C front end and the link of its
        kernel library), so a schedule's new kernels are built together. When the joined
        program does not build, each kernel is built alone, so the error names its source.
        (`heavy` and `costs`, the specs' flags and instructions, are the CPU's business:
        OpenCL has one build, no tiers.)"""
        for source in sources:
            self._check_extensions(source)
        try:
            program = self._build("\n".join(sources))
        except CompileError:
            return [self.compile(source) for source in sources]
        return [OpenCLBinary(program, source) for source in sources]

    def _check_extensions(self, source: str) -> None:
        for dtype, extension in EXTENSIONS.items():
            if extension in source and extension not in self.device.extensions:
                raise CompileError(f"OPENCL device {self.device.name!r} does not support "
                                   f"{dtype.name} (it lacks the {extension} extension)")

    def _build(self, source: str) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # build logs of successful builds
                return cl.Program(self.context, source).build(options=self.options)
        except cl.RuntimeError as error:
            raise CompileError(f"OpenCL kernel failed to compile:\n{error}\nin:\n{source}") \
                from None


@dataclass(frozen=True)
class OpenCLBinary:
    """What the Compiler gives: a built `cl.Program` (it may hold other kernels too, when
    built by `compile_many`) and the source of this kernel."""

    program: Any
    source: str


class OpenCLProgram:
    """One kernel, ready to enqueue. Calling it enqueues and returns without waiting."""

    def __init__(self, queue: Any, binary: OpenCLBinary, spec: ProgramSpec):
        self.queue, self.name = queue, spec.name
        # kept: re-reading program.name warns and costs
        self.kernel = getattr(binary.program, spec.name)
        self.global_size, self.local_size = spec.global_size, spec.local_size

    def __call__(self, *buffers: Buffer, vals: tuple[int, ...] = ()) -> Any:
        """Enqueue on the buffers, then the Variables' values (`const int i` parameters)."""
        self.kernel.set_args(*(b.storage for b in buffers), *(np.int32(v) for v in vals))
        return cl.enqueue_nd_range_kernel(self.queue, self.kernel, self.global_size,
                                          self.local_size)


class OpenCLGraph:
    """Graph execution for TinyJit: enqueue every captured kernel, wait once."""

    def __init__(self, launches: list[Any], slots: list[tuple[int, ...]],
                 inputs: set[int]) -> None:
        self.programs = programs_of(launches, OpenCLProgram, "OPENCL")
        self.slots = slots
        self.queue = self.programs[0].queue

    def __call__(self, buffers: list[Buffer]) -> None:
        for program, slots in zip(self.programs, self.slots):
            program(*[buffers[slot] for slot in slots])
        self.queue.finish()


class OpenCLBackend(Backend):
    """The OPENCL device: one device that passed the probe, one in-order queue."""

    def __init__(self, cl_device: Any):
        self.cl_device = cl_device
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

    def _make_program(self, name: str, binary: OpenCLBinary) -> OpenCLProgram:
        raise TypeError(f"an OpenCL program needs its launch sizes: load {name} with "
                        "backend.load_program(spec, binary), the spec from renderer.spec()")

    def load_program(self, spec: ProgramSpec, binary: OpenCLBinary) -> OpenCLProgram:
        return OpenCLProgram(self.queue, binary, spec)

    def synchronize(self) -> None:
        self.queue.finish()

    def another(self, index: int) -> Backend:
        """OPENCL:index, the index-th device of this device's platform that passes the probe
        (OPENCL itself is the first), with a context and queue of its own. pocl gives a CPU
        several devices with POCL_DEVICES="pthread pthread"."""
        platform = self.cl_device.platform
        devices, _ = devices_of(platform)
        others = [d for d in devices if d != self.cl_device and probe_device(d) is None]
        if index > len(others):
            raise DeviceUnavailable(
                f"device OPENCL:{index} is not available: the OpenCL platform "
                f"{platform.name!r} has {len(others) + 1} working device(s), OPENCL is the "
                f"first (pocl makes more with POCL_DEVICES=\"pthread pthread\")")
        backend = OpenCLBackend(others[index - 1])
        backend.name = f"OPENCL:{index}"
        return backend


def make_backend() -> Backend:
    if cl is None:
        raise DeviceUnavailable("pyopencl is not installed (pip install 'pyopencl[pocl]')")
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # "no platforms found" is an error in some ICD loaders
        platforms = []
    candidates = candidate_platforms(platforms, OPENCL_PLATFORM.value)
    return OpenCLBackend(find_working_device(candidates))

