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
    forward, the loss, backward, and 3 kernels per parameter plus one for the beta powers,
    and the two live tensors that read the old weights, computed before the update (`hidden`,
    a local, and `x.grad`: x gets a gradient by tinygrad's rule). The loss agrees with
    PyTorch's, step after step."""
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
    assert GlobalCounters.kernel_count == 27 + 2  # a replayed step


# ---- SGD's classic rule, LARS and Muon (tinygrad's; torch.optim has no LARS) ----

@pytest.mark.parametrize("options", [dict(momentum=0.9), dict(momentum=0.9, nesterov=True),
                                     dict(momentum=0.5, weight_decay=0.1)], ids=str)
def test_sgd_classic_momentum_folds_the_rate_into_the_buffer(device: str,
                                                             options: dict[str, Any]) -> None:
    """classic=True: b = mu*b + lr*g, p -= b. With a constant lr that is PyTorch's rule with
    the buffer scaled by lr, so the parameters agree with torch.optim.SGD."""
    step_both(lambda p: nn.optim.SGD(p, lr=0.1, classic=True, **options),
              lambda p: torch.optim.SGD(p, lr=0.1, **options), device)


class NumpyLARS:
    """LARS as You et al. (2017), Algorithm 1 (classic=True) or with the rate applied after the
    momentum (classic=False), written out in float64 numpy behind torch.optim's interface."""

    def __init__(self, params: list[Any], lr: float, momentum: float, weight_decay: float,
                 tcoef: float, classic: bool = True, nesterov: bool = False):
        self.params, self.lr, self.mu, self.wd, self.eta = params, lr, momentum, weight_decay, tcoef
        self.classic, self.nesterov = classic, nesterov
        self.b = [np.zeros(p.shape) for p in params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        for i, p in enumerate(self.params):
            g, w = p.grad.numpy().astype(np.float64), p.detach().numpy().astype(np.float64)
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            local_lr = self.eta * w_norm / (g_norm + self.wd * w_norm)
            if w_norm == 0 or g_norm == 0:
                local_lr = 1.0
            d = g + self.wd * w
            if self.classic:
                d = self.lr * local_lr * d
            self.b[i] = self.mu * self.b[i] + d
            d = d + self.mu * self.b[i] if self.nesterov else self.b[i]
            if not self.classic:
                d = self.lr * local_lr * d
            with torch.no_grad():
                p.copy_(torch.tensor(w - d))


LARS_CASES = [dict(), dict(classic=False), dict(nesterov=True), dict(tcoef=0.02, momentum=0.5),
              dict(weight_decay=0.0, classic=False, nesterov=True)]


@pytest.mark.parametrize("options", LARS_CASES, ids=str)
def test_lars(device: str, options: dict[str, Any]) -> None:
    settings: dict[str, Any] = dict(momentum=0.9, weight_decay=1e-4, tcoef=0.001) | options
    step_both(lambda p: nn.optim.LARS(p, lr=0.5, **settings),
              lambda p: NumpyLARS(p, lr=0.5, **settings), device)


def test_lars_ratio_of_a_zero_parameter_is_one() -> None:
    param = Tensor.zeros(2).contiguous()
    optimizer = nn.optim.LARS([param], lr=0.1, momentum=0.0)
    with Tensor.train():
        param.grad = Tensor([1.0, -2.0])
        optimizer.step()
    np.testing.assert_allclose(param.numpy(), [-0.1, 0.2], atol=1e-6)


def numpy_newton_schulz(g: np.ndarray, steps: int, coefficients: tuple[float, ...],
                        eps: float = 1e-7) -> np.ndarray:
    """Muon's iteration in float64 (Jordan et al., 2024), on the wide orientation."""
    if g.shape[0] > g.shape[1]:
        return numpy_newton_schulz(g.T, steps, coefficients, eps).T
    x = g / (np.linalg.norm(g) + eps)
    for _ in range(steps):
        gram = x @ x.T
        x = sum(c * np.linalg.matrix_power(gram, k) @ x for k, c in enumerate(coefficients))
    return x


MUON = (3.4445, -4.775, 2.0315)


@pytest.mark.parametrize("shape", [(3, 5), (6, 2), (4, 4)])
def test_newton_schulz_against_numpy_and_svd(device: str, shape: tuple[int, int]) -> None:
    """The iteration agrees with numpy's, and pushes the singular values of the result into
    Muon's band around 1 while keeping the singular vectors (U V^T of the input's SVD)."""
    g = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ours = nn.optim.newton_schulz(Tensor(g, device=device), 5, MUON).numpy()
    np.testing.assert_allclose(ours, numpy_newton_schulz(g.astype(np.float64), 5, MUON),
                               atol=1e-5)
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    in_input_basis = u.T @ ours @ vt.T  # diagonal: the same singular vectors, new values
    singular = np.diag(in_input_basis)
    np.testing.assert_allclose(in_input_basis - np.diag(singular), 0.0, atol=1e-5)
    assert singular.min() > 0.6 and singular.max() < 1.25, singular


def test_newton_schulz_classic_cubic_converges_to_the_polar_factor() -> None:
    """With (1.5, -0.5) (the classic cubic) many steps converge to U V^T exactly."""
    g = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    ours = nn.optim.newton_schulz(Tensor(g), 40, (1.5, -0.5)).numpy()
    np.testing.assert_allclose(ours, u @ vt, atol=1e-4)
    with pytest.raises(ValueError, match="matrix"):
        nn.optim.newton_schulz(Tensor([1.0, 2.0]), 5, MUON)


class NumpyMuon:
    """Muon in float64 numpy: PyTorch's averaged momentum, Newton-Schulz, decoupled decay."""

    def __init__(self, params: list[Any], lr: float, momentum: float, weight_decay: float,
                 nesterov: bool = True):
        self.params, self.lr, self.mu, self.wd, self.nesterov = (params, lr, momentum,
                                                                 weight_decay, nesterov)
        self.b = [np.zeros(p.shape) for p in params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        for i, p in enumerate(self.params):
            g, w = p.grad.numpy().astype(np.float64), p.detach().numpy().astype(np.float64)
            self.b[i] = self.mu * self.b[i] + (1 - self.mu) * g
            update = (1 - self.mu) * g + self.mu * self.b[i] if self.nesterov else self.b[i]
            matrix = update.reshape(update.shape[0], -1)
            update = numpy_newton_schulz(matrix, 5, MUON).reshape(update.shape)
            with torch.no_grad():
                p.copy_(torch.tensor(w * (1 - self.lr * self.wd) - self.lr * update))


@pytest.mark.parametrize("options", [dict(), dict(nesterov=False), dict(weight_decay=0.0),
                                     dict(momentum=0.8, weight_decay=0.3)], ids=str)
def test_muon_against_numpy(device: str, options: dict[str, Any]) -> None:
    settings: dict[str, Any] = dict(momentum=0.95, weight_decay=0.1) | options
    step_both(lambda p: nn.optim.Muon(p, lr=0.05, **settings),
              lambda p: NumpyMuon(p, lr=0.05, **settings), device, atol=1e-5)


def test_muon_against_torch_optim_muon() -> None:
    """torch.optim.Muon orthogonalizes in bfloat16, so the parameters agree to about 1% of a
    step (lr 0.05, entries of a step about 0.5 * lr); a wide matrix, where torch leaves lr as
    given (it scales it by sqrt(rows/cols) for a tall one; tinygrad does not)."""
    rng = np.random.default_rng(3)
    initial = rng.standard_normal((4, 6)).astype(np.float32)
    ours, theirs = Tensor(initial), torch.tensor(initial, requires_grad=True)
    our_optimizer = nn.optim.Muon([ours], lr=0.05)
    their_optimizer = torch.optim.Muon([theirs], lr=0.05)
    with Tensor.train():
        for step in range(4):
            grad = rng.standard_normal(initial.shape).astype(np.float32)
            ours.grad, theirs.grad = Tensor(grad), torch.tensor(grad)
            our_optimizer.step()
            their_optimizer.step()
            np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), atol=2e-3,
                                       err_msg=f"after step {step + 1}")


def test_muon_on_a_conv_weight_and_a_bias(device: str) -> None:
    """A 4-d weight is orthogonalized as (out, in*kh*kw), a bias as a column (tinygrad's rule)."""
    rng = np.random.default_rng(4)
    shapes = [(3, 2, 2, 2), (3,)]
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [Tensor(v, device=device) for v in values]
    optimizer = nn.optim.Muon(params, lr=0.1, weight_decay=0.0, momentum=0.0, nesterov=False)
    with Tensor.train():
        for param, grad in zip(params, grads):
            param.grad = Tensor(grad, device=device)
        optimizer.step()
    for param, value, grad in zip(params, values, grads):
        matrix = grad.astype(np.float64).reshape(grad.shape[0], -1)
        expected = value - 0.1 * numpy_newton_schulz(matrix, 5, MUON).reshape(grad.shape)
        np.testing.assert_allclose(param.numpy(), expected, atol=1e-5)


def test_optimizer_group_steps_both_in_one_schedule(device: str) -> None:
    rng = np.random.default_rng(5)
    matrix, vector = rng.standard_normal((3, 4)), rng.standard_normal(4)
    ours = [Tensor(matrix.astype(np.float32)), Tensor(vector.astype(np.float32))]
    theirs = [torch.tensor(v.astype(np.float32), requires_grad=True) for v in (matrix, vector)]
    group = nn.optim.OptimizerGroup(nn.optim.Muon([ours[0]], lr=0.05),
                                    nn.optim.AdamW([ours[1]], lr=0.01))
    their_group = [torch.optim.Muon([theirs[0]], lr=0.05), torch.optim.AdamW([theirs[1]], lr=0.01)]
    assert group[0].params == [ours[0]] and len(group.params) == 2
    with Tensor.train():
        for _ in range(3):
            grads = [rng.standard_normal(v.shape).astype(np.float32) for v in (matrix, vector)]
            group.zero_grad()
            for o, t, g in zip(ours, theirs, grads):
                o.grad, t.grad = Tensor(g), torch.tensor(g)
            group.step()
            for optimizer in their_group:
                optimizer.step()
    np.testing.assert_allclose(ours[0].numpy(), theirs[0].detach().numpy(), atol=2e-3)
    np.testing.assert_allclose(ours[1].numpy(), theirs[1].detach().numpy(), atol=1e-6)


@pytest.mark.parametrize("make, message", [
    (lambda p: nn.optim.SGD(p, lr=-0.1), "learning rate"),
    (lambda p: nn.optim.LARS(p, momentum=-0.5), "momentum"),
    (lambda p: nn.optim.Muon(p, weight_decay=-1.0), "weight_decay"),
    (lambda p: nn.optim.Adam(p, b1=1.0), "b1"),
    (lambda p: nn.optim.LAMB(p, eps=-1e-6), "eps"),
    (lambda p: nn.optim.SGD(p, nesterov=True), "nesterov"),
])
def test_bad_hyperparameters_are_refused(make: Callable[[list[Tensor]], Any],
                                         message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make([Tensor([1.0])])


# ---- APOLLO ----

class NumpyAPOLLO:
    """APOLLO (Zhu et al., 2024, Algorithm 1, with tinygrad's choices: channel scaling, the
    1.01 norm-growth limiter, decay applied to the updated weights) in float64 numpy. The
    random projection is the one the tinyteach optimizer drew (read from its state)."""

    def __init__(self, params: list[np.ndarray], ours: Any, lr: float, weight_decay: float,
                 scale_type: str, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6):
        self.params, self.ours, self.lr, self.wd = params, ours, lr, weight_decay
        self.scale_type, self.b1, self.b2, self.eps, self.t = scale_type, b1, b2, eps, 0
        self.m: list[Any] = [None] * len(params)
        self.v: list[Any] = [None] * len(params)
        self.previous_norm: list[float] = [0.0] * len(params)

    def moments(self, i: int, g: np.ndarray) -> np.ndarray:
        m = self.m[i] if self.m[i] is not None else np.zeros_like(g)
        v = self.v[i] if self.v[i] is not None else np.zeros_like(g)
        self.m[i] = self.b1 * m + (1 - self.b1) * g
        self.v[i] = self.b2 * v + (1 - self.b2) * g * g
        return self.m[i] / (np.sqrt(self.v[i]) + self.eps)

    def direction(self, i: int, g: np.ndarray) -> np.ndarray:
        if g.ndim != 2:
            return self.moments(i, g)
        right = g.shape[0] >= g.shape[1]
        projection = self.ours.projs[self.ours.proj_index[i]].numpy().astype(np.float64)
        low = g @ projection.T if right else projection.T @ g
        step = self.moments(i, low)
        if self.scale_type == "tensor":
            scaling = np.linalg.norm(step) / (np.linalg.norm(low) + 1e-8)
        else:
            axis = 1 if right else 0
            scaling = np.linalg.norm(step, axis=axis) / (np.linalg.norm(low, axis=axis) + 1e-8)
            scaling = scaling[:, None] if right else scaling[None, :]
        direction = g * scaling
        norm = np.linalg.norm(direction)
        if self.t > 1:
            limiter = max(norm / (self.previous_norm[i] + 1e-8), 1.01) / 1.01
            direction, norm = direction / limiter, norm / limiter
        self.previous_norm[i] = norm
        return direction

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        step_size = self.lr * np.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t)
        for i, g in enumerate(grads):
            updated = self.params[i] - step_size * self.direction(i, g)
            self.params[i] = updated * (1 - self.lr * self.wd)


@pytest.mark.parametrize("options", [dict(scale_type="channel", weight_decay=0.0),
                                     dict(scale_type="tensor", weight_decay=0.1)], ids=str)
def test_apollo_against_numpy(device: str, options: dict[str, Any]) -> None:
    """A wide and a tall matrix (projected to rank 2 on their smaller side) and a vector (plain
    Adam moments), five steps, parameters compared after each."""
    rng = np.random.default_rng(6)
    shapes = [(3, 5), (6, 3), (4,)]
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ours = [Tensor(v, device=device) for v in values]
    optimizer = nn.optim.APOLLO(ours, lr=0.05, rank=2, **options)
    assert [p.shape for p in optimizer.projs] == [(3, 2), (2, 3)]
    reference = NumpyAPOLLO([v.astype(np.float64) for v in values], optimizer, lr=0.05,
                            **options)
    with Tensor.train():
        for step in range(5):
            grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
            for param, grad in zip(ours, grads):
                param.grad = Tensor(grad, device=device)
            optimizer.step()
            reference.step([g.astype(np.float64) for g in grads])
            for k, (o, t) in enumerate(zip(ours, reference.params)):
                np.testing.assert_allclose(o.numpy(), t, atol=2e-5, rtol=1e-4,
                                           err_msg=f"parameter {k} after step {step + 1}")


def test_apollo_redraws_its_projection_every_gap_steps() -> None:
    param = Tensor(np.ones((4, 6), dtype=np.float32))
    optimizer = nn.optim.APOLLO([param], rank=2, update_proj_gap=2)
    seen = []
    with Tensor.train():
        for _ in range(4):
            param.grad = Tensor(np.ones((4, 6), dtype=np.float32))
            optimizer.step()
            seen.append(optimizer.projs[0].numpy())
    np.testing.assert_array_equal(seen[0], seen[1])
    np.testing.assert_array_equal(seen[2], seen[3])
    assert not np.allclose(seen[1], seen[2])
    assert abs(np.concatenate(seen).std() * np.sqrt(2) - 1) < 0.5  # N(0, 1) / sqrt(rank)
    with pytest.raises(ValueError, match="random"):
        nn.optim.APOLLO([param], proj="svd")


# tinygrad's signatures (nn/optim.py), less `device` and `fused` (FUSE_OPTIM), which tinyteach
# does not have: its state lives on the parameters' device, one buffer per parameter
TINYGRAD_SIGNATURES = {
    "SGD": ["params", "lr", "momentum", "weight_decay", "nesterov", "classic"],
    "Muon": ["params", "lr", "momentum", "weight_decay", "ns_steps", "ns_coefficients",
             "nesterov"],
    "LARS": ["params", "lr", "momentum", "weight_decay", "ns_steps", "ns_coefficients",
             "nesterov", "classic", "pre_wd", "tcoef"],
    "AdamW": ["params", "lr", "b1", "b2", "eps", "weight_decay"],
    "Adam": ["params", "lr", "b1", "b2", "eps"],
    "LAMB": ["params", "lr", "b1", "b2", "eps", "weight_decay", "adam"],
    "APOLLO": ["params", "lr", "b1", "b2", "eps", "weight_decay", "rank", "proj", "scale_type",
               "scale", "update_proj_gap", "proj_type", "scale_front", "disable_nl",
               "correct_bias"],
}
TINYGRAD_DEFAULTS = {"SGD": dict(lr=0.001, momentum=0.0, weight_decay=0.0),
                     "Muon": dict(lr=0.001, momentum=0.95, weight_decay=0.1, ns_steps=5),
                     "LARS": dict(momentum=0.9, weight_decay=1e-4, tcoef=0.001, classic=True),
                     "AdamW": dict(weight_decay=0.01, eps=1e-8), "LAMB": dict(eps=1e-6),
                     "APOLLO": dict(rank=256, update_proj_gap=200, eps=1e-6)}


@pytest.mark.parametrize("name", sorted(TINYGRAD_SIGNATURES))
def test_optimizer_signatures_follow_tinygrad(name: str) -> None:
    import inspect
    parameters = inspect.signature(getattr(nn.optim, name)).parameters
    assert list(parameters) == TINYGRAD_SIGNATURES[name]
    for argument, default in TINYGRAD_DEFAULTS.get(name, {}).items():
        assert parameters[argument].default == default, argument
