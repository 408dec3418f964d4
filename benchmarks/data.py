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
