"""True float division: the primitive FDIV, against PyTorch, on every device.

`Tensor.div` (`/`) is FDIV, the correctly rounded IEEE 754 quotient, as PyTorch's `/` is: the
same bits for random quotients, x/0, 0/0, inf/inf, -0.0 and subnormals (tinygrad's
x * (1/y) was an ulp off for about a quarter of random quotients, and 0 / 1e-40 was NaN).
The rounding modes "trunc" and "floor", integer division, the gradients, constant folding and
what each renderer writes are checked here too.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import skip_unless_supported

from tinyteach import Tensor, dtypes
from tinyteach.codegen.lower import lower
from tinyteach.device import Device
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.rewrite import PYTHON_ALU
from tinyteach.ir.uop import Ops, float_divide
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render.cuda import CUDARenderer
from tinyteach.render.wgsl import WGSLRenderer

NAN, INF = float("nan"), float("inf")
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)
SPECIAL = np.array([NAN, INF, -INF, -0.0, 0.0, 1e-40, -1e-40, 1e-45, SMALLEST_NORMAL, 3e38,
                    -3e38, 2.0 ** 127, 2.0 ** -126, 1.5, -2.0, 3.0], dtype=np.float32)
INT32 = np.iinfo(np.int32)
INT_SPECIAL = np.array([INT32.min, INT32.max, INT32.min + 1, -7, -1, 0, 1, 7, 2, -2],
                       dtype=np.int32)


def random_floats(count: int, seed: int, exponents: tuple[int, int] = (-30, 30)) -> np.ndarray:
    """Random signs, mantissas and exponents: every part of the float32 format is exercised."""
    rng = np.random.default_rng(seed)
    mantissas = rng.uniform(1.0, 2.0, count) * rng.choice([-1.0, 1.0], count)
    return np.ldexp(mantissas, rng.integers(*exponents, count)).astype(np.float32)


def assert_bits_equal(ours: Tensor | np.ndarray, reference: torch.Tensor | np.ndarray) -> None:
    """The same float bits (NaN matches any NaN); zeros must have the same sign."""
    result = ours.numpy() if isinstance(ours, Tensor) else np.asarray(ours)
    expected = reference.numpy() if isinstance(reference, torch.Tensor) else reference
    assert result.shape == expected.shape and result.dtype == expected.dtype
    both_nan = np.isnan(result) & np.isnan(expected)
    integer = np.dtype(f"int{8 * result.dtype.itemsize}")
    same = (result.view(integer) == expected.view(integer)) | both_nan
    wrong = np.flatnonzero(~same)
    examples = (result.reshape(-1)[wrong[:5]], expected.reshape(-1)[wrong[:5]])
    assert wrong.size == 0, f"{wrong.size} of {same.size} differ, e.g. ours {examples[0]} " \
                            f"torch {examples[1]}"


def pairs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return values[:, None], values[None, :]


# ---- forward: the same bits as PyTorch ----

@pytest.mark.parametrize("exponents", [(-30, 30), (-126, 128)], ids=["moderate", "full_range"])
def test_random_quotients_bit_for_bit(device, exponents):
    """10^5 random quotients (the full range includes overflow to inf and subnormal results).
    Measured: 0 ulp on every device (lavapipe too; WGSL allows 2.5 ulp)."""
    x, y = random_floats(100_000, 1, exponents), random_floats(100_000, 2, exponents)
    ours = Tensor(x, device=device) / Tensor(y, device=device)
    assert_bits_equal(ours, torch.tensor(x) / torch.tensor(y))


def test_every_pair_of_special_values(device):
    """x/0, 0/0, inf/inf, -0.0, subnormal dividends and divisors, overflow and underflow."""
    a, b = pairs(SPECIAL)
    ours = Tensor(a, device=device) / Tensor(b, device=device)
    assert_bits_equal(ours, torch.tensor(a) / torch.tensor(b))


def test_division_by_a_subnormal(device):
    x, y = np.float32([0.0, 1e-39, -1e-39, 1.0]), np.float32([1e-40, 1e-40, 1e-40, 1e-40])
    ours = Tensor(x, device=device) / Tensor(y, device=device)
    assert_bits_equal(ours, torch.tensor(x) / torch.tensor(y))


@pytest.mark.parametrize("divisor", [0.0, -0.0, 1.0, -1.0, 3.0, 0.1, 4.0, 2.0 ** -130, INF,
                                     NAN, 1e-40])
def test_constant_divisors(device, divisor):
    """A Python number as the divisor (a literal in the kernel, which a driver may fold: x/0.0
    and 0.0/x come out 0 on lavapipe unless the renderer guards them)."""
    x = np.concatenate([SPECIAL, random_floats(1000, 3)])
    ours = Tensor(x, device=device) / divisor
    assert_bits_equal(ours, torch.tensor(x) / torch.tensor(divisor, dtype=torch.float32))


@pytest.mark.parametrize("dividend", [0.0, -0.0, 1.0, 3.0, INF])
def test_constant_dividends(device, dividend):
    """A number divided by a tensor. (PyTorch's own `c / t` is reciprocal(t) * c, which is
    NaN for 0 / 1e-40: compared with torch.div, its true division.)"""
    ours = dividend / Tensor(SPECIAL, device=device)
    expected = torch.div(torch.tensor(dividend, dtype=torch.float32), torch.tensor(SPECIAL))
    assert_bits_equal(ours, expected)


def test_float16_and_float64(device):
    for dtype, torch_dtype in ((dtypes.float16, torch.float16), (dtypes.float64, torch.float64)):
        skip_unless_supported(device, dtype)
        x = random_floats(10_000, 4, (-12, 12)).astype(dtype.np)
        y = random_floats(10_000, 5, (-12, 12)).astype(dtype.np)
        ours = Tensor(x, device=device) / Tensor(y, device=device)
        assert_bits_equal(ours, torch.tensor(x, dtype=torch_dtype) / torch.tensor(y))


def test_integers_divide_as_floats(device):
    a, b = pairs(INT_SPECIAL)
    ours = Tensor(a, device=device) / Tensor(b, device=device)
    assert_bits_equal(ours, torch.tensor(a) / torch.tensor(b))


# ---- rounding modes ----

@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_float_rounding_modes_with_special_values(device, mode):
    a, b = pairs(np.concatenate([SPECIAL, np.float32([7.0, -7.0, 0.5])]))
    ours = Tensor(a, device=device).div(Tensor(b, device=device), rounding_mode=mode)
    assert_bits_equal(ours, torch.div(torch.tensor(a), torch.tensor(b), rounding_mode=mode))


@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_float_rounding_modes(device, mode):
    """Negative operands and quotients that round up to the next integer (1 // 0.1 is 9:
    PyTorch floors the exact multiple below, not the rounded quotient 10)."""
    a, b = pairs(np.float32([1.0, -1.0, 1.5, 0.1, -0.1, 7.0, -7.0, 0.3, 3.0, 2.0 ** 30]))
    ours = Tensor(a, device=device).div(Tensor(b, device=device), rounding_mode=mode)
    assert_bits_equal(ours, torch.div(torch.tensor(a), torch.tensor(b), rounding_mode=mode))
    x, y = random_floats(20_000, 6, (-4, 8)), random_floats(20_000, 7, (-4, 4))
    ours = Tensor(x, device=device).div(Tensor(y, device=device), rounding_mode=mode)
    assert_bits_equal(ours, torch.div(torch.tensor(x), torch.tensor(y), rounding_mode=mode))


def test_float_floordiv_operator(device):
    x, y = random_floats(20_000, 8, (-4, 8)), random_floats(20_000, 9, (-4, 4))
    assert_bits_equal(Tensor(x, device=device) // Tensor(y, device=device),
                      torch.tensor(x) // torch.tensor(y))


def test_floor_division_starts_from_the_exact_multiple(device):
    """1.5 // 0.1 is 14 (1.5 - 14 * 0.1 is 0.09999998, exactly), not the rounded 15: WGSL's
    float % (x - y * trunc(x / y)) gave 15 on WEBGPU."""
    x, y = np.float32([1.5, -1.5, 1.0, 0.7, 1e30]), np.float32([0.1, 0.1, 0.1, 0.1, 0.3])
    ours = Tensor(x, device=device) // Tensor(y, device=device)
    assert_bits_equal(ours, torch.tensor(x) // torch.tensor(y))
    assert_bits_equal(Tensor(x, device=device) % Tensor(y, device=device),
                      torch.tensor(x) % torch.tensor(y))


# ---- the float remainder: exact, as C's fmod ----

def raw_remainder(x: np.ndarray, y: np.ndarray, device: str) -> np.ndarray:
    """The primitive MOD alone (Tensor.fmod adds NaN for y = 0 and a gradient term)."""
    a, b = Tensor(x, device=device), Tensor(y, device=device)
    return a._apply(a.uop.alu(Ops.MOD, b.uop), a, b).numpy()


def remainder_cases(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random pairs over the whole exponent range (subnormals, quotients up to 2^277) and
    over a moderate one (quotients near an integer), then every pair of special values."""
    half = count // 2
    x = np.concatenate([random_floats(half, seed, (-149, 128)),
                        random_floats(count - half, seed + 1, (-10, 20))])
    y = np.concatenate([random_floats(half, seed + 2, (-149, 128)),
                        random_floats(count - half, seed + 3, (-10, 10))])
    a, b = pairs(SPECIAL)
    a, b = np.broadcast_arrays(a, b)
    return np.concatenate([x, a.reshape(-1)]), np.concatenate([y, b.reshape(-1)])


def test_webgpu_remainder_is_exact():
    """10^6 random pairs and the special values, bit for bit as numpy's fmod (C's fmodf): the
    sign of x, |r| < |y|, NaN for y = 0 or x = +-inf, x for y = +-inf, -0.0 kept. WGSL's own
    % was wrong for 484771 of 10^6 pairs over the whole range and 76 of the 256 special ones."""
    if not Device.is_available("WEBGPU"):
        pytest.skip(f"no WEBGPU here: {Device.why_unavailable('WEBGPU')}")
    x, y = remainder_cases(1_000_000, 20)
    with np.errstate(all="ignore"):
        assert_bits_equal(raw_remainder(x, y, "WEBGPU"), np.fmod(x, y))


def test_remainder_is_exact(device):
    """The primitive on every device, against numpy's fmod (fewer pairs: PYTHON emulates; no
    zero divisors, for which the NUMPY device's MOD gives 0 and Tensor.fmod makes it NaN).
    torch.fmod is no reference here: it gives NaN where x / y overflows."""
    x, y = remainder_cases(20_000, 30)
    x, y = x[y != 0], y[y != 0]
    with np.errstate(all="ignore"):
        assert_bits_equal(raw_remainder(x, y, device), np.fmod(x, y))


@pytest.mark.parametrize("divisor", [0.1, 1.0, 3.0, -0.3, 2.0 ** -140, INF, -INF])
def test_remainder_by_a_constant(device, divisor):
    """A literal divisor, which a driver could fold differently from a run-time one."""
    x = np.concatenate([SPECIAL, random_floats(1000, 40, (-149, 128))])
    ours = Tensor(x, device=device)._binary(Ops.MOD, divisor)
    with np.errstate(all="ignore"):
        assert_bits_equal(ours, np.fmod(x, np.float32(divisor)))


def test_half_float_remainder_is_exact(device):
    skip_unless_supported(device, dtypes.float16)
    x = random_floats(20_000, 50, (-24, 15)).astype(np.float16)
    y = random_floats(20_000, 51, (-24, 15)).astype(np.float16)
    with np.errstate(all="ignore"):
        assert_bits_equal(raw_remainder(x, y, device), np.fmod(x, y))


def test_wgsl_remainder_is_the_exact_helper():
    x = Tensor(random_floats(8, 52), device="NUMPY").realize()
    y = Tensor(random_floats(8, 53), device="NUMPY").realize()
    ast = kernel_ast(x.fmod(y))
    source = WGSLRenderer().render("E_8", lower(ast, heuristic_plan(ast)))
    kernel = source.split("@compute")[1]
    assert "fn fmod_f32" in source and "fmod_f32(" in kernel and "%" not in kernel


@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_integer_rounding_modes_keep_int32(device, mode):
    """int32 limits and negative operands. PyTorch raises for x / 0 and traps (SIGFPE) on
    MIN / -1: the project's are 0 and MIN (wrapping), as C's guarded / gives."""
    a, b = pairs(INT_SPECIAL)
    b = b[:, (INT_SPECIAL != 0) & (INT_SPECIAL != -1)]
    ours = Tensor(a, device=device).div(Tensor(b, device=device), rounding_mode=mode)
    np.testing.assert_array_equal(ours.numpy(), torch.div(torch.tensor(a), torch.tensor(b),
                                                          rounding_mode=mode).numpy())
    assert ours.dtype == dtypes.int32
    x = Tensor(np.int32([INT32.min, INT32.max, -7, 7]), device=device)
    by_minus_one = x.div(Tensor(np.int32([-1, -1, -1, 0]), device=device), rounding_mode=mode)
    np.testing.assert_array_equal(by_minus_one.numpy(), [INT32.min, -INT32.max, 7, 0])


# ---- gradients: PyTorch's formulas, so special values agree too ----

def torch_gradients(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tx, ty = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    (tx / ty).sum().backward()
    assert tx.grad is not None and ty.grad is not None
    return tx.grad.numpy(), ty.grad.numpy()


def our_gradients(x: np.ndarray, y: np.ndarray, device: str) -> tuple[np.ndarray, np.ndarray]:
    ox = Tensor(x, device=device, requires_grad=True)
    oy = Tensor(y, device=device, requires_grad=True)
    (ox / oy).sum().backward()
    assert ox.grad is not None and oy.grad is not None
    return ox.grad.numpy(), oy.grad.numpy()


def test_gradients_bit_for_bit(device):
    x, y = random_floats(10_000, 10), random_floats(10_000, 11)
    for ours, theirs in zip(our_gradients(x, y, device), torch_gradients(x, y)):
        assert_bits_equal(ours, theirs)


def test_gradients_with_special_values(device):
    """y = 0 gives inf or NaN, x/y/y for tiny y does not overflow where x/y^2 would."""
    a, b = pairs(SPECIAL)
    x, y = np.broadcast_to(a, (16, 16)).copy(), np.broadcast_to(b, (16, 16)).copy()
    for ours, theirs in zip(our_gradients(x, y, device), torch_gradients(x, y)):
        assert_bits_equal(ours, theirs)


def test_gradient_of_the_rounding_modes_is_zero():
    x = Tensor(np.float32([1.5, -2.5, 7.0]), requires_grad=True, device="NUMPY")
    y = Tensor(np.float32([0.5, 2.0, -3.0]), requires_grad=True, device="NUMPY")
    (x.div(y, rounding_mode="floor") + x.div(y, rounding_mode="trunc")).sum().backward()
    assert x.grad is not None and y.grad is not None
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros(3, np.float32))
    np.testing.assert_array_equal(y.grad.numpy(), np.zeros(3, np.float32))


# ---- the op, folding and rendering ----

def test_constant_folding_follows_ieee():
    """float_divide on Python floats, rounded to float32, is numpy's float32 division."""
    a, b = pairs(SPECIAL)
    with np.errstate(all="ignore"):
        expected = np.divide(a, b)
    folded = np.array([[float_divide(float(p), float(q)) for q in SPECIAL] for p in SPECIAL])
    with np.errstate(over="ignore"):  # float64 quotients beyond float32's range round to inf
        assert_bits_equal(folded.astype(np.float32), expected)
    assert PYTHON_ALU[Ops.FDIV] is float_divide
    ours = Tensor.full((3,), -1.0, device="NUMPY") / Tensor.full((3,), 0.0, device="NUMPY")
    assert_bits_equal(ours, np.full(3, -INF, np.float32))


def kernel_ast(tensor: Tensor):
    items, _ = create_schedule([tensor.uop], "CPU")
    return next(item.ast for item in items if item.kind == "kernel")


def test_the_graph_divides_with_fdiv_except_by_powers_of_two():
    x = Tensor(random_floats(8, 12), device="NUMPY")
    ops = {node.op for node in (x / 3.0).uop.toposort}
    assert Ops.FDIV in ops and Ops.RECIPROCAL not in ops
    # x / 4 is x * 0.25 exactly (both round the same exact quotient): a multiply
    assert Ops.FDIV not in {node.op for node in (x / 4.0).uop.toposort}
    assert Ops.FDIV in {node.op for node in (x / 2.0 ** -130).uop.toposort}  # 2^130: inf


def test_each_renderer_writes_a_division():
    x = Tensor(random_floats(8, 13), device="NUMPY").realize()
    y = Tensor(random_floats(8, 14), device="NUMPY").realize()
    ast = kernel_ast(x / y)
    program = lower(ast, heuristic_plan(ast))
    assert "/" in CUDARenderer().render("E_8", program)
    assert "(val0/val1)" in WGSLRenderer().render("E_8", program).replace(" ", "")
    ast = kernel_ast(x / 0.0)
    guarded = WGSLRenderer().render("E_8", lower(ast, heuristic_plan(ast)))
    assert "divide_f32(" in guarded and "fn divide_f32" in guarded


def test_opencl_asks_for_correctly_rounded_division():
    pytest.importorskip("pyopencl")
    from tinyteach.device import Device
    from tinyteach.runtime.opencl import build_options
    try:
        compiler = Device["OPENCL"].compiler
    except Exception as error:  # no OpenCL platform here
        pytest.skip(str(error))
    device = compiler.device
    import pyopencl as cl
    offered = device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT
    assert ("-cl-fp32-correctly-rounded-divide-sqrt" in build_options(device)) == bool(offered)


def test_cuda_compiles_an_ieee_division():
    """NVRTC's default is IEEE division (-prec-div=true): PTX's div.rn.f32, correctly
    rounded (div.approx or div.full would be the fast-math forms)."""
    from tinyteach.device import DeviceUnavailable
    from tinyteach.runtime.cuda import CUDACompiler, compile_for_cuda
    try:
        compiler = CUDACompiler("sm_90")
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    x = Tensor(random_floats(8, 15), device="NUMPY").realize()
    y = Tensor(random_floats(8, 16), device="NUMPY").realize()
    kernel = compile_for_cuda("E_8", kernel_ast(x / y), compiler)
    assert "div.rn.f32" in kernel.ptx and "div.approx" not in kernel.ptx
