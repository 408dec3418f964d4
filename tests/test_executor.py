"""One executor (issue 24): every eager realize and every TinyJit replay is a Plan run by
realize.run, counted the same in GlobalCounters and watched the same by DEBUG and
record_launches."""
from __future__ import annotations

import numpy as np
import pytest

from tinyteach import Context, Tensor, TinyJit
from tinyteach.engine.realize import Plan, record_launches
from tinyteach.helpers import GlobalCounters

DATA = np.arange(1024, dtype=np.float32) / 1024


def two_kernels(x: Tensor) -> Tensor:
    return (x - x.max()).exp().realize()


def counts_of(function, x: Tensor) -> tuple[tuple[int, int, int], np.ndarray]:
    GlobalCounters.reset()
    out = function(x).numpy()
    return (GlobalCounters.kernel_count, GlobalCounters.global_ops,
            GlobalCounters.global_mem), out


def test_every_path_counts_the_same() -> None:
    """The whole path (PLAN_CACHE=0), a cached plan, a watched run (DEBUG=1) and a TinyJit
    replay count the same kernels, operations and bytes, and compute numpy's values."""
    expected = np.exp(DATA - DATA.max())
    jitted = TinyJit(two_kernels)
    for _ in range(3):
        jitted(Tensor(DATA, device="CPU").realize())
    fresh = Tensor(DATA, device="CPU").realize
    with Context(PLAN_CACHE=0):
        whole, out = counts_of(two_kernels, fresh())
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    two_kernels(fresh())  # the plan is cached now
    cached, out = counts_of(two_kernels, fresh())
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    with Context(DEBUG=1):
        watched, out = counts_of(two_kernels, fresh())
    replayed, out = counts_of(jitted, fresh())
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert whole == cached == watched == replayed
    assert whole[0] == 2 and whole[1] > 0 and whole[2] > 0


def test_the_lean_elementwise_path_counts_as_the_whole_one() -> None:
    x = Tensor(DATA, device="CPU").realize()
    with Context(PLAN_CACHE=0):
        whole, _ = counts_of(lambda t: (t + 1).realize(), x)
    (x + 1).realize()  # the lean key's plan
    lean, out = counts_of(lambda t: (t + 1).realize(), x)
    np.testing.assert_array_equal(out, DATA + 1)
    assert lean == whole and lean[1] == DATA.size


def test_a_replay_is_recorded_like_an_eager_run() -> None:
    """record_launches observes a TinyJit replay: one launch per captured kernel, with the
    capture's programs and the new input buffer."""
    jitted = TinyJit(two_kernels)
    for _ in range(3):
        jitted(Tensor(DATA, device="CPU").realize())
    x = Tensor(DATA[::-1].copy(), device="CPU").realize()
    with record_launches() as launches:
        out = jitted(x)
    captured = jitted.captured
    assert captured is not None
    assert [launch.runner for launch in launches] == [launch.runner
                                                      for launch in captured.launches]
    input_buffer = x.uop.arg
    assert any(buffer is input_buffer for launch in launches for buffer in launch.buffers)
    np.testing.assert_allclose(out.numpy(), np.exp(DATA[::-1] - DATA.max()), rtol=1e-6)


def test_a_capture_is_a_plan_of_slots() -> None:
    """A capture is a Plan: each step writes its first slot and reads the rest, on the
    captured buffers by slot; the input's slot holds no memory between replays."""
    jitted = TinyJit(two_kernels)
    for _ in range(3):
        jitted(Tensor(DATA, device="CPU").realize())
    captured = jitted.captured
    assert captured is not None and isinstance(captured.plan, Plan) and captured.plan.captured
    plan, buffers = captured.plan, captured.buffers
    for step, launch in zip(plan.steps, captured.launches):
        assert step.writes == step.slots[0] and step.reads == step.slots[1:]
        assert buffers[step.writes] is launch.buffers[0]
    (slot, _), = captured.inputs
    assert not buffers[slot].is_allocated  # the caller's input is not held


def test_debug_prints_a_line_per_launch_and_one_per_replay(
        capsys: pytest.CaptureFixture[str]) -> None:
    jitted = TinyJit(two_kernels)
    inputs = [Tensor(DATA, device="CPU").realize() for _ in range(3)]
    capsys.readouterr()
    with Context(DEBUG=1):
        for x in inputs:
            jitted(x)
    lines = capsys.readouterr().out.splitlines()
    launch_lines = [line for line in lines if line.startswith("*** CPU")]
    assert len(launch_lines) == 2 * 2  # calls 1 and 2, launch by launch
    assert sum(line.startswith("TinyJit: replayed 2 kernels") for line in lines) == 1
