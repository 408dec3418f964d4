"""Issue 13's last missing methods, against PyTorch: scatter and scatter_reduce (a masked sum
over the one-hot of the index), masked_select and nonzero (data-dependent shapes: the count
is realized first), rearrange (einops' formula as reshape / permute / reshape),
max_unpool2d, qr and svd; and dtypes given as Python types (float, int, bool), as in PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tinyteach import Tensor, dtypes

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 5)).astype(np.float32)
INDEX = np.array([[0, 1, 2, 0], [4, 4, 1, 3], [2, 0, 2, 2]], dtype=np.int32)  # repeats
SRC = RNG.standard_normal((3, 4)).astype(np.float32)


def close(ours: Tensor, theirs: torch.Tensor, atol: float = 1e-6) -> None:
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), atol=atol, rtol=1e-5)


def test_scatter_as_torch(device: str) -> None:
    t, index, src = torch.tensor(X), torch.tensor(INDEX).long(), torch.tensor(SRC)
    close(Tensor(X).scatter(1, Tensor(INDEX), Tensor(SRC)), t.scatter(1, index, src))
    close(Tensor(X).scatter(1, Tensor(INDEX), 2.5), t.scatter(1, index, 2.5))
    close(Tensor(X).scatter(-1, Tensor(INDEX), 2.5, reduce="add"),
          t.scatter(-1, index, 2.5, reduce="add"))
    close(Tensor(X).scatter(1, Tensor(INDEX), 2.5, reduce="multiply"),
          t.scatter(1, index, 2.5, reduce="multiply"))
    # a tensor src with reduce: tinygrad refuses it, PyTorch deprecates it for scatter_reduce
    with pytest.raises(TypeError, match="use scatter_reduce\\(dim, index, src, 'sum'\\)"):
        Tensor(X).scatter(-1, Tensor(INDEX), Tensor(SRC), reduce="add")
    with pytest.raises(TypeError, match="'prod'"):  # (before the axis is checked, as there)
        Tensor.ones(4).scatter(1, Tensor([0]), Tensor.ones(4), reduce="multiply")
    small = np.array([[0, 1], [2, 0]], dtype=np.int32)  # covers part of the tensor
    close(Tensor(X).scatter(0, Tensor(small), Tensor(SRC)),
          t.scatter(0, torch.tensor(small).long(), src))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_as_torch(device: str, reduce: str, include_self: bool) -> None:
    ours = Tensor(X).scatter_reduce(1, Tensor(INDEX), Tensor(SRC), reduce,  # type: ignore[arg-type]
                                    include_self=include_self)
    close(ours, torch.tensor(X).scatter_reduce(1, torch.tensor(INDEX).long(), torch.tensor(SRC),
                                               reduce, include_self=include_self))


def test_scatter_reduce_integer_mean_rounds_down_and_gradients_flow() -> None:
    xi, si = RNG.integers(-5, 5, (3, 5)), RNG.integers(-5, 5, (3, 4))
    ours = Tensor(xi.astype(np.int32)).scatter_reduce(1, Tensor(INDEX),
                                                      Tensor(si.astype(np.int32)), "mean")
    theirs = torch.tensor(xi).scatter_reduce(1, torch.tensor(INDEX).long(), torch.tensor(si),
                                             "mean")
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    x, src = Tensor(X, requires_grad=True), Tensor(SRC, requires_grad=True)
    (x.scatter_reduce(1, Tensor(INDEX), src, "sum") ** 2).sum().backward()
    tx, tsrc = torch.tensor(X, requires_grad=True), torch.tensor(SRC, requires_grad=True)
    (tx.scatter_add(1, torch.tensor(INDEX).long(), tsrc) ** 2).sum().backward()
    assert x.grad is not None and src.grad is not None
    close(x.grad, tx.grad)
    close(src.grad, tsrc.grad)


def test_scatter_errors() -> None:
    with pytest.raises(IndexError, match="out of (range|bounds)"):
        Tensor(X).scatter(1, Tensor(INDEX + 5), Tensor(SRC))
    with pytest.raises(ValueError, match="reduce"):
        Tensor(X).scatter(1, Tensor(INDEX), Tensor(SRC), reduce="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="integer tensor"):
        Tensor(X).scatter(1, Tensor(INDEX.astype(np.float32)), Tensor(SRC))


def test_masked_select_and_nonzero_as_torch(device: str) -> None:
    mask = X > 0
    close(Tensor(X).masked_select(Tensor(mask)), torch.tensor(X).masked_select(torch.tensor(mask)))
    row = np.array([True, False, True, True, False])   # broadcast over the rows
    close(Tensor(X).masked_select(Tensor(row)), torch.tensor(X).masked_select(torch.tensor(row)))
    np.testing.assert_array_equal(Tensor(mask).nonzero().numpy(), torch.tensor(mask).nonzero())
    cube = RNG.integers(0, 2, (2, 3, 4)).astype(np.int32)
    np.testing.assert_array_equal(Tensor(cube).nonzero().numpy(), torch.tensor(cube).nonzero())
    assert Tensor(np.zeros(3, np.float32)).nonzero().shape == tuple(torch.zeros(3).nonzero().shape)
    assert Tensor(X).masked_select(Tensor(np.zeros((3, 5), bool))).shape == (0,)


def test_rearrange_as_reshape_and_transpose() -> None:
    x = np.arange(2 * 3 * 4 * 6).reshape(2, 3, 4, 6)
    t = Tensor(x)
    np.testing.assert_array_equal(t.rearrange("b c h w -> b (h w) c").numpy(),
                                  x.transpose(0, 2, 3, 1).reshape(2, 24, 3))
    np.testing.assert_array_equal(t.rearrange("b c h (w p) -> b (p c) h w", p=2).numpy(),
                                  x.reshape(2, 3, 4, 3, 2).transpose(0, 4, 1, 2, 3)
                                  .reshape(2, 6, 4, 3))
    np.testing.assert_array_equal(t.rearrange("b ... w -> w b ...").numpy(),
                                  x.transpose(3, 0, 1, 2))
    np.testing.assert_array_equal(t.rearrange("b c h w -> (b c) 1 h w").numpy(),
                                  x.reshape(6, 1, 4, 6))
    for bad in ["b c h -> b c h", "b c h w -> b c h", "b c h (w p) -> b c h w p",
                "a a h w -> a h w", "b c h w -> b c (h w"]:
        with pytest.raises(ValueError, match="rearrange"):
            t.rearrange(bad)


@pytest.mark.parametrize("kernel, stride", [(2, None), (3, 2)])
def test_max_unpool2d_as_torch(device: str, kernel: int, stride: int | None) -> None:
    x = np.random.default_rng(7).standard_normal((2, 3, 6, 8)).astype(np.float32)
    x[..., 4, 6] = 10.0  # the last window's maximum: flat index 38, past a 5x7 output
    values, indices = Tensor(x).max_pool2d(kernel, stride, return_indices=True)
    t_values, t_indices = torch.nn.functional.max_pool2d(torch.tensor(x), kernel, stride,
                                                         return_indices=True)
    if stride is None:  # (with kernel 3, stride 2 the default output is 5x7, too small)
        close(values.max_unpool2d(indices, kernel, stride),
              torch.nn.functional.max_unpool2d(t_values, t_indices, kernel, stride))
    else:
        with pytest.raises(RuntimeError, match="does not fit"):
            values.max_unpool2d(indices, kernel, stride)
    close(values.max_unpool2d(indices, kernel, stride, output_size=(6, 8)),
          torch.nn.functional.max_unpool2d(t_values, t_indices, kernel, stride,
                                           output_size=(6, 8)))


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 3)])
def test_qr_as_torch(shape: tuple[int, ...]) -> None:
    a = RNG.standard_normal(shape).astype(np.float32)
    q, r = Tensor(a).qr()
    t_q, t_r = torch.linalg.qr(torch.tensor(a))
    close(q, t_q, atol=1e-5)   # Householder as LAPACK: the same signs
    close(r, t_r, atol=1e-5)
    np.testing.assert_allclose((q @ r).numpy(), a, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 3)])
def test_svd_as_torch(shape: tuple[int, ...]) -> None:
    a = RNG.standard_normal(shape).astype(np.float32)
    u, s, vh = Tensor(a, device="NUMPY").svd()
    t_u, t_s, t_vh = torch.linalg.svd(torch.tensor(a))
    assert u.shape == tuple(t_u.shape) and vh.shape == tuple(t_vh.shape)
    close(s, t_s, atol=1e-5)
    k = min(shape[-2:])
    np.testing.assert_allclose(((u[..., :, :k] * s.unsqueeze(-2)) @ vh[..., :k, :]).numpy(), a,
                               atol=1e-5)
    for m in (u, vh):   # orthonormal (the vectors themselves are unique only up to sign)
        size = m.shape[-1]
        np.testing.assert_allclose((m.transpose(-2, -1) @ m).numpy(),
                                   np.broadcast_to(np.eye(size), m.shape), atol=1e-5)
    _, s_reduced, vh_reduced = Tensor(a, device="NUMPY").svd(full_matrices=False)
    assert vh_reduced.shape == tuple(torch.linalg.svd(torch.tensor(a), full_matrices=False)[2]
                                     .shape)


@pytest.mark.parametrize("python_type", [float, int, bool])
def test_dtypes_given_as_python_types_as_torch(python_type: type) -> None:
    expected = {float: dtypes.float64, int: dtypes.int64, bool: dtypes.bool}[python_type]
    torch_dtype = torch.tensor([1, 0, 2], dtype=python_type).dtype
    assert str(torch_dtype).removeprefix("torch.") == expected.name
    made = [Tensor([1, 0, 2], dtype=python_type), Tensor([1.5, 0, 2]).cast(python_type),
            Tensor.zeros(2, dtype=python_type), Tensor.full((2,), 1, dtype=python_type),
            Tensor.arange(3, dtype=python_type), Tensor([1, 2]).sum(dtype=python_type),
            Tensor.eye(2, dtype=python_type), Tensor([1.0]).ones_like(dtype=python_type)]
    assert all(t.dtype == expected for t in made), [t.dtype for t in made]
    np.testing.assert_array_equal(Tensor([1.5, 0, 2]).cast(python_type).numpy(),
                                  torch.tensor([1.5, 0, 2]).to(python_type).numpy())
