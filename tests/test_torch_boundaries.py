"""Where tinyteach accepts and refuses what PyTorch does, with PyTorch's error classes, and
the extremes of pow, sigmoid, tanh, gelu, clip, acosh and atanh (issue 26, groups 1 to 3).

Each error is both tinyteach's old class and PyTorch's, so either `except` catches it; the
values and gradients are compared with PyTorch's."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import check

from tinyteach import Tensor, dtypes
from tinyteach.tensor.core import ArgumentError, DTypeError, ShapeError

# ---- the error classes: both tinyteach's and torch's ----


def test_error_classes_are_both() -> None:
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, RuntimeError)
    assert issubclass(ShapeError, ArgumentError)
    assert issubclass(DTypeError, TypeError) and issubclass(DTypeError, RuntimeError)


@pytest.mark.parametrize("make", [
    lambda: Tensor.ones(2, 4) @ Tensor.ones(1, 3),            # inner sizes differ
    lambda: Tensor(3.0) @ Tensor.ones(3, 3),                  # 0-d operand
    lambda: Tensor.ones(3) + Tensor.ones(4),                  # no broadcast
    lambda: Tensor.ones(2, 1, 1).gather(0, Tensor.zeros(3, 4, 5, dtype=dtypes.int32)),
    lambda: Tensor.ones(1, 1, 6, 7).conv2d(Tensor.ones(6, 1, 3, 3), dilation=3),
    lambda: Tensor.ones(32, 10).cross_entropy(Tensor.zeros(32, 1, dtype=dtypes.int32)),
])
def test_shape_mismatches_raise_runtime_error(make) -> None:  # noqa: ANN001
    with pytest.raises(RuntimeError):
        make()
    with pytest.raises(ValueError):  # what tinyteach raised before: still caught
        make()


@pytest.mark.parametrize("make", [
    lambda: Tensor.ones(3, 4).permute(0, 0),
    lambda: Tensor.ones(3, 4).flip((1, -1)),
    lambda: Tensor.ones(3, 4).reshape(-1, -1, 2),
    lambda: Tensor([5]).div(Tensor([1]), rounding_mode="typo"),
    lambda: Tensor.ones(3).meshgrid(indexing="bad"),
    lambda: Tensor.ones(8).unfold(0, 9, 3),
    lambda: Tensor.ones(8).unfold(0, 1, -1),
    lambda: Tensor.ones(2, 4).roll((1, 2)),
    lambda: Tensor.ones(3).clip(None, None),
    lambda: Tensor([-2, 0, 2]) ** -2,
    lambda: Tensor.linspace(5, 10, 3, dtype="bool"),
    lambda: Tensor.ones(3, 3).diagonal(dim1=0, dim2=0),
])
def test_bad_arguments_raise_runtime_error(make) -> None:  # noqa: ANN001
    with pytest.raises(RuntimeError):
        make()


def test_bitwise_on_floats_raises_runtime_error() -> None:
    x = Tensor([1.0, 2.0])
    for make in (lambda: x & x, lambda: x | x, lambda: x ^ x, lambda: ~x):
        with pytest.raises(RuntimeError):
            make()
        with pytest.raises(TypeError):
            make()


def test_axis_out_of_range_is_index_error() -> None:
    for make in (lambda: Tensor(1.0).cumsum(1), lambda: Tensor.ones(20).cumprod(-2),
                 lambda: Tensor(1.0).cummax(1), lambda: Tensor.ones(8).unfold(1, 8, 3)):
        with pytest.raises(IndexError):
            make()


def test_out_of_bounds_index_message() -> None:
    with pytest.raises(IndexError, match="out of bounds"):
        Tensor.ones(4, 3)[1, 3]


def test_refused_as_torch_refuses() -> None:
    with pytest.raises(ValueError):
        Tensor.eye(-3, 3)
    with pytest.raises(ValueError):
        Tensor.kaiming_uniform((-3, 3), 3)
    with pytest.raises(ValueError):
        Tensor.stack((Tensor([1, 2]), Tensor([3, 4])), Tensor([5, 6]))
    with pytest.raises(NotImplementedError):
        Tensor.ones(1, 1, 5, 5).pad((3, -5, 1, -5), mode="circular")
    with pytest.raises(NotImplementedError):
        Tensor.ones(3, 3, 3).pad((3, 0), mode="typo")
    with pytest.raises(RuntimeError):  # torch: scatter wants one dtype for self and src
        Tensor.ones(3, 4).half().scatter(1, Tensor.zeros(3, 4, dtype=dtypes.int32),
                                         Tensor.ones(3, 4))


# ---- accepted as torch accepts ----

def test_roll_one_shift_in_a_tuple(device: str) -> None:
    check(lambda x: x.roll((1,)), lambda x: x.roll((1,)), [(2, 4)], device=device)


def test_reshape_none_keeps_the_axis(device: str) -> None:
    check(lambda x: x.reshape(None, None, 6), lambda x: x.reshape(4, 3, 6), [(4, 3, 6)],
          device=device)


@pytest.mark.parametrize("axis", [0, -1])
def test_prod_of_a_0d_tensor(device: str, axis: int) -> None:
    check(lambda x: x.prod(axis), lambda x: x.prod(axis), [()], device=device)


def test_idiv_rounds_toward_zero(device: str) -> None:
    a, b = [-4, 7, 5, 4, -7, 8, -5], [2, -3, 8, -2, 3, 5, 2]
    ours = Tensor(a, device=device).idiv(Tensor(b, device=device)).numpy()
    np.testing.assert_equal(ours, torch.div(torch.tensor(a), torch.tensor(b),
                                            rounding_mode="trunc").numpy())
    with pytest.raises(TypeError):
        Tensor([1.5]).idiv(2)


def test_dtype_names_as_strings() -> None:
    # tinygrad's names, aliases included; an unknown name is an AttributeError as in tinygrad
    assert Tensor([1, 2]).cast("uchar").dtype == dtypes.uint8
    assert Tensor([1.0]).sum(dtype="half").dtype == dtypes.float16
    assert Tensor.arange(3, dtype="long").dtype == dtypes.int64
    with pytest.raises(AttributeError):
        Tensor([1.0, 2.0]).sum(dtype="")
    with pytest.raises(TypeError):
        Tensor([1.0, 2.0]).prod(dtype="float33")
    assert dtypes.max(dtypes.int32) == 2**31 - 1 and dtypes.min(dtypes.int8) == -128


def test_cross_entropy_classes_on_axis_1(device: str) -> None:
    probs = np.random.default_rng(0).uniform(0, 1, (4, 3, 2, 2)).astype(np.float32)
    check(lambda x, y: x.cross_entropy(y, label_smoothing=0.3),
          lambda x, y: F.cross_entropy(x, y, label_smoothing=0.3), [(4, 3, 2, 2), probs],
          device=device)
    targets = np.random.default_rng(1).integers(0, 3, (4, 2, 2)).astype(np.int32)
    check(lambda x: x.cross_entropy(Tensor(targets, device=device)),
          lambda x: F.cross_entropy(x, torch.tensor(targets).long()), [(4, 3, 2, 2)],
          device=device)


# ---- extremes ----

@pytest.mark.parametrize("low", [300.0, -400.0, 1e4, -1e4])
@pytest.mark.parametrize("name", ["sigmoid", "tanh", "gelu", "quick_gelu"])
def test_activations_at_extremes(device: str, name: str, low: float) -> None:
    torch_fns = {"sigmoid": torch.sigmoid, "tanh": torch.tanh,
                 "gelu": lambda x: F.gelu(x, approximate="tanh"),
                 "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}
    check(lambda x: getattr(x, name)(), torch_fns[name], [(5, 7)], device=device,
          low=low, high=low + 100)


def test_sigmoid_gradient_is_zero_far_out(device: str) -> None:
    for value in (300.0, -300.0, 1e4, -1e4):
        x = Tensor([value], device=device, requires_grad=True)
        assert x.sigmoid()[0].gradient(x)[0].item() == 0.0


@pytest.mark.parametrize("name,low", [("acosh", -300.0), ("acosh", 300.0), ("atanh", -300.0),
                                      ("atanh", 300.0), ("atanh", -0.9), ("acosh", 1.5)])
def test_acosh_atanh_outside_their_domain(device: str, name: str, low: float) -> None:
    """NaN values outside the domain, but PyTorch's gradients (numbers for |x| > 1)."""
    check(lambda x: getattr(x, name)(), lambda x: getattr(x, name)(), [(4, 5)], device=device,
          low=low, high=low + 1.5 if abs(low) < 100 else low + 3, grad_atol=1e-3)


def test_clip_gradient_at_the_bounds(device: str) -> None:
    values = np.array([-3.0, -2.5, 0.0, 1.5, 2.0], dtype=np.float32)
    check(lambda x: x.clip(-2.5, 1.5), lambda x: x.clip(-2.5, 1.5), [values], device=device)
    check(lambda x: x.clip(3, 0), lambda x: x.clip(3, 0), [(4, 5)], device=device)


ZERO_AND_FRIENDS = np.array([-2.0, -0.5, 0.0, 0.5, 1.0, 2.0], dtype=np.float32)


@pytest.mark.parametrize("exponent", [0.0, 0.3, -0.3, -1.0, 1.1, 2.0, 5.5])
def test_pow_constant_exponent_values_and_gradients(device: str, exponent: float) -> None:
    check(lambda x: x ** exponent, lambda x: x ** exponent, [ZERO_AND_FRIENDS], device=device)


@pytest.mark.parametrize("pair", [(0.0, 0.0), (0.0, 0.3), (0.0, -0.3), (-8.0, 1 / 3),
                                  (2.0, -1.5), (-2.0, 0.5)])
def test_pow_tensor_exponent_values_and_gradients(device: str, pair: tuple[float, float]) -> None:
    base = np.array([pair[0]], dtype=np.float32)
    exponent = np.array([pair[1]], dtype=np.float32)
    check(lambda x, y: x ** y, lambda x, y: x ** y, [base, exponent], device=device)


def test_pow_of_zero_base_to_tensor(device: str) -> None:
    check(lambda x: 0 ** x, lambda x: 0 ** x, [np.array([-2.0, -1, 0, 1, 2, 3], np.float32)],
          device=device)


def test_pow_of_a_negative_base_to_a_tensor_has_torch_s_nan_gradient(device: str) -> None:
    """d/dy (-2) ** y = (-2) ** y * log(-2): NaN everywhere (PyTorch's), though every value
    is a number."""
    check(lambda x: (-2) ** x, lambda x: (-2) ** x, [np.array([-2.0, -1, 0, 1, 2, 3], np.float32)],
          device=device)
    x = Tensor([-2.0, 3.0], device=device, requires_grad=True)
    assert np.isnan(((-2) ** x).sum().gradient(x)[0].numpy()).all()


def test_pow_of_negative_infinity_is_c_s() -> None:
    got = (Tensor([-math.inf, -math.inf]) ** Tensor([0.3, -0.3])).numpy()
    np.testing.assert_equal(got, np.power(np.float32([-np.inf, -np.inf]), [0.3, -0.3]))


# ---- indexing with tuples and lists (group 4) ----

@pytest.mark.parametrize("index", [
    ((0,),), (((0,),),), ((1, 0, -1), 2), (1, (2, 1, 0), None, 0, (2, 1, 0)),
    ([[0]], 1, [[1]]), (0, ((2,), (1,), (0,)), 1, (2, 1, 0)), ([True, False, 2],),
])
def test_tuples_inside_an_index_are_advanced_indices(device: str, index: tuple) -> None:
    x = np.arange(3 * 5 * 6 * 5, dtype=np.float32).reshape(3, 5, 6, 5)
    torch_index = tuple(torch.tensor(i) if isinstance(i, (tuple, list)) else i for i in index)
    check(lambda t: t[index], lambda t: t[torch_index], [x], device=device)


def test_float_or_bool_list_index_is_refused() -> None:
    a = Tensor.ones(10, 11)
    for index in ([1.1], [True, False], Tensor(1.1), Tensor([True, False])):
        with pytest.raises(IndexError):
            a[index]


# ---- state dicts and optimizers (group 5) ----

def test_shape_mismatch_is_a_value_error_with_tinygrad_s_sentence() -> None:
    from tinyteach.nn import Linear
    from tinyteach.nn.state import load_state_dict
    with pytest.raises(ValueError, match=r"Shape mismatch in layer `weight`: Expected shape "
                                         r"\(2, 2\), but found \(4, 4\) in state dict."):
        load_state_dict(Linear(2, 2, bias=False), {"weight": Tensor.ones(4, 4)})


def test_step_outside_training_is_also_an_assertion_error() -> None:
    from tinyteach.nn.optim import SGD
    t = Tensor.ones(1, 1, requires_grad=True)
    optimizer = SGD([t])
    t.sum().backward()
    with pytest.raises(AssertionError):
        optimizer.step()
    with pytest.raises(RuntimeError):
        optimizer.step()


# ---- integer dtypes kept (group 3) ----

def test_max_pool_and_nearest_interpolate_keep_integer_dtypes(device: str) -> None:
    x = np.random.default_rng(2).integers(-50, 50, (2, 2, 5, 7)).astype(np.int32)
    pooled = Tensor(x, device=device).max_pool2d(2, padding=1)
    expected = F.max_pool2d(torch.tensor(x), 2, padding=1)
    assert pooled.dtype == dtypes.int32
    np.testing.assert_equal(pooled.numpy(), expected.numpy())
    u = x.astype(np.uint8)
    resized = Tensor(u, device=device).interpolate((3, 4), mode="nearest")
    assert resized.dtype == dtypes.uint8
    np.testing.assert_equal(resized.numpy(),
                            F.interpolate(torch.tensor(u), size=(3, 4), mode="nearest").numpy())


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("shape,size", [((2, 3, 64, 64), (10, 10)), ((1, 2, 13, 17), (31, 40)),
                                        ((1, 1, 5, 9), (7, 29))])
def test_uint8_bilinear_interpolate_is_torchs_bit_for_bit(device, shape, size, align_corners):
    """PyTorch resamples uint8 images in fixed point (int16 weights, rounded at each axis):
    tinyteach computes the same integers, over the whole 0..255 range (tinygrad's
    TestOpsUint8.test_interpolate_bilinear)."""
    data = np.random.default_rng(0).integers(0, 256, shape).astype(np.uint8)
    theirs = F.interpolate(torch.tensor(data), size=size, mode="bilinear",
                           align_corners=align_corners).numpy()
    ours = Tensor(data, device=device).interpolate(size, mode="linear",
                                                   align_corners=align_corners)
    assert ours.dtype == dtypes.uint8
    np.testing.assert_array_equal(ours.numpy(), theirs)
