"""Chapter 7 (part 3): searching for optimizations — time the candidates, keep the fastest (BEAM).

What this teaches:
- a heuristic (opt.py) guesses which upcasts and threads suit a kernel; a **search** measures.
  Each *candidate* is a `KernelOptions`: it is lowered, rendered, compiled and run on scratch
  buffers of the kernel's sizes, and the fastest one wins;
- the search is a **beam search**, as in tinygrad: start from the heuristic's choice, try every
  *neighbour* (one upcast factor changed, threads switched, a vector tile made scalar), keep the
  `BEAM` fastest, try their neighbours, and stop when the best no longer changes (or after
  `MAX_ROUNDS`);
- timing is never allowed to trade correctness: every candidate's output is compared with the
  heuristic's on the same inputs, and one that disagrees is discarded;
- a search costs seconds (a compiler call per round), so its choice is cached, in memory and on
  disk (one small JSON file per kernel, keyed by device, compiler, machine and the kernel's AST):
  a second process reuses it without timing anything.

`BEAM=n` (environment, or `with Context(BEAM=2):`) turns the search on with a beam of width n;
`BEAM=0`, the default, keeps the heuristic and changes nothing. `DEBUG=2` prints one line per
searched kernel; `DEBUG=3`'s "optimizations of ..." line shows what was chosen. `NOOPT=1` wins
over `BEAM`. The search runs on CPU and OPENCL; on WEBGPU and CUDA (not tried: their timing and
buffers need more care) and on interpreters the heuristic is kept.

Scratch inputs: floats are random in [-1, 1], bools random, integers zero — an integer input may
be an index, and a random one could read out of bounds.

tinygrad: its BEAM also tries local (workgroup) sizes, unrolling of reduce loops and grouped
reductions, and times with the kernel's real buffers; tinyteach has only upcasts and threads.

Builds on: opt.py (the heuristic and KernelOptions), lower.py, device.py, helpers.py (the cache
folder, the machine's identity). Used by: realize.py (`options_for`, when a kernel is compiled).

The neighbours of "upcast axis 1 by 8" for a 32x32 output (a factor must divide the axis and
leave at least two loop iterations; a tile holds at most MAX_TILE outputs):

>>> for options in neighbours(KernelOptions(upcasts=((1, 8),)), (32, 32)):
...     print("; ".join(options.describe()) or "none")
upcast axis 0 by 2; upcast axis 1 by 8
upcast axis 0 by 4; upcast axis 1 by 8
upcast axis 0 by 8; upcast axis 1 by 8
upcast axis 0 by 16; upcast axis 1 by 8
none
upcast axis 1 by 2
upcast axis 1 by 4
upcast axis 1 by 16
upcast axis 1 by 8; threads: split the outer loop across cores
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tinyteach.device import Backend, Buffer, CompileError
from tinyteach.dtype import DType, dtypes
from tinyteach.helpers import BEAM, DEBUG, NOOPT, LRUCache, cache_dir, dedup, machine_identity, prod
from tinyteach.lower import lower
from tinyteach.opt import (
    MAX_UPCAST_AXES,
    KernelOptions,
    kernel_value,
    options_for_renderer,
    outer_loop_size,
)
from tinyteach.uop import Ops, UOp

SEARCHED_DEVICES = ("CPU", "OPENCL")
UPCAST_FACTORS = (2, 4, 8, 16, 32)
MAX_TILE = 256             # outputs per loop iteration (16x16): more spill out of registers
MAX_UNROLLED_NODES = 4096  # a tile copies the kernel's body: keep the copies compilable
MAX_ROUNDS = 3
REPEATS = 3                # timed runs per candidate; the minimum counts
SEARCH_VERSION = "1"       # bump when a cached choice should no longer be trusted


# ---- the candidates ----

def heuristic_options(backend: Backend, ast: UOp) -> KernelOptions:
    """What the hand-written heuristic (opt.py) would choose: the search's starting point.
    It reads the device's renderer: its vector width, and whether it can group-reduce."""
    return options_for_renderer(ast, backend.renderer)


def neighbours(options: KernelOptions, shape: tuple[int, ...], body_nodes: int = 1) \
        -> list[KernelOptions]:
    """Every KernelOptions one step away: one axis's upcast factor changed (or removed), or
    threads switched. Other fields of `options` are kept (`dataclasses.replace`).
    A group reduction takes no upcasts, vectors or threads: its neighbours are the other group
    sizes, the other way to combine, and no group at all. Local tiles and tensor cores neither:
    see `_tile_changes`."""
    if options.group:
        return _group_changes(options)
    if options.local_tile or options.tensor_core:
        return _tile_changes(options)
    found = [*_upcast_changes(options, shape, body_nodes), _threads_switched(options),
             _vectors_off(options)]
    return [o for o in dedup(found) if o is not None and o != options and _is_valid(o, shape)]


def _group_changes(options: KernelOptions) -> list[KernelOptions]:
    """Half and twice the threads per group (4 to 256), the other combine, and no group."""
    sizes = [size for size in (options.group // 2, options.group * 2) if 4 <= size <= 256]
    other = "serial" if options.group_combine == "tree" else "tree"
    return [*(dataclasses.replace(options, group=size) for size in sizes),
            dataclasses.replace(options, group_combine=other), KernelOptions()]


def _tile_changes(options: KernelOptions) -> list[KernelOptions]:
    """A local tile's neighbours: half and twice the tile (4 to 16 on a side: at most 256
    threads, which every GPU allows) and no tile. Tensor cores (a search starts from them
    where the heuristic chose them): the kernel without them."""
    if options.tensor_core:
        return [KernelOptions()]
    sizes = [size for size in (options.local_tile // 2, options.local_tile * 2) if 4 <= size <= 16]
    return [*(KernelOptions(local_tile=size) for size in sizes), KernelOptions()]


def _upcast_changes(options: KernelOptions, shape: tuple[int, ...],
                    body_nodes: int) -> list[KernelOptions]:
    changes = []
    current = dict(options.upcasts)
    largest_tile = min(MAX_TILE, max(1, MAX_UNROLLED_NODES // body_nodes))
    for axis, size in enumerate(shape):
        for factor in (1, *UPCAST_FACTORS):
            if factor == current.get(axis, 1) or size % factor or size < 2 * factor:
                continue
            changed = {**current, axis: factor}
            upcasts = tuple(sorted((a, f) for a, f in changed.items() if f != 1))
            if len(upcasts) <= MAX_UPCAST_AXES and prod(f for _, f in upcasts) <= largest_tile:
                changes.append(dataclasses.replace(options, upcasts=upcasts))
    return changes


def _threads_switched(options: KernelOptions) -> KernelOptions:
    return dataclasses.replace(options, parallel=not options.parallel)


def _vectors_off(options: KernelOptions) -> KernelOptions | None:
    """The same tile in scalars, when the tile was computed in vector registers."""
    if not options.vector_width:
        return None
    return dataclasses.replace(options, vector_width=0)


def _is_valid(options: KernelOptions, shape: tuple[int, ...]) -> bool:
    """Threads need an outer loop of at least 2 iterations to split; a vector tile (on the last
    upcast axis) a whole number of vectors."""
    width = options.vector_width
    if width and (not options.upcasts or options.upcasts[-1][1] % width):
        return False
    return not options.parallel or outer_loop_size(shape, options) >= 2


# ---- running a candidate ----

@dataclass
class Candidate:
    """One KernelOptions on its way through the search: compiled, checked, timed."""

    options: KernelOptions
    name: str
    source: str = ""
    program: Any = None
    seconds: float = math.inf  # inf: not timed, or discarded


def render_candidate(backend: Backend, name: str, ast: UOp, options: KernelOptions) -> str:
    """Lower and render one candidate (the tests replace this to inject a wrong kernel)."""
    return backend.renderer.render(name, lower(ast, options))


def compile_candidates(backend: Backend, candidates: list[Candidate]) -> list[Candidate]:
    """Compile all candidates in one compiler call when the device can (`compile_many`);
    the ones that fail to compile are dropped."""
    compiler = backend.compiler
    assert compiler is not None
    sources = [c.source for c in candidates]
    if hasattr(compiler, "compile_many") and len(candidates) > 1:
        try:
            binaries = compiler.compile_many(sources)
            return _load(backend, candidates, binaries)
        except CompileError:
            pass  # one bad candidate spoils the library: compile them one by one
    compiled, binaries = [], []
    for candidate in candidates:
        try:
            binaries.append(compiler.compile(candidate.source))
            compiled.append(candidate)
        except CompileError:
            continue
    return _load(backend, compiled, binaries)


def _load(backend: Backend, candidates: list[Candidate], binaries: list[Any]) -> list[Candidate]:
    for candidate, binary in zip(candidates, binaries):
        candidate.program = backend.program(candidate.name, binary)
    return candidates


@dataclass
class Scratch:
    """Buffers of the kernel's sizes and dtypes, and the contents every check starts from."""

    buffers: list[Buffer]
    contents: list[np.ndarray]

    def reset(self) -> None:
        """Put the starting contents back (a kernel may read its own output: in-place assign)."""
        for buffer, data in zip(self.buffers, self.contents):
            buffer.copyin(data)


def scratch_for(device: str, ast: UOp, seed: int = 0) -> Scratch:
    """One buffer per DEFINE_GLOBAL (arg: (index, size)), in parameter order."""
    defines = {n.arg[0]: n for n in ast.toposort if n.op is Ops.DEFINE_GLOBAL}
    rng = np.random.default_rng(seed)
    buffers, contents = [], []
    for index in sorted(defines):
        size, dtype = defines[index].arg[1], defines[index].dtype
        buffers.append(Buffer(device, size, dtype))
        contents.append(random_contents(rng, size, dtype))
    return Scratch(buffers, contents)


def random_contents(rng: np.random.Generator, size: int, dtype: DType) -> np.ndarray:
    if dtypes.is_float(dtype):
        return rng.uniform(-1, 1, size).astype(dtype.np)
    if dtype == dtypes.bool:
        return rng.random(size) < 0.5
    return np.zeros(size, dtype=dtype.np)  # an int may be an index: 0 is always in bounds


def output_of(backend: Backend, candidate: Candidate, scratch: Scratch) -> np.ndarray:
    """Run the candidate once from the starting contents; its output (buffer 0)."""
    scratch.reset()
    candidate.program(*scratch.buffers)
    backend.synchronize()
    return scratch.buffers[0].numpy()


def agrees(output: np.ndarray, reference: np.ndarray, dtype: DType) -> bool:
    """Same values, up to float rounding (a vectorized sum adds in another order)."""
    if not dtypes.is_float(dtype):
        return bool(np.array_equal(output, reference))
    tolerance = 1e-2 if dtype.itemsize <= 2 else 1e-3
    return bool(np.allclose(output, reference, rtol=tolerance, atol=tolerance, equal_nan=True))


def time_candidate(backend: Backend, candidate: Candidate, scratch: Scratch,
                   best_so_far: float) -> float:
    """The fastest of a few runs, in seconds. A candidate far slower than the best so far
    is not run again: one run is enough to know it will not win."""
    fastest = math.inf
    for _ in range(REPEATS):
        start = time.perf_counter()
        candidate.program(*scratch.buffers)
        backend.synchronize()
        fastest = min(fastest, time.perf_counter() - start)
        if fastest > 3 * best_so_far:
            break
    return fastest


# ---- the search ----

@dataclass
class SearchResult:
    """What a search found, for DEBUG=2 and the cache."""

    best: KernelOptions
    seconds: float
    heuristic_seconds: float
    candidates: int           # distinct programs compiled and run
    discarded: int = 0        # of those, how many gave a wrong output
    search_seconds: float = 0.0


@dataclass
class BeamSearch:
    """The state of one kernel's search: every KernelOptions tried, with its time."""

    backend: Backend
    ast: UOp
    name: str
    width: int
    scratch: Scratch
    times: dict[KernelOptions, float] = field(default_factory=dict)
    reference: np.ndarray | None = None  # the heuristic's output
    programs: int = 0
    discarded: int = 0

    def try_options(self, options_list: list[KernelOptions]) -> None:
        """Compile, check and time every options set not tried yet."""
        fresh = [o for o in dedup(options_list) if o not in self.times]
        candidates = self._distinct_programs(fresh)
        for candidate in compile_candidates(self.backend, candidates):
            self.times[candidate.options] = self._measure(candidate)

    def _distinct_programs(self, options_list: list[KernelOptions]) -> list[Candidate]:
        """Render each; an options set whose code is the same as another's (threads on a GPU,
        where they mean nothing) is not run twice: its twin stands for it."""
        by_code: dict[str, Candidate] = {}
        for options in options_list:
            name = f"{self.name}_beam{len(self.times)}"
            candidate = Candidate(options, name, render_candidate(self.backend, name, self.ast,
                                                                  options))
            self.times[options] = math.inf
            by_code.setdefault(candidate.source.replace(name, "KERNEL"), candidate)
        return list(by_code.values())

    def _measure(self, candidate: Candidate) -> float:
        self.programs += 1
        output = output_of(self.backend, candidate, self.scratch)
        if self.reference is None:
            self.reference = output  # the heuristic's, which is always tried first
        elif not agrees(output, self.reference, self.scratch.buffers[0].dtype):
            self.discarded += 1
            return math.inf  # never trade correctness for speed
        return time_candidate(self.backend, candidate, self.scratch, min(self.times.values()))

    def best(self, count: int) -> list[KernelOptions]:
        ranked = sorted((o for o in self.times if self.times[o] < math.inf),
                        key=self.times.__getitem__)
        return ranked[:count]


def beam_search(backend: Backend, ast: UOp, name: str, width: int) -> SearchResult:
    """Start from the heuristic, widen to its neighbours, keep the `width` fastest, repeat."""
    start = time.perf_counter()
    heuristic = heuristic_options(backend, ast)
    shape, body_nodes = kernel_value(ast).shape, len(kernel_value(ast).toposort)
    search = BeamSearch(backend, ast, name, width, scratch_for(backend.name, ast))
    search.try_options([heuristic])
    beam = search.best(width)
    if not beam:  # the heuristic's kernel itself failed: compiling it again will say why
        return SearchResult(heuristic, math.inf, math.inf, search.programs)
    for _ in range(MAX_ROUNDS):
        search.try_options([n for o in beam for n in neighbours(o, shape, body_nodes)])
        previous, beam = beam, search.best(width)
        if not beam or beam[0] == previous[0]:
            break
    best = beam[0] if beam else heuristic
    return SearchResult(best, search.times.get(best, math.inf),
                        search.times.get(heuristic, math.inf), search.programs,
                        search.discarded, time.perf_counter() - start)


# ---- the cache and the entry point ----

_memory_cache: LRUCache[str, KernelOptions] = LRUCache("search.choices", limit=10_000)


def options_for(backend: Backend, name: str, ast: UOp) -> KernelOptions:
    """The options a kernel is compiled with: the heuristic's, or with BEAM>=1 on a searched
    device, the fastest found (from the cache when this kernel was searched before)."""
    heuristic = heuristic_options(backend, ast)
    if not BEAM or NOOPT or backend.renderer is None or backend.name not in SEARCHED_DEVICES:
        return heuristic
    if not neighbours(heuristic, kernel_value(ast).shape):
        return heuristic  # nothing else to try: no need to time anything
    key = cache_key(backend, ast, BEAM.value)
    if key not in _memory_cache:
        cached = read_cached(key, heuristic)
        if cached is None:
            result = beam_search(backend, ast, name, BEAM.value)
            _report(name, result)
            write_cached(key, result)
            cached = result.best
        _memory_cache[key] = cached
    return _memory_cache[key]


def _report(name: str, result: SearchResult) -> None:
    if DEBUG.value < 2:
        return
    chosen = "; ".join(result.best.describe()) or "none"
    wrong = f", {result.discarded} discarded (wrong output)" if result.discarded else ""
    print(f"beam {name}: {result.candidates} candidates{wrong} in {result.search_seconds:.2f} s, "
          f"best '{chosen}' {result.seconds * 1e3:.3f} ms "
          f"(heuristic {result.heuristic_seconds * 1e3:.3f} ms)")


def ast_text(ast: UOp) -> str:
    """A string that names the kernel's AST the same way in every process."""
    number = {node: i for i, node in enumerate(ast.toposort)}
    lines = []
    for node in ast.toposort:
        sources = ",".join(str(number[s]) for s in node.src)
        lines.append(f"{node.op.name} {node.dtype.name} ({sources}) {node.arg!r}")
    return "\n".join(lines)


def cache_key(backend: Backend, ast: UOp, width: int) -> str:
    compiler = backend.compiler.cache_key if backend.compiler else "none"
    parts = [SEARCH_VERSION, backend.name, compiler, machine_identity(), f"beam {width}",
             ast_text(ast)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def beam_cache_dir() -> Path:
    """Next to the CPU's compiled kernels: ~/.cache/tinyteach/beam (TINYTEACH_CACHE moves it)."""
    return cache_dir("beam")


def read_cached(key: str, heuristic: KernelOptions) -> KernelOptions | None:
    """The cached choice, or None when there is none (or it no longer fits KernelOptions)."""
    path = beam_cache_dir() / f"{key}.json"
    try:
        stored = json.loads(path.read_text())["options"]
        return dataclasses.replace(heuristic, **{k: _as_tuples(v) for k, v in stored.items()})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cached(key: str, result: SearchResult) -> None:
    """Written under a temporary name and renamed: a reader never sees half a file."""
    directory = beam_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    entry = {"options": dataclasses.asdict(result.best), "seconds": result.seconds,
             "heuristic_seconds": result.heuristic_seconds, "candidates": result.candidates}
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".json.tmp")
    with os.fdopen(handle, "w") as file:
        json.dump(entry, file)
    os.replace(temporary, directory / f"{key}.json")


def _as_tuples(value: Any) -> Any:
    """JSON has lists only: [[1, 8]] -> ((1, 8),), as KernelOptions holds them."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


def clear_memory_cache() -> None:
    """Forget the choices made in this process (the disk cache stays)."""
    _memory_cache.clear()
