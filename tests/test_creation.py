"""Creating tensors: from data, constants, ranges, and random numbers, on every device."""
from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import compare, skip_unless_supported

from tinyteach import Tensor, dtypes

# ---- from data ----

def test_from_list(device):
    t = Tensor([[1, 2, 3], [4, 5, 6]], device=device)
    assert t.shape == (2, 3) and t.dtype == dtypes.int32 and t.device == device
    assert t.tolist() == [[1, 2, 3], [4, 5, 6]]
    f = Tensor([1.5, 2, 3], device=device)
    assert f.dtype == dtypes.float32
    compare(f, np.array([1.5, 2, 3], np.float32), 0, 0)
    b = Tensor([True, False], device=device)
    assert b.dtype == dtypes.bool and b.tolist() == [True, False]
    assert Tensor([], device=device).shape == (0,)


def test_from_list_with_dtype(device):
    t = Tensor([1, 2, 3], dtype=dtypes.float32, device=device)
    assert t.dtype == dtypes.float32 and t.tolist() == [1.0, 2.0, 3.0]
    t = Tensor([1.7, -2.2], dtype="int32", device=device)
    assert t.dtype == dtypes.int32 and t.tolist() == [1, -2]
    t = Tensor([0, 2], dtype=dtypes.bool, device=device)
    assert t.tolist() == [False, True]


def test_from_ndarray(device):
    for dtype in (np.float32, np.int32, np.uint8, np.bool_, np.int8):
        array = (np.arange(6).reshape(2, 3) % 3).astype(dtype)
        t = Tensor(array, device=device)
        assert t.dtype == dtypes.from_np(np.dtype(dtype)) and t.shape == (2, 3)
        compare(t, array, 0, 0)
    array = np.arange(6, dtype=np.float32)
    t = Tensor(array, device=device)
    array[0] = 100  # the tensor holds a copy
    assert t.tolist()[0] == 0
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2].T  # not contiguous
    compare(Tensor(strided, device=device), strided, 0, 0)
    compare(Tensor(np.arange(4), dtype=dtypes.int32, device=device), np.arange(4), 0, 0)


def test_from_scalar(device):
    for value, dtype in ((3, dtypes.int32), (2.5, dtypes.float32), (True, dtypes.bool)):
        t = Tensor(value, device=device)
        assert t.shape == () and t.dtype == dtype and t.item() == value
    t = Tensor(3, dtype=dtypes.float32, device=device)
    assert t.dtype == dtypes.float32 and t.item() == 3.0
    assert Tensor(np.float32(1.5), device=device).item() == 1.5


def test_requires_grad_flag(device):
    t = Tensor([1.0, 2.0], device=device, requires_grad=True)
    assert t.requires_grad
    (t * t).sum().backward()
    assert t.grad.tolist() == [2.0, 4.0]
    assert Tensor([1.0], device=device).requires_grad is None
    assert Tensor.ones(2, device=device, requires_grad=True).requires_grad
    for made in (Tensor.eye(2, device=device, requires_grad=True),
                 Tensor.linspace(0, 1, 3, device=device, requires_grad=True),
                 Tensor.arange(0.0, 1.0, 0.5, device=device, requires_grad=True),
                 Tensor.zeros(2, device=device, requires_grad=True)):
        assert made.requires_grad and made.device == device
        (made * 2).sum().backward()
        compare(made.grad, np.full(made.shape, 2.0, np.float32), 0, 0)
    # equal constants are one shared node in the graph, but two parameters stay two leaves
    a = Tensor.zeros(2, device=device, requires_grad=True)
    b = Tensor.zeros(2, device=device, requires_grad=True)
    (a + 3 * b).sum().backward()
    assert a.grad.tolist() == [1.0, 1.0] and b.grad.tolist() == [3.0, 3.0]


# ---- constants and ranges ----

def test_zeros_ones_full_empty(device):
    compare(Tensor.zeros(2, 3, device=device), np.zeros((2, 3), np.float32), 0, 0)
    compare(Tensor.zeros((2, 3), device=device), np.zeros((2, 3), np.float32), 0, 0)
    compare(Tensor.ones(4, device=device), np.ones(4, np.float32), 0, 0)
    compare(Tensor.ones(2, 2, dtype=dtypes.int32, device=device), np.ones((2, 2), np.int32),
            0, 0)
    compare(Tensor.full((2, 3), 7, device=device), np.full((2, 3), 7, np.int32), 0, 0)
    compare(Tensor.full((2,), 2.5, device=device), np.full(2, 2.5, np.float32), 0, 0)
    compare(Tensor.full((3,), 1, dtype=dtypes.float32, device=device), np.ones(3, np.float32),
            0, 0)
    compare(Tensor.full((), -1.0, device=device), np.array(-1.0, np.float32), 0, 0)
    empty = Tensor.empty(2, 5, device=device)
    assert empty.shape == (2, 5) and empty.dtype == dtypes.float32 and empty.device == device
    assert empty.numpy().shape == (2, 5)
    assert Tensor.empty(3, dtype=dtypes.int32, device=device).dtype == dtypes.int32
    assert Tensor.zeros(0, 3, device=device).numpy().shape == (0, 3)


ARANGES = [(5,), (2, 9), (0, 10, 3), (10, 0, -3), (5, -3, -2), (0, 0), (3, 1),
           (0, 100), (1.0, 0.0, -0.25), (0.5, 3.0), (-1, 1, 0.4), (0, 1, 0.1)]


@pytest.mark.parametrize("args", ARANGES, ids=str)
def test_arange(device, args):
    ours = Tensor.arange(*args, device=device)
    expected = np.arange(*args)
    is_int = all(isinstance(a, int) for a in args)
    assert ours.dtype == (dtypes.int32 if is_int else dtypes.float32)
    compare(ours, expected.astype(np.int32 if is_int else np.float32), 1e-6, 1e-6)


def test_arange_dtype(device):
    compare(Tensor.arange(4, dtype=dtypes.float32, device=device), np.arange(4, dtype=np.float32),
            0, 0)
    compare(Tensor.arange(1, 7, 2, dtype=dtypes.uint8, device=device),
            np.arange(1, 7, 2, dtype=np.uint8), 0, 0)
    with pytest.raises(ValueError, match="step"):
        Tensor.arange(0, 5, 0)


@pytest.mark.parametrize("args", [(0, 1, 5), (-2, 3, 11), (1, 0, 4), (3, 3, 1), (0, 1, 0),
                                  (0.0, 10.0, 101)], ids=str)
def test_linspace(device, args):
    compare(Tensor.linspace(*args, device=device), np.linspace(*args, dtype=np.float32),
            1e-6, 1e-6)


def test_linspace_matches_torch(device):
    torch = pytest.importorskip("torch")
    compare(Tensor.linspace(-1, 1, 7, device=device), torch.linspace(-1, 1, 7), 1e-6, 1e-6)


def test_eye(device):
    compare(Tensor.eye(3, device=device), np.eye(3, dtype=np.float32), 0, 0)
    compare(Tensor.eye(2, 4, device=device), np.eye(2, 4, dtype=np.float32), 0, 0)
    compare(Tensor.eye(4, 2, dtype=dtypes.int32, device=device), np.eye(4, 2, dtype=np.int32),
            0, 0)


def test_like(device):
    base = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3), device=device)
    for made, value in ((base.zeros_like(), 0), (base.ones_like(), 1),
                        (base.full_like(7), 7)):
        assert made.shape == (2, 3) and made.dtype == dtypes.int32 and made.device == device
        compare(made, np.full((2, 3), value, np.int32), 0, 0)
    floats = base.ones_like(dtype=dtypes.float32)
    assert floats.dtype == dtypes.float32
    x = Tensor.zeros(3, 4, device=device)
    r = x.rand_like()
    assert r.shape == (3, 4) and r.dtype == dtypes.float32 and r.device == device
    assert x.randn_like().shape == (3, 4)


# ---- random numbers ----

N = 20000


def test_rand(device):
    Tensor.manual_seed(0)
    values = Tensor.rand(N, device=device).numpy()
    assert values.dtype == np.float32 and values.min() >= 0 and values.max() < 1
    assert abs(values.mean() - 0.5) < 0.01
    assert abs(values.var() - 1 / 12) < 0.005
    assert len(np.unique(values)) > N * 0.99
    assert Tensor.rand(2, 3, device=device).shape == (2, 3)
    assert Tensor.rand((2, 3), device=device).shape == (2, 3)


def test_randn(device):
    Tensor.manual_seed(1)
    values = Tensor.randn(N, device=device).numpy()
    assert np.isfinite(values).all()
    assert abs(values.mean()) < 0.03
    assert abs(values.std() - 1) < 0.03
    # about 68% within one standard deviation, 95% within two
    assert abs((np.abs(values) < 1).mean() - 0.6827) < 0.02
    assert abs((np.abs(values) < 2).mean() - 0.9545) < 0.01


def test_randint(device):
    Tensor.manual_seed(2)
    values = Tensor.randint(N, low=-3, high=5, device=device)
    assert values.dtype == dtypes.int32
    array = values.numpy()
    assert set(np.unique(array)) == set(range(-3, 5))
    counts = np.bincount(array + 3) / N
    assert np.abs(counts - 1 / 8).max() < 0.02
    assert Tensor.randint(2, 3, high=4, device=device).shape == (2, 3)


def test_uniform_normal(device):
    Tensor.manual_seed(3)
    u = Tensor.uniform(N, low=-2.0, high=6.0, device=device).numpy()
    assert u.min() >= -2.0 and u.max() < 6.0 and abs(u.mean() - 2.0) < 0.1
    n = Tensor.normal(N, mean=3.0, std=0.5, device=device).numpy()
    assert abs(n.mean() - 3.0) < 0.02 and abs(n.std() - 0.5) < 0.02
    assert Tensor.uniform(3, 4, device=device, requires_grad=True).requires_grad


@pytest.mark.parametrize("shape", [(64, 32), (16, 8, 3, 3)], ids=str)
def test_kaiming_glorot_bounds(device, shape):
    torch = pytest.importorskip("torch")
    fan_in = math.prod(shape[1:])
    fan_out = shape[0] * math.prod(shape[2:])
    # PyTorch's kaiming_uniform_ bound with leaky_relu slope a=0.01 (tinygrad's default)
    kaiming = torch.nn.init.calculate_gain("leaky_relu", 0.01) * math.sqrt(3 / fan_in)
    values = Tensor.kaiming_uniform(*shape, device=device).numpy()
    assert values.shape == shape
    assert np.abs(values).max() <= kaiming * (1 + 1e-6)
    assert np.abs(values).max() > 0.9 * kaiming
    # tinygrad's glorot_uniform uses shape[0] + prod(shape[1:]); equal to torch's for 2-d
    glorot = math.sqrt(6 / (shape[0] + fan_in))
    values = Tensor.glorot_uniform(*shape, device=device).numpy()
    assert np.abs(values).max() <= glorot * (1 + 1e-6)
    assert np.abs(values).max() > 0.9 * glorot
    if len(shape) == 2:
        assert math.isclose(glorot, math.sqrt(6 / (fan_in + fan_out)))


def test_manual_seed_reproducible(device):
    Tensor.manual_seed(42)
    first = [Tensor.rand(7, device=device).numpy(), Tensor.randn(3, 2, device=device).numpy()]
    Tensor.manual_seed(42)
    second = [Tensor.rand(7, device=device).numpy(), Tensor.randn(3, 2, device=device).numpy()]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0][:3], first[1].reshape(-1)[:3])
    Tensor.manual_seed(43)
    assert not np.array_equal(Tensor.rand(7, device=device).numpy(), first[0])


def test_manual_seed_same_on_every_device(device):
    """Random numbers come from integer hashing on the device: identical everywhere."""
    results = {}
    for name in ("NUMPY", device):
        Tensor.manual_seed(7)
        results[name] = (Tensor.rand(50, device=name).numpy(),
                         Tensor.randint(20, high=1000, device=name).numpy(),
                         Tensor.randn(10, device=name).numpy())
    for ours, reference in zip(results[device], results["NUMPY"]):
        np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(results[device][0], results["NUMPY"][0])
    np.testing.assert_array_equal(results[device][1], results["NUMPY"][1])


def test_random_float64(device):
    skip_unless_supported(device, dtypes.float64)
    Tensor.manual_seed(5)
    values = Tensor.rand(1000, dtype=dtypes.float64, device=device).numpy()
    assert values.dtype == np.float64 and 0 <= values.min() and values.max() < 1
