"""A float converted to an integer type gives the same integer on every device (issue 23).

C leaves the conversion undefined outside the integer type's range, for NaN and for inf, and
before the devices disagreed there: float32 1e10 -> uint32 was 2884901888 on NUMPY, 2147483648
on PYTHON, 4294967295 on CPU with AVX-512; numpy's own answer changes with its SIMD loops. Now
every CAST from a float (float16, bfloat16, float32, float64) to an integer (int8 .. uint64)
truncates toward zero, saturates to the type's range and takes NaN to 0: OpenCL's
`convert_<type>_sat_rtz`, Rust's `as` (dtype.float_to_int).

Each device test is one kernel launch per (source, target) pair over a large array (so that gcc
vectorizes the loop): NaN, +-inf, +-0, every limit's float neighbours inside and outside, the
largest floats, subnormals, fractions and random values, compared with `saturated`, the
semantics written here one value at a time in Python's exact integers. Then constant folding,
the CPU's builds (tcc, gcc -O0, gcc -O2 for this CPU and for AVX2), a vector kernel, the OpenCL
and WGSL sources, and CUDA's compiler.
"""
from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    GCC_O0,
    build_c_library,
    c_builds,
    libraries_of_every_build,
    run_c_kernel,
    skip_unless_supported,
)

from tinyteach import Tensor, dtypes
from tinyteach.codegen.lower import LinearProgram, linearize, lower
from tinyteach.device import Device
from tinyteach.dtype import BFLOAT16_WORDS, DType, from_bfloat16_bits, to_bfloat16_bits
from tinyteach.engine.realize import record_launches
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.rewrite import graph_rewrite, symbolic
from tinyteach.ir.uop import Ops, UOp, make_range
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render.c import CRenderer

SOURCES = ["float16", "bfloat16", "float32", "float64"]
TARGETS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
SIZE = 1 << 14  # elements per kernel: gcc's vector loop takes most, its scalar tail the rest


def saturated(value: float, target: str) -> int:
    """The semantics, for one value: NaN -> 0, else toward zero, clamped to the type's range."""
    if math.isnan(value):
        return 0
    info = np.iinfo(target)
    if math.isinf(value):
        return int(info.max) if value > 0 else int(info.min)
    return min(max(math.trunc(value), int(info.min)), int(info.max))


def expected(values: np.ndarray, target: str) -> np.ndarray:
    """`saturated` of each value (computed once per distinct value)."""
    distinct, position = np.unique(values.astype(np.float64), return_inverse=True)
    results = [saturated(float(value), target) for value in distinct]
    return np.array(results, dtype=target)[position.reshape(-1)]


def in_source(values: np.ndarray, source: str) -> np.ndarray:
    """float64 values rounded to `source` (bfloat16: its words, the host format)."""
    with np.errstate(over="ignore"):
        if source == "bfloat16":
            return to_bfloat16_bits(values.astype(np.float32))
        return values.astype(source)


def as_float64(host: np.ndarray, source: str) -> np.ndarray:
    """The values a host array of `source` holds, as float64 (exactly)."""
    floats = from_bfloat16_bits(host) if source == "bfloat16" else host
    return floats.astype(np.float64)


def special_values() -> np.ndarray:
    """NaN, +-inf, +-0, fractions, subnormals, the largest floats, and around each limit L of
    every integer type (its smallest value and its largest plus one, +-2^7 .. 2^64) the values
    L(1 +- 2^-m) for m = 1 .. 60 and L +- 0.5, 1, 1.5: once rounded to a float type, these are
    L's neighbours in it, inside and outside the range, whatever its precision."""
    limits = [0.0] + [sign * 2.0**bits for bits in (7, 8, 15, 16, 31, 32, 63, 64)
                      for sign in (1, -1)]
    near = [limit * (1 + sign * 2.0**-m) for limit in limits for m in range(1, 61)
            for sign in (1, -1)]
    near += [limit + step for limit in limits for step in (-1.5, -1, -0.5, 0.5, 1, 1.5)]
    others = [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 0.25, -0.5, 0.99, -0.99,
              1.5, -1.5, 2.7, -2.7, 1e-45, -1e-300, 5e-324, 1e10, -1e10, 1e19, -1e19,
              65504.0, -65504.0, 3.4e38, -3.4e38, 1.7e308, -1.7e308]
    return np.array(near + others, dtype=np.float64)


@functools.cache  # (made once: every device's test reads the same values)
def cast_inputs(source: str) -> np.ndarray:
    """SIZE values of `source`: the special values and 2048 random ones of every magnitude
    (both signs), repeated and shuffled with a fixed seed, so that specials land in vector
    lanes and in the tail."""
    rng = np.random.default_rng(23)
    magnitudes = 2.0 ** rng.uniform(-20, 70, 2048)
    pool = np.concatenate([special_values(), magnitudes * rng.choice([-1.0, 1.0], 2048)])
    values = np.resize(pool[rng.permutation(len(pool))], SIZE)
    return in_source(values[rng.permutation(SIZE)], source)


@functools.cache
def reference(source: str, target: str) -> np.ndarray:
    """What every device must give for cast_inputs(source) cast to `target`."""
    return expected(as_float64(cast_inputs(source), source), target)


def holds(device: str, *names: str) -> bool:
    """Can the device hold every one of these dtypes? (WEBGPU has no 64-bit integers.)"""
    unsupported = getattr(Device[device], "unsupported_dtypes", {})
    return not any(dtypes.as_dtype(name) in unsupported for name in names)


def source_tensor(host: np.ndarray, source: str, device: str) -> Tensor:
    if source == "bfloat16":
        host = host.view(BFLOAT16_WORDS)
    return Tensor(host, device=device).realize()


# ---- every pair, on every device ----

@pytest.mark.parametrize("source", SOURCES)
def test_float_to_int_saturates(device: str, source: str) -> None:
    """One kernel per target over the same SIZE values; NUMPY and PYTHON without a warning."""
    skip_unless_supported(device, source)
    x = source_tensor(cast_inputs(source), source, device)
    for target in [t for t in TARGETS if holds(device, t)]:
        with warnings.catch_warnings(), record_launches() as launches:
            warnings.simplefilter("error", RuntimeWarning)
            result = x.cast(target).realize()
        kernels = [launch for launch in launches if launch.runner is not None]
        assert len(kernels) == 1, f"{source} -> {target}: {len(kernels)} kernel launches"
        np.testing.assert_array_equal(result.numpy(), reference(source, target),
                                      err_msg=f"{device}: {source} -> {target}")


def test_the_issue_values_on_every_device(device: str) -> None:
    """The issue's cases, as a student would meet them."""
    x = Tensor([1e10, -1e10, float("nan"), float("inf"), -2.7, 2.7], device=device)
    assert x.cast(dtypes.uint32).tolist() == [4294967295, 0, 0, 4294967295, 0, 2]
    assert x.cast(dtypes.int8).tolist() == [127, -128, 0, 127, -2, 2]
    assert x.int().tolist() == [2147483647, -2147483648, 0, 2147483647, -2, 2]


# ---- constants: folded on the graph, the same numbers ----

def test_constant_casts_fold_to_the_same_integers() -> None:
    """A CAST of a constant folds (ir/rewrite.py) to what the devices compute, NaN and inf too
    (before, inf raised 'cannot store inf' and 1e10 wrapped around)."""
    values = [math.nan, math.inf, -math.inf, 1e10, -1e10, 2.0**31, -2.0**31 - 256, 2.0**63,
              2.0**64, -0.0, 0.99, -0.99, 127.5, -128.5, 255.9, 65535.5, 2.0**63 - 1024]
    for source in SOURCES:
        rounded = as_float64(in_source(np.array(values), source), source)
        for target in TARGETS:
            for value in rounded:
                node = UOp.const(dtypes.as_dtype(source), float(value)).cast(
                    dtypes.as_dtype(target))
                folded = graph_rewrite(node, symbolic)
                want = saturated(float(value), target)
                assert folded.op is Ops.CONST and folded.arg == want, (source, target, value)


def test_a_constant_tensor_casts_alike(device: str) -> None:
    """Tensor.full folds its CAST on the graph; NUMPY computes it: the same numbers."""
    for value in (1e10, -1e10, math.inf, math.nan, -3.7):
        got = Tensor.full((4,), value, device=device).cast(dtypes.int16).tolist()
        assert got == [saturated(value, "int16")] * 4, value


# ---- the CPU: every build of the C gives the same integers ----

CPU_PAIRS = [(source, target) for source in SOURCES for target in TARGETS]


def cpu_kernel(source: str, target: str, name: str) -> str:
    """The CPU renderer's C for a `source` -> `target` CAST of SIZE values, named `name`."""
    x = Tensor.empty(SIZE, dtype=source, device="CPU").realize()
    (item,) = create_schedule([x.cast(target).uop], "CPU")[0]
    program = lower(item.ast, heuristic_plan(item.ast, 16))
    code = CRenderer(vector_width=16).render(item.name, program)
    return code.replace(f"void {item.name}(", f"void {name}(")


def run(kernel: Callable[..., object], host: np.ndarray, target: str) -> np.ndarray:
    return run_c_kernel(kernel, np.zeros(len(host), dtype=target), host)


def test_every_cpu_build_gives_the_same_integers(tmp_path: Path) -> None:
    """All 32 kernels in one library per build (several share a conversion function: its
    include guard keeps one); tcc, which has no _Float16, builds the others."""
    kernels = {f"cast{n}": (pair, cpu_kernel(*pair, f"cast{n}"))
               for n, pair in enumerate(CPU_PAIRS)}
    float32_to_uint32 = kernels[f"cast{CPU_PAIRS.index(('float32', 'uint32'))}"][1]
    assert "data0[gidx0] = tt_float_to_uint32(val0);" in float32_to_uint32
    pairs = {f"cast{n}": pair for n, pair in enumerate(CPU_PAIRS)}
    codes = {name: code for name, (_, code) in kernels.items()}
    for build, library, names in libraries_of_every_build(codes, tmp_path):
        for name in names:
            source, target = pairs[name]
            np.testing.assert_array_equal(run(getattr(library, name), cast_inputs(source),
                                              target), reference(source, target),
                                          err_msg=f"{build}: {source} -> {target}")


def vector_cast_program(source: DType, target: DType, lanes: int) -> LinearProgram:
    """data0[i:i+lanes] = data1[i:i+lanes] (a vector of `lanes` sources) cast to `target`.
    (lower.vectorize makes no integer vectors: here one by hand, as the renderer may see.)"""
    output = UOp(Ops.DEFINE_GLOBAL, target, (), (0, SIZE))
    data = UOp(Ops.DEFINE_GLOBAL, source, (), (1, SIZE))
    start = make_range("g", 0, SIZE // lanes) * lanes
    loaded = UOp(Ops.LOAD, source.vec(lanes), (data, start))
    store = UOp(Ops.STORE, target, (output, start, loaded.cast(target.vec(lanes))))
    return linearize(UOp(Ops.SINK, dtypes.bool, (store,)))


@pytest.mark.parametrize("source,lanes", [("float32", 16), ("float64", 8)])
def test_a_vector_cast_converts_each_lane_alike(tmp_path: Path, source: str, lanes: int) -> None:
    """A float vector cast to an int32 vector is the conversion function once per lane."""
    code = CRenderer(vector_width=16).render(
        "vector_cast", vector_cast_program(dtypes.as_dtype(source), dtypes.int32, lanes))
    function = "tt_float_to_int32" if source == "float32" else "tt_double_to_int32"
    assert f"(int_vec{lanes}){{{function}(val0[0]), {function}(val0[1])," in code
    for command in (c_builds()["gcc -O2"], GCC_O0):
        library = build_c_library(code, command, tmp_path)
        np.testing.assert_array_equal(run(library.vector_cast, cast_inputs(source), "int32"),
                                      reference(source, "int32"), err_msg=" ".join(command))


# ---- the GPU languages ----

def gpu_kernel(renderer_class: type, source: str, target: str, name: str) -> str:
    x = Tensor.empty(256, dtype=source, device="NUMPY").realize()
    (item,) = create_schedule([x.cast(target).uop], "NUMPY")[0]
    return renderer_class().render(name, lower(item.ast, heuristic_plan(item.ast)))


def test_opencl_converts_with_its_saturating_conversion() -> None:
    """OpenCL C has the semantics built in: convert_<type>_sat_rtz (pocl runs it above)."""
    from tinyteach.render.opencl import OpenCLRenderer
    for target, word in [("int8", "char"), ("uint32", "uint"), ("int64", "long")]:
        code = gpu_kernel(OpenCLRenderer, "float32", target, "cast")
        assert f"convert_{word}_sat_rtz(val0)" in code, target


def test_wgsl_converts_through_a_helper_that_finds_nan_by_its_bits() -> None:
    """WGSL: a helper per target type (8- and 16-bit ones are held in 32 bits); a half goes
    through f32, exactly."""
    from tinyteach.render.wgsl import WGSLRenderer
    code = gpu_kernel(WGSLRenderer, "float16", "uint8", "cast")
    assert "to_uint8_f32(f32(val0))" in code and "fn is_nan_f32" in code
    assert "if (x >= 256.0f) { return 255u; }" in code


def test_cuda_cast_kernels_compile_to_ptx() -> None:
    """Every pair's kernel as CUDA C, the conversion a __device__ function, compiled in one
    NVRTC call for sm_90 (guards keep one copy of each function); skipped where no CUDA
    compiler or cuda_fp16.h is."""
    from tinyteach.device import DeviceUnavailable
    from tinyteach.render.cuda import CUDARenderer
    from tinyteach.runtime.cuda import CUDACompiler, cuda_include_directory
    try:
        compiler = CUDACompiler("sm_90")
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    if cuda_include_directory() is None:
        pytest.skip("half and bfloat16 need cuda_fp16.h and cuda_bf16.h from a CUDA toolkit")
    sources = [gpu_kernel(CUDARenderer, source, target, f"cast{number}")
               for number, (source, target) in enumerate(CPU_PAIRS)]
    assert "__device__ __forceinline__ unsigned char tt_float_to_uint8(float x)" in sources[1]
    assert "tt_float_to_uint8(__half2float(val0))" in sources[1]
    ptx = compiler.compile("\n".join(sources)).ptx
    for number in range(len(CPU_PAIRS)):
        assert f".entry cast{number}(" in ptx
