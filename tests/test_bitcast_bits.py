"""A bitcast reads bits, on every device (issue 23): `Tensor.bitcast` is one node, a CAST whose
arg is BITCAST, which each device computes by reinterpreting the bits (numpy's `view`, C's
one-lane vector casts, OpenCL's `as_float`, CUDA's `__int_as_float`, WGSL's `bitcast<f32>`),
never with arithmetic. Before, NUMPY took floats apart with log2 and exp2, and numpy's float32
exp2 on AVX-512 turned the bits of FLT_MAX into inf.

Each test is one kernel launch per device and direction, over a large array of bit patterns,
compared bit for bit with numpy's `view`: every float16 and bfloat16 pattern; for float32 and
float64 each exponent's first and last mantissas (zeros, subnormal edges, infinities, quiet and
signaling NaNs of both signs) and random patterns. Then constants (folded on the graph where
exact), the CPU's three builds, vector bitcasts and CUDA's compiler.
"""
from __future__ import annotations

import functools
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
from tinyteach.dtype import BFLOAT16_WORDS
from tinyteach.engine.realize import record_launches
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.rewrite import graph_rewrite, symbolic
from tinyteach.ir.uop import Ops, UOp, is_bitcast, make_range
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render.c import CRenderer

UNSIGNED = {2: np.uint16, 4: np.uint32, 8: np.uint64}
PAIRS_16 = [("int16", "float16"), ("uint16", "float16"), ("int16", "bfloat16"),
            ("uint16", "bfloat16"), ("float16", "bfloat16")]
PAIRS_32_64 = [("int32", "float32"), ("uint32", "float32"), ("int64", "float64"),
               ("uint64", "float64")]
# (exponent bits, mantissa bits, random patterns) of each float size
FORMATS = {4: (8, 23, 10**6), 8: (11, 52, 10**5)}


def on_host(bits: np.ndarray, name: str) -> np.ndarray:
    """The bit patterns as a host array of dtype `name` (bfloat16: its words, dtype.py)."""
    return bits.view(BFLOAT16_WORDS if name == "bfloat16" else np.dtype(name))


def bits_of(tensor: Tensor) -> np.ndarray:
    """A tensor's bits, as unsigned integers (a bfloat16's float32 values are its words
    shifted up: shifted back, exactly)."""
    values = tensor.numpy()
    if tensor.dtype == dtypes.bfloat16:
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.view(UNSIGNED[tensor.dtype.itemsize])


def holds(device: str, *names: str) -> bool:
    """Can the device hold every one of these dtypes? (WEBGPU has no 64-bit types, pocl's
    OpenCL no float16: helpers.skip_unless_supported, for a test that goes on without them)."""
    unsupported = getattr(Device[device], "unsupported_dtypes", {})
    return not any(dtypes.as_dtype(name) in unsupported for name in names)


def bitcast_on(device: str, bits: np.ndarray, source: str, target: str) -> np.ndarray:
    """`bits` as a `source` tensor on the device, bitcast to `target` in one kernel launch;
    the result's bits."""
    x = Tensor(on_host(bits, source), device=device).realize()
    with record_launches() as launches:
        result = x.bitcast(target).realize()
    kernels = [launch for launch in launches if launch.runner is not None]
    assert len(kernels) == 1, f"{source} -> {target}: {len(kernels)} kernel launches"
    assert result.dtype == dtypes.as_dtype(target)
    return bits_of(result)


@functools.cache  # (made once: every device's test reads the same patterns)
def float_patterns(itemsize: int) -> np.ndarray:
    """For each exponent and sign: the first and last mantissas and those around the quiet
    bit (zeros, the subnormal edges, the largest finite, the infinities, signaling and quiet
    NaNs of both signs); then random patterns, seeded."""
    exponent_bits, mantissa_bits, random_count = FORMATS[itemsize]
    unsigned = UNSIGNED[itemsize]
    quiet = 1 << (mantissa_bits - 1)
    mantissas = np.array([0, 1, 2, quiet - 1, quiet, quiet + 1, 2 * quiet - 2, 2 * quiet - 1],
                         dtype=unsigned)
    exponents = np.arange(1 << exponent_bits, dtype=unsigned) << unsigned(mantissa_bits)
    sign = unsigned(1) << unsigned(8 * itemsize - 1)
    edges = (exponents[:, None] | mantissas[None, :]).reshape(-1)
    rng = np.random.default_rng(23)
    random = rng.integers(0, np.iinfo(unsigned).max, size=random_count, dtype=unsigned,
                          endpoint=True)
    return np.concatenate([edges, edges | sign, random])


# ---- every bit pattern, both directions, on every device ----

@pytest.mark.parametrize("pair", PAIRS_16, ids="<->".join)
def test_every_16_bit_pattern_both_ways(device: str, pair: tuple[str, str]) -> None:
    skip_unless_supported(device, *pair)
    words = np.arange(1 << 16, dtype=np.uint16)
    first, second = pair
    np.testing.assert_array_equal(bitcast_on(device, words, first, second), words)
    np.testing.assert_array_equal(bitcast_on(device, words, second, first), words)


@pytest.mark.parametrize("pair", PAIRS_32_64, ids="<->".join)
def test_float32_and_float64_patterns_both_ways(device: str, pair: tuple[str, str]) -> None:
    """A device that dropped NaN payloads or flushed subnormals would show it here (none of
    NUMPY, CPU, PYTHON, pocl's OpenCL and lavapipe's WebGPU does)."""
    skip_unless_supported(device, *pair)
    integer, floating = pair
    bits = float_patterns(np.dtype(integer).itemsize)
    np.testing.assert_array_equal(bitcast_on(device, bits, integer, floating), bits)
    np.testing.assert_array_equal(bitcast_on(device, bits, floating, integer), bits)


def test_the_largest_float32_on_numpy() -> None:
    """Issue 23's case: FLT_MAX's bits came back as inf on NUMPY (exp2(127) is an ulp high in
    numpy's AVX-512 float32 exp2)."""
    bits = np.array([0x7F7FFFFF, 0x00800000, 0x00000001], dtype=np.int32)
    result = Tensor(bits, device="NUMPY").bitcast("float32").numpy()
    np.testing.assert_array_equal(result, bits.view(np.float32))
    assert result[0] == np.finfo(np.float32).max


# ---- constants: folded on the graph where that is exact, else left to the device ----

def test_constant_bitcasts_fold_by_their_bits() -> None:
    """A bitcast of a constant folds to the constant with those bits (numpy's view); one that
    gives or takes a NaN does not fold (a constant holds a Python float, which keeps no
    payload): the device reads the bits."""
    views = [(0x7F7FFFFF, "int32", "float32"), (-0.0, "float32", "uint32"),
             (1, "int32", "float32"), (-2.5, "float64", "int64"), (0x3C00, "uint16", "float16")]
    cases = [(value, source, target, np.array(value, dtype=source).view(target).item())
             for value, source, target in views]
    # bfloat16 -1.0 is the word 0xBF80 (int16 -16512); the word 0x3F80 is 1.0
    cases += [(-1.0, "bfloat16", "int16", -16512), (0x3F80, "int16", "bfloat16", 1.0)]
    for value, source, target, want in cases:
        node = UOp.const(dtypes.as_dtype(source), value).bitcast(dtypes.as_dtype(target))
        folded = graph_rewrite(node, symbolic)
        assert folded.op is Ops.CONST and folded.arg == want, (value, source, target)
        assert type(folded.arg) is type(want)
    for value, source, target in [(0x7FA00001, "int32", "float32"),
                                  (float("nan"), "float32", "int32")]:
        node = UOp.const(dtypes.as_dtype(source), value).bitcast(dtypes.as_dtype(target))
        assert is_bitcast(graph_rewrite(node, symbolic)), (value, source, target)


def test_bitcast_of_constants(device: str) -> None:
    """FLT_MAX (folded on the graph), a negative signaling float32 NaN and a signaling half
    NaN with a payload (each left to the device: a literal's bits, read there)."""
    cases = [(0x7F7FFFFF, "int32", "float32"), (-0x7FFFFF, "int32", "float32")]
    if holds(device, "float16"):
        cases.append((0x7C05, "uint16", "float16"))
    for value, source, target in cases:
        result = bits_of(Tensor.full((4,), value, dtype=source, device=device).bitcast(target))
        want = np.full(4, value, dtype=source).view(UNSIGNED[np.dtype(source).itemsize])
        if device == "WEBGPU" and target == "float16":
            # lavapipe folds the f32 -> f16 conversion of a literal (bits_to_half) when it
            # compiles, and quiets a signaling NaN there; from memory every payload is kept
            want = want | np.uint16(0x0200)
        np.testing.assert_array_equal(result, want, err_msg=f"{source} {value} -> {target}")


# ---- the audit: other exact operations that leaned on libm or numpy ----

def test_exp2_of_a_whole_number_is_its_power_of_two(device: str) -> None:
    """exp2(n) is 2**n exactly, from 0 and the subnormals through inf (numpy's float32 exp2
    on AVX-512 gave 2**127 one ulp high, and NUMPY computed with it: runtime/numpy.py)."""
    ranges = {"float32": (-160, 130), "float16": (-26, 17), "float64": (-1080, 1025)}
    for name, (low, high) in ranges.items():
        if not holds(device, name):
            continue
        exponents = np.arange(low, high)
        with np.errstate(over="ignore"):
            want = np.ldexp(np.ones(len(exponents), dtype=name), exponents)
        got = Tensor(exponents.astype(name), device=device).exp2().numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_copysign_reads_the_sign_bit(device: str) -> None:
    """The sign of -0.0 and of a NaN counts, as in numpy, C and PyTorch (a comparison sees
    neither: the sign bit is read through a bitcast now)."""
    signs = np.array([np.nan, -np.nan, -0.0, 0.0, -np.inf, np.inf, -1e-45, 2.0], np.float32)
    values = np.array([1.0, 2.0, -3.0, -4.0, 5.0, -6.0, 7.0, -0.0], np.float32)
    got = Tensor(values, device=device).copysign(Tensor(signs, device=device)).numpy()
    np.testing.assert_array_equal(got.view(np.uint32),
                                  np.copysign(values, signs).view(np.uint32))


# conversions between floats and integers at the ends of the integers' ranges: rounded or
# truncated exactly on every device (values outside the range, NaN and inf, which C leaves
# undefined, saturate: tests/test_cast_saturation.py)
LIMITS = [("float32", "int32", [2.0**31 - 128, -2.0**31, -2.0**31 + 128, -0.99, 0.99]),
          ("float32", "uint32", [2.0**32 - 256, 2.0**31, 2.0**31 - 128, 0.99]),
          ("float64", "int64", [2.0**63 - 1024, -2.0**63, 2.0**53 + 2, -2.0**62 - 2048]),
          ("uint64", "float64", [2**64 - 1, 2**63 + 1, 2**53 + 1, 2**63 - 1])]


def test_conversions_at_the_integer_limits(device: str) -> None:
    for source, target, values in LIMITS:
        if not holds(device, source, target):
            continue
        host = np.array(values, dtype=np.float64 if source != "uint64" else np.uint64)
        host = host.astype(source)
        got = Tensor(host, device=device).cast(target).numpy()
        np.testing.assert_array_equal(got, host.astype(target), err_msg=f"{source} -> {target}")


# ---- the CPU's builds: tcc, gcc -O0 and gcc -O2 give the same bits ----

CPU_PAIRS = [("int32", "float32"), ("float32", "uint32"), ("uint64", "float64"),
             ("float64", "int64"), ("uint16", "float16"), ("float16", "bfloat16"),
             ("bfloat16", "int16")]
# the bits each CPU kernel reads: every 16-bit word; each float32 and float64 exponent's edges
CPU_PATTERNS = {2: np.arange(1 << 16, dtype=np.uint16), 4: float_patterns(4)[:1 << 13],
                8: float_patterns(8)[:1 << 15]}
def cpu_kernel(source: str, target: str, name: str) -> str:
    """The CPU renderer's C for a `source` -> `target` bitcast of CPU_PATTERNS, the kernel
    named `name` (several go into one library)."""
    size = len(CPU_PATTERNS[dtypes.as_dtype(source).itemsize])
    x = Tensor.empty(size, dtype=source, device="CPU").realize()
    (item,) = create_schedule([x.bitcast(target).uop], "CPU")[0]
    code = CRenderer(vector_width=8).render(item.name, lower(item.ast, heuristic_plan(item.ast, 8)))
    return code.replace(f"void {item.name}(", f"void {name}(")


def run(kernel: Callable[..., object], bits: np.ndarray) -> np.ndarray:
    """A kernel's output (its first parameter) for the input `bits`."""
    return run_c_kernel(kernel, np.zeros_like(bits), bits)


def test_every_cpu_build_gives_the_same_bits(tmp_path: Path) -> None:
    """The same kernels built by tcc (the fast tier; it has no _Float16), gcc -O0 (the fast
    tier without tcc) and gcc -O2 for this CPU and for x86-64-v3 (the optimized tier) give
    numpy's view."""
    kernels = {f"bitcast{n}": cpu_kernel(*pair, f"bitcast{n}") for n, pair in enumerate(CPU_PAIRS)}
    pairs = {f"bitcast{n}": pair for n, pair in enumerate(CPU_PAIRS)}
    for build, library, names in libraries_of_every_build(kernels, tmp_path):
        for name in names:
            source, target = pairs[name]
            bits = CPU_PATTERNS[dtypes.as_dtype(source).itemsize]
            np.testing.assert_array_equal(run(getattr(library, name), bits), bits,
                                          err_msg=f"{build}: {source} -> {target}")


def vector_bitcast_program(size: int, lanes: int) -> LinearProgram:
    """data0[i:i+lanes] = the bits of data1[i:i+lanes] (float32 x lanes) as int32 x lanes."""
    output = UOp(Ops.DEFINE_GLOBAL, dtypes.int32, (), (0, size))
    data = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, size))
    start = make_range("g", 0, size // lanes) * lanes
    loaded = UOp(Ops.LOAD, dtypes.float32.vec(lanes), (data, start))
    store = UOp(Ops.STORE, dtypes.int32, (output, start, loaded.bitcast(dtypes.int32.vec(lanes))))
    return linearize(UOp(Ops.SINK, dtypes.bool, (store,)))


def test_a_vector_bitcast_is_a_vector_cast_on_cpu(tmp_path: Path) -> None:
    """A bitcast of float32x8 to int32x8 (lower.vectorize makes none yet: a kernel with a
    bitcast stays scalar; here one by hand) is gcc's vector cast, which keeps the bits."""
    code = CRenderer(vector_width=8).render("vector_bitcast", vector_bitcast_program(64, 8))
    assert "((int_vec8)(val0))" in code
    bits = float_patterns(4)[:64].copy()
    for command in (c_builds()["gcc -O2"], GCC_O0):
        library = build_c_library(code, command, tmp_path)
        np.testing.assert_array_equal(run(library.vector_bitcast, bits), bits)


def test_opencl_reinterprets_a_whole_vector() -> None:
    from tinyteach.render.opencl import OpenCLRenderer
    code = OpenCLRenderer().render("vector_bitcast", vector_bitcast_program(64, 8))
    assert "as_int8(val0)" in code


def test_a_renderer_without_bit_functions_refuses_rather_than_converts() -> None:
    """An integer cast would convert the value: a language that names no way to read a
    float's bits (`bits_functions`) cannot bitcast it, and says so."""
    from tinyteach.render import CStyleRenderer
    with pytest.raises(NotImplementedError, match="cannot bitcast int32 to float32"):
        CStyleRenderer().bitcast("x", dtypes.int32, dtypes.float32)
    assert CStyleRenderer().bitcast("x", dtypes.int32, dtypes.uint32) == "((unsigned int)(x))"


# ---- CUDA: every pair renders and compiles (NVRTC; no GPU needed) ----

CUDA_PAIRS = [*PAIRS_16, *[(b, a) for a, b in PAIRS_16], *PAIRS_32_64,
              *[(b, a) for a, b in PAIRS_32_64]]


def test_cuda_bitcast_kernels_compile_to_ptx() -> None:
    """Every pair's kernel as CUDA C, through CUDA's bit intrinsics (`__half_as_short`, ...),
    compiled in one NVRTC call for sm_90; skipped where no CUDA compiler or cuda_fp16.h is."""
    from tinyteach.device import DeviceUnavailable
    from tinyteach.render.cuda import CUDARenderer
    from tinyteach.runtime.cuda import CUDACompiler, cuda_include_directory
    try:
        compiler = CUDACompiler("sm_90")
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    if cuda_include_directory() is None:
        pytest.skip("half and bfloat16 need cuda_fp16.h and cuda_bf16.h from a CUDA toolkit")
    renderer, sources = CUDARenderer(), []
    for number, (source, target) in enumerate(CUDA_PAIRS):
        x = Tensor.empty(256, dtype=source, device="NUMPY").realize()
        (item,) = create_schedule([x.bitcast(target).uop], "NUMPY")[0]
        code = renderer.render(f"bitcast{number}", lower(item.ast, heuristic_plan(item.ast)))
        body = code.split("__global__ void", 1)[1]  # (the prelude spells INFINITY with bits)
        for dtype, (from_bits, to_bits) in renderer.bits_functions.items():
            assert (from_bits in body) == (dtype.name == target), (source, target)
            assert (to_bits in body) == (dtype.name == source), (source, target)
        sources.append(code)
    ptx = compiler.compile("\n".join(sources)).ptx
    for number in range(len(CUDA_PAIRS)):
        assert f".entry bitcast{number}(" in ptx
