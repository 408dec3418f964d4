"""Chapter 1 (part 1) and 2: what autograd remembers, tinygrad's three states of requires_grad,
`Tensor.gradient`, `contiguous_backward`, and the `no_grad` switch with its context manager —
against torch.autograd on NUMPY and CPU, in float64."""
from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest
from helpers import default_device

from tinyteach import Tensor, dtypes
from tinyteach.ir.uop import Ops
from tinyteach.nn.optim import SGD
from tinyteach.tensor import AUTOGRAD

torch = pytest.importorskip("torch")

rng = np.random.default_rng(77)


@pytest.fixture(params=["NUMPY", "CPU"])
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    with default_device(request.param):
        yield request.param


def uniform(*shape: int) -> np.ndarray:
    return rng.uniform(-2.0, 2.0, size=shape)


# ---- Tensor.gradient against torch.autograd.grad ----

def test_gradient_matches_torch_autograd_grad_without_touching_grad(device):
    a, b = uniform(3, 4), uniform(4, 2)
    x = Tensor(a, device=device)                      # requires_grad None: still a target
    w = Tensor(b, device=device, requires_grad=True)
    h = (x @ w).tanh()                                # an intermediate is a target too
    y = (h * h).sum() + (x.exp() * 0.5).mean()
    dx, dw, dh = y.gradient(x, w, h)
    tx = torch.tensor(a, requires_grad=True)
    tw = torch.tensor(b, requires_grad=True)
    th = (tx @ tw).tanh()
    ty = (th * th).sum() + (tx.exp() * 0.5).mean()
    expected = torch.autograd.grad(ty, [tx, tw, th])
    for ours, theirs in zip((dx, dw, dh), expected):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-10, atol=1e-12)
    assert x.grad is None and w.grad is None and h.grad is None


def test_gradient_of_a_non_scalar_takes_the_output_gradient(device):
    a, g = uniform(2, 3), uniform(2, 3)
    x = Tensor(a, device=device)
    y = x.sin() * x
    (dx,) = y.gradient(x, gradient=Tensor(g, device=device))
    tx = torch.tensor(a, requires_grad=True)
    (expected,) = torch.autograd.grad(tx.sin() * tx, [tx], grad_outputs=torch.tensor(g))
    np.testing.assert_allclose(dx.numpy(), expected.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="needs `gradient=`"):
        y.gradient(x)
    with pytest.raises(ValueError, match="gradient shape"):
        y.gradient(x, gradient=Tensor(uniform(3), device=device))


def test_gradient_of_an_unreached_target_is_zeros(device):
    a = uniform(3)
    x, unused = Tensor(a, device=device), Tensor(uniform(2, 2), device=device)
    stopped = Tensor(a, device=device)
    y = (x * 3).sum() + (stopped.detach() * 2).sum()
    dx, dunused, dstopped = y.gradient(x, unused, stopped)
    tx = torch.tensor(a, requires_grad=True)
    tu = torch.tensor(unused.numpy(), requires_grad=True)
    ts = torch.tensor(a, requires_grad=True)
    expected = torch.autograd.grad((tx * 3).sum() + (ts.detach() * 2).sum(), [tx, tu, ts],
                                   allow_unused=True, materialize_grads=True)
    for ours, theirs in zip((dx, dunused, dstopped), expected):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
        assert ours.shape == tuple(theirs.shape)


def test_gradient_needs_float_tensors(device):
    x = Tensor([1, 2, 3], device=device)
    with pytest.raises(RuntimeError, match="only float"):
        (x * 2).sum().gradient(x)
    y = Tensor([1.0, 2.0], device=device)
    with pytest.raises(RuntimeError, match="only float"):
        (y * 2).sum().gradient(Tensor([1, 2], device=device))


def test_gradient_reaches_through_a_realized_tensor(device):
    a = uniform(4)
    w = Tensor(a, device=device, requires_grad=True)
    hidden = (w * w).realize()                       # realized half-way, as a training loop does
    assert id(hidden) not in AUTOGRAD.leaves and hidden.uop in AUTOGRAD.graph_behind
    (dw,) = (hidden.exp()).sum().gradient(w)
    tw = torch.tensor(a, requires_grad=True)
    (expected,) = torch.autograd.grad((tw * tw).exp().sum(), [tw])
    np.testing.assert_allclose(dw.numpy(), expected.numpy(), rtol=1e-12)


# ---- requires_grad: True, None, False ----

def test_requires_grad_of_results_follows_tinygrad():
    true = Tensor([1.0, 2.0], requires_grad=True)
    none = Tensor([1.0, 2.0])
    false = Tensor([1.0, 2.0], requires_grad=False)
    assert none.requires_grad is None and false.requires_grad is False
    assert (true * none).requires_grad is True and (true + false).requires_grad is True
    assert (none * false).requires_grad is None
    assert (false * false).requires_grad is False
    assert (false * 2).requires_grad is False and (none * 2).requires_grad is None
    assert (false.exp() + 1).sum().requires_grad is False
    assert false.requires_grad_(True) is false and false.requires_grad is True


def test_backward_fills_grad_on_every_float_tensor_it_reaches(device):
    """tinygrad's rule: None (the default) gets a .grad too, and so does an intermediate
    result; against torch with requires_grad=True on the same leaves (and retain_grad)."""
    a, b = uniform(3), uniform(3)
    w = Tensor(a, device=device, requires_grad=True)
    x = Tensor(b, device=device)                     # None: gets a .grad if reached
    h = w * x                                        # an intermediate result: a .grad too
    (h * h).sum().backward()
    tw, tx = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    th = tw * tx
    th.retain_grad()
    (th ** 2).sum().backward()
    for mine, theirs in ((w, tw), (x, tx), (h, th)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-12)


def test_backward_fills_a_plain_randn_through_a_mask(device):
    """The issue's example: `(t * (t < 0)).sum().backward()` for a plain Tensor.randn(4)."""
    Tensor.manual_seed(0)
    t = Tensor.randn(4, device=device)
    (t * (t < 0)).sum().backward()
    tt = torch.tensor(t.numpy(), requires_grad=True)
    (tt * (tt < 0)).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), tt.grad.numpy())


def test_backward_accumulates_and_skips_false_ints_and_constants(device):
    a, b = uniform(3), uniform(3)
    w = Tensor(a, device=device)
    frozen = Tensor(b, device=device, requires_grad=False)
    zeros = Tensor.zeros(3, device=device)           # a constant: never a .grad
    steps = Tensor.arange(3, device=device)          # integers: never a .grad
    for _ in range(2):
        (w * frozen + zeros + steps).sum().backward()
    tw = torch.tensor(a, requires_grad=True)
    for _ in range(2):
        (tw * torch.tensor(b)).sum().backward()     # torch adds into .grad the same way
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-12)
    assert frozen.grad is None and zeros.grad is None and steps.grad is None


def test_no_grad_stops_a_default_tensor_too(device):
    x = Tensor(uniform(3), device=device)
    with Tensor.test():
        y = x * 2
    (y * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y.numpy())  # only through the second factor


def test_an_optimizer_turns_none_into_true_and_leaves_false_alone(device):
    a, b = uniform(3), uniform(3)
    w = Tensor(a, device=device)
    frozen = Tensor(b, device=device, requires_grad=False)
    assert w.requires_grad is None
    optimizer = SGD([w, frozen], lr=0.5)
    assert w.requires_grad is True and frozen.requires_grad is False
    assert id(w) in AUTOGRAD.leaves and id(frozen) not in AUTOGRAD.leaves
    optimizer.zero_grad()
    loss = (w * frozen).sum() * 2
    loss.backward()
    with Tensor.train():
        optimizer.step()
    tw = torch.tensor(a, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.5)
    ((tw * torch.tensor(b)).sum() * 2).backward()
    topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-6)  # lr is a float32
    np.testing.assert_array_equal(frozen.numpy(), b)
    assert frozen.grad is None


def test_only_float_tensors_can_require_grad():
    with pytest.raises(TypeError, match="only float"):
        Tensor([1, 2], requires_grad=True)
    assert Tensor([1, 2], requires_grad=False).requires_grad is False


def test_leaves_are_held_weakly():
    w = Tensor([1.0, 2.0], requires_grad=True)
    key = id(w)
    assert AUTOGRAD.leaves.get(key) is w
    del w
    gc.collect()
    assert key not in AUTOGRAD.leaves


# ---- contiguous_backward ----

def test_contiguous_backward_keeps_the_value_and_the_gradient(device):
    a, g = uniform(3, 4), uniform(4, 3)
    x = Tensor(a, device=device, requires_grad=True)
    y = x.contiguous_backward().permute(1, 0).exp()
    np.testing.assert_allclose(y.numpy(), np.exp(a).T, rtol=1e-12)
    assert y.requires_grad
    (y * Tensor(g, device=device)).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    (tx.permute(1, 0).exp() * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)


def test_contiguous_backward_puts_a_contiguous_in_the_backward_graph_only(device):
    x = Tensor(uniform(3, 4), device=device, requires_grad=True)
    forward = (x.contiguous_backward() * 2).sum()
    assert Ops.CONTIGUOUS not in {node.op for node in forward.uop.toposort}
    (with_it,) = forward.gradient(x)
    (without,) = (x * 2).sum().gradient(x)
    assert Ops.CONTIGUOUS in {node.op for node in with_it.uop.toposort}
    assert Ops.CONTIGUOUS not in {node.op for node in without.uop.toposort}
    np.testing.assert_array_equal(with_it.numpy(), without.numpy())
    (stopped,) = (x.detach() * 2).sum().gradient(x)  # detach() still stops it
    np.testing.assert_array_equal(stopped.numpy(), np.zeros((3, 4)))


# ---- the no_grad switch and its context manager ----

def test_no_grad_is_tinygrads_plain_switch():
    assert Tensor.no_grad is False
    x = Tensor([1.0, 2.0], requires_grad=True)
    Tensor.no_grad = True
    try:
        assert (x * 2).requires_grad is not True
    finally:
        Tensor.no_grad = False
    assert (x * 2).requires_grad is True


def test_test_mode_as_a_decorator_restores_the_switch():
    x = Tensor([1.0, 2.0], dtype=dtypes.float64, requires_grad=True)

    @Tensor.test()
    def evaluate(t: Tensor) -> Tensor:
        assert Tensor.no_grad
        return t * 3

    y = evaluate(x)
    assert Tensor.no_grad is False and y.requires_grad is not True
    with pytest.raises(ZeroDivisionError):
        with Tensor.test():
            raise ZeroDivisionError
    assert Tensor.no_grad is False  # put back after an exception too
    (dx,) = (y * x).sum().gradient(x)  # y counts as a constant
    np.testing.assert_allclose(dx.numpy(), y.numpy())


def test_train_mode_restores_training():
    assert Tensor.training is False
    with Tensor.train():
        assert Tensor.training is True
        with Tensor.train(False):
            assert Tensor.training is False
        assert Tensor.training is True
    assert Tensor.training is False


# ---- realize: the loss is computed before the step overwrites what it reads ----

def test_loss_realized_after_the_step_reports_the_loss_before_it(device):
    a = uniform(4)
    w = Tensor(a, device=device, requires_grad=True)
    optimizer = SGD([w], lr=0.1)
    loss = (w * w).sum()
    loss.backward()
    with Tensor.train():
        optimizer.step()
    assert loss.item() == pytest.approx(float((a * a).sum()), rel=1e-12)
    np.testing.assert_allclose(w.numpy(), a - 0.1 * 2 * a, rtol=1e-6)  # lr is a float32
