"""Chapter 7 (part 3): searching for optimizations — time the candidates, keep the fastest (BEAM).

What this teaches:
- a heuristic (opt/) guesses which upcasts and threads suit a kernel; a **search** measures.
  Each *candidate* is a `KernelOptions`: it is lowered, rendered, compiled and run on scratch
  buffers of the kernel's sizes, and the fastest one wins;
- the search is a **beam search**, as in tinygrad: start from the heuristic's choice, try every
  *neighbour* (one upcast factor changed, threads switched, a vector tile made scalar), keep the
  `BEAM` fastest, try their neighbours, and stop when the best no longer changes (or after
  `MAX_ROUNDS`);
- timing is never allowed to trade correctness: every candidate's output is compared with the
  heuristic's on the same inputs, and one that disagrees is discarded;
- a candidate is timed only when its actions (opt/'s `actions_of`) build exactly it: the winner
  is cached and applied as actions, so one the actions reject must never win;
- on a GPU device (OPENCL, WEBGPU, CUDA, PYTHON) the candidates are the GPU options the kernel
  can take there (`GPUSpace`): group reductions (threads per group, tree or serial), local
  tiles (threads per group, and a block of r x r outputs per thread), tensor cores, upcasts
  (several outputs per thread), and no option; each round also steps to the other kinds;
- on PYTHON, the emulator, wall time would measure numpy, not a GPU: its candidates are ranked
  by a **cost model** of the emulator's record instead (`emulator_cost`: the 32-byte sectors
  each warp's global accesses touch, shared-memory wavefronts with bank conflicts, barriers),
  and DEBUG=2 says so;
- a search costs seconds (a compiler call per round), so its choice is cached, in memory and on
  disk (one small JSON file per kernel, keyed by device, compiler, machine and the kernel's AST):
  a second process reuses it without timing anything (`IGNORE_BEAM_CACHE=1`, tinygrad's name,
  searches again and stores the new choice);

`BEAM=n` (environment, or `with Context(BEAM=2):`) turns the search on with a beam of width n;
`BEAM=0`, the default, keeps the heuristic and changes nothing. `DEBUG=2` prints one line per
searched kernel; `DEBUG=3`'s "optimizations of ..." line shows what was chosen. `NOOPT=1` wins
over `BEAM`. The search runs on CPU, OPENCL, WEBGPU, CUDA (timed: on a machine with a GPU;
here only its candidates' compile is tested, `search_space`) and PYTHON (the cost model); on
interpreters the heuristic is kept.

Scratch inputs: floats are random in [-1, 1], bools random, integers zero — an integer input may
be an index, and a random one could read out of bounds.

tinygrad: its BEAM also tries unrolling of reduce loops, the threads per group of a plain
kernel (tinyteach's launch picks those, render/gpu.py) and PADTO (a local tile needs none: its
guards sit in the copies into shared memory, never in the loop over it), and times with the
kernel's real buffers.

Builds on: opt/ (the heuristic and KernelOptions), codegen/lower.py, device.py, helpers.py (the
cache folder, the machine's identity). Used by: engine/realize.py (`options_for`, when a kernel is
compiled).

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

from tinyteach.codegen.lower import lower
from tinyteach.codegen.plan import (
    KernelOptions,
    can_group_reduce,
    kernel_value,
    row_kernel_axis,
    tile_plan,
)
from tinyteach.device import Backend, Buffer, CompileError, capabilities_of
from tinyteach.dtype import DType, dtypes
from tinyteach.helpers import BEAM, DEBUG, NOOPT, LRUCache, cache_dir, dedup, machine_identity, prod
from tinyteach.ir.uop import Ops, UOp
from tinyteach.opt.heuristic import (
    GROUP_THREADS,
    LOCAL_TILE,
    MAX_UPCAST_AXES,
    heuristic_tile_upcast,
    local_tile_fits,
    options_for_renderer,
    tensor_core_block_for,
)
from tinyteach.opt.kernel import Opt, OptOps, actions_of, outer_loop_size, plan_of
from tinyteach.settings import IGNORE_BEAM_CACHE

SEARCHED_DEVICES = ("CPU", "OPENCL", "WEBGPU", "PYTHON", "CUDA")
COST_MODEL_DEVICES = ("PYTHON",)  # ranked by the emulator's record, not by wall time
UPCAST_FACTORS = (2, 4, 8, 16, 32)
TILE_UPCASTS = (1, 2, 4)   # a local tile's r x r block of outputs per thread
MAX_TILE = 256             # outputs per loop iteration (16x16): more spill out of registers
MAX_UNROLLED_NODES = 4096  # a tile copies the kernel's body: keep the copies compilable
MAX_ROUNDS = 3
REPEATS = 3                # timed runs per candidate; the minimum counts
SEARCH_VERSION = "3"       # bump when a cached choice should no longer be trusted


# ---- the candidates ----

def heuristic_options(backend: Backend, ast: UOp) -> KernelOptions:
    """What the hand-written heuristic (opt/) would choose: the search's starting point.
    It reads the device's renderer: its vector width, and whether it can group-reduce."""
    return options_for_renderer(ast, backend.renderer)


@dataclass(frozen=True)
class GPUSpace:
    """The GPU options a kernel can take on a device's renderer (None on a CPU): a group
    reduction, a local tile (whose shared memory must fit: `itemsize` of its operands),
    tensor cores. A kernel over whole rows (a fused softmax) keeps a work-group per row."""

    group: bool
    local_tile: bool
    tensor_core: bool
    itemsize: int = 4
    rows: bool = False
    tile_upcast: int = 1  # the heuristic's block of outputs per thread of a local tile
    tensor_core_block: tuple[int, ...] = ()  # warps x tiles fed from shared memory, if it fits


def gpu_space(ast: UOp, renderer: Any) -> GPUSpace | None:
    """What `ast` can take on `renderer`, or None where the renderer has no work-groups."""
    capabilities = capabilities_of(renderer)
    if not capabilities.group_reduce:
        return None
    from tinyteach.codegen.wmma import (
        why_no_tensor_core,  # (codegen/wmma.py builds on opt/, as this does)
    )
    plan = tile_plan(ast)
    return GPUSpace(can_group_reduce(ast),
                    plan is not None and capabilities.local_tile,
                    bool(capabilities.tensor_cores) and
                    why_no_tensor_core(ast) is None,
                    plan.x.dtype.itemsize if plan is not None else 4,
                    row_kernel_axis(ast) is not None, heuristic_tile_upcast(ast),
                    tensor_core_block_for(ast) if why_no_tensor_core(ast) is None else ())


def neighbours(options: KernelOptions, shape: tuple[int, ...], body_nodes: int = 1,
               space: GPUSpace | None = None) -> list[KernelOptions]:
    """Every KernelOptions one step away: one axis's upcast factor changed (or removed), or
    threads switched. Other fields of `options` are kept (`dataclasses.replace`).
    A group reduction takes no upcasts, vectors or threads: its neighbours are the other group
    sizes, the other way to combine, and no group at all. Local tiles and tensor cores neither:
    see `_tile_changes`. On a GPU (`space`: what the kernel can take there), see
    `_gpu_neighbours`."""
    if space is not None:
        return _gpu_neighbours(options, shape, body_nodes, space)
    if options.group:
        return _group_changes(options)
    if options.local_tile or options.tensor_core:
        return _tile_changes(options)
    found = [*_upcast_changes(options, shape, body_nodes), _threads_switched(options),
             _vectors_off(options)]
    return [o for o in dedup(found) if o is not None and o != options and _is_valid(o, shape)]


def _gpu_neighbours(options: KernelOptions, shape: tuple[int, ...], body_nodes: int,
                    space: GPUSpace) -> list[KernelOptions]:
    """On a GPU: the changes within the option's own kind (group sizes and combines; tile
    sizes and blocks of outputs per thread; upcasts, which give a thread several outputs),
    and a step to each other kind the kernel can take. No threads over cores or vectors:
    a GPU's threads are its launch, and its renderers have no vector types."""
    if options.group:
        found = _group_changes(options)
    elif options.local_tile:
        found = _local_tile_changes(options, space)
    elif options.tensor_core:
        found = [KernelOptions()]
    else:
        found = _upcast_changes(dataclasses.replace(options, parallel=False, vector_width=0),
                                shape, body_nodes)
    if space.rows:  # a fused row kernel: one work-group per row, or the plain kernel
        return [o for o in dedup(found) if o != options and (o.group or o == KernelOptions())]
    found += [kind for kind in _gpu_kinds(space) if _kind(kind) != _kind(options)]
    return [o for o in dedup(found) if o != options]


def _gpu_kinds(space: GPUSpace) -> list[KernelOptions]:
    """One option of each GPU kind the kernel can take, as the heuristic would set it."""
    kinds = [KernelOptions()]
    if space.group:
        kinds.append(KernelOptions(group=GROUP_THREADS))
    if space.local_tile:
        kinds.append(KernelOptions(local_tile=LOCAL_TILE, tile_upcast=space.tile_upcast))
    if space.tensor_core:
        kinds.append(KernelOptions(tensor_core=True))
        if space.tensor_core_block:
            kinds.append(KernelOptions(tensor_core=True, tensor_core_block=space.tensor_core_block))
    return kinds


def _kind(options: KernelOptions) -> str:
    if options.group:
        return "group"
    if options.local_tile:
        return "local tile"
    if options.tensor_core:
        return "tensor-core block" if options.tensor_core_block else "tensor cores"
    return "plain"


def _local_tile_changes(options: KernelOptions, space: GPUSpace) -> list[KernelOptions]:
    """Half and twice the tile (4 to 16 on a side), and every block of outputs per thread
    (TILE_UPCASTS), where the tile's shared memory fits (heuristic.local_tile_fits)."""
    sizes = [size for size in (options.local_tile // 2, options.local_tile * 2) if 4 <= size <= 16]
    found = [dataclasses.replace(options, local_tile=size) for size in sizes]
    found += [dataclasses.replace(options, tile_upcast=r) for r in TILE_UPCASTS]
    return [o for o in found if local_tile_fits(o, space.itemsize)]


def search_space(ast: UOp, renderer: Any, rounds: int = 2) -> list[KernelOptions]:
    """Every KernelOptions a search from the heuristic's choice could reach in `rounds`
    rounds (the whole neighbourhood, not only the best's): what a BEAM on this device may
    compile. (tests/test_gpu_options.py compiles each for CUDA, where no GPU times them.)"""
    shape, body_nodes = kernel_value(ast).shape, len(kernel_value(ast).toposort)
    space = gpu_space(ast, renderer)
    found = [options_for_renderer(ast, renderer)]
    frontier = list(found)
    for _ in range(rounds):
        frontier = [n for o in frontier for n in neighbours(o, shape, body_nodes, space)
                    if n not in found]
        frontier = dedup(frontier)
        found += frontier
    return found


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
    spec: Any = None  # its ProgramSpec (codegen/lower.py): the source and what the runtime needs
    program: Any = None
    seconds: float = math.inf  # inf: not timed, or discarded


def render_candidate(backend: Backend, name: str, ast: UOp, options: KernelOptions) -> Any:
    """Lower and render one candidate: its ProgramSpec (the tests replace this to inject a
    wrong kernel)."""
    return backend.renderer.spec(name, lower(ast, options))


def compile_candidates(backend: Backend, candidates: list[Candidate]) -> list[Candidate]:
    """Compile all candidates in one compiler call when the device's compiler builds them
    together (`builds_together`: compile_many);
    the ones that fail to compile are dropped."""
    compiler = backend.compiler
    assert compiler is not None
    sources = [c.spec.source for c in candidates]
    if compiler.builds_together and len(candidates) > 1:
        try:
            binaries = compiler.compile_many(sources)
            return _load(backend, candidates, binaries)
        except CompileError:
            pass  # one bad candidate spoils the library: compile them one by one
    compiled, binaries = [], []
    for candidate in candidates:
        try:
            binaries.append(compiler.compile(candidate.spec.source))
            compiled.append(candidate)
        except CompileError:
            continue
    return _load(backend, compiled, binaries)


def _load(backend: Backend, candidates: list[Candidate], binaries: list[Any]) -> list[Candidate]:
    for candidate, binary in zip(candidates, binaries):
        candidate.program = backend.load_program(candidate.spec, binary)
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


# ---- the emulator's cost model (PYTHON) ----

SECTOR_BYTES = 32          # a GPU moves global memory in 32-byte sectors
WARP_THREADS = 32          # ... for the 32 threads of a warp at once
SHARED_BANKS = 32          # shared memory: 32 banks of 4-byte words, one word each per cycle
SHARED_WEIGHT = 0.25       # a shared-memory wavefront costs about a quarter of a sector
BARRIER_WEIGHT = 1.0       # a warp waiting at a barrier: about one sector's time


def emulator_cost_of(candidate: Candidate, scratch: Scratch) -> float:
    """Run the candidate on the emulator with its record on, and score the record
    (`emulator_cost`). The emulator's wall time would rank how many numpy steps a kernel
    takes, which says nothing about a GPU."""
    from tinyteach.runtime.python import record_threads  # (a runtime: loaded when searched)
    scratch.reset()
    with record_threads() as traces:
        candidate.program(*scratch.buffers)
    return sum(emulator_cost(trace, candidate.program.linear) for trace in traces)


def emulator_cost(trace: Any, program: Any) -> float:
    """A GPU's time for one launch, estimated from what its threads did: every global load or
    store step costs the 32-byte sectors its warps touch (a coalesced warp reading 32 floats:
    4 sectors; 32 floats far apart: 32), every shared-memory step the wavefronts of its warps
    (1, or more when threads hit the same bank at different words: a bank conflict), weighed
    SHARED_WEIGHT, and every barrier each warp passes BARRIER_WEIGHT. Arithmetic is not
    counted: this ranks memory traffic, which is what tiles and blocks of outputs change."""
    itemsize = {f"data{u.arg[0]}": u.dtype.itemsize for u in program.globals}
    itemsize.update({f"local{u.arg[0]}": u.dtype.itemsize for u in program.locals})
    local = trace.launch.local_size
    cost = 0.0
    for event in trace.events:
        warps = _warp_ids(event.groups, event.threads, local)
        byte = event.addresses * itemsize[event.buffer]
        if event.is_shared:
            cost += SHARED_WEIGHT * _wavefronts(warps, byte // 4)
        else:
            cost += len(np.unique(np.stack([warps, byte // SECTOR_BYTES]), axis=1)[0])
    warps_per_group = -(-prod(local) // WARP_THREADS)
    cost += BARRIER_WEIGHT * trace.barriers * trace.launch.group_count * warps_per_group
    return cost


def _warp_ids(groups: np.ndarray, threads: np.ndarray,
              local: tuple[int, int, int]) -> np.ndarray:
    """A number for each access's warp: its group, and its thread's flat id // 32."""
    flat = threads[:, 0] + local[0] * (threads[:, 1] + local[1] * threads[:, 2])
    group = groups[:, 0] + (1 << 16) * (groups[:, 1] + (1 << 16) * groups[:, 2])
    return group * 64 + flat // WARP_THREADS


def _wavefronts(warps: np.ndarray, words: np.ndarray) -> int:
    """Shared-memory cycles: per warp, the most distinct words any one bank serves."""
    pairs = np.unique(np.stack([warps, words]), axis=1)  # threads reading one word: a broadcast
    banks, per_bank = np.unique(pairs[0] * SHARED_BANKS + pairs[1] % SHARED_BANKS,
                                return_counts=True)
    warp_list, warp_of = np.unique(banks // SHARED_BANKS, return_inverse=True)
    worst = np.zeros(len(warp_list), dtype=np.int64)
    np.maximum.at(worst, warp_of, per_bank)
    return int(worst.sum())


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
    unit: str = "s"           # what `seconds` counts: "s", or "cost" (the emulator's model)
    tried: dict[KernelOptions, float] = field(default_factory=dict)  # each one's time or cost


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
        """Compile, check and time every options set not tried yet that its actions build."""
        fresh = [o for o in dedup(options_list) if o not in self.times]
        if self.times:  # (the first call tries the heuristic alone: it is always kept)
            fresh = [o for o in fresh if self._buildable(o)]
        candidates = self._distinct_programs(fresh)
        for candidate in compile_candidates(self.backend, candidates):
            self.times[candidate.options] = self._measure(candidate)

    def _buildable(self, options: KernelOptions) -> bool:
        """Whether the actions of `options` build exactly `options`: the choice is cached as
        actions, and realize applies them, so a candidate they reject (a vector tile whose loads
        are not consecutive lowers to scalars instead) or change must not win."""
        try:
            built = plan_of(self.ast, actions_of(self.ast, options), self.backend.capabilities,
                            self.backend.name)
        except ValueError:  # KernelOptError: an action does not fit
            return False
        return built == options

    def _distinct_programs(self, options_list: list[KernelOptions]) -> list[Candidate]:
        """Render each; an options set whose code is the same as another's (threads on a GPU,
        where they mean nothing) is not run twice: its twin stands for it."""
        by_code: dict[str, Candidate] = {}
        for options in options_list:
            name = f"{self.name}_beam{len(self.times)}"
            candidate = Candidate(options, name, render_candidate(self.backend, name, self.ast,
                                                                  options))
            self.times[options] = math.inf
            by_code.setdefault(candidate.spec.source.replace(name, "KERNEL"), candidate)
        return list(by_code.values())

    def _measure(self, candidate: Candidate) -> float:
        self.programs += 1
        output = output_of(self.backend, candidate, self.scratch)
        if self.reference is None:
            self.reference = output  # the heuristic's, which is always tried first
        elif not agrees(output, self.reference, self.scratch.buffers[0].dtype):
            self.discarded += 1
            return math.inf  # never trade correctness for speed
        if self.backend.name in COST_MODEL_DEVICES:
            return emulator_cost_of(candidate, self.scratch)
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
    space = gpu_space(ast, backend.renderer)
    search = BeamSearch(backend, ast, name, width, scratch_for(backend.name, ast))
    search.try_options([heuristic])
    beam = search.best(width)
    if not beam:  # the heuristic's kernel itself failed: compiling it again will say why
        return SearchResult(heuristic, math.inf, math.inf, search.programs,
                            unit=_unit(backend))
    for _ in range(MAX_ROUNDS):
        search.try_options([n for o in beam for n in neighbours(o, shape, body_nodes, space)])
        previous, beam = beam, search.best(width)
        if not beam or beam[0] == previous[0]:
            break
    best = beam[0] if beam else heuristic
    return SearchResult(best, search.times.get(best, math.inf),
                        search.times.get(heuristic, math.inf), search.programs,
                        search.discarded, time.perf_counter() - start, _unit(backend),
                        dict(search.times))


# ---- the cache and the entry point ----

_memory_cache: LRUCache[str, KernelOptions] = LRUCache("search.choices", limit=10_000)


def options_for(backend: Backend, name: str, ast: UOp) -> KernelOptions:
    """The options a kernel is compiled with: the heuristic's, or with BEAM>=1 on a searched
    device, the fastest found (from the cache when this kernel was searched before)."""
    heuristic = heuristic_options(backend, ast)
    if not BEAM or NOOPT or backend.renderer is None or backend.name not in SEARCHED_DEVICES:
        return heuristic
    space = gpu_space(ast, backend.renderer)
    if not neighbours(heuristic, kernel_value(ast).shape, space=space):
        return heuristic  # nothing else to try: no need to time anything
    key = cache_key(backend, ast, BEAM.value)
    if key not in _memory_cache or IGNORE_BEAM_CACHE:
        cached = None if IGNORE_BEAM_CACHE else read_cached(key, ast, backend)
        if cached is None:
            result = beam_search(backend, ast, name, BEAM.value)
            _report(name, result)
            write_cached(key, ast, result)
            cached = result.best
        _memory_cache[key] = cached
    return _memory_cache[key]


def actions_for(backend: Backend, name: str, ast: UOp) -> list[Opt]:
    """`options_for` as the actions that build it: what realize applies to the kernel."""
    return actions_of(ast, options_for(backend, name, ast))


def _report(name: str, result: SearchResult) -> None:
    if DEBUG.value < 2:
        return
    chosen = "; ".join(result.best.describe()) or "none"
    wrong = f", {result.discarded} discarded (wrong output)" if result.discarded else ""
    if result.unit == "cost":
        measured = (f"cost {result.seconds:.0f} (heuristic {result.heuristic_seconds:.0f}); "
                    "ranked by the emulator's record (global memory sectors, shared-memory "
                    "wavefronts, barriers per warp), not by wall time, which measures the "
                    "emulator's numpy, not a GPU")
    else:
        measured = (f"{result.seconds * 1e3:.3f} ms "
                    f"(heuristic {result.heuristic_seconds * 1e3:.3f} ms)")
    print(f"beam {name}: {result.candidates} candidates{wrong} in {result.search_seconds:.2f} s, "
          f"best '{chosen}' {measured}")


def _unit(backend: Backend) -> str:
    return "cost" if backend.name in COST_MODEL_DEVICES else "s"


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
    parts = [SEARCH_VERSION, backend.name, repr(backend.capabilities), compiler,
             machine_identity(), f"beam {width}", ast_text(ast)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def beam_cache_dir() -> Path:
    """Next to the CPU's compiled kernels: ~/.cache/tinyteach/beam (TINYTEACH_CACHE moves it)."""
    return cache_dir("beam")


def read_cached(key: str, ast: UOp, backend: Backend) -> KernelOptions | None:
    """The cached choice, or None when there is none (or its actions no longer fit)."""
    path = beam_cache_dir() / f"{key}.json"
    try:
        stored = json.loads(path.read_text())["actions"]
        actions = [Opt(OptOps[op], axis, tuple(arg) if isinstance(arg, list) else arg)
                   for op, axis, arg in stored]
        return plan_of(ast, actions, backend.capabilities, backend.name)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cached(key: str, ast: UOp, result: SearchResult) -> None:
    """The choice as its list of actions. Written under a temporary name and renamed: a
    reader never sees half a file."""
    directory = beam_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    actions = [[opt.op.name, opt.axis, opt.arg] for opt in actions_of(ast, result.best)]
    entry = {"actions": actions, "seconds": result.seconds,
             "heuristic_seconds": result.heuristic_seconds, "candidates": result.candidates}
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".json.tmp")
    with os.fdopen(handle, "w") as file:
        json.dump(entry, file)
    os.replace(temporary, directory / f"{key}.json")


def clear_memory_cache() -> None:
    """Forget the choices made in this process (the disk cache stays)."""
    _memory_cache.clear()
