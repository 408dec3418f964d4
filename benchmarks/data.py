"""The shared inputs: generated once from a fixed numpy seed, saved as .npy files, and loaded
identically by every framework's worker (so every framework trains the same model on the same
batches and multiplies the same matrices)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

SEED = 0
BATCHES = 4  # training steps cycle through this many batches

MLP_SIZES = (784, 128, 10)
MLP_BATCH = 128
CNN_BATCH = 32
CNN_SHAPES = {"c1w": (8, 1, 3, 3), "c1b": (8,), "c2w": (16, 8, 3, 3), "c2b": (16,),
              "lw": (10, 16 * 5 * 5), "lb": (10,)}
MATMUL_SIZES = (512, 1024)
FUSED_N = 4096
NORM_SHAPE = (4096, 1024)
TINY_N = 16
# tinygrad's examples/beautiful_mnist.py model, at two batch sizes
MNIST_BATCHES = {"mnist": 128, "mnist512": 512}
MNIST_CONVS = {"c1": (32, 1, 5), "c2": (32, 32, 5), "c3": (64, 32, 3), "c4": (64, 64, 3)}
# examples/gpt.py's model: vocabulary, context, width, blocks, heads; a batch of 16 x 64 tokens
GPT_CONFIG = {"vocab": 96, "context": 64, "width": 128, "layers": 4, "heads": 4}
GPT_BATCH = 16
DEEP_LENGTHS = (10_000, 100_000)  # x = x + 1 chained this many times


def _uniform_init(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """PyTorch's default init for Linear/Conv2d: uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)]."""
    bound = 1 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def _mlp(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n_in, n_hidden, n_out = MLP_SIZES
    return {"mlp_x": rng.random((BATCHES, MLP_BATCH, n_in), dtype=np.float32),
            "mlp_y": rng.integers(0, n_out, (BATCHES, MLP_BATCH)).astype(np.int32),
            "mlp_w1": _uniform_init(rng, (n_hidden, n_in), n_in),
            "mlp_b1": _uniform_init(rng, (n_hidden,), n_in),
            "mlp_w2": _uniform_init(rng, (n_out, n_hidden), n_hidden),
            "mlp_b2": _uniform_init(rng, (n_out,), n_hidden)}


def _cnn(rng: np.random.Generator) -> dict[str, np.ndarray]:
    arrays = {"cnn_x": rng.random((BATCHES, CNN_BATCH, 1, 28, 28), dtype=np.float32),
              "cnn_y": rng.integers(0, 10, (BATCHES, CNN_BATCH)).astype(np.int32)}
    fan_ins = {"c1": 1 * 9, "c2": 8 * 9, "l": 16 * 5 * 5}
    for name, shape in CNN_SHAPES.items():
        arrays[f"cnn_{name}"] = _uniform_init(rng, shape, fan_ins[name[:-1]])
    return arrays


def _mnist(batch: int) -> Callable[[np.random.Generator], dict[str, np.ndarray]]:
    def arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
        name = "mnist" if batch == 128 else f"mnist{batch}"
        out = {f"{name}_x": rng.random((BATCHES, batch, 1, 28, 28), dtype=np.float32),
               f"{name}_y": rng.integers(0, 10, (BATCHES, batch)).astype(np.int32)}
        for conv, (c_out, c_in, k) in MNIST_CONVS.items():
            out[f"{name}_{conv}w"] = _uniform_init(rng, (c_out, c_in, k, k), c_in * k * k)
            out[f"{name}_{conv}b"] = _uniform_init(rng, (c_out,), c_in * k * k)
        out[f"{name}_lw"] = _uniform_init(rng, (10, 576), 576)
        out[f"{name}_lb"] = _uniform_init(rng, (10,), 576)
        return out
    return arrays


def gpt_shapes() -> dict[str, tuple[int, ...]]:
    """The GPT's parameters by state-dict name (tinyteach.nn.transformer.GPT's names)."""
    c = GPT_CONFIG
    width = c["width"]
    shapes: dict[str, tuple[int, ...]] = {"token_embedding.weight": (c["vocab"], width),
                                          "position_embedding.weight": (c["context"], width)}
    for i in range(c["layers"]):
        for name, shape in (("norm1", (width,)), ("attention.qkv", (3 * width, width)),
                            ("attention.proj", (width, width)), ("norm2", (width,)),
                            ("mlp.fc", (4 * width, width)), ("mlp.proj", (width, 4 * width))):
            if name.startswith("norm"):
                shapes[f"blocks.{i}.{name}.weight"] = shapes[f"blocks.{i}.{name}.bias"] = shape
            else:
                shapes[f"blocks.{i}.{name}.weight"], shapes[f"blocks.{i}.{name}.bias"] = \
                    shape, shape[:1]
    shapes["norm.weight"] = shapes["norm.bias"] = (width,)
    return shapes


def _gpt(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random tokens, and the GPT's weights: embeddings N(0, 0.02), Linear layers PyTorch's
    uniform init, LayerNorms weight 1 and bias 0. Arrays are named "gpt/<state-dict name>"."""
    c = GPT_CONFIG
    shape = (BATCHES, GPT_BATCH, c["context"])
    out = {"gpt_x": rng.integers(0, c["vocab"], shape).astype(np.int32),
           "gpt_y": rng.integers(0, c["vocab"], shape).astype(np.int32)}
    for name, size in gpt_shapes().items():
        if "embedding" in name:
            array = (0.02 * rng.standard_normal(size)).astype(np.float32)
        elif "norm" in name:
            array = np.full(size, 1.0 if name.endswith("weight") else 0.0, np.float32)
        else:
            fan_in = size[1] if len(size) == 2 else gpt_shapes()[name[:-4] + "weight"][1]
            array = _uniform_init(rng, size, fan_in)
        out[f"gpt_{name}"] = array
    return out


def _matmul(n: int) -> Callable[[np.random.Generator], dict[str, np.ndarray]]:
    return lambda rng: {f"mm{n}_{name}": rng.standard_normal((n, n), dtype=np.float32)
                        for name in "ab"}


# workload -> its arrays; each workload draws from its own stream of the fixed seed, so the
# arrays of one workload are the same whichever other workloads are generated with it
GENERATORS: dict[str, Callable[[np.random.Generator], dict[str, np.ndarray]]] = {
    "mlp": _mlp,
    "cnn": _cnn,
    **{f"matmul{n}": _matmul(n) for n in MATMUL_SIZES},
    "fused": lambda rng: {f"fused_{name}": rng.standard_normal((FUSED_N, FUSED_N),
                                                               dtype=np.float32)
                          for name in "abc"},
    "softmax": lambda rng: {"norm_x": rng.standard_normal(NORM_SHAPE, dtype=np.float32)},
    "tiny": lambda rng: {"tiny_x": rng.standard_normal(TINY_N, dtype=np.float32)},
    "deep": lambda rng: {"deep_x": rng.standard_normal(TINY_N, dtype=np.float32)},
    # (added last: each workload's stream is its position here, so the earlier ones keep theirs)
    **{name: _mnist(batch) for name, batch in MNIST_BATCHES.items()},
    "gpt": _gpt,
}
GENERATORS["layernorm"] = GENERATORS["softmax"]  # the same 4096x1024 input


def generate(workloads: Iterable[str] = GENERATORS) -> dict[str, np.ndarray]:
    """The arrays `workloads` need, from `np.random.default_rng([SEED, i])` for workload i."""
    arrays: dict[str, np.ndarray] = {}
    for workload in workloads:
        stream = list(GENERATORS).index(workload)
        if workload == "layernorm":
            stream = list(GENERATORS).index("softmax")
        arrays.update(GENERATORS[workload](np.random.default_rng([SEED, stream])))
    return arrays


def save(directory: Path, workloads: Iterable[str] = GENERATORS) -> None:
    """Write the arrays of `workloads` to `directory/<name>.npy`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in generate(workloads).items():
        np.save(directory / f"{name}.npy", array)


class Data:
    """Loads arrays by name from the directory `save` wrote (each read once, on first use)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = np.load(self.directory / f"{name}.npy")
        return self._cache[name]
