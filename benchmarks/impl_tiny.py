"""tinyteach and tinygrad share one implementation: tinyteach mirrors tinygrad's API, so the very
same code (Tensor, TinyJit, nn.Linear/Conv2d, nn.optim.Adam, GlobalCounters) runs on both, and
the two are measured on identical programs. Training steps run under each one's TinyJit."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.data import Data


class TinyImpl:
    """One of the tinygrad-like frameworks ("tinyteach" or "tinygrad"), on its CPU device, or
    tinyteach on another `device` (which run.py also selects with DEV=<device>). A device that
    cannot run here raises NotImplementedError (the worker reports it as skipped, with why)."""

    has_jit = True
    counts_kernels = True

    def __init__(self, package: str, device: str | None = None):
        self.name = package
        self.lib = importlib.import_module(package)
        self.Tensor = self.lib.Tensor
        self.nn = importlib.import_module(f"{package}.nn")
        self.optim = self._optim_module()
        if device is not None:
            try:
                self.lib.Device[device]
            except Exception as error:  # DeviceUnavailable, ImportError, a driver's own error
                raise NotImplementedError(f"{device} unavailable: {error}"[:200]) from error
            self.lib.Device.DEFAULT = device
        self.device = self.lib.Device[self.lib.Device.DEFAULT]
        # the CPU-emulated GPUs (pocl, lavapipe) get fewer repetitions in a full run
        self.emulated_device = device is not None
        compiler = getattr(self.device, "compiler", None)
        described = getattr(compiler, "cache_key", None) if device is not None else None
        self.notes = [f"device {self.lib.Device.DEFAULT}"] + ([described] if described else [])

    def _optim_module(self) -> Any:
        """nn.optim (tinyteach's was written alongside this suite: fail loudly if it is gone)."""
        return importlib.import_module(f"{self.name}.nn.optim")

    # ---- basics ----

    def tensor(self, array: np.ndarray, requires_grad: bool | None = None) -> Any:
        """A fresh, realized tensor holding a copy of `array`."""
        return self.Tensor(array.copy(), requires_grad=requires_grad).realize()

    def sync(self, _: Any = None) -> None:
        self.device.synchronize()

    def count_kernels(self, fn: Callable[[], Any]) -> int:
        """How many kernels `fn()` launches (GlobalCounters.kernel_count)."""
        self.sync()
        self.lib.GlobalCounters.reset()
        self.sync(fn())
        return int(self.lib.GlobalCounters.kernel_count)

    def kernel_counter(self) -> tuple[Callable[[], None], Callable[[], int]]:
        """(reset, read) for counting kernels over several calls."""
        counters = self.lib.GlobalCounters
        return counters.reset, lambda: int(counters.kernel_count)

    # ---- training ----

    def _mlp(self, data: Data) -> tuple[Callable[[Any], Any], list[Any]]:
        nn, Tensor = self.nn, self.Tensor
        l1, l2 = nn.Linear(784, 128), nn.Linear(128, 10)
        l1.weight, l1.bias = self.tensor(data["mlp_w1"]), self.tensor(data["mlp_b1"])
        l2.weight, l2.bias = self.tensor(data["mlp_w2"]), self.tensor(data["mlp_b2"])
        params = [l1.weight, l1.bias, l2.weight, l2.bias]
        Tensor.realize(*params)
        return (lambda x: l2(l1(x).relu())), params

    def _cnn(self, data: Data) -> tuple[Callable[[Any], Any], list[Any]]:
        nn, Tensor = self.nn, self.Tensor
        c1, c2, lin = nn.Conv2d(1, 8, 3), nn.Conv2d(8, 16, 3), nn.Linear(16 * 5 * 5, 10)
        c1.weight, c1.bias = self.tensor(data["cnn_c1w"]), self.tensor(data["cnn_c1b"])
        c2.weight, c2.bias = self.tensor(data["cnn_c2w"]), self.tensor(data["cnn_c2b"])
        lin.weight, lin.bias = self.tensor(data["cnn_lw"]), self.tensor(data["cnn_lb"])
        params = [c1.weight, c1.bias, c2.weight, c2.bias, lin.weight, lin.bias]
        Tensor.realize(*params)

        def model(x: Any) -> Any:
            x = c1(x).relu().max_pool2d(2)
            x = c2(x).relu().max_pool2d(2)
            return lin(x.flatten(1))
        return model, params

    def train_step(self, kind: str, data: Data) -> Callable[[int], float]:
        """A jitted Adam step of the `kind` ("mlp" or "cnn") model; `step(i)` trains on batch
        i (mod the batch count) and returns the loss as a float (which synchronizes)."""
        model, params = self._mlp(data) if kind == "mlp" else self._cnn(data)
        opt = self.optim.Adam(params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8)
        # the batches are data, as a dataset gives them: no gradient (torch computes none)
        xs = [self.tensor(x, requires_grad=False) for x in data[f"{kind}_x"]]
        ys = [self.tensor(y, requires_grad=False) for y in data[f"{kind}_y"]]

        @self.lib.TinyJit
        def jitted(x: Any, y: Any) -> Any:
            with self.lib.Context(TRAINING=1):
                opt.zero_grad()
                loss = model(x).sparse_categorical_crossentropy(y).backward()
                # loss and step in one realize (tinygrad's idiom): realizing the loss after
                # opt.step() would compute it from the updated weights in tinygrad
                self.Tensor.realize(loss, *opt.schedule_step())
            return loss

        self.jitted = jitted
        return lambda i: float(jitted(xs[i % len(xs)], ys[i % len(ys)]).item())

    def kernel_rows(self, repeats: int) -> list[dict[str, Any]] | None:
        """Each kernel of the last captured training step, timed alone (benchmarks/kernels.py);
        None where the framework records no launches (tinygrad)."""
        captured = getattr(getattr(self, "jitted", None), "captured", None)
        launches = getattr(captured, "launches", None)
        if self.name != "tinyteach" or not launches:
            return None
        from benchmarks.kernels import kernel_table
        return kernel_table(launches, repeats)

    # ---- kernels ----

    def matmul(self, a: Any, b: Any) -> Any:
        return (a @ b).realize()

    def fused(self, a: Any, b: Any, c: Any) -> Any:
        return ((a + b) * c).relu().sum(1).realize()

    def softmax(self, x: Any) -> Any:
        return x.softmax(-1).realize()

    def layernorm(self, x: Any) -> Any:
        return x.layernorm(-1, eps=1e-5).realize()

    def add_one(self, x: Any) -> Any:
        return (x + 1).realize()

    def jit_add_one(self) -> Callable[[Any], Any]:
        return self.lib.TinyJit(lambda x: (x + 1).realize())

    def deep_chain(self, x: Any, length: int) -> Any:
        """`x + 1` chained `length` times, then realized: one lazy graph `length` ops deep."""
        for _ in range(length):
            x = x + 1
        return x.realize()
