"""dtypes: storage, arithmetic, promotion and casts; and the tensor's plain-data interface
(.numpy, .item, .tolist, .realize, .to, .detach, .contiguous) on every device."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import check, compare, skip_unless_supported

from tinyteach import Tensor, dtypes
from tinyteach.dtype import least_upper_dtype
from tinyteach.engine.schedule import is_contiguous_buffer

NAMES = ["bool", "int8", "uint8", "int16", "int32", "uint32", "int64", "uint64", "float16",
         "float32", "float64"]
TESTED = ["float32", "float16", "float64", "int8", "int32", "int64", "uint8", "uint32",
          "uint64", "bool"]


def sample(name: str, shape: tuple[int, ...] = (3, 4), seed: int = 0) -> np.ndarray:
    """Values that fit the dtype, with negatives for signed ones."""
    rng = np.random.default_rng(seed)
    if name == "bool":
        return rng.random(shape) > 0.5
    if name.startswith("float"):
        return rng.uniform(-4, 4, shape).astype(name)
    info = np.iinfo(name)
    return rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(name)


@pytest.mark.parametrize("name", TESTED)
def test_round_trip(device, name):
    skip_unless_supported(device, name)
    array = sample(name)
    t = Tensor(array, device=device)
    assert t.dtype == getattr(dtypes, name) and t.dtype.name == name
    out = t.numpy()
    assert out.dtype == array.dtype
    np.testing.assert_array_equal(out, array)
    np.testing.assert_array_equal(Tensor(array.tolist(), dtype=name, device=device).numpy(),
                                  array)


@pytest.mark.parametrize("name", TESTED)
def test_arithmetic_per_dtype(device, name):
    """+, *, max, sum, comparisons computed in the dtype itself, as numpy computes them."""
    skip_unless_supported(device, name)
    a, b = sample(name, seed=1), sample(name, seed=2)
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    tolerance = 1e-2 if name == "float16" else 1e-6
    if name == "bool":
        compare(ta | tb, a | b, 0, 0)
        compare(ta & tb, a & b, 0, 0)
    else:
        compare(ta + tb, a + b, tolerance, tolerance)
        compare(ta * tb, a * b, tolerance, tolerance)
        assert (ta + tb).dtype == ta.dtype
    compare(ta.maximum(tb), np.maximum(a, b), 0, 0)
    compare(ta < tb, a < b, 0, 0)
    compare(ta == tb, a == b, 0, 0)
    compare(ta.max(1), a.max(1), 0, 0)
    expected_sum = a.astype(np.float64).sum(1)
    compare(ta.sum(1), expected_sum, 0.05 if name == "float16" else 1e-5, 1e-3)


WRAPS = [  # (dtype, a, b): integer arithmetic wraps around as numpy's does
    ("int8", [127, -128, 100], [1, -1, 100]),
    ("uint8", [250, 0, 128], [10, 255, 128]),
    ("int32", [2**31 - 1, -2**31, 123456789], [1, -1, 1000]),
    ("uint32", [2**32 - 1, 3_000_000_000, 65536], [1, 3_000_000_000, 65536]),
    ("int64", [2**63 - 1, -2**62, 2**40], [1, -2**62, 2**30]),
    ("uint64", [2**64 - 1, 2**63, 2**40], [1, 2**63, 2**30]),
]


@pytest.mark.parametrize("name,a,b", WRAPS, ids=[w[0] for w in WRAPS])
def test_integer_wraparound(device, name, a, b):
    skip_unless_supported(device, name)
    x, y = np.array(a, dtype=name), np.array(b, dtype=name)
    tx, ty = Tensor(x, device=device), Tensor(y, device=device)
    with np.errstate(over="ignore"):  # numpy warns where it wraps (INT_MIN // -1 too)
        compare(tx + ty, x + y, 0, 0)
        compare(tx * ty, x * y, 0, 0)
        compare(tx - ty, x - y, 0, 0)
        compare(tx // ty, x // y, 0, 0)
        compare(tx % ty, x % y, 0, 0)
    compare(tx < ty, x < y, 0, 0)


def test_large_unsigned_values(device):
    skip_unless_supported(device, "uint64")
    big = np.array([2**64 - 1, 2**63 + 5], dtype=np.uint64)
    t = Tensor(big, device=device)
    assert t.tolist() == [2**64 - 1, 2**63 + 5]
    assert t.max().item() == 2**64 - 1
    compare(t // 3, big // 3, 0, 0)


def test_float16(device):
    skip_unless_supported(device, "float16")
    x = sample("float16")
    torch = pytest.importorskip("torch")
    t = Tensor(x, device=device)
    reference = torch.tensor(x.astype(np.float32))
    compare(t.exp(), reference.exp(), 0.02, 2e-3)
    compare(t.softmax(-1), reference.softmax(-1), 2e-3, 5e-3)
    assert t.exp().dtype == dtypes.float16
    assert t.sum().dtype == dtypes.float16
    compare(t.sum(), reference.sum(), 0.05, 2e-3)


def test_float64(device):
    skip_unless_supported(device, "float64")
    x = np.array([1.0 + 1e-12, 1e300, -2.5], dtype=np.float64)
    t = Tensor(x, device=device)
    compare(t * 2, x * 2, 0, 0)
    assert (t - 1).numpy()[0] == pytest.approx(1e-12, rel=1e-3)
    compare(t.exp()[2:], np.exp(x[2:]), 0, 1e-12)


# ---- promotion ----

def _torch_result_type(a: str, b: str):
    torch = pytest.importorskip("torch")
    try:
        result = torch.result_type(torch.zeros(1, dtype=getattr(torch, a)),
                                   torch.zeros(1, dtype=getattr(torch, b)))
    except (RuntimeError, TypeError):
        return None  # torch has no promotion for some unsigned pairs
    return str(result).replace("torch.", "")


@pytest.mark.parametrize("a,b", list(itertools.combinations_with_replacement(NAMES, 2)),
                         ids="-".join)
def test_promotion_lattice(a, b):
    """least_upper_dtype agrees with torch where torch defines it; else with numpy, except
    signed + uint64, which tinygrad's lattice sends to float16 (numpy: float64)."""
    ours = least_upper_dtype(getattr(dtypes, a), getattr(dtypes, b)).name
    assert ours == least_upper_dtype(getattr(dtypes, b), getattr(dtypes, a)).name
    theirs = _torch_result_type(a, b)
    if theirs is not None:
        assert ours == theirs
    elif "uint64" in (a, b) and {a, b} & {"int8", "int16", "int32", "int64"}:
        assert ours == "float16"
    else:
        assert ours == np.result_type(np.dtype(a if a != "bool" else "?"),
                                      np.dtype(b if b != "bool" else "?")).name


PROMOTION_PAIRS = [("int8", "uint8"), ("int32", "float16"), ("bool", "int32"),
                   ("uint8", "float32"), ("int32", "int64"), ("float16", "float64"),
                   ("uint32", "int32"), ("bool", "float32")]


@pytest.mark.parametrize("a,b", PROMOTION_PAIRS, ids="-".join)
def test_promotion_in_ops(device, a, b):
    """Binary ops compute in the promoted dtype, with the values numpy gives in that dtype."""
    skip_unless_supported(device, a, b)
    x, y = sample(a, seed=3), sample(b, seed=4)
    result = Tensor(x, device=device) + Tensor(y, device=device)
    wanted = least_upper_dtype(getattr(dtypes, a), getattr(dtypes, b))
    skip_unless_supported(device, wanted)
    assert result.dtype == wanted
    expected = x.astype(wanted.np) + y.astype(wanted.np)
    if wanted == dtypes.bool:
        expected = x | y
    compare(result, expected, 1e-2 if wanted == dtypes.float16 else 0, 1e-3)


def test_python_scalar_promotion(device):
    ints = Tensor([1, 2], device=device)
    assert (ints + 1).dtype == dtypes.int32
    assert (ints + 1.5).dtype == dtypes.float32
    assert (ints * True).dtype == dtypes.int32
    bools = Tensor([True, False], device=device)
    assert (bools + 1).dtype == dtypes.int32
    assert (bools * 1.5).dtype == dtypes.float32
    small = Tensor(np.array([1, 2], np.int8), device=device)
    assert (small + 1).dtype == dtypes.int8
    assert (small / 2).dtype == dtypes.float32
    if "float16" not in getattr(__import__("tinyteach").Device[device], "unsupported_dtypes",
                                {}):
        halves = Tensor(np.array([1, 2], np.float16), device=device)
        assert (halves * 2.5).dtype == dtypes.float16
    assert Tensor([1.0], device=device).dtype == dtypes.default_float == dtypes.float32


def test_default_float_can_change(device):
    skip_unless_supported(device, "float64")
    previous = dtypes.default_float
    try:
        dtypes.default_float = dtypes.float64
        assert Tensor([1.5], device=device).dtype == dtypes.float64
        assert Tensor.ones(2, device=device).dtype == dtypes.float64
        assert (Tensor([1, 2], device=device) / 2).dtype == dtypes.float64
    finally:
        dtypes.default_float = previous


# ---- casts ----

CASTS = [("float32", "int32"), ("float32", "int8"), ("float32", "uint8"),
         ("float32", "bool"), ("int32", "float32"), ("int32", "int8"), ("int32", "uint8"),
         ("bool", "float32"), ("bool", "int32"), ("uint8", "int8"), ("float32", "float16"),
         ("float64", "float32"), ("int64", "int32"), ("float32", "uint32")]


@pytest.mark.parametrize("source,target", CASTS, ids="->".join)
def test_cast(device, source, target):
    skip_unless_supported(device, source, target)
    x = sample(source, seed=5)
    if source.startswith("float") and target.startswith("uint"):
        # (numpy's astype, the expected value here, is undefined for negative floats; ours
        # saturate to 0: tests/test_cast_saturation.py)
        x = np.abs(x)
    ours = Tensor(x, device=device).cast(getattr(dtypes, target))
    assert ours.dtype == getattr(dtypes, target)
    with np.errstate(invalid="ignore"):
        expected = x.astype(target if target != "bool" else np.bool_)
    compare(ours, expected, 0, 0)
    assert Tensor(x, device=device).cast(target).dtype.name == target  # names work too


def test_cast_helpers_and_gradient(device):
    t = Tensor([1.7, -2.2], device=device)
    assert t.int().tolist() == [1, -2]
    assert t.bool().tolist() == [True, True]
    assert Tensor([0, 3], device=device).float().tolist() == [0.0, 3.0]
    assert t.cast(dtypes.float32) is t  # casting to the same dtype is free
    pytest.importorskip("torch")
    skip_unless_supported(device, "float64")
    check(lambda x: (x.cast(dtypes.float64) * 2).cast(dtypes.float32),
          lambda x: (x.double() * 2).float(), [(3,)], device)


# ---- the plain-data interface ----

def test_numpy_item_tolist(device):
    t = Tensor([[1.5, 2.0], [3.0, 4.0]], device=device)
    array = t.numpy()
    assert isinstance(array, np.ndarray) and array.dtype == np.float32 and array.shape == (2, 2)
    array[0, 0] = 100.0  # a copy: the tensor is unchanged
    assert t.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert t.sum().item() == 10.5 and isinstance(t.sum().item(), float)
    count = Tensor([1, 2, 3], device=device).sum().item()
    assert count == 6 and isinstance(count, int)
    flag = Tensor([1, 2], device=device).any().item()
    assert flag is True
    assert Tensor([[7]], device=device).item() == 7
    with pytest.raises(ValueError, match="item"):
        t.item()
    assert t.T.numpy().tolist() == [[1.5, 3.0], [2.0, 4.0]]  # views come out in order


def test_shape_dtype_device(device):
    t = Tensor.zeros(2, 3, 4, device=device)
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24
    assert t.dtype == dtypes.float32 and t.device == device
    assert len(t) == 2 and t.size(1) == 3 and t.size() == (2, 3, 4)
    assert t.permute(2, 0, 1).shape == (4, 2, 3)
    assert Tensor(1.0, device=device).shape == ()


def test_realize(device):
    a = Tensor([1.0, 2.0], device=device) + 1
    assert not is_contiguous_buffer(a.uop)
    assert a.realize() is a
    assert is_contiguous_buffer(a.uop)
    assert a.tolist() == [2.0, 3.0]
    b, c = a * 2, a - 1
    Tensor.realize(b, c)
    assert is_contiguous_buffer(b.uop) and is_contiguous_buffer(c.uop)
    assert b.tolist() == [4.0, 6.0] and c.tolist() == [1.0, 2.0]
    b.realize()  # realizing twice is harmless
    assert b.tolist() == [4.0, 6.0]


def test_to_device(device):
    other = "NUMPY" if device != "NUMPY" else "CPU"
    t = Tensor([[1.0, 2.0], [3.0, 4.0]], device=device, requires_grad=True)
    moved = (t * 2).to(other)
    assert moved.device == other
    assert moved.tolist() == [[2.0, 4.0], [6.0, 8.0]]
    assert t.to(device) is t
    (moved.to(device) * moved.to(device)).sum().backward()  # gradients flow back across
    compare(t.grad, 8 * np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), 0, 0)
    with pytest.raises(RuntimeError, match="different devices"):
        t + Tensor([1.0], device=other)


def test_detach_contiguous(device):
    pytest.importorskip("torch")
    check(lambda x: x * x.detach(), lambda x: x * x.detach(), [(3, 4)], device)
    check(lambda x: x.T.contiguous() * 3, lambda x: x.T.contiguous() * 3, [(3, 4)], device)
    t = Tensor([1.0, 2.0], device=device, requires_grad=True)
    assert not t.detach().requires_grad
    assert t.detach().tolist() == [1.0, 2.0]
    view = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device).T
    compare(view.contiguous(), np.arange(6).reshape(2, 3).T.astype(np.float32), 0, 0)
    assert is_contiguous_buffer(view.contiguous().realize().uop)
