"""Chapter 11b: optimizers stepped side by side with torch.optim (and LAMB with numpy).

Both libraries start from the same parameters and receive the same gradients at each step;
the parameters are compared after every step.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from helpers import ALWAYS, default_device

from tinyteach import GlobalCounters, Tensor, TinyJit, nn

torch = pytest.importorskip("torch")

SHAPES = [(3, 4), (5,)]
STEPS = 4


@pytest.fixture(params=ALWAYS)
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    with default_device(request.param):
        yield request.param


def initial_values(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def gradients(step: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def step_both(make_ours: Callable[[list[Tensor]], Any], make_theirs: Callable[[list[Any]], Any],
              device: str, atol: float = 1e-6, rtol: float = 1e-5) -> None:
    """Run STEPS steps of both optimizers on the same gradients; compare after each step."""
    ours = [Tensor(v, device=device) for v in initial_values()]
    theirs = [torch.tensor(v, requires_grad=True) for v in initial_values()]
    our_optimizer, their_optimizer = make_ours(ours), make_theirs(theirs)
    with Tensor.train():
        for step in range(STEPS):
            our_optimizer.zero_grad()
            their_optimizer.zero_grad()
            for our_param, their_param, grad in zip(ours, theirs, gradients(step)):
                our_param.grad = Tensor(grad, device=device)
                their_param.grad = torch.tensor(grad)
            our_optimizer.step()
            their_optimizer.step()
            for k, (o, t) in enumerate(zip(ours, theirs)):
                np.testing.assert_allclose(o.numpy(), t.detach().numpy(), atol=atol, rtol=rtol,
                                           err_msg=f"parameter {k} after step {step + 1}")


SGD_CASES = [dict(), dict(momentum=0.9), dict(momentum=0.9, nesterov=True),
             dict(momentum=0.5, weight_decay=0.1), dict(weight_decay=0.01)]


@pytest.mark.parametrize("options", SGD_CASES, ids=str)
def test_sgd(device: str, options: dict[str, Any]) -> None:
    step_both(lambda p: nn.optim.SGD(p, lr=0.1, **options),
              lambda p: torch.optim.SGD(p, lr=0.1, **options), device)


def test_adam(device: str) -> None:
    step_both(lambda p: nn.optim.Adam(p, lr=0.01),
              lambda p: torch.optim.Adam(p, lr=0.01), device)


def test_adam_custom_betas(device: str) -> None:
    step_both(lambda p: nn.optim.Adam(p, lr=0.05, b1=0.8, b2=0.99, eps=1e-6),
              lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.8, 0.99), eps=1e-6), device)


@pytest.mark.parametrize("weight_decay", [0.01, 0.3])
def test_adamw(device: str, weight_decay: float) -> None:
    step_both(lambda p: nn.optim.AdamW(p, lr=0.01, weight_decay=weight_decay),
              lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=weight_decay), device)


class NumpyLAMB:
    """LAMB written out in numpy (You et al., 2019, with Adam's bias correction, as tinygrad),
    with torch.optim's interface so step_both can drive it."""

    def __init__(self, params: list[Any], lr: float, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0):
        self.params, self.lr, self.b1, self.b2 = params, lr, b1, b2
        self.eps, self.wd, self.t = eps, weight_decay, 0
        self.m = [np.zeros(p.shape) for p in params]
        self.v = [np.zeros(p.shape) for p in params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        self.t += 1
        for i, p in enumerate(self.params):
            g, w = p.grad.numpy().astype(np.float64), p.detach().numpy().astype(np.float64)
            self.m[i] = self.b1 * self.m[i] + (1 - self.b1) * g
            self.v[i] = self.b2 * self.v[i] + (1 - self.b2) * g * g
            m_hat = self.m[i] / (1 - self.b1 ** self.t)
            v_hat = self.v[i] / (1 - self.b2 ** self.t)
            update = m_hat / (np.sqrt(v_hat) + self.eps) + self.wd * w
            w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(update)
            ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            with torch.no_grad():
                p.copy_(torch.tensor(w - self.lr * ratio * update))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_lamb(device: str, weight_decay: float) -> None:
    step_both(lambda p: nn.optim.LAMB(p, lr=0.02, weight_decay=weight_decay),
              lambda p: NumpyLAMB(p, lr=0.02, weight_decay=weight_decay), device)


def test_lamb_trust_ratio_of_zero_parameter_is_one() -> None:
    """A parameter that is all zeros moves by lr * update (ratio 1), not by 0 or NaN."""
    param = Tensor.zeros(3).contiguous()
    optimizer = nn.optim.LAMB([param], lr=0.1)
    with Tensor.train():
        param.grad = Tensor([1.0, -1.0, 0.0])
        optimizer.step()
    np.testing.assert_allclose(param.numpy(), [-0.1, 0.1, 0.0], atol=1e-5)


def test_lr_can_be_a_tensor_and_changed_between_steps() -> None:
    param = Tensor([1.0, 2.0])
    lr = Tensor([0.5]).reshape(())
    optimizer = nn.optim.SGD([param], lr=lr)
    with Tensor.train():
        for rate, expected in [(0.5, [0.5, 1.5]), (0.25, [0.25, 1.25])]:
            optimizer.lr.assign(Tensor([rate]).reshape(()))
            param.grad = Tensor([1.0, 1.0])
            optimizer.step()
            np.testing.assert_allclose(param.numpy(), expected)


def test_zero_grad_and_parameters_without_gradients_are_skipped() -> None:
    used, unused = Tensor([1.0, 2.0]), Tensor([3.0, 4.0])
    optimizer = nn.optim.Adam([used, unused], lr=0.1)
    assert used.requires_grad and unused.requires_grad  # None became True
    with Tensor.train():
        (used * used).sum().backward()
        assert used.grad is not None and unused.grad is None
        optimizer.step()
        optimizer.zero_grad()
    assert used.grad is None
    np.testing.assert_allclose(unused.numpy(), [3.0, 4.0])
    np.testing.assert_allclose(used.numpy(), [0.9, 1.9], atol=1e-5)  # Adam's first step: lr


def test_step_needs_training_mode_and_trainable_parameters() -> None:
    param = Tensor([1.0])
    optimizer = nn.optim.SGD([param])
    param.grad = Tensor([1.0])
    with pytest.raises(RuntimeError, match="training"):
        optimizer.step()
    with pytest.raises(ValueError, match="requires grad"):
        nn.optim.SGD([Tensor([1.0], requires_grad=False)])


def test_state_lives_in_tensors_updated_with_the_parameters() -> None:
    param = Tensor([1.0, 2.0])
    optimizer = nn.optim.SGD([param], lr=0.1, momentum=0.9)
    with Tensor.train():
        param.grad = Tensor([1.0, 1.0])
        scheduled = optimizer.schedule_step()
    assert any(t is param for t in scheduled) and any(t is optimizer.b[0] for t in scheduled)
    Tensor.realize(*scheduled)
    np.testing.assert_allclose(optimizer.b[0].numpy(), [1.0, 1.0])


def test_adam_step_is_three_kernels_per_parameter_plus_one(device: str) -> None:
    """Each parameter's m, v and new value is one kernel each; b1^t and b2^t share one buffer,
    so one more kernel updates both (the bias corrections read them inside the update kernels).
    The first step also fills m and v with zeros, so the second step is counted."""
    params = [Tensor(v, device=device) for v in initial_values()]
    optimizer = nn.optim.Adam(params, lr=0.01, b1=0.8, b2=0.99)
    with Tensor.train():
        for step in range(2):
            for param, grad in zip(params, gradients(step)):
                param.grad = Tensor(grad, device=device).realize()
            GlobalCounters.reset()
            optimizer.step()
    assert GlobalCounters.kernel_count == 3 * len(params) + 1
    np.testing.assert_allclose(optimizer.beta_powers.numpy(), [0.8 ** 2, 0.99 ** 2], rtol=1e-6)
    np.testing.assert_allclose([optimizer.b1_t.item(), optimizer.b2_t.item()],
                               [0.8 ** 2, 0.99 ** 2], rtol=1e-6)


def test_jitted_training_step_kernel_count() -> None:
    """An MLP step under TinyJit (loss and Adam step in one realize, as the benchmarks do):
    forward, the loss, backward, and 3 kernels per parameter plus one for the beta powers.
    The loss agrees with PyTorch's, step after step."""
    rng = np.random.default_rng(0)
    weights = [rng.uniform(-0.3, 0.3, shape).astype(np.float32)
               for shape in [(32, 16), (32,), (10, 32), (10,)]]
    batches = [(rng.random((8, 16), dtype=np.float32), rng.integers(0, 10, 8).astype(np.int32))
               for _ in range(3)]
    ours = [Tensor(w).realize() for w in weights]
    optimizer = nn.optim.Adam(ours, lr=0.01)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        optimizer.zero_grad()
        hidden = (x @ ours[0].T + ours[1]).relu()
        loss = (hidden @ ours[2].T + ours[3]).sparse_categorical_crossentropy(y).backward()
        Tensor.realize(loss, *optimizer.schedule_step())
        return loss

    theirs = [torch.tensor(w, requires_grad=True) for w in weights]
    torch_optimizer = torch.optim.Adam(theirs, lr=0.01)
    with Tensor.train():
        for k in range(6):
            x, y = batches[k % len(batches)]
            GlobalCounters.reset()
            loss = step(Tensor(x), Tensor(y)).item()
            torch_optimizer.zero_grad()
            hidden = (torch.tensor(x) @ theirs[0].T + theirs[1]).relu()
            expected = torch.nn.functional.cross_entropy(hidden @ theirs[2].T + theirs[3],
                                                         torch.tensor(y, dtype=torch.int64))
            expected.backward()
            torch_optimizer.step()
            assert np.isclose(loss, expected.item(), rtol=1e-5), f"step {k}"
    assert GlobalCounters.kernel_count == 27  # a replayed step
