"""Chapter 11b: Optimizers — a training step is one more lazy graph.

What this teaches:
- an optimizer step builds, for every parameter, the graph of its new value from its gradient
  and the optimizer's state, and `assign`s it; nothing runs until `step()` realizes the new
  parameters *and* the new state together. So the whole step is a handful of kernels, and a JIT
  (chapter 10) can capture it like any other function;
- the state — momentum buffers, Adam's moments m and v, the bias-correction powers beta^t that
  count the steps — is Tensors too, updated with `assign`, never Python numbers that change.
  Each state tensor updated is one kernel, so Adam keeps b1^t and b2^t in one two-element
  buffer: a step is 3 kernels per parameter (m, v, the parameter) and one for the powers;
- the update rules (PyTorch's, which tinygrad's match):
  SGD      g = grad + wd*p;  b = mu*b + g;  g = g + mu*b (nesterov) or b;      p -= lr*g
  Adam     m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
           m_hat = m / (1-b1^t);  v_hat = v / (1-b2^t);  u = m_hat / (sqrt(v_hat) + eps)
  AdamW    p -= lr * (u + wd*p)                   (decay decoupled from the moments)
  LAMB     u = m_hat / (sqrt(v_hat) + eps) + wd*p;  r = |p| / |u| (1 where either is 0)
           p -= lr * r * u                        (a trust ratio per parameter tensor)
- parameters passed with requires_grad=None become trainable (requires_grad=True); tensors with
  requires_grad=False (BatchNorm's running stats) are "buffers": only realized by `step()`.

Builds on: tensor.py. Used by: training loops and jit tests.

>>> from tinyteach import Tensor
>>> w = Tensor([1.0, -2.0])
>>> opt = SGD([w], lr=0.5)
>>> with Tensor.train():
...     opt.zero_grad()
...     _ = (w * w).sum().backward()
...     opt.step()
>>> w.tolist()
[0.0, 0.0]
"""
from __future__ import annotations

from collections.abc import Sequence

from tinyteach.dtype import dtypes
from tinyteach.helpers import TRAINING, dedup
from tinyteach.tensor import Tensor


class Optimizer:
    """Holds the parameters; `zero_grad()` forgets their gradients, `step()` updates them."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor):
        for tensor in params:
            if tensor.requires_grad is None:  # tinygrad: handing it to an optimizer trains it
                tensor.requires_grad = True
        self.params = dedup([t for t in params if t.requires_grad])
        self.buffers = dedup([t for t in params if not t.requires_grad])
        if not self.params:
            raise ValueError("an optimizer needs at least one tensor that requires grad")
        self.device = self.params[0].device
        self.lr = lr if isinstance(lr, Tensor) else _scalar_state(lr, self.device)

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    def step(self) -> None:
        """Build the new parameters and state, then compute them all in one realize."""
        Tensor.realize(*self.schedule_step())

    def schedule_step(self) -> list[Tensor]:
        """Assign the new values lazily; return every tensor that must be realized."""
        if not (Tensor.training or TRAINING):
            raise RuntimeError("Optimizer.step() outside training mode: wrap the loop in "
                               "`with Tensor.train():` (or set Tensor.training = True)")
        indices = [i for i, p in enumerate(self.params) if p.grad is not None]
        new_state = self._update(indices)
        return [self.params[i] for i in indices] + new_state + self.buffers

    def _update(self, indices: list[int]) -> list[Tensor]:
        """Assign new values to self.params[i] for i in indices; return the new state."""
        raise NotImplementedError

    def _gradient(self, index: int) -> Tensor:
        param, grad = self.params[index], self.params[index].grad
        assert grad is not None
        return grad.to(param.device).detach()

    def _apply_update(self, index: int, update: Tensor) -> None:
        """p -= lr * update, computed from p's old value (detached: no gradient flows here)."""
        param = self.params[index]
        param.assign((param.detach() - self.lr * update).cast(param.dtype))

    def _zeros_like_params(self) -> list[Tensor]:
        return [_state(Tensor.zeros(p.shape, dtype=p.dtype, device=p.device))
                for p in self.params]


def _state(initial: Tensor) -> Tensor:
    """Optimizer state: a real buffer (contiguous) that is never trained."""
    result = initial.contiguous()
    result.requires_grad = False
    return result


def _scalar_state(value: float, device: str) -> Tensor:
    """A float32 scalar held in a buffer (not a constant), so it can change between steps
    (`optimizer.lr.assign(...)`) and a JIT replays the new value."""
    scalar = _vector_state([value], device).reshape(())
    scalar.requires_grad = False
    return scalar


def _vector_state(values: list[float], device: str) -> Tensor:
    """float32 values held in a buffer, already realized (no kernel copies them in)."""
    vector = Tensor(values, device=device, dtype=dtypes.float32)
    vector.requires_grad = False
    return vector


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and L2 decay."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001,
                 momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr)
        if nesterov and momentum <= 0:
            raise ValueError("nesterov momentum needs momentum > 0")
        self.momentum, self.wd, self.nesterov = momentum, weight_decay, nesterov
        self.b = self._zeros_like_params() if momentum else []

    def _update(self, indices: list[int]) -> list[Tensor]:
        for i in indices:
            g = self._gradient(i) + self.wd * self.params[i].detach()
            if self.momentum:
                # PyTorch starts b at g; from b = 0 the first step gives the same b = g
                self.b[i].assign(self.momentum * self.b[i] + g)
                g = g + self.momentum * self.b[i] if self.nesterov else self.b[i]
            self._apply_update(i, g)
        return [self.b[i] for i in indices] if self.momentum else []


class LAMB(Optimizer):
    """Adam's moments with a layer-wise trust ratio (You et al., 2019); adam=True drops the
    ratio, which makes it AdamW (and, with weight_decay=0, Adam)."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9,
                 b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0,
                 adam: bool = False):
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
        # [b1^t, b2^t] in one buffer: they count the steps taken, and one kernel updates both
        self.beta_powers = _vector_state([1.0, 1.0], self.device)
        self.betas = _vector_state([b1, b2], self.device)
        self.m = self._zeros_like_params()
        self.v = self._zeros_like_params()

    def _update(self, indices: list[int]) -> list[Tensor]:
        self.beta_powers.assign(self.beta_powers * self.betas)
        b1_t, b2_t = self.b1_t, self.b2_t
        for i in indices:
            g, param = self._gradient(i), self.params[i].detach()
            self.m[i].assign(self.b1 * self.m[i] + (1 - self.b1) * g)
            self.v[i].assign(self.b2 * self.v[i] + (1 - self.b2) * (g * g))
            m_hat = self.m[i] / (1 - b1_t)
            v_hat = self.v[i] / (1 - b2_t)
            update = m_hat / (v_hat.sqrt() + self.eps) + self.wd * param
            if not self.adam:
                update = update * _trust_ratio(param, update)
            self._apply_update(i, update)
        return [self.beta_powers] + [self.m[i] for i in indices] + [self.v[i] for i in indices]

    @property
    def b1_t(self) -> Tensor:
        """b1^t after t steps (a view of `beta_powers`: read inside the update kernels)."""
        return self.beta_powers[0]

    @property
    def b2_t(self) -> Tensor:
        return self.beta_powers[1]


def _trust_ratio(param: Tensor, update: Tensor) -> Tensor:
    """|param| / |update| (Euclidean norms), or 1 when either norm is 0."""
    param_norm = (param * param).sum().sqrt()
    update_norm = (update * update).sum().sqrt()
    ratio = (update_norm > 0).where(param_norm / update_norm, 1.0)
    return (param_norm > 0).where(ratio, 1.0)


def Adam(params: Sequence[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9,
         b2: float = 0.999, eps: float = 1e-8) -> LAMB:
    """Adam (Kingma and Ba, 2014): LAMB without the trust ratio and without weight decay."""
    return LAMB(params, lr, b1, b2, eps, weight_decay=0.0, adam=True)


def AdamW(params: Sequence[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9,
          b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01) -> LAMB:
    """AdamW (Loshchilov and Hutter, 2017): Adam with decoupled weight decay."""
    return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True)
