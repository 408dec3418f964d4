"""Chapter 9 (part 3): the CPU device — generated C, compiled and loaded with ctypes.

What this teaches:
- a compiled backend: the C renderer writes a function per kernel, the system C compiler turns it
  into a shared object, and ctypes calls it with the buffers' addresses;
- compiling costs ~50-100 ms, so binaries are cached on disk, keyed by a hash of the source, the
  compiler and its flags. A cached file is written under a temporary name and renamed into place,
  so several processes compiling at once never see a half-written file; nothing is unpickled;
- a kernel that does not compile raises `CompileError` with the compiler's message and the
  offending source lines.

Set `CC` to choose the compiler (gcc or clang; default: cc, then gcc, then clang) and
`TINYTEACH_CACHE` to move the cache (default ~/.cache/tinyteach).

Builds on: device.py, render/c.py.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tinyteach.device import (
    Backend,
    Buffer,
    CompileError,
    Compiler,
    Device,
    DeviceUnavailable,
    HostAllocator,
)
from tinyteach.render.c import CRenderer

# -march=native: use this machine's vector instructions (the cache key names the machine).
# -O2, not -O3: gcc 12's -O3 with AVX-512 miscompiles a padded load (`cond ? a[i % 4] : 0`
# loses half the rows; tests/test_runtime.py keeps the case), and -O2 vectorizes too.
C_FLAGS = ["-O2", "-march=native", "-fPIC", "-shared", "-fwrapv", "-fno-math-errno",
           "-ffp-contract=off"]
KERNELS_PER_PROCESS = 8   # compile_many starts another compiler per this many kernels (up to
                          # one per core)
THREAD_FLAGS = ["-fopenmp"]  # `#pragma omp parallel for` on big kernels (opt.py decides)
# idle OpenMP threads sleep instead of spinning, so they do not steal the other core
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def machine_identity() -> str:
    """The CPU model and features: binaries built with -march=native only run on the same."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    wanted = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
    return hashlib.sha256("\n".join(sorted(set(wanted))).encode()).hexdigest()[:16]


def supports_flags(compiler: str, flags: list[str]) -> bool:
    probe = "int main(void) { return 0; }\n"
    result = subprocess.run([compiler, *flags, "-x", "c", "-", "-o", os.devnull],
                            input=probe, capture_output=True, text=True)
    return result.returncode == 0


def native_macros(compiler: str) -> str:
    """What the compiler predefines with -march=native (`#define __AVX512F__ 1`, ...)."""
    result = subprocess.run([compiler, "-march=native", "-dM", "-E", "-x", "c", "-"],
                            input="", capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else ""


def native_vector_width(macros: str) -> int:
    """How many float32 lanes this CPU's vector registers hold, as the compiler sees it with
    -march=native: 16 with AVX-512, 8 with AVX, 4 with SSE2 or NEON, else 0 (no vectors)."""
    for macro, width in (("__AVX512F__", 16), ("__AVX__", 8), ("__SSE2__", 4),
                         ("__ARM_NEON", 4)):
        if f"#define {macro} " in macros:
            return width
    return 0


VECTOR_WIDTHS = (0, 2, 4, 8, 16)


def vector_width(macros: str) -> int:
    """The lanes the CPU renderer uses: `CPU_VECTOR_WIDTH` when set (0 turns vectors off; the
    book's stored outputs are those of a 16-lane CPU), else what this CPU has."""
    wanted = os.environ.get("CPU_VECTOR_WIDTH")
    if wanted is None:
        return native_vector_width(macros)
    if not wanted.isdigit() or int(wanted) not in VECTOR_WIDTHS:
        raise ValueError(f"CPU_VECTOR_WIDTH={wanted!r}: give one of {VECTOR_WIDTHS} (float32 "
                         "lanes per vector; 0 turns vectors off)")
    return int(wanted)


def find_c_compiler() -> str:
    wanted = os.environ.get("CC")
    candidates = [wanted] if wanted else ["cc", "gcc", "clang"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    raise DeviceUnavailable(f"no C compiler found (tried {candidates}); install gcc or clang, "
                            "or set CC")


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "tinyteach"
    return Path(os.environ.get("TINYTEACH_CACHE", default)) / "cpu"


def explain_compile_error(source: str, message: str) -> str:
    """The compiler's message, followed by each source line it complains about."""
    lines = source.splitlines()
    shown = []
    for number in sorted({int(n) for n in re.findall(r"<stdin>:(\d+):", message)}):
        if 1 <= number <= len(lines):
            shown.append(f"  line {number}: {lines[number - 1].strip()}")
    where = "\n".join(shown) if shown else source
    return f"kernel failed to compile:\n{message.strip()}\nin:\n{where}"


class ClangStyleCompiler(Compiler):
    """Compiles C source to a shared object with gcc or clang, with an on-disk cache."""

    def __init__(self, compiler: str):
        self.compiler = compiler
        threads = THREAD_FLAGS if supports_flags(compiler, THREAD_FLAGS) else []
        self.flags = [*C_FLAGS, *threads]
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True)
        self.cache_key = (f"{compiler} {version.stdout.splitlines()[0]} {' '.join(self.flags)} "
                          f"{machine_identity()}")

    def compile(self, source: str) -> Path:
        """Compile (or find in the cache) and return the shared object's path."""
        digest = hashlib.sha256((self.cache_key + "\n" + source).encode()).hexdigest()
        target = cache_dir() / f"{digest[:32]}.so"
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
        os.close(handle)
        command = [self.compiler, *self.flags, "-x", "c", "-", "-o", temporary, "-lm"]
        result = subprocess.run(command, input=source, capture_output=True, text=True)
        if result.returncode != 0:
            os.unlink(temporary)
            raise CompileError(explain_compile_error(source, result.stderr))
        os.replace(temporary, target)  # atomic: readers see the old state or the whole file
        return target

    def compile_many(self, sources: list[str]) -> list[Path]:
        """Several kernels (with different function names) in a few shared objects: one
        compiler process per core instead of one per kernel (starting gcc costs ~50 ms), all
        running at once. Each kernel's program loads its group's library."""
        groups = min(os.cpu_count() or 1, max(1, len(sources) // KERNELS_PER_PROCESS))
        size = -(-len(sources) // groups)
        chunks = [sources[start:start + size] for start in range(0, len(sources), size)]
        with ThreadPoolExecutor(len(chunks)) as pool:  # the threads only wait for gcc
            libraries = list(pool.map(lambda chunk: self.compile("\n".join(chunk)), chunks))
        return [library for library, chunk in zip(libraries, chunks) for _ in chunk]


class CPUProgram:
    """A compiled kernel: call it with Buffers, it passes their addresses to the C function."""

    def __init__(self, name: str, library_path: Path):
        self.name = name
        self.library = ctypes.CDLL(str(library_path))
        self.function = getattr(self.library, name)
        self.function.restype = None

    def __call__(self, *buffers: Buffer) -> None:
        self.function(*(ctypes.c_void_p(b.storage.address) for b in buffers))


def render_graph(arities: list[int]) -> str:
    """C that calls every kernel in turn: kernels[k](buffers[...], ...) for each launch."""
    lines = ["void run_graph(void **kernels, void **buffers) {"]
    position = 0
    for k, arity in enumerate(arities):
        signature = ", ".join(["void*"] * arity)
        arguments = ", ".join(f"buffers[{position + i}]" for i in range(arity))
        lines.append(f"  ((void (*)({signature}))kernels[{k}])({arguments});")
        position += arity
    return "\n".join(lines + ["}"]) + "\n"


class CPUGraph:
    """Graph execution for TinyJit on the CPU: one ctypes call runs every captured kernel.
    The buffer addresses live in one C array; a replay only rewrites the input slots."""

    def __init__(self, launches: list) -> None:
        arities = [len(launch.buffers) for launch in launches]
        compiler = Device["CPU"].compiler
        assert compiler is not None
        library_path = compiler.compile(render_graph(arities))
        self.library = ctypes.CDLL(str(library_path))
        self.run = self.library.run_graph
        self.run.restype = None
        functions = [ctypes.cast(launch.runner.program.function, ctypes.c_void_p).value
                     for launch in launches]
        self.kernels = (ctypes.c_void_p * len(functions))(*functions)
        self.offsets = [sum(arities[:k]) for k in range(len(arities))]
        addresses = [b.storage.address for launch in launches for b in launch.buffers]
        self.buffers = (ctypes.c_void_p * len(addresses))(*addresses)

    def __call__(self, launches: list, changed: list[tuple[int, int]]) -> None:
        for k, position in changed:
            self.buffers[self.offsets[k] + position] = launches[k].buffers[position].storage.address
        self.run(self.kernels, self.buffers)


def make_backend() -> Backend:
    compiler = ClangStyleCompiler(find_c_compiler())
    macros = native_macros(compiler.compiler)
    is_gcc = "#define __GNUC__ " in macros and "__clang__" not in macros
    renderer = CRenderer(vector_width=vector_width(macros), fused_multiply_add=is_gcc)
    backend = Backend("CPU", HostAllocator(), renderer, compiler, CPUProgram)
    backend.graph = CPUGraph
    return backend
