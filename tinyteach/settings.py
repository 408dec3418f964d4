"""Every setting tinyteach reads, in one place: its name, its default and what it does.

What this lists:
- **ContextVars** (tinygrad's settings): read once from the environment (`DEBUG=4 python x.py`),
  changed for a block with `with Context(DEBUG=4): ...`;
- **environment variables** read as they are (`CPU_ARCH`, `CC`, `TINYTEACH_CACHE`, ...): each
  is read where it is used, most when a device is first opened;
- **limits**: module constants the scheduler and the packer cut at (`MAX_KERNEL_DEPTH`, ...),
  which a test may change; they are no settings, but what is scheduled depends on them.

`snapshot()` is the value of everything here that changes what is scheduled or compiled for
the same graph: the plan cache puts it in each key. The README's settings table is checked
against `knobs()` (tests/test_settings.py). Builds on nothing; every other module uses it.

>>> with Context(DEBUG=2):
...     DEBUG.value
2
>>> knobs()["CPU_ARCH"].meaning.split(":")[0]
'the -march= of every CPU build'
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar


def getenv(key: str, default: Any = 0) -> Any:
    """Read a setting from the environment, as the type of `default` (tinygrad's helper):
    `getenv("DEBUG")` is an int, `getenv("DEV", "")` a string."""
    if key not in os.environ:
        return default
    return type(default)(os.environ[key])


class ContextVar:
    """A named setting with a value taken from the environment; `Context` changes it for a block.
    `apply`, if given, is called with every new value (DEFAULT_FLOAT sets dtypes.default_float);
    `meaning` is its line in the README's table; `compiles` says whether the same graph may be
    scheduled or compiled differently under another value (then it is part of `snapshot()`)."""

    registry: ClassVar[dict[str, ContextVar]] = {}
    # every setting's value, in registry order, kept up to date by set(): the plan cache puts
    # it in each key, and rebuilding it on every eager realize would cost more than the lookup
    values: ClassVar[tuple[Any, ...]] = ()
    # the values of those that compile, in registry order: snapshot()'s first part
    compiled: ClassVar[tuple[Any, ...]] = ()
    meaning: str
    compiles: bool

    def __init__(self, key: str, default: Any, apply: Callable[[Any], Any] | None = None,
                 meaning: str = "", compiles: bool = True):
        earlier = ContextVar.registry.get(key)
        if earlier is not None and not meaning:  # defined again (an old module's own copy)
            meaning, compiles = earlier.meaning, earlier.compiles
        self.key, self.default, self.apply = key, default, apply
        self.meaning, self.compiles = meaning, compiles
        self.value = default
        ContextVar.registry[key] = self
        self.set(getenv(key, default))

    def set(self, value: Any) -> None:
        """Change the value: ints stay ints, other settings are checked by `apply`."""
        if isinstance(self.value, int) and not isinstance(value, int):
            value = int(value)
        if self.apply is not None:
            self.apply(value)
        self.value = value
        every = ContextVar.registry.values()
        ContextVar.values = tuple(var.value for var in every)
        ContextVar.compiled = tuple(var.value for var in every if var.compiles)

    @property
    def shown_default(self) -> str:
        """The default as the README's table writes it."""
        return '""' if self.default == "" else str(self.default)

    def watch(self, apply: Callable[[Any], Any]) -> None:
        """Call `apply` with the value now and with every new one: a module above this one
        that acts on the setting (dtype.py sets dtypes.default_float from DEFAULT_FLOAT)."""
        apply(self.value)
        self.apply = apply

    def __bool__(self) -> bool:
        return bool(self.value)

    def __ge__(self, other: int) -> bool:
        return self.value >= other

    def __gt__(self, other: int) -> bool:
        return self.value > other

    def __repr__(self) -> str:
        return f"{self.key}={self.value}"


@contextlib.contextmanager
def Context(**settings: Any) -> Iterator[None]:
    """Set settings for the duration of a `with` block: `with Context(DEBUG=4): ...`,
    `with Context(DEFAULT_FLOAT="float16"): ...`."""
    unknown = [key for key in settings if key not in ContextVar.registry]
    if unknown:
        raise KeyError(f"unknown setting(s) {unknown}; known: {sorted(ContextVar.registry)}")
    saved = {key: ContextVar.registry[key].value for key in settings}
    try:
        for key, value in settings.items():
            ContextVar.registry[key].set(value)
        yield
    finally:
        for key, value in saved.items():
            ContextVar.registry[key].set(value)


class EnvironmentVariable:
    """A setting read from the environment each time it is asked for, as a string (`value`:
    the variable, or `default` when it is unset). `shown_default` is how the README's table
    writes the default when it is not a plain value (CUDA_ARCH: the GPU's own)."""

    registry: ClassVar[dict[str, EnvironmentVariable]] = {}

    def __init__(self, key: str, default: str | None, meaning: str, shown_default: str = ""):
        if key in EnvironmentVariable.registry or key in ContextVar.registry:
            raise ValueError(f"the setting {key} is listed twice")
        self.key, self.default, self.meaning = key, default, meaning
        self.shown_default = shown_default or ("(unset)" if default is None else default)
        EnvironmentVariable.registry[key] = self

    @property
    def value(self) -> str | None:
        return os.environ.get(self.key, self.default)

    def get(self, fallback: Any) -> Any:
        """The variable, or `fallback` when it is unset (a default worked out by the caller)."""
        return os.environ.get(self.key, fallback)

    def set_default(self) -> None:
        """Put the default into the environment unless the variable is set: for a library
        that reads it (OpenMP, pocl)."""
        os.environ.setdefault(self.key, str(self.default))

    def __repr__(self) -> str:
        return f"{self.key}={self.value!r}"


# ---- the ContextVars ----

DEBUG = ContextVar("DEBUG", 0, compiles=False,
                   meaning="1 launches, 2 timings, 3 ASTs and fusion reasons, 4 generated "
                           "source, 5 rewrite steps")
NOOPT = ContextVar("NOOPT", 0, meaning="1: no kernel optimizations (tiles, vectors, threads, "
                                       "packing)")
BEAM = ContextVar("BEAM", 0, meaning="n: search each kernel's optimizations with a beam of "
                                     "width n, the choice cached on disk (opt/search.py)")
IGNORE_BEAM_CACHE = ContextVar("IGNORE_BEAM_CACHE", 0,
                               meaning="1: BEAM searches again instead of reading its cached "
                                       "choices (opt/search.py)")
TRAINING = ContextVar("TRAINING", 0, compiles=False,
                      meaning="1: dropout and batchnorm behave as in training (as "
                              "Tensor.training)")
DEFAULT_FLOAT = ContextVar("DEFAULT_FLOAT", "", compiles=False,
                           meaning="the dtype float data gets (HALF, float16, ...); empty: "
                                   "float32 (dtype.py)")
FUSE_ROWS = ContextVar("FUSE_ROWS", 1, meaning="0: reductions over rows that fit in cache are "
                                               "not fused into one kernel (engine/schedule.py)")
FIXED_LANES = ContextVar("FIXED_LANES", 1,
                         meaning="0: only sums are split into vector lanes, in the order the C "
                                 "compiler picks (codegen/lower.py)")
TRANSCENDENTAL = ContextVar("TRANSCENDENTAL", 1,
                            meaning="1: exp2 as arithmetic in vectorized loops; 2: every float32 "
                                    "exp2; 0: libm calls (codegen/transcendental.py)")
ROW_CACHE = ContextVar("ROW_CACHE", 1, meaning="0: a row kernel's column loop computes its exp "
                                               "again (render/c.py)")
CHANNEL_TILES = ContextVar("CHANNEL_TILES", 1,
                           meaning="0: no channel tiles for convolutions; the rest of packing "
                                   "stays (opt/pack.py)")
CPU_TIERED = ContextVar("CPU_TIERED", 1, meaning="0: no fast tier, every CPU kernel waits for "
                                                 "gcc -O2 (runtime/cpu.py)")
PLAN_CACHE = ContextVar("PLAN_CACHE", 1, compiles=False,
                        meaning="0: schedule every graph afresh, no plan cache (engine/realize.py)")
MEMORY_PLANNER = ContextVar("MEMORY_PLANNER", 1, compiles=False,
                            meaning="0: a TinyJit capture keeps a buffer for every intermediate "
                                    "(tinygrad's NO_MEMORY_PLANNER=1) (engine/jit.py)")

# ---- the environment variables ----

DEV = EnvironmentVariable("DEV", None, shown_default="the first of CPU, NUMPY that works",
                          meaning="the default device; `NAME=1` (e.g. `CPU=1`) says the same, "
                                  "as in tinygrad (device.py)")
CPU_ARCH = EnvironmentVariable("CPU_ARCH", "", shown_default="native",
                               meaning="the -march= of every CPU build: e.g. x86-64-v3; the "
                                       "vector width follows it (runtime/cpu.py)")
CPU_VECTOR_WIDTH = EnvironmentVariable("CPU_VECTOR_WIDTH", None, shown_default="the target's",
                                       meaning="float32 lanes of the CPU's vectors: 0, 2, 4, 8 "
                                               "or 16; 0 turns vectors off (runtime/cpu.py)")
CC = EnvironmentVariable("CC", None, shown_default="the first of cc, gcc, clang",
                         meaning="the C compiler of the CPU device (runtime/cpu.py)")
OMP_WAIT_POLICY = EnvironmentVariable("OMP_WAIT_POLICY", "PASSIVE",
                                      meaning="OpenMP's: idle kernel threads sleep, not spin; "
                                              "set when unset (runtime/cpu.py)")
GOMP_SPINCOUNT = EnvironmentVariable("GOMP_SPINCOUNT", "200000",
                                     meaning="gcc's OpenMP: how long an idle kernel thread "
                                             "spins before it sleeps; set when unset "
                                             "(runtime/cpu.py)")
OPENCL_PLATFORM = EnvironmentVariable("OPENCL_PLATFORM", None,
                                      shown_default="the first that builds and runs a probe",
                                      meaning="the OpenCL platform to use, by (part of) its "
                                              "name (runtime/opencl.py)")
POCL_SIGFPE_HANDLER = EnvironmentVariable("POCL_SIGFPE_HANDLER", "0",
                                          meaning="pocl's: 0, no process-wide SIGFPE handler "
                                                  "(C code still traps); set when unset "
                                                  "(runtime/opencl.py)")
XDG_RUNTIME_DIR = EnvironmentVariable("XDG_RUNTIME_DIR", None, shown_default="a fresh temp folder",
                                      meaning="the Vulkan driver's runtime folder, made when "
                                              "unset or empty (runtime/webgpu.py)")
CUDA_PATH = EnvironmentVariable("CUDA_PATH", None,
                                meaning="the CUDA toolkit, for NVRTC's cuda_fp16.h; before "
                                        "CUDA_HOME and /usr/local/cuda (runtime/cuda.py)")
CUDA_HOME = EnvironmentVariable("CUDA_HOME", None, meaning="the CUDA toolkit, when CUDA_PATH "
                                                           "is unset (runtime/cuda.py)")
CUDA_ARCH = EnvironmentVariable("CUDA_ARCH", None,
                                shown_default="the GPU's sm_XY; compute_80 without a GPU",
                                meaning="the architecture CUDA kernels are compiled for "
                                        "(runtime/cuda.py)")
TINYTEACH_CACHE = EnvironmentVariable("TINYTEACH_CACHE", None,
                                      shown_default="~/.cache/tinyteach",
                                      meaning="the folder of the caches on disk: compiled CPU "
                                              "kernels, BEAM's choices (helpers.py)")
TINYTEACH_MNIST_DIR = EnvironmentVariable("TINYTEACH_MNIST_DIR", None,
                                          shown_default="~/.cache/tinyteach/mnist",
                                          meaning="where the MNIST files are read from and "
                                                  "downloaded to (nn/datasets.py)")
TINYTEACH_MNIST_URL = EnvironmentVariable("TINYTEACH_MNIST_URL", None,
                                          shown_default="MNIST_URL in nn/datasets.py",
                                          meaning="where missing MNIST files are downloaded "
                                                  "from (nn/datasets.py)")


def chosen_device(names: Iterable[str]) -> str | None:
    """The device the environment asks for: `DEV=NAME`, else the first of `names` set to 1
    (tinygrad's `CPU=1`), else None."""
    wanted = DEV.value
    if wanted is None:
        wanted = next((name for name in names if os.environ.get(name) == "1"), None)
    return wanted


# ---- the limits: module constants that what is scheduled depends on ----

@dataclass(frozen=True)
class Limit:
    """A constant of another module (`module.name`) that changes how a graph is scheduled or
    packed. It stays in its module, where the code reads it and a test may change it;
    `snapshot()` reads each one, so the plan cache is keyed on it too."""

    module: str
    name: str
    meaning: str

    def value(self) -> Any:
        """The constant as its module holds it now (None before the module is imported)."""
        module = sys.modules.get(self.module)
        return None if module is None else getattr(module, self.name)


LIMITS = (
    Limit("tinyteach.engine.schedule", "MAX_KERNEL_DEPTH", "a chain of ops this deep is cut"),
    Limit("tinyteach.engine.schedule", "MAX_VIEWS_PER_NODE",
          "a node seen through this many views is stored"),
    Limit("tinyteach.engine.schedule", "BROADCAST_RECOMPUTE_LIMIT",
          "a node broadcast this many times into a reduction is stored"),
    Limit("tinyteach.engine.schedule", "MAX_FUSED_ROW_BYTES", "the longest row FUSE_ROWS fuses"),
    Limit("tinyteach.opt.pack", "PACK_MIN_ELEMENTS", "a smaller matmul operand is not packed"),
    Limit("tinyteach.opt.pack", "PACK_MIN_ROW_BYTES", "a shorter row step is not packed"),
)


def knobs() -> dict[str, ContextVar | EnvironmentVariable]:
    """Every setting by name, ContextVars first: what the README's table lists."""
    return {**ContextVar.registry, **EnvironmentVariable.registry}


def snapshot() -> tuple[Any, ...]:
    """The value of every setting and limit that may change what is scheduled or compiled for
    the same graph, hashable: the plan cache's key holds it. DEBUG and PLAN_CACHE (which take
    another path), TRAINING and DEFAULT_FLOAT (read while the graph is built) are not in it;
    nor are the environment variables, read when a device is opened (its name is in the key,
    and a device, once open, keeps what it read). The limits are read by name, as LIMITS lists
    them (a test holds the two together): an eager realize asks for this each time, and a loop
    over LIMITS would cost it a tenth of its time."""
    schedule = sys.modules.get("tinyteach.engine.schedule")
    pack = sys.modules.get("tinyteach.opt.pack")
    if schedule is None or pack is None:
        return (ContextVar.compiled,)  # nothing can be scheduled yet
    return (ContextVar.compiled, schedule.MAX_KERNEL_DEPTH, schedule.MAX_VIEWS_PER_NODE,
            schedule.BROADCAST_RECOMPUTE_LIMIT, schedule.MAX_FUSED_ROW_BYTES,
            pack.PACK_MIN_ELEMENTS, pack.PACK_MIN_ROW_BYTES)
