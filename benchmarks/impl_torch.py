"""PyTorch on the CPU, eager mode (no torch.compile): the same models, data and Adam settings."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.data import Data


class TorchImpl:
    """PyTorch eager on the CPU; it has no JIT here and no kernel counter."""

    name = "torch"
    has_jit = False
    counts_kernels = False

    def __init__(self) -> None:
        self.notes = [f"torch {torch.__version__}, eager, {torch.get_num_threads()} threads"]

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array.copy())

    def sync(self, _: Any = None) -> None:
        """CPU ops in eager mode return when they are done."""

    def _mlp(self, data: Data) -> torch.nn.Module:
        model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10))
        names = ["mlp_w1", "mlp_b1", "mlp_w2", "mlp_b2"]
        self._load(model, [data[n] for n in names])
        return model

    def _cnn(self, data: Data) -> torch.nn.Module:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(1), torch.nn.Linear(16 * 5 * 5, 10))
        names = ["cnn_c1w", "cnn_c1b", "cnn_c2w", "cnn_c2b", "cnn_lw", "cnn_lb"]
        self._load(model, [data[n] for n in names])
        return model

    @staticmethod
    def _load(model: torch.nn.Module, arrays: list[np.ndarray]) -> None:
        with torch.no_grad():
            for param, array in zip(model.parameters(), arrays):
                param.copy_(torch.from_numpy(array))

    def train_step(self, kind: str, data: Data) -> Callable[[int], float]:
        model = self._mlp(data) if kind == "mlp" else self._cnn(data)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
        xs = [self.tensor(x) for x in data[f"{kind}_x"]]
        ys = [torch.from_numpy(y.astype(np.int64)) for y in data[f"{kind}_y"]]

        def step(i: int) -> float:
            opt.zero_grad()
            loss = F.cross_entropy(model(xs[i % len(xs)]), ys[i % len(ys)])
            loss.backward()
            opt.step()
            return float(loss.item())
        return step

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    def fused(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return ((a + b) * c).relu().sum(1)

    def softmax(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)

    def layernorm(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], eps=1e-5)

    def add_one(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1
