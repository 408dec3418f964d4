"""tinygrad's Tensor API beyond the basics (issue 13), part 2: named forms of the operators,
properties, creation, reductions, movement, cumulative ops, einsum, losses, attention and
sorting — forward and backward against PyTorch, with edge cases and errors.

Runs on NUMPY and CPU only (the shared machine's cores); tests/test_ops.py runs every device.
"""
from __future__ import annotations

from collections.abc import Iterator

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


# ---- the named forms of the operators, and functions tests elsewhere reach by name only ----

def test_named_arithmetic(device: str) -> None:
    check(lambda a, b: a.add(b), torch.add, [(3, 4), (4,)], device)
    check(lambda a, b: a.sub(b), torch.sub, [(3, 4), (3, 1)], device)
    check(lambda a, b: a.mul(b), torch.mul, [(3, 4), (3, 4)], device)
    check(lambda a, b: a.div(b), torch.div, [(3, 4), (3, 4)], device, low=0.5, high=2.0)
    check(lambda a: a.pow(3), lambda a: a.pow(3), [(3, 4)], device)
    check(lambda a, b: a.pow(b), torch.pow, [(3, 4), (3, 4)], device, low=0.5, high=2.0)
    check(lambda a: a.neg(), torch.neg, [(5,)], device)
    check(lambda a, b: a.matmul(b), torch.matmul, [(3, 4), (4, 2)], device)
    compare(Tensor([1, 2], device=device).add(3, reverse=True), [4, 3 + 2], 0, 0)


def test_named_unary(device: str) -> None:
    check(lambda a: a.tan(), torch.tan, [(3, 4)], device, low=-1.2, high=1.2)
    check(lambda a: a.elu(), F.elu, [(3, 4)], device)
    check(lambda a: a.swish(), F.silu, [(3, 4)], device)
    check(lambda a: a.softplus(), F.softplus, [(3, 4)], device)
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.7], dtype=np.float32)
    for name in ("ceil", "floor", "round"):
        compare(getattr(Tensor(x, device=device), name)(), getattr(torch, name)(torch.tensor(x)),
                0, 0, name)
    compare(Tensor(x, device=device).ceil(), np.ceil(x), 0, 0)
    compare(Tensor(x, device=device).floor(), np.floor(x), 0, 0)
    compare(Tensor(x, device=device).round(), np.round(x), 0, 0)
    half = Tensor(x, device=device).half()
    assert half.dtype == dtypes.float16
    compare(half, x.astype(np.float16), 0, 0)


# ---- properties and in-place changes ----

@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "int16", "int64",
                                   "uint8", "bool"])
def test_sizes_and_kinds(device: str, dtype: str) -> None:
    t = Tensor.zeros(2, 3, dtype=dtype, device=device)
    theirs = torch.zeros(2, 3, dtype=getattr(torch, dtype))
    assert t.element_size() == theirs.element_size()
    assert t.nbytes() == theirs.nbytes
    assert t.is_floating_point() == theirs.is_floating_point()
    assert Tensor.ones(0, 4, dtype=dtype, device=device).nbytes() == 0


def test_short(device: str) -> None:
    x = np.array([-300.7, -1.5, 0.0, 2.9, 32767.0], dtype=np.float32)
    ours = Tensor(x, device=device).short()
    assert ours.dtype == dtypes.int16
    compare(ours, torch.tensor(x).short(), 0, 0)


def test_data_is_a_memoryview(device: str) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    view = (Tensor(x, device=device) * 2).data()
    assert isinstance(view, memoryview)
    assert view.shape == (2, 3) and view.format == "f"
    assert view.tolist() == (x * 2).tolist()
    assert Tensor([True, False], device=device).data().tolist() == [True, False]


def test_replace(device: str) -> None:
    t = Tensor([1.0, 2.0], device=device)
    t2 = t
    assert t.replace(Tensor([5.0, 6.0], device=device) + 1) is t2
    assert t.tolist() == [6.0, 7.0]
    with pytest.raises(ValueError, match="does not match"):
        t.replace(Tensor([1.0, 2.0, 3.0], device=device))
    with pytest.raises(ValueError, match="does not match"):
        t.replace(Tensor([1, 2], device=device))


def test_to_in_place() -> None:
    t = Tensor([1.0, 2.0], device="NUMPY") * 3
    same = t
    assert t.to_("CPU") is same
    assert t.device == "CPU" and t.tolist() == [3.0, 6.0]
    assert (t + Tensor([1.0, 1.0], device="CPU")).tolist() == [4.0, 7.0]


# ---- creation ----

def test_scaled_uniform(device: str) -> None:
    Tensor.manual_seed(1)
    t = Tensor.scaled_uniform(64, 50, device=device)
    bound = (64 * 50) ** -0.5
    values = t.numpy()
    assert t.shape == (64, 50) and np.abs(values).max() <= bound
    np.testing.assert_allclose(values.std(), bound / np.sqrt(3), rtol=0.05)


def test_kaiming_normal_and_xavier_uniform(device: str) -> None:
    Tensor.manual_seed(2)
    shape = (256, 16, 3, 3)
    std = torch.nn.init.calculate_gain("leaky_relu", 0.01) / np.sqrt(16 * 9)
    np.testing.assert_allclose(Tensor.kaiming_normal(*shape, device=device).numpy().std(), std,
                               rtol=0.03)
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    bound = 2.0 * np.sqrt(6 / (fan_in + fan_out))
    values = Tensor.xavier_uniform(*shape, gain=2.0, device=device).numpy()
    assert np.abs(values).max() <= bound and np.abs(values).max() > 0.99 * bound
    np.testing.assert_allclose(values.std(), bound / np.sqrt(3), rtol=0.03)
    with pytest.raises(ValueError, match="2 dimensions"):
        Tensor.xavier_uniform(5)


def test_randperm(device: str) -> None:
    Tensor.manual_seed(3)
    for n in (0, 1, 2, 7, 100):
        perm = Tensor.randperm(n, device=device)
        assert perm.dtype == dtypes.int32 and perm.shape == (n,)
        assert sorted(perm.tolist()) == list(range(n))
    assert Tensor.randperm(100).tolist() != Tensor.randperm(100).tolist()
    assert Tensor.randperm(5, dtype=dtypes.int64).dtype == dtypes.int64
    with pytest.raises(ValueError, match="non-negative"):
        Tensor.randperm(-1)
    with pytest.raises(TypeError, match="gradients"):
        Tensor.randperm(3, requires_grad=True)


def test_randperm_hits_every_permutation() -> None:
    """60 draws of a permutation of 3 miss one of the 6 with probability 1e-4 if uniform."""
    Tensor.manual_seed(4)
    seen = {tuple(Tensor.randperm(3, device="NUMPY").tolist()) for _ in range(60)}
    assert len(seen) == 6


# ---- movement ----

@pytest.mark.parametrize("diagonal", [-1, 0, 2, 5])
def test_triu_tril(device: str, diagonal: int) -> None:
    check(lambda t: t.triu(diagonal), lambda t: torch.triu(t, diagonal), [(3, 5)], device)
    check(lambda t: t.tril(diagonal), lambda t: torch.tril(t, diagonal), [(2, 4, 3)], device)
    ints = np.arange(12, dtype=np.int32).reshape(4, 3)
    compare(Tensor(ints, device=device).triu(diagonal), np.triu(ints, diagonal), 0, 0)
    flags = np.ones((3, 3), dtype=bool)
    ours = Tensor(flags, device=device).tril(diagonal)
    assert ours.dtype == dtypes.bool
    compare(ours, np.tril(flags, diagonal), 0, 0)


@pytest.mark.parametrize("diagonal", [-9, -3, 0, 1, 9])
def test_triu_tril_keep_special_values(device: str, diagonal: int) -> None:
    """The mask is windows of a padded constant row: NaN, the infinities and -0.0 are kept
    (or zeroed) as torch does, in tall and wide matrices and past either corner."""
    values = np.array([np.nan, np.inf, -np.inf, -0.0, 1.5, -2.0, 3.0], dtype=np.float32)
    for shape in ((5, 7), (7, 5), (2, 4, 6)):
        x = np.resize(values, shape).astype(np.float32)
        for name in ("triu", "tril"):
            ours = getattr(Tensor(x, device=device), name)(diagonal).numpy()
            theirs = getattr(torch, name)(torch.tensor(x), diagonal).numpy()
            np.testing.assert_array_equal(ours, theirs)
            assert (np.signbit(ours) == np.signbit(theirs)).all(), (shape, name, diagonal)


def test_triu_errors_and_empty(device: str) -> None:
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        Tensor([1.0, 2.0]).triu()
    assert Tensor.ones(0, 3, device=device).tril().shape == (0, 3)


def test_roll(device: str) -> None:
    check(lambda t: t.roll(1, 0), lambda t: torch.roll(t, 1, 0), [(4, 3)], device)
    check(lambda t: t.roll(-2, -1), lambda t: torch.roll(t, -2, -1), [(4, 3)], device)
    check(lambda t: t.roll(7, 1), lambda t: torch.roll(t, 7, 1), [(4, 3)], device)
    check(lambda t: t.roll((1, -1), (0, 1)), lambda t: torch.roll(t, (1, -1), (0, 1)), [(4, 3)],
          device)
    check(lambda t: t.roll(5), lambda t: torch.roll(t, 5), [(4, 3)], device)
    check(lambda t: t.roll(3, 0), lambda t: torch.roll(t, 3, 0), [(1, 2)], device)
    assert Tensor.ones(0, 2, device=device).roll(1, 0).shape == (0, 2)
    with pytest.raises(ValueError, match="2 shifts for 1 dims"):
        Tensor.ones(2, 2).roll((1, 2), 0)


@pytest.mark.parametrize("offset", [-2, -1, 0, 1, 3])
def test_diag_and_diagonal(device: str, offset: int) -> None:
    check(lambda t: t.diag(offset), lambda t: torch.diag(t, offset), [(4,)], device)
    check(lambda t: t.diag(offset), lambda t: torch.diag(t, offset), [(3, 5)], device)
    check(lambda t: t.diagonal(offset), lambda t: torch.diagonal(t, offset), [(4, 3)], device)
    check(lambda t: t.diagonal(offset, -1, 0), lambda t: torch.diagonal(t, offset, -1, 0),
          [(3, 2, 4)], device)
    ints = np.arange(5, dtype=np.int32)
    compare(Tensor(ints, device=device).diag(offset), np.diag(ints, offset), 0, 0)


def test_diag_errors(device: str) -> None:
    with pytest.raises(ValueError, match="1-d or 2-d"):
        Tensor.ones(2, 2, 2).diag()
    with pytest.raises(ValueError, match="same axis"):
        Tensor.ones(2, 2).diagonal(0, 1, -1)
    assert Tensor.ones(2, 2, device=device).diagonal(5).shape == (0,)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(device: str, indexing: str) -> None:
    a, b, c = np.arange(3), np.arange(4) * 10, np.arange(2) - 5
    ours = Tensor(a, device=device).meshgrid(Tensor(b, device=device), Tensor(c, device=device),
                                            indexing=indexing)
    theirs = torch.meshgrid(torch.tensor(a), torch.tensor(b), torch.tensor(c), indexing=indexing)
    assert isinstance(ours, tuple) and len(ours) == 3
    for o, t in zip(ours, theirs):
        compare(o, t, 0, 0)
    check(lambda x, y: x.meshgrid(y, indexing=indexing),
          lambda x, y: torch.meshgrid(x, y, indexing=indexing), [(3,), (2,)], device)
    with pytest.raises(ValueError, match="indexing"):
        Tensor(a).meshgrid(Tensor(b), indexing="ji")
    with pytest.raises(ValueError, match="1-d"):
        Tensor.ones(2, 2).meshgrid(Tensor(b))


def test_repeat_interleave(device: str) -> None:
    check(lambda t: t.repeat_interleave(2), lambda t: t.repeat_interleave(2), [(2, 3)], device)
    check(lambda t: t.repeat_interleave(3, 0), lambda t: t.repeat_interleave(3, 0), [(2, 3)],
          device)
    check(lambda t: t.repeat_interleave(2, -1), lambda t: t.repeat_interleave(2, -1),
          [(2, 1, 3)], device)
    check(lambda t: t.repeat_interleave(0, 1), lambda t: t.repeat_interleave(0, 1), [(2, 3)],
          device, grad=False)
    with pytest.raises(TypeError, match="int number of repeats"):
        Tensor.ones(3).repeat_interleave(Tensor([1, 2, 3]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="repeats >= 0"):
        Tensor.ones(3).repeat_interleave(-1)


def test_masked_fill(device: str) -> None:
    mask = np.array([[True, False, True, False]])
    check(lambda t: t.masked_fill(Tensor(mask), -5.0),
          lambda t: t.masked_fill(torch.tensor(mask), -5.0), [(3, 4)], device)
    check(lambda t, v: t.masked_fill(Tensor(mask), v.reshape(())),
          lambda t, v: t.masked_fill(torch.tensor(mask), v.reshape(())), [(3, 4), (1,)], device)
    ints = np.arange(4, dtype=np.int32)
    ours = Tensor(ints, device=device).masked_fill(Tensor(mask[0], device=device), 9)
    assert ours.dtype == dtypes.int32
    compare(ours, np.where(mask[0], 9, ints), 0, 0)
    compare(Tensor([1.0, 2.0], device=device).masked_fill(Tensor([True, False]), float("inf")),
            [np.inf, 2.0], 0, 0)
    with pytest.raises(TypeError, match="bool mask"):
        Tensor.ones(2).masked_fill(Tensor([1, 0]), 0.0)


@pytest.mark.parametrize("dim, size, step", [(0, 2, 1), (1, 3, 2), (-1, 5, 5), (1, 1, 3),
                                             (0, 4, 1)])
def test_unfold(device: str, dim: int, size: int, step: int) -> None:
    check(lambda t: t.unfold(dim, size, step), lambda t: t.unfold(dim, size, step), [(4, 5)],
          device)


def test_unfold_errors(device: str) -> None:
    with pytest.raises(ValueError, match="larger than dim"):
        Tensor.ones(3).unfold(0, 4, 1)
    with pytest.raises(ValueError, match="step >= 1"):
        Tensor.ones(3).unfold(0, 2, 0)


def test_pad2d(device: str) -> None:
    check(lambda t: t.pad2d((1, 2, 0, 1)), lambda t: F.pad(t, (1, 2, 0, 1)), [(2, 3, 4)], device)
    check(lambda t: t.pad2d((1, 1), value=-2.0), lambda t: F.pad(t, (1, 1), value=-2.0),
          [(2, 3)], device)


# ---- closeness and statistics ----

def test_isclose_allclose(device: str) -> None:
    a = np.array([1.0, 1.0, np.inf, -np.inf, np.inf, np.nan, np.nan, 0.0, 1e-9, 100.0],
                 dtype=np.float32)
    b = np.array([1.0, 1.1, np.inf, np.inf, 1e38, np.nan, 1.0, 1e-9, 0.0, 100.001],
                 dtype=np.float32)
    ours, theirs = Tensor(a, device=device), torch.tensor(a)
    for kwargs in ({}, {"equal_nan": True}, {"rtol": 0.2}, {"atol": 1e-3, "rtol": 0.0}):
        compare(ours.isclose(Tensor(b, device=device), **kwargs),
                torch.isclose(theirs, torch.tensor(b), **kwargs), 0, 0, str(kwargs))
    assert ours.isclose(1.0).dtype == dtypes.bool
    compare(Tensor([[1, 2]], device=device).isclose(Tensor([[1], [3]], device=device)),
            [[True, False], [False, False]], 0, 0)
    assert Tensor([1.0, 2.0], device=device).allclose(Tensor([1.0, 2.0 + 1e-6]))
    assert not Tensor([1.0, 2.0], device=device).allclose(Tensor([1.0, 2.1]))
    assert Tensor([np.nan], device=device).allclose(Tensor([np.nan]), equal_nan=True)
    assert isinstance(Tensor([1.0]).allclose(Tensor([1.0])), bool)


@pytest.mark.parametrize("axis, correction", [(None, 1), (0, 0), (-1, 1), ((0, 2), 1)])
def test_var_mean_std_mean(device: str, axis: object, correction: int) -> None:
    torch_dim = axis if axis is not None else None
    check(lambda t: t.var_mean(axis, correction=correction),
          lambda t: torch.var_mean(t, torch_dim, correction=correction), [(3, 4, 2)], device)
    check(lambda t: t.std_mean(axis, keepdim=True, correction=correction),
          lambda t: torch.std_mean(t, torch_dim, correction=correction, keepdim=True),
          [(3, 4, 2)], device)


# ---- cumulative ops ----

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumprod(device: str, axis: int) -> None:
    check(lambda t: t.cumprod(axis), lambda t: torch.cumprod(t, axis), [(3, 5)], device)
    with_zero = np.array([[2.0, 0.0, 3.0, -1.5], [0.5, 4.0, 0.0, 0.0]], dtype=np.float32)
    check(lambda t: t.cumprod(axis), lambda t: torch.cumprod(t, axis), [with_zero], device)
    ints = np.array([[1, -2, 3], [4, 0, 6]], dtype=np.int32)
    compare(Tensor(ints, device=device).cumprod(axis), np.cumprod(ints, axis), 0, 0)


def test_cumprod_edges(device: str) -> None:
    check(lambda t: t.cumprod(0), lambda t: torch.cumprod(t, 0), [(1,)], device)
    assert Tensor.ones(0, 3, device=device).cumprod(0).shape == (0, 3)
    compare(Tensor(2.5, device=device).cumprod(), np.float32(2.5), 0, 0)
    x = np.array([np.inf, 2.0, np.nan, 1.0], dtype=np.float32)
    check(lambda t: t.cumprod(0), lambda t: torch.cumprod(t, 0), [x], device, grad=False)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_cummin(device: str, name: str) -> None:
    check(lambda t: getattr(t, name)(1)[0], lambda t: getattr(torch, name)(t, 1).values,
          [(3, 6)], device)
    ties = np.array([[1.0, 3.0, 3.0, 2.0, 5.0, 5.0, -np.inf, 7.0]], dtype=np.float32)
    for values in (ties, -ties, np.array([1.0, np.nan, 2.0, np.nan, 0.0], dtype=np.float32)):
        ours = getattr(Tensor(values, device=device), name)(-1)
        theirs = getattr(torch, name)(torch.tensor(values), -1)
        compare(ours[0], theirs.values, 0, 0)
        compare(ours[1], theirs.indices, 0, 0)
    ints = np.array([[4, -2, 7, 7, -9], [0, 0, 1, -1, 3]], dtype=np.int32)
    ours = getattr(Tensor(ints, device=device), name)(0)
    theirs = getattr(torch, name)(torch.tensor(ints), 0)
    compare(ours[0], theirs.values, 0, 0)
    compare(ours[1], theirs.indices, 0, 0)
    assert ours[0].dtype == dtypes.int32
    assert getattr(Tensor.ones(2, 0, device=device), name)(1)[1].shape == (2, 0)


def test_cummax_cummin_by_name(device: str) -> None:
    x = np.array([[2.0, -1.0, 4.0, 3.0]], dtype=np.float32)
    compare(Tensor(x, device=device).cummax(1)[0], np.maximum.accumulate(x, 1), 0, 0)
    compare(Tensor(x, device=device).cummin(1)[0], np.minimum.accumulate(x, 1), 0, 0)
    compare(Tensor(x, device=device).cummin(1)[1], [[0, 1, 1, 1]], 0, 0)


@pytest.mark.parametrize("axis", [0, -1])
def test_logcumsumexp(device: str, axis: int) -> None:
    check(lambda t: t.logcumsumexp(axis), lambda t: torch.logcumsumexp(t, axis), [(4, 5)], device)
    wide = np.array([[-1000.0, 0.0, 50.0, -np.inf, 80.0], [-np.inf, -np.inf, 1.0, 2.0, 3.0]],
                    dtype=np.float32)
    check(lambda t: t.logcumsumexp(axis), lambda t: torch.logcumsumexp(t, axis), [wide], device,
          grad=False)
    assert Tensor.ones(0, 2, device=device).logcumsumexp(0).shape == (0, 2)
    compare(Tensor([1, 2, 3], device=device).logcumsumexp(),
            torch.logcumsumexp(torch.tensor([1.0, 2.0, 3.0]), 0), 1e-6, 1e-6)


# ---- einsum ----

EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 2)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->j", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,i->", [(5,), (5,)]),
    ("ij,jk", [(3, 4), (4, 2)]),          # implicit output: "ik"
    ("ba,ac", [(3, 4), (4, 2)]),          # implicit output, alphabetical: "bc"
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij,ij->ij", [(2, 3), (2, 3)]),
    ("i j , j k -> i k", [(2, 3), (3, 2)]),
    # "..." broadcasts the axes no letter names, aligned from the right
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("...ij,jk", [(2, 3, 4), (4, 5)]),        # implicit output: "..." first, then "ik"
    ("...ij->ij", [(2, 3, 4)]),               # no "..." in the output: summed
    ("i...->...", [(3, 2, 1)]),
    ("...i,...i->...", [(2, 1, 3), (4, 3)]),
    ("...,...->...", [(3,), (2, 1)]),
    ("b...->b", [(3, 2, 2)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("...->...", [()]),
    ("ij,jk->ik", [(2, 1), (3, 4)]),          # a size-1 axis broadcasts, as in PyTorch
]


@pytest.mark.parametrize("formula, shapes", EINSUM)
def test_einsum(device: str, formula: str, shapes: list[tuple[int, ...]]) -> None:
    check(lambda *ts: Tensor.einsum(formula, *ts),
          lambda *ts: torch.einsum(formula.replace(" ", ""), *ts), shapes, device)


def test_einsum_list_integers_and_errors(device: str) -> None:
    a, b = np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2)
    compare(Tensor.einsum("ij,jk->ik", [Tensor(a, device=device), Tensor(b, device=device)]),
            a @ b, 0, 0)
    x = Tensor.ones(2, 3)
    with pytest.raises(ValueError, match="2 operands, 1 given"):
        Tensor.einsum("ij,jk->ik", x)
    with pytest.raises(ValueError, match="sizes 3 and 2"):
        Tensor.einsum("ij,jk->ik", x, Tensor.ones(2, 2))
    with pytest.raises(ValueError, match="more axes"):
        Tensor.einsum("...ijk->...ji", x)
    with pytest.raises(ValueError, match="one '...'"):
        Tensor.einsum("..ij->ji", x)
    with pytest.raises(ValueError, match="shape"):
        Tensor.einsum("ijk->i", x)
    with pytest.raises(ValueError, match="shape"):
        Tensor.einsum("iij->i", x)
    with pytest.raises(ValueError, match="output"):
        Tensor.einsum("ij->iz", x)


# ---- functional layers, losses, attention ----

def test_sequential(device: str) -> None:
    x = Tensor([[-1.0, 2.0]], device=device)
    result = x.sequential([lambda t: t * 2, Tensor.relu, lambda t: t + 1])
    compare(result, [[1.0, 5.0]], 0, 0)
    compare(x.sequential([]), x.numpy(), 0, 0)


def test_rmsnorm(device: str) -> None:
    check(lambda t: t.rmsnorm(), lambda t: F.rms_norm(t, (6,), eps=1e-6), [(3, 6)], device)
    check(lambda t: t.rmsnorm((-2, -1), eps=1e-3), lambda t: F.rms_norm(t, (4, 5), eps=1e-3),
          [(2, 4, 5)], device)


def _targets(*shape: int, classes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, size=shape).astype(np.int32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(device: str, reduction: str) -> None:
    y = _targets(6, classes=4)
    check(lambda t: t.log_softmax(-1).nll_loss(Tensor(y), reduction=reduction),
          lambda t: F.nll_loss(t.log_softmax(-1), torch.tensor(y).long(), reduction=reduction),
          [(6, 4)], device)
    y4 = _targets(2, 3, 3, classes=5, seed=1)  # (N, C, H, W) inputs, (N, H, W) targets
    weight = np.array([0.5, 1.0, 2.0, 0.0, 3.0], dtype=np.float32)
    check(lambda t: t.nll_loss(Tensor(y4), Tensor(weight), reduction=reduction),
          lambda t: F.nll_loss(t, torch.tensor(y4).long(), torch.tensor(weight),
                               reduction=reduction), [(2, 5, 3, 3)], device)


@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_ignore_index_and_errors(device: str, weighted: bool) -> None:
    y = np.array([0, -100, 2, 1, -100], dtype=np.int32)
    w = np.array([1.0, 2.0, 0.5], dtype=np.float32) if weighted else None
    check(lambda t: t.nll_loss(Tensor(y), None if w is None else Tensor(w), -100),
          lambda t: F.nll_loss(t, torch.tensor(y).long(), None if w is None else torch.tensor(w),
                               ignore_index=-100), [(5, 3)], device)
    check(lambda t: t.nll_loss(Tensor(2)), lambda t: F.nll_loss(t, torch.tensor(2)), [(4,)],
          device)  # one item: (C,) inputs, a 0-d target
    with pytest.raises(ValueError, match="do not fit"):
        Tensor.ones(4, 3).nll_loss(Tensor([0, 1]))
    with pytest.raises(TypeError, match="integer targets"):
        Tensor.ones(2, 3).nll_loss(Tensor([0.0, 1.0]))


def test_scaled_dot_product_attention(device: str) -> None:
    shapes = [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5)]  # (batch, heads, length, dim)
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v),
          F.scaled_dot_product_attention, shapes, device)
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), shapes, device)
    mask = np.random.default_rng(5).random((4, 6)) > 0.3
    mask[:, 0] = True  # every query sees one key at least (else both give NaN)
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=Tensor(mask)),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(mask)),
          shapes, device)
    bias = np.random.default_rng(6).normal(size=(4, 6)).astype(np.float32)
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=Tensor(bias)),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(bias)),
          shapes, device)


def test_attention_without_heads(device: str) -> None:
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
          [(2, 5, 4), (2, 5, 4), (2, 5, 3)], device)
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v),
          F.scaled_dot_product_attention, [(1, 4), (3, 4), (3, 2)], device)


def test_attention_gqa_dropout_and_errors(device: str) -> None:
    shapes = [(1, 4, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)]
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v, enable_gqa=True),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), shapes,
          device)
    # outside training mode dropout_p changes nothing (tinygrad's rule)
    q, k, v = (Tensor.randn(1, 2, 3, 4, device=device) for _ in range(3))
    compare(q.scaled_dot_product_attention(k, v, dropout_p=0.5),
            q.scaled_dot_product_attention(k, v).numpy(), 1e-6, 1e-6)
    with Tensor.train():
        dropped = q.scaled_dot_product_attention(k, v, dropout_p=0.999).numpy()
    assert np.abs(dropped).sum() < np.abs(q.scaled_dot_product_attention(k, v).numpy()).sum()
    with pytest.raises(ValueError, match="not both"):
        q.scaled_dot_product_attention(k, v, attn_mask=Tensor.ones(3, 3), is_causal=True)
    with pytest.raises(ValueError, match="do not fit"):
        q.scaled_dot_product_attention(Tensor.ones(1, 2, 3, 5), v)


# ---- sorting ----

@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, -1])
def test_sort_forward_and_backward(device: str, descending: bool, dim: int) -> None:
    check(lambda t: t.sort(dim, descending),
          lambda t: tuple(torch.sort(t, dim=dim, descending=descending, stable=True)), [(5, 6)],
          device)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_ties_nan_inf_and_integers(device: str, descending: bool) -> None:
    x = np.array([[3.0, np.nan, 1.0, -np.inf, 1.0, np.inf, -0.5, np.nan, 3.0, 1.0, 2.0]],
                 dtype=np.float32)
    ints = np.array([[5, -3, 5, 0, -2**31, 2**31 - 1, 5, -3]], dtype=np.int32)
    flags = np.array([True, False, True, False, False])
    for values in (x, ints, flags):
        ours = Tensor(values, device=device).sort(-1, descending)
        theirs = torch.sort(torch.tensor(values), dim=-1, descending=descending, stable=True)
        compare(ours[0], theirs.values, 0, 0)
        compare(ours[1], theirs.indices, 0, 0)
        compare(Tensor(values, device=device).argsort(-1, descending), theirs.indices, 0, 0)
        assert ours[0].dtype == Tensor(values).dtype and ours[1].dtype == dtypes.int32


def test_sort_sizes(device: str) -> None:
    for n in (1, 2, 3, 8, 9):
        check(lambda t: t.sort(), lambda t: tuple(torch.sort(t, stable=True)), [(2, n)], device)
    empty = Tensor.ones(2, 0, device=device).sort()
    assert empty[0].shape == (2, 0) and empty[1].shape == (2, 0)
    scalar = Tensor(4.0, device=device).sort()
    assert scalar[0].item() == 4.0 and scalar[1].item() == 0


@pytest.mark.parametrize("largest", [True, False])
def test_topk(device: str, largest: bool) -> None:
    check(lambda t: t.topk(3, largest=largest),
          lambda t: tuple(torch.topk(t, 3, largest=largest)), [(4, 7)], device)
    check(lambda t: t.topk(2, dim=0, largest=largest),
          lambda t: tuple(torch.topk(t, 2, dim=0, largest=largest)), [(4, 7)], device)
    x = np.array([1.0, np.nan, 5.0, 5.0, -np.inf], dtype=np.float32)
    ours = Tensor(x, device=device).topk(3, largest=largest)
    theirs = torch.topk(torch.tensor(x), 3, largest=largest)
    compare(ours[0], theirs.values, 0, 0)
    assert Tensor.ones(3, device=device).topk(0)[0].shape == (0,)
    with pytest.raises(ValueError, match="k=4"):
        Tensor.ones(3).topk(4)


@pytest.mark.parametrize("name", ["floor", "ceil", "trunc", "round", "sign"])
def test_step_functions_have_zero_gradients(device: str, name: str) -> None:
    """PyTorch's gradient of a step function is 0 (not 1, not missing)."""
    x = np.array([-2.5, -1.2, 0.3, 1.5, 7.0, 1e9, np.inf], dtype=np.float32)
    check(lambda t: getattr(t, name)(), getattr(torch, name), [x], device)
    check(lambda t: t.abs(), torch.abs, [x], device)


# ---- interpolate ----

TORCH_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


@pytest.mark.parametrize("size", [(7,), (3,), (1,), (5, 3), (2, 8), (3, 2, 5)])
@pytest.mark.parametrize("mode, align_corners", [("linear", False), ("linear", True),
                                                  ("nearest", False), ("nearest-exact", False)])
def test_interpolate(device: str, size: tuple[int, ...], mode: str, align_corners: bool) -> None:
    shape = (2, 2) + (4, 5, 3)[:len(size)]
    theirs_mode = TORCH_LINEAR[len(size)] if mode == "linear" else mode
    extra = {"align_corners": align_corners} if mode == "linear" else {}
    check(lambda t: t.interpolate(size, mode, align_corners),
          lambda t: F.interpolate(t, size, mode=theirs_mode, **extra), [shape], device)


def test_interpolate_edges_and_errors(device: str) -> None:
    x = np.array([[[1.0, np.inf, 3.0, -2.0]]], dtype=np.float32)
    check(lambda t: t.interpolate((9,), "nearest"), lambda t: F.interpolate(t, 9),
          [x], device, grad=False)
    check(lambda t: t.interpolate((9,)), lambda t: F.interpolate(t, 9, mode="linear"),
          [x], device, grad=False)
    ints = Tensor([[[1, 2, 3]]], device=device).interpolate((6,), "nearest")
    assert ints.dtype == dtypes.int32  # integers stay integers, as in PyTorch
    compare(ints, [[[1, 1, 2, 2, 3, 3]]], 0, 0)
    with pytest.raises(ValueError, match="mode"):
        Tensor.ones(1, 1, 4).interpolate((2,), "cubic")
    with pytest.raises(ValueError, match="positive int sizes"):
        Tensor.ones(1, 1, 4).interpolate((0,))
    with pytest.raises(ValueError, match="align_corners"):
        Tensor.ones(1, 1, 4).interpolate((2,), "nearest", align_corners=True)


# ---- from outside ----

def test_from_blob(device: str) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4) * 1.5
    ours = Tensor.from_blob(x.ctypes.data, (3, 4), device=device)
    assert ours.device == device and ours.dtype == dtypes.float32
    compare(ours, x, 0, 0)
    ints = np.array([-5, 7, 2**40], dtype=np.int64)
    compare(Tensor.from_blob(ints.ctypes.data, (3,), dtype=dtypes.int64), ints, 0, 0)
    half = Tensor.from_blob(x.ctypes.data, (2, 2))  # the first 4 elements
    compare(half, x.reshape(-1)[:4].reshape(2, 2), 0, 0)
    with pytest.raises(ValueError, match="non-null"):
        Tensor.from_blob(0, (2,))


def test_from_url(tmp_path: object, device: str) -> None:
    import gzip
    from pathlib import Path
    payload = bytes(range(256)) * 3
    plain, packed = Path(str(tmp_path)) / "data.bin", Path(str(tmp_path)) / "data.bin.gz"
    plain.write_bytes(payload)
    packed.write_bytes(gzip.compress(payload))
    ours = Tensor.from_url(plain.as_uri(), device=device)
    assert ours.dtype == dtypes.uint8 and ours.device == device
    compare(ours, np.frombuffer(payload, dtype=np.uint8), 0, 0)
    compare(Tensor.from_url(packed.as_uri(), gunzip=True), np.frombuffer(payload, np.uint8), 0, 0)
