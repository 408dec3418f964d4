"""The arguments of existing Tensor ops, as tinygrad and PyTorch have them (issue 13).

Each argument is checked forward and backward against PyTorch on NUMPY and CPU (`check`), with
its edge cases, and a bad argument must raise the error type PyTorch raises, naming the problem.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import check

import tinyteach
from tinyteach import Context, Tensor, dtypes, nn

DEVICES = ["NUMPY", "CPU"]


# ---- div(rounding_mode=) ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_div_rounding_mode_floats(device: str, mode: str | None) -> None:
    check(lambda a, b: a.div(b, rounding_mode=mode),
          lambda a, b: torch.div(a, b, rounding_mode=mode), [(3, 4), (3, 4)], device,
          low=-5, high=5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_div_rounding_mode_integers(device: str, mode: str) -> None:
    a = np.array([7, -7, 7, -7, 0, 6], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, -3], dtype=np.int32)
    check(lambda x, y: x.div(y, rounding_mode=mode),
          lambda x, y: torch.div(x, y, rounding_mode=mode), [a, b], device)
    check(lambda x: x.div(-4, rounding_mode=mode),
          lambda x: torch.div(x, -4, rounding_mode=mode), [a], device)


def test_div_bad_rounding_mode() -> None:
    with pytest.raises(ValueError, match="rounding_mode"):
        Tensor([1.0]).div(2, rounding_mode="round")


# ---- gelu(approximate=) ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_approximate(device: str, approximate: str) -> None:
    check(lambda x: x.gelu(approximate=approximate),
          lambda x: F.gelu(x, approximate=approximate), [(4, 5)], device, low=-6, high=6)


def test_gelu_default_is_tinygrads_tanh() -> None:
    x = np.linspace(-4, 4, 9, dtype=np.float32)
    np.testing.assert_allclose(Tensor(x).gelu().numpy(),
                               F.gelu(torch.tensor(x), approximate="tanh").numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="approximate"):
        Tensor(x).gelu(approximate="erf")


# ---- cross_entropy with probabilities and label_smoothing; pos_weight ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_probabilities(device: str, reduction: str, smoothing: float) -> None:
    target = np.random.default_rng(3).dirichlet(np.ones(5), size=4).astype(np.float32)
    check(lambda x, y: x.cross_entropy(y, reduction=reduction, label_smoothing=smoothing),
          lambda x, y: F.cross_entropy(x, y, reduction=reduction, label_smoothing=smoothing),
          [(4, 5), target], device, grad=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
def test_cross_entropy_label_smoothing_indices(device: str, smoothing: float) -> None:
    labels = np.array([0, 4, 2], dtype=np.int32)
    check(lambda x, y: x.cross_entropy(y, label_smoothing=smoothing),
          lambda x, y: F.cross_entropy(x, y.long(), label_smoothing=smoothing),
          [(3, 5), labels], device)


def test_cross_entropy_bad_arguments() -> None:
    with pytest.raises(ValueError, match="label_smoothing"):
        Tensor.ones(2, 3).cross_entropy(Tensor([0, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="do not match"):
        Tensor.ones(2, 3).cross_entropy(Tensor([0, 1, 2]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_binary_crossentropy_logits_pos_weight(device: str, reduction: str) -> None:
    target = (np.random.default_rng(5).uniform(size=(4, 3)) > 0.5).astype(np.float32)
    pos_weight = np.array([1.0, 2.5, 0.5], dtype=np.float32)  # PyTorch: no gradient for it
    check(lambda x, y: x.binary_crossentropy_logits(y, reduction=reduction,
                                                    pos_weight=Tensor(pos_weight, device=device)),
          lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction,
                                                          pos_weight=torch.tensor(pos_weight)),
          [(4, 3), target], device, grad=True, low=-8, high=8)


@pytest.mark.parametrize("device", DEVICES)
def test_binary_crossentropy_logits_pos_weight_at_zero(device: str) -> None:
    """At x = 0 the max and abs kinks must still give the true gradient."""
    x = np.zeros((2, 2), dtype=np.float32)
    target = np.array([[1.0, 0.0], [0.3, 1.0]], dtype=np.float32)
    check(lambda a, y: a.binary_crossentropy_logits(y, pos_weight=Tensor([3.0, 0.5],
                                                                         device=device)),
          lambda a, y: F.binary_cross_entropy_with_logits(a, y, pos_weight=torch.tensor(
              [3.0, 0.5])), [x, target], device)


# ---- convolution over 1, 2 or 3 spatial axes ----

CONVOLUTIONS = [  # input, weight, keyword arguments, torch function
    ((2, 3, 9), (4, 3, 3), {"stride": 2, "padding": 1, "dilation": 2}, F.conv1d),
    ((1, 4, 7), (2, 2, 2), {"groups": 2, "padding": (3,)}, F.conv1d),
    ((2, 3, 5, 5, 4), (3, 1, 2, 3, 2), {"groups": 3, "padding": (1, 0, 1)}, F.conv3d),
    ((1, 2, 4, 5, 3), (2, 2, 3, 2, 2), {"stride": (1, 2, 1), "dilation": (1, 2, 1)}, F.conv3d),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(CONVOLUTIONS)))
def test_conv_any_number_of_spatial_axes(device: str, case: int) -> None:
    x_shape, w_shape, kwargs, torch_fn = CONVOLUTIONS[case]
    bias = (w_shape[0],)
    check(lambda x, w, b: x.conv2d(w, b, **kwargs), lambda x, w, b: torch_fn(x, w, b, **kwargs),
          [x_shape, w_shape, bias], device, atol=1e-4)


def test_conv_bad_arguments() -> None:
    with pytest.raises(ValueError, match="larger than the padded input"):
        Tensor.ones(1, 1, 2, 2).conv2d(Tensor.ones(1, 1, 3, 3))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\).*as many axes"):
        Tensor.ones(1, 1, 5).conv2d(Tensor.ones(1, 1, 3, 3))
    with pytest.raises(ValueError, match="channels"):
        Tensor.ones(1, 2, 5).conv2d(Tensor.ones(1, 3, 3))
    with pytest.raises(ValueError, match="bias"):
        Tensor.ones(1, 1, 5).conv2d(Tensor.ones(2, 1, 3), Tensor.ones(3))
    with pytest.raises(ValueError, match="stride"):
        Tensor.ones(1, 1, 5, 5, 5).conv2d(Tensor.ones(1, 1, 1, 1, 1), stride=(1, 2))
    with pytest.raises(ValueError, match="stride must be positive"):
        Tensor.ones(1, 1, 5).conv2d(Tensor.ones(1, 1, 1), stride=0)


# ---- pooling: ceil_mode, count_include_pad, divisor_override, return_indices ----

POOLS = [(2, 2, 0), (3, 2, 1), (3, 3, 1), ((2, 3), (2, 2), (1, 0)), (2, 1, 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool2d_arguments(device: str, pool: tuple, ceil_mode: bool,
                              count_include_pad: bool) -> None:
    kernel, stride, padding = pool
    kwargs = {"ceil_mode": ceil_mode, "count_include_pad": count_include_pad}
    check(lambda x: x.avg_pool2d(kernel, stride, padding, **kwargs),
          lambda x: F.avg_pool2d(x, kernel, stride, padding, **kwargs), [(2, 2, 7, 6)], device)


@pytest.mark.parametrize("device", DEVICES)
def test_avg_pool_divisor_override_and_3d(device: str) -> None:
    check(lambda x: x.avg_pool2d(3, 2, 1, ceil_mode=True, divisor_override=5),
          lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, divisor_override=5),
          [(1, 2, 6, 5)], device)
    check(lambda x: x.avg_pool2d((2, 2, 3), ceil_mode=True),
          lambda x: F.avg_pool3d(x, (2, 2, 3), ceil_mode=True), [(1, 2, 5, 4, 7)], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pool", [(2, 2, 0, 1), (3, 2, 1, 1), (3, 2, 1, 2), (2, 1, 1, 1)])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool2d_ceil_mode_and_indices(device: str, pool: tuple, ceil_mode: bool) -> None:
    kernel, stride, padding, dilation = pool
    check(lambda x: x.max_pool2d(kernel, stride, padding, dilation, ceil_mode=ceil_mode,
                                 return_indices=True),
          lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil_mode,
                                 return_indices=True), [(2, 2, 7, 6)], device)


@pytest.mark.parametrize("device", DEVICES)
def test_max_pool_indices_take_the_first_of_a_tie(device: str) -> None:
    x = np.array([[[[1, 3, 3, 0], [3, 2, 0, 0], [5, 5, 1, 1], [5, 5, 1, 1]]]], np.float32)
    # (no gradients: on a tie tinyteach, as tinygrad, splits the gradient among the maxima,
    # where PyTorch gives all of it to the index it returns)
    check(lambda t: t.max_pool2d(2, return_indices=True),
          lambda t: F.max_pool2d(t, 2, return_indices=True), [x], device, grad=False)
    check(lambda t: t.max_pool2d((2, 2, 2), return_indices=True),
          lambda t: F.max_pool3d(t, 2, return_indices=True), [(1, 2, 4, 4, 5)], device)


def test_pool_bad_arguments() -> None:
    with pytest.raises(ValueError, match="half the kernel"):
        Tensor.ones(1, 1, 4, 4).max_pool2d(2, padding=2)
    with pytest.raises(ValueError, match="larger than the padded input"):
        Tensor.ones(1, 1, 2, 2).avg_pool2d(3)
    with pytest.raises(ValueError, match="kernel_size must be positive"):
        Tensor.ones(1, 1, 2, 2).avg_pool2d(0)
    with pytest.raises(ValueError, match="divisor_override"):
        Tensor.ones(1, 1, 2, 2).avg_pool2d(2, divisor_override=0)


# ---- pad(mode=) ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [(2, 1), (1, 2, 0, 3), (3, 0, 1, 1)])
def test_pad_modes(device: str, mode: str, padding: tuple[int, ...]) -> None:
    check(lambda x: x.pad(padding, mode=mode), lambda x: F.pad(x, padding, mode=mode),
          [(2, 4, 5)], device)


@pytest.mark.parametrize("device", DEVICES)
def test_pad_modes_pairs_and_value(device: str) -> None:
    check(lambda x: x.pad(((0, 0), (1, 2)), mode="reflect"),
          lambda x: F.pad(x, (1, 2), mode="reflect"), [(3, 4)], device)
    check(lambda x: x.pad((1, 1), value=2.5), lambda x: F.pad(x, (1, 1), value=2.5),
          [(3, 4)], device)
    check(lambda x: x.pad((1, 1), 2.5), lambda x: F.pad(x, (1, 1), value=2.5),
          [(3, 4)], device)  # tinygrad's older positional value


def test_pad_mode_bad_arguments() -> None:
    x = Tensor.ones(2, 3)
    with pytest.raises(ValueError, match="at most 2"):
        x.pad((3, 0), mode="reflect")  # reflect needs padding < size, as PyTorch
    with pytest.raises(ValueError, match="at most 3"):
        x.pad((4, 0), mode="circular")
    with pytest.raises(ValueError, match="pad mode must be"):
        x.pad((1, 1), mode="wrap")
    with pytest.raises(ValueError, match="no fill value"):
        x.pad((1, 1), mode="reflect", value=1.0)
    with pytest.raises(NotImplementedError, match="negative"):
        x.pad((-1, 1), mode="circular")  # tinygrad refuses it too


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("pads", [(-1, 2, 2, -1), (3, -3, 0, -3), (0, 0, 0, -5), (3, -5, 1, -4)])
def test_pad_edges_negative_crops(device: str, mode: str, pads: tuple[int, ...]) -> None:
    """A negative amount crops that side, after padding from the whole input's edges
    (PyTorch's rule)."""
    check(lambda x: x.pad(pads, mode=mode), lambda x: F.pad(x, pads, mode=mode),
          [(1, 1, 5, 5)], device=device)


# ---- dtype= of sum, prod, mean; Python types as dtypes ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sum", "prod", "mean"])
def test_reduce_dtype(device: str, op: str) -> None:
    data = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    ours = getattr(Tensor(data, device=device), op)(axis=1, dtype=dtypes.float64)
    theirs = getattr(torch.tensor(data), op)(dim=1, dtype=torch.float64)
    assert ours.dtype == dtypes.float64
    np.testing.assert_allclose(ours.numpy(), theirs.numpy())
    check(lambda x: getattr(x, op)(0, dtype="float64"),
          lambda x: getattr(x, op)(0, dtype=torch.float64), [(3, 2)], device)


def test_reduce_dtype_wraps_and_rejects() -> None:
    data = np.array([200, 100], dtype=np.int32)
    np.testing.assert_array_equal(Tensor(data).sum(dtype=dtypes.uint8).numpy(),
                                  torch.tensor(data).sum(dtype=torch.uint8).numpy())
    np.testing.assert_array_equal(Tensor(data).prod(dtype="int16").numpy(),
                                  torch.tensor(data).prod(dtype=torch.int16).numpy())
    with pytest.raises(TypeError, match="float dtype"):
        Tensor(data).mean(dtype=dtypes.int32)
    with pytest.raises(TypeError, match="unknown dtype"):
        Tensor(data).sum(dtype="float128")


def test_python_types_as_dtypes() -> None:
    for python_type, torch_dtype in [(float, torch.float64), (int, torch.int64),
                                     (bool, torch.bool)]:
        ours = Tensor([1, 0], dtype=python_type)
        theirs = torch.tensor([1, 0], dtype=python_type)
        assert ours.dtype.np == torch.empty(0, dtype=torch_dtype).numpy().dtype
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
        np.testing.assert_array_equal(Tensor([1.5, -2.5]).cast(python_type).numpy(),
                                      torch.tensor([1.5, -2.5]).to(python_type).numpy())


# ---- settings: Context(DEFAULT_FLOAT=), getenv, GlobalCounters, Device.DEFAULT ----

def test_context_default_float() -> None:
    with Context(DEFAULT_FLOAT="HALF"):
        assert Tensor([1.5]).dtype == dtypes.float16
        assert (Tensor([1]) / 2).dtype == dtypes.float16
        with Context(DEFAULT_FLOAT=dtypes.float64):
            assert Tensor.ones(2).dtype == dtypes.float64
        assert Tensor.rand(2).dtype == dtypes.float16
    assert Tensor([1.5]).dtype == dtypes.float32
    with pytest.raises(ValueError, match="float dtype"):
        with Context(DEFAULT_FLOAT="int32"):
            pass
    with pytest.raises(ValueError, match="unknown dtype"):
        with Context(DEFAULT_FLOAT="float7"):
            pass
    assert dtypes.default_float == dtypes.float32


def test_getenv_and_top_level_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINYTEACH_TEST_SETTING", "12")
    assert tinyteach.getenv("TINYTEACH_TEST_SETTING") == 12
    assert tinyteach.getenv("TINYTEACH_TEST_SETTING", "") == "12"
    assert tinyteach.getenv("TINYTEACH_NOT_SET", 3) == 3
    tinyteach.GlobalCounters.reset()
    (Tensor([1.0, 2.0], device="CPU") + 1).realize()
    assert tinyteach.GlobalCounters.global_ops >= 2
    assert tinyteach.GlobalCounters.global_mem >= 16
    assert tinyteach.Device.DEFAULT in ("NUMPY", "CPU", "OPENCL", "WEBGPU", "CUDA", "PYTHON")


# ---- fancy indexing with lists and tuples of tensors ----

@pytest.mark.parametrize("device", DEVICES)
def test_fancy_indexing(device: str) -> None:
    rows, cols = np.array([0, 2, 2]), np.array([1, 1, 3])
    cases = [
        (lambda x: x[[0, 2]], lambda x: x[[0, 2]]),
        (lambda x: x[Tensor(rows, device=device), Tensor(cols, device=device)],
         lambda x: x[torch.tensor(rows), torch.tensor(cols)]),
        (lambda x: x[(Tensor(rows, device=device), Tensor(cols, device=device))],
         lambda x: x[(torch.tensor(rows), torch.tensor(cols))]),
        (lambda x: x[[0, 2], [1, -1]], lambda x: x[[0, 2], [1, -1]]),
        (lambda x: x[:, [3, 0]], lambda x: x[:, [3, 0]]),
    ]
    for ours, theirs in cases:
        check(ours, theirs, [(3, 4)], device)
    data = np.arange(12).reshape(3, 4)
    # a list of index tensors is one index tensor, as numpy reads it (PyTorch 2.13 still reads
    # it as a tuple, with a deprecation warning)
    other_rows = np.array([1, 0, 1])
    stacked = Tensor(data, device=device)[[Tensor(rows, device=device),
                                           Tensor(other_rows, device=device)]]
    np.testing.assert_array_equal(stacked.numpy(), data[np.stack([rows, other_rows])])
    mixed = Tensor(data, device=device)[[Tensor(rows, device=device), [0, 1, 1]]]
    np.testing.assert_array_equal(mixed.numpy(), data[np.stack([rows, [0, 1, 1]])])


def test_fancy_index_out_of_range() -> None:
    with pytest.raises(IndexError):
        Tensor.ones(3, 4)[[0, 3]]


# ---- state dicts: BatchNorm's num_batches_tracked ----

def test_batchnorm_state_dict_with_num_batches_tracked() -> None:
    torch_bn = torch.nn.BatchNorm2d(3)
    torch_bn.train()
    torch_bn(torch.randn(4, 3, 2, 2))
    torch_bn.eval()
    ours = nn.BatchNorm(3)
    state = {name: Tensor(value.detach().numpy()) for name, value in
             torch_bn.state_dict().items()}
    nn.state.load_state_dict(ours, state)
    x = np.random.default_rng(0).standard_normal((2, 3, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(ours(Tensor(x)).numpy(),
                               torch_bn(torch.tensor(x)).detach().numpy(), atol=1e-5)


# ---- dtype= of softmax, log_softmax, matmul, dot, linear, conv2d ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_dtype(device: str, op: str) -> None:
    check(lambda x: getattr(x, op)(0, dtype=dtypes.float64),
          lambda x: getattr(F, op)(x, 0, dtype=torch.float64), [(3, 4)], device)
    data = np.array([[1, 2, 3], [0, 0, 5]], dtype=np.int32)
    ours = getattr(Tensor(data, device=device), op)(dtype="float64")
    assert ours.dtype == dtypes.float64
    np.testing.assert_allclose(ours.numpy(), getattr(F, op)(torch.tensor(data), -1,
                                                            dtype=torch.float64).numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_dot_linear_dtype(device: str) -> None:
    check(lambda a, b: a.matmul(b, dtype=dtypes.float64),
          lambda a, b: a.double() @ b.double(), [(3, 4), (4, 2)], device)
    check(lambda a, b: a.dot(b, dtype="float64"), lambda a, b: a.double() @ b.double(),
          [(2, 3, 4), (4,)], device)
    check(lambda x, w, b: x.linear(w, b, dtype=dtypes.float64),
          lambda x, w, b: (x.double() @ w.double()) + b, [(2, 3), (3, 5), (5,)], device)
    a = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
    ours = Tensor(a, device=device).matmul(Tensor(a.T.copy(), device=device), dtype=dtypes.int32)
    assert ours.dtype == dtypes.int32
    np.testing.assert_array_equal(ours.numpy(), a.astype(np.int32) @ a.T.astype(np.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_dtype(device: str) -> None:
    check(lambda x, w: x.conv2d(w, padding=1, dtype=dtypes.float64),
          lambda x, w: F.conv2d(x.double(), w.double(), padding=1), [(1, 2, 4, 4), (3, 2, 3, 3)],
          device)


# ---- conv2d(padding="same" | "valid"), avg_pool2d(dilation=), cross_entropy(ignore_index=) ----

SAME_PADDING = [  # input, weight, dilation, torch function
    ((1, 2, 7), (3, 2, 4), 1, F.conv1d),
    ((1, 2, 6, 5), (2, 2, 3, 2), (2, 1), F.conv2d),
    ((1, 1, 4, 5, 3), (2, 1, 2, 3, 2), 1, F.conv3d),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(SAME_PADDING)))
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_conv_padding_same_and_valid(device: str, case: int, padding: str) -> None:
    x_shape, w_shape, dilation, torch_fn = SAME_PADDING[case]
    check(lambda x, w: x.conv2d(w, padding=padding, dilation=dilation),
          lambda x, w: torch_fn(x, w, padding=padding, dilation=dilation),
          [x_shape, w_shape], device, atol=1e-4)


def test_conv_padding_bad_names() -> None:
    x, w = Tensor.ones(1, 1, 5, 5), Tensor.ones(1, 1, 3, 3)
    with pytest.raises(ValueError, match="'same' needs stride 1"):
        x.conv2d(w, padding="same", stride=2)
    with pytest.raises(ValueError, match="'valid' or 'same'"):
        x.conv2d(w, padding="full")


@pytest.mark.parametrize("device", DEVICES)
def test_avg_pool2d_dilation(device: str) -> None:
    """An average with spaced taps is a convolution with a constant kernel (torch has no
    dilated avg_pool2d); padding=0 so that count_include_pad does not matter."""
    def theirs(x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        kernel = torch.full((1, 1, 2, 3), 1 / 6)
        out = F.conv2d(x.reshape(n * c, 1, h, w), kernel, stride=(2, 1), dilation=(2, 1))
        return out.reshape(n, c, *out.shape[2:])
    check(lambda x: x.avg_pool2d((2, 3), (2, 1), dilation=(2, 1)),
          theirs, [(2, 2, 8, 6)], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_cross_entropy_ignore_index(device: str, smoothing: float) -> None:
    labels = np.array([1, -100, 3, 0], dtype=np.int32)
    check(lambda x, y: x.cross_entropy(y, ignore_index=-100, label_smoothing=smoothing),
          lambda x, y: F.cross_entropy(x, y.long(), ignore_index=-100,
                                       label_smoothing=smoothing), [(4, 5), labels], device)


# ---- softplus(threshold=), scaled_dot_product_attention(scale=) ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("beta, threshold", [(1.0, 20.0), (2.0, 3.0), (0.5, 1.0)])
def test_softplus_threshold(device: str, beta: float, threshold: float) -> None:
    check(lambda x: x.softplus(beta, threshold), lambda x: F.softplus(x, beta, threshold),
          [(4, 6)], device, low=-10, high=10)
    big = np.array([-200.0, 0.0, 100.0, 200.0], dtype=np.float32)  # exp would overflow
    check(lambda x: x.softplus(beta, threshold), lambda x: F.softplus(x, beta, threshold),
          [big], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_attention_scale(device: str, scale: float | None) -> None:
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True, scale=scale),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale),
          [(2, 4, 3), (2, 4, 3), (2, 4, 5)], device)


# ---- cross_entropy(weight=), squeeze(tuple of dims) ----

CLASS_WEIGHT = np.array([0.5, 2.0, 1.0, 0.1, 3.0], dtype=np.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
@pytest.mark.parametrize("probabilities", [False, True])
def test_cross_entropy_class_weight(device: str, reduction: str, smoothing: float,
                                    probabilities: bool) -> None:
    if probabilities:
        target = np.random.default_rng(7).dirichlet(np.ones(5), size=5).astype(np.float32)
        torch_target = torch.tensor(target)
    else:
        target = np.array([1, 4, 3, 1, 0], dtype=np.int32)
        torch_target = torch.tensor(target).long()
    check(lambda x: x.cross_entropy(Tensor(target, device=device), reduction=reduction,
                                    label_smoothing=smoothing,
                                    weight=Tensor(CLASS_WEIGHT, device=device)),
          lambda x: F.cross_entropy(x, torch_target, reduction=reduction,
                                    label_smoothing=smoothing, weight=torch.tensor(CLASS_WEIGHT)),
          [(5, 5)], device)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_class_weight_and_ignore_index(device: str) -> None:
    ignored = np.array([1, -100, 3, 1, -100], dtype=np.int32)
    check(lambda x: x.cross_entropy(Tensor(ignored, device=device), ignore_index=-100,
                                    weight=Tensor(CLASS_WEIGHT, device=device)),
          lambda x: F.cross_entropy(x, torch.tensor(ignored).long(), ignore_index=-100,
                                    weight=torch.tensor(CLASS_WEIGHT)), [(5, 5)], device)


def test_cross_entropy_bad_weight() -> None:
    with pytest.raises(ValueError, match="class weight of shape"):
        Tensor.ones(2, 3).cross_entropy(Tensor([0, 1]), weight=Tensor([1.0, 2.0]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [(0, 2), (-1,), (1, 3), (0, 1, 2, 3), 2])
def test_squeeze_dims(device: str, dims: int | tuple[int, ...]) -> None:
    check(lambda x: x.squeeze(dims), lambda x: x.squeeze(dims), [(1, 3, 1, 2)], device)


def test_squeeze_bad_dims() -> None:
    with pytest.raises(IndexError, match="out of (range|bounds)"):
        Tensor.ones(2, 3).squeeze((0, 2))
    with pytest.raises(IndexError, match="out of (range|bounds)"):
        Tensor(1.0).squeeze(1)
    np.testing.assert_array_equal(Tensor(2.0).squeeze(0).numpy(), torch.tensor(2.0).squeeze(0))


# ---- conv_transpose2d over 1 or 3 spatial axes ----

TRANSPOSED = [  # input, weight, keyword arguments, torch function
    ((2, 4, 5), (4, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}, F.conv_transpose1d),
    ((1, 4, 6), (4, 1, 2), {"groups": 2, "dilation": 3}, F.conv_transpose1d),
    ((1, 2, 3, 2, 4), (2, 3, 2, 3, 2), {"stride": (2, 1, 3), "padding": (0, 1, 1)},
     F.conv_transpose3d),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(TRANSPOSED)))
def test_conv_transpose_any_number_of_spatial_axes(device: str, case: int) -> None:
    x_shape, w_shape, kwargs, torch_fn = TRANSPOSED[case]
    groups = kwargs.get("groups", 1)
    bias = (w_shape[1] * groups,)
    check(lambda x, w, b: x.conv_transpose2d(w, b, **kwargs),
          lambda x, w, b: torch_fn(x, w, b, **kwargs), [x_shape, w_shape, bias], device,
          atol=1e-4)


def test_conv_transpose_bad_arguments() -> None:
    with pytest.raises(ValueError, match="as many axes"):
        Tensor.ones(1, 2, 5).conv_transpose2d(Tensor.ones(2, 1, 3, 3))
    with pytest.raises(ValueError, match="stride"):
        Tensor.ones(1, 2, 5).conv_transpose2d(Tensor.ones(2, 1, 3), stride=(1, 2))
    with pytest.raises(ValueError, match="output_padding"):
        Tensor.ones(1, 2, 5).conv_transpose2d(Tensor.ones(2, 1, 3), stride=2, output_padding=2)
