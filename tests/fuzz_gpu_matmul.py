"""A matmul fuzzer with the GPU options on (issue 14): random matmuls, each kernel lowered with an
option drawn at random among the ones valid for it, run on the GPU devices, compared with numpy.

A case is a matmul (optionally batched) of random shapes — sizes of 1, odd sizes, sizes that are
no multiple of any tile — in float32, float16 or bfloat16, with either operand stored
transposed, and an epilogue (none, + bias, relu). For every kernel of a case, the option is
drawn among those valid for that kernel on that device's renderer: none, a group reduction (4
or 16 threads, tree or serial), a local tile (4, 8 or 16), or tensor cores (half or bfloat16
inputs, where the renderer has them): one warp per tile, or a block of warps fed from shared
memory (TENSOR_CORE_BLOCKS, one drawn at random).

- OPENCL (pocl), WEBGPU (lavapipe) and PYTHON (the emulator) run it (float16 only where the
  device has it); the result must match numpy's float64 matmul of the same (half) values;
- CUDA (no GPU here) renders every kernel with its drawn option and compiles it for sm_80
  with NVRTC: machine code, so ptxas checks the tensor-core instructions too.

    python tests/fuzz_gpu_matmul.py --cases 300 --seed 7          # every available device
    python tests/fuzz_gpu_matmul.py --cases 50 --devices PYTHON --verbose
    python tests/fuzz_gpu_matmul.py --cases 60 --devices PYTHON --dtypes float16  # tensor cores

tests/test_fuzz_gpu_matmul.py runs a fixed-seed slice.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinyteach import Tensor, clear_caches  # noqa: E402
from tinyteach.codegen.lower import lower  # noqa: E402
from tinyteach.codegen.plan import KernelOptions, can_group_reduce, tile_plan  # noqa: E402
from tinyteach.codegen.wmma import why_no_tensor_core  # noqa: E402
from tinyteach.device import Device, capabilities_of  # noqa: E402
from tinyteach.dtype import dtypes, from_bfloat16_bits, to_bfloat16_bits  # noqa: E402
from tinyteach.engine.realize import record_launches  # noqa: E402
from tinyteach.engine.schedule import create_schedule  # noqa: E402
from tinyteach.ir.uop import UOp  # noqa: E402
from tinyteach.opt import search as search_module  # noqa: E402

RUN_DEVICES = ("OPENCL", "WEBGPU", "PYTHON")
SIZES = (1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 19, 24, 31, 32, 33, 40, 64, 70)
# tensor-core blocks (warps along m, along n, tiles per warp along m, along n): the heuristic's
# 64x64, one warp of one tile, and shapes whose copies do not divide evenly among the threads
TENSOR_CORE_BLOCKS = ((2, 2, 2, 4), (1, 1, 1, 1), (1, 2, 3, 1), (2, 1, 1, 2), (4, 1, 1, 4))
EPILOGUES = ("none", "bias", "relu")
DTYPES = ("float32", "float32", "float16", "float16", "bfloat16")


@dataclass(frozen=True)
class Case:
    """One matmul: (batch x) m x k @ k x n in `dtype`, operands stored transposed or not."""

    batch: int  # 0: a plain 2-d matmul
    m: int
    k: int
    n: int
    dtype: str
    transpose_a: bool
    transpose_b: bool
    epilogue: str
    seed: int

    def __str__(self) -> str:
        batch = f"{self.batch} x " if self.batch else ""
        flags = "".join(f" {name}" for name, on in (("a.T", self.transpose_a),
                                                     ("b.T", self.transpose_b)) if on)
        return (f"{batch}{self.m}x{self.k} @ {self.k}x{self.n} {self.dtype}{flags} "
                f"epilogue={self.epilogue} seed={self.seed}")


def random_case(rng: np.random.Generator, dtypes_drawn: tuple[str, ...] = DTYPES) -> Case:
    return Case(int(rng.choice([0, 0, 0, 2, 3])), *(int(rng.choice(SIZES)) for _ in range(3)),
                str(rng.choice(dtypes_drawn)), bool(rng.random() < 0.3),
                bool(rng.random() < 0.3), str(rng.choice(EPILOGUES)), int(rng.integers(1 << 30)))


def case_arrays(case: Case) -> list[np.ndarray]:
    """The inputs as stored: a (m, k) or its transpose (k, m), b likewise, and the bias."""
    rng = np.random.default_rng(case.seed)
    batch = (case.batch,) if case.batch else ()
    a_shape = (*batch, case.k, case.m) if case.transpose_a else (*batch, case.m, case.k)
    b_shape = (*batch, case.n, case.k) if case.transpose_b else (*batch, case.k, case.n)
    shapes = [a_shape, b_shape] + ([(case.n,)] if case.epilogue == "bias" else [])
    arrays = [rng.normal(size=shape).astype(np.float32) for shape in shapes]
    if case.dtype == "bfloat16":  # numpy has none: float32 arrays of bfloat16 values
        return [from_bfloat16_bits(to_bfloat16_bits(a)) for a in arrays]
    return [a.astype(case.dtype) for a in arrays]


def case_tensors(case: Case, arrays: list[np.ndarray], device: str) -> list[Tensor]:
    """The inputs on `device` in the case's dtype (bfloat16 made there from its values)."""
    if case.dtype != "bfloat16":
        return [Tensor(a, device=device) for a in arrays]
    return [Tensor(a, device=device).cast(dtypes.bfloat16).realize() for a in arrays]


def _t(x, transposed: bool):
    """Swap the last two axes (a numpy array or a Tensor) of an operand stored transposed."""
    if not transposed:
        return x
    if isinstance(x, np.ndarray):
        return np.swapaxes(x, -1, -2)
    return x.transpose(-1, -2)


def build(case: Case, tensors: list[Tensor]) -> Tensor:
    out = _t(tensors[0], case.transpose_a) @ _t(tensors[1], case.transpose_b)
    if case.epilogue == "bias":
        out = out + tensors[2]
    return out.relu() if case.epilogue == "relu" else out


def reference(case: Case, arrays: list[np.ndarray]) -> np.ndarray:
    """numpy in float64 from the same (half) values."""
    wide = [a.astype(np.float64) for a in arrays]
    out = _t(wide[0], case.transpose_a) @ _t(wide[1], case.transpose_b)
    if case.epilogue == "bias":
        out = out + wide[2]
    return np.maximum(out, 0) if case.epilogue == "relu" else out


def tolerance(case: Case) -> tuple[float, float]:
    """(rtol, atol): float32 sums are close; half kernels sum in float32 too (as tinygrad and
    PyTorch: sum_acc_dtype) but without tensor cores each product is rounded to half (2^-11),
    and the result is rounded to half once more. A wrong layout or index is off by O(1)."""
    if case.dtype == "float32":
        return 1e-4, 1e-4 * max(case.k, 1) ** 0.5
    if case.dtype == "bfloat16":  # products rounded to bfloat16 (2^-8), float32 sums
        return 2e-2, 1e-2 * max(case.k, 1) ** 0.5
    return 5e-3, 2e-3 * max(case.k, 1) ** 0.5


# ---- the options: one drawn per kernel among the valid ones ----

def valid_options(ast: UOp, renderer: object) -> list[KernelOptions]:
    """No option, and every GPU option this kernel can take on this renderer."""
    options = [KernelOptions()]
    if capabilities_of(renderer).group_reduce and can_group_reduce(ast):
        options += [KernelOptions(group=size, group_combine=combine)
                    for size in (4, 16) for combine in ("tree", "serial")]
    if capabilities_of(renderer).local_tile and tile_plan(ast) is not None:
        options += [KernelOptions(local_tile=size) for size in (4, 8, 16)]
    if bool(capabilities_of(renderer).tensor_cores) and why_no_tensor_core(ast) is None:
        options += [KernelOptions(tensor_core=True)] * 2  # drawn as often as the other kinds
        options += [KernelOptions(tensor_core=True, tensor_core_block=block)
                    for block in TENSOR_CORE_BLOCKS]
    return options


def draw(rng: np.random.Generator, ast: UOp, renderer: object) -> KernelOptions:
    options = valid_options(ast, renderer)
    return options[int(rng.integers(len(options)))]


@contextlib.contextmanager
def drawn_options(rng: np.random.Generator) -> Iterator[None]:
    """The engine lowers each kernel of a GPU device with an option drawn by `draw` (the
    search module's heuristic is what the engine asks); nothing compiled before is reused."""
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


# ---- running ----

@dataclass
class Report:
    cases: int = 0
    runs: int = 0
    compiled: int = 0
    failures: list[str] = field(default_factory=list)
    options: Counter[str] = field(default_factory=Counter)  # kind of option -> kernels

    def ok(self) -> bool:
        return not self.failures


def option_kind(options: KernelOptions) -> str:
    if options.tensor_core and options.tensor_core_block:
        return "tensor_core=" + "x".join(map(str, options.tensor_core_block))
    if options.tensor_core:
        return "tensor_core"
    if options.local_tile:
        return f"local_tile={options.local_tile}"
    if options.group:
        return f"group={options.group}/{options.group_combine}"
    return "none"


def device_has(device: str, dtype: str) -> bool:
    """Can `device` hold `dtype`? (pocl has no float16; WGSL has no 16-bit words for
    bfloat16.)"""
    if dtype == "bfloat16" and device == "WEBGPU":
        return False
    return getattr(dtypes, dtype) not in getattr(Device[device], "unsupported_dtypes", {})


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
        worst = np.abs(got.astype(np.float64) - expected).max() if got.shape == expected.shape \
            else f"shape {got.shape} != {expected.shape}"
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
                (options.tensor_core and "mma.sync.aligned.m16n8k16" not in kernel.ptx):
            report.failures.append(f"CUDA: {case}: {option_kind(options)} kernel {item.name} "
                                   "compiled without its entry or its mma")
        report.compiled += 1


def cuda_compiler() -> object | None:
    """NVRTC or nvcc for sm_80 machine code, or None where there is none (or no cuda_fp16.h)."""
    try:
        from tinyteach.runtime.cuda import CUDACompiler, cuda_include_directory
        return CUDACompiler("sm_80") if cuda_include_directory() is not None else None
    except Exception:  # no CUDA compiler here: the CUDA column is skipped, as the report says
        return None


def fuzz(cases: int, devices: list[str], seed: int = 0, cuda: bool = True,
         verbose: bool = False, dtypes_drawn: tuple[str, ...] = DTYPES) -> Report:
    rng = np.random.default_rng(seed)
    report = Report()
    compiler = cuda_compiler() if cuda else None
    for _ in range(cases):
        case = random_case(rng, dtypes_drawn)
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


def available_devices() -> list[str]:
    return [d for d in RUN_DEVICES if Device.is_available(d)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", nargs="*", default=None, help="default: every available")
    parser.add_argument("--no-cuda", action="store_true", help="skip the CUDA compile column")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--dtypes", nargs="*", default=None,
                        help=f"draw only these (default: {' '.join(DTYPES)})")
    args = parser.parse_args()
    devices = args.devices or available_devices()
    start = time.perf_counter()
    report = fuzz(args.cases, devices, args.seed, not args.no_cuda, args.verbose,
                  tuple(args.dtypes) if args.dtypes else DTYPES)
    seconds = time.perf_counter() - start
    print(f"{report.cases} cases, {report.runs} runs on {', '.join(devices)}, "
          f"{report.compiled} CUDA kernels compiled, {len(report.failures)} failures "
          f"({seconds:.1f} s)")
    for kind, count in sorted(report.options.items()):
        print(f"  {kind}: {count} kernels")
    for failure in report.failures[:10]:
        print("\n" + failure)
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
