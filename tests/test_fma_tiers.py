"""Chapter 9: a vector multiply-add written as a fused multiply-add (render/c.py, FMA_FUNCTIONS)
gives the same bits on every tier of the CPU device (runtime/cpu.py), so no kernel waits for the
optimized build.

Every kernel of a matmul (odd sizes too), a bias + relu layer, a convolution and a matmul over
NaN, ±inf, -0.0 and subnormals runs on each fast tier (cc -O0 always, tcc where it is installed
and can read the source) and on the cc -O2 build: the outputs are compared byte for byte, and
the results against numpy. The optimized build must still use the CPU's vector fma instruction,
and `<math.h>` is included only where a kernel may call it."""
from __future__ import annotations

import platform
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tinyteach.runtime.cpu as cpu
from tinyteach import Context, Tensor
from tinyteach.codegen.lower import ProgramSpec
from tinyteach.device import Buffer, Device
from tinyteach.engine.realize import Launch, record_launches
from tinyteach.render.c import HEAVY_WORK, CRenderer

RNG = np.random.default_rng(16)
NAN, INF = float("nan"), float("inf")
SPECIAL = np.array([NAN, INF, -INF, -0.0, 0.0, 1e-40, -1e-40, 1e-45, 3e38, -3e38],
                   dtype=np.float32)


def compiler() -> cpu.ClangStyleCompiler:
    backend_compiler = Device["CPU"].compiler
    assert isinstance(backend_compiler, cpu.ClangStyleCompiler)
    return backend_compiler


def renderer() -> CRenderer:
    backend_renderer = Device["CPU"].renderer
    assert isinstance(backend_renderer, CRenderer)
    return backend_renderer


def fuses() -> bool:
    """Does this machine's CPU renderer write vector fused multiply-adds?"""
    return renderer().fused_multiply_add and renderer().vector_width > 0


def cpu_tensor(array: np.ndarray) -> Tensor:
    return Tensor(np.ascontiguousarray(array), device="CPU").realize()


def random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def optimized_launches(build: Callable[[], Tensor]) -> tuple[list[Launch], np.ndarray]:
    """The kernels of `build()`, built optimized (tiering off), and the result."""
    with Context(CPU_TIERED=0), record_launches() as launches:
        result = build().realize()
    kernels = [launch for launch in launches if launch.runner is not None]
    assert kernels
    return kernels, result.numpy()


def fast_tiers_of(source: str) -> list[str]:
    """The fast tiers that can build `source`: cc -O0 always, tcc where it reads it."""
    fast = compiler().fast
    return [fast.unoptimized_name] + (["tcc"] if fast.tier_for(source) == "tcc" else [])


def output_on_tier(launch: Launch, tier: str, source: str | None = None) -> bytes:
    """The bytes `launch`'s kernel writes when built by `tier` (from `source`, default its
    own), on the same inputs."""
    runner = launch.runner
    assert runner is not None and runner.source is not None
    library = compiler().fast.build(runner.source if source is None else source, tier)
    assert library is not None, f"{tier} failed to build {runner.name}"
    output = launch.buffers[0]
    fresh = Buffer("CPU", output.size, output.dtype)
    cpu.CPUProgram(runner.name, library)(fresh, *launch.buffers[1:])
    return fresh.numpy().tobytes()


def assert_same_bits_on_every_tier(kernels: list[Launch]) -> set[str]:
    """Each kernel's output on every fast tier equals the optimized build's, byte for byte;
    no kernel needs to wait for the optimized build. Returns the tiers compared."""
    compared: set[str] = set()
    for launch in kernels:
        assert launch.runner is not None and launch.runner.source is not None
        source = launch.runner.source
        assert not cpu.needs_optimized_build(source), f"{launch.runner.name} would wait"
        optimized = launch.buffers[0].numpy().tobytes()
        for tier in fast_tiers_of(source):
            assert output_on_tier(launch, tier) == optimized, f"{launch.runner.name} on {tier}"
            compared.add(tier)
    return compared


MATMUL_SHAPES = [(16, 16, 16), (64, 64, 64), (67, 33, 45), (1, 7, 5), (128, 100, 10),
                 (33, 17, 129)]


@pytest.mark.parametrize("m,k,n", MATMUL_SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in MATMUL_SHAPES])
def test_matmuls_give_the_same_bits_on_every_tier(m: int, k: int, n: int) -> None:
    a, b = random(m, k), random(k, n)
    kernels, result = optimized_launches(lambda: cpu_tensor(a) @ cpu_tensor(b))
    np.testing.assert_allclose(result, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert assert_same_bits_on_every_tier(kernels)


def test_bias_relu_layer_gives_the_same_bits_on_every_tier() -> None:
    x, w, bias = random(32, 96), random(96, 64), random(64)
    kernels, result = optimized_launches(
        lambda: (cpu_tensor(x) @ cpu_tensor(w) + cpu_tensor(bias)).relu())
    expected = np.maximum(x.astype(np.float64) @ w + bias, 0)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)
    assert assert_same_bits_on_every_tier(kernels)


def test_convolution_gives_the_same_bits_on_every_tier() -> None:
    torch = pytest.importorskip("torch")
    x, w, bias = random(2, 3, 11, 13), random(16, 3, 3, 3), random(16)
    kernels, result = optimized_launches(
        lambda: cpu_tensor(x).conv2d(cpu_tensor(w), cpu_tensor(bias)))
    expected = torch.nn.functional.conv2d(torch.from_numpy(x).double(),
                                          torch.from_numpy(w).double(),
                                          torch.from_numpy(bias).double()).numpy()
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)
    assert assert_same_bits_on_every_tier(kernels)


def test_special_values_give_the_same_bits_on_every_tier() -> None:
    """NaN, ±inf, -0.0, subnormals and huge values through a matmul's multiply-adds: NaN and
    inf where numpy has them, the same bits on every tier."""
    a = random(24, 40)
    a[:, :len(SPECIAL)] = SPECIAL  # every row meets every special value
    a[3] = SPECIAL[5]  # a row of subnormals: products underflow, the sums stay exact
    b = random(40, 32)
    b[7] = -0.0
    b[:, 5] = SPECIAL[3]  # a column of -0.0
    kernels, result = optimized_launches(lambda: cpu_tensor(a) @ cpu_tensor(b))
    with np.errstate(all="ignore"):
        expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(result), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(result), np.isinf(expected))
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert assert_same_bits_on_every_tier(kernels)


def vector_matmul_source(size: int = 64) -> str:
    a = cpu_tensor(random(size, size))
    kernels, _ = optimized_launches(lambda: a @ a)
    sources = [k.runner.source for k in kernels if k.runner is not None and k.runner.source]
    fused = [s for s in sources if "fma_float_vec" in s]
    assert fused, "the matmul has no fused multiply-add"
    return fused[0]


@pytest.mark.skipif(not fuses(), reason="this CPU has no fast fma, or no vector registers")
def test_a_vector_matmul_is_written_with_fused_multiply_adds_and_starts_fast(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = vector_matmul_source()
    monkeypatch.setenv("TINYTEACH_CACHE", str(tmp_path))  # an empty cache: nothing built yet
    assert "fp-contract" not in source  # nothing left for the optimizer to decide
    assert not cpu.needs_optimized_build(source) and not cpu.starts_optimized(source)
    binaries = compiler().compile_many([source])
    assert isinstance(binaries[0], cpu.TieredBinary)
    assert binaries[0].tier == compiler().fast.unoptimized_name  # tcc knows no vectors
    cpu.wait_for_optimized_builds(timeout=120)


def test_a_heavy_kernel_waits_for_its_optimized_build() -> None:
    """A 512x512 matmul (2^27 multiply-adds) would run longer unoptimized than its optimized
    build takes: its ProgramSpec says `heavy` and it skips the fast tier; a 64x64 one is not.
    Being heavy is a flag of the spec, not text in the source."""
    def matmul_specs(size: int) -> list[ProgramSpec]:
        a = cpu_tensor(random(size, size))
        kernels, _ = optimized_launches(lambda: a @ a)
        return [k.runner.spec for k in kernels if k.runner is not None and k.runner.spec]
    big = matmul_specs(512)
    assert HEAVY_WORK <= 512**3 and any(spec.heavy for spec in big)
    assert all(cpu.starts_optimized(spec.source, spec.heavy) for spec in big if spec.heavy)
    assert not any(spec.heavy or cpu.starts_optimized(spec.source, spec.heavy)
                   for spec in matmul_specs(64))
    assert not any("heavy" in spec.source for spec in big)  # nothing to read in the text


@pytest.mark.skipif(not fuses(), reason="this CPU has no fast fma, or no vector registers")
def test_a_product_is_rounded_once() -> None:
    """-(1 + 2^-11) + (1 + 2^-12)^2 is exactly 2^-24: the fused multiply-add gets it, as does
    numpy in float64; a rounded product (1 + 2^-11, a tie to even) would give 0."""
    x = np.float32(1 + 2.0**-12)
    a = np.zeros((8, 64), dtype=np.float32)
    a[:, 0], a[:, 1] = -(1 + 2.0**-11), x
    b = np.zeros((64, 64), dtype=np.float32)
    b[0], b[1] = 1.0, x
    kernels, result = optimized_launches(lambda: cpu_tensor(a) @ cpu_tensor(b))
    expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    assert expected[0, 0] == np.float32(2.0**-24)
    np.testing.assert_array_equal(result, expected)
    assert assert_same_bits_on_every_tier(kernels)


def optimized_assembly(source: str) -> str:
    """The assembly the optimized build makes of `source` (the CPU compiler's flags)."""
    build = compiler()
    command = [build.compiler, *build.flags, *build.openmp_flags(source), "-S", "-x", "c", "-",
               "-o", "-"]
    return subprocess.run(command, input=source, capture_output=True, text=True,
                          check=True).stdout


VECTOR_FMA = {"x86_64": r"\bvfmadd\d+ps\b", "aarch64": r"\bfmla\s+v\d+\.4s",
              "arm64": r"\bfmla\s+v\d+\.4s"}


@pytest.mark.skipif(not fuses() or platform.machine() not in VECTOR_FMA,
                    reason="no vector fma here, or an architecture this test cannot read")
def test_the_optimized_build_uses_the_vector_fma_instruction() -> None:
    assembly = optimized_assembly(vector_matmul_source())
    assert re.search(VECTOR_FMA[platform.machine()], assembly)


def test_math_header_only_where_a_kernel_may_call_libm() -> None:
    a = cpu_tensor(random(4, 8))
    for build, needs_header in ((lambda: a * 2.0 + 1.0, False), (lambda: a.sqrt(), True)):
        kernels, _ = optimized_launches(build)
        sources = [k.runner.source for k in kernels if k.runner is not None and k.runner.source]
        assert any(("#include <math.h>" in s) == needs_header for s in sources)


@pytest.mark.skipif(not fuses(), reason="this CPU has no fast fma, or no vector registers")
def test_the_lane_by_lane_fallback_gives_the_instructions_bits() -> None:
    """The vector fma macro is the target's instruction where the compiler has it and one
    fmaf per lane elsewhere (render/c.py, VECTOR_FMA_INSTRUCTIONS): the source with the
    feature macros undefined builds the fallback, and its output equals the instruction's,
    byte for byte, on NaN, ±inf, -0.0 and subnormals too."""
    a, b = random(24, 40), random(40, 48)
    a[:, :len(SPECIAL)] = SPECIAL
    kernels, _ = optimized_launches(lambda: cpu_tensor(a) @ cpu_tensor(b))
    fused = [k for k in kernels if k.runner is not None and "fma_float_vec" in k.runner.source]
    assert fused, "the matmul has no vector fma"
    for launch in fused:
        runner = launch.runner
        assert runner is not None and runner.source is not None
        without = "#undef __AVX512F__\n#undef __FMA__\n" + runner.source
        fallback = output_on_tier(launch, compiler().fast.unoptimized_name, without)
        assert fallback == launch.buffers[0].numpy().tobytes()


@pytest.mark.skipif(not fuses() or platform.machine() != "x86_64",
                    reason="no vector fma here, or not x86-64 (whose assembly this test reads)")
def test_a_scalar_operand_is_broadcast_straight_from_memory() -> None:
    """The scalar of a vector matmul's multiply-add (one element of `a`, used in every lane)
    is loaded by one broadcast from memory. Written as 16 lane-by-lane fmaf calls, gcc -O2
    loaded a whole vector at its address and broadcast its first lane: 64 bytes at every
    step, across two cache lines 15 times out of 16 (a 512 x 512 matmul: 1.05 -> 0.73 ms)."""
    assembly = optimized_assembly(vector_matmul_source())
    assert re.search(r"\bvbroadcastss\s+-?\d*\(%\w+", assembly)  # from memory
    assert not re.search(r"\bvbroadcastss\s+%xmm\d+", assembly)  # not from a loaded vector
