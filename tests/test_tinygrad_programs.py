"""Issue 13: tinygrad's own programs run on tinyteach with only their imports changed.

examples/beautiful_mnist.py, examples/quickstart.py (docs/quickstart.md) and
examples/mnist_tutorial.py (docs/mnist.md) are tinygrad's code with `tinygrad` replaced by
`tinyteach` in the imports and MNIST replaced by the offline digits in MNIST's format
(`nn.datasets.digits_mnist`, `fetch_digits_mnist`). These tests run them for a few steps and
check that the loss falls.

A value computed before an optimizer step can be read after it (the quickstart reads `out`
after `opt.step()`): the step's realize computes every live tensor that reads a weight's old
contents before the weight is overwritten (tensor_core._still_lazy).

A full run of each program (its own loop, shortened) is slow on a 2-core CPU (a step of
beautiful_mnist's 512-image batch is about a minute): it runs with TINYTEACH_EXAMPLES=1.
"""
from __future__ import annotations

import builtins
import os
import re
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tinyteach
from tinyteach import Tensor, TinyJit, nn
from tinyteach.nn.datasets import digits_mnist, fetch_digits_mnist

EXAMPLES = Path(__file__).parent.parent / "examples"
FULL_RUNS = pytest.mark.skipif(os.environ.get("TINYTEACH_EXAMPLES") != "1",
                               reason="a full program run takes minutes on a CPU: set "
                                      "TINYTEACH_EXAMPLES=1 to run it")
pytest.importorskip("sklearn")


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The programs may import sibling modules, as when run as scripts; they set
    Tensor.training themselves, so it is restored afterwards."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    training = Tensor.training
    yield
    Tensor.training = training


def source(name: str) -> str:
    return (EXAMPLES / name).read_text()


def without_tinyjit(monkeypatch: pytest.MonkeyPatch) -> None:
    """TinyJit as the identity, for programs that draw random numbers inside a jitted step
    (see test_tinyjit_replays_random_numbers_as_tinygrad)."""
    def identity(function: Any) -> Any:
        return function
    monkeypatch.setattr(tinyteach, "TinyJit", identity)


def capped_range(limit: int) -> Any:
    """range() for exec'd program code: loops over 1000 or more steps stop after `limit`."""
    def short_range(*args: int) -> range:
        steps = builtins.range(*args)
        return steps[:limit] if len(steps) >= 1000 else steps
    return short_range


# ---- what tinygrad programs rely on ----

def test_tinyjit_replays_random_numbers_as_tinygrad() -> None:
    @TinyJit
    def draw() -> Tensor:
        return Tensor.randint(8, high=1_000_000).realize()
    draws = {tuple(draw().tolist()) for _ in range(4)}
    assert len(draws) == 4


def test_a_value_computed_before_a_step_can_be_read_after_it() -> None:
    """The quickstart's pattern: out = net(x); loss(out).backward(); opt.step(); out.argmax()."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    start = np.ones((3, 2), dtype=np.float32)
    weight = Tensor(start)
    optimizer = nn.optim.SGD([weight], lr=0.1)
    with Tensor.train():
        out = Tensor(x) @ weight
        out.sum().backward()
        optimizer.step()
    np.testing.assert_allclose(out.numpy(), x @ start)


# ---- the data: MNIST's format, from the digits ----

def test_digits_mnist_has_mnists_format() -> None:
    """mnist()'s dtypes and layout (tinygrad's docs print uint8 (N, 1, 28, 28) and uint8
    labels); each 8x8 pixel is a 3x3 block inside a 2-pixel border, scaled 0..16 -> 0..255."""
    from sklearn.datasets import load_digits

    from tinyteach.nn.datasets import DIGITS_TEST_SIZE, digits_order
    X_train, Y_train, X_test, Y_test = digits_mnist()
    assert X_train.shape == (1500, 1, 28, 28) and X_test.shape == (DIGITS_TEST_SIZE, 1, 28, 28)
    assert X_train.dtype == Y_train.dtype == tinyteach.dtypes.uint8
    bunch = load_digits()
    order = digits_order(len(bunch.target))
    first = X_train.numpy()[0, 0]
    expected = np.rint(bunch.images[order[0]] / 16 * 255)
    np.testing.assert_array_equal(first[2:26:3, 2:26:3], expected)
    np.testing.assert_array_equal(first[3:27:3, 4:28:3], expected)
    assert not first[:2].any() and not first[26:].any() and not first[:, :2].any()
    np.testing.assert_array_equal(Y_test.numpy(), bunch.target[order[1500:]])
    flat_train, labels, _, _ = fetch_digits_mnist()
    assert flat_train.shape == (1500, 784) and flat_train.dtype == np.float32
    np.testing.assert_array_equal(flat_train[0].reshape(28, 28), first)
    np.testing.assert_array_equal(labels, Y_train.numpy())


# ---- beautiful_mnist.py ----

def test_beautiful_mnist_model_trains() -> None:
    """The program's Model and the body of its train_step, on 32 images a step instead of
    512 (a 512-image step takes about a minute here): the loss falls over four steps."""
    program = runpy.run_path(str(EXAMPLES / "beautiful_mnist.py"))  # not __main__: no run
    Tensor.manual_seed(0)
    X_train, Y_train, _, _ = digits_mnist()
    model = program["Model"]()
    opt = nn.optim.Adam(nn.state.get_parameters(model))
    losses = []
    for _ in range(4):
        with Tensor.train():
            opt.zero_grad()
            samples = Tensor.randint(32, high=X_train.shape[0])
            loss = model(X_train[samples]).sparse_categorical_crossentropy(
                Y_train[samples]).backward()
            opt.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


@FULL_RUNS
def test_beautiful_mnist_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program itself, as `python examples/beautiful_mnist.py`, for 3 of its 70 steps."""
    from tinyteach import helpers
    descriptions: list[str] = []

    class three_steps(helpers.trange):  # noqa: N801
        def __init__(self, count: int, desc: str = ""):
            super().__init__(3, desc)

        def set_description(self, description: str) -> None:
            descriptions.append(description)
    monkeypatch.setattr(helpers, "trange", three_steps)
    without_tinyjit(monkeypatch)
    Tensor.manual_seed(0)
    runpy.run_path(str(EXAMPLES / "beautiful_mnist.py"), run_name="__main__")
    losses = [float(re.search(r"loss:\s+([\d.]+)", d).group(1)) for d in descriptions]  # type: ignore[union-attr]
    assert len(losses) == 3 and losses[-1] < losses[0], losses


# ---- quickstart.py (docs/quickstart.md) ----

def test_quickstart_runs_and_learns(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The quickstart's code, unchanged but for its imports, with its 1000-step loops cut to
    101 steps (it reads `out` after `opt.step()`, which used to raise): the loss falls from
    step 1 to step 101, the trained net classifies the test digits, and the saved and
    reloaded model gives the same outputs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYTEACH_CACHE", str(tmp_path / "cache"))
    code = source("quickstart.py")
    np.random.seed(0)
    Tensor.manual_seed(0)
    namespace: dict[str, Any] = {"__name__": "__main__", "range": capped_range(101)}
    exec(compile(code, "quickstart.py", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "[-56. -48. -36. -20.   0.]" in printed
    losses = [float(v) for v in re.findall(r"Step \d+ \| Loss: ([\d.e+-]+)", printed)]
    assert len(losses) == 2 and losses[1] < losses[0], printed
    net, X_test, Y_test = namespace["net"], namespace["X_test"], namespace["Y_test"]
    accuracy = (net(Tensor(X_test)).argmax(axis=-1).numpy() == Y_test).mean()
    assert accuracy > 0.6, accuracy
    reloaded = nn.state.safe_load(tmp_path / "cache" / "quickstart" / "model.safetensors")
    assert [path.name for path in tmp_path.iterdir()] == ["cache"]  # nothing in the current folder
    np.testing.assert_array_equal(reloaded["l1.weight"].numpy(), net.l1.weight.numpy())


# ---- mnist_tutorial.py (docs/mnist.md) ----

def test_mnist_tutorial_trains(capsys: pytest.CaptureFixture[str]) -> None:
    """The tutorial's code up to its timing cells (model, data, the random model's accuracy,
    the step function), then three calls of its `step()`: the loss falls."""
    code = source("mnist_tutorial.py")
    head = code[:code.index("import timeit")]
    Tensor.manual_seed(0)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(head, "mnist_tutorial.py", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[1] == "(1500, 1, 28, 28) dtypes.uchar (1500,) dtypes.uchar"  # as tinygrad
    assert 0.0 <= float(printed[2]) <= 0.35  # a random model: about 10%
    losses = [namespace["step"]().item() for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


@FULL_RUNS
def test_mnist_tutorial_runs(capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole tutorial, its 7000-step loop cut to 1: after its 11 timed steps the test
    accuracy it prints beats the random model's."""
    without_tinyjit(monkeypatch)
    Tensor.manual_seed(0)
    namespace: dict[str, Any] = {"__name__": "__main__", "range": capped_range(1)}
    exec(compile(source("mnist_tutorial.py"), "mnist_tutorial.py", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    first = float(printed[2])
    last = float(re.search(r"acc ([\d.]+)%", printed[-1]).group(1)) / 100  # type: ignore[union-attr]
    assert last > first + 0.2, printed
    sys.stdout.flush()
