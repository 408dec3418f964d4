"""benchmarks/kernels.py: the per-kernel table of a jitted step (where the CNN step's time goes)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tinyteach import Tensor, TinyJit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the benchmarks are a folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks.kernels import format_kernel_table, kernel_table  # noqa: E402


def test_kernel_table_times_each_launch_of_a_capture():
    rng = np.random.default_rng(0)
    weights = Tensor(rng.normal(size=(64, 32)).astype(np.float32)).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return (x @ weights).relu().sum(1).realize()

    inputs = [Tensor(rng.normal(size=(16, 64)).astype(np.float32)).realize() for _ in range(3)]
    for x in inputs:
        result = step(x)
    np.testing.assert_allclose(result.numpy(),
                               np.maximum(inputs[-1].numpy() @ weights.numpy(), 0).sum(1),
                               rtol=1e-4, atol=1e-4)
    assert step.captured is not None
    rows = kernel_table(step.captured.launches, repeats=3)
    assert [row["name"] for row in rows] == [launch.item.name
                                             for launch in step.captured.launches]
    assert all(row["ms"] > 0 and row["gflops"] >= 0 and row["options"] for row in rows)
    assert any(row["shape"][:1] == [16] for row in rows)
    text = format_kernel_table(rows)
    assert f"{len(rows)} kernels" in text and rows[0]["name"][:20] in text
