"""Chapter 11 (part 2): Optimizers — a training step is one more lazy graph.

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
  LARS     SGD with a trust ratio r = tcoef*|p| / (|g| + wd*|p|) per parameter tensor
  Muon     b = mu*b + g;  g = g + mu*b;  g = newton_schulz(g);  p = p*(1 - lr*wd) - lr*g
  APOLLO   Adam's moments of a random rank-r projection of g set a per-channel scale for g
  Adam     m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
           m_hat = m / (1-b1^t);  v_hat = v / (1-b2^t);  u = m_hat / (sqrt(v_hat) + eps)
  AdamW    p -= lr * (u + wd*p)                   (decay decoupled from the moments)
  LAMB     u = m_hat / (sqrt(v_hat) + eps) + wd*p;  r = |p| / |u| (1 where either is 0)
           p -= lr * r * u                        (a trust ratio per parameter tensor)
- parameters passed with requires_grad=None become trainable (requires_grad=True); tensors with
  requires_grad=False (BatchNorm's running stats) are "buffers": only realized by `step()`.

Builds on: tensor/. Used by: training loops and jit tests.

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

import math
from collections.abc import Sequence

from tinyteach.dtype import dtypes
from tinyteach.helpers import dedup
from tinyteach.settings import TRAINING
from tinyteach.tensor import Tensor


class TrainingModeError(RuntimeError, AssertionError):
    """step() outside training mode: RuntimeError here, AssertionError in tinygrad (an
    assert), so code written for either catches it."""


class Optimizer:
    """Holds the parameters; `zero_grad()` forgets their gradients, `step()` updates them."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor):
        if not isinstance(lr, Tensor) and lr < 0:
            raise ValueError(f"the learning rate must be >= 0, got {lr}")
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
            raise TrainingModeError("Optimizer.step() outside training mode: wrap the loop "
                                    "in `with Tensor.train():` (or set Tensor.training = True)")
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


class OptimizerGroup(Optimizer):
    """Several optimizers stepped as one (say Muon for the matrices, AdamW for the rest): one
    `step()` realizes every new parameter and all the state in a single schedule."""

    def __init__(self, *optimizers: Optimizer):  # no super().__init__: it holds no lr
        if not optimizers:
            raise ValueError("OptimizerGroup needs at least one optimizer")
        self.optimizers = optimizers
        self.params = [p for o in optimizers for p in o.params]
        self.buffers = [b for o in optimizers for b in o.buffers]
        self.device = optimizers[0].device

    def __getitem__(self, index: int) -> Optimizer:
        return self.optimizers[index]

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad()

    def schedule_step(self) -> list[Tensor]:
        return [t for optimizer in self.optimizers for t in optimizer.schedule_step()]


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


def SGD(params: Sequence[Tensor], lr: float | Tensor = 0.001, momentum: float = 0.0,
        weight_decay: float = 0.0, nesterov: bool = False, classic: bool = False) -> LARS:
    """Stochastic gradient descent with optional momentum, Nesterov momentum and L2 decay:
    LARS without the trust ratio (tcoef=0), as in tinygrad. classic=False (the default, and
    PyTorch's rule) applies lr after the momentum; classic=True folds it in before."""
    return LARS(params, lr, momentum, weight_decay, nesterov=nesterov, classic=classic,
                pre_wd=True, tcoef=0.0)


def Muon(params: Sequence[Tensor], lr: float | Tensor = 0.001, momentum: float = 0.95,
         weight_decay: float = 0.1, ns_steps: int = 5,
         ns_coefficients: tuple[float, ...] = (3.4445, -4.775, 2.0315),
         nesterov: bool = True) -> LARS:
    """Muon (Jordan et al., 2024): momentum SGD whose step is orthogonalized by `ns_steps`
    Newton-Schulz iterations (see `newton_schulz`), with decoupled weight decay
    p <- p * (1 - lr*wd) after the momentum. A parameter of any shape is orthogonalized as the
    matrix (shape[0], everything else), as tinygrad does.

    tinygrad computes that decay into a local variable and never applies it; PyTorch's
    torch.optim.Muon applies it, and so does tinyteach. PyTorch's momentum is the average
    m*b + (1-m)*g, a multiple (1-m) of tinygrad's sum m*b + g: Newton-Schulz divides by the
    norm first, so the two give the same step."""
    return LARS(params, lr, momentum, weight_decay, ns_steps, ns_coefficients, nesterov,
                classic=False, pre_wd=False, tcoef=0.0)


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling (You et al., 2017), tinygrad's general momentum SGD.

    For each parameter p with gradient g, r = tcoef*|p| / (|g| + wd*|p|) (1 where a norm is 0,
    and r = 1 when tcoef = 0):
        g = g + wd*p                        (pre_wd: L2 decay before the momentum)
        g = g * r * lr                      (classic: the rate goes into the momentum)
        b = mu*b + g;  g = g + mu*b (nesterov) or b
        g = newton_schulz(g)                (ns_coefficients given: Muon)
        p = p * (1 - wd*lr)                 (not pre_wd: decoupled decay, Muon's)
        p = p - g * r * lr (not classic), or p - g (classic)"""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001,
                 momentum: float = 0.9, weight_decay: float = 1e-4, ns_steps: int = 0,
                 ns_coefficients: tuple[float, ...] | None = None, nesterov: bool = False,
                 classic: bool = True, pre_wd: bool = True, tcoef: float = 0.001):
        _check_non_negative(momentum=momentum, weight_decay=weight_decay, ns_steps=ns_steps)
        if nesterov and momentum <= 0:
            raise ValueError("nesterov momentum needs momentum > 0")
        if ns_coefficients is not None and len(ns_coefficients) == 0:
            raise ValueError("ns_coefficients must hold at least one coefficient")
        super().__init__(params, lr)
        self.momentum, self.wd, self.nesterov = momentum, weight_decay, nesterov
        self.ns_steps, self.ns_coefficients = ns_steps, ns_coefficients
        self.classic, self.pre_wd, self.tcoef = classic, pre_wd, tcoef
        self.b = self._zeros_like_params() if momentum else []

    def _update(self, indices: list[int]) -> list[Tensor]:
        for i in indices:
            param, g = self.params[i].detach(), self._gradient(i)
            ratio = _lars_ratio(param, g, self.tcoef, self.wd) if self.tcoef else None
            if self.pre_wd:
                g = g + self.wd * param
            if self.classic:
                g = _scaled(g, ratio) * self.lr
            if self.momentum:
                # PyTorch starts b at g; from b = 0 the first step gives the same b = g
                self.b[i].assign(self.momentum * self.b[i] + g)
                g = g + self.momentum * self.b[i] if self.nesterov else self.b[i]
            if self.ns_coefficients:
                g = newton_schulz(g.reshape(g.shape[0], -1), self.ns_steps,
                                  self.ns_coefficients).reshape(g.shape)
            self._apply(i, g, ratio)
        return [self.b[i] for i in indices] if self.momentum else []

    def _apply(self, index: int, g: Tensor, ratio: Tensor | None) -> None:
        param = self.params[index]
        base = param.detach()
        if not self.pre_wd and self.wd:
            base = base * (1 - self.wd * self.lr)  # Muon's decoupled decay
        step = g if self.classic else self.lr * _scaled(g, ratio)
        param.assign((base - step).cast(param.dtype))


def _scaled(g: Tensor, ratio: Tensor | None) -> Tensor:
    return g if ratio is None else g * ratio


def _lars_ratio(param: Tensor, grad: Tensor, tcoef: float, weight_decay: float) -> Tensor:
    """tcoef * |p| / (|g| + wd*|p|), or 1 when |p| or |g| is 0 (You et al., 2017, eq. 6)."""
    param_norm = param.square().sum().sqrt()
    grad_norm = grad.square().sum().sqrt()
    ratio = (grad_norm > 0).where(tcoef * param_norm / (grad_norm + weight_decay * param_norm),
                                  1.0)
    return (param_norm > 0).where(ratio, 1.0)


def newton_schulz(g: Tensor, steps: int, coefficients: Sequence[float],
                  eps: float = 1e-7) -> Tensor:
    """Push every singular value of the matrix g towards 1, keeping its singular vectors:
    tinygrad's `Tensor.newton_schulz(steps, params, eps)`, which this calls.

    g is divided by its Frobenius norm (so every singular value is at most 1), then each step
    applies the odd polynomial with the given coefficients (a, b, c, ...):
        A = G @ G.T;   G <- a*G + b*A@G + c*A@A@G + ...
    which maps a singular value s to a*s + b*s^3 + c*s^5 + ... Muon's (3.4445, -4.775, 2.0315)
    sends any s in (0, 1] into about [0.7, 1.2] in five steps. A tall matrix is transposed
    first, so A is the smaller of the two Gram matrices. Batched over leading axes."""
    return g.newton_schulz(steps, coefficients, eps)


def _check_non_negative(**values: float) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


class LAMB(Optimizer):
    """Adam's moments with a layer-wise trust ratio (You et al., 2019); adam=True drops the
    ratio, which makes it AdamW (and, with weight_decay=0, Adam)."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9,
                 b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0,
                 adam: bool = False):
        _check_non_negative(eps=eps, weight_decay=weight_decay)
        for name, beta in (("b1", b1), ("b2", b2)):
            if not 0 <= beta < 1:
                raise ValueError(f"{name} must be in [0, 1), got {beta}")
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


class APOLLO(Optimizer):
    """APOLLO (Zhu et al., 2024): AdamW's memory cut to a low-rank sketch, tinygrad's version.

    A matrix gradient g (m, n) is projected to rank r by a random Gaussian matrix P (scaled by
    1/sqrt(r), redrawn every `update_proj_gap` steps): R = g @ P.T (r columns) or P.T @ g
    (r rows), whichever side is smaller for proj_type="std". Adam's moments are kept for R only,
    and the Adam step of R says by how much to scale g, per channel (row or column norms of
    the step over those of R) or for the whole tensor:
        s = |adam(R)| / (|R| + 1e-8);   step = g * s * sqrt(scale)
    The norm-growth limiter caps |step| at 1.01 times the last one. With bias correction,
    step_size = lr * sqrt(1 - b2^t) / (1 - b1^t), and p <- (p - step_size*step) * (1 - lr*wd)
    (tinygrad writes this as up + lr*wd*(p - up)). Tensors that are not matrices get AdamW's
    update from full moments. Only proj="random" exists (as in tinygrad)."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9,
                 b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0,
                 rank: int = 256, proj: str = "random", scale_type: str = "channel",
                 scale: float = 1.0, update_proj_gap: int = 200, proj_type: str = "std",
                 scale_front: bool = False, disable_nl: bool = False, correct_bias: bool = True):
        _check_apollo_options(b1, b2, eps, weight_decay, rank, scale, update_proj_gap, proj,
                              scale_type, proj_type)
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.wd, self.rank = b1, b2, eps, weight_decay, rank
        self.scale_type, self.scale, self.update_proj_gap = scale_type, scale, update_proj_gap
        self.proj_type, self.scale_front, self.disable_nl = proj_type, scale_front, disable_nl
        self.correct_bias = correct_bias
        self.step_t = _state(Tensor.zeros(1, dtype=dtypes.int32, device=self.device))
        self.beta_powers = _vector_state([1.0, 1.0], self.device)
        self.betas = _vector_state([b1, b2], self.device)
        shapes = [self._state_shape(p.shape) for p in self.params]
        self.m = [_state(Tensor.zeros(*s, device=self.device)) for s in shapes]
        self.v = [_state(Tensor.zeros(*s, device=self.device)) for s in shapes]
        self.projs = [_state(Tensor.zeros(*self._proj_shape(p.shape), device=self.device))
                      for p in self.params if p.ndim == 2]
        self.proj_index = {i: k for k, i in enumerate(i for i, p in enumerate(self.params)
                                                      if p.ndim == 2)}
        self.scaled_grad = [_state(Tensor.zeros(1, device=self.device)) for _ in self.params]

    # ---- shapes: which side is projected ----

    def _right(self, shape: tuple[int, ...]) -> bool:
        """Project the columns (g @ P.T) rather than the rows (P.T @ g)?"""
        if self.proj_type in ("right", "left"):
            return self.proj_type == "right"
        return (shape[0] >= shape[1]) == (self.proj_type == "std")

    def _rank(self, shape: tuple[int, ...]) -> int:
        return min(self.rank, shape[0], shape[1])

    def _state_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) != 2:
            return shape
        return (shape[0], self._rank(shape)) if self._right(shape) else (self._rank(shape),
                                                                         shape[1])

    def _proj_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        return (self._rank(shape), shape[1]) if self._right(shape) else (shape[0],
                                                                         self._rank(shape))

    # ---- one step ----

    def _update(self, indices: list[int]) -> list[Tensor]:
        self.step_t.assign(self.step_t + 1)
        first, refresh = self.step_t == 1, ((self.step_t - 1) % self.update_proj_gap) == 0
        self.beta_powers.assign(self.beta_powers * self.betas)
        step_size = self.lr
        if self.correct_bias:
            step_size = self.lr * (1 - self.beta_powers[1]).sqrt() / (1 - self.beta_powers[0])
        for i in indices:
            g = self._gradient(i).cast(dtypes.float32)
            if i in self.proj_index:
                direction = self._low_rank_direction(i, g, first, refresh)
            else:
                direction = self._adam_direction(i, g)
            up = step_size * direction
            if self.wd > 0:
                up = up + self.lr * self.wd * (self.params[i].detach() - up)
            param = self.params[i]
            param.assign((param.detach() - up).cast(param.dtype))
        changed = [self.m[i] for i in indices] + [self.v[i] for i in indices]
        changed += [self.projs[self.proj_index[i]] for i in indices if i in self.proj_index]
        changed += [self.scaled_grad[i] for i in indices if i in self.proj_index]
        return [self.step_t, self.beta_powers] + changed

    def _adam_direction(self, i: int, g: Tensor) -> Tensor:
        """m / (sqrt(v) + eps) from the moments of g (the bias correction is in step_size)."""
        self.m[i].assign(self.b1 * self.m[i] + (1 - self.b1) * g)
        self.v[i].assign(self.b2 * self.v[i] + (1 - self.b2) * (g * g))
        return self.m[i] / (self.v[i].sqrt() + self.eps)

    def _low_rank_direction(self, i: int, g: Tensor, first: Tensor, refresh: Tensor) -> Tensor:
        right = self._right(g.shape)
        proj = self.projs[self.proj_index[i]]
        rank = proj.shape[0] if right else proj.shape[1]
        fresh = Tensor.randn(*proj.shape, device=self.device) / math.sqrt(rank)
        proj.assign(refresh.where(fresh, proj))
        low = g @ proj.T if right else proj.T @ g
        step = self._adam_direction(i, low)
        direction = g * self._scaling(step, low, right)
        if self.scale_front:
            direction = direction * math.sqrt(self.scale)
        if not self.disable_nl:
            direction = self._limit_growth(i, direction, first)
        if not self.scale_front:
            direction = direction * math.sqrt(self.scale)
        return direction

    def _scaling(self, step: Tensor, low: Tensor, right: bool) -> Tensor:
        """|step| / |low| per channel (rows when the columns were projected) or in total."""
        if self.scale_type == "tensor":
            return _norm(step) / (_norm(low) + 1e-8)
        axis = 1 if right else 0
        factor = _norm(step, axis) / (_norm(low, axis) + 1e-8)
        return factor.unsqueeze(1) if right else factor

    def _limit_growth(self, i: int, direction: Tensor, first: Tensor) -> Tensor:
        """Scale the step down so its norm is at most 1.01 times the previous step's."""
        norm = _norm(direction).reshape(1)
        limiter = (norm / (self.scaled_grad[i] + 1e-8)).maximum(1.01) / 1.01
        direction = first.where(direction, direction / limiter)
        self.scaled_grad[i].assign(first.where(norm, norm / limiter))
        return direction


def _norm(t: Tensor, axis: int | None = None) -> Tensor:
    return t.square().sum(axis).sqrt()


def _check_apollo_options(b1: float, b2: float, eps: float, weight_decay: float, rank: int,
                          scale: float, update_proj_gap: int, proj: str, scale_type: str,
                          proj_type: str) -> None:
    _check_non_negative(eps=eps, weight_decay=weight_decay, scale=scale)
    for name, beta in (("b1", b1), ("b2", b2)):
        if not 0 <= beta < 1:
            raise ValueError(f"{name} must be in [0, 1), got {beta}")
    if rank < 1 or update_proj_gap < 1:
        raise ValueError(f"rank and update_proj_gap must be >= 1, got {rank} and "
                         f"{update_proj_gap}")
    if proj != "random":
        raise ValueError(f"proj={proj!r}: only 'random' projections exist (as in tinygrad)")
    if scale_type not in ("channel", "tensor"):
        raise ValueError(f"scale_type must be 'channel' or 'tensor', got {scale_type!r}")
    if proj_type not in ("std", "reverse_std", "left", "right"):
        raise ValueError(f"proj_type must be std, reverse_std, left or right, got {proj_type!r}")
