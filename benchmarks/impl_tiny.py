"""tinyteach and tinygrad share one implementation: tinyteach mirrors tinygrad's API, so the very
same code (Tensor, TinyJit, nn.Linear/Conv2d, nn.optim.Adam, GlobalCounters) runs on both, and
the two are measured on identical programs. Training steps run under each one's TinyJit."""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.data import GPT_CONFIG, MNIST_CONVS, Data, gpt_shapes


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
        # tinygrad 0.14's constructor has no requires_grad (its backward fills .grad for every
        # float tensor in the graph, and only what is realized is computed)
        self.takes_requires_grad = "requires_grad" in inspect.signature(self.Tensor).parameters
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
        """A fresh, realized tensor holding a copy of `array` (`requires_grad` where the
        framework's constructor takes it)."""
        if not self.takes_requires_grad:
            return self.Tensor(array.copy()).realize()
        return self.Tensor(array.copy(), requires_grad=requires_grad).realize()

    def sync(self, _: Any = None) -> None:
        self.device.synchronize()

    def settle(self) -> None:
        """Wait until the kernels compiled so far run their optimized builds: tinyteach's CPU
        starts a new kernel on a fast, unoptimized build while gcc -O2 builds it in the
        background (runtime/cpu.py), and a steady-state figure must not time that."""
        if self.name == "tinyteach":
            from tinyteach.runtime.cpu import wait_for_optimized_builds
            wait_for_optimized_builds()

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

    def _mnist(self, kind: str, data: Data) -> tuple[Callable[[Any], Any], list[Any]]:
        """tinygrad's examples/beautiful_mnist.py model (two 5x5 and two 3x3 convolutions,
        BatchNorm, max-pooling, a Linear), with the data's weights."""
        nn, Tensor = self.nn, self.Tensor
        convs = {name: nn.Conv2d(c_in, c_out, k) for name, (c_out, c_in, k) in MNIST_CONVS.items()}
        for name, conv in convs.items():
            conv.weight, conv.bias = self.tensor(data[f"{kind}_{name}w"]), \
                self.tensor(data[f"{kind}_{name}b"])
        norms = [nn.BatchNorm(32), nn.BatchNorm(64)]
        lin = nn.Linear(576, 10)
        lin.weight, lin.bias = self.tensor(data[f"{kind}_lw"]), self.tensor(data[f"{kind}_lb"])
        params = [t for conv in convs.values() for t in (conv.weight, conv.bias)] + \
            [t for norm in norms for t in (norm.weight, norm.bias)] + [lin.weight, lin.bias]
        Tensor.realize(*params)
        c1, c2, c3, c4 = convs.values()

        def model(x: Any) -> Any:
            x = norms[0](c2(c1(x).relu()).relu()).max_pool2d()
            x = norms[1](c4(c3(x).relu()).relu()).max_pool2d()
            return lin(x.flatten(1))
        return model, params

    def _model(self, kind: str, data: Data) -> tuple[Callable[[Any], Any], list[Any]]:
        if kind == "mlp":
            return self._mlp(data)
        if kind == "cnn":
            return self._cnn(data)
        return self._mnist(kind, data)

    def train_step(self, kind: str, data: Data) -> Callable[[int], float]:
        """A jitted Adam step of the `kind` model ("mlp", "cnn", "mnist", "mnist512"; "gpt" is
        `gpt_train_step`); `step(i)` trains on batch i (mod the batch count) and returns the
        loss as a float (which synchronizes)."""
        if kind == "gpt":
            return self.gpt_train_step(data)
        model, params = self._model(kind, data)
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

    # ---- the GPT (examples/gpt.py's model, in tinygrad's API) ----

    def gpt(self, data: Data) -> TinyGPT:
        return TinyGPT(self, data)

    def gpt_train_step(self, data: Data) -> Callable[[int], float]:
        """A jitted AdamW step of the GPT with gradients clipped to norm 1 (examples/gpt.py's
        recipe): forward, cross-entropy, backward, clip, step."""
        model = self.gpt(data)
        opt = self.optim.AdamW(model.params, lr=1e-3, b1=0.9, b2=0.99, eps=1e-8,
                               weight_decay=0.1)
        xs = [self.tensor(x, requires_grad=False) for x in data["gpt_x"]]
        ys = [self.tensor(y, requires_grad=False) for y in data["gpt_y"]]
        Tensor = self.Tensor

        @self.lib.TinyJit
        def jitted(x: Any, y: Any) -> Any:
            with self.lib.Context(TRAINING=1):
                opt.zero_grad()
                logits = model(x)
                loss = logits.reshape(-1, logits.shape[-1]).sparse_categorical_crossentropy(
                    y.reshape(-1)).backward()
                grads = [p.grad for p in model.params]
                norm = Tensor.stack(*[(g * g).sum() for g in grads]).sum().sqrt()
                scale = (1.0 / (norm + 1e-6)).minimum(1.0)  # torch's clip_grad_norm_(.., 1.0)
                for p in model.params:
                    p.grad = p.grad * scale
                Tensor.realize(loss, *opt.schedule_step())
            return loss

        self.jitted = jitted
        return lambda i: float(jitted(xs[i % len(xs)], ys[i % len(ys)]).item())

    def gpt_forward(self, data: Data) -> Callable[[int], Any]:
        """The GPT's forward pass (logits of a batch, no gradient), jitted; returns a synced
        result."""
        model = self.gpt(data)
        xs = [self.tensor(x, requires_grad=False) for x in data["gpt_x"]]
        jitted = self.lib.TinyJit(lambda x: model(x).realize())
        return lambda i: jitted(xs[i % len(xs)]).numpy()

    def gpt_generate(self, data: Data) -> Callable[[int], Any]:
        """One token of generation through a KV cache: tinyteach's own GPT and Sampler
        (tinyteach.nn.transformer, the model examples/gpt.py trains), loaded with the same
        weights; `step(i)` feeds a token at position i mod the context."""
        if self.name != "tinyteach":
            raise NotImplementedError("generation uses tinyteach.nn.transformer's KV-cache "
                                      "Sampler; none is written in tinygrad 0.14's API here")
        from tinyteach.nn.state import load_state_dict
        from tinyteach.nn.transformer import GPT, GPTConfig, Sampler
        c = GPT_CONFIG
        model = GPT(GPTConfig(c["vocab"], c["context"], c["width"], c["layers"], c["heads"]))
        load_state_dict(model, {name: self.tensor(data[f"gpt_{name}"]) for name in gpt_shapes()})
        sampler = Sampler(model)
        return lambda i: sampler.logits(i % c["vocab"], i % c["context"])

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


class TinyGPT:
    """examples/gpt.py's GPT written once in tinygrad's API (so tinyteach and tinygrad run the
    same code): token and position embeddings (nn.Embedding), pre-norm blocks of causal
    multi-head attention and a GELU MLP, a final LayerNorm, logits through the tied token
    embedding."""

    def __init__(self, impl: TinyImpl, data: Data):
        c = GPT_CONFIG
        self.Tensor, self.heads = impl.Tensor, c["heads"]
        weights = {name: impl.tensor(data[f"gpt_{name}"]) for name in gpt_shapes()}
        self.token, self.position = impl.nn.Embedding(c["vocab"], c["width"]), \
            impl.nn.Embedding(c["context"], c["width"])
        self.token.weight = weights["token_embedding.weight"]
        self.position.weight = weights["position_embedding.weight"]
        self.positions = impl.Tensor.arange(c["context"]).reshape(1, -1).realize()
        self.blocks = []
        for i in range(c["layers"]):
            block = {}
            for name in ("norm1", "attention.qkv", "attention.proj", "norm2", "mlp.fc",
                         "mlp.proj"):
                block[name] = (weights[f"blocks.{i}.{name}.weight"],
                               weights[f"blocks.{i}.{name}.bias"])
            self.blocks.append(block)
        self.norm = (weights["norm.weight"], weights["norm.bias"])
        self.params = list(weights.values())
        impl.Tensor.realize(*self.params)

    @staticmethod
    def linear(x: Any, weight_bias: tuple[Any, Any]) -> Any:
        return x.linear(weight_bias[0].T, weight_bias[1])

    @staticmethod
    def layernorm(x: Any, weight_bias: tuple[Any, Any]) -> Any:
        return x.layernorm(-1, eps=1e-5) * weight_bias[0] + weight_bias[1]

    def attention(self, x: Any, block: dict[str, tuple[Any, Any]]) -> Any:
        batch, length, width = x.shape
        q, k, v = [t.reshape(batch, length, self.heads, width // self.heads).transpose(1, 2)
                   for t in self.linear(x, block["attention.qkv"]).split(width, dim=-1)]
        y = q.scaled_dot_product_attention(k, v, is_causal=True)
        return self.linear(y.transpose(1, 2).reshape(batch, length, width),
                           block["attention.proj"])

    def __call__(self, tokens: Any) -> Any:
        length = tokens.shape[1]
        x = self.token(tokens) + self.position(self.positions[:, :length])
        for block in self.blocks:
            x = x + self.attention(self.layernorm(x, block["norm1"]), block)
            hidden = self.linear(self.layernorm(x, block["norm2"]), block["mlp.fc"]).gelu()
            x = x + self.linear(hidden, block["mlp.proj"])
        return self.layernorm(x, self.norm) @ self.token.weight.T
