"""A fuzzer of the GPU optimizer's options (issue 14): random matmuls whose kernels are each
lowered with an option drawn at random among every one valid for it — a local tile of 4, 8 or
16 threads a side with a block of 1 to 4 outputs per thread a side (`tile_upcast`), upcasts
(several outputs per thread), a group reduction, tensor cores — run on the GPU devices and
compared with numpy's float64 matmul.

The cases are tests/fuzz_gpu_matmul.py's (sizes of 1, odd sizes, sizes no tile divides,
transposed operands, float32 / float16 / bfloat16, bias and relu epilogues); this file draws
from more options (that fuzzer, owned with the tensor cores, draws no blocks of outputs and
no upcasts). The PYTHON emulator checks every run for shared-memory races, barrier
divergence and out-of-bounds accesses; CUDA (no GPU here) renders each kernel with its drawn
option and compiles it with NVRTC.

    python tests/fuzz_gpu_options.py --cases 200 --seed 3
    python tests/fuzz_gpu_options.py --cases 30 --devices PYTHON --verbose

tests/test_gpu_options.py runs a fixed-seed slice.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz_gpu_matmul import (  # noqa: E402
    Case,
    available_devices,
    build,
    case_arrays,
    case_tensors,
    cuda_compiler,
    device_has,
    random_case,
    reference,
    tolerance,
)

from tinyteach import clear_caches  # noqa: E402
from tinyteach.codegen.lower import lower  # noqa: E402
from tinyteach.codegen.plan import (
    KernelOptions,
    can_group_reduce,
    kernel_value,
    row_kernel_axis,
    tile_plan,
)
from tinyteach.codegen.wmma import why_no_tensor_core  # noqa: E402
from tinyteach.device import capabilities_of
from tinyteach.engine.realize import record_launches  # noqa: E402
from tinyteach.engine.schedule import create_schedule  # noqa: E402
from tinyteach.ir.uop import UOp  # noqa: E402
from tinyteach.opt import search as search_module  # noqa: E402
from tinyteach.opt.heuristic import local_tile_fits

TILES = (4, 8, 16)
TILE_UPCASTS = (1, 2, 3, 4)
UPCASTS = (2, 3, 4)


def valid_options(ast: UOp, renderer: object) -> list[KernelOptions]:
    """Every option of each kind this kernel can take on this renderer; each kind is then
    drawn about equally often (`draw`)."""
    kinds: list[list[KernelOptions]] = [[KernelOptions()]]
    shape = kernel_value(ast).shape
    if row_kernel_axis(ast) is None:  # (a row kernel keeps one work-group per row)
        kinds.append([KernelOptions(((axis, factor),)) for axis, size in enumerate(shape)
                      for factor in UPCASTS if size % factor == 0 and size >= 2 * factor])
    if capabilities_of(renderer).group_reduce and can_group_reduce(ast):
        kinds.append([KernelOptions(group=size, group_combine=combine)
                      for size in (4, 16) for combine in ("tree", "serial")])
    plan = tile_plan(ast)
    if capabilities_of(renderer).local_tile and plan is not None:
        tiles = [KernelOptions(local_tile=size, tile_upcast=block) for size in TILES
                 for block in TILE_UPCASTS]
        kinds.append([o for o in tiles if local_tile_fits(o, plan.x.dtype.itemsize)])
        kinds.append([o for o in kinds[-1] if o.tile_upcast > 1])  # blocks twice as often
    if bool(capabilities_of(renderer).tensor_cores) and why_no_tensor_core(ast) is None:
        kinds.append([KernelOptions(tensor_core=True)])
    return [option for kind in kinds if kind for option in kind]


def draw(rng: np.random.Generator, ast: UOp, renderer: object) -> KernelOptions:
    """A kind at random, then an option of that kind at random."""
    by_kind: dict[str, list[KernelOptions]] = {}
    for option in valid_options(ast, renderer):
        by_kind.setdefault(option_kind(option).split("=")[0], []).append(option)
    kinds = sorted(by_kind)
    if "local_tile" in by_kind:
        kinds.append("local_tile")  # the new options: drawn more often
    chosen = by_kind[kinds[int(rng.integers(len(kinds)))]]
    return chosen[int(rng.integers(len(chosen)))]


def option_kind(options: KernelOptions) -> str:
    if options.tensor_core:
        return "tensor_core"
    if options.local_tile:
        return f"local_tile={options.local_tile}x{options.tile_upcast}"
    if options.group:
        return f"group={options.group}/{options.group_combine}"
    if options.upcasts:
        return "upcast=" + ",".join(f"{a}:{f}" for a, f in options.upcasts)
    return "none"


@contextlib.contextmanager
def drawn_options(rng: np.random.Generator) -> Iterator[None]:
    """The engine lowers each kernel of a GPU device with an option drawn by `draw`."""
    heuristic = search_module.heuristic_options

    def options(backend, ast: UOp) -> KernelOptions:
        if backend.capabilities.group_reduce:
            return draw(rng, ast, backend.renderer)
        return heuristic(backend, ast)
    clear_caches()
    search_module.heuristic_options = options  # type: ignore[assignment]
    try:
        yield
    finally:
        search_module.heuristic_options = heuristic  # type: ignore[assignment]
        clear_caches()


@dataclass
class Report:
    cases: int = 0
    runs: int = 0
    compiled: int = 0
    failures: list[str] = field(default_factory=list)
    options: Counter[str] = field(default_factory=Counter)  # device and kind -> kernels

    def ok(self) -> bool:
        return not self.failures

    def drew_blocks(self) -> int:
        """Kernels that ran or compiled with a block of outputs per thread (tile_upcast > 1)."""
        return sum(count for kind, count in self.options.items()
                   if "local_tile=" in kind and not kind.endswith("x1"))


def run_on(case: Case, device: str, rng: np.random.Generator, report: Report) -> None:
    arrays = case_arrays(case)
    with drawn_options(rng), record_launches() as launches:
        got = build(case, case_tensors(case, arrays, device)).numpy()
    chosen = [launch.runner.linear.options for launch in launches
              if launch.runner is not None and hasattr(launch.runner, "linear")]
    report.options.update(f"{device} {option_kind(o)}" for o in chosen)
    rtol, atol = tolerance(case)
    expected = reference(case, arrays)
    if got.shape != expected.shape or \
            not np.allclose(got.astype(np.float64), expected, rtol=rtol, atol=atol):
        worst = np.abs(got.astype(np.float64) - expected).max() \
            if got.shape == expected.shape else f"shape {got.shape} != {expected.shape}"
        report.failures.append(f"{device}: {case} with {[option_kind(o) for o in chosen]}: "
                               f"largest error {worst} (atol {atol:.3g})")
    report.runs += 1


def compile_for_cuda(case: Case, compiler: object, rng: np.random.Generator,
                     report: Report) -> None:
    """Every kernel of the case with a drawn CUDA option, rendered and compiled (no GPU)."""
    from tinyteach.render.cuda import CUDARenderer
    renderer = CUDARenderer()
    tensors = case_tensors(case, case_arrays(case), "NUMPY")
    items, _ = create_schedule([build(case, tensors).uop], "PYTHON")  # the same kernels
    for item in (i for i in items if i.kind == "kernel"):
        options = draw(rng, item.ast, renderer)
        report.options[f"CUDA {option_kind(options)}"] += 1
        source = renderer.render(item.name, lower(item.ast, options))
        kernel = compiler.compile(source)  # type: ignore[attr-defined]
        if f".entry {item.name}(" not in kernel.ptx or \
                (options.local_tile and "bar.sync" not in kernel.ptx):
            report.failures.append(f"CUDA: {case}: {option_kind(options)} kernel {item.name} "
                                   "compiled without its entry or its barriers")
        report.compiled += 1


def fuzz(cases: int, devices: list[str], seed: int = 0, cuda: bool = True,
         verbose: bool = False) -> Report:
    rng = np.random.default_rng(seed)
    report = Report()
    compiler = cuda_compiler() if cuda else None
    for _ in range(cases):
        case = random_case(rng)
        report.cases += 1
        if verbose:
            print(case)
        for device in devices:
            if not device_has(device, case.dtype):
                continue
            try:
                run_on(case, device, rng, report)
            except Exception:
                report.failures.append(f"{device}: {case}: {traceback.format_exc(limit=4)}")
        if compiler is not None:
            try:
                compile_for_cuda(case, compiler, rng, report)
            except Exception:
                report.failures.append(f"CUDA: {case}: {traceback.format_exc(limit=4)}")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", nargs="*", default=None, help="default: every available")
    parser.add_argument("--no-cuda", action="store_true", help="skip the CUDA compile column")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    devices = args.devices or available_devices()
    start = time.perf_counter()
    report = fuzz(args.cases, devices, args.seed, not args.no_cuda, args.verbose)
    seconds = time.perf_counter() - start
    print(f"{report.cases} cases, {report.runs} runs on {', '.join(devices)}, "
          f"{report.compiled} CUDA kernels compiled, {len(report.failures)} failures, "
          f"{report.drew_blocks()} kernels with a block of outputs per thread "
          f"({seconds:.1f} s)")
    for kind, count in sorted(report.options.items()):
        print(f"  {kind}: {count} kernels")
    for failure in report.failures[:10]:
        print("\n" + failure)
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
