"""Chapter 9: the CPU device's target (CPU_ARCH) — which -march= every build uses, the vector
lanes that follow from it, the cache key that names it, a clear error for a target the
compiler rejects or this CPU cannot run, and the same bits from a build for another target.

The device is built once a process, so a build for another target runs in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tinyteach.runtime.cpu as cpu

V3 = "x86-64-v3"
V4 = "x86-64-v4"
ROOT = Path(__file__).resolve().parents[1]


def c_compiler() -> str:
    try:
        return cpu.find_c_compiler()
    except cpu.DeviceUnavailable as error:
        pytest.skip(str(error))


def runnable(arch: str) -> bool:
    """Does the compiler know `arch`, and can this CPU run what is built for it?"""
    try:
        cpu.cpu_target(c_compiler(), arch)
    except ValueError:
        return False
    return True


@pytest.fixture
def v3() -> str:
    if not runnable(V3):
        pytest.skip(f"{V3} is not a target of this compiler and CPU")
    return V3


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No CPU_ARCH or CPU_VECTOR_WIDTH from the caller's environment."""
    monkeypatch.delenv("CPU_ARCH", raising=False)
    monkeypatch.delenv("CPU_VECTOR_WIDTH", raising=False)
    return monkeypatch


# ---- the setting reaches every build ----

def test_cpu_arch_replaces_march_native_in_every_build(unset: pytest.MonkeyPatch,
                                                       v3: str) -> None:
    native = cpu.ClangStyleCompiler(c_compiler())
    unset.setenv("CPU_ARCH", v3)
    targeted = cpu.ClangStyleCompiler(c_compiler())
    assert "-march=native" in native.flags
    assert f"-march={v3}" in targeted.flags and "-march=native" not in targeted.flags
    # the fast tier's cc -O0 builds for the same target (tcc takes no -march)
    assert f"-march={v3}" in targeted.fast.unoptimized and "-O0" in targeted.fast.unoptimized
    # a build for v3 and a native build of the same source never share a cache entry
    assert targeted.cache_key != native.cache_key
    assert targeted.library_path(cpu.render_graph([1])) != native.library_path(
        cpu.render_graph([1]))


def test_the_vector_width_follows_the_target(unset: pytest.MonkeyPatch, v3: str) -> None:
    unset.setenv("CPU_ARCH", v3)
    assert cpu.vector_width(cpu.native_macros(c_compiler())) == 8  # AVX2: 8 float lanes
    unset.setenv("CPU_VECTOR_WIDTH", "16")  # the book's width still pins it
    assert cpu.vector_width(cpu.native_macros(c_compiler())) == 16


# ---- targets that cannot be built or run ----

def test_a_value_the_compiler_rejects_is_a_clear_error(unset: pytest.MonkeyPatch) -> None:
    unset.setenv("CPU_ARCH", "no-such-cpu")
    with pytest.raises(ValueError, match=r"CPU_ARCH='no-such-cpu': .* rejects "
                                         r"-march=no-such-cpu: .*no-such-cpu"):
        cpu.make_backend()


def test_a_target_this_cpu_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                 v3: str) -> None:
    """v4 on an AVX2 machine: here the machine's own macros are made v3's."""
    compiler = c_compiler()
    if not cpu.target_macros(compiler, V4):
        pytest.skip(f"the compiler does not know {V4}")
    v3_macros = cpu.target_macros(compiler, v3)
    real = cpu.target_macros

    def as_if_avx2(name: str, arch: str) -> str:
        return v3_macros if arch == cpu.NATIVE else real(name, arch)
    monkeypatch.setattr(cpu, "target_macros", as_if_avx2)
    with pytest.raises(ValueError, match=r"CPU_ARCH='x86-64-v4': this CPU cannot run code "
                                         r"built for x86-64-v4: it lacks AVX512BW, .*AVX512F"):
        cpu._checked_target.__wrapped__(compiler, V4)  # past the cache of real answers


# ---- what the target is called ----

def macros_of(*names: str) -> str:
    return "".join(f"#define {name} 1\n" for name in ("__x86_64__", *names))


def test_isa_level_reads_the_feature_macros() -> None:
    v2 = ("__SSE2__", "__SSE3__", "__SSSE3__", "__SSE4_1__", "__SSE4_2__", "__POPCNT__")
    v3 = (*v2, "__AVX__", "__AVX2__", "__BMI__", "__BMI2__", "__F16C__", "__FMA__",
          "__LZCNT__", "__MOVBE__")
    v4 = (*v3, "__AVX512F__", "__AVX512BW__", "__AVX512CD__", "__AVX512DQ__", "__AVX512VL__")
    assert cpu.isa_level(macros_of(*v4)) == "x86-64-v4"
    assert cpu.isa_level(macros_of(*v3)) == "x86-64-v3"
    assert cpu.isa_level(macros_of(*v3, "__AVX512F__")) == "x86-64-v3"  # v4 needs all five
    assert cpu.isa_level(macros_of(*v2)) == "x86-64-v2"
    assert cpu.isa_level(macros_of("__SSE2__")) == "x86-64"
    assert cpu.isa_level("#define __aarch64__ 1\n#define __ARM_NEON 1\n") == "aarch64"


def compiler_version_from_itself(compiler: str) -> str:
    """gcc's -dumpfullversion (12.2.0), or clang's -dumpversion (14.0.6)."""
    for flag in ("-dumpfullversion", "-dumpversion"):
        result = subprocess.run([compiler, flag], capture_output=True, text=True)
        if result.returncode == 0:
            return result.stdout.strip()
    pytest.skip(f"{compiler} tells no version")


def test_describe_target_names_level_lanes_and_compiler(unset: pytest.MonkeyPatch) -> None:
    compiler = c_compiler()
    target = cpu.cpu_target(compiler, cpu.NATIVE)
    version = compiler_version_from_itself(compiler)
    text = cpu.describe_target()
    assert text.startswith(f"{target.level} (native), {target.lanes} float lanes, ")
    assert f" {version} ({Path(compiler).name})" in text
    if runnable(V3):
        unset.setenv("CPU_ARCH", V3)
        assert cpu.describe_target() == f"{V3}, 8 float lanes, " + text.split(", ")[-1]
        unset.setenv("CPU_VECTOR_WIDTH", "16")
        assert "16 float lanes (CPU_VECTOR_WIDTH; the target's own: 8)" in cpu.describe_target()


# ---- the same source, built for another target, gives the same bits ----

KERNELS = textwrap.dedent("""
    import hashlib, json
    import numpy as np
    from tinyteach import Device, Tensor
    from tinyteach.runtime.cpu import describe_target
    rng = np.random.default_rng(0)
    a, b = (Tensor(rng.standard_normal((128, 128)).astype(np.float32)) for _ in range(2))
    rows = Tensor(rng.standard_normal((8, 1024)).astype(np.float32))
    values = Tensor(rng.standard_normal(100_000).astype(np.float32))
    results = {"matmul": a @ b, "softmax": rows.softmax(-1), "sum": values.sum()}
    print(json.dumps({"target": describe_target(), "flags": Device["CPU"].compiler.flags,
                      **{name: hashlib.sha256(t.numpy().tobytes()).hexdigest()
                         for name, t in results.items()}}))
""")


def run_kernels_for(arch: str) -> subprocess.Popen[str]:
    """The kernels, in a process of their own whose CPU device builds for `arch`: the
    book's 16 lanes (so every target renders the same source), optimized builds only."""
    environment = {**os.environ, "CPU_ARCH": arch, "CPU_VECTOR_WIDTH": "16", "CPU_TIERED": "0",
                   "DEV": "CPU"}
    return subprocess.Popen([sys.executable, "-c", KERNELS], cwd=ROOT, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_build_for_another_target_gives_the_same_bits(v3: str) -> None:
    targets = [cpu.NATIVE, v3] + ([V4] if runnable(V4) else [])
    running = {arch: run_kernels_for(arch) for arch in targets}  # all at once
    results = {}
    for arch, process in running.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        results[arch] = json.loads(out.splitlines()[-1])
    level = cpu.cpu_target(c_compiler(), cpu.NATIVE).level
    named = {arch: arch for arch in targets} | {cpu.NATIVE: f"{level} (native)"}
    for arch, result in results.items():  # each process built for the target it was given
        assert f"-march={arch}" in result.pop("flags")
        assert result.pop("target").startswith(f"{named[arch]}, 16 float lanes")
    native = results.pop(cpu.NATIVE)
    for arch, result in results.items():
        assert result == native, f"{arch} computed other bits than -march=native"
