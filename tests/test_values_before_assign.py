"""A lazy value whose graph reads a buffer keeps the value it had when an assign overwrites that
buffer (tinygrad's quickstart reads `out` after `opt.step()`): the realize that assigns also
computes every live lazy tensor reading the old contents, ordered before the write
(tensor_core._still_lazy). Each value is checked against numpy or PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tinyteach import GlobalCounters, Tensor, TinyJit, nn
from tinyteach.helpers import Context

RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 3)).astype(np.float32)
W = RNG.standard_normal((3, 2)).astype(np.float32)


@pytest.fixture(params=[1, 0], ids=["plan_cache", "no_plan_cache"])
def plan_cache(request: pytest.FixtureRequest) -> object:
    with Context(PLAN_CACHE=request.param):
        yield request.param


def test_a_value_read_after_an_assign_is_the_value_before_it(plan_cache: object) -> None:
    weight = Tensor(W.copy())
    product = Tensor(X) @ weight
    weight.assign(weight * 2).realize()
    np.testing.assert_allclose(product.numpy(), X @ W, rtol=1e-6)
    np.testing.assert_allclose(weight.numpy(), W * 2)
    np.testing.assert_allclose((Tensor(X) @ weight).numpy(), X @ (W * 2), rtol=1e-6)


def test_values_and_gradients_survive_several_sgd_steps(plan_cache: object) -> None:
    """Each step's output and gradient, read after later steps, against the same steps in torch."""
    weight = Tensor(W.copy(), requires_grad=True)
    optimizer = nn.optim.SGD([weight], lr=0.1, momentum=0.9)
    torch_weight = torch.tensor(W.copy(), requires_grad=True)
    torch_optimizer = torch.optim.SGD([torch_weight], lr=0.1, momentum=0.9)
    kept: list[tuple[Tensor, Tensor, np.ndarray, np.ndarray]] = []
    for _ in range(3):
        with Tensor.train():
            optimizer.zero_grad()
            out = (Tensor(X) @ weight).relu()
            (out * out).sum().backward()
            grad = weight.grad
            assert grad is not None
            optimizer.step()
        torch_optimizer.zero_grad()
        torch_out = (torch.tensor(X) @ torch_weight).relu()
        (torch_out * torch_out).sum().backward()
        assert torch_weight.grad is not None
        kept.append((out, grad, torch_out.detach().numpy().copy(),
                     torch_weight.grad.numpy().copy()))
        torch_optimizer.step()
    for out, grad, torch_out, torch_grad in kept:
        np.testing.assert_allclose(out.numpy(), torch_out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad.numpy(), torch_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weight.numpy(), torch_weight.detach().numpy(), rtol=1e-5)


def test_a_gradient_of_an_input_is_its_value_before_the_step() -> None:
    """x.grad (x a plain tensor, which gets one by tinygrad's rule) reads the old weight."""
    x = Tensor(X)
    weight = Tensor(W.copy())
    optimizer = nn.optim.SGD([weight], lr=0.5)
    with Tensor.train():
        (x @ weight).sum().backward()
        optimizer.step()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), np.ones((4, 2)) @ W.T, rtol=1e-6)


def test_detached_copies_and_views_of_the_old_buffer() -> None:
    """A lazy tensor made from the buffer keeps the old values; a view of the buffer that is
    already realized sees the new contents, as a view does in PyTorch."""
    weight = Tensor(W.copy()).realize()
    doubled = weight.detach() * 2
    view = weight.reshape(6)
    weight.assign(weight + 1).realize()
    np.testing.assert_allclose(doubled.numpy(), W * 2)
    np.testing.assert_allclose(view.numpy(), (W + 1).reshape(6))


def test_two_assigns_in_a_row_each_reader_keeps_its_own_value() -> None:
    weight = Tensor(W.copy()).realize()
    first = weight.sum(0)
    weight.assign(weight * 3).realize()
    second = weight.sum(0)
    weight.assign(weight - 1).realize()
    np.testing.assert_allclose(first.numpy(), W.sum(0), rtol=1e-6)
    np.testing.assert_allclose(second.numpy(), (W * 3).sum(0), rtol=1e-6)
    np.testing.assert_allclose(weight.numpy(), W * 3 - 1, rtol=1e-6)


def test_readers_are_computed_in_the_assigns_schedule_without_extra_kernels() -> None:
    """A reader that is itself an intermediate the step stores costs no kernel of its own;
    one that is not costs one (it is computed once, before the assign)."""
    weight = Tensor(W.copy()).realize()
    total = weight.sum()
    GlobalCounters.reset()
    Tensor.realize(total, weight.assign(weight - total))
    assert GlobalCounters.kernel_count == 2  # the sum, and the assign that reads it
    GlobalCounters.reset()
    other = (weight * 5).sum()
    weight.assign(weight + 1).realize()
    assert GlobalCounters.kernel_count == 2  # `other`, computed first, then the assign
    np.testing.assert_allclose(other.numpy(), (W - W.sum()).sum() * 5, rtol=1e-5)


def test_inside_a_jit_the_value_before_the_step_is_returned() -> None:
    weight = Tensor(W.copy()).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        out = x @ weight
        weight.assign(weight * 0.5).realize()
        return out.realize()
    expected_weight = W.copy()
    for _ in range(4):
        x = RNG.standard_normal((4, 3)).astype(np.float32)
        np.testing.assert_allclose(step(Tensor(x)).numpy(), x @ expected_weight, rtol=1e-5)
        expected_weight = expected_weight * 0.5
    np.testing.assert_allclose(weight.numpy(), expected_weight, rtol=1e-6)
