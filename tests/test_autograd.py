"""Chapter 2: autograd — every gradient rule, and the behaviour of backward(), against PyTorch
and central finite differences (in float64), on every device.

Each rule test builds a small graph that contains the primitive op under test (the test checks
that it is there), weights the output by a random tensor so that every output element matters,
and compares the gradient of each input with PyTorch's and with a finite difference along a
random direction: (f(x + eps*d) - f(x - eps*d)) / 2eps must equal <grad f, d>.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from helpers import default_device

from tinyteach import Tensor, dtypes
from tinyteach.ir.uop import Ops

torch = pytest.importorskip("torch")
F = torch.nn.functional

rng = np.random.default_rng(2024)


def uniform(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return rng.uniform(low, high, size=shape)


def away_from_zero(*shape: int) -> np.ndarray:
    return uniform(*shape, low=0.5, high=2.0) * rng.choice([-1.0, 1.0], size=shape)


@pytest.fixture(params=["NUMPY", "CPU"])
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """The reference interpreter and the compiled C backend. (These tests run in float64,
    which not every GPU backend has; test_ops.py runs the float32 gradients everywhere.)"""
    with default_device(request.param):
        yield request.param


def other_device(device: str) -> str:
    return "CPU" if device == "NUMPY" else "NUMPY"


@dataclass
class Rule:
    """One gradient rule under test: the op that must be in the graph, our function, PyTorch's
    function, the float64 inputs, and whether a finite difference is meaningful there (not at
    ties of max, where the function has a kink)."""

    op: Ops
    ours: Callable[..., Tensor]
    theirs: Callable[..., Any]
    inputs: list[np.ndarray]
    finite_difference: bool = True
    tolerance: float = 1e-10  # against PyTorch
    eps: float = 1e-6         # finite-difference step
    fd_tolerance: float = 1e-5


TIES_A = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [0.0, 5.0, -1.0]])
TIES_B = np.array([[1.0, 4.0, 3.0], [2.0, 1.0, 2.5], [0.0, 5.0, -2.0]])
CONDITION = rng.random((3, 4)) > 0.5


def _where(a: Tensor, b: Tensor) -> Tensor:
    return Tensor(CONDITION, device=a.device).where(a, b)


def _cast_ours(a: Tensor) -> Tensor:
    return (a.cast(dtypes.float32) * 3).cast(dtypes.float64)


RULES: dict[str, Rule] = {
    "add": Rule(Ops.ADD, lambda a, b: a + b, lambda a, b: a + b, [uniform(3, 4), uniform(3, 4)]),
    "add_broadcast": Rule(Ops.EXPAND, lambda a, b: a + b, lambda a, b: a + b,
                          [uniform(2, 3, 4), uniform(3, 1)]),
    "mul": Rule(Ops.MUL, lambda a, b: a * b, lambda a, b: a * b, [uniform(3, 4), uniform(3, 4)]),
    "neg": Rule(Ops.NEG, lambda a: -a, lambda a: -a, [uniform(5)]),
    "exp2": Rule(Ops.EXP2, lambda a: a.exp2(), torch.exp2, [uniform(2, 3)]),
    "log2": Rule(Ops.LOG2, lambda a: a.log2(), torch.log2, [uniform(2, 3, low=0.2, high=3.0)]),
    "sin": Rule(Ops.SIN, lambda a: a.sin(), torch.sin, [uniform(2, 3, low=-4.0, high=4.0)]),
    "sqrt": Rule(Ops.SQRT, lambda a: a.sqrt(), torch.sqrt, [uniform(2, 3, low=0.2, high=3.0)]),
    "reciprocal": Rule(Ops.RECIPROCAL, lambda a: a.reciprocal(), torch.reciprocal,
                       [away_from_zero(2, 3)]),
    # through float32: a step of 1e-6 would drown in rounding; the function is linear
    "cast": Rule(Ops.CAST, _cast_ours, lambda a: (a.float() * 3).double(), [uniform(4)],
                 tolerance=1e-6, eps=1e-2, fd_tolerance=1e-3),
    "maximum": Rule(Ops.MAX, lambda a, b: a.maximum(b), torch.maximum,
                    [uniform(3, 4), uniform(3, 4)]),
    "maximum_ties": Rule(Ops.MAX, lambda a, b: a.maximum(b), torch.maximum, [TIES_A, TIES_B],
                         finite_difference=False),
    "where": Rule(Ops.WHERE, _where, lambda a, b: torch.where(torch.tensor(CONDITION), a, b),
                  [uniform(3, 4), uniform(3, 4)]),
    "sum": Rule(Ops.REDUCE_AXIS, lambda a: a.sum((0, 2)), lambda a: a.sum((0, 2)),
                [uniform(2, 3, 4)]),
    "sum_all": Rule(Ops.REDUCE_AXIS, lambda a: a.sum(), lambda a: a.sum(), [uniform(2, 3)]),
    "max_axis": Rule(Ops.REDUCE_AXIS, lambda a: a.max(1), lambda a: torch.amax(a, 1),
                     [uniform(3, 5)]),
    "max_axis_ties": Rule(Ops.REDUCE_AXIS, lambda a: a.max(1), lambda a: torch.amax(a, 1),
                          [TIES_A], finite_difference=False),
    "max_all_ties": Rule(Ops.REDUCE_AXIS, lambda a: a.max(), torch.amax,
                         [np.array([[1.0, 3.0], [3.0, -2.0]])], finite_difference=False),
    "reshape": Rule(Ops.RESHAPE, lambda a: a.reshape(6, 4) * 1.5,
                    lambda a: a.reshape(6, 4) * 1.5, [uniform(2, 3, 4)]),
    "permute": Rule(Ops.PERMUTE, lambda a: a.permute(2, 0, 1), lambda a: a.permute(2, 0, 1),
                    [uniform(2, 3, 4)]),
    "expand": Rule(Ops.EXPAND, lambda a: a.expand(3, 2, 4), lambda a: a.expand(3, 2, 4),
                   [uniform(1, 2, 1)]),
    "pad": Rule(Ops.PAD, lambda a: a.pad(((1, 2), (0, 1))), lambda a: F.pad(a, (0, 1, 1, 2)),
                [uniform(2, 3)]),
    "shrink": Rule(Ops.SHRINK, lambda a: a.shrink(((1, 3), (0, 2))), lambda a: a[1:3, 0:2],
                   [uniform(4, 3)]),
    "flip": Rule(Ops.FLIP, lambda a: a.flip((0, 1)), lambda a: torch.flip(a, (0, 1)),
                 [uniform(3, 4)]),
    "contiguous": Rule(Ops.CONTIGUOUS, lambda a: a.T.contiguous() * a.T,
                       lambda a: a.T.contiguous() * a.T, [uniform(3, 2)]),
    # (no finite difference: numerically, a * a.detach() is a * a)
    "detach": Rule(Ops.DETACH, lambda a: a * a.detach(), lambda a: a * a.detach(),
                   [uniform(3, 2)], finite_difference=False),
    "div": Rule(Ops.FDIV, lambda a, b: a / b, lambda a, b: a / b,
                [uniform(3, 4), away_from_zero(3, 4)]),
}


def ours_with_gradients(fn: Callable[..., Tensor], arrays: list[np.ndarray],
                        weight: np.ndarray, device: str) -> tuple[Tensor, list[np.ndarray]]:
    inputs = [Tensor(a, device=device, requires_grad=True) for a in arrays]
    out = fn(*inputs)
    (out * Tensor(weight, device=device)).sum().backward()
    grads = [t.grad for t in inputs]
    assert all(g is not None for g in grads)
    return out, [g.numpy() for g in grads]  # type: ignore[union-attr]


def torch_with_gradients(fn: Callable[..., Any], arrays: list[np.ndarray],
                         weight: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    inputs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*inputs)
    (out * torch.tensor(weight)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in inputs]


def directional_derivative(fn: Callable[..., Tensor], arrays: list[np.ndarray],
                           weight: np.ndarray, direction: list[np.ndarray], device: str,
                           eps: float = 1e-6) -> float:
    """The central finite difference of sum(fn(x) * weight) along `direction`."""
    def value(step: float) -> float:
        moved = [Tensor(a + step * d, device=device) for a, d in zip(arrays, direction)]
        result = (fn(*moved) * Tensor(weight, device=device)).sum().item()
        return float(result)
    return (value(eps) - value(-eps)) / (2 * eps)


@pytest.mark.parametrize("name", list(RULES))
def test_gradient_rule(device, name):
    rule = RULES[name]
    out_shape = torch_with_gradients(rule.theirs, rule.inputs, np.ones(()))[0].shape
    weight = uniform(*out_shape)
    out, grads = ours_with_gradients(rule.ours, rule.inputs, weight, device)
    assert rule.op in {node.op for node in out.uop.toposort}, f"{rule.op.name} not in graph"
    expected_out, expected_grads = torch_with_gradients(rule.theirs, rule.inputs, weight)
    tolerance = rule.tolerance
    np.testing.assert_allclose(out.numpy(), expected_out, rtol=tolerance, atol=tolerance)
    for k, (grad, expected) in enumerate(zip(grads, expected_grads)):
        np.testing.assert_allclose(grad, expected, rtol=tolerance, atol=tolerance,
                                   err_msg=f"gradient of input {k}")
    if rule.finite_difference:
        direction = [uniform(*a.shape) for a in rule.inputs]
        numeric = directional_derivative(rule.ours, rule.inputs, weight, direction, device,
                                         rule.eps)
        analytic = sum(float((g * d).sum()) for g, d in zip(grads, direction))
        assert numeric == pytest.approx(analytic, rel=rule.fd_tolerance, abs=1e-6)


def test_every_differentiable_primitive_is_covered():
    from tinyteach.tensor import gradient
    covered = {rule.op for rule in RULES.values()} | {Ops.COPY}  # COPY: test_copy_...
    no_gradient = {op for op, rule in gradient.GRADIENT_RULES.items()
                   if rule is gradient._no_grad}
    assert Ops.CMPLT in no_gradient and Ops.ADD not in no_gradient
    assert set(gradient.GRADIENT_RULES) - no_gradient <= covered


def test_copy_between_devices(device):
    """COPY's gradient goes back to the device the tensor came from."""
    elsewhere = other_device(device)
    a = uniform(3, 4)
    weight = uniform(3, 4)
    x = Tensor(a, device=device, requires_grad=True)
    moved = x.to(elsewhere)
    assert moved.device == elsewhere
    out = (moved.sin() * Tensor(weight, device=elsewhere)).to(device) * 2
    out.sum().backward()
    assert x.grad is not None and x.grad.device == device
    np.testing.assert_allclose(x.grad.numpy(), 2 * weight * np.cos(a), rtol=1e-12)


def test_no_gradient_through_comparisons_and_integer_ops(device):
    x = Tensor(uniform(5), device=device, requires_grad=True)
    mask = (x > 0).cast(dtypes.float64)                    # CMPLT, then CAST from bool
    counts = (x.cast(dtypes.int32) // 2).cast(dtypes.float64)  # IDIV
    (x * mask + counts).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), (x.numpy() > 0).astype(np.float64))


# ---- composite graphs against PyTorch ----

def _compare_parameters(ours: list[Tensor], theirs: list[Any], rtol: float = 1e-9) -> None:
    for k, (o, t) in enumerate(zip(ours, theirs)):
        assert o.grad is not None, f"parameter {k} has no gradient"
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=rtol,
                                   err_msg=f"gradient of parameter {k}")


def _parameters(arrays: list[np.ndarray], device: str) -> tuple[list[Tensor], list[Any]]:
    ours = [Tensor(a, device=device, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    return ours, theirs


def test_mlp(device):
    arrays = [uniform(8, 5), uniform(5, 16) * 0.5, uniform(16) * 0.1, uniform(16, 3) * 0.5,
              uniform(3) * 0.1]
    labels = rng.integers(0, 3, size=8)
    (x, w1, b1, w2, b2), theirs = _parameters(arrays, device)
    loss = x.linear(w1, b1).relu().linear(w2, b2).sparse_categorical_crossentropy(
        Tensor(labels, device=device))
    loss.backward()
    tx, tw1, tb1, tw2, tb2 = theirs
    expected = F.cross_entropy(F.relu(tx @ tw1 + tb1) @ tw2 + tb2, torch.tensor(labels))
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10)
    _compare_parameters([x, w1, b1, w2, b2], theirs)


def test_small_conv_net(device):
    """conv2d (padding) -> relu -> max_pool2d -> flatten -> linear -> cross-entropy."""
    arrays = [uniform(2, 2, 6, 6), uniform(3, 2, 3, 3) * 0.5, uniform(3) * 0.1,
              uniform(27, 4) * 0.3]
    labels = np.array([1, 3])
    (x, w, b, fc), theirs = _parameters(arrays, device)
    hidden = x.conv2d(w, b, padding=1).relu().max_pool2d(2)
    loss = hidden.flatten(1).dot(fc).sparse_categorical_crossentropy(Tensor(labels, device=device))
    loss.backward()
    tx, tw, tb, tfc = theirs
    t_hidden = F.max_pool2d(F.relu(F.conv2d(tx, tw, tb, padding=1)), 2)
    expected = F.cross_entropy(t_hidden.flatten(1) @ tfc, torch.tensor(labels))
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10)
    _compare_parameters([x, w, b, fc], theirs)


@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_and_log_softmax(device, axis):
    (x,), (tx,) = _parameters([uniform(3, 4) * 3], device)
    weight = uniform(3, 4)
    out = x.softmax(axis) * Tensor(weight, device=device) + x.log_softmax(axis)
    out.sum().backward()
    expected = F.softmax(tx, axis) * torch.tensor(weight) + F.log_softmax(tx, axis)
    expected.sum().backward()
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-10)
    _compare_parameters([x], [tx])


def test_layernorm(device):
    (x,), (tx,) = _parameters([uniform(4, 6)], device)
    weight = uniform(4, 6)
    (x.layernorm() * Tensor(weight, device=device)).sum().backward()
    (F.layer_norm(tx, (6,)) * torch.tensor(weight)).sum().backward()
    _compare_parameters([x], [tx], rtol=1e-8)


# ---- backward(), gradient(), .grad, no_grad and detach ----

def test_gradient_returns_gradients_without_touching_grad(device):
    x = Tensor(uniform(4), device=device, requires_grad=True)
    y = x * 2
    loss = (y * y).sum()
    grad_y, grad_x = loss.gradient(y, x)
    np.testing.assert_allclose(grad_y.numpy(), 2 * y.numpy())
    np.testing.assert_allclose(grad_x.numpy(), 8 * x.numpy())
    assert x.grad is None and y.grad is None
    (again,) = loss.gradient(x)  # asking twice gives the same answer, nothing accumulates
    np.testing.assert_allclose(again.numpy(), 8 * x.numpy())


def test_grad_accumulates_over_two_backward_calls(device):
    a = uniform(3)
    x = Tensor(a, device=device, requires_grad=True)
    loss = (x * x * x).sum()
    loss.backward()
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * 3 * a * a)


def test_tensor_used_twice(device):
    a, b = uniform(2, 3), uniform(3)
    (x, y), (tx, ty) = _parameters([a, b], device)
    ((x * y + x.exp() * x) * y).sum().backward()
    ((tx * ty + tx.exp() * tx) * ty).sum().backward()
    _compare_parameters([x, y], [tx, ty])


def test_no_grad_as_context_manager(device):
    x = Tensor(uniform(3), device=device, requires_grad=True)
    with Tensor.test():  # tinygrad's context manager: Tensor.no_grad is True inside
        assert Tensor.no_grad
        y = x * 2
        with Tensor.test():  # nested
            z = x * 3
        assert Tensor.no_grad
    assert not Tensor.no_grad
    assert not y.requires_grad and not z.requires_grad
    (y * x + z).sum().backward()  # y and z count as constants
    np.testing.assert_allclose(x.grad.numpy(), y.numpy())


def test_no_grad_as_switch(device):
    x = Tensor(uniform(3), device=device, requires_grad=True)
    previous = Tensor.no_grad
    Tensor.no_grad = True
    try:
        assert Tensor.no_grad
        y = x * 2
        with Tensor.test():  # the context manager still works while the switch is on
            pass
        assert Tensor.no_grad  # and leaving the block keeps the switch on
    finally:
        Tensor.no_grad = previous
    assert not Tensor.no_grad
    assert not y.requires_grad
    z = x * 2
    assert z.requires_grad
    (y * z).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * y.numpy())


def test_parameter_update_under_no_grad(device):
    """An SGD step as an optimizer writes it: the new value is a leaf, not a graph to x0."""
    a = uniform(4)
    x = Tensor(a, device=device, requires_grad=True)
    (x * x).sum().backward()
    with Tensor.test():
        x.assign(x - 0.25 * x.grad)
    x.grad = None
    (x * x).sum().backward()  # without realizing x in between
    np.testing.assert_allclose(x.grad.numpy(), 2 * (a - 0.25 * 2 * a))


def test_detach_stops_gradients(device):
    x = Tensor(uniform(3), device=device, requires_grad=True)
    frozen = (x * 3).detach()
    assert not frozen.requires_grad
    (frozen * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * x.numpy())
    np.testing.assert_allclose(frozen.grad.numpy(), x.numpy())  # a float tensor in the graph
    before = x.grad.numpy()
    frozen.sum().backward()  # adds 1 to frozen.grad, and stops at the detach
    np.testing.assert_allclose(x.grad.numpy(), before)
    np.testing.assert_allclose(frozen.grad.numpy(), x.numpy() + 1)
    with pytest.raises(RuntimeError, match="nothing in this graph can have a gradient"):
        Tensor(uniform(3), device=device, requires_grad=False).sum().backward()


def test_backward_after_the_loss_was_realized(device):
    a = uniform(2, 3)
    x = Tensor(a, device=device, requires_grad=True)
    loss = (x.exp() * x).sum()
    value = loss.item()
    assert value == pytest.approx(float((np.exp(a) * a).sum()), rel=1e-12)
    loss.realize()
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(a) * (a + 1), rtol=1e-12)


def test_backward_through_a_realized_intermediate(device):
    a = uniform(2, 3)
    x = Tensor(a, device=device, requires_grad=True)
    hidden = (x * x).realize()
    (hidden.sin()).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.cos(a * a) * 2 * a, rtol=1e-12)


def test_backward_with_an_output_gradient(device):
    a, upstream = uniform(2, 3), uniform(2, 3)
    x = Tensor(a, device=device, requires_grad=True)
    (x * x).backward(Tensor(upstream, device=device))
    np.testing.assert_allclose(x.grad.numpy(), 2 * a * upstream)


def test_requires_grad_propagates(device):
    x = Tensor(uniform(3), device=device, requires_grad=True)
    plain = Tensor(uniform(3), device=device)
    assert (x * plain).requires_grad
    assert not (plain * 2).requires_grad
    assert (x.to(other_device(device))).requires_grad


# ---- the seed example ----

def test_seed_example_model(device):
    """tinygrad's README model: kaiming_uniform weights, flatten -> dot -> relu -> dot,
    sparse_categorical_crossentropy; gradients equal PyTorch's for the same weights."""
    Tensor.manual_seed(0)
    l1 = Tensor.kaiming_uniform(784, 128, device=device)
    l2 = Tensor.kaiming_uniform(128, 10, device=device)
    l1.requires_grad = l2.requires_grad = True
    x, y = Tensor.rand(4, 1, 28, 28, device=device), Tensor([2, 4, 3, 7], device=device)
    loss = x.flatten(1).dot(l1).relu().dot(l2).sparse_categorical_crossentropy(y).backward()
    bound = np.sqrt(3.0) * np.sqrt(2.0 / (1 + 0.01 ** 2)) / np.sqrt(128)  # tinygrad's
    assert 0.9 * bound < np.abs(l1.numpy()).max() <= bound * (1 + 1e-6)
    t1 = torch.tensor(l1.numpy(), requires_grad=True)
    t2 = torch.tensor(l2.numpy(), requires_grad=True)
    expected = F.cross_entropy(F.relu(torch.tensor(x.numpy()).flatten(1) @ t1) @ t2,
                               torch.tensor([2, 4, 3, 7]))
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    _compare_parameters([l1, l2], [t1, t2], rtol=1e-5)


# ---- composite ops that state their own gradient (gradient.register_gradient) ----

def test_a_registered_rule_is_used_instead_of_the_primitive_rules():
    """The walk sends a registered node's gradient straight to its inputs, by the rule (a rule
    that gives another number than the primitive rules shows which one ran)."""
    from tinyteach.tensor.gradient import register_gradient
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    register_gradient(y.uop, (x.uop,), lambda grad, source: (grad * 3,))
    (y * 1).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [3.0, 3.0]
    z = Tensor([1.0, 2.0], requires_grad=True)
    (z * 2).sum().backward()  # an unregistered node: the rules
    assert z.grad is not None and z.grad.tolist() == [2.0, 2.0]


def test_conv2d_keeps_its_rule_when_its_input_was_realized():
    """backward() rebuilds a realized input's graph (graph_before_realize); the conv rebuilt on
    it keeps its rule: its input gradient is one convolution, and equals PyTorch's."""
    from tinyteach.engine.realize import build_schedule
    x_np, w_np = uniform(2, 3, 8, 8).astype(np.float32), uniform(4, 3, 3, 3).astype(np.float32)
    x = Tensor(x_np, requires_grad=True)
    hidden = (x * 2).realize()
    hidden.conv2d(Tensor(w_np)).sum().backward()
    assert x.grad is not None
    kernels = [i for i in build_schedule([x.grad.uop], "CPU").items if i.kind == "kernel"]
    sums = [k for k in kernels if any(n.op is Ops.REDUCE_AXIS for n in k.ast.toposort)]
    assert len(sums) == 1, [k.name for k in kernels]
    tx = torch.tensor(x_np, requires_grad=True)
    F.conv2d(tx * 2, torch.tensor(w_np)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
