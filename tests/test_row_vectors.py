"""Issue 16: softmax and layernorm at PyTorch's speed on the CPU (opt/, codegen/lower.py,
render/c.py).

A fused row kernel (schedule.fuses_along_rows) on the CPU takes one row per iteration of its
outer loop (heuristic._one_row_at_a_time), so each of its loops walks one row in order and gcc
vectorizes it: the max and the sums in W explicit lanes combined in a fixed order (FIXED_LANES,
W = the renderer's vector width), the column loop with exp2 as arithmetic, reading softmax's exp
back from an array of one row (ROW_CACHE), every integer a position (compiled without -fwrapv).
Checked against PyTorch: softmax, log_softmax, layernorm and their gradients, rows of 1, 7,
1000, 1024 and 1031, NaN and infinite rows, with each new path on and off; the kernels'
structure; that gcc vectorizes every loop of the row; that tcc (the fast tier) builds the
kernel and computes the same bits as gcc -O2; that a kernel with integer data keeps -fwrapv.
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
from tinyteach.codegen.plan import NO_OPTIONS, KernelOptions
from tinyteach.device import Device
from tinyteach.engine.realize import build_schedule
from tinyteach.engine.schedule import create_schedule
from tinyteach.helpers import Context, clear_caches
from tinyteach.opt.heuristic import choose_options, heuristic_plan
from tinyteach.render.c import CRenderer, integers_are_positions
from tinyteach.runtime.cpu import C_FLAGS, march_flags, needs_optimized_build

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

LENGTHS = [1, 7, 1000, 1024, 1031]
# (FIXED_LANES, ROW_CACHE): the new paths on, each off, and the old path
SETTINGS = [(1, 1), (0, 1), (1, 0), (0, 0)]


@pytest.fixture(params=SETTINGS, ids=lambda s: f"lanes{s[0]}-cache{s[1]}")
def setting(request):
    lanes, cache = request.param
    clear_caches()  # compiled kernels are cached by AST: build them again under this setting
    with Context(FIXED_LANES=lanes, ROW_CACHE=cache):
        yield request.param
    clear_caches()


def rows(length: int, count: int = 33, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((count, length)) * 4).astype(np.float32)


# which loops gcc vectorizes is asked for this target, whatever the host's CPU
PINNED_TARGET = "x86-64-v3"

OPS = {
    "softmax": (lambda t: t.softmax(-1), lambda t: torch.softmax(t, -1)),
    "log_softmax": (lambda t: t.log_softmax(-1), lambda t: torch.log_softmax(t, -1)),
    "layernorm": (lambda t: t.layernorm(-1, eps=1e-5),
                  lambda t: torch.nn.functional.layer_norm(t, t.shape[-1:], eps=1e-5)),
}


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("name", list(OPS))
def test_row_kernels_match_torch(name, length, setting):
    ours, theirs = OPS[name]
    x = rows(length)
    got = ours(Tensor(x, device="CPU")).numpy()
    want = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("length", [7, 1031])
@pytest.mark.parametrize("name", list(OPS))
def test_row_kernel_gradients_match_torch(name, length, setting):
    ours, theirs = OPS[name]
    x, weights = rows(length, seed=1), rows(length, seed=2)
    t = Tensor(x, device="CPU", requires_grad=True)
    (ours(t) * Tensor(weights, device="CPU")).sum().backward()
    reference = torch.from_numpy(x).requires_grad_()
    (theirs(reference) * torch.from_numpy(weights)).sum().backward()
    assert t.grad is not None and reference.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), reference.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length", [7, 1024, 1031])
@pytest.mark.parametrize("name", list(OPS))
def test_nan_and_infinite_rows_match_torch(name, length, setting):
    """A NaN anywhere in a row makes the whole row NaN (the max keeps it, in every lane and
    through the combination); +inf gives inf - inf = NaN; -inf entries give 0 (softmax); a
    row of -inf only is NaN."""
    ours, theirs = OPS[name]
    x = rows(length, count=8, seed=3)
    x[0, length // 2] = np.nan
    x[1, -1] = np.nan
    x[2, 0] = np.inf
    x[3, length // 3] = -np.inf
    x[4, :] = -np.inf
    x[5, :] = np.inf
    x[6, 0] = -np.inf
    got = ours(Tensor(x, device="CPU")).numpy()
    want = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_nan_in_any_lane_reaches_the_max(setting):
    """The row max alone (x.max(-1) after the softmax's subtraction needs it): a NaN at each
    position of a 37-long row, so that every lane and the tail see one."""
    lanes, cache = setting
    x = rows(37, count=37, seed=4)
    np.fill_diagonal(x, np.nan)
    clear_caches()
    with Context(FIXED_LANES=lanes, ROW_CACHE=cache):
        got = Tensor(x, device="CPU").softmax(-1).numpy()
    clear_caches()
    assert np.isnan(got).all()


# ---- the kernel: one row per iteration, lanes, no libm call, the row's array ----

def row_kernel(tensor: Tensor):
    (item,) = create_schedule([tensor.uop], "CPU")[0]
    return item


def softmax_item(length: int = 1024):
    return row_kernel(Tensor(np.zeros((64, length), np.float32), device="CPU").realize()
                      .softmax(-1))


def test_the_heuristic_takes_one_row_at_a_time():
    """No tile: a 4x4 tile interleaved 4 rows, and gcc vectorized none of the column loop."""
    item = softmax_item()
    for width in (0, 8, 16):
        options = choose_options(item.ast, width)
        assert options.upcasts == () and options.vector_width == 0


@pytest.mark.parametrize("width", [4, 8, 16])
def test_the_lanes_are_the_renderers_vector_width(width):
    """W lanes per accumulator, W what runtime/cpu.py reports (CPU_VECTOR_WIDTH pins it):
    the max and the sum each have their lane array; no OpenMP simd pragma; the column loop
    reads the row's exp back; no exp2f."""
    item = softmax_item()
    program = lower(item.ast, heuristic_plan(item.ast, width))
    source = CRenderer(vector_width=width).render(item.name, program)
    assert f"acc0_lanes[{width}]" in source and f"acc1_lanes[{width}]" in source
    assert "#pragma omp simd" not in source and "exp2f" not in source
    assert re.search(r"float local0\[1024\];", source)
    column_loop = source[source.index("for (int gidx1"):]
    assert "local0[gidx1]" in column_loop and "tt_bits_to_float" not in column_loop
    assert not needs_optimized_build(source)  # the fast tier may build it: no reordering


def test_the_old_path_splits_sums_only_under_the_pragma():
    item = softmax_item()
    with Context(FIXED_LANES=0):
        program = lower(item.ast, heuristic_plan(item.ast, 8))
        source = CRenderer(vector_width=8).render(item.name, program)
    assert "_lanes[" not in source and "#pragma omp simd reduction(+:acc1)" in source
    assert needs_optimized_build(source)


def test_without_vectors_there_are_no_lanes():
    item = softmax_item()
    program = lower(item.ast, heuristic_plan(item.ast, 0))
    source = CRenderer(vector_width=0).render(item.name, program)
    assert "_lanes[" not in source and "reduction(+:acc0)" not in source


def gcc_vectorized_lines(source: str, tmp_path) -> set[int]:
    """The lines of the loops gcc -O2 vectorizes, built for a pinned target (x86-64-v3, AVX2:
    which loops gcc vectorizes is its decision for a CPU, not tinyteach's, and differs between
    AVX2 and AVX-512); compile-only, so any x86-64 host can ask."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the vectorizer's report is pinned to an x86-64 target")
    flags = [f for f in march_flags(PINNED_TARGET) if f != "-shared"] + ["-fopenmp",
                                                                         "-fopt-info-vec"]
    report = subprocess.run(["gcc", *flags, "-c", "-x", "c", "-", "-o", "kernel.o"],
                            input=source, capture_output=True, text=True, check=True,
                            cwd=tmp_path).stderr
    return {int(n) for n in re.findall(r":(\d+):\d+: optimized: loop vectorized", report)}


def build_and_run(source: str, x: np.ndarray, command: list[str] | None = None) -> np.ndarray:
    """Build a kernel's C source (gcc -O2 with the CPU device's flags, or `command`) and run
    it on x: the kernel's first parameter is its output."""
    with tempfile.TemporaryDirectory() as directory:
        library = Path(directory) / "kernel.so"
        command = command or ["gcc", *C_FLAGS, "-fopenmp", "-x", "c"]
        subprocess.run([*command, "-o", str(library), "-"], input=source, text=True,
                       check=True, capture_output=True)
        match = re.search(r"void (\w+)\(", source)
        assert match is not None
        kernel = getattr(ctypes.CDLL(str(library)), match[1])
        out = np.empty_like(x)
        kernel(out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p))
        return out


def line_of(source: str, text: str) -> int:
    return source[:source.index(text)].count("\n") + 1


@pytest.mark.parametrize("name", list(OPS))
def test_gcc_vectorizes_every_loop_of_the_row(name, tmp_path):
    """The max's or the sums' lane loops and the column loop: each is named in gcc's report
    of the loops it vectorized (with -fwrapv kept, the row + column position was not affine
    and the column loop stayed scalar)."""
    width = Device["CPU"].renderer.vector_width
    if width < 4:
        pytest.skip("this CPU has no vector registers of 4 floats or more")
    item = row_kernel(OPS[name][0](Tensor(rows(1024), device="CPU").realize()))
    program = lower(item.ast, heuristic_plan(item.ast, width))
    source = Device["CPU"].renderer.render(item.name, program)
    vectorized = gcc_vectorized_lines(source, tmp_path)
    reductions = re.findall(r"for \(int (ridx\d+)_block", source)
    assert len(reductions) == 2
    for loop in [f"for (int {r}_block" for r in reductions] + ["for (int gidx1"]:
        assert line_of(source, loop) in vectorized, loop


@pytest.mark.skipif(shutil.which("tcc") is None, reason="tcc is not installed")
@pytest.mark.parametrize("length", [1024, 1031])
@pytest.mark.parametrize("name", list(OPS))
def test_tcc_computes_the_same_bits_as_gcc(name, length):
    """The lanes' order is written in the source: tcc, gcc -O0 and gcc -O2 compute the same
    operations in the same order, bit for bit."""
    x = rows(length, count=64, seed=5)
    item = row_kernel(OPS[name][0](Tensor(x, device="CPU").realize()))
    program = lower(item.ast, heuristic_plan(item.ast, 8))
    source = CRenderer(vector_width=8).render(item.name, program)
    optimized = build_and_run(source, x)
    fast = build_and_run(source, x, ["tcc", "-shared"])
    np.testing.assert_array_equal(fast.view(np.int32), optimized.view(np.int32))
    want = OPS[name][1](torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(optimized, want, rtol=2e-5, atol=2e-5)


# ---- -fwrapv is dropped only where no integer can wrap ----

def test_a_kernel_of_positions_only_is_built_without_wrapv():
    item = softmax_item()
    program = lower(item.ast, heuristic_plan(item.ast, 8))
    assert integers_are_positions(program)
    assert '"no-wrapv"' in CRenderer(vector_width=8).render(item.name, program)


def test_integer_data_keeps_wrapv_and_wraps():
    big = np.array([[2**31 - 1, 5, -(2**31)]] * 3, dtype=np.int32)
    tensor = Tensor(big, device="CPU").realize()
    for result, want in [(tensor + 1, big + 1), ((tensor * 3).sum(-1), (big * 3).sum(-1))]:
        (item,) = create_schedule([result.uop], "CPU")[0]
        program = lower(item.ast, heuristic_plan(item.ast, 8))
        assert not integers_are_positions(program)
        assert "no-wrapv" not in CRenderer(vector_width=8).render(item.name, program)
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(result.numpy(), want.astype(np.int32))


# ---- chapter 8's codegen-61/63: what gcc 12 vectorizes, for AVX2 and AVX-512 alike ----

BOTH_TARGETS = ("x86-64-v3", "x86-64-v4")  # AVX2 and AVX-512: compile-only, any x86-64 host


def gcc_for(target: str, source: str, *flags: str) -> subprocess.CompletedProcess:
    """gcc -O2 on `source` with the CPU device's flags built for `target` and `flags`."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the vectorizer's report is pinned to x86-64 targets")
    device_flags = [f for f in march_flags(target) if f != "-shared"] + ["-fopenmp"]
    return subprocess.run(["gcc", *device_flags, *flags, "-x", "c", "-"], input=source,
                          capture_output=True, text=True, check=True)


def loops_vectorized(source: str, target: str) -> dict[str, bool]:
    """Each loop over a row (its line up to the brace) -> whether gcc vectorized it."""
    report = gcc_for(target, source, "-fopt-info-vec", "-c", "-o", "/dev/null").stderr
    done = {int(n) for n in re.findall(r":(\d+):\d+: optimized: loop vectorized", report)}
    return {line.strip().split(" {")[0]: bool({number, number + 1} & done)
            for number, line in enumerate(source.splitlines(), 1)
            if re.match(r"\s+for \(int (ridx\d+ |ridx\d+_block|gidx1)", line)}


def chapter_sources() -> tuple[str, str]:
    """codegen-62's kernels of softmax over rows of 1024, with the book's 16 lanes: `before`
    (a 4x4 tile, sums under `omp simd`, -fwrapv) and `after` (as the device builds it)."""
    item = row_kernel(Tensor(np.zeros((4096, 1024), np.float32), device="CPU").realize()
                      .softmax(-1))
    renderer = CRenderer(vector_width=16, fused_multiply_add=True)
    tiled = KernelOptions(upcasts=((0, 4), (1, 4)), parallel=True)
    with Context(FIXED_LANES=0, ROW_CACHE=0):
        before = renderer.render(item.name, lower(item.ast, tiled))
    after = renderer.render(item.name, lower(item.ast, heuristic_plan(item.ast, 16)))
    return before.replace(', "no-wrapv"', ""), after


@pytest.mark.parametrize("target", BOTH_TARGETS)
def test_the_tiled_row_kernel_vectorizes_only_its_sum(target):
    before, after = chapter_sources()
    assert list(loops_vectorized(before, target).values()) == [False, True, False]
    found = loops_vectorized(after, target)
    assert len(found) == 3 and all(found.values())  # both lane loops and the column loop


def test_wrapv_alone_scalarizes_the_column_loop_unless_avx512_scatters():
    _, after = chapter_sources()
    wrapping = after.replace(', "no-wrapv"', "")
    columns = "for (int gidx1 = 0; gidx1 < 1024; gidx1++)"
    assert not loops_vectorized(wrapping, "x86-64-v3")[columns]
    assert loops_vectorized(wrapping, "x86-64-v4")[columns]
    scatters = {(target, name): gcc_for(target, source, "-S", "-o", "-").stdout.count("vscatter")
                for target in BOTH_TARGETS for name, source in (("wrap", wrapping),
                                                                ("built", after))}
    assert scatters[("x86-64-v4", "wrap")] > 0
    assert scatters[("x86-64-v3", "wrap")] == 0  # AVX2 has no scatter store
    assert scatters[("x86-64-v3", "built")] == scatters[("x86-64-v4", "built")] == 0


# ---- a vector tile broadcasts from memory: no predictive commoning ----

def conv_input_gradient_source(monkeypatch: pytest.MonkeyPatch) -> str:
    """The channel tile of a convolution's input gradient (32 -> 32 channels, 5x5, 24-pixel
    rows), as the device renders it for 16 lanes: 8 pixels of a row per step of the sum, each
    broadcast to the 32 channels' two vectors."""
    rng = np.random.default_rng(0)
    image = Tensor(rng.normal(size=(2, 32, 24, 24)).astype(np.float32), requires_grad=True)
    weight = Tensor(rng.normal(size=(32, 32, 5, 5)).astype(np.float32))
    (image.conv2d(weight) * Tensor(rng.normal(size=(2, 32, 20, 20)).astype(np.float32))) \
        .sum().backward()
    assert image.grad is not None
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", 16)
    items = [i for i in build_schedule([image.grad.uop], "CPU").items
             if i.kind == "kernel" and i.name.startswith("r_")]
    (item,) = items
    program = lower(item.ast, heuristic_plan(item.ast, 16))
    return CRenderer(vector_width=16, fused_multiply_add=True).render(item.name, program)


def test_a_vector_kernel_is_built_without_predictive_commoning(monkeypatch):
    """gcc 12 -O2 kept the pixels one tap of the window loaded for the next tap, which reads
    seven of them again, and broadcast them from registers: a shuffle on the port of the
    second FMA unit of an AVX-512 core (14.7 against 9.5 ms for beautiful_mnist's conv2 input
    gradient). Without it every broadcast is part of a load (fails before: 8 broadcasts from
    registers, none from memory). A scalar kernel keeps gcc's default."""
    source = conv_input_gradient_source(monkeypatch)
    assert '"no-predictive-commoning"' in source
    assembly = gcc_for("x86-64-v4", source, "-S", "-o", "-").stdout
    from_registers = re.findall(r"vbroadcastss\s+%xmm\d+, %zmm", assembly)
    from_memory = re.findall(r"vbroadcastss\s+-?\d*\(%\w+[^)]*\), %zmm", assembly)
    assert not from_registers and len(from_memory) >= 8, (from_registers, from_memory)
    (plain,) = create_schedule([(Tensor(np.zeros(100, np.float32)).realize() + 1).uop],
                               "CPU")[0]
    plain_source = CRenderer(vector_width=16).render(plain.name, lower(plain.ast, NO_OPTIONS))
    assert "no-predictive-commoning" not in plain_source


def test_a_sum_split_into_lanes_tiles_one_axis():
    """A sum along contiguous memory (a BatchNorm's statistics of 128 x 32 images of 20 x 20)
    is split into vector lanes, an array of 16 per accumulator. A 4 x 4 tile of such sums made
    16 arrays: gcc took 300 ms to build it, and it ran no faster than 4 rows (0.22 against
    0.19 ms), which build in 110 ms: the first steps of beautiful_mnist and the GPT wait on
    such builds (fails before: two axes upcast)."""
    x = np.random.default_rng(0).normal(size=(64, 32, 20, 20)).astype(np.float32)
    out = Tensor(x).relu().sum(axis=(2, 3))
    (item,) = create_schedule([out.uop], "CPU")[0]
    options = choose_options(item.ast, 16)
    assert len(options.upcasts) == 1, options.describe()
    source = CRenderer(vector_width=16).render(item.name, lower(item.ast, options))
    assert "_lanes[16]" in source
    np.testing.assert_allclose(out.numpy(), np.maximum(x, 0).sum(axis=(2, 3)), rtol=1e-5,
                               atol=1e-4)
