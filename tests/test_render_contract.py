"""Chapter 8: the renderers' one contract — every `code_for_op` entry has the same signature,
tables extend by merging, IDIV and MOD have one rendering, rendering is reentrant — and
float16 kernels on the CPU (C's `_Float16`, scalars and vectors)."""
from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest

from tinyteach import Tensor
from tinyteach.codegen.lower import LinearProgram, lower
from tinyteach.device import Device
from tinyteach.dtype import dtypes
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.uop import ALU, Ops
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render import (
    CStyleRenderer,
    KernelWriter,
    integer_division,
    integer_remainder,
    is_safe_divisor,
)
from tinyteach.render.c import CRenderer
from tinyteach.render.cuda import CUDARenderer
from tinyteach.render.opencl import OpenCLRenderer
from tinyteach.render.wgsl import WGSLRenderer

RENDERERS = (CRenderer, OpenCLRenderer, CUDARenderer, WGSLRenderer)


def programs(tensor: Tensor) -> list[tuple[str, LinearProgram]]:
    items, _ = create_schedule([tensor.uop], "CPU")
    return [(item.name, lower(item.ast, heuristic_plan(item.ast)))
            for item in items if item.kind == "kernel"]


def two_kernels() -> list[tuple[str, LinearProgram]]:
    """Two kernels of different shapes, loops and launches: a 1-D elementwise one with an
    integer division and a 2-D reduction."""
    rng = np.random.default_rng(0)
    a = Tensor(rng.integers(-9, 9, 30).astype(np.int32)).realize()
    b = Tensor(rng.integers(-3, 3, 30).astype(np.int32)).realize()
    x = Tensor(rng.standard_normal((3, 4, 7)).astype(np.float32)).realize()
    return programs(a // b + a % 3) + programs(x.max(axis=2) + 1)


# ---- the contract ----

@pytest.mark.parametrize("renderer_class", RENDERERS, ids=lambda c: c.__name__)
def test_every_alu_op_has_an_entry_with_the_one_signature(renderer_class):
    table = renderer_class.code_for_op
    assert set(ALU) <= set(table), [op.name for op in ALU if op not in table]
    renderer = renderer_class()
    for op in ALU:
        parameters = list(inspect.signature(table[op]).parameters)
        assert parameters == ["renderer", "operands", "operand_dtypes", "dtype"], op.name
        operands = ["c", "a", "b"][-len(op_arity(op)):]
        text = table[op](renderer, operands, op_arity(op), dtypes.int32)
        assert isinstance(text, str) and all(o in text for o in operands), (op.name, text)


def op_arity(op: Ops) -> list:
    """Operand dtypes for a call of `op`'s entry on int32 values."""
    if op is Ops.WHERE:
        return [dtypes.bool, dtypes.int32, dtypes.int32]
    if op in (Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.CAST):
        return [dtypes.int32]
    return [dtypes.int32, dtypes.int32]


def test_tables_are_class_level_and_languages_extend_them_by_merging():
    base = CStyleRenderer.code_for_op
    for renderer_class in RENDERERS:
        table = renderer_class.code_for_op
        assert renderer_class().code_for_op is table  # no per-instance copies
        # an entry a language does not change is the base's entry itself
        assert table[Ops.WHERE] is base[Ops.WHERE] and table[Ops.IDIV] is base[Ops.IDIV]
    assert CRenderer.code_for_op[Ops.ADD] is base[Ops.ADD]
    assert WGSLRenderer.code_for_op[Ops.MAX] is not base[Ops.MAX]  # WGSL's NaN-exact max


def test_idiv_and_mod_have_one_rendering_shared_by_every_language():
    for renderer_class in RENDERERS:
        assert renderer_class.code_for_op[Ops.IDIV] is integer_division
    int32 = [dtypes.int32, dtypes.int32]
    c, wgsl = CRenderer(), WGSLRenderer()
    assert integer_division(c, ["a", "b"], int32, dtypes.int32) == \
        "(b==0?0:(b==-1?-(a):a/b))"
    assert integer_division(wgsl, ["a", "b"], int32, dtypes.int32) == \
        "select(select(a/b, -(a), b==-1i), 0i, b==0i)"
    assert integer_remainder(c, ["a", "b"], int32, dtypes.int32) == "((b==0||b==-1)?0:a%b)"
    # a constant divisor other than 0 and -1 cannot trap: the plain operator, in every language
    for renderer_class in RENDERERS:
        renderer = renderer_class()
        four = renderer.render_const(4, dtypes.int32)
        assert renderer.code_for_op[Ops.IDIV](renderer, ["a", four], int32, dtypes.int32) == \
            f"(a/{four})"


@pytest.mark.parametrize("text, safe", [("4", True), ("4u", True), ("12ll", True),
                                        ("4i", True), ("-3", True), ("0", False),
                                        ("-1", False), ("0u", False), ("-1i", False),
                                        ("alu0", False), ("(a+1)", False), ("val1", False),
                                        ("(-2147483647-1)", False)])
def test_safe_divisors_are_the_integer_literals_other_than_0_and_minus_1(text, safe):
    assert is_safe_divisor(text) is safe


def test_integer_division_by_constants_and_variables_matches_the_reference():
    rng = np.random.default_rng(1)
    values = rng.integers(-50, 50, 40).astype(np.int32)
    divisors = np.array([0, -1, 3, -7] * 10, dtype=np.int32)
    for device in ("NUMPY", "CPU"):
        a = Tensor(values, device=device)
        by_variable = Tensor(a.uop.alu(Ops.IDIV, Tensor(divisors, device=device).uop), device)
        by_constant = a // 4
        if device == "NUMPY":
            reference = (by_variable.numpy(), by_constant.numpy())
        else:
            np.testing.assert_array_equal(by_variable.numpy(), reference[0])
            np.testing.assert_array_equal(by_constant.numpy(), reference[1])
    np.testing.assert_array_equal(reference[1], values // 4)  # Tensor // floors, as Python


def test_an_op_missing_from_a_table_is_a_clear_error():
    class NoSin(CRenderer):
        code_for_op = {op: code for op, code in CRenderer.code_for_op.items() if op is not Ops.SIN}
    (name, program), = programs(Tensor(np.ones(4, dtype=np.float32)).realize().sin())
    with pytest.raises(NotImplementedError, match="code_for_op has no entry for SIN"):
        NoSin().render(name, program)


# ---- reentrancy: nothing of one kernel is kept on the renderer ----

def interleaving(renderer_class: type[CStyleRenderer], other: tuple[str, LinearProgram]):
    """A renderer that, in the middle of rendering a kernel (at its first loop), renders
    `other` with the same renderer object."""
    class Interleaving(renderer_class):  # type: ignore[valid-type, misc]
        nested_source: str | None = None

        def loop(self, writer: KernelWriter, name: str, size: int) -> str:
            if self.nested_source is None:
                self.nested_source = ""
                self.nested_source = self.render(*other)
            return super().loop(writer, name, size)
    return Interleaving()


@pytest.mark.parametrize("renderer_class", RENDERERS, ids=lambda c: c.__name__)
def test_rendering_two_kernels_interleaved_gives_the_sources_of_one_after_the_other(
        renderer_class):
    first, second = two_kernels()
    alone = [renderer_class().render(*first), renderer_class().render(*second)]
    assert alone[0] != alone[1]
    renderer = interleaving(renderer_class, second)
    outer = renderer.render(*first)
    assert renderer.nested_source == alone[1]
    assert outer == alone[0]


@pytest.mark.parametrize("renderer_class", RENDERERS, ids=lambda c: c.__name__)
def test_one_renderer_renders_from_several_threads(renderer_class):
    kernels = two_kernels()
    expected = [renderer_class().render(*kernel) for kernel in kernels]
    shared = renderer_class()
    results: dict[int, list[tuple[int, str]]] = {}

    def work(number: int) -> None:
        order = [0, 1] if number % 2 == 0 else [1, 0]
        results[number] = [(which, shared.render(*kernels[which])) for which in order * 10]

    threads = [threading.Thread(target=work, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4  # no thread died
    for rendered in results.values():
        for which, source in rendered:
            assert source == expected[which]


# ---- float16 on the CPU: C's _Float16, in scalars and in vectors ----

HALF_TOLERANCE = {"rtol": 2e-3, "atol": 2e-3}


@pytest.fixture(params=[0, 8, 16], ids=lambda w: f"vector_width={w}")
def cpu_vector_width(request, monkeypatch):
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", request.param)
    return request.param


def half_data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float16)


def test_float16_matmul_on_cpu(cpu_vector_width):
    a, b = half_data(64, 64), half_data(64, 64, seed=1)
    result = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
    assert result.dtype == np.float16
    reference = a.astype(np.float32) @ b.astype(np.float32)
    # 64 products summed in half: each rounding is 2^-11 of a partial sum of size ~8
    np.testing.assert_allclose(result.astype(np.float32), reference, rtol=2e-2, atol=2e-2)


def test_float16_rand_matmul_compiles_on_cpu(cpu_vector_width):
    a, b = Tensor.rand(64, 64, device="CPU").half(), Tensor.rand(64, 64, device="CPU").half()
    result = (a @ b).numpy()
    reference = a.numpy().astype(np.float32) @ b.numpy().astype(np.float32)
    np.testing.assert_allclose(result.astype(np.float32), reference, rtol=2e-2, atol=5e-2)


def test_float16_sum_on_cpu(cpu_vector_width):
    x = half_data(32, 48)
    t = Tensor(x, device="CPU")
    np.testing.assert_allclose(t.sum(axis=1).numpy().astype(np.float32),
                               x.astype(np.float32).sum(axis=1), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(t.max(axis=0).numpy().astype(np.float32),
                               x.astype(np.float32).max(axis=0), **HALF_TOLERANCE)


def test_float16_elementwise_on_cpu(cpu_vector_width):
    x, y = half_data(16, 48), half_data(16, 48, seed=1)
    a, b = Tensor(x, device="CPU"), Tensor(y, device="CPU")
    x32, y32 = x.astype(np.float32), y.astype(np.float32)
    cases = {
        "a*b+a": ((a * b + a), x32 * y32 + x32),
        "2*a-1": ((a * 2 - 1), 2 * x32 - 1),
        "1/(a+3)": ((1 / (a + 3)), 1 / (x32 + 3)),
        "exp": (a.exp(), np.exp(x32)),
        "sqrt|a|": (a.abs().sqrt(), np.sqrt(np.abs(x32))),
        "max": (a.maximum(b), np.maximum(x32, y32)),
        "where": ((a < b).where(a, b * 3), np.where(x32 < y32, x32, y32 * 3)),
    }
    for name, (ours, theirs) in cases.items():
        received = ours.numpy()
        assert received.dtype == np.float16, name
        np.testing.assert_allclose(received.astype(np.float32), theirs, **HALF_TOLERANCE,
                                   err_msg=name)


def test_half_vector_ops_spread_a_scalar_into_a_vector():
    """C computes on _Float16 in float: a half scalar times a half vector must be spread into
    a vector first (`(_Float16_vec16){v, v, ...}`), a float scalar is used as it is."""
    renderer = CRenderer(vector_width=16)
    half, single = dtypes.float16.vec(16), dtypes.float32.vec(16)
    assert renderer.scalar_in_vector_op("val0", single) == "val0"
    assert renderer.scalar_in_vector_op("val0", half) == \
        "(_Float16_vec16){" + ", ".join(["val0"] * 16) + "}"
