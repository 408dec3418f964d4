"""Issue 16, the first training step with a cold compile cache: what makes it cheaper.

- views build their index arithmetic without terms that change nothing (view.index_add, ...):
  the values are those of the plain `+ * // %`, and the rewrite rules that removed such terms
  one by one no longer fire while lowering a kernel;
- a kernel lowered twice with the same options (the packer's look, then the compile) is
  lowered once, unless every rewrite is being recorded;
- `Context(CPU_TIERED=...)` is known from `import tinyteach` on, before the CPU device loads;
- the C compiler gets OpenMP's flag only for a source with OpenMP's pragmas, with the same
  results; the fast tier's optimized builds wait until the builds compile_many waits for are
  done."""
from __future__ import annotations

import itertools
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import tinyteach.codegen.lower as lower_module
import tinyteach.runtime.cpu as cpu
from tinyteach import Tensor
from tinyteach.codegen.lower import lower_ast
from tinyteach.codegen.plan import index_value
from tinyteach.device import Device
from tinyteach.dtype import dtypes
from tinyteach.engine.realize import record_launches
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.rewrite import record_rewrites
from tinyteach.ir.uop import Ops, UOp
from tinyteach.ir.view import index_add, index_div, index_into_buffer, index_mod, index_mul
from tinyteach.opt.heuristic import choose_options

# ---- index arithmetic without trivial terms ----


def loop(number: int, size: int) -> UOp:
    return UOp(Ops.RANGE, dtypes.int32, (), ("g", number, size))


I, J = loop(0, 6), loop(1, 4)
OPERANDS = [UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 3), I, J, I * 4 + J, I + 2]


def value_at(node: UOp, i: int, j: int) -> int:
    found = index_value(node, {I: i, J: j})
    assert found is not None
    return found


@pytest.mark.parametrize("a, b", list(itertools.product(OPERANDS, OPERANDS)))
def test_index_add_is_plain_addition(a: UOp, b: UOp) -> None:
    built = index_add(a, b)
    for i, j in itertools.product(range(6), range(4)):
        assert value_at(built, i, j) == value_at(a, i, j) + value_at(b, i, j)


@pytest.mark.parametrize("a, factor", list(itertools.product(OPERANDS, [0, 1, 2, 7])))
def test_index_mul_is_plain_multiplication(a: UOp, factor: int) -> None:
    built = index_mul(a, factor)
    for i, j in itertools.product(range(6), range(4)):
        assert value_at(built, i, j) == value_at(a, i, j) * factor


@pytest.mark.parametrize("a, n", list(itertools.product(OPERANDS, [1, 2, 4, 24, 100])))
def test_index_div_and_mod_are_plain_division(a: UOp, n: int) -> None:
    quotient, remainder = index_div(a, n), index_mod(a, n)
    for i, j in itertools.product(range(6), range(4)):
        assert value_at(quotient, i, j) == value_at(a, i, j) // n
        assert value_at(remainder, i, j) == value_at(a, i, j) % n


def test_trivial_terms_are_left_out() -> None:
    zero, one = UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 1)
    assert index_add(I, zero) is I and index_add(zero, I) is I
    assert index_mul(I, 1) is I and index_mul(I, 0).arg == 0
    assert index_div(I, 1) is I and index_div(I, 6).arg == 0  # 0 <= i < 6
    assert index_mod(I, 6) is I and index_mod(I, 1).arg == 0
    assert index_mod(I, 5).op is Ops.MOD  # i reaches 5
    assert index_add(UOp.const(dtypes.int32, 2), UOp.const(dtypes.int32, 3)).arg == 5
    assert index_mod(I * 4 + J, 24).op is Ops.MOD  # a sum: left to the rules, which rebuild it
    assert index_mul(one, 5).arg == 5


def trivial(node: UOp) -> bool:
    """Does `node` compute nothing: x+0, x*1, x//1, or x%n where 0 <= x < n always (x one
    term)?"""
    constant = [s for s in node.src if s.op is Ops.CONST]
    if node.op is Ops.ADD:
        return any(c.arg == 0 for c in constant)
    if node.op in (Ops.MUL, Ops.IDIV):
        return node.src[1].op is Ops.CONST and node.src[1].arg == 1
    if node.op is Ops.MOD and node.src[1].op is Ops.CONST and node.src[0].op is not Ops.ADD:
        return 0 <= node.src[0].vmin and node.src[0].vmax < node.src[1].arg  # (a sum: the
    #                                                    rules rebuild it, see view.index_mod)
    return False


@pytest.mark.parametrize("view", [
    lambda t: t.reshape(6, 4).permute(1, 0).reshape(2, 12),
    lambda t: t.reshape(2, 3, 4).permute(2, 0, 1).reshape(4, 6)[1:3, 2:5],
    lambda t: t.reshape(24, 1).expand(24, 3).reshape(8, 9),
    lambda t: t.pad(((2, 1),)).reshape(3, 9),
    lambda t: t.flip(0).reshape(4, 6),
])
def test_views_index_without_trivial_terms(view) -> None:  # type: ignore[no-untyped-def]
    data = np.arange(24, dtype=np.float32)
    base = Tensor(data, device="NUMPY").realize()
    viewed = view(base)
    shape = viewed.shape
    index = tuple(loop(k, size) for k, size in enumerate(shape))
    _, position, valid = index_into_buffer(viewed.uop, index)
    built = [n for n in position.toposort + (valid.toposort if valid is not None else [])]
    assert not [n for n in built if trivial(n)]
    # and it reads what the view shows, element by element
    expected = view(Tensor(data, device="NUMPY")).numpy()
    for element in itertools.product(*(range(size) for size in shape)):
        loops = dict(zip(index, element))
        inside = True if valid is None else bool(index_value(valid, loops))
        read = data[index_value(position, loops)] if inside else 0.0
        assert read == expected[element]


def kernel_asts(tensor: Tensor) -> list[UOp]:
    items, _ = create_schedule([tensor.uop], "CPU")
    return [item.ast for item in items if item.kind == "kernel"]


def test_lowering_a_matmul_fires_no_trivial_rules() -> None:
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((16, 24)).astype(np.float32), device="CPU").realize()
    b = Tensor(rng.standard_normal((24, 8)).astype(np.float32), device="CPU").realize()
    for ast in kernel_asts((a @ b).relu()):
        with record_rewrites() as log:  # (lower_ast: the lane code's own rewrites aside)
            lower_ast(ast, choose_options(ast, 8))
            lower_ast(ast, choose_options(ast))
        fired = {step.rule for step in log.steps}
        assert not fired & {"x+0 -> x", "x*1 -> x", "x//1 -> x"}, fired


# ---- lowering a kernel once ----


def test_a_kernel_is_lowered_once_per_options() -> None:
    x = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8), device="CPU").realize()
    ast = kernel_asts(x.permute(1, 0).sum(axis=1) * 2)[0]
    options = choose_options(ast)
    first = lower_ast(ast, options)
    assert lower_ast(ast, options) is first
    assert (ast, options) in lower_module._lowered


def test_recorded_rewrites_see_every_step_of_a_lowered_kernel() -> None:
    x = Tensor(np.arange(64, dtype=np.float32).reshape(4, 16), device="CPU").realize()
    ast = kernel_asts(x.reshape(16, 4).sum(axis=1) + 1)[0]
    remembered = lower_ast(ast)
    with record_rewrites() as log:
        recorded = lower_ast(ast)
    assert log.steps  # lowered again, rule by rule
    assert recorded is remembered  # to the same (interned) graph


# ---- the CPU device's settings and compiler flags ----


def test_cpu_tiered_is_known_before_the_cpu_device_loads() -> None:
    code = ("import sys\nimport tinyteach\nfrom tinyteach import Context\n"
            "with Context(CPU_TIERED=0):\n    pass\n"
            "assert 'tinyteach.runtime.cpu' not in sys.modules\n"
            "import tinyteach.runtime.cpu as cpu\nimport tinyteach.runtime as runtime\n"
            "assert cpu.CPU_TIERED is runtime.CPU_TIERED\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def compiler() -> cpu.ClangStyleCompiler:
    found = Device["CPU"].compiler
    assert isinstance(found, cpu.ClangStyleCompiler)
    return found


def test_openmp_flags_only_for_sources_with_its_pragmas() -> None:
    c = compiler()
    assert c.openmp_flags("void f(float* restrict d) { d[0] = 1.0f; }") == []
    assert c.openmp_flags("#pragma omp parallel for\nfor (;;) {}") == c.threads
    assert c.openmp_flags("#pragma omp simd reduction(+:acc0)") == c.simd


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TINYTEACH_CACHE", str(tmp_path))
    return tmp_path / "cpu"


def test_kernels_with_and_without_threads_compute_the_same(cache: Path) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((512, 256)).astype(np.float32)
    x, y = (Tensor(v, device="CPU").realize() for v in (a, b))
    with record_launches() as launches:
        product = (x @ y).numpy()
        small = (x[:2, :3] * 2 + 1).numpy()
    sources = [launch.runner.source for launch in launches if launch.runner is not None]
    assert any("#pragma omp parallel" in s for s in sources)  # threads over the outer loop
    assert any("#pragma omp" not in s for s in sources)
    np.testing.assert_allclose(product, a @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(small, a[:2, :3] * np.float32(2) + np.float32(1))


def test_background_builds_wait_for_the_builds_compile_many_waits_for(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    lock = threading.Lock()
    c = compiler()
    compile_now = cpu.ClangStyleCompiler.compile
    queue = cpu.ClangStyleCompiler._queue_optimized

    def compile_and_note(self: cpu.ClangStyleCompiler, source: str) -> Path:
        path = compile_now(self, source)
        with lock:
            events.append("waited-for build done")
        return path

    def queue_and_note(self: cpu.ClangStyleCompiler, queued: list) -> None:
        with lock:
            events.append(f"queued {len(queued)}")
        queue(self, queued)
    monkeypatch.setattr(cpu.ClangStyleCompiler, "compile", compile_and_note)
    monkeypatch.setattr(cpu.ClangStyleCompiler, "_queue_optimized", queue_and_note)
    token = abs(hash(str(cache))) % 10_000
    elementwise = f"void e_{token}(float* restrict d) {{ d[0] = 2.0f; }}\n"
    reduction = (f"void r_{token}(float* restrict d, const float* restrict s) {{\n"
                 "  float acc0 = 0.0f;\n  #pragma omp simd reduction(+:acc0)\n"
                 "  for (int i = 0; i < 64; i++) { acc0 += s[i]; }\n  d[0] = acc0;\n}\n")
    binaries = c.compile_many([elementwise, reduction])
    cpu.wait_for_optimized_builds(timeout=120)
    assert isinstance(binaries[0], cpu.TieredBinary) and isinstance(binaries[1], Path)
    assert events[0] == "waited-for build done" and "queued 1" in events
    assert events.index("queued 1") > events.index("waited-for build done")
