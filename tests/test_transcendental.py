"""Chapter 8 (issue 16): exp2 from primitive ops (tinyteach/codegen/transcendental.py) on the CPU.

The C renderer writes float32 EXP2 as a clamp, a rounding, a polynomial and a power of two built
from its bits, instead of a call to libm's exp2f, so that gcc can vectorize the loop: by default
in the loops split across SIMD lanes (softmax's sum), with TRANSCENDENTAL=2 everywhere. Checked,
on kernels built with gcc -O2 and the CPU device's flags: every float32 of a dense sweep of
[-160, 130], random bit patterns and the special values against numpy's exp2 in float64 rounded
to float32 (within 1 ulp; exact for the special values and the integers); which loops keep
exp2f under each setting; that gcc vectorizes softmax's sum loop only with the arithmetic; that
tcc (the fast tier) builds the same kernel and gets the same values; a kernel with several exp2
in several loops; softmax, sigmoid and gelu against PyTorch with NaN and infinite inputs. NUMPY
computes exp2 with numpy's own function (it has no renderer): only CPU is changed.
"""
from __future__ import annotations

import ctypes
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tinyteach import Tensor
from tinyteach.codegen.lower import lower
from tinyteach.codegen.transcendental import EXP2_COEFFICIENTS, decompose_program, is_bitcast
from tinyteach.engine.schedule import ScheduleItem, create_schedule
from tinyteach.helpers import Context
from tinyteach.ir.uop import Ops
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render.c import BITCAST_FUNCTIONS, CRenderer
from tinyteach.runtime.cpu import C_FLAGS, march_flags

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5,
                    127.0, 127.5, 127.99999, 128.0, 128.5, 200.0, 1e30, 3.4e38, -1e30, -3.4e38,
                    -126.0, -126.5, -127.0, -140.3, -149.0, -149.4, -149.5, -149.6, -149.99,
                    -150.0, -150.5, -151.0, -152.0, -153.0, 1e-8, -1e-8, 1e-40, -1e-40],
                   dtype=np.float32)


def reference_exp2(x: np.ndarray) -> np.ndarray:
    """numpy's exp2 in float64, rounded once to float32."""
    with np.errstate(over="ignore"):
        return np.exp2(x.astype(np.float64)).astype(np.float32)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many float32 values lie between a and b (both not NaN): their bits, made monotonic."""
    def ordered(v: np.ndarray) -> np.ndarray:
        bits = v.view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    return np.abs(ordered(a) - ordered(b))


def build_and_run(source: str, x: np.ndarray, command: list[str] | None = None) -> np.ndarray:
    """Build a kernel's C source into a library (gcc -O2 with the CPU device's flags, or
    `command`) and run it on x: the kernel's first parameter is its output."""
    with tempfile.TemporaryDirectory() as directory:
        library = Path(directory) / "kernel.so"
        command = command or ["gcc", *C_FLAGS, "-fopenmp", "-x", "c"]
        subprocess.run([*command, "-o", str(library), "-"], input=source, text=True,
                       check=True, capture_output=True)
        kernel = getattr(ctypes.CDLL(str(library)), re.search(r"void (\w+)\(", source)[1])
        out = np.empty_like(x)
        kernel(out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p))
        return out


def exp2_source(size: int) -> str:
    """The CPU's C source of an elementwise exp2, every exp2 as arithmetic (TRANSCENDENTAL=2:
    the default decomposes only those in loops gcc vectorizes, and this kernel has none)."""
    x = Tensor(np.zeros(size, np.float32), device="CPU").realize()
    (item,) = schedule_of(x.exp2())
    with Context(TRANSCENDENTAL=2):
        return CRenderer().render(item.name, lower(item.ast, heuristic_plan(item.ast, 0)))


def cpu_exp2(x: np.ndarray) -> np.ndarray:
    source = exp2_source(x.size)
    assert "exp2f" not in source
    return build_and_run(source, np.ascontiguousarray(x))


def schedule_of(tensor: Tensor) -> list[ScheduleItem]:
    items, _ = create_schedule([tensor.uop], tensor.device)
    return items


def softmax_source(rows: int = 64, columns: int = 1024) -> str:
    x = Tensor(np.zeros((rows, columns), np.float32), device="CPU").realize()
    (item,) = schedule_of(x.softmax(-1))
    return CRenderer().render(item.name, lower(item.ast, heuristic_plan(item.ast, 8)))


def test_a_dense_sweep_is_within_one_ulp_of_numpy():
    x = np.linspace(-160, 130, 10**6, dtype=np.float32)
    got, want = cpu_exp2(x), reference_exp2(x)
    assert not np.isnan(got).any()
    assert ulp_distance(got, want).max() <= 1
    # most are exact: a polynomial one ulp off everywhere would fail this
    assert (got == want).mean() > 0.85  # 90% measured (libm: all but a few)


def test_random_floats_of_every_exponent_are_within_one_ulp():
    bits = np.random.default_rng(0).integers(0, 2**32, 200_000, dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32)
    x = x[~np.isnan(x)]
    got, want = cpu_exp2(x), reference_exp2(x)
    assert ulp_distance(got, want).max() <= 1


def test_special_values_are_exact():
    got, want = cpu_exp2(SPECIAL), reference_exp2(SPECIAL)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert ulp_distance(got[finite], want[finite]).max() <= 1
    exact = {np.inf: np.inf, -np.inf: 0.0, 128.0: np.inf, 200.0: np.inf, -150.0: 0.0,
             -151.0: 0.0, -1e30: 0.0, 0.0: 1.0, -149.0: 2.0**-149, 1.0: 2.0}
    for value, expected in exact.items():
        assert cpu_exp2(np.array([value], np.float32))[0] == expected, value


def test_integers_give_exact_powers_of_two_subnormal_ones_included():
    n = np.arange(-149, 128, dtype=np.float32)
    np.testing.assert_array_equal(cpu_exp2(n), np.ldexp(np.float32(1), n.astype(np.int32)))


def test_the_polynomial_starts_at_one_so_exp2_of_zero_is_one():
    assert EXP2_COEFFICIENTS[0] == 1.0
    assert abs(EXP2_COEFFICIENTS[1] - np.log(2)) < 1e-7


def body_of(source: str) -> str:
    """The kernel's function, without the helpers before it."""
    return source[source.index("\nvoid "):]


def sum_loop_of(source: str) -> str:
    start = source.index("for (int ridx1")
    return source[start:source.index("\n    }\n", start)]


def test_the_sum_loop_has_no_exp2f_call_and_the_setting_brings_it_back():
    """By default the exp2 of softmax's sum loop (split across vector lanes) is arithmetic, and
    the column loop reads each exp back from the row's array (render/c.py's ROW_CACHE): no
    exp2f at all. Without the row's array the column loop computes exp2 again, as arithmetic
    too (one row per iteration: gcc vectorizes that loop); 2: arithmetic; 0: both calls."""
    source = softmax_source()
    assert "exp2f" not in source and "local0[gidx1]" in source
    assert all(name in source for name in BITCAST_FUNCTIONS.values())
    assert "no-trapping-math" in source
    with Context(ROW_CACHE=0):
        uncached = softmax_source()
    assert "exp2f" not in uncached and "local0" not in uncached
    assert body_of(uncached).count("tt_bits_to_float(") == \
        2 * body_of(source).count("tt_bits_to_float(")
    with Context(TRANSCENDENTAL=2):
        assert "exp2f" not in softmax_source()
    with Context(TRANSCENDENTAL=0, ROW_CACHE=0):
        kept = softmax_source()
    assert "exp2f" in sum_loop_of(kept) and "tt_bits_to_float(" not in kept
    assert kept.count("exp2f(") == 2


def test_several_exp2_in_several_loops_each_place_their_own_ops():
    """softmax's kernel computes exp2 in the sum loop and again in the column loop (without
    the row's array): each copy's ops are placed in its own loop (an op placed in an earlier
    loop is out of scope in a later one), and the program compiles and gives torch's
    softmax."""
    x = np.random.default_rng(1).standard_normal((64, 1024)).astype(np.float32)
    (item,) = schedule_of(Tensor(x, device="CPU").realize().softmax(-1))
    program = lower(item.ast, heuristic_plan(item.ast, 8))
    exps = sum(u.op is Ops.EXP2 for u in program.uops)
    assert exps == 2
    decomposed = decompose_program(program, simd_loops_only=False)
    assert not any(u.op is Ops.EXP2 for u in decomposed.uops)
    assert sum(is_bitcast(u) for u in decomposed.uops) >= 3 * exps
    with Context(TRANSCENDENTAL=2, ROW_CACHE=0):
        source = CRenderer().render(item.name, program)
    assert body_of(source).count("tt_bits_to_float(") == 2 * exps  # 2**n in two halves
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_allclose(build_and_run(source, x), want, rtol=2e-6, atol=1e-9)
    got = Tensor(x, device="CPU").softmax(-1).numpy()  # the device's path: the default
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)


def compile_report(source: str, directory: Path) -> str:
    """What gcc -O2 (the kernels' flags, for a pinned target: x86-64-v3) says it vectorized:
    the decision is gcc's for a CPU, and differs between AVX2 and AVX-512."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the vectorizer's report is pinned to an x86-64 target")
    flags = [f for f in march_flags("x86-64-v3") if f != "-shared"] + ["-fopenmp",
                                                                       "-fopt-info-vec"]
    result = subprocess.run(["gcc", *flags, "-c", "-x", "c", "-", "-o", "kernel.o"],
                            input=source, capture_output=True, text=True, check=True,
                            cwd=directory)
    return result.stderr


def test_gcc_vectorizes_the_sum_loop_only_with_exp2_as_arithmetic(tmp_path):
    """With exp2f the sum loop calls libm per element and stays scalar; as arithmetic gcc -O2
    vectorizes it (`-fopt-info-vec` names the lines of the loops it vectorized)."""
    def vectorized_in_sum_loop(source: str) -> bool:
        start = source[:source.index("for (int ridx1")].count("\n") + 1  # the loop's line
        lines = {int(n) for n in re.findall(r":(\d+):\d+: optimized: loop vectorized",
                                            compile_report(source, tmp_path))}
        return bool(lines & {start, start + 1})  # gcc names the line of the loop or its test
    assert vectorized_in_sum_loop(softmax_source())
    with Context(TRANSCENDENTAL=0):
        assert not vectorized_in_sum_loop(softmax_source())


@pytest.mark.skipif(shutil.which("tcc") is None, reason="tcc is not installed")
def test_tcc_reads_the_source_and_computes_the_same_bits_as_gcc():
    """The fast tier (tcc) takes the union version of the bitcast, gcc -O2 the vector one:
    the same kernel, the same bits, and torch's softmax."""
    x = np.random.default_rng(3).standard_normal((64, 1024)).astype(np.float32) * 20
    source = softmax_source()
    fast = build_and_run(source, x, ["tcc", "-shared"])
    optimized = build_and_run(source, x)
    np.testing.assert_allclose(fast, optimized, rtol=1e-6, atol=1e-12)
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_allclose(optimized, want, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("name, ours, theirs", [
    ("softmax", lambda t: t.softmax(-1), lambda t: torch.softmax(t, -1)),
    ("sigmoid", lambda t: t.sigmoid(), torch.sigmoid),
    ("gelu", lambda t: t.gelu(), lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
])
def test_ops_built_on_exp_match_torch_with_nan_and_inf(name, ours, theirs):
    x = np.random.default_rng(2).standard_normal((16, 300)).astype(np.float32) * 30
    x[3, 5], x[4, 7], x[5, 9] = np.nan, np.inf, -np.inf
    got = ours(Tensor(x, device="CPU")).numpy()
    want = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_the_numpy_device_keeps_numpys_exp2():
    x = np.linspace(-160, 130, 10_001, dtype=np.float32)
    got = Tensor(x, device="NUMPY").exp2().numpy()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, np.exp2(x))


def sigmoid_source(shape: tuple[int, ...]) -> str:
    x = Tensor(np.zeros(shape, np.float32), device="CPU").realize()
    (item,) = schedule_of(x.sigmoid())
    return CRenderer().render(item.name, lower(item.ast, heuristic_plan(item.ast, 8)))


def test_an_elementwise_kernel_long_inner_loop_has_exp2_as_arithmetic(tmp_path):
    """sigmoid over rows of 512: its inner loop walks memory in order, so its exp2 is
    arithmetic and gcc vectorizes the loop (elementwise_loops); a row of 3 keeps the one
    readable exp2f call (a loop that short gains nothing from vectors)."""
    long_rows = sigmoid_source((4, 512))
    assert "exp2f" not in long_rows and "tt_bits_to_float(" in long_rows
    assert "exp2f(" in sigmoid_source((6, 3))
    loop_line = long_rows[:long_rows.index("for (int gidx1")].count("\n") + 1
    lines = {int(n) for n in re.findall(r":(\d+):\d+: optimized: loop vectorized",
                                        compile_report(long_rows, tmp_path))}
    assert lines & {loop_line, loop_line + 1}
    with Context(TRANSCENDENTAL=0):
        assert "exp2f(" in sigmoid_source((4, 512))


# ---- exp2 on vectors: a matmul's epilogue (lower.vectorize) ----

def vector_exp2_source(size: int, lanes: int = 8) -> str:
    """The C source of an elementwise exp2 computed in vectors of `lanes` (UPCAST then
    VECTORIZE by hand): a vector EXP2 is always written as arithmetic, in whole-vector ops."""
    from tinyteach.device import Capabilities
    from tinyteach.opt import Kernel, Opt, OptOps
    x = Tensor(np.zeros(size, np.float32), device="CPU").realize()
    (item,) = schedule_of(x.exp2())
    plan = Kernel(item.ast, "CPU", Capabilities(vector_width=lanes, threads=True)).apply_opts(
        [Opt(OptOps.UPCAST, 0, lanes), Opt(OptOps.VECTORIZE, 0, lanes)]).finished_plan()
    return CRenderer(vector_width=lanes).render(item.name, lower(item.ast, plan))


def test_vector_exp2_is_arithmetic_in_whole_vectors_and_equals_the_scalar_bits():
    x = np.concatenate([np.linspace(-160, 130, 2**16, dtype=np.float32), SPECIAL,
                        np.full(-len(SPECIAL) % 8, 1.5, np.float32)])
    source = vector_exp2_source(x.size)
    assert "exp2f" not in source and "float_vec8" in source and "int_vec8" in source
    assert "[3]" not in body_of(source), "every op takes the whole vector (no lane by lane)"
    vector, scalar = build_and_run(source, x), cpu_exp2(x)
    np.testing.assert_array_equal(vector.view(np.int32), scalar.view(np.int32))
