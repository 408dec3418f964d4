"""PyTorch on the CPU, eager mode (no torch.compile): the same models, data and Adam settings."""
from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.data import GPT_CONFIG, MNIST_CONVS, Data, gpt_shapes


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

    def _mnist(self, kind: str, data: Data) -> torch.nn.Module:
        """tinygrad's examples/beautiful_mnist.py model (impl_tiny.TinyImpl._mnist)."""
        conv = {name: torch.nn.Conv2d(c_in, c_out, k) for name, (c_out, c_in, k)
                in MNIST_CONVS.items()}
        model = torch.nn.Sequential(
            conv["c1"], torch.nn.ReLU(), conv["c2"], torch.nn.ReLU(), torch.nn.BatchNorm2d(32),
            torch.nn.MaxPool2d(2), conv["c3"], torch.nn.ReLU(), conv["c4"], torch.nn.ReLU(),
            torch.nn.BatchNorm2d(64), torch.nn.MaxPool2d(2), torch.nn.Flatten(1),
            torch.nn.Linear(576, 10))
        with torch.no_grad():
            for name, layer in conv.items():
                layer.weight.copy_(torch.from_numpy(data[f"{kind}_{name}w"]))
                layer.bias.copy_(torch.from_numpy(data[f"{kind}_{name}b"]))
            model[-1].weight.copy_(torch.from_numpy(data[f"{kind}_lw"]))
            model[-1].bias.copy_(torch.from_numpy(data[f"{kind}_lb"]))
        return model

    def _model(self, kind: str, data: Data) -> torch.nn.Module:
        if kind == "mlp":
            return self._mlp(data)
        return self._cnn(data) if kind == "cnn" else self._mnist(kind, data)

    def gpt(self, data: Data) -> TorchGPT:
        c = GPT_CONFIG
        model = TorchGPT(SimpleNamespace(vocab_size=c["vocab"], block_size=c["context"],
                                         embed_size=c["width"], layers=c["layers"],
                                         heads=c["heads"]))
        state = {torch_name(name): torch.from_numpy(data[f"gpt_{name}"]) for name in gpt_shapes()}
        model.load_state_dict(state, strict=True)
        return model

    def gpt_train_step(self, data: Data) -> Callable[[int], float]:
        model = self.gpt(data)
        vocab = GPT_CONFIG["vocab"]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-8,
                                weight_decay=0.1)
        xs = [torch.from_numpy(x.astype(np.int64)) for x in data["gpt_x"]]
        ys = [torch.from_numpy(y.astype(np.int64)) for y in data["gpt_y"]]

        def step(i: int) -> float:
            opt.zero_grad()
            loss = F.cross_entropy(model(xs[i % len(xs)]).reshape(-1, vocab),
                                   ys[i % len(ys)].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return float(loss.item())
        return step

    def gpt_forward(self, data: Data) -> Callable[[int], Any]:
        model = self.gpt(data)
        xs = [torch.from_numpy(x.astype(np.int64)) for x in data["gpt_x"]]

        def forward(i: int) -> Any:
            with torch.no_grad():
                return model(xs[i % len(xs)])
        return forward

    def gpt_generate(self, data: Data) -> Callable[[int], Any]:
        model, c = self.gpt(data), GPT_CONFIG
        shape = (1, c["heads"], c["context"], c["width"] // c["heads"])
        caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(c["layers"])]

        def generate(i: int) -> Any:
            with torch.no_grad():
                return model.step(i % c["vocab"], i % c["context"], caches)
        return generate

    def train_step(self, kind: str, data: Data) -> Callable[[int], float]:
        if kind == "gpt":
            return self.gpt_train_step(data)
        model = self._model(kind, data)
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


# ---- the same model in PyTorch, with a KV cache ----

class TorchBlock(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.attn_proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.mlp_proj = torch.nn.Linear(4 * width, width)

    def heads_of(self, x: Any) -> list[Any]:
        batch, length, width = x.shape
        return [t.reshape(batch, length, self.heads, -1).transpose(1, 2)
                for t in self.qkv(x).split(width, dim=-1)]

    def mlp(self, x: Any) -> Any:
        return self.mlp_proj(F.gelu(self.fc(self.norm2(x)), approximate="tanh"))

    def forward(self, x: Any) -> Any:
        q, k, v = self.heads_of(self.norm1(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(x.shape))
        return x + self.mlp(x)

    def step(self, x: Any, position: int, cache: tuple[Any, Any]) -> Any:
        q, k, v = self.heads_of(self.norm1(x))
        cache[0][:, :, position], cache[1][:, :, position] = k[:, :, 0], v[:, :, 0]
        keys, values = cache[0][:, :, :position + 1], cache[1][:, :, :position + 1]
        y = F.scaled_dot_product_attention(q, keys, values)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(x.shape))
        return x + self.mlp(x)


class TorchGPT(torch.nn.Module):
    """examples/gpt.py's GPT in PyTorch, with a KV-cache `step` for generation. `config` has
    vocab_size, block_size, embed_size, layers and heads (tinyteach's GPTConfig does)."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = config
        self.token_embedding = torch.nn.Embedding(config.vocab_size, config.embed_size)
        self.position_embedding = torch.nn.Embedding(config.block_size, config.embed_size)
        self.blocks = torch.nn.ModuleList(TorchBlock(config.embed_size, config.heads)
                                          for _ in range(config.layers))
        self.norm = torch.nn.LayerNorm(config.embed_size)

    def forward(self, tokens: Any) -> Any:
        x = self.token_embedding(tokens) + self.position_embedding(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.token_embedding.weight.T

    def step(self, token: int, position: int, caches: list[tuple[Any, Any]]) -> Any:
        x = self.token_embedding.weight[token] + self.position_embedding.weight[position]
        x = x.reshape(1, 1, -1)
        for block, cache in zip(self.blocks, caches):
            x = block.step(x, position, cache)
        return (self.norm(x) @ self.token_embedding.weight.T).reshape(-1)


def torch_name(name: str) -> str:
    """Our state-dict name -> the TorchGPT parameter it matches."""
    for ours, theirs in (("attention.qkv", "qkv"), ("attention.proj", "attn_proj"),
                         ("mlp.fc", "fc"), ("mlp.proj", "mlp_proj")):
        name = name.replace(ours, theirs)
    return name
