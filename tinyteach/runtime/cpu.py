"""Chapter 9 (part 3): the CPU device — generated C, compiled and loaded with ctypes.

What this teaches:
- a compiled backend: the C renderer writes a function per kernel, the system C compiler turns it
  into a shared object, and ctypes calls it with the buffers' addresses;
- compiling costs ~50-100 ms, so binaries are cached on disk, keyed by a hash of the source, the
  compiler and its flags. A cached file is written under a temporary name and renamed into place,
  so several processes compiling at once never see a half-written file; nothing is unpickled;
- a kernel that does not compile raises `CompileError` with the compiler's message and the
  offending source lines;
- **tiered compilation**, as the JIT of a virtual machine does it: the first run of a training
  step brings dozens of new kernels, and gcc -O2 needs about a second of CPU for them. So a
  schedule's new kernels (`compile_many`) first run from a *fast tier* — tcc, which builds a
  kernel in a few milliseconds, or gcc -O0 where tcc is missing or cannot read the source (tcc
  knows no vector types) — while gcc -O2 builds the optimized library in a background thread.
  When it is done, each program swaps its function pointer; later launches, and JIT graphs,
  run the optimized code. The disk cache keeps only optimized libraries, so a warm cache skips
  the fast tier, and a process waits for the builds in flight when it exits;
- tiering must never change a number, or a result would depend on which build happened to be
  ready. An unoptimized build does each float operation as written, in the order written; so
  does gcc -O2, except where the source allows it to reorder: `#pragma omp simd reduction`
  (a sum split into vector lanes) and the fused multiply-add attribute (fp-contract). Kernels
  with either skip the fast tier and are built optimized at once, one compiler per core
  (`needs_optimized_build`); every other kernel gives the same bits on both tiers
  (tests/test_cpu_tiers.py compares NaN, ±inf, -0.0, subnormals, casts and integer division
  by zero byte for byte). A vector multiply-add is written as an explicit fused multiply-add
  (render/c.py), correctly rounded on every tier (tests/test_fma_tiers.py), so in the MLP's
  first step all 33 kernels start on the fast tier: tcc builds 29 in one call of tens of
  milliseconds, cc -O0 the 4 vector matmuls (tcc knows no vector types). A kernel of much
  work (a 1024x1024 matmul) still waits (`starts_optimized`): its unoptimized build would run
  longer than the optimized one takes to compile. The renderer says so in the kernel's
  ProgramSpec (`heavy`, render/c.py's HEAVY_WORK), and realize passes that flag to
  `compile_many(sources, heavy=...)`: no flag is read out of the source text;
- **what runs slowest is optimized first.** The spec also counts the operations an unoptimized
  build executes (`instructions`), and realize passes them as `costs`: the optimized builds go
  in that order, in groups of about BACKGROUND_GROUP_BYTES of source, one compiler per core,
  and each group swaps in as soon as it is built. In a GPT's first steps the costliest kernels
  (gelu's, attention's softmax: tens of ms each unoptimized) swap after a second or two
  instead of after every build; the kernels that wait are split over the cores by the length
  of their source (`balanced_groups`), since gcc's time grows with it.

Settings: `CC` chooses the compiler (gcc or clang; default: cc, then gcc, then clang),
`CPU_ARCH` the CPU the C is built for: a `-march=` value such as `x86-64-v3` (AVX2) or
`x86-64-v4` (AVX-512); default `native`, this machine's own. It is every build's -march (the
fast tier's cc -O0 too; tcc takes none), it sets the vector width (8 lanes for x86-64-v3, 16
for x86-64-v4, unless `CPU_VECTOR_WIDTH` pins it) and it is part of the cache key. A value the
compiler rejects, or a target this CPU cannot run (its feature macros, `__AVX512F__` and the
like, compared with -march=native's), is a ValueError naming CPU_ARCH. `describe_target()`
names the target in effect: "x86-64-v4 (native), 16 float lanes, gcc 12.2.0 (cc)".
`TINYTEACH_CACHE` moves the cache (default ~/.cache/tinyteach), `CPU_TIERED=0` (or
`Context(CPU_TIERED=0)`, a setting of tinyteach.runtime, known from `import tinyteach` on)
turns tiering off: every kernel waits for its optimized build, as
under BEAM, which times the builds it is given. `DEBUG=2` shows the tiers: how many kernels
start on the fast tier, a line before each launch of a fast-tier build naming its tier, the
tier at the end of that launch's line (`tm 12.00us (tcc)`), and a line at the first launch
after the swap. `compile(source)` alone always returns the optimized,
cached library.

>>> needs_optimized_build("#pragma omp simd reduction(+:acc0)")
True
>>> needs_optimized_build("void f(float* restrict d) { d[0] = 1.0f; }")
False

Builds on: device.py, render/c.py.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tinyteach import helpers
from tinyteach.device import (
    Backend,
    Buffer,
    CompileError,
    Compiler,
    Device,
    DeviceUnavailable,
    HostAllocator,
)
from tinyteach.helpers import machine_identity, memo
from tinyteach.render.c import CRenderer
from tinyteach.settings import (
    BEAM,
    CC,
    CPU_ARCH,
    CPU_TIERED,
    CPU_VECTOR_WIDTH,
    DEBUG,
    GOMP_SPINCOUNT,
    OMP_WAIT_POLICY,
)

# -march=native: use this machine's vector instructions; CPU_ARCH names another target
# (march_flags puts it in place; the cache key names the flags and the machine).
# -O2, not -O3: gcc 12's -O3 with AVX-512 miscompiles a padded load (`cond ? a[i % 4] : 0`
# loses half the rows; tests/test_runtime.py keeps the case), and -O2 vectorizes too.
# -fno-trapping-math with -fvect-cost-model=dynamic: gcc may compute both sides of a select
# (a max's `acc > x || acc != acc`, relu's `v < 0 ? 0 : v`) and vectorize it, instead of a
# branch that mispredicts on random signs (a max-pool kernel 700 -> 198 us). No result changes:
# kernels never read the floating-point exception flags that trapping math keeps exact.
C_FLAGS = ["-O2", "-march=native", "-fPIC", "-shared", "-fwrapv", "-fno-math-errno",
           "-ffp-contract=off", "-fno-trapping-math"]
SELECT_FLAGS = ["-fvect-cost-model=dynamic"]  # gcc's; clang refuses it (and needs it not)
# a target with 512-bit vectors (16 float lanes) builds with them: gcc's tuning for many Intel
# CPUs (-march=native said rocketlake on a Xeon here) prefers 256-bit vectors, and then it does
# not combine a vector FMA written lane by lane (render/c.py) into one instruction: the 16-lane
# matmul tile became 256 scalar FMAs and shuffles, 30x slower (11 ms against 0.37 ms). The same
# operations in wider registers: no result changes
WIDE_VECTOR_FLAGS = ["-mprefer-vector-width=512"]
KERNELS_PER_PROCESS = 8   # compile_many starts another compiler per this many kernels (up to
                          # one per core)
BACKGROUND_GROUP_BYTES = 24 * 1024  # the source of one background build (runs_of_size)
THREAD_FLAGS = ["-fopenmp"]  # `#pragma omp parallel for` on big kernels (opt/ decides)
SIMD_FLAGS = ["-fopenmp-simd"]  # `#pragma omp simd` alone: the directive, no thread library
# idle OpenMP threads sleep, so they do not steal the other core from a notebook, a compiler or
# torch, but first they spin a little (GOMP_SPINCOUNT: some 0.1-1 ms): the next kernel of a
# step usually starts within microseconds, and a sleeping thread takes tens of them to wake.
# With no spin at all, the GPT step's ~300 threaded kernels each paid that wake-up: 47-56 ms a
# step against 38-39 ms with 200,000 spins (its forward 14-17 -> 10-11 ms, the MLP step
# 0.63-0.66 -> 0.43 ms) on a 2-core AVX-512 Xeon; 20,000 spins gave 41-44 ms
OMP_WAIT_POLICY.set_default()
GOMP_SPINCOUNT.set_default()

OPTIMIZED = "gcc -O2"  # the name DEBUG=2 gives the optimized tier (whichever CC built it)
# what lets gcc -O2 compute other bits than an unoptimized build (see the docstring)
REORDERING_MARKS = ("#pragma omp simd", "fp-contract=fast")
TCC_CANNOT = ("vector_size", "_Float16")  # tcc 0.9.27 knows neither


def supports_flags(compiler: str, flags: list[str]) -> bool:
    probe = "int main(void) { return 0; }\n"
    result = subprocess.run([compiler, *flags, "-x", "c", "-", "-o", os.devnull],
                            input=probe, capture_output=True, text=True)
    return result.returncode == 0


# ---- the target: which CPU the C is built for (CPU_ARCH) ----

NATIVE = "native"  # -march=native: the CPU this process runs on
# x86-64's micro-architecture levels (the psABI's): each adds these feature macros to the
# ones of the levels before it
X86_LEVELS = (
    ("x86-64", ("__SSE2__",)),
    ("x86-64-v2", ("__SSE3__", "__SSSE3__", "__SSE4_1__", "__SSE4_2__", "__POPCNT__")),
    ("x86-64-v3", ("__AVX__", "__AVX2__", "__BMI__", "__BMI2__", "__F16C__", "__FMA__",
                   "__LZCNT__", "__MOVBE__")),
    ("x86-64-v4", ("__AVX512F__", "__AVX512BW__", "__AVX512CD__", "__AVX512DQ__",
                   "__AVX512VL__")),
)
OTHER_ARCHITECTURES = {"__aarch64__": "aarch64", "__arm__": "arm", "__riscv": "riscv",
                       "__powerpc64__": "ppc64"}
VERSION_MACROS = {"clang": ("__clang_major__", "__clang_minor__", "__clang_patchlevel__"),
                  "gcc": ("__GNUC__", "__GNUC_MINOR__", "__GNUC_PATCHLEVEL__")}


def cpu_arch() -> str:
    """The CPU_ARCH setting: the -march= value of every build ("native" when unset or empty)."""
    return CPU_ARCH.value or NATIVE


def march_flags(arch: str) -> list[str]:
    """C_FLAGS for the target `arch`: its -march= in place of -march=native."""
    return [f"-march={arch}" if flag == f"-march={NATIVE}" else flag for flag in C_FLAGS]


@memo("cpu.predefined_macros")
@functools.cache
def _predefine(compiler: str, arch: str) -> subprocess.CompletedProcess[str]:
    """One preprocessor run that prints the macros for -march=arch (~10 ms; once a process)."""
    return subprocess.run([compiler, f"-march={arch}", "-dM", "-E", "-x", "c", "-"],
                          input="", capture_output=True, text=True)


def target_macros(compiler: str, arch: str) -> str:
    """What the compiler predefines for -march=arch (`#define __AVX2__ 1`, ...); "" if it
    does not know that target."""
    result = _predefine(compiler, arch)
    return result.stdout if result.returncode == 0 else ""


def native_macros(compiler: str) -> str:
    """What the compiler predefines for the device's target: -march=native, this CPU, unless
    CPU_ARCH names another (a build for x86-64-v3 has no `__AVX512F__`, whatever this CPU has)."""
    return target_macros(compiler, cpu_arch())


def instruction_sets(macros: str) -> set[str]:
    """The feature macros among `macros`: `__AVX2__`, `__FMA__`, `__AVX512F__`, ..."""
    return set(re.findall(r"^#define (__[A-Z0-9_]+__) 1$", macros, re.MULTILINE))


def isa_level(macros: str) -> str:
    """The highest x86-64 level whose instructions the macros promise (x86-64-v4: AVX-512,
    v3: AVX2 and FMA, v2: SSE4.2); on another CPU, its architecture's name."""
    if "#define __x86_64__ " not in macros:
        found = [name for macro, name in OTHER_ARCHITECTURES.items()
                 if f"#define {macro} " in macros]
        return found[0] if found else "unknown"
    have, needed, level = instruction_sets(macros), set(), "x86-64"
    for name, features in X86_LEVELS:
        needed |= set(features)
        if not needed <= have:
            break
        level = name
    return level


def compiler_version(macros: str) -> str:
    """The compiler and its version, "gcc 12.2.0" or "clang 14.0.6", read from its own macros
    (clang defines gcc's too, with an old version: its own are asked first)."""
    values = dict(re.findall(r"^#define (\w+) (.*)$", macros, re.MULTILINE))
    for family, parts in VERSION_MACROS.items():
        if all(part in values for part in parts):
            return f"{family} {'.'.join(values[part] for part in parts)}"
    return "an unknown compiler"


def missing_instructions(target: str, native: str) -> list[str]:
    """The feature macros the target defines and this CPU's own (-march=native) does not: the
    instructions a build for the target may use that this CPU cannot run."""
    return sorted(instruction_sets(target) - instruction_sets(native))


@dataclass(frozen=True)
class CPUTarget:
    """The CPU the device's C is built for: a -march= value (CPU_ARCH) and what the compiler
    predefines for it, from which its level, its vector lanes and the compiler are read."""

    compiler: str
    arch: str
    macros: str

    @property
    def level(self) -> str:
        return isa_level(self.macros)

    @property
    def lanes(self) -> int:
        """The float32 lanes of its vector registers (CPU_VECTOR_WIDTH may render others)."""
        return native_vector_width(self.macros)

    @property
    def fused_multiply_add(self) -> bool:
        """Has it a fused multiply-add instruction? (render/c.py writes vector FMAs then)"""
        return "#define __FP_FAST_FMAF " in self.macros

    def describe(self, lanes: int) -> str:
        """One line: "x86-64-v4 (native), 16 float lanes, gcc 12.2.0 (cc)", with the lanes
        the renderer uses (and the target's own, when CPU_VECTOR_WIDTH pinned others)."""
        where = self.level if self.arch == self.level else f"{self.level} ({self.arch})"
        width = f"{lanes} float lanes" if lanes else "no vectors"
        if lanes != self.lanes:
            width += f" (CPU_VECTOR_WIDTH; the target's own: {self.lanes})"
        return f"{where}, {width}, {compiler_version(self.macros)} ({Path(self.compiler).name})"


def cpu_target(compiler: str, arch: str | None = None) -> CPUTarget:
    """The target `arch` (default: the CPU_ARCH setting), checked: the compiler must know it
    and this CPU must be able to run what is built for it. Either failure is a ValueError
    that names CPU_ARCH and says which."""
    return _checked_target(compiler, cpu_arch() if arch is None else arch)


@memo("cpu.checked_targets")
@functools.cache
def _checked_target(compiler: str, arch: str) -> CPUTarget:
    if arch == NATIVE:  # as always: a compiler without -march=native builds without vectors
        return CPUTarget(compiler, arch, target_macros(compiler, arch))
    result = _predefine(compiler, arch)
    if result.returncode != 0:
        # the error, and the values it knows, on one line
        message = "; ".join(line.strip() for line in result.stderr.splitlines() if line.strip())
        raise ValueError(f"CPU_ARCH={arch!r}: {Path(compiler).name} rejects -march={arch}: "
                         f"{message}")
    native = target_macros(compiler, NATIVE)
    missing = missing_instructions(result.stdout, native) if native else []
    if missing:
        raise ValueError(f"CPU_ARCH={arch!r}: this CPU cannot run code built for {arch}: it "
                         f"lacks {', '.join(m.strip('_') for m in missing)} (the feature macros "
                         f"-march={arch} defines and -march=native does not)")
    return CPUTarget(compiler, arch, result.stdout)


def describe_target() -> str:
    """The CPU device's target in one line, as the test summary's device table prints it:
    "x86-64-v4 (native), 16 float lanes, gcc 12.2.0 (cc)". It reads CC, CPU_ARCH and
    CPU_VECTOR_WIDTH as the device does (DeviceUnavailable without a compiler, ValueError for
    a bad setting); the compiler is asked once a process (one or two preprocessor runs)."""
    target = cpu_target(find_c_compiler())
    return target.describe(vector_width(target.macros))


def native_vector_width(macros: str) -> int:
    """How many float32 lanes the vector registers of the target whose macros these are hold
    (native_macros: this CPU's, unless CPU_ARCH names another): 16 with AVX-512, 8 with AVX,
    4 with SSE2 or NEON, else 0 (no vectors)."""
    for macro, width in (("__AVX512F__", 16), ("__AVX__", 8), ("__SSE2__", 4),
                         ("__ARM_NEON", 4)):
        if f"#define {macro} " in macros:
            return width
    return 0


VECTOR_WIDTHS = (0, 2, 4, 8, 16)


def vector_width(macros: str) -> int:
    """The lanes the CPU renderer uses: `CPU_VECTOR_WIDTH` when set (0 turns vectors off; the
    book's stored outputs are those of a 16-lane CPU), else what the target has (this CPU,
    unless CPU_ARCH names another)."""
    wanted = CPU_VECTOR_WIDTH.value
    if wanted is None:
        return native_vector_width(macros)
    if not wanted.isdigit() or int(wanted) not in VECTOR_WIDTHS:
        raise ValueError(f"CPU_VECTOR_WIDTH={wanted!r}: give one of {VECTOR_WIDTHS} (float32 "
                         "lanes per vector; 0 turns vectors off)")
    return int(wanted)


def find_c_compiler() -> str:
    wanted = CC.value
    candidates = [wanted] if wanted else ["cc", "gcc", "clang"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    raise DeviceUnavailable(f"no C compiler found (tried {candidates}); install gcc or clang, "
                            "or set CC")


def cache_dir() -> Path:
    """The compiled kernels' folder: ~/.cache/tinyteach/cpu, or under `TINYTEACH_CACHE`."""
    return helpers.cache_dir("cpu")


def explain_compile_error(source: str, message: str) -> str:
    """The compiler's message, followed by each source line it complains about."""
    lines = source.splitlines()
    shown = []
    for number in sorted({int(n) for n in re.findall(r"<stdin>:(\d+):", message)}):
        if 1 <= number <= len(lines):
            shown.append(f"  line {number}: {lines[number - 1].strip()}")
    where = "\n".join(shown) if shown else source
    return f"kernel failed to compile:\n{message.strip()}\nin:\n{where}"


# ---- the fast tier ----

def needs_optimized_build(source: str) -> bool:
    """True when gcc -O2 may compute other bits than an unoptimized build of `source` (it may
    reorder a sum under `omp simd`, or fuse a multiply-add): such a kernel skips the fast tier."""
    return any(mark in source for mark in REORDERING_MARKS)


def starts_optimized(source: str, heavy: bool = False) -> bool:
    """Does `source` skip the fast tier? When its bits could differ (needs_optimized_build),
    or when it is `heavy`, so much work that its unoptimized build would run longer than the
    optimized build takes to compile (its ProgramSpec's flag: render/c.py, HEAVY_WORK)."""
    return heavy or needs_optimized_build(source)


class FastCompiler:
    """The fast tier: tcc where it is installed and can read the source (a few ms), else the
    main compiler at -O0 (a process start and no optimizer: ~5x faster than -O2 here). Its
    libraries live in a temporary directory for this process only, never in the cache."""

    def __init__(self, compiler: str, flags: list[str],
                 openmp_flags: Callable[[str], list[str]] = lambda source: []):
        self.tcc = shutil.which("tcc")
        self.unoptimized = [compiler, *["-O0" if f == "-O2" else f for f in flags]]
        self.openmp_flags = openmp_flags
        self.unoptimized_name = f"{Path(compiler).name} -O0"
        self._directory: Path | None = None
        self._directory_lock = threading.Lock()  # made once, from whichever thread asks first

    def tier_for(self, source: str) -> str:
        """The name of the tier that builds `source`: "tcc" or "<cc> -O0"."""
        if self.tcc and not any(word in source for word in TCC_CANNOT):
            return "tcc"
        return self.unoptimized_name

    def build(self, source: str, tier: str) -> Path | None:
        """A library of `source` built by `tier`, or None if that compiler refused it (the
        optimized build then reports the error)."""
        digest = hashlib.sha256(f"{tier}\n{source}".encode()).hexdigest()[:32]
        output = self.directory() / f"{digest}.so"
        if output.exists():  # never rewrite a library that may be loaded: the same one again
            return output
        temporary = output.with_suffix(f".{threading.get_ident()}.tmp")
        if tier == "tcc":
            command = [str(self.tcc), "-shared", "-o", str(temporary), "-", "-lm"]
        else:
            command = [*self.unoptimized, *self.openmp_flags(source), "-x", "c", "-", "-o",
                       str(temporary), "-lm"]
        result = subprocess.run(command, input=source, capture_output=True, text=True)
        if result.returncode != 0:
            temporary.unlink(missing_ok=True)
            return None
        os.replace(temporary, output)
        return output

    def directory(self) -> Path:
        with self._directory_lock:
            if self._directory is None:
                self._directory = Path(tempfile.mkdtemp(prefix="tinyteach-fast-tier-"))
                atexit.register(shutil.rmtree, self._directory, True)
            return self._directory


class OptimizedBuild:
    """A library that gcc -O2 builds in the background. Programs wait on it with `when_done`:
    each is called once with the library's path (None if the build failed)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.error: str | None = None
        self.started = time.perf_counter()
        self.seconds = 0.0  # how long the build took, once done
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._waiting: list[Callable[[Path | None], None]] = []

    def when_done(self, callback: Callable[[Path | None], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._waiting.append(callback)
                return
        callback(self.path)

    def finish(self, path: Path | None, error: str | None = None) -> None:
        with self._lock:
            self.path, self.error = path, error
            self.seconds = time.perf_counter() - self.started
            self._done.set()
            waiting, self._waiting = self._waiting, []
        for callback in waiting:
            callback(path)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the build is done (True) or `timeout` seconds passed (False)."""
        return self._done.wait(timeout)


@dataclass
class TieredBinary:
    """What `compile_many` returns for a kernel that starts on the fast tier: a library to run
    now, the tier that built it, and the optimized build to swap in when it is done."""

    fast: Path
    tier: str
    optimized: OptimizedBuild
    optimized_tier: str = "gcc -O2"  # what DEBUG=2 calls the optimized build


_background: ThreadPoolExecutor | None = None
_pending: list[Future] = []  # background builds not yet finished


def background() -> ThreadPoolExecutor:
    """One worker thread for the optimized builds. Python waits for it at exit, so builds in
    flight still reach the disk cache (the next process starts warm)."""
    global _background
    if _background is None:
        _background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinyteach-optimize")
    return _background


def wait_for_optimized_builds(timeout: float | None = None) -> None:
    """Block until every background build started so far is done (tests and benchmarks)."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    for future in list(_pending):
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        future.result(left)


def chunks_of(sources: list[str], per_process: int = KERNELS_PER_PROCESS) -> list[list[str]]:
    """Groups of sources for one compiler process each: one per `per_process` kernels, up to
    one per core (starting gcc costs ~50 ms, and each process runs on its own core)."""
    if not sources:
        return []
    groups = min(os.cpu_count() or 1, max(1, len(sources) // per_process))
    size = -(-len(sources) // groups)
    return [sources[start:start + size] for start in range(0, len(sources), size)]


def balanced_groups(sources: list[str], groups: int) -> list[list[str]]:
    """`sources` in at most `groups` groups of about the same length of source, each in the
    given order: the longest first, each into the group with the least so far (LPT). gcc's
    time grows with the source, and the compile of a schedule is done when its last compiler
    is: split by count, the GPT step's waited kernels made a group of 439 KB beside one of
    95 KB, 11.2 s against 2.8 s."""
    loads = [0] * max(1, min(groups, len(sources)))
    group_of: dict[int, int] = {}
    for k in sorted(range(len(sources)), key=lambda k: -len(sources[k])):
        lightest = loads.index(min(loads))
        group_of[k] = lightest
        loads[lightest] += len(sources[k])
    members: list[list[str]] = [[] for _ in loads]
    for k, source in enumerate(sources):
        members[group_of[k]].append(source)
    return [group for group in members if group]


def runs_of_size(sources: list[str], nbytes: int | None = None) -> list[list[str]]:
    """Consecutive runs of `sources` of about `nbytes` (BACKGROUND_GROUP_BYTES) of source each
    (one source at least):
    the groups of the optimized builds behind the fast tier. A group's kernels swap to their
    optimized build together, when its compiler is done, so small groups swap early (one
    compiler process still builds several kernels: starting gcc costs ~50 ms)."""
    nbytes = BACKGROUND_GROUP_BYTES if nbytes is None else nbytes
    runs: list[list[str]] = []
    size = nbytes
    for source in sources:
        if size >= nbytes:
            runs.append([])
            size = 0
        runs[-1].append(source)
        size += len(source)
    return runs


# ---- the compiler ----

class ClangStyleCompiler(Compiler):
    """Compiles C source to a shared object with gcc or clang, with an on-disk cache; for
    `compile_many`, with a fast tier first (see the module docstring)."""

    builds_together = True  # one shared object per core for a schedule's new kernels

    def __init__(self, compiler: str, arch: str | None = None):
        self.compiler = compiler
        self.target = cpu_target(compiler, arch)  # CPU_ARCH's, unless `arch` names one
        selects = SELECT_FLAGS if supports_flags(compiler, SELECT_FLAGS) else []
        # every build's (the fast tier's cc -O0 too); `openmp_flags` adds OpenMP's
        wide = WIDE_VECTOR_FLAGS if self.target.lanes >= 16 and \
            supports_flags(compiler, [*march_flags(self.target.arch), *WIDE_VECTOR_FLAGS]) else []
        self.flags = [*march_flags(self.target.arch), *selects, *wide]
        self.threads = THREAD_FLAGS if supports_flags(compiler, THREAD_FLAGS) else []
        self.simd = SIMD_FLAGS if supports_flags(compiler, SIMD_FLAGS) else self.threads
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True)
        self.cache_key = (f"{compiler} {version.stdout.splitlines()[0]} {' '.join(self.flags)} "
                          f"openmp: {' '.join(self.threads + self.simd)} {machine_identity()}")
        self.fast = FastCompiler(compiler, self.flags, self.openmp_flags)
        self.optimized_tier = f"{Path(compiler).name} -O2"

    def openmp_flags(self, source: str) -> list[str]:
        """OpenMP's flag, only for a source that has its pragmas: -fopenmp for threads
        (`omp parallel`, which needs the thread library), the lighter -fopenmp-simd for
        `omp simd` alone. Without pragmas either flag changes no instruction, and each cost
        gcc ~15 ms per build here; most kernels have no pragma."""
        if "#pragma omp parallel" in source:
            return self.threads
        return self.simd if "#pragma omp simd" in source else []

    def library_path(self, source: str) -> Path:
        """Where the cache keeps the optimized library of `source`."""
        digest = hashlib.sha256((self.cache_key + "\n" + source).encode()).hexdigest()
        return cache_dir() / f"{digest[:32]}.so"

    def compile(self, source: str) -> Path:
        """Compile (or find in the cache) and return the optimized shared object's path. A
        background build (`_optimize`) is this same call, at the kernels' own priority."""
        target = self.library_path(source)
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
        os.close(handle)
        command = [self.compiler, *self.flags, *self.openmp_flags(source), "-x", "c", "-", "-o",
                   temporary, "-lm"]
        # (not under `nice`: at `nice -n 10`, against a training loop's OpenMP threads,
        # which spin between kernels, gcc got a tenth of a core, and a GPT's last fast-tier
        # kernels swapped after ~65 steps instead of ~7; 60 steps from a cold start took
        # 8.5-9.4 s instead of 7.4-8.3, beautiful_mnist's 10.4 instead of 9.9-10.0, on a
        # 2-core Xeon)
        result = subprocess.run(command, input=source, capture_output=True, text=True)
        if result.returncode != 0:
            os.unlink(temporary)
            raise CompileError(explain_compile_error(source, result.stderr))
        os.replace(temporary, target)  # atomic: readers see the old state or the whole file
        return target

    def tiering(self) -> bool:
        """Whether compile_many may hand out fast-tier builds now (not under BEAM, which times
        the builds it is given)."""
        return bool(CPU_TIERED) and not BEAM >= 1

    def compile_many(self, sources: list[str], heavy: Sequence[bool] = (),
                     costs: Sequence[int] = ()) -> list[Path | TieredBinary]:
        """Several kernels (with different function names) in a few shared objects: one
        compiler process per core instead of one per kernel, all running at once. Kernels
        that skip the fast tier (starts_optimized; `heavy[k]`: the k-th kernel's ProgramSpec
        flag, False when not given) are grouped apart from the others, one group per core of
        about the same length of source; with tiering, the others' groups that are not in the
        cache start on the fast tier and are optimized in the background, the costliest first
        (`costs[k]`: the k-th spec's instructions; in the given order when not given). Each
        kernel's program loads its group's library."""
        flags = list(heavy) or [False] * len(sources)
        for name, given in (("heavy flags", heavy), ("costs", costs)):
            if given and len(given) != len(sources):
                raise ValueError(f"compile_many: {len(given)} {name} for {len(sources)} sources")
        waits = {s for s, flag in zip(sources, flags) if starts_optimized(s, flag)}
        waited = [s for s in sources if s in waits]
        exact = [s for s in sources if s not in waits]
        if costs:  # first what saves the most time per step for each byte gcc reads
            cost = dict(zip(sources, costs))
            exact.sort(key=lambda source: -cost[source] / len(source))
        # the kernels that skip the fast tier are waited for: spread them over every core
        groups = balanced_groups(waited, os.cpu_count() or 1) + (
            runs_of_size(exact) if self.tiering() else chunks_of(exact))
        late = [g for g in groups if self.tiering() and g[0] not in waits
                and not self.library_path("\n".join(g)).exists()]
        now = [g for g in groups if not any(g is other for other in late)]
        with ThreadPoolExecutor(len(now) + 1) as pool:  # the threads only wait for compilers
            fast = pool.submit(self._fast_tier, late)
            built = list(pool.map(lambda group: self.compile("\n".join(group)), now))
            binaries, queued = fast.result()
        # the fast tier's optimized builds start only now: started with the fast tier, they
        # took cores from the optimized builds this call was waiting for
        self._queue_optimized(queued)
        for group, library in zip(now, built):
            binaries.update(dict.fromkeys(group, library))
        if DEBUG >= 2 and late:
            print(f"    CPU compile: {sum(map(len, late))} of {len(sources)} new kernels on the "
                  f"fast tier, {self.optimized_tier} builds them in the background")
        return [binaries[source] for source in sources]

    def _fast_tier(self, groups: list[list[str]]) -> tuple[dict[str, Path | TieredBinary],
                                                           list[tuple[list[str], OptimizedBuild]]]:
        """Fast-tier libraries for `groups` (one per tier), and the optimized builds to queue
        for them (`_queue_optimized`). A group the fast tier refuses is compiled optimized
        now."""
        by_tier: dict[str, list[str]] = {}
        for source in (s for group in groups for s in group):
            by_tier.setdefault(self.fast.tier_for(source), []).append(source)
        # the tiers build at once (tcc's few ms overlap cc -O0's vector kernels)
        with ThreadPoolExecutor(max(1, len(by_tier))) as pool:
            building = {tier: pool.submit(self.fast.build, "\n".join(part), tier)
                        for tier, part in by_tier.items()}
        fast_libraries = {tier: future.result() for tier, future in building.items()}
        binaries: dict[str, Path | TieredBinary] = {}
        queued: list[tuple[list[str], OptimizedBuild]] = []
        for group in groups:
            tiers = [self.fast.tier_for(source) for source in group]
            if any(fast_libraries[tier] is None for tier in tiers):
                binaries.update(dict.fromkeys(group, self.compile("\n".join(group))))
                continue
            build = OptimizedBuild()
            queued.append((group, build))
            for source, tier in zip(group, tiers):
                library = fast_libraries[tier]
                assert library is not None
                binaries[source] = TieredBinary(library, tier, build, self.optimized_tier)
        return binaries, queued

    def _queue_optimized(self, queued: list[tuple[list[str], OptimizedBuild]]) -> None:
        """Hand the optimized builds to the background thread."""
        if queued:
            _pending[:] = [future for future in _pending if not future.done()]
            _pending.append(background().submit(self._optimize, queued))

    def _optimize(self, queued: list[tuple[list[str], OptimizedBuild]]) -> None:
        """In the background thread: the optimized builds of the groups, in their order, one
        compiler per core; each group swaps in as soon as its build is done."""
        def build_one(group: list[str], build: OptimizedBuild) -> None:
            try:
                build.finish(self.compile("\n".join(group)))
            except (CompileError, OSError) as error:  # the fast tier's build keeps running
                build.finish(None, str(error))
        with ThreadPoolExecutor(min(len(queued), os.cpu_count() or 1)) as pool:
            list(pool.map(lambda item: build_one(*item), queued))

    def compile_glue(self, source: str) -> Path:
        """C that only calls other functions (the graph runner below): tcc builds it as well
        as gcc -O2 would, in milliseconds. Without tcc: the optimized, cached build."""
        if self.fast.tcc and CPU_TIERED:
            library = self.fast.build(source, "tcc")
            if library is not None:
                return library
        return self.compile(source)


# ---- programs and graphs ----

class CPUProgram:
    """A compiled kernel: call it with Buffers, it passes their addresses to the C function.
    Given a TieredBinary, it runs the fast tier's function until the optimized build is done,
    then swaps (from the background thread; a call in flight finishes on the old code)."""

    swaps = 0  # how many programs have swapped so far (graphs re-read their pointers)
    _swaps_lock = threading.Lock()  # builds finish in several threads at once

    def __init__(self, name: str, binary: Path | TieredBinary):
        self.name = name
        self.libraries: list[ctypes.CDLL] = []  # all stay loaded: a graph may hold the old one
        self.announce = False  # a DEBUG=2 note is due at the next launch
        self.optimized_tier = ""
        if isinstance(binary, TieredBinary):
            self._load(binary.fast, binary.tier)
            self.optimized_tier = binary.optimized_tier
            self.announce = True
            binary.optimized.when_done(self._swap)
        else:
            self._load(binary, "optimized")

    def _load(self, path: Path, tier: str) -> None:
        library = ctypes.CDLL(str(path))
        function = getattr(library, self.name)
        function.restype = None
        self.libraries.append(library)
        self.function, self.tier = function, tier

    def _swap(self, path: Path | None) -> None:
        if path is None:  # the optimized build failed: stay on the fast tier
            self.announce = False
            return
        # load first, count second: a graph that sees the new count finds the new function
        self._load(path, "optimized")
        self.announce = True
        with CPUProgram._swaps_lock:
            CPUProgram.swaps += 1

    @property
    def tier_name(self) -> str:
        """The build a launch runs now, as DEBUG=2 names it: "tcc", "cc -O0" or "cc -O2"."""
        if self.tier != "optimized":
            return self.tier
        if not self.optimized_tier:  # built optimized at once: name the CPU's compiler
            self.optimized_tier = getattr(Device["CPU"].compiler, "optimized_tier", OPTIMIZED)
        return self.optimized_tier

    def function_address(self) -> int:
        """The address of the C function a launch calls now (a graph calls it directly)."""
        address = ctypes.cast(self.function, ctypes.c_void_p).value
        assert address is not None
        return address

    def _note(self) -> None:
        if self.tier == "optimized":
            print(f"    {self.name}: now runs its {self.optimized_tier} build")
            self.announce = False
        else:
            print(f"    {self.name}: runs its {self.tier} build ({self.optimized_tier} is "
                  "compiling in the background)")

    def __call__(self, *buffers: Buffer, vals: tuple[int, ...] = ()) -> None:
        """Run on the buffers' addresses, then the Variables' values (`const int i`)."""
        if self.announce and DEBUG >= 2:
            self._note()
        function = self.function
        if function.argtypes is None:  # once per loaded function: ctypes then takes plain
            # ints as pointers, in C; a Variable's value (`const int i`) after the buffers
            function.argtypes = [ctypes.c_void_p] * len(buffers) + [ctypes.c_int] * len(vals)
        # (a buffer's memory is allocated before its launch: `_storage` saves the property)
        function(*[(buffer._storage or buffer.storage).address for buffer in buffers], *vals)


@runtime_checkable
class NativeKernel(Protocol):
    """What a graph executor needs of a launch's program: the address of the native function
    it runs now (CPUProgram is one; a program that swaps tiers changes its answer)."""

    name: str

    def function_address(self) -> int: ...


def native_kernels(launches: list[Any]) -> list[NativeKernel]:
    """Each launch's program (`launch.runner.program`), checked to be a NativeKernel."""
    kernels = []
    for number, launch in enumerate(launches):
        program = getattr(getattr(launch, "runner", None), "program", None)
        if not isinstance(program, NativeKernel):
            raise TypeError(f"launch {number} runs {type(program).__name__}, not a compiled "
                            "CPU kernel: the CPU graph replays only those")
        kernels.append(program)
    return kernels


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
    The buffer addresses live in one C array; a replay only rewrites the places of the
    plan's input slots, from the plan's buffers. The kernels' addresses live in another,
    re-read after a program swapped tiers."""

    def __init__(self, launches: list[Any], slots: list[tuple[int, ...]],
                 inputs: set[int]) -> None:
        arities = [len(launch.buffers) for launch in launches]
        compiler = Device["CPU"].compiler
        assert isinstance(compiler, ClangStyleCompiler)
        library_path = compiler.compile_glue(render_graph(arities))
        self.library = ctypes.CDLL(str(library_path))
        self.run = self.library.run_graph
        self.run.restype = None
        self.programs = native_kernels(launches)
        self.kernels = (ctypes.c_void_p * len(self.programs))()
        self._read_kernels()
        flat = [slot for launch_slots in slots for slot in launch_slots]
        self.places = [(index, slot) for index, slot in enumerate(flat) if slot in inputs]
        captured = [buffer for launch in launches for buffer in launch.buffers]
        addresses = [None if slot in inputs else buffer.storage.address  # (inputs: each call)
                     for buffer, slot in zip(captured, flat)]
        self.buffers = (ctypes.c_void_p * len(addresses))(*addresses)

    def _read_kernels(self) -> None:
        self.swaps_seen = CPUProgram.swaps  # read first: a swap from now on is seen next time
        for k, program in enumerate(self.programs):
            self.kernels[k] = program.function_address()

    def __call__(self, buffers: list[Buffer]) -> None:
        if CPUProgram.swaps != self.swaps_seen:
            self._read_kernels()
        for index, slot in self.places:
            self.buffers[index] = buffers[slot].storage.address
        self.run(self.kernels, self.buffers)


def make_backend() -> Backend:
    compiler = ClangStyleCompiler(find_c_compiler())  # for CPU_ARCH's target, checked
    target = compiler.target
    # a vector multiply-add is written as fused where the target has the instruction
    # (render/c.py); the lanes are the target's, unless CPU_VECTOR_WIDTH pins them
    renderer = CRenderer(vector_width=vector_width(target.macros),
                         fused_multiply_add=target.fused_multiply_add)
    backend = Backend("CPU", HostAllocator(), renderer, compiler, CPUProgram)
    backend.graph = CPUGraph
    return backend
