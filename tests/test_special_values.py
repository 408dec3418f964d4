"""Special values on every device: NaN, ±inf, -0.0, subnormals and the int32 limits.

Every device must give the reference's numbers (PyTorch, or numpy where the project defines the
result as numpy does: integer division by zero, the sign of a tie between -0.0 and 0.0). Float
results are compared NaN-aware: NaN must sit exactly where the reference has NaN, infinities
must match in sign, and (where the test says so) zeros must match in sign, which is what
`1/x` sees. WGSL promises none of this; render/wgsl.py makes it so, and the last tests check the
source it writes for that.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from helpers import skip_unless_supported

from tinyteach import Tensor, dtypes
from tinyteach.codegen.lower import lower
from tinyteach.engine.schedule import create_schedule
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render.cuda import CUDARenderer
from tinyteach.render.wgsl import WGSLRenderer

NAN, INF = float("nan"), float("inf")
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)
# one of each kind: NaN, infinities, signed zeros, subnormals, huge, ordinary
SPECIAL = np.array([NAN, INF, -INF, -0.0, 0.0, 1e-40, -1e-40, SMALLEST_NORMAL, 3e38, -3e38,
                    1.5, -2.0], dtype=np.float32)
INT32 = np.iinfo(np.int32)
INT_SPECIAL = np.array([INT32.min, INT32.max, INT32.min + 1, -7, -1, 0, 1, 7, INT32.max - 1],
                       dtype=np.int32)
# rows for reductions: NaN, each infinity, both, ties of infinities, overflow, subnormals
ROWS = np.array([[1.0, NAN, 3.0, 0.5], [INF, 1.0, 2.0, INF], [-INF, -INF, 0.0, -1.0],
                 [INF, -INF, 1.0, 2.0], [3e38, 3e38, -1.0, 0.0], [1e-40, 2e-40, 0.0, -1e-40],
                 [NAN, NAN, INF, -INF], [-2.0, 5.0, -0.0, 4.0]], dtype=np.float32)


def pairs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every value against every value: a column and a row that broadcast to all pairs."""
    return values[:, None], values[None, :]


def assert_same(ours: Tensor, expected: np.ndarray | torch.Tensor, zero_sign: bool = False,
                rtol: float = 1e-6, atol: float = 0.0) -> None:
    """Equal shapes; NaN exactly where expected has NaN; other values within `rtol` and `atol`
    (infinities
    equal, integers and bools exact); with `zero_sign`, zeros with the expected sign."""
    result = ours.numpy()
    reference = expected.numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    assert result.shape == reference.shape, f"shape {result.shape} != {reference.shape}"
    if reference.dtype.kind in "biu":
        np.testing.assert_array_equal(result, reference)
        return
    np.testing.assert_array_equal(np.isnan(result), np.isnan(reference), err_msg="NaN places")
    np.testing.assert_allclose(result, reference, rtol=rtol, atol=atol, equal_nan=True)
    if zero_sign:
        zeros = reference == 0
        np.testing.assert_array_equal(np.signbit(result[zeros]), np.signbit(reference[zeros]),
                                      err_msg="signs of zeros")


def torch_pairs(function: Callable[..., torch.Tensor]) -> torch.Tensor:
    a, b = pairs(SPECIAL)
    return function(torch.tensor(a), torch.tensor(b))


def our_pairs(function: Callable[..., Tensor], device: str) -> Tensor:
    a, b = pairs(SPECIAL)
    return function(Tensor(a, device=device), Tensor(b, device=device))


# ---- NaN through max, min, where and comparisons ----

COMPARISONS: dict[str, Callable] = {
    "<": lambda a, b: a < b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


@pytest.mark.parametrize("name", COMPARISONS)
def test_comparisons_with_nan_and_infinities(device, name):
    """NaN < x, NaN == NaN and the rest are False; NaN != x is True, NaN != NaN too."""
    compare = COMPARISONS[name]
    assert_same(our_pairs(compare, device), torch_pairs(compare))


def test_nan_is_not_equal_to_itself(device):
    x = Tensor(SPECIAL, device=device)
    assert_same(x != x, np.isnan(SPECIAL))
    assert_same((x == x).logical_not(), np.isnan(SPECIAL))


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum(device, name):
    """NaN wins, as in torch and numpy. A tie of -0.0 and 0.0 gives the second operand, as
    numpy's maximum does (PyTorch gives the first): the project's reference is numpy."""
    a, b = pairs(SPECIAL)
    expected = np.maximum(a, b) if name == "maximum" else np.minimum(a, b)
    ours = our_pairs(lambda x, y: getattr(x, name)(y), device)
    assert_same(ours, expected, zero_sign=True)
    assert_same(ours, torch_pairs(getattr(torch, name)))  # the same NaNs and values as torch


def test_clip_keeps_nan(device):
    x = Tensor(SPECIAL, device=device)
    assert_same(x.clip(-1.0, 2.0), torch.tensor(SPECIAL).clip(-1.0, 2.0))


def test_where_with_nan(device):
    x, y = Tensor(SPECIAL, device=device), Tensor(SPECIAL[::-1].copy(), device=device)
    tx, ty = torch.tensor(SPECIAL), torch.tensor(SPECIAL[::-1].copy())
    assert_same((x < y).where(x, y), torch.where(tx < ty, tx, ty), zero_sign=True)
    assert_same((x != x).where(0.0, x), torch.where(tx != tx, 0.0, tx), zero_sign=True)


# ---- reductions ----

REDUCTIONS: dict[str, tuple[Callable, Callable]] = {
    "sum": (lambda x: x.sum(axis=1), lambda t: t.sum(1)),
    "max": (lambda x: x.max(axis=1), lambda t: t.max(1).values),
    "min": (lambda x: x.min(axis=1), lambda t: t.min(1).values),
    "mean": (lambda x: x.mean(axis=1), lambda t: t.mean(1)),
    "max_all": (lambda x: x.max(), lambda t: t.max()),
    "min_all": (lambda x: x.min(), lambda t: t.min()),
    "softmax": (lambda x: x.softmax(1), lambda t: t.softmax(1)),
    "log_softmax": (lambda x: x.log_softmax(1), lambda t: t.log_softmax(1)),
    "cumsum": (lambda x: x.cumsum(1), lambda t: t.cumsum(1)),
    "max_columns": (lambda x: x.max(axis=0), lambda t: t.max(0).values),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_with_special_values(device, name):
    ours, theirs = REDUCTIONS[name]
    assert_same(ours(Tensor(ROWS, device=device)), theirs(torch.tensor(ROWS)), rtol=1e-5)


def test_max_of_a_row_with_nan_is_nan(device):
    assert np.isnan(Tensor([1.0, NAN, 3.0], device=device).max().numpy())
    assert np.isnan(Tensor([1.0, NAN, 3.0], device=device).min().numpy())


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin_with_infinities(device, name):
    rows = ROWS[[1, 2, 3, 4, 7]]  # no NaN: the first extreme, infinities included
    ours = getattr(Tensor(rows, device=device), name)(1)
    assert_same(ours, getattr(torch.tensor(rows), name)(1).int())


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin_with_nan(device, name):
    ours = getattr(Tensor(ROWS, device=device), name)(1)
    assert_same(ours, getattr(torch.tensor(ROWS), name)(1).int())


# ---- signed zeros: what 1/x sees ----

ZEROS = np.array([-0.0, 0.0], dtype=np.float32)
ZERO_OPS: dict[str, Callable] = {
    "1/x": lambda a, b: 1 / a,
    "1/(x*1)": lambda a, b: 1 / (a * 1),
    "1/-x": lambda a, b: 1 / -a,
    "1/(x*y)": lambda a, b: 1 / (a * b),
    "1/(x-y)": lambda a, b: 1 / (a - b),
    "1/(x+y)": lambda a, b: 1 / (a + b),
    "1/(x-0)": lambda a, b: 1 / (a - 0.0),
    "1/(x*-1)": lambda a, b: 1 / (a * -1.0),
}


@pytest.mark.parametrize("name", ZERO_OPS)
def test_signed_zeros(device, name):
    a, b = pairs(ZEROS)
    with np.errstate(divide="ignore"):
        expected = ZERO_OPS[name](a, b).astype(np.float32)
    ours = ZERO_OPS[name](Tensor(a, device=device), Tensor(b, device=device))
    assert_same(ours, expected, zero_sign=True)


def test_signed_zero_max_ties(device):
    """max(-0.0, 0.0) and the max reduction keep numpy's sign, seen through 1/x."""
    a, b = pairs(ZEROS)
    ours = 1 / Tensor(a, device=device).maximum(Tensor(b, device=device))
    with np.errstate(divide="ignore"):
        assert_same(ours, 1 / np.maximum(a, b), zero_sign=True)


def test_abs_of_negative_zero(device):
    assert_same(1 / Tensor(ZEROS, device=device).abs(), 1 / torch.tensor(ZEROS).abs())


def test_adding_zero_to_negative_zero(device):
    """-0.0 + 0.0 is +0.0 in IEEE arithmetic, so 1/(x + 0.0) is +inf for x = -0.0 (the kernel
    simplifier must not drop the + 0.0, nor may lavapipe: WGSL writes it as a bit test)."""
    ours = 1 / (Tensor(ZEROS, device=device) + 0.0)
    assert_same(ours, 1 / (torch.tensor(ZEROS) + 0.0), zero_sign=True)


def test_constant_maximum_with_nan(device):
    """Folded at compile time, max(1.0, nan) must still be nan."""
    ours = Tensor.full((3,), 1.0, device=device).maximum(NAN)
    assert_same(ours, torch.full((3,), 1.0).maximum(torch.tensor(NAN)))


# ---- infinities and subnormals through arithmetic and math functions ----

UNARY: dict[str, tuple[Callable, Callable]] = {
    "neg": (lambda x: -x, lambda t: -t),
    "double": (lambda x: x * 2, lambda t: t * 2),
    "halve": (lambda x: x * 0.5, lambda t: t * 0.5),
    "reciprocal": (lambda x: x.reciprocal(), lambda t: t.reciprocal()),
    "sqrt": (lambda x: x.sqrt(), lambda t: t.sqrt()),
    "log": (lambda x: x.log(), lambda t: t.log()),
    "log2": (lambda x: x.log2(), lambda t: t.log2()),
    "exp": (lambda x: x.exp(), lambda t: t.exp()),
    "sigmoid": (lambda x: x.sigmoid(), lambda t: t.sigmoid()),
    "tanh": (lambda x: x.tanh(), lambda t: t.tanh()),
    "square": (lambda x: x * x, lambda t: t * t),
}


@pytest.mark.parametrize("name", UNARY)
def test_unary_with_special_values(device, name):
    ours, theirs = UNARY[name]
    zero_sign = name in ("neg", "double", "halve", "square", "sqrt")
    atol = 1e-7 if name == "tanh" else 0.0  # 2*sigmoid(2x)-1 is 0 for tiny x, not x
    assert_same(ours(Tensor(SPECIAL, device=device)), theirs(torch.tensor(SPECIAL)),
                zero_sign=zero_sign, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_binary_arithmetic_with_special_values(device, name):
    function = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
                "mul": lambda a, b: a * b, "div": lambda a, b: a / b}[name]
    a, b = pairs(SPECIAL)
    ours = function(Tensor(a, device=device), Tensor(b, device=device))
    assert_same(ours, function(torch.tensor(a), torch.tensor(b)), zero_sign=True, rtol=1e-6)


def test_division_by_a_subnormal(device):
    """Tensor.div is FDIV, a true division (it was x * (1/y), and 1/1e-40 overflows to inf:
    0/1e-40 was 0*inf = NaN and 1e-39/1e-40 inf; PyTorch gives 0 and 10)."""
    x, y = np.float32([0.0, 1e-39]), np.float32([1e-40, 1e-40])
    assert_same(Tensor(x, device=device) / Tensor(y, device=device),
                torch.tensor(x) / torch.tensor(y), rtol=0.0, zero_sign=True)


IDENTITIES: dict[str, tuple[Callable, Callable]] = {
    # an optimizer that assumes no NaN or inf (lavapipe's) folds these to 0
    "x-x": (lambda x: x - x, lambda t: t - t),
    "-x+x": (lambda x: -x + x, lambda t: -t + t),
    "x*0": (lambda x: x * 0.0, lambda t: t * 0.0),
    "x*-0": (lambda x: x * -0.0, lambda t: t * -0.0),
    "x*x-x*x": (lambda x: x * x - x * x, lambda t: t * t - t * t),
}


@pytest.mark.parametrize("name", IDENTITIES)
def test_identities_that_do_not_hold_for_nan_and_inf(device, name):
    ours, theirs = IDENTITIES[name]
    assert_same(ours(Tensor(SPECIAL, device=device)), theirs(torch.tensor(SPECIAL)),
                zero_sign=True)


def test_constant_factors_are_applied_in_order(device, request):
    """(x * 2e38) * 10 overflows for x = 1 and is 2e38 * 1e-39 * 10 = 2 for x = 1e-39."""
    if device == "WEBGPU":
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "lavapipe reassociates (x*c1)*c2 into x*(c1*c2) = x*inf: a driver's fast-math "
            "that WGSL allows and the renderer does not undo")))
    values = np.float32([1.0, 1e-39, -1e-39, 0.0])
    ours = Tensor(values, device=device) * 2e38 * 10
    assert_same(ours, torch.tensor(values) * 2e38 * 10, rtol=1e-5)


def test_subnormals_are_kept(device):
    """A device that flushes subnormals to zero gets these wrong."""
    tiny = np.array([1e-40, -1e-40, 1.4e-45, 1e-20], dtype=np.float32)
    x = Tensor(tiny, device=device)
    assert_same(x > 0, tiny > 0)
    assert_same(x * x, torch.tensor(tiny) * torch.tensor(tiny), zero_sign=True)
    assert_same(x * 1e30, torch.tensor(tiny) * 1e30, rtol=1e-6)
    assert_same(x.maximum(0.0), np.maximum(tiny, np.float32(0)), zero_sign=True)
    exponents = np.array([-130.0, -140.5, -149.0, -151.0], dtype=np.float32)
    assert_same(Tensor(exponents, device=device).exp2(), torch.tensor(exponents).exp2(),
                rtol=1e-5)


HALF = np.array([NAN, INF, -INF, -0.0, 0.0, 1e-7, 2.5, -2.5], dtype=np.float16)


def test_half_floats_with_special_values(device):
    skip_unless_supported(device, np.float16)
    x, y = Tensor(HALF, device=device), Tensor(HALF[::-1].copy(), device=device)
    other = HALF[::-1].copy()
    with np.errstate(all="ignore"):
        # numpy's float16 maximum keeps the first of a tie (-0.0, 0.0), its float32 one the
        # second, as every device does: the reference is float32's
        widened = np.maximum(HALF.astype(np.float32), other.astype(np.float32))
        assert_same(x.maximum(y), widened.astype(np.float16), zero_sign=True)
        assert_same(x < y, HALF < other)
        assert_same(x != x, np.isnan(HALF))
        assert_same(x.max(), np.float16(NAN))
        assert_same(x - x, HALF - HALF, zero_sign=True)
        assert_same(x * 0.0, HALF * np.float16(0), zero_sign=True)
        assert_same(x.log2(), np.log2(HALF), rtol=1e-3)


# ---- integer limits ----

INT_BINARY: dict[str, Callable] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
    "maximum": lambda a, b: a.maximum(b) if isinstance(a, Tensor) else np.maximum(a, b),
    "minimum": lambda a, b: a.minimum(b) if isinstance(a, Tensor) else np.minimum(a, b),
    "<": lambda a, b: a < b, "!=": lambda a, b: a != b, "xor": lambda a, b: a ^ b,
}


@pytest.mark.parametrize("name", INT_BINARY)
def test_int32_limits(device, name):
    """Overflow wraps as numpy's int32 does; x // 0 and x % 0 are 0 (numpy's answer, which the
    project takes as its definition); INT_MIN // -1 wraps to INT_MIN, INT_MIN % -1 is 0."""
    a, b = pairs(INT_SPECIAL)
    with np.errstate(all="ignore"):
        expected = INT_BINARY[name](a, b)
    ours = INT_BINARY[name](Tensor(a, device=device), Tensor(b, device=device))
    assert_same(ours, expected)


@pytest.mark.parametrize("divisor", [-1, 0, 3, -4])
def test_int32_division_by_constants(device, divisor):
    with np.errstate(all="ignore"):
        quotient, remainder = INT_SPECIAL // np.int32(divisor), INT_SPECIAL % np.int32(divisor)
    x = Tensor(INT_SPECIAL, device=device)
    assert_same(x // divisor, quotient)
    assert_same(x % divisor, remainder)


def test_int32_unary_and_reductions_at_the_limits(device):
    x = Tensor(INT_SPECIAL, device=device)
    with np.errstate(all="ignore"):
        assert_same(-x, -INT_SPECIAL)
        assert_same(x.abs(), np.abs(INT_SPECIAL))
    assert_same(x.sum(), INT_SPECIAL.sum(dtype=np.int32))
    assert_same(x.max(), INT_SPECIAL.max())
    assert_same(x.min(), INT_SPECIAL.min())
    assert_same(x.cumsum(0), np.cumsum(INT_SPECIAL, dtype=np.int32))
    assert_same(x.argmax(), np.int32(INT_SPECIAL.argmax()))
    assert_same(x.argmin(), np.int32(INT_SPECIAL.argmin()))


# ---- gradients, where PyTorch defines them ----

def _gradient(function: Callable, values: np.ndarray, device: str) -> tuple[Tensor, torch.Tensor]:
    ours = Tensor(values, device=device, requires_grad=True)
    theirs = torch.tensor(values, requires_grad=True)
    shape = tuple(function(torch.tensor(values)).shape)
    weights = np.linspace(0.5, 1.5, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    (function(ours) * Tensor(weights, device=device)).sum().backward()
    (function(theirs) * torch.tensor(weights)).sum().backward()
    assert ours.grad is not None and theirs.grad is not None
    return ours.grad, theirs.grad


GRADIENTS: dict[str, tuple[Callable, np.ndarray]] = {
    # ties of infinities share the gradient evenly
    "max_infinities": (lambda x: x.max(), np.float32([1.0, INF, INF, -INF])),
    "min_infinities": (lambda x: x.min(), np.float32([-INF, 1.0, -INF, INF])),
    # -inf is how attention masks: its probability and its gradient are exactly 0
    "softmax_masked": (lambda x: x.softmax(-1), np.float32([[-INF, 0.0, 1.0], [2.0, -INF, 0.0]])),
    "log_softmax_masked": (lambda x: x.log_softmax(-1)[:, 1:], np.float32([[-INF, 0.0, 1.0]])),
    "sum_infinities": (lambda x: x.sum(), np.float32([INF, -INF, NAN, -0.0])),
    "times_two": (lambda x: x * 2, np.float32([INF, -INF, NAN, 3e38])),
}


@pytest.mark.parametrize("name", GRADIENTS)
def test_gradients_with_special_values(device, name):
    function, values = GRADIENTS[name]
    ours, theirs = _gradient(function, values, device)
    assert_same(ours, theirs, rtol=1e-5)


def test_maximum_gradient_with_infinite_ties(device):
    a_values, b_values = np.float32([1.0, INF, 2.0, -INF]), np.float32([1.0, INF, INF, -INF])
    a, b = (Tensor(v, device=device, requires_grad=True) for v in (a_values, b_values))
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (a_values, b_values))
    a.maximum(b).sum().backward()
    torch.maximum(ta, tb).sum().backward()
    assert a.grad is not None and b.grad is not None
    assert_same(a.grad, ta.grad)
    assert_same(b.grad, tb.grad)


def test_max_gradient_with_nan(device):
    ours, theirs = _gradient(lambda x: x.max(), np.float32([1.0, NAN, 3.0, NAN]), device)
    assert_same(ours, theirs)


def test_relu_keeps_nan(device):
    assert_same(Tensor(SPECIAL, device=device).relu(), torch.tensor(SPECIAL).relu(),
                zero_sign=True)


def test_relu_gradient_at_zero_nan_and_inf(device):
    values = np.float32([-0.0, 0.0, NAN, -INF, INF, -1.0, 2.0])
    ours, theirs = _gradient(lambda x: x.relu(), values, device)
    assert_same(ours, theirs)


# ---- the source the GPU renderers write (no device needed) ----

def _kernel_sources(tensor: Tensor, renderer: WGSLRenderer | CUDARenderer) -> str:
    items, _ = create_schedule([tensor.uop], "CPU")
    return "\n".join(renderer.render(item.name, lower(item.ast, heuristic_plan(item.ast)))
                     for item in items if item.kind == "kernel")


BIT_TEST = "(bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u"
WGSL_KERNELS: dict[str, tuple[Callable, str]] = {
    "maximum": (lambda a, b: a.maximum(b), "max_f32("),
    "minimum": (lambda a, b: a.minimum(b), "max_f32("),
    "max_reduce": (lambda a, b: a.max(axis=1), "max_f32("),
    "less": (lambda a, b: a < b, "less_f32("),
    "not_equal": (lambda a, b: a != b, "not_equal_f32("),
}


@pytest.mark.parametrize("name", WGSL_KERNELS)
def test_wgsl_finds_nan_with_a_bit_test(name):
    """Not with `x != x`, nor with the max/min builtins, which lavapipe lets drop NaN."""
    function, helper = WGSL_KERNELS[name]
    a, b = Tensor(np.ones((4, 4), np.float32)).realize(), Tensor(np.ones((4, 4), np.float32))
    source = _kernel_sources(function(a, b.realize()), WGSLRenderer())
    assert BIT_TEST in source
    assert helper in source
    kernel_body = source[source.index("@compute"):]
    assert helper in kernel_body
    assert "max(" not in kernel_body.replace("max_f32(", "")  # no builtin max on floats
    assert "!=" not in kernel_body and "<val" not in kernel_body


def test_wgsl_writes_x_minus_x_and_x_times_zero_with_bit_tests():
    x = Tensor(np.ones(4, np.float32)).realize()
    assert "minus_itself_f32(val0)" in _kernel_sources(x - x, WGSLRenderer())
    source = _kernel_sources(x * 0.0, WGSLRenderer())
    assert "times_zero_f32(val0, 0.0f)" in source and "0x7f800000u" in source
    assert "(val0*0.0f)" not in source
    assert "plus_zero_f32(val0)" in _kernel_sources(x + 0.0, WGSLRenderer())


def test_wgsl_kernel_without_floats_compares_has_no_helpers():
    x = Tensor(np.arange(6, dtype=np.int32)).realize()
    source = _kernel_sources(x.maximum(3) < 4, WGSLRenderer())
    assert "bitcast" not in source and "fn max_f32" not in source


def test_wgsl_half_float_helpers():
    x = Tensor(np.ones(4, np.float16)).realize()
    source = _kernel_sources(x.maximum(x.log2()), WGSLRenderer())
    assert "fn max_f16(" in source and "fn is_nan_f16(" in source and "fn log2_f16(" in source
    assert "is_nan_f32(f32(x))" in source and BIT_TEST in source  # widened: exact


def test_cuda_source_keeps_nan_in_max_and_compiles():
    """CUDA C (no fast-math) keeps IEEE comparisons: max tests `a!=a`. Compiled where NVRTC or
    nvcc is installed; no GPU is needed."""
    a = Tensor(np.ones((4, 4), np.float32)).realize()
    tensor = a.maximum(a.T.contiguous()).max(axis=1) + (a != a).cast(dtypes.float32)
    source = _kernel_sources(tensor, CUDARenderer())
    assert "!=" in source and "?" in source
    try:
        from tinyteach.runtime.cuda import CUDACompiler, compile_for_cuda
        compiler = CUDACompiler()
    except Exception as error:  # no CUDA compiler on this machine
        pytest.skip(f"no CUDA compiler: {error}")
    items, _ = create_schedule([tensor.uop], "CPU")
    for item in items:
        if item.kind == "kernel":
            assert f".entry {item.name}(" in compile_for_cuda(item.name, item.ast, compiler).ptx
