"""numpy: the baseline a student would write by hand. The MLP step has a hand-written backward
pass and Adam; numpy has no autograd, so the CNN step is not measured (a hand-written conv
backward would measure the author, not numpy). Matmul goes to numpy's BLAS."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.data import Data


class NumpyAdam:
    """PyTorch's Adam update rule on numpy arrays, in place."""

    def __init__(self, params: list[np.ndarray], lr: float = 1e-3, b1: float = 0.9,
                 b2: float = 0.999, eps: float = 1e-8):
        self.params, self.lr, self.b1, self.b2, self.eps = params, lr, b1, b2, eps
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            p -= self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)


def mlp_loss_and_grads(params: list[np.ndarray], x: np.ndarray,
                       y: np.ndarray) -> tuple[float, list[np.ndarray]]:
    """Mean cross-entropy of relu(x W1^T + b1) W2^T + b2 and its gradients, by hand."""
    w1, b1, w2, b2 = params
    hidden = x @ w1.T + b1
    active = np.maximum(hidden, 0)
    logits = active @ w2.T + b2
    shifted = logits - logits.max(1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    rows = np.arange(len(y))
    loss = -log_probs[rows, y].mean()
    d_logits = np.exp(log_probs)
    d_logits[rows, y] -= 1
    d_logits /= len(y)
    d_active = d_logits @ w2
    d_hidden = d_active * (hidden > 0)
    grads = [d_hidden.T @ x, d_hidden.sum(0), d_logits.T @ active, d_logits.sum(0)]
    return float(loss), grads


class NumpyImpl:
    """numpy on the CPU (its BLAS threads as configured); no JIT, no kernels to count."""

    name = "numpy"
    has_jit = False
    counts_kernels = False

    def __init__(self) -> None:
        self.notes = [f"numpy {np.__version__}"]

    def tensor(self, array: np.ndarray) -> np.ndarray:
        return array.copy()

    def sync(self, _: Any = None) -> None:
        """numpy calls return when they are done."""

    def train_step(self, kind: str, data: Data) -> Callable[[int], float]:
        if kind != "mlp":
            raise NotImplementedError("no autograd in numpy: the CNN backward is not written")
        params = [data[n].copy() for n in ("mlp_w1", "mlp_b1", "mlp_w2", "mlp_b2")]
        opt = NumpyAdam(params)
        xs, ys = data["mlp_x"], data["mlp_y"]

        def step(i: int) -> float:
            loss, grads = mlp_loss_and_grads(params, xs[i % len(xs)], ys[i % len(ys)])
            opt.step(grads)
            return loss
        return step

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a @ b

    def fused(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.maximum((a + b) * c, 0).sum(1)

    def softmax(self, x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def layernorm(self, x: np.ndarray) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        centered = x - mean
        return centered / np.sqrt((centered * centered).mean(-1, keepdims=True) + 1e-5)

    def add_one(self, x: np.ndarray) -> np.ndarray:
        return x + 1
