"""Train a small CNN on handwritten digits with TinyJit — the example to copy.

    python examples/train_digits.py            # scikit-learn's 8x8 digits (offline, ~20 s)
    python examples/train_digits.py --mnist    # real MNIST, if its files are in the cache

Each training step is captured by TinyJit on its second call and replayed afterwards: the
Python that builds the graph, the scheduler and the code generator run twice, then every step
is one call into the captured kernels. Batches are drawn on the host with numpy and passed in
as arguments, so each replay sees new data.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from tqdm import tqdm

from tinyteach import GlobalCounters, Tensor, TinyJit, nn
from tinyteach.nn.state import get_parameters


class SmallCNN:
    """conv 3x3 -> relu -> max-pool -> conv 3x3 -> relu -> max-pool -> linear."""

    def __init__(self, image_size: int, classes: int = 10):
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        pooled = image_size // 4
        self.out = nn.Linear(32 * pooled * pooled, classes)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.c1(x).relu().max_pool2d(2)
        x = self.c2(x).relu().max_pool2d(2)
        return self.out(x.flatten(1))


def load(use_mnist: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The data as numpy arrays on the host, images as float32 in [0, 1]."""
    if use_mnist:
        x_train, y_train, x_test, y_test = nn.datasets.mnist()
        scale = 1 / 255.0
    else:
        x_train, y_train, x_test, y_test = nn.datasets.digits()
        scale = 1.0
    return (x_train.numpy().astype(np.float32) * scale, y_train.numpy().astype(np.int32),
            x_test.numpy().astype(np.float32) * scale, y_test.numpy().astype(np.int32))


def accuracy(model: SmallCNN, x: np.ndarray, y: np.ndarray, batch: int = 500) -> float:
    correct = 0
    for start in range(0, len(x), batch):
        logits = model(Tensor(x[start:start + batch]))
        correct += int((logits.argmax(axis=1).numpy() == y[start:start + batch]).sum())
    return correct / len(x)


def train(steps: int, batch_size: int, use_mnist: bool, seed: int = 0) -> float:
    """Train and return the test accuracy."""
    Tensor.manual_seed(seed)
    rng = np.random.default_rng(seed)
    x_train, y_train, x_test, y_test = load(use_mnist)
    model = SmallCNN(x_train.shape[-1])
    optimizer = nn.optim.Adam(get_parameters(model), lr=1e-2)

    @TinyJit
    def train_step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            optimizer.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            optimizer.step()
            return loss.realize()

    progress = tqdm(range(steps), desc="training")
    start = time.perf_counter()
    for step in progress:
        chosen = rng.integers(0, len(x_train), batch_size)
        loss = train_step(Tensor(x_train[chosen]), Tensor(y_train[chosen]))
        if step % 20 == 0 or step == steps - 1:
            progress.set_postfix(loss=f"{loss.item():.3f}")
    seconds = time.perf_counter() - start
    test_accuracy = accuracy(model, x_test, y_test)
    print(f"{steps} steps in {seconds:.1f} s ({GlobalCounters.kernel_count} kernel launches); "
          f"test accuracy {test_accuracy:.1%}")
    return test_accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", action="store_true", help="train on MNIST instead of digits")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    arguments = parser.parse_args()
    train(arguments.steps, arguments.batch_size, arguments.mnist)
