"""tinygrad's `Tensor.schedule()` and `run_schedule(items)`: the items that would compute a
tensor, inspectable before anything runs, and run later; `realize()` is the two steps."""
from __future__ import annotations

import numpy as np
import pytest

from tinyteach import GlobalCounters, Tensor
from tinyteach.engine.realize import run_schedule
from tinyteach.engine.schedule import ScheduleItem
from tinyteach.ir.uop import Ops

A = np.arange(12, dtype=np.float32).reshape(3, 4)


def test_schedule_returns_the_items_without_running_them() -> None:
    x = Tensor(A).realize()
    y = (x + 1).relu().sum(1)
    GlobalCounters.reset()
    items = y.schedule()
    assert GlobalCounters.kernel_count == 0
    assert [type(item) for item in items] == [ScheduleItem]
    (item,) = items
    assert item.name == "r_3_4" and item.kind == "kernel"
    assert item.ast.op is Ops.SINK and item.ast.src[0].op is Ops.STORE
    assert item.buffers[0].size == 3 and not item.buffers[0].is_allocated
    assert item.buffers[1] is x.uop.src[0].arg  # the input, as it is in memory (reshaped)
    run_schedule(items)
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(y.numpy(), np.maximum(A + 1, 0).sum(1))


def test_a_scheduled_tensor_read_before_its_items_run_raises() -> None:
    y = Tensor(A) * 2
    items = y.schedule()
    with pytest.raises(RuntimeError, match="run_schedule"):
        y.numpy()
    with pytest.raises(RuntimeError, match="run_schedule"):
        (y + 1).numpy()
    run_schedule(items)
    np.testing.assert_allclose((y + 1).numpy(), A * 2 + 1)


def test_schedule_of_several_tensors_and_of_realized_ones() -> None:
    x = Tensor(A)
    a, b = x.sum(0), x.max(1)
    items = Tensor.schedule(a, b)
    assert sorted(item.name for item in items) == ["r_3_4", "r_4_3"]
    run_schedule(items)
    np.testing.assert_allclose(a.numpy(), A.sum(0))
    np.testing.assert_allclose(b.numpy(), A.max(1))
    assert a.schedule() == []  # nothing left to compute


def test_schedule_of_an_assign_orders_the_readers_of_the_old_value_first() -> None:
    weight = Tensor(A.copy()).realize()
    reader = weight.sum()
    items = weight.assign(weight * 2).schedule()
    assert [item.node.op if item.node else None for item in items][-1] is Ops.ASSIGN
    run_schedule(items)
    np.testing.assert_allclose(weight.numpy(), A * 2)
    np.testing.assert_allclose(reader.numpy(), A.sum())


def test_equal_graphs_scheduled_together_get_distinct_buffers() -> None:
    a, b = Tensor.zeros(4).contiguous(), Tensor.zeros(4).contiguous()
    items = Tensor.schedule(a, b)
    run_schedule(items)
    assert a.uop.arg is not b.uop.arg
    a.assign(a + 1).realize()
    np.testing.assert_allclose(b.numpy(), np.zeros(4))
    np.testing.assert_allclose(a.numpy(), np.ones(4))
