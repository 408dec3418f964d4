"""Every example's documented command (the header of each file in examples/) runs, with a small
step count, from an empty current folder, and leaves nothing in it: checkpoints go into
tinyteach's cache folder (here $TINYTEACH_CACHE, a temporary one) or where the user says.

quickstart.py and mnist_tutorial.py run in tests/test_tinygrad_programs.py (their loops cut);
beautiful_mnist.py's full run, with its accuracy check, takes minutes on a CPU: it runs with
TINYTEACH_EXAMPLES=1.
"""
from __future__ import annotations

import gzip
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
pytestmark = pytest.mark.slow  # each test starts Python and compiles kernels
FULL_RUNS = pytest.mark.skipif(os.environ.get("TINYTEACH_EXAMPLES") != "1",
                               reason="a full program run takes minutes on a CPU: set "
                                      "TINYTEACH_EXAMPLES=1 to run it")
# a GPT small enough that a few steps of it take seconds
SMALL_GPT = ["--block-size", "16", "--embed-size", "32", "--layers", "1", "--heads", "2",
             "--batch-size", "2", "--eval-every", "2", "--sample-length", "8"]


def run_example(folder: Path, *arguments: str, **environment: str) -> str:
    """`python examples/<arguments>` run in `folder` with its cache in folder/cache; returns what
    it printed, and checks that the cache is all it left in the folder."""
    env = {**os.environ, "TINYTEACH_CACHE": str(folder / "cache"), **environment}
    command = [sys.executable, str(EXAMPLES / arguments[0]), *arguments[1:]]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    left = sorted(path.name for path in folder.iterdir() if path.name != "cache")
    assert left == [], f"{arguments[0]} wrote {left} into the current folder"
    return done.stdout + done.stderr


def header(name: str) -> str:
    """The comment or docstring at the top of an example: where its commands are written."""
    return (EXAMPLES / name).read_text()[:1500]


def test_demo(tmp_path: Path) -> None:
    printed = run_example(tmp_path, "demo.py")
    assert "kernels run for `out`: 1" in printed and "void " in printed


def test_gpt_trains_saves_into_the_cache_and_loads_it_back(tmp_path: Path) -> None:
    """The header's commands, with a small model: training saves the checkpoint into the cache
    folder (not the current one), and `--load` with no path reads it back (`--save PATH` goes to
    the same `save`, which tests/test_gpt.py round-trips through a path of its own)."""
    for command in ("python examples/gpt.py ", "python examples/gpt.py --steps 20 ",
                    'python examples/gpt.py --load --steps 0 --prompt "Return the"'):
        assert command in header("gpt.py")
    printed = run_example(tmp_path, "gpt.py", "--steps", "2", *SMALL_GPT)
    checkpoint = tmp_path / "cache" / "checkpoints" / "gpt.safetensors"
    assert f"checkpoint: {checkpoint}" in printed and checkpoint.is_file()
    printed = run_example(tmp_path, "gpt.py", "--load", "--steps", "0", "--prompt", "Return the",
                          *SMALL_GPT)
    assert "--- sample (8 tokens" in printed and "checkpoint:" not in printed


def test_gpt_load_without_a_checkpoint_says_what_to_do(tmp_path: Path) -> None:
    env = {**os.environ, "TINYTEACH_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, str(EXAMPLES / "gpt.py"), "--load", "--steps", "0"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no checkpoint at" in done.stderr and "train one first" in done.stderr


def write_mnist_files(folder: Path, train: int = 64, test: int = 32) -> None:
    """Random images and labels in MNIST's four IDX files (the format: tests/test_datasets.py)."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for prefix, count in (("train", train), ("t10k", test)):
        arrays = {"images-idx3-ubyte": rng.integers(0, 256, (count, 28, 28), dtype=np.uint8),
                  "labels-idx1-ubyte": rng.integers(0, 10, count, dtype=np.uint8)}
        for kind, array in arrays.items():
            header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
            (folder / f"{prefix}-{kind}.gz").write_bytes(gzip.compress(header + array.tobytes()))


@pytest.mark.parametrize("use_mnist", [False, True], ids=["digits", "mnist"])
def test_train_digits(tmp_path: Path, use_mnist: bool) -> None:
    """Both documented commands, for 5 steps; `--mnist` reads MNIST's files from the cache
    folder that $TINYTEACH_MNIST_DIR names (random images here: the run, not the accuracy)."""
    assert "python examples/train_digits.py --mnist" in header("train_digits.py")
    arguments = ["train_digits.py", "--steps", "5", *(["--mnist"] if use_mnist else [])]
    mnist = tmp_path / "cache" / "mnist"
    if use_mnist:
        write_mnist_files(mnist)
    printed = run_example(tmp_path, *arguments, TINYTEACH_MNIST_DIR=str(mnist))
    accuracy = float(re.search(r"test accuracy ([\d.]+)%", printed).group(1))  # type: ignore[union-attr]
    assert 0 <= accuracy <= 100 and "5 steps in" in printed


def test_beautiful_mnist_short_run(tmp_path: Path) -> None:
    """`STEPS=5 BS=32 python examples/beautiful_mnist.py`: five TinyJit'd steps (captured on the
    second, replayed after) of 32 stand-in images, each loss finite."""
    assert "STEPS=5 BS=32 python examples/beautiful_mnist.py" in header("beautiful_mnist.py")
    printed = run_example(tmp_path, "beautiful_mnist.py", STEPS="5", BS="32")
    losses = [float(loss) for loss in re.findall(r"loss:\s+([\d.]+)", printed)]
    assert len(losses) >= 5 and all(np.isfinite(losses)), printed[-1000:]
    assert "5/5" in printed


@FULL_RUNS
def test_beautiful_mnist_reaches_tinygrads_accuracy(tmp_path: Path) -> None:
    """The documented check: 70 steps of 512 images reach 95% on the held-out images (97.8%
    here; a PyTorch copy of the program gets 96.0-97.6% over seeds; tinygrad's gets about 98% on
    MNIST), and not 100%, which tinygrad's check takes for a broken evaluation. About 15 minutes
    on 2 busy CPU cores."""
    assert "TARGET_EVAL_ACC_PCT=95 to check" in header("beautiful_mnist.py")
    printed = run_example(tmp_path, "beautiful_mnist.py", TARGET_EVAL_ACC_PCT="95")
    accuracy = float(re.search(r"test_acc=([\d.]+)", printed).group(1))  # type: ignore[union-attr]
    assert 95 <= accuracy < 100
