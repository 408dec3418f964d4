"""tinygrad's elementwise API beyond the basics (issue 13): inverse trigonometric and hyperbolic
functions, erf, inf/NaN tests, more activations, fmod, copysign, logaddexp, bitwise ops and
shifts — forward and backward against PyTorch, with edge values (inf, NaN, -0.0, tiny and huge
inputs), integer and bool dtypes, empty tensors and errors.

Runs on NUMPY and CPU only (the shared machine's cores); tests/test_ops.py runs every device.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from helpers import check, compare, default_device

from tinyteach import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture(params=["NUMPY", "CPU"])
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    with default_device(request.param):
        yield request.param


# name: (ours, PyTorch's, low, high) — inputs are drawn from [low, high), inside the domain
UNARY: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any], float, float]] = {
    "log10": (Tensor.log10, torch.log10, 0.1, 5.0),
    "asin": (Tensor.asin, torch.asin, -0.97, 0.97),
    "acos": (Tensor.acos, torch.acos, -0.97, 0.97),
    "atan": (Tensor.atan, torch.atan, -6.0, 6.0),
    "sinh": (Tensor.sinh, torch.sinh, -4.0, 4.0),
    "cosh": (Tensor.cosh, torch.cosh, -4.0, 4.0),
    "atanh": (Tensor.atanh, torch.atanh, -0.95, 0.95),
    "asinh": (Tensor.asinh, torch.asinh, -6.0, 6.0),
    "acosh": (Tensor.acosh, torch.acosh, 1.05, 6.0),
    "erf": (Tensor.erf, torch.erf, -3.0, 3.0),
    "logsigmoid": (Tensor.logsigmoid, F.logsigmoid, -8.0, 8.0),
    "hardsigmoid": (Tensor.hardsigmoid, F.hardsigmoid, -5.0, 5.0),
    "celu": (Tensor.celu, F.celu, -4.0, 4.0),
    "selu": (Tensor.selu, torch.selu, -4.0, 4.0),
    "relu6": (Tensor.relu6, F.relu6, -3.0, 9.0),
    "hardswish": (Tensor.hardswish, F.hardswish, -5.0, 5.0),
    "hardtanh": (Tensor.hardtanh, F.hardtanh, -2.0, 2.0),
    "quick_gelu": (Tensor.quick_gelu, lambda x: x * torch.sigmoid(1.702 * x), -4.0, 4.0),
    "mish": (Tensor.mish, F.mish, -6.0, 6.0),
    "softsign": (Tensor.softsign, F.softsign, -4.0, 4.0),
    "leakyrelu": (Tensor.leakyrelu, F.leaky_relu, -2.0, 2.0),
}

SPECIAL = np.array([-np.inf, -1e30, -100.0, -20.0, -1.0, -0.5, -1e-3, -1e-6, -0.0, 0.0, 1e-6,
                    1e-3, 0.5, 0.9999, 1.0, 1.0001, 20.0, 100.0, 1e30, np.inf, np.nan],
                   dtype=np.float32)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_forward_and_backward(device: str, name: str) -> None:
    ours, theirs, low, high = UNARY[name]
    check(ours, theirs, [(3, 17)], device, low=low, high=high, atol=1e-6, rtol=1e-5,
          grad_atol=1e-5, grad_rtol=1e-4)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_edge_values(device: str, name: str) -> None:
    """inf, NaN, -0.0, values outside the domain (NaN in both), tiny and huge inputs."""
    ours, theirs, _, _ = UNARY[name]
    check(ours, theirs, [SPECIAL], device, atol=1e-7, rtol=2e-6, grad=False)


def test_unary_size_one_and_empty(device: str) -> None:
    for name, (ours, theirs, low, high) in UNARY.items():
        check(ours, theirs, [(1, 1, 3)], device, low=low, high=high, atol=1e-6, rtol=1e-5)
        assert ours(Tensor.ones(0, 4, device=device)).shape == (0, 4), name


def test_unary_on_integers_gives_floats(device: str) -> None:
    ints = np.array([-3, -1, 0, 1, 2, 7], dtype=np.int32)
    for name in ("asin", "atan", "sinh", "cosh", "asinh", "erf", "log10", "mish", "logsigmoid"):
        ours = UNARY[name][0](Tensor(ints, device=device))
        assert ours.dtype == dtypes.float32, name
        compare(ours, UNARY[name][1](torch.tensor(ints, dtype=torch.float32)), 1e-6, 1e-5, name)


def test_activation_arguments(device: str) -> None:
    check(lambda t: t.celu(0.5), lambda t: F.celu(t, 0.5), [(20,)], device, low=-4, high=4)
    check(lambda t: t.hardtanh(-0.5, 1.5), lambda t: F.hardtanh(t, -0.5, 1.5), [(20,)], device,
          low=-3.0, high=3.0)
    check(lambda t: t.hardsigmoid(0.2, 0.4),
          lambda t: torch.clamp(0.2 * t + 0.4, 0, 1), [(20,)], device, low=-4.0, high=4.0)
    check(lambda t: t.selu(1.5, 2.0),
          lambda t: 2.0 * torch.where(t > 0, t, 1.5 * (torch.exp(t) - 1)), [(20,)], device)
    with pytest.raises(ValueError, match="alpha"):
        Tensor([1.0]).celu(0.0)
    with pytest.raises(ValueError, match="min_val"):
        Tensor([1.0]).hardtanh(2, 1)


def test_large_inputs_have_finite_gradients(device: str) -> None:
    """Branches that are not taken must not turn the gradient into NaN (0 * inf)."""
    x = np.array([-200.0, -90.0, 90.0, 200.0], dtype=np.float32)
    for name in ("mish", "logsigmoid", "selu", "celu", "erf", "atan", "asinh"):
        check(UNARY[name][0], UNARY[name][1], [x], device, atol=1e-5, rtol=1e-4)
    huge = np.array([-1e30, -5000.0, 5000.0, 1e30], dtype=np.float32)
    check(Tensor.atan, torch.atan, [huge], device, atol=1e-6, rtol=1e-5)
    check(Tensor.asinh, torch.asinh, [huge], device, atol=1e-6, rtol=1e-5)


def test_gradients_at_zero(device: str) -> None:
    """The odd functions use where(x < 0, -x, x), whose gradient at 0 is 1 (abs's is 0)."""
    zero = np.zeros(1, dtype=np.float32)
    for name in ("asin", "atan", "asinh", "erf", "sinh", "atanh", "logsigmoid", "softsign"):
        check(UNARY[name][0], UNARY[name][1], [zero], device, atol=1e-6, rtol=1e-5)


def test_isinf_isnan_isfinite(device: str) -> None:
    ours, theirs = Tensor(SPECIAL, device=device), torch.tensor(SPECIAL)
    compare(ours.isinf(), torch.isinf(theirs), 0, 0)
    compare(ours.isnan(), torch.isnan(theirs), 0, 0)
    compare(ours.isfinite(), torch.isfinite(theirs), 0, 0)
    compare(ours.isinf(detect_negative=False), torch.isposinf(theirs), 0, 0)
    compare(ours.isinf(detect_positive=False), torch.isneginf(theirs), 0, 0)
    assert ours.isnan().dtype == dtypes.bool
    for values in (np.array([-5, 0, 7], dtype=np.int32), np.array([True, False])):
        t = Tensor(values, device=device)
        compare(t.isinf(), np.zeros(3 if values.dtype != bool else 2, bool), 0, 0)
        compare(t.isnan(), np.isnan(values.astype(np.float32)), 0, 0)
        compare(t.isfinite(), np.ones(values.shape, bool), 0, 0)
    assert Tensor.ones(0, 2, device=device).isnan().shape == (0, 2)


def test_lerp(device: str) -> None:
    check(lambda a, b, w: a.lerp(b, w), torch.lerp, [(3, 4), (3, 4), (3, 4)], device)
    check(lambda a, b: a.lerp(b, 0.3), lambda a, b: torch.lerp(a, b, 0.3), [(2, 1, 4), (3, 1)],
          device)


def away_from_zero(*shape: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    magnitude = rng.uniform(0.5, 3.0, size=shape)
    return (magnitude * rng.choice([-1.0, 1.0], size=shape)).astype(np.float32)


def test_fmod(device: str) -> None:
    x = np.random.default_rng(0).uniform(-10, 10, size=(4, 5)).astype(np.float32)
    check(Tensor.fmod, torch.fmod, [x, away_from_zero(4, 5)], device)
    check(lambda a: a.fmod(1.5), lambda a: torch.fmod(a, 1.5), [x], device)
    check(Tensor.fmod, torch.fmod, [x, away_from_zero(1, 5)], device)  # broadcast
    specials = np.array([np.inf, -np.inf, np.nan, 3.0, -3.0, 5.5, -0.0], dtype=np.float32)
    divisors = np.array([2.0, 2.0, 2.0, 0.0, np.inf, -np.inf, 1.0], dtype=np.float32)
    check(Tensor.fmod, torch.fmod, [specials, divisors], device, grad=False)
    a = np.array([-7, -6, -1, 0, 5, 7], dtype=np.int32)
    b = np.array([3, -4, 2, 3, -3, 7], dtype=np.int32)
    compare(Tensor(a, device=device).fmod(Tensor(b, device=device)),
            torch.fmod(torch.tensor(a), torch.tensor(b)), 0, 0)


def test_copysign(device: str) -> None:
    # the result does not depend on the value of `other`, only on its sign: no gradient there
    other = away_from_zero(3, 4)
    check(lambda a: a.copysign(Tensor(other)), lambda a: torch.copysign(a, torch.tensor(other)),
          [(3, 4)], device)
    signs = np.array([-0.0, 0.0, -np.inf, np.inf, -2.0, 3.0], dtype=np.float32)
    check(lambda a: a.copysign(Tensor(signs)), lambda a: torch.copysign(a, torch.tensor(signs)),
          [(6,)], device)
    check(lambda a: a.copysign(-1.0), lambda a: torch.copysign(a, -1.0), [(5,)], device)
    ints = np.array([-3, 0, 4], dtype=np.int32)
    ours = Tensor(ints, device=device).copysign(Tensor([1, -1, -1], device=device))
    assert ours.dtype == dtypes.float32
    compare(ours, torch.copysign(torch.tensor(ints), torch.tensor([1, -1, -1])), 0, 0)


def test_logaddexp(device: str) -> None:
    check(Tensor.logaddexp, torch.logaddexp, [(3, 4), (3, 4)], device, low=-30, high=30)
    check(Tensor.logaddexp, torch.logaddexp, [(3, 1), (1, 4)], device)  # broadcast
    a = np.array([-np.inf, np.inf, np.inf, np.nan, 1000.0, -1000.0, 0.0], dtype=np.float32)
    b = np.array([-np.inf, np.inf, -np.inf, 1.0, 1000.0, -1000.0, 0.0], dtype=np.float32)
    check(Tensor.logaddexp, torch.logaddexp, [a, b], device, grad=False)
    compare(Tensor([1, 2], device=device).logaddexp(3),
            torch.logaddexp(torch.tensor([1.0, 2.0]), torch.tensor(3.0)), 1e-6, 1e-6)


INTS = np.array([[-7, -1, 0, 5, 12, 2**30]], dtype=np.int32)
OTHER = np.array([[3, -1, 9, -6, 10, 1]], dtype=np.int32)


@pytest.mark.parametrize("name", ["bitwise_and", "bitwise_or", "bitwise_xor", "xor"])
def test_bitwise_binary(device: str, name: str) -> None:
    reference = getattr(np, "bitwise_xor" if name == "xor" else name)
    a, b = Tensor(INTS, device=device), Tensor(OTHER, device=device)
    compare(getattr(a, name)(b), reference(INTS, OTHER), 0, 0)
    compare(getattr(a, name)(6), reference(INTS, 6), 0, 0)
    compare(getattr(a, name)(6, reverse=True), reference(6, INTS), 0, 0)
    flags = np.array([True, True, False, False])
    other = np.array([True, False, True, False])
    ours = getattr(Tensor(flags, device=device), name)(Tensor(other, device=device))
    assert ours.dtype == dtypes.bool
    compare(ours, reference(flags, other), 0, 0)
    u = np.array([0, 200, 255], dtype=np.uint8)
    compare(getattr(Tensor(u, device=device), name)(15), reference(u, np.uint8(15)), 0, 0)
    with pytest.raises(TypeError, match="float32"):
        getattr(Tensor([1.0, 2.0], device=device), name)(1)
    with pytest.raises(TypeError, match="float32"):
        getattr(a, name)(1.5)


def test_bitwise_not(device: str) -> None:
    compare(Tensor(INTS, device=device).bitwise_not(), np.bitwise_not(INTS), 0, 0)
    compare(Tensor([True, False], device=device).bitwise_not(), [False, True], 0, 0)
    u = np.array([0, 7, 255], dtype=np.uint8)
    compare(Tensor(u, device=device).bitwise_not(), np.bitwise_not(u), 0, 0)
    with pytest.raises(TypeError, match="float32"):
        Tensor([1.0], device=device).bitwise_not()


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8", "int64", "uint32"])
def test_shifts_by_constants(device: str, dtype: str) -> None:
    values = np.array([-100, -7, -1, 0, 1, 5, 77, 100], dtype=np.int64)
    if dtype.startswith("u"):
        values = np.abs(values)
    x = values.astype(dtype)
    t = Tensor(x, device=device)
    bits = 8 * x.dtype.itemsize
    for shift in (0, 1, 3, bits - 1):  # numpy: PyTorch has no uint32 shifts
        compare(t.lshift(shift), np.left_shift(x, shift), 0, 0, f"<< {shift}")
        compare(t.rshift(shift), np.right_shift(x, shift), 0, 0, f">> {shift}")
        compare(t << shift, np.left_shift(x, shift), 0, 0)
        compare(t >> shift, np.right_shift(x, shift), 0, 0)
    assert (t << 2).dtype == t.dtype


def test_shifts_by_tensors(device: str) -> None:
    x = np.array([[-9, 3, 100, 1]], dtype=np.int32)
    shifts = np.array([[0, 1, 2, 30]], dtype=np.int32)
    ours, theirs = Tensor(x, device=device), torch.tensor(x)
    compare(ours << Tensor(shifts, device=device), theirs << torch.tensor(shifts), 0, 0)
    compare(ours >> Tensor(shifts, device=device), theirs >> torch.tensor(shifts), 0, 0)
    column = np.array([[1], [2]], dtype=np.int32)  # broadcast to (2, 4)
    compare(ours << Tensor(column, device=device), theirs << torch.tensor(column), 0, 0)
    amounts = Tensor(shifts, device=device)
    compare(1 << amounts, 1 << torch.tensor(shifts), 0, 0)
    compare(-1000 >> amounts, -1000 >> torch.tensor(shifts), 0, 0)


def test_shift_errors(device: str) -> None:
    with pytest.raises(ValueError, match="shift 32"):
        Tensor([1], device=device) << 32
    with pytest.raises(ValueError, match="shift -1"):
        Tensor([1], device=device) >> -1
    with pytest.raises(TypeError, match="float32"):
        Tensor([1.0], device=device) << 1
    with pytest.raises(TypeError, match="bool"):
        Tensor([True], device=device) >> 1


def test_bitwise_by_name_matches_the_operators(device: str) -> None:
    a, b = Tensor(INTS, device=device), Tensor(OTHER, device=device)
    compare(a.bitwise_and(b), (a & b).numpy(), 0, 0)
    compare(a.bitwise_or(b), np.bitwise_or(INTS, OTHER), 0, 0)
    compare(a.bitwise_xor(b), np.bitwise_xor(INTS, OTHER), 0, 0)
    compare(a.xor(b), np.bitwise_xor(INTS, OTHER), 0, 0)


# ---- bitcast: the same bits read as another dtype, checked against numpy's view ----

FLOATS = {"float16": ("int16", "uint16"), "float32": ("int32", "uint32"),
          "float64": ("int64", "uint64")}


def _float_samples(name: str) -> np.ndarray:
    """Every kind of float: zeros, infinities, subnormals, the extremes and random bit patterns."""
    info = np.finfo(name)
    specials = [0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, info.tiny, -info.tiny, info.max,
                -info.max, info.smallest_subnormal, -info.smallest_subnormal * 3, info.eps,
                1 + info.eps, 0.1, -1e-3]
    unsigned = np.dtype(FLOATS[name][1])
    rng = np.random.default_rng(7)
    bits = rng.integers(0, np.iinfo(unsigned).max, size=200, dtype=unsigned, endpoint=True)
    random = bits.view(name)
    return np.concatenate([np.array(specials, dtype=name), random[np.isfinite(random)]])


@pytest.mark.parametrize("name", list(FLOATS))
def test_bitcast_float_to_int_and_back(device: str, name: str) -> None:
    x = _float_samples(name)
    for int_name in FLOATS[name]:
        bits = Tensor(x, device=device).bitcast(int_name)
        assert bits.dtype == dtypes.as_dtype(int_name)
        compare(bits, x.view(int_name), 0, 0, f"{name} -> {int_name}")
        back = Tensor(x.view(int_name), device=device).bitcast(name)
        assert back.dtype == dtypes.as_dtype(name)
        np.testing.assert_array_equal(back.numpy().view(int_name), x.view(int_name))


@pytest.mark.parametrize("name", list(FLOATS))
def test_bitcast_nan(device: str, name: str) -> None:
    """A NaN keeps its payload and its sign, quiet or signaling, both ways (a bitcast reads
    bits, it computes nothing); every such pattern is a NaN (tests/test_bitcast_bits.py
    covers every device)."""
    unsigned = FLOATS[name][1]
    sign, mantissa_bits = np.iinfo(unsigned).max // 2 + 1, np.finfo(name).nmant
    exponent = np.array([np.inf], dtype=name).view(unsigned)[0]
    payloads = np.array([1, 3, 1 << (mantissa_bits - 1), (1 << mantissa_bits) - 1],
                        dtype=unsigned)
    patterns = np.concatenate([exponent | payloads, (exponent | payloads) + sign])
    floats = Tensor(patterns, device=device).bitcast(name)
    assert floats.isnan().all().item()
    compare(floats.bitcast(unsigned), patterns, 0, 0)
    compare(Tensor(patterns.view(name), device=device).bitcast(unsigned), patterns, 0, 0)


def test_bitcast_between_integers(device: str) -> None:
    x = np.array([-128, -1, 0, 1, 127], dtype=np.int8)
    compare(Tensor(x, device=device).bitcast(dtypes.uint8), x.view(np.uint8), 0, 0)
    u = np.array([0, 1, 2**31, 2**32 - 1], dtype=np.uint32)
    compare(Tensor(u, device=device).bitcast("int32"), u.view(np.int32), 0, 0)


def test_bitcast_errors_and_no_gradient(device: str) -> None:
    with pytest.raises(ValueError, match="same size"):
        Tensor([1.0], device=device).bitcast(dtypes.int16)
    with pytest.raises(TypeError, match="bool"):
        Tensor([True], device=device).bitcast(dtypes.uint8)
    x = Tensor([1.5, -2.0], device=device, requires_grad=True)
    assert not x.bitcast(dtypes.int32).requires_grad
    assert Tensor.ones(0, 2, device=device).bitcast("uint32").shape == (0, 2)


def test_binary_ops_on_empty_and_size_one(device: str) -> None:
    empty = Tensor.ones(0, 3, device=device)
    for name in ("fmod", "copysign", "logaddexp", "lerp"):
        args = (empty, 0.5) if name == "lerp" else (empty,)
        assert getattr(empty, name)(*args).shape == (0, 3), name
    assert Tensor.ones(0, dtype=dtypes.int32, device=device).bitwise_and(3).shape == (0,)
    assert (Tensor.ones(0, dtype=dtypes.int32, device=device) << 2).shape == (0,)
    check(Tensor.logaddexp, torch.logaddexp, [(1, 1), (2, 1, 3)], device)
    check(lambda a: a.fmod(-0.75), lambda a: torch.fmod(a, -0.75), [(1,)], device)


@pytest.mark.parametrize("device", ["NUMPY", "CPU"])
def test_fmod_keeps_the_sign_of_a_zero_remainder(device):
    """fmod(-4, 2) is -0.0 in C and torch (the sign of x); a gradient term added as +0.0 made
    it +0.0. Values and gradients against torch."""
    xs = np.array([-4.0, 4.0, -0.0, 0.0, -5.5, 5.5, 3.0, -3.0, 1e30], np.float32)
    ys = np.array([2.0, 2.0, 3.0, -3.0, 2.0, -2.0, np.inf, -np.inf, 3.0], np.float32)
    x = Tensor(xs, device=device, requires_grad=True)
    y = Tensor(ys, device=device, requires_grad=True)
    result = x.fmod(y)
    result.sum().backward()
    tx, ty = torch.tensor(xs, requires_grad=True), torch.tensor(ys, requires_grad=True)
    expected = torch.fmod(tx, ty)
    expected.sum().backward()
    np.testing.assert_array_equal(result.numpy(), expected.detach().numpy())
    np.testing.assert_array_equal(np.signbit(result.numpy()), np.signbit(expected.detach().numpy()))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=1e-6)
